"""The browser check's judgement of the first page (tools/browser_check.first_screen_errors), without a browser."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import browser_check  # noqa: E402

OK = {"thesis": 300.0, "thesisTop": 200.0, "todo": 320.0, "end": 700.0, "items": 5, "before": []}


def test_an_answer_on_the_first_screen_passes():
    assert browser_check.first_screen_errors(OK, 1280) == []
    assert browser_check.first_screen_errors({**OK, "end": 1500.0}, 400) == []  # on a phone only the order counts


def test_an_answer_below_the_first_screen_or_after_something_else_fails():
    assert "below the first 800 px" in browser_check.first_screen_errors({**OK, "end": 820.0}, 1280)[0]
    assert browser_check.first_screen_errors({**OK, "before": ["IMG "]}, 400) == ["at 400 px, before the answer: IMG "]
    assert browser_check.first_screen_errors({**OK, "thesis": None}, 1280)[0].startswith("the first page has no")
    assert browser_check.first_screen_errors({**OK, "items": 0}, 1280) == ["the first page has no 'What to do' list"]
    assert "comes before the answer" in browser_check.first_screen_errors({**OK, "todo": 100.0}, 1280)[0]
