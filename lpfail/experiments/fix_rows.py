"""What the fix does to rows whose maximum is tied and large: row suppression (B) and 0/0 (B′).

The paper's fix (Algorithm 3, `lpfail.precision.DynamicMax`) shifts a row whose positive maximum m is attained
more than once by β·m instead of m, so that no P̄ = exp(S − β·m) equals 1. The tied keys then get
P̄ = exp(−(β − 1)·m), and the row sum ℓ is about n_ties·exp(−(β − 1)·m) — tiny once m is large:

* The official fixed code (preset PAPER_BF16_OFFICIAL_FIX, "B") floors each key block's row sum at
  ``l_clamp = 1e-10``. With β = 2 and n_ties tied keys, ℓ falls under the floor at m ≈ ln(n_ties / 1e-10)
  (23.7 for two ties); from there on O = Ō / 1e-10 instead of Ō / ℓ, so the output norm is multiplied by
  ℓ / 1e-10 ≈ n_ties·exp(−m)·1e10 and the row is suppressed toward 0 (half its norm at m ≈ 24.4).
* Our fix without the floor (PAPER_BF16.with_fix(), "B′") divides by the true ℓ and is accurate until the
  numbers leave the BF16 range. P̄ = exp(S − 2m) is formed in FP32, rounded to BF16 for P̄V, and ℓ (summed in
  FP32 from the unrounded P̄) is stored in BF16. For two ties: below e^−87.3 = 2^−126 the BF16 P̄ and ℓ are
  subnormal and lose significant bits, so O = Ō/ℓ degrades (m ≳ 88); once e^−m < 2^−134 (m > 92.9) the BF16
  P̄ is 0, Ō = 0 and O = 0; once 2·e^−m < 2^−134 (m > 93.6) the BF16 ℓ is 0 as well and O = 0/0 = NaN. Beyond
  m ≈ 104 even the FP32 exp underflows. (CPU numbers with subnormals; a device that flushes subnormals to
  zero reaches these points earlier, at e^−m ≈ 2^−126.)

PAPER_BF16 ("A", no fix) and FA2_BF16 ("D", no fix) are the controls: without the fix the tied keys give
P̄ = 1 and ℓ ≥ 1, so nothing under- or overflows at any m.

The rows (`make_rows`): `n_keys` = 512 keys (one of the paper's 512-wide key tiles), `n_ties` = 2 of them
(random positions) tied at the swept maximum m, the others a background N(0, bg_std²) clipped to at most
m − bg_gap (so exactly the tied keys hold the maximum, also under the fix's ε = 1e-3 tie test); V is N(0, 1)
rounded to BF16, head dim 64. The background, V and the tie positions are drawn once (from `seed`) and reused
at every m — common random numbers, so that only m changes along the sweep. Scores are BF16 values (every m of
the grid must be one). The truth is float64 softmax attention on the same BF16 values.

The `fix_rows` experiment sweeps m from 1 to 120 in steps of 0.5 plus a few points up to 200 and measures, per
policy and m, over `n_rows` rows: ‖O‖ / ‖O_exact‖, ‖O − O_exact‖ / ‖O_exact‖ (both over finite rows only),
the fractions of rows with a non-finite (and NaN) output, the final row sum ℓ and the maximum m the forward
used. `thresholds` reads the thresholds off a result: the smallest m where B's mean norm ratio drops below
0.5, the smallest m where B′ gives any non-finite output, and the smallest m where B′ is off by more than 10 %.
"""
from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass

import numpy as np
import torch

from lpfail import attention as attn
from lpfail.bf16 import round_bf16
from lpfail.precision import Precision
from lpfail.results import experiment

#: The policies of the experiment: tag → preset string (`Precision.parse`). The tags are used in result keys.
DEFAULT_POLICIES = (("A", "PAPER_BF16"), ("B", "PAPER_BF16_OFFICIAL_FIX"), ("Bp", "PAPER_BF16+fix"),
                    ("D", "FA2_BF16"))

