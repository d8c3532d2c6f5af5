"""Chapter 1's claims on the verdict page (C0, C0-bias, C0-qk, C0-size), judged from the stored results.

`claims(load, stored)` is what `lpfail.book.verdict` calls for chapter 1. The claims are judged by the
learning-rate sweep's pre-registered hypotheses (H1–H4 on its three seeds; `few_seeds` says so), and where the
confirmation grid has a hypothesis on ten paired seeds, by that grid (`judge_confirmed`, also chapter 5's Fix-b);
the explosion search's old criterion (`lpfail.book.symptom_report`) is reported beside C0 without deciding it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from lpfail import sweep
from lpfail.book import dial_report, symptom_report
from lpfail.book.dial_report import DIAL_RULE
from lpfail.book.claims import FIX_STAT, TEN, c0_size, fix_b, size_judgement
from lpfail.book import confirmation_report as CR
from lpfail.book.confirmation_report import h5_text, h5_word, h6_text
from lpfail.book.text import SIZE_WORDS, interval, listing
from lpfail.book.verdict import (NOT_TESTED, SWEEP_RULE, SWEEP_WORDS, Verdict, as_float, load_or_none, pending,
                                 provenance_line, stat_text, sweep_hypothesis)
from lpfail.experiments import confirmation as CF
from lpfail.experiments import lr_sweep as L
from lpfail.experiments import dial_training as D
from lpfail.experiments.sr_confound import sci
from lpfail.sweep.lr import LRSweepConfig


# -- chapter 1's claims (C0, C0-bias, C0-qk, C0-size), by the sweep's pre-registered hypotheses ----------------

def _s(a: Mapping, variant: str, size: str = "small") -> str:
    d = a.get("sizes", {}).get(size, {}).get(variant)
    if d is None:
        return f"S({variant}) not measured"
    return f"S({variant}) = {as_float(d['S']):.3f} [{as_float(d['ci'][0]):.3f}, {as_float(d['ci'][1]):.3f}]"

def _closed(a: Mapping, treated: str, control: str) -> str:
    """How much of the smaller size's A − C gap the pair (treated, control) closes, from the point estimates."""
    sz = a.get("sizes", {}).get("small", {})
    if not all(k in sz for k in ("A", "C", treated, control)):
        return ""
    gap = as_float(sz["A"]["S"]) - as_float(sz["C"]["S"])
    left = as_float(sz[treated]["S"]) - as_float(sz[control]["S"])
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
    miss = "; ".join(f"{SIZE_WORDS.get(size, size)} size: " + ", ".join(f"{v} {d['stored']}/{d['runs']}"
                                                                     for v, d in per.items())
                     for size, per in inc.items() if per)
    done = "; ".join(f"{SIZE_WORDS.get(size, size)} size: {', '.join(per)}" for size, per in a.get("sizes", {}).items()
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
                   f"rates {min(lrs):g}–{max(lrs):g}")   # (no seed count: the evidence line gives the verdict's)
    else:
        setting = "small byte-level GPTs trained briefly over a grid of learning rates (see the stored config)"
    return (f"A small-scale proxy (Wortsman et al. {{cite}}`wortsman2023small`): {setting}; the final held-out loss "
            "summarised as LR sensitivity, not the paper's loss explosion of GPT-2 small over 3.5 B tokens.")

