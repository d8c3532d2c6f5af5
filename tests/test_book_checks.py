"""tools/book_checks.py (the static checks of the built book) on pages it must accept and pages it must reject,
and the text helpers that keep generated text from breaking (lpfail.book.text)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import book_checks as B  # noqa: E402


def page(body: str) -> str:
    return f"<html><body><main><article class='bd-article'>{body}</article></main></body></html>"


GOOD = page("<h1>A chapter</h1><p>Words of prose, and a value 0.5 to 0.7.</p>"
            "<div class='cell'><div class='cell_input'><pre>print('code is not prose')</pre></div></div>"
            "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr>"
            "<tr><td colspan='2'>spans both</td></tr></table>")


def test_a_good_page_passes_and_its_prose_is_counted():
    r = B.check_page("good.html", GOOD, main=True)
    assert r.ok, r.errors
    assert r.words == 11 and r.tables == 1 and r.longest_table == 3  # the code and the table are not prose


def test_unequal_rows_are_rejected():
    r = B.check_page("bad.html", page("<table><tr><td>claim</td><td>verdict</td><td>evidence</td></tr>"
                                      "<tr><td>sdpa_flash</td><td>O</td><td>rest</td><td>of the cell</td></tr>"
                                      "</table>"))
    assert any("unequal cell count [3, 4]" in e for e in r.errors), r.errors
    ok = B.check_page("span.html", page("<table><tr><td rowspan='2'>a</td><td>b</td></tr><tr><td>c</td></tr></table>"))
    assert ok.ok, ok.errors  # a rowspan carried down is not a short row


@pytest.mark.parametrize("text, what", [
    ("the production kernels keep -8.86 to -8.86 (their pull", "degenerate range"),
    ("from 3 % to 3 % of the time", "degenerate range"),
    ("steps 51–51", "degenerate range"),
    ("(stored: stored) does", "repeated value"),
    ("its error nan ± nan", "placeholder"),
    ("a value of None here", "placeholder"),
    ("an unrendered {glue:text}`x`", "placeholder"),
    ("| variant | runs | |---|---| | A | 5 |", "Markdown table not rendered"),
    ("| variant | runs | |—|—| | A | 5 |", "Markdown table not rendered"),
])
def test_generated_garbage_is_rejected(text, what):
    r = B.check_page("bad.html", page(f"<p>{text}</p>"))
    assert any(e.startswith(what) for e in r.errors), r.errors


def test_what_reads_fine_is_not_flagged():
    r = B.check_page("fine.html", page("<p>None of the fixes works. From -8.86 to -8.70; 3–4 runs; turned NaN at step 5; results: "
                                       "<code>results/x.json</code>; <code>fix=None</code></p>"
                                       "<table><tr><td>run</td></tr><tr><td>run</td></tr></table>"))
    assert r.ok, r.errors


def test_main_path_limits():
    long = page("<p>" + "word " * (B.MAX_WORDS + 1) + "</p>")
    assert any("words of prose on a main-path chapter" in e for e in B.check_page("x.html", long, main=True).errors)
    assert B.check_page("x.html", long, main=False).ok  # a lab page may be long
    rows = "".join(f"<tr><td>{k}</td></tr>" for k in range(B.MAX_TABLE_ROWS + 1))
    tall = page(f"<table><thead><tr><th>h</th></tr></thead><tbody>{rows}</tbody></table>")
    assert any("a table of 11 rows on the main path" in e for e in B.check_page("x.html", tall, main=True).errors)
    assert B.check_page("x.html", tall, main=False).ok


def test_main_path_pages_come_from_the_toc(tmp_path):
    toc = tmp_path / "_toc.yml"
    toc.write_text("format: jb-book\nroot: book/intro\nparts:\n  - caption: The argument\n    chapters:\n"
                   "      - file: book/01_symptom\n  - caption: Lab notebook\n    chapters:\n      - file: book/lab_01\n")
    assert B.main_path_pages(toc) == {"book/01_symptom.html"}
    assert "book/01_symptom.html" in B.main_path_pages(ROOT / "_toc.yml")


def test_md_table_escapes_cells_and_refuses_ragged_rows():
    from lpfail.book.text import md_table

    t = md_table(["method", "toward larger |O|"], [["`sdpa_flash`", "-10.45 | ± 0.20"]])
    assert t.count("\\|") == 3 and t.splitlines()[2].count(" | ") == 1
    with pytest.raises(ValueError, match="row 0 has 1 cells"):
        md_table(["a", "b"], [["only one"]])


def test_span_never_reads_x_to_x():
    from lpfail.book.text import listing, sentence, span

    assert span(-8.86, -8.86, "+.2f") == "-8.86" and span(1, 2.5, "g", unit=" %") == "1 % to 2.5 %"
    assert span(0.1234, 0.1236, ".2f") == "0.12"  # equal once formatted
    assert listing([]) == "none" and listing(["a", "b", "c"]) == "a, b and c"
    assert sentence("the bias is real") == "The bias is real." and sentence("`x` holds.") == "`x` holds."


def test_reading_times_must_match_the_rendered_words_within_the_tolerance():
    res = [B.PageText("book/intro.html", all_words=10), B.PageText("book/a.html", all_words=1000),
           B.PageText("book/b.html", all_words=500)]
    paths = [("someone", "what", ("a", "b"))]
    assert B.reading_time_errors(res, paths, {"a": 1000, "b": 420}.get) == []   # −5 %
    err = B.reading_time_errors(res, paths, {"a": 700, "b": 420}.get)              # −25 %
    assert len(err) == 1 and "1,120 words counted" in err[0] and "1,500 rendered" in err[0]
    assert "not built" in B.reading_time_errors(res, [("x", "y", ("a", "c"))], {"a": 1, "c": 1}.get)[0]


def test_page_words_keeps_prose_after_a_less_than_sign():
    import nbformat

    from lpfail.book import front

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("when a < b the sum rounds " + "word " * 50),
                nbformat.v4.new_markdown_cell("and b > c keeps " + "more " * 50)]
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        nbformat.write(nb, str(Path(d) / "p.ipynb"))
        assert front.page_words("p", Path(d)) >= 110


def _fig(n_panels: int, caption: str) -> str:
    imgs = "".join("<img class='lp-panel' src='x.png'/>" for _ in range(n_panels))
    return page(f"<figure><div class='lp-fig'>{imgs}</div><figcaption><p>{caption}</p></figcaption></figure>")


def test_a_caption_may_not_place_panels_that_stack_on_a_phone():
    assert B.check_page("p.html", _fig(2, "Left: the loss. Right: the logits.")).errors
    assert B.check_page("p.html", _fig(3, "the bias vanishes at a 50/50 balance (middle)")).errors
    assert B.check_page("p.html", _fig(2, "Top: the loss; bottom panel: the logits")).errors
    ok = _fig(2, "First panel: the loss. Second: the logits; the curves lie on top of each other.")
    assert B.check_page("p.html", ok).errors == []
    assert B.check_page("p.html", _fig(1, "Top: P̄ along the keys. Bottom, left: the error.")).errors == []
