"""The precision alarm: an observer of `lpfail.monitor.Monitor` (its protocol: `lpfail.monitor.Observer`), turned on
with ``Monitor(model, alarm=Alarm())``, which builds one `AlarmObserver` from the `Alarm` settings.

**The precision alarm** (``alarm=Alarm()``; what separates a precision failure from a learning rate that is
too high, which the logit alert cannot: chapter 7). On a sampled step (every `Alarm.every`), for each SDPA call
of the step's first forward, tensor hooks capture the gradient dO of its output and the model's own dQ and dK;
the attention of the first `sample_batch` sequences is recomputed from the same q, k, v by the reference
(`reference_grads`: FP64 truth, or the FP32 preset) and the record holds, per call and head, the relative
errors ‖dQ − dQ_ref‖/‖dQ_ref‖ and the same for dK (``alarm_dq_rel``, ``alarm_dk_rel``; None for a head whose
reference is exactly 0, e.g. dQ at sequence length 1, where the ratio means nothing). The error is also pushed
back to the projections: ΔW_Q = (∂q/∂W_Q)ᵀ (dQ − dQ_ref), by autograd through the model's own graph from q to
the parameter (RoPE, reshapes and fused projections included; the graph is kept for the backward in progress,
so the model's gradients are unchanged, tested), the same for W_K. Each is kept as a fixed random sketch
Uᵀ ΔW^h V (s × s per head, linear, norm-preserving in expectation), and over the latest `Alarm.window`
measurements the record gives per projection layer and head the coherence ‖Σ_k ΔW_k‖ / Σ_k ‖ΔW_k‖
(``alarm_coherence_q``/``_k``: 1 when the error keeps one direction and sign from step to step — the paper's
Eq. 3 signature —, ≈ 1/√K when it cancels) and chapter 3's ρ_K = ‖Σ ΔW_k‖ / √(Σ ‖ΔW_k‖²) (``alarm_rho_q``/``_k``).
Calls it cannot recompute (a mask, dropout, no gradient) are listed in ``alarm_skipped``. The alarm raises no
alert itself: `scaled_fires` applies the rule tested in chapter 7 (`ScaledRule`) to a monitor's records
(``scaled_fires(monitor.records)``: the step at which it fires, or None).

The monitor re-exports this module's public names (``from lpfail.monitor import Alarm`` works), and knows the
record keys it adds (`RECORD_KEYS`; `PER_HEAD` are those that `lpfail.monitor.scalars` flattens). This module
imports nothing of the monitor's at run time.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

import torch

from lpfail.sdpa_hook import SDPACall, _to4

if TYPE_CHECKING:
    from lpfail.monitor import Monitor, QKWeights

__all__ = ["Alarm", "AlarmObserver", "RECORD_KEYS", "PER_HEAD", "reference_grads", "relative_error", "coherence",
           "rho", "ScaledRule", "SCALED_RULE", "scaled_statistic", "scaled_fires", "head_value"]

#: the keys the alarm adds to a monitor record (which `Monitor.step`'s extras may not use, alarm or not)
RECORD_KEYS = frozenset({"alarm_dq_rel", "alarm_dk_rel", "alarm_coherence_q", "alarm_coherence_k", "alarm_rho_q",
                         "alarm_rho_k", "alarm_terms", "alarm_skipped"})
#: of those, the per (call or projection layer, head) statistics, in the order `lpfail.monitor.scalars` flattens them
PER_HEAD = ("alarm_dq_rel", "alarm_dk_rel", "alarm_coherence_q", "alarm_coherence_k", "alarm_rho_q", "alarm_rho_k")


def _no_autocast(device: torch.device):
    """A context in which autocast is off on `device` (the monitor's helper of the same name, for the alarm's
    recomputation and sketches)."""
    return torch.autocast(device_type=device.type, enabled=False)


@dataclass(frozen=True)
class Alarm:
    """Settings of the precision alarm (module docstring). It raises no alert itself: `scaled_fires` applies
    chapter 7's tested rule to the monitor's records.

    every      steps between two measurements, a multiple of the monitor's `every` (None: the monitor's)
    reference  "FP64" or "FP32": the `lpfail.precision` preset the attention is recomputed under
    window     measurements whose error terms the coherence and ρ sum (the latest `window`, per layer and
               head). 16: the draft rule's (notes/beyond.md): under random signs ρ² has mean 1 whatever the
               terms' sizes, and 16 terms of one sign give ρ up to 4, beyond what random signs reach in a run
    sketch     side s of the fixed random sketch Uᵀ E V (s × s per head) the error terms are kept as
    seed       seed of the sketch's random matrices
    """

    every: int | None = None
    reference: str = "FP64"
    window: int = 16
    sketch: int = 16
    seed: int = 0

    def __post_init__(self):
        for nm in ("window", "sketch") + (("every",) if self.every is not None else ()):
            v = getattr(self, nm)
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"Alarm.{nm} must be a positive int (got {v!r})")
        if self.window < 2:
            raise ValueError("Alarm.window must be ≥ 2: the coherence of one term is 1 by definition")
        if self.reference not in _REFERENCES:
            raise ValueError(f"Alarm.reference must be one of {sorted(_REFERENCES)} (got {self.reference!r})")


def _references():
    from lpfail.precision import FP32, FP64

    return {"FP64": (FP64, torch.float64), "FP32": (FP32, torch.float32)}


_REFERENCES = ("FP64", "FP32")


def reference_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, is_causal: bool,
                    scale: float | None, reference: str = "FP64") -> tuple[torch.Tensor, torch.Tensor]:
    """(dQ, dK) of softmax(α q kᵀ) v for the output gradient `do`, recomputed by `lpfail.attention` from the same
    inputs (upcast exactly), autocast off: "FP64" by `naive_attention` (the truth: float64, untiled, autograd —
    a few kernels, where the tiled FP64 policy would take hundreds), "FP32" by `attention` under the FP32
    preset (FlashAttention-2's algorithm in FP32). q (B, H, Tq, D); k, v (B, Hkv, Tk, D), expanded to H heads
    inside the graph, so dK has k's shape; `is_causal` as the reference aligns it (bottom-right: SDPA's
    top-left when Tq = Tk, the only causal case the alarm measures)."""
    from lpfail.attention import attention, naive_attention

    policy, dt = _references()[reference]
    qh, kh, vh = (t.detach().to(dt).requires_grad_() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    with torch.enable_grad(), _no_autocast(q.device):
        ke, ve = (t.repeat_interleave(rep, dim=1) if rep > 1 else t for t in (kh, vh))
        if reference == "FP64":
            o = naive_attention(qh, ke, ve, causal=is_causal, scale=scale, check_finite=False)
        else:
            o = attention(qh, ke, ve, policy=policy, causal=is_causal, scale=scale, check_finite=False)
        dq, dk = torch.autograd.grad(o, (qh, kh), do.detach().to(o.dtype))
    return dq, dk


#: What `AlarmObserver` stores for a head whose reference gradient is exactly 0 (a relative error with no
#: meaning: e.g. dQ of a sequence of length 1, whose softmax has one key); the record holds None there.
_NOT_APPLICABLE = -1.0


def relative_error(a: torch.Tensor, ref: torch.Tensor, na: float = math.nan) -> torch.Tensor:
    """Per head (dim 1 of (B, H, T, D)): ‖a − ref‖ / ‖ref‖ in float64 over the other dims; `na` (NaN unless
    given) where ref = 0, whatever a is (never ±∞: the reference dQ of a sequence of length 1 is exactly 0)."""
    d = (a.double() - ref.double()).square().sum(dim=(0, 2, 3)).sqrt()
    n = ref.double().square().sum(dim=(0, 2, 3)).sqrt()
    return torch.where(n > 0, d / torch.where(n > 0, n, torch.ones_like(n)), torch.full_like(n, na))


def _applicable(values: list) -> list:
    """A head's relative errors as the record holds them: None where the reference was 0 (`_NOT_APPLICABLE`)."""
    return [None if v == _NOT_APPLICABLE else v for v in values]