def _production_text(res: Mapping) -> str:
    """Descriptive, not part of any rule: the share of the A − C gap that D (production-kernel arithmetic) and
    S (SDPA) close, where both are stored ('' otherwise)."""
    if "small_variants" not in res or "small_val_final" not in res:
        return ""
    try:
        rows = {r["variant"]: r for r in L.versus_control(res, "small")}
    except (KeyError, sweep.SweepIncomplete):
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
    v, h = sweep_hypothesis(a, "H1")
    per_lr = a.get("a_minus_c_per_lr", {}).get("small", [])
    where = [f"{as_float(d['lr']):g}" for d in per_lr if d.get("ci") is not None and as_float(d["ci"][0]) > 0]
    small = a.get("sizes", {}).get("small", {})
    nonfinite = sum(int(small[k].get("nonfinite", 0)) for k in ("A", "C") if k in small)
    ev = (f"Pre-registered ({a.get('preregistered_on', '?')}) H1, S(A) − S(C) at the smaller size: "
          f"{stat_text(h)} — **{h['verdict']}**. {_s(a, 'A')}, {_s(a, 'C')} (LR sensitivity of the held-out loss, "
          "bootstrap intervals over the seeds: with 3 seeds, the seed range).")
    if per_lr:
        ev += (" Per learning rate, on these seeds A's final loss lies above C's over the whole seed range at "
               + (f"lr {', '.join(where)}" if where else "no learning rate")
               + f" of {len(per_lr)}; {nonfinite} runs of A and C turned non-finite.")
    if prod := _production_text(res):
        ev += " " + prod
    ev += f" See {{numref}}`fig-lr-curves`; {provenance_line(res)}."
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

def confound_text(sr: Mapping | None) -> str:
    """What stochastic rounding adds beside the bias it removes, from the stored ``sr_confound`` ('' without it)."""
    if sr is None:
        return ""
    g = lambda k: float(np.nanmean(np.asarray(sr[k], dtype=np.float64)))  # noqa: E731
    rise = 100 * (float(sr["rows_A_sr_rms"]) / float(sr["rows_A_rms"]) - 1)
    return (f"The test is confounded: stochastic rounding removes the bias but adds noise. On chapter 4's tied rows "
            f"it cuts O's bias from {sci(sr['rows_A_bias'])} to about {sci(sr['rows_A_sr_bias'], 1)}, and raises "
            f"O's RMS error by {rise:.0f} % ({sci(sr['rows_A_rms'])} → {sci(sr['rows_A_sr_rms'])}) and "
            f"dQ's relative error from {g('grad_A_dq'):.4f} to {g('grad_A_sr_dq'):.4f} (FP32 attention "
            f"{g('grad_C_dq'):.4f}; `sr_confound`). So a gap that survives stochastic rounding may come from the "
            "added variance, not only from a harm that the bias does not explain.")


def retired_text(grid: str = "confirmation") -> str:
    """Where ``grid``'s A_sr runs are runs of the retired stochastic-rounding stream (`lpfail.sweep.Lookup.retired`,
    read from the results cache's part files): that they cannot be repeated and are to be trained again ('' when
    none is)."""
    n = len(sweep.lookup(sweep.get(grid)).retired)
    if not n:
        return ""
    return (f"The {n} stochastic-rounding runs (A_sr) behind it drew their random bits from torch's generator, "
            "whose draws depended on whether a training step was captured in a CUDA graph; that stream is replaced "
            "by one each run owns, so these runs cannot be repeated bit for bit. Until they are trained again under "
            "the new stream, this verdict rests on one draw of the rounding and may move with another.")


def rerun_text(res: Mapping | None, name: str = "H2") -> str:
    """Before → after of hypothesis ``name`` where the grid's retired-stream runs were trained again
    (`lpfail.sweep.before_rerun`, stored in the result as ``before_rerun``); '' where nothing was retrained."""
    before = (res or {}).get("before_rerun")
    if not before:
        return ""
    now = sweep.verdict_stats(res)
    key = next((k for k in before["stats"] if k.rsplit("/", 1)[-1] == name and k in now), None)
    if key is None:
        return ""
    b, a = before["stats"][key], now[key]
    say = lambda h: (f"{interval({'point': h.get('estimate', h.get('point')), 'ci': h.get('ci')})}"  # noqa: E731
                     + (f", Holm p {h['p_adjusted']:.2g}" if h.get("p_adjusted") is not None else "")
                     + f", {h['verdict']}")
    return (f"The {before['runs']} stochastic-rounding runs (A_sr) behind it were trained again on a stream each "
            f"run owns (the retired one drew from torch's generator and could not be repeated bit for bit). {name} "
            f"before → after: {say(b)} → {say(a)}.")


