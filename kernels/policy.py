"""What the kernels compute, as their compile-time constants: a `Precision` checked and translated into a
`KernelPolicy` (`kernel_policy`, memoised as `policy_for_launch`), a head dim into its tile (`head_tile`), the robust
fix's bounds into the kernels' score units (`shift_args`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import torch

from lpfail.precision import _ACC_FIELDS, DIAL, SAFE_SHIFT, BoundedMax, Precision

from . import runtime
from .runtime import TL
from .tuning import cached_hash, state_without_hash

if runtime.IMPORT_ERROR is None:
    from . import bwd as _bwd

CHUNK = 64  # key chunk of the two-pass emulation path
#: The head dims the kernels take: the multiples of 16 up to 128. A tile's width along the head dim is a power of
#: two, so 48, 80, 96 and 112 run in the next power of two's tile with the padding read as 0 and never written
#: (`fwd._attn_fwd_kernel`'s D_VALID), without TMA; the others fill their tile exactly.
HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128)
#: The pure-PyTorch reference that runs every policy (for the refusals of `kernel_policy`).
REFERENCE = "lpfail.attention.attention(q, k, v, policy, causal=...)"


def head_tile(d: int) -> tuple[int, int]:
    """(HEAD_DIM, D_VALID), the kernels' constexprs for head dim `d`: the tile's width (the next power of two) and
    `d` itself where the tile is wider (else 0)."""
    width = 1 << (d - 1).bit_length()
    return width, (0 if width == d else d)


_DTYPE_KNOBS = tuple(k for k in ("matmul", "qk_out", "scores", "exp_in", "pbar", "pv_out", "acc", "out", "dp",
                                 "delta_prod", "ds", "grad_acc") if k in {f.name for f in fields(Precision)})


@dataclass(frozen=True)
class KernelPolicy:
    """A `Precision` translated into the kernels' constexprs (see `kernel_policy`)."""

    matmul: object     # dot operands of QKᵀ, dO Vᵀ
    qk_out: object
    scores: object
    exp_in: object
    pbar: object
    pv_dt: object      # operands of the P̄V and Pᵀ dO dots: the wider of pbar and matmul
    pv_out: object
    acc: object
    out_dtype: torch.dtype
    dp: object
    ds: object
    ds_dt: object      # operands of the dS K and dSᵀ Q dots: the wider of ds and matmul
    grad_acc: object
    delta_prod: object
    sub_fma: bool
    beta: float
    eps: float
    clamp: bool
    l_clamp: float
    delta: str
    block_n: int       # hardware tile along the keys
    key_block: int     # the policy's key block (a multiple of block_n); 0 = one block over the row
    query_block: int   # the policy's query block (dK, dV's grad_acc roundings); 0 = one block over the sequence
    two_pass: bool
    dot_prec: str
    pv_prec: str
    ds_prec: str
    fix_mode: int = 0           # FIX constexpr: 0 none, 1 Algorithm 3 (DynamicMax), 2 the robust fix (BoundedMax)
    shift_lo: float = 0.0       # BoundedMax's shift_min and shift_max (natural units)
    shift_hi: float = 0.0
    l_pbar: bool = False        # L_PBAR constexpr: ℓ summed from P̄ (the policy's l_from="pbar")

    __hash__ = cached_hash            # computed once: it keys every launch's caches
    __getstate__ = state_without_hash


def wider(a: str, b: str) -> str:
    """The wider of two of a policy's dtype names (the operands of a dot that mixes them)."""
    return "fp32" if "fp32" in (a, b) else a


def _prec(dt: str) -> str:
    return "ieee" if dt == "fp32" else "tf32"  # FP32 dots are true FP32 (the policy says so); 16-bit ignore it


def require_precision(policy) -> None:
    """TypeError unless `policy` is a `Precision`."""
    if not isinstance(policy, Precision):
        raise TypeError(f"policy must be a lpfail.precision.Precision (got {type(policy).__name__})")


