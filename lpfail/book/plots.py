"""Figures of the book. Each function takes data (or a stored result) and returns a matplotlib Figure; the
chapters only call them, and place them with `glue_figure`.

One look for every figure, from this module:

* **one colour per variant across the book** (`PALETTE`, by the variant's letter; `style(v)` gives its colour and
  line style, `label(v)` its name in words): the paper's arithmetic is always red, FP32 attention always black,
  production (FA2) arithmetic always orange, and so on. Names that stand for the same arithmetic elsewhere
  (``ref_PAPER_BF16``, ``nofix``, ``triton_paper`` …) are `ALIASES` of the letter, never a colour of their own;
* **text readable where people read**: fonts of at least `MIN_PT` points (`apply_style`), panels at most
  `MAX_PANEL_IN` inches wide, so that at a phone's width (a 400 px window, a column of ≈ 360 px) a panel shown
  whole keeps its text at ≥ 9 px;
* **panels that stack on a narrow screen**: `figure_html` cuts a figure into its panels (an axes with its labels
  and legend, a colour bar with its axes, axes stacked on a shared x) and lays them out in a row that wraps, each
  a PNG at `DPI` (≥ 2× the pixels it is shown at), each carrying the size of its smallest text and legend text
  (``data-lp-*``) for the browser check (tools/browser_check.py).
"""
from __future__ import annotations

import base64
import html
import io

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.legend import Legend
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from myst_nb import glue
from PIL import Image

from lpfail import bf16
from lpfail.book.symptom_report import max_over_layers

# -- one palette --------------------------------------------------------------------------------------------------
#: The colour of each variant (by its letter in lpfail.sweep.variants and the chapters' tables).
PALETTE = {
    "A": "#d62728",       # the paper's arithmetic (PAPER_BF16)
    "C": "#000000",       # FP32 attention
    "D": "#ff7f0e",       # production (FA2) arithmetic (FA2_BF16)
    "B": "#9467bd",       # the official fix (clamp included)
    "Bp": "#2ca02c",      # Algorithm 3 without the clamp (the reference's with_fix())
    "R": "#17becf",       # the robust fix (BoundedMax)
    "S": "#7f7f7f",       # PyTorch SDPA (its flash back end on a GPU)
    "A_sr": "#e377c2",    # + stochastic rounding
    "A_qk": "#8c564b",    # + QK-norm
    "C_qk": "#bcbd22",    # FP32 attention + QK-norm
    "C_tile": "#6baed6",  # FP32 attention in FA2's tiles (the placebo)
    "A_hp": "#1f77b4",    # + δ from an FP32 O
    "A_res": "#ff9896",   # + output-residual compensation
    "A_ds": "#98df8a",    # + dS row-sum correction
    "A_z": "#c5b0d5",     # + z-loss
    "A_cap": "#c49c94",   # + output soft-cap
    "A_comp": "#8b0000",  # the paper's arithmetic as torch.compile runs it (PAPER_BF16_COMPILED)
    # implementations measured in chapters 5 and 6 (each its own colour; the arithmetic they share is in words)
    "sdpa_cudnn": "#393b79", "sdpa_efficient": "#6b6ecf", "sdpa_math": "#17607d",
    "triton_sub": "#e6a000", "triton_fma": "#a05195", "mimic_exp2_fma": "#5b8c2a",
    # the drop-in in a training step (kernels.bench_step): the five-matmul backward, without and with the robust fix
    "dropin_dqa": "#8c6d31", "dropin_dqa_robust": "#2b6f8f",
    # the precision dial's arms (lpfail.experiments.dial): each arm its family's hue, darker as K falls (fewer bits)
    "A_6": "#f4a6a6", "A_5": "#e8686a", "A_4": "#b31b1b", "A_3": "#6e0a0a",
    "SR_6": "#f7c6e3", "SR_5": "#e98fc4", "SR_4": "#c2448f", "SR_3": "#7a1f5a",
    "D_6": "#fdd0a2", "D_5": "#fdae6b", "D_4": "#d9661a", "D_3": "#8c3d06",
    "R_6": "#b3e9ef", "R_5": "#6fd3df", "R_4": "#119aab", "R_3": "#0b5f6a",
}
#: Other names of the same arithmetic: they take that variant's colour.
ALIASES = {"ref_PAPER_BF16": "A", "PAPER_BF16": "A", "nofix": "A", "triton_paper": "A", "reference_paper": "A",
           "FP32": "C", "ref_FA2_BF16": "D", "FA2_BF16": "D", "triton": "triton_sub",
           "official": "B", "alg3": "Bp", "fix": "Bp", "triton_fix": "Bp", "A_fix": "B",
           "robust": "R", "sdpa_flash": "S", "sdpa": "S", "dropin": "triton_sub", "dropin_robust": "R"}