def judge_bias_not_noise(res: Mapping, sr: Mapping | None = None) -> Verdict:
    """C0-bias, by H2: stochastic rounding of A's output path (P̄V, Ō, O: the same 8-bit mantissas without the
    bias) closes at least half of the A − C gap. Needs H1 supported ("no gap to close" → not yet tested).
    ``sr``: the stored ``sr_confound``, whose measurement of what stochastic rounding adds is shown beside it."""
    a = res["analysis"]
    v, h = sweep_hypothesis(a, "H2")
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
    ev = (f"{plain} Pre-registered H2, S(A_sr) − S(C) − ½·(S(A) − S(C)): {stat_text(h)} — **{word}**"
          + (f"; {closed}" if closed else "") + f". {_s(a, 'A_sr')}. See {{doc}}`01_symptom`; {provenance_line(res)}.")
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
    v, h = sweep_hypothesis(a, "H3")
    closed = _closed(a, "A_qk", "C_qk")
    word = h["verdict"]
    plain = {"supported": "QK-norm closes at least half of the A − C gap.",
             "refuted": "QK-norm leaves more than half of the A − C gap.",
             "inconclusive": "The interval cannot tell whether QK-norm closes half of the A − C gap.",
             "no gap to close": "H1 is not supported, so there is no A − C gap for QK-norm to close."
             }.get(word, "The runs it needs (A, C, A_qk and C_qk at the smaller size) are not all stored.")
    ev = (f"{plain} Pre-registered H3, S(A_qk) − S(C_qk) − ½·(S(A) − S(C)): {stat_text(h)} — **{word}**"
          + (f"; {closed}" if closed else "") + f". {_s(a, 'A_qk')}, {_s(a, 'C_qk')}. See {{doc}}`01_symptom`; "
          f"{provenance_line(res)}.")
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
    v, h = sweep_hypothesis(a, "H4")
    word = h["verdict"]
    if word == "not measured (runs missing)":
        inc = a.get("incomplete", {}).get("large", {})
        ev = ("Not measured: the larger size's A and C runs are not all stored"
              + (" (" + ", ".join(f"{k} {d['stored']}/{d['runs']}" for k, d in inc.items()) + ")" if inc else "")
              + ".")
    else:
        gl, gs = h.get("gap_large"), h.get("gap_small")
        ev = (f"Pre-registered H4 (descriptive), (S(A) − S(C))_larger − (S(A) − S(C))_smaller: "
              f"{stat_text(h)} — **{word}**" + (f"; the gap is {stat_text(gl)} at the larger size, "
                                                 f"{stat_text(gs)} at the smaller" if gl and gs else "") + ".")
    ev += f" See {{doc}}`01_symptom`; {provenance_line(res)}."
    if scope := sweep_scope(res):
        ev += " " + scope
    return Verdict(
        "C0-size", "Larger models are at least as sensitive: the A − C gap does not shrink with model size (the "
                   "premise of a small-scale proxy; the paper's failures are at GPT-2 scale).",
        v, ev, f"{a.get('hypotheses', {}).get('H4', 'H4')}; {SWEEP_RULE}",
        "Two sizes only, ≈ 8× apart in parameters; " + _sweep_differs(res)[0].lower() + _sweep_differs(res)[1:],
        note=_sweep_note(res))


def size_estimates(conf: Mapping | None) -> str | None:
    """C0-size's numbers from the confirmation grid (`size_judgement`) in one sentence: the gap per size with its
    seeds, and the paired difference with its seeds and word. None without those runs."""
    j = size_judgement(conf)
    if j is None:
        return None
    iv = lambda d: interval(d, "+.3f")  # noqa: E731
    few = f", fewer than the {TEN} a training verdict needs" if j["n"] < TEN else ""
    return (f"S(A) − S(C) is {iv(j['large'])} at the larger size ({j['large']['n']} seeds) and {iv(j['small'])} "
            f"at the smaller ({j['small']['n']} seeds); paired by seed over the {j['n']} seeds both sizes have, the "
            f"larger size's gap minus the smaller's is {iv(j['diff'])} (95 % Student t intervals): C0-size reads "
            f"{c0_size(conf).word} on {j['n']} seeds{few}.")