def coherence(terms: torch.Tensor) -> torch.Tensor:
    """‖Σ_k t_k‖ / Σ_k ‖t_k‖ for terms (K, …, n) → (…): 1 when every term points the same way with the same
    sign, ≈ √(Σ‖t_k‖²)/Σ‖t_k‖ (1/√K for equal sizes: → 0) when their signs or directions are random; NaN when
    every term is 0. The running sum's share that survives cancellation (chapter 3's ρ_K divides by
    √(Σ‖t_k‖²) instead: `rho`)."""
    t = terms.double()
    total = t.sum(dim=0).norm(dim=-1)
    return total / t.norm(dim=-1).sum(dim=0)


def rho(terms: torch.Tensor) -> torch.Tensor:
    """Chapter 3's ρ_K = ‖Σ_k t_k‖ / √(Σ_k ‖t_k‖²) for terms (K, …, n) → (…): √K for K equal parallel terms of
    one sign, ≈ 1 for random signs (`lpfail.gradient_error.coherence_ratio`, with the exact denominator)."""
    t = terms.double()
    return t.sum(dim=0).norm(dim=-1) / t.square().sum(dim=(0, -1)).sqrt()


def _refusal(call: SDPACall) -> str | None:
    """Why the alarm cannot recompute this call, or None."""
    if not (call.q.requires_grad or call.k.requires_grad):
        return "no gradient reaches q or k (torch.no_grad, or a reentrant checkpoint's forward)"
    if call.attn_mask is not None:
        return "an attn_mask (the alarm recomputes calls without one: is_causal or no mask)"
    if call.dropout_p:
        return f"dropout_p={call.dropout_p} (the reference has no dropout)"
    if call.is_causal and call.q.shape[-2] != call.k.shape[-2]:
        return "causal with Tq ≠ Tk (SDPA aligns that mask top-left, the reference bottom-right)"
    return None


