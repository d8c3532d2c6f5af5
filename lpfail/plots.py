"""Figures of the book. Each function takes data (or a stored result) and returns a matplotlib Figure; the
chapters only call them. Styling is shared so every chapter looks the same."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

#: The causal chain of the paper's argument (its Fig. 1), with the chapter that examines each link.
ARGUMENT = [
    ("Repeated row maxima\nin the attention scores", "ch. 4"),
    ("P̄ = exp(S − m) = 1\nexactly, for several keys", "ch. 4"),
    ("Biased rounding of P̄V\n(carry + sticky bit)", "ch. 4"),
    ("Ō too negative\n(rounded away from zero)", "ch. 4"),
    ("δ = rowsum(dO ∘ O)\nbiased", "ch. 3"),
    ("dW_Q error along a shared\nlow-rank direction", "ch. 3"),
    ("Spectral norm of W_Q\ngrows, logits grow", "ch. 1–2"),
    ("Loss explodes", "ch. 1"),
]

COLORS = {"A": "#c0392b", "B": "#8e44ad", "B'": "#27ae60", "C": "#2c3e50", "D": "#e67e22",
          "nofix": "#c0392b", "fix": "#27ae60", "ties": "#c0392b", "noties": "#7f8c8d"}


def argument_map() -> plt.Figure:
    """The map of the argument: repeated maxima → … → loss explosion, two rows of boxes."""
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.set_xlim(0, 4)
    ax.set_ylim(0, 2)
    ax.axis("off")
    w, h = 0.84, 0.62
    centers = [(0.5 + i, 1.5) for i in range(4)] + [(3.5 - i, 0.5) for i in range(4)]
    for (text, chapter), (x, y) in zip(ARGUMENT, centers):
        color = "#fdebd0" if "ch. 4" in chapter else "#d6eaf8" if "ch. 3" in chapter else "#fadbd8"
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02",
                                    fc=color, ec="#555555", lw=1.0))
        ax.text(x, y + 0.05, text, ha="center", va="center", fontsize=9.5)
        ax.text(x, y - h / 2 + 0.07, chapter, ha="center", va="center", fontsize=8, color="#555555",
                style="italic")
    for (x0, y0), (x1, y1) in zip(centers[:-1], centers[1:]):
        if y0 == y1:
            sgn = 1 if x1 > x0 else -1
            start, end = (x0 + sgn * w / 2, y0), (x1 - sgn * w / 2, y1)
        else:
            start, end = (x0, y0 - h / 2), (x1, y1 + h / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, color="#333333", lw=1.2))
    ax.set_title("The paper's causal chain, and the chapter that tests each link", fontsize=11)
    fig.tight_layout()
    return fig


def running_error(keys: np.ndarray, error: np.ndarray, ties: np.ndarray, *, label: str, ax=None, color=None):
    """Running Ō error along the key index, with the keys where P̄ = 1 marked."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    ax.plot(keys, error, lw=1.0, color=color, label=label)
    idx = np.flatnonzero(ties)
    if idx.size:
        ax.scatter(keys[idx], error[idx], s=18, color=color, zorder=3, marker="o", edgecolor="k", linewidth=0.5)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("key index t")
    ax.set_ylabel("running error of Ō")
    return ax
