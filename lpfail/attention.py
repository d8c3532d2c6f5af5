"""The reference attention: FlashAttention-2 written out in plain PyTorch, with every cast point explicit.

This is the oracle of the project. Its forward is FlashAttention-2's Algorithm 1 (tiled, online softmax),
its backward FlashAttention-2's Algorithm 2 (P recomputed from the log-sum-exp L = m + log ℓ), and with
``policy.fix = DynamicMax(β, ε)`` the forward is the paper's Algorithm 3 (explained in chapter 5, Fix).
A `Precision` policy (lpfail.precision) names the dtype of every intermediate; each cast is one line,
marked ``# cast:``, right before the value is used. The Triton kernels (``kernels``) are checked against
it, the model uses it to emulate the paper's failing code, and the Rounding chapter (chapter 4, Rounding)
drives the very same tile loop on synthetic rows through `forward_from_scores`.

Public surface::

    attention(q, k, v, policy=FA2_BF16, causal=True, scale=None, check_finite=True, sr_key=None,
              attn_mask=None) -> o                                        (backward: Algorithm 2)
    naive_attention(q, k, v, causal=True, scale=None, check_finite=True, attn_mask=None) -> o  float64 truth
    flash_forward(q, k, v, policy, causal=True, scale=None, sr_key=None, attn_mask=None) -> ForwardResult
    flash_backward(q, k, v, o, lse, do, policy, causal=True, scale=None, attn_mask=None) -> (dq, dk, dv)
    forward_from_scores(s, v, policy, mask=None, sr_key=None) -> ForwardResult   rows of given scores
    ForwardResult(o, o_unnorm, m, l, lse, fix_pos, fix_neg)

Shapes: q (B, H, Tq, D), k and v (B, H, Tk, D). Causal masking is bottom-right aligned as in
FlashAttention-2 (query i sees keys j ≤ i + Tk − Tq), so causal needs Tq ≤ Tk (else a ValueError: the first
Tq − Tk queries would see no key at all). Any lengths: the last tile of each axis may be partial.

Masks: ``attn_mask`` is SDPA's, broadcastable to (B, H, Tq, Tk): bool (True = allowed), or float, added to the
scores (−∞ entries masked). With ``causal`` as well, both apply. A row that the mask leaves without any allowed
key (a padding query) gives O = 0, L = +∞ and zero gradients, as SDPA does. Without a mask not one operation
of the paths below changes.

Conventions
-----------
* ``op`` below is the dtype an elementwise operation on its operands computes in: FP32 when they are 16- or
  32-bit, FP64 when one is FP64 (PyTorch's "opmath"). An elementwise op on BF16 tensors therefore computes
  in FP32 and rounds once to the dtype the policy names, exactly what the official code's eager BF16 ops do.
* A matmul whose operands and result share one dtype runs as that dtype's native matmul (for BF16: FP32
  accumulation, one rounding at the end, the kernel autocast calls); otherwise its operands are upcast
  (exactly) to the wider of their dtypes (at least FP32), multiplied there, and the result rounded to the
  dtype the policy names. On CUDA, FP32 matmuls must not run in TF32 (checked).
* Formats: a cast to a policy's format is `_cast` (``.to(dtype)`` for bf16, fp16, fp32, fp64) or, on the output
  path, `_round`. A K-bit format of the precision dial ("bf16m1" … "bf16m6": bf16's exponent, K fraction bits;
  `lpfail.precision.DIAL`) is held in BF16 tensors and rounded to by `lpfail.bf16.round_mantissa` (exact, to
  nearest even); a matmul whose result has a K-bit format is formed in FP32 and rounded once. An operand in a
  K-bit format enters a matmul as the BF16 tensor that holds it (exactly).
* The forward's numbers for a row depend only on the key tiling (``block_k``): query rows are independent, so
  all query tiles of a key tile are processed at once. ``block_q`` matters in the backward, where dK and dV
  are accumulated tile by tile over the query tiles (in ``grad_acc``).
* Key tiles that are fully masked for a row are skipped for it (they would add exact zeros), unless
  ``policy.masked_ties`` asks for the official code's masking (see below).

Forward, per key tile j (Algorithm 1, with Algorithm 3 when ``policy.fix`` is set), for all query rows::

    QKᵀ  = matmul(Q, K_jᵀ)                          operands `matmul`, result rounded to `qk_out`
    S    = QKᵀ · α                                  computed in op, rounded to `scores`
    S    = S + M                                     a float attn_mask M: in op, rounded to `scores`
                                                     masked entries (causal, bool mask, M = −∞) → −∞
    r_m  = rowmax(S)                                 exact (in `scores`)
    fix: t = r_m − ε (op, rounded to `scores`);  r_s = #{unmasked S ≥ t}
         m' = β·r_m (op, rounded to `scores`) if r_s > 1 and r_m > 0;  0 if r_s > 1 and r_m < 0;  else r_m
         BoundedMax (the robust fix): that m', its shift folded into [shift_min, shift_max] (`_bounded_max`)
    m_new = max(m_old, m' rounded to `m_acc`)        in `m_acc` (default `acc`)
    x    = S − m_new  (op, rounded to `exp_in`)     sub="sub"; sub="fma": x = QKᵀ·α − m_new in one
                                                     rounding, emulated in float64 (see below)
    P̄    = exp(x)  in `exp`
    ℓ_j  = rowsum(P̄) in `exp`                       then .clamp(min=l_clamp) if l_clamp is set
    P̄V   = matmul(P̄ rounded to `pbar`, V_j)         V in `v` (default `matmul`, rounded from the input
                                                     once); result rounded to `pv_out`
    a    = exp(m_old − m_new)                        m_old, m_new first rounded to `m_rescale` (default
                                                     `m_acc`); difference in op rounded to `exp_in`, exp in `exp`
    ℓ    = a·ℓ + ℓ_j                                 two ops in op, rounded to `acc`
    Ō    = Ō·a        (op, rounded to `o_acc`)       the rescale and the add are two roundings,
    Ō    = Ō + P̄V     (op, rounded to `o_acc`)       like the official `o.mul_(a).add_(P̄V)`; `o_acc`
                                                     is `acc` unless set
  after the last tile:
    O    = Ō / ℓ      (op, rounded to `out`)         ℓ first rounded to `l_div` (default `acc`); in the
                                                     last query tile (`block_q`) to `l_div_last` if set
    L    = log(ℓ) + m   in `exp`                     ℓ and m first rounded to `l_store` (default `acc`)

  m_acc (default `acc`) is the dtype of the running maximum m alone: r_m and m_new are rounded to it.
  masked_carry (default None: nothing extra), only with masked_ties: in the update of a key tile that is fully
  masked for a row, that row's m_old and m_new are rounded to it before a, its ℓ_old before a·ℓ + ℓ_j, and its
  Ō·a after the product (to nearest even) — the compiled official fixed code computes that update, where the
  fix's m' = 0 can move the maximum, from its BF16 row buffers (PAPER_BF16_COMPILED_OFFICIAL_FIX).
  o_acc, l_div, l_store, m_acc, m_rescale and l_div_last exist for PAPER_BF16_COMPILED: the official code under
  torch.compile keeps S, m, ℓ and Ō in FP32 registers across tiles while the row maxima that the rescale
  factors read and its stored ℓ and m (what L reads) are BF16 buffers, and it divides by the FP32 or the
  stored BF16 ℓ depending on where inductor's kernel boundaries fall: on the H200 (torch 2.11) the last
  query tile by the BF16 ℓ, earlier tiles by the FP32 one (`lpfail.experiments.official_check`,
  notes/official_check.md).

  ``policy.rounding = "sr"``: the four casts of the output path — P̄V to `pv_out`, Ō·a and Ō + P̄V to `o_acc`
  (default `acc`), O to `out` — round stochastically where their format is 16-bit or K-bit (`_round`,
  `lpfail.bf16.round_stochastic`, unbiased). Their random bits are counter-based (`lpfail.sr_stream`): a pure
  function of the call's `RoundingKey` (the run's seed, the training step, the micro-batch, layer and head
  group, passed by the model), the cast point and key tile (sites (0, j) for P̄V of key tile j, (1, j) for Ō·a,
  (2, j) for Ō·a + P̄V, (3,) for O) and each element's index, so they are the same on CPU and CUDA and in a
  captured CUDA graph. A call without a key draws the key's seed from torch's default CPU generator. P̄V is then
  formed in FP32 (operands upcast exactly) and rounded once, instead of the native 16-bit matmul. m, ℓ, V and
  every other cast keep round-to-nearest-even; the backward is unchanged (δ reads the stored O).

Backward (Algorithm 2), per key tile j, for all query rows at once::

    δ    = rowsum(dO ∘ O)                            "dO.O": products rounded to `delta_prod` (widened to
                                                     the operands' dtype), summed in op.  "dO.O_hp": O
                                                     recomputed as Σ_j P_j·V_j in FP32 (FP64 when `exp` or
                                                     `acc` is FP64) from L, for δ only.  "dP.P":
                                                     δ = Σ_j rowsum(dP_j ∘ P_j), a first pass over the tiles.
                                                     "dO.O_res": δ = rowsum(dO ∘ (O + R)) in FP32, R the
                                                     forward's stored residual O_hp − O rounded to `out`.
    S    as in the forward (same `qk_out`, `scores`, the same S + M)
    P    = exp(S − L)    difference in op rounded to `exp`, exp in `exp`  (sub="fma": one fused rounding)
    dV_j += matmul(P rounded to `pbar`, dO)ᵀ         per query tile: rounded to `grad_acc`, then added
    dP   = matmul(dO, V_jᵀ)                          dO in `matmul`, V in `v`; rounded to `dp`
    dS   = (P·α)·(dP − δ)                            in op
    dQ  += matmul(dS rounded to `ds`, K_j)           rounded to `grad_acc`, then added in `grad_acc`
    dK_j += matmul(dS rounded to `ds`, Q)ᵀ           per query tile, like dV_j
    ds_rowsum: e = rowsum(dS rounded − dS) / n (per row, this tile's n allowed keys), and in op
               dQ part −= e·Σ_allowed K_j  (before its rounding to `grad_acc`), dK_j −= (e·allowed)ᵀ Q after
  gradients are returned in the inputs' dtype.

PAPER_BF16: the official code's order of operations
----------------------------------------------------
The paper's official attention (github.com/ucker/why-low-precision-training-fails, ``attention.py``) is a
pure-PyTorch port of FlashAttention-2 with 512×512 tiles, run under ``torch.autocast(dtype=bfloat16)`` in
both passes on BF16 q, k, v. Under CUDA autocast the einsums (→ bmm) take BF16 operands, accumulate in FP32
and return BF16; ``exp``, ``log`` and ``sum`` run in FP32; every other elementwise op follows PyTorch's type
promotion and computes in FP32 before rounding to its result dtype. PAPER_BF16 reproduces that, in order:

Forward, per (query tile, key tile):

1. ``QKᵀ`` BF16 (rounded once from FP32 accumulation)                              qk_out=bf16
2. ``S = QKᵀ·α``: FP32 product of the BF16 value and α (rounded to FP32), rounded to BF16      scores=bf16
   (causal entries are filled with −max(BF16); they never matter without the fix)
3. ``r_m = rowmax(S)`` BF16; ``m_new = max(m_old, r_m)`` BF16; ``m`` starts at −max(BF16)           acc=bf16
4. ``S − m_new``: BF16 − BF16, rounded to BF16                                       exp_in=bf16
5. ``P̄ = exp(·)`` in FP32                                                                exp=fp32
6. ``ℓ_j = rowsum(P̄)`` in FP32, clamped at 1e-10 (a no-op here: ℓ ≥ 1 without the fix)
7. ``P̄V``: P̄ rounded to BF16, FP32 accumulation, rounded to BF16                 pbar=bf16, pv_out=bf16
8. ``a = exp(m_old − m_new)``: BF16 difference, exp in FP32
9. ``ℓ = a·ℓ + ℓ_j`` in FP32 (two roundings), stored as BF16
10. ``O.mul_(a)``: FP32 product rounded to BF16; ``.add_(P̄V)``: FP32 sum rounded to BF16
11. after the last key tile ``O = O / ℓ``: FP32 quotient of the BF16 values, rounded to BF16       out=bf16
12. ``L = log(ℓ) + m``: log in FP32 of the BF16 ℓ, plus the BF16 m, in FP32

Backward, per (query tile, key tile), with dO in BF16:

1. ``S`` recomputed exactly as in the forward (steps 1–2), causal entries −∞
2. ``P = exp(S − L)``: BF16 − FP32 in FP32, exp in FP32 (no BF16 rounding of the difference here)
3. ``dV_j += Pᵀ dO``: P rounded to BF16, product rounded to BF16, added into a BF16 dV    grad_acc=bf16
4. ``dP = dO Vᵀ`` BF16                                                                        dp=bf16
5. ``δ = rowsum(dO ∘ O)``: each product dO·O rounded to BF16, the row sum in FP32   delta_prod=bf16
6. ``dS = (P·α)·(dP − δ)`` in FP32
7. ``dQ += dS K``, ``dK_j += dSᵀ Q``: dS rounded to BF16, products rounded to BF16, added into BF16  ds=bf16

Two facts about the official code that only matter with its fix (preset PAPER_BF16_OFFICIAL_FIX): its row-sum
clamp is per key block (step 6), and it visits key tiles that are fully masked for a row, whose masked
scores (−max(BF16)) then count as tied maxima with r_m < 0, so the fix sets m' = 0 there
(``masked_ties=True``). PAPER_BF16 with ``.with_fix()`` is our fix: no clamp, masked entries never tie.

Checked with a script that is not part of the repository: on one H200 (torch 2.11, official code under CUDA
autocast in both passes) and on CPU (torch 2.13, with CUDA autocast's rules for einsum, exp, log and sum
emulated), causal, BF16 inputs, 2 × 4 heads, T ∈ {512, 1024}, D ∈ {64, 128}, q scaled by 1 and 4:
PAPER_BF16 against the official code and PAPER_BF16_OFFICIAL_FIX against it with STABLE=1 agree in 100% of
the elements of O, dQ, dK and dV; flipping any one of the BF16 knobs above to FP32 breaks the agreement.
CPU autocast itself has other rules (exp, log and sum stay BF16 there), so the official code run under
``torch.autocast("cpu")`` computes something else than the paper's GPU runs.

The fused subtraction (``sub="fma"``)
------------------------------------
Production kernels form ``exp(QKᵀ·α − m)`` with one fused multiply-add on the FP32 product, so the row's
maximum maps to a small nonzero residual instead of exactly 0. We emulate the FMA by computing QKᵀ·α − m in
float64 (the FP32×FP32 product is exact there) and rounding once to `exp_in`. The float64 subtraction can
itself round when the exponents of QKᵀ·α and m are far apart, so in rare cases this double rounding differs
from a hardware FMA by one FP32 ulp. With FP64 operands the step is simply computed unfused in float64.
A float attn_mask M joins the fused step: QKᵀ·α + M − m is formed in float64 and rounded once.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, NamedTuple

import torch

from lpfail.bf16 import round_stochastic
from lpfail.precision import (
    FA2_BF16,
    FORMATS,
    FP32,
    FP64,
    PAPER_BF16,
    PAPER_BF16_OFFICIAL_FIX,
    SAFE_SHIFT,
    BoundedMax,
    DynamicMax,
    Format,
    Precision,
)
from lpfail.sr_stream import RoundingKey

__all__ = [
    "Precision", "DynamicMax", "PAPER_BF16", "FA2_BF16", "FP32", "FP64", "PAPER_BF16_OFFICIAL_FIX",
    "attention", "naive_attention", "flash_forward", "flash_backward", "forward_from_scores",
    "ForwardResult", "NonFiniteInputError", "output_residual", "paper_forward_tile_loop",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class NonFiniteInputError(ValueError):
    """q, k or v holds inf or NaN (raised by the public entry points; the model opts out with
    ``check_finite=False`` so that NaN reaches its loss, where the training loop records it)."""


class ForwardResult(NamedTuple):
    """Everything the tiled forward computes, for one call.

    o         (…, Tq, D)  normalized output O = Ō / ℓ, in the policy's `out` dtype
    o_unnorm  (…, Tq, D)  the final accumulator Ō before the division by ℓ, in `acc`
    m         (…, Tq, 1)  the final running maximum, in `acc` (with the fix: the dynamic maximum)
    l         (…, Tq, 1)  the final row sum ℓ, in `acc`
    lse       (…, Tq, 1)  L = log ℓ + m, in `exp` (what the backward recomputes P from)
    fix_pos   (…, Tq)     int32: in how many key tiles the fix's positive branch (m' = β·r_m) fired
    fix_neg   (…, Tq)     int32: in how many key tiles its negative branch (m' = 0) fired
    """

    o: torch.Tensor
    o_unnorm: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor
    lse: torch.Tensor
    fix_pos: torch.Tensor
    fix_neg: torch.Tensor


# ---------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------
def _op(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype an elementwise op on these dtypes computes in (PyTorch's opmath): FP64 if any is FP64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _wider(*dtypes: torch.dtype) -> torch.dtype:
    """The widest of some float dtypes (BF16 and FP16 count as equally narrow; BF16 wins the tie)."""
    rank = {torch.float16: 0, torch.bfloat16: 0, torch.float32: 1, torch.float64: 2}
    best = max(dtypes, key=lambda d: (rank[d], d == torch.bfloat16))
    return best


_NATIVE = {f.dtype: f for f in FORMATS.values() if f.native}

#: Sites of the output path's stochastic roundings (words of their `RoundingKey`): P̄V, Ō·a and Ō·a + P̄V of key
#: tile j are (site, j); O is (_SITE_OUT,).
_SITE_PV, _SITE_SCALE, _SITE_ADD, _SITE_OUT = 0, 1, 2, 3


def _cast(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """x rounded to the format of a cast point, to nearest even, in the format's storage dtype: ``x.to(dtype)``
    for bf16, fp16, fp32, fp64, `lpfail.bf16.round_mantissa` for the K-bit formats (`Format.round`). Every cast
    to a policy's format goes through here (or through `_round` on the output path)."""
    return fmt.round(x)


def _stochastic(fmt: Format, policy: Precision | None) -> bool:
    """Whether a cast to `fmt` rounds stochastically: policy.rounding == "sr" and a 16-bit or K-bit `fmt`."""
    return policy is not None and policy.rounding == "sr" and fmt.narrow


def _at(key: RoundingKey | None, *words: int) -> RoundingKey | None:
    return None if key is None else key.at(*words)


def _round(x: torch.Tensor, fmt: Format, policy: Precision | None, key: RoundingKey | None = None) -> torch.Tensor:
    """x (in op, FP32 or FP64) rounded to `fmt`: to nearest even (`_cast`), or stochastically (unbiased,
    `lpfail.bf16.round_stochastic` with the counter-based bits of `key`) under policy.rounding == "sr" when
    `fmt` is 16-bit or K-bit. Used by the output path's casts only: P̄V, Ō·a, Ō·a + P̄V and O."""
    if not _stochastic(fmt, policy):
        return _cast(x, fmt)
    if key is None:
        raise ValueError("a stochastic rounding needs its RoundingKey (lpfail.sr_stream)")
    return round_stochastic(x, fmt.dtype, mantissa=None if fmt.native else fmt.mantissa, key=key)


def _matmul(a: torch.Tensor, b: torch.Tensor, out: Format, policy: Precision | None = None,
            key: RoundingKey | None = None) -> torch.Tensor:
    """a @ b with a, b already in their operand dtypes, the result in `out` (see the module docstring).
    With `policy` given, the result is rounded to `out` by `_round` (stochastic rounding under "sr", with `key`).
    A K-bit `out` is formed in FP32 (operands upcast exactly) and rounded once, like a stochastic one."""
    if out.native and a.dtype == b.dtype == out.dtype and not _stochastic(out, policy):
        return a @ b  # native: for BF16 operands FP32 accumulation and one rounding, as under autocast
    compute = _wider(a.dtype, b.dtype, torch.float32)
    if compute == torch.float32 and a.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        raise RuntimeError("lpfail.attention needs true FP32 matmuls, but TF32 is allowed "
                           "(torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision): turn it off")
    return _round(a.to(compute) @ b.to(compute), out, policy, key)  # cast: product to `out` (P̄V: `pv_out`)


def _prod_format(fmt: Format, *dtypes: torch.dtype) -> Format:
    """The format an elementwise product of operands of `dtypes` is rounded to when a policy names `fmt` for it:
    `fmt`, widened to the operands' dtype when they are wider (`_wider` for the native formats; a K-bit `fmt`
    stays unless an operand is FP32 or FP64)."""
    if fmt.native:
        return _NATIVE[_wider(fmt.dtype, *dtypes)]
    wide = [d for d in dtypes if d in (torch.float32, torch.float64)]
    return _NATIVE[_wider(*wide)] if wide else fmt


def _product(a: torch.Tensor, b: torch.Tensor, fmt: Format) -> torch.Tensor:
    """a ∘ b rounded once to `fmt` (operands of 16 bits or more multiply exactly in op): for a native format the
    product in that dtype (PyTorch computes it in op and rounds once), else `_cast` of the product in op."""
    if fmt.native:
        return a.to(fmt.dtype) * b.to(fmt.dtype)
    op = _op(a.dtype, b.dtype)
    return _cast(a.to(op) * b.to(op), fmt)


def _sr_key(policy: Precision, key: RoundingKey | None) -> RoundingKey | None:
    """The key of an attention call's stochastic roundings: `key` as given; None for an "rne" policy; for an "sr"
    policy called without one, a key with a seed drawn from torch's default CPU generator (so torch.manual_seed
    fixes it; the model always passes its own, `lpfail.sr_stream.SRStream`)."""
    if policy.rounding != "sr":
        return None
    if key is None:
        return RoundingKey(int(torch.randint(0, 1 << 62, (), dtype=torch.int64)))
    if not isinstance(key, RoundingKey):
        raise TypeError(f"sr_key must be a lpfail.sr_stream.RoundingKey or None (got {type(key).__name__})")
    return key


def _tiles(n: int, block: int | None) -> list[tuple[int, int]]:
    """[(start, end), …] covering range(n) in tiles of `block` (None: one tile); the last may be partial."""
    step = n if block is None else block
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def _no_autocast(t: torch.Tensor):
    """Autocast would silently change our casts: switch it off inside the reference."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.autocast(device_type=t.device.type, enabled=False)
    return contextlib.nullcontext()


class _Masking:
    """Which (query, key) pairs are allowed, tile by tile, where a key tile's first live row is, and what an
    additive mask adds to the scores.

    `causal_offset` = Tk − Tq for bottom-right causal masking (query i sees keys j ≤ i + offset), or None.
    `mask` is a bool mask (…, Tq, Tk), True = allowed, broadcastable; with a causal offset both apply.
    `bias` is an additive mask (…, Tq, Tk) added to the scores (an ``attn_mask`` of floats), or None.
    `user_mask`: an ``attn_mask`` was given to `attention` (rows it leaves without a key get O = 0)."""

    def __init__(self, tq: int, tk: int, causal_offset: int | None, mask: torch.Tensor | None,
                 device: torch.device, skip_rows: bool, bias: torch.Tensor | None = None, user_mask: bool = False):
        self.tq, self.tk, self.offset, self.mask, self.device = tq, tk, causal_offset, mask, device
        self.skip_rows, self.bias = skip_rows, bias
        self.user_mask = user_mask

    def first_row(self, k0: int) -> int:
        """First query row that sees any key of the tile starting at k0 (rows above it are fully masked)."""
        if self.offset is None or not self.skip_rows:
            return 0
        return min(max(0, k0 - self.offset), self.tq)

    def allowed(self, r0: int, k0: int, k1: int) -> torch.Tensor | None:
        """Bool (…, Tq − r0, k1 − k0) for rows r0: and keys k0:k1, or None when everything is allowed."""
        causal = None
        if self.offset is not None and k1 - 1 > r0 + self.offset:
            rows = torch.arange(r0, self.tq, device=self.device)[:, None]  # (Tq − r0, 1)
            cols = torch.arange(k0, k1, device=self.device)[None, :]       # (1, bk)
            causal = cols <= rows + self.offset
        if self.mask is None:
            return causal
        m = self.mask[..., r0:, k0:k1]
        return m if causal is None else m & causal

    def added(self, s: torch.Tensor, r0: int, k0: int, k1: int, scores_f: Format) -> torch.Tensor:
        """The scores s (…, R, bk) in `scores` plus the additive mask's entries for rows r0: and keys k0:k1."""
        if self.bias is None:
            return s
        b = self.bias[..., r0:, k0:k1]
        op = _op(scores_f.dtype, b.dtype)
        return _cast(s.to(op) + b.to(op), scores_f)                 # cast: S + M to `scores`

    def fused_bias(self, r0: int, k0: int, k1: int) -> torch.Tensor | None:
        """The additive mask's entries for rows r0: and keys k0:k1 (for the fused step, sub="fma"), or None."""
        return None if self.bias is None else self.bias[..., r0:, k0:k1]


def _mask_parts(attn_mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor, check_finite: bool = True):
    """(allowed, bias) from an SDPA-style ``attn_mask``, both broadcast to (B, H, Tq, Tk) (views, no copy):
    a bool mask allows its True entries (bias None); a float mask is added to the scores and allows the
    entries that are not −∞. (None, None) without a mask. Raises for a mask of another type or shape, one
    that requires grad (the reference gives the mask no gradient), or (`check_finite`) one holding NaN or +∞."""
    if attn_mask is None:
        return None, None
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be None or a torch.Tensor (got {type(attn_mask).__name__})")
    shape = (*q.shape[:2], q.shape[-2], k.shape[-2])
    try:
        m = torch.broadcast_to(attn_mask, shape)
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (batch, heads, "
                         f"seq_q, seq_k) = {shape}") from None
    if m.device != q.device:
        raise ValueError(f"attn_mask is on {m.device}, q on {q.device}")
    if m.dtype == torch.bool:
        return m, None
    if m.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"attn_mask must be bool (True = allowed) or floating point (added to the scores); got "
                         f"{m.dtype}")
    if attn_mask.requires_grad:
        raise ValueError("attn_mask requires grad, but the reference attention gives the mask no gradient")
    if check_finite and bool((torch.isnan(m) | torch.isposinf(m)).any()):
        raise NonFiniteInputError("attn_mask contains NaN or +inf (masked entries are -inf)")
    return ~torch.isneginf(m), m


