"""The attention variants of the learning-rate grid (`lpfail.sweep.lr`), shared by every experiment built on its
runs (`lr_sweep`, `fix_training`, `cures`, `compiled_sweep`, `confirmation`, `dial_training`, `precision_alarm`,
`substitution`'s baselines, the verdict page). Framework data, not an experiment: it imports none.

A variant is the training run's attention (a `TrainConfig.attention` spec), whether the model has QK-norm, a
label, and any further TrainConfig fields (the cures' z-loss and soft-cap). Every variant runs the pure-PyTorch
reference `lpfail.attention` except S (PyTorch's SDPA). A run's identity is the hash of its TrainConfig, so a
variant of one experiment that another experiment also uses *is* the same stored run.
"""
from __future__ import annotations

from dataclasses import dataclass

from lpfail import precision as _precision
from lpfail.precision import DIAL_KS, arm_a, arm_d, arm_r, arm_sr


@dataclass(frozen=True)
class Variant:
    attention: str  # TrainConfig.attention
    qk_norm: bool
    label: str
    train: tuple = ()  # further TrainConfig fields as (name, value) pairs (the `cures` variants' z-loss, soft-cap)
    words: str = ""  # the variant named in words, for prose (the book's glossary)


VARIANTS: dict[str, Variant] = {
    "A": Variant("reference(PAPER_BF16)", False, "A: PAPER_BF16 (the paper's failing arithmetic)",
                 words="the paper's arithmetic"),
    "C": Variant("reference(FP32)", False, "C: FP32 attention (the control)", words="FP32 attention"),
    "D": Variant("reference(FA2_BF16)", False, "D: FA2_BF16 (production-kernel arithmetic)",
                 words="production (FA2) arithmetic"),
    "B": Variant("reference(PAPER_BF16_OFFICIAL_FIX)", False, "B: the paper's official fix", words="the official fix"),
    "S": Variant("sdpa", False, "S: PyTorch SDPA", words="PyTorch SDPA"),
    "A_sr": Variant("reference(PAPER_BF16,rounding=sr,sr_stream=1)", False, "A + stochastic rounding (P̄V, Ō, O)",
                    words="the paper's arithmetic + stochastic rounding"),
    "A_qk": Variant("reference(PAPER_BF16)", True, "A + QK-norm", words="the paper's arithmetic + QK-norm"),
    "C_qk": Variant("reference(FP32)", True, "C + QK-norm", words="FP32 attention + QK-norm"),
    # the placebo of experiment `confirmation`: FP32 attention with FA2's tiles, another summation
    # order in the online softmax where the precision is high enough not to matter
    "C_tile": Variant("reference(FP32,block=128x64)", False, "C_tile: FP32 attention, FA2's 128 × 64 tiles (placebo)",
                      words="FP32 attention with other tiles (placebo)"),
    # the cures of experiment `cures` (chapter 6; lpfail.experiments.cures), never in lr_sweep's grid
    "A_hp": Variant("reference(PAPER_BF16,delta=dO.O_hp)", False, "A + δ from an FP32 O (dO·O_hp)",
                    words="the paper's arithmetic + δ from an FP32 O"),
    "A_res": Variant("reference(PAPER_BF16,delta=dO.O_res)", False, "A + output-residual compensation",
                     words="the paper's arithmetic + output-residual compensation"),
    "A_ds": Variant("reference(PAPER_BF16,ds_rowsum=true)", False, "A + dS row-sum correction",
                    words="the paper's arithmetic + a dS row-sum correction"),
    "A_z": Variant("reference(PAPER_BF16)", False, "A + z-loss 1e-4", (("z_loss", 1e-4),),
                   words="the paper's arithmetic + z-loss"),
    "A_cap": Variant("reference(PAPER_BF16)", False, "A + output-logit soft-cap 30", (("logit_softcap", 30.0),),
                     words="the paper's arithmetic + a logit soft-cap"),
    # the variants of experiment `fix_training` (lpfail.experiments.fix_training); not in lr_sweep's grid
    "Bp": Variant("reference(PAPER_BF16+fix)", False, "B′: Algorithm 3 without the official clamp",
                  words="Algorithm 3 without the clamp"),
    "R": Variant("reference(PAPER_BF16_ROBUST_FIX)", False, "R: the robust fix (BoundedMax)", words="the robust fix"),
    # the variant of experiment `compiled_sweep` (lpfail.experiments.compiled_sweep); not in lr_sweep's grid.
    # The preset's knobs are spelled out, so that the runs' TrainConfig hash changes whenever the preset is
    # corrected (a run of an earlier definition is then not reused).
    "A_comp": Variant(f"reference({_precision.PAPER_BF16_COMPILED})", False,
                      "A_comp: PAPER_BF16_COMPILED (the official code under torch.compile)",
                      words="the paper's arithmetic as compiled"),
}


# The precision dial's arms (`lpfail.precision.arm_a` …; experiment `dial_training`): K fraction bits at BF16's
# exponent. At K = 7 each arm is its base policy (A_7 is A, SR_7 is A_sr), so only K < 7 is listed; the policy string is
# spelled out, so a run's TrainConfig hash names every knob of its arm.
def _dial_variants() -> dict[str, Variant]:
    words = {"A": ("the paper's arithmetic at {k} bits", "A_{k}: PAPER_BF16 with V and the output path at {k} bits"),
             "SR": ("the paper's arithmetic at {k} bits, stochastically rounded",
                    "SR_{k}: A_{k} with the output path rounded stochastically"),
             "D": ("production arithmetic at {k} bits", "D_{k}: FA2_BF16 with V and O at {k} bits"),
             "R": ("the robust fix at {k} bits", "R_{k}: A_{k} with the robust fix")}
    out = {}
    for arm, make in (("A", arm_a), ("SR", arm_sr), ("D", arm_d), ("R", arm_r)):
        for k in DIAL_KS:
            if k < 7:
                w, label = words[arm]
                out[f"{arm}_{k}"] = Variant(f"reference({make(k)})", False, label.format(k=k), words=w.format(k=k))
    return out


VARIANTS.update(_dial_variants())


def check(names, what: str):
    """Raise a ValueError naming the unknown variants among ``names``."""
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"{what}: unknown variant(s) {unknown}; variants: {list(VARIANTS)}")
