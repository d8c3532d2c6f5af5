"""Rows with a tied maximum m under the fix: B's row suppression and B′'s 0/0 (lpfail.experiments.fix_rows)."""
import math

import numpy as np
import pytest
import torch

from lpfail import results
from lpfail.experiments import fix_rows as fixrows
from lpfail.precision import FA2_BF16, PAPER_BF16, PAPER_BF16_OFFICIAL_FIX

A, B, BP, D = PAPER_BF16, PAPER_BF16_OFFICIAL_FIX, PAPER_BF16.with_fix(), FA2_BF16
POLICIES = {"A": A, "B": B, "Bp": BP, "D": D}
# BF16 tolerance of a normalized output: P̄, Ō, ℓ and O are each rounded once to BF16 (unit roundoff 2^-9 each),
# so a correct result is within about 4·2^-9 = 2^-7; we allow twice that.
TOL = 2.0 ** -6
SMALL = fixrows.FixRowsConfig(n_rows=8, head_dim=16)


@pytest.fixture(scope="module")
def rows():
    bg, v, ties = fixrows.base_rows(SMALL)
    return bg, v, ties


def _measure(rows, m, policy):
    bg, v, ties = rows
    s = fixrows.make_rows(bg, ties, m, SMALL.bg_gap)
    return s, fixrows.row_measures(s, v, policy)


def _l_exact(s, shift):
    """The exact row sum Σ exp(S − shift) of each row, float64."""
    return torch.exp(s.double()[:, 0] - shift).sum(-1).numpy()


def test_rows_have_exactly_the_ties_at_m(rows):
    bg, v, ties = rows
    for m in (1.0, 30.0, 150.0):
        s = fixrows.make_rows(bg, ties, m)[:, 0]
        assert torch.equal(s == m, ties) and (s <= m).all()
        assert (s[~ties] <= m - 1.0).all()                                   # the fix's ε-tie test sees 2 ties
        assert torch.equal(s.to(torch.bfloat16).float(), s)
    assert torch.equal(v.to(torch.bfloat16).float(), v)
    with pytest.raises(ValueError, match="BF16"):
        fixrows.make_rows(bg, ties, 1.001)


def test_all_policies_agree_with_exact_at_m10(rows):
    for name, policy in POLICIES.items():
        _, meas = _measure(rows, 10.0, policy)
        assert not meas["nonfinite"].any(), name
        assert meas["relerr"].max() < TOL, (name, meas["relerr"].max())
        assert np.abs(meas["ratio"] - 1).max() < TOL, name


def test_official_fix_suppresses_rows_once_l_is_under_the_clamp(rows):
    """B divides Ō ≈ ℓ·O by the clamp instead of ℓ once ℓ = Σ exp(S − 2m) < l_clamp, so ‖O‖/‖O_exact‖ =
    ℓ / l_clamp; at m = 23 ℓ ≈ 2e^-23 = 2.1e-10 is still above the clamp and nothing happens."""
    s, meas = _measure(rows, 30.0, B)
    predicted = _l_exact(s, 60.0) / B.l_clamp                               # ≈ 2e^-30 / 1e-10 ≈ 1.9e-3
    assert (predicted < 0.01).all()
    assert not meas["nonfinite"].any()
    np.testing.assert_allclose(meas["ratio"], predicted, rtol=TOL)
    np.testing.assert_allclose(meas["l"], B.l_clamp, rtol=2.0 ** -8)        # the stored ℓ is the clamp
    s, meas = _measure(rows, 23.0, B)
    assert (_l_exact(s, 46.0) > B.l_clamp).all()
    assert np.abs(meas["ratio"] - 1).max() < TOL and meas["relerr"].max() < TOL


def test_our_fix_is_accurate_at_30_and_nan_at_150(rows):
    s, meas = _measure(rows, 30.0, BP)
    assert not meas["nonfinite"].any()
    assert meas["relerr"].max() < TOL
    np.testing.assert_allclose(meas["l"], _l_exact(s, 60.0), rtol=2.0 ** -7)
    # at m = 150 every exp(S − 300) ≤ e^-150 is below FP32's smallest subnormal 2^-149 ≈ e^-103.3: ℓ = Ō = 0
    _, meas = _measure(rows, 150.0, BP)
    assert meas["nan"].all() and (meas["l"] == 0).all()
    _, meas = _measure(rows, 150.0, B)                                      # the clamp keeps B finite (O = 0)
    assert not meas["nonfinite"].any() and (meas["ratio"] == 0).all()


