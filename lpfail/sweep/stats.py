"""Paired statistics of the sweeps: what every grid experiment computes from its runs, once.

Every grid in lpfail trains the same points (learning rate × seed) under several *variants* (attention
arithmetics) with the same initialization and the same batches per seed: **the seed is the pairing unit**.
Two rules live here.

**The legacy seed-bootstrap rule** (`effective_loss` … `gap_word`). The rules pre-registered
before the paired rule (lr_sweep's H1–H4, substitution's rows, Fix-b, the cures' K1/K2, compiled_sweep) use it, and
their verdicts must stay reproducible bit for bit: S is the LR sensitivity of the *seed-mean* curve, its
"95 % interval" the percentile interval of 10,000 paired resamples of the seeds, and a hypothesis is
'supported' when that interval lies on its side of 0. What it does on null data: with 3
seeds the resample has 27 equally likely patterns, so the interval's ends are the smallest and largest seed,
and the rule calls about one null comparison in four (two-sided), still about one in ten with 10 seeds
(tests/test_stats_null.py measures it; notes/statistics.md gives the numbers). Do not use it for new rules.

**The paired rule** (`paired`, `judge_family`):

* *statistic* — per seed s, a difference d_s between variants: of final held-out losses at one learning
  rate (L_X − L_Y), of LR sensitivities S computed from *that seed's own curve* (`seed_sensitivity`; so the
  d_s are independent across seeds), or the half-gap statistic (X − Y) − ½·(A − C) per seed
  (`seed_half_gap`).
  A diverged run counts as its loss at initialization (`effective_loss`, as in the legacy rule); a missing
  run (NaN) is an error: drop that seed from every variant, or run it.
* *test* — the exact paired sign-flip permutation test of the mean (`sign_flip_p`): under "no difference"
  the d_s are symmetric about 0 (the variants are exchangeable within a seed), so each of the 2^n sign
  patterns is equally likely; p counts the patterns whose |Σ ± d_s| is at least the observed |Σ d_s|.
  Exact enumeration for n ≤ 20, Monte Carlo (2^16 patterns, fixed seed) above: the design of
  ``scipy.stats.permutation_test(..., permutation_type="samples")``, whose p values it equals, except that a
  sum counts as tied with the observed one within 1e-9·Σ|d_s| (scipy's tolerance, relative to the observed
  mean, misses the observed pattern's own mirror when that mean is near 0; tests/test_stats.py). No distributional
  assumption beyond symmetry under the null (exact for X − Y; for the half-gap statistic, whose per-seed
  values need not be symmetric, tests/test_stats_null.py measures it); its smallest attainable p is 2/2^n
  two-sided (`p_floor`).
  **With n = 3 seeds that is 1/4: a 3-seed row can never be 'supported' or 'refuted' at α = 0.05**;
  n = 7 reaches 1/64, n = 10 1/512. The Student t test (`test="t"`) is available where a family is too large
  for the floor (see `judge_family`); tests/test_stats_null.py measures its false-call rate too.
* *multiplicity* — Holm–Bonferroni within each pre-registered family (`holm`); raw and adjusted p side by
  side; a hypothesis not measured counts in its family with p = 1 (the family's size is the registered one).
* *call* — α = 0.05 on the Holm-adjusted two-sided p: 'supported' when p_adj ≤ α and the mean difference lies
  on the hypothesised side of 0, 'refuted' when p_adj ≤ α on the other side, else 'inconclusive'.
* *estimate* — the mean of d_s with a Student t interval (95 %, `t_interval`; the t distribution is scipy's,
  `t_quantile` and `t_sf`, imported on first use). The interval is per hypothesis (not adjusted for the family).
* *confirm / estimate split* — the call may be made on a subset of the seeds (e.g. seeds 3–9, run after the
  rule was fixed) while the estimate and its interval pool every seed (0–9); `paired` reports both seed
  sets it used.

`placebo` applies the same rule and family to a variant that should not matter (e.g. FP32 attention with
another tiling): its call rate is the rule's false-positive rate in chaotic training. `seed_residuals`,
`null_draws`, `contrast`, `paired_rates` and `legacy_rates` simulate null data at the stored noise level and
measure both rules on it (tests/test_stats_null.py; the numbers are in notes/statistics.md).
`lpfail.sweep.power` simulates whole pre-registered families through `paired` and `judge_family` (false calls,
coverage, the gap detectable with 80 % power).

The design in one example (lr_sweep's H1 on ten seeds, the call on the fresh seeds 3–9)::

    eff = effective_loss(res["small_val_final"], res["small_val_init"])         # (variants, lrs, seeds)
    s = seed_sensitivity(eff)                                                      # (variants, seeds)
    h1 = paired(s[iA] - s[iC], seeds=range(10), confirm=range(3, 10))
    fam = judge_family({"H1": h1, "H2": ..., "H3": ...}, {"H1": "above", "H2": "below", "H3": "below"})
    fam["H1"]["verdict"], fam["H1"]["p"], fam["H1"]["p_adjusted"], fam["H1"]["estimate"], fam["H1"]["ci"]
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

# == the legacy seed-bootstrap rule (pre-registered; keep its numerics) ===============================
CONFIDENCE = 0.95  # two-sided percentile bootstrap interval
N_BOOTSTRAP = 10_000  # resamples of the seeds (with replacement; the same resample for every variant and lr)
BOOTSTRAP_SEED = 0
SIDES = ("above", "below")
LEGACY_RULE = ("A statistic's hypothesis is 'supported' when its 95 % percentile bootstrap interval (10,000 "
               "resamples of the seeds, paired across variants) lies entirely on the hypothesised side of 0, "
               "'refuted' when it lies entirely on the other side, else 'inconclusive'.")


def sensitivity(loss_eff: np.ndarray) -> np.ndarray:
    """LR sensitivity of curves ``loss_eff[..., lr]`` (already min(L, L_init), non-finite → L_init):
    mean over the grid minus the minimum over the grid (Wortsman et al. 2023, Sec. 3)."""
    x = np.asarray(loss_eff, dtype=np.float64)
    return x.mean(axis=-1) - x.min(axis=-1)


def effective_loss(val_final: np.ndarray, val_init: np.ndarray) -> np.ndarray:
    """min(final loss, loss at initialization), with a non-finite final loss counted as the init loss.

    This is how every rule treats a diverged run: as a run that learned nothing. A missing run has a NaN
    *init* loss too and stays NaN (the paired rule refuses it)."""
    final = np.asarray(val_final, dtype=np.float64)
    init = np.asarray(val_init, dtype=np.float64)
    return np.where(np.isfinite(final), np.minimum(final, init), init)


def bootstrap_seed_indices(n_seeds: int, n: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(n, n_seeds) indices into the seed axis: the resamples every statistic shares (paired design)."""
    return np.random.default_rng(seed).integers(0, n_seeds, size=(n, n_seeds))


