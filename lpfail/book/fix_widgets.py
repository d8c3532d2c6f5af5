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

from lpfail import attention as attn
from lpfail.book.text import nowrap_numbers  # a number never breaks at its hyphen-minus
from lpfail.book.twin import HTML as _HTML, switcher_html
from lpfail.experiments.rounding import RowSpec, make_rows, mean_ci
from lpfail.precision import PAPER_BF16, PAPER_BF16_OFFICIAL_FIX, BoundedMax, DynamicMax

#: The twin's precomputed states: (title, r_m, n_ties, β, ε, spread).
GALLERY = [
    ("Two ties at 16: the chapter-4 rows; Algorithm 3 removes the bias", 16.0, 2, 2.0, 1e-3, 1.0),
    ("Ties at 100: Algorithm 3's ℓ underflows (0/0); the clamp silences the row", 100.0, 2, 2.0, 1e-3, 1.0),
    ("Ties at −100: Algorithm 3's m' = 0, every P̄ underflows", -100.0, 2, 2.0, 1e-3, 1.0),
    ("Ties at 1000, BF16 spacing 4: the robust fix still moves m", 1000.0, 2, 2.0, 1e-3, 1.0),
    ("β = 1.001 at 0.5: β·r_m rounds back to r_m, P̄ = 1, the bias stays", 0.5, 2, 1.001, 1e-3, 1.0),
    ("Eight ties at 16", 16.0, 8, 2.0, 1e-3, 1.0),
    ("β = 8 at 16: P̄ = e^−112 underflows for Algorithm 3", 16.0, 2, 8.0, 1e-3, 1.0),
    ("Spread 0.25: the other logits crowd the maximum, ε = 0.1 counts them as ties", 16.0, 2, 2.0, 0.1, 0.25),
]


def rows(r_m: float, n_ties: int, spread: float, n_rows: int = 64, seed: int = 0):
    """Scores (rows, 1, 512) as BF16 values with `n_ties` keys tied near r_m, V (rows, 512, 64)."""
    spec = RowSpec(n_ties=int(n_ties), gap=16.0)
    s, v, _ = make_rows(spec, n_rows, seed)
    top = s.amax(dim=-1, keepdim=True)
    s = (top.double() + spread * (s.double() - top.double()) + (r_m - spec.gap)).to(torch.bfloat16).float()
    return s, v


def fix_policies(beta: float, eps: float) -> dict:
    return {"no fix": PAPER_BF16, "Algorithm 3": PAPER_BF16.replace(fix=DynamicMax(beta, eps)),
            "official (clamp)": PAPER_BF16_OFFICIAL_FIX.replace(fix=DynamicMax(beta, eps)),
            "robust": PAPER_BF16.replace(fix=BoundedMax(beta, eps) if beta >= 1.0 else None)}


def fix_state(r_m: float, n_ties: int, beta: float, eps: float, spread: float, n_rows: int = 64) -> list[dict]:
    """Per policy: m' and P̄ of the tied keys, ℓ and |O − O_exact|/|O_exact| of row 0, the bias over rows."""
    s, v = rows(r_m, n_ties, spread, n_rows)
    o_true = (torch.softmax(s.double(), -1) @ v.double())[:, 0]
    out = []
    for name, policy in fix_policies(beta, eps).items():
        res = attn.forward_from_scores(s, v, policy)
        o = res.o.double()[:, 0]
        top = s[:1, 0].amax(-1, keepdim=True)
        pbar = attn.exp_scores(top, res.m[:1, 0].reshape(1, 1), policy).to(policy.dtype("pbar"))
        finite = torch.isfinite(o).all(-1)
        err = (o - o_true).mean(-1)[finite].numpy()
        bias = mean_ci(err) if err.size >= 2 else (float("nan"), float("nan"))
        rel = ((o[0] - o_true[0]).norm() / o_true[0].norm()).item()
        out.append({"policy": name, "m": float(res.m[0].reshape(())), "pbar": float(pbar.reshape(())),
                    "l": float(res.l[0].reshape(())), "rel_err": rel, "bias": bias[0], "bias_ci": bias[1],
                    "nonfinite": float((~finite).double().mean())})
    return out


def _num(x: float, fmt: str) -> str:
    """A number of the table, or what it is when it is not one (never 'nan')."""
    return format(x, fmt) if np.isfinite(x) else "non-finite"


def state_html(r_m, n_ties, beta, eps, spread) -> str:
    head = ("<tr><th>policy</th><th>m′ (row 0)</th><th>P̄ at a tie</th><th>ℓ</th><th>error of row 0</th>"
            "<th>bias, 64 rows (± 95 % CI)</th><th>non-finite rows</th></tr>")
    body = []
    for st in fix_state(r_m, n_ties, beta, eps, spread):
        bad = st["nonfinite"] > 0 or not np.isfinite(st["rel_err"]) or st["rel_err"] > 0.5
        style = " style='color:#c0392b'" if bad else ""
        bias = (f"{st['bias']:+.2e} ± {st['bias_ci']:.1e}" if np.isfinite(st["bias"]) else
                "none: fewer than 2 finite rows")
        body.append(nowrap_numbers(
            f"<tr{style}><td>{html.escape(st['policy'])}</td><td>{_num(st['m'], '.6g')}</td>"
            f"<td>{_num(st['pbar'], '.4g')}</td><td>{_num(st['l'], '.4g')}</td>"
            f"<td>{_num(st['rel_err'], '.3g')}</td><td>{bias}</td><td>{st['nonfinite']:.0%}</td></tr>"))
    return (f"<p>r_m = {r_m:g}, {n_ties} ties, β = {beta:g}, ε = {eps:g}, spread {spread:g} (error of row 0: "
            "|O − O*| / |O*|, O* the exact output)</p>"
            f"<table class='lpfail-table'>{head}{''.join(body)}</table>")


def fix_twin(cases=GALLERY):
    """Kernel-free twin of `fix_explorer`: the gallery's states behind one <select>."""
    return _HTML(switcher_html("fix_explorer", [(t, state_html(*a)) for t, *a in cases], label="case"))


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
