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


# -- the GPU records: A's own checkpoints (res["gpu"]) ---------------------------------------------------------
GPU_HEADER = ["step", "layer", "max logit", "Eq. 1 / Eq. 2 rel. err.", "rank-one cos. (mean pair) per head",
              "Σ Δδ per head", "Σ Δδ / (√N·σ) per head", "‖A's dW_Q error‖ per head"]


def _n_rows(rec: Mapping) -> int:
    return len(rec["dd_rows"]) * 8  # 8 sequences of the step's batch (check_run's rows) × positions


def bias_z(rec: Mapping, n_rows: int | None = None) -> list[float]:
    """Per head, Σ Δδ over the batch in units of its random-walk size √N·σ, with σ estimated from the mean
    |Δδ| (σ = mean|Δδ|·√(π/2) for a centred normal): |z| of order 1 is what an unbiased sum gives; a bias
    that accumulates shows as |z| ≫ 1 with one sign. N = rows × positions (`n_rows`)."""
    n = n_rows or _n_rows(rec)
    return [s / (np.sqrt(n) * a * np.sqrt(np.pi / 2)) if a > 0 else float("nan")
            for s, a in zip(rec["sum_dd"], rec["dd_abs_mean"])]


def gpu_rows(res: Mapping) -> list[list[str]]:
    """One row per (step, layer) of the GPU records."""
    out = []
    for r in res["gpu"]["records"]:
        out.append([str(r["step"]), str(r["layer"]), f"{r['max_logit']:.0f}",
                    f"{max(r['eq1_rel_err']):.1e} / {max(r['eq2_rel_err']):.1e}",
                    ", ".join(f"{x:.2f}" for x in r["eq3_cos_mean"]),
                    ", ".join(f"{x:+.1e}" for x in r["sum_dd"]),
                    ", ".join(f"{x:+.1f}" for x in bias_z(r)),
                    ", ".join(f"{x:.2g}" for x in r["dw_err_norm"])])
    return out


def gpu_summary(res: Mapping) -> dict:
    """The numbers chapter 3's prose and the notes quote, from the GPU records."""
    recs = res["gpu"]["records"]
    cos = [c for r in recs for c in r["eq3_cos_mean"]]
    worst = max(recs, key=lambda r: max(r["dw_err_norm"]))["layer"]
    sums = [x for r in recs for x in r["sum_dd"]]
    zs = [z for r in recs for z in bias_z(r)]
    per_layer = {}
    for r in recs:
        per_layer.setdefault(r["layer"], []).append(float(np.median(r["eq3_cos_mean"])))
    layer_sum = {r["step"]: sum(r["sum_dd"]) for r in recs if r["layer"] == worst}
    return {"n": len(recs), "steps": sorted({r["step"] for r in recs}), "max_rel_err": float(res["gpu"]["max_rel_err"]),
            "tol": float(res["gpu"]["tol"]), "passed": bool(res["gpu"]["passed"]), "median_cos": float(np.median(cos)),
            "cos_range": (float(min(cos)), float(max(cos))),
            "median_cos_by_layer": {k: float(np.median(v)) for k, v in sorted(per_layer.items())},
            "worst_layer": int(worst), "worst_layer_sum_dd": layer_sum,
            "n_pos": int(sum(x > 0 for x in sums)), "n_sums": len(sums),
            "frac_pos_range": (float(min(x for r in recs for x in r["frac_dd_pos"])),
                               float(max(x for r in recs for x in r["frac_dd_pos"]))),
            "z_abs_max": float(np.nanmax(np.abs(zs))), "z_abs_median": float(np.nanmedian(np.abs(zs))),
            "has_ties": all("sum_dd_tied" in r for r in recs), "has_sketches": all("sketch_rbar" in r for r in recs)}


def gpu_figure(res: Mapping):
    """From A's GPU checkpoints. Left (the paper's Fig. 4, across tokens): the mean pairwise cosine of the
    rank-one terms (PK)[T]ᵀX[T], per head, at each step and layer. Middle (Fig. 5): the running sum of Δδ over
    the positions of the batch (summed over its sequences and heads), per layer and step. Right: Σ Δδ in units
    of its random-walk size (`bias_z`), per head."""
    import matplotlib.pyplot as plt

    recs = res["gpu"]["records"]
    steps = sorted({r["step"] for r in recs})
    layers = sorted({r["layer"] for r in recs})
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(12, 3.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r in recs:
        x = layers.index(r["layer"]) + (steps.index(r["step"]) - 1) * 0.22
        c = colors[steps.index(r["step"]) % len(colors)]
        ax0.scatter(np.full(len(r["eq3_cos_mean"]), x), r["eq3_cos_mean"], s=14, color=c,
                    label=f"step {r['step']}" if r["layer"] == layers[0] else None)
        ax2.scatter(np.full(len(r["sum_dd"]), x), bias_z(r), s=14, color=c,
                    label=f"step {r['step']}" if r["layer"] == layers[0] else None)
        ls = ("-", "--", ":", "-.")[layers.index(r["layer"]) % 4]
        ax1.plot(np.cumsum(r["dd_rows"]), ls, color=c, lw=1.0, label=f"s{r['step']} L{r['layer']}")
    for ax in (ax0, ax2):
        ax.set_xticks(range(len(layers)), [f"layer {l_}" for l_ in layers])
        ax.axhline(0, color="k", lw=0.6)
    ax0.axhline(0.5, color="k", lw=0.6, ls=":")
    ax0.set_ylim(-0.05, 1.0)
    ax0.set_ylabel("mean pairwise cosine")
    ax0.set_title("rank-one terms, across tokens", fontsize=10)
    ax0.legend(fontsize=7)
    ax1.axhline(0, color="k", lw=0.6)
    ax1.set_xlabel("position in the sequence")
    ax1.set_ylabel("running Σ Δδ")
    ax1.set_title("running sum of δ_lp − δ_hp over rows", fontsize=10)
    ax1.legend(fontsize=6, ncol=3)
    for y in (-2, 2):
        ax2.axhline(y, color="k", lw=0.6, ls=":")
    ax2.set_ylabel("Σ Δδ / (√N·σ)")
    ax2.set_title("bias of Σ Δδ vs random-walk size", fontsize=10)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def a_run_wall(directory=None) -> str:
    """Training seconds of the GPU call's retrained A run, from its log (results/substitution_gpu/extras.log:
    the line ``<TrainResult completed: … , N s>``); "not recorded" when absent."""
    import re

    from lpfail import results

    p = (directory or results.results_dir()) / "substitution_gpu" / "extras.log"
    m = re.search(r"<TrainResult completed: [^>]*?([0-9.]+) s>", p.read_text()) if p.is_file() else None
    return f"{float(m.group(1)):.0f}" if m else "not recorded"