def sensitivities(loss_eff: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """loss_eff (variants, lrs, seeds) → (point estimates (variants,), bootstrap draws (variants, n)).

    The curve of a variant is the mean over seeds at each learning rate; a resample replaces the seeds by
    ``idx`` (the same for every variant, so differences between variants are paired by seed). Leading axes
    beyond ``variants`` are kept (``(..., lrs, seeds)`` → ``(...,)`` and ``(..., n)``)."""
    x = np.asarray(loss_eff, dtype=np.float64)
    point = sensitivity(x.mean(axis=-1))
    if idx is None:
        idx = bootstrap_seed_indices(x.shape[-1])
    curves = x[..., idx].mean(axis=-1)  # (variants, lrs, n)
    return point, sensitivity(np.moveaxis(curves, -2, -1))


def interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of bootstrap ``draws`` (legacy)."""
    a = (1 - confidence) / 2
    return float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a))


def judge(lo: float, hi: float, side: str) -> str:
    """'supported' / 'refuted' / 'inconclusive' for an interval [lo, hi] and the hypothesised side of 0
    ("above" or "below") (legacy)."""
    _check_side(side)
    above, below = lo > 0, hi < 0
    if side == "above":
        return "supported" if above else "refuted" if below else "inconclusive"
    return "supported" if below else "refuted" if above else "inconclusive"


def lr_exceeding(curve: np.ndarray, lrs, factor: float = 1.10) -> float:
    """The smallest learning rate above the best one whose loss exceeds the best loss by ``factor`` (NaN if
    none does): where the curve turns up."""
    curve = np.asarray(curve, dtype=np.float64)
    best = int(np.argmin(curve))
    for i in range(best + 1, len(curve)):
        if curve[i] > factor * curve[best]:
            return float(lrs[i])
    return float("nan")


def sensitivity_draws(res, size: str = "small") -> tuple[dict[str, tuple[float, np.ndarray]], list[str]]:
    """Per variant of an assembled grid result (``{size}_val_final``, ``{size}_val_init``, ``{size}_variants``)
    at ``size``: its LR sensitivity S and S's bootstrap draws over the seeds (the shared resamples), as
    {variant: (S, draws)}, and the variants in the result's order (legacy)."""
    eff = effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])   # (V, lrs, seeds)
    variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
    point, boot = sensitivities(eff, bootstrap_seed_indices(eff.shape[-1]))
    return {v: (float(point[i]), boot[i]) for i, v in enumerate(variants)}, variants


