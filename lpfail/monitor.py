"""A training monitor for the failure this book studies, for any PyTorch model. Explained in chapter 7.

    from lpfail.monitor import Alarm, Monitor, Thresholds
    mon = Monitor(model, path="run.jsonl")      # every=100, window=100: the defaults; alarm=Alarm() adds the alarm
    with mon:                                   # attaches; detaches on exit
        for step in range(steps):
            loss = model(x, y)[1]; loss.backward(); opt.step(); opt.zero_grad()
            rec = mon.step(loss=loss.item())   # ends the step: on sampled steps, computes and writes a record
            if rec: writer.add_scalars("lpfail", mon.scalars(), step)   # or wandb.log(mon.scalars())

Nothing in the model's code changes. Two sources are used, each where it can be found:

* **attention calls**: every call of ``F.scaled_dot_product_attention`` made during the forwards of a sampled
  step (``step % every == 0``) is seen through `lpfail.sdpa_hook` (a TorchFunctionMode; also inside
  ``nn.MultiheadAttention`` and so ``nn.TransformerEncoder``, with 3-D inputs, and in compiled models); from
  its q and k the monitor computes, per call (= layer, numbered in call order within a forward) and per head,
  the largest attention logit S = α·qkᵀ (FP32, over the allowed entries) and the fraction of query rows whose
  maximum is attained by ≥ 2 keys once S is rounded to BF16 (`score_dtype`): the tied maxima of chapter 1. The
  allowed entries are those of is_causal and of an ``attn_mask`` (bool; or float, whose entries −∞ and its dtype's
  most negative value mask a key, its other values not added to S: `SDPACall.allowed`); rows with no allowed key
  are not counted. The
  first `sample_batch` sequences of the batch are examined, to bound the cost. Calls made by modules that are
  not the model's, and a checkpoint's recomputation in the backward, are not counted.
* **Q/K projections**: modules that expose them, by name or by shape (`find_qk` lists the patterns:
  ``q_proj``/``k_proj``, ``query``/``key``, a fused ``c_attn``/``qkv`` — also Hugging Face GPT-2's transposed
  ``Conv1D`` —, ``in_proj_weight`` as in nn.MultiheadAttention, a child with three times as many outputs as
  inputs), or a user function ``qk=``. Head layouts (grouped-query attention included) are checked when the
  monitor is built; `Monitor.found` says what was found and which attention-like modules were not recognised.
  Per layer and head: ‖W_Q^h‖₂ and ‖W_Q^h W_K^hᵀ‖₂ (spectral norms; the second is the bilinear form whose
  entries are the raw logits, paper Fig. 3), and every `window` steps the spectral entropy of the update
  ΔW_Q^h = W_Q^h(t) − W_Q^h(t − window): with σ_i the singular values and p_i = σ_i² / Σσ_j²,
  H = −Σ p_i log p_i / log r (r = the number of singular values), 1 for an update spread evenly over all
  directions, 0 for a rank-one update (after arXiv 2606.28116, which reports that a collapse of this entropy
  precedes divergence).

Where weights are found but no attention call is seen (e.g. ``nn.MultiheadAttention`` called with its default
``need_weights=True``, which does not use SDPA) the first such step warns (`MonitorCoverageWarning`) and says
why. Where projections are not found, the monitor warns once (`MonitorCoverageWarning`): when it is built, for
modules that hold projection-like children it could not read (a fused ``qkv``/``c_attn`` without a head count,
`unmatched_projections`) or whose class name says attention; else at the first sampled step that sees attention
calls but has no projections at all. On a sampled step where neither source yields anything it raises
`MonitorError`, naming what it looked for, instead of monitoring nothing.

**The precision alarm** (``alarm=Alarm()``: dQ, dK against an FP64 recomputation): an observer, in `lpfail.alarm`.

**Observers**: code of one's own that the monitor calls at fixed points of its sampled steps (the precision alarm
is one), passed as ``Monitor(model, observers=[obs])``. An observer subclasses `Observer` (whose hooks do
nothing) or has all of its hooks; the monitor calls, in the order of its `observers` (the alarm's first):

* ``bind(monitor)`` once, when the monitor is built (its `qk`, `every`, `sample_batch` set);
* ``wants_step(step)`` → bool: whether it takes part in sampled step `step` (unsampled steps are not offered);
* ``on_call(call, out, forward)`` inside the model's forward, for each SDPA call of that step that the monitor
  counts (`SDPACall`; `out` the call's result as the model receives it; `forward` the forward's number within
  the step, from 1), after the monitor's own statistics of the call;
* ``on_step_end(step, host)`` → state, in `step()` before the step's one copy to the host: device tensors the
  record needs go through ``host.add(tensor)``, which returns a handle;
* ``on_record(record, state, host)`` after that copy (``host.get(handle)``: a float64 numpy array), to add its
  keys to the record before it is written (after the monitor's own statistics, before its ``warning``);
* ``record_keys``: the keys it adds, which `step()` refuses as extras.

The monitor never changes the model's numbers: it reads detached tensors under ``torch.no_grad()`` with
autocast off, draws no random numbers and passes every SDPA call through unchanged (tests/test_monitor.py
checks bit-identical losses, also under autocast). One exception: compiled code. From the `step()` before a
sampled step to the `step()` that ends it, dynamo's stance is "force_eager" (`Monitor._hold_eager`), so every
compiled forward of a sampled step runs eagerly, however the model was compiled — ``torch.compile(model)``
given to the monitor or made after attaching it, ``model.compile()`` before or after, a compiled submodule, any
inductor mode on a CPU (tests/test_kit_compiled.py): that is what makes its statistics the eager model's
(inductor drops BF16 round trips) and avoids recompiling the model. With a backend that changes low bits
(inductor) a sampled step's numbers are therefore the eager ones, and other compiled code run in that span (a
compiled loss or optimizer step) runs eagerly too; `paused()` blocks run compiled. CUDA graphs on a GPU (modes
"reduce-overhead" and "max-autotune") are refused with a `MonitorError` (`cuda_graph_modules`). Its cost is
confined to sampled steps: the interceptor mode is entered by a forward pre-hook of the model on sampled
steps only and left by its forward hook, so an unsampled step runs no monitor code but two hook calls; on a
sampled step the logit statistics stay on the device until `step()`; the norms come from hs × hs Gram
matrices on the device (batched matmuls, no SVD; all layers in one batch), and the update's spectral entropy,
every `window` steps, from the eigenvalues of those Gram matrices taken on the host in float64. A sampled
step costs a number of device operations that does not grow with the depth, beyond ≈ 20 per attention call
in the forward, and one copy to the host (tools/monitor_op_count.py counts them; GPT-2 small: ≈ 350 ops and 1
copy, against ≈ 2 400 and 36 in an earlier version, whose sampled steps cost ≈ 70-90 ms on an H200).

Thresholds (`Thresholds`) turn statistics into alerts, once when a statistic of a (layer, head) crosses its
threshold (and again only after it went back). Each alert is one message: a ``logging`` record on the
"lpfail.monitor" logger where the application has configured logging (a handler that receives it), else a
warning (`MonitorWarning`, through ``warnings``); and the optional ``callback(alert)``. Every record and
alert is one line of strict JSON in `path` (non-finite numbers as the strings "NaN", "Infinity",
"-Infinity", which `read_jsonl` reads back as floats), after a header record per attachment (`header`:
format, versions, the model, the settings). `scalars()` gives the latest record as a flat {name: float}
dict for TensorBoard's ``add_scalars`` or ``wandb.log``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn as nn

from lpfail.alarm import PER_HEAD as _ALARM_PER_HEAD
from lpfail.alarm import RECORD_KEYS as _ALARM_RECORD_KEYS
from lpfail.alarm import (SCALED_RULE, Alarm, AlarmObserver, ScaledRule, coherence, reference_grads, relative_error, rho,
                          scaled_fires, scaled_statistic)
from lpfail.sdpa_hook import SDPACall, SDPAInterceptor, eager, force_eager

log = logging.getLogger("lpfail.monitor")
log.addHandler(logging.NullHandler())  # a library: the application decides where records go

__all__ = ["Monitor", "Observer", "Thresholds", "Alert", "Alarm", "AlarmObserver", "MonitorError", "MonitorWarning",
           "MonitorCoverageWarning", "QKWeights", "find_qk", "describe_qk", "unmatched_projections", "scalars",
           "spectral_entropy", "attention_logit_stats", "reference_grads", "relative_error", "coherence", "rho",
           "ScaledRule", "SCALED_RULE", "scaled_statistic", "scaled_fires", "read_jsonl", "cuda_graph_modules"]


class MonitorError(RuntimeError):
    """The monitor cannot attach to the model, or found nothing to monitor."""


class MonitorWarning(UserWarning):
    """A monitored statistic crossed its threshold (issued where logging is not configured: `Thresholds`)."""


class MonitorCoverageWarning(UserWarning):
    """The monitor sees less of the model than it should: Q/K projections not found, or found without attention
    calls seen."""


@dataclass(frozen=True)
class Thresholds:
    """When to alert. None switches a statistic's alert off. The defaults:

    max_logit       30, fixed before any evaluation: BF16 spaces numbers in [16, 32) 0.125 apart and in [32, 64)
                    0.25 apart, so above ≈ 30 neighbouring logits start to round to the same value (chapter 1's
                    tied maxima). It marks that regime, not a failure: on the stored confirmation runs at the
                    learning rates where FP32 attention is healthy (results/confirmation: the C runs of three
                    sizes and the D runs of the smallest, 100 runs, a record every 100 steps; the largest logit
                    over each layer's heads) it is crossed in 83, in none at step 0
    tied_frac       0.25, calibrated so that a freshly initialised model does not alert. Random logits tie
                    after rounding to BF16 in a few rows in a hundred whatever their scale (simulated: 0.7 % of
                    rows of 16 keys, 2 % of 256, 3.5 % of 4096, growing like log n). Measured per head at
                    initialisation, the largest fraction was 0.0625 (one row of 16) over lpfail's GPT in five
                    shapes (T = 16 to 256), Hugging Face's GPT-2 small and a Llama (T = 1024), 2 to 20 seeds each
                    (tests/test_kit_defaults.py repeats it on small models). 0.25 is four times that: with 6 % of
                    rows tied at random a head of T rows crosses it with probability 2e-3 for T = 16, 2e-7 for
                    T = 64 (binomial). Training raises the fraction: on the same stored healthy runs a layer's
                    mean over its heads exceeded 0.01 at step 0 in all 100, 0.1 later in 20, 0.25 in none (the
                    per-head values the alert reads were not stored, so its per-head rate there is not known).
                    A model whose keys carry no position (no position embedding, no RoPE) gives repeated tokens
                    equal keys, whose exact ties count too: it can cross 0.25 at initialisation
    wq, wqk         off: their scale depends on the model (use the values of a healthy run)
    update_entropy  off: alert when the spectral entropy of ΔW_Q^h falls *below* this value
    """

    max_logit: float | None = 30.0
    tied_frac: float | None = 0.25
    wq: float | None = None
    wqk: float | None = None
    update_entropy: float | None = None

    def crossed(self, stat: str, value: float) -> bool:
        limit = getattr(self, stat)
        if limit is None or not math.isfinite(value):
            return False
        return value < limit if stat == "update_entropy" else value > limit


@dataclass
class Alert:
    step: int
    stat: str
    layer: int
    head: int
    value: float
    threshold: float
    where: str = ""

    def message(self) -> str:
        side = "below" if self.stat == "update_entropy" else "above"
        return (f"step {self.step}: {self.stat} of layer {self.layer} head {self.head}{self.where} is "
                f"{self.value:.4g}, {side} the threshold {self.threshold:.4g}")


# -- the statistics, as plain functions ------------------------------------------------------------------
def _no_autocast(device: torch.device):
    """A context in which autocast is off on `device`: the monitor's FP32 logits must be FP32 even when the
    model's forward runs under ``torch.autocast`` (which would otherwise run the monitor's matmul in BF16)."""
    return torch.autocast(device_type=device.type, enabled=False)


@torch.no_grad()
def _logit_stats_device(call: SDPACall, score_dtype: torch.dtype, sample_batch: int,
                        masks: dict | None = None):
    """(max logit per head, tied rows per head) as float64 tensors on the call's device, and the rows per head
    (an int, or a 0-d device tensor when an explicit mask decides them): nothing is copied to the host, so the
    forward does not wait for the device. `masks` caches the causal mask between calls (key: shape, device).

    Few passes over the (H, Tq, Tk) scores, each exact: the BF16 row maximum is the BF16 rounding of the FP32
    row maximum (rounding is monotone), entries equal to a finite maximum are finite, and a row whose maximum
    is finite has an allowed key; so one FP32 `amax` over the rows serves both statistics, and the maximum
    over the finite entries (the max logit) needs one more pass only to drop NaN and +∞ entries. A scale α
    that is a power of two multiplies q instead of the scores: the same FP32 numbers (scaling by 2^j is
    exact), except for products in FP32's subnormal range (below ≈ 1e-38, far from any logit that matters)."""
    try:
        q, k, _, allowed = call.heads_view()                                  # (B, H, T, D), any input dims
    except ValueError as e:
        raise MonitorError(f"SDPA call {call.index}: {e}") from None
    q, k = q.detach(), k.detach()
    nb = min(sample_batch, q.shape[0])
    nh, tq, tk = q.shape[1], q.shape[-2], k.shape[-2]
    if call.attn_mask is None and call.is_causal:  # the common case: one cached (Tq, Tk) mask
        key = (tq, tk, q.device)
        banned = masks.get(key) if masks is not None else None
        if banned is None:
            banned = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu_(1)
            if masks is not None:
                masks[key] = banned
    else:
        banned = None if allowed is None else ~allowed
    max_logit = tied = None
    rows = 0
    alpha = call.alpha
    pow2 = alpha > 0 and math.frexp(alpha)[0] == 0.5  # 1/√64 = 2⁻³: GPT-2's head size
    with _no_autocast(q.device):
        for b in range(nb):
            if pow2:  # α = 2^j scales exactly: folded into q, one pass over the scores fewer
                s = (q[b].float() * alpha) @ k[b].float().transpose(-1, -2)   # (H, Tq, Tk) FP32
            else:
                s = q[b].float() @ k[b].float().transpose(-1, -2)
                s.mul_(alpha)
            if banned is not None:
                bn = banned if banned.dim() == 2 else \
                    torch.broadcast_to(banned, (q.shape[0], nh, tq, tk))[b]
                s.masked_fill_(bn, -math.inf)
            row_max = s.amax(dim=-1, keepdim=True)                            # (H, Tq, 1), NaN if any NaN
            rm = row_max.to(score_dtype)                                      # = max of the rounded row
            n_at_max = (s.to(score_dtype) == rm).sum(dim=-1)                  # (H, Tq)
            n_at_max.masked_fill_(~torch.isfinite(rm[..., 0]), 0)
            t = (n_at_max >= 2).sum(dim=-1)
            mx = s.nan_to_num_(nan=-math.inf, posinf=-math.inf, neginf=-math.inf).amax(dim=(-1, -2)).double()
            max_logit = mx if max_logit is None else torch.maximum(max_logit, mx)
            tied = t if tied is None else tied + t
            rows = rows + _live_rows(call, banned, b)
    if max_logit is None:  # an empty batch
        max_logit = torch.full((nh,), -math.inf, dtype=torch.float64, device=q.device)
        tied = torch.zeros(nh, dtype=torch.int64, device=q.device)
    return max_logit, tied.double(), rows


