"""lpfail.experiments.symptom on the CPU: the pre-registered failure criterion on synthetic curves, its grid on the
sweep framework (tiny models, 2 variants x 2 seeds as concurrent subprocesses, a wall-clock budget, stop and
continue from checkpoints with losses equal to an uninterrupted run's), the outcome table, and the pydocs corpus."""
import dataclasses
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lpfail import data, results
from lpfail.experiments import symptom as S
from lpfail.sweep.store import part_files, read_part

REPO = Path(__file__).resolve().parent.parent


# -- the criterion ---------------------------------------------------------------------------------------
def _decay(n, lo=1.5, hi=5.5, tau=200.0, seed=0):
    rng = np.random.default_rng(seed)
    return lo + (hi - lo) * np.exp(-np.arange(n) / tau) + 0.02 * rng.standard_normal(n)


def test_criterion_healthy_run_does_not_fail():
    assert S.failed(_decay(3000), warmup=100) == (False, None)
    assert S.failed(np.full(3000, 2.0), warmup=100) == (False, None)


def test_criterion_explosion_fails_at_the_right_step():
    loss = _decay(3000)
    loss[1500:] = np.linspace(loss[1499], 7.0, 1500)  # climbs from ≈1.5 to 7
    f, step = S.failed(loss, warmup=100)
    assert f and 1500 < step < 1700
    # the exact step: first window end whose mean exceeds 1.25 x the best mean so far
    c = np.convolve(loss[100:], np.ones(100) / 100, "valid")
    best = np.minimum.accumulate(c)
    assert step == 100 + int(np.argmax(c > 1.25 * best)) + 99
    assert S.failed(loss[:1500], warmup=100) == (False, None)  # before the rise: healthy


def test_criterion_nonfinite_fails_at_that_step_even_in_warmup():
    loss = _decay(500)
    loss[37] = np.nan
    assert S.failed(loss, warmup=100) == (True, 37)
    loss = _decay(500)
    loss[400] = np.inf
    assert S.failed(loss, warmup=100) == (True, 400)
    gn = np.ones(500)
    gn[250] = np.nan
    assert S.failed(_decay(500), warmup=100, grad_norms=gn) == (True, 250)
    with pytest.raises(ValueError):
        S.failed(_decay(10), 0, grad_norms=np.ones(9))


def test_criterion_spike_that_recovers_does_not_fail():
    loss = _decay(2000)
    loss[1200:1210] = 3.0 * loss[1200:1210]  # 10 steps at 3x: lifts a 100-step mean by ~20 %
    assert S.failed(loss, warmup=100) == (False, None)
    loss[1200:1240] = 3.0 * _decay(2000)[1200:1240]  # 40 steps at 3x: +80 %: fails
    assert S.failed(loss, warmup=100)[0]


def test_criterion_ignores_warmup_and_short_runs():
    loss = np.concatenate([np.full(100, 9.0), np.full(50, 1.0)])  # high in warm-up, short after: no verdict
    assert S.failed(loss, warmup=100) == (False, None)
    rising_in_warmup = np.concatenate([np.linspace(1, 5, 100), np.full(300, 5.0)])
    assert S.failed(rising_in_warmup, warmup=100) == (False, None)
    assert S.CRITERION_FIXED_ON == "2026-11-29" and "before any outcome" in S.failed.__doc__


def test_outcome_table():
    t = S.outcome_table(("A", "C"), (0, 1), [[True, False], [False, False]], [[812, -1], [-1, -1]],
                        [[3.29, 1.41], [1.76, 1.80]], [["completed", "incomplete"], ["completed", "missing"]],
                        [[2000, 700], [2000, 0]])
    assert "| variant | seed 0 | seed 1 | fails |" in t
    assert "**fails** at 812, final 3.290" in t and "(incomplete, 700 steps)" in t and "not run" in t
    assert "| 1/2 |" in t and "| 0/2 |" in t


# -- the driver -----------------------------------------------------------------------------------------
def tiny(**kw) -> S.SymptomConfig:
    base = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, data="tinyshakespeare", lr=3e-3,
                warmup=2, max_steps=60, variants=("A", "C"), seeds=(0, 1), diag_every=20, checkpoint_every=10,
                check_steps=10, curve_points=20)
    return S.SymptomConfig(**{**base, **kw})


def test_config_is_registered_and_validated():
    exp = results.get("symptom")
    assert exp.gpu and exp.config is S.SymptomConfig
    c = exp.default_config()
    assert (c.n_layer, c.n_embd, c.warmup, c.schedule, c.optimizer, c.data) == (4, 256, 100, "constant", "adamw",
                                                                                "pydocs")
    assert 1.2e-2 <= c.lr <= 2e-2 and c.block_size in (512, 1024) and len(c.seeds) >= 3
    assert c.variants == ("A", "C", "Bp", "B", "D")
    cfg = S.train_config(c, "B", 0, "reference", "/tmp/x")
    assert cfg.attention == "reference(PAPER_BF16_OFFICIAL_FIX)" and cfg.min_lr == cfg.lr
    with pytest.raises(ValueError):
        S.train_config(c, "B", 0, "triton", "/tmp/x")  # the kernel refuses masked_ties
    with pytest.raises(ValueError):
        S.SymptomConfig(variants=("A", "E"))
    assert S.impl_for(c, "A", {"cuda": False}) == "reference"
    assert S.impl_for(c, "A", {"cuda": True, "kernel": {"A": {"trusted": True}}}) == "triton"
    assert S.impl_for(c, "A", {"cuda": True, "kernel": {"A": {"trusted": False}}}) == "reference"


def _specs(grid, root, **kw):
    """The driver's RunSpecs of a grid's runs, in the directories `lpfail.sweep.drive` uses under ``root``."""
    from lpfail.sweep.run import run_dir_name

    return [S.RunSpec(run_dir_name(r), r.at(Path(root) / run_dir_name(r)), variant=r.group, seed=r.seed, **kw)
            for r in grid.runs()]


def test_driver_budget_stop_continue_and_collect(tmp_path):
    """The checks' stop-and-continue run equals its uninterrupted twin; 2 variants x 2 seeds run as concurrent
    subprocesses, are stopped past step 12 of 30, continued from their checkpoints by the framework's driver and
    collected, and their continued losses equal the uninterrupted check run's bit for bit; a finished grid is never
    rerun; the wall-clock budget stops a run and never starts the rest; a control file brings the deadline
    forward and widens the parallelism of a running sweep."""
    from lpfail import sweep

    c = tiny(max_steps=30, diag_every=10, check_steps=6, curve_points=10)
    chk = S.checks(c, tmp_path / "checks", log=lambda *a: None)
    assert chk["cuda"] is False and chk["kernel"] == {}
    assert chk["continue"]["exercised"] and chk["continue"]["equal"], chk["continue"]
    assert chk["continue"]["steps"] == 24
    grid = S.SymptomGrid(c, chk)
    specs = _specs(grid, tmp_path / "runs", interrupt_at_step=12)
    assert [r.group + str(r.seed) for r in grid.runs()] == ["A0", "C0", "A1", "C1"]
    assert specs[0].cfg.attention == "reference(PAPER_BF16)" and specs[1].cfg.attention == "reference(FP32)"
    finished = []  # on_finish: once per run that leaves the running set, with its status
    st = S.sweep(specs, parallel=4, budget_s=1e9, poll_s=0.1, log=lambda *a: None,
                 on_finish=lambda name, d: finished.append((name, d["state"])))
    assert all(v["state"] == "stopped" for v in st.values()), st
    assert sorted(finished) == sorted((s.name, "stopped") for s in specs)
    assert all(S.run_state(s) == "partial" for s in specs)

    # the framework's driver continues each from its checkpoint and stores its summary in a part
    sweep.drive(grid, root=tmp_path / "runs", directory=tmp_path, parallel=4, budget_s=120, log=lambda *a: None)
    assert all("--resume" in (s.dir / "stdout.txt").read_text() for s in specs)
    lk = sweep.lookup(grid, tmp_path)
    assert lk.complete
    out = grid.result(lk.have, lk.parts)
    assert out["complete"] and out["steps"].tolist() == [[30, 30], [30, 30]]
    # continued runs equal an uninterrupted process over the check's 24 steps (A, seed 0, same settings): bit
    # equality is right, every run is a subprocess of this machine with the same config and OMP_NUM_THREADS
    np.testing.assert_array_equal(out["loss"][0, 0, :24], np.float32(chk["continue"]["loss_whole"]))
    assert not np.array_equal(out["loss"][0, 0], out["loss"][0, 1])  # seeds differ
    assert out["loss_curve"].shape == (2, 2, 10) and np.all(np.isfinite(out["loss_curve"]))
    assert out["max_logit"].shape == (2, 2, 3, 2) and np.all(np.isfinite(out["tied_frac"]))
    assert out["spectral"].shape[:3] == (2, 2, 3) and len(out["spectral_names"]) == out["spectral"].shape[3]
    assert out["failed"].shape == (2, 2) and "| variant | seed 0 | seed 1 |" in out["outcome_table"]
    results._split("symptom", out)  # storable
    # a finished grid is never rerun
    assert sweep.drive(grid, root=tmp_path / "runs", directory=tmp_path, log=lambda *a: None) == {}

    # the budget: with one slot and 2 s, the first run is stopped and the others never start
    grid2 = S.SymptomGrid(tiny(max_steps=2000), {"cuda": False})
    specs2 = _specs(grid2, tmp_path / "budget")
    finished2 = []
    st2 = S.sweep(specs2, parallel=1, budget_s=2.0, min_start_s=0, log=lambda *a: None,
                  on_finish=lambda name, d: finished2.append(name))
    first, *rest = [s.name for s in specs2]
    assert st2[first]["state"] == "stopped" and st2[first]["wall_s"] < 25
    assert finished2 == [first]  # runs that never started are not reported
    assert [st2[n]["state"] for n in rest] == ["pending"] * 3
    # a control file brings the deadline forward while the sweep runs
    import time as _time
    ctl = tmp_path / "control.json"
    ctl.write_text(json.dumps({"stop_at": _time.time() + 3, "parallel": 2}))
    specs3 = _specs(grid2, tmp_path / "ctl")
    t0 = _time.monotonic()
    st3 = S.sweep(specs3, parallel=1, budget_s=1e9, min_start_s=0, log=lambda *a: None, control=ctl)
    assert _time.monotonic() - t0 < 40
    assert [st3[s.name]["state"] for s in specs3[:2]] == ["stopped"] * 2  # 2 at a time, both stopped


