"""Chapter 1's figures, tables and explorer for the learning-rate sweep (`lpfail.experiments.lr_sweep`).

Everything here reads a stored `lr_sweep` result (or the dict `assemble` builds) and its `analysis`; the
chapter only calls these functions. Tables come back as HTML strings (narrow, wrapping), figures as matplotlib
Figures, the explorer as an ipywidgets box with a kernel-free twin (`lpfail.book.widgets`).
"""
from __future__ import annotations

from collections.abc import Mapping

import html

import numpy as np

from lpfail.book.text import interval
from lpfail.experiments import lr_sweep as L
from lpfail.book.verdict import (SWEEP_RULE, Verdict, _f, _hyp, _load_or_none, _prov, _stat, pending)



def _style(v: str) -> tuple[str, str]:
    """(colour, line style) of a variant, from the book's one palette (`lpfail.book.plots`)."""
    from lpfail.book import plots

    st = plots.style(v)
    return st["color"], st["ls"]


SIZE_NAME = {"small": "4 layers × 256 (3.2 M parameters)", "large": "8 layers × 512 (25 M parameters)"}


def label(v: str) -> str:
    return L.VARIANTS[v].label


def _legend(v: str) -> str:
    """A variant's name in a figure's legend: its letter and its words (the book's palette module)."""
    from lpfail.book import plots

    return plots.label(v)


def _variants(res, size: str) -> list[str]:
    return [str(v) for v in np.asarray(res[f"{size}_variants"])]


def sizes(res) -> list[str]:
    return [s for s in ("small", "large") if f"{s}_variants" in res]


def _fmt_lr(x: float) -> str:
    return f"{x:.3g}"


# -- figures --------------------------------------------------------------------------------------------------
def lr_curves_figure(res, analysis=None, variants=None, only_sizes=None):
    """Final held-out loss against learning rate, per variant (mean over seeds; the band spans the seeds),
    one panel per model size — the analogue of Wortsman et al.'s Fig. 1. Non-finite runs are drawn at the
    loss at initialization (how the sensitivity counts them) and ringed."""
    import matplotlib.pyplot as plt

    analysis = analysis or res["analysis"]
    lrs = np.asarray(res["lrs"], dtype=float)
    ss = [x for x in sizes(res) if only_sizes is None or x in only_sizes]
    if not ss:
        raise ValueError(f"lr_curves_figure: none of the sizes {only_sizes} is stored (have {sizes(res)})")
    fig, axes = plt.subplots(1, len(ss), figsize=(4.9 * len(ss), 4.0), squeeze=False)
    for ax, size in zip(axes[0], ss):
        eff = L.effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])  # (V, L, S)
        stored = np.asarray(res[f"{size}_stored"])
        eff = np.where(stored, eff, np.nan)
        status = np.asarray(res[f"{size}_status"])
        for i, v in enumerate(_variants(res, size)):
            if (variants is not None and v not in variants) or not stored[i].any():
                continue
            color, ls = _style(v)
            with np.errstate(all="ignore"):
                mean = np.nanmean(eff[i], axis=-1)
            done = analysis["sizes"].get(size, {}).get(v)
            tag = (f"sensitivity {done['S']:.3f}" if done else
                   f"{int(stored[i].sum())} of {stored[i].size} runs: no S")
            ax.plot(lrs, mean, ls, color=color, marker="o", ms=3.5, lw=1.6, label=f"{_legend(v)}: {tag}")
            ax.fill_between(lrs, np.nanmin(eff[i], axis=-1), np.nanmax(eff[i], axis=-1), color=color,
                            alpha=0.10, lw=0)
            bad = status[i].any(axis=-1)
            if bad.any():
                ax.plot(lrs[bad], mean[bad], "o", mfc="none", mec=color, ms=10, mew=1.5)
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_title(SIZE_NAME.get(size, size))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_ylabel("held-out loss at step 1,000 (nats/byte)")
    fig.tight_layout()
    return fig


def sensitivity_figure(analysis):
    """LR sensitivity per variant with its 95 % bootstrap interval, one row per (size, variant)."""
    import matplotlib.pyplot as plt

    rows = [(size, v, d) for size, sz in analysis["sizes"].items() for v, d in sz.items()]
    fig, ax = plt.subplots(figsize=(5.0, 0.32 * len(rows) + 1.0))
    for y, (size, v, d) in enumerate(rows):
        color, _ = _style(v)
        ax.errorbar(d["S"], y, xerr=[[d["S"] - d["ci"][0]], [d["ci"][1] - d["S"]]], fmt="o", color=color,
                    capsize=3, ms=5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{'large' if s == 'large' else 'small'}: {v}" for s, v, _ in rows])
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
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.4))
    for v in vs:
        i = _variants(res, size).index(v)
        color, ls = _style(v)
        series = (np.nanmax(np.asarray(res[f"{size}_max_logit"])[i, lr_index], axis=-1),  # (S, n_diag)
                  np.nanmean(np.asarray(res[f"{size}_tied_frac"])[i, lr_index], axis=-1),
                  np.nanmax(np.asarray(res[f"{size}_wq"])[i, lr_index], axis=(-1, -2)))
        for ax, y in zip(axes, series):
            for s in range(y.shape[0]):
                ax.plot(steps, y[s], ls, color=color, alpha=0.25, lw=0.8)
            with np.errstate(all="ignore"):
                ax.plot(steps, np.nanmean(y, axis=0), ls, color=color, lw=1.8, label=_legend(v))
    axes[0].set_yscale("log")
    axes[0].set_ylabel("largest attention logit")
    axes[1].set_ylabel("rows with a tied maximum")
    axes[2].set_ylabel("‖W_Q‖ of the largest head")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    return fig


def run_figure(res, size: str, variant: str, lr_index: int, seed_index: int | None = None, dpi=None):
    """Runs of one (size, variant, lr): training loss (binned) and held-out loss, gradient norm and largest
    logit against the step — one seed, or every stored seed (``seed_index=None``, one shade per seed)."""
    import matplotlib.pyplot as plt

    i = _variants(res, size).index(variant)
    seeds = np.asarray(res["seeds"])
    stored = np.asarray(res[f"{size}_stored"])[i, lr_index]
    ks = [seed_index] if seed_index is not None else [k for k in range(len(seeds)) if stored[k]]
    P = np.asarray(res[f"{size}_loss_curve"]).shape[-1]
    n = int(np.asarray(res["val_step"])[-1])
    x = (np.arange(P) + 0.5) * n / P
    lr = float(np.asarray(res["lrs"])[lr_index])
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 3.0), dpi=dpi)
    color, _ = _style(variant)
    notes = []
    for n_k, k in enumerate(ks):
        idx = (i, lr_index, k)
        alpha = 1.0 if len(ks) == 1 else 0.45 + 0.55 * n_k / max(1, len(ks) - 1)
        lab = f"seed {int(seeds[k])}"
        axes[0].plot(x, np.asarray(res[f"{size}_loss_curve"])[idx], color=color, lw=1.2, alpha=alpha, label=lab)
        axes[0].plot(np.asarray(res["val_step"]), np.asarray(res[f"{size}_val_curve"])[idx], "o", color="k",
                     ms=3.5, alpha=alpha)
        axes[1].semilogy(x, np.asarray(res[f"{size}_gnorm_curve"])[idx], color=color, lw=1.2, alpha=alpha)
        axes[2].semilogy(np.asarray(res["diag_step"]),
                         np.nanmax(np.asarray(res[f"{size}_max_logit"])[idx], axis=-1), "o-", color=color, ms=3,
                         alpha=alpha)
        if res[f"{size}_status"][idx]:
            notes.append(f"seed {int(seeds[k])} non-finite at step {int(res[f'{size}_nonfinite_step'][idx])}")
    axes[0].set_title("loss (dots: held-out)")
    axes[0].legend()
    axes[1].set_title("gradient norm (before clipping)")
    axes[2].set_title("largest attention logit")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig._lp_alt = f"{label(variant)} — {size}, lr {_fmt_lr(lr)}" + (f" ({'; '.join(notes)})" if notes else "")
    fig.tight_layout()
    return fig


# -- sentences from the numbers ---------------------------------------------------------------------------------
WORDS = {"supported": "holds", "refuted": "is refuted", "inconclusive": "is undecided",
         "no gap to close": "has no gap to close", "not measured (runs missing)": "is not measured yet (runs missing)"}


def verdict_sentences(analysis) -> str:
    """One Markdown bullet per hypothesis, its statistic and interval, generated from the analysis."""
    out = []
    for r in verdict_rows(analysis):
        word = WORDS.get(r["verdict"], r["verdict"])
        stat = ("" if r["point"] is None else
                f": statistic {r['point']:+.3f}, 95 % interval [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]")
        out.append(f"* **{r['name']} {word}**{stat}. *{r['hypothesis']}.*")
    return "\n".join(out)


def turning_text(analysis, size: str = "small") -> str:
    """Whether the variants share their best learning rate and the rate where the loss first exceeds the best
    by 10 %, as one sentence."""
    sz = analysis["sizes"][size]
    best = {v: d["best_lr"] for v, d in sz.items()}
    up = {v: d["lr_10pct"] for v, d in sz.items()}
    if len(set(best.values())) == 1 and len(set(up.values())) == 1:
        return (f"Every variant has its best loss at lr {_fmt_lr(next(iter(best.values())))} and first exceeds it "
                f"by 10 % at lr {_fmt_lr(next(iter(up.values())))}: the variants differ in how much worse the high "
                "rates get, not in where the curve turns.")
    return ("Best learning rate per variant: " + ", ".join(f"{v} {_fmt_lr(x)}" for v, x in best.items())
            + "; loss first above 1.1 × best from: " + ", ".join(f"{v} {_fmt_lr(x)}" for v, x in up.items()) + ".")


