"""The confirmation grid's report (`lpfail.experiments.confirmation`: ten paired seeds, the call on the fresh
seeds): chapter 1's ten-seed table, facts and answer, the per-learning-rate gap tables, the three sizes' regime
figure and paragraph (H5, H6), chapter 5's per-learning-rate text on the fixes (`fix_lr_text`), and the calls
with their power beside them (`h5_word`, `row_word`, `power_text`).

Everything here reads a stored ``confirmation`` result or its ``analysis``; text comes back as Markdown.
"""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from lpfail.book import plots
from lpfail.book.text import interval, listing, md_table
from lpfail.book.verdict import CONTRADICTED, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED
from lpfail.experiments import confirmation as CF
from lpfail.experiments import confirmation_power as CP
from lpfail.sweep import stats


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
        called = sum(r["called_adjusted"] for r in pl["rows"].values())
        out["ten_placebo_bound"] = f"{100 * stats.binomial_upper(called, pl['n']):.0f} %"
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
    fix_word = fix_rates_word(fix_rates(a))
    if word("HB") != "supported" and fix_word in ("partly", "reproduced"):
        out += f" Per learning rate, the official fix reads *{fix_word}* ({{doc}}`05_fix`)."
    h5 = h5_word(a, "small")
    size = SIZE_SHORT["small"]
    if h5 == "not distinguishable":
        out += (f" At {size} the gap is called only at learning rates where FP32 attention itself has degraded, "
                "unlike the paper's healthy high-precision run beside a failing one.")
    elif h5 == "no power":
        out += (f" Whether at {size} it also opens where FP32 attention is healthy, the fresh seeds cannot tell: they "
                "could not have called a gap as large as the healthy margin there.")
    return out


def ten_seed_gap_table(a: Mapping, size: str = "small") -> str:
    """Markdown: per learning rate of one size on ten paired seeds — FP32 attention's mean loss and whether it is
    healthy (within `confirmation.HEALTHY` of its best), A − C with its interval, p on the fresh seeds, the Holm p
    within the size's gap family and the call; at the smaller size also the placebo's difference and call."""
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


def t_text(d, fmt: str = "+.3f") -> str:
    """'+0.082 [+0.057, +0.107]': the mean of per-seed values ``d`` with its 95 % Student t interval."""
    m, lo, hi = stats.t_interval(d)
    return interval({"point": m, "ci": [lo, hi]}, fmt)


#: The variants whose share of the gap chapter 1's "What does close the gap" quotes on ten seeds.
CLOSING = ("D", "S", "B", "A_sr")


#: The remedies that remove the output path's bias, by their ten-seed half-gap hypothesis.
BIAS_REMEDIES = {"H2": "stochastic rounding", "HB": "the official fix", "HR": "the robust fix"}


def bias_cures_said(a: Mapping) -> str:
    """What ten seeds say of the remedies that remove the bias (`BIAS_REMEDIES`), grouped by their calls:
    'Stochastic rounding closes significantly less than half of it; the official fix and the robust fix leave too
    much of it for the rule to call' ('' where none is judged)."""
    claims = a.get("claims") or {}
    by: dict[str, list[str]] = {}
    for h, name in BIAS_REMEDIES.items():
        if (claims.get(h) or {}).get("verdict") in ("supported", "refuted", "inconclusive"):
            by.setdefault(claims[h]["verdict"], []).append(name)
    words = {"supported": ("closes", "close", "at least half of it"),
             "refuted": ("closes", "close", "significantly less than half of it"),
             "inconclusive": ("leaves", "leave", "too much of it for the rule to call")}
    parts = [f"{listing(names)} {words[w][len(names) > 1]} {words[w][2]}"
             for w in ("supported", "refuted", "inconclusive") if (names := by.get(w))]
    text = "; ".join(parts)
    return text[:1].upper() + text[1:]


def closing_facts(conf: Mapping, lrs: tuple[float, ...] = (0.016, 0.032)) -> dict[str, str]:
    """What chapter 1's "What does close the gap" quotes, on every seed of the confirmation grid's smaller size:
    S(A) − S(C) (``ten_gap_S``) and per variant of `CLOSING` its own gap S(X) − S(C) (``ten_own_X``), both with
    95 % Student t intervals over the paired seeds, the share of S(A) − S(C) it closes from the two means
    (``ten_share_X``, a point estimate) and X − C in final held-out loss at ``lrs`` (``ten_X_minus_C_LR``, t
    intervals); ``ten_n_all``: the seed count; ``bias_cures_said``: `bias_cures_said`. Empty without A and C."""
    d = CF._size(conf, "small")
    if d is None or not {"A", "C"} <= set(d["eff"]):
        return {}
    s = {v: stats.seed_sensitivity(e) for v, e in d["eff"].items()}
    gap = s["A"] - s["C"]
    out = {"ten_gap_S": t_text(gap), "ten_n_all": f"{gap.size}", "bias_cures_said": bias_cures_said(conf["analysis"])}
    for v in CLOSING:
        if v not in s:
            continue
        left = s[v] - s["C"]
        out[f"ten_own_{v}"] = t_text(left)
        if gap.mean() > 0:
            out[f"ten_share_{v}"] = f"{100 * (1 - left.mean() / gap.mean()):.0f} %"
        for lr in lrs:
            j = [i for i, x in enumerate(d["lrs"]) if np.isclose(x, lr)]
            if j:
                out[f"ten_{v}_minus_C_{lr:g}"] = t_text(d["eff"][v][j[0]] - d["eff"]["C"][j[0]])
    return out