#: Line style of each variant where two share a figure's axes often (solid otherwise).
LINESTYLE = {"A_sr": "--", "C_qk": "--", "S": ":", "reference_paper": ":", "A_comp": "-."}
#: Each variant in words (the legend and the glossary say the same).
WORDS = {"A": "the paper's arithmetic", "C": "FP32 attention", "D": "production (FA2) arithmetic",
         "B": "the official fix", "Bp": "Algorithm 3 without the clamp", "R": "the robust fix", "S": "PyTorch SDPA",
         "A_sr": "+ stochastic rounding", "A_qk": "+ QK-norm", "C_qk": "FP32 + QK-norm",
         "C_tile": "FP32 in FA2's tiles (placebo)", "A_hp": "+ δ from an FP32 O",
         "A_res": "+ output-residual compensation", "A_ds": "+ dS row-sum correction", "A_z": "+ z-loss",
         "A_cap": "+ output soft-cap", "A_comp": "the paper's arithmetic, compiled",
         "sdpa_cudnn": "SDPA cuDNN", "sdpa_efficient": "SDPA memory-efficient", "sdpa_math": "SDPA math",
         "sdpa_flash": "SDPA flash", "triton_sub": "our Triton kernel", "triton_fma": "our Triton kernel, FMA",
         "mimic_exp2_fma": "FA2-order mimic", "ref_PAPER_BF16": "the paper's arithmetic",
         "ref_FA2_BF16": "production (FA2) arithmetic", "nofix": "no fix", "alg3": "Algorithm 3 (no clamp)",
         "official": "the official fix", "robust": "the robust fix", "fix": "Algorithm 3",
         "triton": "our kernel, FA2 arithmetic", "triton_fix": "our kernel + Algorithm 3",
         "triton_paper": "our kernel, the paper's arithmetic",
         "reference_paper": "the reference, the paper's arithmetic",
         "dropin": "drop-in, no fix", "dropin_robust": "drop-in + robust fix",
         "dropin_dqa": "five-matmul backward", "dropin_dqa_robust": "five-matmul + robust fix",
         **{f"A_{k}": f"the paper's arithmetic at {k} bits" for k in (6, 5, 4, 3)},
         **{f"SR_{k}": f"stochastic rounding at {k} bits" for k in (6, 5, 4, 3)},
         **{f"D_{k}": f"production arithmetic at {k} bits" for k in (6, 5, 4, 3)},
         **{f"R_{k}": f"the robust fix at {k} bits" for k in (6, 5, 4, 3)}}
#: Letters shown in legends beside the words (the tables use the same).
LETTER = {"A": "A", "C": "C", "D": "D", "B": "B", "Bp": "B′", "R": "R", "S": "SDPA", "A_sr": "A_sr",
          "A_qk": "A_qk", "C_qk": "C_qk", "C_tile": "C_tile", "A_hp": "A_hp", "A_res": "A_res", "A_ds": "A_ds",
          "A_z": "A_z", "A_cap": "A_cap", "A_comp": "A_comp",
          **{f"{a}_{k}": f"{a}_{k}" for a in ("A", "SR", "D", "R") for k in (6, 5, 4, 3)}}
#: Colours of series that are not variants (heads, layers, steps): a sequential map, never a variant's colour.
SERIES_CMAP = "viridis"


