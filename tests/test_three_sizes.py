"""Chapter 1's three-size picture (lpfail.book.confirmation_report: size_curves, three_size_figure,
three_size_text)
on a small synthetic confirmation result: a complete size and an incomplete one."""
import numpy as np
import pytest

from lpfail.book import confirmation_report as CR
from lpfail.book import training_claims as TC
from lpfail.sweep import stats


def _conf():
    lrs = [1e-3, 2e-3, 4e-3]
    # A, C over (lrs, seeds): C is best at 1e-3 (1.30), within 10 % at 2e-3 (1.40), degraded at 4e-3 (2.0)
    c = np.array([[1.30, 1.31, 1.29], [1.40, 1.41, 1.39], [2.00, 2.10, 1.90]])
    a = c + np.array([[0.00, 0.01, -0.01], [0.01, 0.00, 0.02], [0.30, 0.40, 0.20]])
    small = {"small_variants": np.array(["A", "C"]), "small_val_final": np.stack([a, c]),
             "small_val_init": np.full((2, 3, 3), 5.5), "small_stored": np.ones((2, 3, 3), bool),
             "small_seeds": np.arange(3), "small_lrs": np.array(lrs)}
    g_stored = np.zeros((3, 3, 5), bool)
    g_stored[0, :, 0] = True          # A at every rate, seed 0
    g_stored[1, :2, 0] = True         # C at the two lower rates, seed 0
    g_final = np.full((3, 3, 5), np.nan)
    g_final[0, :, 0] = [1.2801, 1.30, 3.0]
    g_final[1, :2, 0] = [1.2803, 1.25]
    gpt2 = {"gpt2_variants": np.array(["A", "C", "D"]), "gpt2_val_final": g_final,
            "gpt2_val_init": np.full((3, 3, 5), 5.5), "gpt2_stored": g_stored, "gpt2_seeds": np.arange(5),
            "gpt2_lrs": np.array([2.5e-4, 5e-4, 1e-3])}
    cells = {f"lr={lr:g}": {"verdict": v, "p_adjusted": p} for lr, v, p in
             zip(lrs, ["inconclusive", "inconclusive", "supported"], [0.5, 0.4, 0.01])}
    analysis = {"sizes": {"small": {"cells": cells, "H5": "not distinguishable", "confirm_seeds": [1, 2]}},
                "H6": {"verdict": "not measured (runs missing)"}}
    return {**small, **gpt2, "analysis": analysis}


def test_size_curves_pair_only_stored_seeds_and_mark_health():
    d = CR.size_curves(_conf())
    assert list(d) == ["small", "gpt2"]
    s = d["small"]
    assert s["complete"] and s["healthy"] == [True, True, False] and s["c_best"] == pytest.approx(1.30)
    assert s["c_rel"][2] == pytest.approx(2.0 / 1.30 - 1)
    g = s["gaps"][2]
    assert g["n"] == 3 and g["point"] == pytest.approx(0.30) and g["ci"][0] < 0.30 < g["ci"][1]
    p = d["gpt2"]
    assert not p["complete"] and (p["runs"], p["runs_planned"]) == (5, 30)
    assert [g["n"] for g in p["gaps"]] == [1, 1, 0]  # C at 1e-3 not stored: no gap there
    assert p["gaps"][0]["ci"] is None and p["gaps"][2]["point"] is None  # one seed: no interval
    assert p["c_mean"][2] is None and p["healthy"] == [True, True, False]


def test_three_size_text_says_what_is_called_and_what_waits():
    t = CR.three_size_text(_conf())
    assert "At 4 × 256 (3 paired seeds; the call on seeds 1–2 alone), the gap is called at 0.004" in t
    assert "H5 reads *not distinguishable*" in t and "where FP32 attention has degraded" in t
    assert "fresh seeds and Holm over" not in t  # a size with a call needs no word on what it could not call
    assert "At 12 × 768, 5 of its 30 runs of A and C are stored, so it has no call yet" in t
    assert "0.000 at 0.00025" in t and "-0.000" not in t and "+0.000" not in t  # never a signed zero
    assert "+0.050 at 0.0005" in t  # A 1.30 against C 1.25
    assert t.endswith("waits for the third size's runs.")


def test_three_size_figure_has_both_panels_and_a_legend_of_sizes():
    fig = CR.three_size_figure(_conf())
    ax0, ax1, axl = fig.axes
    assert ax0.get_xscale() == ax1.get_xscale() == "log"
    texts = [t.get_text() for t in axl.get_legend().get_texts()]
    assert texts[0] == "4 × 256, 3 seeds" and texts[1] == "12 × 768, seed 0 so far (5 of 30 runs)"
    with pytest.raises(ValueError, match="no size with A and C"):
        CR.three_size_figure({"analysis": {}})


def test_size_estimates_need_both_sizes_complete():
    conf = _conf()
    large = {k.replace("small_", "large_"): v for k, v in conf.items() if k.startswith("small_")}
    t = TC.size_estimates({**conf, **large})
    assert t.startswith("S(A) − S(C) is") and t.count("(3 seeds)") == 2 and "95 % Student t intervals" in t
    # the same gaps at both sizes: the paired difference is 0 on every seed, so C0-size is not shown
    assert "paired by seed over the 3 seeds" in t and "C0-size reads not reproduced on 3 seeds, fewer than" in t
    assert TC.size_estimates(conf) is None and TC.size_estimates(None) is None  # no larger size stored
    stored = large["large_stored"].copy()
    stored[0, 0, 0] = False
    assert TC.size_estimates({**conf, **large, "large_stored": stored}) is None  # one run of A missing


