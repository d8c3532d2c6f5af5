"""Experiment `cures`: its grid is lr_sweep's (reusing stored runs), and its pre-registered rule on fabricated
results."""
import numpy as np
import pytest

from lpfail.experiments import cures as cu
from lpfail import results, sweep
from lpfail.experiments import lr_sweep as ls


def test_grid_is_lr_sweeps_and_reuses_its_runs():
    cfg = cu.CuresConfig()
    c = cfg.sweep()
    base = ls.LRSweepConfig()
    assert (c.lrs, c.seeds, c.small, c.max_steps, c.batch_size) == (base.lrs, base.seeds, base.small,
                                                                    base.max_steps, base.batch_size)
    assert c.large_variants == () and {p.size for p in ls.plan(c)} == {"small"}
    # a reused variant's run is the very lr_sweep run (same key, same TrainConfig hash)
    p = ls.Point("small", "A", base.lrs[0], 0)
    assert sweep.run_hash(ls.train_config(c, p, "")) == sweep.run_hash(ls.train_config(base, p, ""))
    s = cu.grid_status(cfg)
    assert s["planned"] == len(cfg.variants) * len(base.lrs) * len(base.seeds)
    for v in cu.NEW:  # stored or not, each new variant has its 6 × 3 points
        assert s["per_variant"][v]["planned"] == 18
    if ls.STORE.load()[0]:
        assert s["per_variant"]["A"]["stored"] == 18  # lr_sweep's A runs are found, not rerun


def test_new_variants_train_configs():
    c = cu.CuresConfig().sweep()
    tc = {v: ls.train_config(c, ls.Point("small", v, 1e-3, 0), "") for v in cu.NEW}
    assert tc["A_z"].z_loss == 1e-4 and tc["A_z"].attention == "reference(PAPER_BF16)"
    assert tc["A_cap"].logit_softcap == 30.0
    assert tc["A_res"].attention_table()[0][2].policy.delta == "dO.O_res"
    assert tc["A_ds"].attention_table()[0][2].policy.ds_rowsum is True
    assert tc["Bp"].attention_table()[0][2].policy.fix is not None
    assert len({sweep.run_hash(t) for t in tc.values()}) == len(tc)


def test_config_validation():
    with pytest.raises(ValueError, match="unknown variant"):
        cu.CuresConfig(variants=("A", "C", "nope"))
    with pytest.raises(ValueError, match="must include"):
        cu.CuresConfig(variants=("A", "A_z"))


def _fake(curves: dict, seeds=3, noise=0.005, seed=0):
    """A fabricated assembled result: per variant a loss curve over lr_sweep's 6 rates, plus seed noise."""
    rng = np.random.default_rng(seed)
    variants = list(curves)
    final = np.array([[[c + noise * rng.standard_normal() for _ in range(seeds)] for c in curves[v]]
                      for v in variants])
    return {"small_variants": np.array(variants), "small_val_final": final,
            "small_val_init": np.full(final.shape, 5.5), "small_tokens_per_s": np.full(final.shape, 1e5)}


def test_rule_on_fabricated_results():
    good = [1.6, 1.4, 1.3, 1.25, 1.25, 1.3]        # C-like: flat
    bad = [1.6, 1.4, 1.3, 1.3, 1.6, 2.4]           # A-like: turns up at the high rates
    half = [1.6, 1.4, 1.3, 1.28, 1.45, 1.9]
    out = cu.analyse(_fake({"A": bad, "C": good, "D": good, "A_z": bad, "Bp": half}))
    assert out["gap"]["ci"][0] > 0
    cures = out["cures"]
    assert cures["D"]["K1"]["verdict"] == "supported" and cures["D"]["K2"]["verdict"] == "supported"
    assert cures["D"]["gap_closed"] == pytest.approx(1.0, abs=0.1)
    assert cures["A_z"]["K1"]["verdict"] != "supported" and cures["A_z"]["K2"]["verdict"] == "refuted"
    assert cures["Bp"]["K1"]["verdict"] == "supported" and cures["Bp"]["K2"]["verdict"] != "supported"
    assert "K1" not in cures["C"] and cures["C"]["where"] == "—"
    assert out["preregistered_on"] == "2026-12-01"


def test_no_gap_means_nothing_to_close():
    flat = [1.6, 1.4, 1.3, 1.25, 1.25, 1.3]
    out = cu.analyse(_fake({"A": flat, "C": flat, "A_res": flat}, seed=1))
    assert out["cures"]["A_res"]["K2"]["verdict"] == "no gap to close"


def test_gradient_errors_rank_the_policies():
    from lpfail.precision import FP32, PAPER_BF16

    out = cu.gradient_errors({"A": PAPER_BF16, "C": FP32, "res": PAPER_BF16.replace(delta="dO.O_res")},
                             seeds=(0,), T=64, D=16)
    assert out["C"]["dq"] < out["A"]["dq"] / 3  # C: only the BF16 rounding of the returned gradients
    assert out["res"]["dq"] < out["A"]["dq"] and out["res"]["dv"] == out["A"]["dv"]


