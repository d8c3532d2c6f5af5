"""One claim, one word, one number on every page (issue 41): the claims registry (`lpfail.book.claims`) against the
stored outputs of the book's pages (`lpfail.book.claim_check`), and the check shown to fail on doctored copies.

Nothing here types a result: every word and number comes from results/ through the registry, and the doctored
copies are made by changing what the registry says into something else."""
import json
from pathlib import Path

import pytest

from lpfail import results
from lpfail.book import claim_check as CC
from lpfail.book import claims as CL
from lpfail.book import verdict as V

BOOK = Path(__file__).resolve().parent.parent / "book"
LABS = tuple(p.stem for p in sorted(BOOK.glob("lab_*.ipynb")))


@pytest.fixture(scope="module")
def vs():
    return V.verdicts()


@pytest.fixture(scope="module")
def reg(vs):
    return CL.from_verdicts(vs)


@pytest.fixture(scope="module")
def pages():
    return {name: CC.page_texts(json.loads((BOOK / f"{name}.ipynb").read_text())) for name in CC.MAIN_PATH + LABS}


def _text(pages, page, where):
    return next(t for w, t in pages[page] if w == where)


def _doctor(pages, page, where, old, new):
    """A copy of ``pages`` with ``old`` replaced by ``new`` in one stored output (which must contain it)."""
    text = _text(pages, page, where)
    assert old in text, (page, where, old)
    return {**pages, page: [(w, t.replace(old, new) if w == where else t) for w, t in pages[page]]}


def _other_word(word):
    return next(w for w in (V.PARTLY, V.REPRODUCED) if w != word)


def _other_number(iv):
    """``iv`` ('point [lo, hi]') with its lower bound moved by one in the last digit: the same quantity, a
    different number."""
    point, rest = iv.split(" [")
    lo, hi = rest.rstrip("]").split(", ")
    digits = len(lo.split(".")[1])
    moved = f"{float(lo) - 10 ** -digits:+.{digits}f}"
    return f"{point} [{moved}, {hi}]"


# -- the registry --------------------------------------------------------------------------------------------
def test_registry_lists_every_claim_of_the_verdict_page_once(reg, vs):
    assert list(reg) == [v.claim for v in vs]
    for v in vs:
        c = reg[v.claim]
        assert c.word == v.verdict and c.chapter == v.chapter and c.seeds == v.seeds
        assert V.one_line(v).startswith(c.headline[:60])


def test_every_paired_seed_claim_has_its_headline_numbers(reg):
    """A claim judged on paired seeds states at least one interval, each parsed with its value."""
    for c in reg.values():
        if c.seeds is not None and c.seeds > 1 and c.word != V.NOT_TESTED:
            assert c.numbers, c.id
            for _, iv in c.numbers:
                assert iv in CL.norm(c.headline)


def test_the_prose_functions_are_the_registry(reg):
    """Fix-b and C0-size: the functions chapter 1, 5 and 6 call give the verdict page's word and numbers."""
    conf = results.load("confirmation")
    fb = CL.fix_b(conf["analysis"])
    assert (fb.word, fb.numbers) == (reg["Fix-b"].word, reg["Fix-b"].numbers)
    assert reg["Fix-b"].headline.startswith(fb.headline)
    assert {lab for lab, _ in fb.numbers} >= {"at 0.016", "at 0.032"}
    cs = CL.c0_size(conf)
    assert (cs.word, cs.seeds, cs.numbers) == (reg["C0-size"].word, reg["C0-size"].seeds, reg["C0-size"].numbers)


# -- the pages agree ---------------------------------------------------------------------------------------------
def test_every_page_states_each_claim_as_the_registry(reg, pages):
    assert CC.conflicts(pages, reg) == []


def test_the_check_reads_the_pages_where_they_name_claims(reg, pages):
    """The check is not vacuous: it finds Fix-b's word on the first page and chapters 1, 5, 6 and the verdict page,
    and Fix-b's numbers at both rates on chapters 5 and 6."""
    found = {p for p, texts in pages.items() for _, t in texts
             if any("Fix-b" in ids for ids, _, _ in CC.bindings(t, reg))}
    assert {"intro", "01_symptom", "05_fix", "06_beyond", "verdict"} <= found
    for page, where in (("05_fix", "ten_fix_found:text/markdown"), ("06_beyond", "official_fix:text/markdown")):
        text = _text(pages, page, where)
        for lab, iv in reg["Fix-b"].numbers:
            assert CC.labelled(text, lab) == [iv], (page, lab)


