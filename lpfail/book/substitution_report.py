"""Tables and figures of chapter 2 ("Substitution"), from `lpfail.experiments.substitution` and the stored
`lr_sweep` / `substitution` results."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lpfail.experiments import substitution as sub

ROWS_HEADER = ["row", "change from A", "group", "learning rates", "the paper's finding"]


def _change(r: sub.Row) -> str:
    if r.kind == "policy":
        return f"<code>{r.changes}</code>"
    return {"layer_a": f"layer {r.layer}: PAPER_BF16, the rest FP32", "layer_c": f"layer {r.layer}: FP32, the rest A",
            "heads_top": f"{sub.HEADS_PER_ROW} heads with the largest ‖W_Q^h‖ (per seed): PAPER_BF16, the rest FP32",
            "heads_rest": "the other heads of that layer: PAPER_BF16, the rest FP32"}[r.kind]


def rows_table(c: sub.SubstitutionConfig | None = None) -> list[list[str]]:
    """One line per row of the grid, in the order they run."""
    c = c or sub.SubstitutionConfig()
    return [[r.name + ": " + r.label, _change(r), r.group, ", ".join(f"{x:g}" for x in r.lrs), r.paper]
            for r in c.row_objects()]


#: The table's order: the paper's Sec. 3 (tiling, one layer, δ, O, heads), then the casts beyond its list.
GROUP_ORDER = ("tiling", "layer", "delta", "output", "heads", "scores", "backward")


def paper_order(rows: list[sub.Row]) -> list[sub.Row]:
    return sorted(rows, key=lambda r: GROUP_ORDER.index(r.group))  # stable: the grid's order within a group


def results_rows(analysis: Mapping | None, c: sub.SubstitutionConfig | None = None) -> list[list[str]]:
    """One line per row, in the paper's order: its verdict and statistic at each learning rate, or "pending
    (GPU)" without a result."""
    c = c or sub.SubstitutionConfig()
    out = []
    for r in paper_order(c.row_objects()):
        cells = [r.name + ": " + r.label]
        for lr in c.lrs:
            if lr not in r.lrs:
                cells.append("not run at this lr")
                continue
            d = (analysis or {}).get("rows", {}).get(r.name, {}).get("by_lr", {}).get(f"{lr:g}")
            if d is None:
                cells.append("pending (GPU)")
            elif d.get("ci") is None:
                cells.append(d["verdict"])
            else:
                fr = d.get("fraction_closed")
                cells.append(f"<b>{d['verdict']}</b><br>{d['point']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                             + (f"<br>{fr * 100:.0f} % closed" if fr is not None else ""))
        cells.append(r.paper)
        out.append(cells)
    return out


def results_header(c: sub.SubstitutionConfig | None = None) -> list[str]:
    c = c or sub.SubstitutionConfig()
    return ["row"] + [f"lr {lr:g}: verdict, (L_row − L_C) − ½(L_A − L_C) [95 % CI]" for lr in c.lrs] + ["paper"]


def wq_figure(lr_res, lr: float = 3.2e-2, seed: int = 0):
    """The paper's Fig. 3 from lr_sweep's stored diagnostics: ‖W_Q^h‖ per head against the step, one panel per
    layer, A (solid) and C (dashed), at one learning rate and seed of the smaller size."""
    import matplotlib.pyplot as plt

    variants = [str(v) for v in np.asarray(lr_res["small_variants"])]
    lrs = [float(x) for x in np.asarray(lr_res["lrs"])]
    seeds = [int(s) for s in np.asarray(lr_res["seeds"])]
    wq = np.asarray(lr_res["small_wq"], dtype=np.float64)  # (V, L, S, n_diag, layer, head)
    steps = np.asarray(lr_res["diag_step"])
    n_layer, n_head = wq.shape[-2], wq.shape[-1]
    fig, axes = plt.subplots(1, n_layer, figsize=(3.0 * n_layer, 3.0), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for layer, ax in enumerate(np.atleast_1d(axes)):
        for name, style in (("A", "-"), ("C", "--")):
            y = wq[variants.index(name), lrs.index(lr), seeds.index(seed), :, layer]  # (n_diag, head)
            for h in range(n_head):
                ax.plot(steps, y[:, h], style, color=colors[h % len(colors)], lw=1.2,
                        label=f"{name} head {h}" if layer == 0 else None)
        ax.set_title(f"layer {layer}", fontsize=10)
        ax.set_xlabel("step")
    np.atleast_1d(axes)[0].set_ylabel("‖W_Q^h‖ (spectral)")
    np.atleast_1d(axes)[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
