"""kernels.bench's summaries of a stored benchmark (CPU: fake results with known ratios)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lpfail.kernels.bench import summary, targets

METHODS = ["sdpa_flash", "sdpa_cudnn", "triton", "triton_fix", "triton_paper", "reference_paper"]
MODES = ["fwd", "bwd", "fwd_bwd"]


def fake(flash=100.0, cudnn=150.0, triton=(130.0, 110.0), fix_cost=(0.10, 0.02), paper_x=8.0):
    tf = np.full((2, 3, len(METHODS), 3), np.nan)
    tf[..., 0, :] = flash
    tf[..., 1, :] = cudnn
    tf[..., 2, 0], tf[..., 2, 2], tf[..., 2, 1] = triton[0], triton[1], 100.0
    tf[..., 3, :] = 90.0
    tf[..., 4, :] = 50.0
    tf[..., 5, :] = 50.0 / paper_x
    tf[:, 2, 5, :] = np.nan                                   # the reference is not timed at the largest N
    ratio = np.empty((2, 3, 1, 2))
    ratio[..., 0], ratio[..., 1] = 1 + fix_cost[0], 1 + fix_cost[1]
    return {"methods": np.array(METHODS), "modes": np.array(MODES), "head_dims": np.array([64, 128]),
            "seq_lens": np.array([1024, 2048, 4096]), "tflops": tf, "ms": 1.0 / tf,
            "pairs": np.array(["triton/triton_fix"]), "pair_modes": np.array(["fwd", "fwd_bwd"]), "pair_ratio": ratio}


def test_summary_ratios():
    rows = summary(fake())
    assert len(rows) == 6 and rows[0]["head_dim"] == 64 and rows[0]["n"] == 1024
    r = rows[1]
    assert math.isclose(r["fwd_vs_flash"], 1.3) and math.isclose(r["fwd_bwd_vs_flash"], 1.1)
    assert math.isclose(r["fwd_vs_cudnn"], 130 / 150) and math.isclose(r["fix_cost_fwd_bwd"], 0.02)
    assert math.isclose(r["paper_speedup"], 8.0)
    assert math.isnan(rows[2]["paper_speedup"])


def test_targets_met_and_missed():
    t = {x["target"]: x for x in targets(fake())}
    assert t["fwd / SDPA flash"]["met"] and t["fwd+bwd / SDPA flash"]["met"]
    assert t["fix cost, fwd+bwd"]["met"] and t["PAPER_BF16 kernel / reference"]["met"]
    t = {x["target"]: x for x in targets(fake(triton=(115.0, 95.0), fix_cost=(0.2, 0.05), paper_x=4.0))}
    assert not any(x["met"] for x in t.values())
    assert math.isclose(t["fwd / SDPA flash"]["worst"], 1.15) and math.isclose(t["fix cost, fwd+bwd"]["worst"], 0.05)


def test_targets_without_alternating_timings_are_unknown():
    res = {k: v for k, v in fake().items() if not k.startswith("pair")}
    t = {x["target"]: x for x in targets(res)}
    assert t["fix cost, fwd+bwd"]["met"] is None and math.isnan(t["fix cost, fwd+bwd"]["worst"])


def test_targets_figure_draws_both_panels():
    import matplotlib
    matplotlib.use("Agg")
    from lpfail.book import kernel_plots as KP
    res = fake()
    res["methods"] = np.array(METHODS)
    fig = KP.kernel_targets_figure(res)
    axes = fig.axes
    assert len(axes) == 4
    labels = [line.get_label() for line in axes[1].get_lines()]
    # the fix's cost per mode of the subtraction, named in words (the book's figures name no method by its code)
    assert "scale, subtract: fwd + bwd" in labels and any("target" in x for x in labels)
    target = [line for line in axes[0].get_lines() if "target" in line.get_label()][0]
    assert np.allclose(target.get_ydata(), 1.2 * 100.0)


def test_markdown_tables():
    from lpfail.kernels.bench import summary_markdown, targets_markdown
    res = fake(triton=(115.0, 95.0), fix_cost=(0.2, 0.05))
    t = targets_markdown(res, methods=("triton",))
    assert "| `triton` | fwd / SDPA flash | ≥ 1.2× | 1.15× | 1.15× | **no** |" in t
    assert "| `triton` | fix cost, fwd+bwd | ≤ 3 % | +5.0 % | +5.0 % | **no** |" in t
    s = summary_markdown(res, methods=("triton",))
    assert s.count("\n") == 2 + 6 - 1 and "| `triton` | 64 | 1024 | 1.15× | 0.95× |" in s


# -- the robust fix's cost: the stored result imported from the device's JSON, and its targets ------------------
def _raw_robust(cost_pct=None, drop=None, extra=None):
    """A tools/gpu_robust_cost.py JSON over RobustCostConfig's grid; ``cost_pct(d, n, pair, mode)`` gives each."""
    from lpfail.kernels.bench import RobustCostConfig

    cfg = RobustCostConfig()
    cost_pct = cost_pct or (lambda d, n, pair, mode: 2.0 if mode == "fwd_bwd" else 5.0)
    rows = [{"d": d, "n": n, "pair": list(p), "mode": m, "ms": [1.0, 1.0 + cost_pct(d, n, p, m) / 100],
             "cost_pct": cost_pct(d, n, p, m)}
            for d in cfg.head_dims for n in cfg.seq_lens for p in cfg.pairs for m in cfg.modes]
    if drop is not None:
        rows.pop(drop)
    rows += extra or []
    return {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "pairs": [list(p) for p in cfg.pairs], "rows": rows}