def incomplete_text(res, analysis) -> str:
    """What is missing from a partial grid, as one sentence ('' when complete)."""
    if bool(res["complete"]):
        return ""
    parts = [f"{size}: " + ", ".join(f"{v} ({d['stored']} of {d['runs']} runs)" for v, d in miss.items())
             for size, miss in analysis.get("incomplete", {}).items()]
    return (f"{int(res['runs_stored'])} of {int(res['runs_planned'])} runs of the pre-registered grid are stored; "
            "missing or partial, and left out of every statistic: " + "; ".join(parts) + ".")


def cost(res, parallel: int) -> dict:
    """Measured run times and what the whole grid costs at that rate, for runs `parallel` at a time on one GPU:
    per size the stored runs' median wall time, and (run-seconds of the whole grid) / parallel in minutes."""
    out = {}
    for size in sizes(res):
        stored = np.asarray(res[f"{size}_stored"])
        wall = np.asarray(res[f"{size}_wall_s"])[stored]
        out[size] = {"runs": int(stored.sum()), "planned": int(stored.size),
                     "median_wall_s": float(np.median(wall)) if wall.size else float("nan"),
                     "grid_min": float(np.median(wall) * stored.size / parallel / 60) if wall.size else float("nan")}
    out["total_grid_min"] = float(sum(v["grid_min"] for k, v in out.items() if isinstance(v, dict)))
    return out


def setting_html(c) -> str:
    """The sweep's setting beside the paper's run (its App. B), as a narrow table."""
    rows = [
        ["model", f"{c.small[0]} layers × {c.small[2]} ({c.small[1]} heads), and {c.large[0]} × {c.large[2]}",
         "GPT-2 small: 12 × 768 (12 heads)"],
        ["data", f"{c.data}: Python documentation as bytes, {c.val_fraction:.0%} held out", "OpenWebText, GPT-2 BPE"],
        ["tokens per step", f"{c.batch_size} × {c.block_size} = {c.batch_size * c.block_size:,}", "524,288"],
        ["steps", f"{c.max_steps:,} ({c.max_steps * c.batch_size * c.block_size / 1e6:.1f} M tokens)",
         "≈ 6,600 until the failure"],
        ["learning rate", f"{len(c.lrs)} rates {c.lrs[0]:g} … {c.lrs[-1]:g}; warm-up {c.warmup}, cosine to lr/"
                          f"{1 / c.min_lr_ratio:g}", "1e-3, warm-up 2,000, cosine"],
        ["optimizer", f"AdamW (0.9, {c.beta2}), wd {c.weight_decay:g}, clip {c.grad_clip:g}",
         "AdamW (0.9, 0.95), wd 0, clip 1"],
        ["seeds", f"{len(c.seeds)} (init and batch order)", "1"],
    ]
    return _table(["", "this sweep", "the paper"], [[html.escape(x) for x in r] for r in rows])


# -- tables (HTML: they wrap in the text column) ---------------------------------------------------------------
def _table(header: list[str], rows: list[list[str]]) -> str:
    """`costs.html_table` with cells that are already HTML (escaped where they hold text)."""
    from lpfail.book.costs import html_table

    return html_table(header, rows, escape=False)


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
        stat = interval(r)
        rows.append([r["name"], html.escape(r["hypothesis"]), stat, f"<b>{html.escape(r['verdict'])}</b>"])
    return _table(["", "hypothesis (pre-registered " + analysis["preregistered_on"] + ")",
                   "statistic [95 % CI]", "verdict"], rows)


def gap_per_lr_table(analysis) -> str:
    """A − C in final held-out loss at each learning rate, per size, with a bootstrap interval over seeds."""
    rows = []
    for size, items in analysis["a_minus_c_per_lr"].items():
        for it in items:
            rows.append([size, _fmt_lr(it["lr"]), interval(it)])
    return _table(["size", "lr", "A − C, held-out loss [95 % CI]"], rows)


def closure_table(res, size: str = "small", variants=("D", "B", "S", "A_sr")) -> str:
    """Descriptive (`lpfail.experiments.lr_sweep.versus_control`): per variant, S(v) − S(C), the share of the
    A − C gap it closes, and v − C in held-out loss at the two highest learning rates, with 95 % intervals."""
    rows = {r["variant"]: r for r in L.versus_control(res, size)}
    out, lr_head = [], []
    for v in variants:
        if v not in rows:
            continue
        r = rows[v]
        lr_head = lr_head or [f"v − C at lr {_fmt_lr(d['lr'])} [95 % CI]" for d in r["per_lr"]]
        out.append([html.escape(label(v)), interval(r["minus_control"]),
                    interval(r["closed"], ".0f", scale=100) + " %", *[interval(d) for d in r["per_lr"]]])
    if not out:
        raise ValueError(f"closure_table: none of {variants} is stored at the {size} size")
    return _table(["variant", "S(v) − S(C) [95 % CI]", "share of S(A) − S(C) closed [95 % CI]", *lr_head], out)


def calls_rows(directory=None, grid: bool = True) -> list[dict]:
    """One row per stored part (a GPU call's driver): when, where, how many runs, the driver's wall time, the
    median run time per size, and how the call ran its runs — how many at once (``parallel``), on which GPUs,
    which variant groups uncaptured, its budget — from the part file's own metadata (`lpfail.sweep.run` records
    them); ``None`` for a key the part does not record (the parts written before it did)."""
    import json

    from lpfail import sweep

    runs, metas = L.STORE.load(directory)
    if grid:  # only the parts that hold runs of lr_sweep's own grid (cures and fix_training share the folder)
        metas = sweep.lookup(L.lr_sweep_grid(), directory).parts
    folder = L.STORE.path(directory)
    out = []
    for m in metas:
        part = json.loads((folder / m["file"]).read_text())
        med = {}
        for size in ("small", "large"):
            w = [runs[k]["wall_s"] for k in m["keys"] if k.startswith(size + "/")]
            med[size] = (float(np.median(w)), len(w)) if w else None
        unc = part.get("uncaptured")
        out.append({"file": m["file"], "device": m["device"], "created": str(m["created"]), "git": str(m["git"]),
                    "runs": m["runs"], "wall_s": float(m["wall_s"]), "median_wall_s": med,
                    "parallel": part.get("parallel"), "gpus": part.get("gpus"), "budget_s": part.get("budget_s"),
                    "uncaptured": None if unc is None else (", ".join(unc) if unc else "none")})
    return out


NOT_RECORDED = "not recorded"


def calls_table(directory=None, grid: bool = True) -> str:
    rows = []
    for r in calls_rows(directory, grid):
        med = "; ".join(f"{size} {m[0]:.0f} s ({m[1]} runs)" for size, m in r["median_wall_s"].items() if m)
        rows.append([html.escape(f"{r['created'][:16].replace('T', ' ')} UTC"), html.escape(r["git"][:7]),
                     str(r["runs"]), f"{r['wall_s'] / 60:.1f} min",
                     NOT_RECORDED if r["parallel"] is None else str(r["parallel"]),
                     html.escape(NOT_RECORDED if r["uncaptured"] is None else r["uncaptured"]),
                     html.escape(med)])
    return _table(["driver started", "git", "runs", "driver wall", "at once", "uncaptured variants",
                   "median run wall"], rows)


def provenance_html(res) -> str:
    """Where and when the runs ran, as a short wrapped list (one line per part file)."""
    m = res.meta if hasattr(res, "meta") else {}
    items = [f"{html.escape(str(p['device']))}, {html.escape(str(p['created'])[:16]).replace('T', ' ')} UTC, "
             f"git {html.escape(str(p['git'])[:12])}, {p['runs']} runs, {p['wall_s'] / 60:.1f} min"
             for p in res["parts"]]
    head = (f"lr_sweep: config {html.escape(str(m.get('config_hash', '?')))}, collected on "
            f"{html.escape(str(m.get('collected_on', m.get('created', '?'))))}") if m else "lr_sweep"
    return (f"<div style='font-size:0.8em;color:#555'>{head}; runs from:<ul style='margin:0'>"
            + "".join(f"<li>{i}</li>" for i in items) + "</ul></div>")


# -- the explorer -------------------------------------------------------------------------------------------
def runs_twin(res, size: str = "small", dpi: int = 90, variants=None):
    """Kernel-free twin of `runs_explorer`: every stored (variant, lr) of one size precomputed, its seeds
    drawn together, behind one <select>."""
    from lpfail.book import twin

    cases = []
    stored = np.asarray(res[f"{size}_stored"])
    for v in variants or _variants(res, size):
        i = _variants(res, size).index(v)
        for j, lr in enumerate(np.asarray(res["lrs"])):
            if stored[i, j].any():
                cases.append((f"{v}, lr {_fmt_lr(float(lr))}",
                              twin.png_html(run_figure(res, size, v, j), dpi=dpi)))
    return twin.HTML(twin.switcher_html(f"lr_sweep_runs_{size}", cases, label="run"))


