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
