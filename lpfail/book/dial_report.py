"""The precision dial on the book's pages (chapter 1's last section, the first page's thesis): what the
pre-registered test of "bias, not noise" (`lpfail.experiments.dial_training`) has stored so far, and what stochastic
rounding at BF16's own precision could and could not say before it.

Every sentence is generated from stored results (``confirmation``, ``sr_confound``, ``dial_training``); a result
that is missing makes its sentence say so.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from lpfail import results
from lpfail.book import plots
from lpfail.book.text import listing, md_cell, rate, sentence
from lpfail.book.verdict import CONTRADICTED, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED, load_or_none
from lpfail.experiments import dial_training as D


def _h2(conf: Mapping | None) -> Mapping:
    """The confirmation grid's H2 (stochastic rounding closes half of the gap), {} without it."""
    return ((conf or {}).get("analysis", {}).get("claims") or {}).get("H2") or {}


def sr_ten_seeds(conf: Mapping | None) -> str:
    """Stochastic rounding's half-gap statistic on the confirmation grid's ten seeds, with its call (H2)."""
    h = _h2(conf)
    if h.get("estimate") is None:
        return "not yet measured on ten seeds"
    lo, hi = h["ci"]
    return (f"(S(A_sr) − S(C)) − ½·(S(A) − S(C)) = {h['estimate']:+.3f} [{lo:+.3f}, {hi:+.3f}] on {h['n']} paired "
            f"seeds, Holm-adjusted p {h['p_adjusted']:.2g}: {h['verdict']}")


def sr_says(conf: Mapping | None) -> str:
    """Whether stochastic rounding closes half of the gap on ten seeds, in a sentence worded by H2's call."""
    h = _h2(conf)
    stat = sr_ten_seeds(conf)
    if h.get("estimate") is None:
        return f"It is {stat}."
    return {"refuted": f"It does not: it closes significantly less than half; {stat}.",
            "supported": f"It does: {stat}."}.get(h["verdict"], f"It is not shown to: {stat}.")


def sr_noise(sr: Mapping | None) -> str:
    """How much stochastic rounding raises O's RMS error on chapter 4's tied rows (``sr_confound``)."""
    if sr is None:
        return "an amount not yet measured"
    return f"{100 * (float(sr['rows_A_sr_rms']) / float(sr['rows_A_rms']) - 1):.0f} %"


def seed_runs(seeds) -> str:
    """'seeds 20–27', 'seeds 20, 22 and 25', 'seed 20' (consecutive seeds as one range)."""
    seeds = sorted(int(x) for x in seeds)
    if not seeds:
        return "no seed"
    groups, start = [], seeds[0]
    for a, b in zip(seeds, seeds[1:] + [None]):
        if b != a + 1:
            groups.append(str(a) if a == start else f"{start}, {a}" if a == start + 1 else f"{start}–{a}")
            start = b
    return ("seed " if len(seeds) == 1 else "seeds ") + listing(groups)


def status(dial: Mapping | None) -> str:
    """Where the dial's grid stands: nothing stored; per learning rate, the seeds with every arm and those with
    some, the long runs, the cards and days; nothing judged until every arm has its ten seeds at both rates; or,
    once every 1,000-step run is stored, its families' calls and the long runs' count."""
    if dial is None:
        return "No run of the dial is stored yet."
    stored, planned = int(dial["runs_stored"]), int(dial["runs_planned"])
    long_stored = np.asarray(dial.get("long_stored", []), dtype=bool)
    n_long, n_long_planned = int(long_stored.sum()), int(long_stored.size)
    cards_, days = _cards_days(dial)
    devices = listing(cards_, none="no card")
    calls = (dial.get("analysis") or {}).get("calls") or {}
    if calls:
        long = (long_brief(dial) if n_long == n_long_planned else "") or sentence(
            "every long run is stored" if n_long == n_long_planned else
            f"H11 (descriptive) is not described yet: none of its {n_long_planned} long runs is stored" if n_long == 0
            else f"H11 (descriptive) is not described yet: {n_long} of its {n_long_planned} long runs are stored")
        return f"All {stored - n_long} short runs are stored. {judged(calls)} {long}"
    have = np.asarray(dial["small_stored"], dtype=bool)  # (variants, lrs, seeds)
    lrs, seeds = [float(x) for x in dial["small_lrs"]], [int(s) for s in dial["small_seeds"]]
    where = []
    for j in sorted(range(len(lrs)), key=lambda j: -lrs[j]):
        full = [s for k, s in enumerate(seeds) if have[:, j, k].all()]
        some = [s for k, s in enumerate(seeds) if have[:, j, k].any() and not have[:, j, k].all()]
        if not full and not some:
            where.append(f"none at {lrs[j]:g}")
            continue
        parts = ([f"every arm on {seed_runs(full)}"] if full else []) + ([f"some arms on {seed_runs(some)}"]
                                                                       if some else [])
        where.append(f"{listing(parts)} at {lrs[j]:g}")
    return (f"So far {stored} of its {planned} runs are stored: {'; '.join(where)}; {n_long} of the "
            f"{n_long_planned} long runs ({devices}, {listing(days)}). Nothing is judged until every arm has its ten "
            "seeds at both rates.")


