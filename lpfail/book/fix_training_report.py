"""Chapter 5's Fix-b section: the `fix_training` result as tables and sentences (no hand-typed numbers).

Per learning rate the chapter says where each fix closes A's gap to C, where it turns non-finite and where
none helps. That per-lr reading is descriptive (after the runs); the verdict is the pre-registered rule
(`lpfail.experiments.fix_training.FIX_RULE`), printed beside it.

Per-lr classes (`per_lr`), with X − C and A − C the mean over seeds of the effective held-out loss
(`lpfail.sweep.stats.effective_loss`) and 95 % paired bootstrap intervals over seeds (lr_sweep's resamples):

============== ===========================================================================================
non-finite     at least one of X's runs turned non-finite at this lr (whether or not A − C has a gap there)
no gap         A − C's interval does not lie above 0: nothing to close at this lr
closed         X − C's interval does not lie above 0 (X is as good as C)
partly         X − C lies above 0, X − A lies below 0
no help        X − C lies above 0 and X − A does not lie below 0
============== ===========================================================================================
"""
from __future__ import annotations

import html
from collections.abc import Mapping

import numpy as np

from lpfail import sweep
from lpfail.book.costs import html_table
from lpfail.book.text import interval
from lpfail.experiments import lr_sweep as L
from lpfail.experiments.fix_training import FIXES, FixTrainingConfig, fix_training_grid

LABELS = {"B": "B (official fix)", "Bp": "B′ (Algorithm 3, no clamp)", "R": "R (robust fix)"}
CLASSES = ("non-finite", "no gap", "closed", "partly", "no help")


def _stat(d: np.ndarray, idx: np.ndarray) -> dict:
    """Mean over seeds of d (seeds,) with its bootstrap interval over the shared resamples."""
    return {"point": float(d.mean()), "ci": list(sweep.stats.interval(d[idx].mean(axis=-1)))}


def per_lr(res: Mapping, size: str = "small") -> list[dict]:
    """One row per learning rate: A − C, and per fix X − C, X − A, its non-finite runs (count, steps) and class."""
    variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
    for v in ("A", "C"):
        if v not in variants:
            raise KeyError(f"fix_training: variant {v!r} missing from {variants}")
    stored = np.asarray(res[f"{size}_stored"], dtype=bool)
    if not stored.all():
        raise sweep.SweepIncomplete(f"fix_training: {int((~stored).sum())} runs not stored; collect them first")
    eff = sweep.stats.effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])    # (V, lrs, seeds)
    status = np.asarray(res[f"{size}_status"])
    nf_step = np.asarray(res[f"{size}_nonfinite_step"], dtype=np.float64)
    idx = sweep.stats.bootstrap_seed_indices(eff.shape[-1])
    a, c = eff[variants.index("A")], eff[variants.index("C")]
    rows = []
    for j, lr in enumerate(np.asarray(res["lrs"], dtype=np.float64)):
        gap = _stat(a[j] - c[j], idx)
        row = {"lr": float(lr), "a_minus_c": gap, "gap": gap["ci"][0] > 0, "fixes": {}}
        for x in FIXES:
            if x not in variants:
                continue
            i = variants.index(x)
            xc, xa = _stat(eff[i, j] - c[j], idx), _stat(eff[i, j] - a[j], idx)
            bad = status[i, j] != 0
            steps = [int(s) for s in nf_step[i, j][bad] if np.isfinite(s)]
            if bad.any():
                cls = "non-finite"
            elif not row["gap"]:
                cls = "no gap"
            elif xc["ci"][0] <= 0:
                cls = "closed"
            elif xa["ci"][1] < 0:
                cls = "partly"
            else:
                cls = "no help"
            row["fixes"][x] = {"minus_c": xc, "minus_a": xa, "nonfinite": int(bad.sum()), "runs": int(bad.size),
                               "steps": steps, "class": cls}
        rows.append(row)
    return rows


def _lr(x: float) -> str:
    return f"{x:.3g}"


