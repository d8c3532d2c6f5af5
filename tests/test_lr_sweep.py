"""The lr_sweep experiment (chapter 1): the pre-registered statistics on fabricated curves, the grid, the parts
that merge across calls, and a tiny sweep end to end on the CPU."""
import json
from pathlib import Path

import numpy as np
import pytest

from lpfail import results
from lpfail.experiments import lr_sweep as L

LRS = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)


def test_sensitivity_is_mean_minus_min():
    curve = np.array([3.0, 2.0, 1.5, 1.6, 2.5, 5.0])
    assert L.sensitivity(curve) == pytest.approx(curve.mean() - 1.5)
    assert L.sensitivity(np.full(6, 2.0)) == 0.0


def test_effective_loss_caps_at_init_and_counts_nonfinite_as_init():
    final = np.array([1.0, 7.0, np.nan, np.inf])
    init = np.array([5.5, 5.5, 5.5, 5.4])
    assert L.effective_loss(final, init).tolist() == [1.0, 5.5, 5.5, 5.4]


def test_judge():
    assert L.judge(0.1, 0.2, "above") == "supported"
    assert L.judge(-0.2, -0.1, "above") == "refuted"
    assert L.judge(-0.1, 0.1, "above") == "inconclusive"
    assert L.judge(-0.2, -0.1, "below") == "supported"
    assert L.judge(0.1, 0.2, "below") == "refuted"
    with pytest.raises(ValueError, match="side"):
        L.judge(0, 1, "left")


def test_lr_exceeding():
    lrs = np.array(LRS)
    assert L.lr_exceeding([3, 2, 1.5, 1.6, 1.66, 5], lrs) == pytest.approx(1.6e-2)  # 1.66 > 1.65
    assert np.isnan(L.lr_exceeding([3, 2, 1.5, 1.6, 1.6, 1.6], lrs))


def _fake(gaps: dict, n_seeds=3, noise=0.01, seed=0, large_gap=None):
    """A result dict like `assemble` makes: C's curve is a bowl; each variant adds gaps[v] × a ramp that is 0
    at low lr and 1 at the highest (plus seed noise)."""
    rng = np.random.default_rng(seed)
    base = np.array([2.0, 1.7, 1.5, 1.45, 1.6, 2.2])
    ramp = np.array([0, 0, 0, 0.2, 0.6, 1.0])
    out = {"lrs": np.array(LRS), "seeds": np.arange(n_seeds)}
    for size, g in (("small", gaps), ("large", large_gap)):
        if g is None:
            continue
        vs = list(g)
        final = np.stack([base[:, None] + g[v] * ramp[:, None] + noise * rng.standard_normal((6, n_seeds))
                          for v in vs])
        out[f"{size}_variants"] = np.array(vs)
        out[f"{size}_val_final"] = final
        out[f"{size}_val_init"] = np.full(final.shape, 5.5)
        out[f"{size}_status"] = np.zeros(final.shape, dtype=np.int8)
    return out


def test_h1_supported_and_sr_closing_the_gap():
    res = _fake({"A": 0.5, "C": 0.0, "A_sr": 0.05, "A_qk": 0.0, "C_qk": 0.0})
    a = L.analyse(res)
    v = a["verdicts"]
    assert v["H1"]["verdict"] == "supported" and v["H1"]["point"] > 0.05
    assert v["H2"]["verdict"] == "supported"  # A_sr − C is far below half of A − C
    assert v["H3"]["verdict"] == "supported"
    s = a["sizes"]["small"]
    assert s["A"]["S"] > s["C"]["S"] and s["A"]["ci"][0] <= s["A"]["S"] <= s["A"]["ci"][1]
    assert a["preregistered_on"] == L.PREREGISTERED_ON


def test_h2_refuted_when_sr_keeps_the_gap():
    v = L.analyse(_fake({"A": 0.5, "C": 0.0, "A_sr": 0.5}))["verdicts"]
    assert v["H1"]["verdict"] == "supported" and v["H2"]["verdict"] == "refuted"