#: Per policy tag T and m: T_ratio_{mean,min,max}, T_relerr_{mean,min,max} (over the rows whose output is
#: finite; NaN where none is), T_nonfinite_frac, T_nan_frac, T_l_{mean,min,max} (the forward's final ℓ, as
#: float64) and T_m_used_mean (the maximum the forward subtracted, β·m when the fix fired).
STATS = ("ratio_mean", "ratio_min", "ratio_max", "relerr_mean", "relerr_min", "relerr_max", "nonfinite_frac",
         "nan_frac", "l_mean", "l_min", "l_max", "m_used_mean")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_bf16(x: np.ndarray) -> np.ndarray:
    """Elementwise: is this float64 value exactly a BF16 value?"""
    return torch.from_numpy(x).to(torch.bfloat16).double().numpy() == x


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class FixRowsConfig:
    n_rows: int = 64             # rows per m (different backgrounds and V)
    n_keys: int = 512            # keys per row: one 512-wide key tile of the paper's code
    head_dim: int = 64
    n_ties: int = 2              # keys tied at the maximum m
    bg_std: float = 1.0          # background scores ~ N(0, bg_std²) ...
    bg_gap: float = 1.0          # ... clipped to at most m − bg_gap
    m_start: float = 1.0         # the grid: m_start, m_start + m_step, …, m_stop, then m_extra
    m_stop: float = 120.0
    m_step: float = 0.5
    m_extra: tuple = (125.0, 130.0, 140.0, 150.0, 160.0, 175.0, 200.0)
    seed: int = 0
    policies: tuple = DEFAULT_POLICIES

    def __post_init__(self):
        for name, low in (("n_rows", 1), ("n_keys", 2), ("head_dim", 1), ("n_ties", 2)):
            value = getattr(self, name)
            if not (_is_int(value) and value >= low):
                raise ValueError(f"FixRowsConfig.{name} must be an int >= {low} (got {value!r})")
        if self.n_ties > self.n_keys:
            raise ValueError(f"FixRowsConfig.n_ties must be <= n_keys (got {self.n_ties!r} > {self.n_keys!r})")
        if not (_is_num(self.bg_std) and self.bg_std >= 0):
            raise ValueError(f"FixRowsConfig.bg_std must be a finite number >= 0 (got {self.bg_std!r})")
        if not (_is_num(self.bg_gap) and self.bg_gap >= 0.01):
            raise ValueError(f"FixRowsConfig.bg_gap must be a finite number >= 0.01 (got {self.bg_gap!r}): the "
                             "background must stay below the tied maximum by more than the fix's ε")
        if not (_is_num(self.m_step) and self.m_step > 0):
            raise ValueError(f"FixRowsConfig.m_step must be a finite number > 0 (got {self.m_step!r})")
        if not (_is_num(self.m_start) and self.m_start > 0):
            raise ValueError(f"FixRowsConfig.m_start must be a finite number > 0 (got {self.m_start!r})")
        if not (_is_num(self.m_stop) and self.m_stop >= self.m_start):
            raise ValueError(f"FixRowsConfig.m_stop must be a finite number >= m_start (got {self.m_stop!r})")
        if not (isinstance(self.m_extra, tuple) and all(_is_num(x) and x > 0 for x in self.m_extra)):
            raise ValueError(f"FixRowsConfig.m_extra must be a tuple of finite numbers > 0 (got {self.m_extra!r})")
        if not (_is_int(self.seed) and self.seed >= 0):
            raise ValueError(f"FixRowsConfig.seed must be an int >= 0 (got {self.seed!r})")
        grid = m_grid(self)
        if len(grid) > 5000:
            raise ValueError(f"FixRowsConfig.m_step gives {len(grid)} grid points (at most 5000)")
        not_bf16 = grid[~_is_bf16(grid)]
        if not_bf16.size:
            raise ValueError(f"FixRowsConfig.m_start/m_step/m_stop/m_extra: every m must be a BF16 value, as the "
                             f"scores are (not: {not_bf16[:5].tolist()})")
        _check_policies(self.policies)


