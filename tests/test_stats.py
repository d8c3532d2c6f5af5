"""lpfail.sweep.stats: the legacy rule reproduces every stored verdict bit for bit; the paired rule's pieces
(t distribution, sign-flip test, Holm, the judge, the confirm/estimate split, the placebo) against hand-worked
cases and closed forms. The null simulation is tests/test_stats_null.py."""
import itertools
import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from lpfail import results
from lpfail.experiments import confirmation
from lpfail.sweep import stats
from lpfail.sweep.store import part_files, read_part

REPO = Path(__file__).resolve().parent.parent


# -- the legacy rule: the stored analyses, recomputed from the stored arrays with this module -------------------
def _eff(res, size="small"):
    return stats.effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])


def _ci(point, draws):
    return {"point": float(point), "ci": list(stats.interval(draws))}


def test_legacy_reproduces_lr_sweep_verdicts_exactly():
    res = results.load("lr_sweep")
    stored = res["analysis"]
    d = {}
    for size in ("small", "large"):
        eff = _eff(res, size)
        point, boot = stats.sensitivities(eff, stats.bootstrap_seed_indices(eff.shape[-1]))
        for i, v in enumerate(res[f"{size}_variants"]):
            d[size, str(v)] = (float(point[i]), boot[i])
            assert stored["sizes"][size][str(v)]["S"] == float(point[i])
            assert stored["sizes"][size][str(v)]["ci"] == list(stats.interval(boot[i]))
            curve = eff[i].mean(axis=-1)
            assert stored["sizes"][size][str(v)]["lr_10pct"] == pytest.approx(
                stats.lr_exceeding(curve, res["lrs"]), nan_ok=True)
    sm = lambda v: d["small", v]  # noqa: E731
    h1 = _ci(sm("A")[0] - sm("C")[0], sm("A")[1] - sm("C")[1])
    h2 = _ci(*stats.half_gap(sm("A_sr"), sm("A"), sm("C")))
    h3 = _ci(*stats.half_gap(sm("A_qk"), sm("A"), sm("C"), y=sm("C_qk")))
    lg = lambda v: d["large", v]  # noqa: E731
    h4 = _ci((lg("A")[0] - lg("C")[0]) - h1["point"], (lg("A")[1] - lg("C")[1]) - (sm("A")[1] - sm("C")[1]))
    for name, h, side in (("H1", h1, "above"), ("H2", h2, "below"), ("H3", h3, "below"), ("H4", h4, "above")):
        assert stored["verdicts"][name]["point"] == h["point"], name
        assert stored["verdicts"][name]["ci"] == h["ci"], name
        assert stored["verdicts"][name]["verdict"] == stats.judge(*h["ci"], side), name
    for size, rows in stored["a_minus_c_per_lr"].items():
        v = [str(x) for x in res[f"{size}_variants"]]
        eff = _eff(res, size)
        point, draws = stats.mean_draws(eff[v.index("A")] - eff[v.index("C")])
        for j, row in enumerate(rows):
            assert row["point"] == float(point[j]) and row["ci"] == list(stats.interval(draws[j]))


def test_legacy_reproduces_cures_fix_training_and_compiled_verdicts_exactly():
    cures = results.load("cures")
    stored = cures["cures_analysis"]
    variants = [str(v) for v in cures["small_variants"]]
    d, _ = stats.sensitivity_draws(cures)
    gap = (d["A"][0] - d["C"][0], d["A"][1] - d["C"][1])
    assert stored["gap"] == _ci(*gap)
    has_gap = stats.judge(*stats.interval(gap[1]), "above") == "supported"
    for v, row in stored["cures"].items():
        if "K2" not in row:
            continue
        k1 = _ci(d[v][0] - d["A"][0], d[v][1] - d["A"][1])
        k2 = _ci(*stats.half_gap(d[v], d["A"], d["C"]))
        assert {k: row["K1"][k] for k in ("point", "ci")} == k1, v
        assert {k: row["K2"][k] for k in ("point", "ci")} == k2, v
        assert row["K2"]["verdict"] == stats.gap_word(stats.judge(*k2["ci"], "below"), has_gap), v
    assert len([v for v in variants if "K2" in stored["cures"][v]]) >= 10

    fix = results.load("fix_training")
    d, _ = stats.sensitivity_draws(fix)
    got = _ci(*stats.half_gap(d["B"], d["A"], d["C"]))
    assert {k: fix["fix_analysis"]["fixes"]["B"]["closes_half"][k] for k in ("point", "ci")} == got

    comp = results.load("compiled_sweep")
    d, _ = stats.sensitivity_draws(comp)
    assert {k: comp["compiled_analysis"]["symptom"][k] for k in ("point", "ci")} == _ci(
        d["A_comp"][0] - d["C"][0], d["A_comp"][1] - d["C"][1])


