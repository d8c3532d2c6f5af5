"""A grid experiment is declared once (`lpfail.sweep.register_grid`) and everything that names it follows: the results
registry's entry, the sweep registry's, the chapter that shows it, the module's command line. No list kept by hand
elsewhere (a grid → chapter table, a second registration) may come back."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from lpfail import results, sweep
from lpfail.sweep import cli as sweep_cli

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("lpfail", "kernels", "tools")


@dataclass(frozen=True)
class ToyConfig:
    n: int = 2


class ToyGrid(sweep.GridBase):
    name = "toy_declared"
    store = sweep.Store("toy_declared_parts", "lpfail.toy_declared.part")

    def __init__(self, config):
        self.config = config

    def runs(self):
        return []

    def result(self, have, parts):
        return {"n": self.config.n}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy grid declared (its store in an empty results folder), and both registries' entries removed
    afterwards."""
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path))

    @sweep.register_grid("toy_declared", config=ToyConfig, chapter="05_fix", description="a toy grid (GPU)")
    def toy_grid(config=None):
        return ToyGrid(config or ToyConfig())

    try:
        yield toy_grid
    finally:
        results._REGISTRY.pop("toy_declared", None)
        sweep.GRIDS.pop("toy_declared", None)


def test_one_declaration_gives_the_results_entry_the_grid_the_chapter_and_the_command_line(toy, monkeypatch):
    exp = results.get("toy_declared")
    assert (exp.config, exp.gpu, exp.description, exp.chapter) == (ToyConfig, True, "a toy grid (GPU)", "05_fix")
    assert exp.fn.__module__ == __name__ and exp.fn.__name__ == "toy_declared"
    assert sweep.get("toy_declared").config == ToyConfig() and "toy_declared" in sweep.names()
    assert exp.fn(ToyConfig(n=3)) == {"n": 3}  # run_experiment on the grid: no run missing, its result
    seen = []
    monkeypatch.setattr(sweep_cli, "main", lambda argv: seen.append(argv) or 0)
    assert toy.main(["status", "--json"]) == 0 and seen == [["toy_declared", "status", "--json"]]


def test_a_declaration_without_a_chapter_is_refused():
    with pytest.raises(ValueError, match="chapter"):
        sweep.register_grid("toy_nochapter", config=ToyConfig, chapter="", description="x")


def test_a_module_whose_only_registration_is_register_grid_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "lpfail_grid_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "declared.py").write_text("from lpfail.sweep import register_grid\n\n"
                                     "@register_grid('x', config=None, chapter='c', description='d')\n"
                                     "def grid(config=None):\n    pass\n")
    (pkg / "helper.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(results, "EXPERIMENT_PACKAGES", ("lpfail_grid_pkg",))
    assert results.experiment_modules() == ["lpfail_grid_pkg.declared"]


# -- the repository's grids -------------------------------------------------------------------------------------
def _page_text(page: Path) -> str:
    """The notebook's JSON and the source of every `lpfail.book` module it imports (its report module reads the
    stored results it shows)."""
    text = page.read_text()
    mods = {m for names in re.findall(r"from lpfail\.book import ([\w ,]+)", text)
            for m in (n.split(" as ")[0].strip() for n in names.split(","))}
    return text + "".join((ROOT / "lpfail" / "book" / f"{m}.py").read_text() for m in sorted(mods)
                          if (ROOT / "lpfail" / "book" / f"{m}.py").is_file())


def test_every_grid_declares_a_chapter_whose_page_shows_it():
    """Each registered grid names its chapter in its declaration; ``book/<chapter>.ipynb`` exists and names the
    grid, itself or through the report module it imports. The appendix's table reads the same declarations."""
    from lpfail.book import costs

    for name in sweep.names():
        chapter = results.get(name).chapter
        page = ROOT / "book" / f"{chapter}.ipynb"
        assert chapter and page.is_file(), f"grid {name!r}: chapter {chapter!r} is not a page of book/"
        assert re.search(rf"\b{name}\b", _page_text(page)), f"grid {name!r}: {page.name} never names it"
    rows = costs.quick_rows()
    assert {r["grid"]: r["chapter"] for r in rows} == {n: results.get(n).chapter for n in sweep.names()}


def test_every_grid_is_one_experiment_of_the_module_that_declares_it():
    for name in sweep.names():
        assert results.get(name).fn.__module__ == sweep.GRIDS[name].__module__, name


def _literals(path: Path):
    """(decorator calls named `register` or `experiment` with a string first argument, {key: value} string pairs of
    dict literals) in the file at `path`."""
    tree = ast.parse(path.read_text())
    calls, pairs = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            pairs += [(k.value, v.value) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                      and isinstance(k.value, str) and isinstance(v.value, str)]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant):
                    fn = d.func.attr if isinstance(d.func, ast.Attribute) else getattr(d.func, "id", "")
                    calls.append((fn, d.args[0].value))
    return calls, pairs


def test_no_hand_kept_grid_list_comes_back():
    """No source pairs a grid with a chapter page in a literal (the retired ``GRID_CHAPTER``), and no module
    registers a grid a second time, with ``@register`` or ``@results.experiment`` beside its declaration."""
    grids = set(sweep.names())
    pages = {p.stem for p in (ROOT / "book").glob("*.ipynb")}
    tables, twice = [], []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            calls, pairs = _literals(path)
            tables += [f"{path.relative_to(ROOT)}: {k!r}: {v!r}" for k, v in pairs if k in grids and v in pages]
            twice += [f"{path.relative_to(ROOT)}: @{fn}({name!r})" for fn, name in calls
                      if fn in ("register", "experiment") and name in grids]
    assert tables == [], f"a grid → chapter table kept by hand (declare the chapter in register_grid): {tables}"
    assert twice == [], f"a grid registered beside its register_grid declaration: {twice}"