def judge_size_confirmed(conf: Mapping, old: Verdict) -> Verdict:
    """C0-size on the confirmation grid's seeds (`size_judgement`): H4's statistic over the seeds both sizes have,
    judged by its 95 % Student t interval, its word mapped by `SWEEP_WORDS`; ``old`` (lr_sweep's three-seed H4,
    the legacy bootstrap rule) is reported beside it. The row says its seed count where it is under `TEN`."""
    j = size_judgement(conf)
    n = j["n"]
    ev = (f"On our proxy, (S(A) − S(C))_larger − (S(A) − S(C))_smaller = {interval(j['diff'], '+.3f')} (mean over "
          f"{n} seeds paired by seed, 95 % Student t interval) — **{j['verdict']}**. "
          f"S(A) − S(C) is {interval(j['large'], '+.3f')} at the larger size ({j['large']['n']} seeds) and "
          f"{interval(j['small'], '+.3f')} at the smaller ({j['small']['n']} seeds). Descriptive: not one of the "
          f"confirmation grid's pre-registered families, so no Holm correction and no split into fresh seeds.")
    if not (conf["analysis"].get("H6") or {}).get("verdict", "not measured").startswith("not measured"):
        ev += f" On the confirmation grid: {h6_text(conf['analysis'])}"
    ev += f" See {{doc}}`01_symptom`; {provenance_line(conf)}."
    note = f"{n} seeds: fewer than the {TEN} a training verdict needs" if n < TEN else ""
    return dataclasses.replace(
        old, verdict=c0_size(conf).word, evidence=ev,
        rule=f"{L.HYPOTHESES['H4']}; per seed the statistic's value over the seeds both sizes have; supported (its 95 % Student t "
               "interval entirely above 0) → reproduced, inconclusive (the interval contains 0) → not reproduced, "
               "refuted (entirely below) → contradicted",
        old=f"the same claim on lr_sweep's {old.seeds or 3} seeds (legacy bootstrap rule): **{old.verdict}**. "
            f"{old.evidence}",
        note=note, seeds=n,
        test=f"95 % Student t interval of the mean over {n} seeds (a two-sided one-sample t test at 5 %); its "
             "coverage on simulated null data: tests/test_stats_null.py",
        p_adjusted=None, proxy=proxy(conf, ("small", "large")), family="")


#: How lr_sweep's three-seed rows say what their rule is (issue of the legacy rule: its "interval" over three
#: seeds is the seed range, and its false-call rate on simulated null data, tests/test_stats_null.py, is far
#: above 5 %): shown on every training verdict still judged on those seeds.
FEW_SEEDS_TEST = ("paired percentile bootstrap over the seeds (with 3 seeds its interval is the seed range, not a "
                  "95 % interval; its false-call rate on simulated null data is measured in tests/test_stats_null.py)")
FEW_SEEDS_NOTE = "3 seeds: fewer than the 10 a training verdict needs"


def proxy(res: Mapping | None = None, sizes: tuple[str, ...] = ("small",)) -> dict:
    """The proxy a training verdict was judged on, from the stored config: {"size", "steps", "lr"}."""
    cfg = ((getattr(res, "meta", None) or {}).get("config") or {}) if res is not None else {}
    default = LRSweepConfig()
    shapes = [cfg.get(size) or getattr(default, size) for size in sizes]
    lrs = [float(x) for x in cfg.get("lrs", default.lrs)]
    steps = int(cfg.get("max_steps", default.max_steps))
    return {"size": " and ".join(f"{s[0]} layers × {s[2]} wide" for s in shapes),
            "steps": f"{steps:,} per run",
            "lr": f"{min(lrs):g} to {max(lrs):g}, a factor 2 apart" if len(lrs) > 1 else f"{lrs[0]:g}"}


def few_seeds(v: Verdict, res: Mapping, sizes: tuple[str, ...] = ("small",)) -> Verdict:
    """A training verdict still on lr_sweep's three seeds, saying so: its seeds, its test, its proxy, a note."""
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
    ev += f" See {{doc}}`{CONFIRMED_PAGE.get(claim, '01_symptom')}`; {provenance_line(conf)}."
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