VERSIONS = {"python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0"}


def test_robust_cost_import_stores_provenance_and_targets(tmp_path):
    from lpfail.kernels.bench import import_robust_cost, robust_markdown, robust_summary
    from lpfail import results

    def cost(d, n, pair, mode):   # the fma pair misses the forward target at d = 64, N = 8192 only
        return 20.0 if (pair[0] == "triton_fma" and mode == "fwd" and d == 64 and n == 8192) else 1.0
    import_robust_cost(_raw_robust(cost), "23f8cd9", "2026-12-01T08:08:22+00:00", VERSIONS, 134.0,
                       directory=tmp_path)
    res = results.load("robust_cost", directory=tmp_path)
    assert res.meta["git"] == "23f8cd9" and res.meta["created"].startswith("2026-12-01")
    assert res.meta["device"] == "NVIDIA H200" and res.meta["versions"]["triton"] == "3.6.0"
    rows = {(r["base"], r["mode"]): r for r in robust_summary(res)}
    miss = rows[("triton_fma", "fwd")]
    assert miss["met"] is False and math.isclose(miss["worst"], 0.20) and miss["shapes_over"] == 1
    assert math.isclose(miss["excess"], 0.12)
    assert rows[("triton", "fwd")]["met"] is True and rows[("triton", "fwd_bwd")]["bound"] == 0.03
    assert rows[("triton_fix", "fwd")]["bound"] is None          # against Algorithm 3: no target
    assert "**no**" in robust_markdown(res) and "+12.0 points" in robust_markdown(res)


def test_robust_cost_import_refuses_incomplete_or_unknown(tmp_path):
    import pytest

    from lpfail.kernels.bench import import_robust_cost

    with pytest.raises(ValueError, match="missing"):
        import_robust_cost(_raw_robust(drop=3), "g", "2026-12-01", VERSIONS, 1.0, directory=tmp_path)
    bad = {"d": 32, "n": 2048, "pair": ["triton", "triton_robust"], "mode": "fwd", "ms": [1, 1], "cost_pct": 0}
    with pytest.raises(ValueError, match="not in the grid"):
        import_robust_cost(_raw_robust(extra=[bad]), "g", "2026-12-01", VERSIONS, 1.0, directory=tmp_path)
    with pytest.raises(ValueError, match="git"):
        import_robust_cost(_raw_robust(), "", "2026-12-01", VERSIONS, 1.0, directory=tmp_path)
    with pytest.raises(ValueError, match="torch"):
        import_robust_cost(_raw_robust(), "g", "2026-12-01", {"torch": "2.13.0+cpu", "triton": "3.6.0"}, 1.0,
                           directory=tmp_path)
    assert not (tmp_path / "robust_cost.json").exists()           # nothing half-written


def test_host_time_record_is_read_checked_and_tabled(tmp_path):
    from lpfail.kernels.bench import HOST_FILE, host_time_rows, load_host_time

    with pytest.raises(FileNotFoundError, match="gpu_overhead"):
        load_host_time(tmp_path)
    p = tmp_path / HOST_FILE
    p.parent.mkdir(parents=True)
    p.write_text("{")
    with pytest.raises(ValueError, match="corrupt"):
        load_host_time(tmp_path)
    p.write_text(json.dumps({"device": "X"}))
    with pytest.raises(ValueError, match="missing"):
        load_host_time(tmp_path)
    rec = {"device": "X", "when_utc": "t", "commit": "c", "shape": [1, 1, 128, 64], "target_us": 40,
           "dropin": {"fwd": 40.32, "robust_fwd": 38.5, "policy_fwd": 36.9, "fwd_bwd": 381.0},
           "dropin_jit_path": {"fwd": 100.3, "fwd_bwd": 632.7}, "direct_equals_jit_bits": True,
           "sdpa_flash": {"fwd": 24.2, "fwd_bwd": 151.6}, "sdpa_cudnn": {"fwd": 23.3}}
    p.write_text(json.dumps(rec))
    rows = host_time_rows(load_host_time(tmp_path))
    assert [r[0] for r in rows] == ["drop-in, forward", "drop-in + robust fix, forward", "policy style, forward",
                                    "drop-in, fwd + bwd"]
    assert rows[0] == ["drop-in, forward", "40.3", "100", "24", "23", "no"]   # 40.32 > 40: missed
    assert rows[1][-1] == "yes" and rows[1][2] == "—" and rows[3][-1] == "—" and rows[3][4] == "—"


