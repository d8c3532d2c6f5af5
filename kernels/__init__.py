"""Triton flash attention that takes the same `Precision` policy as the pure-PyTorch reference.

Explained in chapter 5 ("Fix"). ``flash_attention(q, k, v, is_causal=False, scale=None, fix="robust")`` is a
drop-in for ``F.scaled_dot_product_attention`` (a ``torch.library`` custom op, SDPA's defaults), and
``flash_attention(q, k, v, policy, causal=True)`` runs any `Precision` the kernels support, for
(batch, heads, seq, head_dim) tensors, head_dim a multiple of 16 up to 128 (`HEAD_DIMS`): a Triton forward
(`kernels/fwd.py`), a Triton backward (`kernels/bwd.py`) and the `autograd.Function` here that joins them. The
policy's knobs are compile-time constants of the kernels, so one source compiles every precision variant:

* ``pbar``      P̄ rounded to BF16 (FP16) or kept in FP32 before the P̄V dot;
* ``acc``, ``pv_out``, ``scores``  FP32, or rounded to BF16 (FP16) after every key block — the paper's code;
* ``fix``       the paper's dynamic maximum (Algorithm 3, β and ε) in the forward, or the robust fix
  (`lpfail.precision.BoundedMax`: Algorithm 3's shift folded into a bounded range, finite at every logit);
* ``delta``     the δ source of the backward: ``"dO.O"``, ``"dO.O_hp"`` (O recomputed in FP32), ``"dP.P"``;
* ``sub``       ``"sub"`` (scale, round, subtract: a tied maximum gives P̄ = 1 exactly) or ``"fma"``;
* ``block_k``   the key block in which the fix and the roundings act: one hardware tile when ≤ 128, else
  walked in 64-key chunks with two passes per block (the paper's 512, or ``None`` for one tile per row);
* ``l_clamp``   the row-sum clamp of the paper's official code;
* ``l_from``    ℓ summed from the FP32 P (as FlashAttention-2) or from P̄ as rounded for P̄V (PR #2721).

How they run is a separate object, `Tuning` (TMA descriptors, the autotune space, the causal grid order, the split,
atomic or fused backward, the tie test's form, the FTZ exp), which never changes what is computed beyond the last FP32 bits
of the backward's sums: ``flash_attention(..., tuning=Tuning(...))``; `DEFAULT_TUNING` (= `NEXT_LEVERS`) unless given.

``exp`` must be FP32, nothing may be FP64 and ``rounding`` must be ``"rne"`` (stochastic rounding lives in the
reference only), and no knob may name a K-bit format of the precision dial ("bf16m1" … "bf16m6") or give V a
format of its own (``v``): such policies raise ``ValueError`` naming the knob. The kernels need a CUDA GPU; with
``TRITON_INTERPRET=1`` set before this package is imported they run in Triton's CPU interpreter, which is slow and
whose BF16 arithmetic is broken, so only ``matmul="fp32"`` policies are accepted there (rounding cast points to
BF16 still work: they are conversions). Without either, ``flash_attention`` raises ``RuntimeError`` naming the
call of the pure-PyTorch reference, ``lpfail.attention.attention(q, k, v, policy, causal=..., scale=...)``, that
computes the same (for the SDPA style, with ``policy_for(q.dtype, fix)`` as the policy and ``causal=is_causal``).
"""
from __future__ import annotations

if __name__ != "lpfail.kernels":
    # This folder imported under another name: a checkout's root on sys.path makes it importable as a top-level
    # `kernels`, which probes look for (transformers' check for Hugging Face's package of that name imports it).
    # The import then returns lpfail.kernels itself (one copy of the kernels and of their registered ops; no
    # __version__, so such a probe finds no usable `kernels`); the rest of this file runs once more in a namespace
    # that is then dropped, registering nothing (the ops exist by then). The repository's code imports lpfail.kernels.
    import importlib as _importlib
    import sys as _sys

    _sys.modules[__name__] = _importlib.import_module("lpfail.kernels")

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, fields

import torch

from lpfail.precision import _ACC_FIELDS, DIAL, FA2_BF16, SAFE_SHIFT, BoundedMax, Precision

try:
    import triton
    import triton.language as tl

    from . import bwd as _bwd
    from . import fwd as _fwd
    _IMPORT_ERROR: Exception | None = None
except ImportError as e:  # pragma: no cover - triton is in requirements.txt
    _IMPORT_ERROR = e

__all__ = ["flash_attention", "FlashAttention", "KernelPolicy", "kernel_policy", "available", "probe_pbar",
           "policy_for", "Tuning", "DEFAULT_TUNING", "ALL_LEVERS", "HEAD_DIMS", "deterministic"]

#: The Triton dtypes the kernels' constexprs name: "bf16", "fp16", "fp32" (empty without Triton).
TL = {}
if _IMPORT_ERROR is None:
    TL = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}
CHUNK = 64  # key chunk of the two-pass emulation path
#: The head dims the kernels take: the multiples of 16 up to 128. A tile's width along the head dim is a power of
#: two, so 48, 80, 96 and 112 run in the next power of two's tile with the padding read as 0 and never written
#: (`fwd._attn_fwd_kernel`'s D_VALID), without TMA; the others fill their tile exactly.
HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128)


def _head_tile(d: int) -> tuple[int, int]:
    """(HEAD_DIM, D_VALID), the kernels' constexprs for head dim `d`: the tile's width (the next power of two) and
    `d` itself where the tile is wider (else 0)."""
    width = 1 << (d - 1).bit_length()
    return width, (0 if width == d else d)
_DTYPE_KNOBS = tuple(k for k in ("matmul", "qk_out", "scores", "exp_in", "pbar", "pv_out", "acc", "out", "dp",
                                 "delta_prod", "ds", "grad_acc") if k in {f.name for f in fields(Precision)})


def interpreted() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _IMPORT_ERROR is None and _fwd.INTERPRET