def _substitution_losses():
    """{(row, lr, seed): effective final loss} from the stored substitution parts (the runs of its rows)."""
    steps = json.loads((REPO / "results" / "lr_sweep.json").read_text())["config"]["max_steps"]
    out = {}
    for f in part_files(REPO / "results" / "substitution_parts"):
        for key, r in read_part(f)["runs"].items():
            vs, vl = np.asarray(r["val_step"]), np.asarray(r["val_loss"], dtype=np.float64)
            init = vl[vs == 0][0]
            fin = vl[vs == steps][0] if r["status"] == "completed" and (vs == steps).any() else np.nan
            if key.count("/") != 2:
                continue  # the baseline check (check/A/...) is not a row
            row, lr, seed = key.split("/")
            out[row, float(lr[2:]), int(seed[1:])] = float(stats.effective_loss(fin, init))
    return out


def test_legacy_half_gap_seeds_reproduces_substitution_rows_exactly():
    stored = results.load("substitution")["analysis"]
    sweep = results.load("lr_sweep")
    eff, lrs = _eff(sweep), [float(x) for x in sweep["lrs"]]
    v = [str(x) for x in sweep["small_variants"]]
    runs = _substitution_losses()
    idx = stats.bootstrap_seed_indices(len(stored["seeds"]))
    checked = 0
    for name, row in stored["rows"].items():
        for lr_key, got in row["by_lr"].items():
            lr = float(lr_key)
            l_row = np.array([runs.get((name, lr, s), np.nan) for s in stored["seeds"]])
            if np.isnan(l_row).any():
                continue  # a row judged from lr_sweep's runs (heads_*) or the amendment's
            j = lrs.index(lr)
            l_a, l_c = eff[v.index("A"), j], eff[v.index("C"), j]
            point, draws = stats.half_gap_seeds(l_row, l_a, l_c, idx=idx)
            gp, gd = stats.mean_draws(l_a - l_c, idx)
            assert got["point"] == point and got["ci"] == list(stats.interval(draws)), (name, lr)
            assert got["gap"] == {"point": float(gp), "ci": list(stats.interval(gd))}, (name, lr)
            checked += 1
    assert checked >= 30


def test_legacy_pieces_keep_their_contract():
    with pytest.raises(ValueError, match="above"):
        stats.judge(0.1, 0.2, "up")
    assert stats.judge(0.1, 0.2, "above") == "supported" and stats.judge(0.1, 0.2, "below") == "refuted"
    assert stats.judge(-0.1, 0.2, "below") == "inconclusive"
    np.testing.assert_array_equal(stats.effective_loss([np.nan, np.inf, 9.0, 2.0], [5.0, 5.0, 5.0, 5.0]),
                                  [5.0, 5.0, 5.0, 2.0])  # diverged → init; above init → init
    with pytest.raises(TypeError, match="half_gap_seeds"):
        stats.half_gap(np.ones(3), np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="same seeds"):
        stats.half_gap_seeds(np.ones(3), np.ones(3), np.ones(2))
    x = np.random.default_rng(0).normal(size=(4, 6, 3))
    idx = stats.bootstrap_seed_indices(3)
    np.testing.assert_allclose(stats._resample_means(x, idx), x[..., idx].mean(axis=-1), rtol=0, atol=1e-12)
    point, draws = stats.sensitivities(x, idx)  # (variants, lrs, seeds); leading batch axes give the same numbers
    p4, d4 = stats.sensitivities(np.stack([x, x]), idx)
    assert draws.shape == (4, stats.N_BOOTSTRAP) and (p4[1] == point).all() and (d4[0] == draws).all()
    assert draws[2, 0] == stats.sensitivity(x[2][:, idx[0]].mean(axis=-1))  # resample 0 of variant 2, by hand