def per_lr_table(res: Mapping) -> str:
    """HTML: per lr, A − C and each fix's X − C [95 % CI], its non-finite runs and its class."""
    rows = per_lr(res)
    fixes = list(rows[0]["fixes"])
    out = []
    for r in rows:
        cells = [_lr(r["lr"]), interval(r["a_minus_c"])]
        for x in fixes:
            f = r["fixes"][x]
            if f["nonfinite"]:
                st = f"{min(f['steps'])}–{max(f['steps'])}" if f["steps"] else "?"
                txt = f"non-finite in {f['nonfinite']} of {f['runs']} (steps {st})"
            else:
                txt = interval(f["minus_c"])
            cells.append(f"{html.escape(txt)}<br><b>{html.escape(f['class'])}</b>")
        out.append(cells)
    head = ["lr", "A − C [95 % CI]"] + [f"{html.escape(LABELS[x])}: X − C" for x in fixes]
    return html_table(head, out, escape=False)


def verdict_table(res: Mapping) -> str:
    """HTML: per fix, S(X) [CI], the pre-registered statistic S(X) − S(C) − ½(S(A) − S(C)) [CI] and its word,
    S(X) − S(C) [CI] and its word, and the share of the gap closed [CI] (descriptive)."""
    a = res["fix_analysis"]
    closed = {r["variant"]: r["closed"] for r in L.versus_control(res, "small")}
    out = []
    for v in ("A", "C"):
        s = a["S"][v]
        out.append([v, interval({"point": s["S"], "ci": s["ci"]}), "", "", ""])
    for x, f in a["fixes"].items():
        s = a["S"][x]
        h, al = f["closes_half"], f["closes_all"]
        # a non-finite run counts at its initial loss in S (the rule's choice), so a share of the gap is no
        # measure of closing it there: say why instead of printing a share of several thousand per cent
        nonfinite = sum(int(r["nonfinite"]) for r in f["finite"])
        share = (f"— ({nonfinite} runs non-finite)" if nonfinite
                 else interval(closed.get(x), ".0f", scale=100) + " %")
        out.append([html.escape(LABELS.get(x, x)), interval({"point": s["S"], "ci": s["ci"]}),
                    f"{interval(h)} → <b>{html.escape(h['verdict'])}</b>",
                    f"{interval(al)} → {html.escape(al['verdict'])}", share])
    return html_table(["", "LR sensitivity S [95 % CI]", "S(X) − S(C) − ½ gap [95 % CI] (rule)",
                       "S(X) − S(C) [95 % CI]", "share of the gap closed [95 % CI]"], out, escape=False)


def where(res: Mapping) -> dict[str, str]:
    """Sentences for the chapter: per fix the learning rates of each class, and where no fix helps."""
    rows = per_lr(res)
    out = {}
    for x in rows[0]["fixes"]:
        parts = []
        for cls in CLASSES:
            if cls == "no gap":
                continue
            lrs = [_lr(r["lr"]) for r in rows if r["fixes"][x]["class"] == cls]
            if lrs:
                parts.append(f"{cls} at lr {', '.join(lrs)}")
        out[x] = "; ".join(parts) or "nothing to close at any lr"
    gaps = [r for r in rows if r["gap"]]
    out["gap_lrs"] = ", ".join(_lr(r["lr"]) for r in gaps) or "none"
    none = [_lr(r["lr"]) for r in gaps if not any(f["class"] in ("closed", "partly") for f in r["fixes"].values())]
    out["none_helps"] = ", ".join(none) or "none"
    return out


def part_lines(directory=None) -> list[str]:
    """Where the result's runs come from: one line per part file that holds runs of `fix_training`'s grid —
    when (UTC), on what, from which commit, and how many runs of each variant (read from the part files, as
    ``collect`` does)."""
    lk = sweep.lookup(fix_training_grid(FixTrainingConfig()), directory)
    have = lk.have
    out = []
    for m in lk.parts:
        used = [k for k in m["keys"] if k in have]
        if not used:
            continue
        per: dict[str, int] = {}
        for k in used:
            v = k.split("/")[1]
            per[v] = per.get(v, 0) + 1
        out.append(f"{str(m['created'])[:16].replace('T', ' ')} UTC, {m['device']}, git {str(m['git'])[:7]}: "
                   + ", ".join(f"{v} × {n}" for v, n in per.items()))
    return out
