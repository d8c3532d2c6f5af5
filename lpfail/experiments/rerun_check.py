"""Do the stored grid runs reproduce? One stored run per variant and model size of every grid, trained again on the
GPU and compared bit for bit with what is stored (`lpfail.sweep.rerun`).

Each chosen run is stopped after `stop_at` steps (its first `stop_at` steps' binned losses and gradient norms are
compared), except the runs named in `full`, trained to the end and compared with their held-out losses too: the
runs a rerun on another day found different (production arithmetic D at seed 9, learning rates 1.6e-2 and 3.2e-2).
``python -m lpfail run rerun_check`` on a GPU machine (about five minutes on one H200, many runs at a time under
MPS); the stored runs are read from the repository's results cache. The check builds up across calls: runs that the
stored rerun_check already holds a finished row for (same key and TrainConfig hash; bit-identical or different) are
not rerun, their rows are kept; a run cut off by the budget or failed, and a grid whose runs are stored later (e.g.
after a change of its arithmetic), are checked by running it again. A run whose part records that it was trained
without CUDA-graph capture is rerun without it. A run is checked only on the kind of card it was trained on (its
part's device: runs repeat bit for bit on their own kind, not across kinds); the others wait as "pending" rows for a
machine of their kind, so a check of every row may take one call on each kind of card. ``$LPFAIL_RERUN_BUDGET``
(seconds) shortens this call's budget for a short lease: scheduling only, like the runs at a time, so the result's
identity (its config hash) does not change and the rows of every call merge.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lpfail import results
from lpfail.sweep import rerun


@dataclass(frozen=True)
class RerunCheckConfig:
    stop_at: int = 300
    full: tuple[str, ...] = ("small/D/lr0.016/s9", "small/D/lr0.032/s9")
    parallel: int = 24          # runs at a time (scheduling only: a run's numbers do not depend on it)
    budget_s: float = 400.0     # within one device call
    root: str = "/tmp/lpfail_rerun"


@results.experiment("rerun_check", config=RerunCheckConfig, gpu=True,
                    description="one stored run per variant and size of every grid, rerun and compared bit for bit (GPU)")
def rerun_check(cfg: RerunCheckConfig) -> dict:
    """Keys: ``rows`` [{grid, key, group, size, stop_at, state, units, done, same_so_far, equal, first_diff_step,
    word, card, rerun_card, ...}] (`lpfail.sweep.rerun.compare`), ``n_runs``, ``n_equal``, ``all_equal``,
    ``n_pending`` and ``pending_cards`` (rows waiting for their kind of card)."""
    repo = results.REPO_ROOT / "results"
    items = rerun.plan(cfg.stop_at, cfg.full, directory=repo)
    try:
        before = results.load("rerun_check", cfg, directory=repo)
        done, where = finished(before["rows"]), str(before.meta.get("device") or "")
    except results.ResultError:
        done, where = {}, ""
    here = results.device_name()
    todo = [it for it in items if (it.run.key, it.run.hash) not in done and rerun.same_card(it.card, here)]
    new = rerun.execute(todo, Path(cfg.root), call_budget(cfg), cfg.parallel) if todo else []
    return summary(merge(items, done, new, where))


def call_budget(cfg: RerunCheckConfig) -> float:
    """This call's seconds for the reruns: ``$LPFAIL_RERUN_BUDGET`` where set (a short lease), else the config's."""
    env = os.environ.get("LPFAIL_RERUN_BUDGET", "").strip()
    if not env:
        return cfg.budget_s
    try:
        budget = float(env)
    except ValueError:
        budget = float("nan")
    if not budget > 0:
        raise ValueError(f"LPFAIL_RERUN_BUDGET must be a number of seconds > 0 (got {env!r})")
    return budget


def finished(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """The rows of an earlier check that need no rerun, by (key, run hash): bit-identical or different (a run cut
    off, failed or pending is run again)."""
    return {(r["key"], r["run_hash"]): r for r in rows if rerun.word(r) in ("bit-identical", "different")}


def merge(items: list, done: dict, new: list[dict], where: str) -> list[dict]:
    """One row per planned item, in plan order: this call's row, else the earlier check's (its stored card and
    the card it was rerun on filled in where an older check did not record them: ``where``, that check's device),
    else a pending row (it needs its own kind of card)."""
    fresh = {(r["key"], r["run_hash"]): r for r in new}
    rows = []
    for it in items:
        k = (it.run.key, it.run.hash)
        if k in fresh:
            rows.append(fresh[k])
        elif k in done:
            rows.append({"card": it.card, "rerun_card": where} | done[k])
        else:
            rows.append(rerun.pending_row(it))
    return rows


def summary(rows: list[dict]) -> dict:
    """The result's counts over its rows: how many are bit-identical, and how many wait for their kind of card."""
    n_equal = sum(bool(r.get("equal")) for r in rows)
    pending = sorted({r.get("card") or "?" for r in rows if rerun.word(r) == "pending"})
    return {"rows": rows, "n_runs": len(rows), "n_equal": n_equal, "all_equal": n_equal == len(rows),
            "n_pending": sum(rerun.word(r) == "pending" for r in rows), "pending_cards": pending}
