"""Intercepting ``F.scaled_dot_product_attention`` in any model, without touching the model's code.

Shared by `lpfail.monitor` (which only looks at q and k) and `lpfail.substitute` (which replaces the call).
Explained in chapter 7, "Diagnose your own model".

A `torch.overrides.TorchFunctionMode` sees every call of ``torch.nn.functional.scaled_dot_product_attention``,
however the model imported it (``F.scaled_dot_product_attention``, ``from torch.nn.functional import
scaled_dot_product_attention``, ``torch._C._nn.scaled_dot_product_attention``), and the interception ends when
the mode is left. A forward pre-hook on the model's top module starts a new forward: the attention calls of
one forward are numbered 0, 1, 2, … in call order, which for the usual layer stacks is the layer index.

Four cases need more than that, each handled here:

* **nn.MultiheadAttention** (and so ``nn.TransformerEncoder``/``Decoder``): its forward is one overridable
  function, ``F.multi_head_attention_forward``, which the mode receives whole; the SDPA call inside it runs
  with the mode switched off (a mode never sees the calls made by its own handler). For the duration of that
  one call, and for the calling thread only, the SDPA name that function looks up is pointed at the
  interceptor, so the inner call is seen like any other. With ``need_weights=True`` (nn.MultiheadAttention's
  default when called directly) it computes its attention without SDPA: such calls are counted in
  `unseen_attention`, so that the users can say why no attention call was seen.
* **activation checkpointing**: a checkpointed block runs its forward again during the backward. Every call
  is attributed to the innermost ``nn.Module`` that made it (found from the Python frames of
  ``Module._call_impl``); a call made while the autograd engine runs a backward node is a recomputation
  (`SDPACall.recomputed`) and gets the index that module's call had in the last forward, so both the
  non-reentrant and the reentrant ``torch.utils.checkpoint`` see the same layer numbers as the forward.
* **torch.compile**: while the mode is active, dynamo's stance is ``force_eager`` (set when the mode is
  entered, the previous stance restored when it is left; only where dynamo was imported, i.e. where
  something may be compiled): a compiled model then runs eagerly, its compiled graphs untouched. So the
  statistics and the reference attention are computed by eager PyTorch with every cast kept (inductor drops
  BF16 round trips: the tied-maximum fraction read 0 and the PAPER_BF16 substitution changed), dynamo never
  guards on the handlers' Python state (before, every sampled step recompiled the model), and a compiled
  model is compiled once, with its graphs reused after the mode is left. The cost: a forward made under the
  mode runs at eager speed, and with a compiler that changes low bits (inductor) its numbers are the eager
  ones, not the compiled ones. The forward hooks that enter the mode run under ``torch._dynamo.disable``
  (`eager`), so that dynamo never traces them. A compiled region reads the stance when it is entered: a hook that
  runs inside one (``model.compile()``'s compiled ``__call__``, or a ``torch.compile`` wrapper around a model
  that holds the hook) cannot make the rest of that forward eager, so its owner sets the stance (`force_eager`)
  before the forward starts (`lpfail.monitor.Monitor` from one step to the next; `lpfail.substitute` for its
  whole block, which it enters outside any compiled region).
* **shapes**: SDPA takes (…, L, E) inputs with any number of leading dimensions; `SDPACall.heads_view` gives
  (B, H, L, E) views: 4-D as they are, 3-D (N, L, E) as N sequences of one head, more dimensions with the
  leading ones folded into the batch.

`SDPACall` is one call's arguments in a normalised form (q, k, v, is_causal, attn_mask, scale, dropout_p,
enable_gqa) so that both users read them the same way.
"""
from __future__ import annotations

import inspect
import math
import sys
import threading
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SDPA = F.scaled_dot_product_attention
MHA_FORWARD = F.multi_head_attention_forward
_MHA_SIGNATURE = inspect.signature(MHA_FORWARD)
_ARG_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
_CALL_IMPL = nn.Module._call_impl.__code__
_RESUME_CALL_IMPL = "torch_dynamo_resume_in__call_impl"  # dynamo's name for a resumed _call_impl frame


_EAGER: dict = {}


def eager(fn):
    """`fn` under ``torch._dynamo.disable``: dynamo runs it eagerly and never traces it. Made on first use
    (importing torch._dynamo takes seconds, so importing this module does not); module-level functions
    once each, bound methods (a hook of one monitor or block) each time."""
    out = _EAGER.get(fn) if inspect.isfunction(fn) else None
    if out is None:
        import torch._dynamo

        out = torch._dynamo.disable(fn)
        if inspect.isfunction(fn):
            _EAGER[fn] = out
    return out


