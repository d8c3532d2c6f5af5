"""A chapter's handout for a class: its exercises and quiz questions, without their solutions, as plain Markdown.

The questions are read from the chapter's notebook (its ``{exercise}`` directives, grouped under the ``##``
heading each stands under), so the handout always says what the chapter says; the solutions, in ``{solution}``
directives, are never read. A question must be self-contained: a MyST role in it (a cross-reference, a glued
value) has no meaning outside the book and is refused."""
from __future__ import annotations

import json
import re
from pathlib import Path

_OPEN = re.compile(r"^(`{3,}|:{3,})\{exercise\}\s*(.*)$")
_ROLE = re.compile(r"\{[\w:.-]+\}`")


def exercises(notebook: str | Path) -> list[tuple[str, str, str]]:
    """(section heading, label, question text) for every ``{exercise}`` directive of the notebook's Markdown
    cells, in order. The directive's options (``:label:`` …) are dropped from the text."""
    nb = json.loads(Path(notebook).read_text())
    found, heading = [], ""
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        lines = "".join(cell["source"]).splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("## "):
                heading = line[3:].strip()
            opened = _OPEN.match(line)
            if not opened:
                i += 1
                continue
            fence, label, body = opened.group(1), "", []
            i += 1
            while i < len(lines) and lines[i].strip() != fence:
                option = re.match(r"^:(\w+):\s*(.*)$", lines[i])
                if option and not body:
                    label = option.group(2).strip() if option.group(1) == "label" else label
                else:
                    body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{notebook}: the exercise {label or '(no label)'} is never closed")
            found.append((heading, label, "\n".join(body).strip()))
            i += 1
    return found


def handout_markdown(notebook: str | Path, title: str, intro: str = "") -> str:
    """The handout: `title`, `intro`, then per section its questions numbered from 1, without solutions.
    Raises ValueError when a question holds a MyST role (it would not render outside the book)."""
    out = [f"# {title}", ""]
    if intro:
        out += [intro.strip(), ""]
    section, n = None, 0
    for heading, label, text in exercises(notebook):
        if _ROLE.search(text):
            raise ValueError(f"{notebook}: exercise {label} uses a MyST role, which a handout cannot render: "
                             f"{_ROLE.search(text).group(0)}")
        if heading != section:
            section, n = heading, 0
            out += [f"## {heading}", ""]
        n += 1
        out += [f"**{n}.** {text}", "", "_Your answer:_", ""]
    return "\n".join(out).rstrip() + "\n"


def write_handout(notebook: str | Path, path: str | Path, title: str, intro: str = "") -> Path:
    """Write `handout_markdown` to `path` (its folder created), only when the text differs; returns the path."""
    path = Path(path)
    text = handout_markdown(notebook, title, intro)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path
