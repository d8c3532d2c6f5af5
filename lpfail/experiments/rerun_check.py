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
without CUDA-graph capture is rerun without it.
"""
from __future__ import annotations

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
    word, ...}] (`lpfail.sweep.rerun.compare`), ``n_runs``, ``n_equal``, ``all_equal``."""
    repo = results.REPO_ROOT / "results"
    items = rerun.plan(cfg.stop_at, cfg.full, directory=repo)
    try:
        done = {(r["key"], r["run_hash"]): r for r in results.load("rerun_check", cfg, directory=repo)["rows"]
                if rerun.word(r) in ("bit-identical", "different")}  # cut off or failed: run again
    except results.ResultError:
        done = {}
    todo = [it for it in items if (it.run.key, it.run.hash) not in done]
    new = rerun.execute(todo, Path(cfg.root), cfg.budget_s, cfg.parallel)
    fresh = {(r["key"], r["run_hash"]): r for r in new}
    rows = [fresh.get((it.run.key, it.run.hash)) or done[(it.run.key, it.run.hash)] for it in items]
    n_equal = sum(bool(r.get("equal")) for r in rows)
    return {"rows": rows, "n_runs": len(rows), "n_equal": n_equal, "all_equal": n_equal == len(rows)}
