"""The `Grid` protocol: what an experiment hands to the framework, and the framework's view of its runs.

A grid is a list of `Run`s — each a point key, the `Store` its summary lives in, the `TrainConfig` the driver
trains (everything but its directory), a *group* (the variant or row: what the checks and the uncaptured list
name) and a seed — plus a function that turns the stored summaries into the experiment's result. The framework
never imports an experiment: experiments build grids and declare them (`lpfail.sweep.declare.register_grid`, which
`register`s the factory here); `get` finds them by name after `lpfail.results.registry()` has imported every
experiment module.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from lpfail import results
from lpfail.sweep.checks import graph_checks
from lpfail.sweep.store import Store, run_hash


class SweepIncomplete(results.ResultError):
    """Some runs of a grid are not stored yet: the finished ones are kept in parts."""


@dataclass(frozen=True)
class Run:
    """One run of a grid. ``key`` is its key in ``store``; ``name`` the grid's own key for it (what the
    grid's analysis looks it up by: default ``key``; e.g. substitution's baseline "A/lr0.032/s0" is lr_sweep's
    run "small/A/lr0.032/s0"). ``config``: the `TrainConfig` the driver trains, with ``out_dir`` left empty (and
    so no checkpoints: `at` gives it a directory and ``checkpoint_every``)."""

    key: str
    store: Store
    config: object
    group: str = ""
    seed: int = 0
    name: str = ""
    checkpoint_every: int = 0  # set with the run's directory (a TrainConfig without one writes no checkpoints)

    @property
    def id(self) -> str:
        return self.name or self.key

    @property
    def hash(self) -> str:
        return run_hash(self.config)

    def at(self, out_dir) -> object:
        """The run's TrainConfig writing into ``out_dir`` (with its checkpoints, where it has them)."""
        ck = {"checkpoint_every": self.checkpoint_every} if self.checkpoint_every else {}
        return dataclasses.replace(self.config, out_dir=str(out_dir), **ck)


@runtime_checkable
class Grid(Protocol):
    """What an experiment hands to the framework (see `GridBase` for the optional parts' defaults)."""

    name: str  # the registered experiment (its stored result is results/<name>.{json,npz})
    config: object  # the experiment's frozen config (the stored result's config hash)
    store: Store  # where this grid's own runs are written

    def runs(self) -> list[Run]:
        """Every run the result needs, in the order the driver starts them (a cut-off call keeps the first)."""

    def result(self, have: dict[str, dict], parts: list[dict]) -> dict:
        """The stored result's data from the summaries (keyed by `Run.id`) and the parts that hold them."""


class GridBase:
    """Defaults for a grid's optional parts; an experiment's grid subclasses it and sets what differs."""

    curve_points: int = 100  # the stored curves' length (`store.summarize_run`)
    check_groups: tuple[str, ...] = ()  # groups whose captured step `checks` compares with the uncaptured one
    partial_ok: bool = False  # `collect --partial` may store the grid with runs missing (marked incomplete)
    no_parts: str = ""  # the device named in the provenance of a result built from no part of its own
    description: str = ""  # one line for `status`

    def summarize(self, run_dir, tc, key: str) -> dict:
        from lpfail.sweep.store import summarize_run

        return summarize_run(run_dir, tc, key, self.curve_points)

    def quick(self):
        """The grid's quick profile (`lpfail.sweep.quick.Quick`), or None."""
        return None

    def ready(self) -> str:
        """Why the grid may not be trained now ("" when it may): e.g. a preset a GPU check must confirm first.
        `drive` refuses, starting nothing, while this says why."""
        return ""

    def checks(self, root: Path, log=print) -> dict:
        """`graph_checks` of the `check_groups`; a grid that names none (its runs are never captured, e.g.
        precision_alarm's) has nothing to compare, and says so instead of failing (a failure would stop
        `start --checks` before the grid's driver begins)."""
        if not self.check_groups:
            why = f"{self.name}: no checks to run (the grid names no check groups: its runs are not captured)"
            log(why)
            return {"skipped": why, "ok": True, "equal": {}, "resume_equal": True}
        return graph_checks(self, root, log=log)


