"""lpfail.book.text: outputs that fit the book's column."""
import pytest


def test_book_text_wraps_to_the_column():
    from lpfail.book import text as T

    long = "word " * 60
    out = T.wrap("  " + long + "\nshort\n\nend")
    lines = out.splitlines()
    assert all(len(x) <= T.WIDTH for x in lines) and lines[0].startswith("  word") and lines[1].startswith("    ")
    assert "short" in lines and "" in lines and lines[-1] == "end"
    assert T.wrap("x" * 200).count("\n") >= 2  # a single long token is broken too
    assert "&lt;tag&gt;" in T.pre_html("<tag>") and "pre-wrap" in T.pre_html("a")
    with pytest.raises(ValueError):
        T.wrap("a", width=5)


def test_interval_formats_a_statistic_or_says_none():
    from lpfail.book.text import interval

    d = {"point": 0.0829, "ci": [0.0567, 0.1386]}
    assert interval(d) == "+0.083 [+0.057, +0.139]"
    assert interval({"point": 0.35, "ci": [0.2, 0.48]}, ".0f", scale=100) == "35 [20, 48]"
    assert interval(None) == "—" and interval({"point": None, "ci": None}, none="not measured") == "not measured"


def test_numbers_in_table_cells_never_break_and_identifiers_break_only_where_allowed():
    import re

    from lpfail.book import fix_widgets
    from lpfail.book.text import ZWSP, breakable, nowrap_numbers

    assert nowrap_numbers("<td>-1.4e-03 ± 7.4e-05</td>") == (
        '<td><span class="lp-num">-1.4e-03</span> ± <span class="lp-num">7.4e-05</span></td>')
    assert nowrap_numbers("<td>0.00169</td><code>1e-05</code>") == "<td>0.00169</td><code>1e-05</code>"
    assert nowrap_numbers("<td>048e337</td>") == "<td>048e337</td>"  # a git hash, not a number
    assert breakable("PAPER_BF16,l_div=fp32") == f"PAPER_{ZWSP}BF16,{ZWSP}l_{ZWSP}div={ZWSP}fp32"
    h = fix_widgets.state_html(*fix_widgets.GALLERY[0][1:])  # the fix explorer's table (chapter 5)
    cells = re.findall(r"<td>(.*?)</td>", h)
    assert cells and all("e-" not in re.sub(r'<span class="lp-num">[^<]*</span>', "", c) for c in cells), cells


def test_appendix_number_formats():
    from lpfail.book.text import rate, small_number, two_sig
    assert [small_number(x) for x in (0.0, 6.101e-4, 0.06783, -2.2e-3)] == ["0", "6.1e-4", "0.068", "-2.2e-3"]
    assert [two_sig(x) for x in (421.6, 37.5, 4.69, 1251.0)] == ["420", "38", "4.7", "1,300"]
    assert [rate(x) for x in (6e-4, 1.5e-3, 8e-3, 0.1)] == ["6e-4", "1.5e-3", "8e-3", "0.1"]
