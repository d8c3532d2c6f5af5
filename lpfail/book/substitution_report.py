"""Tables and figures of chapter 2 ("Substitution"), from `lpfail.experiments.substitution` and the stored
`lr_sweep` / `substitution` results."""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import torch

from lpfail import results
from lpfail.attention import attention
from lpfail.book import plots, training_claims
from lpfail.book.text import breakable, interval, listing, md_table
from lpfail.experiments import substitution as sub
from lpfail.book.verdict import (CONTRADICTED, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED, Verdict, as_float,
                                load_or_none, provenance_line, pending)
from lpfail.book.verdict import stat_text as _stat_text
from lpfail.precision import Precision

ROWS_HEADER = ["row", "change from A", "group", "learning rates", "the paper's finding"]


def _change(r: sub.Row) -> str:
    if r.kind == "policy":
        return f"<code>{breakable(r.changes)}</code>"
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
            d = _stat(analysis, r.name, lr)
            cells.append(_cell(d))
        cells.append(r.paper)
        out.append(cells)
    return out


def _stat(analysis: Mapping | None, name: str, lr: float) -> Mapping | None:
    """The rule's statistic of row ``name`` at ``lr`` in a substitution analysis, or None (not run, not stored)."""
    return (analysis or {}).get("rows", {}).get(name, {}).get("by_lr", {}).get(f"{lr:g}")


def _cell(d: Mapping | None, pending: str = "pending (GPU)") -> str:
    if d is None:
        return pending
    if d.get("ci") is None:
        return d["verdict"]
    fr = d.get("fraction_closed")
    return (f"<b>{d['verdict']}</b><br>{interval(d)}"
            + (f"<br>{fr * 100:.0f} % closed" if fr is not None else ""))


# -- the amendment of 2026-12-01 (sub.AMENDED_ROWS; experiment substitution_amendment) --------------------------------
def amendment_state(directory=None) -> dict:
    """Where the amendment stands: {"state": the stored result's state ('fresh', 'missing', ...), "analysis":
    its analysis or None, "stored": {row: {lr: runs stored}}, "n_stored", "n_runs"} (its own runs, without
    the baselines), from the part files and the results cache."""
    c = sub.AmendmentConfig()
    state, res = results.inspect("substitution_amendment", directory)
    have, missing = sub.stored_for(c, directory, baselines=False)
    stored = {r: {f"{lr:g}": sum(sub.Point(r, lr, s).key in have for s in c.seeds) for lr in c.lrs} for r in c.rows}
    return {"state": state, "analysis": res["analysis"] if state == "fresh" else None, "stored": stored,
            "n_stored": len(have), "n_runs": len(have) + len(missing), "provenance": res.provenance if res else None,
            "n_completed": sum(r.get("status") == "completed" for r in have.values()),
            "meta": res["parts"][0] if state == "fresh" and res["parts"] else None}


def amendment_outcome(analysis: Mapping, c: sub.AmendmentConfig | None = None) -> dict[str, dict[str, str]]:
    """{row: {lr: "verdict (N % of the gap closed, statistic [95 % CI])"}} of the amended rows, for the prose;
    a missing statistic reads "pending (GPU)"."""
    c = c or sub.AmendmentConfig()
    out: dict = {}
    for r in c.row_objects():
        for lr in c.lrs:
            d = _stat(analysis, r.name, lr)
            if d is None:
                txt = "pending (GPU)"
            elif d.get("ci") is None:
                txt = d["verdict"]
            else:
                fr = d.get("fraction_closed")
                txt = (f"{d['verdict']} ({'' if fr is None else f'{fr * 100:.0f} % of the gap closed, '}"
                       f"{interval(d)})")
            out.setdefault(r.name, {})[f"{lr:g}"] = txt
    return out


def amendment_header(c: sub.AmendmentConfig | None = None) -> list[str]:
    c = c or sub.AmendmentConfig()
    return (["amended row", "change from A", "amends"]
            + [f"lr {lr:g}: verdict, (L_row − L_C) − ½(L_A − L_C) [95 % CI]" for lr in c.lrs])


def amendment_rows(state: Mapping, c: sub.AmendmentConfig | None = None) -> list[list[str]]:
    """One line per amended row: its change, the row it amends, and at each learning rate its verdict by the
    same rule, or "pending (GPU): k of n runs stored" while its stored result is missing."""
    c = c or sub.AmendmentConfig()
    out = []
    for r in c.row_objects():
        cells = [f"{r.name}: {r.label}", f"<code>{breakable(r.changes)}</code>", r.amends]
        for lr in c.lrs:
            d = _stat(state.get("analysis"), r.name, lr)
            k = state["stored"][r.name][f"{lr:g}"]
            cells.append(_cell(d, f"pending (GPU): {k} of {len(c.seeds)} runs stored"))
        out.append(cells)
    return out