#: The registered families in words (`lpfail.experiments.dial_training.HYPOTHESES`).
FAMILY_WORDS = {"H7": "the dose", "H8": "bias, not noise", "gaps": "A_3 above FP32 attention", "H9": "the robust fix",
                "H10": "production arithmetic"}


def family_words(fam: Mapping) -> list[str]:
    """The distinct verdict words of a family's rows, in a fixed order."""
    return sorted({r["verdict"] for r in fam.values() if isinstance(r, dict) and r.get("verdict")})


#: H8's family → one verdict for the claim C0-dial (written 2026-12-06, when 79 of the grid's 265 runs, every arm
#: at 8e-3 on seeds 20–25, had been seen as an interim description; the family's rule itself was fixed on 2026-12-04).
DIAL_RULE = ("H8's family (12 rows, Holm within it) → verdict: every row supported → reproduced; some supported and "
             "none refuted, or both words among the rows → partly; some refuted and none supported → contradicted; "
             "every row inconclusive → not reproduced ('no power' says so); the grid incomplete → not yet tested")


def dial_verdict(words: list[str]) -> str:
    """One verdict from H8's row words (`DIAL_RULE`)."""
    if words and all(w == "supported" for w in words):
        return REPRODUCED
    if "supported" in words:
        return PARTLY
    if "refuted" in words:
        return CONTRADICTED
    return NOT_REPRODUCED


def row_label(family: str, key: str) -> str:
    """A registered row in words: 'A_3 − SR_3 at 8e-3', 'the slope at 4e-3' (H7), "R_3's half-gap at 8e-3" (H9)."""
    name, _, lr = key.rpartition("@lr=") if "@lr=" in key else ("", "", key.removeprefix("lr="))
    name = name.strip() or ("the slope" if family == "H7" else family)
    if family == "H9":
        name = f"{name}'s half-gap"
    return f"{name} at {rate(float(lr))}"


def row_text(family: str, key: str, r: Mapping) -> str:
    """'A_3 − SR_3 at 8e-3 = +0.053 [+0.025, +0.081] (Holm p 0.021)': the label then '=' as the claims registry
    reads a labelled number (`lpfail.book.claims.numbers_of`)."""
    lo, hi = r["ci"]
    return f"{row_label(family, key)} = {r['estimate']:+.3f} [{lo:+.3f}, {hi:+.3f}] (Holm p {r['p_adjusted']:.2g})"


