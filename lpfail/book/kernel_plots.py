"""The kernels' figures (chapter 5's lab notebook): throughput against SDPA, the targets, the robust fix's cost and
the drop-in in GPT-2 small's training step; colours and words from `lpfail.book.plots`."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from lpfail.book.plots import WORDS, color

#: line style of each benchmark method (its colour is `color(method)`)
KERNEL_LS = {"sdpa_cudnn": "--", "sdpa_flash": "--", "triton": "-", "triton_fma": "-", "triton_fix": "-",
             "triton_paper": "-", "reference_paper": ":"}


def kernel_bench_figure(res, mode: str = "fwd_bwd",
                        methods=("sdpa_cudnn", "sdpa_flash", "triton", "triton_fix", "triton_paper",
                                 "reference_paper")) -> plt.Figure:
    """TFLOP/s against sequence length, one panel per head dim, from the `bench_kernels` result."""
    names = [str(m) for m in res["methods"]]
    a = [str(m) for m in res["modes"]].index(mode)
    dims = res["head_dims"]
    fig, axes = plt.subplots(1, len(dims), figsize=(4.6 * len(dims), 3.6), squeeze=False)
    for ax, (i, d) in zip(axes[0], enumerate(dims)):
        for method in methods:
            if method not in names:
                continue
            y = res["tflops"][i, :, names.index(method), a]
            ax.plot(res["seq_lens"], y, KERNEL_LS.get(method, "-"), marker="o", ms=4, color=color(method),
                    label=WORDS.get(method, method))
        ax.set_xscale("log", base=2)
        ax.set_xticks(res["seq_lens"], [str(int(n)) for n in res["seq_lens"]])
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"head dim {int(d)}, {mode.replace('_', ' + ')}")
    axes[0][0].legend()
    fig.tight_layout()
    return fig


def step_figure(res) -> plt.Figure:
    """GPT-2 small's training step with the drop-in in SDPA's place (`bench_step`): each method's tokens/s against
    SDPA's in the same round (median over rounds, the whisker their range), eager (solid) and compiled (hatched),
    with SDPA at 1 and the target's bound dashed."""
    from lpfail.kernels.bench_step import STEP_TARGETS, ratios  # here: lpfail.kernels imports Triton
    rs, modes = ratios(res), [str(m) for m in res["modes"]]
    methods = [str(m) for m in res["methods"] if str(m) != "sdpa"]
    fig, ax = plt.subplots(figsize=(4.6, 1.1 + 0.62 * len(methods)))
    h = 0.8 / max(1, len(modes))
    lo = 1.0
    for i, m in enumerate(methods):
        for a, mode in enumerate(modes):
            d = rs[(m, mode)]
            if not np.isfinite(d["ratio"]):
                continue
            y = i + (a - (len(modes) - 1) / 2) * h
            err = [[d["ratio"] - d["range"][0]], [d["range"][1] - d["ratio"]]]
            ax.barh(y, d["ratio"], height=h * 0.9, color=color(m), alpha=1.0 if mode == "eager" else 0.55,
                    hatch=None if mode == "eager" else "//", edgecolor="white", xerr=err,
                    error_kw={"lw": 1, "capsize": 2})
            lo = min(lo, d["range"][0])
    ax.axvline(1.0, color=color("sdpa"), lw=1.2)
    for bound in sorted({b for _, _, b in STEP_TARGETS}):
        ax.axvline(bound, color="0.3", ls="--", lw=1)
    ax.set_yticks(range(len(methods)), [WORDS.get(m, m) for m in methods])
    ax.invert_yaxis()
    ax.set_xlim(max(0.0, lo - 0.05), 1.06)
    ax.set_xlabel("tokens/s ÷ SDPA's (same round)")
    ax.legend(handles=[Patch(facecolor="0.45", alpha=1.0 if mode == "eager" else 0.55,
                             hatch=None if mode == "eager" else "//", edgecolor="white", label=mode)
                       for mode in modes], loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(modes))
    ax.xaxis.set_major_locator(plt.MaxNLocator(5))
    fig.tight_layout()
    return fig