def color(v: str) -> str:
    """The colour of variant ``v`` (or of a name for the same arithmetic, `ALIASES`)."""
    key = ALIASES.get(v, v)
    if key not in PALETTE:
        raise KeyError(f"plots.color: no colour for {v!r}; add it to PALETTE (one colour per variant) or ALIASES")
    return PALETTE[key]


def style(v: str, **kw) -> dict:
    """Matplotlib keywords for variant ``v``: its colour and line style (``kw`` added)."""
    return {"color": color(v), "ls": LINESTYLE.get(v, "-"), **kw}


def label(v: str) -> str:
    """'the paper's arithmetic (A)': a variant in words, its letter after it where it has one."""
    w = WORDS.get(v, v)
    return f"{w} ({LETTER[v]})" if v in LETTER else w


def series_colors(n: int) -> list:
    """``n`` colours for series that are not variants (heads, layers, steps)."""
    cmap = matplotlib.colormaps[SERIES_CMAP]
    return [cmap(x) for x in np.linspace(0.05, 0.85, max(n, 1))][:n]


# -- readable at the column's width and on a phone --------------------------------------------------------------
MIN_PT = 9.0          # the smallest text in any figure, in points
MAX_PANEL_IN = 5.2    # the widest panel, in inches (a 9-point text stays ≥ 9 px when it is shown 360 px wide)
DPI = 200             # PNG resolution: ≥ 2× the CSS pixels a panel is shown at (96 per inch at most)
RC = {"font.size": 10.0, "axes.titlesize": 10.0, "axes.labelsize": 10.0, "xtick.labelsize": 9.0,
      "ytick.labelsize": 9.0, "legend.fontsize": 9.0, "legend.title_fontsize": 9.0, "figure.titlesize": 10.0,
      "axes.grid": False, "savefig.dpi": DPI}


def apply_style() -> None:
    """The book's font sizes (`RC`), for every figure made after it (done on import)."""
    matplotlib.rcParams.update(RC)


apply_style()


def _is_colorbar(ax) -> bool:
    return getattr(ax, "_colorbar", None) is not None or ax.get_label() == "<colorbar>"


def panels(fig) -> list[list]:
    """The figure's panels, each a list of artists cut out together: ``fig._lp_panels`` when the figure sets it,
    else each visible axes alone, axes stacked on a shared x axis together, a colour bar with the axes nearest it,
    and each figure-level legend as a panel of its own."""
    if getattr(fig, "_lp_panels", None):
        return [list(g) for g in fig._lp_panels]
    axes = [ax for ax in fig.axes
            if ax.get_visible() and (ax.axison or ax.texts or ax.patches or ax.get_legend() is not None)]
    main = [ax for ax in axes if not _is_colorbar(ax)]
    groups: list[list] = []
    for ax in main:
        for g in groups:
            if any(ax.get_shared_x_axes().joined(ax, o) and _overlap_x(ax, o) for o in g):
                g.append(ax)
                break
        else:
            groups.append([ax])
    for cb in [ax for ax in axes if _is_colorbar(ax)]:
        pos = cb.get_position()
        near = min(groups, key=lambda g: min(abs(pos.x0 - o.get_position().x1) + abs(pos.y0 - o.get_position().y0)
                                             for o in g))
        near.append(cb)
    if fig.legends:
        raise ValueError("plots.panels: a figure-level legend cannot be cut out as a panel; put it on an axes "
                         "of its own (`legend_axes`)")
    return groups


def legend_axes(ax, handles, labels, **kw):
    """Use ``ax`` (an axes of the figure's grid) as a legend alone: no frame, no ticks; `panels` cuts it out as a
    panel of its own, which wraps under the others on a narrow screen."""
    ax.axis("off")
    ax.legend(handles, labels, loc=kw.pop("loc", "center left"), frameon=kw.pop("frameon", False), **kw)
    return ax


def _overlap_x(a, b) -> bool:
    pa, pb = a.get_position(), b.get_position()
    return min(pa.x1, pb.x1) - max(pa.x0, pb.x0) > 0.5 * min(pa.width, pb.width)