def mean_draws(d: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Point and bootstrap draws of the seed mean of per-seed values ``d`` (seeds last): lr_sweep's per-lr
    A − C, substitution's gap (legacy)."""
    d = np.asarray(d, dtype=np.float64)
    if idx is None:
        idx = bootstrap_seed_indices(d.shape[-1])
    return d.mean(axis=-1), d[..., idx].mean(axis=-1)


def half_gap(x: tuple[float, np.ndarray], a: tuple[float, np.ndarray], c: tuple[float, np.ndarray],
             y: tuple[float, np.ndarray] | None = None) -> tuple[float, np.ndarray]:
    """The legacy "closes at least half of the A − C gap" statistic (X − Y) − ½·(A − C) (Y defaults to C), as
    (point, draws), from the (point, draws) of each variant's sensitivity (`sensitivity_draws`,
    `sensitivities`): lr_sweep's H2 (and H3 with Y = C_qk), fix_training's closes_half, cures' K2. Below 0:
    X closes more than half of the gap. For per-lr losses over seeds use `half_gap_seeds`."""
    parts = [x, a, c] + ([] if y is None else [y])
    if not all(isinstance(p, tuple) and len(p) == 2 for p in parts):
        raise TypeError("half_gap: give each variant as a (point, draws) pair; per-seed arrays go to half_gap_seeds")
    (px, dx), (pa, da), (pc, dc) = x, a, c
    py, dy = (pc, dc) if y is None else y
    return px - py - 0.5 * (pa - pc), dx - dy - 0.5 * (da - dc)


def half_gap_seeds(x, a, c, y=None, idx: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """The legacy half-gap statistic on per-lr losses: ``x, a, c[, y]`` 1-D over the same seeds; the per-seed
    (X − Y) − ½·(A − C), its mean and its means under the resamples ``idx`` (substitution's `judge_row`)."""
    arrs = [np.asarray(v, dtype=np.float64) for v in ((x, a, c) if y is None else (x, a, c, y))]
    if any(v.ndim != 1 or v.shape != arrs[0].shape for v in arrs):
        raise ValueError(f"half_gap_seeds: need 1-D arrays over the same seeds (got {[v.shape for v in arrs]})")
    x, a, c = arrs[:3]
    y = arrs[3] if len(arrs) == 4 else c
    stat = (x - y) - 0.5 * (a - c)
    point, draws = mean_draws(stat, idx)
    return float(point), draws


def gap_word(verdict: str, has_gap: bool) -> str:
    """A half-gap verdict, or 'no gap to close' where the A − C gap itself is not established (legacy and
    paired rules alike: a gap that is not there cannot be closed)."""
    return verdict if has_gap else "no gap to close"


# == the paired rule ==============================================================================
ALPHA = 0.05  # on the Holm-adjusted two-sided p
T_CONFIDENCE = 0.95  # the Student t interval of the estimate
EXACT_MAX = 20  # sign-flip test: exact enumeration of the 2^n patterns up to this n
N_FLIPS = 2 ** 16  # random sign patterns beyond it
FLIP_SEED = 0
TESTS = ("sign-flip", "t")
PAIRED_RULE = (
    "Per hypothesis, d_s is the paired difference of seed s (same init and batches across variants): of final "
    "held-out losses at one learning rate, of LR sensitivities computed from each seed's own curve, or the "
    "half-gap statistic (X − Y) − ½(A − C) per seed; a diverged run counts as its loss at init. The call is "
    "made on the confirmatory seeds by the exact paired sign-flip permutation test of the mean (two-sided), "
    "Holm–Bonferroni-adjusted within the hypothesis' family: 'supported' when the adjusted p ≤ 0.05 and the "
    "mean difference lies on the hypothesised side of 0, 'refuted' when it lies on the other side, else "
    "'inconclusive' (with 3 seeds p ≥ 1/4: never supported). The estimate is the mean of d_s over all seeds "
    "with a 95 % Student t interval.")


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side must be 'above' or 'below' (got {side!r})")


def per_seed(x, name: str = "d") -> np.ndarray:
    """``x`` as a finite 1-D float array over seeds, or a ValueError that says what to do."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name}: need a non-empty 1-D array over seeds (got shape {a.shape})")
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"{name}: non-finite value at seed position(s) {bad.tolist()}. A diverged run counts as "
                         "its loss at init (pass losses through effective_loss); a missing run cannot be paired: "
                         "drop that seed from every variant, or run it")
    return a


def seed_sensitivity(loss_eff: np.ndarray) -> np.ndarray:
    """LR sensitivity of each seed's own curve: ``loss_eff`` (..., lrs, seeds) → (..., seeds).

    Unlike the legacy S (of the seed-mean curve) the per-seed values are independent across seeds, so their
    paired differences can be tested seed by seed. It is at least the legacy S in expectation (the minimum
    of one seed's curve is at most the minimum of the mean curve)."""
    x = np.asarray(loss_eff, dtype=np.float64)
    if x.ndim < 2:
        raise ValueError(f"seed_sensitivity: need (..., lrs, seeds) (got shape {x.shape})")
    return sensitivity(np.moveaxis(x, -1, -2))


def paired_difference(x, y, name: str = "x − y") -> np.ndarray:
    """x − y per seed, both 1-D over the same seeds in the same order, finite."""
    x, y = per_seed(x, f"{name} (x)"), per_seed(y, f"{name} (y)")
    if x.shape != y.shape:
        raise ValueError(f"{name}: x and y must be over the same seeds (got {x.size} and {y.size} values)")
    return x - y


def seed_half_gap(x, a, c, y=None) -> np.ndarray:
    """The half-gap statistic (X − Y) − ½·(A − C) per seed (Y defaults to C), from 1-D values over the same
    seeds (per-lr losses, or `seed_sensitivity` values); below 0: X − Y closes more than half of A − C."""
    named = {"x": x, "a": a, "c": c, **({} if y is None else {"y": y})}
    vals = {k: per_seed(v, f"seed_half_gap ({k})") for k, v in named.items()}
    if len({v.size for v in vals.values()}) != 1:
        raise ValueError(f"seed_half_gap: x, a, c{', y' if y is not None else ''} must be over the same seeds "
                         f"(got sizes {[v.size for v in vals.values()]})")
    return (vals["x"] - vals.get("y", vals["c"])) - 0.5 * (vals["a"] - vals["c"])


# -- the Student t distribution (scipy) ---------------------------------------------------------------
def _special():
    """scipy.special, imported on first use: `lpfail.sweep` (and so this module) is imported by the sweep drivers
    on the GPU machines, which have no scipy; only the statistics, run on a CPU, need it."""
    try:
        from scipy import special
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("lpfail.sweep.stats: the Student t distribution needs scipy (requirements.txt); "
                                  "the statistics run on a CPU machine") from e
    return special


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom: ``scipy.special.stdtrit(df, p)``, the function
    ``scipy.stats.t.ppf`` evaluates."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must lie in (0, 1) (got {p})")
    if not df > 0:
        raise ValueError(f"t_quantile: df must be positive (got {df})")
    return float(_special().stdtrit(df, p))


def t_sf(t, df):
    """P(T > t) for Student's t with ``df`` degrees of freedom: ``scipy.special.stdtr(df, -t)``, the function
    ``scipy.stats.t.sf`` evaluates (accurate in the upper tail, no 1 − cdf cancellation). Scalars or arrays."""
    out = _special().stdtr(df, -np.asarray(t, dtype=np.float64))
    return float(out) if np.ndim(out) == 0 else out


def t_interval(d, confidence: float = T_CONFIDENCE) -> tuple[float, float, float]:
    """(mean, lo, hi): the Student t interval of the mean of per-seed differences ``d`` (n ≥ 2)."""
    d = per_seed(d)
    if d.size < 2:
        raise ValueError("t_interval: need at least 2 seeds for an interval")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"t_interval: confidence must lie in (0, 1) (got {confidence})")
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    half = t_quantile(0.5 + confidence / 2.0, d.size - 1) * se
    return mean, mean - half, mean + half


def t_test_p(d) -> dict[str, float]:
    """The one-sample t test of mean 0 on per-seed differences: {"two-sided", "greater", "less"} p (the p values of
    ``scipy.stats.ttest_1samp``; here all three at once, and a zero standard deviation gives t = ±inf or 0
    instead of NaN)."""
    d = per_seed(d)
    if d.size < 2:
        raise ValueError("t_test_p: need at least 2 seeds")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    t = mean / (sd / math.sqrt(d.size)) if sd > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    tail = t_sf(abs(t), d.size - 1)  # P(T > |t|)
    upper = tail if t >= 0 else 1.0 - tail
    return {"two-sided": min(1.0, 2.0 * tail), "greater": upper, "less": 1.0 - upper if t >= 0 else tail}


def callable_ratio(n: int, m: int, alpha: float | None = None) -> float:
    """The smallest |mean| / sd of ``n`` fresh per-seed differences that the two-sided t test can call in a
    Holm family of ``m`` rows (at best: as the family's smallest p, which Holm multiplies by m): a row whose
    fresh seeds' mean gap is under this many standard deviations is never called, however real the gap.
    t_crit / √n with t_crit the (1 − α/(2m)) quantile of t with n − 1 degrees of freedom."""
    alpha = ALPHA if alpha is None else alpha
    if n < 2 or m < 1:
        raise ValueError(f"callable_ratio: need n ≥ 2 fresh seeds and m ≥ 1 rows (got n={n}, m={m})")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"callable_ratio: alpha must lie in (0, 1) (got {alpha})")
    return t_quantile(1.0 - alpha / (2.0 * m), n - 1) / math.sqrt(n)


