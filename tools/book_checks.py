"""Checks of the built book's text that need no browser: what a reader reads, and what a generator could break.

    python tools/book_checks.py [_build/html] [--toc _toc.yml]

Over every page of the built HTML (the article's content, ``article.bd-article``) it fails on:

* a **main-path chapter** (the chapters of the table of contents' parts named in ``MAIN_PARTS``) with more than
  ``MAX_WORDS`` words of prose, or with a table of more than ``MAX_TABLE_ROWS`` body rows. Prose is the article's
  text without code cells and their outputs, tables, code, math and figures (`prose_words`): what one reads
  from top to bottom, captions, dropdowns and exercises included;
* a **table whose rows have unequal numbers of cells** (colspan and rowspan counted): what a ``|`` inside a
  generated Markdown cell does to a row;
* a **caption that places panels** ("left", "right", "middle", "Top:") on a figure of several panel images, which
  stack on a phone (`caption_layout_errors`);
* **generated text that reads as garbage**: a value repeated around a colon ("stored: stored"), a degenerate
  range ("-8.86 to -8.86", "3–3"), a placeholder (``nan``, ``None``, an unrendered ``{glue:…}`` role), or a
  Markdown table left as text (its ``|---|`` row in a paragraph).

It prints one line per page (words of prose, tables) and exits 1 when any page fails; ``--json`` writes the
counts (the before/after measure of the book's length). The browser check (tools/browser_check.py) covers what
needs a layout: words broken inside table cells, the size of figure text at a phone's width.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

#: Parts of the table of contents that make the main path (each chapter must read in ~15 minutes).
MAIN_PARTS = ("The argument", "Beyond the paper")
MAX_WORDS = 3000
MAX_TABLE_ROWS = 10
#: Words per minute of reading (technical prose), for the first page's reading times.
WPM = 200

_WORD = re.compile(r"[0-9A-Za-zÀ-ÿ\u0370-\u03ff]+(?:[’'.,/−–-][0-9A-Za-zÀ-ÿ\u0370-\u03ff]+)*")
_NUM = r"[−-]?\d[\d,]*(?:\.\d+)?(?:\s?[×x]\s?10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)?\s?%?"
#: "x to x", "x – x", "x–x" with the same x on both sides (a degenerate range), and "word: word" repeats.
_SAME_RANGE = re.compile(rf"(?<![\w.−-])({_NUM})\s*(?:to|–|—)\s*\1(?![\w.])")
_SAME_COLON = re.compile(r"(?<![\w-])([A-Za-z][\w-]{2,}): \1\b")
#: A value that is not one: Python's nan and None where a number or a word belongs (English "None of …" is fine),
#: an unrendered role, or "???".
_PLACEHOLDER = re.compile(r"(?<![\w.])nan(?![\w.(])|(?<![\w.])None(?![\w.(])(?!\s+(?:of|is|are|was|were|has|have|"
                          r"closes|needs|does)\b)|\{glue:|\{numref\}|\{doc\}|\?\?\?")
#: A Markdown table that reached the page as text (its separator row in a paragraph: a `{glue:md}` role inline
#: instead of the block directive, 2026-12-02; MyST had turned its --- into —).
_RAW_TABLE = re.compile(r"\|\s*:?(?:-{3,}|[—–]-*):?\s*\|")  # MyST typesets --- as an em dash


@dataclasses.dataclass
class PageText:
    page: str
    words: int = 0
    all_words: int = 0  # every word a reader sees: prose, tables, outputs (not code inputs, math or images)
    tables: int = 0
    longest_table: int = 0
    main: bool = False
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def line(self) -> str:
        head = "OK  " if self.ok else "FAIL"
        info = f"{self.words:6,d} words of prose, {self.tables} tables (longest {self.longest_table} rows)"
        return "\n".join([f"{head} {self.page:<34} {info}{'  [main path]' if self.main else ''}"]
                         + [f"     - {e}" for e in self.errors])


def _soup(html: str):
    from bs4 import BeautifulSoup

    return BeautifulSoup(html, "html.parser")


def article(soup):
    return soup.select_one("article.bd-article") or soup.select_one("main") or soup.body or soup


#: What is not prose: code cells (input and output), tables, code, math, figures' images, the theme's
#: permalink marks, scripts.
NOT_PROSE = ("div.cell", "div.cell_output", "table", "pre", "div.highlight", "span.math", "div.math",
             "mjx-container", "script", "style", "a.headerlink", "img", "div.lp-fig-panels", "select")


def prose_words(html_or_soup) -> int:
    """Words of prose on a page (see the module's docstring)."""
    soup = _soup(html_or_soup) if isinstance(html_or_soup, str) else html_or_soup
    art = article(soup)
    art = _soup(str(art))  # a copy: decompose() must not change the caller's tree
    for sel in NOT_PROSE:
        for el in art.select(sel):
            el.decompose()
    for el in art.select("code"):   # inline code: one word however long
        el.replace_with(" code ")
    return len(_WORD.findall(art.get_text(" ")))


def all_words(soup) -> int:
    """Every word of the page's article a reader sees: prose, tables and outputs; not code inputs, math, scripts."""
    art = _soup(str(article(soup)))
    for sel in ("div.cell_input", "script", "style", "span.math", "div.math", "mjx-container", "a.headerlink",
                "select"):
        for el in art.select(sel):
            el.decompose()
    return len(_WORD.findall(art.get_text(" ")))


def table_shape_errors(table) -> list[str]:
    """Rows of unequal width (cells counted with colspan, rowspan carried down)."""
    widths, carried = [], []  # carried: (rows still covered, width) of cells spanning down from above
    for tr in table.find_all("tr"):
        if tr.find_parent("table") is not table:
            continue
        w = sum(width for _, width in carried)
        carried = [(n - 1, width) for n, width in carried if n > 1]
        for c in tr.find_all(["td", "th"], recursive=False):
            cs, rs = int(c.get("colspan", 1) or 1), int(c.get("rowspan", 1) or 1)
            w += cs
            if rs > 1:
                carried.append((rs - 1, cs))
        widths.append(w)
    if len(set(widths)) > 1:
        first = " ".join(table.get_text(" ").split())[:60]
        return [f"table with rows of unequal cell count {sorted(set(widths))}: {first}"]
    return []


def body_rows(table) -> int:
    body = table.find("tbody")
    rows = (body or table).find_all("tr")
    return sum(1 for r in rows if r.find_parent("table") is table and not r.find_parent("thead"))


def text_errors(text: str) -> list[str]:
    out = []
    for rx, what in ((_SAME_RANGE, "degenerate range"), (_SAME_COLON, "repeated value"),
                     (_PLACEHOLDER, "placeholder"), (_RAW_TABLE, "Markdown table not rendered")):
        for m in rx.finditer(text):
            a, b = max(0, m.start() - 40), min(len(text), m.end() + 40)
            out.append(f"{what} {m.group(0)!r}: …{text[a:b].strip()}…")
    return out


#: Words that place a panel in a row or a column. A figure of several panel images (`lpfail.book.plots`) lays them
#: side by side on a wide screen and stacks them on a phone, so its caption names panels by order ("the first
#: panel") instead; a single image keeps its own layout and may say "top" or "left".
_PLACE = re.compile(r"\b(?:left|right|middle|centre|center)\b|\b(?:top|bottom)\b(?=\s*(?::|,|panel|row|plot))", re.I)


def caption_layout_errors(art) -> list[str]:
    """A caption that places panels (left, right, middle, "Top:") on a figure whose panels are separate images."""
    out = []
    for fig in art.select("figure"):
        n = len(fig.select("img.lp-panel"))
        cap = fig.select_one("figcaption")
        if n < 2 or cap is None:
            continue
        text = " ".join(cap.get_text(" ").split())
        for m in _PLACE.finditer(text):
            a, b = max(0, m.start() - 40), min(len(text), m.end() + 40)
            out.append(f"caption places a panel ({m.group(0)!r}) but its {n} panels stack on a narrow screen: "
                       f"…{text[a:b]}…")
    return out


def checked_text(art) -> str:
    """The page's text as the generators' checks read it: code (inputs, inline code, preformatted output) left
    out as a marker, and every table cell, list item and paragraph fenced off (` ‖ `) so that a match cannot
    run from one cell into the next."""
    view = _soup(str(art))
    for el in view.select("script, style, div.cell_input, div.highlight, pre, a.headerlink"):
        el.decompose()
    for el in view.select("code"):
        el.replace_with(" ⟨code⟩ ")
    for el in view.select("td, th, li, p, dt, dd, caption, h1, h2, h3, h4, div.admonition-title"):
        el.insert_before(" ‖ ")
        el.insert_after(" ‖ ")
    return " ".join(view.get_text(" ").split())


def main_path_pages(toc: Path) -> set[str]:
    """The HTML pages (relative paths) of the main path's chapters, from the table of contents."""
    import yaml

    t = yaml.safe_load(toc.read_text())
    out = set()
    for part in t.get("parts", []):
        if part.get("caption") in MAIN_PARTS:
            for ch in part.get("chapters", []):
                out.add(ch["file"] + ".html")
    return out


def check_page(page: str, html: str, main: bool = False) -> PageText:
    soup = _soup(html)
    r = PageText(page, main=main)
    art = article(soup)
    r.words = prose_words(soup)
    r.all_words = all_words(soup)
    tables = [t for t in art.find_all("table")]
    r.tables = len(tables)
    for t in tables:
        r.errors += table_shape_errors(t)
        n = body_rows(t)
        r.longest_table = max(r.longest_table, n)
        if main and n > MAX_TABLE_ROWS and not t.find_parent(class_="lp-lab"):
            first = " ".join(t.get_text(" ").split())[:50]
            r.errors.append(f"a table of {n} rows on the main path (at most {MAX_TABLE_ROWS}): {first}")
    if main and r.words > MAX_WORDS:
        r.errors.append(f"{r.words:,} words of prose on a main-path chapter (at most {MAX_WORDS:,})")
    r.errors += text_errors(checked_text(art))
    r.errors += caption_layout_errors(art)
    return r


def check_site(root: str | Path, toc: str | Path | None = None, pages: list[str] | None = None) -> list[PageText]:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no built HTML here (run `make book` first)")
    main = main_path_pages(Path(toc)) if toc and Path(toc).is_file() else set()
    skip = {"_static", "_sources", "_images", "_sphinx_design_static", "_panels_static"}
    found = pages or [p.relative_to(root).as_posix() for p in sorted(root.rglob("*.html"))
                      if not (set(p.relative_to(root).parts[:-1]) & skip)
                      and p.name not in ("genindex.html", "search.html")]
    return [check_page(p, (root / p).read_text(errors="replace"), p in main) for p in found]


#: The first page's reading times may differ from the rendered words by at most this fraction.
READING_TOLERANCE = 0.10


def reading_time_errors(res: list[PageText], paths=None, words=None) -> list[str]:
    """The first page's reading paths (`lpfail.book.front.PATHS`, their words counted from the notebooks' stored
    outputs by `front.page_words`) against the words the built pages show (`all_words`): one error per path whose
    counts differ by more than `READING_TOLERANCE`, or whose page was not built."""
    from lpfail.book import front

    paths = front.PATHS if paths is None else paths
    words = front.page_words if words is None else words
    shown = {r.page: r.all_words for r in res}
    errors = []
    for reader, _what, pages in paths:
        missing = [p for p in pages if f"book/{p}.html" not in shown]
        if missing:
            errors.append(f"reading path '{reader}': {', '.join(missing)} not built")
            continue
        rendered = sum(shown[f"book/{p}.html"] for p in pages)
        counted = sum(words(p) for p in pages)
        if abs(counted / rendered - 1) > READING_TOLERANCE:
            errors.append(f"reading path '{reader}': {counted:,} words counted for its reading time, {rendered:,} "
                          f"rendered ({counted / rendered - 1:+.0%}, tolerance ±{READING_TOLERANCE:.0%})")
    return errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", nargs="?", default="_build/html")
    ap.add_argument("--toc", default="_toc.yml")
    ap.add_argument("--json", default="", help="write {page: words} here")
    a = ap.parse_args(argv)
    res = check_site(a.html, a.toc)
    for r in res:
        print(r.line())
    if a.json:
        Path(a.json).write_text(json.dumps({r.page: dataclasses.asdict(r) for r in res}, indent=1))
    bad = [r for r in res if not r.ok]
    reading = reading_time_errors(res) if any(r.page == "book/intro.html" for r in res) else []
    for e in reading:
        print(f"FAIL {e}")
    main_words = sum(r.words for r in res if r.main)
    print(f"book checks: {len(res) - len(bad)} pages passed, {len(bad)} failed; {sum(r.words for r in res):,} words "
          f"of prose in all ({sum(r.all_words for r in res):,} with tables and outputs), {main_words:,} on the main "
          f"path (≈ {main_words / WPM:.0f} min at {WPM} words/min)")
    return 1 if bad or reading else 0


if __name__ == "__main__":
    sys.exit(main())