def available(device: torch.device | str | None = None) -> bool:
    """Whether `flash_attention` can run on tensors of `device` (CUDA, or CPU under the interpreter)."""
    if _IMPORT_ERROR is not None:
        return False
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cpu":
        return interpreted()
    return torch.cuda.is_available() or interpreted()


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

    def __hash__(self):  # the dataclass's hash, computed once (it keys every launch's caches)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):  # a pickle must not carry this process's string hashes
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class Tuning:
    """How the kernels are scheduled and tuned, never what they compute (speed levers, measured side by side by
    ``tools/gpu_kernels_tune.py``). Every lever keeps O and L bit for bit, except where said:

    * ``tma``      read Q, K, V (and dO in the backward) and write O through Hopper tensor descriptors
                   (`tl.make_tensor_descriptor`: the tensor memory accelerator copies whole tiles) instead of
                   pointer tiles and cp.async; tensors that are not 16-byte aligned run without it. ``"bwd"``: in
                   the backward only (measured: TMA sped up the d 64 backward by 5–10 % and slowed the d 64
                   forward at N ≤ 2k by 12–18 %; notes/kernels.md).
    * ``space``    the autotune space: ``"v1"`` (6 forward, 3 + 3 backward configs: the first space, and ``Tuning()``'s)
                   or ``"sm90"`` (v1 plus deeper pipelines, 256-row forward tiles at head dim ≤ 64 and configs
                   capped at 128 registers per thread; `fwd.FWD_SPACES`, `bwd.DKDV_SPACES` of this package).
                   The backward's FP32 sums follow its tiles: gradients change in their last bits with the pick.
    * ``order``    the causal grid order: ``"head"`` (the longest query blocks first within each (batch, head))
                   or ``"lpt"`` (longest first over all heads, in the forward and both backward kernels).
    * ``bwd``      ``"split"``: a dK/dV kernel and a dQ kernel, no atomics (7 matmuls per tile pair,
                   deterministic); ``"atomic"``: one kernel adds dQ into an FP32 buffer with atomics (5 matmuls,
                   FlashAttention-2's way; dQ's last FP32 bits vary run to run). Needs ``grad_acc="fp32"``;
                   ``"fused"``: the split backward's two halves in one launch, no atomics — program j makes dK_j,
                   dV_j and then dQ_j, which under the causal mask gives every program the same work (n + 1
                   blocks); the bits of the split backward with the same tiles (deterministic, any grad_acc);
                   ``"dq_atomic"``: the five-matmul backward (`bwd.launch_dq_atomic`): dQ's partials added into
                   an FP32 buffer by TMA reduce-add where descriptors are on (``tma``), else pointer atomics, and
                   an epilogue kernel; not deterministic, so it gives way to ``"fused"`` under
                   `deterministic` and for a 16-bit grad_acc (which it cannot round as the policy says).
    * ``tie``      the fix's tie test: ``"max2"`` (a (max, second max) reduction) or ``"count"`` (a count of the
                   scores at or above r_m − ε after the max, no second running value); same m' bit for bit;
                   ``"auto"``: count at head dim ≤ 64, max2 above (the cheaper form for each as measured on a GPU,
                   with both fixes). The two-pass emulation path (policy blocks > 128
                   keys) always uses max2.
    * ``ftz_exp``  the backward's P = exp(S − L) in sub mode through ex2.approx.ftz (the forward's and FMA mode's
                   exp already are): three instructions fewer per score; P below 2^−126 becomes 0.
    """

    tma: bool | str = False
    space: str = "v1"
    order: str = "head"
    bwd: str = "split"
    tie: str = "max2"
    ftz_exp: bool = False

    _CHOICES = {"space": ("v1", "sm90"), "order": ("head", "lpt"), "bwd": ("split", "atomic", "fused", "dq_atomic"),
                "tie": ("max2", "count", "auto")}

    def __hash__(self):  # computed once: a tuning keys every launch's caches
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):  # a pickle must not carry this process's string hashes
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __post_init__(self):
        for name, allowed in self._CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"Tuning.{name} must be one of {list(allowed)} (got {getattr(self, name)!r})")
        if not isinstance(self.tma, bool) and self.tma != "bwd":
            raise ValueError(f"Tuning.tma must be True, False or 'bwd' (got {self.tma!r})")
        if not isinstance(self.ftz_exp, bool):
            raise ValueError(f"Tuning.ftz_exp must be True or False (got {self.ftz_exp!r})")

    def __str__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name) != f.default]
        return ",".join(parts) or "default"

    @classmethod
    def parse(cls, text: str) -> "Tuning":
        """Inverse of ``str(tuning)`` ("default", or "tma=True,space=sm90,…"); unknown keys raise ValueError."""
        if text.strip() in ("", "default"):
            return cls()
        kw, names = {}, [f.name for f in fields(cls)]
        for item in text.split(","):
            key, _, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if key not in names:
                raise ValueError(f"unknown Tuning key {key!r} in {text!r}; valid keys: {names}")
            kw[key] = {"True": True, "False": False}.get(value, value) if key in ("tma", "ftz_exp") else value
        return cls(**kw)


#: Every lever on (measured lever by lever: the LPT order and the atomic backward lost; notes/kernels.md).
ALL_LEVERS = Tuning(tma=True, space="sm90", order="lpt", bwd="atomic", tie="count", ftz_exp=True)
#: The levers that did not lose in ALL_LEVERS's measurement (TMA in the backward only, the sm90 space, the FTZ exp)
#: and the ones added after it (the fused backward, the tie test's form chosen per head dim); not the LPT order or
#: the atomic backward, which lost (notes/kernels.md).
NEXT_LEVERS = Tuning(tma="bwd", space="sm90", bwd="fused", tie="auto", ftz_exp=True)
#: What every call runs unless it passes ``tuning=``: NEXT_LEVERS (in the subtract form, the drop-in's arithmetic,
#: it ran fwd+bwd 16–27 % faster than ``Tuning()`` at N ≥ 2k in both tuning measurements; notes/kernels.md).
#: ``Tuning()`` (every lever off) is the kernels as first written, before any lever; ``str(tuning)``
#: and `Tuning.parse` name fields against ``Tuning()``, so "default" is that, not DEFAULT_TUNING.
DEFAULT_TUNING = NEXT_LEVERS
_DEFAULT_TEXT = str(DEFAULT_TUNING)


def deterministic(tuning: Tuning) -> Tuning:
    """The tuning a call runs: under ``torch.use_deterministic_algorithms(True)`` the atomic backward, whose dQ
    varies in its last FP32 bits from run to run, gives way to the fused backward (the same tiles without atomics,
    bit for bit run to run), so a user's deterministic training stays deterministic; any other tuning as given."""
    if tuning.bwd in ("atomic", "dq_atomic") and torch.are_deterministic_algorithms_enabled():
        return dataclasses.replace(tuning, bwd="fused")
    return tuning