def _live_rows(call: SDPACall, banned: torch.Tensor | None, b: int) -> int:
    """Query rows of sequence b (head 0) with at least one allowed key, from the mask alone (`banned`: the
    negated mask, 2-D or (B, H, Tq, Tk), either with size-1 dimensions that broadcast): an int computed on the
    host when the mask is only causal, else a 0-d tensor on the mask's device (never read during the forward).
    The mask is broadcast to (Tq, Tk) first, as SDPA does: a key-padding mask (B, 1, 1, Tk) or (1, Tk) holds
    one row for all Tq query rows."""
    tq, tk = call.q.shape[-2], call.k.shape[-2]
    if call.attn_mask is None:
        return tq if tk > 0 else 0  # no mask, or causal (top-left: every row sees key 0)
    a = ~banned
    a = a if a.dim() == 2 else a[b if a.shape[0] > 1 else 0, 0]
    return torch.broadcast_to(a, (tq, tk)).any(dim=-1).sum()  # 0-d, on the mask's device, read at step()


@torch.no_grad()
def attention_logit_stats(call: SDPACall, score_dtype: torch.dtype = torch.bfloat16,
                          sample_batch: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    """(max logit per head, tied rows per head, rows per head) for one SDPA call, from its first
    `sample_batch` sequences. Logits S = α·qkᵀ in FP32 over the allowed entries (autocast off); a row is
    tied when ≥ 2 allowed keys attain its maximum after S is rounded to `score_dtype`; rows with no allowed
    key are skipped."""
    mx, tied, rows = _logit_stats_device(call, score_dtype, sample_batch)
    return mx.cpu().numpy(), tied.cpu().numpy().astype(np.int64), int(rows)


def _gram(w: torch.Tensor) -> torch.Tensor:
    """w wᵀ or wᵀ w (the smaller of the two) of each matrix in w (…, m, n), in float64 on w's device, autocast
    off. Its eigenvalues are the σ_i² of w: a (…, r, r) matrix with r = min(m, n), cheap to move to the host."""
    with _no_autocast(w.device):
        x = w.double()
        return x @ x.transpose(-1, -2) if x.shape[-2] <= x.shape[-1] else x.transpose(-1, -2) @ x


_EIGVALSH_CHUNK = 16  # matrices per host thread in `_sq_singular_values`


def _sq_singular_values(gram: torch.Tensor) -> torch.Tensor:
    """σ_i² (ascending, clipped at 0) from Gram matrices, on the host in float64 (LAPACK): the monitor's
    linear algebra never runs a device SVD (a CUDA SVD of 144 matrices of 768 × 768 per
    sampled step made those steps about 14 s long on GPT-2 small)."""
    g = gram.detach()
    g = g if g.device.type == "cpu" and g.dtype == torch.float64 else g.to("cpu", torch.float64)
    flat = g.reshape(-1, *g.shape[-2:])
    workers = min(len(flat) // _EIGVALSH_CHUNK, os.cpu_count() or 1, 16)
    if workers <= 1:
        return torch.linalg.eigvalsh(g).clamp_min(0.0)
    # torch's batched eigvalsh runs the matrices one after another (≈ 0.2 ms each for 64 × 64: ≈ 30 ms for
    # GPT-2 small's 144 heads); LAPACK releases the GIL, so threads share the batch. Same LAPACK call per
    # matrix: the same values as one batched call.
    with ThreadPoolExecutor(workers) as ex:
        parts = list(ex.map(torch.linalg.eigvalsh, flat.chunk(workers)))
    return torch.cat(parts).reshape(*g.shape[:-1]).clamp_min(0.0)


@torch.no_grad()
def spectral_entropy(dw: torch.Tensor) -> np.ndarray:
    """Normalised spectral entropy of each matrix in `dw` (…, m, n): p_i = σ_i² / Σσ_j², −Σ p log p / log r,
    r = min(m, n); NaN for a zero matrix (no update) or r = 1. σ_i² are the eigenvalues of the r × r Gram
    matrix (float64, on the host)."""
    return _entropy_from_gram(_gram(dw))


def _entropy_from_gram(gram: torch.Tensor) -> np.ndarray:
    """`spectral_entropy` from the (…, r, r) Gram matrices of the updates (any device; eigenvalues on the
    host)."""
    e = _sq_singular_values(gram)                                             # (…, r)
    r = e.shape[-1]
    tot = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(tot > 0, tot, torch.ones_like(tot))
    h = -(torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))),
                      torch.zeros_like(p))).sum(dim=-1)
    out = (h / math.log(r)) if r > 1 else torch.full_like(h, math.nan)
    out = torch.where(tot[..., 0] > 0, out, torch.full_like(out, math.nan))
    return out.numpy()


