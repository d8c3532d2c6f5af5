"""Does the arithmetic the paper's GPUs ran change the symptom? `PAPER_BF16_COMPILED` on lr_sweep's grid.

The paper's `train.py` compiles its model (`compile = True`), and inductor fuses the official attention's
elementwise chains, skipping some of the BF16 roundings that eager PyTorch performs (chapter 4, "What the paper's
GPUs computed"). `PAPER_BF16` is the eager arithmetic; `PAPER_BF16_COMPILED` is the compiled one. This experiment
runs the compiled arithmetic through the learning-rate grid (`lpfail.sweep.lr`) at its smaller size (4 × 256):
the same 6 learning rates, 3 seeds, initializations, batches and training setting as A (PAPER_BF16) and C (FP32),
whose runs lr_sweep stored and which are reused, not rerun.

====== ============================================== ===================================================
A      ``reference(PAPER_BF16)``                      the eager official arithmetic (lr_sweep's runs)
C      ``reference(FP32)``                            the control (lr_sweep's runs)
A_comp ``reference(PAPER_BF16_COMPILED)``             the official code under torch.compile (18 new runs)
====== ============================================== ===================================================

The runs are lr_sweep runs (`lpfail.sweep.variants`, the same part files, keyed by a hash of their TrainConfig). The
preset is read by name when a run starts: run this only after `official_check` on a GPU has confirmed the preset
(≥ 99.9 % bit agreement with the compiled official code); a run of an earlier preset has another TrainConfig hash
only if the preset's string changed, so check `PAPER_BF16_COMPILED`'s string against the one in the stored runs.

The rule (`COMPILED_RULE`, `judge_compiled`) was fixed in code on `PREREGISTERED_ON`, before any run of A_comp.
What was known then: lr_sweep's S(A) − S(C) = +0.083 with a CI above 0 at the smaller size; the compiled
arithmetic's tied-row output bias on chapter 4's rows equal to the eager one within its CI (a probe),
no training run of it.

``python -m lpfail sweep compiled_sweep status | plan | checks | drive [--budget S] [--quick] | collect``; on a GPU
machine ``tools/gpu.sh compiled_sweep start``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpfail import results
from lpfail.sweep import lr as L
from lpfail.sweep.variants import VARIANTS
from lpfail.sweep import register_grid
from lpfail.sweep.stats import interval, judge, sensitivity_draws

PREREGISTERED_ON = "2026-12-01"
#: What had been seen when the rule was written, before the first run of A_comp.
SEEN = ("lr_sweep's stored runs of A and C at the same seeds, rates and batches, which this grid shares (its H1, "
        "S(A) − S(C) > 0, supported on three seeds); no run of A_comp.")
NEW = ("A_comp",)
COMPILED_HYPOTHESES = {
    "symptom": "the compiled arithmetic shows the symptom: S(A_comp) − S(C) > 0",
    "same_as_eager": "(descriptive) the compiled arithmetic's sensitivity equals the eager one's: the interval "
                     "of S(A_comp) − S(A) contains 0",
}
COMPILED_RULE = ("'symptom' is 'supported' when the 95 % paired bootstrap interval of S(A_comp) − S(C) (10,000 "
                 "resamples of the seeds, as lr_sweep) lies above 0, 'refuted' when it lies below, else "
                 "'inconclusive'. 'same_as_eager' reports the interval of S(A_comp) − S(A): 'yes' when it "
                 "contains 0, else 'higher' or 'lower' (descriptive: a difference the 3 seeds cannot resolve is "
                 "not evidence of equality).")


@dataclass(frozen=True)
class CompiledSweepConfig(L.LRSweepConfig):
    """`lr_sweep`'s config (same grid, seeds, data, schedule, smaller size) with A, C and A_comp only."""

    variants: tuple[str, ...] = ("A", "C", "A_comp")
    large_variants: tuple[str, ...] = ()


def judge_compiled(res: dict) -> dict:
    """The pre-registered analysis of a compiled_sweep result (the arrays `lpfail.sweep.lr.assemble` builds)."""
    variants = [str(v) for v in np.asarray(res["small_variants"])]
    for v in ("A", "C", "A_comp"):
        if v not in variants:
            raise ValueError(f"judge_compiled: variant {v!r} missing from the result (has {variants})")
    S, _ = sensitivity_draws(res)

    def diff(x, y):
        ci = interval(S[x][1] - S[y][1])
        return {"point": S[x][0] - S[y][0], "ci": list(ci)}

    symptom = diff("A_comp", "C")
    symptom["verdict"] = judge(*symptom["ci"], "above")
    eager = diff("A_comp", "A")
    lo, hi = eager["ci"]
    eager["verdict"] = "yes" if lo <= 0 <= hi else ("higher" if lo > 0 else "lower")
    status = np.asarray(res["small_status"])
    return {"preregistered_on": PREREGISTERED_ON, "rule": COMPILED_RULE, "hypotheses": dict(COMPILED_HYPOTHESES),
            "S": {v: {"S": S[v][0], "ci": list(interval(S[v][1]))} for v in variants},
            "symptom": symptom, "same_as_eager": eager, "gap_A_C": diff("A", "C"),
            "nonfinite": {v: int(status[variants.index(v)].sum()) for v in variants},
            "preset": VARIANTS["A_comp"].attention}


class CompiledGrid(L.LRGrid):
    """lr_sweep's grid with A_comp; the quick profile's headline is S(A_comp) − S(C)."""

    quick_variants = ("A_comp", "C")
    quick_label = "S(A_comp) − S(C) at the smaller size, one seed"

    def headline(self, have: dict, seed: int) -> float:
        return self.seed_sensitivity(have, "A_comp", seed) - self.seed_sensitivity(have, "C", seed)

    def ready(self) -> str:
        """Runs of A_comp start only once `official_check` (on a GPU) confirms PAPER_BF16_COMPILED."""
        from lpfail.experiments.official_check import preset_confirmed

        try:
            ok, why = preset_confirmed(results.load("official_check"))
        except results.ResultError as e:
            return f"no usable official_check result ({e})"
        return "" if ok else f"official_check does not confirm the preset: {why}"


@register_grid("compiled_sweep", config=CompiledSweepConfig, chapter="lab_01_symptom",
               description="PAPER_BF16_COMPILED beside A and C on lr_sweep's grid, smaller size (ch. 1; GPU)")
def compiled_sweep_grid(config: CompiledSweepConfig | None = None) -> CompiledGrid:
    """The grid (only A_comp is new when lr_sweep's parts are there); the result assembled and judged."""
    return CompiledGrid(config or CompiledSweepConfig(), "compiled_sweep", "compiled_analysis", judge_compiled,
                        new=NEW)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(compiled_sweep_grid.main())