def _check_tuning(tuning, kp: "KernelPolicy") -> None:
    if not isinstance(tuning, Tuning):
        raise TypeError(f"tuning must be a lpfail.kernels.Tuning (got {type(tuning).__name__})")
    if tuning.bwd == "atomic" and kp.grad_acc != tl.float32:
        raise ValueError("kernels: Tuning(bwd='atomic') adds dQ with FP32 atomics, so it needs Precision.grad_acc="
                         "'fp32'; a 16-bit grad_acc rounds dQ once per policy key block, which only the split "
                         "backward (Tuning(bwd='split'), the default) can do")


def _wider(a: str, b: str) -> str:
    return "fp32" if "fp32" in (a, b) else a


def _prec(dt: str) -> str:
    return "ieee" if dt == "fp32" else "tf32"  # FP32 dots are true FP32 (the policy says so); 16-bit ignore it


def _require_precision(policy) -> None:
    if not isinstance(policy, Precision):
        raise TypeError(f"policy must be a lpfail.precision.Precision (got {type(policy).__name__})")


def kernel_policy(policy: Precision) -> KernelPolicy:
    """Check that the kernels can honour `policy` and translate it; ValueError names the knob that can't."""
    _require_precision(policy)
    for knob in (*_DTYPE_KNOBS, *_ACC_FIELDS, "masked_carry", "v"):
        value = getattr(policy, knob, None)
        if value in DIAL:
            raise ValueError(f"kernels: Precision.{knob}={value!r} is a K-bit format of the precision dial (bf16's "
                             f"exponent with {DIAL[value]} fraction bits), which the Triton kernels do not round "
                             f"to; run it with the reference, {_REFERENCE}")
    if getattr(policy, "v", None) is not None:
        raise ValueError(f"kernels: Precision.v={policy.v!r} (V rounded to a format of its own where it enters "
                         "attention) is not implemented in the Triton kernels; run it with the reference, "
                         f"{_REFERENCE}")
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
                         f"the reference, {_REFERENCE}")
    if getattr(policy, "delta", "dO.O") not in ("dO.O", "dO.O_hp", "dP.P"):
        raise ValueError(f"kernels: Precision.delta={policy.delta!r} is not implemented in the Triton kernels; "
                         f"run it with the reference, {_REFERENCE}")
    if getattr(policy, "ds_rowsum", False):
        raise ValueError("kernels: Precision.ds_rowsum=True (the dS row-sum correction) is not implemented in the "
                         f"Triton kernels; run it with the reference, {_REFERENCE}")
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
    if interpreted() and policy.matmul != "fp32":
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
    pv_dt, ds_dt = _wider(policy.pbar, policy.matmul), _wider(g("ds"), policy.matmul)
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


#: The pure-PyTorch reference that runs every policy (for the refusals of `kernel_policy`).
_REFERENCE = "lpfail.attention.attention(q, k, v, policy, causal=...)"


def _reference_call(call) -> str:
    """The reference call that computes what a `flash_attention` call computes, for the errors that send the user
    there. `call`: None (any policy), or (sdpa_style, fix, causal, scale, enable_gqa) of the call."""
    if call is None:
        return _REFERENCE
    sdpa_style, fix, causal, scale, gqa = call
    policy = f"lpfail.kernels.policy_for(q.dtype, {fix!r})" if sdpa_style else "policy"
    text = f"lpfail.attention.attention(q, k, v, {policy}, causal={bool(causal)}, scale={scale!r})"
    if gqa:
        text += (" with k and v repeated to q's heads first (k.repeat_interleave(q.shape[1] // k.shape[1], dim=1), "
                 "and v likewise)")
    return text


def check_inputs(q, k, v, call=None):
    """Refuse what the kernels cannot run. `call` (see `_reference_call`) words the reference call that the
    errors for a missing Triton or GPU offer instead."""
    if _IMPORT_ERROR is not None:
        raise RuntimeError(f"lpfail.flash_attention needs Triton, which failed to import ({_IMPORT_ERROR}); "
                           f"the pure-PyTorch reference computes the same: {_reference_call(call)}")
    if q.device.type != "cuda" and not interpreted():
        raise RuntimeError(
            f"lpfail.flash_attention needs a CUDA GPU (got tensors on {q.device}). It is Triton code with no "
            f"CPU path; on this machine the pure-PyTorch reference computes the same: {_reference_call(call)}. "
            "Or set TRITON_INTERPRET=1 before lpfail.kernels is imported, to run Triton's (slow, FP32-only) CPU "
            "interpreter")
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have one shape (self-attention); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head_dim must be a multiple of 16 up to 128, one of {', '.join(map(str, HEAD_DIMS))} "
                         f"(got {q.shape[-1]}); the reference, lpfail.attention.attention, takes any")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"q, k, v must share one dtype among bf16, fp16, fp32 (got {q.dtype}, {k.dtype}, "
                         f"{v.dtype})")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")


def _raw_units(kp: KernelPolicy, scale: float) -> bool:
    """Sub mode with α a power of two (head dims 16 and 64 at the default α): the forward keeps scores in
    units of α, one multiply fewer per score, with bit-identical results (see `lpfail.kernels.fwd._attn_fwd`)."""
    return not kp.sub_fma and math.frexp(scale)[0] == 0.5


def _shift_args(kp: KernelPolicy, unit: float) -> tuple[float, float, float]:
    """The robust fix's runtime scalars (SHIFT_LO, SHIFT_HI, SHIFT_SAFE) in the kernel's score units (α in RAW
    mode, a power of two, so the division is exact); unused placeholders for the other modes."""
    if kp.fix_mode != 2:
        return 0.0, 2.0, 0.0
    return kp.shift_lo / unit, kp.shift_hi / unit, SAFE_SHIFT / unit


PICKS: dict = {}
DIRECT: dict = {}
#: "0" turns the direct launch of a compiled kernel off (on by default). It calls Triton 3.6's launcher with that
#: version's argument layout, which no CPU test can run; measured on an NVIDIA H200 (torch 2.11, triton 3.6,
#: results/kernels_gpu/overhead.json), it gave the same O, dQ, dK, dV bit for bit as the JIT path and cut the
#: drop-in's host time per forward from 100 to 40 µs. Another Triton's binder layout turns it off by itself.
DIRECT_ENV = "LPFAIL_KERNELS_DIRECT"