def test_no_gap_means_no_gap_to_close():
    v = L.analyse(_fake({"A": 0.0, "C": 0.0, "A_sr": 0.0}))["verdicts"]
    assert v["H1"]["verdict"] in ("inconclusive", "refuted")
    assert v["H2"]["verdict"] == "no gap to close"


def test_h1_refuted_when_a_is_better():
    assert L.analyse(_fake({"A": 0.0, "C": 0.5}))["verdicts"]["H1"]["verdict"] == "refuted"


def test_h4_compares_sizes():
    v = L.analyse(_fake({"A": 0.2, "C": 0.0}, large_gap={"A": 0.8, "C": 0.0}))["verdicts"]
    assert v["H4"]["verdict"] == "supported" and v["H4"]["point"] > 0
    v = L.analyse(_fake({"A": 0.8, "C": 0.0}, large_gap={"A": 0.2, "C": 0.0}))["verdicts"]
    assert v["H4"]["verdict"] == "refuted"


def test_nonfinite_runs_count_as_init_loss():
    res = _fake({"A": 0.0, "C": 0.0})
    res["small_val_final"][0, -1, :] = np.nan  # A diverged at the highest lr, every seed
    a = L.analyse(res)
    assert a["sizes"]["small"]["A"]["curve"][-1] == pytest.approx(5.5)
    assert a["verdicts"]["H1"]["verdict"] == "supported"


def test_bootstrap_is_paired_and_fixed():
    i1, i2 = L.bootstrap_seed_indices(3), L.bootstrap_seed_indices(3)
    assert np.array_equal(i1, i2) and i1.shape == (L.N_BOOTSTRAP, 3)
    # identical variants: every paired draw of the difference is exactly 0
    x = np.random.default_rng(1).normal(2, 0.1, size=(1, 6, 3))
    _, d = L.sensitivities(np.concatenate([x, x]), i1)
    assert np.array_equal(d[0], d[1])


def test_default_grid_and_plan():
    c = L.LRSweepConfig()
    pts = L.plan(c)
    assert len(pts) == 6 * 3 * 8 + 6 * 3 * 3 == 198
    assert len({p.key for p in pts}) == len(pts)
    assert max(c.lrs) / min(c.lrs) >= 30 and len(c.lrs) >= 6 and len(c.seeds) >= 3
    assert pts[0].size == "small" and pts[0].variant == "A"
    tc = L.train_config(c, pts[0], "/tmp/x")
    assert tc.attention == "reference(PAPER_BF16)" and tc.val_fraction > 0 and tc.cuda_graph
    qk = L.train_config(c, L.Point("small", "A_qk", 1e-3, 0), "")
    assert qk.qk_norm and qk.attention == tc.attention


@pytest.mark.parametrize("bad, match", [
    (dict(variants=("A", "Z")), "unknown variant"),
    (dict(lrs=(1e-2, 1e-3)), "increasing"),
    (dict(seeds=(0, 0, 1)), "repeat"),
    (dict(small=(4, 3, 256)), "n_head"),
    (dict(min_lr_ratio=0.0), "min_lr_ratio"),
])
def test_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        L.LRSweepConfig(**bad)


def test_run_hash_ignores_where_not_what():
    c = L.LRSweepConfig()
    p = L.plan(c)[0]
    h = L.run_hash(L.train_config(c, p, ""))
    assert L.run_hash(L.train_config(c, p, "/somewhere/else")) == h
    assert L.run_hash(L.train_config(c, L.Point(p.size, p.variant, 2e-3, p.seed), "")) != h


TINY = dict(lrs=(1e-3, 1e-2), seeds=(0,), variants=("A", "C"), large_variants=(), small=(1, 2, 32),
            block_size=16, batch_size=4, max_steps=6, warmup=2, val_rows=4, val_every=3, diag_every=3,
            curve_points=3, checkpoint_every=3)


