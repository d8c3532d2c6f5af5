"""How lpfail is packaged: the kernels are `lpfail.kernels`, never a top-level `kernels` (that import name belongs
to Hugging Face's package, which `transformers` looks for), in a plain checkout and in an install alike."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: an import of the top-level name `kernels` (not `lpfail.kernels`), in Python or shell-embedded Python
STALE_IMPORT = re.compile(r"^\s*(?:import kernels\b|from kernels\b)|importorskip\(\s*[\"']kernels[\"']|"
                          r"import_module\(\s*[\"']kernels[\"'.]", re.MULTILINE)


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split() if not p.startswith(("results/", "notes/"))]


def _sources() -> dict[str, str]:
    """Every tracked Python file, shell script, README and notebook code cell (by name), as text."""
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in _tracked("*.py", "*.sh", "*.md")}
    for p in _tracked("*.ipynb"):
        cells = json.loads(p.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "code":
                texts[f"{p.relative_to(ROOT)}[{i}]"] = "".join(cell["source"])
    return texts


def test_stale_import_pattern_catches_top_level_imports_only():
    for bad in ("import kernels", "from kernels import flash_attention", "    from kernels.bench import table",
                'pytest.importorskip("kernels")', 'importlib.import_module("kernels.fwd")'):
        assert STALE_IMPORT.search(bad), bad
    for good in ("from lpfail import kernels", "from lpfail.kernels.bench import table", "import kernels_gpu",
                 'pytest.importorskip("lpfail.kernels")', "# the kernels import lpfail"):
        assert not STALE_IMPORT.search(good), good


def test_no_code_imports_the_top_level_name_kernels():
    sources = _sources()
    assert any(name.startswith("book/") for name in sources) and "tools/gpu_batch.sh" in sources
    stale = {name: m.group(0).strip() for name, text in sources.items() if name != "tests/test_packaging.py"
             for m in [STALE_IMPORT.search(text)] if m}
    assert not stale, f"imports of the top-level name `kernels` (use lpfail.kernels): {stale}"


def _python(code: str, cwd: Path, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    run = subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**base, **env}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_plain_checkout_gives_lpfail_kernels_from_the_folder(tmp_path):
    """PYTHONPATH at the checkout and nothing else (as on the GPU machines): lpfail.kernels is the kernels/ folder,
    the experiments in it are registered, and the folder imported as a top-level `kernels` (a probe such as
    transformers' does that where the root is on sys.path) is that same module, so there is one copy."""
    out = _python("import json, sys\n"
                  "import lpfail.kernels as lk\n"
                  "from lpfail import flash_attention, results\n"
                  "import kernels\n"
                  "print(json.dumps({'file': lk.__file__, 'same': kernels is lk,"
                  " 'fn': flash_attention is lk.flash_attention, 'version': hasattr(kernels, '__version__'),"
                  " 'exps': results.experiment_modules()}))",
                  tmp_path, PYTHONPATH=str(ROOT))
    got = json.loads(out.strip().splitlines()[-1])
    assert Path(got["file"]) == ROOT / "kernels" / "__init__.py"
    assert got["same"] and got["fn"] and not got["version"]
    assert "lpfail.kernels.bench" in got["exps"] and "lpfail.experiments.fix_rows" in got["exps"]


def test_pyproject_maps_the_folder_to_lpfail_kernels_and_lists_every_package():
    """The build installs kernels/ as lpfail/kernels and claims no top-level name but lpfail; every package under
    lpfail/ is listed (an explicit list: a package missing from it would be missing from the wheel)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert cfg["package-dir"] == {"lpfail.kernels": "kernels"}
    listed = set(cfg["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lpfail").rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert listed == on_disk | {"lpfail.kernels"}
    assert {name.split(".")[0] for name in listed} == {"lpfail"}


# -- the built wheel in a fresh environment that already holds torch --------------------------------------------------
def _run(cmd, env=None, cwd=None, timeout=600) -> str:
    run = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"{cmd}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


def _requirements(metadata: str) -> dict[str, str]:
    """name → version specifier of each Requires-Dist of a wheel's METADATA that no extra asks for."""
    out = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            m = re.fullmatch(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*(.*)", line.strip())
            out[m.group(1).lower()] = m.group(2)
    return out


def _users_torch(site: Path) -> list[str]:
    """Link the torch this test runs under, and every distribution it requires (recursively, markers evaluated
    here), into the folder `site`, as an environment outside the venv that already holds torch; the names linked."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    site.mkdir(parents=True)
    todo, seen = ["torch"], set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        todo += [r.name for r in map(Requirement, dist.requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if not (site / top).is_symlink():
                (site / top).symlink_to(Path(dist.locate_file(top)))
    return sorted(seen)


@pytest.mark.slow
def test_wheel_installs_beside_the_users_torch_and_runs_outside_a_checkout(tmp_path):
    """Build the wheel (from the tracked files); in a fresh venv that sees the user's torch in a site folder
    outside it (the torch this test runs under, at the version requirements.txt pins, with the distributions it
    requires; as a venv made with --system-site-packages sees the system's), install the wheel without
    dependencies and then its declared non-torch dependencies at their floors. Then: pip finds every requirement
    met and would change nothing of torch, numpy or tqdm to install the wheel; torch is the same version at the
    same place, the outside folder; the wheel holds lpfail.kernels and no top-level `kernels`;
    `from lpfail import flash_attention` imports; `lpfail list` has the kernels' experiments; and `lpfail run` of a
    CPU experiment (fix_rows, a few rows) stores its result in the user's folder ($HOME/.local/share/lpfail/results,
    or $LPFAIL_HOME/results), not in site-packages."""
    import zipfile

    src, wheels = tmp_path / "src", tmp_path / "dist"   # built from a copy of the tracked files: nothing written here
    for path in _tracked("pyproject.toml", "README.md", "LICENSE", "lpfail", "kernels"):
        (src / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        (src / path.relative_to(ROOT)).write_bytes(path.read_bytes())
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", wheels, src])
    (wheel,) = wheels.glob("lpfail-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"lpfail", wheel.name.split("-py3")[0] + ".dist-info"}
    assert {"lpfail/kernels/__init__.py", "lpfail/kernels/fwd.py", "lpfail/kernels/bwd.py",
            "lpfail/kernels/bench.py", "lpfail/corpus/tinyshakespeare.txt.gz"} <= set(names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    reqs = _requirements(meta)
    assert "torch" in reqs and all(spec.startswith(">=") for spec in reqs.values()), reqs   # ranges, no pins

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py, pip = venv / "bin" / "python", [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET")
           and not k.startswith("LPFAIL_")}
    torch_pin = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.MULTILINE).group(1)
    outside = tmp_path / "users_site"
    assert "torch" in _users_torch(outside)
    venv_site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).strip())
    (venv_site / "users_site.pth").write_text(f"{outside}\n")
    if (venv_site / "setuptools").is_dir():  # ensurepip's own (Python < 3.12) would shadow the one torch requires
        _run([*pip, "uninstall", "-q", "-y", "setuptools"], env=env)
    where = "import torch; print(torch.__version__, torch.__file__)"
    torch_before = _run([py, "-c", where], env=env, cwd=tmp_path).split()
    assert torch_before[0].split("+")[0] == torch_pin.split("+")[0]
    assert torch_before[1] == str(outside / "torch" / "__init__.py")

    _run([*pip, "install", "-q", "--no-deps", wheel], env=env)
    floors = [f"{name}=={spec[2:]}" for name, spec in reqs.items() if name != "torch"]
    _run([*pip, "install", "-q", *floors], env=env)
    _run([*pip, "check"], env=env)
    report = tmp_path / "report.json"
    _run([*pip, "install", "-q", "--dry-run", "--report", report, wheel], env=env)
    would = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert not would & {"torch", "numpy", "tqdm"}, would
    assert _run([py, "-c", where], env=env, cwd=tmp_path).split() == torch_before

    home = tmp_path / "home"
    home.mkdir()
    user = {**{k: v for k, v in env.items() if k != "XDG_DATA_HOME" and k not in _pins()}, "HOME": str(home)}
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=user).strip()
    got = json.loads(_run([py, "-c", "import importlib.util, json, lpfail, lpfail.kernels as k\n"
                                       "from lpfail import flash_attention, results\n"
                                       "print(json.dumps({'lpfail': lpfail.__file__, 'kernels': k.__file__,\n"
                                       " 'top': importlib.util.find_spec('kernels') is not None,\n"
                                       " 'fn': flash_attention is k.flash_attention,\n"
                                       " 'dir': str(results.results_dir()), 'checkout': results.checkout()}))"],
                          env=user, cwd=tmp_path))
    assert got["lpfail"].startswith(site) and got["kernels"] == str(Path(site) / "lpfail" / "kernels" / "__init__.py")
    assert not got["top"] and got["fn"] and not got["checkout"]
    assert got["dir"] == str(home / ".local" / "share" / "lpfail" / "results")
    listed = _run([py, "-m", "lpfail", "list"], env=user, cwd=tmp_path)
    assert "bench_kernels" in listed and "robust_cost" in listed and "fix_rows" in listed

    out = _run([py, "-m", "lpfail", "run", "fix_rows", "--set", "n_rows=2", "--set", "m_stop=2", "--set",
                "m_extra=125"], env=user, cwd=tmp_path)
    stored = home / ".local" / "share" / "lpfail" / "results" / "fix_rows.json"
    assert str(stored) in out and stored.is_file() and stored.with_suffix(".npz").is_file()
    assert json.loads(stored.read_text())["git"].startswith("lpfail-")
    assert not list(Path(site).glob("results")) and not list(Path(site).rglob("fix_rows.json"))
    alt = _run([py, "-c", "from lpfail import results; print(results.results_dir())"],
               env={**user, "LPFAIL_HOME": str(tmp_path / "alt")}, cwd=tmp_path).strip()
    assert alt == str(tmp_path / "alt" / "results")


def _pins() -> set[str]:
    """The CPU numeric pins' variables (lpfail sets them itself when it is imported; a result is stored only under
    them), so that the installed lpfail runs with its own."""
    from lpfail import numerics

    return set(numerics.PINS)


def test_version_citation_changelog_and_pins_agree():
    """One version everywhere (lpfail.__version__ is the package's, read by the build), the citation names the
    paper, and the pins of requirements.txt lie inside the ranges pyproject.toml declares."""
    import tomllib

    import lpfail

    requirements = pytest.importorskip("packaging.requirements")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["dynamic"] == ["version"] and re.fullmatch(r"\d+\.\d+\.\d+", lpfail.__version__)
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(rf"^version: {re.escape(lpfail.__version__)}$", cff, re.MULTILINE)
    assert "arXiv:2510.04212" in cff and "given-names: Haiquan" in cff and "given-names: Quanming" in cff
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(r"^## (\S+)", changelog, re.MULTILINE).group(1) == lpfail.__version__
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.MULTILINE))
    declared = [requirements.Requirement(r) for r in project["dependencies"]]
    assert {r.name for r in declared} == {"torch", "numpy", "tqdm"}
    for r in declared:
        assert r.specifier.contains(pins[r.name].split("+")[0]), (r, pins[r.name])