def family_summary(family: str, fam: Mapping, numbers: bool = True, named: bool = True) -> str:
    """A judged family in a clause: the rows that the rule supports or refutes (each with its number unless
    ``numbers`` is off, then 'only'), and with numbers how many rows read each other word ('inconclusive: the other
    10 of 12 rows'); ``named`` off leaves out the family's name."""
    rows = {k: r for k, r in fam.items() if isinstance(r, dict) and r.get("verdict")}
    n = len(rows)
    words = {r["verdict"] for r in rows.values()}
    name = f"{FAMILY_WORDS.get(family, family)} ({family})"
    if not numbers and len(words) == 1:
        return f"{name} {words.pop()} {'at both rates' if n == 2 else f'for all {n} rows'}"
    parts = []
    for word in ("supported", "refuted"):
        hits = [(row_text if numbers else row_label)(family, k, *([r] if numbers else []))
                for k, r in rows.items() if r["verdict"] == word]
        if hits:  # with numbers, rows after "word:" and ";" so that each label stands alone
            parts.append(f"{word}: {'; '.join(hits)}" if numbers else f"{word} for {listing(hits)}")
    if not numbers:
        return f"{name} {', '.join(parts)} only"
    called = sum(r["verdict"] in ("supported", "refuted") for r in rows.values())
    for word in sorted(words - {"supported", "refuted"}):
        k = sum(r["verdict"] == word for r in rows.values())
        which = (f"all {k} rows" if k == n else "the other row" if called + k == n and k == 1 else
                 f"the other {k} of {n} rows" if called + k == n else f"{k} of {n} rows")
        parts.append(f"{word}: {which}")
    return f"{name}, {'; '.join(parts)}" if named else '; '.join(parts)


def judged(calls: Mapping) -> str:
    """The judged grid in words for the chapter: C0-dial's verdict from H8's family, H8's rows with their numbers,
    the other families in a clause each (every row with its number: `rows_table`, on the lab page)."""
    h8 = calls.get("H8") or {}
    word = dial_verdict([r["verdict"] for r in h8.values() if isinstance(r, dict)])
    others = [family_summary(f, fam, numbers=False) for f, fam in calls.items() if f != "H8"]
    return (f"The rule's verdict on bias, not noise (H8): {word}. {sentence(family_summary('H8', h8, named=False))} "
            f"The other families: {'; '.join(others)}.")


def h8_rows(dial: Mapping | None) -> dict[str, Mapping]:
    """H8's judged rows of a stored dial ({row key: row}); {} while nothing is judged."""
    h8 = (((dial or {}).get("analysis") or {}).get("calls") or {}).get("H8") or {}
    return {k: r for k, r in h8.items() if isinstance(r, dict) and r.get("verdict")}


def _k_lr(key: str) -> tuple[int, float]:
    """(K, learning rate) of an H8 row key, 'A_3 − SR_4 @lr=0.008' → (3, 0.008)."""
    name, _, lr = key.rpartition("@lr=")
    arm = name.split("−")[0].strip()
    return (7 if arm == "A" else int(arm.split("_")[1])), float(lr)


def supported_at(dial: Mapping | None) -> tuple[list[int], list[float]]:
    """The fraction bits K (largest first) and learning rates at which H8 has a supported row ([], [] if none)."""
    sup = [_k_lr(k) for k, r in h8_rows(dial).items() if r["verdict"] == "supported"]
    return sorted({k for k, _ in sup}, reverse=True), sorted({lr for _, lr in sup})


def finding(dial: Mapping | None) -> str | None:
    """What the judged dial says about "bias, not noise" in a clause (C0-dial's verdict from H8's rows): where the
    paper's rounding to nearest trains worse than unbiased rounding at equal precision, with the bias multiple
    2^(7−K) the dial's K gives, and where no difference is shown; None while nothing is judged."""
    rows = h8_rows(dial)
    if not rows:
        return None
    word = dial_verdict([r["verdict"] for r in rows.values()])
    sup = sorted({_k_lr(k) for k, r in rows.items() if r["verdict"] == "supported"}, key=lambda t: (-t[0], t[1]))
    ref = [k for k, r in rows.items() if r["verdict"] == "refuted"]
    if word == REPRODUCED:
        return ("at every K the dial tests (5, 4 and 3 fraction bits) and both rates, the paper's rounding to nearest "
                "trains worse than unbiased rounding at equal precision")
    if word == NOT_REPRODUCED:
        return ("at no K or rate does the paper's rounding to nearest train differently from unbiased rounding at "
                "equal precision")
    if word == CONTRADICTED:
        return (f"unbiased rounding trains worse than the paper's rounding to nearest at equal precision "
                f"({listing(row_label('H8', k) for k in ref)})")
    ks = sorted({k for k, _ in sup}, reverse=True)
    lrs = sorted({lr for _, lr in sup})
    other = len(rows) - sum(r["verdict"] == "supported" for r in rows.values())
    other_ks = sorted({_k_lr(k)[0] for k in rows} - set(ks), reverse=True)
    other_lrs = sorted({_k_lr(k)[1] for k in rows} - set(lrs))
    less = ([f"{listing(other_ks, last='or')} bits"] if other_ks else []) + [f"at {rate(x)}" for x in other_lrs]
    where = "with " + listing(less, last="or") if less else "elsewhere"
    return (f"the paper's rounding to nearest trains worse than unbiased rounding at equal precision only with V and "
            f"the output path cut to {listing(ks)} fraction bits ({listing(f'{2 ** (7 - k)}' for k in ks)} times "
            f"BF16's tied-row bias) at {listing(rate(x) for x in lrs)}; {where}, no difference is shown "
            f"({other} of {len(rows)} rows)")