def test_tiny_sweep_end_to_end(tmp_path):
    c = L.LRSweepConfig(**TINY)
    runs = L.run_points(c, L.plan(c), root=tmp_path / "root", directory=tmp_path, parallel=2, budget_s=600,
                        log=lambda *_: None)
    assert len(runs) == 4 and all(r["status"] == "completed" for r in runs.values())
    stored, _ = L.load_parts(tmp_path)
    have, missing = L.stored_for(c, stored)
    assert not missing and len(have) == 4  # a second call would run nothing
    assert not list((tmp_path / "root").rglob("ckpt_*.pt"))  # finished runs leave no checkpoints behind
    res = L.store_from_parts(c, directory=tmp_path)
    assert "collected from their logs" in res.provenance
    again = results.load("lr_sweep", c, directory=tmp_path)
    assert again["small_val_final"].shape == (2, 2, 1) and np.isfinite(again["small_val_final"]).all()
    assert (again["small_val_final"] < again["small_val_init"]).all()  # 6 steps of training help a little
    assert again["small_max_logit"].shape == (2, 2, 1, 2, 1)
    # a grid with more points than stored: refused whole, stored marked incomplete with --partial
    bigger = L.LRSweepConfig(**{**TINY, "variants": ("A", "C", "C_qk")})
    with pytest.raises(L.SweepIncomplete, match="2 of 6 runs are not stored"):
        L.store_from_parts(bigger, directory=tmp_path)
    part = L.store_from_parts(bigger, directory=tmp_path, partial=True)
    assert part["complete"] is False and part["runs_stored"] == 4 and part["runs_planned"] == 6
    assert part["small_stored"][:2].all() and not part["small_stored"][2].any()
    a = part["analysis"]
    assert set(a["sizes"]["small"]) == {"A", "C"} and a["incomplete"]["small"]["C_qk"] == {"stored": 0, "runs": 2}
    assert a["verdicts"]["H3"]["verdict"] == "not measured (runs missing)"
    # a changed setting orphans the stored runs instead of silently reusing them
    _, missing = L.stored_for(L.LRSweepConfig(**{**TINY, "max_steps": 9}), stored)
    assert len(missing) == 4
    # a corrupt part is an error that names it
    bad = tmp_path / L.PARTS_DIR / "part-0-bad.json"
    bad.write_text("{not json")
    with pytest.raises(results.ResultCorrupt, match="part-0-bad"):
        L.load_parts(tmp_path)


def test_incomplete_sweep_says_how_many(tmp_path):
    c = L.LRSweepConfig(**TINY)
    with pytest.raises(L.SweepIncomplete, match="none of the 4 runs"):
        L.store_from_parts(c, directory=tmp_path)
    part = L.Part(tmp_path)
    part.add({"key": L.plan(c)[0].key, "run_hash": "stale"})
    stored, metas = L.load_parts(tmp_path)
    assert len(metas) == 1 and L.stored_for(c, stored)[1][0].key == L.plan(c)[0].key


def test_validation_split_is_never_trained_on():
    from lpfail.train import TrainConfig, split_validation, validation_offsets

    cfg = TrainConfig(block_size=16, val_fraction=0.1, val_rows=8)
    toks = np.arange(1000)
    train, val = split_validation(toks, cfg)
    assert len(val) == 100 and train[-1] < val[0]
    off = validation_offsets(len(val), cfg)
    assert off.min() == 0 and off.max() + cfg.block_size + 1 == len(val) and len(off) == 8
    with pytest.raises(ValueError, match="val_fraction"):
        TrainConfig(val_fraction=0.6)
    assert split_validation(toks, TrainConfig())[1] is None


def test_part_file_is_json_with_provenance(tmp_path):
    part = L.Part(tmp_path)
    part.add({"key": "k", "run_hash": "h", "x": float("nan")})
    d = json.loads(part.path.read_text())
    assert d["format"] == L.PART_FORMAT and {"git", "device", "created", "versions"} <= set(d)