def launch(kernel, grid, key, args, consts, stream=None):
    """Launch an autotuned kernel (or a plain JIT one) on `args` with the constexpr keywords `consts`. Once the
    autotuner has picked a config for `key`, launch that config directly: Triton's autotuner rebuilds its own key
    from every argument on each call, ≈ 25 µs of Python per launch, which adds straight to a short kernel's time.
    `key` holds the shape, the input dtype and every constexpr (the whole KernelPolicy and Tuning), so it is at
    least as fine as the autotuner's key.

    From the third launch on (CUDA, triton's own launcher, LPFAIL_KERNELS_DIRECT not "0"), the compiled kernel that
    Triton's JIT returned is called directly with the same arguments (see `_direct_entry`), skipping the JIT's
    argument binding and cache key (≈ 18 µs of Python per launch on the CPU measured in notes/fix.md), on
    `stream` (the current stream when None). `key` must then also fix every
    integer argument's value (the callers put the batch and head counts and the strides in it) and the tensors'
    16-byte alignment, which Triton specialises on."""
    d = DIRECT.get((kernel, key))
    if d is not None:
        compiled, tail, meta, drv, hooks = d
        g = grid(meta) if callable(grid) else grid
        if stream is None:
            stream = drv.get_current_stream(drv.get_current_device())
        enter = hooks.launch_enter_hook
        md = compiled.launch_metadata(g, stream, *args, *tail) if enter is not None else None
        compiled.run(g[0], g[1], 1, stream, compiled.function, compiled.packed_metadata, md, enter,
                     hooks.launch_exit_hook, *args, *tail)
        return compiled
    tuned = hasattr(kernel, "configs")  # an autotuner, not a plain JIT function
    cfg = PICKS.get((kernel, key), PICKS)   # (PICKS itself: no launch yet)
    if cfg is PICKS or (not tuned and _fwd.INTERPRET):
        out = kernel[grid](*args, **consts)
        PICKS[(kernel, key)] = kernel.best_config if tuned else None
        return out
    meta = cfg.all_kwargs() if tuned else {}
    jit = kernel.fn if tuned else kernel
    out = jit.run(*args, grid=grid, warmup=False, **consts, **meta)
    entry = _direct_entry(jit, out, args, {**consts, **meta}, key)
    if entry is not None:
        DIRECT[(kernel, key)] = entry[:2] + (meta,) + entry[2:]    # (compiled, tail, meta, driver, hooks)
    return out


def _current_stream():
    """The current CUDA stream's handle, as Triton's launcher takes it (one lookup per backward, not per launch)."""
    from triton.runtime import driver

    drv = driver.active
    return drv.get_current_stream(drv.get_current_device())


def _direct_entry(jit, compiled, args, kwargs, key):
    """What `launch` needs to call `compiled` (the kernel `jit.run` just launched) without the JIT: the
    constexpr values in signature order after the positional `args`, checked against Triton's own binder
    (its bound arguments, in the launcher's order, must be `args` then those values). None where the direct
    call is not possible or not wanted: the interpreter, a hook on the JIT, LPFAIL_KERNELS_DIRECT=0, a
    misaligned tensor, or a binding whose layout this code does not know (another Triton version's)."""
    if _fwd.INTERPRET or not hasattr(compiled, "packed_metadata") or os.environ.get(DIRECT_ENV, "1") == "0":
        return None
    if any(isinstance(a, torch.Tensor) and a.data_ptr() % 16 for a in args):
        return None
    try:
        from triton import knobs
        from triton.runtime import driver
        drv = driver.active
        if jit.pre_run_hooks or knobs.runtime.debug:
            return None
        binder = jit.device_caches[drv.get_current_device()][4]
        bound = list(binder(*args, **kwargs)[0].values())
    except Exception:  # noqa: BLE001 - an internal layout other than triton 3.6's: keep the JIT path
        return None
    if len(bound) < len(args) or any(a is not b for a, b in zip(bound, args)):
        return None
    return compiled, tuple(bound[len(args):]), drv, knobs.runtime


_ENV_DATA = getattr(os.environ, "_data", None)   # CPython's os.environ store: a lookup without KeyError handling
_TUNE_KEY = b"LPFAIL_KERNELS_AUTOTUNE"            # fwd.TUNE_ENV, encoded as os.environ stores it on POSIX


def _tune_env():
    """LPFAIL_KERNELS_AUTOTUNE's value (part of the launch plans' keys: the prune step reads it when it tunes),
    read from os.environ's own store where it has one: ≈ 0.1 µs instead of ≈ 1 µs per call."""
    if _ENV_DATA is not None and os.name == "posix":
        value = _ENV_DATA.get(_TUNE_KEY)
        return None if value is None else value.decode()
    return os.environ.get(_fwd.TUNE_ENV)


def _device_index(t: torch.Tensor):
    """The current CUDA device (Triton launches there), or None off CUDA: part of the direct launch's key."""
    return torch.cuda.current_device() if t.is_cuda else None


def _tma_alloc(size: int, alignment: int, stream):
    """Global scratch for the kernels' device-side tensor descriptors (128 bytes per program)."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _ensure_tma_allocator() -> None:
    """Triton's allocator for descriptor scratch is a context variable: set it in every thread that launches (the
    autograd engine runs the backward in its own thread)."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is not _tma_alloc:
        triton.set_allocator(_tma_alloc)