# -- the Student t distribution -----------------------------------------------------------------------------
@pytest.mark.parametrize("p,df,table", [(0.975, 1, 12.70620474), (0.975, 2, 4.302652730), (0.975, 4, 2.776445105),
                                        (0.975, 6, 2.446911851), (0.975, 9, 2.262157163), (0.975, 30, 2.042272456),
                                        (0.95, 5, 2.015048373), (0.995, 9, 3.249835542), (0.9995, 2, 31.59905458),
                                        (0.9, 3, 1.637744354)])
def test_t_quantile_matches_table_values(p, df, table):
    assert stats.t_quantile(p, df) == pytest.approx(table, rel=1e-9)
    assert stats.t_quantile(1 - p, df) == pytest.approx(-table, rel=1e-9)


def test_t_quantile_tends_to_the_normal():
    # z_{0.975} = 1.959963985; for large df, t ≈ z + (z³ + z)/(4 df)
    z = 1.959963985
    assert stats.t_quantile(0.975, 1e7) == pytest.approx(z + (z ** 3 + z) / 4e7, abs=1e-9)


def test_t_quantile_matches_closed_forms():
    for p in np.linspace(0.01, 0.99, 41):
        assert stats.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10, abs=1e-12)
        assert stats.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10, abs=1e-12)
        a = 4 * p * (1 - p)  # df = 4: q = sign(p − ½)·2·sqrt(cos(θ/3)/√a − 1), θ = arccos(√a)
        q4 = math.copysign(2 * math.sqrt(math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a) - 1), p - 0.5)
        assert stats.t_quantile(p, 4) == pytest.approx(q4, rel=1e-9, abs=1e-12)
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0):  # df = 1 (Cauchy): P(T > t) = ½ − atan(t)/π
        assert stats.t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-13)
    assert stats.t_sf(0.0, 3) == 0.5 and stats.t_sf(math.inf, 3) == 0.0 and stats.t_sf(-math.inf, 3) == 1.0
    np.testing.assert_array_equal(stats.t_sf(np.array([0.0, math.inf]), 5), [0.5, 0.0])
    with pytest.raises(ValueError, match="p must lie"):
        stats.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df must be positive"):
        stats.t_quantile(0.5, 0)


def test_t_distribution_is_scipys():
    """t_quantile and t_sf are scipy.stats.t's ppf and sf; t_test_p gives scipy.stats.ttest_1samp's p values."""
    sps = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 6, 9, 30, 1e7):
        for p in (0.9, 0.95, 0.975, 0.99583, 0.9995):
            assert stats.t_quantile(p, df) == sps.t.ppf(p, df)
        for t in (-2.0, 0.3, 4.0, 40.0):
            assert stats.t_sf(t, df) == sps.t.sf(t, df)
    rng = np.random.default_rng(4)
    for _ in range(200):
        d = rng.normal(rng.normal(0, 1), 1, size=int(rng.integers(2, 12))) * 10 ** rng.uniform(-4, 1)
        got = stats.t_test_p(d)
        for alt, key in (("two-sided", "two-sided"), ("greater", "greater"), ("less", "less")):
            assert got[key] == pytest.approx(sps.ttest_1samp(d, 0.0, alternative=alt).pvalue, rel=1e-12, abs=1e-300)
    assert stats.t_test_p([1.0, 1.0]) == {"two-sided": 0.0, "greater": 0.0, "less": 1.0}  # sd 0: t = +inf


def test_t_interval_and_t_test_closed_forms():
    d = np.array([0.3, -0.1, 0.5, 0.2])
    mean, lo, hi = stats.t_interval(d)
    half = 3.1824463052842638 * d.std(ddof=1) / 2  # t_{0.975, 3}
    assert (mean, lo, hi) == pytest.approx((0.225, 0.225 - half, 0.225 + half), rel=1e-10)
    p = stats.t_test_p([1.0, 3.0])  # t = 2/(√2/√2) = 2, df = 1: P(T > 2) = ½ − atan(2)/π
    assert p["greater"] == pytest.approx(0.5 - math.atan(2) / math.pi, rel=1e-12)
    assert p["two-sided"] == pytest.approx(2 * p["greater"], rel=1e-12) and p["less"] == pytest.approx(1 - p["greater"])
    with pytest.raises(ValueError, match="at least 2"):
        stats.t_interval([1.0])


def _close(got, want, path=""):
    """Every string, flag and integer equal, every float within 1e-12 relative or 1e-13 absolute."""
    if isinstance(want, Mapping):
        assert set(got) == set(want), (path, sorted(set(got) ^ set(want)))
        for k in want:
            _close(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, (list, tuple, np.ndarray)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-13, nan_ok=True), path
    else:
        assert got == want, (path, got, want)


