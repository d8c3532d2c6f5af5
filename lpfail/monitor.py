"""A training monitor for the failure this book studies, for any PyTorch model. Explained in chapter 7.

    from lpfail.monitor import Monitor, Thresholds
    mon = Monitor(model, path="run.jsonl")      # every=100, window=100: the defaults
    with mon:                                   # attaches; detaches on exit
        for step in range(steps):
            loss = model(x, y)[1]; loss.backward(); opt.step(); opt.zero_grad()
            mon.step(loss=loss.item())         # ends the step: on sampled steps, computes and writes a record

Nothing in the model's code changes. Two sources are used, each where it can be found:

* **attention calls**: every call of ``F.scaled_dot_product_attention`` made during the forwards of a sampled
  step (``step % every == 0``) is seen through `lpfail.sdpa_hook` (a TorchFunctionMode); from its q and k the
  monitor computes, per call (= layer, numbered in call order within a forward) and per head, the largest
  attention logit S = α·qkᵀ (FP32, over the allowed entries) and the fraction of query rows whose maximum is
  attained by ≥ 2 keys once S is rounded to BF16 (`score_dtype`): the tied maxima of chapter 1. The first
  `sample_batch` sequences of the batch are examined, to bound the cost.
* **Q/K projections**: modules that expose them (`find_qk` lists the patterns: ``q_proj``/``k_proj``,
  ``query``/``key``, a fused ``c_attn`` with ``n_head`` as in nanoGPT and lpfail's GPT, ``in_proj_weight`` as
  in nn.MultiheadAttention), or a user function ``qk=``. Per layer and head: ‖W_Q^h‖₂ and ‖W_Q^h W_K^hᵀ‖₂
  (spectral norms; the second is the bilinear form whose entries are the raw logits, paper Fig. 3), and
  every `window` steps the spectral entropy of the update ΔW_Q^h = W_Q^h(t) − W_Q^h(t − window): with
  σ_i the singular values and p_i = σ_i² / Σσ_j², H = −Σ p_i log p_i / log r (r = the number of singular
  values), 1 for an update spread evenly over all directions, 0 for a rank-one update (after arXiv
  2606.28116, which reports that a collapse of this entropy precedes divergence).

The monitor never changes the model's numbers: it reads detached tensors under ``torch.no_grad()`` with
autocast off, draws no random numbers and passes every SDPA call through unchanged (tests/test_monitor.py
checks bit-identical losses, also under autocast). Its cost is confined to sampled steps: the interceptor
mode is entered by a forward pre-hook of the model on sampled steps only and left by its forward hook, so an
unsampled step runs no monitor code but two hook calls; on a sampled step the logit statistics stay on the
device until `step()`; the norms come from hs × hs Gram matrices on the device (batched matmuls, no SVD;
all layers in one batch), and the update's spectral entropy, every `window` steps, from the eigenvalues of
those Gram matrices taken on the host in float64. A sampled step costs a number of device operations that
does not grow with the depth, beyond ≈ 20 per attention call in the forward, and one copy to the host
(tools/monitor_op_count.py counts them; GPT-2 small: ≈ 350 ops and 1 copy, against ≈ 2 400 and 36 before
2026-12-01 12:00, whose sampled steps cost ≈ 70-90 ms on an H200). On a sampled step where neither source yields anything it raises
`MonitorError`, naming what it looked for, instead of monitoring nothing.

Thresholds (`Thresholds`) turn statistics into alerts: a warning (`MonitorWarning`, through ``warnings``),
a ``logging`` record on the "lpfail.monitor" logger and the optional ``callback(alert)``, once when a
statistic of a (layer, head) crosses its threshold (and again only after it went back). Every record and
alert is one JSON line in `path`.
"""
from __future__ import annotations

import json
import logging
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from lpfail.sdpa_hook import SDPACall, SDPAInterceptor

log = logging.getLogger("lpfail.monitor")
log.addHandler(logging.NullHandler())  # a library: the application decides where records go

__all__ = ["Monitor", "Thresholds", "Alert", "MonitorError", "MonitorWarning", "QKWeights", "find_qk",
           "spectral_entropy", "attention_logit_stats"]


class MonitorError(RuntimeError):
    """The monitor cannot attach to the model, or found nothing to monitor."""


class MonitorWarning(UserWarning):
    """A monitored statistic crossed its threshold."""