def runs_explorer(res):
    """Live: choose size, variant, learning rate and seed; see the run's curves."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    size_dd = W.Dropdown(options=sizes(res), description="size")
    var_dd = W.Dropdown(description="variant")
    lr_dd = W.Dropdown(options=[(_fmt_lr(float(x)), j) for j, x in enumerate(np.asarray(res["lrs"]))],
                       value=len(res["lrs"]) - 1, description="lr")
    seed_dd = W.Dropdown(options=[("all", None)] + [(str(int(s)), k) for k, s in enumerate(np.asarray(res["seeds"]))],
                         value=None, description="seed")
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


# -- the compiled arithmetic (lpfail.experiments.compiled_sweep) -----------------------------------------------
def compiled_section() -> str:
    """Chapter 1's section on PAPER_BF16_COMPILED: the stored compiled_sweep table (S of A, C and A_comp, the
    pre-registered verdicts), or how many of its runs are still missing and what they wait for. Markdown."""
    from lpfail import results
    from lpfail.experiments import compiled_sweep as CS

    try:
        res = results.load("compiled_sweep")
    except results.ResultMissing:
        from lpfail import sweep

        lk = sweep.lookup(CS.compiled_sweep_grid())
        return (f"**Pending.** {len(lk.missing)} of the {len(lk.runs)} runs are not yet measured (variants "
                f"{', '.join(sorted({r.group for r in lk.missing}))}). They run once `official_check` "
                "has confirmed the preset on a GPU (chapter 4). The rule is fixed (pre-registered "
                f"{CS.PREREGISTERED_ON}): *{CS.COMPILED_RULE}*")
    a = res["compiled_analysis"]
    rows = ["| variant | LR sensitivity S [95 % CI] | non-finite runs |", "|---|---|---|"]
    for v in ("A", "C", "A_comp"):
        d = a["S"][v]
        rows.append(f"| {label(v)} | {interval({'point': d['S'], 'ci': d['ci']})} | {a['nonfinite'][v]} |")
    rows += ["", f"* **symptom** ({CS.COMPILED_HYPOTHESES['symptom']}): S(A_comp) − S(C) = "
                 f"{interval(a['symptom'])}: **{a['symptom']['verdict']}**.",
             f"* **same as eager** (descriptive): S(A_comp) − S(A) = {interval(a['same_as_eager'])}: "
             f"**{a['same_as_eager']['verdict']}**.",
             "", f"*{res.provenance}*"]
    return "\n".join(rows)


# -- chapter 1's claims (C0, C0-bias, C0-qk, C0-size), by the sweep's pre-registered hypotheses ----------------
_SIZE = {"small": "smaller", "large": "larger"}

def _s(a: Mapping, variant: str, size: str = "small") -> str:
    d = a.get("sizes", {}).get(size, {}).get(variant)
    if d is None:
        return f"S({variant}) not measured"
    return f"S({variant}) = {_f(d['S']):.3f} [{_f(d['ci'][0]):.3f}, {_f(d['ci'][1]):.3f}]"

def _closed(a: Mapping, treated: str, control: str) -> str:
    """How much of the smaller size's A − C gap the pair (treated, control) closes, from the point estimates."""
    sz = a.get("sizes", {}).get("small", {})
    if not all(k in sz for k in ("A", "C", treated, control)):
        return ""
    gap, left = _f(sz["A"]["S"]) - _f(sz["C"]["S"]), _f(sz[treated]["S"]) - _f(sz[control]["S"])
    if gap <= 0:
        return ""
    frac = 1 - left / gap
    how = (f"closes {frac * 100:.0f} % of the gap" if frac >= 0
           else f"closes none of the gap: it widens it by {-frac * 100:.0f} %")
    return f"S({treated}) − S({control}) = {left:+.3f} against S(A) − S(C) = {gap:+.3f} ({how}, point estimates)"

def sweep_scope(res: Mapping) -> str:
    """Empty for a complete grid; else which runs are missing and that verdicts are on the complete part."""
    if res.get("complete", True):
        return ""
    a = res["analysis"]
    inc = a.get("incomplete", {})
    miss = "; ".join(f"{_SIZE.get(size, size)} size: " + ", ".join(f"{v} {d['stored']}/{d['runs']}"
                                                                     for v, d in per.items())
                     for size, per in inc.items() if per)
    done = "; ".join(f"{_SIZE.get(size, size)} size: {', '.join(per)}" for size, per in a.get("sizes", {}).items()
                     if per)
    n = (f"{int(res['runs_stored'])} of {int(res['runs_planned'])} runs stored"
         if "runs_stored" in res and "runs_planned" in res else "not every run stored")
    return (f"**Partial evidence:** the grid is incomplete, {n} (runs stored of the variants with missing ones — "
            f"{miss or 'none listed'}); the verdict is on the complete part: {done or 'no complete variant'}.")

def _sweep_note(res: Mapping) -> str:
    return "" if res.get("complete", True) else "partial grid"

def _sweep_differs(res: Mapping) -> str:
    cfg = (getattr(res, "meta", None) or {}).get("config") or {}
    if cfg.get("small"):
        (nl, _, ne), lrs = cfg["small"], [float(x) for x in cfg.get("lrs", [])]
        setting = (f"{nl} layers × {ne} (the smaller size), {cfg['max_steps']:,} steps of "
                   f"{int(cfg['batch_size']) * int(cfg['block_size']):,} byte-level tokens per run at learning "
                   f"rates {min(lrs):g}–{max(lrs):g}, {len(cfg.get('seeds', []))} seeds")
    else:
        setting = "small byte-level GPTs trained briefly over a grid of learning rates (see the stored config)"
    return (f"A small-scale proxy (Wortsman et al. {{cite}}`wortsman2023small`): {setting}; the final held-out loss "
            "summarised as LR sensitivity, not the paper's loss explosion of GPT-2 small over 3.5 B tokens.")

def _production_text(res: Mapping) -> str:
    """Descriptive, not part of any rule: the share of the A − C gap that D (production-kernel arithmetic) and
    S (SDPA) close, where both are stored ('' otherwise)."""
    from lpfail.experiments import lr_sweep as L

    if "small_variants" not in res or "small_val_final" not in res:
        return ""
    try:
        rows = {r["variant"]: r for r in L.versus_control(res, "small")}
    except (KeyError, L.SweepIncomplete):
        return ""
    parts = [f"{name} closes {100 * rows[v]['closed']['point']:.0f} % [{100 * rows[v]['closed']['ci'][0]:.0f}, "
             f"{100 * rows[v]['closed']['ci'][1]:.0f}]" for v, name in (("D", "D (production-kernel arithmetic)"),
                                                                       ("S", "PyTorch SDPA"))
             if v in rows and rows[v]["closed"] is not None]
    if not parts:
        return ""
    return "Descriptively (no hypothesis was registered for them), of that gap " + " and ".join(parts) + "."

def judge_lr_symptom(res: Mapping, old: Verdict | None = None) -> Verdict:
    """C0, by the sweep's pre-registered H1: the LR sensitivity of A (PAPER_BF16) exceeds that of C (FP32) at
    the smaller size. Its word maps by `SWEEP_WORDS`. ``old`` — the explosion search's verdict
    (`judge_symptom`) — is reported beside it and does not decide it."""
    a = res["analysis"]
    v, h = _hyp(a, "H1")
    per_lr = a.get("a_minus_c_per_lr", {}).get("small", [])
    where = [f"{_f(d['lr']):g}" for d in per_lr if d.get("ci") is not None and _f(d["ci"][0]) > 0]
    small = a.get("sizes", {}).get("small", {})
    nonfinite = sum(int(small[k].get("nonfinite", 0)) for k in ("A", "C") if k in small)
    ev = (f"Pre-registered ({a.get('preregistered_on', '?')}) H1, S(A) − S(C) at the smaller size: "
          f"{_stat(h)} — **{h['verdict']}**. {_s(a, 'A')}, {_s(a, 'C')} (LR sensitivity of the held-out loss, "
          "bootstrap intervals over the seeds: with 3 seeds, the seed range).")
    if per_lr:
        ev += (" Per learning rate, A's final loss is significantly above C's at "
               + (f"lr {', '.join(where)}" if where else "no learning rate")
               + f" of {len(per_lr)}; {nonfinite} runs of A and C turned non-finite.")
    if prod := _production_text(res):
        ev += " " + prod
    ev += f" See {{numref}}`fig-lr-curves`; {_prov(res)}."
    if scope := sweep_scope(res):
        ev += " " + scope
    oldtxt, note = "", _sweep_note(res)
    if old is not None:
        oldtxt = (f"explosion search (`symptom`), by its own pre-registered rule: **{old.verdict}**. "
                  f"{old.evidence} Its rule: {old.rule}.")
        note = "; ".join(x for x in (note, f"old criterion, explosion search: {old.verdict}") if x)
    return Verdict(
        "C0", "The small-scale symptom: training with the paper's BF16 flash attention is worse than with "
              "high-precision (FP32) attention — measured as learning-rate sensitivity.",
        v, ev,
        f"{a.get('hypotheses', {}).get('H1', 'H1: S(A) − S(C) > 0')}; {SWEEP_RULE}. The explosion search's "
        "criterion is reported beside it and no longer decides",
        _sweep_differs(res), note=note, old=oldtxt)

def _sci(x) -> str:
    """1.3175e-3 → '1.32 × 10⁻³' (three significant digits)."""
    m, e = f"{float(x):.2e}".split("e")
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    return f"{m} × 10{str(int(e)).translate(sup)}"


def confound_text(sr: Mapping | None) -> str:
    """What stochastic rounding adds beside the bias it removes, from the stored ``sr_confound`` ('' without it)."""
    if sr is None:
        return ""
    g = lambda k: float(np.nanmean(np.asarray(sr[k], dtype=np.float64)))  # noqa: E731
    rise = 100 * (float(sr["rows_A_sr_rms"]) / float(sr["rows_A_rms"]) - 1)
    return (f"The test is confounded: stochastic rounding removes the bias but adds noise. On chapter 4's tied rows "
            f"it cuts O's bias from {_sci(sr['rows_A_bias'])} to {_sci(sr['rows_A_sr_bias'])}, and raises "
            f"O's RMS error by {rise:.0f} % ({_sci(sr['rows_A_rms'])} → {_sci(sr['rows_A_sr_rms'])}) and "
            f"dQ's relative error from {g('grad_A_dq'):.4f} to {g('grad_A_sr_dq'):.4f} (FP32 attention "
            f"{g('grad_C_dq'):.4f}; `sr_confound`). So a gap that survives stochastic rounding may come from the "
            "added variance, not only from a harm that the bias does not explain.")


