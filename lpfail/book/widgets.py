"""Interactive explorers for the book, each with a static twin for the HTML edition.

In Jupyter the widgets are live (ipywidgets, a running kernel). In the built HTML there is no kernel, so
every explorer has a twin that needs none: its states are precomputed, and a JavaScript-only control (a
<select> with an inline handler, no kernel, no library) switches between them. The book shows the live
widget's code but not its output in the HTML (cell tag ``remove-output``); see book/about_widgets.md.
Every twin's outermost element carries ``data-lpfail-twin="<explorer name>"``, which the browser test
(tools/browser_check.py) looks for on every page whose notebook has a widget output. Used in chapter 4,
"Rounding".
"""
from __future__ import annotations

import html

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

from lpfail import bf16
from lpfail.book import gradient_report, plots
from lpfail.book.twin import HTML as _HTML  # noqa: F401  (re-exported)
from lpfail.book.twin import TWIN_DPI, switcher_html
from lpfail.book.twin import png_html as _png_html
from lpfail.gradient_error import accumulation_toy

#: Cases the static twin shows: (title, kind, a, b). "acc" = FP32 running sum + BF16 term.
ADDITION_GALLERY = [
    ("The paper's worked addition: carry, rounding bit 1, sticky bits set → away from zero",
     "acc", bf16.PAPER_RUNNING_SUM, bf16.PAPER_TERM),
    ("The same two big terms without the small residual: an exact tie, broken to even",
     "bf16", bf16.from_bits("1 10000000 0011010"), bf16.PAPER_TERM),
    ("Two same-exponent terms whose carry leaves an odd last bit: a tie broken to even → away from zero",
     "bf16", -2.375, bf16.PAPER_TERM),
    ("A residual of the opposite sign: below half an ulp → toward zero",
     "acc", float(np.float32(-2.40625 + 0.000865459)), bf16.PAPER_TERM),
    ("Cancellation: nearly equal magnitudes of opposite sign, a left shift, exact",
     "bf16", 1.2265625, -1.203125),
    ("A large exponent gap: the small term lies entirely in the sticky bits",
     "bf16", 3.0, 0.0048828125),
]


def trace(kind: str, a: float, b: float) -> bf16.AddTrace:
    """`add_trace` for kind "bf16" (two BF16 operands) or `add_trace_acc` for kind "acc"."""
    if kind == "bf16":
        return bf16.add_trace(a, b)
    if kind == "acc":
        return bf16.add_trace_acc(a, b)
    raise ValueError(f"kind must be 'bf16' or 'acc' (got {kind!r})")


def addition_gallery_html(cases=ADDITION_GALLERY) -> str:
    """The static twin of `addition_explorer`: one titled trace table per case."""
    parts = []
    for title, kind, a, b in cases:
        parts.append(f"<h4 style='margin:1em 0 0.3em 0'>{html.escape(title)}</h4>")
        parts.append(trace(kind, a, b)._repr_html_())
    return "\n".join(parts)


def addition_twin_html(cases=ADDITION_GALLERY) -> str:
    """The HTML edition's twin of `addition_explorer`: the gallery's traces behind one <select>."""
    return switcher_html("addition_explorer",
                         [(title, trace(kind, a, b)._repr_html_()) for title, kind, a, b in cases])


def addition_gallery():
    """Displayable static twin (renders as HTML in a notebook and in the built book)."""
    return _HTML(addition_gallery_html())


def addition_twin():
    """Displayable kernel-free twin of `addition_explorer` (a <select> over the gallery's cases)."""
    return _HTML(addition_twin_html())


def addition_explorer():
    """A live explorer of BF16 addition: pick two BF16 operands, or an FP32 running sum and a BF16 term,
    and see alignment, the significand sum, normalization and rounding, with the error. Values typed in are
    rounded to the operand's format first (and the table says so)."""
    mode = W.ToggleButtons(options=[("two BF16 operands", "bf16"), ("FP32 running sum + BF16 term", "acc")],
                           value="acc", description="add")
    a_box = W.FloatText(value=bf16.PAPER_RUNNING_SUM, description="a", step=0.01)
    b_box = W.FloatText(value=bf16.PAPER_TERM, description="b", step=0.01)
    presets = W.Dropdown(options=[(t, i) for i, (t, *_) in enumerate(ADDITION_GALLERY)], value=0,
                         description="example", layout=W.Layout(width="95%"))
    out = W.HTML()

    def _round(x: float, to_fp32: bool) -> float:
        t = torch.tensor(x, dtype=torch.float64).float()
        return float(t if to_fp32 else t.to(torch.bfloat16).float())

    def update(*_):
        kind = mode.value
        a = _round(a_box.value, to_fp32=(kind == "acc"))
        b = _round(b_box.value, to_fp32=False)
        notes = []
        if a != a_box.value:
            notes.append(f"a = {a_box.value!r} is not representable; using {a!r}")
        if b != b_box.value:
            notes.append(f"b = {b_box.value!r} is not representable in BF16; using {b!r}")
        try:
            body = trace(kind, a, b)._repr_html_()
        except (ValueError, OverflowError) as e:
            body = f"<p style='color:#c0392b'>{html.escape(str(e))}</p>"
        out.value = "".join(f"<p><i>{html.escape(n)}</i></p>" for n in notes) + body

    def pick(change):
        _, kind, a, b = ADDITION_GALLERY[change["new"]]
        mode.value, a_box.value, b_box.value = kind, a, b

    presets.observe(pick, names="value")
    for w in (mode, a_box, b_box):
        w.observe(update, names="value")
    update()
    return W.VBox([presets, mode, W.HBox([a_box, b_box]), out])


