"""Chapter 6's tables, figure and glued numbers for the production kernels on tied rows (experiment
`prod_kernels`, measured on the GPU). The chapter narrates; every number it shows comes from here, read from
the stored result.

Conventions: "signed" is the mean of O − O_true; "away" the mean of (O − O_true)·sign(O_true), > 0 when the
stored |O| is too large (the paper's direction). With 90 % negative V (the base rows) O_true is mostly
negative, so a positive signed error is an error toward zero, i.e. a negative "away".
"""
from __future__ import annotations

import html
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np

from lpfail import results
from lpfail.book import plots
from lpfail.book import confirmation_report as CR
from lpfail.book.claims import fix_b
from lpfail.book.costs import html_table
from lpfail.book.text import interval, md_table, span
from lpfail.experiments import prod_kernels as pk
from lpfail.experiments import cures as cu
from lpfail.experiments.rounding import RowSpec, headline as rounding_headline
from lpfail.sweep.variants import VARIANTS
from lpfail.book.verdict import (CONTRADICTED, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED, Verdict,
                                e4_text as _e4_ci, load_or_none, provenance_line, sig_neg, sig_pos)

#: The production implementations: PyTorch SDPA's CUDA back ends and lpfail's Triton kernel.
PRODUCTION = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "triton_sub", "triton_fma")
#: The FlashAttention-2-order references (FP32 accumulator, O divided by ℓ before its one BF16 rounding).
DIVIDE_FIRST = ("ref_FA2_BF16", "mimic_exp_sub", "mimic_exp2_sub", "mimic_exp2_fma")
#: The paper's order and its mimics (Ō rounded to BF16 before the division, or P and O rounded separately).
ROUND_FIRST = ("ref_PAPER_BF16", "mimic_exp2_fma_roundfirst", "math_mimic")


def _e4(x: float) -> str:
    return f"{x * 1e4:+.2f}"


def kernels_table(res, methods=None) -> str:
    """Markdown table: per method at the base rows (``methods``: all by default), the signed error and the error
    toward larger |O| (×10⁻⁴, ± the 95 % CI half-width), and the fraction of tied keys with P̄ = 1 (FP32 p = 1 in
    brackets)."""
    rows = []
    for r in pk.summary(res):
        if methods is not None and r["method"] not in methods:
            continue
        if not r["available"]:
            rows.append([f"`{r['method']}`", f"not available: {r['reason'][:70]}", "", ""])
            continue
        pb = "not observable" if np.isnan(r["pbar_one"]) else f"{r['pbar_one']:.0%} (p: {r['p_one']:.0%})"
        rows.append([f"`{r['method']}`", f"{_e4(r['signed'])} ± {r['signed_ci'] * 1e4:.2f}",
                     f"{_e4(r['away'])} ± {r['away_ci'] * 1e4:.2f}", pb])
    return md_table(["method", "signed error (×10⁻⁴)", "toward larger |O| (×10⁻⁴)", "P̄ = 1 at ties"], rows)


def match(res, a: str, b: str) -> float:
    """Fraction of O's elements equal bit for bit between methods a and b at the base point (NaN if absent)."""
    for k in (f"match_{a}__{b}", f"match_{b}__{a}"):
        if k in res:
            return float(res[k])
    return float("nan")


#: Short names of the reference orders in the match table's header (its caption says what each is).
MATCH_LABELS = {"ref_FA2_BF16": "FA2 ref.", "mimic_exp2_fma": "FA2 mimic", "ref_PAPER_BF16": "paper ref.",
                "mimic_exp2_fma_roundfirst": "round-first mimic", "math_mimic": "math mimic"}