def retired_text(grid: str = "confirmation") -> str:
    """Where ``grid``'s A_sr runs are runs of the retired stochastic-rounding stream (`lpfail.sweep.Lookup.retired`,
    read from the results cache's part files): that they cannot be repeated and are to be trained again ('' when
    none is)."""
    from lpfail import sweep

    n = len(sweep.lookup(sweep.get(grid)).retired)
    if not n:
        return ""
    return (f"The {n} stochastic-rounding runs (A_sr) behind it drew their random bits from torch's generator, "
            "whose draws depended on whether a training step was captured in a CUDA graph; that stream is replaced "
            "by one each run owns, so these runs cannot be repeated bit for bit. Until they are trained again under "
            "the new stream, this verdict rests on one draw of the rounding and may move with another.")


def judge_bias_not_noise(res: Mapping, sr: Mapping | None = None) -> Verdict:
    """C0-bias, by H2: stochastic rounding of A's output path (P̄V, Ō, O: the same 8-bit mantissas without the
    bias) closes at least half of the A − C gap. Needs H1 supported ("no gap to close" → not yet tested).
    ``sr``: the stored ``sr_confound``, whose measurement of what stochastic rounding adds is shown beside it."""
    a = res["analysis"]
    v, h = _hyp(a, "H2")
    closed = _closed(a, "A_sr", "C")
    word = h["verdict"]
    if word == "refuted":
        plain = ("The A − C gap survives stochastic rounding: removing the bias at the same precision closes "
                 "significantly less than half of it, so on this proxy the harm does not come from the bias alone.")
    elif word == "supported":
        plain = ("Stochastic rounding closes at least half of the A − C gap: the bias, not the precision, does "
                 "the harm.")
    elif word == "inconclusive":
        plain = "The interval cannot tell whether stochastic rounding closes half of the A − C gap."
    elif word == "no gap to close":
        plain = "H1 is not supported, so there is no A − C gap for stochastic rounding to close."
    else:
        plain = "The runs it needs (A, C and A_sr at the smaller size) are not all stored."
    ev = (f"{plain} Pre-registered H2, S(A_sr) − S(C) − ½·(S(A) − S(C)): {_stat(h)} — **{word}**"
          + (f"; {closed}" if closed else "") + f". {_s(a, 'A_sr')}. See {{doc}}`01_symptom`; {_prov(res)}.")
    if conf := confound_text(sr):
        ev += " " + conf
    if scope := sweep_scope(res):
        ev += " " + scope
    return Verdict(
        "C0-bias", "The harm comes from the bias of the rounding, not from the low precision itself: the same "
                   "8-bit rounding made unbiased (stochastic rounding of P̄V, Ō and O) trains like FP32 attention.",
        v, ev,
        f"{a.get('hypotheses', {}).get('H2', 'H2')}; {SWEEP_RULE}; H1 not supported → no gap to close → not yet "
        "tested",
        "Stochastic rounding only of P̄V, Ō and O in the reference attention (the rest of A's arithmetic as it "
        "is); " + _sweep_differs(res)[0].lower() + _sweep_differs(res)[1:], note=_sweep_note(res))

def judge_qk_norm(res: Mapping) -> Verdict:
    """C0-qk, by H3: QK-norm closes at least half of the A − C gap (S(A_qk) − S(C_qk) against S(A) − S(C)).
    Not a claim of the paper: a remedy from the follow-up literature, tested with the same rule."""
    a = res["analysis"]
    v, h = _hyp(a, "H3")
    closed = _closed(a, "A_qk", "C_qk")
    word = h["verdict"]
    plain = {"supported": "QK-norm closes at least half of the A − C gap.",
             "refuted": "QK-norm leaves more than half of the A − C gap.",
             "inconclusive": "The interval cannot tell whether QK-norm closes half of the A − C gap.",
             "no gap to close": "H1 is not supported, so there is no A − C gap for QK-norm to close."
             }.get(word, "The runs it needs (A, C, A_qk and C_qk at the smaller size) are not all stored.")
    ev = (f"{plain} Pre-registered H3, S(A_qk) − S(C_qk) − ½·(S(A) − S(C)): {_stat(h)} — **{word}**"
          + (f"; {closed}" if closed else "") + f". {_s(a, 'A_qk')}, {_s(a, 'C_qk')}. See {{doc}}`01_symptom`; "
          f"{_prov(res)}.")
    if scope := sweep_scope(res):
        ev += " " + scope
    return Verdict(
        "C0-qk", "QK-norm (LayerNorm of q and k per head) blocks it: with QK-norm in both, BF16 flash attention's "
                 "extra LR sensitivity over FP32 attention shrinks by at least half. Not a claim of the paper: a "
                 "remedy from the instability literature {cite}`dehghani2023scaling,wortsman2023small`.",
        v, ev,
        f"{a.get('hypotheses', {}).get('H3', 'H3')}; {SWEEP_RULE}; H1 not supported → no gap to close → not yet "
        "tested",
        _sweep_differs(res), note=_sweep_note(res))

def judge_size(res: Mapping) -> Verdict:
    """C0-size, by the descriptive H4: the A − C gap at the larger size is at least the gap at the smaller."""
    a = res["analysis"]
    v, h = _hyp(a, "H4")
    word = h["verdict"]
    if word == "not measured (runs missing)":
        inc = a.get("incomplete", {}).get("large", {})
        ev = ("Not measured: the larger size's A and C runs are not all stored"
              + (" (" + ", ".join(f"{k} {d['stored']}/{d['runs']}" for k, d in inc.items()) + ")" if inc else "")
              + ".")
    else:
        gl, gs = h.get("gap_large"), h.get("gap_small")
        ev = (f"Pre-registered H4 (descriptive), (S(A) − S(C))_larger − (S(A) − S(C))_smaller: {_stat(h)} — "
              f"**{word}**" + (f"; the gap is {_stat(gl)} at the larger size, {_stat(gs)} at the smaller"
                               if gl and gs else "") + ".")
    ev += f" See {{doc}}`01_symptom`; {_prov(res)}."
    if scope := sweep_scope(res):
        ev += " " + scope
    return Verdict(
        "C0-size", "Larger models are at least as sensitive: the A − C gap does not shrink with model size (the "
                   "premise of a small-scale proxy; the paper's failures are at GPT-2 scale).",
        v, ev, f"{a.get('hypotheses', {}).get('H4', 'H4')}; {SWEEP_RULE}",
        "Two sizes only, ≈ 8× apart in parameters; " + _sweep_differs(res)[0].lower() + _sweep_differs(res)[1:],
        note=_sweep_note(res))


def size_estimates(conf: Mapping | None) -> str | None:
    """C0-size's estimates from the confirmation grid's seeds, where both sizes' A and C are all stored: the gap in
    LR sensitivity S(A) − S(C) per size with its 95 % Student t interval over that size's seeds. Estimates beside
    the verdict, not a call (H4 is not one of the confirmation's families). None without those runs."""
    from lpfail.experiments import confirmation as CF
    from lpfail.sweep import stats

    if conf is None:
        return None
    gaps = {}
    for size in ("large", "small"):
        d = CF._size(conf, size)  # the size's complete variants only
        if d is None or not {"A", "C"} <= set(d["eff"]):
            return None
        diff = stats.seed_sensitivity(d["eff"]["A"]) - stats.seed_sensitivity(d["eff"]["C"])
        m, lo, hi = stats.t_interval(diff)
        gaps[size] = (interval({"point": m, "ci": [lo, hi]}, "+.3f"), diff.size)
    (gl, nl), (gs, ns) = gaps["large"], gaps["small"]
    return (f"On the confirmation grid's seeds (estimates, not a call: H4 is not one of its families), "
            f"S(A) − S(C) is {gl} at the larger size ({nl} seeds) and {gs} at the smaller ({ns} seeds), 95 % "
            f"Student t intervals.")


#: How lr_sweep's three-seed rows say what their rule is (issue of the legacy rule: its "interval" over three
#: seeds is the seed range, and its false-call rate on simulated null data, tests/test_stats_null.py, is far
#: above 5 %): shown on every training verdict still judged on those seeds.
FEW_SEEDS_TEST = ("paired percentile bootstrap over the seeds (with 3 seeds its interval is the seed range, not a "
                  "95 % interval; its false-call rate on simulated null data is measured in tests/test_stats_null.py)")
FEW_SEEDS_NOTE = "3 seeds: fewer than the 10 a training verdict needs"


def proxy(res: Mapping | None = None, sizes: tuple[str, ...] = ("small",)) -> dict:
    """The proxy a training verdict was judged on, from the stored config: {"size", "steps", "lr"}."""
    cfg = ((getattr(res, "meta", None) or {}).get("config") or {}) if res is not None else {}
    default = L.LRSweepConfig()
    shapes = [cfg.get(size) or getattr(default, size) for size in sizes]
    lrs = [float(x) for x in cfg.get("lrs", default.lrs)]
    steps = int(cfg.get("max_steps", default.max_steps))
    return {"size": " and ".join(f"{s[0]} layers × {s[2]} wide" for s in shapes),
            "steps": f"{steps:,} per run",
            "lr": f"{min(lrs):g} to {max(lrs):g}, a factor 2 apart" if len(lrs) > 1 else f"{lrs[0]:g}"}


def few_seeds(v: Verdict, res: Mapping, sizes: tuple[str, ...] = ("small",)) -> Verdict:
    """A training verdict still on lr_sweep's three seeds, saying so: its seeds, its test, its proxy, a note."""
    import dataclasses

    n = len(((getattr(res, "meta", None) or {}).get("config") or {}).get("seeds", [])) or 3
    note = "; ".join(x for x in (v.note, FEW_SEEDS_NOTE.replace("3 seeds", f"{n} seeds")) if x)
    return dataclasses.replace(v, seeds=n, test=FEW_SEEDS_TEST, proxy=proxy(res, sizes), note=note)