# ---------------------------------------------------------------------------------------------------
# the forward: Algorithm 1 (+ Algorithm 3), shared by attention and forward_from_scores
# ---------------------------------------------------------------------------------------------------
# A score source gives, for rows r0: and keys k0:k1, the scores S in `scores` and (for sub="fma") the raw
# product QKᵀ in `qk_out` together with the scale α it is to be multiplied by.
ScoreSource = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor | None]]


def exp_scores(s: torch.Tensor, m: torch.Tensor, policy: Precision) -> torch.Tensor:
    """P̄ = exp(S − m) as the forward forms it with sub="sub", before the cast to `pbar`: S (in `scores`) minus
    m (in `m_acc`, default `acc`) computed in op and rounded to `exp_in`, then exp in `exp`. Also used by chapter 4 (Rounding)
    to rebuild the forward's P̄ for a row."""
    scores_f, m_f, exp_in = policy.format("scores"), policy.format("m_acc"), policy.format("exp_in")
    op = _op(scores_f.dtype, m_f.dtype, exp_in.dtype)
    x = _cast(_cast(s, scores_f).to(op) - _cast(m, m_f).to(op), exp_in)  # cast: S − m to `exp_in`
    return torch.exp(_cast(x, policy.format("exp")))               # cast: exp runs in `exp`