def _texts(artist) -> tuple[list[float], list[float]]:
    """(sizes of every visible text, sizes of the legend texts) of an axes or a legend, in points."""
    alltxt = [t for t in artist.findobj(Text) if t.get_visible() and t.get_text().strip()]
    legends = [artist] if isinstance(artist, Legend) else [lg for lg in artist.findobj(Legend)]
    leg = [t.get_fontsize() for lg in legends if lg.get_visible() for t in lg.get_texts() if t.get_text().strip()]
    return [t.get_fontsize() for t in alltxt], leg


def panel_images(fig, dpi: int = DPI, pad: float = 0.04) -> list[dict]:
    """Each panel (`panels`) as a PNG: {"png": bytes, "width_in", "height_in", "min_pt", "legend_pt"} — the
    smallest text and the smallest legend text in points (legend_pt None without a legend). The figure is drawn
    once, at ``dpi``, and each panel cut out of that image (its tight box, ``pad`` inches around it)."""
    fig.set_dpi(dpi)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    image = Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).convert("RGB")
    W, H = image.size
    out = []
    for group in panels(fig):
        boxes = [a.get_tightbbox(r) if hasattr(a, "get_tightbbox") else a.get_window_extent(r) for a in group]
        bb = Bbox.union([b for b in boxes if b is not None])
        p = pad * dpi
        x0, x1 = max(0, int(bb.x0 - p)), min(W, int(np.ceil(bb.x1 + p)))
        y0, y1 = max(0, int(H - bb.y1 - p)), min(H, int(np.ceil(H - bb.y0 + p)))  # image rows run downward
        sizes, leg = [], []
        for a in group:
            s_, l_ = _texts(a)
            sizes += s_
            leg += l_
        buf = io.BytesIO()
        # 256 colours are plenty for a plot, and a quarter of the bytes
        image.crop((x0, y0, x1, y1)).quantize(256, method=Image.Quantize.FASTOCTREE).save(buf, format="PNG",
                                                                                        optimize=True)
        out.append({"png": buf.getvalue(), "width_in": (x1 - x0) / dpi, "height_in": (y1 - y0) / dpi,
                    "min_pt": float(min(sizes)) if sizes else None, "legend_pt": float(min(leg)) if leg else None})
    return out


def figure_html(fig, alt: str = "", dpi: int = DPI, close: bool = True) -> str:
    """The figure as HTML: its panels (`panel_images`) side by side, wrapping onto new lines on a narrow screen,
    each shown at most at its natural size (96 CSS px per inch) and at most the column's width."""
    alt = alt or getattr(fig, "_lp_alt", "") or (fig._suptitle.get_text() if fig._suptitle else "figure")
    imgs = []
    for k, p in enumerate(panel_images(fig, dpi)):
        attrs = (f' data-lp-width-in="{p["width_in"]:.3f}"'
                 + (f' data-lp-text-pt="{p["min_pt"]:g}"' if p["min_pt"] else "")
                 + (f' data-lp-legend-pt="{p["legend_pt"]:g}"' if p["legend_pt"] else ""))
        css = f"width:{p['width_in'] * 96:.0f}px"
        imgs.append(f'<img class="lp-panel" alt="{html.escape(alt)} (panel {k + 1})"{attrs} style="{css}" '
                    f'src="data:image/png;base64,{base64.b64encode(p["png"]).decode()}"/>')
    if close:
        plt.close(fig)
    return f'<div class="lp-fig">{"".join(imgs)}</div>'


class Figure:
    """What a chapter glues: the figure's HTML (`figure_html`) as an IPython display object."""

    def __init__(self, fig, alt: str = "", dpi: int = DPI):
        self.html = figure_html(fig, alt, dpi)

    def _repr_html_(self):
        return self.html


def glue_figure(name: str, fig, alt: str = "") -> None:
    """Glue ``fig`` under ``name`` for a ``{glue:figure}`` (its panels stack on a narrow screen), and close it."""
    glue(name, Figure(fig, alt), display=False)