def _grid(order: int):
    """The grid of a kernel whose blocks run along the sequence: (blocks, B·H), or (B·H, blocks) for ORDER 1."""
    if order:
        return lambda n, bh, block: (lambda meta: (bh, -(-n // meta[block])))
    return lambda n, bh, block: (lambda meta: (-(-n // meta[block]), bh))


_GRIDS = (_grid(0), _grid(1))


@functools.lru_cache(maxsize=1024)
def fwd_plan(N: int, D: int, causal: bool, kp: KernelPolicy, scale: float, dtype, tune, interp: bool,
             tuning: Tuning = DEFAULT_TUNING):
    """The forward launch's per-(shape, policy, tuning) constants: the key-block argument, the scalars after it and
    the constexpr keywords (computed once instead of on every call)."""
    raw = _raw_units(kp, scale)
    key_block = kp.key_block or triton.cdiv(N, kp.block_n) * kp.block_n
    scalars = (key_block, scale, kp.eps / scale if raw else kp.eps, kp.beta, kp.l_clamp,
               *_shift_args(kp, scale if raw else 1.0))
    width, d_valid = _head_tile(D)
    consts = dict(RAW=raw, HEAD_DIM=width, D_VALID=d_valid, BLOCK_N=kp.block_n, MATMUL=kp.matmul,
                  QK_OUT=kp.qk_out, SCORES=kp.scores, EXP_IN=kp.exp_in, PBAR=kp.pbar, PV_DT=kp.pv_dt,
                  PV_OUT=kp.pv_out, ACC=kp.acc, SUB_FMA=kp.sub_fma, FIX=kp.fix_mode, CLAMP=kp.clamp, CAUSAL=causal,
                  TWO_PASS=kp.two_pass, DOT_PREC=kp.dot_prec, PV_PREC=kp.pv_prec,
                  **_fwd_levers(kp, scale, causal, tuning, D))
    if not interp:
        consts["enable_fp_fusion"] = kp.sub_fma
    return (N, D, causal, kp, raw, dtype, tune, tuning), scalars, consts


def _fwd_levers(kp: KernelPolicy, scale: float, causal: bool, tuning: Tuning, head_dim: int = 64) -> dict:
    """The forward's tuning constexprs, each set only where it changes the code (so that variants that compute
    the same code share one compiled kernel): TIE and POW2 with the fix on the fast path, ORDER when causal.
    Tuning.tie "auto" counts at head dim ≤ 64 and keeps max2 above."""
    count = tuning.tie == "count" or (tuning.tie == "auto" and head_dim <= 64)
    tie = int(count and kp.fix_mode != 0 and not kp.two_pass)
    return dict(TMA=tuning.tma is True, ORDER=int(causal and tuning.order == "lpt"), TIE=tie,
                POW2=bool(tie and kp.sub_fma and math.frexp(scale)[0] == 0.5), L_PBAR=kp.l_pbar)


def _aligned(*tensors) -> bool:
    """All data pointers 16-byte aligned (Triton specialises on it; TMA descriptors need it)."""
    ptrs = 0
    for t in tensors:
        ptrs |= t.data_ptr()
    return not (ptrs & 15)


def launch_forward(q, k, v, kp: KernelPolicy, causal: bool, scale: float, tuning: Tuning = DEFAULT_TUNING):
    """Launch the forward kernel; returns O (in the policy's `out` dtype) and L = m + log ℓ (FP32). (The grids
    divide with -(-a // b), not triton.cdiv, which is a JIT function: ≈ 5 µs per call on the host.)"""
    B, H, N, D = q.shape
    o = torch.empty((B, H, N, D), device=q.device, dtype=kp.out_dtype)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    aligned = _aligned(q, k, v, o)                                      # Triton specialises on it
    if tuning.tma and (not aligned or D & (D - 1)):   # a descriptor needs 16-byte alignment; D_VALID, pointers
        tuning = dataclasses.replace(tuning, tma=False)
    key, scalars, consts = fwd_plan(N, D, causal, kp, scale, q.dtype, _tune_env(), _fwd.INTERPRET, tuning)
    if consts["TMA"] and not _fwd.INTERPRET:
        _ensure_tma_allocator()
    strides = (*q.stride(), *k.stride(), *v.stride())
    launch(_fwd._attn_fwd if tuning.space == "v1" else _fwd.FWD_TUNERS[tuning.space],
           _GRIDS[consts["ORDER"]](N, B * H, "BLOCK_M"),
           (key, B, H, strides, aligned, _device_index(q)),
           (q, k, v, o, lse, *strides, *o.stride(), H, N, *scalars), consts)
    return o, lse


def launch_backward(do, q, k, v, o, lse, kp: KernelPolicy, causal: bool, scale: float,
                    tuning: Tuning = DEFAULT_TUNING):
    """Launch the backward: δ (its own pass, or a pass over K, V for "dP.P" / "dO.O_hp"), then the split dK/dV
    and dQ kernels, or the atomic kernel (dK, dV and dQ in one; dQ summed in FP32 and cast after)."""
    if tuning.bwd == "dq_atomic":   # five matmuls (kernels/bwd.py), or the fused backward where it can't run
        if _bwd.dq_atomic_honours(kp):
            return _bwd.launch_dq_atomic(do, q, k, v, o, lse, kp, causal, scale, tuning)
        tuning = dataclasses.replace(tuning, bwd="fused")
    B, H, N, D = q.shape
    do = do.contiguous()
    aligned = _aligned(q, k, v, do, o, lse)
    if tuning.tma and (not aligned or D & (D - 1)):   # as in `launch_forward`
        tuning = dataclasses.replace(tuning, tma=False)
    key, consts, key_block, query_block = bwd_plan(N, D, causal, kp, scale, q.dtype, do.dtype, _tune_env(),
                                                   _fwd.INTERPRET, tuning)
    if tuning.tma and not _fwd.INTERPRET:
        _ensure_tma_allocator()
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    # Triton specialises on the integers' values (mod 16, = 1) and the tensors' 16-byte alignment
    key = (key, B, H, strides, o.stride(), aligned, _device_index(q))
    stream = _current_stream() if q.is_cuda else None
    grids, bh = _GRIDS[consts["kv"]["ORDER"]], B * H
    atomic = tuning.bwd == "atomic"
    # (the v1 space's kernels are read from the module at each call, so that tools/host_breakdown.py can stub them)
    dq_kernel = _bwd._bwd_dq if tuning.space == "v1" else _bwd.DQ_TUNERS[tuning.space]
    delta = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    dq = torch.empty(q.shape, device=q.device, dtype=torch.float32) if atomic else torch.empty_like(q)
    if kp.delta in ("dP.P", "dO.O_hp"):   # a pass over K, V per query block: δ from dP ∘ P or dO ∘ O_hp
        mode = 1 if kp.delta == "dP.P" else 2
        launch(dq_kernel, grids(N, bh, "BLOCK_M"), (key, mode), (q, k, v, do, lse, delta, q, *strides, H, N,
               key_block, scale), consts["dpp" if mode == 1 else "o_hp"], stream)
        if atomic:
            dq.zero_()
    else:
        wide = "fp32" if torch.float32 in (o.dtype, do.dtype) else kp.delta_prod
        launch(_bwd._bwd_delta_dot, (-(-N // 64), bh), (key, o.dtype, atomic),
               (o, do, delta, dq, *o.stride(), *do.stride(), H, N),
               dict(HEAD_DIM=consts["kv"]["HEAD_DIM"], D_VALID=consts["kv"]["D_VALID"], BLOCK_M=64,
                    PROD=TL[_wider(kp.delta_prod, wide)], ZERO_DQ=atomic), stream)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if tuning.bwd == "fused":
        launch(_bwd.FUSED_TUNERS[tuning.space], _GRIDS[0](N, bh, "BLOCK_N1"), key, (q, k, v, do, lse, delta, dq, dk, dv,
               *strides, H, N, query_block, key_block, scale), consts["fused"], stream)
        return dq, dk, dv
    args = (q, k, v, do, lse, delta, dk, dv, dq if atomic else dk, *strides, H, N, query_block, scale)
    kv_kernel = _bwd.DKDV_TUNERS[(tuning.space, atomic)] if tuning.space != "v1" or atomic else _bwd._bwd_dkdv
    launch(kv_kernel, grids(N, bh, "BLOCK_N"), key, args, consts["kv"], stream)
    if atomic:
        return dq.to(q.dtype), dk, dv
    launch(dq_kernel, grids(N, bh, "BLOCK_M"), (key, 0), (q, k, v, do, lse, delta, dq, *strides, H, N, key_block,
           scale), consts["dq"], stream)
    return dq, dk, dv


@functools.lru_cache(maxsize=1024)
def bwd_plan(N: int, D: int, causal: bool, kp: KernelPolicy, scale: float, dtype, do_dtype, tune, interp: bool,
             tuning: Tuning = DEFAULT_TUNING):
    """The backward launches' per-(shape, policy, tuning) constants (computed once instead of on every call)."""
    width, d_valid = _head_tile(D)
    common = dict(HEAD_DIM=width, D_VALID=d_valid, MATMUL=kp.matmul, QK_OUT=kp.qk_out, SCORES=kp.scores,
                  DP=kp.dp, DS=kp.ds, DS_DT=kp.ds_dt, GACC=kp.grad_acc, SUB_FMA=kp.sub_fma, CAUSAL=causal,
                  DOT_PREC=kp.dot_prec, DS_PREC=kp.ds_prec, RAW=_raw_units(kp, scale), TMA=bool(tuning.tma),
                  ORDER=int(causal and tuning.order == "lpt"), FTZ=bool(tuning.ftz_exp and not kp.sub_fma))
    if not interp:
        common["enable_fp_fusion"] = kp.sub_fma
    # the policy's blocks for the grad_acc roundings; one block over the sequence (0) is a boundary past its end
    whole = triton.cdiv(N, _bwd.GRAD_TILE) * _bwd.GRAD_TILE
    kv = {**common, "PBAR": kp.pbar, "PV_DT": kp.pv_dt, "PV_PREC": kp.pv_prec, "DQ_ATOMIC": tuning.bwd == "atomic"}
    consts = {"dq": {**common, "MODE": 0}, "dpp": {**common, "MODE": 1}, "o_hp": {**common, "MODE": 2}, "kv": kv}
    if tuning.bwd == "fused":   # one grid order (its programs all do the same work), no atomics
        consts["fused"] = {k: v for k, v in kv.items() if k not in ("ORDER", "DQ_ATOMIC")}
    return (N, D, causal, kp, dtype, do_dtype, tune, tuning), consts, kp.key_block or whole, kp.query_block or whole


@functools.lru_cache(maxsize=256)
def policy_for_launch(policy: Precision) -> KernelPolicy:
    """`kernel_policy`, memoised: a launch must not pay to re-check and translate the policy every call
    (Python overhead adds straight to a short kernel's time). Refusals raise anew each time (not cached)."""
    return kernel_policy(policy)


class FlashAttention(torch.autograd.Function):
    """O = softmax(α QKᵀ [+ causal mask]) V under a `Precision` policy, Triton forward and backward.
    ``FlashAttention.apply(q, k, v, policy, causal, scale[, tuning])``; `policy` may also be the KernelPolicy that
    `flash_attention` already translated it into. (The non-tensor arguments travel as one tuple: autograd's apply
    walks its arguments in Python, so fewer of them cost less host time per call.)"""

    @staticmethod
    def forward(ctx, q, k, v, *meta):
        policy, causal, scale, tuning = meta[0] if len(meta) == 1 else (*meta, DEFAULT_TUNING)[:4]
        kp = policy if isinstance(policy, KernelPolicy) else policy_for_launch(policy)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o, lse = launch_forward(q, k, v, kp, causal, scale, tuning)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.kp, ctx.causal, ctx.scale, ctx.tuning = kp, causal, scale, tuning
        ctx.n_meta = len(meta)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = launch_backward(do, q, k, v, o, lse, ctx.kp, ctx.causal, ctx.scale, ctx.tuning)
        return (dq, dk, dv) + (None,) * ctx.n_meta


_FIXES = ("robust", "alg3", "none")


def policy_for(dtype: torch.dtype, fix=None) -> Precision:
    """The policy the SDPA-style call runs for inputs of `dtype`: FlashAttention-2 arithmetic (FP32 scores, m, ℓ
    and accumulator; P̄, dS and the output in the inputs' dtype; FP32 inputs: everything FP32) plus `fix`:
    None / "none", "robust" (`BoundedMax()`), "alg3" (`DynamicMax()`), or a DynamicMax / BoundedMax."""
    from lpfail.precision import BoundedMax, DynamicMax

    if dtype == torch.bfloat16:
        base = FA2_BF16
    elif dtype == torch.float16:
        base = FA2_BF16.replace(matmul="fp16", pbar="fp16", out="fp16", ds="fp16")
    elif dtype == torch.float32:
        base = FA2_BF16.replace(matmul="fp32", pbar="fp32", out="fp32", ds="fp32")
    else:
        raise ValueError(f"lpfail.flash_attention takes bfloat16, float16 or float32 tensors (got {dtype})")
    if fix is None or fix == "none":
        return base
    if isinstance(fix, (DynamicMax, BoundedMax)):
        return base.replace(fix=fix)
    if fix == "robust":
        return base.replace(fix=BoundedMax())
    if fix == "alg3":
        return base.replace(fix=DynamicMax())
    raise ValueError(f"fix must be None, one of {_FIXES}, or a DynamicMax / BoundedMax (got {fix!r})")


# -- the drop-in as a PyTorch custom op: torch.compile traces through it (one opaque node, no graph break) ---------
@functools.lru_cache(maxsize=64)
def parse_policy(text: str) -> Precision:
    """`Precision.parse(text)`, memoised."""
    return Precision.parse(text)


def _ops_registered() -> bool:
    """True once lpfail's ops exist (a re-import of this package, as tests/kernel_env.py does to switch to the
    interpreter, re-runs this file in the same namespace: the registered ops then call the new functions)."""
    try:
        return hasattr(torch.ops.lpfail, "flash_attention_fwd")
    except (AttributeError, RuntimeError):
        return False


if not _ops_registered():
    @torch.library.custom_op("lpfail::flash_attention_fwd", mutates_args=())
    def _op_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: str, causal: bool,
                scale: float, tuning: str = _DEFAULT_TEXT) -> tuple[torch.Tensor, torch.Tensor]:
        """O and L = m + log ℓ (FP32) under the policy named by its string (`Precision.parse`)."""
        kp = policy_for_launch(parse_policy(policy))
        return launch_forward(q.contiguous(), k.contiguous(), v.contiguous(), kp, causal, scale, _parse_tuning(tuning))


    @_op_fwd.register_fake
    def _(q, k, v, policy, causal, scale, tuning=_DEFAULT_TEXT):
        out = parse_policy(policy).dtype("out")
        return q.new_empty(q.shape, dtype=out), q.new_empty(q.shape[:-1], dtype=torch.float32)


    @torch.library.custom_op("lpfail::flash_attention_bwd", mutates_args=())
    def _op_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                lse: torch.Tensor, policy: str, causal: bool, scale: float,
                tuning: str = _DEFAULT_TEXT) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kp = policy_for_launch(parse_policy(policy))
        return launch_backward(do, q.contiguous(), k.contiguous(), v.contiguous(), o, lse, kp, causal, scale,
                               _parse_tuning(tuning))


    @_op_bwd.register_fake
    def _(do, q, k, v, o, lse, policy, causal, scale, tuning=_DEFAULT_TEXT):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


    def _op_setup(ctx, inputs, output):
        q, k, v, policy, causal, scale, *tuning = inputs
        ctx.save_for_backward(q, k, v, output[0], output[1])
        ctx.policy, ctx.causal, ctx.scale, ctx.tuning = policy, causal, scale, (tuning or [_DEFAULT_TEXT])[0]


    def _op_backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _op_bwd(do.contiguous(), q, k, v, o, lse, ctx.policy, ctx.causal, ctx.scale, ctx.tuning)
        return dq, dk, dv, None, None, None, None


    _op_fwd.register_autograd(_op_backward, setup_context=_op_setup)


@functools.lru_cache(maxsize=64)
def _parse_tuning(text: str) -> Tuning:
    return Tuning.parse(text)


#: (dtype, fix name) → (policy, its string) of the SDPA-style call, built once (see `flash_attention`)
SDPA_POLICIES = {(dt, fx): (policy_for(dt, fx), str(policy_for(dt, fx)))
                 for dt in (torch.bfloat16, torch.float16, torch.float32) for fx in (None, *_FIXES)}

_SUPPORTED = ("what the kernels support: attn_mask=None with is_causal=False (full attention) or is_causal=True (the "
              "causal mask, bottom-right = top-left for these self-attention shapes), dropout_p=0, any scale, "
              "enable_gqa=True with a number of query heads that is a multiple of the key/value heads")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Precision | None = None,
                    causal: bool | None = None, scale: float | None = None, *, attn_mask=None,
                    dropout_p: float = 0.0, is_causal: bool | None = None, enable_gqa: bool = False,
                    fix=None, tuning: Tuning | None = None) -> torch.Tensor:
    """Attention of (batch, heads, seq, head_dim) tensors through the Triton kernels.

    Two ways to call it:

    * SDPA-style, the drop-in: ``flash_attention(q, k, v, is_causal=False, scale=None, enable_gqa=False,
      fix="robust")`` — the keywords of ``torch.nn.functional.scaled_dot_product_attention``, with SDPA's
      defaults (full attention unless ``is_causal=True``; ``scale`` 1/√head_dim), for the cases the kernels
      support: ``attn_mask=None`` (a mask, boolean or float, is a ValueError that names what is supported),
      ``dropout_p=0``, ``enable_gqa`` (key/value heads repeated for the query heads, as SDPA does); the policy
      chosen from the inputs' dtype by `policy_for` (FlashAttention-2 arithmetic), plus ``fix``: None (default:
      what SDPA computes), "robust" (the robust fix, `lpfail.precision.BoundedMax`) or "alg3" (the paper's
      Algorithm 3, no clamp).
    * With a policy: ``flash_attention(q, k, v, policy, causal=True, scale=None)`` — any `Precision` the
      kernels can honour (the book's variants); causal unless ``causal=False``, as `lpfail.attention.attention`.

    ``tuning`` (both styles): a `Tuning` (how the kernels are scheduled, never what they compute), default
    `DEFAULT_TUNING` (a deterministic backward); under ``torch.use_deterministic_algorithms(True)`` an atomic
    backward is replaced by the fused one (`deterministic`). Returns O in the policy's `out` dtype (the inputs' dtype in the SDPA style); differentiable
    (Triton backward). The SDPA style runs as the custom op ``torch.ops.lpfail.flash_attention_fwd`` (with its
    backward registered) whenever it is traced (torch.compile, export, a dispatch mode), so ``torch.compile``
    keeps it in one graph; called eagerly on plain tensors, both styles run the same kernels with the same
    arguments without the op's dispatch (less host time): an `autograd.Function` where an input needs a
    gradient, else the forward alone. Raises RuntimeError without a CUDA GPU (see the module docstring),
    ValueError for a mask, dropout, a head count, dtype, head dim, shape or policy the kernels cannot honour.
    """
    if attn_mask is not None:
        raise ValueError(f"lpfail.flash_attention takes no attn_mask (got a {type(attn_mask).__name__}"
                         f"{' of ' + str(attn_mask.dtype) if isinstance(attn_mask, torch.Tensor) else ''}); "
                         f"{_SUPPORTED}. For another mask use torch.nn.functional.scaled_dot_product_attention")
    if dropout_p != 0.0:
        raise ValueError(f"lpfail.flash_attention has no dropout (got dropout_p={dropout_p!r}); {_SUPPORTED}")
    if isinstance(policy, torch.Tensor):
        raise TypeError("the 4th positional argument of lpfail.flash_attention is a Precision policy, not SDPA's "
                        f"attn_mask; pass SDPA's arguments by keyword ({_SUPPORTED})")
    sdpa_style = policy is None
    if sdpa_style:
        if causal is not None and is_causal is not None and bool(causal) != bool(is_causal):
            raise ValueError(f"causal={causal!r} and is_causal={is_causal!r} disagree; pass one of them")
        causal = bool(is_causal if is_causal is not None else (causal or False))   # SDPA's default: full attention
        policy, policy_text = _sdpa_policy(q, fix)
    else:
        if fix is not None or is_causal is not None:
            raise ValueError("pass either a policy (with causal=) or the SDPA-style keywords (is_causal=, fix=), "
                             "not both: the policy already says whether there is a fix")
        causal = True if causal is None else causal
    k_in = k
    k, v = _expand_kv_heads(q, k, v, enable_gqa)
    check_inputs(q, k, v, (sdpa_style, fix, causal, scale, enable_gqa and k is not k_in))
    if not sdpa_style:  # (the SDPA style's policies are valid by construction; the op checks them again)
        _require_precision(policy)  # before the memo, which would only say "unhashable" of a non-policy
    kp = policy_for_launch(policy)  # validate before anything is launched (memoised)
    tuning = DEFAULT_TUNING if tuning is None else tuning
    _check_tuning(tuning, kp)
    tuning = deterministic(tuning)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if sdpa_style and not _eager(q, k, v):  # traced: through the custom op (torch.compile sees one node)
        # contiguous before the op: its setup then saves the contiguous tensors, and the backward does not copy
        # non-contiguous inputs (e.g. q, k, v split from a fused projection) a second time
        return torch.ops.lpfail.flash_attention_fwd(q.contiguous(), k.contiguous(), v.contiguous(), policy_text,
                                                    bool(causal), scale, str(tuning))[0]
    # eager (less host time): the same kernels with the same arguments, without the custom op's dispatch;
    # without autograd where no input needs a gradient
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttention.apply(q, k, v, (kp, bool(causal), scale, tuning))
    return launch_forward(q.contiguous(), k.contiguous(), v.contiguous(), kp, bool(causal), scale, tuning)[0]


def _sdpa_policy(q, fix):
    """(policy, its string) of the SDPA-style call for q's dtype and `fix`: a dict lookup for the named fixes."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor (got {type(q).__name__})")
    named = (q.dtype, fix) if fix is None or isinstance(fix, str) else None
    if named in SDPA_POLICIES:  # a dict lookup: nothing for torch.compile to trace through
        return SDPA_POLICIES[named]
    policy = policy_for(q.dtype, fix)
    return policy, str(policy)


def _expand_kv_heads(q, k, v, enable_gqa: bool):
    """SDPA's enable_gqa: k and v hold H_kv heads, H_q a multiple of it, and query head h reads key/value head
    h // (H_q / H_kv): k and v are repeated along the heads (their gradients sum back through the repeat).
    Without enable_gqa the head counts must agree (checked with the shapes)."""
    if not enable_gqa or not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return k, v
    hq, hk = q.shape[1], k.shape[1]
    if k.shape[1] != v.shape[1] or hq % hk:
        raise ValueError(f"enable_gqa=True needs k and v with one head count that divides q's (got q {hq}, k "
                         f"{k.shape[1]}, v {v.shape[1]} heads)")
    if hq == hk:
        return k, v
    return k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)


def _eager(q, k, v) -> bool:
    """True for plain tensors outside torch.compile / export tracing and outside any dispatch mode: then
    `flash_attention` may call the kernels directly, which is what the custom op's implementation does."""
    return (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor
            and not torch.compiler.is_compiling() and not torch._C._len_torch_dispatch_stack())


def probe_pbar(q: torch.Tensor, k: torch.Tensor, policy: Precision = FA2_BF16,
               scale: float | None = None) -> torch.Tensor:
    """P̄ = exp(S − m) of one key block, rounded to the policy's `pbar`, as the forward kernel forms it
    (same device functions, same compile flags). q: (M, D) with M ≤ 64, k: (N, D) with N ≤ 128, one head;
    m is the block's own maximum (with the fix when the policy has it). Returns (M, N) FP32."""
    check_inputs(k[None, None], k[None, None], k[None, None])
    if q.dim() != 2 or q.shape[1] != k.shape[1] or q.dtype != k.dtype or q.device != k.device:
        raise ValueError(f"probe_pbar takes q (M, D) and k (N, D) of one dtype and device (got {tuple(q.shape)} "
                         f"{q.dtype}, {tuple(k.shape)} {k.dtype})")
    kp = kernel_policy(policy)
    (M, D), N = q.shape, k.shape[0]
    if M > 64 or N > 128:
        raise ValueError(f"probe_pbar takes at most 64 query rows and 128 keys (got {M}, {N})")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    q, k = q.contiguous(), k.contiguous()
    p = torch.full((M, N), float("nan"), device=q.device, dtype=torch.float32)
    extra = {} if interpreted() else {"enable_fp_fusion": kp.sub_fma}
    block_n = max(16, triton.next_power_of_2(N))
    width, d_valid = _head_tile(D)
    _fwd._probe_pbar[(1,)](q, k, p, q.stride(0), k.stride(0), p.stride(0), M, N, scale, kp.eps, kp.beta,
                          *_shift_args(kp, 1.0),
                          HEAD_DIM=width, D_VALID=d_valid, BLOCK_M=64, BLOCK_N=block_n, MATMUL=kp.matmul,
                          QK_OUT=kp.qk_out,
                          SCORES=kp.scores, EXP_IN=kp.exp_in, PBAR=kp.pbar, ACC=kp.acc, SUB_FMA=kp.sub_fma, FIX=kp.fix_mode, DOT_PREC=kp.dot_prec,
                          **extra)
    return p