def _bounded_max(m_alg3: torch.Tensor, r_m: torch.Tensor, r_s: torch.Tensor, fix: BoundedMax,
                 scores_f: Format, acc: Format):
    """The robust fix's m' (`lpfail.precision.BoundedMax`, whose docstring gives the rule) from Algorithm 3's
    m'₃ (in `scores`), the block maximum r_m and the tie count r_s. Computed in FP32 (FP64 for FP64 policies),
    in the same order as `lpfail.kernels.fwd._dynamic_max`. Returns (m' in `acc`, pos, neg): m' is r_m where the rule
    leaves no shift; pos / neg mark the rows shifted with r_m > 0 / r_m ≤ 0 (the fix's counters)."""
    op = _op(scores_f.dtype, acc.dtype)
    lo, hi, half = float(fix.shift_min), float(fix.shift_max), float(fix.shift_max) / 2
    r = r_m.to(op)
    x = m_alg3.to(op) - r                                          # Algorithm 3's shift (≥ 0)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))     # r_m = ±inf: no tie anyway
    folded = half + ((x - half) - half * torch.floor((x - half) * (1.0 / half)))  # in [H/2, H)
    delta = torch.where(x < lo, x + lo, folded)
    moved = _cast(r + delta, scores_f)                             # cast: r_m + shift to `scores`
    keep3 = (x >= lo) & (x <= hi)
    m_b = _cast(torch.where(keep3, m_alg3, moved), acc)            # cast: m' to `acc`
    shift = m_b.to(op) - r
    use = (r_s > 1) & torch.isfinite(r) & (shift > 0) & (shift <= SAFE_SHIFT)
    m_blk = torch.where(use, m_b, _cast(r_m, acc))
    return m_blk, use & (r_m > 0), use & (r_m <= 0)