def finding_short(dial: Mapping | None) -> str | None:
    """`finding` in a few words for the first page: where biased rounding trained worse than unbiased rounding at
    equal precision ('only at 3 fraction bits and 8e-3'), or its word's plain reading; None while nothing is judged."""
    words = [r["verdict"] for r in h8_rows(dial).values()]
    if not words:
        return None
    if dial_verdict(words) == PARTLY:
        ks, lrs = supported_at(dial)
        return (f"at equal precision, biased rounding trained worse than unbiased only at {listing(ks)} fraction bits "
                f"and {listing(rate(x) for x in lrs)}")
    return finding(dial)


def found_markdown(dial: Mapping | None) -> str:
    """Chapter 1's answer under "What we found": whether the bias is what harms, from the dial, or that its test is
    pending."""
    f = finding(dial)
    if f is None:
        n = f"{int(dial['runs_stored'])} of {int(dial['runs_planned'])} runs stored" if dial is not None else "no run"
        return ("**Our runs do not show the paper's account of the harm, and do not refute it:** the last section's "
                f"precision dial is the test that can ({n}).")
    word = verdict_word(dial)
    return (f"**Is the rounding bias what harms? {word[0].upper()}{word[1:]}, on our proxy** (4 × 256, 1,000 steps, "
            f"{listing(rate(x) for x in dial['small_lrs'])}, ten fresh seeds): {f}. The "
            "test is the last section's precision dial.")


def power_table(n_sims: int = 400, seed: int = 0, dial: Mapping | None = None) -> str:
    """Each family's power and false-call rate, measured through the code that makes the calls
    (`dial_training.power_rows`, `dial_training.simulate`): its rows, the gap one row detects with 80 % power at
    each rate (seed noise from the confirmation grid's ten seeds of A and C), and the share of simulated null
    grids (no gap anywhere) in which the family called any row, with its binomial standard error; above it, the
    rule's healthy margin (10 % of FP32 attention's mean final loss in ``dial``, the stored grid by default), past
    which a family would read 'no power'. A Markdown table."""
    dial = results.load("dial_training") if dial is None else dial
    sd = D.noise_sd()
    sim = D.simulate(sd, n_sims=n_sims, seed=seed)
    lrs = [float(x) for x in dial["small_lrs"]]
    c = np.asarray(dial["small_val_final"])[list(map(str, dial["small_variants"])).index("C")]
    margin = " / ".join(f"{0.1 * float(np.nanmean(c[lrs.index(lr)])):.3f}" for lr in sorted(D.LRS))
    lines = ["| family | rows | gap detected with 80 % power, 4e-3 / 8e-3 | null grids with a call |",
             "|---|---|---|---|", f"| the healthy margin ('no power' above it) | — | {margin} nats | — |"]
    for r in D.power_rows(sd):
        f, rate_ = r["family"], sim["family_rate"][r["family"]]
        se = (rate_ * (1 - rate_) / n_sims) ** 0.5
        gaps = " / ".join(f"{r['detectable_nats'][f'{lr:g}']:.3f}" for lr in sorted(D.LRS))
        lines.append("| " + " | ".join(md_cell(x) for x in (
            f"{FAMILY_WORDS.get(f, f)} ({f})", r["rows"], f"{gaps} {r['unit']}",
            f"{100 * rate_:.1f} % ± {100 * se:.1f} % of {n_sims}")) + " |")
    return "\n".join(lines)


