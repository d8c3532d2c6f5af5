"""The monitor's thresholds evaluated on the `lr_sweep` runs (chapter 7).

The lr_sweep runs recorded, every `diag_every` steps, the largest attention logit per layer (the maximum over
heads, in BF16 scores, `lpfail.model.logit_capture`), which is exactly what `lpfail.monitor` compares with
`Thresholds.max_logit` (an alert fires when any head of any layer exceeds it). So the monitor's max-logit alert
can be replayed on every stored run. The rule, fixed on 2026-12-01 before this evaluation was run:

* alert step of a run: the first recorded step at which the largest logit over layers exceeds the threshold
  (default: `Thresholds().max_logit`, 30);
* divergence step of an A run (PAPER_BF16): the first bin of its training-loss curve (bins of
  max_steps / curve_points steps, reported by their first step) in which its loss exceeds that of the C run
  (FP32) with the same learning rate and seed by more than `margin` (5 %); NaN if it never does;
* lead time: divergence step − alert step (positive: the alert came first);
* false alarm: an alert in a run of C or S (high-precision or production attention), which do not fail.

The tied-fraction alert cannot be replayed: lr_sweep stored the fraction per layer averaged over heads, the
monitor compares each head's.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from lpfail.monitor import Thresholds
from lpfail.experiments.precision_alarm import divergence_steps

PREREGISTERED_ON = "2026-12-01"


def alert_steps(max_logit: np.ndarray, diag_step: np.ndarray, threshold: float) -> np.ndarray:
    """max_logit (…, n_diag, n_layer) → the first diag step at which any layer exceeds `threshold` (…), NaN if
    none does (NaN records count as no alert)."""
    over = np.nan_to_num(np.asarray(max_logit, dtype=np.float64), nan=-np.inf).max(axis=-1) > threshold
    first = np.argmax(over, axis=-1)
    return np.where(over.any(axis=-1), np.asarray(diag_step, dtype=np.float64)[first], np.nan)


def evaluate(res: Mapping, threshold: float | None = None, margin: float = 0.05, size: str = "small") -> dict:
    """Per variant and learning rate: the fraction of seeds that alert and the median alert step; for A the
    divergence steps and lead times per (lr, seed). Variants with runs missing are left out (listed)."""
    threshold = Thresholds().max_logit if threshold is None else float(threshold)
    variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
    stored = np.asarray(res[f"{size}_stored"]) if f"{size}_stored" in res else None
    lrs = np.asarray(res["lrs"], dtype=np.float64)
    steps = alert_steps(res[f"{size}_max_logit"], res["diag_step"], threshold)      # (V, L, S)
    curve = np.asarray(res[f"{size}_loss_curve"], dtype=np.float64)                  # (V, L, S, bins)
    max_steps = int(np.asarray(res["val_step"])[-1]) if "val_step" in res else curve.shape[-1]
    bin_steps = max_steps // curve.shape[-1]
    out = {"threshold": threshold, "margin": margin, "preregistered_on": PREREGISTERED_ON, "lrs": lrs.tolist(),
           "variants": {}, "missing": []}
    for i, v in enumerate(variants):
        if stored is not None and not stored[i].all():
            out["missing"].append(v)
            continue
        s = steps[i]
        out["variants"][v] = {"alert_frac": np.isfinite(s).mean(axis=-1).tolist(),
                              "alert_step_median": [float(np.nanmedian(x)) if np.isfinite(x).any() else None
                                                    for x in s]}
    if "A" in out["variants"] and "C" in out["variants"]:
        ia, ic = variants.index("A"), variants.index("C")
        div = divergence_steps(curve[ia], curve[ic], bin_steps, margin)               # (L, S)
        lead = div - steps[ia]
        out["A_divergence_step"] = div.tolist()
        out["A_lead_steps"] = lead.tolist()
        out["false_alarm_frac"] = {v: float(np.isfinite(steps[variants.index(v)]).mean())
                                   for v in ("C", "S") if v in out["variants"]}
    return out