def _check_policies(policies) -> dict[str, Precision]:
    if not (isinstance(policies, tuple) and policies):
        raise ValueError(f"FixRowsConfig.policies must be a non-empty tuple of (tag, preset) pairs (got {policies!r})")
    out: dict[str, Precision] = {}
    for item in policies:
        if not (isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise ValueError(f"FixRowsConfig.policies: each entry must be a (tag, preset) pair of strings "
                             f"(got {item!r})")
        tag, text = item
        if not tag.isidentifier() or tag in out:
            raise ValueError(f"FixRowsConfig.policies: tag {tag!r} must be a unique identifier")
        try:
            out[tag] = Precision.parse(text)
        except ValueError as e:
            raise ValueError(f"FixRowsConfig.policies: {tag}={text!r} is not a policy ({e})") from None
    return out


def m_grid(cfg: FixRowsConfig) -> np.ndarray:
    """The swept maxima: m_start … m_stop in steps of m_step, then the m_extra points above m_stop (sorted)."""
    n = int(math.floor((cfg.m_stop - cfg.m_start) / cfg.m_step + 1e-9)) + 1
    base = cfg.m_start + cfg.m_step * np.arange(n, dtype=np.float64)
    extra = np.asarray([x for x in cfg.m_extra if x > base[-1]], dtype=np.float64)
    return np.unique(np.concatenate([base, extra]))


def base_rows(cfg: FixRowsConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The m-independent part of the rows: background (n_rows, n_keys) ~ N(0, bg_std²) in float32, V
    (n_rows, n_keys, head_dim) ~ N(0, 1) as BF16 values in float32, and the tie mask (n_rows, n_keys)."""
    g = torch.Generator().manual_seed(cfg.seed)
    bg = cfg.bg_std * torch.randn(cfg.n_rows, cfg.n_keys, generator=g)
    tie_idx = torch.argsort(torch.rand(cfg.n_rows, cfg.n_keys, generator=g), dim=1)[:, : cfg.n_ties]
    ties = torch.zeros(cfg.n_rows, cfg.n_keys, dtype=torch.bool).scatter_(1, tie_idx, True)
    v = round_bf16(torch.randn(cfg.n_rows, cfg.n_keys, cfg.head_dim, generator=g)).float()
    return bg, v, ties


def make_rows(bg: torch.Tensor, ties: torch.Tensor, m: float, bg_gap: float = 1.0) -> torch.Tensor:
    """Scores (rows, 1, n_keys) as BF16 values in float32: `m` at the tied keys, the background clipped to at
    most m − bg_gap elsewhere. `m` must be a BF16 value (so the tied keys keep exactly m)."""
    if not _is_bf16(np.asarray([m], dtype=np.float64))[0]:
        raise ValueError(f"m must be a BF16 value (got {m!r})")
    s = round_bf16(torch.minimum(bg, torch.tensor(m - bg_gap, dtype=bg.dtype))).float()
    s = torch.where(ties, torch.tensor(float(m)), s)
    return s[:, None, :]


def exact_output(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float64 softmax attention of the given scores (rows, 1, Tk) and V (rows, Tk, D): (rows, D)."""
    return (torch.softmax(s.double(), dim=-1) @ v.double())[:, 0]


def row_measures(s: torch.Tensor, v: torch.Tensor, policy: Precision,
                 o_exact: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """Per row: ‖O‖/‖O_exact‖ ("ratio") and ‖O − O_exact‖/‖O_exact‖ ("relerr"), NaN where O is not finite;
    "nonfinite" and "nan" (bool), the forward's final row sum "l" and maximum "m" (float64)."""
    if o_exact is None:
        o_exact = exact_output(s, v)
    res = attn.forward_from_scores(s, v, policy)
    o = res.o.double()[:, 0]                                        # (rows, D)
    finite = torch.isfinite(o).all(dim=-1)
    norm_exact = o_exact.norm(dim=-1)
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    ratio = torch.where(finite, o.norm(dim=-1) / norm_exact, nan)
    relerr = torch.where(finite, (o - o_exact).norm(dim=-1) / norm_exact, nan)
    return {"ratio": ratio.numpy(), "relerr": relerr.numpy(), "nonfinite": (~finite).numpy(),
            "nan": torch.isnan(o).any(dim=-1).numpy(), "l": res.l.double().reshape(-1).numpy(),
            "m": res.m.double().reshape(-1).numpy()}


def _summary(meas: dict[str, np.ndarray]) -> dict[str, float]:
    out = {"nonfinite_frac": float(meas["nonfinite"].mean()), "nan_frac": float(meas["nan"].mean()),
           "l_mean": float(meas["l"].mean()), "l_min": float(meas["l"].min()), "l_max": float(meas["l"].max()),
           "m_used_mean": float(meas["m"].mean())}
    for key in ("ratio", "relerr"):
        x = meas[key][np.isfinite(meas[key])]
        for stat, fn in (("mean", np.mean), ("min", np.min), ("max", np.max)):
            out[f"{key}_{stat}"] = float(fn(x)) if x.size else float("nan")
    return out


def thresholds(result, suppress_tag: str = "B", nan_tag: str = "Bp", tol: float = 0.1) -> dict[str, float]:
    """From a `fix_rows` result (the experiment's dict or a stored `Result`), the smallest m of its grid where

    * "b_suppress_m": policy `suppress_tag`'s mean output-norm ratio ‖O‖/‖O_exact‖ is below 0.5;
    * "bp_nonfinite_m": policy `nan_tag` gives a non-finite output in any row;
    * "bp_inaccurate_m": policy `nan_tag` is non-finite or off by more than `tol` (relative error) in any row.

    NaN where the grid has no such m."""
    m = np.asarray(result["m_values"], dtype=np.float64)

    def first(hit: np.ndarray) -> float:
        idx = np.flatnonzero(hit)
        return float(m[idx[0]]) if idx.size else float("nan")

    ratio = np.asarray(result[f"{suppress_tag}_ratio_mean"], dtype=np.float64)
    nonfinite = np.asarray(result[f"{nan_tag}_nonfinite_frac"], dtype=np.float64) > 0
    relerr = np.asarray(result[f"{nan_tag}_relerr_max"], dtype=np.float64)
    return {"b_suppress_m": first(ratio < 0.5), "bp_nonfinite_m": first(nonfinite),
            "bp_inaccurate_m": first(nonfinite | (relerr > tol))}


def headline(result) -> dict[str, str]:
    """What chapter 1's lab page states from a `fix_rows` result, as it prints it: where B's output is halved
    (``b_suppress_m``), where B′ turns non-finite (``bp_nonfinite_m``), both with ``:g``, and where the clamp
    takes over in theory (``b_clamp_m_theory``, ``.1f``).

    ``bp_inaccurate_m`` is left out on purpose: the book does not print it, and it depends on the machine. Where
    oneDNN may use native BF16 instructions (``ONEDNN_MAX_CPU_ISA=ALL`` on a CPU with AVX512_BF16 or AMX) the P̄V
    product flushes subnormal results to zero, so B′ is off by more than 10 % from m = 86.5 instead of 90.5 under
    the pinned AVX2 path (`lpfail.numerics`)."""
    th = thresholds(result)
    return {"b_suppress_m": f"{th['b_suppress_m']:g}", "bp_nonfinite_m": f"{th['bp_nonfinite_m']:g}",
            "b_clamp_m_theory": f"{float(result['b_clamp_m_theory']):.1f}"}


def check(cfg: FixRowsConfig) -> FixRowsConfig:
    """The two-settings check's config: a quarter of the rows and every other m (the same code path; the full
    config's thresholds are checked against the stored ones by tests/test_cpu_invariance.py)."""
    return dataclasses.replace(cfg, n_rows=16, m_step=1.0)


@experiment("fix_rows", config=FixRowsConfig, gpu=False, headline=headline, check=check,
            description="rows with a tied maximum m: B's row suppression (clamp) and B′'s 0/0 NaN vs m (CPU)")
def fix_rows_experiment(cfg: FixRowsConfig) -> dict:
    """Sweep the tied maximum m and measure every policy against float64 attention.

    Keys: ``m_values``; ``{tag}_{stat}`` for every policy tag and stat in STATS (arrays over m);
    ``policy_{tag}`` (the policy's string); ``b_suppress_m``, ``bp_nonfinite_m`` and ``bp_inaccurate_m`` (see
    `thresholds`, when the policies include tags B and Bp);
    ``b_clamp_m_theory`` = ln(n_ties / l_clamp) and ``b_half_m_theory`` = ln(2·n_ties / l_clamp), where B's ℓ
    (≈ n_ties·e^−m, the background neglected) meets the clamp and where the clamp halves the output."""
    from tqdm.auto import tqdm

    policies = _check_policies(cfg.policies)
    grid = m_grid(cfg)
    bg, v, ties = base_rows(cfg)
    stats = {tag: {stat: np.empty(len(grid)) for stat in STATS} for tag in policies}
    for i, m in enumerate(tqdm(grid, desc="fix_rows", leave=False)):
        s = make_rows(bg, ties, float(m), cfg.bg_gap)
        o_exact = exact_output(s, v)
        for tag, policy in policies.items():
            for stat, value in _summary(row_measures(s, v, policy, o_exact)).items():
                stats[tag][stat][i] = value
    out: dict = {"m_values": grid}
    for tag, policy in policies.items():
        out[f"policy_{tag}"] = str(policy)
        for stat in STATS:
            out[f"{tag}_{stat}"] = stats[tag][stat]
    if "B" in policies and "Bp" in policies:
        out.update(thresholds(out))
    clamp = policies["B"].l_clamp if "B" in policies else None
    if clamp is not None and policies["B"].fix is not None:
        beta = policies["B"].fix.beta
        out["b_clamp_m_theory"] = math.log(cfg.n_ties / clamp) / (beta - 1)
        out["b_half_m_theory"] = math.log(2 * cfg.n_ties / clamp) / (beta - 1)
    return out