def rows_table(dial: Mapping | None) -> str:
    """Every judged row of the dial (family, row, mean and 95 % t interval of the paired per-seed statistic in
    nats, Holm-adjusted p within the family, word) as a Markdown table; a sentence while nothing is judged."""
    calls = ((dial or {}).get("analysis") or {}).get("calls") or {}
    if not calls:
        return "Nothing is judged yet: the rule waits for every arm's ten seeds at both rates."
    lines = ["| family | row | mean [95 % interval] | Holm p | call |", "|---|---|---|---|---|"]
    for f, fam in calls.items():
        for k, r in fam.items():
            if not isinstance(r, dict) or r.get("estimate") is None:
                continue
            lo, hi = r["ci"]
            lines.append("| " + " | ".join(md_cell(x) for x in (
                f"{FAMILY_WORDS.get(f, f)} ({f})", row_label(f, k), f"{r['estimate']:+.3f} [{lo:+.3f}, {hi:+.3f}]",
                f"{r['p_adjusted']:.2g}", r["verdict"])) + " |")
    return "\n".join(lines)


def interim(dial: Mapping | None, rows=("A_3 − C", "A_3 − SR_3", "A_3 − SR_4")) -> str:
    """Descriptive, before the rule can judge: the named rows of the interim description (held-out loss, arm minus
    arm, paired by seed) with mean and 95 % t interval at each learning rate where every seed of the grid is stored
    for them; the other rates with at least two seeds by their seed count (their numbers are in the figure)."""
    if ((dial or {}).get("analysis") or {}).get("calls"):
        return ""  # judged: `status` gives the calls with their numbers
    got = ((dial or {}).get("analysis") or {}).get("interim") or {}
    n_all = len((dial or {}).get("small_seeds", []))
    full, partial = [], []
    for lr in sorted({float(x) for x in (dial or {}).get("small_lrs", [])}, reverse=True):
        rs = [(name, got.get(f"{name} @lr={lr:g}")) for name in rows]
        if not all(r is not None and "ci" in r for _, r in rs):
            continue
        ns = sorted({r["n"] for _, r in rs})
        if ns == [n_all]:
            vals = listing([f"{name} {r['estimate']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]" for name, r in rs])
            full.append(f"at {lr:g} on all {n_all} seeds, {vals} nats")
        else:
            partial.append(f"{lr:g} has {ns[0]} seeds" if len(ns) == 1 else f"{lr:g} has {ns[0]}–{ns[-1]} seeds")
    if not full and not partial:
        return "No rate has two seeds of these arms yet."
    said = "; ".join(full) if full else "no rate has all its seeds yet"
    rest = f"; {listing(partial)} so far (the figure)" if partial else ""
    return f"Held-out loss, paired by seed, mean and 95 % interval (descriptive, no call): {said}{rest}."


def facts(load: Callable | None = None) -> dict[str, str]:
    """The glued values of chapter 1's dial section."""
    load = load or results.load
    dial = load_or_none(load, "dial_training")
    conf = load_or_none(load, "confirmation")
    return {"sr_ten": sr_ten_seeds(conf), "sr_says": sr_says(conf),
            "sr_noise": sr_noise(load_or_none(load, "sr_confound")),
            "dial_status": status(dial), "dial_interim": interim(dial), "dial_word": verdict_word(dial), **cards(dial)}


def verdict_word(dial: Mapping | None) -> str:
    """C0-dial's word: H8's family through `DIAL_RULE` once every row is judged, else not yet tested."""
    h8 = (((dial or {}).get("analysis") or {}).get("calls") or {}).get("H8") or {}
    rows = [r for r in h8.values() if isinstance(r, dict)]
    if not rows or any(r.get("estimate") is None for r in rows):
        return NOT_TESTED
    return dial_verdict([r["verdict"] for r in rows])



def _cards_days(dial: Mapping | None) -> tuple[list[str], list[str]]:
    """The cards and the days (YYYY-MM-DD) of the dial's stored parts, each sorted, once."""
    parts = (dial or {}).get("parts") or []
    return (sorted({str(p.get("device")) for p in parts if p.get("device")}),
            sorted({str(p.get("created"))[:10] for p in parts if p.get("created")}))


def cards(dial: Mapping | None) -> dict[str, str]:
    """The cards and days of the dial's stored runs: ``dial_card`` and ``dial_when`` for a figure's caption."""
    devices, days = _cards_days(dial)
    return {"dial_card": listing(devices, none="no card yet"),
            "dial_when": (days[0] if len(days) == 1 else f"{days[0]} – {days[-1]}") if days else "no run yet"}