# -- finding the Q/K projections ----------------------------------------------------------------------------
@dataclass
class QKWeights:
    """One attention layer's query and key projections, per head: wq (H, hs, C), wk (Hkv, hs, C), so that
    head h's query is x @ wq[h]ᵀ. `get` returns them (detached views or copies) when called.

    Found by `find_qk`, also: `how` (which pattern matched), `module` (the attention module: its SDPA calls
    are this layer's), `params` (the parameters holding W_Q and W_K, possibly one fused parameter) and
    `split` (tensors shaped like `params` → the per-head (H, hs, C), (Hkv, hs, C) blocks; the precision
    alarm maps gradients with it). A user's ``qk=`` function may give only `name` and `get`."""

    name: str
    get: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    how: str = "qk= function"
    module: nn.Module | None = None
    params: tuple[torch.Tensor, torch.Tensor] | None = None
    split: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None


_HEAD_ATTRS = ("n_head", "num_heads", "num_attention_heads", "n_heads", "nhead")
_KV_ATTRS = ("num_key_value_heads", "n_kv_head", "n_kv_heads", "num_kv_heads")
_HS_ATTRS = ("head_dim", "head_size", "d_head", "attention_head_size")
#: children holding separate Q and K projections, by name (Llama/HF, BERT, Meta's Llama, diffusers, DistilBERT)
_QK_PAIRS = (("q_proj", "k_proj"), ("query", "key"), ("wq", "wk"), ("to_q", "to_k"), ("q_lin", "k_lin"),
             ("query_proj", "key_proj"), ("q", "k"))
#: a child holding the fused q | k | v projection (blocks in that order), by name (nanoGPT and HF GPT-2, timm, …)
_FUSED = ("c_attn", "qkv", "qkv_proj", "Wqkv", "to_qkv", "qkv_linear", "in_proj")


def _first_int(module: nn.Module, attrs: tuple[str, ...], config: bool = True) -> int | None:
    """The first positive int among ``attrs`` on the module, then (`config`) on its ``config``; None if none."""
    for owner in (module, getattr(module, "config", None) if config else None):
        for a in attrs:
            v = getattr(owner, a, None) if owner is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _heads(module: nn.Module, n_head: int | None) -> int | None:
    return n_head if n_head is not None else _first_int(module, _HEAD_ATTRS)


def _weight(m) -> tuple[torch.Tensor, bool] | None:
    """(weight, transposed) of a projection: an nn.Linear's (out, in) weight, or a weight stored (in, out) as in
    Hugging Face's GPT-2 ``Conv1D`` (recognised by its ``nf`` = out features); None if `m` is neither."""
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return None
    if isinstance(m, nn.Linear):
        return w, False
    nf = getattr(m, "nf", None)
    return (w, True) if isinstance(nf, int) and w.shape[1] == nf else (w, False)


def _rows(w: torch.Tensor, transposed: bool, start: int, stop: int) -> torch.Tensor:
    """Output features start:stop of a projection weight as an (n, in) view."""
    return w[:, start:stop].t() if transposed else w[start:stop]