def _tiled_forward(scores_of: ScoreSource, v: torch.Tensor, policy: Precision, masking: _Masking,
                   alpha: float, key: RoundingKey | None = None) -> ForwardResult:
    """Algorithm 1 of FlashAttention-2 over the key tiles, from the scores on. v (…, Tk, D) in `v` (default
    `matmul`). The running state (m, ℓ, Ō and the fix's counters) starts in `_RunningState`; each key tile is one
    `_forward_tile`; `_normalise` divides and forms L. `key`: the stochastic roundings' (None under "rne")."""
    st = _RunningState.start(v, policy, masking.tq)
    for j, (k0, k1) in enumerate(_tiles(v.shape[-2], policy.block_k)):
        r0 = masking.first_row(k0)
        if r0 < masking.tq:
            _forward_tile(st, scores_of, v, policy, masking, alpha, r0, k0, k1, key, j)
    return _normalise(st, policy, key, masked=masking.user_mask)


class _RunningState(NamedTuple):
    """The forward's running state over key tiles, updated in place row block by row block."""

    m: torch.Tensor          # (…, Tq, 1) running maximum, in `m_acc` (default `acc`)
    l: torch.Tensor          # (…, Tq, 1) running row sum ℓ, in `acc`
    o: torch.Tensor          # (…, Tq, D) accumulator Ō, in `o_acc` (default `acc`)
    fix_pos: torch.Tensor    # (…, Tq) int32 counters of the fix's branches
    fix_neg: torch.Tensor

    @classmethod
    def start(cls, v: torch.Tensor, policy: Precision, tq: int) -> "_RunningState":
        *lead, _, d = v.shape
        dev = v.device
        return cls(torch.full((*lead, tq, 1), -math.inf, dtype=policy.format("m_acc").dtype, device=dev),
                   torch.zeros((*lead, tq, 1), dtype=policy.format("acc").dtype, device=dev),
                   torch.zeros((*lead, tq, d), dtype=policy.format("o_acc").dtype, device=dev),
                   torch.zeros((*lead, tq), dtype=torch.int32, device=dev),
                   torch.zeros((*lead, tq), dtype=torch.int32, device=dev))


def _forward_tile(st: _RunningState, scores_of: ScoreSource, v: torch.Tensor, policy: Precision,
                  masking: _Masking, alpha: float, r0: int, k0: int, k1: int, key: RoundingKey | None = None,
                  j: int = 0) -> None:
    """One key tile k0:k1 (the j-th) for the rows r0: (the rows that see any of its keys): block maximum (and the
    fix), P̄, ℓ_j, P̄V, and the online rescaling of the running state."""
    mask_value = -policy.format("scores").max if policy.masked_ties else -math.inf
    s, raw = scores_of(r0, k0, k1)                      # (…, R, bk) in `scores`; raw QKᵀ for fma
    s = masking.added(s, r0, k0, k1, policy.format("scores"))  # an additive mask: S + M (else s itself)
    allowed = masking.allowed(r0, k0, k1)               # (…, R, bk) bool, or None
    if allowed is not None:
        s = s.masked_fill(~allowed, mask_value)
    m_old = st.m[..., r0:, :]                           # (…, R, 1)
    carry = None                                        # masked_carry: rows for which this tile is fully masked
    if policy.masked_carry is not None and allowed is not None:
        dead = ~allowed.any(dim=-1, keepdim=True)       # (…, R, 1) bool
        if bool(dead.any()):
            carry = (dead, FORMATS[policy.masked_carry])

    m_blk, pos, neg = _block_maximum(s, allowed, policy)
    if pos is not None:
        st.fix_pos[..., r0:] += pos[..., 0].to(torch.int32)
        st.fix_neg[..., r0:] += neg[..., 0].to(torch.int32)
    m_new = torch.maximum(m_old, m_blk)                            # (…, R, 1) in `acc`
    # a row fully masked so far keeps m = −∞; subtract 0 there so that exp(−∞ − 0) = 0, not NaN
    m_sub = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    p = _tile_probabilities(s, raw, allowed, m_sub, policy, alpha,
                            masking.fused_bias(r0, k0, k1))  # (…, R, bk) in `exp`
    pbar = policy.format("pbar")
    p_mm = _cast(p, pbar)                                          # cast: P̄ to `pbar`
    l_blk = _block_row_sum(p, p_mm, policy)                        # (…, R, 1) in `exp`
    pv = _matmul(p_mm, v[..., k0:k1, :].to(_wider(pbar.dtype, v.dtype)), policy.format("pv_out"),
                 policy, _at(key, _SITE_PV, j))                    # cast: P̄V to `pv_out`
    _rescale_and_add(st, policy, r0, m_old, m_sub, m_new, l_blk, pv, carry, key, j)


def _block_maximum(s: torch.Tensor, allowed: torch.Tensor | None, policy: Precision):
    """The maximum this key tile contributes, in `m_acc`: r_m = rowmax(S), or with the fix Algorithm 3's m'
    (the robust fix's for BoundedMax; chapter 5, Fix). Returns (m', pos, neg): the rows where the fix's
    positive (β·r_m) and negative (0) branches fired, or None, None without a fix."""
    fix, scores_f, m_f = policy.fix, policy.format("scores"), policy.format("m_acc")
    r_m = s.amax(dim=-1, keepdim=True)                             # (…, R, 1) in `scores`
    if fix is None:
        return _cast(r_m, m_f), None, None                         # cast: m' to `m_acc` (default `acc`)
    op = _op(scores_f.dtype)
    thresh = _cast(r_m.to(op) - fix.eps, scores_f)                 # cast: r_m − ε to `scores`
    tied = s >= thresh                                             # (…, R, bk)
    if allowed is not None and not policy.masked_ties:
        tied = tied & allowed                                      # masked entries never tie
    r_s = tied.sum(dim=-1, keepdim=True)                           # (…, R, 1)
    pos = (r_s > 1) & (r_m > 0)
    neg = (r_s > 1) & (r_m < 0)
    scaled = _cast(r_m.to(op) * fix.beta, scores_f)                # cast: β·r_m to `scores`
    m_blk = torch.where(pos, scaled, torch.where(neg, torch.zeros_like(r_m), r_m))
    if isinstance(fix, BoundedMax):                                # the robust fix: bound the shift
        m_blk, pos, neg = _bounded_max(m_blk, r_m, r_s, fix, scores_f, m_f)  # m_f: `acc` unless m_acc
    return _cast(m_blk, m_f), pos, neg                             # cast: m' to `m_acc` (default `acc`)