# -- the exact paired sign-flip test ------------------------------------------------------------
def _signed_sums(flat: np.ndarray) -> np.ndarray:
    """(rows, n) → (patterns, rows): Σ ± d_s over every sign pattern when n ≤ EXACT_MAX (built by doubling,
    pattern 0 = all +: the observed sum, computed by the same arithmetic), else over the observed pattern
    and N_FLIPS random ones (fixed seed)."""
    n = flat.shape[-1]
    if n > EXACT_MAX:
        signs = 1.0 - 2.0 * np.random.default_rng(FLIP_SEED).integers(0, 2, size=(N_FLIPS, n))
        return np.concatenate([np.ones((1, n)), signs]) @ flat.T
    cols = np.ascontiguousarray(flat.T)
    sums = np.zeros((2 ** n, flat.shape[0]))
    w = 1
    for i in range(n):  # patterns [0, w) get +d_i, their copies [w, 2w) get −d_i
        np.subtract(sums[:w], cols[i], out=sums[w:2 * w])
        sums[:w] += cols[i]
        w *= 2
    return sums


def sign_flip_p(d) -> dict[str, float]:
    """The paired sign-flip permutation test of mean 0: {"two-sided", "greater", "less"} p, by exact
    enumeration of the 2^n sign patterns (n ≤ EXACT_MAX) or N_FLIPS random ones, p = (1 + k)/(1 + N).

    ``d`` is 1-D over seeds, or (..., seeds) for many tests at once (then each p is an array). Sums within
    a relative 1e-9 of the observed one count as ties (as extreme). Zero differences are allowed."""
    d = np.asarray(d, dtype=np.float64)
    if d.ndim == 1:
        d = per_seed(d)
    elif d.ndim == 0 or d.shape[-1] == 0 or not np.isfinite(d).all():
        raise ValueError(f"sign_flip_p: need finite (..., seeds) differences (got shape {d.shape})")
    n, lead = d.shape[-1], d.shape[:-1]
    flat = d.reshape(-1, n)
    exact = n <= EXACT_MAX
    n_patterns = 2 ** n if exact else N_FLIPS
    counts = np.zeros((3, flat.shape[0]))
    step = max(1, 2 ** 22 // n_patterns)  # rows per chunk: ≤ 4M sums in memory
    for i in range(0, flat.shape[0], step):
        sums = _signed_sums(flat[i:i + step])  # (patterns, chunk); row 0 is the observed sum
        obs, tol = sums[0], 1e-9 * np.abs(flat[i:i + step]).sum(axis=-1)
        sums = sums if exact else sums[1:]
        counts[0, i:i + step] = (np.abs(sums) >= np.abs(obs) - tol).sum(axis=0)
        counts[1, i:i + step] = (sums >= obs - tol).sum(axis=0)
        counts[2, i:i + step] = (sums <= obs + tol).sum(axis=0)
    p = counts / n_patterns if exact else (1 + counts) / (1 + n_patterns)
    p = np.minimum(p, 1.0).reshape(3, *lead)
    if not lead:
        return {"two-sided": float(p[0]), "greater": float(p[1]), "less": float(p[2])}
    return {"two-sided": p[0], "greater": p[1], "less": p[2]}


def p_floor(n: int, test: str = "sign-flip", alternative: str = "two-sided") -> float:
    """The smallest p the test can give with n seeds: 2/2^n two-sided, 1/2^n one-sided for the exact
    sign-flip test (1/4 and 1/8 at n = 3); 0 for the t test."""
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS} (got {test!r})")
    if test == "t":
        return 0.0
    if n > EXACT_MAX:
        return 1.0 / (1 + N_FLIPS)
    return (2.0 if alternative == "two-sided" else 1.0) / 2 ** n


