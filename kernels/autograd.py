"""Where autograd joins the forward and backward launches: `FlashAttention`, the `autograd.Function` of eager calls,
and the custom ops ``torch.ops.lpfail.flash_attention_fwd`` / ``flash_attention_bwd`` with the backward registered,
which traced calls (torch.compile, export, a dispatch mode) go through."""
from __future__ import annotations

import functools

import torch

from lpfail.precision import Precision

from .launcher import launch_backward, launch_forward
from .policy import KernelPolicy, policy_for_launch
from .tuning import DEFAULT_TUNING, Tuning


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


# -- the drop-in as a PyTorch custom op: torch.compile traces through it (one opaque node, no graph break) ---------
@functools.lru_cache(maxsize=64)
def parse_policy(text: str) -> Precision:
    """`Precision.parse(text)`, memoised."""
    return Precision.parse(text)


_DEFAULT_TEXT = str(DEFAULT_TUNING)   # the ops' tuning argument when none is given


def _ops_registered() -> bool:
    """True once lpfail's ops exist (a reload of this module, as tests/kernel_env.py does to switch to the
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
