"""Code shown on the book's pages, taken from the library at build time, never copied into a notebook.

A region of a module is marked by two comment lines, ``# [book:NAME-start]`` and ``# [book:NAME-end]``;
`marked_source` returns the lines between them, dedented, and `code_block` wraps them in a fenced Markdown block
that a chapter glues (``{glue:md}``), so the page always shows the code the book runs."""
from __future__ import annotations

import inspect
import re
import textwrap
from types import ModuleType


def marked_source(module: ModuleType, name: str) -> str:
    """The lines of `module`'s source between ``# [book:NAME-start]`` and ``# [book:NAME-end]``, dedented,
    without the two marker lines. Raises ValueError when either marker is missing or appears twice."""
    lines = inspect.getsource(module).splitlines()
    found = {}
    for tag in ("start", "end"):
        marker = f"# [book:{name}-{tag}]"
        hits = [i for i, line in enumerate(lines) if line.strip() == marker]
        if len(hits) != 1:
            raise ValueError(f"{module.__name__} has {len(hits)} lines '{marker}' (needs exactly one)")
        found[tag] = hits[0]
    if found["end"] <= found["start"] + 1:
        raise ValueError(f"{module.__name__}: the region '{name}' is empty")
    return textwrap.dedent("\n".join(lines[found["start"] + 1:found["end"]]))


def code_block(source: str, language: str = "python") -> str:
    """`source` as a fenced Markdown code block (a fence longer than any backtick run inside it)."""
    run = max((len(m) for m in re.findall(r"`+", source)), default=0)
    fence = "`" * max(3, run + 1)
    return f"{fence}{language}\n{source}\n{fence}"
