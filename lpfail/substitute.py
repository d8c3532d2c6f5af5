"""Run any model that calls ``F.scaled_dot_product_attention`` with the reference attention instead, under a
chosen `Precision`, in chosen layers and heads. Chapter 2's substitution, for a model whose code you did not
write (explained in chapter 7, "Diagnose your own model")::

    from lpfail.substitute import substitute
    from lpfail.precision import PAPER_BF16
    with substitute(model, PAPER_BF16, layers=[1], heads=[0, 6, 7]):
        loss = model(x, y)[1]            # layer 1 (its 2nd SDPA call in each forward), heads 0, 6, 7
        loss.backward()                  # the backward is the reference's (FlashAttention-2's Algorithm 2)

Layers are the positions of the SDPA calls within one forward of `model` (0-based, in call order), which
for a stack of blocks is the layer index. Heads are 0-based query heads. Everything else — the other calls,
the other heads of a substituted call — runs the model's own SDPA untouched. The reference
(`lpfail.attention.attention`) is called as lpfail's GPT calls it for a "reference" layer (autocast off,
``check_finite=False``), so on lpfail's GPT the substitution is bit for bit the model's own
``set_attention("reference", policy, layers, heads)`` (tested). Its output is returned in q's dtype.

What the reference cannot do is refused with an error rather than approximated: an ``attn_mask``, dropout,
and a causal call with different query and key lengths (SDPA aligns such a mask top-left, the reference
bottom-right). Grouped-query calls (fewer key/value heads) are expanded first. A requested layer index that
no forward reached, or a block in which no SDPA call happened, is an error at the end of the block.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from lpfail.attention import attention
from lpfail.precision import Precision
from lpfail.sdpa_hook import SDPACall, SDPAInterceptor

__all__ = ["substitute", "Substitution", "SubstitutionError"]


class SubstitutionError(RuntimeError):
    """The requested substitution cannot be carried out faithfully."""


@dataclass
class Substitution:
    """What happened inside a `substitute` block (yielded by it)."""

    policy: Precision
    layers: tuple[int, ...] | None
    heads: tuple[int, ...] | None
    calls: int = 0                 # SDPA calls seen
    substituted: int = 0           # of which ran the reference
    calls_per_forward: set = field(default_factory=set)  # distinct call counts per forward (normally one)


def _ids(which, what):
    if which is None:
        return None
    items = [which] if isinstance(which, int) and not isinstance(which, bool) else list(which)
    if not items or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in items):
        raise ValueError(f"{what} must be None, a non-negative int or a non-empty list of them (got {which!r})")
    if len(set(items)) != len(items):
        raise ValueError(f"repeated {what[:-1]} index in {items}")
    return tuple(sorted(items))


def _reference(call: SDPACall, policy: Precision, heads: tuple[int, ...] | None, original):
    if call.attn_mask is not None:
        raise SubstitutionError(f"SDPA call {call.index} passes an attn_mask; the reference attention supports "
                                "only is_causal=True or no mask, so this call cannot be substituted")
    if call.dropout_p != 0.0:
        raise SubstitutionError(f"SDPA call {call.index} uses dropout_p={call.dropout_p}; the reference has no "
                                "dropout (evaluate with model.eval() or dropout 0)")
    q = call.q
    if q.dim() != 4:
        raise SubstitutionError(f"SDPA call {call.index}: q must be 4-D (batch, heads, seq, head_dim), got "
                                f"{tuple(q.shape)}")
    if call.is_causal and q.shape[-2] != call.k.shape[-2]:
        raise SubstitutionError(f"SDPA call {call.index} is causal with {q.shape[-2]} queries and "
                                f"{call.k.shape[-2]} keys: SDPA aligns that mask top-left, the reference "
                                "bottom-right, so they would attend to different keys")
    k, v = call.kv_for_heads()
    nh = q.shape[1]
    if heads is not None and heads[-1] >= nh:
        raise SubstitutionError(f"head {heads[-1]} requested, but SDPA call {call.index} has {nh} heads")

    def ref(qh, kh, vh):
        with torch.autocast(device_type=q.device.type, enabled=False):
            return attention(qh, kh, vh, policy=policy, causal=call.is_causal, scale=call.scale,
                             check_finite=False)

    if heads is None or len(heads) == nh:
        return ref(q, k, v).to(q.dtype)
    idx = torch.tensor(heads, device=q.device)
    out = original()                                                      # (B, H, Tq, D) the model's own
    part = ref(q[:, idx], k[:, idx], v[:, idx]).to(out.dtype)             # (B, len(heads), Tq, D)
    return out.index_copy(1, idx, part)


@contextmanager
def substitute(model: nn.Module, policy: Precision, layers=None, heads=None):
    """Inside the block, SDPA calls of `model` at positions `layers` (None: all) run `lpfail.attention` under
    `policy` for `heads` (None: all). Yields a `Substitution` record. See the module docstring."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"substitute needs the model (a torch.nn.Module), got {type(model).__name__}: the call "
                        "order within one of its forwards defines the layer index")
    if isinstance(policy, str):
        policy = Precision.parse(policy)
    if not isinstance(policy, Precision):
        raise TypeError(f"policy must be a lpfail.precision.Precision or its string (got {type(policy).__name__})")
    rec = Substitution(policy, _ids(layers, "layers"), _ids(heads, "heads"))

    def handler(call: SDPACall, original):
        rec.calls += 1
        if rec.layers is not None and call.index not in rec.layers:
            return original()
        rec.substituted += 1
        return _reference(call, policy, rec.heads, original)

    mode = SDPAInterceptor(handler)
    forwards = []

    def pre_hook(*_):
        if forwards and mode.calls_this_forward:
            rec.calls_per_forward.add(mode.calls_this_forward)
        forwards.append(1)
        mode.new_forward()

    hook = model.register_forward_pre_hook(pre_hook)
    ok = False
    try:
        with mode:
            yield rec
        ok = True
    finally:
        hook.remove()
    if ok:
        if mode.calls_this_forward:
            rec.calls_per_forward.add(mode.calls_this_forward)
        if rec.calls == 0:
            raise SubstitutionError("no call of torch.nn.functional.scaled_dot_product_attention happened inside "
                                    "the substitute block: this model's attention does not go through SDPA (or "
                                    "no forward was run), so nothing was substituted")
        most = max(rec.calls_per_forward)
        if rec.layers is not None and rec.layers[-1] >= most:
            raise SubstitutionError(f"layer {rec.layers[-1]} requested, but the model made at most {most} SDPA "
                                    "calls per forward (layers are call positions, 0-based)")
