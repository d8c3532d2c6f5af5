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


#: colour and line style of each benchmark method, shared by the kernel figures
KERNEL_STYLES = {"sdpa_cudnn": ("#7f8c8d", "--"), "sdpa_flash": ("#2c3e50", "--"), "triton": ("#2980b9", "-"),
                 "triton_fma": ("#8e44ad", "-"), "triton_fix": ("#27ae60", "-"), "triton_paper": ("#c0392b", "-"),
                 "reference_paper": ("#c0392b", ":")}


def kernel_bench_figure(res, mode: str = "fwd_bwd",
                        methods=("sdpa_cudnn", "sdpa_flash", "triton", "triton_fix", "triton_paper",
                                 "reference_paper")) -> plt.Figure:
    """TFLOP/s against sequence length, one panel per head dim, from the `bench_kernels` result."""
    names = [str(m) for m in res["methods"]]
    a = [str(m) for m in res["modes"]].index(mode)
    dims = res["head_dims"]
    fig, axes = plt.subplots(1, len(dims), figsize=(5.2 * len(dims), 3.6), sharey=True, squeeze=False)
    for ax, (i, d) in zip(axes[0], enumerate(dims)):
        for method in methods:
            if method not in names:
                continue
            y = res["tflops"][i, :, names.index(method), a]
            color, ls = KERNEL_STYLES.get(method, (None, "-"))
            ax.plot(res["seq_lens"], y, ls, marker="o", ms=4, color=color, label=method)
        ax.set_xscale("log", base=2)
        ax.set_xticks(res["seq_lens"], [str(int(n)) for n in res["seq_lens"]])
        ax.set_xlabel("sequence length N")
        ax.set_title(f"head dim {int(d)}, {mode.replace('_', '+')}, causal")
    axes[0][0].set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def kernel_targets_figure(res) -> plt.Figure:
    """The issue's two kernel targets, one row per head dim: forward TFLOP/s against N with the 1.2 × SDPA
    flash target dashed (left), and the fix's cost from the alternating timings with the 3 % target (right)."""
    from kernels.bench import TARGETS
    names = [str(m) for m in res["methods"]]
    modes = [str(m) for m in res["modes"]]
    dims, ns = res["head_dims"], res["seq_lens"]
    bounds = {name: bound for name, bound, _ in TARGETS}
    fwd_bound, cost_bound = bounds["fwd / SDPA flash"], bounds["fix cost, fwd+bwd"]
    fig, axes = plt.subplots(len(dims), 2, figsize=(10.4, 3.3 * len(dims)), squeeze=False)
    styles = {m: KERNEL_STYLES[m] for m in ("sdpa_cudnn", "sdpa_flash", "triton", "triton_fma")}
    a = modes.index("fwd")
    for i, d in enumerate(dims):
        ax = axes[i][0]
        for method, (color, ls) in styles.items():
            if method in names:
                ax.plot(ns, res["tflops"][i, :, names.index(method), a], ls, marker="o", ms=4, color=color,
                        label=method)
        if "sdpa_flash" in names:
            ax.plot(ns, fwd_bound * res["tflops"][i, :, names.index("sdpa_flash"), a], ":", color="#2c3e50",
                    label=f"target: {fwd_bound:g} × sdpa_flash")
        ax.set_title(f"head dim {int(d)}: forward, causal")
        ax.set_ylabel("TFLOP/s")
        ax = axes[i][1]
        if "pair_ratio" in res:
            pmodes = [str(m) for m in res["pair_modes"]]
            for p, name in enumerate(res["pairs"]):
                base = str(name).split("/")[0]
                color = styles.get(base, ("#333333", "-"))[0]
                for mode, ls in (("fwd_bwd", "-"), ("fwd", ":")):
                    if mode in pmodes:
                        y = 100 * (res["pair_ratio"][i, :, p, pmodes.index(mode)] - 1)
                        ax.plot(ns, y, ls, marker="o", ms=4, color=color,
                                label=f"{base}: {mode.replace('_', '+')}")
        ax.axhline(100 * cost_bound, color="#c0392b", lw=0.8, ls="--", label=f"target {100 * cost_bound:g} % (fwd+bwd)")
        ax.axhline(0, color="#999999", lw=0.6)
        ax.set_title(f"head dim {int(d)}: the fix's cost (alternating timings)")
        ax.set_ylabel("% of time")
        for ax in axes[i]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns, [str(int(n)) for n in ns])
            ax.set_xlabel("sequence length N")
    axes[0][0].legend(fontsize=7)
    axes[0][1].legend(fontsize=7)
    fig.tight_layout()
    return fig