def _tile_probabilities(s, raw, allowed, m_sub, policy: Precision, alpha: float, bias=None) -> torch.Tensor:
    """P̄ = exp(S − m) of one tile, in `exp`: S − m rounded to `exp_in` (sub), or the fused QKᵀ·α − m (fma;
    with an additive mask M, QKᵀ·α + M − m formed in float64 and rounded once)."""
    if policy.sub == "sub":
        return exp_scores(s, m_sub, policy)                        # (…, R, bk) in `exp`
    x = _cast(_fused_scores(raw, alpha, policy, bias) - m_sub.double(), policy.format("exp_in"))  # cast: fused
    if allowed is not None:
        x = x.masked_fill(~allowed, -math.inf)
    return torch.exp(_cast(x, policy.format("exp")))               # cast: exp runs in `exp`; (…, R, bk)


def _fused_scores(raw: torch.Tensor, alpha: float, policy: Precision, bias: torch.Tensor | None) -> torch.Tensor:
    """QKᵀ·α (+ M, an additive mask) in float64, unrounded: the part of the fused step before "− m"."""
    x = raw.double() * _fma_alpha(alpha, policy)
    return x if bias is None else x + bias.double()


def _block_row_sum(p: torch.Tensor, p_mm: torch.Tensor, policy: Precision) -> torch.Tensor:
    """ℓ_j = rowsum of this tile's probabilities in `exp`: of P as computed (l_from="p", FlashAttention-2 and the
    paper) or of P̄ as rounded to `pbar` for the P̄V product (l_from="pbar", flash-attention PR #2721: the
    normaliser then matches the numerator); then the official code's floor `l_clamp` where set."""
    if policy.l_from == "pbar":
        l_blk = _cast(p_mm, policy.format("exp")).sum(dim=-1, keepdim=True)  # cast: P̄ back to `exp` (exact)
    else:
        l_blk = p.sum(dim=-1, keepdim=True)                        # (…, R, 1) in `exp`
    if policy.l_clamp is not None:
        l_blk = l_blk.clamp(min=policy.l_clamp)                    # the official code's per-block floor
    return l_blk


def _rescale_and_add(st: _RunningState, policy: Precision, r0: int, m_old, m_sub, m_new, l_blk, pv,
                     carry, key: RoundingKey | None = None, j: int = 0) -> None:
    """The online update of rows r0: a = exp(m_old − m_new), ℓ = a·ℓ + ℓ_j, Ō = Ō·a + P̄V (each rounded)."""
    acc, exp_f, exp_in = policy.format("acc"), policy.format("exp"), policy.format("exp_in")
    m_f, o_acc, pv_out = policy.format("m_acc"), policy.format("o_acc"), policy.format("pv_out")
    m_rs = policy.format("m_rescale")                              # `m_acc` unless m_rescale is set
    op = _op(m_f.dtype, exp_in.dtype, m_rs.dtype)
    # cast: m_old, m_new to `m_rescale`, m_old − m_new to `exp_in`
    m_o, m_n = _cast(m_old, m_rs), _cast(m_sub, m_rs)
    l_old = st.l[..., r0:, :]                                      # (…, R, 1)
    if carry is not None:                                          # cast: m_old, m_new to `masked_carry` there
        m_o = torch.where(carry[0], _cast(_cast(m_o, carry[1]), m_rs), m_o)
        m_n = torch.where(carry[0], _cast(_cast(m_n, carry[1]), m_rs), m_n)
    d_m = _cast(m_o.to(op) - m_n.to(op), exp_in)
    a = torch.exp(_cast(d_m, exp_f))                               # cast: exp runs in `exp`; (…, R, 1)
    if carry is not None:                                          # cast: ℓ_old to `masked_carry` there
        l_old = torch.where(carry[0], _cast(l_old, carry[1]).to(l_old.dtype), l_old)
    op = _op(acc.dtype, exp_f.dtype)
    l_new = _cast(a.to(op) * l_old.to(op) + l_blk.to(op), acc)     # cast: ℓ to `acc`
    op = _op(o_acc.dtype, exp_f.dtype, pv_out.dtype)
    o_prod = st.o[..., r0:, :].to(op) * a.to(op)
    o_scaled = _round(o_prod, o_acc, policy, _at(key, _SITE_SCALE, j))  # cast: Ō·a to `o_acc`
    if carry is not None:                                          # cast: Ō·a to `masked_carry` there (rne)
        o_scaled = torch.where(carry[0], _cast(_cast(o_prod, carry[1]), o_acc), o_scaled)
    st.o[..., r0:, :] = _round(o_scaled.to(op) + pv.to(op), o_acc, policy,
                               _at(key, _SITE_ADD, j))             # cast: Ō·a + P̄V to `o_acc`
    st.l[..., r0:, :] = l_new
    st.m[..., r0:, :] = m_new