@dataclass(frozen=True)
class Thresholds:
    """When to alert. None switches a statistic's alert off. Defaults, fixed before any evaluation:

    max_logit       30: BF16 spaces numbers in [16, 32) 0.125 apart and in [32, 64) 0.25 apart, so above
                    ≈ 30 neighbouring logits start to round to the same value (chapter 1's tied maxima)
    tied_frac       0.01: one query row in a hundred with a tied BF16 maximum in some head
    wq, wqk         off: their scale depends on the model (use the values of a healthy run)
    update_entropy  off: alert when the spectral entropy of ΔW_Q^h falls *below* this value
    """

    max_logit: float | None = 30.0
    tied_frac: float | None = 0.01
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
    q = call.q.detach()
    k, _ = call.kv_for_heads()
    k = k.detach()
    if q.dim() != 4:
        raise MonitorError(f"expected 4-D (batch, heads, seq, head_dim) q in scaled_dot_product_attention, got "
                           f"shape {tuple(q.shape)}")
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
        allowed = call.allowed()
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
            rows = rows + _live_rows(call, b)
    if max_logit is None:  # an empty batch
        max_logit = torch.full((nh,), -math.inf, dtype=torch.float64, device=q.device)
        tied = torch.zeros(nh, dtype=torch.int64, device=q.device)
    return max_logit, tied.double(), rows