def amendment_lines(state: Mapping, c: sub.AmendmentConfig | None = None) -> list[str]:
    """The amendment in words for a text cell: when and why, each row with its change, its state, and the
    prediction written with it."""
    c = c or sub.AmendmentConfig()
    out = [f"Amendment of {c.amended_on}, written after the grid's GPU run and before any run of its rows. "
           f"{sub.AMENDMENT_WHY}",
           f"Runs stored: {state['n_stored']} of {state['n_runs']}; result: "
           + ("stored" if state["state"] == "fresh" else f"{state['state']} (pending, GPU)") + "."]
    for r in c.row_objects():
        out.append(f"{r.name} (amends {r.amends}): PAPER_BF16,{r.changes}. Prediction: "
                   f"{sub.AMENDMENT_PREDICTIONS[r.name]}.")
    return out


def results_header(c: sub.SubstitutionConfig | None = None) -> list[str]:
    c = c or sub.SubstitutionConfig()
    return ["row"] + [f"lr {lr:g}: verdict, (L_row − L_C) − ½(L_A − L_C) [95 % CI]" for lr in c.lrs] + ["paper"]


def wq_figure(lr_res, lr: float = 3.2e-2, seed: int = 0):
    """The paper's Fig. 3 from lr_sweep's stored diagnostics: ‖W_Q^h‖ per head against the step, one panel per
    layer, A (solid) and C (dashed), at one learning rate and seed of the smaller size."""
    variants = [str(v) for v in np.asarray(lr_res["small_variants"])]
    lrs = [float(x) for x in np.asarray(lr_res["lrs"])]
    seeds = [int(s) for s in np.asarray(lr_res["seeds"])]
    wq = np.asarray(lr_res["small_wq"], dtype=np.float64)  # (V, L, S, n_diag, layer, head)
    steps = np.asarray(lr_res["diag_step"])
    n_layer, n_head = wq.shape[-2], wq.shape[-1]

    fig, axes = plt.subplots(1, n_layer, figsize=(3.0 * n_layer, 3.1))
    for layer, ax in enumerate(np.atleast_1d(axes)):
        for name in ("A", "C"):
            y = wq[variants.index(name), lrs.index(lr), seeds.index(seed), :, layer]  # (n_diag, head)
            for h in range(n_head):
                ax.plot(steps, y[:, h], color=plots.color(name), lw=1.1, alpha=0.85,
                        label=(plots.LETTER[name] + ", each head") if (layer == 0 and h == 0) else None)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("step")
        ax.set_ylabel("‖W_Q^h‖ (spectral)")
    np.atleast_1d(axes)[0].legend()
    fig.tight_layout()
    return fig


# -- the GPU run's replay (results/substitution_gpu/replay.json) ------------------------------------------------
REPLAY_HEADER = ["branch from the checkpoint", "first step that differs from the record", "steps trained",
                 "mean training loss, first 100 steps", "mean training loss, last 100 steps",
                 "last 100 steps − the record's"]


def load_replay(directory=None) -> dict | None:
    """The stored replay of `tools/gpu_batch.sh ge-extras` (None when absent)."""
    p = (directory or results.results_dir()) / "substitution_gpu" / "replay.json"
    return json.loads(p.read_text()) if p.is_file() else None


def replay_provenance(directory=None) -> dict | None:
    """Device, tree and date of the stored replay: its own "provenance" when it has one, else that of
    results/substitution_gpu/accumulation.json, which `tools/gpu_batch.sh ge-extras` writes in the same
    call right after the replay (the stored replay.json has none); None
    when neither says."""
    rep = load_replay(directory)
    if rep and isinstance(rep.get("provenance"), Mapping):
        return dict(rep["provenance"])
    p = (directory or results.results_dir()) / "substitution_gpu" / "accumulation.json"
    if p.is_file():
        prov = json.loads(p.read_text()).get("provenance")
        return dict(prov, source="accumulation.json (same call)") if prov else None
    return None


def _branches(rep: Mapping) -> dict:
    if not isinstance(rep, Mapping) or "replay" not in rep or "step" not in rep:
        raise ValueError("replay: not a replay_branch result (no 'replay' or 'step')")
    return {n: d for n, d in rep.items() if isinstance(d, Mapping) and "first_diff" in d}