def _normalise(st: _RunningState, policy: Precision, key: RoundingKey | None = None,
               masked: bool = False) -> ForwardResult:
    """After the last key tile: O = Ō / ℓ rounded to `out`, and L = log ℓ + m. `masked` (an attention mask was
    given): rows with no allowed key get O = 0 and L = +∞, as SDPA and FlashAttention-2 give them."""
    o, l, m = st.o, st.l, st.m
    exp_f, out_f, o_acc = policy.format("exp"), policy.format("out"), policy.format("o_acc")
    l_div_last, l_store = policy.format("l_div_last"), policy.format("l_store")
    tq = l.shape[-2]
    l_div = _cast(l, policy.format("l_div"))                       # cast: ℓ to `l_div` (default `acc`)
    op = _op(o_acc.dtype, l_div.dtype, out_f.dtype, l_div_last.dtype)
    l_div = l_div.to(op)
    if policy.l_div_last is not None:                              # the last query tile divides by another ℓ
        l_div = l_div.clone()                                      # (never write into ℓ itself)
        last = 0 if policy.block_q is None else ((tq - 1) // policy.block_q) * policy.block_q
        l_div[..., last:, :] = _cast(l[..., last:, :], l_div_last).to(op)  # cast: ℓ to `l_div_last`
    o_out = _round(o.to(op) / l_div, out_f, policy, _at(key, _SITE_OUT))  # cast: O = Ō / ℓ to `out`
    l_st, m_st = _cast(l, l_store), _cast(m, l_store)              # cast: stored ℓ, m (`l_store`)
    lse = torch.log(_cast(l_st, exp_f)) + _cast(m_st, exp_f)       # cast: L = log ℓ + m in `exp`
    if masked:  # rows with no allowed key (m = −∞): O = 0 and L = +∞, so that the backward's P is 0 there
        dead = torch.isneginf(m)                                   # (…, Tq, 1): no finite score seen
        o_out = o_out.masked_fill(dead, 0.0)
        lse = lse.masked_fill(dead, math.inf)
    return ForwardResult(o_out, o, m, l, lse, st.fix_pos, st.fix_neg)


# ---------------------------------------------------------------------------------------------------
# scores from q and k
# ---------------------------------------------------------------------------------------------------
def _qk_scores(q: torch.Tensor, k: torch.Tensor, policy: Precision, alpha: float) -> ScoreSource:
    """The score source of the main forward and the backward: S = round(round(QKᵀ)·α)."""
    mm, qk_out, scores_f = policy.format("matmul"), policy.format("qk_out"), policy.format("scores")
    q_mm = _cast(q, mm)                                            # cast: Q to `matmul`; (B, H, Tq, D)
    k_mm = _cast(k, mm)                                            # cast: K to `matmul`; (B, H, Tk, D)
    op = _op(qk_out.dtype, scores_f.dtype)

    def scores_of(r0: int, k0: int, k1: int):
        qk = _matmul(q_mm[..., r0:, :], k_mm[..., k0:k1, :].transpose(-1, -2), qk_out)  # (B, H, R, bk)
        s = _cast(qk.to(op) * alpha, scores_f)                     # cast: S = QKᵀ·α to `scores`
        return s, (qk if policy.sub == "fma" else None)

    return scores_of


def _check_qkv(q, k, v, policy, causal, check_finite: bool = True):
    if not isinstance(policy, Precision):
        raise TypeError(f"policy must be a lpfail.precision.Precision (got {type(policy).__name__})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim); got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if q.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q, k and v must be floating point ({', '.join(map(str, _FLOAT_DTYPES))}); "
                         f"got {q.dtype}")
    if not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
        raise ValueError(f"q, k and v must agree in batch and heads; got shapes q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (seq_k, head_dim); got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim; got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.shape[-1] == 0:
        raise ValueError(f"empty sequence or head_dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"causal attention is bottom-right aligned (query i sees keys j <= i + Tk - Tq), so it "
                         f"needs seq_q <= seq_k; got seq_q {q.shape[-2]} > seq_k {k.shape[-2]}, which would "
                         "leave the first queries with no key")
    if not check_finite:  # the model: NaN flows on to the loss, and no host-device sync per layer
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not torch.isfinite(t).all():
            raise NonFiniteInputError(f"{name} contains non-finite values (inf or NaN)")


def resolve_scale(scale, d):
    """α as a Python float (D^-1/2 by default). Elementwise ops round it to their op dtype (FP32 or FP64).
    Raises ValueError naming the argument for a scale that is not a finite positive number (a string, 0, NaN)."""
    if scale is None:
        return d ** -0.5
    try:
        alpha = float(scale)
    except (TypeError, ValueError):
        alpha = None
    if alpha is None or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    return alpha



def _fma_alpha(alpha: float, policy: Precision) -> float:
    """α as the fused step sees it: rounded to the dtype of the raw product (`qk_out`)."""
    return float(torch.tensor(alpha, dtype=policy.format("qk_out").dtype))  # sub="fma": a native qk_out


# ---------------------------------------------------------------------------------------------------
# public forward / backward
# ---------------------------------------------------------------------------------------------------
def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Precision = FA2_BF16,
                  causal: bool = True, scale: float | None = None,
                  sr_key: RoundingKey | None = None, attn_mask: torch.Tensor | None = None) -> ForwardResult:
    """FlashAttention-2's Algorithm 1 (and the paper's Algorithm 3 when `policy.fix` is set), no autograd.

    q (B, H, Tq, D), k and v (B, H, Tk, D). Returns the `ForwardResult` (o, o_unnorm, m, l, lse, counters).
    sr_key: where an "sr" policy's stochastic roundings draw their bits (see `attention`); attn_mask as in
    `attention` (rows it leaves without a key have lse = +∞)."""
    _check_qkv(q, k, v, policy, causal)
    _mask_parts(attn_mask, q, k)
    return _forward(q, k, v, policy, causal, scale, sr_key, attn_mask)


def _forward(q, k, v, policy: Precision, causal: bool, scale: float | None,
             sr_key: RoundingKey | None = None, attn_mask: torch.Tensor | None = None) -> ForwardResult:
    alpha = resolve_scale(scale, q.shape[-1])
    key = _sr_key(policy, sr_key)
    with _no_autocast(q), torch.no_grad():
        allowed, bias = _mask_parts(attn_mask, q, k, check_finite=False)
        masking = _Masking(q.shape[-2], k.shape[-2], k.shape[-2] - q.shape[-2] if causal else None, allowed,
                           q.device, skip_rows=not policy.masked_ties, bias=bias, user_mask=attn_mask is not None)
        v_mm = _cast(v, policy.format("v"))                        # cast: V to `v` (default `matmul`)
        return _tiled_forward(_qk_scores(q, k, policy, alpha), v_mm, policy, masking, alpha, key)


def forward_from_scores(s: torch.Tensor, v: torch.Tensor, policy: Precision = PAPER_BF16,
                        mask: torch.Tensor | None = None, sr_key: RoundingKey | None = None) -> ForwardResult:
    """The same tiled forward, started from given (already scaled) scores: the Rounding chapter's entry point.

    s (…, Tq, Tk) scores αQKᵀ, cast to the policy's `scores` dtype first (with sub="fma" they play the role
    of the raw FP32 product, with α = 1); v (…, Tk, D), cast to `v` (default `matmul`); mask None or bool
    (…, Tq, Tk), broadcastable, True = allowed (every row needs at least one allowed key). Everything after S is
    the code path of `attention` (chapter 4, Rounding: the chapter's numbers are the model's numbers). sr_key as
    in `attention`."""
    if not isinstance(policy, Precision):
        raise TypeError(f"policy must be a lpfail.precision.Precision (got {type(policy).__name__})")
    if s.dim() < 2 or v.dim() < 2 or s.shape[-1] != v.shape[-2] or s.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"s must be (…, Tq, Tk) and v (…, Tk, D) with the same leading dims; got s "
                         f"{tuple(s.shape)}, v {tuple(v.shape)}")
    if s.dtype not in _FLOAT_DTYPES or v.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"s and v must be floating point; got {s.dtype} and {v.dtype}")
    if not (torch.isfinite(s).all() and torch.isfinite(v).all()):
        raise ValueError("s and v must be finite (mask entries with `mask`, not with -inf)")
    tq, tk = s.shape[-2], s.shape[-1]
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor (True = allowed); got {mask.dtype}")
        mask = torch.broadcast_to(mask, s.shape)
        if not mask.any(dim=-1).all():
            raise ValueError("every row needs at least one allowed key in mask")
    key = _sr_key(policy, sr_key)
    with _no_autocast(s), torch.no_grad():
        s_in = _cast(s, policy.format("scores"))                   # cast: S to `scores`
        raw_in = _cast(s, policy.format("qk_out")) if policy.sub == "fma" else None  # cast: raw product (fma)

        def scores_of(r0, k0, k1):
            return s_in[..., r0:, k0:k1], (raw_in[..., r0:, k0:k1] if raw_in is not None else None)

        masking = _Masking(tq, tk, None, mask, s.device, skip_rows=False)
        v_mm = _cast(v, policy.format("v"))                        # cast: V to `v` (default `matmul`); (…, Tk, D)
        return _tiled_forward(scores_of, v_mm, policy, masking, 1.0, key)


def _per_q_tile_sum(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, block_q: int | None,
                    out: Format) -> torch.Tensor:
    """acc + Σ_i a_iᵀ b_i over query tiles i (rows of a and b), each product rounded to `out` and added in
    order, rounded to `out` after every add. a (…, R, bk), b (…, R, D), acc (…, bk, D) in `out`."""
    r = a.shape[-2]
    step = r if block_q is None else block_q
    n_full = r // step
    op = _op(out.dtype)
    if n_full:
        a_f = a[..., : n_full * step, :].unflatten(-2, (n_full, step))   # (…, n, bq, bk)
        b_f = b[..., : n_full * step, :].unflatten(-2, (n_full, step))   # (…, n, bq, D)
        parts = _matmul(a_f.transpose(-1, -2), b_f, out)                  # (…, n, bk, D) in `out`
        for i in range(n_full):
            acc = _cast(acc.to(op) + parts[..., i, :, :].to(op), out)     # cast: running sum to `grad_acc`
    if n_full * step < r:
        part = _matmul(a[..., n_full * step:, :].transpose(-1, -2), b[..., n_full * step:, :], out)
        acc = _cast(acc.to(op) + part.to(op), out)                        # cast: running sum to `grad_acc`
    return acc


def output_residual(res: ForwardResult, policy: Precision) -> torch.Tensor:
    """R = O_hp − O rounded to `out`: what the forward's final rounding O = Ō / ℓ took away, with O_hp the
    quotient in op. The stored residual of output-residual compensation (``delta="dO.O_res"``)."""
    acc, out_f = policy.format("acc"), policy.format("out")
    op = _op(acc.dtype, out_f.dtype)
    o_hp = res.o_unnorm.to(op) / res.l.to(op)                      # the quotient before its rounding
    return _cast(o_hp - res.o.to(op), out_f)                       # cast: residual to `out`


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   do: torch.Tensor, policy: Precision = FA2_BF16, causal: bool = True,
                   scale: float | None = None, o_residual: torch.Tensor | None = None,
                   attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's Algorithm 2 under the policy: (dq, dk, dv) in the inputs' dtype.

    o (B, H, Tq, D) and lse (B, H, Tq, 1) are what `flash_forward` returned (o in `out`, lse in `exp`);
    do (B, H, Tq, D) is the gradient of o. With ``policy.delta == "dO.O_res"``, o_residual is
    `output_residual` of the forward (required). attn_mask: the forward's (see `attention`)."""
    _check_qkv(q, k, v, policy, causal)
    _mask_parts(attn_mask, q, k)
    return _backward(q, k, v, o, lse, do, policy, causal, scale, o_residual, attn_mask)


def _backward(q, k, v, o, lse, do, policy: Precision, causal: bool, scale: float | None, o_res=None,
              attn_mask=None):
    alpha = resolve_scale(scale, q.shape[-1])
    with _no_autocast(q), torch.no_grad():
        return _backward_tiles(q, k, v, o, lse, do, policy, causal, alpha, o_res, attn_mask)


def _backward_tiles(q, k, v, o, lse, do, policy: Precision, causal: bool, alpha: float, o_res=None,
                    attn_mask=None):
    """Algorithm 2 over the key tiles: δ first (`_delta`), then one pass for dQ, dK, dV (`_gradient_pass`)."""
    tiles = _BackwardTiles(q, k, v, lse, do, policy, causal, alpha, attn_mask)
    delta = _delta(tiles, o, do, o_res)
    dq, dk, dv = _gradient_pass(tiles, delta)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)         # cast: gradients to the inputs' dtype


