"""Calibration and power of a pre-registered family, simulated through the calls that judge it.

A family of the paired rule is judged by `stats.paired` on each row's per-seed differences — the call on the
confirmatory seeds, the estimate on every seed — and `stats.judge_family` (Holm within the family, unmeasured
rows counted with p = 1). A `Family` holds one family's design as it was judged (its rows, their hypothesised
sides and stored per-seed values, the seeds of the estimate and of the call, the test, α, the unmeasured rows);
`lpfail.experiments.confirmation_power.families` builds them from the confirmation grid's stored analysis.

* `simulate` draws per-seed values from a noise model, adds a true gap per row and judges every draw with the
  *same* calls (`judge`). It measures the family-wise false-call rate (any row called, either way, when every
  true gap is 0), each row's call rate, the coverage of each row's 95 % interval, and the share of draws in which
  a row is called on its side (under a gap: its power). ``rule="legacy"`` runs the legacy seed-bootstrap rule
  through the same harness (`stats.mean_draws`, `stats.interval`, `stats.judge` per row, on every seed, no Holm):
  the negative control.
* `critical_gaps` finds, per draw, the smallest true gap at which a row is called on its side (the other rows
  null), by bisection through `judge`; their 80 % quantile is the simulated detectable gap.
* `detectable_sd` is that gap for the t test under normal noise without simulation: the row's t on k fresh
  seeds is noncentral t(k − 1, δ√k), and Holm's first step calls it when t ≥ t_{1 − α/(2m), k − 1}. Holm calls
  more only when another row is called too, so this δ bounds the simulated one from above, by little
  (tests/test_power.py).

**Noise models** (`noise_draws`):

* ``"normal"`` — each row independent normal with the standard deviation of its stored per-seed values. The
  t test is exact there, so this measures the design itself (the seed counts, the confirm/estimate split,
  Holm), and it is the model `detectable_sd` solves. It needs only each row's standard deviation: every size.
* ``"runs"`` — null grids rebuilt from the stored runs (`Runs`; `stats.null_draws`, the model of
  tests/test_stats_null.py): each run's deviation from its (variant, learning rate) seed mean, a whole curve; a
  simulated seed takes one stored seed and *distinct* variants at it for the roles the family needs, each role's
  curve a common base curve plus its residual curve. The roles share that seed's common deviation (the pairing)
  and are exchangeable (the null); the rows are computed from the curves by the analysis' own formulas
  (``Runs.row_values``). This keeps the shape of a run's noise, its correlation across learning rates and between
  rows. Only with at least `MIN_RUN_SEEDS` stored seeds: from five seeds and two variants a simulated
  difference takes one of ten values, two fresh seeds repeat one with probability 1/10, and their standard
  deviation 0 gives an infinite t — an artefact of the model, not a property of the runs.

Resampling the stored per-seed *differences* themselves (ten values with random signs) is not offered: that
noise is bounded, and on short tails the t test at Holm's levels calls too often (7 seeds at α/6: 0.015 on a
uniform distribution, 0.0083 on a normal) — a property of the model, which ``"runs"`` avoids by differencing many
runs.

CPU only: scipy is imported on first use; `lpfail.sweep` does not import this module.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lpfail.sweep import stats

POWER = 0.80  # the detectable gap is the gap called on its side with this probability
UPPER = 0.95  # the one-sided upper confidence bound
MIN_RUN_SEEDS = 10  # stored seeds the "runs" noise model needs
NOISE = ("normal", "runs")
RULES = ("paired", "legacy")
CALLED = ("supported", "refuted")


@dataclass(frozen=True)
class Family:
    """One family as it was judged: its measured rows (names, hypothesised sides, per-seed values (rows, seeds) in
    the order of ``seeds``), the seeds of the estimate and of the call, the test, α, and the rows not measured
    (counted by Holm with p = 1). ``size`` and ``name`` label it."""

    size: str
    name: str
    rows: tuple[str, ...]
    sides: tuple[str, ...]
    values: np.ndarray
    seeds: tuple[int, ...]
    confirm: tuple[int, ...]
    test: str
    alpha: float
    missing: tuple[str, ...] = ()

    @property
    def m(self) -> int:
        """The family's size, as Holm counts it."""
        return len(self.rows) + len(self.missing)

    @property
    def sd(self) -> np.ndarray:
        """Each row's standard deviation over all its stored seeds."""
        return self.values.std(axis=1, ddof=1)