@dataclass
class Lookup:
    """Which runs of a grid are stored: ``have`` {run id: summary}, ``missing`` [Run], ``parts`` (the
    provenance of every part that holds one of them, all stores together). ``retired``: the ids of runs read from a
    retired spelling of their policy (`lpfail.sweep.store.retired_hashes`, a random stream this code no longer
    has), in ``have`` so that a grid's stored result can be read again — those with no current version (also in
    ``missing``: still to train) and, while any run has none, those with one too (`lookup`: one stream per grid).
    ``superseded``: the ids of runs stored under both a retired and the current stream (trained again)."""

    have: dict[str, dict]
    missing: list[Run]
    parts: list[dict]
    runs: list[Run]
    retired: set[str] = dataclasses.field(default_factory=set)
    superseded: set[str] = dataclasses.field(default_factory=set)

    @property
    def complete(self) -> bool:
        """Every run can be read (retired runs included): the grid's result can be assembled."""
        return all(r.id in self.have for r in self.runs)

    @property
    def trained(self) -> bool:
        """Every run is stored under its current TrainConfig: nothing is left to train."""
        return not self.missing

    def missing_text(self, name: str, again: str) -> str:
        n = len(self.runs)
        if not self.have:
            return f"{name}: none of the {n} runs is stored yet; run `{again}` on a GPU machine"
        per: dict[str, int] = {}
        for r in self.missing:
            per[r.group] = per.get(r.group, 0) + 1
        retired = (f"; {len(self.retired)} of them are stored only from a retired stochastic-rounding stream"
                   if self.retired else "")
        return (f"{name}: {len(self.missing)} of {n} runs are not stored yet (missing per group: "
                + ", ".join(f"{g} {k}" for g, k in per.items()) + f"; first: {self.missing[0].key}{retired}); "
                f"nothing stored. Run `{again}` on a GPU machine")


def lookup(grid: Grid, directory: Path | None = None, runs: list[Run] | None = None,
           retired_first: bool | None = None) -> Lookup:
    """The grid's runs found in their stores (a run counts when its key and its TrainConfig hash match).

    A grid is read from one random stream, never two: while any of its runs is stored only under a retired
    stream (`lpfail.sweep.store.retired_hashes`), every run that has a retired version is read from it — the grid
    as it stood before its runs were trained again — and ``missing`` lists the runs still without a current
    version (``retired_first=None``, the default). ``retired_first=True`` reads the retired versions wherever they
    exist (`lpfail.sweep.run.collect`'s record of what a rerun changed); ``False``, the current ones. With a
    ``directory``, the stored results the grid's runs are built from (substitution's lr_sweep) are read from it as
    well (`lpfail.results.reading_from`)."""
    from lpfail.sweep.store import retired_hashes

    if runs is None:
        with results.reading_from(directory):  # a grid built from another stored result reads it from here too
            runs = grid.runs()
    stores = {r.store.folder: r.store for r in runs} | {grid.store.folder: grid.store}
    loaded = {f: s.load_versions(directory) for f, s in stores.items()}
    found_all = []
    for r in runs:
        versions = loaded[r.store.folder][0].get(r.key, [])
        current = next((fs for fs in versions if fs[1].get("run_hash") == r.hash), None)
        old = retired_hashes(r.config)
        former = next((fs for fs in versions if fs[1].get("run_hash") in old), None) if old else None
        found_all.append((r, current, former))
    if retired_first is None:
        retired_first = any(current is None and former is not None for _, current, former in found_all)
    have, missing, retired = {}, [], set()
    used: dict[str, dict[str, list[str]]] = {f: {} for f in stores}  # folder → part file → the keys read from it
    for r, current, former in found_all:
        if current is None:
            missing.append(r)
        found = former if former is not None and (retired_first or current is None) else current
        if found is None:
            continue
        if found is former:
            retired.add(r.id)
        have[r.id] = found[1]
        used[r.store.folder].setdefault(found[0], []).append(r.key)
    # each part's provenance counts the runs read from it (a part of runs trained again holds no new key)
    parts = [m | {"runs": len(used[f][m["file"]]), "keys": sorted(used[f][m["file"]])}
             for f in stores for m in loaded[f][1] if m["file"] in used[f]]
    superseded = {r.id for r, current, former in found_all if current is not None and former is not None}
    return Lookup(have, missing, parts, runs, retired, superseded)


# -- the registry of grids ---------------------------------------------------------------------------------------
GRIDS: dict[str, Callable[..., Grid]] = {}


def register(name: str):
    """Register ``factory(config=None) -> Grid`` as the grid of experiment ``name`` (`register_grid` does this
    with the rest of an experiment's declaration; `python -m lpfail sweep NAME` finds it)."""

    def deco(factory):
        if name in GRIDS and GRIDS[name].__qualname__ != factory.__qualname__:
            raise ValueError(f"grid {name!r} is registered twice")
        GRIDS[name] = factory
        return factory

    return deco


def get(name: str, config=None) -> Grid:
    """The grid of experiment ``name`` (its default config unless ``config`` is given)."""
    results.registry()  # imports every experiment module, which registers its grid
    if name not in GRIDS:
        raise results.UnknownExperiment(f"no grid experiment named {name!r}; grids: {sorted(GRIDS)}")
    return GRIDS[name](config)


def names() -> list[str]:
    results.registry()
    return sorted(GRIDS)
