"""Helpers to write book notebooks from Python (cells as a list) and to execute them in place.

`python tools/nbbuild.py execute book/*.ipynb` runs each notebook top to bottom with the project's kernel
and stores the outputs (what `make notebooks` does). Used by maintainers; the book build itself executes
nothing (see _config.yml)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from lpfail.numerics import PINS as CPU_NUMERICS  # noqa: E402  the library's CPU numeric pins

#: The kernels started below inherit the pins (outputs computed live on a CPU must come out the same on any x86-64
#: machine that re-executes or tests the chapters); the Makefile exports the same (tests/test_layout.py).
for _k, _v in CPU_NUMERICS.items():
    os.environ[_k] = _v

KERNELSPEC = {"display_name": "Python 3 (lpfail)", "language": "python", "name": "python3"}


def md(text: str, **meta):
    return nbformat.v4.new_markdown_cell(text.strip("\n"), metadata=meta)


def code(text: str, tags: list[str] | None = None):
    cell = nbformat.v4.new_code_cell(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = tags
    return cell


def write(path: str | Path, cells: list) -> None:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, str(path))


def execute(path: str | Path, timeout: int = 1200) -> None:
    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    for cell in nb.cells:  # strip volatile execution metadata so diffs stay readable
        cell.metadata.pop("execution", None)
    nbformat.write(nb, str(path))
    print(f"executed {path}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "execute":
        sys.exit("usage: python tools/nbbuild.py execute NOTEBOOK.ipynb ...")
    for p in sys.argv[2:]:
        execute(p)
