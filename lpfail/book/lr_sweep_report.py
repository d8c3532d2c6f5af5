"""Chapter 1's report on the learning-rate sweep (`lpfail.experiments.lr_sweep`): its figures, tables, run
explorer and the numbers the chapter and its lab page quote.

Everything here reads a stored `lr_sweep` result (or the dict `assemble` builds) and its `analysis`; the
chapter only calls these functions. Tables come back as HTML strings (narrow, wrapping), figures as matplotlib
Figures, the explorer as an ipywidgets box with a kernel-free twin (`lpfail.book.twin`). The confirmation
grid's ten-seed report is `lpfail.book.confirmation_report`; chapter 1's claims are judged in
`lpfail.book.training_claims`.
"""
from __future__ import annotations

import html

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from lpfail import results, sweep
from lpfail.book import plots, twin
from lpfail.book.costs import html_table
from lpfail.book.text import SIZE_WORDS, interval, listing, md_table, span
from lpfail.book.verdict import stat_text
from lpfail.experiments import compiled_sweep as CS
from lpfail.experiments import lr_sweep as L


def _style(v: str) -> tuple[str, str]:
    """(colour, line style) of a variant, from the book's one palette (`lpfail.book.plots`)."""
    st = plots.style(v)
    return st["color"], st["ls"]


SIZE_NAME = {"small": "4 layers × 256 (3.2 M parameters)", "large": "8 layers × 512 (25 M parameters)"}


def label(v: str) -> str:
    return L.VARIANTS[v].label


def _legend(v: str) -> str:
    """A variant's name in a figure's legend: its letter and its words (the book's palette module)."""
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
    steps = np.asarray(res["diag_step"])
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
    at = f"At the {SIZE_WORDS[size]} size" if size in SIZE_WORDS else f"At size {size}"
    if len(set(best.values())) == 1 and len(set(up.values())) == 1:
        return (f"{at}, every variant has its best loss at lr {_fmt_lr(next(iter(best.values())))} and first exceeds it "
                f"by 10 % at lr {_fmt_lr(next(iter(up.values())))}: the variants differ in how much worse the high "
                "rates get, not in where the curve turns.")
    return (f"{at}, the best learning rate per variant: " + ", ".join(f"{v} {_fmt_lr(x)}" for v, x in best.items())
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
         "≈ 6,700 until the failure"],
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


    runs, metas = L.STORE.load(directory)
    if grid:  # only the parts that hold runs of lr_sweep's own grid (cures and fix_training share the folder)
        metas = sweep.lookup(L.lr_sweep_grid(), directory).parts
    out = []
    for m in metas:
        part = sweep.read_part(L.STORE.file(m["file"], directory))
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


# -- the compiled arithmetic (lpfail.experiments.compiled_sweep) ------------------------------------------------
def compiled_section() -> str:
    """Chapter 1's section on PAPER_BF16_COMPILED: the stored compiled_sweep table (S of A, C and A_comp, the
    pre-registered verdicts), or how many of its runs are still missing and what they wait for. Markdown."""
    try:
        res = results.load("compiled_sweep")
    except results.ResultMissing:
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


# -- the numbers chapter 1's text quotes (and its lab page's) -------------------------------------------------------
def _iv(d, fmt: str = "+.3f") -> str:
    return interval(d, fmt)


def card(res) -> dict[str, str]:
    """On what card and when the runs ran, for a GPU figure's caption: {"card": "NVIDIA H200", "when": the days}."""
    parts = res["parts"]
    days = sorted({str(p["created"])[:10] for p in parts})
    cards = sorted({str(p["device"]) for p in parts})

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
        out[f"{name}_stat"] = stat_text(h)
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
    short = {"H1": "the paper's arithmetic is more sensitive than FP32 attention",
             "H2": "stochastic rounding closes at least half of that gap",
             "H3": "QK-norm closes at least half of it",
             "H4": "(descriptive) the gap is at least as large at the larger size"}
    return md_table(["", "hypothesis, fixed before the runs", "statistic [95 % CI]", "verdict"],
                    [[r["name"], short.get(r["name"], r["hypothesis"]), interval(r), f"**{r['verdict']}**"]
                     for r in verdict_rows(analysis)])