# -- the first page: the paper's causal chain, each link marked from the verdicts ------------------------------------
#: The mark of each status on the chain (its colour is the verdict page's).
STATUS_COLORS = {"reproduced": "#1a7f37", "partly": "#b35900", "not reproduced": "#8c6d1f", "contradicted": "#c0392b",
                 "not yet tested": "#6e7781"}


def causal_chain(links: list[dict]) -> plt.Figure:
    """The paper's causal chain (its Fig. 1) as a column of boxes, one per link, each marked with its status.
    ``links``: [{"text": the link in words, "chapter": "ch. 4", "status": one of `STATUS_COLORS`}, ...] (from
    `lpfail.book.front.chain`). One panel, narrow enough to read on a phone."""
    n = len(links)
    h_box, gap = 0.62, 0.30
    fig, ax = plt.subplots(figsize=(4.9, n * (h_box + gap) * 0.72 + 0.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(-n * (h_box + gap) + gap / 2, gap)
    ax.axis("off")
    for k, link in enumerate(links):
        y = -k * (h_box + gap)
        c = STATUS_COLORS[link["status"]]
        ax.add_patch(FancyBboxPatch((0.1, y - h_box), 6.5, h_box, boxstyle="round,pad=0.02", fc="#f6f8fa",
                                    ec="#8c959f", lw=0.8))
        ax.text(0.3, y - h_box / 2, link["text"], ha="left", va="center", fontsize=9.5)
        ax.add_patch(FancyBboxPatch((6.8, y - h_box + 0.1), 3.1, h_box - 0.2, boxstyle="round,pad=0.02", fc=c,
                                    ec=c, lw=0.8))
        ax.text(8.35, y - h_box / 2, link["status"], ha="center", va="center", fontsize=9, color="white",
                weight="bold")
        ax.text(6.55, y - h_box + 0.06, link["chapter"], ha="right", va="bottom", fontsize=9, color="#57606a",
                style="italic")
        if k < n - 1:
            ax.add_patch(FancyArrowPatch((3.3, y - h_box), (3.3, y - h_box - gap), arrowstyle="-|>",
                                         mutation_scale=10, color="#57606a", lw=1.0))
    fig.subplots_adjust(0, 0, 1, 1)
    return fig


# -- chapter 4: rounding -----------------------------------------------------------------------------------------
ONE_MAX = "#8c959f"   # a row with one maximum (not a variant: the row's kind)


def running_error(keys: np.ndarray, error: np.ndarray, ties: np.ndarray, *, label: str, ax=None, color=None):
    """Running Ō error along the key index, with the keys where P̄ = 1 marked."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ax.plot(keys, error, lw=1.2, color=color, label=label)
    idx = np.flatnonzero(ties)
    if idx.size:
        ax.scatter(keys[idx], error[idx], s=22, color=color, zorder=3, marker="o", edgecolor="k", linewidth=0.5)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("key index t")
    ax.set_ylabel("running error of Ō")
    return ax


def running_error_figure(with_ties: dict, without_ties: dict, with_fix: dict | None = None) -> plt.Figure:
    """Paper Fig. 6 analogue: P̄ along the keys (top) and the running error of Ō (bottom), for a row with
    tied maxima, one without, and optionally the tied row under the fix. Inputs are `rounding.running_error`
    dicts."""
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(5.0, 5.0), sharex=True, gridspec_kw={"height_ratios": [1, 1.6]})
    keys = np.arange(len(with_ties["pbar"]))
    ax0.semilogy(keys, np.maximum(with_ties["pbar"], 1e-30), ".", ms=3, color=color("A"),
                 label="2 tied maxima")
    ax0.semilogy(keys, np.maximum(without_ties["pbar"], 1e-30), ".", ms=3, color=ONE_MAX, alpha=0.7,
                 label="one maximum")
    ax0.set_ylabel("P̄[t] (BF16)")
    ax0.legend(loc="lower right", markerscale=3)
    running_error(keys, with_ties["error"], with_ties["is_one"], label="2 tied maxima, no fix", ax=ax1,
                  color=color("A"))
    running_error(keys, without_ties["error"], without_ties["is_one"], label="one maximum, no fix", ax=ax1,
                  color=ONE_MAX)
    if with_fix is not None:
        running_error(keys, with_fix["error"], with_fix["is_one"], label="2 tied maxima, Algorithm 3",
                      ax=ax1, color=color("fix"))
    ax1.legend(loc="lower left")
    ax1.set_ylabel("running error of Ō\n(rounded prefix − exact)")
    fig.tight_layout()
    return fig


def rounding_sweep_figure(res) -> plt.Figure:
    """Mean Ō error along the three axes of the `rounding` experiment, without and with the fix, with 95 %
    confidence intervals over rows. Positive = the magnitude of Ō is rounded up (away from zero)."""
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.4))
    labels = {"ties": "number of tied maxima", "neg_frac": "fraction of negative V entries",
              "gap": "tied score above the background"}
    for k, (ax, axis) in enumerate(zip(axes, ("ties", "neg_frac", "gap"))):
        x = res[f"{axis}_values"]
        for pname, stat, fmt, lab in (("nofix", "acc_away", "-o", "no fix: Ō"), ("fix", "acc_away", "-^", "Algorithm 3: Ō"),
                                      ("nofix", "out_away", ":o", "no fix: O"), ("fix", "out_away", ":^", "Algorithm 3: O")):
            y, ci = res[f"{axis}_{pname}_{stat}"], res[f"{axis}_{pname}_{stat}_ci"]
            ax.errorbar(x, y * 1e4, yerr=ci * 1e4, fmt=fmt, ms=4, lw=1.2, capsize=2, color=color(pname),
                        alpha=0.6 if stat == "out_away" else 1.0, label=lab if k == 0 else None)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel(labels[axis])
        ax.set_ylabel("error toward larger |Ō| (×10⁻⁴)")
    axes[0].legend(loc="upper right")
    fig.tight_layout()
    return fig


# -- chapter 1's explosion search (its lab page) ----------------------------------------------------------------
def _vstyle(v: str, **kw) -> dict:
    return {**style(v), "lw": 1.4, **kw}


VARIANT_NAME = {v: label(v) for v in ("A", "B", "Bp", "C", "D")}


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
        st = _vstyle(v)
        ax.plot(x, y, label=LETTER.get(v, v), **st)
        status, fail = str(a["status"][i, j]), int(a["fail_step"][i, j])
        e = _curve_end(y)
        if status == "nonfinite" and e >= 0:
            ax.plot([x[e]], [min(y[e], ylim[1] - 0.1)], marker="X", ms=9, color=st["color"], ls="none")
        elif fail >= 0:
            ax.axvline(fail, color=st["color"], lw=0.8, ls=(0, (2, 2)))
        elif status not in ("completed", "nonfinite") and e >= 0:
            ax.plot([x[e]], [y[e]], marker="|", ms=10, color=st["color"], ls="none")
    ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)


def symptom_loss_figure(conf, variants=("A", "C", "Bp", "B", "D")) -> plt.Figure:
    """Training loss (mean per bin of 5 steps) of each variant, one panel per seed (the paper's Fig. 2).
    X: a run that turned NaN (its last finite bin); dashed line: the step where the pre-registered criterion
    says a run failed; bar: a run stopped unfinished."""
    seeds = conf.seeds
    fig, axes = plt.subplots(1, len(seeds), figsize=(3.6 * len(seeds), 3.3), squeeze=False)
    for j, ax in enumerate(axes[0]):
        _loss_panel(ax, conf, j, variants)
        ax.set_title(f"seed {seeds[j]}")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats/byte)")
    axes[0, -1].legend(loc="upper right", ncol=2)
    fig.tight_layout()
    return fig


def symptom_sweep_figure(confs, variants=("A", "C", "Bp")) -> plt.Figure:
    """Loss curves of every other configuration (rows) and seed (columns)."""
    confs = list(confs)
    n = max(len(c.seeds) for c in confs)
    fig, axes = plt.subplots(len(confs), n, figsize=(3.4 * n, 2.6 * len(confs)), squeeze=False)
    for r, conf in enumerate(confs):
        for j in range(n):
            ax = axes[r, j]
            if j < len(conf.seeds):
                _loss_panel(ax, conf, j, variants)
                ax.set_title(f"{conf.label}, seed {conf.seeds[j]}", fontsize=9)
                ax.set_xlabel("step")
                ax.set_ylabel("loss")
            else:
                ax.set_visible(False)
    axes[0, 0].legend(loc="upper right")
    fig.tight_layout()
    return fig


def symptom_grad_norm_figure(conf, variants=("A", "C", "B", "D")) -> plt.Figure:
    """Pre-clip gradient norm (largest per bin of 5 steps), log scale, one panel per seed."""
    seeds = conf.seeds
    fig, axes = plt.subplots(1, len(seeds), figsize=(3.6 * len(seeds), 3.2), squeeze=False)
    a = conf.arrays
    for j, ax in enumerate(axes[0]):
        for v in variants:
            if v in conf.variants:
                ax.semilogy(a["curve_steps"], a["grad_norm_curve_max"][conf.index(v), j], label=LETTER.get(v, v),
                            **_vstyle(v))
        ax.axhline(1.0, color="#999999", lw=0.8)
        ax.set_title(f"seed {seeds[j]}")
        ax.set_xlabel("step")
        ax.set_ylabel("pre-clip gradient norm")
        ax.grid(alpha=0.3, which="major")
    axes[0, -1].legend()
    fig.tight_layout()
    return fig


#: the kinds of weight matrix (not variants: a sequential colour each)
_KINDS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "wte", "wpe")
_KIND_COLORS = dict(zip(_KINDS, series_colors(len(_KINDS))))


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
    fig, axes = plt.subplots(1, len(variants), figsize=(3.4 * len(variants), 3.4), squeeze=False)
    for ax, v in zip(axes[0], variants):
        sp = a["spectral"][conf.index(v), seed_index]
        for kk, name in enumerate(names):
            kind, layer = _kind(name)
            y = sp[:, kk]
            ax.semilogy(steps, y, color=_KIND_COLORS.get(kind, "#333333"), lw=1.0,
                        alpha=0.9 if kind == "attn.c_attn" else 0.6)
            e = _curve_end(y)
            if kind == "attn.c_attn" and e >= 0:
                ax.annotate(f"L{layer}", (steps[e], y[e]), fontsize=9, color=_KIND_COLORS[kind],
                            xytext=(2, 0), textcoords="offset points", va="center")
        ax.set_title(label(v), color=color(v))
        ax.set_xlabel("step")
        ax.set_ylabel(f"σ_max (seed {conf.seeds[seed_index]})")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, label=k) for k, c in _KIND_COLORS.items()]
    axes[0, -1].legend(handles=handles, loc="upper left")
    fig.tight_layout()
    return fig


def ties_loss_figure(conf, seed_index: int = 0, variants=("A", "C")) -> plt.Figure:
    """Above: the loss of each variant. Below: the fraction of attention rows whose maximum is tied, per
    layer, measured every 50 steps on a batch of the training data (the paper's Fig. 13 counts them)."""
    a = conf.arrays
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(5.0, 5.0), sharex=True, gridspec_kw={"height_ratios": [1, 1.2]})
    for v in variants:
        i = conf.index(v)
        ax0.plot(a["curve_steps"], a["loss_curve"][i, seed_index], label=label(v), **_vstyle(v))
        tf = a["tied_frac"][i, seed_index]
        for layer in range(tf.shape[-1]):
            ax1.plot(a["diag_steps"], tf[:, layer], color=color(v), lw=1.0,
                     ls=["-", "--", "-.", ":"][layer % 4], label=f"{LETTER.get(v, v)}, layer {layer}")
    ax0.set_ylabel("loss")
    ax0.legend()
    ax0.grid(alpha=0.3)
    ax1.set_ylabel("rows with a tied maximum")
    ax1.set_xlabel("step")
    ax1.legend(ncol=2)
    ax1.grid(alpha=0.3)
    ax0.set_title(f"{conf.label}, seed {conf.seeds[seed_index]}")
    fig.tight_layout()
    return fig


def fix_rows_figure(res) -> plt.Figure:
    """‖O‖ / ‖O_exact‖ (mean over rows) against the tied maximum m for A, B, B′ and D (stored `fix_rows`
    result); where B′'s output is not finite the ratio is drawn at the bottom as crosses."""
    m = np.asarray(res["m_values"], dtype=float)
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    floor = 1e-14
    for tag in ("A", "D", "B", "Bp"):
        y = np.asarray(res[f"{tag}_ratio_mean"], dtype=float)
        bad = np.asarray(res[f"{tag}_nonfinite_frac"], dtype=float) > 0
        st = _vstyle(tag)
        ax.semilogy(m[~bad], np.clip(y[~bad], floor, None), label=LETTER[tag], **st)
        if bad.any():
            ax.plot(m[bad], np.full(bad.sum(), floor), ls="none", marker="x", ms=5, color=st["color"],
                    label=f"{LETTER[tag]}: not finite")
    ax.axvline(float(res["b_clamp_m_theory"]), color=color("B"), lw=0.8, ls=":")
    ax.set_xlabel("tied maximum score m (two keys)")
    ax.set_ylabel("‖O‖ / ‖O exact‖")
    ax.set_ylim(floor / 3, 5)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", ncol=2)
    fig.tight_layout()
    return fig


def run_figure(conf, seed_index: int, variants=None, figsize=(9.6, 3.0), dpi=None) -> plt.Figure:
    """One seed of one configuration: loss, largest gradient norm per 5 steps (log), and the largest
    attention score over layers (log, every 50 steps), one line per variant."""
    a = conf.arrays
    variants = [v for v in (variants or conf.variants) if v in conf.variants]
    fig, axes = plt.subplots(1, 3, figsize=figsize, dpi=dpi)
    for v in variants:
        i, st = conf.index(v), _vstyle(v)
        axes[0].plot(a["curve_steps"], a["loss_curve"][i, seed_index], label=LETTER.get(v, v), **st)
        axes[1].semilogy(a["curve_steps"], a["grad_norm_curve_max"][i, seed_index], **st)
        axes[2].semilogy(a["diag_steps"], max_over_layers(a["max_logit"][i, seed_index]), **st)
    for ax, t in zip(axes, ("loss", "pre-clip gradient norm", "largest attention score")):
        ax.set_title(t)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    return fig


# -- the primer ---------------------------------------------------------------------------------------------------
def bf16_spacing_figure(marks=(1.0, 16.0, 1024.0, 32768.0)) -> plt.Figure:
    """The spacing of BF16 numbers (one ulp, `lpfail.bf16.ulp`) against their magnitude, log–log: a staircase that
    doubles at every power of two, 2⁻⁷ relative; ``marks`` labelled with their spacing."""
    x = torch.tensor(np.logspace(-2, 5, 2000)).bfloat16()     # BF16 magnitudes (ulp is defined on them)
    u = bf16.ulp(x).double().numpy()
    x = x.double().numpy()
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    ax.loglog(x, u, color=color("A"), lw=1.4, drawstyle="steps-post", label="BF16 spacing (one ulp)")
    ax.loglog(x, x * 2.0 ** -23, color=color("C"), lw=1.0, ls="--", label="FP32 spacing (≈ |x|·2⁻²³)")
    for m in marks:
        ax.plot([m], [bf16.ulp(m)], "o", color=color("A"), ms=5)
        ax.annotate(f"{bf16.ulp(m):g} at {m:g}", (m, bf16.ulp(m)), xytext=(-6, 6), textcoords="offset points",
                    ha="right", fontsize=9)
    ax.set_xlabel("magnitude |x|")
    ax.set_ylabel("distance to the next number")
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig

