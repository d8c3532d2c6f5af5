"""No comment or docstring in `lpfail/` or `kernels/` refers to an issue number ("issue 25", "(issue 23)") or to a
session: a comment says what is true of the code beside it, and the history lives in `notes/` and in git.

Only comments (``#`` tokens) and docstrings are read, found with `tokenize` and `ast`: string data such as a
pre-registration record (``SEEN``, ``AMENDMENT``) is data and is not checked here. A docstring is any statement
that is a bare string (a module's, class's or function's docstring, or one written under an attribute)."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lpfail", "kernels")
#: "issue 25", "Issue #7", "issues 3"; "session(s)" as a word, not a module or path so named (lpfail.sweep.session).
PATTERN = re.compile(r"\bissues?\s*#?\s*\d+|(?<![./])\bsessions?\b", re.IGNORECASE)


def _docstring_starts(tree: ast.AST) -> set[tuple[int, int]]:
    """(line, column) where each bare-string statement begins."""
    return {(node.lineno, node.col_offset) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def findings(root: Path = ROOT) -> list[str]:
    """'path:line: text' for every comment or docstring line under `root`'s packages that matches PATTERN."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text()
            starts = _docstring_starts(ast.parse(source))
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start in starts):
                    for offset, line in enumerate(tok.string.splitlines()):
                        if PATTERN.search(line):
                            out.append(f"{path.relative_to(root)}:{tok.start[0] + offset}: {line.strip()}")
    return out


def test_pattern_reads_the_forms_it_is_meant_to():
    for text in ("# issue 16", "(Issue 23)", "issue 25, item 4", "issues 40", "issue #7", "one session's budget"):
        assert PATTERN.search(text), text
    for text in ("tissue 3", "the issue is", "obsession", "python -m lpfail.sweep.session", "lpfail/sweep/session.py"):
        assert not PATTERN.search(text), text


def test_no_issue_or_session_in_comments_or_docstrings():
    found = findings()
    assert not found, "comments or docstrings that refer to an issue or a session:\n" + "\n".join(found)