# -- chapter 5 on ten paired seeds: the fixes per learning rate -----------------------------------------------------
def fix_lr_text(a: Mapping, with_hr: bool = True) -> str:
    """Fix-b's per-learning-rate evidence from the confirmation grid (family "fix_lr"): each fix's call where the
    A − C gap is called on the fresh seeds; where the gap is seen on all ten seeds at a rate where FP32 attention
    has degraded but is not called on the fresh ones, the pooled estimates (not calls); and the robust fix's own
    hypothesis (HR)."""
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


#: A fix's outcome at one learning rate (`fix_rates`) in words.
OUTCOME_WORDS = {"closes": "closes at least half of the gap", "less": "closes less than half of it",
                 "unclear": "is not shown either way"}


def fix_rates(a: Mapping, fix: str = "B") -> list[dict]:
    """Per learning rate of the smaller size where the A − C gap is present, the fix's half-gap statistic
    (L_X − L_C) − ½·(L_A − L_C) (family "fix_lr") and its outcome: where the gap is called on the fresh seeds, from
    the cell's call (supported → "closes", refuted → "less", else "unclear"; basis "call"); at a rate where FP32
    attention has degraded and the gap is not called but its 95 % t interval over all seeds lies above 0, from the
    fix's t interval over all seeds (entirely below 0 → "closes", above → "less", else "unclear"; basis
    "estimate"). Rates without a gap are left out. Each: {"lr", "row", "gap", "basis", "outcome"}."""
    small = (a.get("sizes") or {}).get("small") or {}
    fam, gaps, healthy = a.get("fix_lr") or {}, small.get("cells") or {}, small.get("healthy_lrs") or []
    out = []
    for lr in sorted({float(k.split("=", 1)[1]) for k in fam if k.startswith(f"{fix}@")}):
        r, g = fam.get(f"{fix}@lr={lr:g}"), gaps.get(f"lr={lr:g}") or {}
        if r is None:
            continue
        if g.get("verdict") == "supported":
            basis, outcome = "call", {"supported": "closes", "refuted": "less"}.get(r["verdict"], "unclear")
        elif lr not in healthy and g.get("ci") is not None and g["ci"][0] > 0:
            basis = "estimate"
            outcome = "closes" if r["ci"][1] < 0 else "less" if r["ci"][0] > 0 else "unclear"
        else:
            continue
        out.append({"lr": lr, "row": r, "gap": g, "basis": basis, "outcome": outcome})
    return out


def fix_rates_word(rates: list[dict]) -> str:
    """The verdict page's word for a fix from `fix_rates`: reproduced when it is called to close at least half of
    the gap at every rate with one; partly when it closes at least half at some rate (by the call, or by the
    estimate where the gap is not called) and not at another; contradicted when it is called to close less than
    half at every such rate; not yet tested without a rate with a gap; else not reproduced."""
    if not rates:
        return NOT_TESTED
    if all(x["outcome"] == "closes" and x["basis"] == "call" for x in rates):
        return REPRODUCED
    if any(x["outcome"] == "closes" for x in rates):
        return PARTLY
    if all(x["outcome"] == "less" and x["basis"] == "call" for x in rates):
        return CONTRADICTED
    return NOT_REPRODUCED


def fix_rates_text(rates: list[dict]) -> str:
    """`fix_rates` in one clause: per rate the outcome, the statistic with its 95 % t interval over all seeds, and
    the call's Holm-adjusted p, or 'an estimate over N seeds, not a call' where the gap itself is not called."""
    parts = []
    for x in rates:
        r = x["row"]
        how = (f"Holm-adjusted p {r['p_adjusted']:.2g}" if x["basis"] == "call"
               else f"an estimate over {r['n']} seeds, not a call: the gap itself is not called there")
        parts.append(f"{OUTCOME_WORDS[x['outcome']]} at {x['lr']:g} "
                     f"({interval({'point': r['estimate'], 'ci': r['ci']}, '+.3f')}; {how})")
    return listing(parts, none="no rate has a gap to close")


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


# -- the calls with their power beside them -------------------------------------------------------------------------
def h5_word(a: Mapping, size: str) -> str:
    """H5 at ``size`` with power beside it: 'no power' instead of 'not distinguishable' where the fresh seeds could
    not have called a gap as large as the healthy margin (`lpfail.experiments.confirmation_power.h5_word`)."""
    return CP.h5_word(a, size)


def row_word(a: Mapping, family: str, name: str) -> str:
    """A confirmation row's call with power beside it: 'no power' instead of 'inconclusive' where its family could
    not have called a gap as large as the healthy margin (`lpfail.experiments.confirmation_power.row_word`)."""
    return CP.row_word(a, family, name)


def power_text(a: Mapping, size: str, n: int) -> str:
    """One sentence on what a size's gap family could call where FP32 attention is healthy: the gap its fresh seeds
    call 80 % of the time (in standard deviations of the per-seed gap and in nats, beside the healthy margin) and
    the one-sided 95 % upper bound of A − C over all ``n`` seeds there (`confirmation_power.power_rows`); "" where
    the analysis lacks what power needs."""
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