def test_host_fwd_bwd_facts_give_the_ratio_the_target_and_the_python_floor():
    from lpfail.kernels.bench import host_fwd_bwd_facts

    rec = {"dropin": {"fwd_bwd": 375.56}, "sdpa_flash": {"fwd_bwd": 243.0}}
    f = host_fwd_bwd_facts(rec)
    assert f["host_fb"] == "376 µs" and f["host_fb_sdpa"] == "243 µs" and f["host_fb_ratio"] == "1.55 ×"
    assert f["host_fb_met"] == "missed" and "host_floor" not in f           # an older record: no floor phrases
    rec["dropin"]["fwd_bwd"] = 364.0                                        # 1.498 × : met
    rec["noop_function"] = {"fwd_bwd": 176.92}
    f = host_fwd_bwd_facts(rec)
    assert f["host_fb_met"] == "met" and f["host_floor"] == "177 µs" and f["host_floor_sdpa"] == "0.73 ×"
    assert f["host_floor_share"] == "49 %" and f["host_above_floor"] == "187 µs"
    for bad in ({"dropin": {}, "sdpa_flash": {"fwd_bwd": 1.0}}, {"dropin": {"fwd_bwd": 1.0}, "sdpa_flash": {"fwd_bwd": 0}},
                {"dropin": {"fwd_bwd": 1.0}, "sdpa_flash": {"fwd_bwd": 1.0}, "noop_function": {"fwd_bwd": "x"}}):
        with pytest.raises(ValueError, match="positive number"):
            host_fwd_bwd_facts(bad)


def test_sdpa_host_spread_reads_every_record_and_needs_two(tmp_path):
    from lpfail.kernels.bench import sdpa_host_spread

    root = tmp_path / "kernels_gpu"
    (root / "tune_a").mkdir(parents=True)
    record = {"sdpa_flash": {"fwd_bwd": 243.0}}                  # the host-time record itself
    with pytest.raises(ValueError, match="found 1"):
        sdpa_host_spread(record, tmp_path)
    (root / "tune_a" / "host.json").write_text(json.dumps({"sdpa_flash fwd_bwd": {"median_us": 164.98}}))
    (root / "tune_b").mkdir()
    (root / "tune_b" / "host.json").write_text(json.dumps({"dropin fwd": {"median_us": 1.0}}))  # no SDPA cell
    assert sdpa_host_spread(record, tmp_path) == {"host_sdpa_lo": "165 µs", "host_sdpa_hi": "243 µs",
                                                  "host_sdpa_n": "2"}


def test_interleaved_timing_visits_every_method_each_round_and_takes_the_median_of_rounds():
    """`time_interleaved` (issue 25: two timings of one kernel in one run differed by ≈ 10 %): warm-up for every
    method first, then rounds that visit each method in turn, reversed every other round; per method the median
    of its round medians and their spread. A drift that grows with time then biases no method."""
    from lpfail.kernels.bench import time_interleaved

    clock, visits, warm = [0.0], [], []

    def runner(fn, sets, mode):
        name = fn

        def call(i):
            warm.append(name)

        def timed(i):
            clock[0] += 1.0               # every timing a little slower than the one before: drift
            visits.append(name)
            return {"a": 1.0, "b": 2.0}[name] + 0.01 * clock[0]
        return call, timed

    synced = []
    out = time_interleaved({"a": "a", "b": "b"}, [None], "fwd", rounds=4, reps=3, warmup=2, runner=runner,
                           sync=lambda: synced.append(True))
    assert warm == ["a", "a", "b", "b"] and synced == [True]
    assert visits == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3 + ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3
    assert len(out["a"]["rounds"]) == len(out["b"]["rounds"]) == 4
    # round medians: a at clocks 2, 11, 14, 23 → 1.02, 1.11, 1.14, 1.23; b at 5, 8, 17, 20
    assert out["a"]["rounds"] == pytest.approx([1.02, 1.11, 1.14, 1.23])
    assert out["a"]["ms"] == pytest.approx((1.11 + 1.14) / 2) and out["b"]["ms"] == pytest.approx(2 + (0.08 + 0.17) / 2)
    # the drift lands equally on both: their medians differ by the true 1.0 plus only the 0.005 of interleaving
    assert out["b"]["ms"] - out["a"]["ms"] == pytest.approx(1.0, abs=0.01)
    assert out["a"]["spread"] == pytest.approx((1.23 - 1.02) / out["a"]["ms"])
    with pytest.raises(ValueError, match="rounds and reps"):
        time_interleaved({"a": "a"}, [None], "fwd", rounds=0, reps=3, warmup=0, runner=runner, sync=lambda: None)
