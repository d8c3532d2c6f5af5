"""The calls a user makes. `flash_attention`, the drop-in for ``F.scaled_dot_product_attention`` (SDPA's calling
convention and defaults) or a call with a `Precision`, with its argument checks and the errors that name what is
supported or the reference call that computes the same; `policy_for`, the SDPA-style call's policy; `deterministic`,
the tuning a call runs under ``torch.use_deterministic_algorithms``; and `probe_pbar`, one key block's P̄ as the
forward kernel forms it."""
from __future__ import annotations

import dataclasses
import math

import torch

from lpfail.attention import resolve_scale
from lpfail.precision import FA2_BF16, Precision

from . import runtime
from .autograd import FlashAttention
from .launcher import launch_forward
from .policy import (HEAD_DIMS, REFERENCE, KernelPolicy, head_tile, kernel_policy, policy_for_launch,
                     require_precision, shift_args)
from .runtime import TL
from .tuning import DEFAULT_TUNING, Tuning

if runtime.IMPORT_ERROR is None:
    import triton

    from . import fwd as _fwd


def deterministic(tuning: Tuning) -> Tuning:
    """The tuning a call runs: under ``torch.use_deterministic_algorithms(True)`` the atomic backward, whose dQ
    varies in its last FP32 bits from run to run, gives way to the fused backward (the same tiles without atomics,
    bit for bit run to run), so a user's deterministic training stays deterministic; any other tuning as given."""
    if tuning.bwd in ("atomic", "dq_atomic") and torch.are_deterministic_algorithms_enabled():
        return dataclasses.replace(tuning, bwd="fused")
    return tuning


def _check_tuning(tuning, kp: KernelPolicy) -> None:
    if not isinstance(tuning, Tuning):
        raise TypeError(f"tuning must be a lpfail.kernels.Tuning (got {type(tuning).__name__})")
    if tuning.bwd == "atomic" and kp.grad_acc != TL["fp32"]:
        raise ValueError("kernels: Tuning(bwd='atomic') adds dQ with FP32 atomics, so it needs Precision.grad_acc="
                         "'fp32'; a 16-bit grad_acc rounds dQ once per policy key block, which only the split "
                         "backward (Tuning(bwd='split'), the default) can do")


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


def _reference_call(call) -> str:
    """The reference call that computes what a `flash_attention` call computes, for the errors that send the user
    there. `call`: None (any policy), or (sdpa_style, fix, causal, scale, enable_gqa) of the call."""
    if call is None:
        return REFERENCE
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
    if runtime.IMPORT_ERROR is not None:
        raise RuntimeError(f"lpfail.flash_attention needs Triton, which failed to import ({runtime.IMPORT_ERROR}); "
                           f"the pure-PyTorch reference computes the same: {_reference_call(call)}")
    if q.device.type != "cuda" and not runtime.interpreted():
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


#: (dtype, fix name) → (policy, its string) of the SDPA-style call, built once (see `flash_attention`)
SDPA_POLICIES = {(dt, fx): (policy_for(dt, fx), str(policy_for(dt, fx)))
                 for dt in (torch.bfloat16, torch.float16, torch.float32) for fx in (None, *_FIXES)}

_SUPPORTED = ("what the kernels support: attn_mask=None with is_causal=False (full attention) or is_causal=True (the "
              "causal mask, bottom-right = top-left for these self-attention shapes), dropout_p=0, any scale, "
              "enable_gqa=True with a number of query heads that is a multiple of the key/value heads")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, policy: Precision | None = None, *,
                    causal: bool | None = None, scale: float | None = None, attn_mask=None,
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

    Only q, k, v and the policy may be positional: ``causal``, ``scale`` and SDPA's keywords are keyword-only, so
    a call written in SDPA's positional order (``flash_attention(q, k, v, None, 0.0, True)``) is a TypeError
    rather than read as other arguments.

    ``tuning`` (both styles): a `Tuning` (how the kernels are scheduled, never what they compute), default
    `DEFAULT_TUNING` (a deterministic backward); under ``torch.use_deterministic_algorithms(True)`` an atomic
    backward is replaced by the fused one (`deterministic`). Returns O in the policy's `out` dtype (the inputs' dtype in the SDPA style); differentiable
    (Triton backward). The SDPA style runs as the custom op ``torch.ops.lpfail.flash_attention_fwd`` (with its
    backward registered) whenever it is traced (torch.compile, export, a dispatch mode), so ``torch.compile``
    keeps it in one graph; called eagerly on plain tensors, both styles run the same kernels with the same
    arguments without the op's dispatch (less host time): an `autograd.Function` where an input needs a
    gradient, else the forward alone. Raises RuntimeError without a CUDA GPU (see `lpfail.kernels`' docstring),
    ValueError for a mask, dropout, a head count, dtype, head dim, shape or policy the kernels cannot honour.
    """
    if attn_mask is not None:
        raise ValueError(f"lpfail.flash_attention takes no attn_mask (got a {type(attn_mask).__name__}"
                         f"{' of ' + str(attn_mask.dtype) if isinstance(attn_mask, torch.Tensor) else ''}); "
                         f"{_SUPPORTED}. For another mask use torch.nn.functional.scaled_dot_product_attention")
    if scale is not None:
        scale = resolve_scale(scale, None)   # a float, or a ValueError naming the argument
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
        require_precision(policy)  # before the memo, which would only say "unhashable" of a non-policy
    kp = policy_for_launch(policy)  # validate before anything is launched (memoised)
    tuning = DEFAULT_TUNING if tuning is None else tuning
    _check_tuning(tuning, kp)
    tuning = deterministic(tuning)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
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
    scale = 1.0 / math.sqrt(D) if scale is None else resolve_scale(scale, D)
    q, k = q.contiguous(), k.contiguous()
    p = torch.full((M, N), float("nan"), device=q.device, dtype=torch.float32)
    extra = {} if runtime.interpreted() else {"enable_fp_fusion": kp.sub_fma}
    block_n = max(16, triton.next_power_of_2(N))
    width, d_valid = head_tile(D)
    _fwd._probe_pbar[(1,)](q, k, p, q.stride(0), k.stride(0), p.stride(0), M, N, scale, kp.eps, kp.beta,
                          *shift_args(kp, 1.0),
                          HEAD_DIM=width, D_VALID=d_valid, BLOCK_M=64, BLOCK_N=block_n, MATMUL=kp.matmul,
                          QK_OUT=kp.qk_out,
                          SCORES=kp.scores, EXP_IN=kp.exp_in, PBAR=kp.pbar, ACC=kp.acc, SUB_FMA=kp.sub_fma, FIX=kp.fix_mode, DOT_PREC=kp.dot_prec,
                          **extra)
    return p