def test_stored_confirmation_analysis_is_reproduced_with_scipys_t():
    """The confirmation grid's stored analysis (its p values, Holm p values, t intervals and every verdict, computed
    when the t distribution was this module's own) is what scipy's t distribution gives from the stored runs."""
    conf = results.load("confirmation")
    stored = json.loads(json.dumps(conf["analysis"]))
    fresh = json.loads(json.dumps(confirmation.analyse(conf), default=lambda o: o.tolist()))
    # the record of what had been seen names the exploratory probes where it once pointed to a file outside the
    # repository: that pointer is the only difference allowed
    assert fresh["seen"] == stored["seen"].replace("of ../shared/proxy-findings.md", "(the lab notebook's 'probes')")
    fresh["seen"] = stored["seen"]
    _close(fresh, stored)
    assert fresh["claims"]["H1"]["verdict"] == "supported" and fresh["sizes"]["gpt2"]["cells"]["lr=0.004"]["p"] < 1e-3


# -- the exact sign-flip test -------------------------------------------------------------------------------
def _brute(d):
    sums = np.array([np.dot(s, d) for s in itertools.product((1, -1), repeat=len(d))])
    t = d.sum()
    return {"two-sided": np.mean(np.abs(sums) >= abs(t) - 1e-12), "greater": np.mean(sums >= t - 1e-12),
            "less": np.mean(sums <= t + 1e-12)}


def test_sign_flip_small_cases_by_hand():
    assert stats.sign_flip_p([0.1, 0.2, 0.3]) == {"two-sided": 0.25, "greater": 0.125, "less": 1.0}
    assert stats.sign_flip_p([-0.1, -0.2, -0.3]) == {"two-sided": 0.25, "greater": 1.0, "less": 0.125}
    # d = (1, −1, 3): sums ±1 ∓ 1 ± 3 = {5, 3, 3, 1, −1, −3, −3, −5}; observed 3
    assert stats.sign_flip_p([1.0, -1.0, 3.0]) == {"two-sided": 0.75, "greater": 0.375, "less": 0.875}
    assert stats.sign_flip_p([0.0, 0.0, 0.0])["two-sided"] == 1.0
    assert stats.sign_flip_p(np.arange(1.0, 8.0))["two-sided"] == 2 / 128  # 7 seeds all one way: the floor
    assert stats.p_floor(3) == 0.25 and stats.p_floor(3, alternative="greater") == 0.125
    assert stats.p_floor(7) == 1 / 64 and stats.p_floor(10) == 1 / 512 and stats.p_floor(3, "t") == 0.0


def test_sign_flip_matches_brute_force_and_batches():
    rng = np.random.default_rng(3)
    batch = rng.normal(0.2, 1.0, size=(25, 6))
    got = stats.sign_flip_p(batch)
    for i, d in enumerate(batch):
        want = _brute(d)
        for k in want:
            assert got[k][i] == pytest.approx(want[k], abs=1e-15)
            assert stats.sign_flip_p(d)[k] == pytest.approx(want[k], abs=1e-15)
    ties = np.array([1.0, 1.0, 2.0, -2.0, 0.0])  # integer data: many sums tie with the observed one
    assert stats.sign_flip_p(ties) == pytest.approx(_brute(ties))


def test_sign_flip_equals_scipys_permutation_test_away_from_ties():
    """scipy.stats.permutation_test on one sample with permutation_type="samples" is the same design (every sign
    pattern, exact for small n) and gives the same p values; it counts a pattern as tied with the observed one
    within 100 ulp of the observed *mean*, which misses the observed pattern's own mirror when the mean is
    near 0 and the sums' rounding is set by Σ|d_s| — why this module keeps its enumeration (tolerance
    1e-9·Σ|d_s|; 15 times faster on a batch)."""
    sps = pytest.importorskip("scipy.stats")
    mean = lambda x, axis: np.mean(x, axis=axis)  # noqa: E731
    rng = np.random.default_rng(1)
    for _ in range(60):
        d = rng.normal(0.3, 1.0, size=int(rng.integers(3, 12)))
        got = stats.sign_flip_p(d)
        for alt in ("two-sided", "greater", "less"):
            want = sps.permutation_test((d,), mean, permutation_type="samples", vectorized=True, n_resamples=np.inf,
                                        alternative=alt).pvalue
            assert got[alt] == want, (d, alt)
    d = np.random.default_rng(1).normal(0, 1, size=(20000, 10))[1909]  # sum 0.0031; the sums round at ~2e-16
    assert stats.sign_flip_p(d)["two-sided"] == _brute(d)["two-sided"] == 1022 / 1024
    scipy_p = sps.permutation_test((d,), mean, permutation_type="samples", vectorized=True, n_resamples=np.inf).pvalue
    assert scipy_p == 1020 / 1024


