"""The precision dial on the book's pages (chapter 1's last section, the first page's thesis): what the
pre-registered test of "bias, not noise" (`lpfail.experiments.dial_training`) has stored so far, and what stochastic
rounding at BF16's own precision could and could not say before it.

Every sentence is generated from stored results (``confirmation``, ``sr_confound``, ``dial_training``); a result
that is missing makes its sentence say so.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from lpfail.book.text import listing
from lpfail.book.verdict import _load_or_none


def sr_ten_seeds(conf: Mapping | None) -> str:
    """Stochastic rounding's half-gap statistic on the confirmation grid's ten seeds, with its call (H2)."""
    if conf is None:
        return "not yet measured on ten seeds"
    h = (conf["analysis"].get("claims") or {}).get("H2") or {}
    if h.get("estimate") is None:
        return "not yet measured on ten seeds"
    lo, hi = h["ci"]
    return (f"(S(A_sr) − S(C)) − ½·(S(A) − S(C)) = {h['estimate']:+.3f} [{lo:+.3f}, {hi:+.3f}] on {h['n']} paired "
            f"seeds, Holm-adjusted p {h['p_adjusted']:.2g}: {h['verdict']}")


def sr_noise(sr: Mapping | None) -> str:
    """How much stochastic rounding raises O's RMS error on chapter 4's tied rows (``sr_confound``)."""
    if sr is None:
        return "an amount not yet measured"
    return f"{100 * (float(sr['rows_A_sr_rms']) / float(sr['rows_A_rms']) - 1):.0f} %"


def status(dial: Mapping | None) -> str:
    """Where the dial's grid stands: nothing stored; the runs stored so far (by seed, rate and card), nothing judged
    until every arm has its ten seeds; or, complete, its families' calls."""
    if dial is None:
        return "No run of the dial is stored yet."
    stored, planned = int(dial["runs_stored"]), int(dial["runs_planned"])
    if dial.get("complete", False):
        calls = dial["analysis"].get("calls") or {}
        words = {f: sorted({r["verdict"] for r in fam.values() if isinstance(r, dict) and "verdict" in r})
                 for f, fam in calls.items()}
        return "All its runs are stored: " + "; ".join(f"{f} {listing(w)}" for f, w in words.items()) + "."
    vs = [str(v) for v in np.asarray(dial["small_variants"])]
    have = np.asarray(dial["small_stored"], dtype=bool)  # (variants, lrs, seeds)
    lrs, seeds = [float(x) for x in dial["small_lrs"]], [int(s) for s in dial["small_seeds"]]
    cells = sorted({(lrs[j], seeds[k]) for i, j, k in zip(*np.nonzero(have))})
    where = listing([f"seed {s} at {lr:g}" for lr, s in cells]) or "none of the 1,000-step points"
    arms = listing([vs[i] for i in sorted(set(np.nonzero(have)[0]))]) or "no arm"
    devices = listing(sorted({str(p.get("device")) for p in dial.get("parts") or []})) or "no card"
    days = sorted({str(p.get("created"))[:10] for p in dial.get("parts") or []})
    return (f"So far {stored} of its {planned} runs are stored ({arms}; {where}; {devices}, {listing(days)}): "
            "nothing is judged until every arm has its ten seeds.")


def facts(load: Callable | None = None) -> dict[str, str]:
    """The glued values of chapter 1's dial section."""
    from lpfail import results

    load = load or results.load
    return {"sr_ten": sr_ten_seeds(_load_or_none(load, "confirmation")),
            "sr_noise": sr_noise(_load_or_none(load, "sr_confound")),
            "dial_status": status(_load_or_none(load, "dial_training"))}


def preregistration_markdown() -> str:
    """The dial's pre-registration as it is in code (`lpfail.experiments.dial_training`): the date, what had been
    seen, each hypothesis with its family, the rule, and the predictions written beside it (MyST Markdown)."""
    from lpfail.experiments import dial_training as D

    hyps = "\n".join(f"- **{h}** — {text}" + (f" *Family:* {D.FAMILIES[h]}." if h in D.FAMILIES else "")
                     for h, text in D.HYPOTHESES.items())
    preds = "\n".join(f"- **{h}:** {text}" for h, text in D.PREDICTIONS.items())
    return (f"Fixed in code on {D.PREREGISTERED_ON}, before any run of the grid. *Seen then:* {D.SEEN}\n\n"
            f"{hyps}\n\n*The rule.* {D.RULE}\n\n*Predictions written with the rule (not part of it):*\n\n{preds}")
