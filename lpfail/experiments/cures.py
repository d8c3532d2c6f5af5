"""Every cure side by side on the learning-rate proxy. Chapter 6, "Beyond the paper".

The `lr_sweep` experiment (chapter 1) measures the LR sensitivity S of each attention arithmetic on a grid of
6 learning rates × 3 seeds at two sizes. This experiment runs the *cures* of the failing arithmetic A
(PAPER_BF16) on the same grid, seeds, batches and training setting, at the smaller size only, and compares each
cure's sensitivity with A's and with the FP32 control C. It is the learning-rate grid (`lpfail.sweep.lr`) with
other variants (`lpfail.sweep.variants.VARIANTS`): the runs are lr_sweep runs, stored in the same part files under
``results/lr_sweep_parts/`` and keyed by a hash of their TrainConfig, so every variant lr_sweep already ran
(A, C, S, D, B, A_sr, A_qk) is reused, not rerun.

====== ================================ ======== =========================================================
cure   variant                          acts in  stored runs
====== ================================ ======== =========================================================
—      A  reference(PAPER_BF16)         —        lr_sweep (the failing baseline)
—      C  reference(FP32)               —        lr_sweep (the control)
—      S  sdpa                          —        lr_sweep ("what sdpa users get")
FA2    D  reference(FA2_BF16)           fwd+bwd  lr_sweep
QK     A_qk  A + QK-norm                model    lr_sweep
SR     A_sr  A + stochastic rounding    forward  lr_sweep
B      B  the official fix              forward  lr_sweep
hp     A_hp  δ from FP32 O (dO·O_hp)    backward new
res    A_res output-residual comp.      both     new (stores a BF16 residual of O in the forward)
fix    Bp  Algorithm 3, no clamp        forward  new (shared with fix_training, chapter 5)
robust R   the robust fix (BoundedMax)  forward  new (shared with fix_training, chapter 5)
ds     A_ds  dS row-sum correction      backward new
z      A_z   z-loss 1e-4                model    new (non-precision control)
cap    A_cap output soft-cap 30         model    new (non-precision control)
====== ================================ ======== =========================================================

Algorithm 3 without the clamp (B′, variant ``Bp``) and chapter 5's robust fix (``R``) are the variants of
experiment `fix_training` (chapter 5, Fix-b): the same TrainConfigs, so whichever experiment runs first stores
them for both. (A first draft named Algorithm 3 ``A_fix`` here; it was renamed to share those runs, and the
robust fix added, before any run of either.)

The rule and the hypotheses below are code, fixed on 2026-12-01 before any run of the new variants. What was
known then: lr_sweep's results for the reused variants (S(A) − S(C) > 0 with a CI above 0, A_sr does not close
the gap, D closes it, B about a third), none for the new ones.

GPU: ``bash tools/gpu.sh start cures`` then ``wait cures`` (126 new runs, 36 of them shared with
fix_training; ≈ 13–18 device-minutes on one H200 at lr_sweep's measured 72–100 s per run with 12 at once); here
``python -m lpfail.experiments.cures collect`` stores the result from the copied parts — only once the grid is
whole: with runs missing it prints which (per variant and learning rate) and writes nothing. Meanwhile
`partial_analysis` gives the pre-registered verdicts of the complete variants (the rule is per cure, see
there) and `grid_status` the rest; chapter 6 shows both.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpfail.sweep import lr as ls
from lpfail.sweep.variants import VARIANTS, check as check_variants
from lpfail.sweep import lookup, register_grid
from lpfail.sweep.stats import bootstrap_seed_indices, effective_loss, interval, judge, sensitivities

PREREGISTERED_ON = "2026-12-01"
#: What had been seen when the rule was written. The disclosure of the probe was added on 2026-12-02 (the module
#: said "none for the new ones"); the rule is unchanged.
SEEN = ("lr_sweep's results for the reused variants (A − C > 0, A_sr does not close the gap, D closes it, B about a "
        "third); of the new variants no run of this grid, but the earlier two-seed exploratory probe "
        "(the lab notebook's 'probes'), which preceded every rule, had tried δ from an O recomputed in FP32 and a "
        "bounded form of the fix.")
BASELINE, CONTROL = "A", "C"
REUSED = ("A", "C", "S", "D", "B", "A_sr", "A_qk")  # already in lr_sweep's grid
NEW = ("A_hp", "A_res", "Bp", "R", "A_ds", "A_z", "A_cap")
CURES = ("D", "A_qk", "A_sr", "B", "A_hp", "A_res", "Bp", "R", "A_ds", "A_z", "A_cap")  # judged against A and C
WHERE = {"A": "—", "C": "—", "S": "—", "D": "forward + backward", "A_qk": "model", "A_sr": "forward",
         "B": "forward", "A_hp": "backward", "A_res": "forward + backward", "Bp": "forward", "R": "forward",
         "A_ds": "backward", "A_z": "model (loss)", "A_cap": "model (logits)"}

HYPOTHESES = {
    "K1": "cure c lowers A's LR sensitivity at the smaller size: S(c) − S(A) < 0",
    "K2": "cure c closes at least half of the A − C gap: S(c) − S(C) − ½·(S(A) − S(C)) < 0",
}
RULE = ("Per cure, each statistic's 95 % bootstrap interval (10,000 resamples of the seeds, the same resamples "
        "for every variant, as in lr_sweep) decides: 'supported' when it lies entirely on the hypothesised side "
        "of 0, 'refuted' when entirely on the other side, else 'inconclusive'. K2 needs a gap: unless "
        "S(A) − S(C) has an interval above 0 it reads 'no gap to close'. The fraction of the gap closed, "
        "(S(A) − S(c)) / (S(A) − S(C)), and the throughput relative to A are descriptive.")
#: What we expected on 2026-12-01, written before the new runs (for the closing note to compare against).
PREDICTIONS = {
    "A_hp": "closes little: the suspects left by A_sr are the BF16 scores, m, ℓ and the backward casts, and δ "
            "reads O only",
    "A_res": "like A_hp",
    "Bp": "closes part of the gap, more than B (no clamp, no masked ties), but turns non-finite at 3.2e-2",
    "R": "closes as much as Bp where Bp is finite, and stays finite",
    "A_ds": "closes little (dS is BF16 in D too, which closes the gap)",
    "A_z": "closes little: a control that acts on the output logits, not attention",
    "A_cap": "closes little, like A_z",
}


@dataclass(frozen=True)
class CuresConfig:
    """The variants; everything else is lr_sweep's default setting (grid, seeds, batches, smaller size)."""

    variants: tuple[str, ...] = REUSED + NEW

    def __post_init__(self):
        check_variants(self.variants, "CuresConfig")
        if BASELINE not in self.variants or CONTROL not in self.variants:
            raise ValueError(f"CuresConfig.variants must include {BASELINE} and {CONTROL}")

    def sweep(self) -> ls.LRSweepConfig:
        """The lr_sweep config whose grid these runs are: lr_sweep's defaults, these variants, the smaller
        size only."""
        return ls.LRSweepConfig(variants=tuple(self.variants), large_variants=())


