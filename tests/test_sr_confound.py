"""The stochastic-rounding confound (experiment sr_confound): on tied rows SR removes the bias toward larger |O|
that round-to-nearest leaves, while its own error stays as large; FP32 attention errs far less than either."""
import numpy as np

from lpfail import results
from lpfail.experiments import sr_confound as S


def test_sr_removes_the_bias_but_not_the_error():
    cfg = S.SRConfoundConfig(n_rows=300, grad_seeds=(0, 1), T=64, D=16)
    res = S.sr_confound(cfg)
    s = S.summary(res)
    a, sr = s["rows"]["A"], s["rows"]["A_sr"]
    assert a["bias"] > 5 * a["bias_ci"] > 0                   # round-to-nearest: biased toward larger |O|
    assert abs(sr["bias"]) < a["bias"] / 5                    # stochastic rounding: (nearly) unbiased
    assert sr["rms"] > 0.5 * a["rms"]                         # ... but not (much) smaller an error
    g = s["grads"]
    assert g["C"]["dq"]["mean"] < g["A"]["dq"]["mean"] / 3 and g["A_sr"]["dv"]["mean"] == g["A"]["dv"]["mean"]
    results._split("sr_confound", res)  # storable


def test_stored_result_matches_its_summary():
    res = results.load("sr_confound")
    s = S.summary(res)
    assert s["rows"]["A"]["bias"] > 0 and np.isfinite(s["rms_ratio_sr_over_a"])
    assert res.meta["device"].startswith("cpu")