def replay_summary(rep: Mapping, last: int = 100) -> dict:
    """The replay's window in numbers: its first and last step, the recorded run's mean training loss over the
    window's first and last `last` steps, and per branch its first differing step, the same two means, the
    difference of its last-`last` mean from the record's (negative: the branch's loss stays below A's), or
    the step of its first non-finite loss. "below": the branches whose difference is < 0."""
    br = _branches(rep)
    step = int(rep["step"])
    base = np.asarray(rep["replay"]["losses"], dtype=np.float64)
    if len(base) < 2 * last or not np.isfinite(base).all():
        raise ValueError(f"replay_summary: the replay needs >= {2 * last} finite losses (got {len(base)})")
    ref_first, ref_last = float(base[:last].mean()), float(base[-last:].mean())
    out = {"start": step, "end": step + len(base), "last": last, "equal": bool(rep["replay"]["equal"]),
           "record_first": ref_first, "record_last": ref_last, "branches": {}}
    for name, d in br.items():
        x = np.asarray(d["losses"], dtype=np.float64)
        bad = np.nonzero(~np.isfinite(x))[0]
        e = {"first_diff": d["first_diff"], "steps": len(x)}
        if bad.size or len(x) < len(base):
            e["nonfinite_step"] = step + (int(bad[0]) if bad.size else len(x))
        else:
            e.update(first=float(x[:last].mean()), last_mean=float(x[-last:].mean()),
                     diff=float(x[-last:].mean() - ref_last))
        out["branches"][name] = e
    out["below"] = [n for n, e in out["branches"].items() if e.get("diff", 0.0) < 0]
    diffs = [e["diff"] for e in out["branches"].values() if "diff" in e]
    out["diff_range"] = (min(diffs), max(diffs)) if diffs else None
    return out


def replay_rows(rep: Mapping, last: int = 100) -> list[list[str]]:
    """One line for the replay and one per branch: where it leaves the record, how far it trained (a branch
    stops at its first non-finite loss), its mean loss over the window's first and last `last` steps, and the
    last mean's difference from the record's."""
    by = {r.name: r for r in sub.ALL_ROWS}
    sm = replay_summary(rep, last)
    rows = [["replay (no change)", "none: bit-exact" if sm["equal"] else "DIFFERS",
             str(len(rep["replay"]["losses"])), f"{sm['record_first']:.4f}", f"{sm['record_last']:.4f}", "0"]]
    for name, e in sm["branches"].items():
        label = by[name].label if name in by else name
        where = "never" if e["first_diff"] is None else str(e["first_diff"])
        if "nonfinite_step" in e:
            rows.append([f"{name}: {label}", where, str(e["steps"]), "—", f"non-finite at step {e['nonfinite_step']}",
                         "—"])
        else:
            rows.append([f"{name}: {label}", where, str(e["steps"]), f"{e['first']:.4f}", f"{e['last_mean']:.4f}",
                         f"{e['diff']:+.4f}"])
    return rows


def replay_figure(rep: Mapping, smooth: int = 20, departure: tuple[int, int] | None = None):
    """Top: training loss of the replay (= the recorded run) and of each branch from the checkpoint (running mean
    over `smooth` steps). Bottom: each branch's difference from the record (same running mean). Grey: the
    interval between the held-out evaluations where A's loss leaves C's (`departure`), when given."""
    br = _branches(rep)
    step = int(rep["step"])

    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(4.9, 5.4), sharex=True, height_ratios=(3, 2))
    kern = np.ones(smooth) / smooth
    base = np.asarray(rep["replay"]["losses"], dtype=np.float64)
    yb = np.convolve(base, kern, mode="valid")
    xs = step + smooth - 1 + np.arange(len(yb))
    ax0.plot(xs, yb, lw=2.2, color=plots.color("A"), label="the record (A)")
    shown = [(n, d) for n, d in br.items()
             if len(d["losses"]) == len(base) and np.isfinite(np.asarray(d["losses"], dtype=np.float64)).all()]
    for (name, d), c in zip(shown, plots.series_colors(len(shown))):
        y = np.convolve(np.asarray(d["losses"], dtype=np.float64), kern, mode="valid")
        ax0.plot(xs, y, lw=1.0, color=c, label=name)
        ax1.plot(xs, y - yb, lw=1.0, color=c)
    ax1.axhline(0, color=plots.color("A"), lw=1.2)
    for ax in (ax0, ax1):
        if departure:
            ax.axvspan(*departure, color="0.9", lw=0, zorder=0)
    ax0.set_ylabel(f"training loss (mean of {smooth})")
    ax1.set_ylabel("branch − record")
    ax1.set_xlabel("step")
    ax0.legend(ncol=2)
    fig.tight_layout()
    return fig