def family_from_rows(size: str, name: str, rows: Mapping[str, Mapping | None], alpha: float) -> Family:
    """A `Family` from judged rows {name: a `stats.judge_family` row (``per_seed``, ``seeds``, ``seeds_confirm``,
    ``test``, ``side``), or None when not measured}; every measured row must share seeds and test."""
    measured = {k: r for k, r in rows.items() if r is not None}
    if not measured:
        raise ValueError(f"family {name} at {size}: no measured row")
    first = next(iter(measured))
    design = lambda r: (tuple(r["seeds"]), tuple(r["seeds_confirm"]), r["test"])  # noqa: E731
    for k, r in measured.items():
        if design(r) != design(measured[first]):
            raise ValueError(f"family {name} at {size}: row {k} has other seeds or another test than row {first}")
    seeds, confirm, test = design(measured[first])
    return Family(size, name, tuple(measured), tuple(r["side"] for r in measured.values()),
                  np.array([r["per_seed"] for r in measured.values()], dtype=np.float64), seeds, confirm, test,
                  float(alpha), tuple(k for k, r in rows.items() if r is None))


# -- the calls -----------------------------------------------------------------------------------------------
def judge(fam: Family, values: np.ndarray, rule: str = "paired", idx: np.ndarray | None = None) -> dict[str, dict]:
    """Judge per-seed values (rows, seeds) of ``fam`` as the analysis does: per row `stats.paired` (the call on
    ``fam.confirm``, the estimate on ``fam.seeds``, ``fam.test``), then `stats.judge_family` with the family's
    sides, its unmeasured rows as None and its α. ``rule="legacy"``: per row the seed-bootstrap rule on every
    seed (`stats.mean_draws` over the resamples ``idx``, default `stats.bootstrap_seed_indices`;
    `stats.interval`; `stats.judge`), no Holm. Each row comes back with its ``verdict`` and ``ci``."""
    if rule == "paired":
        rows = {k: stats.paired(v, fam.seeds, fam.confirm, test=fam.test) for k, v in zip(fam.rows, values)}
        rows.update(dict.fromkeys(fam.missing))
        sides = {**dict(zip(fam.rows, fam.sides)), **dict.fromkeys(fam.missing, "above")}
        out = stats.judge_family(rows, sides, fam.alpha)
        return {k: out[k] for k in fam.rows}
    if rule == "legacy":
        if idx is None:
            idx = stats.bootstrap_seed_indices(len(fam.seeds))
        _point, draws = stats.mean_draws(values, idx)
        out = {}
        for k, side, d in zip(fam.rows, fam.sides, draws):
            lo, hi = stats.interval(d)
            out[k] = {"verdict": stats.judge(lo, hi, side), "ci": [lo, hi]}
        return out
    raise ValueError(f"judge: rule must be one of {RULES} (got {rule!r})")


# -- noise -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Runs:
    """The stored runs of one size, for the ``"runs"`` noise model: every variant's residual curves (variants,
    lrs, seeds; `stats.seed_residuals`), the base curve every role gets, the learning rates, and the analysis'
    formulas: ``roles(fam)``, the variants a family's rows need, and ``row_values(fam, eff, lrs)``, its rows'
    per-seed values (rows, seeds) from effective losses {variant: (lrs, seeds)}."""

    size: str
    residuals: np.ndarray
    base: np.ndarray
    lrs: tuple[float, ...]
    roles: Callable[[Family], tuple[str, ...]]
    row_values: Callable[[Family, Mapping[str, np.ndarray], Sequence[float]], np.ndarray]