def _layout(name: str, what: str, out_q: int, out_k: int, h: int, hk: int | None, hs: int | None):
    """(H, Hkv, hs) from the output widths of the Q and K projections and what the module says; raises a
    MonitorError (with the shapes) where they do not fit: checked when the monitor is built."""
    hs = hs or (out_q // h if out_q % h == 0 else None)
    if hs is None or out_q != h * hs:
        raise MonitorError(f"{name}: {what}: the query projection has {out_q} output features, which do not "
                           f"split into {h} heads" + (f" of {hs}" if hs else ""))
    hk = hk or (out_k // hs if out_k % hs == 0 else None)
    if hk is None or out_k != hk * hs or h % hk:
        raise MonitorError(f"{name}: {what}: the key projection has {out_k} output features, which is not a "
                           f"number of key/value heads of size {hs} dividing the {h} query heads (grouped-query "
                           "attention: set num_key_value_heads on the module, or pass qk=)")
    return h, hk, hs


def _qk_source(name, m, what, pq, tq, oq, pk, tk, ok, h, hk, hs) -> QKWeights:
    """A QKWeights reading rows oq:oq+H·hs of pq (queries) and ok:ok+Hkv·hs of pk (keys)."""
    def split(gq, gk):
        return (_rows(gq, tq, oq, oq + h * hs).reshape(h, hs, -1),
                _rows(gk, tk, ok, ok + hk * hs).reshape(hk, hs, -1))
    return QKWeights(name, lambda: split(pq.detach(), pk.detach()),
                     f"{what}, {h} heads × {hs}" + (f", {hk} key/value heads" if hk != h else ""), m, (pq, pk), split)


def _unfused(name, m, qn, kn, h, n_head) -> QKWeights:
    (pq, tq), (pk, tk) = _weight(getattr(m, qn)), _weight(getattr(m, kn))
    out = lambda w, t: w.shape[1] if t else w.shape[0]  # noqa: E731
    h, hk, hs = _layout(name, f"{qn}/{kn}", out(pq, tq), out(pk, tk), h, _first_int(m, _KV_ATTRS),
                        _first_int(m, _HS_ATTRS))
    return _qk_source(name, m, f"{qn}/{kn}", pq, tq, 0, pk, tk, 0, h, hk, hs)


def _fused(name, m, what, w, t, h) -> QKWeights:
    """A fused q | k | v weight: (H + 2·Hkv)·hs output features, the blocks in that order."""
    out = w.shape[1] if t else w.shape[0]
    hk, hs = _first_int(m, _KV_ATTRS), _first_int(m, _HS_ATTRS)
    bad = MonitorError(f"{name}: {what} has {out} output features, which are not three blocks q | k | v for {h} "
                       f"query heads" + (f" and {hk} key/value heads" if hk else "") + (f" of size {hs}" if hs else "")
                       + "; set head_dim / num_key_value_heads on the module, or pass qk=")
    if hs is None and hk is None:
        if out % 3 or (out // 3) % h:
            raise bad
        hk, hs = h, out // 3 // h
    elif hs is None:
        if out % (h + 2 * hk):
            raise bad
        hs = out // (h + 2 * hk)
    elif hk is None:
        if out % hs or (out // hs - h) % 2 or out // hs <= h:
            raise bad
        hk = (out // hs - h) // 2
    if out != (h + 2 * hk) * hs:
        raise bad
    _layout(name, what, h * hs, hk * hs, h, hk, hs)
    return _qk_source(name, m, what, w, t, 0, w, t, h * hs, h, hk, hs)


def _looks_fused(child: nn.Module) -> bool:
    """Whether a child projection has three times as many output features as input features (q | k | v)."""
    wt = _weight(child)
    if wt is None:
        return False
    w, t = wt
    out, inp = (w.shape[1], w.shape[0]) if t else (w.shape[0], w.shape[1])
    return out == 3 * inp


def _match(name: str, m: nn.Module, n_head: int | None) -> QKWeights | None:
    """The Q/K projections of module `m` by name, then by shape; None when it holds none."""
    h = _heads(m, n_head)
    child = lambda a: getattr(m, a, None) if isinstance(getattr(m, a, None), nn.Module) else None  # noqa: E731
    for qn, kn in _QK_PAIRS:
        if child(qn) is not None and child(kn) is not None and _weight(child(qn)) and _weight(child(kn)):
            if h is None:
                raise MonitorError(f"{name}: found {qn}/{kn} but no head count ({', '.join(_HEAD_ATTRS)}); "
                                   "pass n_head=")
            return _unfused(name, m, qn, kn, h, n_head)
    if isinstance(getattr(m, "in_proj_weight", None), torch.Tensor) and h is not None:
        return _fused(name, m, "in_proj_weight (fused q | k | v)", m.in_proj_weight, False, h)
    if isinstance(getattr(m, "q_proj_weight", None), torch.Tensor) and h is not None:  # MHA with kdim ≠ embed_dim
        return _qk_source(name, m, "q_proj_weight/k_proj_weight", m.q_proj_weight, False, 0, m.k_proj_weight,
                          False, 0, *_layout(name, "q/k_proj_weight", m.q_proj_weight.shape[0],
                                             m.k_proj_weight.shape[0], h, _first_int(m, _KV_ATTRS), None))
    if h is None:
        return None
    for fn in _FUSED:
        if child(fn) is not None and _weight(child(fn)):
            return _fused(name, m, f"{fn} (fused q | k | v, by name)", *_weight(child(fn)), h)
    by_shape = [(cn, *_weight(c)) for cn, c in m.named_children() if _looks_fused(c)]
    if len(by_shape) == 1 and (n_head or _first_int(m, _HEAD_ATTRS, config=False)):
        cn, w, t = by_shape[0]
        return _fused(name, m, f"{cn} (fused q | k | v, found by its shape)", w, t, h)
    return None


def find_qk(model: nn.Module, n_head: int | None = None) -> list[QKWeights]:
    """The Q/K projections of every attention layer of `model`, in module order. Patterns looked for, on
    each module (heads from ``n_head``/``num_heads``/… on the module or its ``config``; key/value heads
    from ``num_key_value_heads``/…, else from the key projection's width; head size from ``head_dim``/…):

    * children holding separate projections, by name: ``q_proj``/``k_proj`` (Llama, Hugging Face),
      ``query``/``key`` (BERT), ``wq``/``wk``, ``to_q``/``to_k``, ``q_lin``/``k_lin``, ``query_proj``/``key_proj``,
      ``q``/``k`` (nn.Linear, or a weight stored transposed as Hugging Face's ``Conv1D``)
    * a parameter ``in_proj_weight`` (3·E, E) with ``num_heads`` (nn.MultiheadAttention), or its separate
      ``q_proj_weight``/``k_proj_weight``
    * a fused q | k | v child by name — ``c_attn`` (nanoGPT, lpfail, Hugging Face's GPT-2), ``qkv`` (timm),
      ``qkv_proj``, ``Wqkv``, ``to_qkv``, ``qkv_linear``, ``in_proj`` — or, on a module with a head count, the one
      child whose weight has three times as many outputs as inputs (found by its shape)

    Shapes are checked here: a projection that does not split into the module's heads raises a
    `MonitorError` naming the layer and the widths. `n_head` overrides the head count where the module does
    not say it. Returns [] when nothing matches (`describe_qk` says what was found, and what looked like
    attention but was not recognised)."""
    found: list[QKWeights] = []
    claimed: list[str] = []
    for name, m in model.named_modules():
        if any(name.startswith(c + ".") for c in claimed):
            continue  # inside a layer already found (its q_proj's own children, …)
        src = _match(name, m, n_head)
        if src is not None:
            found.append(src)
            claimed.append(name)
    return found


def unrecognised_attention(model: nn.Module, found: list[QKWeights]) -> list[str]:
    """Modules whose class name says attention (…Attention…, …Attn…) and that neither hold nor sit inside or
    around a layer `find_qk` found: what a user's ``qk=`` would have to cover."""
    names = [f.name for f in found]
    out = []
    for name, m in model.named_modules():
        cls = type(m).__name__.lower()
        if ("attention" in cls or "attn" in cls) and not any(
                n == name or n.startswith(name + ".") or name.startswith(n + ".") for n in names):
            out.append(f"{name or '(the model)'} ({type(m).__name__})")
    return out


def unmatched_projections(model: nn.Module, found: list[QKWeights]) -> list[str]:
    """Modules that hold what looks like Q/K projections — a child named as a fused q | k | v (``c_attn``,
    ``qkv``, …), or an ``in_proj_weight`` — that `find_qk` did not match (it needs the head count, from
    ``n_head``/``num_heads``/… or ``n_head=``), and that neither sit inside nor around a layer it found."""
    names = [f.name for f in found]
    out = []
    for name, m in model.named_modules():
        if any(n == name or n.startswith(name + ".") or name.startswith(n + ".") for n in names):
            continue
        held = [a for a in _FUSED if isinstance(getattr(m, a, None), nn.Module) and _weight(getattr(m, a))]
        if isinstance(getattr(m, "in_proj_weight", None), torch.Tensor):
            held.append("in_proj_weight")
        if held:
            out.append(f"{name or '(the model)'} ({type(m).__name__}: {held[0]}, but no head count)")
    return out


def describe_qk(model: nn.Module, found: list[QKWeights]) -> str:
    """What `find_qk` found, one line per layer, and the attention-like modules it did not recognise."""
    lines = [f"{src.name}: {src.how}" for src in found] or ["no Q/K projections found"]
    missed = unmatched_projections(model, found) + unrecognised_attention(model, found)
    if missed:
        lines.append("not recognised (pass n_head= or qk= to cover them): " + ", ".join(missed))
    return "\n".join(lines)


@torch.no_grad()
def _lambda_max(m: torch.Tensor, squarings: int = 20) -> torch.Tensor:
    """The largest eigenvalue of each matrix in m (…, n, n), float64, whose eigenvalues are real and ≥ 0 (a
    Gram matrix, or a product of two): m is squared `squarings` times (normalised each time), which leaves
    ≈ the projector on the top eigenvector (components of the others shrink like (λ₂/λ₁)^(2^squarings)), and
    λ₁ = ‖m x‖ / ‖x‖ for its largest column x. Batched matmuls only, on m's device: no eigensolver, no SVD,
    no copy to the host. The error is largest when λ₂ is just below λ₁ (the relative gap near 1/2^squarings)
    and vanishes when the gap is large or zero: measured on 64 × 64 matrices, ≤ 6e-6 relative with 16
    squarings (gap 1e-5), ≤ 2.1e-7 with 20 (gap 1e-6) — hence 20 (tests/test_monitor.py).
    About 4 ops a squaring whatever the batch, so callers batch all their matrices into one call (on a
    GPU each op is a kernel launch: the count, not the FLOPs, is the cost)."""
    tiny = torch.finfo(m.dtype).tiny
    scale = torch.linalg.vector_norm(m, dim=(-2, -1), keepdim=True)
    a = m / scale.clamp_min(tiny)
    for _ in range(squarings):
        a = a @ a
        a = a / torch.linalg.vector_norm(a, dim=(-2, -1), keepdim=True).clamp_min_(tiny)
    cols = a.norm(dim=-2)                                                     # (…, n)
    x = torch.gather(a, -1, cols.argmax(dim=-1)[..., None, None].expand(*a.shape[:-1], 1))  # (…, n, 1)
    lam = (m @ x).norm(dim=(-2, -1)) / x.norm(dim=(-2, -1)).clamp_min(tiny)
    return lam.masked_fill_(scale[..., 0, 0] <= tiny, 0.0)


def _host_linalg(device: torch.device) -> bool:
    """Whether the Q/K norms are taken by LAPACK (on a CPU: quicker there than the squarings, and exact) or by
    `_lambda_max` (on an accelerator: no device eigensolver, and nothing read back but the result)."""
    return device.type == "cpu"


@torch.no_grad()
def _qk_norms_device(wq: torch.Tensor, wk: torch.Tensor, host_linalg: bool | None = None) -> torch.Tensor:
    """(2, …, H) float64 on the weights' device: ‖W_Q^h‖₂ and ‖W_Q^hᵀ W_K^h‖₂ for wq (…, H, hs, C), wk
    (…, Hkv, hs, C) — any leading dims, so all layers of a model go in one call. No copy to the host.
    `host_linalg` None: LAPACK on a CPU, `_lambda_max` elsewhere (see `qk_norms`)."""
    h, hk = wq.shape[-3], wk.shape[-3]
    if hk != h:
        if h % hk:
            raise MonitorError(f"query heads ({h}) must be a multiple of key heads ({hk})")
        wk = wk.repeat_interleave(h // hk, dim=-3)
    if host_linalg is None:
        host_linalg = _host_linalg(wq.device)
    with _no_autocast(wq.device):
        q, k = wq.detach().double(), wk.detach().double()
        gq = q @ q.transpose(-1, -2)                                          # (…, H, hs, hs)
        gk = k @ k.transpose(-1, -2)
        if host_linalg:
            lam, u = torch.linalg.eigh(gq)
            root = (u * lam.clamp_min(0.0).sqrt()[..., None, :]) @ u.transpose(-1, -2)  # G_Q^½
            m = root @ gk @ root                                               # same spectrum as G_Q G_K
            both = torch.stack([lam[..., -1], torch.linalg.eigvalsh((m + m.transpose(-1, -2)) / 2)[..., -1]])
        else:
            both = _lambda_max(torch.stack([gq, gq @ gk]))                    # one batch: G_Q and G_Q G_K
        return both.clamp_min(0.0).sqrt()


@torch.no_grad()
def qk_norms(wq: torch.Tensor, wk: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per head ‖W_Q^h‖₂ and ‖W_Q^hᵀ W_K^h‖₂ (the C × C bilinear form x W_Q^hᵀ W_K^h yᵀ whose entries are the raw
    logits), wq (…, H, hs, C), wk (…, Hkv, hs, C). Both from hs × hs Gram matrices G_Q = W_Q W_Qᵀ, G_K = W_K W_Kᵀ
    in float64 on the weights' device: ‖W_Q‖₂² = λ_max(G_Q) and ‖W_Qᵀ W_K‖₂² = λ_max(G_Q G_K) (the nonzero
    eigenvalues of W_Kᵀ G_Q W_K): on a CPU by LAPACK's eigh, on an accelerator by `_lambda_max` (batched
    matmuls; no device eigensolver or SVD); no C × C matrix, one small copy to the host."""
    both = _qk_norms_device(wq, wk).cpu()
    return both[0].numpy(), both[1].numpy()


# -- the monitor ----------------------------------------------------------------------------------------------
#: a record's own keys (the alarm's included, with or without it), which `Monitor.step`'s extras may not use
_RECORD_KEYS = frozenset({"kind", "step", "max_logit", "tied_frac", "rows", "layers", "wq", "wqk", "update_entropy",
                          "update_window", "warning"}) | _ALARM_RECORD_KEYS


class Observer:
    """What the monitor calls at fixed points of its sampled steps (module docstring, "Observers"): subclass it
    and override the hooks you need (each does nothing here), or write a class with all of them. The
    precision alarm is one (`lpfail.alarm.AlarmObserver`)."""

    #: the keys `on_record` adds to a record (which `Monitor.step` refuses as extras)
    record_keys: frozenset[str] = frozenset()

    def bind(self, monitor: "Monitor") -> None:
        """Once, when the monitor is built: its `qk`, `every`, `sample_batch`, … are set."""

    def wants_step(self, step: int) -> bool:
        """Whether to take part in sampled step `step` (`on_call`, `on_step_end`, `on_record`)."""
        return True

    def on_call(self, call: SDPACall, out: torch.Tensor, forward: int) -> None:
        """Each SDPA call the monitor counts in a step it wants, inside the model's forward: `out` is the call's
        result as the model receives it (tensor hooks on it see the backward), `forward` the forward's number
        within the step (from 1)."""

    def on_step_end(self, step: int, host: "_ToHost") -> object:
        """In `Monitor.step()`, before the step's one copy to the host: hand device tensors to ``host.add(t)``
        (which returns a handle) and return what `on_record` needs."""
        return None

    def on_record(self, record: dict, state: object, host: "_ToHost") -> None:
        """After the copy (``host.get(handle)``: float64 numpy): add this observer's keys to `record`."""


#: the hooks an observer must have (`Observer` gives each a default)
_OBSERVER_HOOKS = ("bind", "wants_step", "on_call", "on_step_end", "on_record")


def _check_observers(observers) -> list:
    """The observers as a list, each checked for the hooks (a TypeError naming what is missing)."""
    out = list(observers)
    for obs in out:
        missing = [h for h in _OBSERVER_HOOKS if not callable(getattr(obs, h, None))]
        if missing:
            raise TypeError(f"observer {type(obs).__name__} has no {', '.join(missing)}: subclass "
                            "lpfail.monitor.Observer (whose hooks do nothing) or define them")
    return out


class Monitor:
    """See the module docstring. Arguments:

    model         any nn.Module, also a compiled one (module docstring: compiled code on sampled steps)
    every         sample every `every`-th step (steps counted by `step()`, starting at 0). Default 100: on an
                  H200 (GPT-2 small, tools/gpu_monitor_overhead.py) a sampled step costs tens of
                  milliseconds (the logit statistics in the forward, the norms, the update's eigenvalues on the
                  host every `window`), which at every=10 came to a mean overhead of several percent; the
                  logit alert was evaluated on chapter 1's runs at this resolution (their diagnostics every
                  100 steps). Smaller values watch more closely and cost proportionally more.
    window        steps between the weight snapshots whose difference is ΔW (a multiple of `every`)
    path          JSONL file to append records and alerts to (None: keep them in `records` only); a header
                  record opens each attachment (`header`)
    thresholds    a `Thresholds`
    callback      called with each `Alert`
    score_dtype   dtype the scores are rounded to for the tied-maximum count (BF16: what PAPER_BF16 stores)
    sample_batch  sequences of each sampled batch examined for the logit statistics (and the alarm)
    n_head        head count, where the attention modules do not expose it
    qk            None (use `find_qk`), or a function model → list[QKWeights]
    alarm         None, or an `Alarm`: the precision alarm (`lpfail.alarm`), the first of `observers`
    observers     objects the monitor calls on its sampled steps (module docstring, "Observers"; `Observer`)
    """

    def __init__(self, model: nn.Module, every: int = 100, window: int = 100, path: str | Path | None = None,
                 thresholds: Thresholds = Thresholds(), callback: Callable[[Alert], None] | None = None,
                 score_dtype: torch.dtype = torch.bfloat16, sample_batch: int = 1, n_head: int | None = None,
                 qk: Callable[[nn.Module], list[QKWeights]] | None = None, alarm: Alarm | None = None,
                 observers: Iterable[Observer] = ()):
        if not isinstance(model, nn.Module):
            raise TypeError(f"Monitor needs a torch.nn.Module (got {type(model).__name__})")
        for nm, v in (("every", every), ("window", window), ("sample_batch", sample_batch)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"{nm} must be a positive int (got {v!r})")
        if window % every:
            raise ValueError(f"window ({window}) must be a multiple of every ({every}): ΔW is taken between "
                             "sampled steps")
        if not isinstance(thresholds, Thresholds):
            raise TypeError("thresholds must be a lpfail.monitor.Thresholds")
        if not (isinstance(score_dtype, torch.dtype) and score_dtype.is_floating_point):
            raise ValueError(f"score_dtype must be a floating torch.dtype such as torch.bfloat16 (got "
                             f"{score_dtype!r})")
        if alarm is not None and not isinstance(alarm, Alarm):
            raise TypeError("alarm must be None or a lpfail.monitor.Alarm")
        alarm_obs = AlarmObserver(alarm, every) if alarm is not None else None  # checks Alarm.every
        self.observers: list = ([alarm_obs] if alarm_obs is not None else []) + _check_observers(observers)
        self.model, self.every, self.window, self.thresholds = model, every, window, thresholds
        self.callback, self.score_dtype, self.sample_batch = callback, score_dtype, sample_batch
        self.path = Path(path) if path is not None else None
        self.qk = qk(model) if qk is not None else find_qk(model, n_head)
        _check_qk(self.qk)
        self.found = describe_qk(model, self.qk)  # what was found, for the header and for the user
        log.info("lpfail.monitor found:\n%s", self.found)
        self._qk_warned = False  # whether missing Q/K projections were warned about (once)
        missed = unmatched_projections(model, self.qk) + unrecognised_attention(model, self.qk) if qk is None else []
        if missed:
            self._warn_qk("Q/K projections were not found for " + ", ".join(missed) + ": the records hold no "
                          "‖W_Q‖, ‖W_Q W_Kᵀ‖ or update entropy for them. Pass n_head= (a fused q | k | v "
                          "without a head-count attribute) or qk=", stacklevel=3)
        self.alarm = alarm
        self.records: list[dict] = []
        self.alerts: list[Alert] = []
        self._step = 0
        self._mode: SDPAInterceptor | None = None
        self._hooks: tuple | None = None
        self._active, self._depth, self._forwards = False, 0, 0
        self._calls: dict[int, dict] = {}
        self._above: set[tuple[str, int, int]] = set()
        self._snapshot: list[tuple[list[int], torch.Tensor]] | None = None  # per group: wq (n, H, hs, C)
        self._masks: dict = {}  # causal masks by (Tq, Tk, device), reused across sampled steps
        self._host_linalg: bool | None = None  # None: LAPACK for weights on a CPU (see _host_linalg)
        self._snapshot_step: int | None = None
        self._alarm = alarm_obs  # the observer `alarm` made (None without): its windows, for tests and tools
        self._coverage_warned = False
        self._paused = False
        self._eager = None  # the "force_eager" stance held for a sampled step (`_hold_eager`), or None
        for obs in self.observers:
            obs.bind(self)

    # -- attaching --------------------------------------------------------------------------------------
    def attach(self) -> "Monitor":
        """Start watching. Two forward hooks on the model's top module are all that stays attached: on a
        sampled step the pre-hook enters the SDPA interceptor (a TorchFunctionMode) and the post-hook leaves
        it, so the mode is active only during the forwards of sampled steps; on the other steps no torch
        call passes through Python code of the monitor. Both hooks run eagerly in a compiled model (a graph
        break each), so dynamo never guards on the monitor's step count. Writes the header record."""
        if self._hooks is not None:
            raise MonitorError("this Monitor is already attached")
        _refuse_cuda_graphs(self.model)
        self._mode = SDPAInterceptor(self._on_sdpa)
        self._ids = {id(m) for m in self.model.modules()}
        self._depth, self._active = 0, False
        self._hooks = (self.model.register_forward_pre_hook(eager(self._pre_forward)),
                       self.model.register_forward_hook(eager(self._post_forward), always_call=True))
        self._write(self.header())
        self._hold_eager(self.sampling)
        return self

    def detach(self) -> None:
        if self._hooks is not None:
            if self._active:
                self._mode.__exit__(None, None, None)
            for hk in self._hooks:
                hk.remove()
            self._hooks, self._mode, self._active, self._depth = None, None, False, 0
        self._hold_eager(False)

    def _hold_eager(self, on: bool) -> None:
        """Hold dynamo's "force_eager" stance (on), or give it back (off; the stance before it is restored).

        Held from the `step()` before a sampled step (or `attach()`, for step 0) to the `step()` that ends it, so
        that every compiled forward of a sampled step runs its Python code eagerly, however the model was
        compiled: ``torch.compile(model)`` given to the monitor or made after it was attached, ``model.compile()``
        before or after, a compiled submodule. A compiled region reads the stance when it is entered; the
        monitor's forward hooks run inside the compiled ``__call__`` of ``model.compile()`` (and of a
        ``torch.compile`` wrapper made after attaching), too late to change it for that forward, so the stance is
        set before the forward starts. Not held while `paused`. Without torch._dynamo imported nothing is
        compiled and nothing is held."""
        on = on and self._hooks is not None and not self._paused
        if on and self._eager is None:
            self._eager = force_eager()
        elif not on and self._eager is not None:
            held, self._eager = self._eager, None
            held.__exit__(None, None, None)

    def header(self) -> dict:
        """The record that opens each attachment in the JSONL: format, versions, the model, the settings."""
        import platform
        import sys
        import time

        import lpfail

        versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                    "lpfail": getattr(lpfail, "__version__", None)}
        if "transformers" in sys.modules:
            versions["transformers"] = getattr(sys.modules["transformers"], "__version__", None)
        params = list(self.model.parameters())
        return {"kind": "header", "format": "lpfail.monitor/2", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                         time.gmtime()),
                "non_finite": "NaN and ±∞ are written as the strings \"NaN\", \"Infinity\", \"-Infinity\"",
                "versions": versions,
                "model": {"class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
                          "parameters": sum(p.numel() for p in params),
                          "trainable": sum(p.numel() for p in params if p.requires_grad),
                          "qk_layers": [src.name for src in self.qk], "found": self.found.splitlines()},
                "settings": {"every": self.every, "window": self.window, "thresholds": asdict(self.thresholds),
                             "score_dtype": str(self.score_dtype).replace("torch.", ""),
                             "sample_batch": self.sample_batch,
                             "alarm": asdict(self.alarm) if self.alarm is not None else None}}

    def _pre_forward(self, *_):
        self._depth += 1
        if self._depth > 1 or self._paused:  # a forward inside the model's own forward, or one not watched
            return
        self._forwards += 1
        self._mode.new_forward()
        if self.sampling:
            _refuse_cuda_graphs(self.model)  # also a model.compile(mode=...) made after attaching
            self._mode.__enter__()
            self._active = True

    def _post_forward(self, *_):
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and self._active:
            self._active = False
            self._mode.__exit__(None, None, None)

    @contextlib.contextmanager
    def paused(self):
        """Forwards made inside are not seen: neither counted nor examined (a training loop's validation), and
        compiled code inside runs compiled also on a sampled step."""
        prev, self._paused = self._paused, True
        self._hold_eager(False)
        try:
            yield self
        finally:
            self._paused = prev
            self._hold_eager(self.sampling)

    def __enter__(self) -> "Monitor":
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    @property
    def sampling(self) -> bool:
        """Whether the current step is a sampled one (its forwards' attention calls are examined)."""
        return self._step % self.every == 0

    def _on_sdpa(self, call: SDPACall, original):
        out = original()  # the model's own result, computed exactly as without the monitor
        if call.recomputed or call.module is not None and id(call.module) not in self._ids:
            return out    # a checkpoint's recomputation, or another model's call: not this forward's
        if self.sampling:  # statistics stay on the device until step(): the forward never waits for them
            mx, tied, rows = _logit_stats_device(call, self.score_dtype, self.sample_batch, self._masks)
            acc = self._calls.get(call.index)
            if acc is None:
                self._calls[call.index] = {"max": mx, "tied": tied, "rows": rows}
            else:
                acc["max"] = torch.maximum(acc["max"], mx)
                acc["tied"] = acc["tied"] + tied
                acc["rows"] = acc["rows"] + rows
            for obs in self.observers:
                if obs.wants_step(self._step):
                    obs.on_call(call, out, self._forwards)
        return out

    def _weight_groups(self) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
        """The Q/K weights of all layers, stacked: (layer indices, wq (n, H, hs, C), wk (n, Hkv, hs, C)) per
        group of layers with the same shapes and devices (one group for the usual uniform stack), so that
        the norms and the update Gram matrices of all layers take one batched call each."""
        groups: dict[tuple, list[int]] = {}
        ws = [src.get() for src in self.qk]
        for i, (wq, wk) in enumerate(ws):
            groups.setdefault((tuple(wq.shape), tuple(wk.shape), wq.device, wk.device), []).append(i)
        return [(ix, torch.stack([ws[i][0] for i in ix]), torch.stack([ws[i][1] for i in ix]))
                for ix in groups.values()]

    # -- one step -----------------------------------------------------------------------------------------
    def step(self, **extra) -> dict | None:
        """End a training step. On a sampled step: compute the record, check thresholds, write JSONL and
        return the record; otherwise return None. `extra` (e.g. loss=…) is stored in the record as is; the
        record's own keys (step, max_logit, …) cannot be given (a ValueError names them).

        All device work of a sampled step is batched: the norms of all layers in one call, the Gram matrices
        of all updates in one, and everything that goes to the host (logit statistics, norms, Gram matrices,
        what the observers add, e.g. the alarm's errors) in one copy per device; the host then does the eigenvalues
        of the update entropy."""
        if self._hooks is None:
            raise MonitorError("Monitor.step() called while not attached: use `with Monitor(model) as mon:` or "
                               "mon.attach()")
        clash = sorted(set(extra) & self._record_keys())
        if clash:
            raise ValueError(f"step() got {', '.join(map(repr, clash))}, which the record itself holds"
                             + (" (its step is the monitor's own count of step() calls since it was built, from 0;"
                                " pass your own under another name, e.g. global_step=)" if "step" in clash else ""))
        step = self._step
        self._step += 1
        self._hold_eager(self.sampling)  # the next step's forwards run eagerly if it is sampled
        forwards, self._forwards = self._forwards, 0
        if step % self.every:
            return None
        rec: dict = {"kind": "record", "step": step, **{k: _plain(v) for k, v in extra.items()}}
        host = _ToHost()
        calls, self._calls = self._calls, {}
        pending = self._gather_calls(calls, host)
        weights = self._gather_weights(step, host) if self.qk else None
        observed = [(obs, obs.on_step_end(step, host)) for obs in self.observers if obs.wants_step(step)]
        host.fetch()  # the one copy (per device) of this step: waits for the device once
        self._fill_calls(rec, pending, host)
        if weights is not None:
            self._fill_weights(rec, step, weights, host)
        for obs, state in observed:
            obs.on_record(rec, state, host)
        self._coverage(rec, step, forwards)
        self.records.append(rec)
        self._write(rec)
        for stat in ("max_logit", "tied_frac", "wq", "wqk", "update_entropy"):
            for layer, row in enumerate(rec.get(stat, [])):
                for head, value in enumerate(row or []):
                    self._check(step, stat, layer, head, float(value))
        return rec

    def _record_keys(self) -> frozenset[str]:
        """The keys a record holds of itself or from an observer: `step()`'s extras may not use them."""
        return _RECORD_KEYS.union(*(getattr(obs, "record_keys", ()) for obs in self.observers))

    def _gather_calls(self, calls: dict, host: "_ToHost") -> list:
        idx = sorted(calls)
        return [(host.add(calls[i]["max"]), host.add(calls[i]["tied"]),
                 host.add(calls[i]["rows"]) if isinstance(calls[i]["rows"], torch.Tensor) else calls[i]["rows"])
                for i in idx]

    def _fill_calls(self, rec: dict, pending: list, host: "_ToHost") -> None:
        if not pending:
            return
        rows = [r if isinstance(r, int) else int(host.get(r)) for _, _, r in pending]
        rec["max_logit"] = [host.get(m).tolist() for m, _, _ in pending]
        rec["tied_frac"] = [(host.get(t) / max(r, 1)).tolist() for (_, t, _), r in zip(pending, rows)]
        rec["rows"] = rows

    def _gather_weights(self, step: int, host: "_ToHost") -> dict:
        groups = self._weight_groups()
        norms = [host.add(_qk_norms_device(wq, wk, self._host_linalg)) for _, wq, wk in groups]
        window = self._snapshot is None or step - self._snapshot_step >= self.window
        grams = []
        if window and self._snapshot is not None:
            for (ix, wq, _), (old_ix, old) in zip(groups, self._snapshot):
                if ix != old_ix or wq.shape != old.shape:
                    raise MonitorError("the Q/K projections changed shape since the last weight snapshot")
                grams.append(host.add(_gram((wq.float() - old).transpose(-1, -2))))  # (n, H, hs, hs)
        return {"groups": groups, "norms": norms, "window": window, "grams": grams}

    def _fill_weights(self, rec: dict, step: int, w: dict, host: "_ToHost") -> None:
        n = len(self.qk)
        wqn, wqkn, ent = [None] * n, [None] * n, [None] * n
        for (ix, _, _), h in zip(w["groups"], w["norms"]):
            both = host.get(h)                                                # (2, n, H)
            for j, i in enumerate(ix):
                wqn[i], wqkn[i] = both[0, j].tolist(), both[1, j].tolist()
        rec["layers"] = [src.name for src in self.qk]
        rec["wq"], rec["wqk"] = wqn, wqkn
        if not w["window"]:
            return
        if w["grams"]:
            for (ix, _, _), h in zip(w["groups"], w["grams"]):
                e = _entropy_from_gram(torch.from_numpy(host.get(h)))
                for j, i in enumerate(ix):
                    ent[i] = e[j].tolist()
            rec["update_entropy"] = ent
            rec["update_window"] = [self._snapshot_step, step]
        self._snapshot = [(ix, wq.float()) for ix, wq, _ in w["groups"]]  # stacked: a copy, not a view
        self._snapshot_step = step

    def _coverage(self, rec: dict, step: int, forwards: int) -> None:
        """Say what was not seen: no forward through __call__, weights without attention calls (warned once,
        `MonitorCoverageWarning`), a call count that differs from the projection count; nothing at all is an
        error."""
        if forwards == 0:
            rec["warning"] = ("no forward of the monitored module ran through its __call__ during this step, so "
                              "its attention calls were not examined (call model(...), not model.forward(...))")
        elif "max_logit" not in rec and self.qk:
            unseen = self._mode.unseen_attention[:1] if self._mode is not None else []
            rec["warning"] = (f"Q/K projections of {len(self.qk)} layers were found, but no call of "
                              "torch.nn.functional.scaled_dot_product_attention was seen in this step's forwards: "
                              "the logit statistics (and the precision alarm) are missing"
                              + (f"; seen instead: {unseen[0]}" if unseen else ""))
            if not self._coverage_warned:
                self._coverage_warned = True
                warnings.warn(f"step {step}: {rec['warning']}", MonitorCoverageWarning, stacklevel=3)
        if "max_logit" not in rec and not self.qk:
            raise MonitorError(
                "nothing to monitor: no call of torch.nn.functional.scaled_dot_product_attention was seen during "
                "this step's forward passes, and no Q/K projections were found (looked for modules with "
                "q_proj/k_proj, query/key, c_attn/qkv + n_head, a fused q | k | v by its shape, or in_proj_weight "
                "+ num_heads). Run the forward between attach() and step(), or pass qk= a function returning the "
                "projections" + ("" if "max_logit" in rec else f" ({self.found})"))
        if "max_logit" in rec and not self.qk:
            self._warn_qk(f"step {step}: {len(rec['max_logit'])} attention calls were seen but no Q/K projections "
                          f"were found ({self.found.splitlines()[-1]}): the records hold no ‖W_Q‖, ‖W_Q W_Kᵀ‖ or "
                          "update entropy. Pass n_head= (a fused q | k | v without a head-count attribute) or qk=",
                          stacklevel=4)
        if "max_logit" in rec and self.qk and len(rec["max_logit"]) != len(self.qk):
            rec["warning"] = (f"{len(rec['max_logit'])} attention calls per step but {len(self.qk)} Q/K "
                              "projections: the call index and the projection index may not be the same layer")

    def _warn_qk(self, message: str, stacklevel: int) -> None:
        """A `MonitorCoverageWarning` about Q/K projections that were not found, once per monitor."""
        if not self._qk_warned:
            self._qk_warned = True
            warnings.warn(message, MonitorCoverageWarning, stacklevel=stacklevel)

    def scalars(self, record: dict | None = None, heads: bool = False) -> dict[str, float]:
        """The latest record (or `record`) as a flat {name: float} dict for TensorBoard's ``add_scalars`` or
        ``wandb.log`` (module function `scalars`); {} before the first sampled step."""
        rec = record if record is not None else (self.records[-1] if self.records else None)
        return {} if rec is None else scalars(rec, heads)

    def _check(self, step, stat, layer, head, value):
        key = (stat, layer, head)
        if self.thresholds.crossed(stat, value):
            if key in self._above:
                return
            self._above.add(key)
            where = f" ({self.qk[layer].name})" if stat in ("wq", "wqk", "update_entropy") else " (call order)"
            alert = Alert(step, stat, layer, head, value, getattr(self.thresholds, stat), where)
            self.alerts.append(alert)
            self._write({"kind": "alert", **asdict(alert)})
            msg = alert.message()
            if _logging_configured(log):
                log.warning(msg)
            else:
                warnings.warn(msg, MonitorWarning, stacklevel=3)
            if self.callback is not None:
                self.callback(alert)
        else:
            self._above.discard(key)

    def _write(self, obj: dict) -> None:
        if self.path is None:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(_strict(obj), allow_nan=False) + "\n")


def _logging_configured(logger: logging.Logger) -> bool:
    """Whether a WARNING record of `logger` reaches a handler other than a NullHandler (one the application added:
    ``logging.basicConfig``, a handler on "lpfail" or "lpfail.monitor", a test's log capture)."""
    if not logger.isEnabledFor(logging.WARNING):
        return False
    node = logger
    while node is not None:
        if any(not isinstance(h, logging.NullHandler) and h.level <= logging.WARNING for h in node.handlers):
            return True
        if not node.propagate:
            return False
        node = node.parent
    return False


_FLAT = ("max_logit", "tied_frac", "wq", "wqk", "update_entropy") + _ALARM_PER_HEAD


def scalars(record: dict, heads: bool = False) -> dict[str, float]:
    """A monitor record (from `Monitor.records` or `read_jsonl`) as a flat {name: float} dict:
    ``attn/layer{i}/{stat}`` per layer — the maximum over heads of max_logit, tied_frac, wq, wqk and the alarm's
    errors, coherences and ρ (the minimum of update_entropy) —, with `heads` also ``attn/layer{i}/head{h}/{stat}``
    (NaN where a head has no value), and the record's numeric extras (``loss``) by name. Layers are call
    positions for the logit statistics and the alarm's dQ/dK errors, projection positions (the record's
    `layers`) for the rest."""
    out: dict[str, float] = {}
    for stat in _FLAT:
        for layer, row in enumerate(record.get(stat) or []):
            vals = [float(v) for v in (row or []) if v is not None and not math.isnan(float(v))]
            if vals:
                out[f"attn/layer{layer}/{stat}"] = min(vals) if stat == "update_entropy" else max(vals)
            if heads:
                for h, v in enumerate(row or []):
                    out[f"attn/layer{layer}/head{h}/{stat}"] = math.nan if v is None else float(v)
    for k, v in record.items():
        if k not in _RECORD_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def cuda_graph_modules(model: nn.Module) -> list[str]:
    """The modules of `model` (by name; "" is the model) compiled to replay CUDA graphs: by ``torch.compile``
    with mode "reduce-overhead" or "max-autotune" (or ``options={"triton.cudagraphs": True}``), as the wrapper
    ``torch.compile`` returns or by ``module.compile(...)``. Whatever their device (on a CPU inductor makes no
    CUDA graph)."""
    out = []
    for name, m in model.named_modules():
        for compiled in (m, getattr(m, "_compiled_call_impl", None)):
            get = getattr(compiled, "get_compiler_config", None)  # set by torch.compile on what it returns
            config = get() if callable(get) else None
            if isinstance(config, dict) and config.get("triton.cudagraphs"):
                out.append(name)
                break
    return out


def _refuse_cuda_graphs(model: nn.Module) -> None:
    """A `MonitorError` for a model whose compiled parts replay CUDA graphs on a CUDA device (see the message)."""
    names = cuda_graph_modules(model)
    cuda = [n for n in names if any(p.is_cuda for p in model.get_submodule(n).parameters())]
    if cuda:
        where = ", ".join(repr(n) if n else "the model" for n in cuda)
        raise MonitorError(
            f"{where} is compiled with CUDA graphs (torch.compile mode 'reduce-overhead' or 'max-autotune'). On a "
            "sampled step the monitor runs the forward eagerly (dynamo's force_eager stance), between replays of "
            "the captured graphs; that has not been checked on a GPU, so the monitor refuses rather than risk "
            "records of the wrong forward. Compile with mode='max-autotune-no-cudagraphs' or the default mode "
            "(the same kernels, launched without a graph) while monitoring")


def _check_qk(qk: list[QKWeights]) -> None:
    """Each layer's projections as (H, hs, C) and (Hkv, hs, C) with Hkv dividing H: checked when the monitor is
    built, so that a wrong head layout (grouped-query attention without a key/value-head attribute, a qk=
    function's mistake) is an error that names the layer, not a shape error in a later step."""
    for src in qk:
        if not isinstance(src, QKWeights):
            raise MonitorError(f"qk= must return lpfail.monitor.QKWeights (got {type(src).__name__})")
        wq, wk = src.get()
        if wq.dim() != 3 or wk.dim() != 3 or wq.shape[1:] != wk.shape[1:] or wq.shape[0] % wk.shape[0]:
            raise MonitorError(f"{src.name}: Q/K projections of shapes {tuple(wq.shape)} and {tuple(wk.shape)} "
                               "are not (heads, head size, width) and (key/value heads, head size, width) with the "
                               "key/value heads dividing the query heads (grouped-query attention)")


class _ToHost:
    """Device tensors gathered during a sampled step and copied to the host together: one `.cpu()` per device
    (each copy makes the host wait for the device's queue, so one wait instead of one per statistic)."""

    def __init__(self):
        self._parts: dict[torch.device, list[torch.Tensor]] = {}
        self._host: dict[torch.device, list[np.ndarray]] | None = None

    def add(self, t: torch.Tensor) -> tuple:
        parts = self._parts.setdefault(t.device, [])
        parts.append(t.detach())
        return t.device, len(parts) - 1

    def fetch(self) -> None:
        self._host = {}
        for dev, parts in self._parts.items():
            flat = torch.cat([t.reshape(-1).to(torch.float64) for t in parts]).cpu().numpy()
            sizes = np.cumsum([t.numel() for t in parts])[:-1]
            self._host[dev] = [a.reshape(t.shape) for a, t in zip(np.split(flat, sizes), parts)]

    def get(self, handle: tuple) -> np.ndarray:
        """float64, on the host (after `fetch`)."""
        dev, i = handle
        return self._host[dev][i]


def _plain(v):
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _strict(obj):
    """`obj` with every non-finite float replaced by the string "NaN", "Infinity" or "-Infinity": strict JSON,
    which parsers other than Python's accept (they reject the bare NaN / Infinity tokens)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else ("NaN" if math.isnan(obj) else "Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def _decode(obj):
    if isinstance(obj, str):
        return _NON_FINITE.get(obj, obj)
    if isinstance(obj, dict):
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def read_jsonl(path: str | Path, decode: bool = True) -> list[dict]:
    """The header, records and alerts a Monitor wrote, in order. With `decode` the strings "NaN", "Infinity"
    and "-Infinity" (how the file spells non-finite numbers) are read back as floats."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [_decode(x) for x in lines] if decode else lines