def heldout(have: Mapping, steps, lr: float = 3.2e-2, seed: int = 0) -> dict[str, list[float | None]]:
    """lr_sweep's held-out losses of A and C at (lr, seed) at the given evaluation steps (None where not
    evaluated; a missing run raises KeyError)."""
    out = {}
    for v in ("A", "C"):
        r = have[sub.Point(v, lr, seed).key]
        at = dict(zip(list(r["val_step"]), list(r["val_loss"])))
        out[v] = [float(at[s]) if s in at else None for s in steps]
    return out


# -- why the FP32-score rows broke: a BF16 max (or stored m) under FP32 scores -------------------------------------
#: A, the grid's two broken FP32-score rows, the amendment's two rows, D (from the rows' definitions).
OVERFLOW_POLICIES = (("PAPER_BF16",)
                     + tuple(f"PAPER_BF16,{sub.row_by_name(n).changes}"
                             for n in ("scores", "score_path", "score_path_l", "scores_l"))
                     + ("FA2_BF16",))


def overflow_check(scale: float = 100.0, policies=OVERFLOW_POLICIES, seed: int = 0) -> list[tuple[str, float, list]]:
    """Forward and backward of one causal attention (2 heads, T = 256, D = 64) on BF16 q, k of standard deviation
    `scale` (largest |S| in the tens of thousands at 100, as in the GPU runs of the score rows), per policy:
    (policy, largest |S|, [O, dQ, dK, dV all finite])."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.randn(1, 2, 256, 64, generator=g) * s) for s in (scale, scale, 1.0))
    smax = float((q @ k.transpose(-1, -2) / 8).abs().max())
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    do = (torch.randn(1, 2, 256, 64, generator=g) * 1e-2).to(torch.bfloat16)
    out = []
    for pol in policies:
        q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
        o = attention(q_, k_, v_, Precision.parse(pol))
        o.backward(do)
        out.append((pol, smax, [bool(torch.isfinite(t).all()) for t in (o, q_.grad, k_.grad, v_.grad)]))
    return out


def outcome_lines(analysis: Mapping, c: sub.SubstitutionConfig | None = None) -> list[str]:
    """The closing note: each row's verdict with its interval at each learning rate, in the paper's order."""
    c = c or sub.SubstitutionConfig()
    out = []
    for r in paper_order(c.row_objects()):
        parts = []
        for lr in c.lrs:
            d = _stat(analysis, r.name, lr)
            if lr not in r.lrs:
                continue
            if d is None or d.get("ci") is None:
                parts.append(f"lr {lr:g}: {d['verdict'] if d else 'pending (GPU)'}")
            else:
                parts.append(f"lr {lr:g}: {d['verdict']}, {interval(d)}")
        out.append(f"{r.name}: " + "; ".join(parts))
    return out


def verdict_counts(analysis: Mapping) -> dict[str, dict[str, list[str]]]:
    """{lr: {verdict: [row names]}} over the stored rows."""
    out: dict = {}
    for name, r in analysis.get("rows", {}).items():
        for lr, d in r["by_lr"].items():
            out.setdefault(lr, {}).setdefault(d["verdict"], []).append(name)
    return out


def replay_run_matches(have: Mapping, directory=None) -> bool | None:
    """Whether the GPU call's retrained A (lr 3.2e-2, seed 0, with checkpoints; results/substitution_gpu/
    a_val.jsonl) has exactly the held-out losses of lr_sweep's stored run of A there (None when absent)."""
    p = (directory or results.results_dir()) / "substitution_gpu" / "a_val.jsonl"
    ref = have.get(sub.Point("A", sub.LRS[-1], sub.SEEDS[0]).key)
    if not p.is_file() or ref is None:
        return None
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return ([r["step"] for r in rows] == list(ref["val_step"])
            and [r["val_loss"] for r in rows] == list(ref["val_loss"]))


def departure(have: Mapping, lr: float = 3.2e-2, seed: int = 0) -> tuple[int, int] | None:
    """Where A's held-out loss leaves C's in lr_sweep's runs at (lr, seed): (the last evaluation step at which
    A's loss is ≤ C's, the next evaluation step), after which A stays above C at every evaluation; None when A
    never stays above C (or a run is missing)."""
    a, c = have.get(sub.Point("A", lr, seed).key), have.get(sub.Point("C", lr, seed).key)
    if a is None or c is None or list(a["val_step"]) != list(c["val_step"]):
        return None
    steps = list(a["val_step"])
    above = [x > y for x, y in zip(a["val_loss"], c["val_loss"])]
    if not above or not above[-1]:
        return None
    i = len(above) - 1
    while i > 0 and above[i - 1]:
        i -= 1
    return (steps[i - 1], steps[i]) if i > 0 else None


