"""The rerun check: does every stored grid run come out again, bit for bit?

A stored run is a claim that its TrainConfig produces its numbers. `plan` picks, from every registered grid, one
stored run per (store, group, model size) — the first in the grid's own order — and `execute` trains each again
from nothing in a fresh process on the GPU (one queue, many at a time under MPS), stopping it at `stop_at` steps
unless it is listed as a full rerun, and compares the rerun's per-step losses and gradient norms, binned as the
stored curves are (`lpfail.sweep.store.summarize_run`), with the stored curves: every bin the rerun completed must
be bit-identical, and a full rerun's final held-out losses too. Runs named in `full` are trained to the end.

Scheduling (how many at a time, the stop step) does not change a run's numbers: a run's arithmetic depends only on
its TrainConfig (the CUDA graph checks, `lpfail.sweep.run.graph_checks`, show captured == uncaptured and
continued == uninterrupted). The check is stored as the GPU experiment ``rerun_check``
(`lpfail.experiments.rerun_check`).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpfail import results
from lpfail.sweep import driver
from lpfail.sweep.grid import Run, get, lookup, names
from lpfail.sweep.run import CUBLAS, parallel_default, run_dir_name


@dataclass(frozen=True)
class Item:
    grid: str
    run: Run
    stored: dict
    stop_at: int | None  # None: trained to the end
    curve_points: int
    uncaptured: bool = False  # the stored run was trained without CUDA-graph capture (its part says so): so is the rerun
    card: str = ""  # the GPU the stored run was trained on (its part's device): a run repeats bit for bit on its own kind

    @property
    def label(self) -> str:
        c = self.run.config
        return f"{self.grid}:{self.run.group}@{c.n_layer}x{c.n_embd}"


def plan(stop_at: int = 300, full: tuple[str, ...] = (), grids: tuple[str, ...] | None = None,
         directory: Path | None = None) -> list[Item]:
    """One stored run per (store, group, model size) of every grid (each stored run once, by store and key),
    stopped at ``stop_at`` steps; the runs whose key is in ``full`` are added (if not chosen) and trained to the
    end."""
    items, seen = [], set()
    for name in grids or tuple(names()):
        grid = get(name)
        lk = lookup(grid, directory)
        stored = [r for r in lk.runs if r.id in lk.have and r.id not in lk.retired]  # a retired stream cannot rerun
        chosen: dict[tuple, Run] = {(r.store.folder, r.key): r for r in stored if r.key in full}
        for r in stored:
            chosen.setdefault((r.store.folder, r.group, r.config.n_layer, r.config.n_embd), r)
        for r in chosen.values():
            if (r.store.folder, r.key) in seen:
                continue
            seen.add((r.store.folder, r.key))
            part = next((m for m in lk.parts if r.key in m["keys"]), {})
            off = part.get("uncaptured") or []
            items.append(Item(name, r, lk.have[r.id], None if r.key in full else min(stop_at, r.config.max_steps),
                              getattr(grid, "curve_points", 100), "*" in off or r.group in off,
                              str(part.get("device") or "")))
    return items


def _form(stored: dict) -> tuple[str, str, bool]:
    """The two series a store keeps of a run: its binned curves ("loss_curve", "gnorm_curve"), or, where it keeps
    every step (chapter 1's search), "loss" and "grad_norm" as float32 values."""
    return ("loss_curve", "gnorm_curve", True) if "loss_curve" in stored else ("loss", "grad_norm", False)


def rerun_series(run_dir: Path, item: Item) -> dict:
    """The rerun's two series in its store's form, and how many steps it logged."""
    from lpfail.sweep.store import _geometric_mean
    from lpfail.train import read_log

    log, tc = read_log(run_dir), item.run.config
    loss_key, gn_key, binned = _form(item.stored)
    if binned:
        out = {loss_key: driver.bins(log["loss"], tc.max_steps, item.curve_points, np.mean),
               gn_key: driver.bins(log["grad_norm"], tc.max_steps, item.curve_points, _geometric_mean)}
    else:
        out = {k: np.asarray(log[src], dtype=np.float32).astype(np.float64) for k, src in ((loss_key, "loss"),
                                                                                         (gn_key, "grad_norm"))}
    return {**out, "steps_logged": len(log["loss"])}


def compare(item: Item, rerun: dict, val: dict | None = None) -> dict:
    """The rerun's series against the stored ones over the units (bins, or steps where the store keeps every step)
    that the rerun completed, of those up to its stop (all, for a full rerun, with its held-out losses too).

    {"units", "done", "same_so_far", "equal", "first_diff_step", ...}: ``same_so_far`` — bit-identical over the
    ``done`` units the rerun completed; ``equal`` — that, and the rerun reached every one of the ``units``."""
    tc = item.run.config
    loss_key, gn_key, binned = _form(item.stored)
    width = max(1, math.ceil(tc.max_steps / item.curve_points)) if binned else 1
    target = len(item.stored[loss_key]) if item.stop_at is None else item.stop_at // width
    done = min(target, int(rerun["steps_logged"]) // width)
    same_so_far, first = True, None
    for key in (loss_key, gn_key):
        a = np.asarray(item.stored[key][:done], dtype=np.float64)
        b = np.asarray(rerun[key][:done], dtype=np.float64)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if not same.all():
            same_so_far = False
            bad = int(np.argmin(same)) * width
            first = bad if first is None else min(first, bad)
    out = {"units": target, "unit_steps": width, "done": done, "same_so_far": same_so_far,
           "equal": bool(same_so_far and done == target), "first_diff_step": first,
           "stored_last": float(item.stored[loss_key][done - 1]) if done else float("nan"),
           "rerun_last": float(rerun[loss_key][done - 1]) if done else float("nan")}
    if item.stop_at is None and val is not None:
        same_val = np.array_equal(np.asarray(item.stored["val_loss"], dtype=np.float64),
                                  np.asarray(val["val_loss"], dtype=np.float64), equal_nan=True)
        out["val_equal"] = bool(same_val)
        out["equal"] = bool(out["equal"] and same_val)
        out["stored_val"], out["rerun_val"] = item.stored["val_loss"][-1], val["val_loss"][-1]
    return out


def same_card(stored: str, here: str) -> bool:
    """Whether a run stored from card ``stored`` can be checked on card ``here``: the same kind of GPU (names as
    torch or nvidia-smi give them, e.g. "NVIDIA H100 80GB HBM3"); a run whose card is not recorded, anywhere."""
    return not stored or stored.strip().lower() == here.strip().lower()


def _row(item: Item) -> dict:
    """What every row of the check says of its run: which run it is, where it stops, and its stored card."""
    c = item.run.config
    return {"grid": item.grid, "key": item.run.key, "run_hash": item.run.hash, "group": item.run.group,
            "uncaptured": item.uncaptured, "size": f"{c.n_layer}x{c.n_embd}", "stop_at": item.stop_at,
            "card": item.card}


def pending_row(item: Item) -> dict:
    """The row of a run not checked yet because it needs its own kind of card (`same_card`)."""
    return _row(item) | {"state": "pending", "equal": False, "word": "pending"}


def word(row: dict) -> str:
    """A row's outcome in words: bit-identical, different (from step s), cut off (bit-identical over the part it
    ran), failed, or pending (not run yet: it needs the kind of card it was stored from)."""
    if row.get("state") == "pending":
        return "pending"
    if row.get("error") or row.get("state") == "failed":
        return "failed"
    if row.get("same_so_far") is False:
        return "different"
    if row.get("equal"):
        return "bit-identical"
    return "cut off"


def _cost(item: Item) -> float:
    """A run's relative cost: steps × layers × width² (the model's matmul work per token)."""
    c = item.run.config
    return float(item.stop_at or c.max_steps) * c.n_layer * c.n_embd ** 2


def execute(items: list[Item], root: Path, budget_s: float, parallel: int | None = None, log=print) -> list[dict]:
    """Train every item afresh (a run directory left by an earlier call is wiped first) and compare it; one row per
    item, in order."""
    from lpfail.train import read_val

    root = Path(root)
    gpus = driver.gpu_ids()
    here = results.device_name()
    specs = []
    for it in items:
        tc = it.run.at(root / run_dir_name(it.run))
        tc = dataclasses.replace(tc, checkpoint_every=0, keep_checkpoints=0)
        specs.append(driver.RunSpec(run_dir_name(it.run), tc, variant=it.run.group, seed=it.run.seed,
                                    interrupt_at_step=it.stop_at,
                                    env={"LPFAIL_NO_CAPTURE": "1"} if it.uncaptured else None))
    t0 = time.monotonic()
    order = sorted(range(len(items)), key=lambda i: -_cost(items[i]))  # the longest first: none is cut off last
    status = driver.sweep([specs[i] for i in order], parallel or parallel_default(gpus), budget_s, cont=False,
                          env=CUBLAS, log=log, gpus=gpus)
    rows = []
    for it, spec in zip(items, specs):
        st = status[spec.name]
        row = _row(it) | {"state": st["state"], "wall_s": st["wall_s"], "rerun_card": here}
        try:
            val = read_val(spec.dir) if it.stop_at is None else None
            row.update(compare(it, rerun_series(spec.dir, it),
                               {"val_loss": val["val_loss"].tolist()} if val is not None else None))
            if it.stop_at is None:  # a full rerun keeps its whole summary: it can replace a stored run that differs
                row["summary"] = get(it.grid).summarize(spec.dir, spec.cfg, it.run.key)
        except (OSError, KeyError, ValueError) as e:
            row.update(equal=False, error=f"{type(e).__name__}: {e}")
        rows.append(row)
        row["word"] = word(row)
        log(f"rerun {it.label} {it.run.key}: {row['word']} over {row.get('done', 0)} of {row.get('units', 0)} "
            f"units of {row.get('unit_steps', 1)} steps (first difference at step {row.get('first_diff_step')})")
    log(f"rerun check: {sum(bool(r.get('equal')) for r in rows)} of {len(rows)} bit-identical, "
        f"{time.monotonic() - t0:.0f} s")
    return rows