# -- chapter 1: the symptom -----------------------------------------------------------------------------------
VARIANT_STYLE = {"A": dict(color=COLORS["A"], lw=1.4), "C": dict(color=COLORS["C"], lw=1.4),
                 "Bp": dict(color=COLORS["B'"], lw=1.2), "B": dict(color=COLORS["B"], lw=1.1, ls="--"),
                 "D": dict(color=COLORS["D"], lw=1.1, ls=":")}
VARIANT_NAME = {"A": "A  PAPER_BF16", "B": "B  official fix", "Bp": "B′ our fix (no clamp)", "C": "C  FP32",
                "D": "D  FA2_BF16"}


def _curve_end(curve: np.ndarray) -> int:
    ok = np.nonzero(np.isfinite(curve))[0]
    return int(ok[-1]) if ok.size else -1


def _loss_panel(ax, conf, j: int, variants, ylim=(1.2, 4.2)):
    a = conf.arrays
    x = a["curve_steps"]
    for v in variants:
        if v not in conf.variants:
            continue
        i = conf.index(v)
        y = a["loss_curve"][i, j]
        st = VARIANT_STYLE.get(v, {})
        ax.plot(x, y, label=VARIANT_NAME.get(v, v), **st)
        status, fail = str(a["status"][i, j]), int(a["fail_step"][i, j])
        e = _curve_end(y)
        if status == "nonfinite" and e >= 0:
            ax.plot([x[e]], [min(y[e], ylim[1] - 0.1)], marker="X", ms=9, color=st.get("color"), ls="none")
        elif fail >= 0:
            ax.axvline(fail, color=st.get("color"), lw=0.8, ls=(0, (2, 2)))
        elif status not in ("completed", "nonfinite") and e >= 0:
            ax.plot([x[e]], [y[e]], marker="|", ms=10, color=st.get("color"), ls="none")
    ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)


def symptom_loss_figure(conf, variants=("A", "C", "Bp", "B", "D")) -> plt.Figure:
    """Training loss (mean per bin of 5 steps) of each variant, one panel per seed (the paper's Fig. 2).
    X: a run that turned NaN (its last finite bin); dashed line: the step where the pre-registered criterion
    says a run failed; bar: a run stopped unfinished."""
    seeds = conf.seeds
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.2 * len(seeds), 3.6), sharey=True, squeeze=False)
    for j, ax in enumerate(axes[0]):
        _loss_panel(ax, conf, j, variants)
        ax.set_title(f"seed {seeds[j]}")
        ax.set_xlabel("step")
    axes[0, 0].set_ylabel("training loss (nats per byte)")
    axes[0, -1].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"{conf.label}: 4 layers × 256, 16,384 tokens per step", fontsize=11)
    fig.tight_layout()
    return fig


