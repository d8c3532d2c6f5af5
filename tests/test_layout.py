"""The library's layout: the core never imports the experiments or the book's modules, no function in the core is
longer than 80 lines, the old module names (``lpfail.symptom``, ``lpfail.plots`` ...) fail with an error naming
the new place, and the registry finds every experiment module by itself."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import lpfail

REPO = Path(__file__).resolve().parent.parent
CORE = ("lpfail", "lpfail.bf16", "lpfail.precision", "lpfail.attention", "lpfail.model", "lpfail.data",
        "lpfail.train", "lpfail.train.config", "lpfail.train.batches", "lpfail.train.step", "lpfail.train.log",
        "lpfail.train.loop", "lpfail.optim", "lpfail.results", "lpfail.cli", "lpfail.sweep", "lpfail.sweep.cli",
        "lpfail.sweep.session")

#: The longest function the core may hold (issue 22: a reader reads each in one sitting).
MAX_FUNCTION_LINES = 80
#: Core functions allowed to be longer than that, with their length (none since the attention split).
LONG_FUNCTIONS: dict[tuple[str, str], int] = {}


def _py(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


#: One fresh interpreter imports the third-party libraries, then forks a child per core module that imports it
#: alone and reports which experiment, book or moved modules came with it (no lpfail module is loaded before the
#: fork, so each child sees only what its module imports).
_IMPORTS = """
import importlib, json, os, sys
import numpy, torch
out = {}
for mod in MODS:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        importlib.import_module(mod)
        moved = __import__("lpfail").MOVED
        found = sorted(m for m in sys.modules if m.startswith(("lpfail.experiments", "lpfail.book")) or m in moved)
        os.write(w, json.dumps(found).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out[mod] = json.loads(f.read() or "null")
    os.waitpid(pid, 0)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def core_imports() -> dict:
    out = _py(f"MODS = {list(CORE)!r}\n" + _IMPORTS)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("mod", CORE)
def test_core_imports_no_experiment_and_no_book_module(mod, core_imports):
    assert core_imports[mod] == []


def test_the_import_check_sees_a_book_module_that_comes_with_a_core_one():
    out = _py("MODS = ['lpfail.book.text']\n" + _IMPORTS)
    assert "lpfail.book.text" in json.loads(out.strip().splitlines()[-1])["lpfail.book.text"]


@pytest.mark.parametrize("old", sorted(lpfail.MOVED))
def test_old_names_fail_naming_the_new_place(old):
    with pytest.raises(ModuleNotFoundError, match=f"{old} has moved: import {lpfail.MOVED[old]} instead"):
        __import__(old)


def _core_files() -> list[Path]:
    """lpfail/*.py and every package under lpfail/ except the experiments and the book's modules."""
    skip = {"experiments", "book"}
    return sorted(p for p in (REPO / "lpfail").rglob("*.py")
                  if not skip & set(p.relative_to(REPO / "lpfail").parts[:-1]))


def _function_lengths(path: Path) -> dict[str, int]:
    """{qualified name: lines from its def to its last line} of every function and method in `path`."""
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
    visit(ast.parse(path.read_text()), "")
    return out


def test_no_core_function_is_longer_than_80_lines():
    files = _core_files()
    assert REPO / "lpfail" / "train" / "loop.py" in files and not [p for p in files if "experiments" in p.parts]
    too_long = {}
    for path in files:
        for name, n in _function_lengths(path).items():
            key = (str(path.relative_to(REPO)), name.rsplit(".", 1)[-1])
            if n > LONG_FUNCTIONS.get(key, MAX_FUNCTION_LINES):
                too_long[f"{key[0]}:{name}"] = n
    assert too_long == {}, f"split these into named parts of at most {MAX_FUNCTION_LINES} lines: {too_long}"


def test_the_length_rule_sees_a_long_function(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("class C:\n    def f(self):\n" + "        x = 1\n" * 81)
    assert _function_lengths(long) == {"C.f": 82}


def test_registry_imports_the_experiment_modules():
    out = _py("import sys; from lpfail import results; reg = results.registry(); "
              "print(sorted({e.fn.__module__ for e in reg.values()}))")
    mods = eval(out.strip().splitlines()[-1])
    for m in ("lpfail.experiments.rounding", "lpfail.experiments.fix_rows", "lpfail.experiments.symptom",
              "lpfail.experiments.train_ddp", "lpfail.experiments.train_speed"):
        assert m in mods


def test_registry_finds_a_new_experiment_module_without_a_list(tmp_path, monkeypatch):
    from lpfail import results

    pkg = tmp_path / "lpfail_extra_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "new_exp.py").write_text(
        "from dataclasses import dataclass\nfrom lpfail import results\n\n@dataclass(frozen=True)\n"
        "class Cfg:\n    x: int = 1\n\n@results.experiment('brand_new', config=Cfg)\ndef f(c):\n    return {}\n")
    (pkg / "helper.py").write_text("raise RuntimeError('a module that registers nothing is never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(results, "EXPERIMENT_PACKAGES", (*results.EXPERIMENT_PACKAGES, "lpfail_extra_pkg"))
    monkeypatch.setattr(results, "_IMPORTED", False)
    assert "lpfail_extra_pkg.new_exp" in results.experiment_modules()
    assert "lpfail_extra_pkg.helper" not in results.experiment_modules()
    assert "brand_new" in results.registry()
    results._REGISTRY.pop("brand_new")


def test_every_grid_has_a_command_line_status():
    out = _py("from lpfail import sweep; print(sweep.names())")
    names = eval(out.strip().splitlines()[-1])
    assert {"symptom", "symptom_sweep", "lr_sweep", "substitution", "substitution_amendment", "fix_training",
            "cures", "compiled_sweep"} <= set(names)
    for name in ("lr_sweep", "substitution"):
        proc = subprocess.run([sys.executable, "-m", "lpfail", "sweep", name, "status"], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and f"{name}: " in proc.stdout and "runs stored" in proc.stdout, proc.stderr


def test_the_chapters_cpu_numerics_are_pinned_alike_in_make_nbbuild_and_the_library():
    import importlib.util
    import re

    from lpfail.numerics import PINS

    spec = importlib.util.spec_from_file_location("nbbuild", REPO / "tools" / "nbbuild.py")
    nbbuild = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nbbuild)
    make = dict(re.findall(r"^export (\w+) := (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE))
    assert make == nbbuild.CPU_NUMERICS == PINS


def test_make_test_runs_the_two_settings_check():
    """The chapters and the CPU experiments' headlines are executed under a second CPU setting in `make test`."""
    import re

    text = (REPO / "Makefile").read_text()
    test_line = re.search(r"^test: (.*)$", text, re.MULTILINE).group(1).split()
    assert "invariance" in test_line
    assert re.search(r"^invariance:.*\n\t.*tools/cpu_invariance\.py all", text, re.MULTILINE)


def test_monitor_and_alarm_at_the_top_come_on_first_use():
    """``lpfail.Monitor`` and ``lpfail.Alarm`` (what the book tells users to take) are the monitor's classes, and
    ``import lpfail`` alone still imports neither torch nor the monitor."""
    out = _py("import sys, lpfail\n"
              "light = [m for m in ('torch', 'lpfail.monitor', 'lpfail.alarm') if m in sys.modules]\n"
              "import lpfail.monitor, lpfail.alarm\n"
              "print(light, lpfail.Monitor is lpfail.monitor.Monitor, lpfail.Alarm is lpfail.alarm.Alarm,\n"
              "      {'Monitor', 'Alarm', 'flash_attention'} <= set(dir(lpfail)) & set(lpfail.__all__))")
    assert out.split() == ["[]", "True", "True", "True"]
    with pytest.raises(AttributeError, match="no attribute 'Monitr'"):
        lpfail.Monitr  # noqa: B018
