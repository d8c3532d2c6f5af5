"""`register_grid`: a grid experiment's one declaration, from which everything that names it follows.

Applied to the grid factory ``(config=None) -> Grid`` of an experiment module, ``@register_grid(NAME,
config=..., chapter=..., description=...)`` gives

* the sweep registry's entry (`lpfail.sweep.grid.register`): ``python -m lpfail sweep NAME ...``, `tools/gpu.sh`;
* the results registry's entry (`lpfail.results.experiment`), whose function trains the missing runs and builds
  the result from the parts (`run_experiment`): ``python -m lpfail run NAME``, ``results.load(NAME)``, with the
  config class, ``gpu`` flag and description given here;
* the chapter that shows the grid (`lpfail.results.Experiment.chapter`, ``book/<chapter>.ipynb``), which the book
  reads from the registry (the appendix's table of quick profiles);
* ``factory.main(argv=None)``, the module's command line: ``python -m lpfail.experiments.MODULE CMD`` is
  ``python -m lpfail sweep NAME CMD`` where the module ends with
  ``if __name__ == "__main__": raise SystemExit(factory.main())``.
"""
from __future__ import annotations

import sys
from typing import Callable

from lpfail import results
from lpfail.sweep.grid import Grid, register
from lpfail.sweep.run import run_experiment


def sweep_command(name: str) -> Callable[..., int]:
    """``main(argv=None) -> int``: ``python -m lpfail sweep NAME *argv`` (``argv`` defaults to the process's)."""

    def main(argv=None) -> int:
        from lpfail.sweep.cli import main as sweep_main

        return sweep_main([name, *(sys.argv[1:] if argv is None else argv)])

    main.__doc__ = f"``python -m lpfail sweep {name} CMD``: the grid's command line."
    return main


def register_grid(name: str, *, config: type, chapter: str, description: str, gpu: bool = True,
                  preregistered_on: str | None = None, seen: str | None = None):
    """Declare the grid experiment ``name`` on its factory ``(config=None) -> Grid`` (the module docstring says what
    follows from it). ``config``: the frozen config dataclass (the stored result's hash); ``chapter``: the book page
    that shows it, ``book/<chapter>.ipynb``; ``description``: the line ``python -m lpfail list`` prints; ``gpu``:
    whether its runs need a GPU (every grid's do). ``preregistered_on`` and ``seen``: where a module declares two
    experiments with two rules, the second's date and what had been seen then (set on its experiment function,
    which the verdict page's record reads before the module's ``PREREGISTERED_ON`` and ``SEEN``)."""
    if not chapter:
        raise ValueError(f"grid {name!r}: declare the chapter that shows it (book/<chapter>.ipynb)")

    def deco(factory: Callable[..., Grid]):
        register(name)(factory)

        def run(c) -> dict:
            return run_experiment(factory(c))

        run.__name__ = run.__qualname__ = name
        run.__module__ = factory.__module__
        run.__doc__ = (f"Train the missing runs of grid {name!r} (on a GPU), then its result from the parts; raises "
                       "`SweepIncomplete` while runs are still missing.")
        if preregistered_on is not None:
            run.PREREGISTERED_ON, run.SEEN = preregistered_on, seen
        results.experiment(name, config=config, gpu=gpu, description=description, chapter=chapter)(run)
        factory.main = sweep_command(name)
        return factory

    return deco
