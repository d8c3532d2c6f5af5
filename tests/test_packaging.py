"""How lpfail is packaged: the kernels are `lpfail.kernels`, never a top-level `kernels` (that import name belongs
to Hugging Face's package, which `transformers` looks for), in a plain checkout and in an install alike."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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