@dataclass
class SDPACall:
    """One call of scaled_dot_product_attention, its arguments by name. q (…, Hq, Tq, D), k/v (…, Hkv, Tk, D)."""

    index: int | None  # position of this call within the current forward (0-based); None: unknown
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    module: nn.Module | None = None  # the innermost nn.Module that made the call (None: none found)
    recomputed: bool = False         # made during a backward: activation checkpointing's recomputation

    @property
    def alpha(self) -> float:
        """The softmax scale actually used: `scale`, or 1/sqrt(D) by default (SDPA's rule)."""
        return 1.0 / math.sqrt(self.q.shape[-1]) if self.scale is None else float(self.scale)

    def kv_for_heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v with one head per query head (grouped-query attention expanded on dim −3, as SDPA's
        enable_gqa). Raises ValueError when the head counts do not divide."""
        if self.q.dim() < 3 or self.k.dim() < 3:
            return self.k, self.v
        hq, hk = self.q.shape[-3], self.k.shape[-3]
        if hq == hk:
            return self.k, self.v
        if hq % hk:
            raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
        return self.k.repeat_interleave(hq // hk, dim=-3), self.v.repeat_interleave(hq // hk, dim=-3)

    def allowed(self) -> torch.Tensor | None:
        """Bool (…, Tq, Tk), True where a query may attend to a key (None: everywhere). SDPA's is_causal is
        top-left aligned (query i sees keys j ≤ i); a float attn_mask allows the entries that are neither −∞ nor
        its dtype's most negative finite value (how libraries that avoid −∞ mask a key: the key's weight
        exp(min − max) is 0)."""
        tq, tk = self.q.shape[-2], self.k.shape[-2]
        out = None
        if self.is_causal:
            out = torch.ones(tq, tk, dtype=torch.bool, device=self.q.device).tril()
        if self.attn_mask is not None:
            m = self.attn_mask
            if m.dtype != torch.bool:
                m = ~(torch.isneginf(m) | (m <= torch.finfo(m.dtype).min))
            out = m if out is None else out & m
        return out

    def mask_view(self) -> torch.Tensor | None:
        """The attn_mask as it applies to `heads_view`'s (B, H, Tq, Tk) scores (a broadcast view where it can
        be), its dtype kept: bool (True = allowed) or float (added to the scores); None without a mask."""
        if self.attn_mask is None:
            return None
        full = torch.broadcast_to(self.attn_mask, (*self.q.shape[:-2], self.q.shape[-2], self.k.shape[-2]))
        return _to4(full)

    def heads_view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(q, k, v, allowed) as (B, H, T, D) tensors (k, v with the query's head count) and a bool mask
        broadcastable to (B, H, Tq, Tk) or None. 3-D inputs (N, L, E) are N sequences of one head; inputs of
        more than 4 dimensions have their leading dimensions folded into the batch."""
        if self.q.dim() < 2:
            raise ValueError(f"scaled_dot_product_attention: q must have ≥ 2 dimensions (got {tuple(self.q.shape)})")
        k, v = self.kv_for_heads()
        allowed = self.allowed()
        lead = self.q.shape[:-2]
        if allowed is not None and allowed.dim() > 2:
            allowed = torch.broadcast_to(allowed, (*lead, *allowed.shape[-2:]))
        return (*(_to4(t) for t in (self.q, k, v)), allowed if allowed is None or allowed.dim() == 2 else _to4(allowed))


def _to4(t: torch.Tensor) -> torch.Tensor:
    """(…, L, E) → (B, H, L, E): 2-D (1, 1, L, E), 3-D (N, 1, L, E), 4-D as is, more dims folded into B."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    return t if t.dim() == 4 else t.reshape(-1, *t.shape[-3:])


def from_heads_view(out4: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of `SDPACall.heads_view` for an output (B, H, L, E'): back to the leading dims of `like` (q)."""
    return out4.reshape(*like.shape[:-1], out4.shape[-1])


def parse_call(index: int | None, args, kwargs) -> SDPACall:
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


def calling_module(depth: int = 2) -> nn.Module | None:
    """The innermost nn.Module whose ``__call__`` is on the Python stack (from ``Module._call_impl``'s frames,
    also when dynamo resumed one after a graph break), or None."""
    f = sys._getframe(depth)
    while f is not None:
        code = f.f_code
        if code is _CALL_IMPL or code.co_name.startswith(_RESUME_CALL_IMPL) or \
                (code.co_name == "_call_impl" and code.co_filename == _CALL_IMPL.co_filename):
            mod = f.f_locals.get("self")
            if isinstance(mod, nn.Module):
                return mod
        f = f.f_back
    return None


def in_backward() -> bool:
    """Whether the autograd engine is running a backward node on this thread (checkpoint recomputation)."""
    return torch._C._current_autograd_node() is not None