class CuresGrid(ls.LRGrid):
    """lr_sweep's grid with the cures (smaller size only), analysed by this experiment's rule; the quick
    profile's headline is production arithmetic's (D) half-gap statistic."""

    quick_variants = ("A", "C", "D")
    quick_label = "(S(D) − S(C)) − ½·(S(A) − S(C)) at the smaller size, one seed"

    def __init__(self, cfg: CuresConfig):
        super().__init__(cfg.sweep(), "cures", "cures_analysis", analyse, new=NEW, lr_analysis=False,
                         experiment_config=cfg)

    def result(self, have: dict, parts: list[dict]) -> dict:
        out = super().result(have, parts)
        out["preregistered_on"] = PREREGISTERED_ON
        return out

    def headline(self, have: dict, seed: int) -> float:
        s = {v: self.seed_sensitivity(have, v, seed) for v in self.quick_variants}
        return s["D"] - s["C"] - 0.5 * (s["A"] - s["C"])


@register_grid("cures", config=CuresConfig, chapter="06_beyond",
               description="every cure of A on the LR-sensitivity proxy, reusing lr_sweep's runs (ch. 6; GPU)")
def cures_grid(config: CuresConfig | None = None) -> CuresGrid:
    return CuresGrid(config or CuresConfig())


def grid_status(cfg: CuresConfig | None = None, directory=None) -> dict:
    """Which points of the cures grid are stored: per variant the stored and planned run counts, whether the
    variant is complete, and for an incomplete one the learning rates with missing runs ({lr: [seeds]}).
    ``complete`` is True when the whole grid is stored; ``judgeable`` lists the variants whose verdicts the
    pre-registered rule can give now (see `partial_analysis`)."""
    cfg = cfg or CuresConfig()
    lk = lookup(cures_grid(cfg), directory)
    per = {}
    for v in cfg.variants:
        miss = [r for r in lk.runs if r.group == v and r.id not in lk.have]  # retired runs are read
        lrs: dict[float, list[int]] = {}
        for r in miss:
            lrs.setdefault(float(r.config.lr), []).append(int(r.seed))
        stored = sum(r.group == v and r.id in lk.have for r in lk.runs)
        per[v] = {"stored": stored, "planned": stored + len(miss), "complete": not miss,
                  "missing_lrs": {lr: sorted(s) for lr, s in sorted(lrs.items())}}
    base_ok = per[BASELINE]["complete"] and per[CONTROL]["complete"]
    return {"planned": len(lk.runs), "stored": len(lk.have), "complete": lk.complete, "per_variant": per,
            "judgeable": [v for v in cfg.variants if base_ok and per[v]["complete"]],
            "not_judged": [v for v in cfg.variants if not (base_ok and per[v]["complete"])]}