class AlarmObserver:
    """The precision alarm as an observer of the monitor (`lpfail.monitor.Observer`'s hooks): on the steps it
    measures (`wants_step`) it hooks every SDPA call of the step's first forward (`on_call`); during the
    backward the hooks fill its measurements in flight (`pending`, `skipped`); `on_step_end` and `on_record`
    move them into its windows of sketched error terms, per projection layer (`windows`), and into the record.
    Built by the monitor from ``alarm=Alarm(...)`` (`Monitor._alarm`); `every` is the monitor's."""

    record_keys = RECORD_KEYS

    def __init__(self, settings: Alarm, every: int):
        if (settings.every or every) % every:
            raise ValueError(f"Alarm.every ({settings.every}) must be a multiple of every ({every})")
        self.settings = settings
        self.every = settings.every or every
        self.pending: dict[int, dict] = {}      # call index → {"dq_rel", "dk_rel", "layer", "sq", "sk"}
        self.skipped: list[str] = []
        self.windows: dict[int, list[tuple[torch.Tensor | None, torch.Tensor | None]]] = {}
        self._proj: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.qk: list[QKWeights] = []
        self.sample_batch = 1
        self._layer_of: dict[int, int] = {}

    # -- the observer's hooks (`lpfail.monitor.Observer`) ---------------------------------------------------
    def bind(self, monitor: Monitor) -> None:
        """The monitor's Q/K projections (the layers the error terms are pushed back to) and `sample_batch`."""
        self.qk, self.sample_batch = monitor.qk, monitor.sample_batch
        self._layer_of = {id(src.module): i for i, src in enumerate(self.qk) if src.module is not None}

    def wants_step(self, step: int) -> bool:
        """Whether the alarm measures on this step: every `Alarm.every` (the monitor's `every` if None)."""
        return step % self.every == 0

    def on_call(self, call: SDPACall, out: torch.Tensor, forward: int) -> None:
        """Hooks on the calls of the step's first forward (the one whose backward the step's gradients are)."""
        if forward == 1:
            self._hooks(call, out)

    def on_step_end(self, step: int, host) -> dict:
        """The step's measurement closed, its device tensors handed to the monitor's one copy to the host."""
        done = self.close()
        per_call = {i: {k: host.add(v) for k, v in e.items() if k in ("dq_rel", "dk_rel")} for i, e in done.items()}
        layers = sorted({e["layer"] for e in done.values() if e.get("layer") is not None})
        stats = {layer: {k: host.add(v) for k, v in self.statistics(layer).items()} for layer in layers}
        skipped, self.skipped = self.skipped, []
        return {"per_call": per_call, "stats": stats, "skipped": skipped}

    def on_record(self, rec: dict, a: dict, host) -> None:
        """alarm_dq_rel / alarm_dk_rel per call (as max_logit), alarm_coherence_q / _k and alarm_rho_q / _k per
        projection layer (as wq; None where the window holds fewer than two terms), alarm_terms (terms in each
        layer's window), alarm_skipped (why calls were not measured)."""
        idx = sorted(a["per_call"])
        for key in ("dq_rel", "dk_rel"):
            rec[f"alarm_{key}"] = [_applicable(host.get(a["per_call"][i][key]).tolist()) if key in a["per_call"][i]
                                   else None for i in idx]
        n = len(self.qk)
        for key in ("coherence_q", "coherence_k", "rho_q", "rho_k"):
            rec[f"alarm_{key}"] = [host.get(a["stats"][i][key]).tolist() if i in a["stats"] and key in a["stats"][i]
                                   else None for i in range(n)]
        rec["alarm_terms"] = [len(self.windows.get(i, [])) for i in range(n)]
        if not idx and not a["skipped"]:
            a["skipped"] = ["no backward reached the attention calls of this step's first forward"]
        if a["skipped"]:
            rec["alarm_skipped"] = a["skipped"]

    # -- the measurement --------------------------------------------------------------------------------------
    def sketch(self, e: torch.Tensor) -> torch.Tensor:
        """Uᵀ E V for per-head error terms e (H, hs, C) → (H, s²), U (hs, s) and V (C, s) fixed Gaussian
        matrices with variance 1/s: linear (so the sketch of a sum is the sum of the sketches) and
        E‖Uᵀ E V‖² = ‖E‖²."""
        s = self.settings.sketch
        key = (e.shape[-2], e.shape[-1], e.device)
        if key not in self._proj:
            g = torch.Generator().manual_seed(self.settings.seed)
            u = torch.randn(e.shape[-2], s, generator=g, dtype=torch.float64) / math.sqrt(s)
            v = torch.randn(e.shape[-1], s, generator=g, dtype=torch.float64) / math.sqrt(s)
            self._proj[key] = (u.to(e.device), v.to(e.device))
        u, v = self._proj[key]
        with _no_autocast(e.device):
            return (u.t() @ e.double() @ v).flatten(-2)

    def close(self) -> dict:
        """The measurement of this step, its terms moved into the windows: {call index: pending entry}."""
        done, self.pending = self.pending, {}
        for entry in done.values():
            layer = entry.get("layer")
            if layer is None or ("sq" not in entry and "sk" not in entry):
                continue
            win = self.windows.setdefault(layer, [])
            win.append((entry.get("sq"), entry.get("sk")))
            del win[:-self.settings.window]
        return done

    def statistics(self, layer: int) -> dict[str, torch.Tensor]:
        """Coherence and ρ of the window's terms of one layer (Q and K), device tensors (H,) / (Hkv,)."""
        win = self.windows.get(layer, [])
        out = {}
        for j, name in enumerate(("q", "k")):
            terms = [w[j] for w in win if w[j] is not None]
            if len(terms) >= 2:
                t = torch.stack(terms)
                out[f"coherence_{name}"], out[f"rho_{name}"] = coherence(t), rho(t)
        return out

    def _layer(self, call: SDPACall) -> int | None:
        """The index in `qk` of the projections whose SDPA call this is: by the calling module, else (a qk=
        function without modules) by the call's position when the counts agree."""
        if call.module is not None and id(call.module) in self._layer_of:
            return self._layer_of[id(call.module)]
        if not self._layer_of and call.index is not None and call.index < len(self.qk):
            return call.index
        return None

    def _hooks(self, call: SDPACall, out: torch.Tensor) -> None:
        """Tensor hooks that, during this forward's backward, recompute the call's attention under the
        reference for the first `sample_batch` sequences and record the errors of the model's dQ and dK."""
        reason = _refusal(call)
        if reason is not None:
            self.skipped.append(f"call {call.index}: {reason}")
            return
        q4, k4, v4 = (_to4(t.detach()) for t in (call.q, call.k, call.v))
        nb = min(self.sample_batch, q4.shape[0])
        layer = self._layer(call)
        src = self.qk[layer] if layer is not None else None
        entry = self.pending.setdefault(call.index, {"layer": layer})
        st: dict = {"busy": False}
        settings = self.settings

        def on_out(g):
            st["do"] = _to4(g.detach())[:nb]

        def grad_hook(which: int, tensor: torch.Tensor):
            def hook(g):
                if st["busy"] or "do" not in st:
                    return
                st["busy"] = True
                try:
                    if "ref" not in st:
                        st["ref"] = reference_grads(q4[:nb], k4[:nb], v4[:nb], st["do"], call.is_causal,
                                                    call.scale, settings.reference)
                    g4 = _to4(g.detach())
                    entry[("dq_rel", "dk_rel")[which]] = relative_error(g4[:nb], st["ref"][which], _NOT_APPLICABLE)
                    if src is not None and src.params is not None:
                        entry[("sq", "sk")[which]] = self._param_term(src, which, tensor, g, st["ref"][which], nb)
                finally:
                    st["busy"] = False
            return hook

        out.register_hook(on_out)
        for which, t in enumerate((call.q, call.k)):
            if t.requires_grad:
                t.register_hook(grad_hook(which, t))

    def _param_term(self, src: QKWeights, which: int, tensor: torch.Tensor, g: torch.Tensor, ref: torch.Tensor,
                    nb: int) -> torch.Tensor | None:
        """The error of the gradient that reaches W_Q (which = 0) or W_K (1) through this call, per head and
        sketched: ΔW = (∂q/∂W)ᵀ (dq_model − dq_ref), by autograd through the model's own graph from q to its
        projection (RoPE and reshapes included), the graph kept for the backward in progress."""
        full = torch.zeros_like(g)
        _to4(full)[:nb] = (_to4(g.detach())[:nb].double() - ref).to(g.dtype)
        param = src.params[which]
        (dw,) = torch.autograd.grad(tensor, param, full, retain_graph=True, allow_unused=True)
        if dw is None:
            return None
        e = src.split(dw, dw)[which]                                   # (H or Hkv, hs, C)
        return self.sketch(e)