class SDPAInterceptor(TorchFunctionMode):
    """Calls `handler(call, original)` for every SDPA call made while the mode is active, where `original()`
    runs the real SDPA with the call's own arguments; the handler's return value is the call's result.
    Every other torch function passes through unchanged. `new_forward()` restarts the call numbering.

    `index_of` maps each module to the indices its calls had in the current forward; a recomputed call
    (during a backward) takes its module's index from there: `call.index` is that index, or None when the
    module made no call or more than one in the forward (the handler decides what to do then)."""

    def __init__(self, handler: Callable[[SDPACall, Callable[[], torch.Tensor]], torch.Tensor]):
        super().__init__()
        self.handler = handler
        self.calls_this_forward = 0
        self.index_of: dict[int, list[int]] = {}   # id(module) → call indices in the current forward
        self.unseen_attention: list[str] = []      # attention computed without SDPA (nn.MultiheadAttention)
        self._stances: list = []                  # dynamo stances to restore, one per __enter__

    def new_forward(self) -> None:
        self.calls_this_forward = 0
        self.index_of = {}

    def __enter__(self):
        self._stances.append(force_eager())
        try:
            out = super().__enter__()
        except BaseException:
            self._restore()
            raise
        global _N_ACTIVE
        _active().append(self)
        _N_ACTIVE += 1
        return out

    def __exit__(self, *exc):
        global _N_ACTIVE
        stack = _active()
        if stack and stack[-1] is self:
            stack.pop()
            _N_ACTIVE -= 1
        try:
            return super().__exit__(*exc)
        finally:
            self._restore()

    def _restore(self) -> None:
        stance = self._stances.pop() if self._stances else None
        if stance is not None:
            stance.__exit__(None, None, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            return _dispatch(self, args, kwargs)
        if func is MHA_FORWARD:
            return _dispatch_mha(self, args, kwargs)
        return func(*args, **kwargs)


_ACTIVE = threading.local()
#: interceptors active on any thread: a plain int, so that `presented`'s path without one is a global read that
#: torch.compile guards on (a thread-local lookup would break its graph at every attention call)
_N_ACTIVE = 0


def _active() -> list:
    """This thread's active interceptors, innermost last."""
    stack = getattr(_ACTIVE, "stack", None)
    if stack is None:
        stack = _ACTIVE.stack = []
    return stack


def presented(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: Callable[[], torch.Tensor],
              is_causal: bool = True) -> torch.Tensor:
    """An attention that another implementation computes (``impl()``: lpfail's own GPT under its reference,
    naive or Triton back ends), shown to the innermost interceptor active on this thread as an SDPA call with
    these arguments whose ``original()`` is ``impl`` — so the monitor and `substitute` see lpfail's GPT whatever
    its attention back end. Without an active interceptor: ``impl()``, nothing else. The handler runs with the
    mode still active (the call did not come through ``__torch_function__``): its torch calls pass through it,
    and an SDPA call made by the handler itself would be intercepted again (none of ours makes one)."""
    if not _N_ACTIVE:
        return impl()
    stack = _active()
    if not stack:  # active on another thread only
        return impl()
    return _dispatch(stack[-1], (q, k, v), {"is_causal": is_causal}, calling_module(2), original=impl)


def force_eager():
    """Set dynamo's stance to "force_eager" (every compiled function and module runs its Python code eagerly
    until the stance is restored) and return the object whose ``__exit__(None, None, None)`` restores the
    previous one; None where torch._dynamo was never imported (then nothing is compiled, and importing it
    would take seconds) or torch has no ``torch.compiler.set_stance`` (before 2.6)."""
    if "torch._dynamo" not in sys.modules or not hasattr(torch.compiler, "set_stance"):  # set_stance: torch ≥ 2.6
        return None
    return torch.compiler.set_stance("force_eager")


def _dispatch(mode: SDPAInterceptor, args, kwargs, module: nn.Module | None = None, original=None):
    """One intercepted SDPA call: number it (or, when recomputed in a backward, look its number up), then
    hand it to the handler (`original`: what computes the call's own result; default the real SDPA)."""
    module = module if module is not None else calling_module(1)
    recomputed = in_backward()
    if recomputed:
        found = mode.index_of.get(id(module)) if module is not None else None
        index = found[0] if found is not None and len(found) == 1 else None
    else:
        index = mode.calls_this_forward
        mode.calls_this_forward += 1
        if module is not None:
            mode.index_of.setdefault(id(module), []).append(index)
    call = parse_call(index, args, kwargs)
    call.module, call.recomputed = module, recomputed
    return mode.handler(call, original if original is not None else (lambda: SDPA(*args, **kwargs)))


_patch_lock = threading.RLock()


def _dispatch_mha(mode: SDPAInterceptor, args, kwargs):
    """``F.multi_head_attention_forward`` with its inner SDPA call intercepted (see the module docstring)."""
    bound = _MHA_SIGNATURE.bind(*args, **kwargs)
    if bound.arguments.get("need_weights", True):
        mode.unseen_attention.append("nn.MultiheadAttention with need_weights=True (its attention does not go "
                                     "through SDPA: call it with need_weights=False)")
        return MHA_FORWARD(*args, **kwargs)
    module = calling_module(1)
    thread = threading.get_ident()
    namespace = MHA_FORWARD.__globals__

    def inner(*a, **kw):
        if threading.get_ident() != thread:   # another thread's call while this one is patched: untouched
            return SDPA(*a, **kw)
        return _dispatch(mode, a, kw, module)

    with _patch_lock:
        saved = namespace["scaled_dot_product_attention"]
        namespace["scaled_dot_product_attention"] = inner
        try:
            return MHA_FORWARD(*args, **kwargs)
        finally:
            namespace["scaled_dot_product_attention"] = saved