@pytest.fixture(scope="module")
def sweep():
    cfg = fixrows.FixRowsConfig(n_rows=8, head_dim=16, m_start=1.0, m_stop=26.0, m_step=0.5,
                                m_extra=tuple(90.0 + 0.5 * i for i in range(33)) + (150.0, 200.0))
    return cfg, fixrows.fix_rows_experiment(cfg)


def test_controls_are_finite_and_accurate_everywhere(sweep):
    _, out = sweep
    for tag in ("A", "D"):
        assert (out[f"{tag}_nonfinite_frac"] == 0).all(), tag
        assert out[f"{tag}_relerr_max"].max() < TOL, tag


def test_thresholds_follow_from_the_formats(sweep):
    cfg, out = sweep
    m = out["m_values"]
    th = fixrows.thresholds(out)
    assert {k: out[k] for k in th} == th
    # B: ratio = 2e^-m / l_clamp < 0.5 exactly from m > ln(4 / l_clamp) = 24.41 on
    assert out["b_half_m_theory"] == pytest.approx(math.log(4 / 1e-10))
    assert th["b_suppress_m"] == m[m > out["b_half_m_theory"]][0]
    # B′: O is non-finite only where the stored BF16 ℓ is 0. ℓ ≥ 2e^-m (two ties at exp(−m)) rounds to a nonzero
    # BF16 while > 2^-134 (half the smallest BF16 subnormal), i.e. for m < 135·ln 2 ≈ 93.57; and ℓ is surely 0
    # once every FP32 exp(S − 2m) ≤ e^-m underflows, m > 150·ln 2 ≈ 103.97
    assert 135 * math.log(2) * (1 - 1e-6) <= th["bp_nonfinite_m"] <= 150 * math.log(2)
    assert (out["Bp_nonfinite_frac"][m >= th["bp_nonfinite_m"]] == 1).all()  # and stays non-finite
    assert out["Bp_relerr_max"][m <= 26].max() < TOL                        # accurate where B is suppressed
    assert th["bp_inaccurate_m"] <= th["bp_nonfinite_m"]
    # a grid that stops short of both thresholds finds neither
    short = {k: (v[m < 24] if isinstance(v, np.ndarray) else v) for k, v in out.items()}
    assert all(math.isnan(x) for x in fixrows.thresholds(short).values())


def test_result_is_storable_and_round_trips(sweep, tmp_path):
    cfg, out = sweep
    arrays, scalars = results._split("fix_rows", out)
    assert set(arrays) == {"m_values"} | {f"{t}_{s}" for t in POLICIES for s in fixrows.STATS}
    assert all(a.shape == out["m_values"].shape for a in arrays.values())
    res = results.save("fix_rows", cfg, out, wall_s=1.0, directory=tmp_path)
    again = results.load("fix_rows", cfg, directory=tmp_path)
    assert fixrows.thresholds(again) == fixrows.thresholds(res) == fixrows.thresholds(out)


def test_experiment_is_registered():
    exp = results.get("fix_rows")
    assert exp.gpu is False and exp.config is fixrows.FixRowsConfig
    grid = fixrows.m_grid(exp.default_config())
    assert grid[0] == 1.0 and grid[-1] == 200.0 and np.all(np.diff(grid[grid <= 120]) == 0.5)


@pytest.mark.parametrize("field, value", [
    ("n_rows", 0), ("n_keys", 1), ("head_dim", 0), ("n_ties", 1), ("n_ties", 600), ("bg_std", -1.0),
    ("bg_gap", 0.0), ("m_step", 0.0), ("m_start", -1.0), ("m_stop", float("inf")), ("m_stop", 0.5), ("m_extra", (float("nan"),)),
    ("m_extra", [150.0]), ("seed", -1), ("policies", ()), ("policies", (("B", "NOPE"),)),
    ("policies", (("B", "FP32"), ("B", "FP64"))), ("n_rows", True)])
def test_config_validation(field, value):
    with pytest.raises(ValueError, match=f"FixRowsConfig.{field}"):
        fixrows.FixRowsConfig(**{field: value})


def test_config_rejects_m_that_is_not_bf16():
    with pytest.raises(ValueError, match="BF16"):
        fixrows.FixRowsConfig(m_step=0.3)
    with pytest.raises(ValueError, match="BF16"):
        fixrows.FixRowsConfig(m_extra=(200.5,))