# -- an alert rule on the records (chapter 7) --------------------------------------------------------------------------
# Pre-registered on 2026-12-06 in lpfail.experiments.precision_alarm (which re-exports it) and tested there on 120
# fresh runs; moved here unchanged so that a user can apply it to a monitor's records without the experiment:
# ``scaled_fires(monitor.records)``. Chapter 7 says what its test showed: it tells the paper's arithmetic from FP32
# attention, and mostly from production arithmetic, but fires by the same early step whether or not a run diverges.
def head_value(nested, layer: int, head: int):
    """``nested[layer][head]`` of a record's per (layer, head) statistic, or None where the layer or head is absent."""
    try:
        row = nested[layer]
        return None if row is None else row[head]
    except (IndexError, TypeError):
        return None


@dataclass(frozen=True)
class ScaledRule:
    """The second alert rule. At each measurement, per (layer, head): e = ½·(dQ's + dK's relative error against the
    high-precision recomputation) divided by max(the head's largest logit, `logit_floor`) — BF16 rounding makes the
    gradient's error grow with the logits, and the paper's arithmetic makes it grow faster per unit of logit than
    production arithmetic; the statistic is the median of e over every (layer, head) with finite values. The run's
    alarm is the first measurement at which the statistic has been ≥ `threshold` for `consecutive` measurements in
    a row (with the monitor every 10 steps, 8 measurements = 70 steps after the first)."""

    threshold: float = 5e-4
    consecutive: int = 8
    logit_floor: float = 1.0

    def __post_init__(self):
        if not (self.threshold > 0 and self.logit_floor > 0):
            raise ValueError(f"ScaledRule.threshold and logit_floor must be > 0 (got {self.threshold}, "
                             f"{self.logit_floor})")
        if not (isinstance(self.consecutive, int) and not isinstance(self.consecutive, bool) and self.consecutive >= 1):
            raise ValueError(f"ScaledRule.consecutive must be a positive int (got {self.consecutive!r})")