def _store_without(directory, drop):
    """A fabricated store of the whole cures grid (only what `lookup` reads) in ``directory``, minus the runs
    ``drop`` selects."""
    part = ls.STORE.part(directory)
    for r in cu.cures_grid().runs():
        if not drop(r):
            part.runs[r.key] = {"key": r.key, "run_hash": r.hash}
    part.write()
    return directory


def test_grid_status_names_the_missing_runs(tmp_path):
    d = _store_without(tmp_path / "a", lambda r: (r.group == "A_z" and r.seed == 2)
                       or (r.group == "A_cap" and r.config.lr == 1e-3))
    st = cu.grid_status(directory=d)
    assert not st["complete"] and st["planned"] - st["stored"] == 6 + 3
    assert st["per_variant"]["A_z"]["missing_lrs"] == {lr: [2] for lr in ls.LRSweepConfig().lrs}
    assert st["per_variant"]["A_cap"]["missing_lrs"] == {1e-3: [0, 1, 2]}
    assert "A_z" in st["not_judged"] and "A_cap" in st["not_judged"] and "Bp" in st["judgeable"]
    text = cu.status_text(st)
    assert "A_z: 12/18 stored; missing seed 2 at all 6 LRs" in text and "A_cap: 15/18 stored; missing lr 0.001: seed 0, 1, 2" in text
    # without a complete baseline nothing can be judged
    d = _store_without(tmp_path / "b", lambda r: r.group == "C" and r.seed == 0 and r.config.lr == 1e-3)
    st = cu.grid_status(directory=d)
    assert st["judgeable"] == [] and "Bp" in st["not_judged"]


def test_a_complete_cures_verdict_does_not_depend_on_the_others():
    # the reason chapter 6 may judge the complete cures of a partial grid: the rule is per cure
    good = [1.6, 1.4, 1.3, 1.25, 1.25, 1.3]
    bad = [1.6, 1.4, 1.3, 1.3, 1.6, 2.4]
    half = [1.6, 1.4, 1.3, 1.28, 1.45, 1.9]
    full = _fake({"A": bad, "C": good, "D": good, "A_z": bad, "Bp": half}, seed=3)
    keep = [0, 1, 4]  # A, C, Bp
    sub = {k: (v[keep] if k.startswith("small_") else v) for k, v in full.items()}
    a, b = cu.analyse(full), cu.analyse(sub)
    assert a["cures"]["Bp"] == b["cures"]["Bp"] and a["gap"] == b["gap"]


def test_collect_refuses_an_incomplete_grid(tmp_path, monkeypatch):
    from lpfail.sweep import SweepIncomplete, collect

    d = _store_without(tmp_path, lambda r: r.group == "A_hp" and r.seed == 2)
    monkeypatch.setattr(results, "save", lambda *a, **k: pytest.fail("collect wrote a partial result"))
    with pytest.raises(SweepIncomplete, match=r"6 of 252 runs are not stored yet \(missing per group: A_hp 6;.*"
                                              r"nothing stored"):
        collect(cu.cures_grid(), d, partial=True)


def test_chapter_table_judges_complete_cures_and_lists_the_missing_runs():
    """Chapter 6's table from the stored parts (216 of 252 runs on 2026-12-01): every cure has a row; a complete
    one shows its S and verdicts, an incomplete one what is missing and no verdict; cells are HTML-escaped."""
    from lpfail.book import beyond_report as br
    from lpfail.experiments import cures as cu

    part = cu.partial_analysis()
    variants = cu.CuresConfig().variants
    html = br.cures_table(part, variants)
    rows = html.split("<tr>")[2:]
    assert len(rows) == len(variants)
    st, an = part["status"], part["analysis"]
    for v, row in zip(variants, rows):
        judged = an is not None and v in an["cures"]
        assert ("not judged: incomplete" in row) == (not judged)
        if judged:
            assert f"{an['cures'][v]['S']:.3f}" in row
        else:
            assert "missing" in row and f"{st['per_variant'][v]['stored']}/" in row


def test_cures_outcome_groups_by_k2_and_scores_the_predictions():
    from lpfail.book import beyond_report as br

    a = {"cures": {"A": {"S": 1.0}, "D": {"K2": {"verdict": "supported"}},
                   "A_hp": {"K2": {"verdict": "refuted"}}, "A_z": {"K2": {"verdict": "supported"}},
                   "A_cap": {"K2": {"verdict": "inconclusive"}}},
         "predictions": {"A_hp": "closes little: x", "A_z": "closes little: y", "R": "closes as much as Bp",
                         "A_cap": "like A_z"}}
    o = br.cures_outcome(a)
    assert o["closes"] == ["D", "A_z"] and o["does_not"] == ["A_hp"] and o["inconclusive"] == ["A_cap"]
    assert o["predicted_little"] == {"A_hp": "hit", "A_z": "miss", "A_cap": "hit"}
    t = br.cures_outcome_text(a)
    assert "δ from an FP32 O" in t and "2 of 3 did as predicted" in t
