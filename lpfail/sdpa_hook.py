"""Intercepting ``F.scaled_dot_product_attention`` in any model, without touching the model's code.

Shared by `lpfail.monitor` (which only looks at q and k) and `lpfail.substitute` (which replaces the call).
Explained in chapter 7, "Diagnose your own model".

A `torch.overrides.TorchFunctionMode` sees every call of ``torch.nn.functional.scaled_dot_product_attention``,
however the model imported it (``F.scaled_dot_product_attention``, ``from torch.nn.functional import
scaled_dot_product_attention``, ``torch._C._nn.scaled_dot_product_attention``), so no monkey-patching of a
module attribute is needed and the interception ends when the mode is left. A forward pre-hook on the
model's top module starts a new forward: the attention calls of one forward are numbered 0, 1, 2, … in call
order, which for the usual layer stacks is the layer index.

`SDPACall` is one call's arguments in a normalised form (q, k, v, is_causal, attn_mask, scale, dropout_p,
enable_gqa) so that both users read them the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SDPA = F.scaled_dot_product_attention
_ARG_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


@dataclass
class SDPACall:
    """One call of scaled_dot_product_attention, its arguments by name. q (B, H, Tq, D), k/v (B, Hkv, Tk, D)."""

    index: int  # position of this call within the current forward (0-based)
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool

    @property
    def alpha(self) -> float:
        """The softmax scale actually used: `scale`, or 1/sqrt(D) by default (SDPA's rule)."""
        return 1.0 / math.sqrt(self.q.shape[-1]) if self.scale is None else float(self.scale)

    def kv_for_heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v with one head per query head (grouped-query attention expanded, as SDPA's enable_gqa)."""
        hq, hk = self.q.shape[-3], self.k.shape[-3]
        if hq == hk:
            return self.k, self.v
        if hq % hk:
            raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
        return self.k.repeat_interleave(hq // hk, dim=-3), self.v.repeat_interleave(hq // hk, dim=-3)

    def allowed(self) -> torch.Tensor | None:
        """Bool (…, Tq, Tk), True where a query may attend to a key (None: everywhere). SDPA's is_causal is
        top-left aligned (query i sees keys j ≤ i); a float attn_mask allows the entries that are not −∞."""
        tq, tk = self.q.shape[-2], self.k.shape[-2]
        out = None
        if self.is_causal:
            out = torch.ones(tq, tk, dtype=torch.bool, device=self.q.device).tril()
        if self.attn_mask is not None:
            m = self.attn_mask if self.attn_mask.dtype == torch.bool else ~torch.isneginf(self.attn_mask)
            out = m if out is None else out & m
        return out


def parse_call(index: int, args, kwargs) -> SDPACall:
    """Bind SDPA's positional and keyword arguments to names (raises TypeError on an unknown keyword)."""
    bound = dict(_DEFAULTS)
    if len(args) > len(_ARG_NAMES):
        raise TypeError(f"scaled_dot_product_attention got {len(args)} positional arguments")
    bound.update(zip(_ARG_NAMES, args))
    for key, value in (kwargs or {}).items():
        if key not in _ARG_NAMES:
            raise TypeError(f"scaled_dot_product_attention got an unexpected keyword {key!r}")
        bound[key] = value
    return SDPACall(index, bound["query"], bound["key"], bound["value"], bound["attn_mask"],
                    float(bound["dropout_p"]), bool(bound["is_causal"]), bound["scale"], bool(bound["enable_gqa"]))


class SDPAInterceptor(TorchFunctionMode):
    """Calls `handler(call, original)` for every SDPA call made while the mode is active, where `original()`
    runs the real SDPA with the call's own arguments; the handler's return value is the call's result.
    Every other torch function passes through unchanged. `new_forward()` restarts the call numbering."""

    def __init__(self, handler: Callable[[SDPACall, Callable[[], torch.Tensor]], torch.Tensor]):
        super().__init__()
        self.handler = handler
        self.calls_this_forward = 0

    def new_forward(self) -> None:
        self.calls_this_forward = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not SDPA:
            return func(*args, **kwargs)
        call = parse_call(self.calls_this_forward, args, kwargs)
        self.calls_this_forward += 1
        return self.handler(call, lambda: func(*args, **kwargs))