class _BackwardTiles:
    """What every pass of the backward reads: the operands cast to `matmul`, the masking, the scores and
    P = exp(S − L) of a tile."""

    def __init__(self, q, k, v, lse, do, policy: Precision, causal: bool, alpha: float, attn_mask=None):
        mm = policy.format("matmul")
        self.policy, self.alpha, self.lse, self.shape_q, self.device = policy, alpha, lse, q.shape, q.device
        self.tq, self.tk = q.shape[-2], k.shape[-2]
        allowed, bias = _mask_parts(attn_mask, q, k, check_finite=False)
        self.masking = _Masking(self.tq, self.tk, self.tk - self.tq if causal else None, allowed, q.device,
                                skip_rows=True, bias=bias)
        self.scores_of = _qk_scores(q, k, policy, alpha)
        self.v_mm = _cast(v, policy.format("v"))                   # cast: V to `v` (default `matmul`); (B, H, Tk, D)
        self.q_mm = _cast(q, mm)                                   # cast: Q to `matmul`; (B, H, Tq, D)
        self.k_mm = _cast(k, mm)                                   # cast: K to `matmul`; (B, H, Tk, D)
        self.do_mm = _cast(do, mm)                                 # cast: dO to `matmul`; (B, H, Tq, D)

    def tiles(self):
        """(r0, k0, k1) per key tile: r0 is the first row of the query tile holding the tile's first live row
        (keeps dK/dV's tiling aligned with `block_q`)."""
        bq = self.policy.block_q
        for k0, k1 in _tiles(self.tk, self.policy.block_k):
            r0 = self.masking.first_row(k0)
            yield (r0 if bq is None else (r0 // bq) * bq), k0, k1

    def probabilities(self, r0, k0, k1):
        """P = exp(S − L) for rows r0: and keys k0:k1, in `exp`; masked entries 0.  (B, H, R, bk)"""
        policy, exp_f = self.policy, self.policy.format("exp")
        s, raw = self.scores_of(r0, k0, k1)
        s = self.masking.added(s, r0, k0, k1, policy.format("scores"))  # an additive mask: S + M as in the forward
        allowed = self.masking.allowed(r0, k0, k1)
        L = self.lse[..., r0:, :]
        if policy.sub == "sub":
            if allowed is not None:
                s = s.masked_fill(~allowed, -math.inf)
            op = _op(policy.format("scores").dtype, exp_f.dtype)
            x = _cast(s.to(op) - L.to(op), exp_f)                  # cast: S − L to `exp`
        else:
            x = _cast(_fused_scores(raw, self.alpha, policy, self.masking.fused_bias(r0, k0, k1)) - L.double(),
                      exp_f)                                       # cast: fused QKᵀ·α (+ M) − L to `exp`
            if allowed is not None:
                x = x.masked_fill(~allowed, -math.inf)
        return torch.exp(x)                                        # exp in `exp`

    def dp(self, r0, k0, k1):
        """dP = dO V_jᵀ for rows r0: and keys k0:k1, rounded to `dp`."""
        return _matmul(self.do_mm[..., r0:, :], self.v_mm[..., k0:k1, :].transpose(-1, -2),
                       self.policy.format("dp"))                   # cast: dP to `dp`


def _delta(t: _BackwardTiles, o, do, o_res) -> torch.Tensor:
    """δ (B, H, Tq, 1) from the policy's source: dO ∘ O, dO ∘ O_hp (O recomputed), dO ∘ (O + R), or dP ∘ P."""
    policy, exp_dt, prod_f = t.policy, t.policy.format("exp").dtype, t.policy.format("delta_prod")
    if policy.delta == "dO.O":
        f = _prod_format(prod_f, do.dtype, o.dtype)
        prod = _product(do, o, f)                                  # cast: dO∘O in `delta_prod`
        return prod.to(_op(f.dtype)).sum(dim=-1, keepdim=True)     # (B, H, Tq, 1) summed in op
    if policy.delta == "dO.O_hp":
        hp = _wider(torch.float32, exp_dt, policy.format("acc").dtype)
        o_hp = torch.zeros(t.shape_q, dtype=hp, device=t.device)   # (B, H, Tq, D) O recomputed for δ
        for r0, k0, k1 in t.tiles():
            p = t.probabilities(r0, k0, k1)
            o_hp[..., r0:, :] += p.to(hp) @ t.v_mm[..., k0:k1, :].to(hp)  # cast: P and V to hp
        f = _prod_format(prod_f, do.dtype, hp)
        return _product(do, o_hp, f).to(_op(f.dtype)).sum(dim=-1, keepdim=True)
    if policy.delta == "dO.O_res":
        if o_res is None:
            raise ValueError("delta='dO.O_res' needs the forward's output residual (flash_backward(..., "
                             "o_residual=output_residual(forward_result, policy)))")
        hp = _wider(torch.float32, o.dtype, o_res.dtype)
        o_c = o.to(hp) + o_res.to(hp)                              # O + R in FP32: the compensated output
        f = _prod_format(prod_f, do.dtype, hp)
        return _product(do, o_c, f).to(_op(f.dtype)).sum(dim=-1, keepdim=True)
    delta = None                                                   # "dP.P"
    for r0, k0, k1 in t.tiles():
        p = t.probabilities(r0, k0, k1)
        dp = t.dp(r0, k0, k1)
        f = _prod_format(prod_f, policy.format("dp").dtype, exp_dt)
        part = _product(dp, p, f).to(_op(f.dtype)).sum(dim=-1, keepdim=True)
        if delta is None:
            delta = torch.zeros((*t.shape_q[:-1], 1), dtype=part.dtype, device=t.device)
        delta[..., r0:, :] += part
    return delta


def _gradient_pass(t: _BackwardTiles, delta: torch.Tensor):
    """dQ, dK, dV in `grad_acc` over the key tiles (dK_j, dV_j per query tile of `block_q`)."""
    policy, alpha = t.policy, t.alpha
    mm, exp_dt, pbar = policy.format("matmul").dtype, policy.format("exp").dtype, policy.format("pbar")
    dp_dt, ds_f, gacc, bq = policy.format("dp").dtype, policy.format("ds"), policy.format("grad_acc"), policy.block_q
    dq = torch.zeros(t.shape_q, dtype=gacc.dtype, device=t.device)     # (B, H, Tq, D) in `grad_acc`
    dk = torch.zeros(t.k_mm.shape, dtype=gacc.dtype, device=t.device)  # (B, H, Tk, D)
    dv = torch.zeros(t.v_mm.shape, dtype=gacc.dtype, device=t.device)  # (B, H, Tk, D)
    for r0, k0, k1 in t.tiles():
        if r0 >= t.tq:
            continue
        p = t.probabilities(r0, k0, k1)                            # (B, H, R, bk) in `exp`
        p_mm = _cast(p, pbar)                                      # cast: P to `pbar`
        dv[..., k0:k1, :] = _per_q_tile_sum(dv[..., k0:k1, :], p_mm,
                                            t.do_mm[..., r0:, :].to(_wider(pbar.dtype, mm)), bq, gacc)
        dp = t.dp(r0, k0, k1)                                      # cast: dP to `dp`
        op = _op(exp_dt, dp_dt, delta.dtype)
        ds = (p.to(op) * alpha) * (dp.to(op) - delta[..., r0:, :].to(op))  # (B, H, R, bk) in op
        ds_mm = _cast(ds, ds_f)                                    # cast: dS to `ds`
        wide = _wider(ds_f.dtype, mm)
        dq_part = _matmul(ds_mm.to(wide), t.k_mm[..., k0:k1, :].to(wide), gacc)  # (B, H, R, D)
        corr_k = None
        if policy.ds_rowsum:
            dq_part, corr_k = _ds_rowsum_correction(t, r0, k0, k1, ds, ds_mm, dq_part, op)
        op = _op(gacc.dtype)
        dq[..., r0:, :] = _cast(dq[..., r0:, :].to(op) + dq_part.to(op), gacc)  # cast: dQ sum to `grad_acc`
        dk[..., k0:k1, :] = _per_q_tile_sum(dk[..., k0:k1, :], ds_mm.to(wide), t.q_mm[..., r0:, :].to(wide),
                                            bq, gacc)
        if corr_k is not None:
            dk[..., k0:k1, :] = _cast(dk[..., k0:k1, :].to(corr_k.dtype) - corr_k, gacc)  # cast: to `grad_acc`
    return dq, dk, dv


def _ds_rowsum_correction(t: _BackwardTiles, r0, k0, k1, ds, ds_mm, dq_part, op):
    """ds_rowsum: remove the row sum of dS's rounding error, evenly over the row's allowed keys of the tile.
    Returns dQ's corrected part (in `grad_acc`) and dK_j's correction (in op, subtracted after the sum)."""
    allowed = t.masking.allowed(r0, k0, k1)                        # (R, bk) or None
    live = (allowed.to(op) if allowed is not None
            else torch.ones(ds.shape[-2:], dtype=op, device=ds.device))  # (R, bk)
    n = live.sum(dim=-1, keepdim=True).clamp(min=1)                # (R, 1)
    e = (ds_mm.to(op) - ds).sum(dim=-1, keepdim=True) / n          # (B, H, R, 1) per allowed key
    dq_part = _cast(dq_part.to(op) - e * (live @ t.k_mm[..., k0:k1, :].to(op)), t.policy.format("grad_acc"))  # cast
    corr_k = (e * live).transpose(-1, -2) @ t.q_mm[..., r0:, :].to(op)  # (B, H, bk, D)
    return dq_part, corr_k


class _FlashAttentionFn(torch.autograd.Function):
    """Forward: `flash_forward`. Backward: `flash_backward` (FlashAttention-2's Algorithm 2), not autograd."""

    @staticmethod
    def forward(ctx, q, k, v, policy, causal, scale, sr_key=None, attn_mask=None):
        res = _forward(q, k, v, policy, causal, scale, sr_key, attn_mask)
        if policy.delta == "dO.O_res":  # output-residual compensation stores one more `out` tensor
            with _no_autocast(q), torch.no_grad():
                ctx.save_for_backward(q, k, v, res.o, res.lse, output_residual(res, policy))
        else:
            ctx.save_for_backward(q, k, v, res.o, res.lse)
        ctx.policy, ctx.causal, ctx.scale, ctx.attn_mask = policy, causal, scale, attn_mask
        return res.o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, *o_res = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.policy, ctx.causal, ctx.scale, *(o_res or [None]),
                               attn_mask=ctx.attn_mask)
        return dq, dk, dv, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Precision = FA2_BF16,
              causal: bool = True, scale: float | None = None, check_finite: bool = True,
              sr_key: RoundingKey | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(α·QKᵀ)·V computed as FlashAttention-2 under `policy`; differentiable (Algorithm 2 backward).

    q (B, H, Tq, D), k and v (B, H, Tk, D), one float dtype; α = scale or D^-1/2. Causal masking is
    bottom-right aligned (needs Tq ≤ Tk). Returns O (B, H, Tq, D) in the policy's `out` dtype; gradients
    come back in the inputs' dtype. Inputs holding inf or NaN raise `NonFiniteInputError` (a ValueError)
    unless ``check_finite=False`` (what the model passes: NaN then propagates to the output, as in a kernel,
    and no host-device synchronization is spent on the check). Shape and dtype checks always run.

    sr_key: under ``policy.rounding = "sr"``, the `lpfail.sr_stream.RoundingKey` the output path's stochastic
    roundings draw their bits from (the model passes one per layer and micro-batch, from its `SRStream`); None
    draws a key's seed from torch's default CPU generator. Ignored under "rne".

    attn_mask: as SDPA's, broadcastable to (B, H, Tq, Tk): bool (True = the query may attend to the key), or
    float, added to the scores S in op and rounded to `scores` (S + M, before the row maximum; entries −∞ are
    masked). Applied together with `causal` when both are given. A row left with no allowed key gives O = 0 and
    zero gradients (as SDPA). The mask gets no gradient (one that requires grad is refused)."""
    _check_qkv(q, k, v, policy, causal, check_finite)
    _mask_parts(attn_mask, q, k, check_finite)
    return _FlashAttentionFn.apply(q, k, v, policy, causal, scale, sr_key, attn_mask)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    scale: float | None = None, check_finite: bool = True,
                    attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The truth: softmax(α·QKᵀ)·V in float64 (inputs upcast), no tiling, differentiable by autograd.

    Same shapes, causal convention (bottom-right, Tq ≤ Tk), `check_finite` and `attn_mask` (a float mask added
    in float64; rows with no allowed key give 0) as `attention`; returns float64."""
    _check_qkv(q, k, v, FP64, causal, check_finite)
    allowed, bias = _mask_parts(attn_mask, q, k, check_finite)
    alpha = resolve_scale(scale, q.shape[-1])
    q64, k64, v64 = q.double(), k.double(), v.double()             # cast: everything to float64
    s = (q64 @ k64.transpose(-1, -2)) * alpha                      # (B, H, Tq, Tk)
    if bias is not None:
        s = s + bias.double()                                      # cast: the additive mask to float64
    if causal:
        tq, tk = q.shape[-2], k.shape[-2]
        rows = torch.arange(tq, device=q.device)[:, None]
        cols = torch.arange(tk, device=q.device)[None, :]
        s = s.masked_fill(cols > rows + (tk - tq), -math.inf)
    if allowed is None:
        return torch.softmax(s, dim=-1) @ v64                      # (B, H, Tq, D)
    s = s.masked_fill(~allowed, -math.inf)
    live = torch.isfinite(s.amax(dim=-1, keepdim=True))            # (B, H, Tq, 1): rows with an allowed key
    p = torch.softmax(s.masked_fill(~live, 0.0), dim=-1).masked_fill(~live, 0.0)  # no NaN, also in the backward
    return p @ v64                                                 # (B, H, Tq, D)


# ---------------------------------------------------------------------------------------------------
# the forward in thirty lines (shown in the book's primer)
# ---------------------------------------------------------------------------------------------------
def _check_tile_loop_policy(policy: Precision) -> None:
    """Refuse a policy that `paper_forward_tile_loop` does not cover: it covers the plain tiled forward of
    PAPER_BF16 and FP32 (and any policy that differs from them only in which of BF16 and FP32 each cast point
    names, with native matmuls): no fix, no fused subtraction, no stochastic rounding, no compiled-code knobs."""
    fixed = dict(sub="sub", fix=None, l_clamp=None, masked_ties=False, rounding="rne", o_acc=None, l_div=None,
                 l_store=None, m_acc=None, m_rescale=None, l_div_last=None, masked_carry=None, l_from="p", v=None)
    wrong = [name for name, want in fixed.items() if getattr(policy, name) != want]
    knobs = ("matmul", "qk_out", "scores", "exp_in", "exp", "pbar", "pv_out", "acc", "out")
    wrong += [name for name in knobs if getattr(policy, name) not in ("bf16", "fp32")]
    if policy.exp != "fp32" or len({policy.matmul, policy.qk_out, policy.pbar, policy.pv_out}) != 1:
        wrong.append("exp must be fp32, and matmul, qk_out, pbar, pv_out one format")
    if wrong:
        raise ValueError(f"paper_forward_tile_loop covers plain BF16/FP32 tiled forwards like PAPER_BF16 and FP32; "
                         f"this policy differs in: {', '.join(wrong)} (use lpfail.attention.attention)")


def paper_forward_tile_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Precision = PAPER_BF16,
                            causal: bool = True) -> torch.Tensor:
    """The forward of `attention` for the paper's arithmetic, written as one readable loop over key tiles.

    Computes the same O, bit for bit, as ``attention(q, k, v, policy, causal)`` for PAPER_BF16 and FP32
    (tests/test_tile_loop.py), with the default scale D^-1/2, whenever no key tile starts a causal row slice at
    an unaligned row: without causal masking, and with it when queries and keys have one length (self-attention,
    the model's case). With causal Tq < Tk, `attention` multiplies only the rows a key tile is visible to, and an
    FP32 matmul of such a row slice may round differently in the last bit. Other policies are refused
    (`_check_tile_loop_policy`). Each line marked ``[n]`` is one cast point of the paper's code, which under
    PAPER_BF16 rounds to BF16 (under FP32 the same lines keep FP32); the primer numbers them the same way.
    q (B, H, Tq, D), k and v (B, H, Tk, D); causal masking bottom-right aligned, as in `attention`."""
    _check_tile_loop_policy(policy)
    _check_qkv(q, k, v, policy, causal)
    with _no_autocast(q), torch.no_grad():
        # [book:forward-start]
        f = policy.dtype                              # a cast point's dtype (PAPER_BF16: bfloat16)
        alpha, tq, tk = q.shape[-1] ** -0.5, q.shape[-2], k.shape[-2]
        q, k, v = q.to(f("matmul")), k.to(f("matmul")), v.to(f("matmul"))
        row = dict(dtype=f("acc"), device=q.device)   # the running state is held in `acc`
        m = torch.full((*q.shape[:-1], 1), -math.inf, **row)          # running maximum m
        l = torch.zeros((*q.shape[:-1], 1), **row)                    # running row sum ℓ
        o = torch.zeros(q.shape, **row)                               # unnormalised output Ō
        block = policy.block_k or tk
        for k0 in range(0, tk, block):                # one tile of keys at a time
            k1 = min(k0 + block, tk)
            qk = q @ k[..., k0:k1, :].transpose(-1, -2)               # [1] QKᵀ: FP32 sum, rounded
            s = (qk.float() * alpha).to(f("scores"))                  # [2] scores S = α·QKᵀ
            if causal:                                # query i sees keys j ≤ i + tk − tq
                rows = torch.arange(tq, device=q.device)[:, None] + (tk - tq)
                s = s.masked_fill(torch.arange(k0, k1, device=q.device) > rows, -math.inf)
            r_m = s.amax(-1, keepdim=True)                            # this tile's row maximum
            m_new = torch.maximum(m, r_m.to(f("acc")))                # [3] running maximum m
            x = (s.float() - m_new.float()).to(f("exp_in"))           # [4] S − m
            p = torch.exp(x.to(f("exp")))             # P̄ = exp(S − m): exactly 1 where S = m
            pv = p.to(f("pbar")) @ v[..., k0:k1, :]                   # [5] P̄, then [6] P̄V
            d = (m.float() - m_new.float()).to(f("exp_in"))           # [4] m_old − m_new
            a = torch.exp(d.to(f("exp")))             # rescale factor a = exp(m_old − m_new)
            l = (a * l.float() + p.sum(-1, keepdim=True)).to(f("acc"))  # [7] row sum ℓ
            o = (o.float() * a).to(f("acc"))                          # [8] Ō·a
            o = (o.float() + pv.float()).to(f("acc"))                 # [8] Ō·a + P̄V
            m = m_new
        return (o.float() / l.float()).to(f("out"))                   # [9] stored output O = Ō / ℓ
        # [book:forward-end]
