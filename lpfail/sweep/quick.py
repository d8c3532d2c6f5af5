"""Quick profiles: a chapter's headline reproduced on one GPU in minutes.

A grid's quick profile (`Quick`, returned by its ``quick()``) is a subset of its runs fixed in code — one seed
of the points its headline needs — and the headline as a statistic of one seed's runs. `run_quick` trains the
subset afresh (in a scratch store, so the stored runs cannot stand in for it), computes the headline, and sets
it beside the stored full grid: the mean over the stored seeds and the interval one new seed is expected to
fall in, computed from the stored seeds (a t prediction interval, mean ± t_{0.975, n−1} · sd · √(1 + 1/n)).
On the card that made the stored runs, a quick run reproduces its stored seed bit for bit; on another card the
arithmetic's order may differ, and the prediction interval says how far that may move the headline. A profile
whose runs did not all finish (the budget ran out) has no headline (`has_headline`): its record names the runs
that did not finish instead, and how to finish them.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from lpfail import results
from lpfail.sweep import stats
from lpfail.sweep.grid import Grid, Run, lookup

#: Student's t 97.5 % quantile for 1–30 degrees of freedom (``scipy.stats.t.ppf(0.975, df)``; tests/test_sweep.py
#: checks each against scipy). A quick profile runs on a GPU machine, which has no scipy.
T975 = {1: 12.706204736174694, 2: 4.302652729749462, 3: 3.1824463052837078,
        4: 2.7764451051977934, 5: 2.5705818356363146, 6: 2.4469118511449786,
        7: 2.364624251592784, 8: 2.306004135204166, 9: 2.262157162798205,
        10: 2.228138851986274, 11: 2.200985160091639, 12: 2.1788128296672284,
        13: 2.1603686564627913, 14: 2.144786687917804, 15: 2.131449545559776,
        16: 2.1199052992212546, 17: 2.1098155778333156, 18: 2.1009220402410382,
        19: 2.0930240544083087, 20: 2.085963447265864, 21: 2.0796138447276795,
        22: 2.0738730679040254, 23: 2.0686576104190486, 24: 2.0638985616280245,
        25: 2.0595385527532972, 26: 2.0555294386428735, 27: 2.0518305164802846,
        28: 2.0484071417952454, 29: 2.045229642132703, 30: 2.0422724563012378}


def t975(df: int) -> float:
    """Student's t 97.5 % quantile for ``df`` degrees of freedom: `T975` up to 30, scipy's beyond (CPU only)."""
    if df < 1:
        raise ValueError(f"t975: need at least 1 degree of freedom (got {df})")
    return T975[df] if df in T975 else float(stats.t_quantile(0.975, df))


@dataclass
class Quick:
    """A grid's quick profile: ``runs`` (the subset, fixed in code, all of ``seed``), ``statistic(have, seed)``
    (the headline from the summaries of one seed's runs, keyed by `Run.id`; NaN when a run is missing),
    ``label`` (the headline in words) and ``seeds`` (the stored seeds the comparison uses)."""

    runs: list[Run]
    statistic: Callable[[dict[str, dict], int], float]
    label: str
    seed: int
    seeds: tuple[int, ...]


def prediction(values: list[float]) -> dict:
    """Mean, sd and the 95 % prediction interval of one new value, from ``values`` (the stored seeds')."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if x.size < 2:
        return {"n": int(x.size), "mean": float(x.mean()) if x.size else None, "sd": None, "interval": None}
    sd = float(x.std(ddof=1))
    half = t975(x.size - 1) * sd * math.sqrt(1 + 1 / x.size)
    return {"n": int(x.size), "mean": float(x.mean()), "sd": sd, "interval": [float(x.mean() - half),
                                                                             float(x.mean() + half)]}


#: the summary fields that identify a run's trajectory, first present wins: the held-out curve (lr_sweep's
#: store) or the training-loss curve (symptom's, which has no held-out loss)
FINGERPRINT_FIELDS = ("val_loss", "loss")


def fingerprint(summary: dict):
    """The trajectory a summary stores (`FINGERPRINT_FIELDS`), to tell bit-identical reruns; None if it has none."""
    for field in FINGERPRINT_FIELDS:
        if field in summary:
            return summary[field]
    return None


def compare(grid: Grid, q: Quick, quick_have: dict[str, dict], directory: Path | None = None) -> dict:
    """The quick headline beside the stored grid's: its value, the stored seeds' values and mean, the interval
    one seed is expected in, whether it falls inside, and whether the quick runs equal the stored ones bit for
    bit (same held-out losses)."""
    value = float(q.statistic(quick_have, q.seed))
    lk = lookup(grid, directory)
    stored = {k: v for k, v in lk.have.items() if k not in lk.retired}  # a retired stream's runs are not this code's
    per_seed = {int(s): float(q.statistic(stored, s)) for s in q.seeds}
    pred = prediction(list(per_seed.values()))
    inside = pred["interval"] is not None and pred["interval"][0] <= value <= pred["interval"][1]
    same = [fp is not None and fingerprint(stored.get(r.id, {})) == fp for r in q.runs
            for fp in [fingerprint(quick_have.get(r.id, {}))]]
    return {"headline": q.label, "value": value, "stored_per_seed": per_seed, "stored": pred,
            "inside": bool(inside), "bit_identical_runs": int(sum(same)), "runs": len(q.runs),
            "differing_runs": [r.id for r, ok in zip(q.runs, same) if not ok]}


def run_quick(grid: Grid, root: Path, budget_s: float = 600.0, directory: Path | None = None, log=print) -> dict:
    """Train the quick subset afresh under ``root`` (its own scratch results folder), then `compare` it with the
    grid stored in ``directory`` (default: the results cache)."""
    from lpfail.sweep.run import default_root, drive

    q = grid.quick()
    if q is None:
        raise ValueError(f"{grid.name}: no quick profile")
    scratch = Path(root) / "quick_results"
    t0 = time.perf_counter()
    drive(grid, q.runs, root=Path(root) / "quick_runs", budget_s=budget_s, directory=scratch, log=log)
    wall = time.perf_counter() - t0
    lk = lookup(grid, scratch, runs=q.runs)
    have = {k: v for k, v in lk.have.items() if k not in lk.retired}
    missing = [r for r in q.runs if r.id not in have]
    out = {"name": grid.name, "wall_s": round(wall, 1), "complete": not missing}
    if missing:
        again = (f"python -m lpfail sweep {grid.name} drive --quick --budget S"
                 + (f" --root {root}" if Path(root) != default_root(grid) else ""))
        out.update(headline=q.label, value=None, runs=len(q.runs), budget_s=budget_s, again=again,
                   unfinished=[unfinished(r, Path(root) / "quick_runs") for r in missing])
    else:
        out.update(compare(grid, q, have, directory))
    out.update(config_hash=results.config_hash(grid.config), device=results.device_name(), git=results.git_commit(),
               versions=results.library_versions(),
               created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return out


def unfinished(run: Run, runs_root: Path) -> str:
    """A quick run that did not finish, in words: its key and how far it got (from its run directory)."""
    from lpfail.sweep.run import run_dir_name
    from lpfail.train import read_log, read_status

    d = Path(runs_root) / run_dir_name(run)
    steps = read_log(d)["step"] if d.is_dir() else []
    try:
        st = read_status(d)
    except (OSError, ValueError):
        st = {}
    if st.get("status") == "failed":
        return f"{run.key} (failed: {st.get('error')})"
    if len(steps) == 0:
        return f"{run.key} (not started)"
    return f"{run.key} (stopped after step {int(steps[-1])} of {run.config.max_steps})"


def has_headline(rec: dict) -> bool:
    """Whether a quick record holds a headline: every run finished and the statistic is a number."""
    return bool(rec.get("complete", True)) and rec.get("value") is not None and math.isfinite(rec["value"])


def text(rec: dict) -> str:
    """The quick profile's outcome in two lines; without a headline (`has_headline`), why, and what to run."""
    if not rec.get("complete", True):
        from lpfail.sweep.driver import MIN_START_S

        left = rec["unfinished"]
        short = (f" (a run is started only while more than {MIN_START_S:.0f} s of it are left)"
                 if rec["budget_s"] <= MIN_START_S else "")
        return (f"{rec['name']} quick: no headline: {len(left)} of {rec['runs']} runs did not finish within the "
                f"budget of {rec['budget_s']:.0f} s{short}: {', '.join(left)}.\n  Finish them with "
                f"`{rec['again']}` and a larger S: the finished runs are kept, and a cut-off run continues from its "
                "last checkpoint where it wrote one")
    if not has_headline(rec):
        return (f"{rec['name']} quick: no headline: all {rec['runs']} runs finished, but {rec['headline']} is not "
                "a number from them")
    st = rec["stored"]
    iv = st.get("interval")
    where = (f"inside the interval one seed is expected in, [{iv[0]:+.3f}, {iv[1]:+.3f}]" if rec["inside"]
             else f"OUTSIDE the interval one seed is expected in, [{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv
             else "no interval (fewer than 2 stored seeds)")
    mean = f"{st['mean']:+.3f}" if st.get("mean") is not None else "none stored"
    return (f"{rec['name']} quick: {rec['headline']} = {rec['value']:+.3f} on this machine ({rec['runs']} runs, "
            f"{rec['wall_s']:.0f} s); the stored grid's mean over {st['n']} seeds {mean}\n"
            f"  {where}; {rec['bit_identical_runs']} of {rec['runs']} runs bit-identical to the stored ones"
            + (f" (differing: {', '.join(rec['differing_runs'])})" if rec.get("differing_runs") else ""))


def save(rec: dict, path: Path):
    """Write a quick record (``results/quick_NAME.json``) atomically, with the hash of its content last
    (`lpfail.results.CONTENT_KEY`)."""
    results.atomic_write(Path(path), (json.dumps(results.with_content_hash(rec), indent=1) + "\n").encode())