def kernel_policy(policy: Precision) -> KernelPolicy:
    """Check that the kernels can honour `policy` and translate it; ValueError names the knob that can't."""
    require_precision(policy)
    for knob in (*_DTYPE_KNOBS, *_ACC_FIELDS, "masked_carry", "v"):
        value = getattr(policy, knob, None)
        if value in DIAL:
            raise ValueError(f"kernels: Precision.{knob}={value!r} is a K-bit format of the precision dial (bf16's "
                             f"exponent with {DIAL[value]} fraction bits), which the Triton kernels do not round "
                             f"to; run it with the reference, {REFERENCE}")
    if getattr(policy, "v", None) is not None:
        raise ValueError(f"kernels: Precision.v={policy.v!r} (V rounded to a format of its own where it enters "
                         "attention) is not implemented in the Triton kernels; run it with the reference, "
                         f"{REFERENCE}")
    for knob in _DTYPE_KNOBS:
        value = getattr(policy, knob)
        if value not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"kernels: Precision.{knob}={value!r} is not supported by the Triton kernels "
                             "(bf16, fp16 or fp32 only); use the reference, lpfail.attention.attention, for float64")
    if policy.exp != "fp32":
        raise ValueError(f"kernels: Precision.exp={policy.exp!r} is not supported: the kernels evaluate exp in "
                         "fp32 only")
    if getattr(policy, "rounding", "rne") != "rne":
        raise ValueError(f"kernels: Precision.rounding={policy.rounding!r} (stochastic rounding of the output path) "
                         "is not implemented in the Triton kernels, which round to nearest even only; run it with "
                         f"the reference, {REFERENCE}")
    if getattr(policy, "delta", "dO.O") not in ("dO.O", "dO.O_hp", "dP.P"):
        raise ValueError(f"kernels: Precision.delta={policy.delta!r} is not implemented in the Triton kernels; "
                         f"run it with the reference, {REFERENCE}")
    if getattr(policy, "ds_rowsum", False):
        raise ValueError("kernels: Precision.ds_rowsum=True (the dS row-sum correction) is not implemented in the "
                         f"Triton kernels; run it with the reference, {REFERENCE}")
    if getattr(policy, "masked_carry", None) is not None:
        raise ValueError(f"kernels: Precision.masked_carry={policy.masked_carry!r} (the compiled official fixed "
                         "code's rounding of the running state in a fully masked key tile) is not implemented in "
                         "the Triton kernels, which skip fully masked tiles; use the reference, "
                         "lpfail.attention.attention, for PAPER_BF16_COMPILED_OFFICIAL_FIX")
    if getattr(policy, "masked_ties", False):
        raise ValueError("kernels: Precision.masked_ties=True (the official code's masking, under which fully "
                         "masked tiles count as ties) is not supported: the kernels never let masked scores tie; "
                         "use the reference, lpfail.attention.attention, for PAPER_BF16_OFFICIAL_FIX")
    for knob in _ACC_FIELDS:  # torch.compile's arithmetic (PAPER_BF16_COMPILED): reference only
        if getattr(policy, knob, None) is not None:
            raise ValueError(f"kernels: Precision.{knob}={getattr(policy, knob)!r} (the compiled official code's "
                             "arithmetic) is not implemented in the Triton kernels; use the reference, "
                             "lpfail.attention.attention, for PAPER_BF16_COMPILED")
    if runtime.interpreted() and policy.matmul != "fp32":
        raise ValueError(f"kernels: Precision.matmul={policy.matmul!r} under TRITON_INTERPRET=1: the CPU "
                         "interpreter's bf16/fp16 arithmetic is broken; use matmul='fp32' there")
    for knob in ("qk_out", "scores", "exp_in"):
        if policy.sub == "fma" and getattr(policy, knob, "fp32") != "fp32":
            raise ValueError(f"kernels: Precision.{knob}={getattr(policy, knob)!r} with sub='fma': the fused "
                             "multiply-add forms S − m from the raw FP32 QKᵀ, so nothing may round before it")
    bk = policy.block_k
    if bk is not None and bk <= 128:
        if bk & (bk - 1) or bk < 16:
            raise ValueError(f"kernels: Precision.block_k={bk} must be a power of two in [16, 128] "
                             f"(one hardware tile) or a multiple of {CHUNK} (two-pass emulation)")
        block_n, key_block, two_pass = bk, bk, False
    else:
        if bk is not None and bk % CHUNK:
            raise ValueError(f"kernels: Precision.block_k={bk} must be a multiple of {CHUNK} above 128")
        block_n, key_block, two_pass = CHUNK, (bk or 0), True
    fix = policy.fix
    g = lambda knob: getattr(policy, knob, "fp32")  # noqa: E731  (knobs a policy may not have yet)
    if g("grad_acc") != "fp32":
        # dQ is rounded once per key block, dK and dV once per query block: the backward chains the hardware
        # tiles of one policy block in FP32, so the block must be whole tiles for any config the autotuner
        # may pick (tiles chosen per policy would need the block in the autotune key, and the interpreter
        # never prunes its one config). An FP32 grad_acc rounds nothing between tiles: any block works.
        for knob in ("block_q", "block_k"):
            b = getattr(policy, knob)
            if b is not None and b % _bwd.GRAD_TILE:
                raise ValueError(f"kernels: Precision.{knob}={b} with grad_acc={policy.grad_acc!r}: the backward "
                                 f"rounds the gradients once per policy tile, which must be a multiple of "
                                 f"{_bwd.GRAD_TILE} (whole hardware tiles) or None; grad_acc='fp32' takes any")
    pv_dt, ds_dt = wider(policy.pbar, policy.matmul), wider(g("ds"), policy.matmul)
    return KernelPolicy(
        matmul=TL[policy.matmul], qk_out=TL[g("qk_out")], scores=TL[policy.scores], exp_in=TL[g("exp_in")],
        pbar=TL[policy.pbar], pv_dt=TL[pv_dt], pv_out=TL[policy.pv_out], acc=TL[policy.acc],
        out_dtype=policy.dtype("out"), dp=TL[g("dp")], ds=TL[g("ds")], ds_dt=TL[ds_dt],
        grad_acc=TL[g("grad_acc")], delta_prod=g("delta_prod"), sub_fma=policy.sub == "fma",
        beta=float(fix.beta) if fix else 2.0, eps=float(fix.eps) if fix else 0.0,
        clamp=policy.l_clamp is not None, l_clamp=float(policy.l_clamp or 0.0), delta=policy.delta,
        block_n=block_n, key_block=key_block, query_block=policy.block_q or 0, two_pass=two_pass,
        dot_prec=_prec(policy.matmul), pv_prec=_prec(pv_dt), ds_prec=_prec(ds_dt),
        fix_mode=0 if fix is None else 2 if isinstance(fix, BoundedMax) else 1,
        shift_lo=float(fix.shift_min) if isinstance(fix, BoundedMax) else 0.0,
        shift_hi=float(fix.shift_max) if isinstance(fix, BoundedMax) else 0.0,
        l_pbar=getattr(policy, "l_from", "p") == "pbar")


def shift_args(kp: KernelPolicy, unit: float) -> tuple[float, float, float]:
    """The robust fix's runtime scalars (SHIFT_LO, SHIFT_HI, SHIFT_SAFE) in the kernel's score units (α in RAW
    mode, a power of two, so the division is exact); unused placeholders for the other modes."""
    if kp.fix_mode != 2:
        return 0.0, 2.0, 0.0
    return kp.shift_lo / unit, kp.shift_hi / unit, SAFE_SHIFT / unit


@functools.lru_cache(maxsize=256)
def policy_for_launch(policy: Precision) -> KernelPolicy:
    """`kernel_policy`, memoised: a launch must not pay to re-check and translate the policy every call
    (Python overhead adds straight to a short kernel's time). Refusals raise anew each time (not cached)."""
    return kernel_policy(policy)