# -- one hypothesis, a family, the placebo ---------------------------------------------------------
def _seed_sets(n: int, seeds, confirm) -> tuple[list[int], list[int], np.ndarray]:
    seeds = list(range(n)) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != n or len(set(seeds)) != n:
        raise ValueError(f"paired: seeds must name each of the {n} values once (got {seeds})")
    confirm = list(seeds) if confirm is None else [int(s) for s in confirm]
    unknown = sorted(set(confirm) - set(seeds))
    if unknown or not confirm or len(set(confirm)) != len(confirm):
        raise ValueError(f"paired: confirm must be distinct seeds among {seeds} (got {confirm}; unknown {unknown})")
    return seeds, confirm, np.isin(np.array(seeds), np.array(confirm))


def paired(d, seeds: Sequence[int] | None = None, confirm: Sequence[int] | None = None,
           confidence: float = T_CONFIDENCE, test: str = "sign-flip") -> dict:
    """One hypothesis from per-seed paired differences ``d`` (1-D, in the order of ``seeds``).

    The call's p values use the ``confirm`` seeds only (default: all); the estimate (mean) and its Student t
    interval use every seed. Returns a JSON-ready dict: ``estimate``, ``ci``, ``confidence``, ``sd``, ``n``,
    ``seeds`` (the estimate's), ``seeds_confirm``, ``n_confirm``, ``mean_confirm`` (its sign is the call's
    direction), ``test``, ``p`` (two-sided), ``p_greater``, ``p_less``, ``p_floor`` (the smallest two-sided
    p the test can give with ``n_confirm`` seeds) and ``per_seed``."""
    if test not in TESTS:
        raise ValueError(f"paired: test must be one of {TESTS} (got {test!r})")
    d = per_seed(d)
    seeds, confirm, mask = _seed_sets(d.size, seeds, confirm)
    mean, lo, hi = t_interval(d, confidence)
    dc = d[mask]
    if test == "t" and dc.size < 2:
        raise ValueError("paired: the t test needs at least 2 confirmatory seeds")
    p = sign_flip_p(dc) if test == "sign-flip" else t_test_p(dc)
    return {"estimate": mean, "ci": [lo, hi], "confidence": confidence, "interval": "Student t",
            "sd": float(d.std(ddof=1)), "n": int(d.size), "seeds": seeds, "seeds_confirm": confirm,
            "n_confirm": int(dc.size), "mean_confirm": float(dc.mean()), "test": test, "p": p["two-sided"],
            "p_greater": p["greater"], "p_less": p["less"], "p_floor": p_floor(dc.size, test),
            "per_seed": d.tolist()}


