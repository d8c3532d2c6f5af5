"""Grids of training runs over several GPU calls: one framework for every experiment that trains many small
models (`symptom`, `lr_sweep`, `substitution`, `fix_training`, `cures`, `compiled_sweep`, ...).

**How to add a grid experiment.** Write one module in `lpfail/experiments/` with a frozen config dataclass, its
dated pre-registered rule (the hypotheses, the test from `lpfail.sweep.stats` and the decision rule, as code,
committed before any run), and a grid: a class with ``name``, ``config``, ``store`` (a `Store`: the folder of
part files its own runs go to) and two methods — ``runs()``, every `Run` its result needs in the order they
should be trained (each a key, the store it lives in, its `TrainConfig`, its group and seed; a run another grid
already stores is simply listed with that grid's store and key, and is reused, never rerun), and
``result(have, parts)``, the stored result's data from the run summaries. Subclass `GridBase` for the
defaults (the run summary, the graph checks, no quick profile) and override ``quick()`` to give the chapter's
headline on one GPU in minutes (`lpfail.sweep.quick.Quick`). Declare it once, with
``@register_grid("NAME", config=..., chapter=..., description=...)`` on a factory ``(config=None) -> grid``
(`lpfail.sweep.declare`): the results registry's entry (``python -m lpfail run NAME``), the sweep registry's
(``python -m lpfail sweep NAME ...``), the chapter that shows it and the module's command line
(``factory.main``) all follow from it. Nothing else changes: the command line, the GPU script, the results
cache and the book find it by name.

**What the framework then does.** ``python -m lpfail sweep NAME status | plan | checks | drive [--budget S]
[--quick] | collect``: `lookup` finds each run in its store by key and TrainConfig hash; `drive` trains the
missing ones as subprocesses (`driver`: N per GPU, a wall-clock budget, continuation of cut-off runs from their
checkpoints) and writes every finished run's summary into a new part file at once, so a call cut off anywhere
keeps what it finished and parts from several machines merge; `checks` verifies that CUDA-graph capture and
resuming change no bit before a long call; `collect` stores ``results/NAME.{json,npz}`` from the parts on any
machine, with the runs' GPUs, commits and dates as its provenance; `quick.run_quick` trains the quick profile
and says whether its headline lies where the stored seeds predict. `lr` is the learning-rate grid that lr_sweep,
fix_training, cures, compiled_sweep, confirmation, dial_training and precision_alarm build on (`LRSweepConfig`,
`plan`, `train_config`, `STORE`, `LRGrid`, `assemble`), with its attention variants in `variants`, so that those
experiments import the framework, not one another. The framework never imports an experiment:
`get(NAME)` asks `lpfail.results.registry()` to import the experiment package, whose modules register their
grids.
"""
from lpfail.sweep import stats
from lpfail.sweep.declare import register_grid
from lpfail.sweep.grid import GRIDS, Grid, GridBase, Lookup, Run, SweepIncomplete, get, lookup, names
from lpfail.sweep.run import (before_rerun, collect, drive, graph_checks, run_experiment, status, status_text,
                              verdict_stats)
from lpfail.sweep.store import (Part, Store, part_files, part_name, parts_provenance, read_part, run_hash,
                                 summarize_run, used_parts)

__all__ = ["GRIDS", "Grid", "GridBase", "Lookup", "Part", "Run", "Store", "SweepIncomplete", "before_rerun",
           "collect", "drive", "get", "graph_checks", "lookup", "names", "part_files", "part_name",
           "parts_provenance", "read_part", "register_grid", "run_experiment", "run_hash", "stats", "status",
           "status_text", "summarize_run", "used_parts", "verdict_stats"]