def match_table(res, methods=PRODUCTION, against=("ref_FA2_BF16", "mimic_exp2_fma", "ref_PAPER_BF16",
                                                  "mimic_exp2_fma_roundfirst", "math_mimic")) -> str:
    """Markdown: per production method, the bit-for-bit agreement with each reference order (short names in the
    header, `MATCH_LABELS`)."""
    live = [m for m in methods if bool(res.get(f"available_{m}", False))]
    return md_table(["method", *[MATCH_LABELS.get(a, a) for a in against]],
                    [[f"`{m}`", *[f"{match(res, m, a):.1%}" for a in against]] for m in live])


def facts(res) -> dict:
    """The numbers the chapter's prose quotes (glued), and the plain statement of the comparison:
    ``opposite`` is True when every available production method's error toward larger |O| has a CI
    entirely below 0 while PAPER_BF16's lies entirely above 0."""
    live = [m for m in PRODUCTION if bool(res.get(f"available_{m}", False))]
    rows = {x["method"]: x for x in pk.summary(res)}   # once: every number below is one of its fields
    if not live:
        raise ValueError("prod_kernels: no production method is available in this result")
    away = {m: (float(rows[m]["away"]), float(rows[m]["away_ci"])) for m in live + list(ROUND_FIRST + DIVIDE_FIRST)
            if bool(res.get(f"available_{m}", False))}
    signed = {m: float(rows[m]["signed"]) for m in away}
    below = all(a + ci < 0 for m, (a, ci) in away.items() if m in live)
    paper_up = away["ref_PAPER_BF16"][0] - away["ref_PAPER_BF16"][1] > 0
    prod_signed = [signed[m] for m in live]
    prod_away = [away[m][0] for m in live]
    negs = list(np.asarray(res["neg_fracs"], dtype=float))
    i5 = negs.index(0.5) if 0.5 in negs else None
    out = {
        "n_production": len(live),
        "prod_signed_lo": _e4(min(prod_signed)), "prod_signed_hi": _e4(max(prod_signed)),
        "prod_away_lo": _e4(min(prod_away)), "prod_away_hi": _e4(max(prod_away)),
        "prod_ci_max": f"{max(away[m][1] for m in live) * 1e4:.2f}",
        "paper_signed": _e4(signed["ref_PAPER_BF16"]), "paper_away": _e4(away["ref_PAPER_BF16"][0]),
        "fa2_signed": _e4(signed["ref_FA2_BF16"]), "fa2_away": _e4(away["ref_FA2_BF16"][0]),
        "fma_away": _e4(away["mimic_exp2_fma"][0]), "roundfirst_away": _e4(away["mimic_exp2_fma_roundfirst"][0]),
        "fma_p_one": f"{float(rows['mimic_exp2_fma']['p_one']):.0%}",
        "fma_pbar_one": f"{float(rows['mimic_exp2_fma']['pbar_one']):.0%}",
        "match_prod_divide_lo": f"{min(match(res, m, d) for m in live for d in DIVIDE_FIRST):.1%}",
        "match_prod_divide_hi": f"{max(match(res, m, d) for m in live for d in DIVIDE_FIRST):.1%}",
        "match_prod_round_hi": f"{max(match(res, m, d) for m in live for d in ROUND_FIRST):.1%}",
        "match_prod_prod_lo": f"{min(match(res, a, b) for a in live for b in live if a < b):.1%}",
        "match_exp_exp2": f"{match(res, 'mimic_exp_sub', 'mimic_exp2_sub'):.1%}",
        "match_sub_fma": f"{match(res, 'mimic_exp2_sub', 'mimic_exp2_fma'):.1%}",
        "match_paper_roundfirst": f"{match(res, 'ref_PAPER_BF16', 'mimic_exp2_fma_roundfirst'):.1%}",
        "opposite": bool(below and paper_up),
    }
    if i5 is not None:
        out["paper_away_neg50"] = _e4(float(np.asarray(res["neg_ref_PAPER_BF16_away"])[i5]))
        out["prod_away_neg50_lo"] = _e4(min(float(np.asarray(res[f"neg_{m}_away"])[i5]) for m in live))
        out["prod_away_neg50_hi"] = _e4(max(float(np.asarray(res[f"neg_{m}_away"])[i5]) for m in live))

        out["prod_away_neg50"] = span(out["prod_away_neg50_lo"], out["prod_away_neg50_hi"])
    out["statement"] = (
        "On these rows every production kernel measured is biased the other way from the paper's kernel: "
        "toward smaller |O|, where PAPER_BF16 is biased toward larger |O|." if out["opposite"] else
        "The production kernels are not uniformly biased the other way from the paper's kernel on these rows "
        "(at least one CI is not on the opposite side).")
    return out