def test_versus_control_shares_of_the_gap():
    # D as good as C, B halfway, A_sr as bad as A: shares ≈ 1, ½, 0 of the A − C gap
    res = _fake({"A": 0.6, "C": 0.0, "D": 0.0, "B": 0.3, "A_sr": 0.6}, noise=0.002)
    rows = {r["variant"]: r for r in L.versus_control(res)}
    assert set(rows) == {"D", "B", "A_sr"}
    assert rows["D"]["closed"]["point"] == pytest.approx(1, abs=0.05)
    eff = L.effective_loss(res["small_val_final"], res["small_val_init"]).mean(axis=-1)
    S = dict(zip(res["small_variants"], L.sensitivity(eff)))
    assert rows["B"]["closed"]["point"] == pytest.approx(1 - (S["B"] - S["C"]) / (S["A"] - S["C"]))
    assert 0.2 < rows["B"]["closed"]["point"] < 0.8
    assert rows["A_sr"]["closed"]["point"] == pytest.approx(0, abs=0.05)
    for r in rows.values():
        lo, hi = r["closed"]["ci"]
        assert lo <= r["closed"]["point"] <= hi
        assert [d["lr"] for d in r["per_lr"]] == pytest.approx([1.6e-2, 3.2e-2])
    assert rows["B"]["per_lr"][1]["point"] == pytest.approx(0.3, abs=0.01)  # the ramp is 1 at the top lr
    # no gap in some resample → no share
    flat = {r["variant"]: r for r in L.versus_control(_fake({"A": 0.0, "C": 0.0, "D": 0.1}))}
    assert flat["D"]["closed"] is None and flat["D"]["minus_control"]["point"] > 0
    with pytest.raises(KeyError, match="'Z'"):
        L.versus_control(res, control="Z")
    res["small_stored"] = np.ones(res["small_val_final"].shape, bool)
    res["small_stored"][1, 0, 0] = False  # a run of C missing
    with pytest.raises(L.SweepIncomplete, match="not all stored"):
        L.versus_control(res)


def test_report_tables_from_parts_and_logs(tmp_path):
    from lpfail.book import lr_sweep_report as LR

    part = L.Part(tmp_path)
    for k, w in (("small/A/lr0.001/s0", 10.0), ("small/C/lr0.001/s0", 30.0), ("large/A/lr0.001/s0", 99.0)):
        part.add({"key": k, "run_hash": "h", "wall_s": w})
    (tmp_path / "lr_sweep_gpu").mkdir()
    (tmp_path / "lr_sweep_gpu" / "drive-x.log").write_text(
        f"lr_sweep: 3 runs, 5 at a time on GPUs ['0'], budget 9 s, root r, part {part.path.name}, uncaptured: ['A_sr']\n")
    assert LR.calls_rows(tmp_path) == []  # none of these keys is in lr_sweep's grid
    (row,) = LR.calls_rows(tmp_path, grid=False)
    assert row["runs"] == 3 and row["parallel"] == 5 and row["uncaptured"] == "A_sr"
    assert row["median_wall_s"] == {"small": (20.0, 2), "large": (99.0, 1)}
    assert "A_sr" in LR.calls_table(tmp_path, grid=False)
    (tmp_path / "lr_sweep_gpu" / "drive-x.log").write_text("an older log without the header\n")
    assert LR.calls_rows(tmp_path, grid=False)[0]["parallel"] is None
    assert "not in the log" in LR.calls_table(tmp_path, grid=False)
    t = LR.closure_table(_fake({"A": 0.6, "C": 0.0, "D": 0.0}, noise=0.002), "small", ("D", "S"))
    assert "D: FA2_BF16" in t and "S: PyTorch" not in t and "at lr 0.016" in t
    with pytest.raises(ValueError, match="none of"):
        LR.closure_table(_fake({"A": 0.6, "C": 0.0}), "small", ("D",))


def test_parts_provenance_and_sweep_command():
    used = [{"device": "NVIDIA H200", "created": "2026-12-01T03:55", "git": "048e3378a0dce71f", "wall_s": 10.0},
            {"device": "NVIDIA H200", "created": "2026-12-01T05:23", "git": "5112e531be604454", "wall_s": 5.5}]
    p = L.parts_provenance(used)
    assert p["device"] == "NVIDIA H200" and p["created"] == "2026-12-01T05:23" and p["runs_wall_s"] == 15.5
    assert p["git"] == "048e3378a0dc 5112e531be60" and {"collected_on", "collected_at", "collected_git"} <= set(p)
    assert L.parts_provenance([], none="lr_sweep's runs only")["device"] == "lr_sweep's runs only"
    with pytest.raises(ValueError, match="unknown command"):
        L.sweep_command("collect", L.LRSweepConfig(**TINY), Path("/nonexistent"), None, "x")
