"""Chapter 5's explorer of Algorithm 3 and the robust fix, with its static twin (see `lpfail.book.widgets`).

Pick the tied maximum r_m, the number of ties, β, ε and the spread of the other logits; see, per fix, the
maximum m' the forward subtracts, P̄ of the tied keys, the final row sum ℓ, the output error of one row, and
the bias of the stored output over many rows (with its 95 % CI). Rows: the chapter-4 generator
(`lpfail.experiments.rounding.make_rows`), the other scores at r_m − spread·(gap − background), BF16 values,
one 512-key tile, PAPER_BF16 arithmetic.
"""
from __future__ import annotations

import html

import ipywidgets as W
import numpy as np
import torch

from lpfail import bf16, results
from lpfail.book.text import nowrap_numbers  # a number never breaks at its hyphen-minus
from lpfail.book.twin import HTML as _HTML, switcher_html
from lpfail.experiments.fix_gallery import GALLERY, fix_state, states  # noqa: F401  (GALLERY: the states)


def _num(x: float, fmt: str) -> str:
    """A number of the table, or what it is when it is not one (never 'nan')."""
    return format(x, fmt) if np.isfinite(x) else "non-finite"


def state_html(r_m, n_ties, beta, eps, spread) -> str:
    """The table of one state, computed now (the live explorer)."""
    return table_html((r_m, n_ties, beta, eps, spread), fix_state(r_m, n_ties, beta, eps, spread))


def table_html(params, sts: list[dict]) -> str:
    """One state's table from `fix_state`'s list (computed now, or stored by `fix_gallery`)."""
    r_m, n_ties, beta, eps, spread = params
    head = ("<tr><th>policy</th><th>m′ (row 0)</th><th>P̄ at a tie</th><th>ℓ</th><th>error of row 0</th>"
            "<th>bias, 64 rows (± 95 % CI)</th><th>non-finite rows</th></tr>")
    body = []
    for st in sts:
        bad = st["nonfinite"] > 0 or not np.isfinite(st["rel_err"]) or st["rel_err"] > 0.5
        style = " style='color:#c0392b'" if bad else ""
        bias = (f"{st['bias']:+.2e} ± {st['bias_ci']:.1e}" if np.isfinite(st["bias"]) else
                "none: fewer than 2 finite rows")
        body.append(nowrap_numbers(
            f"<tr{style}><td>{html.escape(st['policy'])}</td><td>{_num(st['m'], '.6g')}</td>"
            f"<td>{_num(st['pbar'], '.4g')}</td><td>{_num(st['l'], '.4g')}</td>"
            f"<td>{_num(st['rel_err'], '.3g')}</td><td>{bias}</td><td>{st['nonfinite']:.0%}</td></tr>"))
    return (f"<p>{n_ties} ties at r_m + U(0, 1), r_m = {r_m:g}, rounded to BF16 (row 0's in the m′ of no fix); "
            f"β = {beta:g}, ε = {eps:g}, spread {spread:g} (error of row 0: |O − O*| / |O*|, O* the exact output)</p>"
            f"<table class='lpfail-table'>{head}{''.join(body)}</table>")


#: The twin's label of each stored gallery case (by its stored title): {ties} (where the tied maxima lie), {a3} (what
#: Algorithm 3 does to the bias, by chapter 5's rule) and {shift} (Algorithm 3's shift in row 0) are filled from the
#: case's parameters and stored table, so that label and table agree.
CASE_LABELS = {
    GALLERY[0][0]: "Two ties at {ties}: the chapter-4 rows; Algorithm 3 {a3}",
    GALLERY[1][0]: "Ties at {ties}: Algorithm 3's ℓ underflows (0/0); the clamp silences the row",
    GALLERY[2][0]: "Ties at {ties}: Algorithm 3's m′ = 0, every P̄ underflows",
    GALLERY[3][0]: "Ties at {ties}, BF16 spacing {ulp}: the robust fix still moves m′",
    GALLERY[4][0]: "β = {beta}, ties at {ties}: β·m rounds back to m, P̄ = 1, the bias stays",
    GALLERY[5][0]: "Eight ties at {ties}; Algorithm 3 {a3}",
    GALLERY[6][0]: "β = {beta}, ties at {ties}: P̄ = e^−{shift} (row 0) underflows for Algorithm 3",
    GALLERY[7][0]: "Spread {spread}: the other logits crowd the maximum, ε = {eps} counts them as ties; Algorithm 3 {a3}",
}