def test_sweep_points_validate_and_share_the_default_checks(tmp_path, monkeypatch):
    from lpfail import sweep

    sc = S.SymptomSweepConfig()
    assert results.get("symptom_sweep").config is S.SymptomSweepConfig
    cs = S.sweep_configs(sc)
    d = S.SymptomConfig()
    assert [c.lr for c in cs] == [0.02, d.lr, 0.01, d.lr] and cs[3].warmup == 50
    assert cs[1].impl == "reference" and cs[1].variants == ("A",)
    assert all(c.variants == ("A", "C", "Bp") for k, c in enumerate(cs) if k != 1)
    assert all(c.seeds == d.seeds and c.n_embd == d.n_embd for c in cs)
    for bad in (("lr=0.02", "lr=0.02"), ("nonsense=1",), ("lr",), ("seeds=1,2",), (), ("variants=A,Q",)):
        with pytest.raises(ValueError):
            S.SymptomSweepConfig(points=bad)
    monkeypatch.setenv("LPFAIL_SYMPTOM_PARALLEL", "0")
    with pytest.raises(ValueError):
        S.default_parallel([])
    monkeypatch.setenv("LPFAIL_SYMPTOM_PARALLEL", "3")
    assert S.default_parallel(["0", "1"]) == 3
    monkeypatch.delenv("LPFAIL_SYMPTOM_PARALLEL")
    assert S.default_parallel(["0", "1"]) == 16 and S.default_parallel([]) == 2

    # the checks are shared between configurations of one model shape, not across shapes
    c0 = tiny(max_steps=12, seeds=(0,), variants=("A",))
    c1 = dataclasses.replace(c0, lr=6e-3)
    c2 = dataclasses.replace(c0, n_embd=16)
    chk = {"cuda": True, "kernel": {"A": {"trusted": True}, "C": {"trusted": False}}}
    assert S._shareable(c1, c0, chk) and not S._shareable(c2, c0, chk)
    assert not S._shareable(dataclasses.replace(c0, variants=("A", "C", "D")), c0, chk)  # D was never checked
    # every stored neighbour finds its checks beside the migrated parts, the same shape as the default's
    grid = sweep.get("symptom_sweep")
    assert [g.chk()["cuda"] for g in grid.points] == [S.stored_checks(d)["cuda"]] * len(grid.points)
    # same init and batches: step 0's loss is computed before the lr acts, the same arithmetic (same machine)
    outs = []
    for c in (c0, c1):
        g = S.SymptomGrid(c, {"cuda": False})
        sweep.drive(g, root=tmp_path / "runs", directory=tmp_path, parallel=4, budget_s=600, log=lambda *a: None)
        lk = sweep.lookup(g, tmp_path)
        outs.append(g.result(lk.have, lk.parts))
    assert all(o["complete"] for o in outs)
    assert not np.array_equal(outs[0]["loss"][:, :, 5:], outs[1]["loss"][:, :, 5:])  # lr differs
    np.testing.assert_array_equal(outs[0]["loss"][:, :, 0], outs[1]["loss"][:, :, 0])