# -- chapter 2's claims (C1a–c), by the pre-registered substitution rule ---------------------------------------
#: The words of `lpfail.experiments.substitution.judge_row`, per row and learning rate.
CLOSES, OPEN, UNSURE, NO_GAP = "closes the gap", "does not close it", "inconclusive", "no gap to close"

SUB_RULE = ("pre-registered in lpfail.experiments.substitution (2026-12-01): at each learning rate a row closes the "
            "A − C gap when the 95 % bootstrap interval (seeds, paired) of (L_row − L_C) − ½·(L_A − L_C) lies below "
            "0, does not close it when above, else inconclusive; no A − C gap there → no gap to close")

def _row_words(a: Mapping, name: str) -> dict[str, str]:
    """{lr: verdict word} of one substitution row ({} when the row is not in the result)."""
    r = a.get("rows", {}).get(name)
    return {lr: d["verdict"] for lr, d in r["by_lr"].items()} if r else {}

def _row_text(a: Mapping, name: str) -> str:
    r = a.get("rows", {}).get(name)
    if not r:
        return f"{name}: not in the result"
    parts = []
    for lr, d in r["by_lr"].items():
        if d.get("ci") is None:
            parts.append(f"lr {lr}: {d['verdict']}")
            continue
        fr = d.get("fraction_closed")
        parts.append(f"lr {lr}: **{d['verdict']}** ({_stat_text(d)}" + (f", {fr * 100:.0f} % closed" if fr is not None else "")
                     + ")")
    return f"{r['label']} — " + "; ".join(parts)

def _gaps(a: Mapping) -> dict[str, bool]:
    """{lr: whether A − C is significantly positive there}, from any row's stored gap."""
    out = {}
    for r in a.get("rows", {}).values():
        for lr, d in r["by_lr"].items():
            if d.get("gap") is not None:
                out[lr] = as_float(d["gap"]["ci"][0]) > 0
    return out

def _ten_seed_gaps(conf: Mapping | None, lrs) -> dict[str, Mapping]:
    """The confirmation grid's A − C cells at 4 × 256 (ten paired seeds, Holm within the size's family) at the
    learning rates ``lrs`` ({"0.016": cell}); empty without that grid."""
    if conf is None:
        return {}
    cells = (((conf["analysis"].get("sizes") or {}).get("small") or {}).get("cells") or {})
    return {lr: cells[f"lr={float(lr):g}"] for lr in lrs if f"lr={float(lr):g}" in cells}


def judge_one_tile(res: Mapping, conf: Mapping | None = None) -> Verdict:
    """C1a. In our setting one tile per row *is* A (T = 256 fits A's 512 × 512 tile; `SAME_AS_A`, checked bit for
    bit), so the claim "one tile per row still fails" holds exactly when the A − C gap is called at a substitution
    learning rate. Where the confirmation grid ``conf`` has those rates, its ten-seed calls decide (supported at
    some rate → reproduced, refuted at every rate → contradicted, else not reproduced); without it, the
    substitution grid's three-seed intervals do. FA2's smaller tiles (row tiles_fa2) are reported beside it."""
    a = res["analysis"]
    gaps = _gaps(a)
    ten = _ten_seed_gaps(conf, gaps)
    if ten:
        called = [lr for lr, c in ten.items() if c["verdict"] == "supported"]
        order = sorted(ten, key=lambda lr: ten[lr]["verdict"] != "supported")  # the called rates first
        cells = " and ".join(f"{ten[lr]['verdict']} at {float(lr):g} ({ten[lr]['estimate']:+.3f} "
                             f"[{ten[lr]['ci'][0]:+.3f}, {ten[lr]['ci'][1]:+.3f}], Holm p {ten[lr]['p_adjusted']:.2g})"
                             for lr in order)
        n = next(iter(ten.values()))["n"]
        if called:
            v = REPRODUCED
        elif all(c["verdict"] == "refuted" for c in ten.values()):
            v = CONTRADICTED
        else:
            v = NOT_REPRODUCED
        plain = (f"One tile per row is A itself here, and on {n} paired seeds the A − C gap in final held-out loss "
                 f"is {cells}.")
        ev = f"{plain} Beside it: {_row_text(a, 'tiles_fa2')}. See {{doc}}`02_substitution`; {provenance_line(conf)}."
        return Verdict("C1a", "Tiling is not the cause: one tile per row (block = sequence length) still fails.", v,
                       ev, "one tile per row = A at T = 256 (bit for bit): reproduced when the A − C gap is called "
                       "(supported) at a substitution learning rate on the confirmation grid's ten paired seeds "
                       "(paired t test on the fresh seeds, Holm within the size's family)",
                       "Our sequences (256) fit in one of A's 512-key tiles, so every run of A is already one tile "
                       "per row; the failure is the proxy's loss gap, not a loss explosion.", seeds=int(n))
    if not gaps:
        v, plain = NOT_TESTED, "No A − C gap is stored yet."
    elif any(gaps.values()):
        v, plain = REPRODUCED, ("One tile per row is A itself here, and A − C is significantly positive at lr "
                                + ", ".join(lr for lr, g in gaps.items() if g) + ".")
    else:
        v, plain = NOT_REPRODUCED, "A − C is not significantly positive at any substitution learning rate."
    ev = f"{plain} Beside it: {_row_text(a, 'tiles_fa2')}. See {{doc}}`02_substitution`; {provenance_line(res)}."
    return Verdict("C1a", "Tiling is not the cause: one tile per row (block = sequence length) still fails.", v, ev,
                   "one tile per row = A at T = 256 (bit for bit): reproduced when the A − C interval lies above 0 "
                   "at some learning rate; " + SUB_RULE,
                   "Our sequences (256) fit in one of A's 512-key tiles, so every run of A is already one tile per "
                   "row; the failure is the lr_sweep proxy's loss gap, not a loss explosion.")