def test_sign_flip_monte_carlo_beyond_exact(monkeypatch):
    d = np.random.default_rng(5).normal(0.3, 1.0, size=14)
    exact = stats.sign_flip_p(d)
    monkeypatch.setattr(stats, "EXACT_MAX", 10)
    mc = stats.sign_flip_p(d)
    se = math.sqrt(exact["two-sided"] * (1 - exact["two-sided"]) / stats.N_FLIPS)
    assert abs(mc["two-sided"] - exact["two-sided"]) < 4 * se + 1 / stats.N_FLIPS
    assert mc["two-sided"] >= 1 / (1 + stats.N_FLIPS) and stats.p_floor(14) == 1 / (1 + stats.N_FLIPS)


# -- Holm, the judge, the split, the placebo -----------------------------------------------------------------
def test_holm_hand_worked():
    # sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → monotone 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
    np.testing.assert_allclose(stats.holm([0.5, 0.6]), [1.0, 1.0])
    np.testing.assert_allclose(stats.holm([0.01, np.nan, 0.02]), [0.03, np.nan, 0.04], rtol=1e-12)
    assert stats.holm([0.2]).tolist() == [0.2]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stats.holm([0.1, 1.2])


def test_paired_reports_both_seed_sets_and_refuses_bad_input():
    d = np.array([0.05, 0.02, 0.04, 0.06, 0.03, 0.05, 0.04, 0.07, 0.02, 0.05])
    r = stats.paired(d, seeds=range(10), confirm=range(3, 10))
    assert r["seeds"] == list(range(10)) and r["seeds_confirm"] == list(range(3, 10))
    assert r["n"] == 10 and r["n_confirm"] == 7 and r["mean_confirm"] == pytest.approx(d[3:].mean())
    assert r["estimate"] == pytest.approx(d.mean()) and r["ci"] == pytest.approx(list(stats.t_interval(d)[1:]))
    assert r["p"] == 1 / 64 and r["p_greater"] == 1 / 128 and r["p_floor"] == 1 / 64
    assert stats.paired(d, test="t")["p"] == pytest.approx(stats.t_test_p(d)["two-sided"])
    with pytest.raises(ValueError, match="effective_loss"):
        stats.paired([0.1, np.nan, 0.2])
    with pytest.raises(ValueError, match="unknown"):
        stats.paired(d, confirm=[3, 11])
    with pytest.raises(ValueError, match="same seeds"):
        stats.paired_difference(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="same seeds"):
        stats.seed_half_gap(np.ones(3), np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="test must be"):
        stats.paired(d, test="bootstrap")


def test_three_seeds_are_never_supported_however_large_the_effect():
    fam = stats.judge_family({"H": stats.paired([5.0, 6.0, 7.0])}, {"H": "above"})
    assert fam["H"]["p"] == 0.25 and fam["H"]["verdict"] == "inconclusive" and fam["H"]["p_adjusted_floor"] == 0.25


def test_judge_family_holm_and_words():
    up = np.linspace(1.0, 2.0, 10)
    rows = {"a": stats.paired(up), "b": stats.paired(-up), "c": stats.paired(up * np.tile([1, -1], 5)), "d": None}
    fam = stats.judge_family(rows, {"a": "above", "b": "above", "c": "above", "d": "below"})
    assert fam["a"]["p"] == 2 / 1024 and fam["a"]["p_adjusted"] == pytest.approx(4 * 2 / 1024)  # m = 4 (d counts)
    assert fam["a"]["verdict"] == "supported" and fam["b"]["verdict"] == "refuted"
    assert fam["c"]["verdict"] == "inconclusive" and fam["d"]["verdict"] == "not measured (runs missing)"
    assert fam["a"]["family_size"] == 4 and fam["a"]["p_adjusted_floor"] == pytest.approx(4 / 512)
    # 7 confirmatory seeds: a family of 4 can never be called (4 × 1/64 > 0.05)
    seven = {k: stats.paired(up, confirm=range(3, 10)) for k in "wxyz"}
    fam7 = stats.judge_family(seven, dict.fromkeys("wxyz", "above"))
    assert all(r["verdict"] == "inconclusive" and r["p_adjusted_floor"] > stats.ALPHA for r in fam7.values())
    with pytest.raises(ValueError, match="same hypotheses"):
        stats.judge_family({"a": rows["a"]}, {"b": "above"})


