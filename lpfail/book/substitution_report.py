"""Tables and figures of chapter 2 ("Substitution"), from `lpfail.experiments.substitution` and the stored
`lr_sweep` / `substitution` results."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lpfail.book.text import interval
from lpfail.experiments import substitution as sub

ROWS_HEADER = ["row", "change from A", "group", "learning rates", "the paper's finding"]


def _change(r: sub.Row) -> str:
    if r.kind == "policy":
        return f"<code>{r.changes}</code>"
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
    from lpfail import results

    c = sub.AmendmentConfig()
    state, res = results.inspect("substitution_amendment", directory)
    have, missing = sub.stored_for(c, directory, baselines=False)
    stored = {r: {f"{lr:g}": sum(sub.Point(r, lr, s).key in have for s in c.seeds) for lr in c.lrs} for r in c.rows}
    return {"state": state, "analysis": res["analysis"] if state == "fresh" else None, "stored": stored,
            "n_stored": len(have), "n_runs": len(have) + len(missing), "provenance": res.provenance if res else None}


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
        cells = [f"{r.name}: {r.label}", f"<code>{r.changes}</code>", r.amends]
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
    import matplotlib.pyplot as plt

    variants = [str(v) for v in np.asarray(lr_res["small_variants"])]
    lrs = [float(x) for x in np.asarray(lr_res["lrs"])]
    seeds = [int(s) for s in np.asarray(lr_res["seeds"])]
    wq = np.asarray(lr_res["small_wq"], dtype=np.float64)  # (V, L, S, n_diag, layer, head)
    steps = np.asarray(lr_res["diag_step"])
    n_layer, n_head = wq.shape[-2], wq.shape[-1]
    fig, axes = plt.subplots(1, n_layer, figsize=(3.0 * n_layer, 3.0), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for layer, ax in enumerate(np.atleast_1d(axes)):
        for name, style in (("A", "-"), ("C", "--")):
            y = wq[variants.index(name), lrs.index(lr), seeds.index(seed), :, layer]  # (n_diag, head)
            for h in range(n_head):
                ax.plot(steps, y[:, h], style, color=colors[h % len(colors)], lw=1.2,
                        label=f"{name} head {h}" if layer == 0 else None)
        ax.set_title(f"layer {layer}", fontsize=10)
        ax.set_xlabel("step")
    np.atleast_1d(axes)[0].set_ylabel("‖W_Q^h‖ (spectral)")
    np.atleast_1d(axes)[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


# -- the GPU run's replay (results/substitution_gpu/replay.json) ------------------------------------------------
REPLAY_HEADER = ["branch from the checkpoint", "first step that differs from the record", "steps trained",
                 "mean training loss, last 100 steps of the window"]


def load_replay(directory=None) -> dict | None:
    """The stored replay of tools/gpu_substitution.sh (None when absent)."""
    import json

    from lpfail import results

    p = (directory or results.results_dir()) / "substitution_gpu" / "replay.json"
    return json.loads(p.read_text()) if p.is_file() else None


def replay_rows(rep: Mapping) -> list[list[str]]:
    """One line for the replay and one per branch: where it leaves the record, how far it trained (a branch
    stops at its first non-finite loss), its mean loss over the window's last 100 steps (or where it broke)."""
    if "replay" not in rep or "step" not in rep:
        raise ValueError("replay_rows: not a replay_branch result (no 'replay' or 'step')")
    by = {r.name: r for r in sub.ALL_ROWS}
    step = int(rep["step"])

    def tail(losses):
        x = np.asarray(losses, dtype=np.float64)
        if not np.isfinite(x).all() or len(x) < 100:
            bad = np.nonzero(~np.isfinite(x))[0]
            where = step + int(bad[0]) if bad.size else step + len(x)
            return f"non-finite at step {where}"
        return f"{x[-100:].mean():.4f}"

    rows = [["replay (no change)", "none: bit-exact" if rep["replay"]["equal"] else "DIFFERS",
             str(len(rep["replay"]["losses"])), tail(rep["replay"]["losses"])]]
    for name, d in rep.items():
        if not isinstance(d, Mapping) or "first_diff" not in d:
            continue
        label = by[name].label if name in by else name
        rows.append([f"{name}: {label}", "never" if d["first_diff"] is None else str(d["first_diff"]),
                     str(len(d["losses"])), tail(d["losses"])])
    return rows


def replay_figure(rep: Mapping, smooth: int = 20):
    """Training loss of the replay and of each branch from the checkpoint (running mean over `smooth` steps)."""
    import matplotlib.pyplot as plt

    step = int(rep["step"])
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    kern = np.ones(smooth) / smooth
    series = [("replay (= the recorded run)", rep["replay"]["losses"])] + [
        (n, d["losses"]) for n, d in rep.items() if isinstance(d, Mapping) and "first_diff" in d]
    for name, losses in series:
        x = np.asarray(losses, dtype=np.float64)
        if len(x) < smooth or not np.isfinite(x).all():
            continue
        y = np.convolve(x, kern, mode="valid")
        ax.plot(step + smooth - 1 + np.arange(len(y)), y, lw=2.0 if name.startswith("replay") else 1.0,
                color="k" if name.startswith("replay") else None, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean of {smooth})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


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
    import torch

    from lpfail.attention import attention
    from lpfail.precision import Precision

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
    import json

    from lpfail import results

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
