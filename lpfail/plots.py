"""Figures of the book. Each function takes data (or a stored result) and returns a matplotlib Figure; the
chapters only call them. Styling is shared so every chapter looks the same."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

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


def running_error_figure(with_ties: dict, without_ties: dict, with_fix: dict | None = None) -> plt.Figure:
    """Paper Fig. 6 analogue: P̄ along the keys (top) and the running error of Ō (bottom), for a row with
    tied maxima, one without, and optionally the tied row under the fix. Inputs are `rounding.running_error`
    dicts."""
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, gridspec_kw={"height_ratios": [1, 1.6]})
    keys = np.arange(len(with_ties["pbar"]))
    ax0.semilogy(keys, np.maximum(with_ties["pbar"], 1e-30), ".", ms=2.5, color=COLORS["ties"], label="row with 2 tied maxima")
    ax0.semilogy(keys, np.maximum(without_ties["pbar"], 1e-30), ".", ms=2.5, color=COLORS["noties"], alpha=0.6,
                 label="row with one maximum")
    ax0.set_ylabel("P̄[t] (BF16)")
    ax0.legend(loc="lower right", fontsize=8)
    running_error(keys, with_ties["error"], with_ties["is_one"], label="2 tied maxima, no fix", ax=ax1,
                  color=COLORS["ties"])
    running_error(keys, without_ties["error"], without_ties["is_one"], label="one maximum, no fix", ax=ax1,
                  color=COLORS["noties"])
    if with_fix is not None:
        running_error(keys, with_fix["error"], with_fix["is_one"], label="2 tied maxima, with the fix (Ō rescaled)",
                      ax=ax1, color=COLORS["fix"])
    ax1.legend(loc="lower left", fontsize=8)
    ax1.set_ylabel("running error of Ō\n(rounded prefix − exact)")
    fig.tight_layout()
    return fig


def rounding_sweep_figure(res) -> plt.Figure:
    """Mean Ō error along the three axes of the `rounding` experiment, without and with the fix, with 95 %
    confidence intervals over rows. Positive = the magnitude of Ō is rounded up (away from zero)."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
    labels = {"ties": "number of tied maxima", "neg_frac": "fraction of negative V entries",
              "gap": "tied score above the N(0,1) background"}
    for ax, axis in zip(axes, ("ties", "neg_frac", "gap")):
        x = res[f"{axis}_values"]
        for pname, stat, style, label in (("nofix", "acc_away", "-o", "no fix: Ō (P̄V accumulation)"),
                                          ("fix", "acc_away", "-^", "fix: Ō (P̄V accumulation)"),
                                          ("nofix", "out_away", ":o", "no fix: output O"),
                                          ("fix", "out_away", ":^", "fix: output O")):
            y, ci = res[f"{axis}_{pname}_{stat}"], res[f"{axis}_{pname}_{stat}_ci"]
            color = COLORS["nofix"] if pname == "nofix" else COLORS["fix"]
            alpha = 0.55 if stat == "out_away" else 1.0
            ax.errorbar(x, y * 1e4, yerr=ci * 1e4, fmt=style, ms=4, lw=1, capsize=2, color=color, alpha=alpha,
                        label=label)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel(labels[axis])
    axes[0].set_ylabel("mean error toward larger magnitude\n(units of O, ×10⁻⁴, 95 % CI)")
    axes[0].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def kernel_bench_figure(res, mode: str = "fwd_bwd",
                        methods=("sdpa_cudnn", "sdpa_flash", "triton", "triton_fix", "triton_paper",
                                 "reference_paper")) -> plt.Figure:
    """TFLOP/s against sequence length, one panel per head dim, from the `bench_kernels` result."""
    names = [str(m) for m in res["methods"]]
    a = [str(m) for m in res["modes"]].index(mode)
    dims = res["head_dims"]
    fig, axes = plt.subplots(1, len(dims), figsize=(5.2 * len(dims), 3.6), sharey=True, squeeze=False)
    styles = {"sdpa_cudnn": ("#7f8c8d", "--"), "sdpa_flash": ("#2c3e50", "--"), "triton": ("#2980b9", "-"),
              "triton_fix": ("#27ae60", "-"), "triton_paper": ("#c0392b", "-"), "reference_paper": ("#c0392b", ":")}
    for ax, (i, d) in zip(axes[0], enumerate(dims)):
        for method in methods:
            if method not in names:
                continue
            y = res["tflops"][i, :, names.index(method), a]
            color, ls = styles.get(method, (None, "-"))
            ax.plot(res["seq_lens"], y, ls, marker="o", ms=4, color=color, label=method)
        ax.set_xscale("log", base=2)
        ax.set_xticks(res["seq_lens"], [str(int(n)) for n in res["seq_lens"]])
        ax.set_xlabel("sequence length N")
        ax.set_title(f"head dim {int(d)}, {mode.replace('_', '+')}, causal")
    axes[0][0].set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig
