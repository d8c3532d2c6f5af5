"""The confirmation grid's families simulated through the calls that judge them (lpfail.sweep.power,
lpfail.experiments.confirmation_power): the harness rebuilds each family from the stored analysis and judges it
exactly as the analysis did; the paired rule holds its level at every family and seed count the grid calls on,
under normal noise and under null grids rebuilt from the stored runs, and the legacy bootstrap rule fails the
same check; the noncentral-t detectable gap is the simulated one; the stored simulation is fresh; and the power
table's words on the stored grid. Every draw has a fixed seed: the tests are deterministic."""
import math

import numpy as np
import pytest

from lpfail import results
from lpfail.experiments import confirmation as CF
from lpfail.experiments import confirmation_power as CP
from lpfail.sweep import power as P
from lpfail.sweep import stats

ALPHA = stats.ALPHA


def _se(rate: float, n: int) -> float:
    return math.sqrt(rate * (1 - rate) / n)


@pytest.fixture(scope="module")
def conf():
    return results.load("confirmation")


@pytest.fixture(scope="module")
def fams(conf):
    return {(f.size, f.name): f for f in CP.families(conf)}


def test_the_harness_rebuilds_and_judges_each_family_as_the_analysis_did(conf, fams):
    a = conf["analysis"]
    assert sorted(fams) == [("gpt2", "gaps_gpt2"), ("large", "gaps_large"), ("small", "claims"),
                            ("small", "fix_lr"), ("small", "gaps_small")]
    gap_supported = {k: c["verdict"] == "supported" for k, c in a["sizes"]["small"]["cells"].items()}
    for fam in fams.values():
        d = CF._size(conf, fam.size)
        assert np.array_equal(CP.row_values(fam, d["eff"], d["lrs"]), fam.values)  # the runs model's formulas
        stored = CP._judged_rows(a, fam)
        got = P.judge(fam, fam.values)
        for k in fam.rows:
            assert got[k]["p_adjusted"] == pytest.approx(stored[k]["p_adjusted"], rel=1e-12, abs=1e-15)
            gate = {"claims": a["claims"]["H1"]["verdict"] == "supported",
                    "fix_lr": gap_supported.get(k.split("@")[-1], True)}.get(fam.name, True)
            want = stored[k]["verdict"]
            assert (stats.gap_word(got[k]["verdict"], gate) if k != "H1" else got[k]["verdict"]) == want, k
    assert (fams["large", "gaps_large"].m, len(fams["large", "gaps_large"].confirm)) == (6, 2)
    assert (fams["gpt2", "gaps_gpt2"].m, len(fams["gpt2", "gaps_gpt2"].confirm)) == (4, 5)
    assert (fams["small", "fix_lr"].m, len(fams["small", "fix_lr"].confirm)) == (12, 7)


@pytest.mark.parametrize("i,key", enumerate([("small", "claims"), ("small", "gaps_small"), ("small", "fix_lr"),
                                             ("large", "gaps_large"), ("gpt2", "gaps_gpt2")]))
def test_paired_rule_holds_its_level_in_every_family(fams, i, key):
    """Normal noise at each row's stored standard deviation: the family-wise false-call rate (any row called,
    either way) is at most α within Monte Carlo error, and every row's 95 % t interval covers the truth."""
    n = 600
    sim = P.simulate(fams[key], "normal", n, seed=11 + i)
    print(key, sim["family_rate"], np.round(sim["cover"], 3).tolist())
    assert sim["family_rate"] <= ALPHA + 3 * _se(ALPHA, n)
    assert np.mean(sim["cover"]) >= 0.94 and min(sim["cover"]) >= 0.92


def test_paired_rule_holds_its_level_on_null_grids_from_the_stored_runs(conf, fams):
    runs = CP.stored_runs(conf, "small")
    assert runs.residuals.shape == (10, 6, 10)
    n = 300
    for name in ("claims", "gaps_small", "fix_lr"):
        sim = P.simulate(fams["small", name], "runs", n, seed=12, runs=runs)
        print(name, sim["family_rate"], np.round(sim["cover"], 3).tolist())
        assert sim["family_rate"] <= ALPHA + 3 * _se(ALPHA, n) and np.mean(sim["cover"]) >= 0.93
    with pytest.raises(ValueError, match="at least 10 stored seeds"):
        P.noise_draws(fams["large", "gaps_large"], "runs", 2, np.random.default_rng(0),
                      P.Runs("large", np.zeros((2, 6, 5)), np.zeros(6), (1.0,) * 6, CP.roles, CP.row_values))


def test_the_legacy_rule_fails_the_same_check(conf, fams):
    """The negative control, through the same harness: the seed-bootstrap rule (percentile interval over 10,000
    resamples of every seed, no Holm) calls a null family far more often than α, at ten seeds and at five."""
    n = 50
    for key, noise in ((("small", "gaps_small"), "normal"), (("large", "gaps_large"), "normal"),
                       (("small", "claims"), "runs")):
        runs = CP.stored_runs(conf, "small") if noise == "runs" else None
        sim = P.simulate(fams[key], noise, n, seed=13, rule="legacy", runs=runs)
        print(key, noise, sim["family_rate"])
        assert sim["family_rate"] > 0.25 > ALPHA + 3 * _se(ALPHA, n)


def test_detectable_gap_is_the_simulated_power(fams):
    """At `detectable_sd`, one row of the family is called on its side 80 % of the time, through the calls
    (Holm's other steps add a little), at two fresh seeds and at five."""
    n = 600
    for key in (("gpt2", "gaps_gpt2"), ("large", "gaps_large")):
        fam = fams[key]
        d = P.detectable_sd(len(fam.confirm), fam.m)
        gap = np.zeros(len(fam.rows))
        gap[1] = d * fam.sd[1]
        sim = P.simulate(fam, "normal", n, seed=14, gap=gap)
        print(key, d, sim["on_side"][1])
        assert 0.8 - 3 * _se(0.8, n) <= sim["on_side"][1] <= 0.82 + 3 * _se(0.8, n)


