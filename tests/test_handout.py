"""Chapter 4's handout (`lpfail.book.handout`, `rounding_report.write_handout`) and its quiz's computed answers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpfail.book import handout
from lpfail.book import rounding_report as RR

BOOK = Path(__file__).resolve().parent.parent / "book"
CHAPTER = BOOK / "04_rounding.ipynb"


def _nb(tmp_path, *markdown):
    path = tmp_path / "x.ipynb"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_stored_handout_is_current():
    """The committed handout is what the chapter's exercises give now (re-executing chapter 4 rewrites it)."""
    stored = (BOOK / RR.HANDOUT).read_text()
    assert stored == handout.handout_markdown(CHAPTER, RR.HANDOUT_TITLE, RR.HANDOUT_INTRO)


def test_handout_has_every_question_and_no_solution():
    text = (BOOK / RR.HANDOUT).read_text()
    found = handout.exercises(CHAPTER)
    assert [h for h, _, _ in found].count("Exercises") == 6
    assert [h for h, _, _ in found].count("Closing quiz") == 5
    for _, _, question in found:
        assert question in text
    for word in ("{solution", "{glue", "{ref}", ":label:", ":class:", "dropdown"):
        assert word not in text
    # a line from a solution of the chapter never reaches the handout
    assert "tie→even" not in text and "stochastic rounding is unbiased" not in text


def test_parser_groups_by_heading_and_skips_solutions(tmp_path):
    nb = _nb(tmp_path, "## A\n\n```{exercise}\n:label: e1\n\nFirst?\n```\n\n````{solution} e1\n:class: dropdown\n\n"
                       "Secret.\n````\n", "## B\n\n:::{exercise}\n:label: e2\nSecond?\n:::\n")
    assert handout.exercises(nb) == [("A", "e1", "First?"), ("B", "e2", "Second?")]
    text = handout.handout_markdown(nb, "T", "Intro.")
    assert text.startswith("# T\n\nIntro.\n\n## A\n\n**1.** First?") and "## B\n\n**1.** Second?" in text
    assert "Secret" not in text


def test_parser_refuses_roles_and_unclosed(tmp_path):
    with pytest.raises(ValueError, match="MyST role"):
        handout.handout_markdown(_nb(tmp_path, "```{exercise}\n:label: e\nSee {numref}`fig-x`.\n```\n"), "T")
    with pytest.raises(ValueError, match="never closed"):
        handout.exercises(_nb(tmp_path, "```{exercise}\n:label: e\nOpen?\n"))


def test_write_handout_writes_only_on_change(tmp_path):
    nb = _nb(tmp_path, "```{exercise}\n:label: e\nQ?\n```\n")
    out = handout.write_handout(nb, tmp_path / "h" / "x.md", "T")
    mtime = out.stat().st_mtime_ns
    handout.write_handout(nb, out, "T")
    assert out.stat().st_mtime_ns == mtime and "**1.** Q?" in out.read_text()


def test_quiz_facts():
    f = RR.quiz_facts()
    assert (f["q1_ulp"], f["q1_result"]) == ("0.125", "16.25")          # 16.3 in [16, 32): ulp 2^-3
    assert (f["q2_result"], f["q2_direction"]) == ("1.015625", "away from zero")  # a tie to the even 0000010
    assert (f["q3_result"], f["q3_direction"], f["q3_rounding_bit"]) == ("-4.6875", "toward zero", "0")
    assert (f["q4_decision"], f["q4_result"]) == ("exact", "-2.75")
    assert (f["q4b_decision"], f["q4b_result"]) == ("tie→even", "-2.75")
    assert (f["plan_case1"], f["plan_case2"]) == ("-4.71875", "-4.6875")
    assert f["q5_p3"] == "0.0498046875" and f["q5_err3"].startswith("+") and f["q5_err4"].startswith("-")