def judge_one_layer(res: Mapping) -> Verdict:
    """C1b, at the largest learning rate: reproduced when for some layer ℓ, PAPER_BF16 in ℓ alone does not close
    the gap and FP32 in ℓ alone closes it; partly when one of the two holds for some layer; contradicted when no
    layer's FP32 closes it and every layer's PAPER_BF16 alone closes it (no single layer carries it); else not
    reproduced. Rows with no gap → not yet tested."""
    a = res["analysis"]
    layers = sorted({int(n[5:-2]) for n in a.get("rows", {}) if n.startswith("layer")})
    words = {(l_, k): _row_words(a, f"layer{l_}_{k}") for l_ in layers for k in ("a", "c")}
    flat = [w for d in words.values() for w in d.values()]
    if not layers or not flat or all(w in (NO_GAP,) or w.startswith("not measured") for w in flat):
        v = NOT_TESTED
    else:
        both = [l_ for l_ in layers if OPEN in words[(l_, "a")].values() and CLOSES in words[(l_, "c")].values()]
        one = [l_ for l_ in layers if OPEN in words[(l_, "a")].values() or CLOSES in words[(l_, "c")].values()]
        if both:
            v = REPRODUCED
        elif one:
            v = PARTLY
        elif all(OPEN in words[(l_, "c")].values() and CLOSES in words[(l_, "a")].values() for l_ in layers):
            v = CONTRADICTED
        else:
            v = NOT_REPRODUCED
    ev = ("; ".join(_row_text(a, f"layer{l_}_{k}") for k in ("a", "c") for l_ in layers)
          + f". See {{doc}}`02_substitution`; {provenance_line(res)}.")
    return Verdict("C1b", "One layer causes it: flash attention in the second attention layer alone fails; standard "
                          "attention in that layer alone is stable.", v, ev,
                   "reproduced: some layer ℓ where PAPER_BF16 in ℓ alone does not close the gap and FP32 in ℓ alone "
                   "closes it; partly: one of the two; contradicted: no layer's FP32 closes it and every layer's "
                   "PAPER_BF16 alone does; " + SUB_RULE,
                   "4 layers, not 12; FP32 flash attention (C's arithmetic) stands in for standard attention; the "
                   "layer is whichever one the rows point to, not necessarily index 1.")

C1C_ROWS = ("delta_dPP", "delta_hp", "out", "obar")

def judge_through_delta(res: Mapping) -> Verdict:
    """C1c: each of δ = rowsum(dP ∘ P), O recomputed in FP32 for δ, O in FP32, only Ō = P̄V in FP32 closes the gap.
    Reproduced when all four close it at every learning rate with a gap; partly when at least one closes it
    somewhere; contradicted when all four do not close it at every learning rate with a gap; else not reproduced."""
    a = res["analysis"]
    words = {n: {lr: w for lr, w in _row_words(a, n).items() if w != NO_GAP} for n in C1C_ROWS}
    flat = [w for d in words.values() for w in d.values()]
    if not flat or any(w.startswith("not measured") for w in flat):
        v = NOT_TESTED
    elif all(w == CLOSES for w in flat):
        v = REPRODUCED
    elif CLOSES in flat:
        v = PARTLY
    elif all(w == OPEN for w in flat):
        v = CONTRADICTED
    else:
        v = NOT_REPRODUCED
    ev = "; ".join(_row_text(a, n) for n in C1C_ROWS) + f". See {{doc}}`02_substitution`; {provenance_line(res)}."
    return Verdict("C1c", "It runs through δ: δ = rowsum(dP ∘ P), or O in FP32 (forward, or recomputed for δ, or "
                          "only Ō = P̄V), is stable.", v, ev,
                   "reproduced: all four rows close the gap wherever there is one; partly: at least one does "
                   "somewhere; contradicted: none does anywhere; " + SUB_RULE,
                   "The lr_sweep proxy's final held-out loss stands in for the paper's loss explosion; 3 seeds.")