def judge_fix_rates(conf: Mapping, v: Verdict) -> Verdict:
    """Fix-b per learning rate on the confirmation grid (`confirmation_report.fix_rates`, `fix_rates_word`): the
    word from each rate where the A − C gap is present, the per-rate statistics as the headline, and ``v``'s
    evidence (HB in LR sensitivity, each rate's cell) after the per-rate sentence."""
    a = conf["analysis"]
    rates = CR.fix_rates(a)
    fb = fix_b(a)
    word = fb.word
    lead = (f"Per learning rate where the A − C gap is present, the official fix {CR.fix_rates_text(rates)}: "
            f"**{word}**. Over all rates at once, in LR sensitivity (HB): ")
    ev = lead + v.evidence[0].lower() + v.evidence[1:] if v.evidence.startswith("On our proxy") else lead + v.evidence
    return dataclasses.replace(
        v, statement="With the fix, training is stable: it closes A's gap to C at the learning rates where there is "
                     "one.", verdict=word, evidence=ev, headline=fb.headline, p_adjusted=None,
        rule=(f"at each learning rate of the smaller size where the A − C gap is present (called on the fresh "
              f"seeds, or, where FP32 attention has degraded, its 95 % Student t interval over all seeds above 0), "
              f"{FIX_STAT} < 0: the fix closes at least half of the gap there. Where the gap is called, by the "
              f"pre-registered call (family fix_lr: paired t test on the fresh seeds, Holm within the family); "
              f"elsewhere by its 95 % Student t interval over all seeds (an estimate, not a call). reproduced: "
              f"called to close at least half at every such rate; partly: closes at least half at one and not at "
              f"another; contradicted: called to close less than half at every such rate; else not reproduced. "
              f"HB, the same in LR sensitivity: {a['hypotheses'].get('HB', 'HB')}"),
        family="fix_lr: B and R at each of the smaller size's learning rates (12 cells)")


def _family_text(a: Mapping) -> str:
    """The family of claims in words, naming the hypotheses not yet stored (they count as p = 1)."""
    missing = [k for k in CF.SIDES if (a.get("claims") or {}).get(k) is None]
    text = f"the claims at the smaller size ({', '.join(CF.SIDES)})"
    if missing:
        text += f"; {', '.join(missing)} not yet stored, counted as p = 1"
    return text


def claims(load, stored) -> list[Verdict]:
    """C0, C0-bias, C0-qk and C0-size from the stored ``lr_sweep`` (pending without it); C0 carries the explosion
    search's verdict (`lpfail.book.symptom_report.judge_symptom`) beside its own. Where the ``confirmation`` grid
    has H1 on ten seeds, it decides C0 (`judge_confirmed`); the rows still on three seeds say so (`few_seeds`)."""


    search = symptom_report.search_evidence(load)
    old = symptom_report.judge_symptom(*search) if search is not None else None
    lr = load_or_none(load, "lr_sweep")
    if lr is not None:
        c0 = few_seeds(judge_lr_symptom(lr, old), lr)
        conf = load_or_none(load, "confirmation")
        if confirmed(conf, "C0"):
            c0 = judge_confirmed(conf, c0)
        sr = load_or_none(load, "sr_confound")
        bias = few_seeds(judge_bias_not_noise(lr, sr), lr)
        if confirmed(conf, "C0-bias"):
            if lr_again := rerun_text(lr):  # the old criterion's own runs were trained again too
                bias = dataclasses.replace(bias, evidence=f"{bias.evidence} {lr_again}")
            extra = (confound_text(sr), retired_text(), rerun_text(conf))
            bias = judge_confirmed(conf, bias, "C0-bias", " ".join(filter(None, extra)))
        elif retired := retired_text("lr_sweep") or rerun_text(lr):
            bias = dataclasses.replace(bias, evidence=f"{bias.evidence} {retired}")
        qk = few_seeds(judge_qk_norm(lr), lr)
        if confirmed(conf, "C0-qk"):
            qk = judge_confirmed(conf, qk, "C0-qk")
        size = few_seeds(judge_size(lr), lr, ("small", "large"))
        if size_judgement(conf) is not None:
            size = judge_size_confirmed(conf, size)
        return [c0, bias, qk, size, judge_dial(load_or_none(load, "dial_training"))]
    c0 = pending("C0", "The small-scale symptom: training with the paper's BF16 flash attention is worse than "
                       "with high-precision attention.", "lr_sweep", "01_symptom", stored)
    if old is not None:
        c0 = dataclasses.replace(c0, note=f"old criterion, explosion search: {old.verdict}",
                                 old=f"explosion search (`symptom`): **{old.verdict}**. {old.evidence}")
    dial = judge_dial(load_or_none(load, "dial_training"))
    return [c0] + [pending(c, s, "lr_sweep", "01_symptom", stored) for c, s in (
        ("C0-bias", "The harm comes from the bias of the rounding, not from the low precision itself."),
        ("C0-qk", "QK-norm blocks it."),
        ("C0-size", "Larger models are at least as sensitive."))] + [dial]