def chapter4_sentence(res, rounding) -> str:
    """The sentence that ties chapter 6's paper-arithmetic row to chapter 4's default row: the same measurement
    (signed error of the stored O on tied rows) on other random rows of the same kind, so the two numbers differ;
    whether their 95 % intervals overlap is computed, not assumed."""
    row = {x["method"]: x for x in pk.summary(res)}["ref_PAPER_BF16"]
    a, a_ci = float(row["signed"]), float(row["signed_ci"])
    b, b_ci = float(rounding["default_nofix_out_signed"]), float(rounding["default_nofix_out_signed_ci"])
    overlap = abs(a - b) <= a_ci + b_ci
    said = rounding_headline(rounding)["signed_nofix"]   # chapter 4's own text of its number
    return (f"(Chapter 4 measures the same thing, {said} ×10⁻⁴, on other random rows of "
            f"the same kind; the two intervals {'overlap' if overlap else 'do not overlap'}.)")


def prod_figure(res, show=("sdpa_flash", "sdpa_cudnn", "sdpa_math", "triton_sub", "mimic_exp2_fma",
                             "ref_PAPER_BF16")):
    """Error toward larger |O| (×10⁻⁴, 95 % CIs) against the gap (2 ties) and the number of ties (gap 16)."""
    gaps, ties = np.asarray(res["gaps"], dtype=float), np.asarray(res["ties"]).astype(int)
    base = RowSpec()
    ti, gi = list(ties).index(base.n_ties), list(gaps).index(base.gap)
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for m in show:
        if not bool(res.get(f"available_{m}", False)):
            continue
        a, ci = np.asarray(res[f"grid_{m}_away"]) * 1e4, np.asarray(res[f"grid_{m}_away_ci"]) * 1e4
        st = dict(color=plots.color(m), label=plots.WORDS.get(m, m), marker="o", ms=3, capsize=2)
        axes[0].errorbar(gaps, a[:, ti], ci[:, ti], **st)
        axes[1].errorbar(ties, a[gi], ci[gi], **st)
    for ax, xl in zip(axes, (f"gap of the tied maximum ({base.n_ties} ties)",
                             f"number of tied maxima (gap {base.gap:g})")):
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel=xl, ylabel="error toward larger |O| (×10⁻⁴)")
    axes[0].legend()
    fig.tight_layout()
    return fig


# -- the cures (experiment `cures`, possibly incomplete) -------------------------------------------------------
def cures_table(part: dict, variants) -> str:
    """HTML: per cure (``variants`` in order), where it acts, the runs stored, and — for a complete cure only —
    its LR sensitivity S [95 % CI], K1 (S lower than A), K2 (half the A − C gap closed) and its throughput
    relative to A; an incomplete cure says what is missing and is not judged. ``part`` is
    `cures.partial_analysis()`. Cells wrap (seven columns do not fit the text column as one line each)."""
    st, an = part["status"], part["analysis"]
    rows = []
    for v in variants:
        x = st["per_variant"][v]
        label = html.escape(VARIANTS[v].label)
        if an is None or v not in an["cures"]:
            rows.append([label, html.escape(cu.WHERE.get(v, "?")),
                         f"{x['stored']}/{x['planned']} (missing {html.escape(cu.missing_text(x))})",
                         "not judged: incomplete", "", "", ""])
            continue
        y = an["cures"][v]
        rows.append([label, html.escape(y["where"]), f"{x['stored']}/{x['planned']}",
                     interval({"point": y["S"], "ci": y["ci"]}, ".3f"),
                     html.escape(y["K1"]["verdict"]) if "K1" in y else "—",
                     html.escape(y["K2"]["verdict"]) if "K2" in y else "—", f"{y['throughput_vs_A']:.2f}"])
    return html_table(["cure", "acts in", "runs stored", "LR sensitivity S [95 % CI]", "K1: S lower than A",
                       "K2: half the A − C gap closed", "rel. throughput"], rows, escape=False)


#: The cures in two groups for chapter 6's tables: aimed at the bias or at δ; changing the arithmetic or the model.
CURE_GROUPS = {"bias": ("B", "Bp", "R", "A_sr", "A_hp", "A_res", "A_ds"), "other": ("D", "A_qk", "A_z", "A_cap")}


#: Per cure, the confirmation grid's ten-seed hypothesis that it closes at least half of the gap
#: (`lpfail.experiments.confirmation.HYPOTHESES`; QK-norm's is measured against FP32 attention with QK-norm).
TEN_SEED_TEST = {"A_sr": "H2", "A_qk": "H3", "D": "HD", "B": "HB", "R": "HR"}


def ten_seed_row(conf: Mapping | None, variant: str) -> dict | None:
    """A cure's half-gap test on the confirmation grid's ten paired seeds: {"hyp", "n", "stat" (the estimate with
    its 95 % t interval over all seeds), "p_adjusted" (Holm, the call on the fresh seeds), "word"
    (`confirmation_report.row_word`)}; None where the grid has no such test or has not made it."""
    hyp = TEN_SEED_TEST.get(variant)
    if conf is None or hyp is None:
        return None
    a = conf["analysis"] if "analysis" in conf else conf
    h = (a.get("claims") or {}).get(hyp)
    if h is None or h.get("estimate") is None or h.get("ci") is None:
        return None
    return {"hyp": hyp, "n": int(h["n"]), "stat": {"point": h["estimate"], "ci": h["ci"]},
            "p_adjusted": h.get("p_adjusted"), "word": CR.row_word(a, "claims", hyp)}


def cures_summary_table(res, group: str, omit: tuple[str, ...] = (), conf: Mapping | None = None) -> str:
    """Markdown: for the cures of one `CURE_GROUPS` group of a stored ``cures`` result (less those in ``omit``,
    judged elsewhere), where each acts, the seeds its row stands on, the half-gap statistic [95 % CI] and its word
    for "closes at least half of the gap". Where the stored ``confirmation`` grid (``conf``) tests that on ten
    paired seeds (`ten_seed_row`), the row is that test's (its hypothesis, its Holm-adjusted p); else it is the
    ``cures`` grid's pre-registered K2 on its seeds (a bootstrap interval over them), and the seeds cell says how
    many, with the runs that were non-finite (they count at their initial loss)."""
    analysis = res["cures_analysis"]
    variants = [str(x) for x in np.asarray(res["small_variants"])]
    bad = {v: int((np.asarray(res["small_status"])[i] != 0).sum()) for i, v in enumerate(variants)}
    n_seeds = len(np.asarray(res["seeds"])) if "seeds" in res else None
    rows = []
    for v in (x for x in CURE_GROUPS[group] if x not in omit):
        ten = ten_seed_row(conf, v)
        if ten is not None:
            p = f" (Holm p {ten['p_adjusted']:.2g})" if ten["p_adjusted"] is not None else ""
            where = (analysis["cures"].get(v) or {}).get("where") or cu.WHERE.get(v, "—")
            rows.append([plots.label(v), where, f"{ten['n']} seeds, {ten['hyp']}",
                         interval(ten["stat"], "+.3f"), f"**{ten['word']}**{p}"])
            continue
        y = analysis["cures"].get(v)
        if y is None:
            rows.append([plots.label(v), "—", "not stored", "—", "not judged"])
            continue
        seeds = f"{n_seeds} seed{'s' if n_seeds != 1 else ''}, K2" if n_seeds is not None else "K2"
        if bad.get(v):
            seeds += f"; {bad[v]} run{'s' if bad[v] != 1 else ''} non-finite"
        k2 = y.get("K2")
        rows.append([plots.label(v), y["where"], seeds, interval(k2, "+.3f") if k2 else "—",
                     f"**{k2['verdict']}**" if k2 else "—"])
    return md_table(["cure", "acts in", "seeds (test)", "half-gap statistic [interval]", "closes half"], rows)


