"""Chapter 1's figures, tables and explorer for the learning-rate sweep (`lpfail.experiments.lr_sweep`).

Everything here reads a stored `lr_sweep` result (or the dict `assemble` builds) and its `analysis`; the
chapter only calls these functions. Tables come back as HTML strings (narrow, wrapping), figures as matplotlib
Figures, the explorer as an ipywidgets box with a kernel-free twin (`lpfail.book.widgets`).
"""
from __future__ import annotations

import html

import numpy as np

from lpfail.experiments import lr_sweep as L

#: Colours and line styles per variant (the chapter's legend).
STYLE = {
    "A": ("#c0392b", "-"), "C": ("#2c3e50", "-"), "D": ("#e67e22", "-"), "B": ("#8e44ad", "-"),
    "S": ("#7f8c8d", ":"), "A_sr": ("#c0392b", "--"), "A_qk": ("#16a085", "-"), "C_qk": ("#16a085", "--"),
}
SIZE_NAME = {"small": "4 layers × 256 (3.2 M parameters)", "large": "8 layers × 512 (25 M parameters)"}


def label(v: str) -> str:
    return L.VARIANTS[v].label


def _variants(res, size: str) -> list[str]:
    return [str(v) for v in np.asarray(res[f"{size}_variants"])]


def sizes(res) -> list[str]:
    return [s for s in ("small", "large") if f"{s}_variants" in res]


def _fmt_lr(x: float) -> str:
    return f"{x:.3g}"


# -- figures --------------------------------------------------------------------------------------------------
def lr_curves_figure(res, analysis=None, variants=None):
    """Final held-out loss against learning rate, per variant (mean over seeds; the band spans the seeds),
    one panel per model size — the analogue of Wortsman et al.'s Fig. 1. Non-finite runs are drawn at the
    loss at initialization (how the sensitivity counts them) and ringed."""
    import matplotlib.pyplot as plt

    analysis = analysis or res["analysis"]
    lrs = np.asarray(res["lrs"], dtype=float)
    ss = sizes(res)
    fig, axes = plt.subplots(1, len(ss), figsize=(5.2 * len(ss), 3.8), squeeze=False, sharey=True)
    for ax, size in zip(axes[0], ss):
        eff = L.effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])  # (V, L, S)
        status = np.asarray(res[f"{size}_status"])
        for i, v in enumerate(_variants(res, size)):
            if variants is not None and v not in variants:
                continue
            color, ls = STYLE.get(v, ("k", "-"))
            mean = eff[i].mean(axis=-1)
            ax.plot(lrs, mean, ls, color=color, marker="o", ms=3.5, lw=1.6,
                    label=f"{v}  (S = {analysis['sizes'][size][v]['S']:.3f})")
            ax.fill_between(lrs, eff[i].min(axis=-1), eff[i].max(axis=-1), color=color, alpha=0.10, lw=0)
            bad = status[i].any(axis=-1)
            if bad.any():
                ax.plot(lrs[bad], mean[bad], "o", mfc="none", mec=color, ms=10, mew=1.5)
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_title(SIZE_NAME.get(size, size), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="upper left")
    axes[0][0].set_ylabel("held-out loss at step 1,000 (nats/byte)")
    fig.tight_layout()
    return fig


def sensitivity_figure(analysis):
    """LR sensitivity per variant with its 95 % bootstrap interval, one row per (size, variant)."""
    import matplotlib.pyplot as plt

    rows = [(size, v, d) for size, sz in analysis["sizes"].items() for v, d in sz.items()]
    fig, ax = plt.subplots(figsize=(7.2, 0.32 * len(rows) + 1.0))
    for y, (size, v, d) in enumerate(rows):
        color, _ = STYLE.get(v, ("k", "-"))
        ax.errorbar(d["S"], y, xerr=[[d["S"] - d["ci"][0]], [d["ci"][1] - d["S"]]], fmt="o", color=color,
                    capsize=3, ms=5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{'large' if s == 'large' else 'small'}: {v}" for s, v, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("LR sensitivity (nats/byte): mean − min of the loss-vs-lr curve")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def growth_figure(res, size: str = "small", lr_index: int = -1, variants=("A", "C", "A_sr", "A_qk")):
    """At one learning rate: the largest attention logit (max over layers), the fraction of query rows with a
    tied maximum (mean over layers), and ‖W_Q‖ (max over layers and heads), against the step; mean over
    seeds, each seed faint."""
    import matplotlib.pyplot as plt

    steps = np.asarray(res["diag_step"])
    lr = float(np.asarray(res["lrs"])[lr_index])
    vs = [v for v in variants if v in _variants(res, size)]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.3))
    for v in vs:
        i = _variants(res, size).index(v)
        color, ls = STYLE.get(v, ("k", "-"))
        series = (np.nanmax(np.asarray(res[f"{size}_max_logit"])[i, lr_index], axis=-1),  # (S, n_diag)
                  np.nanmean(np.asarray(res[f"{size}_tied_frac"])[i, lr_index], axis=-1),
                  np.nanmax(np.asarray(res[f"{size}_wq"])[i, lr_index], axis=(-1, -2)))
        for ax, y in zip(axes, series):
            for s in range(y.shape[0]):
                ax.plot(steps, y[s], ls, color=color, alpha=0.25, lw=0.8)
            with np.errstate(all="ignore"):
                ax.plot(steps, np.nanmean(y, axis=0), ls, color=color, lw=1.8, label=v)
    axes[0].set_yscale("log")
    axes[0].set_title("largest attention logit (max over layers)", fontsize=9)
    axes[1].set_title("rows with a tied maximum (BF16 scores, mean over layers)", fontsize=9)
    axes[2].set_title("‖W_Q‖ of the largest head", fontsize=9)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{SIZE_NAME.get(size, size)}, lr {_fmt_lr(lr)}", fontsize=10)
    fig.tight_layout()
    return fig