def symptom_sweep_figure(confs, variants=("A", "C", "Bp")) -> plt.Figure:
    """Loss curves of every other configuration (rows) and seed (columns)."""
    confs = list(confs)
    n = max(len(c.seeds) for c in confs)
    fig, axes = plt.subplots(len(confs), n, figsize=(3.9 * n, 2.5 * len(confs)), sharex=True, sharey=True,
                             squeeze=False)
    for r, conf in enumerate(confs):
        for j in range(n):
            ax = axes[r, j]
            if j < len(conf.seeds):
                _loss_panel(ax, conf, j, variants)
                ax.set_title(f"{conf.label}, seed {conf.seeds[j]}", fontsize=9)
        axes[r, 0].set_ylabel("loss")
    for ax in axes[-1]:
        ax.set_xlabel("step")
    axes[0, -1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def symptom_grad_norm_figure(conf, variants=("A", "C", "B", "D")) -> plt.Figure:
    """Pre-clip gradient norm (largest per bin of 5 steps), log scale, one panel per seed."""
    seeds = conf.seeds
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.2 * len(seeds), 3.3), sharey=True, squeeze=False)
    a = conf.arrays
    for j, ax in enumerate(axes[0]):
        for v in variants:
            if v in conf.variants:
                ax.semilogy(a["curve_steps"], a["grad_norm_curve_max"][conf.index(v), j], label=VARIANT_NAME[v],
                            **VARIANT_STYLE[v])
        ax.axhline(1.0, color="#999999", lw=0.8)
        ax.set_title(f"seed {seeds[j]}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="major")
    axes[0, 0].set_ylabel("pre-clip gradient norm\n(clip at 1.0, grey)")
    axes[0, -1].legend(fontsize=8)
    fig.tight_layout()
    return fig


_KIND_COLORS = {"attn.c_attn": "#c0392b", "attn.c_proj": "#e67e22", "mlp.c_fc": "#2980b9",
                "mlp.c_proj": "#16a085", "wte": "#7f8c8d", "wpe": "#bdc3c7"}


def _kind(name: str) -> tuple[str, str]:
    for k in _KIND_COLORS:
        if k in name:
            layer = name.split(".h.")[1].split(".")[0] if ".h." in name else ""
            return k, layer
    return name, ""


def spectral_figure(conf, seed_index: int = 0, variants=("A", "C", "B", "D")) -> plt.Figure:
    """σ_max of every weight matrix against the step (the paper's Fig. 11), one panel per variant, one seed.
    Colour: the kind of matrix (c_attn holds W_Q, W_K and W_V of a layer); the line's label at its end names
    its layer."""
    a = conf.arrays
    names = [str(n) for n in a["spectral_names"]]
    steps = a["diag_steps"]
    variants = [v for v in variants if v in conf.variants]
    fig, axes = plt.subplots(1, len(variants), figsize=(3.7 * len(variants), 3.6), sharey=True, squeeze=False)
    for ax, v in zip(axes[0], variants):
        sp = a["spectral"][conf.index(v), seed_index]
        for kk, name in enumerate(names):
            kind, layer = _kind(name)
            y = sp[:, kk]
            ax.semilogy(steps, y, color=_KIND_COLORS.get(kind, "#333333"), lw=1.0,
                        alpha=0.9 if kind == "attn.c_attn" else 0.6)
            e = _curve_end(y)
            if kind == "attn.c_attn" and e >= 0:
                ax.annotate(f"L{layer}", (steps[e], y[e]), fontsize=7, color=_KIND_COLORS[kind],
                            xytext=(2, 0), textcoords="offset points", va="center")
        ax.set_title(VARIANT_NAME[v], fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel(f"spectral norm σ_max (seed {conf.seeds[seed_index]})")
    handles = [plt.Line2D([], [], color=c, label=k) for k, c in _KIND_COLORS.items()]
    axes[0, -1].legend(handles=handles, fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def ties_loss_figure(conf, seed_index: int = 0, variants=("A", "C")) -> plt.Figure:
    """Above: the loss of each variant. Below: the fraction of attention rows whose maximum is tied, per
    layer, measured every 50 steps on a batch of the training data (the paper's Fig. 13 counts them)."""
    a = conf.arrays
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(8.5, 5.4), sharex=True, gridspec_kw={"height_ratios": [1, 1.2]})
    for v in variants:
        i = conf.index(v)
        ax0.plot(a["curve_steps"], a["loss_curve"][i, seed_index], label=VARIANT_NAME[v], **VARIANT_STYLE[v])
        tf = a["tied_frac"][i, seed_index]
        for layer in range(tf.shape[-1]):
            ax1.plot(a["diag_steps"], tf[:, layer], color=VARIANT_STYLE[v]["color"], lw=1.0,
                     ls=["-", "--", "-.", ":"][layer % 4], label=f"{v}, layer {layer}")
    ax0.set_ylabel("loss")
    ax0.legend(fontsize=8)
    ax0.grid(alpha=0.3)
    ax1.set_ylabel("rows with a tied maximum")
    ax1.set_xlabel("step")
    ax1.legend(fontsize=7, ncol=2)
    ax1.grid(alpha=0.3)
    ax0.set_title(f"{conf.label}, seed {conf.seeds[seed_index]}", fontsize=10)
    fig.tight_layout()
    return fig


def fix_rows_figure(res) -> plt.Figure:
    """‖O‖ / ‖O_exact‖ (mean over rows) against the tied maximum m for A, B, B′ and D (stored `fix_rows`
    result); where B′'s output is not finite the ratio is drawn at the bottom as crosses."""
    m = np.asarray(res["m_values"], dtype=float)
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    floor = 1e-14
    for tag in ("A", "D", "B", "Bp"):
        y = np.asarray(res[f"{tag}_ratio_mean"], dtype=float)
        bad = np.asarray(res[f"{tag}_nonfinite_frac"], dtype=float) > 0
        st = dict(VARIANT_STYLE[tag])
        ax.semilogy(m[~bad], np.clip(y[~bad], floor, None), label=VARIANT_NAME[tag], **st)
        if bad.any():
            ax.plot(m[bad], np.full(bad.sum(), floor), ls="none", marker="x", ms=5, color=st["color"],
                    label=f"{VARIANT_NAME[tag].split()[0]}: output not finite")
    ax.axvline(float(res["b_clamp_m_theory"]), color=COLORS["B"], lw=0.8, ls=":")
    ax.set_xlabel("tied maximum score m (two keys)")
    ax.set_ylabel("‖O‖ / ‖O exact‖ (mean over rows)")
    ax.set_ylim(floor / 3, 5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def run_figure(conf, seed_index: int, variants=None, figsize=(10, 2.9), dpi=None) -> plt.Figure:
    """One seed of one configuration: loss, largest gradient norm per 5 steps (log), and the largest
    attention score over layers (log, every 50 steps), one line per variant."""
    from lpfail.book.symptom_report import max_over_layers

    a = conf.arrays
    variants = [v for v in (variants or conf.variants) if v in conf.variants]
    fig, axes = plt.subplots(1, 3, figsize=figsize, dpi=dpi)
    for v in variants:
        i, st = conf.index(v), VARIANT_STYLE.get(v, {})
        axes[0].plot(a["curve_steps"], a["loss_curve"][i, seed_index], label=VARIANT_NAME.get(v, v), **st)
        axes[1].semilogy(a["curve_steps"], a["grad_norm_curve_max"][i, seed_index], **st)
        axes[2].semilogy(a["diag_steps"], max_over_layers(a["max_logit"][i, seed_index]), **st)
    for ax, t in zip(axes, ("loss", "pre-clip gradient norm", "largest attention score")):
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{conf.label}, seed {conf.seeds[seed_index]}", fontsize=10)
    fig.tight_layout()
    return fig


def robust_cost_figure(res) -> plt.Figure:
    """The robust fix's cost (`robust_cost`, alternating timings) per shape: forward (left) and forward +
    backward (right), against the same kernel without a fix in both modes and against Algorithm 3, with the
    issue's target as a dashed line."""
    from kernels.bench import ROBUST_TARGETS, robust_summary

    rows = robust_summary(res)
    bounds = dict(ROBUST_TARGETS)
    shapes = list(rows[0]["per_shape"])
    x = np.arange(len(shapes))
    colors = {"triton": "#2980b9", "triton_fma": "#8e44ad", "triton_fix": "#7f8c8d"}
    names = {"triton": "vs no fix (sub)", "triton_fma": "vs no fix (fma)", "triton_fix": "vs Algorithm 3 (sub)"}
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.4), sharey=False)
    for ax, mode in zip(axes, ("fwd", "fwd_bwd")):
        sel = [r for r in rows if r["mode"] == mode]
        w = 0.8 / len(sel)
        for k, r in enumerate(sel):
            ax.bar(x + (k - (len(sel) - 1) / 2) * w, [100 * r["per_shape"][s] for s in shapes], w,
                   color=colors.get(r["base"], "#333333"), label=names.get(r["base"], r["base"]))
        ax.axhline(100 * bounds[mode], color="#c0392b", ls="--", lw=1,
                   label=f"target ≤ {100 * bounds[mode]:g} % (vs no fix)")
        ax.axhline(0, color="#999999", lw=0.6)
        ax.set_xticks(x, [f"d {d}\nN {n}" for d, n in shapes], fontsize=8)
        ax.set_title({"fwd": "forward", "fwd_bwd": "forward + backward"}[mode] + ": the robust fix's cost")
        ax.set_ylabel("% of time")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