def noise_draws(fam: Family, noise: str, n_sims: int, rng: np.random.Generator, runs: Runs | None = None) -> np.ndarray:
    """(n_sims, rows, seeds) null per-seed values for ``fam`` (`NOISE`; the module's docstring says what each model
    keeps and why). ``runs``: the `Runs` of the family's size, for the ``"runs"`` model."""
    rows, n = fam.values.shape
    if noise == "normal":
        return rng.standard_normal((n_sims, rows, n)) * fam.sd[None, :, None]
    if noise == "runs":
        if runs is None or runs.size != fam.size:
            raise ValueError(f"noise_draws: the runs model needs the stored runs of {fam.size}")
        if runs.residuals.shape[-1] < MIN_RUN_SEEDS:
            raise ValueError(f"noise_draws: the runs model needs at least {MIN_RUN_SEEDS} stored seeds ({fam.size} "
                             f"has {runs.residuals.shape[-1]}); use the normal model")
        names = runs.roles(fam)
        curves = stats.null_draws(runs.residuals, np.tile(runs.base, (len(names), 1)), n, n_sims,
                                  seed=int(rng.integers(2 ** 31)))
        return np.stack([runs.row_values(fam, dict(zip(names, c)), runs.lrs) for c in curves])
    raise ValueError(f"noise_draws: noise must be one of {NOISE} (got {noise!r})")


def _toward(fam: Family, gap) -> np.ndarray:
    """Per-row true gaps toward each row's hypothesised side: ``gap`` ≥ 0 (scalar or (rows,)), signed."""
    sign = np.array([1.0 if s == "above" else -1.0 for s in fam.sides])
    return sign * np.broadcast_to(np.asarray(gap, dtype=np.float64), sign.shape)


# -- the simulation through the calls ---------------------------------------------------------------------------
def simulate(fam: Family, noise: str = "normal", n_sims: int = 2000, seed: int = 0, rule: str = "paired",
             gap=0.0, runs: Runs | None = None) -> dict:
    """``n_sims`` draws of ``fam`` with true gaps ``gap`` (nats, scalar or per row, toward each row's hypothesised
    side; 0: the null) and the given noise (``runs`` for the ``"runs"`` model), each judged by `judge` (``rule``).

    Returns ``family_rate`` (the share of draws with any row called, either way: under the null, the family-wise
    false-call rate) and per row ``call`` (called either way), ``on_side`` (called on its hypothesised side:
    under a gap, the power) and ``cover`` (its 95 % interval covers the true gap), with ``n_sims``, ``noise``,
    ``rule``, ``family``, ``size`` and ``rows``."""
    rng = np.random.default_rng(seed)
    truth = _toward(fam, gap)
    draws = noise_draws(fam, noise, n_sims, rng, runs) + truth[None, :, None]
    idx = stats.bootstrap_seed_indices(len(fam.seeds)) if rule == "legacy" else None
    call, side, cover = (np.zeros((n_sims, len(fam.rows)), bool) for _ in range(3))
    for i in range(n_sims):
        out = judge(fam, draws[i], rule, idx)
        for j, k in enumerate(fam.rows):
            lo, hi = out[k]["ci"]
            call[i, j] = out[k]["verdict"] in CALLED
            side[i, j] = out[k]["verdict"] == "supported"
            cover[i, j] = lo <= truth[j] <= hi
    return {"family": fam.name, "size": fam.size, "rows": list(fam.rows), "noise": noise, "rule": rule,
            "n_sims": n_sims, "family_rate": float(call.any(axis=1).mean()), "call": call.mean(0).tolist(),
            "on_side": side.mean(0).tolist(), "cover": cover.mean(0).tolist()}