# -- chapter 1: every run of the symptom search ------------------------------------------------------------
def runs_twin(confs, dpi: int = TWIN_DPI):
    """Kernel-free twin of `runs_explorer`: every (configuration, seed) precomputed, behind one <select>."""
    cases = [(f"{c.label}, seed {s}", _png_html(plots.run_figure(c, j), dpi=dpi))
             for c in confs for j, s in enumerate(c.seeds)]
    return _HTML(switcher_html("runs_explorer", cases, label="configuration and seed"))


def runs_explorer(confs):
    """Live: choose a configuration, a seed and the variants; see loss, gradient norm and largest score."""
    conf_dd = W.Dropdown(options=[(c.label, k) for k, c in enumerate(confs)], value=0, description="config")
    seed_dd = W.Dropdown(options=[], description="seed")
    var_sel = W.SelectMultiple(description="variants", rows=5)
    out = W.Output()

    def refresh_options(*_):
        c = confs[conf_dd.value]
        seed_dd.options = [(str(s), j) for j, s in enumerate(c.seeds)]
        var_sel.options = [(plots.VARIANT_NAME.get(v, v), v) for v in c.variants]
        var_sel.value = tuple(c.variants)

    def draw(*_):
        c = confs[conf_dd.value]
        if seed_dd.value is None:
            return
        with out:
            out.clear_output(wait=True)
            fig = plots.run_figure(c, seed_dd.value, list(var_sel.value) or None)
            display(fig)
            plt.close(fig)

    conf_dd.observe(lambda ch: (refresh_options(), draw()), names="value")
    seed_dd.observe(draw, names="value")
    var_sel.observe(draw, names="value")
    refresh_options()
    draw()
    return W.VBox([W.HBox([conf_dd, seed_dd]), var_sel, out])


# -- chapter 3: the accumulation toy (biased ∝ K, unbiased ∝ √K) -------------------------------------------
#: (bias, rank) states of the static twin.
ACCUMULATION_CASES = [(0.0, 1), (0.05, 1), (0.5, 1), (0.05, 4), (0.0, 4)]


def accumulation_twin(cases=ACCUMULATION_CASES, steps: int = 300, dpi: int = TWIN_DPI):
    """Kernel-free twin of `accumulation_explorer`: the toy precomputed for a few (bias, rank)."""
    states = []
    for bias, rank in cases:
        fig = gradient_report.toy_figure([accumulation_toy(bias=bias, rank=rank, steps=steps, d=8, reps=64)])
        states.append((f"bias {bias:g}, rank {rank}", _png_html(fig, dpi=dpi)))
    return _HTML(switcher_html("accumulation_explorer", states, label="coefficient bias and rank"))


def accumulation_explorer():
    """Live: the coefficients' bias, the number of shared directions (rank) and the number of steps of
    `lpfail.gradient_error.accumulation_toy`; see how the accumulated error grows. The figure is an HTML widget
    (a PNG), so nothing is displayed outside the widget."""
    bias = W.FloatSlider(value=0.05, min=0.0, max=0.5, step=0.01, description="bias", continuous_update=False)
    rank = W.IntSlider(value=1, min=1, max=8, description="rank", continuous_update=False)
    steps = W.IntSlider(value=300, min=50, max=1000, step=50, description="steps", continuous_update=False)
    view = W.HTML()

    def draw(*_):
        fig = gradient_report.toy_figure([accumulation_toy(bias=bias.value, rank=rank.value, steps=steps.value,
                                                            d=8, reps=64)])
        view.value = _png_html(fig)

    for w in (bias, rank, steps):
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([bias, rank, steps]), view])