# -- the precision dial (H8 of `lpfail.experiments.dial_training`) ---------------------------------------------
DIAL_STATEMENT = ("At equal precision the paper's biased rounding trains worse than unbiased rounding: with V and "
                  "the output path at K = 5, 4 and 3 fraction bits, rounding to nearest (A_K) ends above stochastic "
                  "rounding at K bits (SR_K, noisier) and at K + 1 bits (SR_{K+1}, less noisy).")
DIAL_DIFFERS = ("The paper does not test a precision below BF16's: the dial turns the tied-row bias up by rounding V and "
                "the output path to K < 7 fraction bits (BF16's exponent kept), on a 4 × 256 model for 1,000 steps "
                "instead of GPT-2 small for billions of tokens.")
DIAL_TEST = "paired Student t test, two-sided, on ten fresh seeds, Holm within H8's family"


def judge_dial(dial: Mapping | None) -> Verdict:
    """C0-dial: the precision dial's H8 on its ten fresh seeds at both rates; not yet tested until every run of the
    grid's 1,000-step part is stored (the interim description beside it, no call)."""
    prox = {"size": "4 layers × 256 wide", "steps": "1,000 per run",
            "lr": listing_rates(D.LRS)}
    word = dial_report.verdict_word(dial)
    if word == NOT_TESTED:
        ev = f"{dial_report.status(dial)} {dial_report.interim(dial)} See {{doc}}`01_symptom`."
        if dial is not None:
            ev += f" {provenance_line(dial)}."
        return Verdict("C0-dial", DIAL_STATEMENT, NOT_TESTED, ev, DIAL_RULE, DIAL_DIFFERS,
                       note=f"{int((dial or {}).get('runs_stored', 0))} of "
                            f"{int((dial or {}).get('runs_planned', 265))} runs stored",
                       seeds=None, test=DIAL_TEST, proxy=prox, family=D.FAMILIES["H8"])
    h8 = dial_report.h8_rows(dial)
    rows = "; ".join(f"{dial_report.row_label('H8', k)} = {r['estimate']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}], "
                     f"Holm p {r['p_adjusted']:.2g}: {r['verdict']}" for k, r in h8.items())
    long = dial_report.long_brief(dial)  # H11 beside the verdict (descriptive: it does not decide it)
    return Verdict("C0-dial", DIAL_STATEMENT, word,
                   f"H8 on ten paired seeds: {rows}.{' ' + long if long else ''} See {{doc}}`01_symptom`; "
                   f"{provenance_line(dial)}.", DIAL_RULE,
                   DIAL_DIFFERS, seeds=len(D.SEEDS), test=DIAL_TEST, proxy=prox, family=D.FAMILIES["H8"],
                   headline=dial_report.family_summary("H8", h8))


def listing_rates(lrs) -> str:
    """'4e-3 and 8e-3' (`dial_report.rate`, as the dial's rows write them)."""
    return listing([dial_report.rate(x) for x in sorted(lrs)])