SCALED_RULE = ScaledRule()


def scaled_statistic(rec: Mapping, floor: float = SCALED_RULE.logit_floor) -> float:
    """One record's statistic (`ScaledRule`): the median over (layer, head) of ½(dQ + dK relative error) / max(largest
    logit, floor); NaN when no head has all three values finite."""
    vals = []
    for layer, heads in enumerate(rec.get("alarm_dq_rel") or []):
        for head, eq in enumerate(heads or []):
            ek, ml = head_value(rec.get("alarm_dk_rel"), layer, head), head_value(rec.get("max_logit"), layer, head)
            if all(x is not None and math.isfinite(x) for x in (eq, ek, ml)):
                vals.append(0.5 * (eq + ek) / max(ml, floor))
    return float(np.median(vals)) if vals else float("nan")


def scaled_fires(records: Iterable[Mapping], rule: ScaledRule = SCALED_RULE) -> int | None:
    """The second rule on one run's monitor records (in step order): the step of its alarm, or None. Records
    without the alarm's fields are skipped; a NaN statistic breaks a run of measurements."""
    run = 0
    for rec in records:
        if rec.get("kind", "record") != "record" or "alarm_dq_rel" not in rec:
            continue
        x = scaled_statistic(rec, rule.logit_floor)
        run = run + 1 if math.isfinite(x) and x >= rule.threshold else 0
        if run >= rule.consecutive:
            return int(rec["step"])
    return None