def run_figure(res, size: str, variant: str, lr_index: int, seed_index: int, dpi=None):
    """One run: training loss (binned), held-out loss, gradient norm and largest logit against the step."""
    import matplotlib.pyplot as plt

    i = _variants(res, size).index(variant)
    idx = (i, lr_index, seed_index)
    P = np.asarray(res[f"{size}_loss_curve"]).shape[-1]
    n = int(np.asarray(res["val_step"])[-1])
    x = (np.arange(P) + 0.5) * n / P
    lr = float(np.asarray(res["lrs"])[lr_index])
    seed = int(np.asarray(res["seeds"])[seed_index])
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.0), dpi=dpi)
    color, _ = STYLE.get(variant, ("k", "-"))
    axes[0].plot(x, np.asarray(res[f"{size}_loss_curve"])[idx], color=color, lw=1.3, label="training (binned)")
    axes[0].plot(np.asarray(res["val_step"]), np.asarray(res[f"{size}_val_curve"])[idx], "ko", ms=4,
                 label="held-out")
    axes[0].set_title("loss", fontsize=9)
    axes[0].legend(fontsize=7)
    axes[1].semilogy(x, np.asarray(res[f"{size}_gnorm_curve"])[idx], color=color, lw=1.3, label="geometric mean")
    axes[1].semilogy(x, np.asarray(res[f"{size}_gnorm_max_curve"])[idx], color=color, lw=0.7, alpha=0.5,
                     label="max in bin")
    axes[1].set_title("gradient norm before clipping", fontsize=9)
    axes[1].legend(fontsize=7)
    axes[2].semilogy(np.asarray(res["diag_step"]), np.nanmax(np.asarray(res[f"{size}_max_logit"])[idx], axis=-1),
                     "o-", color=color, ms=3)
    axes[2].set_title("largest attention logit", fontsize=9)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    status = "non-finite at step %d" % res[f"{size}_nonfinite_step"][idx] if res[f"{size}_status"][idx] else "completed"
    fig.suptitle(f"{label(variant)} — {size}, lr {_fmt_lr(lr)}, seed {seed}: {status}", fontsize=10)
    fig.tight_layout()
    return fig


# -- tables (HTML: they wrap in the text column) ---------------------------------------------------------------
_TABLE = "<table class='lpfail-table' style='font-size:0.85em;border-collapse:collapse'>"


def _cell(x, tag="td"):
    return f"<{tag} style='padding:2px 8px;border-bottom:1px solid #ddd;text-align:left'>{x}</{tag}>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "<tr>" + "".join(_cell(html.escape(h), "th") for h in header) + "</tr>"
    body = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows)
    return f"{_TABLE}{head}{body}</table>"


def sensitivity_table(analysis) -> str:
    """Per size and variant: LR sensitivity [95 % interval], the best lr and its loss, where the curve first
    exceeds the best by 10 %, and how many runs turned non-finite."""
    rows = []
    for size, sz in analysis["sizes"].items():
        for v, d in sz.items():
            rows.append([size, html.escape(label(v)), f"{d['S']:.3f} [{d['ci'][0]:.3f}, {d['ci'][1]:.3f}]",
                         f"{_fmt_lr(d['best_lr'])}: {d['best_loss']:.3f}",
                         "—" if np.isnan(d["lr_10pct"]) else _fmt_lr(d["lr_10pct"]),
                         f"{d['nonfinite']} of {d['runs']}"])
    return _table(["size", "variant", "LR sensitivity [95 % CI]", "best lr: loss", "loss > 1.1 × best from lr",
                   "non-finite runs"], rows)