def preregistration_markdown() -> str:
    """The dial's pre-registration as it is in code (`lpfail.experiments.dial_training`): the date, what had been
    seen, each hypothesis with its family, the rule, and the predictions written beside it (MyST Markdown)."""
    hyps = "\n".join(f"- **{h}** — {text}" + (f" *Family:* {D.FAMILIES[h]}." if h in D.FAMILIES else "")
                     for h, text in D.HYPOTHESES.items())
    preds = "\n".join(f"- **{h}:** {text}" for h, text in D.PREDICTIONS.items())
    return (f"Fixed in code on {D.PREREGISTERED_ON}, before any run of the grid. *Seen then:* {D.SEEN}\n\n"
            f"{hyps}\n\n*The rule.* {D.RULE}\n\n*Predictions written with the rule (not part of it):*\n\n{preds}")


#: The dial's families on its figure: (name in words, colour key of the family's line, arms by fraction bits K).
DIAL_FAMILIES = (
    ("the paper's arithmetic, to nearest (A_K)", "A", {7: "A", 5: "A_5", 4: "A_4", 3: "A_3"}),
    ("stochastic rounding (SR_K)", "A_sr", {6: "SR_6", 5: "SR_5", 4: "SR_4", 3: "SR_3"}),
    ("production arithmetic (D_K)", "D", {4: "D_4", 3: "D_3"}),
    ("the robust fix (R_3)", "R", {3: "R_3"}),
)


def dial_figure(res) -> plt.Figure:
    """The precision dial (stored `dial_training`): each arm's final held-out loss minus FP32 attention's, paired by
    seed, against the fraction bits K its output path keeps (fewer bits to the right: the tied-row bias doubles per
    bit lost), one panel per learning rate; the mean with its 95 % t interval over the seeds stored for both (the
    number of seeds in each panel's title). A point stands only where at least two seeds are paired."""
    rows = (res["analysis"].get("interim") or {})
    lrs = [float(x) for x in res["small_lrs"]]
    fig, axes = plt.subplots(1, len(lrs) + 1, figsize=(4.2 * len(lrs) + 3.0, 3.6), squeeze=False,
                             gridspec_kw={"width_ratios": [4.2] * len(lrs) + [3.0]})
    legend_ax = axes[0][-1]
    axes = axes[:, :-1]
    offsets = np.linspace(-0.18, 0.18, len(DIAL_FAMILIES))
    for ax, lr in zip(axes[0], sorted(lrs, reverse=True)):
        ns = []
        for (name, key, arms), dx in zip(DIAL_FAMILIES, offsets):
            xs, ys, lo, hi = [], [], [], []
            for k, arm in sorted(arms.items(), reverse=True):
                r = rows.get(f"{arm} − C @lr={lr:g}")
                if r is None or "ci" not in r:
                    continue
                ns.append(r["n"])
                xs.append(k + dx)
                ys.append(r["estimate"])
                lo.append(r["estimate"] - r["ci"][0])
                hi.append(r["ci"][1] - r["estimate"])
                ax.errorbar([k + dx], [r["estimate"]], yerr=[[lo[-1]], [hi[-1]]], fmt="o", ms=5, capsize=2,
                            color=plots.color(arm), lw=1.2)
            if xs:
                ax.plot(xs, ys, color=plots.color(key), lw=1.0, alpha=0.7, label=name)
        ax.axhline(0.0, color=plots.color("C"), lw=0.8)
        if not ns:
            ax.text(0.5, 0.5, "no seed stored yet", ha="center", va="center", transform=ax.transAxes)
        seeds = (f"{min(ns)} seeds" if ns and min(ns) == max(ns) else
                 f"{min(ns)}–{max(ns)} seeds" if ns else "no paired seeds yet")
        ax.set_title(f"lr {lr:g} ({seeds})")
        ax.set_xlim(7.5, 2.5)
        ax.set_xticks([7, 6, 5, 4, 3])
        ax.set_xlabel("fraction bits K of the output path")
        ax.grid(alpha=0.3)
    lims = [ax.get_ylim() for ax in axes[0] if ax.lines[1:]]
    for ax in axes[0]:
        if lims:
            ax.set_ylim(min(lo for lo, _ in lims), max(hi for _, hi in lims))
        ax.set_ylabel("held-out loss − FP32's (nats)")
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    handles.append(Line2D([], [], color=plots.color("C"), lw=0.8))
    labels.append("FP32 attention (C), the zero line")
    plots.legend_axes(legend_ax, handles, labels, fontsize=9)
    fig.tight_layout()
    return fig


