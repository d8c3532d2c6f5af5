"""The confound of the stochastic-rounding control (claim C0-bias). Chapters 1 and 6, the verdict page.

The paper's claim C0-bias says the rounding error harms *because it is biased*. Our control A_sr (the paper's
arithmetic with stochastic rounding of the output path P̄V, Ō, O) removes the bias — but stochastic rounding
also *adds* error: each rounding is unbiased but its error is as large as the spacing allows, and random. So a
training run of A_sr differs from A in two ways at once, and "A_sr does not close the gap" cannot separate
"the bias was not the cause" from "the added noise harms as much". This experiment measures both sides on one
attention call, on CPU:

* on chapter 4's tied rows (`lpfail.experiments.rounding.RowSpec`, its defaults: 2 ties at 16σ, V 90 %
  negative), the stored output O's error: its mean toward larger |O| (the bias) with a 95 % interval over rows,
  and its root mean square over every element (bias and spread together), for A and A_sr;
* on the BF16 inputs of `cures.gradient_errors` (queries ×6, so that scores tie), the relative error of dQ, dK
  and dV against float64, for A, A_sr, production (FA2) arithmetic D and FP32 attention C, over seeds.

``python -m lpfail run sr_confound`` (CPU, under a minute).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from lpfail.precision import FA2_BF16, FP32, PAPER_BF16, Precision
from lpfail.results import experiment


@dataclass(frozen=True)
class SRConfoundConfig:
    n_rows: int = 2000  # tied rows per policy (the interval of the bias is over rows)
    row_seed: int = 0
    grad_seeds: tuple[int, ...] = tuple(range(10))  # one attention call per seed (the spread over calls)
    T: int = 256
    D: int = 64
    q_scale: float = 6.0


POLICIES = {"A": PAPER_BF16, "A_sr": PAPER_BF16.replace(rounding="sr"), "D": FA2_BF16, "C": FP32}


def row_side(cfg: SRConfoundConfig, policy: Precision, seed: int) -> dict:
    """The stored output's error on tied rows: bias toward larger |O| (mean, 95 % half-width over rows) and RMS."""
    from lpfail.experiments.rounding import RowSpec, make_rows, mean_ci, row_errors

    s, v, _ = make_rows(RowSpec(), cfg.n_rows, seed)
    torch.manual_seed(seed)  # stochastic rounding draws from torch's generator
    err = row_errors(s, v, policy)
    bias, half = mean_ci(err.away_from_zero("out_err"))
    return {"bias": bias, "bias_ci": half, "rms": float(np.sqrt(np.mean(err.out_err ** 2))),
            "rms_true": float(np.sqrt(np.mean(err.o_true ** 2)))}


def sci(x, digits: int = 3) -> str:
    """1.3175e-3 → '1.32 × 10⁻³' (three significant digits, as the verdict page writes it; `digits` others)."""
    m, e = f"{float(x):.{digits - 1}e}".split("e")
    return f"{m} × 10{str(int(e)).translate(str.maketrans('-0123456789', '⁻⁰¹²³⁴⁵⁶⁷⁸⁹'))}"


def headline(res) -> dict[str, str]:
    """What the verdict page states from an `sr_confound` result (C0-bias's confound sentence), as it prints it:
    O's bias on tied rows for A and A_sr and their RMS errors (three significant digits; A_sr's bias, a residue
    at the noise's scale that moves in its second digit with the instruction set, one), the RMS error's rise
    (``.0f`` %), and dQ's mean relative error for A, A_sr and FP32 attention C (``.4f``)."""
    g = lambda k: float(np.nanmean(np.asarray(res[k], dtype=np.float64)))  # noqa: E731
    return {"bias_A": sci(res["rows_A_bias"]), "bias_A_sr": sci(res["rows_A_sr_bias"], 1),
            "rms_A": sci(res["rows_A_rms"]), "rms_A_sr": sci(res["rows_A_sr_rms"]),
            "rms_rise": f"{100 * (float(res['rows_A_sr_rms']) / float(res['rows_A_rms']) - 1):.0f} %",
            "dq_A": f"{g('grad_A_dq'):.4f}", "dq_A_sr": f"{g('grad_A_sr_dq'):.4f}", "dq_C": f"{g('grad_C_dq'):.4f}"}


def check(cfg: SRConfoundConfig) -> SRConfoundConfig:
    """The two-settings check's config: a quarter of the tied rows and three of the ten attention calls."""
    return dataclasses.replace(cfg, n_rows=500, grad_seeds=(0, 1, 2))


@experiment("sr_confound", config=SRConfoundConfig, headline=headline, check=check,
            description="what stochastic rounding removes (the bias) and adds (noise), on one attention call (CPU)")
def sr_confound(cfg: SRConfoundConfig) -> dict:
    from lpfail.experiments.cures import gradient_errors

    out: dict = {"policies": np.array(list(POLICIES)), "policy_strings": np.array([str(p) for p in POLICIES.values()])}
    for name in ("A", "A_sr"):
        r = row_side(cfg, POLICIES[name], cfg.row_seed)
        for k, x in r.items():
            out[f"rows_{name}_{k}"] = x
    per_seed = {name: {g: [] for g in ("dq", "dk", "dv")} for name in POLICIES}
    for seed in cfg.grad_seeds:  # one call per seed: the spread of the error over calls
        e = gradient_errors(POLICIES, seeds=(seed,), T=cfg.T, D=cfg.D, q_scale=cfg.q_scale)
        for name in POLICIES:
            for g in ("dq", "dk", "dv"):
                per_seed[name][g].append(e[name][g])
    for name, d in per_seed.items():
        for g, xs in d.items():
            out[f"grad_{name}_{g}"] = np.array(xs)
    return out


def summary(res) -> dict:
    """The numbers the verdict quotes: the bias each policy leaves on tied rows, the RMS error there, and the
    mean relative gradient errors (with their spread over calls)."""
    rows = {n: {k: float(res[f"rows_{n}_{k}"]) for k in ("bias", "bias_ci", "rms")} for n in ("A", "A_sr")}
    grads = {n: {g: {"mean": float(np.mean(res[f"grad_{n}_{g}"])), "sd": float(np.std(res[f"grad_{n}_{g}"], ddof=1))}
                 for g in ("dq", "dk", "dv")} for n in (str(x) for x in res["policies"])}
    return {"rows": rows, "grads": grads,
            "rms_ratio_sr_over_a": rows["A_sr"]["rms"] / rows["A"]["rms"],
            "dq_ratio_sr_over_a": grads["A_sr"]["dq"]["mean"] / grads["A"]["dq"]["mean"]}
