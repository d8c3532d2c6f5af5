"""Run any model that calls ``F.scaled_dot_product_attention`` with the reference attention instead, under a
chosen `Precision`, in chosen layers and heads. Chapter 2's substitution, for a model whose code you did not
write (explained in chapter 7, "Diagnose your own model")::

    from lpfail.substitute import substitute
    from lpfail.precision import PAPER_BF16
    with substitute(model, PAPER_BF16, layers=[1], heads=[0, 6, 7]):
        loss = model(x, y)[1]            # layer 1 (its 2nd SDPA call in each forward), heads 0, 6, 7
        loss.backward()                  # the backward is the reference's (FlashAttention-2's Algorithm 2)

Layers are the positions of the SDPA calls within the block's first forward of `model` (0-based, in call
order), which for a stack of blocks is the layer index, and they stay with the modules that made those calls:
in a later forward a call is substituted when its module's call had a requested position in the first one (its
k-th call, where a module makes several: the k-th of its positions), so a forward that skips a layer (LayerDrop,
early exit) substitutes the same modules, and so does ``model.forward(...)`` called directly (the block wraps
``model.forward`` too, so that every forward starts the numbering). Heads are 0-based query heads.

Everything else — the other calls, the other heads of a substituted call, SDPA calls of any other model run
inside the block — runs the model's own SDPA untouched: a call is `model`'s when the innermost ``nn.Module``
that made it is one of `model`'s modules (or, where no module made it, when it happens during a forward of
`model`). The reference (`lpfail.attention.attention`) is called as lpfail's GPT calls it for a "reference"
layer (autocast off, ``check_finite=False``), so on lpfail's GPT the substitution is bit for bit the model's own
``set_attention("reference", policy, layers, heads)`` (tested). Its output is returned in q's dtype.

Also covered (`lpfail.sdpa_hook` says how): attention inside ``nn.MultiheadAttention`` (so
``nn.TransformerEncoder``) with ``need_weights=False``; 3-D inputs (N sequences of one head) and inputs with
more leading dimensions; activation checkpointing, reentrant or not — the recomputation in the backward
runs the same layers' reference as the forward did (between two forwards, forward pre-hooks on `model`'s
submodules re-enter the interceptor when the autograd engine calls them); and ``torch.compile``: inside the
block a compiled model runs eagerly (dynamo's stance is force_eager while the interceptor is active), so the
reference keeps every cast of its policy (inductor would drop BF16 round trips), the result is the eager
model's, bit for bit, and nothing is compiled or recompiled for the block.

Masks: a call's ``attn_mask`` (bool, or float added to the scores: a padding mask as Hugging Face builds it, a
causal mask given as a mask, a sliding window) is passed to the reference (`lpfail.attention.attention`'s
``attn_mask``); a causal call with different query and key lengths gets SDPA's top-left causal mask as a mask
(the reference's own causal is bottom-right). Rows a mask leaves without a key give 0, as SDPA.

What the reference cannot do is refused with an error rather than approximated: dropout; a float mask that
requires grad (a learned bias: the reference gives the mask no gradient); a recomputed call from a module that
made several SDPA calls in its forward (which of them it recomputes cannot be told). Grouped-query calls (fewer
key/value heads) are expanded first. A requested layer index that no forward reached, or a block in which no
SDPA call of `model` happened, is an error at the end of the block.
"""
from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from lpfail.attention import attention
from lpfail.precision import Precision
from lpfail.sdpa_hook import SDPACall, SDPAInterceptor, eager, from_heads_view, in_backward

__all__ = ["substitute", "Substitution", "SubstitutionError"]


class SubstitutionError(RuntimeError):
    """The requested substitution cannot be carried out faithfully."""


@dataclass
class Substitution:
    """What happened inside a `substitute` block (yielded by it)."""

    policy: Precision
    layers: tuple[int, ...] | None
    heads: tuple[int, ...] | None
    calls: int = 0                 # SDPA calls of the model seen in its forwards
    substituted: int = 0           # of which ran the reference
    recomputed: int = 0            # calls recomputed in a backward (activation checkpointing) that ran it
    foreign: int = 0               # SDPA calls inside the block that were not the model's (left untouched)
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