def critical_gaps(fam: Family, row: int, noise: str = "normal", n_sims: int = 500, seed: int = 0,
                  rel: float = 1e-3, runs: Runs | None = None) -> np.ndarray:
    """Per draw of the null, the smallest true gap (in the row's standard deviations, toward its side) at which
    row ``row`` is called on its side, the other rows null: by bisection to ``rel``, each step judged by `judge`
    (a larger gap lowers the row's p, and Holm's adjusted p rises with it, so the call is monotone in the gap).
    inf where the test cannot call the row (the sign-flip test below its floor) or past 10⁹ deviations."""
    draws = noise_draws(fam, noise, n_sims, np.random.default_rng(seed), runs)
    if fam.test == "sign-flip" and stats.p_floor(len(fam.confirm)) * fam.m > fam.alpha:
        return np.full(n_sims, np.inf)
    step = np.zeros(len(fam.rows))
    step[row] = fam.sd[row] * (1.0 if fam.sides[row] == "above" else -1.0)
    called = lambda x, g: judge(fam, x + g * step[:, None])[fam.rows[row]]["verdict"] == "supported"  # noqa: E731
    out = np.empty(n_sims)
    for i, x in enumerate(draws):
        if called(x, 0.0):
            out[i] = 0.0
            continue
        lo, hi = 0.0, 1.0
        while hi <= 1e9 and not called(x, hi):
            lo, hi = hi, 2.0 * hi
        while hi <= 1e9 and hi - lo > rel * hi:
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if called(x, mid) else (mid, hi)
        out[i] = hi if hi <= 1e9 else np.inf
    return out


def simulated_detectable_sd(fam: Family, row: int = 0, noise: str = "normal", n_sims: int = 500, seed: int = 0,
                            power: float = POWER, runs: Runs | None = None) -> float:
    """The ``power`` quantile of `critical_gaps`: the true gap (the row's standard deviations) at which row ``row``
    is called on its side with that probability, simulated through the calls."""
    return float(np.quantile(critical_gaps(fam, row, noise, n_sims, seed, runs=runs), power, method="higher"))


# -- power without simulation ------------------------------------------------------------------------------------
def detectable_sd(k: int, m: int, alpha: float = stats.ALPHA, power: float = POWER, test: str = "t") -> float:
    """The smallest true mean gap, in seed standard deviations, at which one row of a Holm family of ``m`` rows,
    called on ``k`` fresh seeds by the two-sided paired test ``test``, is called on its hypothesised side with
    probability ``power`` (normal seed noise, the other rows null).

    t test: its t is noncentral t(k − 1, δ√k), and Holm's first step calls it when t ≥ t_{1 − α/(2m), k − 1}
    (``scipy.stats.nct``, solved for δ by ``scipy.optimize.brentq``); Holm calls more only when another row is
    called too, so this bounds the simulated gap (`simulated_detectable_sd`) from above. inf with fewer than 2
    fresh seeds. Sign-flip test: inf where its floor times m exceeds α (no data can be called); otherwise
    simulated on m standard normal rows (1,000 draws, fixed seed)."""
    if not (m >= 1 and 0.0 < alpha < 1.0 and 0.0 < power < 1.0):
        raise ValueError(f"detectable_sd: need m ≥ 1 and α, power in (0, 1) (got m={m}, α={alpha}, power={power})")
    if test == "sign-flip":
        if k < 1 or stats.p_floor(k) * m > alpha:
            return math.inf
        z = np.random.default_rng(0).standard_normal((m, k))
        fam = Family("-", "standard normal", tuple(f"r{i}" for i in range(m)), ("above",) * m,
                     z / z.std(axis=1, ddof=1, keepdims=True), tuple(range(k)), tuple(range(k)), test, alpha)
        return simulated_detectable_sd(fam, 0, "normal", 1000, 0, power)
    if test != "t":
        raise ValueError(f"detectable_sd: test must be one of {stats.TESTS} (got {test!r})")
    if k < 2:
        return math.inf
    from scipy import optimize
    from scipy import stats as sps

    crit = stats.t_quantile(1.0 - alpha / (2.0 * m), k - 1)
    f = lambda d: float(sps.nct.sf(crit, k - 1, d * math.sqrt(k))) - power  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12))


def upper_bound(d: Sequence[float], level: float = UPPER) -> float:
    """The one-sided ``level`` upper confidence bound of the mean of per-seed values ``d`` (Student t):
    mean + t_{level, n − 1} · sd/√n."""
    d = stats.per_seed(d)
    if d.size < 2:
        raise ValueError("upper_bound: need at least 2 seeds")
    return float(d.mean() + stats.t_quantile(level, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