def _a3_effect(by: dict[str, dict]) -> str:
    """What Algorithm 3 does to the bias of one case (its table rows by policy), by §5.2's rule
    (`rounding_report.REMOVED_RATIO`)."""
    from lpfail.book.rounding_report import REMOVED_RATIO

    a, b = by["no fix"], by["Algorithm 3"]
    if not np.isfinite(b["bias"]):
        return "turns non-finite"
    if abs(a["bias"]) <= a["bias_ci"]:
        return "has no significant bias to remove"
    ratio = abs(b["bias"]) / abs(a["bias"])
    if abs(b["bias"]) <= b["bias_ci"] or ratio <= REMOVED_RATIO:
        return "removes the bias"
    return f"leaves {100 * ratio:.0f} % of the bias"


def case_label(title: str, params, sts: list[dict]) -> str:
    """The twin's label of a stored case (`CASE_LABELS`, filled from its data); the stored title if it has none."""
    r_m, _n, beta, eps, spread = params
    lo, hi = (f"{x:g}".replace("-", "−") for x in (r_m, r_m + 1))
    by = {st["policy"]: st for st in sts}
    shift = (beta - 1) * by["no fix"]["m"] if np.isfinite(by["Algorithm 3"]["m"]) else float("nan")
    fill = {"ties": f"{lo}–{hi}" if r_m >= 0 else f"{lo} to {hi}", "a3": _a3_effect(by), "beta": f"{beta:g}",
            "eps": f"{eps:g}", "spread": f"{spread:g}", "shift": f"{shift:.0f}", "ulp": f"{bf16_ulp(r_m):g}"}
    return CASE_LABELS.get(title, title).format(**fill)


def bf16_ulp(x: float) -> float:
    """BF16's spacing at x (rounded to BF16 first)."""
    return bf16.ulp(float(bf16.round_bf16(torch.tensor([float(x)]))[0]))


def fix_twin(res=None):
    """Kernel-free twin of `fix_explorer`: the gallery's states behind one <select>, from the stored `fix_gallery`
    (computed once under the pinned CPU numerics; `GALLERY` lists the states, `CASE_LABELS` their labels)."""
    res = results.load("fix_gallery") if res is None else res
    return _HTML(switcher_html("fix_explorer", [(case_label(t, a, sts), table_html(a, sts))
                                                for t, a, sts in states(res)], label="case"))


def fix_explorer():
    """Live: sliders for r_m, the number of ties, β, ε and the spread; the table of `state_html`."""
    r_m = W.FloatText(value=16.0, description="r_m")
    ties = W.IntSlider(value=2, min=1, max=16, description="ties")
    beta = W.FloatLogSlider(value=2.0, base=2, min=0.0015, max=4, step=0.01, description="β")
    eps = W.FloatLogSlider(value=1e-3, base=10, min=-5, max=0, description="ε")
    spread = W.FloatLogSlider(value=1.0, base=2, min=-4, max=3, description="spread")
    out = W.HTML()

    def update(*_):
        try:
            out.value = state_html(float(r_m.value), int(ties.value), float(beta.value), float(eps.value),
                                   float(spread.value))
        except ValueError as e:
            out.value = f"<p style='color:#c0392b'>{html.escape(str(e))}</p>"

    for w in (r_m, ties, beta, eps, spread):
        w.observe(update, names="value")
    update()
    return W.VBox([W.HBox([r_m, ties]), W.HBox([beta, eps]), spread, out])