# -- the corpus -----------------------------------------------------------------------------------------
def test_pydocs_corpus_loads_and_matches_its_hashes():
    text = data.load_corpus("pydocs")  # checks the recorded sha256 of the text
    raw = text.encode("utf-8")
    assert len(raw) == 9_375_052
    assert hashlib.sha256(raw).hexdigest() == data.CORPORA["pydocs"][1]
    readme = (REPO / "lpfail" / "corpus" / "README.md").read_text()
    xz = (REPO / "lpfail" / "corpus" / "pydocs.txt.xz").read_bytes()
    assert hashlib.sha256(xz).hexdigest() in readme and data.CORPORA["pydocs"][1] in readme
    assert len(xz) < 8_000_000
    assert "The Python Tutorial" in text and "PSF LICENSE AGREEMENT" in text
    assert math.isclose(len(data.tokens("pydocs")), len(raw))


# -- collecting runs that crashed on non-finite values, and recollection from the logs --------------------
def _fake_run(d: Path, losses, status="running", stdout=""):
    d.mkdir(parents=True)
    with open(d / "log.jsonl", "w") as f:
        for i, l in enumerate(losses):
            f.write(json.dumps({"step": i, "loss": l, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 1.0,
                                "time_s": 0.1}) + "\n")
    (d / "run.json").write_text(json.dumps({"status": status, "steps": len(losses)}))
    (d / "stdout.txt").write_text(stdout)


def test_outcome_counts_a_crash_on_nonfinite_values_as_nonfinite(tmp_path):
    loss = list(_decay(300))
    _fake_run(tmp_path / "nan", loss, stdout="# 2026 first start\nerror: q contains non-finite values (inf or NaN)\n")
    o = S.outcome(tmp_path / "nan", warmup=100)
    assert (o["failed"], o["fail_step"], o["status"]) == (True, 300, "nonfinite") and "non-finite" in o["note"]
    # an earlier attempt's error does not count once a later start ran cleanly
    _fake_run(tmp_path / "later", loss, stdout="# a\nerror: q contains non-finite values\n\n# b\nstarted again\n")
    o = S.outcome(tmp_path / "later", warmup=100)
    assert (o["failed"], o["status"], o["note"]) == (False, "running", "")
    # other errors are errors, not failures of the criterion
    _fake_run(tmp_path / "err", loss, stdout="# a\nerror: TrainConfig.lr must be positive\n")
    o = S.outcome(tmp_path / "err", warmup=100)
    assert (o["failed"], o["status"]) == (False, "error")
    t = S.outcome_table(["A"], [0], [[True]], [[300]], [[float("nan")]], [["nonfinite"]], [[300]])
    assert "**fails** at 300 (non-finite)" in t


def test_save_with_provenance_keeps_the_integrity_fields(tmp_path):
    c = tiny()
    r = results.save("symptom", c, {"x": np.arange(3)}, 1.0, tmp_path,
                     provenance={"device": "NVIDIA H200", "collected_on": "cpu"})
    meta = json.loads((tmp_path / "symptom.json").read_text())
    assert meta["device"] == "NVIDIA H200" and meta["collected_on"] == "cpu" and r.meta["device"] == "NVIDIA H200"
    with pytest.raises(ValueError):
        results.save("symptom", c, {"x": np.arange(3)}, 1.0, tmp_path, provenance={"npz_sha256": "0"})


def test_stored_symptom_results_match_their_archive():
    """The committed results were collected from the committed run logs: same sha256, same losses; the run store
    was migrated from that archive."""
    import tarfile
    for name in ("symptom", "symptom_sweep"):
        meta = json.loads((REPO / "results" / f"{name}.json").read_text())
        arc = REPO / "results" / meta["runs_archive"]["path"]
        assert hashlib.sha256(arc.read_bytes()).hexdigest() == meta["runs_archive"]["sha256"]
    (part,) = part_files(REPO / "results" / "symptom_parts")
    assert read_part(part)["migrated_from"]["sha256"] == meta["runs_archive"]["sha256"]
    res = results.load("symptom")
    with tarfile.open(REPO / "results" / "symptom_runs.tgz") as tf:
        root = results.config_hash(S.SymptomConfig())
        f = tf.extractfile(f"./{root}/runs/A_s1/log.jsonl")
        loss = np.array([json.loads(line)["loss"] for line in f.read().decode().splitlines()], dtype=np.float32)
    i = list(res["variants"]).index("A")
    np.testing.assert_array_equal(res["loss"][i, 1, :len(loss)], loss)
    assert res["complete"] and res.meta["device"].startswith("NVIDIA H200")
