"""Fix-b: the fixes in training, on the `lr_sweep` experiment's grid (chapter 5, Fix; GPU).

The paper's Fix-b claim: with its fix (Algorithm 3), training that failed is stable. Here three fixes run through
the learning-rate grid of `lpfail.experiments.lr_sweep` (`lpfail.sweep.lr`) at its smaller size (4 × 256), with the
same learning rates, seeds and therefore the same initializations and batches as A (PAPER_BF16) and C (FP32):

====== ============================================== ===================================================
B      ``reference(PAPER_BF16_OFFICIAL_FIX)``         the official fixed code (clamp 1e-10, its masking)
Bp     ``reference(PAPER_BF16+fix)``                  Algorithm 3 alone (β = 2, ε = 1e-3), no clamp
R      ``reference(PAPER_BF16_ROBUST_FIX)``           the robust fix (`lpfail.precision.BoundedMax`)
====== ============================================== ===================================================

Every run is a `lr_sweep` run (same `train_config`, same part files under ``results/lr_sweep_parts/``, keyed by
point and a hash of its TrainConfig), so A, C and B — already stored by `lr_sweep` — are not run again; only
Bp and R are new (2 variants × 6 learning rates × 3 seeds = 36 runs).

The rule (`FIX_RULE`, `judge_fixes`) was fixed in code on `PREREGISTERED_ON`, before any run of Bp or R. B's
runs were stored (and their sensitivity seen: 0.566 against A 0.595 and C 0.512) before this rule was written,
so for B the rule is applied, not pre-registered.

``python -m lpfail sweep fix_training status | plan | checks | drive [--budget S] [--quick] | collect`` (on a GPU
machine ``tools/gpu.sh fix_training start``); ``python -m lpfail run fix_training`` runs what is missing and stores
the result.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpfail.sweep import lr as L
from lpfail.sweep import register_grid
from lpfail.sweep.stats import interval, judge, sensitivity_draws

PREREGISTERED_ON = "2026-12-01"
#: What had been seen when the rule was written (the docstring says so too): for B, the rule is applied, not
#: pre-registered.
SEEN = ("B's runs (the official fix) were stored, and their sensitivity seen beside A's and C's, before this "
        "rule was written; no run of B′ or R existed. The two-seed exploratory probe "
        "(the lab notebook's 'probes') had tried B and a bounded fix at 1e-2 and 3e-2 before any rule.")
FIXES = ("B", "Bp", "R")
FIX_HYPOTHESES = {
    "closes_half": "the fix closes at least half of the A − C gap in LR sensitivity at the smaller size: "
                   "S(X) − S(C) − ½·(S(A) − S(C)) < 0",
    "closes_all": "(descriptive) the fix's sensitivity is not above C's: S(X) − S(C) ≤ 0",
    "finite": "the fix turns no run non-finite where A did not (counted per learning rate; descriptive)",
}
FIX_RULE = ("Per fix X in (B, Bp, R): 'closes_half' is 'supported' when the 95 % paired bootstrap interval of "
            "S(X) − S(C) − ½·(S(A) − S(C)) (10,000 resamples of the seeds, as lr_sweep) lies below 0, 'refuted' "
            "when it lies above, else 'inconclusive'; it reads 'no gap to close' unless the interval of "
            "S(A) − S(C) lies above 0. Fix-b (the paper's claim, for the official fix B) takes B's word. "
            "'closes_all' is reported with the same words for S(X) − S(C) on the side 'below'; 'finite' lists, per "
            "learning rate, the runs of X that turned non-finite and those of A.")


@dataclass(frozen=True)
class FixTrainingConfig(L.LRSweepConfig):
    """`lr_sweep`'s config (same grid, seeds, data, schedule, smaller size) with the fix variants only."""

    variants: tuple[str, ...] = ("A", "C", "B", "Bp", "R")
    large_variants: tuple[str, ...] = ()


def judge_fixes(res: dict) -> dict:
    """The pre-registered analysis of a fix_training result (the arrays `lpfail.sweep.lr.assemble` builds)."""
    d, variants = sensitivity_draws(res)
    out = {"preregistered_on": PREREGISTERED_ON, "rule": FIX_RULE, "hypotheses": dict(FIX_HYPOTHESES),
           "S": {v: {"S": d[v][0], "ci": list(interval(d[v][1]))} for v in variants}}
    gap_p, gap_d = d["A"][0] - d["C"][0], d["A"][1] - d["C"][1]
    gap_ci = interval(gap_d)
    out["gap"] = {"point": gap_p, "ci": list(gap_ci), "verdict": judge(*gap_ci, "above")}
    status = np.asarray(res["small_status"])
    lrs = np.asarray(res["lrs"], dtype=np.float64)
    per = {}
    for x in FIXES:
        if x not in d:
            continue
        half_p = d[x][0] - d["C"][0] - 0.5 * gap_p
        half_ci = interval(d[x][1] - d["C"][1] - 0.5 * gap_d)
        all_ci = interval(d[x][1] - d["C"][1])
        word = judge(*half_ci, "below") if out["gap"]["verdict"] == "supported" else "no gap to close"
        per[x] = {"closes_half": {"point": half_p, "ci": list(half_ci), "verdict": word},
                  "closes_all": {"point": d[x][0] - d["C"][0], "ci": list(all_ci),
                                 "verdict": judge(*all_ci, "below")},
                  "finite": [{"lr": float(lr), "nonfinite": int(status[variants.index(x), j].sum()),
                              "A_nonfinite": int(status[variants.index("A"), j].sum())}
                             for j, lr in enumerate(lrs)]}
    out["fixes"] = per
    out["fix_b"] = per.get("B", {}).get("closes_half", {}).get("verdict", "not measured (runs missing)")
    return out


class FixGrid(L.LRGrid):
    """lr_sweep's grid with the fix variants; the quick profile's headline is B's half-gap statistic."""

    quick_variants = ("A", "C", "B")
    quick_label = "(S(B) − S(C)) − ½·(S(A) − S(C)) at the smaller size, one seed"

    def headline(self, have: dict, seed: int) -> float:
        s = {v: self.seed_sensitivity(have, v, seed) for v in self.quick_variants}
        return s["B"] - s["C"] - 0.5 * (s["A"] - s["C"])


@register_grid("fix_training", config=FixTrainingConfig, chapter="05_fix",
               description="Fix-b: B, B′ and the robust fix on lr_sweep's grid, smaller size (ch. 5; GPU)")
def fix_training_grid(config: FixTrainingConfig | None = None) -> FixGrid:
    """The grid (its runs: only Bp and R are new when lr_sweep's parts are there); the result assembled and judged."""
    return FixGrid(config or FixTrainingConfig(), "fix_training", "fix_analysis", judge_fixes, new=("Bp", "R"))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(fix_training_grid.main())