def _mask(call: SDPACall, q: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
    """(attn_mask for the reference, causal) of a call: its own attn_mask as a (B, H, Tq, Tk) view, and
    is_causal as the reference takes it — bottom-right causal where Tq = Tk (there the same as SDPA's top-left),
    else SDPA's top-left causal mask given as a bool mask."""
    mask = call.mask_view()
    if mask is not None and mask.dtype != torch.bool and mask.requires_grad:
        raise SubstitutionError(f"SDPA call {call.index} passes an attn_mask that requires grad (a learned "
                                "bias); the reference gives the mask no gradient, so this call cannot be substituted")
    tq, tk = q.shape[-2], call.k.shape[-2]
    if not call.is_causal or tq == tk:
        return mask, call.is_causal
    top_left = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()  # query i sees keys j ≤ i
    if mask is None:
        return top_left, False
    if mask.dtype == torch.bool:
        return mask & top_left, False
    return mask.masked_fill(~top_left, -math.inf), False


def _reference(call: SDPACall, policy: Precision, heads: tuple[int, ...] | None, original):
    if call.dropout_p != 0.0:
        raise SubstitutionError(f"SDPA call {call.index} uses dropout_p={call.dropout_p}; the reference has no "
                                "dropout (evaluate with model.eval() or dropout 0)")
    try:
        q, k, v, _ = call.heads_view()                                     # (B, H, T, D)
    except ValueError as e:
        raise SubstitutionError(f"SDPA call {call.index}: {e}") from None
    mask, causal = _mask(call, q)                                         # (B, H, Tq, Tk) or None
    nh = q.shape[1]
    if heads is not None and heads[-1] >= nh:
        raise SubstitutionError(f"head {heads[-1]} requested, but SDPA call {call.index} has {nh} heads")

    def ref(qh, kh, vh, mh):
        with torch.autocast(device_type=q.device.type, enabled=False):
            return attention(qh, kh, vh, policy=policy, causal=causal, scale=call.scale, check_finite=False,
                             attn_mask=mh)

    if heads is None or len(heads) == nh:
        return from_heads_view(ref(q, k, v, mask).to(call.q.dtype), call.q)
    idx = torch.tensor(heads, device=q.device)
    own = original()
    out = own if own.dim() == 4 else own.reshape(*q.shape[:-1], own.shape[-1])   # (B, H, Tq, D) the model's
    part_mask = None if mask is None else (mask if mask.dim() == 2 else mask[:, idx])
    part = ref(q[:, idx], k[:, idx], v[:, idx], part_mask).to(out.dtype)  # (B, len(heads), Tq, D)
    return from_heads_view(out.index_copy(1, idx, part), call.q)


_NONE = object()


class _Block:
    """The state of one `substitute` block: the interceptor, the hooks on the model, the record."""

    def __init__(self, model: nn.Module, policy: Precision, rec: Substitution):
        self.model, self.policy, self.rec = model, policy, rec
        self.ids = {id(m) for m in model.modules()}
        self.mode = SDPAInterceptor(self.handle)
        self.depth, self.forwards, self.bw_depth = 0, 0, 0
        self.recompute_hooks: list = []
        self.sites: dict[int, list[int]] | None = None  # id(module) → its call positions in the first forward

    def layer(self, call: SDPACall) -> int | None:
        """The layer of one of the model's calls: by the module that made it — the position its call had in the
        block's first forward that made any (its k-th call in a forward: the k-th of them) —, else (a module
        unseen then, or a call no module made) the position of the call in its own forward. A recomputed call
        (activation checkpointing) takes its module's one position; `call.index` where the module made
        several."""
        first = self.sites.get(id(call.module)) if self.sites is not None and call.module is not None else None
        if first is None:
            return call.index
        if call.recomputed:
            return first[0] if len(first) == 1 else call.index
        k = len(self.mode.index_of.get(id(call.module), [])) - 1    # this call's rank among its module's calls
        return first[k] if 0 <= k < len(first) else call.index

    def handle(self, call: SDPACall, original):
        ours = id(call.module) in self.ids if call.module is not None else self.depth > 0
        if not ours:
            self.rec.foreign += 1
            return original()
        if call.recomputed:
            if call.index is None:
                name = type(call.module).__name__ if call.module is not None else "no module"
                raise SubstitutionError(
                    f"an SDPA call was recomputed during the backward (activation checkpointing) by {name}, "
                    "which made no call or several SDPA calls in the last forward: which layer it recomputes "
                    "cannot be told. Checkpoint modules that make one SDPA call each, or substitute without "
                    "checkpointing")
        else:
            self.rec.calls += 1
        if self.rec.layers is not None and self.layer(call) not in self.rec.layers:
            return original()
        if call.recomputed:
            self.rec.recomputed += 1
        else:
            self.rec.substituted += 1
        return _reference(call, self.policy, self.rec.heads, original)

    # the top module's hooks and its forward (`delimited`): a forward of the model starts (numbering from 0), ends
    def pre(self, *_):
        self.depth += 1
        if self.depth > 1:
            return
        self._remove_recompute_hooks()
        if self.forwards and self.mode.calls_this_forward:
            self.rec.calls_per_forward.add(self.mode.calls_this_forward)
        self.forwards += 1
        self.mode.new_forward()

    def post(self, *_):
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0 and self.sites is None and self.mode.index_of:
            self.sites = {m: list(ix) for m, ix in self.mode.index_of.items()}
        if self.depth == 0 and not self.recompute_hooks:
            self._add_recompute_hooks()

    def delimited(self, forward):
        """`forward` (the model's bound forward) between `pre` and `post`: a forward is delimited also when
        ``model.forward(...)`` is called directly, which runs no hook of the model."""
        @functools.wraps(forward)
        def run(*args, **kwargs):
            self.pre()
            try:
                return forward(*args, **kwargs)
            finally:
                self.post()
        return run

    # between forwards: a submodule called by the autograd engine is a checkpoint's recomputation
    def _add_recompute_hooks(self):
        for m in self.model.modules():
            self.recompute_hooks.append(m.register_forward_pre_hook(self._bw_pre))
            self.recompute_hooks.append(m.register_forward_hook(self._bw_post, always_call=True))

    def _remove_recompute_hooks(self):
        for h in self.recompute_hooks:
            h.remove()
        self.recompute_hooks = []

    def _bw_pre(self, *_):
        if self.bw_depth or in_backward():
            if self.bw_depth == 0:
                self.mode.__enter__()
            self.bw_depth += 1

    def _bw_post(self, *_):
        if self.bw_depth:
            self.bw_depth -= 1
            if self.bw_depth == 0:
                self.mode.__exit__(None, None, None)

    def finish(self):
        """The checks at the end of a block that raised nothing."""
        rec = self.rec
        if self.mode.calls_this_forward:
            rec.calls_per_forward.add(self.mode.calls_this_forward)
        if rec.calls == 0:
            why = ("this model's attention does not go through SDPA (or no forward was run)" if not rec.foreign
                   else f"{rec.foreign} SDPA calls were seen, but none made by a module of this model")
            if self.mode.unseen_attention:
                why += "; seen instead: " + self.mode.unseen_attention[0]
            raise SubstitutionError("no call of torch.nn.functional.scaled_dot_product_attention by the model "
                                    f"happened inside the substitute block: {why}, so nothing was substituted")
        most = max(rec.calls_per_forward)
        if rec.layers is not None and rec.layers[-1] >= most:
            raise SubstitutionError(f"layer {rec.layers[-1]} requested, but the model made at most {most} SDPA "
                                    "calls per forward (layers are call positions, 0-based)")


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
    block = _Block(model, policy, Substitution(policy, _ids(layers, "layers"), _ids(heads, "heads")))
    hooks = (model.register_forward_pre_hook(eager(block.pre)),
             model.register_forward_hook(eager(block.post), always_call=True))
    own_forward = model.__dict__.get("forward", _NONE)  # an instance attribute (torch.compile's wrapper has one)
    model.forward = block.delimited(model.forward)
    ok = False
    try:
        with block.mode:
            yield block.rec
        ok = True
    finally:
        if own_forward is _NONE:
            del model.forward
        else:
            model.forward = own_forward
        for h in hooks:
            h.remove()
        block._remove_recompute_hooks()
    if ok:
        block.finish()