def _live_rows(call: SDPACall, b: int) -> int:
    """Query rows of sequence b (head 0) with at least one allowed key, from the mask alone: an int computed on
    the host when the mask is only causal, else a 0-d tensor on the mask's device (never read during the
    forward)."""
    tq, tk = call.q.shape[-2], call.k.shape[-2]
    if call.attn_mask is None:
        return tq if tk > 0 else 0  # no mask, or causal (top-left: every row sees key 0)
    a = call.allowed()
    a = a if a.dim() == 2 else torch.broadcast_to(a, (*call.q.shape[:2], tq, tk))[b, 0]
    return a.any(dim=-1).sum()  # a 0-d tensor on the mask's device, read at step() with everything else


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
    linear algebra never runs a device SVD (on 2026-12-01 a CUDA SVD of 144 matrices of 768 × 768 per
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
    head h's query is x @ wq[h]ᵀ. `get` returns them (detached views or copies) when called."""

    name: str
    get: Callable[[], tuple[torch.Tensor, torch.Tensor]]


_HEAD_ATTRS = ("n_head", "num_heads", "num_attention_heads", "n_heads", "nhead")
_KV_ATTRS = ("num_key_value_heads", "n_kv_head", "n_kv_heads", "num_kv_heads")


def _first_int(module: nn.Module, attrs: tuple[str, ...]) -> int | None:
    """The first positive int among ``attrs`` on the module, then on its ``config``; None if none is."""
    for owner in (module, getattr(module, "config", None)):
        for a in attrs:
            v = getattr(owner, a, None) if owner is not None else None
            if isinstance(v, int) and v > 0:
                return v
    return None


def _heads(module: nn.Module, n_head: int | None) -> int | None:
    return n_head if n_head is not None else _first_int(module, _HEAD_ATTRS)


def _kv_heads(module: nn.Module, n_head: int) -> int:
    return _first_int(module, _KV_ATTRS) or n_head


def _split(w: torch.Tensor, heads: int, what: str, name: str) -> torch.Tensor:
    """(heads·hs, C) → (heads, hs, C)."""
    if w.shape[0] % heads:
        raise MonitorError(f"{name}: {what} has {w.shape[0]} output features, not divisible by {heads} heads")
    return w.detach().reshape(heads, w.shape[0] // heads, w.shape[1])


def find_qk(model: nn.Module, n_head: int | None = None) -> list[QKWeights]:
    """The Q/K projections of every attention layer of `model`, in module order. Patterns looked for:

    * children ``q_proj`` and ``k_proj`` (nn.Linear; heads from ``num_heads``/``n_head``/… or ``config``)
    * children ``query`` and ``key`` (nn.Linear; BERT-style)
    * a child ``c_attn`` (nn.Linear, output 3·C = q | k | v) on a module with ``n_head`` (nanoGPT, lpfail)
    * a parameter ``in_proj_weight`` (3·E, E) with ``num_heads`` (nn.MultiheadAttention)

    `n_head` overrides the head count where the module does not say it. Returns [] when nothing matches."""
    found: list[QKWeights] = []
    for name, m in model.named_modules():
        lin = lambda a: isinstance(getattr(m, a, None), nn.Linear)  # noqa: E731
        if lin("q_proj") and lin("k_proj") or lin("query") and lin("key"):
            qn, kn = ("q_proj", "k_proj") if lin("q_proj") else ("query", "key")
            h = _heads(m, n_head)
            if h is None:
                raise MonitorError(f"{name}: found {qn}/{kn} but no head count ({', '.join(_HEAD_ATTRS)}); "
                                   "pass n_head=")
            hk = _kv_heads(m, h)

            def get(m=m, qn=qn, kn=kn, h=h, hk=hk, name=name):
                return (_split(getattr(m, qn).weight, h, qn, name), _split(getattr(m, kn).weight, hk, kn, name))
            found.append(QKWeights(name, get))
        elif (lin("c_attn") or isinstance(getattr(m, "in_proj_weight", None), torch.Tensor)) and \
                (h := _heads(m, n_head)) is not None:
            # a fused q | k | v projection, (3·C, C): nanoGPT's c_attn, nn.MultiheadAttention's in_proj_weight
            attr, what = ("c_attn", "c_attn") if lin("c_attn") else ("in_proj_weight", "in_proj")
            w = m.c_attn.weight if attr == "c_attn" else m.in_proj_weight
            if attr == "c_attn" and w.shape[0] != 3 * w.shape[1]:
                continue  # not a fused q | k | v of width C

            def get(m=m, h=h, name=name, attr=attr, what=what):
                w = m.c_attn.weight if attr == "c_attn" else m.in_proj_weight
                c = w.shape[1]
                return _split(w[:c], h, f"{what} (q)", name), _split(w[c:2 * c], h, f"{what} (k)", name)
            found.append(QKWeights(name, get))
    return found


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
class Monitor:
    """See the module docstring. Arguments:

    model         any nn.Module
    every         sample every `every`-th step (steps counted by `step()`, starting at 0). Default 100: on an
                  H200 (2026-12-01, GPT-2 small, tools/gpu_monitor_overhead.py) a sampled step costs tens of
                  milliseconds (the logit statistics in the forward, the norms, the update's eigenvalues on the
                  host every `window`), which at every=10 came to a mean overhead of several percent; the
                  logit alert was evaluated on chapter 1's runs at this resolution (their diagnostics every
                  100 steps). Smaller values watch more closely and cost proportionally more.
    window        steps between the weight snapshots whose difference is ΔW (a multiple of `every`)
    path          JSONL file to append records and alerts to (None: keep them in `records` only)
    thresholds    a `Thresholds`
    callback      called with each `Alert`
    score_dtype   dtype the scores are rounded to for the tied-maximum count (BF16: what PAPER_BF16 stores)
    sample_batch  sequences of each sampled batch examined for the logit statistics
    n_head        head count, where the attention modules do not expose it
    qk            None (use `find_qk`), or a function model → list[QKWeights]
    """

    def __init__(self, model: nn.Module, every: int = 100, window: int = 100, path: str | Path | None = None,
                 thresholds: Thresholds = Thresholds(), callback: Callable[[Alert], None] | None = None,
                 score_dtype: torch.dtype = torch.bfloat16, sample_batch: int = 1, n_head: int | None = None,
                 qk: Callable[[nn.Module], list[QKWeights]] | None = None):
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
        self.model, self.every, self.window, self.thresholds = model, every, window, thresholds
        self.callback, self.score_dtype, self.sample_batch = callback, score_dtype, sample_batch
        self.path = Path(path) if path is not None else None
        self.qk = qk(model) if qk is not None else find_qk(model, n_head)
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

    # -- attaching --------------------------------------------------------------------------------------
    def attach(self) -> "Monitor":
        """Start watching. Two forward hooks on the model's top module are all that stays attached: on a
        sampled step the pre-hook enters the SDPA interceptor (a TorchFunctionMode) and the post-hook leaves
        it, so the mode is active only during the forwards of sampled steps; on the other steps no torch
        call passes through Python code of the monitor."""
        if self._hooks is not None:
            raise MonitorError("this Monitor is already attached")
        self._mode = SDPAInterceptor(self._on_sdpa)
        self._depth, self._active = 0, False
        self._hooks = (self.model.register_forward_pre_hook(self._pre_forward),
                       self.model.register_forward_hook(self._post_forward, always_call=True))
        return self

    def detach(self) -> None:
        if self._hooks is not None:
            if self._active:
                self._mode.__exit__(None, None, None)
            for hk in self._hooks:
                hk.remove()
            self._hooks, self._mode, self._active, self._depth = None, None, False, 0

    def _pre_forward(self, *_):
        self._depth += 1
        if self._depth > 1:                # a forward inside the model's own forward: already handled
            return
        self._forwards += 1
        self._mode.new_forward()
        if self.sampling:
            self._mode.__enter__()
            self._active = True

    def _post_forward(self, *_):
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and self._active:
            self._active = False
            self._mode.__exit__(None, None, None)

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
        if self.sampling:  # statistics stay on the device until step(): the forward never waits for them
            mx, tied, rows = _logit_stats_device(call, self.score_dtype, self.sample_batch, self._masks)
            acc = self._calls.get(call.index)
            if acc is None:
                self._calls[call.index] = {"max": mx, "tied": tied, "rows": rows}
            else:
                acc["max"] = torch.maximum(acc["max"], mx)
                acc["tied"] = acc["tied"] + tied
                acc["rows"] = acc["rows"] + rows
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
        return the record; otherwise return None. `extra` (e.g. loss=…) is stored in the record as is.

        All device work of a sampled step is batched: the norms of all layers in one call, the Gram matrices
        of all updates in one, and everything that goes to the host (logit statistics, norms, Gram matrices)
        in one copy per device; the host then does the eigenvalues of the update entropy."""
        if self._hooks is None:
            raise MonitorError("Monitor.step() called while not attached: use `with Monitor(model) as mon:` or "
                               "mon.attach()")
        step = self._step
        self._step += 1
        forwards, self._forwards = self._forwards, 0
        if step % self.every:
            return None
        rec: dict = {"kind": "record", "step": step, **{k: _plain(v) for k, v in extra.items()}}
        calls, self._calls = self._calls, {}
        idx = sorted(calls)
        host = _ToHost()
        h_max = [host.add(calls[i]["max"]) for i in idx]
        h_tied = [host.add(calls[i]["tied"]) for i in idx]
        h_rows = [host.add(calls[i]["rows"]) if isinstance(calls[i]["rows"], torch.Tensor) else calls[i]["rows"]
                  for i in idx]
        if forwards == 0:
            rec["warning"] = ("no forward of the monitored module ran through its __call__ during this step, so "
                              "its attention calls were not examined (call model(...), not model.forward(...))")
        window = False
        if self.qk:
            groups = self._weight_groups()
            h_norms = [host.add(_qk_norms_device(wq, wk, self._host_linalg)) for _, wq, wk in groups]
            window = self._snapshot is None or step - self._snapshot_step >= self.window
            h_gram = []
            if window and self._snapshot is not None:
                for (ix, wq, _), (old_ix, old) in zip(groups, self._snapshot):
                    if ix != old_ix or wq.shape != old.shape:
                        raise MonitorError("the Q/K projections changed shape since the last weight snapshot")
                    h_gram.append(host.add(_gram((wq.float() - old).transpose(-1, -2))))  # (n, H, hs, hs)
        host.fetch()  # the one copy (per device) of this step: waits for the device once
        if idx:
            rec["max_logit"] = [host.get(h).tolist() for h in h_max]
            rows = [r if isinstance(r, int) else int(host.get(r)) for r in h_rows]
            rec["tied_frac"] = [(host.get(h) / max(r, 1)).tolist() for h, r in zip(h_tied, rows)]
            rec["rows"] = rows
        if self.qk:
            n = len(self.qk)
            wqn, wqkn, ent = [None] * n, [None] * n, [None] * n
            for (ix, _, _), h in zip(groups, h_norms):
                both = host.get(h)                                            # (2, n, H)
                for j, i in enumerate(ix):
                    wqn[i], wqkn[i] = both[0, j].tolist(), both[1, j].tolist()
            rec["layers"] = [src.name for src in self.qk]
            rec["wq"], rec["wqk"] = wqn, wqkn
            if window:
                if h_gram:
                    for (ix, _, _), h in zip(groups, h_gram):
                        e = _entropy_from_gram(torch.from_numpy(host.get(h)))
                        for j, i in enumerate(ix):
                            ent[i] = e[j].tolist()
                    rec["update_entropy"] = ent
                    rec["update_window"] = [self._snapshot_step, step]
                self._snapshot = [(ix, wq.float()) for ix, wq, _ in groups]  # stacked: a copy, not a view
                self._snapshot_step = step
        if "max_logit" not in rec and not self.qk:
            raise MonitorError(
                "nothing to monitor: no call of torch.nn.functional.scaled_dot_product_attention was seen during "
                "this step's forward passes, and no Q/K projections were found (looked for modules with "
                "q_proj/k_proj, query/key, c_attn + n_head, or in_proj_weight + num_heads). Run the forward "
                "between attach() and step(), or pass qk= a function returning the projections")
        if "max_logit" in rec and self.qk and len(rec["max_logit"]) != len(self.qk):
            rec["warning"] = (f"{len(rec['max_logit'])} attention calls per step but {len(self.qk)} Q/K "
                              "projections: the call index and the projection index may not be the same layer")
        self.records.append(rec)
        self._write(rec)
        for stat in ("max_logit", "tied_frac", "wq", "wqk", "update_entropy"):
            for layer, row in enumerate(rec.get(stat, [])):
                for head, value in enumerate(row):
                    self._check(step, stat, layer, head, float(value))
        return rec

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
            warnings.warn(msg, MonitorWarning, stacklevel=3)
            log.warning(msg)
            if self.callback is not None:
                self.callback(alert)
        else:
            self._above.discard(key)

    def _write(self, obj: dict) -> None:
        if self.path is None:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(obj, allow_nan=True) + "\n")


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


def read_jsonl(path: str | Path) -> list[dict]:
    """The records and alerts a Monitor wrote, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