def holm(p) -> np.ndarray:
    """Holm–Bonferroni adjusted p values, in the input's order: the k-th smallest p times (m − k + 1),
    made monotone and capped at 1. A NaN (a hypothesis not measured) counts in m as p = 1 and stays NaN."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"holm: need a 1-D array of p values (got shape {p.shape})")
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"holm: p values must lie in [0, 1] (got {p.tolist()})")
    missing = np.isnan(p)
    filled = np.where(missing, 1.0, p)
    m = filled.size
    order = np.argsort(filled, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * filled[order]))
    out = np.empty(m)
    out[order] = adj
    out[missing] = np.nan
    return out


def call(p_adjusted: float, direction: float, side: str, alpha: float = ALPHA) -> str:
    """The paired rule's word: 'supported' / 'refuted' when the adjusted p ≤ α and the mean difference
    ``direction`` lies on / off the hypothesised ``side`` of 0, else 'inconclusive'."""
    _check_side(side)
    if not (p_adjusted <= alpha) or direction == 0:
        return "inconclusive"
    return "supported" if (direction > 0) == (side == "above") else "refuted"


def judge_family(rows: Mapping[str, dict | None], sides: Mapping[str, str], alpha: float = ALPHA) -> dict:
    """Judge one pre-registered family: ``rows`` {name: `paired` result, or None when not measured},
    ``sides`` {name: "above" | "below"}, the hypothesised side of 0 of each.

    Each row comes back with ``side``, ``p_adjusted`` (Holm over the whole family, unmeasured rows counted
    with p = 1), ``p_adjusted_floor`` (the smallest adjusted p the family's seed counts allow: when it is
    above α no row can be called, whatever the data — with the sign-flip test a family of m rows needs
    2^n ≥ 2m/α seeds: 3 rows at n = 7, 25 at n = 10) and ``verdict``."""
    if set(rows) != set(sides):
        raise ValueError(f"judge_family: rows and sides must name the same hypotheses "
                         f"(rows only: {sorted(set(rows) - set(sides))}, sides only: {sorted(set(sides) - set(rows))})")
    names = list(rows)
    p = np.array([np.nan if rows[k] is None else rows[k]["p"] for k in names])
    adj = holm(p)
    floors = [rows[k]["p_floor"] for k in names if rows[k] is not None]
    m, low = len(names), min(floors) if floors else 1.0
    out = {}
    for k, a in zip(names, adj):
        _check_side(sides[k])
        if rows[k] is None:
            out[k] = {"side": sides[k], "p": None, "p_adjusted": None, "verdict": "not measured (runs missing)"}
            continue
        r = rows[k]
        out[k] = {**r, "side": sides[k], "p_adjusted": float(a), "family_size": m,
                  "p_adjusted_floor": float(min(1.0, max(m * low, r["p_floor"]))),
                  "verdict": call(float(a), r["mean_confirm"], sides[k], alpha)}
    return out


def curve_tests(eff_x: np.ndarray, eff_y: np.ndarray, lrs, seeds=None, confirm=None,
                test: str = "sign-flip") -> dict[str, dict]:
    """X against Y on one grid: `paired` tests of S (per-seed sensitivity) and of the final loss at each
    learning rate. ``eff_*`` (lrs, seeds) effective losses; keys "S" and f"lr={lr:g}"."""
    eff_x, eff_y = (np.asarray(e, dtype=np.float64) for e in (eff_x, eff_y))
    if eff_x.shape != eff_y.shape or eff_x.ndim != 2 or eff_x.shape[0] != len(lrs):
        raise ValueError(f"curve_tests: eff_x and eff_y must both be (lrs={len(lrs)}, seeds) "
                         f"(got {eff_x.shape} and {eff_y.shape})")
    out = {"S": paired(paired_difference(seed_sensitivity(eff_x), seed_sensitivity(eff_y), "S"), seeds, confirm,
                       test=test)}
    for j, lr in enumerate(lrs):
        out[f"lr={float(lr):g}"] = paired(paired_difference(eff_x[j], eff_y[j], f"lr={float(lr):g}"), seeds,
                                          confirm, test=test)
    return out


def placebo(rows: Mapping[str, dict], family: Mapping[str, dict | None] | None = None,
            alpha: float = ALPHA) -> dict:
    """The call rate of a placebo (a variant that changes the arithmetic where it should not matter, e.g.
    FP32 attention with another tiling) under the same rule and family.

    ``rows``: the placebo's `paired` results (e.g. `curve_tests(placebo, twin, ...)`), each a null
    hypothesis; ``family``: the real family it shadows, whose rows share its Holm adjustment (default: the
    placebo's rows alone; the family's own verdicts come from `judge_family` without the placebo, so the
    placebo never changes them). Both sides count as a call. Returns the per-row raw and adjusted p and whether
    each was called, and ``rate_raw`` / ``rate_adjusted``: the share of placebo rows with p ≤ α before and
    after Holm (rows whose seed count cannot reach α are counted in ``unreachable``)."""
    family = dict(family or {})
    clash = sorted(set(rows) & set(family))
    if clash or not rows:
        raise ValueError(f"placebo: need placebo rows with names not in the family (clash: {clash})")
    p_family = [np.nan if r is None else r["p"] for r in family.values()]
    adj = holm([rows[k]["p"] for k in rows] + p_family)[:len(rows)]  # as if members of the family
    per = {k: {"p": rows[k]["p"], "p_adjusted": float(a), "estimate": rows[k]["estimate"], "ci": rows[k]["ci"],
               "called_raw": bool(rows[k]["p"] <= alpha), "called_adjusted": bool(a <= alpha)}
           for k, a in zip(rows, adj)}
    n = len(per)
    return {"rows": per, "n": n, "family_size": n + len(family), "alpha": alpha,
            "rate_raw": sum(r["called_raw"] for r in per.values()) / n,
            "rate_adjusted": sum(r["called_adjusted"] for r in per.values()) / n,
            "unreachable": sum(rows[k]["p_floor"] > alpha for k in rows)}


def binomial_upper(k: int, n: int, confidence: float = T_CONFIDENCE) -> float:
    """The exact (Clopper–Pearson) one-sided upper confidence bound of a rate from ``k`` events in ``n``
    independent trials: the rate p at which P(X ≤ k) = 1 − ``confidence`` (1 when k = n). For k = 0 it is
    1 − (1 − confidence)^(1/n)."""
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"binomial_upper: need 0 ≤ k ≤ n and n ≥ 1 (got k={k}, n={n})")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"binomial_upper: confidence must lie in (0, 1) (got {confidence})")
    if k == n:
        return 1.0
    return float(_special().betaincinv(k + 1, n - k, confidence))


# -- calibration: null data at the stored noise level (tests/test_stats_null.py, notes/statistics.md) --------
def seed_residuals(eff: np.ndarray) -> np.ndarray:
    """The seed noise of a grid: ``eff`` (variants, lrs, seeds) effective losses → each run's deviation from its
    (variant, lr) seed mean, scaled by √(n/(n − 1)) so that its variance is the seed variance (deviations from
    a mean of n are smaller by that factor). Each (variant, seed) row is one residual *curve*: a simulated run
    takes a whole curve, so the correlation across learning rates within a run is kept."""
    eff = np.asarray(eff, dtype=np.float64)
    if eff.ndim != 3 or eff.shape[-1] < 2 or not np.isfinite(eff).all():
        raise ValueError(f"seed_residuals: need finite (variants, lrs, seeds ≥ 2) losses (got shape {eff.shape})")
    n = eff.shape[-1]
    return (eff - eff.mean(axis=-1, keepdims=True)) * math.sqrt(n / (n - 1))


def null_draws(residuals: np.ndarray, bases: np.ndarray, n_seeds: int, n_sims: int, seed: int = 0) -> np.ndarray:
    """Simulated paired grids: (n_sims, roles, lrs, n_seeds) losses, role r's curve = ``bases[r]`` + a stored
    residual curve (`seed_residuals`). Each simulated seed takes one stored seed and ``roles`` distinct
    variants at it, so the roles share that seed's common deviation (the pairing) and are exchangeable: with
    equal bases, role 0 against role 1 is a null comparison at our noise level."""
    residuals, bases = np.asarray(residuals, dtype=np.float64), np.atleast_2d(np.asarray(bases, dtype=np.float64))
    n_var, n_lr, n_stored = residuals.shape
    roles = bases.shape[0]
    if bases.shape[1] != n_lr or roles > n_var:
        raise ValueError(f"null_draws: bases must be (roles ≤ {n_var}, lrs={n_lr}) (got {bases.shape})")
    rng = np.random.default_rng(seed)
    k = rng.integers(0, n_stored, size=(n_sims, n_seeds))
    v = np.argsort(rng.random((n_sims, n_seeds, n_var)), axis=-1)[..., :roles]  # distinct variants per seed
    r = residuals[v, :, k[..., None]]  # (sims, seeds, roles, lrs)
    return bases[None, :, :, None] + np.transpose(r, (0, 2, 3, 1))


def expected_sensitivity(residuals: np.ndarray, base: np.ndarray) -> float:
    """E[S(base + residual curve)] over the stored residual curves, exactly (each equally likely, as in
    `null_draws`): the true per-seed sensitivity of a simulated variant."""
    residuals = np.asarray(residuals, dtype=np.float64)
    curves = np.asarray(base, dtype=np.float64)[None, :, None] + residuals  # (variants, lrs, seeds)
    return float(seed_sensitivity(curves).mean())


def contrast(curves: np.ndarray, weights) -> np.ndarray:
    """Per-seed values Σ_r w_r · (role r's statistic) of simulated grids (n_sims, roles, lrs, seeds): statistic 0
    is the per-seed sensitivity S, statistic 1 + j the loss at learning rate j. → (n_sims, 1 + lrs, seeds).
    Weights (1, −1) give X − Y; (1, −½, −½) with roles (X, A, C) give the half-gap statistic."""
    w = np.asarray(weights, dtype=np.float64)
    s = np.tensordot(w, seed_sensitivity(curves), axes=([0], [1]))  # (sims, seeds)
    per_lr = np.tensordot(w, curves, axes=([0], [1]))  # (sims, lrs, seeds)
    return np.concatenate([s[:, None], per_lr], axis=1)


def paired_rates(values: np.ndarray, truth, n_confirm: int | None = None, alpha: float = ALPHA,
                 test: str = "sign-flip", confidence: float = T_CONFIDENCE) -> dict[str, np.ndarray]:
    """The paired rule on simulated per-seed values (n_sims, stats, seeds): per statistic, the share of
    simulations called (two-sided p ≤ α, on the last ``n_confirm`` seeds: the confirmatory ones) and the
    share whose t interval (on every seed) covers ``truth`` (scalar or (stats,))."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[-1]
    conf = values[..., n - (n_confirm or n):]
    if test == "sign-flip":
        called = sign_flip_p(conf)["two-sided"] <= alpha
    else:  # p ≤ α ⇔ |t| ≥ the (1 − α/2) quantile
        t = conf.mean(-1) / (conf.std(-1, ddof=1) / math.sqrt(conf.shape[-1]))
        called = np.abs(t) >= t_quantile(1.0 - alpha / 2.0, conf.shape[-1] - 1)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * values.std(-1, ddof=1) / math.sqrt(n)
    mean = values.mean(-1)
    truth = np.asarray(truth, dtype=np.float64)
    return {"call": called.mean(0), "cover": ((mean - half <= truth) & (truth <= mean + half)).mean(0)}


def _resample_means(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """x[..., idx].mean(-1) by one matrix product (the resamples' seed counts): same numbers to rounding."""
    n = x.shape[-1]
    w = (idx[:, :, None] == np.arange(n)).sum(axis=1) / idx.shape[1]  # (resamples, seeds)
    return x @ w.T


def legacy_rates(curves: np.ndarray, weights, truth, confidence: float = CONFIDENCE,
                 chunk: int = 50) -> dict[str, np.ndarray]:
    """The legacy bootstrap rule on simulated grids (n_sims, roles, lrs, seeds), statistics as in `contrast`: S of
    each role's seed-mean curve under the shared resamples (`sensitivities`), per-lr seed means
    (`mean_draws`); per statistic, the share called (percentile interval excludes 0) and the share covering
    ``truth``."""
    curves, w = np.asarray(curves, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    idx = bootstrap_seed_indices(curves.shape[-1])
    a = (1 - confidence) / 2
    called, covered, truth = [], [], np.asarray(truth, dtype=np.float64)
    for i in range(0, curves.shape[0], chunk):
        x = curves[i:i + chunk]
        s = np.tensordot(w, sensitivity(np.moveaxis(_resample_means(x, idx), -2, -1)), axes=([0], [1]))
        per_lr = _resample_means(np.tensordot(w, x, axes=([0], [1])), idx)  # (chunk, lrs, resamples)
        lo, hi = np.quantile(np.concatenate([s[:, None], per_lr], axis=1), [a, 1 - a], axis=-1)
        called.append((lo > 0) | (hi < 0))
        covered.append((lo <= truth) & (truth <= hi))
    return {"call": np.concatenate(called).mean(0), "cover": np.concatenate(covered).mean(0)}


def binomial_interval(k: int, n: int, confidence: float = T_CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided interval of a rate from ``k`` events in ``n`` independent trials:
    the beta quantiles at (1 − confidence)/2 and (1 + confidence)/2 (0 at k = 0, 1 at k = n)."""
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"binomial_interval: need 0 ≤ k ≤ n and n ≥ 1 (got k={k}, n={n})")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"binomial_interval: confidence must lie in (0, 1) (got {confidence})")
    a = (1.0 - confidence) / 2
    lo = 0.0 if k == 0 else float(_special().betaincinv(k, n - k + 1, a))
    hi = 1.0 if k == n else float(_special().betaincinv(k + 1, n - k, 1.0 - a))
    return lo, hi