def partial_analysis(cfg: CuresConfig | None = None, directory=None) -> dict:
    """The pre-registered analysis for the *complete* variants of a partly stored grid, and the grid's status.

    Why this is the pre-registered verdict and not a peek: the rule (`RULE`) is defined per cure — S(c) and its
    bootstrap draws use only cure c's 6 × 3 runs (`sensitivities` works variant by variant), and the
    resamples of the seeds (`bootstrap_seed_indices`) depend only on the number of seeds — so a complete
    cure's K1/K2 verdict, compared with complete A and C, is exactly the one the whole grid will give; the
    runs still missing cannot change it. An incomplete variant gets no S and no verdict. Returns
    {"status": grid_status, "analysis": analyse(...) over the judgeable variants, or None when A or C is
    incomplete}."""
    cfg = cfg or CuresConfig()
    status = grid_status(cfg, directory)
    judged = tuple(status["judgeable"])
    if not judged:
        return {"status": status, "analysis": None, "parts": []}
    sub = CuresConfig(variants=judged)
    lk = lookup(cures_grid(sub), directory)
    out = ls.assemble(sub.sweep(), lk.have, lk.parts)
    return {"status": status, "analysis": analyse(out), "parts": out["parts"]}


def missing_text(entry: dict, n_lrs: int | None = None) -> str:
    """A variant's missing runs in a few words: "seed 2 at all 6 LRs", or per learning rate."""
    miss = entry["missing_lrs"]
    if not miss:
        return "none"
    n_lrs = n_lrs or len(ls.LRSweepConfig().lrs)
    seeds = {tuple(s) for s in miss.values()}
    if len(miss) == n_lrs and len(seeds) == 1:
        (s,) = seeds
        return f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))} at all {n_lrs} LRs"
    return "; ".join(f"lr {lr:g}: seed {', '.join(map(str, s))}" for lr, s in miss.items())


def status_text(status: dict) -> str:
    """A short plain-text account of the grid: complete variants, and per incomplete one its missing runs."""
    per = status["per_variant"]
    done = [v for v, x in per.items() if x["complete"]]
    lines = [f"cures grid: {status['stored']} of {status['planned']} runs stored"
             + ("" if not status["complete"] else " (complete)"),
             f"complete variants: {', '.join(done) if done else 'none'}"]
    for v, x in per.items():
        if not x["complete"]:
            lines.append(f"{v}: {x['stored']}/{x['planned']} stored; missing {missing_text(x)}")
    return "\n".join(lines)


