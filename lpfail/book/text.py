"""Text outputs that fit the book's column: printed rules, messages and source code wrap instead of scrolling
sideways (the browser check, tools/browser_check.py, fails an output box wider than the text column)."""
from __future__ import annotations

import html
import textwrap

#: Characters of monospace text that fit the text column at 1280 px (688 px at ≈ 8.8 px per character, as the
#: browser check measured an 86-character line at 757 px).
WIDTH = 76


def wrap(text: str, width: int = WIDTH) -> str:
    """Each line of ``text`` wrapped to ``width`` characters; a wrapped line's continuation keeps its indent
    (plus two spaces), blank lines and short lines stay as they are."""
    if width < 20:
        raise ValueError(f"wrap: width must be at least 20 characters (got {width})")
    out = []
    for line in str(text).splitlines() or [""]:
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(textwrap.fill(line.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ",
                                 break_long_words=True, break_on_hyphens=False))
    return "\n".join(out)


def pre_html(text: str) -> str:
    """``text`` (e.g. source code) as a preformatted block whose long lines wrap at the column's edge."""
    return ("<pre style='white-space:pre-wrap;overflow-wrap:anywhere;font-size:0.8em;margin:0'>"
            + html.escape(str(text)) + "</pre>")


def interval(d, fmt: str = "+.3f", none: str = "—", scale: float = 1.0) -> str:
    """'point [lo, hi]' of a statistic ``d`` = {"point": …, "ci": [lo, hi]} (each ×``scale``, formatted with
    ``fmt``), or ``none`` when there is no statistic (None, or a point or interval of None)."""
    if d is None or d.get("point") is None or d.get("ci") is None:
        return none
    p, (lo, hi) = float(d["point"]) * scale, (float(x) * scale for x in d["ci"])
    return f"{p:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


# -- generated Markdown that cannot break -------------------------------------------------------------------------
def md_cell(x) -> str:
    """One Markdown table cell: ``|`` escaped (a bare one would split the row, also inside `code` or a role) and
    line breaks folded into spaces (a newline would end the row)."""
    s = " ".join(str(x).split())
    return s.replace("\\|", "|").replace("|", "\\|")


def md_table(header, rows) -> str:
    """A Markdown table whose cells are escaped (`md_cell`). Every row must have as many cells as the header:
    a short or long row is an error here, not a broken table on the page."""
    header = [md_cell(h) for h in header]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for k, row in enumerate(rows):
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"md_table: row {k} has {len(row)} cells, the header {len(header)}: {row!r}")
        out.append("| " + " | ".join(md_cell(c) for c in row) + " |")
    return "\n".join(out)


def span(lo, hi, fmt: str = "", sep: str = " to ", unit: str = "") -> str:
    """A range as text: 'lo to hi' (each formatted with ``fmt``, ``unit`` after each), or the one value when both
    ends read the same (never 'x to x')."""
    a, b = format(lo, fmt) + unit, format(hi, fmt) + unit
    return a if a == b else f"{a}{sep}{b}"


def listing(items, none: str = "none", last: str = "and") -> str:
    """'a', 'a and b', 'a, b and c' (``none`` for no item)."""
    items = [str(x) for x in items]
    if not items:
        return none
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {last} " + items[-1]


def sentence(text: str) -> str:
    """``text`` as a sentence: its first letter upper-case (an inline code span or a role is left as it is), a
    full stop at the end when it has none."""
    t = " ".join(str(text).split())
    if not t:
        raise ValueError("sentence: empty text")
    if t[0].isalpha():
        t = t[0].upper() + t[1:]
    return t if t[-1] in ".!?:" else t + "."