#: Per confirmed claim: its hypothesis, the statistic in words, and which runs it needs (`judge_confirmed`).
CONFIRMED = {"C0": ("H1", "S(A) − S(C)", "A and C at the smaller size, seeds 0–9"),
             "C0-bias": ("H2", "S(A_sr) − S(C) − ½·(S(A) − S(C))", "A, C and A_sr at the smaller size, seeds 0–9"),
             "C0-qk": ("H3", "S(A_qk) − S(C_qk) − ½·(S(A) − S(C))",
                       "A, C, A_qk and C_qk at the smaller size, seeds 0–9"),
             "Fix-b": ("HB", "S(B) − S(C) − ½·(S(A) − S(C))", "A, C and B at the smaller size, seeds 0–9")}
#: The three-seed rule a confirmed claim had before, in words (lr_sweep's unless named here).
OLD_RULE = {"Fix-b": "fix_training's rule on its {n} seeds (legacy bootstrap rule; B's runs had been seen when it "
                     "was written)"}
#: The page that shows a confirmed claim's evidence (chapter 1 unless named here).
CONFIRMED_PAGE = {"Fix-b": "05_fix"}
#: Each half-gap hypothesis' remedy: its own gap, in words of the LR sensitivity S.
REMEDY_GAP = {"H2": "S(A_sr) − S(C)", "H3": "S(A_qk) − S(C_qk)", "HD": "S(D) − S(C)", "HB": "S(B) − S(C)",
              "HR": "S(R) − S(C)"}


def confirmed(conf: Mapping | None, claim: str) -> bool:
    """Whether the stored ``confirmation`` grid decides ``claim`` (its hypothesis has a verdict on ten seeds)."""
    if conf is None or claim not in CONFIRMED:
        return False
    h = conf["analysis"].get("claims", {}).get(CONFIRMED[claim][0]) or {}
    return h.get("verdict") in ("supported", "inconclusive", "refuted")


def h5_word(a: Mapping, size: str) -> str:
    """H5 at ``size`` with power beside it: 'no power' instead of 'not distinguishable' where the fresh seeds could
    not have called a gap as large as the healthy margin (`lpfail.experiments.confirmation_power.h5_word`)."""
    from lpfail.experiments import confirmation_power as CP

    return CP.h5_word(a, size)


def row_word(a: Mapping, family: str, name: str) -> str:
    """A confirmation row's call with power beside it: 'no power' instead of 'inconclusive' where its family could
    not have called a gap as large as the healthy margin (`lpfail.experiments.confirmation_power.row_word`)."""
    from lpfail.experiments import confirmation_power as CP

    return CP.row_word(a, family, name)


def power_text(a: Mapping, size: str, n: int) -> str:
    """One sentence on what a size's gap family could call where FP32 attention is healthy: the gap its fresh seeds
    call 80 % of the time (in standard deviations of the per-seed gap and in nats, beside the healthy margin) and
    the one-sided 95 % upper bound of A − C over all ``n`` seeds there (`confirmation_power.power_rows`); "" where
    the analysis lacks what power needs."""
    from lpfail.experiments import confirmation_power as CP

    try:
        rows = [r for r in CP.power_rows(a) if r["family"] == f"gaps_{size}" and r["healthy"]]
    except (KeyError, TypeError, ValueError):
        return ""
    if not rows:
        return ""
    nats = sorted(r["detectable_gap_nats"] for r in rows)
    span = f"{nats[0]:.3f}" if len(nats) == 1 else f"{nats[0]:.3f}–{nats[-1]:.3f}"
    dsd, limit, k = rows[0]["detectable_gap_sd"], rows[0]["margin_nats"], rows[0]["n_confirm"]
    beyond = nats[0] > limit
    return (f" At the healthy rates its {k} fresh seeds would call a gap of {dsd:.{0 if dsd >= 10 else 1}f} standard "
            f"deviations of the per-seed gap 80 % of the time: {span} nats there, "
            + (f"more than the healthy margin of {limit:.3f} nats, which is what *no power* says"
               if beyond else f"less than the healthy margin of {limit:.3f} nats")
            + f"; over all {n} seeds, A − C there is at most {max(r['upper_bound'] for r in rows):+.3f} nats "
              "(one-sided 95 % bound).")


def _closed_text(a: Mapping, hyp: str) -> str:
    """For a half-gap hypothesis: how much of S(A) − S(C) the remedy leaves, from the two estimates (both means
    over the same seeds, so the difference is exact)."""
    h, h1 = a["claims"][hyp], a["claims"].get("H1") or {}
    if h1.get("estimate") is None or h.get("estimate") is None:
        return ""
    left = float(h["estimate"]) + 0.5 * float(h1["estimate"])
    name = REMEDY_GAP[hyp]
    return (f" The remedy's own gap, {name}, is {left:+.3f} against S(A) − S(C) = {float(h1['estimate']):+.3f}"
            f" (the same seeds).")


def judge_confirmed(conf: Mapping, old: Verdict, claim: str = "C0", extra: str = "") -> Verdict:
    """``claim`` by the confirmation grid's pre-registered hypothesis (`CONFIRMED`; `lpfail.experiments.confirmation`:
    ten paired seeds, the call on the fresh seeds 3–9 by a paired t test, Holm within the family of claims);
    ``old`` (lr_sweep's three-seed verdict, and for C0 the explosion search) is reported beside it and does not
    decide it. ``extra``: text added to the evidence (C0-bias: what stochastic rounding adds, `confound_text`)."""
    import dataclasses

    from lpfail.book.verdict import SWEEP_WORDS

    from lpfail.experiments import confirmation as CF

    hyp, stat, needs = CONFIRMED[claim]
    a = conf["analysis"]
    h = a["claims"][hyp]
    small = a.get("sizes", {}).get("small", {})
    healthy = ", ".join(f"{x:g}" for x in small.get("healthy_lrs", []))
    ev = (f"On our proxy, {stat} = {interval({'point': h['estimate'], 'ci': h['ci']}, '+.3f')} (mean over "
          f"{h['n']} paired seeds, 95 % Student t interval); the call on the fresh seeds "
          f"{h['seeds_confirm'][0]}–{h['seeds_confirm'][-1]} alone: paired t test p = {h['p']:.2g}, "
          f"Holm-adjusted within its family of {h['family_size']}: {h['p_adjusted']:.2g} — **{h['verdict']}**.")
    h5 = h5_word(a, "small") if small else None
    if hyp != "H1":
        ev += _closed_text(a, hyp)
    elif h5 == "not distinguishable":
        ev += (f" But at no learning rate where FP32 attention is healthy ({healthy}: its loss within "
               f"{100 * CF.HEALTHY:.0f} % of its best) is the A − C gap called: on this proxy the gap opens only where "
               "FP32 attention itself degrades, unlike the paper's healthy high-precision run beside a failing one.")
        if len(a.get("sizes", {})) > 1:
            ev += " " + h5_text(a)
    elif h5 == "no power":
        ev += (f" At the learning rates where FP32 attention is healthy ({healthy}: its loss within "
               f"{100 * CF.HEALTHY:.0f} % of its best) no A − C gap is called, but the fresh seeds could not have "
               "called one as large as that margin (H5: *no power*), so whether the gap opens there is not known.")
        if len(a.get("sizes", {})) > 1:
            ev += " " + h5_text(a)
    elif small:
        called = ", ".join(f"{x:g}" for x in small.get("H5_called_lrs", []))
        ev += f" The A − C gap is called at a learning rate where FP32 attention is healthy ({called})."
    if extra:
        ev += " " + extra
    ev += f" See {{doc}}`{CONFIRMED_PAGE.get(claim, '01_symptom')}`; {_prov(conf)}."
    if not conf.get("complete", True):
        ev += (f" The grid is incomplete ({int(conf['runs_stored'])} of {int(conf['runs_planned'])} runs stored); "
               f"this verdict's runs ({needs}) are all stored.")
    label = OLD_RULE.get(claim, "lr_sweep's {n} seeds (legacy bootstrap rule)").format(n=old.seeds or 3)
    oldtxt = (f"the same claim on {label}: **{old.verdict}**. "
              f"{old.evidence}" + (f" {old.old}" if old.old else ""))
    return dataclasses.replace(
        old, verdict=SWEEP_WORDS[h["verdict"]], evidence=ev,
        rule=(f"{a['hypotheses'][hyp]}; {a['rule']}"), old=oldtxt, note="", seeds=int(h["n"]),
        test=(f"paired Student t test, two-sided, on the fresh seeds only (the estimate pools all {h['n']}); its "
              "false-call rate and interval coverage on simulated null data: tests/test_stats_null.py"),
        p_adjusted=float(h["p_adjusted"]), proxy=proxy(conf), family=_family_text(a))


def _family_text(a: Mapping) -> str:
    """The family of claims in words, naming the hypotheses not yet stored (they count as p = 1)."""
    from lpfail.experiments import confirmation as CF

    missing = [k for k in CF.SIDES if (a.get("claims") or {}).get(k) is None]
    text = f"the claims at the smaller size ({', '.join(CF.SIDES)})"
    if missing:
        text += f"; {', '.join(missing)} not yet stored, counted as p = 1"
    return text