#: (id, statement) of chapter 2's claims while their evidence is missing.
PENDING = [
    ("C1a", "Tiling is not the cause: one tile per row (block = sequence length) still fails."),
    ("C1b", "One layer causes it: flash attention in the second attention layer alone fails; standard "
            "attention in that layer alone is stable."),
    ("C1c", "It runs through δ: δ = rowsum(dP ∘ P), or O in FP32 (forward, or recomputed for δ, or only "
            "Ō = P̄V), is stable."),
]


def claims(load, stored) -> list[Verdict]:
    """C1a, C1b and C1c from the stored ``substitution`` result, or pending without it."""
    res = load_or_none(load, "substitution")
    if res is None:
        return [pending(c, s, "substitution", "02_substitution", stored) for c, s in PENDING]
    conf = load_or_none(load, "confirmation")
    return [judge_one_tile(res, conf)] + [on_three_seeds(v, res) for v in (judge_one_layer(res),
                                                                           judge_through_delta(res))]


#: The interval the substitution rule quotes, as the row must read it (its words are the pre-registered ones).
RULE_SEEDS = " (with 3 seeds that interval is the seed range, not a 95 % interval)"


def on_three_seeds(v: Verdict, res: Mapping) -> Verdict:
    """C1b and C1c are judged from training runs on lr_sweep's three seeds: the row names its seeds, test and
    proxy (`training_claims.few_seeds`) and the rule's "95 %" interval is qualified (`RULE_SEEDS`)."""
    v = training_claims.few_seeds(v, res)
    return dataclasses.replace(v, rule=v.rule.replace("the 95 % bootstrap interval (seeds, paired)",
                                                      "the 95 % bootstrap interval (seeds, paired)" + RULE_SEEDS))


# -- the numbers chapter 2's text quotes, and its one table ---------------------------------------------------------
#: The main path's table: the paper's chain, one row each, in its order (row names of the grid and its amendment).
PAPER_CHAIN = (("layer_a", "the paper's arithmetic in one layer alone (the rest FP32)",
                "fails in its second layer"),
               ("layer_c", "FP32 in one layer alone (the rest the paper's)", "stable in that layer"),
               ("delta_dPP", "δ = rowsum(dP ∘ P)", "stable"),
               ("delta_hp", "O recomputed in FP32, for δ only", "stable"),
               ("out", "O stored in FP32", "stable"),
               ("obar", "only Ō = P̄V in FP32", "stable"),
               ("heads_top", "the paper's arithmetic only in the 2 largest heads", "carry it"),
               ("score_path_l", "FP32 scores, with m and L in FP32 (the amendment)", "not tested"))


def _word(d: Mapping | None) -> str:
    if d is None:
        return "not run"
    fr = d.get("fraction_closed")
    return d["verdict"] + ("" if fr is None else f" ({fr * 100:.0f} %)")


def _layers(analysis: Mapping, kind: str, lr: str) -> str:
    rows = analysis.get("rows", {})
    names = sorted(n for n in rows if n.startswith("layer") and n.endswith("_" + kind))
    if not any(lr in rows[n]["by_lr"] for n in names):
        return "not run"
    by = {}
    for n in names:
        w = rows[n]["by_lr"].get(lr, {}).get("verdict")
        if w:
            by.setdefault(w, []).append(n[5:-2])

    return "; ".join(f"{w}: layer{'s' if len(ls) > 1 else ''} {listing(ls)}" for w, ls in by.items())