def analyse(res) -> dict:
    """The cures table from an assembled lr_sweep-style result of the cures grid (`ls.assemble`): per variant
    S with CI, S(c) − S(A) and the K1/K2 verdicts with CIs, the fraction of the gap closed, relative throughput."""
    variants = [str(v) for v in np.asarray(res["small_variants"])]
    eff = effective_loss(res["small_val_final"], res["small_val_init"])           # (V, L, S)
    idx = bootstrap_seed_indices(eff.shape[-1])
    point, boot = sensitivities(eff, idx)
    tps = np.asarray(res["small_tokens_per_s"], dtype=np.float64)                    # (V, L, S)
    i_a, i_c = variants.index(BASELINE), variants.index(CONTROL)
    gap_p, gap_d = point[i_a] - point[i_c], boot[i_a] - boot[i_c]
    gap_ci = interval(gap_d)
    has_gap = judge(*gap_ci, "above") == "supported"
    rows = {}
    for i, v in enumerate(variants):
        row = {"label": VARIANTS[v].label, "where": WHERE.get(v, "?"), "S": float(point[i]),
               "ci": list(interval(boot[i])),
               "throughput_vs_A": float(np.nanmedian(tps[i]) / np.nanmedian(tps[i_a]))}
        if v in CURES:
            d1 = boot[i] - boot[i_a]
            k1 = {"point": float(point[i] - point[i_a]), "ci": list(interval(d1))}
            k1["verdict"] = judge(*k1["ci"], "below")
            d2 = boot[i] - boot[i_c] - 0.5 * gap_d
            k2 = {"point": float(point[i] - point[i_c] - 0.5 * gap_p), "ci": list(interval(d2))}
            k2["verdict"] = judge(*k2["ci"], "below") if has_gap else "no gap to close"
            frac = (boot[i_a] - boot[i]) / np.where(gap_d > 0, gap_d, np.nan)
            row.update(K1=k1, K2=k2, gap_closed=float((point[i_a] - point[i]) / gap_p) if gap_p > 0 else None,
                       gap_closed_ci=list(interval(frac[np.isfinite(frac)])) if np.isfinite(frac).any() else None)
        rows[v] = row
    return {"preregistered_on": PREREGISTERED_ON, "rule": RULE, "hypotheses": dict(HYPOTHESES),
            "predictions": dict(PREDICTIONS), "gap": {"point": float(gap_p), "ci": list(gap_ci)}, "cures": rows}


# -- what a CPU can show now: each cure's effect on one attention call's gradient error --------------------------
def gradient_errors(policies: dict, seeds=(0, 1, 2), T: int = 256, D: int = 64, q_scale: float = 6.0) -> dict:
    """Relative error (‖g − g_FP64‖ / ‖g_FP64‖) of dQ, dK, dV of one causal attention call under each policy,
    mean over `seeds`, on BF16 inputs whose queries are scaled by `q_scale` so that logits are large and BF16
    scores tie (the failing regime). {name: {"dq": …, "dk": …, "dv": …}}. Uses the reference attention
    (`lpfail.attention`); stochastic rounding draws from torch's generator, seeded per seed."""
    import torch

    from lpfail.attention import attention, naive_attention

    out = {name: {"dq": [], "dk": [], "dv": []} for name in policies}
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        q = (torch.randn(1, 2, T, D, generator=g) * q_scale).bfloat16()
        k, v, do = (torch.randn(1, 2, T, D, generator=g).bfloat16() for _ in range(3))
        ref = [t.double().requires_grad_() for t in (q, k, v)]
        naive_attention(*ref).backward(do.double())
        truth = [t.grad for t in ref]
        for name, policy in policies.items():
            torch.manual_seed(seed)
            xs = [t.clone().requires_grad_() for t in (q, k, v)]
            attention(*xs, policy=policy).backward(do)
            for key, x, t in zip(("dq", "dk", "dv"), xs, truth):
                out[name][key].append(((x.grad.double() - t).norm() / t.norm()).item())
    return {name: {k: float(np.mean(v)) for k, v in d.items()} for name, d in out.items()}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(cures_grid.main())