def fix_lr_text(a: Mapping, with_hr: bool = True) -> str:
    """Fix-b's per-learning-rate evidence from the confirmation grid (family "fix_lr"): each fix's call where the
    A − C gap is called on the fresh seeds; where the gap is seen on all ten seeds at a rate where FP32 attention
    has degraded but is not called on the fresh ones, the pooled estimates (not calls); and the robust fix's own
    hypothesis (HR)."""
    from lpfail.book.text import listing

    small = a.get("sizes", {}).get("small") or {}
    fam, gaps, healthy = a.get("fix_lr") or {}, small.get("cells") or {}, small.get("healthy_lrs") or []
    names = {"B": "the official fix", "R": "the robust fix"}
    iv = lambda r: interval({"point": r["estimate"], "ci": r["ci"]}, "+.3f")  # noqa: E731
    lrs = sorted({float(k.split("=", 1)[1]) for k in fam})
    judged, pooled = [], []
    for lr in lrs:
        rows = {x: fam.get(f"{x}@lr={lr:g}") for x in names}
        if any(r is None for r in rows.values()):
            continue
        if all(r["verdict"] != "no gap to close" for r in rows.values()):
            judged.append(f"at {lr:g}, " + "; ".join(
                f"{names[x]} {iv(r)}, p = {r['p']:.2g}, Holm-adjusted {r['p_adjusted']:.2g} — "
                f"**{row_word(a, 'fix_lr', f'{x}@lr={lr:g}')}**" for x, r in rows.items()))
            continue
        g = gaps.get(f"lr={lr:g}") or {}
        if lr not in healthy and g.get("ci") is not None and g["ci"][0] > 0:
            pooled.append(f"At {lr:g}, where the A − C gap is {iv(g)} on all {g['n']} seeds but not called on the "
                          "fresh ones, the statistic is " + " and ".join(f"{iv(r)} for {names[x]}"
                                                                           for x, r in rows.items())
                          + " (estimates, not calls).")
    if not (judged or pooled):
        return ""
    called = [k.split("=", 1)[1] for k, c in gaps.items() if c.get("verdict") == "supported"]
    out = (f"Per learning rate, in final held-out loss, (L_X − L_C) − ½·(L_A − L_C) (family fix_lr, {len(fam)} "
           f"cells, judged only where the A − C gap itself is called on the fresh seeds: "
           f"{listing(called, none='no rate')}): " + "; ".join(judged) + ". " + " ".join(pooled))
    hr = (a.get("claims") or {}).get("HR")
    if hr is not None and with_hr:
        out += (f" The robust fix in LR sensitivity (HR): {iv(hr)}, Holm-adjusted p {hr['p_adjusted']:.2g} — "
                f"**{row_word(a, 'claims', 'HR')}**.")
    return out.replace(": . ", ". ").strip()


def claims(load, stored) -> list[Verdict]:
    """C0, C0-bias, C0-qk and C0-size from the stored ``lr_sweep`` (pending without it); C0 carries the explosion
    search's verdict (`lpfail.book.symptom_report.judge_symptom`) beside its own. Where the ``confirmation`` grid
    has H1 on ten seeds, it decides C0 (`judge_confirmed`); the rows still on three seeds say so (`few_seeds`)."""
    import dataclasses

    from lpfail.book import symptom_report

    search = symptom_report.search_evidence(load)
    old = symptom_report.judge_symptom(*search) if search is not None else None
    lr = _load_or_none(load, "lr_sweep")
    if lr is not None:
        c0 = few_seeds(judge_lr_symptom(lr, old), lr)
        conf = _load_or_none(load, "confirmation")
        if confirmed(conf, "C0"):
            c0 = judge_confirmed(conf, c0)
        sr = _load_or_none(load, "sr_confound")
        bias = few_seeds(judge_bias_not_noise(lr, sr), lr)
        if confirmed(conf, "C0-bias"):
            bias = judge_confirmed(conf, bias, "C0-bias", " ".join(filter(None, (confound_text(sr), retired_text()))))
        elif retired := retired_text("lr_sweep"):
            bias = dataclasses.replace(bias, evidence=f"{bias.evidence} {retired}")
        qk = few_seeds(judge_qk_norm(lr), lr)
        if confirmed(conf, "C0-qk"):
            qk = judge_confirmed(conf, qk, "C0-qk")
        size = few_seeds(judge_size(lr), lr, ("small", "large"))
        if (more := size_estimates(conf)) is not None:
            size = dataclasses.replace(size, evidence=f"{size.evidence} {more}")
        if conf is not None and not (conf["analysis"].get("H6") or {}).get("verdict", "not measured").startswith(
                "not measured"):
            size = dataclasses.replace(size, evidence=f"{size.evidence} On the confirmation grid: "
                                                      f"{h6_text(conf['analysis'])}")
        return [c0, bias, qk, size]
    c0 = pending("C0", "The small-scale symptom: training with the paper's BF16 flash attention is worse than "
                       "with high-precision attention.", "lr_sweep", "01_symptom", stored)
    if old is not None:
        c0 = dataclasses.replace(c0, note=f"old criterion, explosion search: {old.verdict}",
                                 old=f"explosion search (`symptom`): **{old.verdict}**. {old.evidence}")
    return [c0] + [pending(c, s, "lr_sweep", "01_symptom", stored) for c, s in (
        ("C0-bias", "The harm comes from the bias of the rounding, not from the low precision itself."),
        ("C0-qk", "QK-norm blocks it."),
        ("C0-size", "Larger models are at least as sensitive."))]


# -- the numbers chapter 1's text quotes (and its lab page's) -------------------------------------------------------
def _iv(d, fmt: str = "+.3f") -> str:
    return interval(d, fmt)


def card(res) -> dict[str, str]:
    """On what card and when the runs ran, for a GPU figure's caption: {"card": "NVIDIA H200", "when": the days}."""
    parts = res["parts"]
    days = sorted({str(p["created"])[:10] for p in parts})
    cards = sorted({str(p["device"]) for p in parts})
    from lpfail.book.text import listing, span

    return {"card": listing(cards), "when": span(days[0], days[-1]) if days else "not recorded"}


def facts(res) -> dict[str, str]:
    """Every number chapter 1 and its lab page quote, formatted, from a stored ``lr_sweep`` result: the
    pre-registration's date, the sensitivities, the per-learning-rate A − C gaps, the logits and ties at the
    highest rate (the growth figure), the descriptive shares of the gap closed by D, SDPA, B and A_sr, H4 at both
    sizes, the larger size's turning point, the run times; and the card and day the runs ran on."""
    a = res["analysis"]
    small, large = a["sizes"]["small"], a["sizes"].get("large", {})
    out = {"prereg_date": a["preregistered_on"], "n_seeds": f"{a['n_seeds']}", **card(res)}
    for v, d in small.items():
        out[f"S_{v}"] = f"{d['S']:.3f}"
        out[f"S_{v}_ci"] = interval({"point": d["S"], "ci": d["ci"]}, ".3f")
    for v, d in large.items():
        out[f"S_{v}_large"] = f"{d['S']:.3f}"
    for size, items in a["a_minus_c_per_lr"].items():
        for it in items:
            out[f"gap_{size}_{it['lr']:g}"] = _iv(it, "+.2f")
    sig = [f"{it['lr']:g}" for it in a["a_minus_c_per_lr"]["small"] if it["ci"][0] > 0]
    from lpfail.book.text import listing

    out["gap_lrs"] = listing(sig)
    v = list(np.asarray(res["small_variants"]))
    at_end = lambda key, name: np.asarray(res[f"small_{key}"])[v.index(name), -1, :, -1]  # noqa: E731  (seeds, layers)
    for name in ("A", "C", "A_sr", "A_qk"):
        if name in v:
            out[f"logit_{name}"] = f"{np.median(at_end('max_logit', name).max(axis=-1)):,.0f}"
            out[f"tied_{name}"] = f"{np.median(at_end('tied_frac', name).mean(axis=-1)) * 100:.0f} %"
    out["diag_last"] = f"{int(np.asarray(res['diag_step'])[-1])}"
    out["lr_top"] = _fmt_lr(float(np.asarray(res["lrs"])[-1]))
    vc = {r["variant"]: r for r in L.versus_control(res, "small")}
    for name in ("D", "S", "B", "A_sr"):
        if name in vc and vc[name]["closed"] is not None:
            out[f"closed_{name}"] = interval(vc[name]["closed"], ".0f", scale=100) + " %"
        if name in vc:
            for d in vc[name]["per_lr"]:
                out[f"{name}_minus_C_{d['lr']:g}"] = _iv(d)
    h4 = a["verdicts"].get("H4")
    if h4 and h4.get("gap_large"):
        out.update(h4_stat=_iv(h4), h4_word=h4["verdict"], gap_large=_iv(h4["gap_large"]),
                   gap_small=_iv(h4["gap_small"]))
    for name, h in a["verdicts"].items():
        out[f"{name}_word"] = h["verdict"]
        out[f"{name}_stat"] = _stat(h)
    if "A" in large:
        out["large_turn"] = _fmt_lr(large["A"]["lr_10pct"])
    out["small_turn"] = _fmt_lr(small["A"]["lr_10pct"])
    c = cost(res, 1)
    for size in sizes(res):
        out[f"wall_{size}"] = f"{c[size]['median_wall_s']:.0f}"
        out[f"runs_{size}"] = f"{c[size]['planned']}"
    out["drive_min"] = f"{sum(p['wall_s'] for p in res['parts']) / 60:.0f}"
    out["n_calls"] = f"{len(res['parts'])}"
    return out


def hypotheses_table(analysis) -> str:
    """Markdown: each pre-registered hypothesis in a few words, its statistic [95 % CI] and its word."""
    from lpfail.book.text import md_table

    short = {"H1": "the paper's arithmetic is more sensitive than FP32 attention",
             "H2": "stochastic rounding closes at least half of that gap",
             "H3": "QK-norm closes at least half of it",
             "H4": "(descriptive) the gap is at least as large at the larger size"}
    return md_table(["", "hypothesis, fixed before the runs", "statistic [95 % CI]", "verdict"],
                    [[r["name"], short.get(r["name"], r["hypothesis"]), interval(r), f"**{r['verdict']}**"]
                     for r in verdict_rows(analysis)])