def kernel_targets_figure(res) -> plt.Figure:
    """The kernel's two targets, one row per head dim: forward TFLOP/s against N with the 1.2 × SDPA flash target
    (left), and the fix's cost from the alternating timings with the 3 % target (right)."""
    from lpfail.kernels.bench import TARGETS  # here, not at the top: lpfail.kernels imports Triton
    names = [str(m) for m in res["methods"]]
    modes = [str(m) for m in res["modes"]]
    dims, ns = res["head_dims"], res["seq_lens"]
    bounds = {name: bound for name, bound, _ in TARGETS}
    fwd_bound, cost_bound = bounds["fwd / SDPA flash"], bounds["fix cost, fwd+bwd"]
    fig, axes = plt.subplots(len(dims), 2, figsize=(9.4, 3.4 * len(dims)), squeeze=False)
    shown = ("sdpa_cudnn", "sdpa_flash", "triton", "triton_fma")
    a = modes.index("fwd")
    for i, d in enumerate(dims):
        ax = axes[i][0]
        for method in shown:
            if method in names:
                ax.plot(ns, res["tflops"][i, :, names.index(method), a], KERNEL_LS.get(method, "-"), marker="o",
                        ms=4, color=color(method), label=WORDS.get(method, method))
        if "sdpa_flash" in names:
            ax.plot(ns, fwd_bound * res["tflops"][i, :, names.index("sdpa_flash"), a], ":", color=color("sdpa_flash"),
                    label=f"target: {fwd_bound:g} × SDPA flash")
        ax.set_title(f"head dim {int(d)}: forward")
        ax.set_ylabel("TFLOP/s")
        ax.legend()
        ax = axes[i][1]
        if "pair_ratio" in res:
            pmodes = [str(m) for m in res["pair_modes"]]
            for p, name in enumerate(res["pairs"]):
                base = str(name).split("/")[0]
                for mode, ls in (("fwd_bwd", "-"), ("fwd", ":")):
                    if mode in pmodes:
                        y = 100 * (res["pair_ratio"][i, :, p, pmodes.index(mode)] - 1)
                        ax.plot(ns, y, ls, marker="o", ms=4, color=color(base),
                                label=f"{'FMA' if base == 'triton_fma' else 'scale, subtract'}: "
                                      f"{mode.replace('_', ' + ')}")
        ax.axhline(100 * cost_bound, color="k", lw=0.8, ls="--", label=f"target {100 * cost_bound:g} %")
        ax.axhline(0, color="#999999", lw=0.6)
        ax.set_title(f"head dim {int(d)}: the fix's cost")
        ax.set_ylabel("% of time")
        ax.legend()
        for ax in axes[i]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns, [str(int(n)) for n in ns])
            ax.set_xlabel("sequence length N")
    fig.tight_layout()
    return fig


def robust_cost_figure(res) -> plt.Figure:
    """The robust fix's cost (`robust_cost`, alternating timings) per shape: forward (left) and forward +
    backward (right), against the same kernel without a fix in both modes and against Algorithm 3, with the
    target as a dashed line."""
    from lpfail.kernels.bench import ROBUST_TARGETS, robust_summary  # here, not at the top: lpfail.kernels imports Triton

    rows = robust_summary(res)
    bounds = dict(ROBUST_TARGETS)
    shapes = list(rows[0]["per_shape"])
    x = np.arange(len(shapes))
    names = {"triton": "vs no fix (scale, subtract)", "triton_fma": "vs no fix (FMA)",
             "triton_fix": "vs Algorithm 3"}
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    for ax, mode in zip(axes, ("fwd", "fwd_bwd")):
        sel = [r for r in rows if r["mode"] == mode]
        w = 0.8 / len(sel)
        for k, r in enumerate(sel):
            ax.bar(x + (k - (len(sel) - 1) / 2) * w, [100 * r["per_shape"][s] for s in shapes], w,
                   color=color(r["base"]), label=names.get(r["base"], r["base"]))
        ax.axhline(100 * bounds[mode], color="k", ls="--", lw=1, label=f"target ≤ {100 * bounds[mode]:g} %")
        ax.axhline(0, color="#999999", lw=0.6)
        ax.set_xticks(x, [f"d {d}\nN {n}" for d, n in shapes])
        ax.set_title({"fwd": "forward", "fwd_bwd": "forward + backward"}[mode])
        ax.set_ylabel("% of time")
        ax.legend(loc="upper left")
    fig.tight_layout()
    return fig
