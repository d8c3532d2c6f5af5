"""The precision dial: the paper's rounding bias turned up by keeping fewer fraction bits, and its control.

Why. The causal chain under test is: tied row maxima make P̄ = 1 exactly → the BF16 rounding of P̄V is *biased* →
δ and the W_Q gradient are biased → the error accumulates → training fails. Stochastic rounding of the same
values at the same precision has no bias but more noise, so a run that fails under round-to-nearest and trains
under stochastic rounding says "bias, not noise". At BF16 both effects are small and a run needs many steps to
show them. Keeping K < 7 fraction bits (BF16's 8-bit exponent kept, `lpfail.precision.DIAL`) multiplies the
tied-row bias by about 2^(7−K) (the error is a fraction of one spacing 2^(e−K)), which makes the test affordable.

The arms, each a policy constructor of K (7 … 1; at K = 7 each is the BF16 policy it starts from, string and bits):

======= ==============================================================================================
A_K     the paper's arithmetic (PAPER_BF16) with V and the output path — P̄V, Ō·a, Ō·a + P̄V, O — at K bits,
        to nearest even; the scores and P̄ stay BF16, so ties at the row maximum occur as in BF16
SR_K    A_K with the output path rounded stochastically at K bits; V stays at K bits to nearest even, so both
        arms hold the same data and differ only in how the accumulation rounds
D_K     production arithmetic (FA2_BF16: FP32 accumulation) with V and O at K bits
R_K     A_K with the robust fix (`lpfail.precision.BoundedMax`, PAPER_BF16_ROBUST_FIX at K = 7)
======= ==============================================================================================

V at K bits is the knob ``v`` (V rounded once where it enters attention, its operand of P̄V and dP in both
passes), not ``matmul``: rounding every matmul operand would round Q and K too, and with them the scores and
their ties. The accumulator's knob is ``o_acc`` (Ō alone), not ``acc``, which also holds m and ℓ.

The calibration (experiment ``dial_calibration``, CPU): on chapter 4's synthetic tied rows
(`lpfail.experiments.rounding`), for each K and arm, the bias of O against float64 arithmetic on the same data
(V at K bits) and the per-element variance of O's error, with 95 % intervals over rows, and the ratios of the
variances that say whether A_K's noise lies between SR_{K+1}'s and SR_K's (a noisier but unbiased SR_K that
trains, where A_K fails, blames the bias).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lpfail.precision import DIAL_KS as KS, FORMATS, Precision, arm_a, arm_d, arm_r, arm_sr, dial_format
from lpfail.results import experiment

# The arms' policy constructors (arm_a, arm_sr, arm_d, arm_r) and KS live in `lpfail.precision` (the learning-rate
# grid's variants, `lpfail.sweep.variants`, are built from them and the framework imports no experiment).


@dataclass(frozen=True)
class Arm:
    name: str
    policy: Callable[[int], Precision]
    words: str  # the arm in words, for the book


ARMS: dict[str, Arm] = {
    "A": Arm("A", arm_a, "the paper's arithmetic with V and the output path at K bits, rounded to nearest "
                         "(biased on tied rows)"),
    "SR": Arm("SR", arm_sr, "the same data with the output path rounded stochastically at K bits (unbiased, "
                            "noisier)"),
    "D": Arm("D", arm_d, "production arithmetic (FP32 accumulation) with V and O at K bits"),
    "R": Arm("R", arm_r, "the paper's arithmetic at K bits with the robust fix"),
}


def arm(name: str, k: int) -> Precision:
    """The policy of arm `name` ("A", "SR", "D", "R") at k fraction bits."""
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; arms: {list(ARMS)}")
    return ARMS[name].policy(k)


def label(name: str, k: int) -> str:
    """"A_5", "SR_3", …"""
    return f"{name}_{k}"


# -- the calibration ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DialCalibrationConfig:
    ks: tuple[int, ...] = KS
    arms: tuple[str, ...] = ("A", "SR", "D")
    n_rows: int = 2000  # tied rows (the intervals are over rows)
    seed: int = 0  # the rows (`rounding.make_rows`)
    sr_seed: int = 0  # the RoundingKey seed of the stochastic roundings
    n_keys: int = 512  # chapter 4's rows: one of the paper's 512-wide key tiles, 2 ties at 16σ, V 90 % negative
    n_ties: int = 2
    gap: float = 16.0
    neg_frac: float = 0.9
    head_dim: int = 16  # features per row (chapter 4 has 64; 16 keep the CPU cost low, the bias is per element)


#: Per (arm, K): the stored output O's error e = O − O_exact (float64 arithmetic on the same scores and the same
#: K-bit V): "bias" the mean of e, "acc_bias" the mean error of the accumulator Ō/ℓ_exact (before the division's
#: rounding), "var" the per-element variance of e, "mse" its mean square; each with its 95 % half-width over rows.
STATS = ("bias", "acc_bias", "var", "mse")


def _row_stats(err) -> dict[str, tuple[float, float]]:
    """The STATS of one `rounding.RowErrors`, each a (mean, 95 % half-width) over rows, plus per-row values."""
    from lpfail.experiments.rounding import mean_ci

    e = err.out_err                                                # (rows, d)
    centred = (e - e.mean()) ** 2
    out = {"bias": mean_ci(e.mean(axis=1)), "acc_bias": mean_ci(err.o_err.mean(axis=1)),
           "var": mean_ci(centred.mean(axis=1)), "mse": mean_ci((e ** 2).mean(axis=1))}
    out["_var_rows"] = centred.mean(axis=1)
    return out


def _ratio(a: np.ndarray, b: np.ndarray, z: float = 1.96) -> tuple[float, float]:
    """mean(a) / mean(b) over paired rows, and the 95 % half-width of the delta method."""
    r = float(a.mean() / b.mean())
    return r, float(z * np.std(a - r * b, ddof=1) / (math.sqrt(a.size) * b.mean()))


def calibrate_point(cfg: DialCalibrationConfig, name: str, k: int, s: torch.Tensor, v: torch.Tensor) -> dict:
    """One (arm, K) on the rows (s, v): V rounded to K bits first (the arm's data, also the truth's)."""
    from lpfail.experiments.rounding import row_errors
    from lpfail.sr_stream import RoundingKey

    v_k = FORMATS[dial_format(k)].round(v.to(torch.bfloat16))    # make_rows' V holds BF16 values: exact
    key = RoundingKey(cfg.sr_seed, 0, (k,))
    return _row_stats(row_errors(s, v_k, arm(name, k), sr_key=key))


def _rows(cfg: DialCalibrationConfig):
    from lpfail.experiments.rounding import RowSpec, make_rows

    spec = RowSpec(n_keys=cfg.n_keys, n_ties=cfg.n_ties, gap=cfg.gap, neg_frac=cfg.neg_frac, head_dim=cfg.head_dim)
    s, v, _ = make_rows(spec, cfg.n_rows, cfg.seed)
    return s, v


def _brackets(cfg: DialCalibrationConfig, points: dict, out: dict) -> None:
    """The variance ratios: SR_K / A_K, SR_K / A_{K−1}, A_K / SR_{K+1}, and whether SR_{K+1} ≤ A_K ≤ SR_K."""
    nan2 = (math.nan, math.nan)
    keys = {"sr_over_a": [], "sr_over_a_prev": [], "a_over_sr_next": []}
    bracketed = []
    for k in cfg.ks:
        a, sr = points.get(("A", k)), points.get(("SR", k))
        a_prev, sr_next = points.get(("A", k - 1)), points.get(("SR", k + 1))
        pairs = {"sr_over_a": (sr, a), "sr_over_a_prev": (sr, a_prev), "a_over_sr_next": (a, sr_next)}
        for name, (x, y) in pairs.items():
            keys[name].append(_ratio(x["_var_rows"], y["_var_rows"]) if x is not None and y is not None else nan2)
        measured = a is not None and sr is not None and sr_next is not None
        bracketed.append(float(sr_next["var"][0] <= a["var"][0] <= sr["var"][0]) if measured else math.nan)
    for name, vals in keys.items():
        out[f"ratio_{name}"] = np.array([v[0] for v in vals])
        out[f"ratio_{name}_ci"] = np.array([v[1] for v in vals])
    out["bracketed"] = np.array(bracketed, dtype=np.float64)


def headline(res) -> dict[str, str]:
    """Per arm and K: O's bias on the tied rows and the error variance, two significant digits (as the dial's
    pre-registration quotes them), and per K whether A_K's variance lies between SR_{K+1}'s and SR_K's."""
    out = {}
    ks = [int(k) for k in res["ks"]]
    arms = [a for a in ARMS if f"{a}_bias" in res]
    for i, k in enumerate(ks):
        for a in arms:
            out[f"{a}_{k} bias"] = f"{float(res[f'{a}_bias'][i]):.1e}"
            out[f"{a}_{k} var"] = f"{float(res[f'{a}_var'][i]):.1e}"
        b = float(res["bracketed"][i])
        out[f"bracketed K={k}"] = "n/a" if math.isnan(b) else str(bool(b))
    return out


def check(cfg: DialCalibrationConfig) -> DialCalibrationConfig:
    """The two-settings check's config: a fifth of the rows."""
    return dataclasses.replace(cfg, n_rows=400)


@experiment("dial_calibration", config=DialCalibrationConfig, headline=headline, check=check,
            description="the precision dial on tied rows: bias and noise of O for A_K, SR_K, D_K, K = 7 … 3 (CPU)")
def dial_calibration(cfg: DialCalibrationConfig) -> dict:
    """Keys: ``ks``; ``{arm}_{stat}`` and ``{arm}_{stat}_ci`` (arrays over ks) for stat in STATS; ``{arm}_policy``
    (the policy strings, over ks); ``ratio_sr_over_a``, ``ratio_sr_over_a_prev`` (SR_K over A_{K−1}),
    ``ratio_a_over_sr_next`` (A_K over SR_{K+1}), each with ``_ci`` (NaN where a neighbour is not in ks);
    ``bracketed`` (1.0 where var(SR_{K+1}) ≤ var(A_K) ≤ var(SR_K), 0.0 where not, NaN where SR_K, A_K or
    SR_{K+1} is not measured: at K = 7 always, the dial having no 8-bit BF16)."""
    for name in cfg.arms:
        arm(name, 7)  # unknown arms fail before any work
    s, v = _rows(cfg)
    points = {(name, k): calibrate_point(cfg, name, k, s, v) for name in cfg.arms for k in cfg.ks}
    out: dict = {"ks": np.array(cfg.ks)}
    for name in cfg.arms:
        for stat in STATS:
            out[f"{name}_{stat}"] = np.array([points[name, k][stat][0] for k in cfg.ks])
            out[f"{name}_{stat}_ci"] = np.array([points[name, k][stat][1] for k in cfg.ks])
        out[f"{name}_policy"] = np.array([str(arm(name, k)) for k in cfg.ks])
    _brackets(cfg, points, out)
    return out


def summary(res) -> str:
    """A table of the calibration: per K, each arm's bias and error variance, and the variance ratios."""
    ks = [int(k) for k in res["ks"]]
    arms = [a for a in ARMS if f"{a}_bias" in res]
    lines = ["K  " + "  ".join(f"{a + ' bias':>22} {a + ' var':>20}" for a in arms)
             + "  SR/A   A/SR(K+1)  bracketed"]
    for i, k in enumerate(ks):
        cells = "  ".join(f"{res[f'{a}_bias'][i]:+.3e}±{res[f'{a}_bias_ci'][i]:.1e} "
                          f"{res[f'{a}_var'][i]:.3e}±{res[f'{a}_var_ci'][i]:.1e}" for a in arms)
        b = res["bracketed"][i]
        lines.append(f"{k}  {cells}  {res['ratio_sr_over_a'][i]:.3f}  {res['ratio_a_over_sr_next'][i]:.3f}  "
                     f"{'n/a' if math.isnan(b) else bool(b)}")
    return "\n".join(lines)