def chain_table(analysis: Mapping, amendment: Mapping | None, c: sub.SubstitutionConfig | None = None) -> str:
    """Markdown: the paper's chain (`PAPER_CHAIN`), one row each, with its verdict and the share of the gap closed
    at each learning rate, from the grid's analysis and the amendment's (None while it is not stored)."""
    c = c or sub.SubstitutionConfig()
    lrs = [f"{lr:g}" for lr in c.lrs]
    rows = []
    for name, change, paper in PAPER_CHAIN:
        cells = [change, paper]
        for lr in lrs:
            if name in ("layer_a", "layer_c"):
                cells.append(_layers(analysis, name[-1], lr))
            else:
                src = amendment if name in {r.name for r in sub.AMENDED_ROWS} else analysis
                d = (src or {}).get("rows", {}).get(name, {}).get("by_lr", {}).get(lr)
                cells.append(_word(d) if src is not None else "pending (GPU)")
        rows.append(cells)
    return md_table(["change from the paper's arithmetic", "the paper found", *[f"lr {x}" for x in lrs]], rows)


def facts(res: Mapping, lr_res: Mapping, amend: Mapping) -> dict[str, str]:
    """Every number chapter 2 and its lab page quote: the A − C gaps the grid starts from (from lr_sweep), each row's
    verdict and share at each learning rate, the rows that close the gap, the amendment's outcome, the per-head
    ‖W_Q‖ pointers, and where and when the grid ran."""
    a = res["analysis"]
    out = {}
    per_lr = {f"{d['lr']:g}": d for d in lr_res["analysis"]["a_minus_c_per_lr"]["small"]}
    for lr in sub.LRS:
        k = f"{lr:g}"
        out[f"gap_{k}"] = interval(per_lr[k], "+.2f")
        closes = [n for n, r in a["rows"].items() if r["by_lr"].get(k, {}).get("verdict") == CLOSES]
        out[f"closes_{k}"] = listing(closes)
        # the one-layer rows (the paper's arithmetic in layer i alone) by their layer index, for prose
        out[f"closes_layers_{k}"] = listing(m[1] for n in closes if (m := re.fullmatch(r"layer(\d+)_a", n))) or "none"
        out[f"n_open_{k}"] = f"{sum(r['by_lr'].get(k, {}).get('verdict') == OPEN for r in a['rows'].values())}"
        out[f"n_rows_{k}"] = f"{sum(k in r['by_lr'] for r in a['rows'].values())}"
    for n, r in a["rows"].items():
        for k, d in r["by_lr"].items():
            out[f"{n}_{k}"] = _word(d)
    am = amend.get("analysis") or {}
    for n, r in am.get("rows", {}).items():
        for k, d in r["by_lr"].items():
            out[f"am_{n}_{k}"] = _word(d)
    out["amend_state"] = ("stored" if amend["state"] == "fresh"
                          else f"pending (GPU): {amend['n_stored']} of {amend['n_runs']} runs stored")
    out["amend_runs"] = f"{amend['n_stored']} of {amend['n_runs']}"
    out["am_completed"] = f"{amend['n_completed']} of {amend['n_stored']}"
    layer, heads = sub.head_choice(lr_res, sub.LRS[-1], sub.SEEDS[0])
    out["wq_layer"], out["wq_heads"] = f"{layer}", listing([str(h) for h in heads])
    vs = [str(x) for x in np.asarray(lr_res["small_variants"])]
    li = [float(x) for x in np.asarray(lr_res["lrs"])].index(sub.LRS[-1])
    wq = np.asarray(lr_res["small_wq"], dtype=np.float64)
    a_last, c_last = wq[vs.index("A"), li, 0, -1], wq[vs.index("C"), li, 0, -1]
    L_, H_ = np.unravel_index(np.nanargmax(a_last), a_last.shape)
    out["wq_a_max"], out["wq_a_where"] = f"{a_last[L_, H_]:.0f}", f"layer {L_}, head {H_}"
    out["wq_c_max"] = f"{np.nanmax(c_last[L_]):.0f}"
    where = [np.unravel_index(np.nanargmax(wq[vs.index("A"), li, k, -1]), a_last.shape) for k in range(wq.shape[2])]
    out["wq_seeds"] = "; ".join(f"seed {k}: layer {w[0]}, head {w[1]}" for k, w in enumerate(where))
    part = res["parts"][0]
    out.update(card=str(part["device"]), when=str(part["created"])[:10], git=str(part["git"])[:7],
               n_new=f"{part['runs'] - 1}", wall_min=f"{part['wall_s'] / 60:.0f}",
               baseline_ok=str(a.get("baseline_reproduced", "not checked")), n_seeds=f"{len(a['seeds'])}")
    meta = amend.get("meta") or {}
    out.update(amend_card=str(meta.get("device", "not run")), amend_when=str(meta.get("created", "not run"))[:10],
               amend_wall=f"{meta['wall_s']:.0f}" if "wall_s" in meta else "not recorded")
    return out