def test_seeds_text_names_runs_of_seeds():
    assert CR.seeds_text([3, 4]) == "seeds 3–4" and CR.seeds_text([0]) == "seed 0"
    assert CR.seeds_text([0, 2, 5]) == "seeds 0, 2, 5" and CR.seeds_text([]) == "no seed"


def test_h6_text_names_each_sizes_smallest_called_rate():
    a = {"H6": {"verdict": "inconclusive", "lr_star": {"small": 0.032, "large": None, "gpt2": 0.004}}}
    t = CR.h6_text(a)
    assert t.startswith("H6, whether the smallest learning rate with a gap falls with size, reads *inconclusive*")
    assert "0.032 at 4 × 256, none in the grid at 8 × 512 and 0.004 at 12 × 768." in t
    assert CR.h6_text({}).endswith("waits for the third size's runs.")
    assert CR.h6_text({"H6": {"verdict": "not measured (runs missing)"}}) == CR.h6_text({})


def test_h5_text_groups_sizes_by_word():
    a = {"sizes": {"small": {"H5": "not distinguishable", "H5_called_lrs": []},
                   "large": {"H5": "not distinguishable", "H5_called_lrs": []},
                   "gpt2": {"H5": "distinguishable", "H5_called_lrs": [5e-4, 1e-3]}}}
    assert CR.h5_text(a) == ("Where FP32 attention is healthy, H5 reads *not distinguishable* at 4 × 256 and "
                             "8 × 512; *distinguishable* at 12 × 768 (called at 0.0005 and 0.001).")
    assert CR.h5_text({"sizes": {}}) is None and CR.h5_text({}) is None


def test_three_size_text_says_what_a_size_without_a_call_could_have_called():
    conf = _conf()
    cells = conf["analysis"]["sizes"]["small"]["cells"]
    conf["analysis"]["sizes"]["small"]["cells"] = {k: {**c, "verdict": "inconclusive"} for k, c in cells.items()}
    t = CR.three_size_text(conf)
    r = stats.callable_ratio(2, len(cells))   # 2 fresh seeds (confirm_seeds), Holm over the 3 rates: ≈ 27
    assert "no learning rate's gap is called" in t
    assert (f"With 2 fresh seeds and Holm over {len(cells)} learning rates, a gap is called only where its mean over "
            f"the fresh seeds is at least {r:.0f} times their standard deviation") in t


def test_power_beside_the_calls_on_the_stored_grid():
    """The stored grid: at 8 × 512 the two fresh seeds could not have called a gap as large as the healthy margin, so
    H5 and every uncalled cell there read *no power*; at 4 × 256 and 12 × 768 H5 stays *not distinguishable*, with
    the gap the fresh seeds would call and what the estimate over all seeds rules out beside it."""
    from lpfail import results

    conf = results.load("confirmation")
    a = conf["analysis"]
    assert a["sizes"]["large"]["H5"] == "not distinguishable"  # the stored, pre-registered word stays
    assert [CR.h5_word(a, s) for s in ("small", "large", "gpt2")] == ["not distinguishable", "no power",
                                                                      "not distinguishable"]
    t = CR.three_size_text(conf)
    assert "At 8 × 512 (5 paired seeds; the call on seeds 3–4 alone), no learning rate's gap is called; where FP32 " \
           "attention is healthy, H5 reads *no power*." in t
    assert "would call a gap of 69 standard deviations of the per-seed gap 80 % of the time" in t
    assert "more than the healthy margin of 0.132 nats, which is what *no power* says" in t
    assert t.count("less than the healthy margin") == 2 and t.count("(one-sided 95 % bound)") == 3
    assert CR.h5_text(a) == ("Where FP32 attention is healthy, H5 reads *not distinguishable* at 4 × 256 and "
                             "12 × 768; *no power* at 8 × 512.")
    large = CR.ten_seed_gap_table(a, "large")
    assert large.count("**no power**") == 6 and "**inconclusive**" not in large
    assert "**no power**" not in CR.ten_seed_gap_table(a) and CR.ten_seed_facts(conf)["ten_H5"] == "not distinguishable"
    assert "the robust fix +0.186 [+0.046, +0.325], p = 0.033, Holm-adjusted 0.3 — **no power**" in CR.fix_lr_text(a)


def test_c0_size_is_judged_by_the_t_interval_of_the_paired_difference():
    conf = _conf()
    large = {k.replace("small_", "large_"): v for k, v in conf.items() if k.startswith("small_")}
    final = large["large_val_final"].copy()
    final[0, 2] += np.array([0.30, 0.35, 0.32])  # A worse at the top rate of the larger size, on every seed
    j = TC.size_judgement({**conf, **large, "large_val_final": final})
    assert j["n"] == 3 and j["verdict"] == "supported" and j["diff"]["ci"][0] > 0
    assert j["large"]["point"] > j["small"]["point"] and j["small"]["n"] == 3


def test_size_word_says_the_verdict_and_its_seeds():
    from lpfail.book import symptom_summary

    conf = _conf()
    large = {k.replace("small_", "large_"): v for k, v in conf.items() if k.startswith("small_")}
    assert symptom_summary.size_word({**conf, **large}) == ("not reproduced on 3 seeds, fewer than the 10 a training "
                                                            "verdict needs")
    assert symptom_summary.size_word(conf) == "not yet measured"