def test_seed_sensitivity_is_each_seeds_own_curve():
    eff = np.random.default_rng(1).uniform(1.4, 3.0, size=(2, 6, 4))
    got = stats.seed_sensitivity(eff)
    for v in range(2):
        for s in range(4):
            assert got[v, s] == pytest.approx(eff[v, :, s].mean() - eff[v, :, s].min())


def test_curve_tests_and_placebo():
    rng = np.random.default_rng(2)
    c = rng.normal(2.0, 0.01, size=(6, 10))
    same = c + rng.normal(0, 0.01, size=c.shape)  # a placebo: noise only
    worse = c + 0.05  # a real effect at every lr (S is shift-invariant: no effect on S)
    lrs = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]
    rows = stats.curve_tests(worse, c, lrs, seeds=range(10), confirm=range(3, 10))
    assert list(rows) == ["S"] + [f"lr={x:g}" for x in lrs]
    assert all(rows[f"lr={x:g}"]["p"] == 1 / 64 for x in lrs) and rows["S"]["estimate"] == pytest.approx(0, abs=1e-12)
    pl = stats.placebo(rows)
    assert pl["n"] == 7 and pl["rate_raw"] == 6 / 7 and pl["rate_adjusted"] == 0.0  # 7 × 1/64 > 0.05
    pl = stats.placebo(stats.curve_tests(same, c, lrs), family={"H1": stats.paired(np.linspace(1, 2, 10))})
    assert pl["family_size"] == 8 and 0 <= pl["rate_adjusted"] <= pl["rate_raw"] <= 1
    with pytest.raises(ValueError, match="clash"):
        stats.placebo({"H1": rows["S"]}, family={"H1": rows["S"]})
    with pytest.raises(ValueError, match="lrs=6"):
        stats.curve_tests(worse[:, :3], c, lrs)


@pytest.mark.parametrize("n,m", [(2, 6), (2, 4), (5, 4), (7, 6), (10, 1)])
def test_callable_ratio_is_the_edge_of_what_holm_and_t_can_call(n, m):
    """Fresh seeds whose mean is just above callable_ratio standard deviations give the family's smallest p
    (times m, Holm's first step) at most α; just below, above α."""
    r = stats.callable_ratio(n, m)
    z = np.linspace(-1.0, 1.0, n)
    z = (z - z.mean()) / z.std(ddof=1)                     # sd exactly 1, mean 0
    for factor, callable_ in ((1.001, True), (0.999, False)):
        p = stats.t_test_p(z + factor * r)["two-sided"]
        adj = stats.holm(np.array([p] + [1.0] * (m - 1)))[0]
        assert bool(adj <= stats.ALPHA) is callable_, (n, m, factor, adj)


def test_callable_ratio_falls_with_seeds_and_refuses_bad_input():
    assert stats.callable_ratio(2, 6) > 50 > stats.callable_ratio(7, 6) > stats.callable_ratio(10, 6) > 1
    for bad in ((1, 4), (5, 0)):
        with pytest.raises(ValueError, match="need n ≥ 2"):
            stats.callable_ratio(*bad)
    with pytest.raises(ValueError, match="alpha"):
        stats.callable_ratio(5, 4, 1.5)


def test_binomial_upper_is_the_exact_one_sided_bound():
    """0 calls in 7 placebo tests bound the call rate below 1 − 0.05^(1/7) ≈ 35 %; at the bound, P(X ≤ k) = 5 %."""
    from scipy.stats import binom

    assert stats.binomial_upper(0, 7) == pytest.approx(1 - 0.05 ** (1 / 7), rel=1e-12)
    assert round(100 * stats.binomial_upper(0, 7)) == 35
    for k, n in ((1, 7), (2, 10), (5, 20)):
        assert binom.cdf(k, n, stats.binomial_upper(k, n)) == pytest.approx(0.05, rel=1e-9)
    assert stats.binomial_upper(3, 3) == 1.0
    with pytest.raises(ValueError):
        stats.binomial_upper(4, 3)