# -- chapter 1 on ten paired seeds (the confirmation grid) ------------------------------------------------------------
#: Each pre-registered hypothesis of the confirmation grid in a few words, for chapter 1's table.
TEN_SEED_SHORT = {"H1": "the paper's arithmetic is more sensitive than FP32 attention",
                  "H2": "stochastic rounding closes at least half of that gap",
                  "H3": "QK-norm closes at least half of it",
                  "HD": "production (FA2) arithmetic closes at least half of it",
                  "HB": "the official fix closes at least half of it",
                  "HR": "the robust fix closes at least half of it"}


def ten_seed_table(a: Mapping) -> str:
    """Markdown: the confirmation grid's hypotheses at the smaller size — the statistic over all seeds with its
    95 % Student t interval, the paired t test's p on the fresh seeds, its Holm-adjusted p and the call — and the
    placebo's S as the last row (its call, raw and adjusted)."""
    from lpfail.book.text import md_table

    rows = []
    for h, words in TEN_SEED_SHORT.items():
        r = (a.get("claims") or {}).get(h)
        if r is None:
            rows.append([h, words, "not yet run", "", "", ""])
            continue
        seeds = f"{r['seeds_confirm'][0]}–{r['seeds_confirm'][-1]}"
        rows.append([h, words, interval({"point": r["estimate"], "ci": r["ci"]}, "+.3f"),
                     f"{r['p']:.2g} (seeds {seeds})", f"{r['p_adjusted']:.2g}", f"**{row_word(a, 'claims', h)}**"])
    pl = ((a.get("placebo") or {}).get("rows") or {}).get("placebo S")
    if pl is not None:
        rows.append(["placebo", "FP32 attention with other tiles differs from FP32 attention",
                     interval({"point": pl["estimate"], "ci": pl["ci"]}, "+.3f"), f"{pl['p']:.2g}",
                     f"{pl['p_adjusted']:.2g}", "**called**" if pl["called_adjusted"] else "not called"])
    return md_table(["", "hypothesis, fixed before the runs", "statistic, all seeds [95 % CI]", "p, fresh seeds",
                     "Holm p", "call"], rows)


def ten_seed_facts(conf: Mapping) -> dict[str, str]:
    """The numbers chapter 1 quotes from the confirmation grid (``ten_*`` keys): its seeds, the A − C gap at the two
    highest rates (pooled estimate and the call on the fresh seeds), the rates where FP32 attention is healthy,
    H5's word, the placebo's call rate, SDPA's S − S(C), the run count, and the larger size's seeds (all, and
    those its call uses) where it is stored."""
    from lpfail.book.text import listing

    a = conf["analysis"]
    small = a["sizes"]["small"]
    cells, lrs = small["cells"], sorted(float(k.split("=", 1)[1]) for k in small["cells"])
    h1 = a["claims"]["H1"]
    out = {"ten_n": f"{h1['n']}", "ten_confirm": f"{h1['seeds_confirm'][0]}–{h1['seeds_confirm'][-1]}",
           "ten_healthy": listing([f"{x:g}" for x in small["healthy_lrs"]]), "ten_H5": h5_word(a, "small"),
           "ten_prereg": str(a["preregistered_on"])}
    for lr in lrs[-2:]:
        c = cells[f"lr={lr:g}"]
        out[f"ten_gap_{lr:g}"] = (f"{interval({'point': c['estimate'], 'ci': c['ci']}, '+.3f')} (Holm-adjusted p "
                                  f"{c['p_adjusted']:.2g}: {c['verdict']})")
    pl = a.get("placebo")
    if pl is not None:
        out["ten_placebo"] = f"{sum(r['called_adjusted'] for r in pl['rows'].values())} of {pl['n']}"
        out["ten_placebo_raw"] = f"{sum(r['called_raw'] for r in pl['rows'].values())} of {pl['n']}"
    s = a["claims"].get("S_minus_C")
    if s is not None:
        out["ten_S_minus_C"] = interval({"point": s["estimate"], "ci": s["ci"]}, "+.3f")
    out["ten_runs"] = f"{int(conf['runs_stored']):,} of {int(conf['runs_planned']):,}"
    large = a["sizes"].get("large")
    if large is not None:
        out["ten_large_n"] = f"{large['n_seeds']}"
        out["ten_large_confirm"] = seeds_text(large["confirm_seeds"])
    return out


def ten_seed_found(a: Mapping) -> str:
    """Chapter 1's answer in two sentences from the confirmation grid's calls (each outcome has its wording)."""
    from lpfail.book.text import listing

    c = a["claims"]
    word = lambda h: (c.get(h) or {}).get("verdict")  # noqa: E731
    if word("H1") != "supported":
        return (f"On ten paired seeds the paper's arithmetic is not shown to be more sensitive to the learning rate "
                f"than FP32 attention (H1 {word('H1')}).")
    names = {"H2": "stochastic rounding", "HB": "the official fix", "HR": "the robust fix",
             "HD": "production (FA2) arithmetic", "H3": "QK-norm"}
    closes = [names[h] for h in names if word(h) == "supported"]
    not_shown = [names[h] for h in names if word(h) == "inconclusive"]
    less = [names[h] for h in names if word(h) == "refuted"]
    out = ("Yes, on ten paired seeds it trains worse, in the way the instability literature measures small-scale "
           "failures: its final loss is more sensitive to the learning rate.")
    parts = []
    if closes:
        parts.append(f"{listing(closes)} {'closes' if len(closes) == 1 else 'close'} at least half of the gap")
    if not_shown:
        parts.append(f"{listing(not_shown)} {'is' if len(not_shown) == 1 else 'are'} not shown to")
    if less:
        parts.append(f"{listing(less)} {'closes' if len(less) == 1 else 'close'} less than half")
    out += " Of the remedies, " + "; ".join(parts) + "."
    h5 = h5_word(a, "small")
    if h5 == "not distinguishable":
        out += (" The gap opens only at learning rates where FP32 attention itself has degraded, unlike the paper's "
                "healthy high-precision run beside a failing one.")
    elif h5 == "no power":
        out += (" Whether it also opens where FP32 attention is healthy, the fresh seeds cannot tell: they could not "
                "have called a gap as large as the healthy margin there.")
    return out


def ten_seed_gap_table(a: Mapping, size: str = "small") -> str:
    """Markdown: per learning rate of one size on ten paired seeds — FP32 attention's mean loss and whether it is
    healthy (within `confirmation.HEALTHY` of its best), A − C with its interval, p on the fresh seeds, the Holm p
    within the size's gap family and the call; at the smaller size also the placebo's difference and call."""
    from lpfail.book.text import md_table

    g = a["sizes"][size]
    placebo = (a.get("placebo") or {}).get("rows") or {} if size == "small" else {}
    rows = []
    for (key, c), cm in zip(sorted(g["cells"].items(), key=lambda kv: float(kv[0].split("=", 1)[1])), g["c_mean"]):
        lr = float(key.split("=", 1)[1])
        row = [f"{lr:g}", f"{cm:.3f}", "yes" if lr in g["healthy_lrs"] else "no",
               interval({"point": c["estimate"], "ci": c["ci"]}, "+.3f"), f"{c['p']:.2g}", f"{c['p_adjusted']:.2g}",
               f"**{row_word(a, f'gaps_{size}', key)}**"]
        if placebo:
            pl = placebo.get(f"placebo {key}")
            row += ([interval({"point": pl["estimate"], "ci": pl["ci"]}, "+.3f"),
                     "called" if pl["called_adjusted"] else "not called"] if pl else ["", ""])
        rows.append(row)
    head = ["learning rate", "FP32 loss", "FP32 healthy", "A − C [95 % CI]", "p, fresh seeds", "Holm p", "call"]
    if placebo:
        head += ["placebo − C", "placebo"]
    return md_table(head, rows)


# -- the three sizes (chapter 1's regime figure, H5 and H6) --------------------------------------------------------
#: The confirmation grid's sizes in words, smallest first (12 × 768 is GPT-2 small's shape).
SIZE_SHORT = {"small": "4 × 256", "large": "8 × 512", "gpt2": "12 × 768"}


