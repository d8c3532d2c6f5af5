"""Two CPU tables of chapter 6's lab notebook, stored so that the page reads numbers computed once under the pinned
CPU numerics (each moves in its third digit with the order of a sum, so a live computation would print other
digits on another instruction set):

* where each bias sits: the reference's own knobs on the chapter-4 base rows (`RowSpec()`, 400 rows, seed 5), the
  error toward larger |O| with its 95 % CI (`prod_kernels.point_stats`);
* each cure on one attention call: the relative error of dQ, dK and dV against float64 (`cures.gradient_errors`).

``python -m lpfail run beyond_cpu`` (seconds)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpfail.precision import FA2_BF16, FP32, PAPER_BF16
from lpfail.results import experiment

#: The reference's knobs: label → policy.
KNOBS = {"FA2_BF16": FA2_BF16, "FA2_BF16, out=fp32": FA2_BF16.replace(out="fp32"),
         "FA2_BF16, pbar=fp32": FA2_BF16.replace(pbar="fp32"), "PAPER_BF16": PAPER_BF16,
         "PAPER_BF16, out=fp32": PAPER_BF16.replace(out="fp32")}
#: The cures on one call: label → policy.
CURES = {"A: PAPER_BF16": PAPER_BF16, "δ from FP32 O": PAPER_BF16.replace(delta="dO.O_hp"),
         "output-residual comp.": PAPER_BF16.replace(delta="dO.O_res"),
         "dS row-sum corr.": PAPER_BF16.replace(ds_rowsum=True), "Algorithm 3": PAPER_BF16.with_fix(),
         "stochastic rounding": PAPER_BF16.replace(rounding="sr"), "D: FA2_BF16": FA2_BF16, "C: FP32": FP32}


@dataclass(frozen=True)
class BeyondCPUConfig:
    knobs: tuple = tuple(KNOBS)
    knob_rows: int = 400
    knob_seed: int = 5
    cures: tuple = tuple(CURES)
    cure_seeds: tuple = (0, 1, 2)


def _side(m: float, ci: float) -> str:
    """Which way a bias points, by its 95 % CI: 'away from zero', 'toward zero' or 'none'."""
    return "none" if abs(m) <= ci else "away from zero" if m > 0 else "toward zero"


def headline(res) -> dict[str, str]:
    """What lab 6 reads from the tables: which way each knob's bias points (by its CI), and each cure's dQ error to
    one significant digit (the third digit moves with the instruction set; the page prints the stored three)."""
    out = {f"knob {n}": _side(m, ci) for n, (m, ci) in zip(res["knobs"], res["knob_away"])}
    out.update({f"cure {n} dQ": f"{e[0]:.0e}" for n, e in zip(res["cures"], res["cure_errors"])})
    return out


@experiment("beyond_cpu", config=BeyondCPUConfig, chapter="lab_06_beyond", headline=headline,
            description="chapter 6's lab: the reference's knobs on tied rows and each cure on one call (CPU)")
def beyond_cpu(cfg: BeyondCPUConfig) -> dict:
    from lpfail import attention as attn
    from lpfail.experiments import cures as cu, prod_kernels as pk
    from lpfail.experiments.rounding import RowSpec, make_rows

    s, v, ties = make_rows(RowSpec(), cfg.knob_rows, cfg.knob_seed)
    truth = pk.truth(s, v)
    away = np.full((len(cfg.knobs), 2), np.nan)   # mean, 95 % CI half-width
    for i, name in enumerate(cfg.knobs):
        o = attn.forward_from_scores(s, v, KNOBS[name]).o[:, 0].double()
        away[i] = pk.point_stats(o, truth, None, ties)["away"]
    errs = cu.gradient_errors({n: CURES[n] for n in cfg.cures}, seeds=cfg.cure_seeds)
    return {"knobs": np.array(cfg.knobs), "knob_policies": np.array([str(KNOBS[n]) for n in cfg.knobs]),
            "knob_away": away, "cures": np.array(cfg.cures),
            "cure_policies": np.array([str(CURES[n]) for n in cfg.cures]),
            "cure_errors": np.array([[errs[n][k] for k in ("dq", "dk", "dv")] for n in cfg.cures])}


def knob_rows(res) -> list[list[str]]:
    """The knob table's rows: `label`, "m ± ci" in units of 10⁻⁴."""
    return [[f"`{n}`", f"{m * 1e4:+.2f} ± {ci * 1e4:.2f}"] for n, (m, ci) in zip(res["knobs"], res["knob_away"])]


def cure_rows(res) -> list[list[str]]:
    """The cure table's rows: label, dQ, dK, dV relative errors."""
    return [[str(n), *(f"{x:.2e}" for x in e)] for n, e in zip(res["cures"], res["cure_errors"])]
