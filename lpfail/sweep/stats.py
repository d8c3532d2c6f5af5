"""The paired statistics of every grid experiment: LR sensitivity, intervals over seeds, the half-gap rule, the
judge — written once, used by `lr_sweep`, `substitution`, `fix_training`, `cures` and `compiled_sweep`.

The design: every variant of a grid shares its seeds (the same initialization and the same batches), so two
variants are compared seed by seed (*paired*). A statistic is a function of the per-seed losses; an interval
over seeds says how much it could move with other seeds.

**The legacy rule** (`sensitivities`, `bootstrap_seed_indices`, `interval`, `judge`, `half_gap`): a percentile
bootstrap over seeds (10,000 resamples, the same resamples for every variant). It is the rule the experiments
pre-registered on 2026-12-01, so their stored verdicts are reproduced with it exactly. With 3 seeds its "95 %"
interval is the range of the seeds (27 equally likely resamples: each all-one-seed resample weighs 3.7 % >
2.5 %), so it calls far more than 5 % of null effects.
"""
from __future__ import annotations

import numpy as np

CONFIDENCE = 0.95  # two-sided percentile bootstrap interval (the legacy rule)
N_BOOTSTRAP = 10_000  # resamples of the seeds (with replacement; the same resample for every variant and lr)
BOOTSTRAP_SEED = 0
SIDES = ("above", "below")


def effective_loss(val_final: np.ndarray, val_init: np.ndarray) -> np.ndarray:
    """min(final loss, loss at initialization), with a non-finite final loss counted as the init loss."""
    final = np.asarray(val_final, dtype=np.float64)
    init = np.asarray(val_init, dtype=np.float64)
    return np.where(np.isfinite(final), np.minimum(final, init), init)


def sensitivity(loss_eff: np.ndarray) -> np.ndarray:
    """LR sensitivity of curves ``loss_eff[..., lr]`` (already min(L, L_init), non-finite → L_init):
    mean over the grid minus the minimum over the grid (Wortsman et al. 2023, Sec. 3)."""
    x = np.asarray(loss_eff, dtype=np.float64)
    return x.mean(axis=-1) - x.min(axis=-1)


def bootstrap_seed_indices(n_seeds: int, n: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(n, n_seeds) indices into the seed axis: the resamples every statistic shares (paired design)."""
    return np.random.default_rng(seed).integers(0, n_seeds, size=(n, n_seeds))


def sensitivities(loss_eff: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """loss_eff (variants, lrs, seeds) → (point estimates (variants,), bootstrap draws (variants, n)).

    The curve of a variant is the mean over seeds at each learning rate; a resample replaces the seeds by
    ``idx`` (the same for every variant, so differences between variants are paired by seed)."""
    x = np.asarray(loss_eff, dtype=np.float64)
    point = sensitivity(x.mean(axis=-1))
    if idx is None:
        idx = bootstrap_seed_indices(x.shape[-1])
    curves = x[..., idx].mean(axis=-1)  # (variants, lrs, n)
    return point, sensitivity(np.moveaxis(curves, 1, -1))


def sensitivity_draws(res, size: str = "small") -> tuple[dict[str, tuple[float, np.ndarray]], list[str]]:
    """Per variant of an assembled grid result (``{size}_val_final``, ``{size}_val_init``, ``{size}_variants``)
    at ``size``: its LR sensitivity S and S's bootstrap draws over the seeds (the shared resamples), as
    {variant: (S, draws)}, and the variants in the result's order."""
    eff = effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])   # (V, lrs, seeds)
    variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
    point, boot = sensitivities(eff, bootstrap_seed_indices(eff.shape[-1]))
    return {v: (float(point[i]), boot[i]) for i, v in enumerate(variants)}, variants


def interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of bootstrap draws."""
    a = (1 - confidence) / 2
    return float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a))


def judge(lo: float, hi: float, side: str) -> str:
    """'supported' / 'refuted' / 'inconclusive' for an interval [lo, hi] and the hypothesised side of 0
    ("above" or "below")."""
    if side not in SIDES:
        raise ValueError(f"side must be 'above' or 'below' (got {side!r})")
    above, below = lo > 0, hi < 0
    if side == "above":
        return "supported" if above else "refuted" if below else "inconclusive"
    return "supported" if below else "refuted" if above else "inconclusive"


def half_gap(x: tuple[float, np.ndarray], a: tuple[float, np.ndarray], c: tuple[float, np.ndarray]
             ) -> tuple[float, np.ndarray]:
    """The "closes at least half of the A − C gap" statistic (X − C) − ½·(A − C), as (point, draws), from the
    (point, draws) of X, A and C — sensitivities (`sensitivity_draws`) or per-lr mean losses with their
    bootstrap means. Below 0: X closes more than half of the gap."""
    (px, dx), (pa, da), (pc, dc) = x, a, c
    return px - pc - 0.5 * (pa - pc), dx - dc - 0.5 * (da - dc)


def gap_word(verdict: str, has_gap: bool) -> str:
    """A half-gap verdict, or 'no gap to close' where the A − C gap itself is not established."""
    return verdict if has_gap else "no gap to close"


def lr_exceeding(curve: np.ndarray, lrs, factor: float = 1.10) -> float:
    """The smallest learning rate above the best one whose loss exceeds the best loss by ``factor`` (NaN if
    none does): where the curve turns up."""
    curve = np.asarray(curve, dtype=np.float64)
    best = int(np.argmin(curve))
    for i in range(best + 1, len(curve)):
        if curve[i] > factor * curve[best]:
            return float(lrs[i])
    return float("nan")