def test_detectable_sd_closed_cases():
    assert 0.99 < P.detectable_sd(10, 1) < 1.0  # the paired t test on 10 seeds has 80.3 % power at 1 sd
    assert P.detectable_sd(2, 6) > 54 > stats.callable_ratio(2, 6) - 1  # two fresh seeds, Holm over six rates
    assert P.detectable_sd(7, 6) < P.detectable_sd(7, 12) and P.detectable_sd(10, 6) < P.detectable_sd(7, 6)
    assert P.detectable_sd(1, 3) == math.inf
    assert P.detectable_sd(7, 6, test="sign-flip") == math.inf and P.detectable_sd(3, 1, test="sign-flip") == math.inf
    sps = pytest.importorskip("scipy.stats")
    d = P.detectable_sd(5, 4)
    assert sps.nct.sf(sps.t.ppf(1 - ALPHA / 8, 4), 4, d * math.sqrt(5)) == pytest.approx(0.8, abs=1e-10)
    x = np.array([0.3, -0.1, 0.5, 0.2])
    assert P.upper_bound(x) == pytest.approx(x.mean() + sps.t.ppf(0.95, 3) * x.std(ddof=1) / 2, rel=1e-13)


def test_stored_simulation_is_fresh_and_calibrated(conf):
    """The stored ``confirmation_power`` (20,000 null draws per family): computed from the stored confirmation
    result; the paired rule at most α within Monte Carlo error everywhere, the legacy rule far above; the
    simulated detectable gap within Monte Carlo error of the noncentral-t one, which bounds it from above."""
    res = results.load("confirmation_power")
    assert res["confirmation_npz_sha256"] == conf.meta["npz_sha256"], \
        "results/confirmation.npz changed: python -m lpfail run confirmation_power"
    fams = res["families"]
    assert len(fams) == 5
    for f in fams:
        n, nl = f["normal"]["paired"]["n_sims"], f["normal"]["legacy"]["n_sims"]
        assert f["normal"]["paired"]["family_rate"] <= ALPHA + 3 * _se(ALPHA, n), f["family"]
        assert f["normal"]["legacy"]["family_rate"] > ALPHA + 10 * _se(ALPHA, nl), f["family"]
        assert min(f["normal"]["paired"]["cover"]) >= 0.94
        assert f["detectable_sd"] == pytest.approx(P.detectable_sd(f["n_confirm"], f["family_size"]), rel=1e-12)
        assert f["normal"]["detectable_sd"] <= 1.03 * f["detectable_sd"]
        assert f["normal"]["power_at_detectable_sd"] >= 0.8 - 3 * _se(0.8, f["normal"]["n_power"])
        if f["runs"] is not None:
            n = f["runs"]["paired"]["n_sims"]
            assert f["runs"]["paired"]["family_rate"] <= ALPHA + 3 * _se(ALPHA, n), f["family"]
            assert f["runs"]["legacy"]["family_rate"] > ALPHA + 10 * _se(ALPHA, f["runs"]["legacy"]["n_sims"])
    assert {f["size"] for f in fams if f["runs"] is not None} == {"small"}


def test_power_table_on_the_stored_grid(conf):
    table = {(r["size"], r["family"]): r for r in CP.power_table(conf)}
    large, small, gpt2 = table["large", "gaps_large"], table["small", "gaps_small"], table["gpt2", "gaps_gpt2"]
    assert large["n_confirm"] == 2 and large["detectable_gap_sd"] > 50 and large["word"] == "no power"
    assert large["detectable_gap_nats"] > large["margin_nats"] == pytest.approx(0.1 * 1.3166, rel=1e-3)
    assert small["word"] == gpt2["word"] == "not distinguishable" and small["calls"] == ["lr=0.032"]
    assert small["detectable_gap_nats"] < small["margin_nats"] and gpt2["detectable_gap_nats"] < gpt2["margin_nats"]
    for r in (large, small, gpt2):
        assert 0 < r["upper_bound_healthy"] < 0.02  # the estimates over all seeds rule out more than the calls
    assert table["small", "claims"]["word"] == table["small", "fix_lr"]["word"] == "has power"
    assert {CP.h5_word(conf, s) for s in ("small", "gpt2")} == {"not distinguishable"}
    assert CP.h5_word(conf, "large") == "no power"
    changed = {(r["size"], r["row"]) for r in CP.power_rows(conf) if r["word"] != r["verdict"]}
    assert changed == {("large", f"lr={x:g}") for x in conf["large_lrs"]} | {("gpt2", "lr=0.002"),
                                                                             ("small", "R@lr=0.032")}
    assert all(r["verdict"] == "inconclusive" for r in CP.power_rows(conf) if (r["size"], r["row"]) in changed)
    for r in CP.power_rows(conf):
        assert CP.row_word(conf, r["family"], r["row"]) == r["word"]


def test_words_fall_back_where_the_analysis_lacks_what_power_needs():
    a = {"sizes": {"small": {"H5": "not distinguishable", "healthy_lrs": [1e-3],
                             "cells": {"lr=0.001": {"verdict": "inconclusive"}}}}}
    assert CP.h5_word(a, "small") == "not distinguishable"
    assert CP.row_word(a, "gaps_small", "lr=0.001") == "inconclusive"
    a["sizes"]["small"]["H5"] = "distinguishable"
    assert CP.h5_word(a, "small") == "distinguishable"