def hp_sentence(cures: Mapping, load=None) -> str:
    """Chapter 6's sentence on δ from an FP32 output (A_hp) against the paper's Sec. 3: its K2 statistic and word
    on the ``cures`` grid's seeds, that count against the ten a verdict on training rests on, and the verdict
    page's word for K-cure:hp (`judge_cure`)."""
    y = cures["cures_analysis"]["cures"].get("A_hp")
    if y is None or "K2" not in y:
        return ("The paper's Sec. 3 finds that recomputing O in FP32 for δ removes the failure; δ from an FP32 "
                "output has no stored runs here.")
    k2 = y["K2"]
    n = len(np.asarray(cures["seeds"])) if "seeds" in cures else None
    seeds = f"{n} seed{'s' if n != 1 else ''}" if n is not None else "the seeds stored"
    few = n is None or n < 10
    does = {"supported": "closes at least half of the gap", "refuted": "closes less than half of the gap"}.get(
        k2["verdict"], "is not shown to close half of the gap or less")
    paper = {"supported": "as the paper's Sec. 3 finds", "refuted": "against the paper's Sec. 3"}.get(
        k2["verdict"], "beside the paper's Sec. 3")
    word = judge_cure(cures, "A_hp").verdict
    return (f"On {seeds}{', fewer than the ten a verdict on training rests on,' if few else ''} δ from an FP32 "
            f"output {does} (K2: {interval(k2, '+.3f')}, **{k2['verdict']}**; K-cure:hp on {{doc}}`verdict`: "
            f"*{word}*), {paper}, which finds that recomputing O in FP32 for δ removes the failure"
            + ("; on ten seeds it is not yet tested." if few else "."))


def official_fix_sentence(conf: Mapping | None) -> str:
    """Chapter 6's sentence on the official fix in training: Fix-b's word and per-rate numbers on the confirmation
    grid's ten paired seeds (`confirmation_report.fix_rates`, the verdict page's and chapter 5's), or '' without
    them."""
    rates = CR.fix_rates(conf["analysis"]) if conf is not None else []
    if not rates:
        return ""
    return (f"The official fix is judged on ten paired seeds per learning rate ({{doc}}`05_fix`, Fix-b): "
            f"*{fix_b(conf['analysis']).word}*. It {CR.fix_rates_text(rates)}.")


def cures_outcome(analysis: dict) -> dict:
    """The cures grouped by their K2 verdict (closes at least half of the A − C gap), from a `cures`
    analysis (``res["cures_analysis"]``): {"closes": [...], "does_not": [...], "inconclusive": [...],
    "predicted_little": the cures predicted (in writing, before the runs) to "close little" and whether each
    did ("hit" when K2 is not supported, "miss" when it is)}; variants without K2 (A, C, S) are left out."""
    groups = {"closes": [], "does_not": [], "inconclusive": []}
    key = {"supported": "closes", "refuted": "does_not", "inconclusive": "inconclusive"}
    for v, y in analysis["cures"].items():
        if "K2" in y:
            groups[key.get(y["K2"]["verdict"], "inconclusive")].append(v)
    preds = dict(analysis.get("predictions", {}))
    for v, p in list(preds.items()):   # "like A_hp": the prediction written for A_hp
        if p.startswith("like ") and p[5:].split()[0].strip(",.:") in preds:
            preds[v] = preds[p[5:].split()[0].strip(",.:")]
    little = {v: ("miss" if analysis["cures"][v].get("K2", {}).get("verdict") == "supported" else "hit")
              for v, p in preds.items() if p.startswith("closes little") and v in analysis["cures"]}
    return {**groups, "predicted_little": little}


def cures_outcome_text(analysis: dict) -> str:
    """`cures_outcome` in one Markdown paragraph (names from lr_sweep's variant labels)."""
    o = cures_outcome(analysis)
    name = lambda vs: "; ".join(VARIANTS[v].label for v in vs) or "none"
    hits = [v for v, h in o["predicted_little"].items() if h == "hit"]
    return (f"Closes at least half of the gap (K2 supported): {name(o['closes'])}. "
            f"Does not (K2 refuted): {name(o['does_not'])}. Inconclusive: {name(o['inconclusive'])}. "
            f"Of the cures predicted in writing to close little, {len(hits)} of {len(o['predicted_little'])} "
            "did as predicted.")


# -- chapter 6's claims (the production kernels, the cures) --------------------------------------------------
#: Which stored method stands for "the production kernel" in each prod_kernels result.
PROD_BACKEND = {"prod_kernels": "sdpa_flash", "prod_kernels_cpu": "sdpa_flash"}

def _base_index(res: Mapping) -> tuple[int, int]:
    gaps, ties = list(np.asarray(res["gaps"]).tolist()), list(np.asarray(res["ties"]).tolist())
    base = RowSpec()
    return (gaps.index(base.gap) if base.gap in gaps else 0, ties.index(base.n_ties) if base.n_ties in ties else 0)

def judge_backend_bias(res: Mapping, method: str, name: str = "prod_kernels") -> Verdict:
    """K-bias: a back end rounds the stored O toward larger |O| on rows with tied maxima, as PAPER_BF16 does
    (chapter 4's bias), at the base rows (2 ties at 16, 90 % negative V).

    Rule: the error toward larger |O| (``grid_{method}_away``) significantly positive → reproduced (the
    paper's direction); significantly negative → contradicted (a bias of the other sign); otherwise not
    reproduced; a method that could not run on the machine → not yet tested, with its error."""
    statement = (f"The back end `{method}` has the paper's bias on tied rows: its stored O is rounded toward "
                 "larger |O|.")
    rule = ("away-from-zero error of the stored O at the base rows: 95 % CI above 0 → reproduced, below 0 → "
            "contradicted, else not reproduced; not run on the machine → not yet tested")
    if not bool(res.get(f"available_{method}", False)):
        why = res.get(f"unavailable_{method}", "not in this result")
        return Verdict(f"K-bias:{method}", statement, NOT_TESTED,
                       f"`{method}` did not run: {why}. {provenance_line(res)}.", rule)
    gi, ti = _base_index(res)
    m = np.asarray(res[f"grid_{method}_away"])[gi, ti]
    ci = np.asarray(res[f"grid_{method}_away_ci"])[gi, ti]
    v = REPRODUCED if sig_pos(m, ci) else CONTRADICTED if sig_neg(m, ci) else NOT_REPRODUCED
    dev = str(res.get("device_used", "?"))
    return Verdict(f"K-bias:{method}", statement, v,
                   f"Error toward larger |O| {_e4_ci(m, ci)} (experiment `{name}`, device {dev}); see {{doc}}`06_beyond`; "
                   f"{provenance_line(res)}.", rule,
                   "Synthetic rows fed to the kernel through q = e₀, k_j = s_j·e₀ with scale 1 (exact scores), "
                   "not a trained model's attention." + (" Measured on a CPU: PyTorch's CPU kernel, not the CUDA "
                                                         "one." if dev == "cpu" else ""),
                   note="PyTorch's CPU kernel; the CUDA one pending" if dev == "cpu" else "")