# -- and it fails where they do not --------------------------------------------------------------------------------
@pytest.mark.parametrize("page,where", [("05_fix", "ten_fix_found:text/markdown"),
                                        ("06_beyond", "official_fix:text/markdown"),
                                        ("intro", "findings:text/markdown")])
def test_a_wrong_word_is_caught(reg, pages, page, where):
    word = reg["Fix-b"].word
    text = _text(pages, page, where)
    old = next(s for s in (f"Fix-b: *{word}*", f"Fix-b): *{word}*", f"reads *{word}*") if s in text)
    bad = _doctor(pages, page, where, old, old.replace(word, _other_word(word)))
    found = CC.conflicts(bad, reg)
    assert found and all(page in f and "Fix-b" in f for f in found), found


def test_a_wrong_word_in_the_verdict_table_or_the_chain_is_caught(reg, pages):
    c = reg["C0-size"]
    row = next(ln for ln in _text(pages, "verdict", "claims_table:text/markdown").splitlines()
               if ln.startswith("| C0-size |"))
    new = row.replace(f">{c.word}</span>", f">{_other_word(c.word)}</span>")
    assert CC.conflicts(_doctor(pages, "verdict", "claims_table:text/markdown", row, new), reg)
    chain = _text(pages, "intro", "chain_claims:text/plain")
    link = next(s for s in chain.strip("'\"").split("; ") if "Fix-b" in s)
    mark = link.split(" → ")[1]
    assert CC.conflicts(_doctor(pages, "intro", "chain_claims:text/plain", link,
                                link.replace(mark, "reproduced" if mark != "reproduced" else "not reproduced")), reg)
    glue = _text(pages, "01_symptom", "size_word:text/plain")
    assert CC.conflicts(_doctor(pages, "01_symptom", "size_word:text/plain", glue,
                                glue.replace(c.word, _other_word(c.word), 1)), reg)


@pytest.mark.parametrize("page,where", [("05_fix", "ten_fix_found:text/markdown"),
                                        ("06_beyond", "official_fix:text/markdown"),
                                        ("verdict", "claims_table:text/markdown")])
def test_a_wrong_number_is_caught(reg, pages, page, where):
    """Fix-b's number at its first rate with one bound changed (a variant of the same number), and replaced by a
    number that shares nothing with it (caught only where a page binds it to its label and claim)."""
    lab, iv = reg["Fix-b"].numbers[0]
    text = _text(pages, page, where)
    written = next(w for w in (iv, iv.replace("-", "−")) if w in text)
    found = CC.conflicts(_doctor(pages, page, where, written, _other_number(iv)), reg)
    assert any(page in f and "Fix-b" in f for f in found), found
    point, rest = iv.split(" [")
    lo, hi = rest.rstrip("]").split(", ")
    shift = lambda x: f"{float(x) + 0.5:+.3f}"  # noqa: E731
    found = CC.conflicts(_doctor(pages, page, where, written, f"{shift(point)} [{shift(lo)}, {shift(hi)}]"), reg)
    assert any(page in f and f"Fix-b's {lab}" in f for f in found), found


def test_the_old_criterion_is_not_the_headline(reg, pages):
    """The verdict page shows an earlier rule's numbers beside some verdicts (another rule, on other seeds); those
    are left out, and only those: the same number in the evidence bullet is caught."""
    text = _text(pages, "verdict", "cell 3:text/markdown")
    lab, iv = reg["C0-size"].numbers[0]
    bullet = next(ln for ln in text.splitlines() if ln.startswith("- **Evidence.**") and iv in CL.norm(ln)
                  and lab in ln)
    written = next(w for w in (iv, iv.replace("-", "−")) if w in bullet)
    bad = _doctor(pages, "verdict", "cell 3:text/markdown", bullet, bullet.replace(written, _other_number(iv)))
    assert any("C0-size" in f for f in CC.conflicts(bad, reg))


def test_a_statistic_stated_without_its_claim_id_is_checked_too(reg, pages):
    """Chapter 1 states C0-bias's statistic in its prose (the glued number after the statistic's name), without
    the claim's id: a different number there is caught."""
    lab, iv = reg["C0-bias"].numbers[0]
    where, text = next((w, t) for w, t in pages["01_symptom"] if w.startswith("md ") and CC.labelled(t, lab))
    assert CC.labelled(text, lab) == [iv]
    written = next(w for w in (iv, iv.replace("-", "−")) if w in text)
    point, rest = iv.split(" [")
    other = f"{float(point) + 0.5:+.3f} [{rest}"
    found = CC.conflicts(_doctor(pages, "01_symptom", where, written, other), reg)
    assert any("01_symptom" in f and "C0-bias" in f for f in found), found