def seeds_text(seeds) -> str:
    """'seed 3', 'seeds 3–9' (a run of consecutive seeds) or 'seeds 0, 2, 5'; 'no seed' for none."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        return "no seed"
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return "seeds " + ", ".join(str(s) for s in seeds)


def size_curves(conf: Mapping) -> dict[str, dict]:
    """Per size of the confirmation grid, from the runs stored so far (also a size still incomplete): its
    learning rates; FP32 attention's (C's) mean held-out loss at each rate over its stored seeds, and relative to
    its best stored rate; A − C per rate over the seeds where both runs are stored (mean, 95 % Student t interval
    from 2 seeds on, the seeds); which rates have C healthy (`confirmation.HEALTHY`); A's and C's runs stored and
    planned. Diverged runs count at their loss at init, as in the rule."""
    from lpfail.experiments import confirmation as CF
    from lpfail.sweep import stats

    out = {}
    for size in SIZE_SHORT:
        if f"{size}_variants" not in conf:
            continue
        names = [str(v) for v in np.asarray(conf[f"{size}_variants"])]
        if not {"A", "C"} <= set(names):
            continue
        eff = stats.effective_loss(np.asarray(conf[f"{size}_val_final"], dtype=float),
                                   np.asarray(conf[f"{size}_val_init"], dtype=float))
        stored = np.asarray(conf[f"{size}_stored"], dtype=bool)
        seeds = [int(s) for s in np.asarray(conf[f"{size}_seeds"])]
        lrs = [float(x) for x in np.asarray(conf[f"{size}_lrs"])]
        ia, ic = names.index("A"), names.index("C")
        c_mean, gaps = [], []
        for j, _lr in enumerate(lrs):
            cs = stored[ic, j]
            c_mean.append(float(eff[ic, j][cs].mean()) if cs.any() else None)
            both = stored[ia, j] & cs
            d = eff[ia, j][both] - eff[ic, j][both]
            g = {"n": int(both.sum()), "seeds": [s for s, b in zip(seeds, both) if b], "point": None, "ci": None}
            if d.size:
                g["point"] = float(d.mean())
            if d.size >= 2:
                _m, lo, hi = stats.t_interval(d)
                g["ci"] = [float(lo), float(hi)]
            gaps.append(g)
        known = [m for m in c_mean if m is not None]
        best = min(known) if known else None
        rel = [None if m is None else m / best - 1.0 for m in c_mean]
        healthy = CF.healthy_flags(c_mean)
        out[size] = {"name": SIZE_SHORT[size], "lrs": lrs, "c_mean": c_mean, "c_best": best, "c_rel": rel,
                     "healthy": healthy, "gaps": gaps, "seeds_planned": seeds,
                     "runs": int(stored[[ia, ic]].sum()), "runs_planned": int(stored[[ia, ic]].size),
                     "complete": bool(stored[[ia, ic]].all())}
    return out


def _signed(x: float, fmt: str = "+.3f") -> str:
    """``x`` with its sign, but never "-0.000" or "+0.000": a value that rounds to zero reads "0.000"."""
    s = format(x, fmt)
    return format(0.0, fmt.lstrip("+")) if float(s) == 0 else s


def _size_label(d: Mapping) -> str:
    n = max((g["n"] for g in d["gaps"]), default=0)
    if d["complete"]:
        return f"{d['name']}, {n} seeds"
    seen = sorted({s for g in d["gaps"] for s in g["seeds"]})
    return f"{d['name']}, {seeds_text(seen)} so far ({d['runs']} of {d['runs_planned']} runs)"


def three_size_figure(conf: Mapping):
    """Chapter 1's regime figure: per size, FP32 attention's own degradation (its held-out loss above its best,
    in %, with the healthy margin) and the A − C gap (mean over paired seeds, 95 % t interval where there are 2
    or more), against the learning rate. A gap marker is filled where FP32 attention is healthy at that rate and
    open where it has degraded: the paper's regime is a gap at a filled marker."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from lpfail.book import plots
    from lpfail.experiments import confirmation as CF

    curves = size_curves(conf)
    if not curves:
        raise ValueError("three_size_figure: the confirmation result has no size with A and C")
    fig, (ax0, ax1, axl) = plt.subplots(1, 3, figsize=(11.2, 3.6), gridspec_kw={"width_ratios": [1, 1, 0.62]})
    colours = dict(zip(SIZE_SHORT, plots.series_colors(len(SIZE_SHORT))))
    handles, labels = [], []
    for k, (size, d) in enumerate(curves.items()):
        col = colours[size]
        lrs = np.asarray(d["lrs"])
        rel = np.array([np.nan if r is None else 100 * r for r in d["c_rel"]])
        ax0.plot(lrs, rel, "-o", color=col, ms=4, lw=1.6)
        pts = np.array([np.nan if g["point"] is None else g["point"] for g in d["gaps"]])
        x = lrs * (1.0 + 0.06 * (k - 1))  # a small offset per size, so intervals do not hide each other
        ax1.plot(x, pts, "-", color=col, lw=1.2, alpha=0.8)
        for xi, g, ok in zip(x, d["gaps"], d["healthy"]):
            if g["point"] is None:
                continue
            if g["ci"] is not None:
                ax1.plot([xi, xi], g["ci"], "-", color=col, lw=1.4)
            ax1.plot([xi], [g["point"]], "o", ms=5.5, color=col, mfc=col if ok else "white", mew=1.4)
        handles.append(Line2D([], [], color=col, marker="o", lw=1.6))
        labels.append(_size_label(d))
    ax0.axhline(100 * CF.HEALTHY, color="0.4", ls="--", lw=1)
    ax0.set_ylabel("FP32 attention's loss above its best (%)")
    ax0.set_title("FP32 attention's own degradation")
    ax1.axhline(0.0, color="0.4", lw=1)
    ax1.set_ylabel("A − C, held-out loss (nats/byte)")
    ax1.set_title("the gap, paper's arithmetic − FP32")
    for ax in (ax0, ax1):
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.grid(alpha=0.3)
    handles += [Line2D([], [], color="0.4", ls="--", lw=1),
                Line2D([], [], color="0.3", marker="o", ls="none", mfc="0.3"),
                Line2D([], [], color="0.3", marker="o", ls="none", mfc="white")]
    labels += [f"healthy margin ({100 * CF.HEALTHY:.0f} %)", "gap where FP32 is healthy",
               "gap where FP32 has degraded"]
    plots.legend_axes(axl, handles, labels, title="size (layers × width)")
    fig.tight_layout()
    return fig


def three_size_text(conf: Mapping) -> str:
    """Chapter 1's paragraph on the three sizes from the confirmation grid: per size, its seeds, the calls on its
    fresh seeds, H5's word with power beside it (`h5_word`), where nothing is called the smallest gap the fresh
    seeds could call (`stats.callable_ratio`), the gap they call 80 % of the time where FP32 attention is healthy
    and what the estimate over all seeds rules out there (`power_text`), or that the size is still incomplete,
    with what its seeds so far show where FP32 attention is healthy; then H6's word."""
    from lpfail.book.text import listing
    from lpfail.sweep import stats

    a = conf["analysis"]
    curves = size_curves(conf)
    parts = []
    for size, d in curves.items():
        g = (a.get("sizes") or {}).get(size)
        if g is not None and d["complete"]:
            called = [(float(k.split("=", 1)[1]), c) for k, c in g["cells"].items()
                      if c["verdict"] in ("supported", "refuted")]
            calls = (f"the gap is called at {listing([f'{lr:g}' for lr, _ in sorted(called)])}" if called
                     else "no learning rate's gap is called")
            n = max(gg["n"] for gg in d["gaps"])
            conf_seeds = seeds_text(g["confirm_seeds"])
            big = max((gg for gg in d["gaps"] if gg["point"] is not None), key=lambda gg: gg["point"])
            j = d["gaps"].index(big)
            where = "where FP32 attention is still healthy" if d["healthy"][j] else "where FP32 attention has degraded"
            power = ""
            if not called and a.get("test", "t") == "t":   # what "no call" can mean with these fresh seeds
                k, m = len(g["confirm_seeds"]), len(g["cells"])
                r = stats.callable_ratio(k, m, a.get("alpha"))
                power = (f" With {k} fresh seeds and Holm over {m} learning rates, a gap is called only where its "
                         f"mean over the fresh seeds is at least {r:.{0 if r >= 10 else 1}f} times their standard "
                         f"deviation, so at this size \"no call\" is not evidence that there is no gap.")
            parts.append(
                f"At {d['name']} ({n} paired seeds; the call on {conf_seeds} alone), {calls}; where FP32 attention "
                f"is healthy, H5 reads *{h5_word(a, size)}*.{power}{power_text(a, size, n)} Its largest mean gap over "
                f"all {n} seeds, {interval(big, '+.2f')} (95 % t interval), is at {d['lrs'][j]:g}, {where}.")
        else:
            healthy = [(lr, gg) for lr, gg, ok in zip(d["lrs"], d["gaps"], d["healthy"])
                       if ok and gg["point"] is not None]
            seen = sorted({s for gg in d["gaps"] for s in gg["seeds"]})
            text = (f"At {d['name']}, {d['runs']} of its {d['runs_planned']} runs of A and C are stored, so it has "
                    f"no call yet")
            if healthy:
                text += (f"; on {seeds_text(seen)}, A − C where FP32 attention is healthy is "
                         + listing([f"{_signed(gg['point'])} at {lr:g}" for lr, gg in healthy]))
            parts.append(text + ".")
    parts.append(h6_text(a))
    return " ".join(parts)


def h6_text(a: Mapping) -> str:
    """H6 in one sentence from the confirmation's analysis: its word and each size's lr* (the smallest learning
    rate whose A − C cell is supported on the fresh seeds; "none in the grid" where no cell is), or that it waits
    for the third size's runs."""
    from lpfail.book.text import listing

    h6 = a.get("H6") or {}
    word = h6.get("verdict", "not measured (runs missing)")
    if word.startswith("not measured"):
        return "H6, whether the smallest learning rate with a gap falls with size, waits for the third size's runs."
    stars = h6.get("lr_star") or {}
    each = listing([f"{'none in the grid' if x is None else format(x, 'g')} at {SIZE_SHORT[s]}"
                    for s, x in stars.items() if s in SIZE_SHORT])
    return (f"H6, whether the smallest learning rate with a gap falls with size, reads *{word}*: that learning rate "
            f"(a gap called on the fresh seeds) is {each}.")


def h5_text(a: Mapping) -> str | None:
    """H5 at every size the confirmation's analysis has judged, with power beside it (`h5_word`), in one sentence
    ("... *not distinguishable* at 4 × 256; *no power* at 8 × 512; *distinguishable* at 12 × 768 (called at
    0.001)."); None when no size is judged."""
    from lpfail.book.text import listing

    sizes = {s: g for s, g in (a.get("sizes") or {}).items() if s in SIZE_SHORT}
    if not sizes:
        return None
    groups = []
    for word in ("not distinguishable", "no power", "distinguishable"):
        names = [SIZE_SHORT[s] + (f" (called at {listing([format(x, 'g') for x in g['H5_called_lrs']])})"
                                  if g.get("H5_called_lrs") else "")
                 for s, g in sizes.items() if h5_word(a, s) == word]
        if names:
            groups.append(f"*{word}* at {listing(names)}")
    return "Where FP32 attention is healthy, H5 reads " + "; ".join(groups) + "."