def judge_fma_pbar(res: Mapping) -> Verdict:
    """K-fma (arXiv 2609.34272): production kernels form S − m with a fused multiply-add, so the tied maximum
    does not give P̄ = 1. Judged on the FA2-order mimic with exp2 and FMA (`mimic_exp2_fma`) at the base rows.

    Rule: fraction of tied keys with P̄ = bf16(p) exactly 1 (what the P̄V product multiplies) ≤ 0.5 →
    reproduced; p itself (FP32) ≠ 1 for most ties while P̄ = 1 for ≥ 99 % → contradicted for the P̄ that the
    product uses (the residual is lost in the BF16 rounding); otherwise partly."""
    gi, ti = _base_index(res)
    if not bool(res.get("available_mimic_exp2_fma", False)):
        return Verdict("K-fma", "A fused S − m leaves P̄ ≠ 1 at tied maxima.", NOT_TESTED,
                       "The mimic `mimic_exp2_fma` is not in this result.", "needs mimic_exp2_fma")
    p1 = float(np.asarray(res["grid_mimic_exp2_fma_p_one"])[gi, ti])
    pb1 = float(np.asarray(res["grid_mimic_exp2_fma_pbar_one"])[gi, ti])
    if pb1 <= 0.5:
        v = REPRODUCED
    elif p1 < 0.5 and pb1 >= 0.99:
        v = CONTRADICTED
    else:
        v = PARTLY
    return Verdict(
        "K-fma", "In a production kernel the max subtraction is fused into an FMA, so P̄ = 1 may never occur at "
                 "a tied maximum (arXiv 2609.34272).", v,
        f"FA2's order with exp2 and a fused S·c − m·c: p = 1 exactly for {p1:.0%} of the tied keys in FP32, "
        f"P̄ = bf16(p) = 1 for {pb1:.0%}; see {{doc}}`06_beyond`; {provenance_line(res)}.",
        "P̄ = 1 for ≤ 50 % of ties → reproduced; p ≠ 1 for most but P̄ = 1 for ≥ 99 % → contradicted (for the "
        "P̄ the P̄V product uses); else partly",
        "Our emulation of the FMA (float64, one rounding) and of FA2's order, not a CUDA kernel's output.",
        note="on our emulation, not a CUDA kernel")

CURE_CLAIMS = {
    "A_res": ("K-cure:res", "Output-residual compensation (δ from O plus a stored BF16 residual) cures the failure "
                            "(after arXiv 2610.05854)."),
    "A_ds": ("K-cure:ds", "Correcting dS's row sum after the BF16 cast cures the failure (after arXiv 2609.34272)."),
    "A_qk": ("K-cure:qk", "QK-norm guards the QK channel and prevents the failure (after arXiv 2608.02091)."),
    "A_hp": ("K-cure:hp", "δ from an FP32 output (dO·O_hp) cures the failure (the paper's Sec. 3)."),
}

