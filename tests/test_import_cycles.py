"""No import cycle inside `lpfail`, counting imports inside functions too (they only hide a cycle until the
function runs): a module graph built with `ast` from every module's imports, `from X import Y` read as the
submodule X.Y where there is one, imports under ``if TYPE_CHECKING:`` left out (they never run)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in (ROOT / "lpfail").rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _typing_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under an ``if TYPE_CHECKING:`` block."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imports(path: Path, mods: dict[str, Path], name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _typing_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
    return {m for m in out if m in mods and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_lpfail():
    mods = _modules()
    graph = {name: imports(path, mods, name) for name, path in mods.items()}
    found = cycles(graph)
    assert not found, "import cycles (each a set of modules that import each other): " + "; ".join(
        " ↔ ".join(c) for c in found)


def test_no_book_module_over_700_lines():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "lpfail" / "book"
    long = {p.name: n for p in root.glob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert not long, f"lpfail/book modules over 700 lines (split them by page or job): {long}"
