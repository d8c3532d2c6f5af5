"""Running a grid: `drive` (the missing runs as subprocesses, each stored in a part as it finishes), `checks`
(captured == uncaptured, continued == uninterrupted), `collect` (the stored result from the parts, on any
machine) and `run_experiment` (the body of a registered grid experiment).

Scheduling is not part of any config (a run's numbers do not depend on it): ``LPFAIL_SWEEP_ROOT`` (where the
runs write; default /tmp/lpfail_sweep/<name>), ``LPFAIL_SWEEP_BUDGET_S`` (default 3,600 s),
``LPFAIL_SWEEP_PARALLEL`` (default 12 processes per GPU, 2 without one) and ``LPFAIL_SWEEP_UNCAPTURED``
(groups whose steps run without CUDA-graph capture, "*" for all: the same arithmetic, slower — set from the
checks when a captured step did not reproduce the uncaptured one).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from lpfail import results
from lpfail.sweep import driver
from lpfail.sweep.checks import CUBLAS, graph_checks, uncaptured_from_checks  # noqa: F401  (re-exported)
from lpfail.sweep.grid import Grid, Lookup, Run, SweepIncomplete, lookup
from lpfail.sweep.store import Part, parts_provenance

DEFAULT_BUDGET_S = 3600.0


def default_root(grid: Grid) -> Path:
    return Path(os.environ.get("LPFAIL_SWEEP_ROOT") or f"/tmp/lpfail_sweep/{grid.name}")


def parallel_default(gpus: list[str]) -> int:
    env = os.environ.get("LPFAIL_SWEEP_PARALLEL", "").strip()
    if env:
        if int(env) < 1:
            raise ValueError(f"LPFAIL_SWEEP_PARALLEL must be >= 1 (got {env!r})")
        return int(env)
    return 12 * len(gpus) if gpus else 2


def uncaptured_groups() -> set[str]:
    return {v.strip() for v in os.environ.get("LPFAIL_SWEEP_UNCAPTURED", "").split(",") if v.strip()}


def run_dir_name(run: Run) -> str:
    return f"{run.store.folder.removesuffix('_parts')}_{run.key.replace('/', '_')}"


class _Writer:
    """The part files one `drive` writes (one per store it writes to), and the progress bar."""

    def __init__(self, label: str, directory, total: int):
        from tqdm.auto import tqdm

        self.directory, self.parts, self.schedule = directory, {}, {}
        self.bar = tqdm(total=total, desc=label, unit="run", disable=None)

    def add(self, grid: Grid, run: Run, tc):
        part = self.parts.get(run.store.folder)
        if part is None:
            part = self.parts[run.store.folder] = Part(run.store, self.directory)
            part.meta.update(self.schedule)  # how this call ran its runs (read by the book, not by any result)
        part.add(grid.summarize(tc.out_dir, tc, run.key))
        for ck in Path(tc.out_dir).glob("ckpt_*.pt"):
            ck.unlink(missing_ok=True)
        self.bar.update(1)
        self.bar.set_postfix(stored=sum(len(p.runs) for p in self.parts.values()), refresh=False)

    def has(self, run: Run) -> bool:
        p = self.parts.get(run.store.folder)
        return p is not None and run.key in p.runs

    def close(self):
        self.bar.close()
        for p in self.parts.values():
            p.close()

    def stored(self) -> dict[str, dict]:
        return {k: s for p in self.parts.values() for k, s in p.runs.items()}


def drive(grid: Grid, runs: list[Run] | None = None, root=None, budget_s: float | None = None,
          directory: Path | None = None, parallel: int | None = None, log=print) -> dict[str, dict]:
    """Train ``runs`` (default: the grid's missing ones), N processes at a time, until done or ``budget_s`` has
    passed; every finished run is summarised into a part of its store at once, and its checkpoints deleted
    (a cut-off run keeps its checkpoints and continues from them in the next call). Returns {key: summary}."""
    runs = lookup(grid, directory).missing if runs is None else runs
    root = Path(root) if root is not None else default_root(grid)
    return drive_many([(grid, r) for r in runs], root, budget_s, directory, parallel, log, label=grid.name)


def drive_many(todo: list[tuple[Grid, Run]], root: Path, budget_s: float | None = None,
               directory: Path | None = None, parallel: int | None = None, log=print,
               label: str = "sweep") -> dict[str, dict]:
    """`drive` over the runs of several grids at once (one queue keeps the GPU full): ``todo`` is [(grid, run)]
    in the order to start them; a run listed by two grids (the same store and key) is trained once."""
    budget_s = float(budget_s if budget_s is not None else os.environ.get("LPFAIL_SWEEP_BUDGET_S",
                                                                          DEFAULT_BUDGET_S))
    gpus = driver.gpu_ids()
    parallel = parallel or parallel_default(gpus)
    uncaptured = uncaptured_groups()
    specs, by_name = [], {}
    for grid, r in todo:
        name = run_dir_name(r)
        if name in by_name:
            continue
        tc = r.at(Path(root) / name)
        env = {"LPFAIL_NO_CAPTURE": "1"} if ("*" in uncaptured or r.group in uncaptured) else None
        specs.append(driver.RunSpec(name, tc, variant=r.group, seed=r.seed, env=env))
        by_name[name] = (grid, r, tc)
    writer = _Writer(label, directory, len(specs))
    writer.schedule = {"parallel": parallel, "gpus": gpus, "uncaptured": sorted(uncaptured), "budget_s": budget_s}

    def on_finish(name: str, st: dict):
        if st["state"] == "done":
            writer.add(*by_name[name])

    log(f"{label}: {len(specs)} runs, {parallel} at a time on GPUs {gpus or 'none'}, budget {budget_s:.0f} s, "
        f"root {root}, uncaptured: {sorted(uncaptured) or 'none'}")
    try:
        status = driver.sweep(specs, parallel, budget_s, cont=True, env=CUBLAS, log=log, gpus=gpus,
                              on_finish=on_finish, control=Path(root) / "control.json")
        for name, st in status.items():  # runs finished before this call (their summaries were not stored)
            grid, r, tc = by_name[name]
            if st["state"] == "done" and not writer.has(r):
                writer.add(grid, r, tc)
    finally:
        writer.close()
    failed = [n for n, st in status.items() if st["state"] == "failed"]
    if failed:
        log(f"{label}: {len(failed)} runs failed (not non-finite: crashed): {failed[:5]}; see their stdout.txt")
    return writer.stored()


# -- storing ------------------------------------------------------------------------------------------------------
def again_command(grid: Grid) -> str:
    return f"python -m lpfail sweep {grid.name} drive"


def collect(grid: Grid, directory: Path | None = None, partial: bool = False) -> results.Result | None:
    """Store the grid's result from the parts alone, on any machine (the runs' GPU, git and dates are its
    provenance; the collecting machine's are ``collected_*``). Refuses, writing nothing, while runs are missing
    — unless ``partial`` and the grid allows it (`GridBase.partial_ok`): then the result is marked incomplete.
    Returns None (and writes nothing) when the stored result is fresh and built from the same parts."""
    lk = lookup(grid, directory)
    if not lk.have or (lk.missing and not (partial and grid.partial_ok)):
        raise SweepIncomplete(lk.missing_text(grid.name, again_command(grid)))
    if unchanged(grid, lk, directory):
        return None
    data = assemble(grid, lk, directory)
    return results.save(grid.name, grid.config, data, 0.0, directory,
                        provenance=parts_provenance(lk.parts, none=getattr(grid, "no_parts", "")))


def assemble(grid: Grid, lk: Lookup, directory: Path | None = None) -> dict:
    """The grid's result from the runs ``lk`` found, with `before_rerun` where runs were trained again."""
    data = grid.result(lk.have, lk.parts)
    before = before_rerun(grid, lk, directory)
    if before is not None:
        data["before_rerun"] = before
    return data


#: The fields of a judged statistic that the record of a rerun keeps (`verdict_stats`).
_KEPT = ("estimate", "point", "ci", "n", "p_adjusted", "verdict")


def verdict_stats(data, path: str = "") -> dict[str, dict]:
    """Every judged statistic in a grid's result — each mapping with a ``verdict`` — as {path: its estimate,
    interval, n, Holm-adjusted p and verdict, those it has}; paths join the keys with "/" (``analysis/claims/H2``)."""
    out: dict[str, dict] = {}
    if isinstance(data, Mapping):
        if "verdict" in data and path:
            out[path] = {k: data[k] for k in _KEPT if k in data}
        for k, v in data.items():
            if isinstance(v, Mapping) and k != "before_rerun":
                out.update(verdict_stats(v, f"{path}/{k}" if path else str(k)))
    return out


def before_rerun(grid: Grid, lk: Lookup, directory: Path | None = None) -> dict | None:
    """What the grid's result said before runs of a retired random stream were trained again: the result
    assembled from the retired versions where both are stored (`lookup(retired_first=True)`), reduced to its
    judged statistics (`verdict_stats`) — the "before" of a before → after record. None when no run has been
    trained again, or when the old versions do not make up a whole grid."""
    again = lk.superseded - lk.retired  # none while the grid is still read from the retired stream
    if not again:
        return None
    old = lookup(grid, directory, lk.runs, retired_first=True)
    if not old.complete:
        return None
    return {"runs": len(again), "groups": sorted({r.group for r in lk.runs if r.id in again}),
            "parts": sorted(p["file"] for p in old.parts),
            "stats": verdict_stats(grid.result(old.have, old.parts))}


def unchanged(grid: Grid, lk: Lookup, directory: Path | None = None) -> bool:
    """Whether the stored result is fresh and was built from exactly the part files ``lk`` would use."""
    if os.environ.get("LPFAIL_RECOMPUTE") == "1":
        return False
    try:
        stored = results.load(grid.name, grid.config, directory=directory)
    except results.ResultError:  # missing, stale (another config) or corrupt: store it anew
        return False
    files = sorted(p.get("file", "") for p in (stored.get("parts") or []))
    return bool(files) and files == sorted(p["file"] for p in lk.parts) and (
        bool(stored.get("complete", True)) == lk.complete)


def run_experiment(grid: Grid) -> dict:
    """The body of a registered grid experiment (``python -m lpfail run NAME``): train the missing runs, then
    the result from the parts; raises `SweepIncomplete` while runs are still missing."""
    lk = lookup(grid)
    if lk.missing:
        drive(grid, lk.missing)
        lk = lookup(grid)
    if lk.missing:
        raise SweepIncomplete(lk.missing_text(grid.name, f"python -m lpfail run {grid.name}"))
    return grid.result(lk.have, lk.parts)


# -- what is stored ------------------------------------------------------------------------------------------------
def status(grid: Grid, directory: Path | None = None) -> dict:
    """Runs stored (under the current stream) and planned, per group, and the parts the grid is read from;
    ``retired``: runs still stored only under a retired random stream, to be trained again; ``read_retired``: runs
    the grid is read from a retired stream for meanwhile (`lookup`: one stream per grid)."""
    lk = lookup(grid, directory)
    todo = {r.id for r in lk.missing}
    per: dict[str, list[int]] = {}
    for r in lk.runs:
        n = per.setdefault(r.group, [0, 0])
        n[0] += r.id not in todo
        n[1] += 1
    return {"name": grid.name, "stored": len(lk.runs) - len(todo), "planned": len(lk.runs), "per_group": per,
            "missing": [r.key for r in lk.missing], "parts": lk.parts, "retired": len(todo & lk.retired),
            "read_retired": len(lk.retired)}


def status_text(grid: Grid, directory: Path | None = None) -> str:
    st = status(grid, directory)
    groups = ", ".join(f"{g} {a}/{b}" for g, (a, b) in st["per_group"].items())
    parts = ", ".join(f"{m['file']} ({m['runs']} runs, {m['device']}, {str(m['created'])[:16]})" for m in st["parts"])
    head = f"{st['name']}: {st['stored']} of {st['planned']} runs stored"
    if st["retired"]:
        head += (f" ({st['retired']} more read from a retired stochastic-rounding stream, to be trained again: "
                 "lpfail.sr_stream.RETIRED_SPELLINGS")
        if st["read_retired"] > st["retired"]:
            head += (f"; until they are, the grid reads all {st['read_retired']} runs that have a retired version "
                     "from it, one stream for the whole grid")
        head += ")"
    if st["missing"]:
        head += f"; next missing: {st['missing'][0]}"
    return f"{head}\n  by group: {groups}\n  parts: {parts or 'none'}"