def verdict_rows(analysis) -> list[dict]:
    out = []
    for name, text in L.HYPOTHESES.items():
        v = analysis["verdicts"].get(name)
        out.append({"name": name, "hypothesis": text, "point": None if v is None else v["point"],
                    "ci": None if v is None else v["ci"], "verdict": "not measured" if v is None else v["verdict"]})
    return out


def verdict_table(analysis) -> str:
    rows = []
    for r in verdict_rows(analysis):
        stat = "—" if r["point"] is None else f"{r['point']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]"
        rows.append([r["name"], html.escape(r["hypothesis"]), stat, f"<b>{html.escape(r['verdict'])}</b>"])
    return _table(["", "hypothesis (pre-registered " + analysis["preregistered_on"] + ")",
                   "statistic [95 % CI]", "verdict"], rows)


def gap_per_lr_table(analysis) -> str:
    """A − C in final held-out loss at each learning rate, per size, with a bootstrap interval over seeds."""
    rows = []
    for size, items in analysis["a_minus_c_per_lr"].items():
        for it in items:
            rows.append([size, _fmt_lr(it["lr"]), f"{it['point']:+.3f} [{it['ci'][0]:+.3f}, {it['ci'][1]:+.3f}]"])
    return _table(["size", "lr", "A − C, held-out loss [95 % CI]"], rows)


def provenance_html(res) -> str:
    """Where and when the runs ran, as a short wrapped list (one line per part file)."""
    m = res.meta if hasattr(res, "meta") else {}
    items = [f"{html.escape(str(p['device']))}, {html.escape(str(p['created'])[:16]).replace('T', ' ')} UTC, "
             f"git {html.escape(str(p['git'])[:12])}, {p['runs']} runs, {p['wall_s'] / 60:.1f} min"
             for p in res["parts"]]
    head = (f"lr_sweep: config {html.escape(str(m.get('config_hash', '?')))}, collected "
            f"{html.escape(str(m.get('collected_on', m.get('created', '?'))))}") if m else "lr_sweep"
    return (f"<div style='font-size:0.8em;color:#555'>{head}; runs from:<ul style='margin:0'>"
            + "".join(f"<li>{i}</li>" for i in items) + "</ul></div>")


# -- the explorer -------------------------------------------------------------------------------------------
def runs_twin(res, size: str = "small", dpi: int = 55, variants=None):
    """Kernel-free twin of `runs_explorer`: every run of one size precomputed behind one <select>."""
    from lpfail.book import widgets

    cases = []
    for v in variants or _variants(res, size):
        for j, lr in enumerate(np.asarray(res["lrs"])):
            for k, s in enumerate(np.asarray(res["seeds"])):
                cases.append((f"{v}, lr {_fmt_lr(float(lr))}, seed {int(s)}",
                              widgets._png_html(run_figure(res, size, v, j, k), dpi=dpi)))
    return widgets._HTML(widgets.switcher_html(f"lr_sweep_runs_{size}", cases, label="run"))


def runs_explorer(res):
    """Live: choose size, variant, learning rate and seed; see the run's curves."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    size_dd = W.Dropdown(options=sizes(res), description="size")
    var_dd = W.Dropdown(description="variant")
    lr_dd = W.Dropdown(options=[(_fmt_lr(float(x)), j) for j, x in enumerate(np.asarray(res["lrs"]))],
                       value=len(res["lrs"]) - 1, description="lr")
    seed_dd = W.Dropdown(options=[(str(int(s)), k) for k, s in enumerate(np.asarray(res["seeds"]))], value=0,
                         description="seed")
    out = W.Output()

    def refresh(*_):
        var_dd.options = [(label(v), v) for v in _variants(res, size_dd.value)]

    def draw(*_):
        if var_dd.value is None:
            return
        with out:
            out.clear_output(wait=True)
            fig = run_figure(res, size_dd.value, var_dd.value, lr_dd.value, seed_dd.value)
            display(fig)
            plt.close(fig)

    size_dd.observe(lambda ch: (refresh(), draw()), names="value")
    for w in (var_dd, lr_dd, seed_dd):
        w.observe(draw, names="value")
    refresh()
    draw()
    return W.VBox([W.HBox([size_dd, var_dd]), W.HBox([lr_dd, seed_dd]), out])
