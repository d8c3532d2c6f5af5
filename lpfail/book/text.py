"""Text outputs that fit the book's column: printed rules, messages and source code wrap instead of scrolling
sideways (the browser check, tools/browser_check.py, fails an output box wider than the text column)."""
from __future__ import annotations

import html
import re
import textwrap

#: Characters of monospace text that fit the text column at 1280 px (688 px at ≈ 8.8 px per character, as the
#: browser check measured an 86-character line at 757 px).
WIDTH = 76
#: The two model sizes of the learning-rate grids in words ("the smaller size"), by their key in a result.
SIZE_WORDS = {"small": "smaller", "large": "larger"}


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
        out.append("| " + " | ".join(nowrap_numbers(md_cell(c)) for c in row) + " |")
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


# -- table cells that never break a word: numbers kept whole, long identifiers broken only where allowed -----------
ZWSP = "\u200b"
#: Numbers a browser would break at their hyphen-minus ("1.2e-05", "-0.5"): kept on one line by `nowrap_numbers`. An
#: exponent has its sign, as Python writes it, so that a short git hash ("048e337") is not taken for a number.
_NUMBER = re.compile(r"(?<![\w.\-])([-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?)(?![\w.])")


def breakable(ident: str) -> str:
    """A long identifier or policy string (``PAPER_BF16_COMPILED,l_div=fp32``) with break opportunities after
    ``_``, ``,`` and ``=`` (zero-width spaces), so that a narrow table column breaks it there, never inside a word."""
    return re.sub(r"([_,=])", r"\1" + ZWSP, str(ident))


def nowrap_numbers(html_text: str) -> str:
    """Each number with a sign or an exponent in the text parts of ``html_text`` (not inside tags, not inside
    ``code``) wrapped in ``<span class="lp-num">`` (white-space: nowrap), so that a table cell never breaks
    "1.2e-05" at its hyphen."""
    parts = re.split(r"(<[^>]+>|`[^`]*`)", str(html_text))
    out, in_code = [], 0
    for p in parts:
        if p.startswith("<"):
            in_code += 1 if re.match(r"<code\b", p) else -1 if p.startswith("</code") else 0
            out.append(p)
        elif p.startswith("`") or in_code > 0:
            out.append(p)
        else:
            out.append(_NUMBER.sub(lambda m: (f'<span class="lp-num">{m.group(1)}</span>'
                                              if re.search(r"[-+−e]", m.group(1)) else m.group(1)), p))
    return "".join(out)


def rate(lr: float) -> str:
    """A learning rate as the book writes it: '8e-3', '1.6e-2', '0.1'."""
    m, e = f"{float(lr):e}".split("e")
    return f"{float(m):g}e{int(e)}" if int(e) < -1 else f"{float(lr):g}"


def small_number(x: float) -> str:
    """Two significant digits, in e-notation below 0.01: 6.1e-4, 0.068, 0 (the appendix's loss gaps)."""
    if x == 0:
        return "0"
    if abs(x) < 0.01:
        m, e = f"{x:.1e}".split("e")
        return f"{m}e{int(e)}"
    return f"{x:.2g}"


def two_sig(x: float) -> str:
    """Two significant digits, as an integer with thousands separators from 10 on: 421.6 → '420', 37.5 → '38',
    4.69 → '4.7'."""
    return f"{float(f'{x:.2g}'):,.0f}" if x >= 10 else f"{x:.2g}"
