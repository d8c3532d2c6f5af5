"""Tables and figures of chapter 3 ("The gradient error"), from the stored `gradient_error` result and the toy.

The chapter calls these; the numbers come from `lpfail.experiments.gradient_error` (stored) and
`lpfail.gradient_error` (live)."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def check_rows(res: Mapping) -> list[list[str]]:
    """One row per checked case: source, where, the largest max-logit, Eq. 1 and Eq. 2 relative errors (the
    worst head), the cosine of the δ-term with A's whole dW_Q error (per head), Σ Δδ (per head)."""
    rows = []
    for r in res["synthetic"]:
        rows.append(["synthetic", f"logit scale {r['logit_scale']:g}, seed {r['seed']}", f"{r['max_logit']:.0f}",
                     f"{max(r['eq1_rel_err']):.1e}", f"{max(r['eq2_rel_err']):.1e}",
                     ", ".join(f"{c:+.2f}" for c in r["share_cos"]), ", ".join(f"{x:+.1e}" for x in r["sum_dd"])])
    for r in res["model"]:
        rows.append(["CPU model under A", f"step {r['step']}, layer {r['layer']}", f"{r['max_logit']:.0f}",
                     f"{max(r['eq1_rel_err']):.1e}", f"{max(r['eq2_rel_err']):.1e}",
                     ", ".join(f"{c:+.2f}" for c in r["share_cos"]), ", ".join(f"{x:+.1e}" for x in r["sum_dd"])])
    return rows


CHECK_HEADER = ["tensors", "case", "max logit", "Eq. 1 rel. err.", "Eq. 2 rel. err.",
                "cos(δ-term, A's dW_Q error) per head", "Σ Δδ per head"]


def delta_figure(res: Mapping):
    """Left: Σ Δδ per head at each (checkpoint, layer) of the CPU-trained model. Right: the cosine between the
    δ-term of Eq. 2 and A's whole dW_Q error, per head, for every checked case."""
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.6))
    recs = res["model"]
    labels = [f"s{r['step']}\nL{r['layer']}" for r in recs]
    n_head = len(recs[0]["sum_dd"]) if recs else 0
    width = 0.8 / max(n_head, 1)
    for h in range(n_head):
        ax0.bar(np.arange(len(recs)) + h * width, [r["sum_dd"][h] for r in recs], width, label=f"head {h}")
    ax0.axhline(0, color="k", lw=0.6)
    ax0.set_xticks(np.arange(len(recs)) + 0.4 - width / 2, labels, fontsize=8)
    ax0.set_ylabel("Σ Δδ over the batch")
    ax0.set_title("CPU model under A: Σ (δ_lp − δ_hp)", fontsize=10)
    ax0.legend(fontsize=8)
    for i, (name, group) in enumerate((("synthetic", res["synthetic"]), ("CPU model", recs))):
        cs = [c for r in group for c in r["share_cos"]]
        ax1.scatter(np.full(len(cs), i) + np.linspace(-0.15, 0.15, len(cs)), cs, s=18)
    ax1.axhline(0, color="k", lw=0.6)
    ax1.set_xticks([0, 1], ["synthetic", "CPU model"])
    ax1.set_ylim(-1.05, 1.05)
    ax1.set_ylabel("cosine")
    ax1.set_title("δ-term of Eq. 2 vs A's whole dW_Q error", fontsize=10)
    fig.tight_layout()
    return fig


def toy_figure(runs: list[Mapping]):
    """‖accumulated error‖ against the number of steps K (log–log) for toy runs, with K and √K guides."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for r in runs:
        ax.loglog(r["k"], r["norm"], label=f"bias {r['bias']:g}: exponent {r['exponent']:.2f}")
    k = runs[0]["k"]
    ref = runs[0]["norm"][9]
    ax.loglog(k, ref * k / k[9], "k--", lw=0.7, label="∝ K")
    ax.loglog(k, ref * np.sqrt(k / k[9]), "k:", lw=0.7, label="∝ √K")
    ax.set_xlabel("steps K")
    ax.set_ylabel("‖accumulated error‖ (RMS over runs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