# -- the long horizon (H11, descriptive) ---------------------------------------------------------------------------
def _long(res: Mapping) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """(arms, stored (arm, seed), diagnostic steps) of the long horizon, or None while no long run is stored."""
    if "long_stored" not in res or not np.asarray(res["long_stored"], dtype=bool).any():
        return None
    arms = [str(v) for v in np.asarray(res["long_variants"])]
    n = np.asarray(res["long_val_curve"]).shape[-1]
    return arms, np.asarray(res["long_stored"], dtype=bool), np.arange(n) * (D.LONG_STEPS // (n - 1))


def long_facts(res: Mapping | None) -> dict[str, str]:
    """The long horizon's state for a page: ``long_status`` (how many of its runs are stored, in a sentence),
    ``long_last_diag`` (the last step with diagnostics in any stored run: a run records them every
    `long_diag_every` steps before its last step, so ‖W_Q‖ and δ stop one interval before the held-out loss), and
    ``long_card`` / ``long_when``: the cards and days of the parts that hold long runs (of every part where the
    result does not say which hold them)."""
    got = _long(res or {})
    planned = int(np.asarray((res or {}).get("long_stored", np.zeros(0))).size)
    parts = (res or {}).get("parts") or []
    if any("long" in p for p in parts):
        parts = [p for p in parts if p.get("long")]
    where = cards({"parts": parts})
    where = {"long_card": where["dial_card"], "long_when": where["dial_when"]}
    if got is None:
        return {"long_status": f"None of the {planned} long runs is stored yet." if planned else
                "No long run is stored yet.", "long_last_diag": "none", **where}
    arms, stored, steps = got
    n = int(stored.sum())
    status = (f"All {planned} long runs are stored." if n == planned else
              f"{n} of the {planned} long runs are stored so far; the legend counts the seeds behind each line, and "
              "H11 is described when every arm has its five.")
    seen = np.isfinite(np.asarray(res["long_wq"], dtype=np.float64))[stored].any(axis=0)
    return {"long_status": status, "long_last_diag": f"{int(steps[np.flatnonzero(seen)[-1]]):,}" if seen.any()
            else "none", **where}


def long_figure(res: Mapping) -> plt.Figure | None:
    """The long horizon (stored `dial_training`): per arm, against the step, the held-out loss, the largest ‖W_Q‖
    of any head and the running sum over checkpoints of the δ error on rows with a tied maximum (Σ over layers
    and heads of Σ (δ_lp − δ_hp); the paper's Fig. 5a measures the same running sum over steps) — each seed faint,
    the mean over the stored seeds bold. None while no long run is stored (a page shows nothing instead of an
    empty figure)."""
    got = _long(res)
    if got is None:
        return None
    arms, stored, steps = got
    dd = np.nansum(np.asarray(res["long_delta_tied"], dtype=np.float64), axis=-1)     # (arm, seed, step)
    have_dd = np.isfinite(np.asarray(res["long_delta_tied"], dtype=np.float64)).any(axis=-1)
    panels = (("held-out loss (nats)", np.asarray(res["long_val_curve"], dtype=np.float64)),
              ("largest ‖W_Q‖ of a head", np.asarray(res["long_wq"], dtype=np.float64)),
              ("running Σ of the δ error on tied rows", np.where(have_dd, np.cumsum(dd, axis=-1), np.nan)))
    # two by two (three panels and the legend): readable at column width and at 400 px
    fig, grid = plt.subplots(2, 2, figsize=(7.2, 5.6))
    axes = grid.ravel()
    handles, labels = [], []
    for ax, (title, y) in zip(axes[:-1], panels):
        for i, arm in enumerate(arms):
            rows = y[i][stored[i]]
            if not rows.size:
                continue
            for r in rows:
                ax.plot(steps, r, color=plots.color(arm), lw=0.6, alpha=0.35)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a step no seed recorded: no point there
                mean = np.nanmean(rows, axis=0)
            (h,) = ax.plot(steps, mean, color=plots.color(arm), lw=1.8)
            label = f"{arm} ({int(stored[i].sum())} seeds)"
            if label not in labels:
                handles.append(h)
                labels.append(label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[2].axhline(0.0, color="0.5", lw=0.8)
    plots.legend_axes(axes[-1], handles, labels, fontsize=9)
    fig.tight_layout()
    return fig


def long_words(res: Mapping | None) -> str:
    """H11 in a sentence, from the stored long runs: per arm its final held-out loss minus FP32 attention's (mean
    and 95 % t interval over the paired seeds), the runs failed by chapter 1's criterion, and in how many seeds
    the δ error on tied rows, summed over the run, is positive; '' while no long run is stored."""
    got = _long(res or {})
    if got is None:
        return ""
    arms, stored, _ = got
    h11 = (res["analysis"].get("H11") or {})
    dd = np.asarray(res["long_delta_tied"], dtype=np.float64)
    parts = []
    for i, arm in enumerate(arms):
        row = h11.get(arm) or {}
        n = int(stored[i].sum())
        if not n:
            continue
        bits = [f"{n} seed{'s' if n != 1 else ''}"]
        if "minus_c" in row:
            bits.append(f"{row['minus_c']:+.3f} [{row['ci'][0]:+.3f}, {row['ci'][1]:+.3f}] against C")
        bits.append(f"{row.get('failed', 0)} failed")
        total = np.nansum(dd[i][stored[i]], axis=(-1, -2))
        if arm != "C" and np.isfinite(dd[i][stored[i]]).any():
            bits.append(f"tied-row δ error positive over the run in {int((total > 0).sum())} of {n}")
        parts.append(f"{arm}: {', '.join(bits)}")
    return ("Over 10,000 steps at 8e-3 (H11, descriptive): " + "; ".join(parts) + ".") if parts else ""


def long_brief(res: Mapping | None) -> str:
    """H11 for the chapter, once every long run is stored ('' before): per arm its final held-out loss minus C's
    (mean and 95 % t interval over the five paired seeds) and its failed runs, then how the pattern reads against
    the paper's expectation — A_3 fails or ends above C (interval above 0) while SR_3, SR_4 and C do not."""
    got = _long(res or {})
    if got is None or not got[1].all():
        return ""
    h11 = res["analysis"].get("H11") or {}

    def bad(arm: str) -> bool:
        row = h11.get(arm) or {}
        return bool(row.get("failed")) or bool(row.get("ci") and row["ci"][0] > 0)

    def said(arm: str) -> str:
        row = h11.get(arm) or {}
        fail = f", {row.get('failed', 0)} of {row.get('stored', 0)} failed" if row.get("failed") else ""
        num = f"{row['minus_c']:+.2f} [{row['ci'][0]:+.2f}, {row['ci'][1]:+.2f}]" if "minus_c" in row else "—"
        return f"{arm} {num}{fail}"

    arms = [a for a in ("A_3", "SR_3", "SR_4") if a in got[0]]  # H11's arms (A, the 7-bit one, is in the lab's words)
    n = int(got[1].shape[1])
    head = (f"Over 10,000 steps at 8e-3 (H11, {n} seeds, descriptive), held-out loss minus C's: "
            + "; ".join(said(a) for a in arms) + (f"; C {h11['C']['failed']} failed" if (h11.get("C") or {}).get(
                "failed") else "") + ".")
    unbiased_bad = [a for a in ("SR_3", "SR_4") if a in arms and bad(a)] + (["C"] if bad("C") else [])
    if not bad("A_3"):
        tail = "A_3 neither fails nor ends above FP32 attention: the amplified regime does not appear here."
    elif unbiased_bad:
        one = len(unbiased_bad) == 1
        tail = (f"A_3 is harmed, and so {'is' if one else 'are'} {listing(unbiased_bad)}, which "
                f"{'carries' if one else 'carry'} no bias: precision costs too, not the bias alone.")
    else:
        tail = "A_3 is harmed while the unbiased arms are not: the pattern the paper's account predicts."
    return f"{head} {tail}"
