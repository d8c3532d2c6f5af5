"""Modules meet through public names: few uses, in `lpfail/`, `kernels/` (installed as `lpfail.kernels`) and
`tools/`, of a private name (one leading underscore, not a dunder) that another `lpfail` module defines.

A use is counted, with `ast`, in a module M as either
* a name in ``from X import _x`` (absolute or relative) where X is another `lpfail` module — a package's
  ``__init__`` re-exporting its submodules' private names counts too — or
* an attribute ``m._x`` where ``m`` is bound in M to an `lpfail` module (``from lpfail import results``,
  ``import lpfail.kernels as K``, ``from lpfail.kernels import fwd as _fwd``, ``lpfail.results._x``).

Tests are not counted: a test may reach into a module's private names."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("lpfail", "kernels", "tools")
LIMIT = 50


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name `path` imports as (kernels/ is installed as lpfail.kernels, tools/ are scripts)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] == "kernels":
        parts = ["lpfail", "kernels"] + parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def uses(path: Path, own: str, modules: set[str]) -> list[str]:
    """'module.name' for every use in the file at `path` (module `own`) of another `lpfail` module's private
    name."""
    tree = ast.parse(path.read_text())
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    bound: dict[str, str] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "lpfail":
                    bound[alias.asname or "lpfail"] = alias.name if alias.asname else "lpfail"
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base not in modules:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif is_private(alias.name) and base != own:
                    out.append(f"{base}.{alias.name}")

    def resolve(expr) -> str | None:
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = resolve(expr.value)
            if base and f"{base}.{expr.attr}" in modules:
                return f"{base}.{expr.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            base = resolve(node.value)
            if base and base != own:
                out.append(f"{base}.{node.attr}")
    return out


def count(root: Path = ROOT) -> dict[str, list[str]]:
    """{file: its uses of other modules' private names}, for every file with at least one."""
    files = [p for folder in FOLDERS for p in sorted((root / folder).rglob("*.py"))]
    modules = {m for m in map(lambda p: module_name(p, root), files) if m.startswith("lpfail")}
    out = {}
    for path in files:
        found = uses(path, module_name(path, root), modules)
        if found:
            out[str(path.relative_to(root))] = found
    return out


def test_the_counter_sees_imports_attributes_and_reexports(tmp_path):
    (tmp_path / "lpfail" / "sub").mkdir(parents=True)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "lpfail" / "__init__.py").write_text("")
    (tmp_path / "lpfail" / "a.py").write_text("_x = 1\n_y = 2\n__version__ = 3\n")
    (tmp_path / "lpfail" / "sub" / "__init__.py").write_text("from .b import _z, public\n")
    (tmp_path / "lpfail" / "sub" / "b.py").write_text(
        "from lpfail.a import _x, __version__\nfrom lpfail import a\n_z = a._y + a.__version__ + _x\npublic = _z\n")
    (tmp_path / "kernels" / "__init__.py").write_text("from .fwd import _k\n_own = 1\n")
    (tmp_path / "kernels" / "fwd.py").write_text("_k = 1\n")
    (tmp_path / "tools" / "t.py").write_text(
        "import lpfail.kernels as K\nimport lpfail.a\nfrom lpfail.sub import b as _b\n"
        "print(K._k, K._own, lpfail.a._x, _b._z, _b.public)\n")
    found = count(tmp_path)
    assert found == {"kernels/__init__.py": ["lpfail.kernels.fwd._k"],
                     "lpfail/sub/__init__.py": ["lpfail.sub.b._z"],
                     "lpfail/sub/b.py": ["lpfail.a._x", "lpfail.a._y"],
                     "tools/t.py": ["lpfail.kernels._k", "lpfail.kernels._own", "lpfail.a._x", "lpfail.sub.b._z"]}


def test_private_names_rarely_cross_modules():
    found = count()
    total = sum(map(len, found.values()))
    worst = sorted(found.items(), key=lambda kv: -len(kv[1]))[:10]
    report = "\n".join(f"{len(v):4d}  {path}: {', '.join(sorted(set(v)))}" for path, v in worst)
    assert total < LIMIT, f"{total} uses of another module's private names (limit {LIMIT}); the worst files:\n{report}"
