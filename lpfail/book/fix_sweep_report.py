"""The figure of the `fix_sweep` experiment (chapter 5, Fix): where each fix is safe over (β, r_m)."""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from lpfail.book.plots import color, legend_axes
from lpfail.experiments.fix_sweep import removed

#: Outcome classes of a grid point, in the order of the colour map.
OUTCOMES = ("bias removed", "bias remains", "row silenced (clamp)", "non-finite output")
#: outcome colours (not variants): removed green, remains amber, silenced grey-violet, non-finite dark red
_CMAP = ListedColormap(["#1a7f37", "#f2b134", "#8c6bb1", "#67000d"])
TITLES = {"alg3": "Algorithm 3 (no clamp)", "official": "official fix (clamp 1e-10)", "robust": "robust fix"}


def outcome_map(result: Mapping, name: str) -> np.ndarray:
    """Int (β, r_m): 0 bias removed (`removed`), 1 bias remains, 2 some row silenced, 3 some row non-finite."""
    out = np.where(removed(result, name), 0, 1)
    out = np.where(np.asarray(result[f"{name}_silenced"]) > 0, 2, out)
    return np.where(np.asarray(result[f"{name}_nonfinite"]) > 0, 3, out)


def plot_safe_region(result: Mapping) -> plt.Figure:
    """Three panels (Algorithm 3, official, robust), β down, r_m across: the outcome of each grid point."""
    betas, r_ms = np.asarray(result["betas"]), np.asarray(result["r_ms"])

    fig, all_axes = plt.subplots(1, 4, figsize=(12.0, 3.4), width_ratios=[3.3, 3.3, 3.3, 2.1])
    axes = all_axes[:3]
    for ax, name in zip(axes, ("alg3", "official", "robust")):
        ax.imshow(outcome_map(result, name), cmap=_CMAP, vmin=-0.5, vmax=3.5, aspect="auto",
                  interpolation="nearest")
        step = max(1, len(r_ms) // 9)
        ax.set_xticks(range(0, len(r_ms), step))
        ax.set_xticklabels([f"{r:g}" for r in r_ms[::step]], rotation=60)
        ax.set_yticks(range(len(betas)))
        ax.set_yticklabels([f"{b:g}" for b in betas])
        ax.set_title(TITLES[name], color=color(name))
        ax.set_xlabel("tied maximum r_m")
        ax.set_ylabel("β")
    handles = [plt.Rectangle((0, 0), 1, 1, color=_CMAP(i)) for i in range(len(OUTCOMES))]
    legend_axes(all_axes[3], handles, OUTCOMES)
    fig.tight_layout()
    return fig


def plot_bias_vs_rm(result: Mapping, beta: float = 2.0) -> plt.Figure:
    """|bias| of the stored output vs r_m at one β, per policy; non-finite points are left out (marked ×)."""
    betas, r_ms = np.asarray(result["betas"]), np.asarray(result["r_ms"])
    i = int(np.argmin(np.abs(betas - beta)))
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    x = np.arange(len(r_ms))
    for name in ("nofix", "alg3", "official", "robust"):
        b = np.abs(np.asarray(result[f"{name}_bias"])[i])
        bad = np.asarray(result[f"{name}_nonfinite"])[i] > 0
        ax.semilogy(x[~bad], b[~bad], "o-", ms=3, color=color(name), label=TITLES.get(name, "no fix"))
        ax.plot(x[bad], np.full(bad.sum(), 3.0), "x", color=color(name))
    ax.set_xticks(x[::3])
    ax.set_xticklabels([f"{r:g}" for r in r_ms[::3]], rotation=60)
    ax.set_xlabel("tied maximum r_m")
    ax.set_ylabel(f"|mean error of O| (β = {betas[i]:g})")
    ax.legend(ncol=2)
    fig.tight_layout()
    return fig
