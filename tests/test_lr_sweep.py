"""The lr_sweep experiment (chapter 1): the pre-registered analysis on fabricated curves, the grid and its
config, the descriptive comparison with the control, and the report's tables (the framework it runs on, with a
tiny sweep end to end, is tests/test_sweep.py)."""
import json
from pathlib import Path

import numpy as np
import pytest

from lpfail import results
from lpfail.experiments import lr_sweep as L
from lpfail.sweep import stats

LRS = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)


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


def test_versus_control_shares_of_the_gap():
    # D as good as C, B halfway, A_sr as bad as A: shares ≈ 1, ½, 0 of the A − C gap
    res = _fake({"A": 0.6, "C": 0.0, "D": 0.0, "B": 0.3, "A_sr": 0.6}, noise=0.002)
    rows = {r["variant"]: r for r in L.versus_control(res)}
    assert set(rows) == {"D", "B", "A_sr"}
    assert rows["D"]["closed"]["point"] == pytest.approx(1, abs=0.05)
    eff = stats.effective_loss(res["small_val_final"], res["small_val_init"]).mean(axis=-1)
    S = dict(zip(res["small_variants"], stats.sensitivity(eff)))
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


def test_report_tables_from_parts_and_their_metadata(tmp_path):
    from lpfail.book import lr_sweep_report as LR

    old = L.STORE.part(tmp_path)  # a part written before the parts recorded how their call ran
    old.path = old.path.with_name("part-20261130T000000-1.json")  # not the same second's name as the next
    old.add({"key": "small/C/lr0.002/s0", "run_hash": "h0", "wall_s": 5.0})
    part = L.STORE.part(tmp_path)
    part.meta.update(parallel=5, gpus=["0"], uncaptured=["A_sr"], budget_s=9.0)  # as lpfail.sweep.run records it
    for k, w in (("small/A/lr0.001/s0", 10.0), ("small/C/lr0.001/s0", 30.0), ("large/A/lr0.001/s0", 99.0)):
        part.add({"key": k, "run_hash": "h", "wall_s": w})
    (tmp_path / "lr_sweep_gpu").mkdir()  # a driver's log is not read, whatever it says
    (tmp_path / "lr_sweep_gpu" / "drive-x.log").write_text(f"lr_sweep: 3 runs, 7 at a time, part {part.path.name}\n")
    assert LR.calls_rows(tmp_path) == []  # none of these keys is in lr_sweep's grid
    rows = {r["file"]: r for r in LR.calls_rows(tmp_path, grid=False)}
    row = rows[part.name]
    assert row["runs"] == 3 and row["parallel"] == 5 and row["uncaptured"] == "A_sr" and row["budget_s"] == 9.0
    assert row["median_wall_s"] == {"small": (20.0, 2), "large": (99.0, 1)}
    assert rows[old.name]["parallel"] is None and rows[old.name]["uncaptured"] is None
    table = LR.calls_table(tmp_path, grid=False)
    assert "A_sr" in table and "not recorded" in table and ">7<" not in table
    t = LR.closure_table(_fake({"A": 0.6, "C": 0.0, "D": 0.0}, noise=0.002), "small", ("D", "S"))
    assert "D: FA2_BF16" in t and "S: PyTorch" not in t and "at lr 0.016" in t
    with pytest.raises(ValueError, match="none of"):
        LR.closure_table(_fake({"A": 0.6, "C": 0.0}), "small", ("D",))