def judge_cure(res: Mapping, variant: str) -> Verdict:
    """A cure 'cures the failure' on the LR-sensitivity proxy (experiment `cures`): pre-registered K2 (closes at
    least half of the A − C gap) supported → reproduced; K1 (lowers S) supported but K2 not → partly; K1
    refuted (raises S) → contradicted; otherwise not reproduced; no gap between A and C → not yet tested."""
    claim, statement = CURE_CLAIMS.get(variant, (f"K-cure:{variant}", f"The cure `{variant}` cures the failure."))
    a = res["cures_analysis"] if "cures_analysis" in res else res
    row = a["cures"].get(variant)
    rule = ("pre-registered (2026-12-01) K2 supported → reproduced; K1 supported only → partly; K1 refuted → "
            "contradicted; else not reproduced")
    if row is None or "K1" not in row:
        return Verdict(claim, statement, NOT_TESTED, f"No runs of `{variant}` in the `cures` result.", rule)
    k1, k2 = row["K1"], row["K2"]
    if k2["verdict"] == "no gap to close":
        return Verdict(claim, statement, NOT_TESTED, "A and C do not differ: nothing to cure.", rule)
    v = (REPRODUCED if k2["verdict"] == "supported" else PARTLY if k1["verdict"] == "supported"
         else CONTRADICTED if k1["verdict"] == "refuted" else NOT_REPRODUCED)
    ci1, ci2 = k1["ci"], k2["ci"]
    seeds = len(np.asarray(res["seeds"])) if "seeds" in res else None
    return Verdict(claim, statement, v,
                   f"S(cure) − S(A) = {k1['point']:+.3f} [{ci1[0]:+.3f}, {ci1[1]:+.3f}] ({k1['verdict']}); "
                   f"S(cure) − S(C) − ½(S(A) − S(C)) = {k2['point']:+.3f} [{ci2[0]:+.3f}, {ci2[1]:+.3f}] "
                   f"({k2['verdict']}); see {{doc}}`06_beyond`; {provenance_line(res)}.", rule,
                   "A 3.2 M-parameter byte-level proxy trained 1,000 steps at 6 learning rates, not GPT-2 small.",
                   seeds=seeds)


def claims(load=None, stored=None) -> list[Verdict]:
    """Chapter 6's claims, from whatever is stored: the CUDA back ends (prod_kernels) or, before that GPU run,
    the CPU part (prod_kernels_cpu); the cures (cures). ``stored`` is not read (every claim here says itself
    why it is not yet tested)."""
    load = load or results.load
    out = []
    name, res = "prod_kernels", load_or_none(load, "prod_kernels")
    if res is None:
        name, res = "prod_kernels_cpu", load_or_none(load, "prod_kernels_cpu")
    if res is not None:
        out += [judge_backend_bias(res, PROD_BACKEND[name], name), judge_fma_pbar(res)]
    else:
        out.append(Verdict("K-bias", "Production kernels have the bias.", NOT_TESTED,
                           "No stored `prod_kernels` result yet; see {doc}`06_beyond`.", "no evidence yet"))
    cures = load_or_none(load, "cures")
    for variant in CURE_CLAIMS:
        if cures is not None:
            out.append(judge_cure(cures, variant))
        else:
            claim, statement = CURE_CLAIMS[variant]
            out.append(Verdict(claim, statement, NOT_TESTED, "No stored `cures` result yet (GPU run pending: "
                               "tools/gpu.sh start cures); see {doc}`06_beyond`.", "no evidence yet"))
    return out


# -- the normaliser's source (flash-attention PR #2721; results/prod_normaliser) -----------------------------------
def normaliser_facts(res) -> dict[str, str]:
    """Chapter 6's sentence on ℓ summed from P or from P̄, from the stored ``prod_normaliser``: at the rows with
    two ties at gap 16 (the base rows), the largest change of the error toward larger |O| when ℓ is summed from
    P̄ ("norm_part", ×10⁻⁴), the largest share of a production back end's error it makes ("norm_share"), over the
    pairs measured (ours, the reference, the FA2 mimic), and the card and day."""
    rows = [r for r in pk.normaliser_summary(res, "away") if r["tied"] and r["gap"] == 16.0 and r["n_ties"] == 2]
    if not rows:
        raise ValueError("normaliser_facts: no pair measured at gap 16 with 2 ties")
    parts = [abs(r["normaliser_part"]) for r in rows]
    shares = [abs(v) for r in rows for v in r["shares"].values() if np.isfinite(v)]
    meta = getattr(res, "meta", {}) or {}
    return {"norm_part": f"{max(parts) * 1e4:.2f}", "norm_share": f"{100 * max(shares):.0f} %" if shares else "—",
            "norm_pairs": str(len(rows)), "norm_card": str(meta.get("device", "not recorded")),
            "norm_when": str(meta.get("created", ""))[:10] or "not recorded"}
