"""The verdict page, "What we reproduced": each claim of the paper judged from the stored results.

Nothing here is typed by hand: a verdict is a rule applied to the numbers in ``results/`` (through
``lpfail.results``), so the page changes when the evidence does. A claim whose evidence does not exist yet is
"not yet tested", never "reproduced". Explained on the book's page ``book/verdict.ipynb``.

Verdicts, from best to worst: ``reproduced``, ``partly``, ``not reproduced``, ``contradicted``; and
``not yet tested`` (no evidence), ``no claim to test`` (a measurement the paper makes no claim about).

The rules live with the chapter that shows their evidence, each chapter's report module exposing
``claims(load, stored)``: chapter 1 `lpfail.book.training_claims` (C0, C0-bias, C0-qk, C0-size; the explosion
search's old criteria in `lpfail.book.symptom_report`), chapter 2 `lpfail.book.substitution_report` (C1a–c),
chapter 3 `lpfail.book.gradient_report` (C2), chapter 4 `lpfail.book.rounding_report` (C3a, C3b, Fix-a),
chapter 5 `lpfail.book.fix_report` (Fix-b, Fix-c, Fix-β, Robust), chapter 6 `lpfail.book.beyond_report` (the
production kernels and the cures). This module holds their shared vocabulary (`Verdict`, the words, the
significance helpers, the sweep's word map), collects the claims (`verdicts`) and writes the page
(`page_markdown`, `summary_table`, `details`).

Significance everywhere is the 95 % confidence interval over rows that the ``rounding`` experiment stores
next to each mean (``NAME_ci``): a mean is *significantly positive* when ``mean - ci > 0``.

The training claims (C0, C0-bias, C0-qk, C0-size) are judged by the hypotheses pre-registered in
``lpfail.experiments.lr_sweep`` (H1–H4, bootstrap intervals over seeds), their words mapped onto this page's
by `SWEEP_WORDS`: supported → reproduced, inconclusive → not reproduced, refuted (the interval entirely on the
other side) → contradicted, and "no gap to close" or "not measured (runs missing)" → not yet tested. Where the
stored grid is incomplete the row says so: its verdict is on the complete part. C0 still reports the explosion
search (``symptom``, `lpfail.book.symptom_report.judge_symptom`) beside its verdict, without letting it decide.
"""
from __future__ import annotations

import dataclasses
import html
import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lpfail import results
from lpfail.book.text import interval, md_table
from lpfail.results import ResultError, results_dir

REPRODUCED = "reproduced"

PARTLY = "partly"

NOT_REPRODUCED = "not reproduced"

CONTRADICTED = "contradicted"

NOT_TESTED = "not yet tested"

NO_CLAIM = "no claim to test"

VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, CONTRADICTED, NOT_TESTED, NO_CLAIM)



@dataclasses.dataclass(frozen=True)
class Verdict:
    claim: str        # short id: "C1a", "C3b", "fix-bias", ...
    statement: str    # what the paper claims, in one sentence
    verdict: str      # one of VERDICTS
    evidence: str     # MyST Markdown: numbers, figures ({numref}), pages ({doc}), stored results
    rule: str         # the rule that produced the verdict
    differs: str = ""  # where our setting differs from the paper's
    note: str = ""    # a few words shown beside the verdict in the summary table (e.g. "partial grid")
    old: str = ""     # MyST Markdown: an earlier criterion's outcome, reported beside the verdict, not deciding it
    # What a rule of the paired-seed statistics may add (shown on the page when present; none of them decides
    # anything here): the seeds per variant, the test, its p value after the family's Holm correction, the
    # proxy the claim was tested on ({"size": ..., "steps": ..., "lr": ...}) and the family of hypotheses.
    seeds: int | None = None
    test: str = ""
    p_adjusted: float | None = None
    proxy: Mapping | None = None
    family: str = ""
    chapter: str = ""  # the page that shows the evidence ("01_symptom", ...), set by `verdicts`
    headline: str = ""  # the evidence in one line where the statistic is not the evidence's first (`one_line`)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS} (got {self.verdict!r})")


# -- small helpers, shared by the chapters' rules -------------------------------------------------------------

def as_float(x) -> float:
    """`x` (a number or a 0-d array) as a Python float."""
    return float(np.asarray(x))


def sig_pos(mean, ci) -> bool:
    """Mean significantly above zero (its 95 % CI excludes zero)."""
    return as_float(mean) - as_float(ci) > 0


def sig_neg(mean, ci) -> bool:
    return as_float(mean) + as_float(ci) < 0


def e4_text(mean, ci) -> str:
    """'+1.23 ± 0.45 ×10⁻⁴': a mean and its 95 % half-width in units of 10⁻⁴."""
    return f"{as_float(mean) * 1e4:+.2f} ± {as_float(ci) * 1e4:.2f} ×10⁻⁴"


def provenance_line(res) -> str:
    """Where a stored result comes from: its name, device, date, commit and config hash."""
    meta = getattr(res, "meta", None)
    if not meta:
        return "stored result (no provenance: fabricated for a test)"
    return (f"stored result `{meta.get('name')}`: {meta.get('device')}, {str(meta.get('created', ''))[:10]}, "
            f"git {', '.join(g[:7] for g in str(meta.get('git', '')).split())}, "
            f"config {str(meta.get('config_hash', ''))[:8]}")



# -- the sweeps' pre-registered words (lpfail.experiments.lr_sweep and the grids on its design) -------------------
#: The sweep's pre-registered words (its RULE) → this page's verdicts.
SWEEP_WORDS = {"supported": REPRODUCED, "inconclusive": NOT_REPRODUCED, "refuted": CONTRADICTED,
               "no gap to close": NOT_TESTED, "not measured (runs missing)": NOT_TESTED}


SWEEP_RULE = ("pre-registered word → verdict: supported (the paired bootstrap interval over the seeds — with 3 "
              "seeds, the seed range — entirely on the hypothesised side of 0) → reproduced; inconclusive (the interval contains 0) → not reproduced; refuted (entirely "
              "on the other side) → contradicted; not measured (runs missing) → not yet tested")


def sweep_hypothesis(a: Mapping, name: str) -> tuple[str, Mapping]:
    """(this page's verdict, the stored statistic) of hypothesis ``name`` of an lr_sweep analysis."""
    h = a.get("verdicts", {}).get(name) or {"point": None, "ci": None, "verdict": "not measured (runs missing)"}
    if h["verdict"] not in SWEEP_WORDS:
        raise ValueError(f"unknown lr_sweep verdict {h['verdict']!r} for {name}")
    return SWEEP_WORDS[h["verdict"]], h


def stat_text(h: Mapping) -> str:
    """'+0.083 [+0.057, +0.139]' (point, 95 % interval) or 'not measured'."""
    return interval(h, none="not measured")



# -- claims whose evidence does not exist yet ---------------------------------------------------------------

def pending(claim, statement, experiment, page, stored: Callable[[str], bool]) -> Verdict:
    note = (f"A stored result `{experiment}` exists, but no rule in `lpfail.book.verdict` judges it yet."
            if stored(experiment) else f"No stored result `{experiment}` yet; planned in {{doc}}`{page}`.")
    return Verdict(claim, statement, NOT_TESTED, note,
                   "no rule and no evidence yet: never counted as reproduced", "")


def load_or_none(load, name):
    """`load(name)`, or None when the result is missing or unreadable (a ResultError)."""
    try:
        return load(name)
    except ResultError:
        return None


def _stored(name: str) -> bool:
    return (results_dir() / f"{name}.json").exists()



# -- the page -----------------------------------------------------------------------------------------------
#: The chapters in the book's order, each with the report module whose ``claims(load, stored)`` judges its
#: claims (``lpfail.book.<module>``).
CHAPTERS = (("01_symptom", "training_claims"), ("02_substitution", "substitution_report"),
            ("03_gradient_error", "gradient_report"), ("04_rounding", "rounding_report"),
            ("05_fix", "fix_report"), ("06_beyond", "beyond_report"))


def verdicts(load: Callable[[str], Any] | None = None, stored: Callable[[str], bool] | None = None,
             worked_addition: tuple[float, float, str] | None = None) -> list[Verdict]:
    """Every claim's verdict, chapter by chapter, from the stored results (``load`` and ``stored`` may be
    replaced in tests; ``worked_addition`` replaces chapter 4's live `lpfail.bf16.paper_example`). Each verdict
    comes back with its ``chapter`` set."""
    load = load or results.load
    stored = stored or _stored
    out = []
    for page, module in CHAPTERS:
        mod = importlib.import_module(f"lpfail.book.{module}")
        kw = {"worked_addition": worked_addition} if module == "rounding_report" else {}
        out += [dataclasses.replace(v, chapter=v.chapter or page) for v in mod.claims(load, stored, **kw)]
    return out


def summary_table(vs: list[Verdict]) -> str:
    """The claims as one Markdown table (claim, statement, verdict), every cell escaped."""
    return md_table(["claim", "what is claimed", "our verdict"],
                    [[v.claim, v.statement, f"**{v.verdict}**" + (f" ({v.note})" if v.note else "")] for v in vs])


_STAT = re.compile(r"((?:S|L|\()[^;:]*?= [+−-]?\d[\d.]* \[[^\]]+\])")


def short_claim(v: Verdict, words: int = 14) -> str:
    """The claim in a few words: its statement up to the first colon or full stop, cut at ``words`` words."""
    head = re.split(r"(?<!Sec)(?<!e\.g)(?<!i\.e)(?<!vs)(?<=[a-z)])[:.](?:\s|$)", v.statement, maxsplit=1)[0].strip()
    groups = _word_groups(head.split())
    if sum(map(len, groups)) <= words:
        return head
    # cut: the asides in brackets left out whole, so that the words kept are the claim's own
    cut, more = [], False
    for group in (g for g in groups if not (len(g) > 1 and g[0].startswith("("))):
        if len(cut) + len(group) > words:
            more = True
            break
        cut += group
    if not more:
        return " ".join(cut)
    # never end on a word that needs the next one ('rounds to …', 'between …')
    while len(cut) > 3 and cut[-1].lower().strip(",;:") in _DANGLING:
        cut.pop()
    return " ".join(cut).rstrip(",;:") + " …"


def _word_groups(ws: list[str]) -> list[list[str]]:
    """``ws`` in groups: a word alone, or the words from one that opens a bracket to the one that closes it."""
    out, depth = [], 0
    for w in ws:
        if depth > 0:
            out[-1].append(w)
        else:
            out.append([w])
        depth = max(0, depth + w.count("(") + w.count("[") - w.count(")") - w.count("]"))
    return out


#: Words a cut claim may not end on.
_DANGLING = frozenset("a an the to at of in on by for from with and or than so as when where whose is are has "
                      "between".split())


#: A training verdict rests on this many paired seeds; a row on fewer says so in its one line.
TEN_SEEDS = 10


def seeds_words(v: Verdict) -> str:
    """'10 seeds', '5 seeds, fewer than ten', '1 run, fewer than ten' ('' where the rule has no seeds)."""
    if v.seeds is None:
        return ""
    n = f"{v.seeds} seeds" if v.seeds != 1 else "1 run"
    return n + (", fewer than ten" if v.seeds < TEN_SEEDS else "")


def one_line(v: Verdict, chars: int = 180) -> str:
    """The evidence in one line: the verdict's ``headline`` where it has one; for a paired-seed rule (a Holm p, or
    evidence that opens with its statistic) the statistic with its interval and Holm's p; otherwise the evidence's
    first sentence, cut at ``chars`` characters. Each followed by its seeds (`seeds_words`) where the rule has
    seeds."""
    seeds = seeds_words(v)
    if v.headline:
        return v.headline + (f"; {seeds}" if seeds else "")
    if (v.p_adjusted is not None or v.evidence.startswith("On our proxy, (")) and (m := _STAT.search(v.evidence)):
        return (f"{m.group(1)}; {seeds}" + (f", Holm p {v.p_adjusted:.2g}" if v.p_adjusted is not None else ""))
    first = re.split(r"(?<=[.;])\s", re.sub(r"^On our proxy, ", "", v.evidence), maxsplit=1)[0]
    first = re.sub(r"\{doc\}`[^`]*`|\{numref\}`[^`]*`", "", first).strip(" ;,.")
    if len(first) > chars:
        first = _cut(first, chars) + " …"
    return first + (f" ({seeds})" if seeds else "")


def _balanced(s: str) -> bool:
    return s.count("(") == s.count(")") and s.count("[") == s.count("]")


def _cut(text: str, chars: int) -> str:
    """``text`` cut to at most ``chars`` characters at the last whole clause ('; ', ' and ', ', ' outside brackets)
    in its second half, else at a word: a cut row never ends inside an interval or on 'at' before its number."""
    head = text[:chars]
    for sep in ("; ", " and ", ", "):
        i = head.rfind(sep)
        while i > chars // 2 and not _balanced(head[:i]):
            i = head.rfind(sep, 0, i)
        if i > chars // 2:
            return head[:i].rstrip(" ,;(")
    return head.rsplit(" ", 1)[0].rstrip(" ,;(")


def claims_table(vs: list[Verdict]) -> str:
    """Every claim in one table — the claim in words, our verdict, the evidence in one line, its chapter — cells
    escaped; the verdict a coloured label that says the word."""
    return md_table(["claim", "what is claimed", "our verdict", "evidence", "chapter"],
                    [[v.claim, short_claim(v), status_html(v.verdict), one_line(v), f"{{doc}}`{v.chapter}`"]
                     for v in vs])


def _extras(v: Verdict) -> list[str]:
    """The optional fields of the paired-seed rules, as bullets (only those present)."""
    out = []
    if v.family:
        out.append(f"- **Family of hypotheses.** {v.family}")
    if v.seeds is not None:
        out.append(f"- **Seeds.** {v.seeds} per variant")
    if v.test:
        out.append(f"- **Test.** {v.test}")
    if v.p_adjusted is not None:
        out.append(f"- **p, Holm-adjusted within the family.** {v.p_adjusted:.3g}")
    if v.proxy:
        parts = [f"{k} {v.proxy[k]}" for k in ("size", "steps", "lr") if k in v.proxy]
        parts += [f"{k} {x}" for k, x in v.proxy.items() if k not in ("size", "steps", "lr")]
        out.append("- **Proxy.** " + "; ".join(parts))
    return out


def details(vs: list[Verdict]) -> str:
    """Each claim's evidence, rule, optional fields, old criterion and differences, as Markdown bullets."""
    parts = []
    for v in vs:
        parts.append(f"**{v.claim} — {v.verdict}.** *{v.statement}*\n\n"
                     f"- **Evidence.** {v.evidence}\n- **Rule.** {v.rule}\n"
                     + "".join(x + "\n" for x in _extras(v))
                     + (f"- **Old criterion, beside the verdict (it does not decide it).** {v.old}\n" if v.old else "")
                     + (f"- **Where our setting differs.** {v.differs}\n" if v.differs else ""))
    return "\n".join(parts)


def counts(vs: list[Verdict]) -> dict[str, int]:
    return {k: n for k in VERDICTS if (n := sum(v.verdict == k for v in vs))}


#: CSS class of each verdict's coloured status (_static/lpfail.css); the word is always written too.
STATUS_CLASS = {REPRODUCED: "lp-st-reproduced", PARTLY: "lp-st-partly", NOT_REPRODUCED: "lp-st-not-reproduced",
                CONTRADICTED: "lp-st-contradicted", NOT_TESTED: "lp-st-not-tested", NO_CLAIM: "lp-st-no-claim"}


def status_html(verdict: str) -> str:
    """The coloured status of a verdict: a small label that always says the word."""
    return f'<span class="lp-status {STATUS_CLASS[verdict]}">{html.escape(verdict)}</span>'


def claim_markdown(v: Verdict) -> str:
    """One claim on the verdict page: its coloured status and statement in one line, its evidence, rule and
    setting in a collapsed box below (MyST Markdown)."""
    note = f" *({v.note})*" if v.note else ""
    body = [f"- **Evidence.** {v.evidence}", f"- **Rule.** {v.rule}", *_extras(v)]
    if v.old:
        body.append(f"- **Old criterion, beside the verdict (it does not decide it).** {v.old}")
    if v.differs:
        body.append(f"- **Where our setting differs.** {v.differs}")
    return (f"{status_html(v.verdict)} **{v.claim}.** {v.statement}{note}\n\n"
            f":::{{admonition}} {v.claim}: evidence, rule and setting\n:class: dropdown lp-evidence\n"
            + "\n".join(body) + "\n:::\n")


def page_markdown(vs: list[Verdict], titles: Mapping[str, str] | None = None) -> str:
    """The verdict page's body: per chapter (in the book's order) a heading that links to it, then each of its
    claims (`claim_markdown`)."""
    out, seen = [], []
    for v in vs:
        if v.chapter not in seen:
            seen.append(v.chapter)
    for page in seen:
        title = (titles or {}).get(page)
        out.append(f"### {title}\n\n{{doc}}`Read the chapter <{page}>`\n" if title else f"### {{doc}}`{page}`\n")
        out += [claim_markdown(v) for v in vs if v.chapter == page]
    return "\n".join(out)



# -- the tally and the pre-registration record ------------------------------------------------------------------
#: The paper's own claims; every other row is ours (a remedy or a mechanism from the later literature, the premise
#: of the proxy, the robust fix, the production kernels).
PAPER_CLAIMS = ("C0", "C0-bias", "C1a", "C1b", "C1c", "C2", "C3a", "C3b", "Fix-a", "Fix-b", "Fix-c", "Fix-β")
#: Rows that test the same change as another row (on other runs of the same proxy): shown, counted once, under the other.
SAME_EVIDENCE = {"K-cure:qk": "C0-qk", "K-cure:hp": "C1c"}


def tally(vs: list[Verdict]) -> dict:
    """The verdicts counted in two parts, each claim once: {"paper": counts, "ours": counts, "same": {row: row it
    tests the same change as}}."""
    once = [v for v in vs if v.claim not in SAME_EVIDENCE]
    return {"paper": counts([v for v in once if v.claim in PAPER_CLAIMS]),
            "ours": counts([v for v in once if v.claim not in PAPER_CLAIMS]),
            "same": {k: x for k, x in SAME_EVIDENCE.items() if any(v.claim == k for v in vs)}}


def tally_markdown(vs: list[Verdict]) -> str:
    """The tally in words: the paper's claims, then ours, and which rows are counted under another."""
    t = tally(vs)
    say = lambda c: ", ".join(f"{n} {k}" for k, n in c.items()) or "none"  # noqa: E731
    n_paper, n_ours = sum(t["paper"].values()), sum(t["ours"].values())
    out = (f"Of the paper's {n_paper} claims: {say(t['paper'])}. Of our own {n_ours} (remedies and mechanisms from "
           f"the later literature, the premise of the proxy, the robust fix, the production kernels): {say(t['ours'])}.")
    if t["same"]:
        out += (" Counted once: " + "; ".join(f"{k} tests the same change as {x}" for k, x in t["same"].items())
                + ", so each is counted under the latter only.")
    return out


def preregistered() -> tuple[str, ...]:
    """Every registered experiment that declares a pre-registration (``PREREGISTERED_ON`` on its function, else on
    its module: `_declared`), in the order the rules were fixed (then by name): derived from the experiments
    themselves, never a hand-kept list."""
    found = []
    for name, exp in results.registry().items():
        when = _declared(exp.fn, "PREREGISTERED_ON")
        if when:
            found.append((str(when), name))
    return tuple(name for _, name in sorted(found))


def _declared(fn, attr: str):
    """An experiment's declaration: the attribute on its function (a module holding two experiments with two rules
    sets it there), else on its module."""
    return getattr(fn, attr, None) or getattr(importlib.import_module(fn.__module__), attr, None)
#: A rule whose data had been seen in part before its final form, where the experiment module has no `SEEN`.
RECORD_EXTRA = {
    "fix_sweep": ("the robust fix's rule (`lpfail.book.fix_report`), not dated in code",
                  "the first run, at half the rows per point, read 'partly' on one borderline point; the rows were "
                  "doubled and the run repeated, after which it read 'reproduced' — both runs' outcomes were seen"),
}


def preregistration_record() -> list[list[str]]:
    """[experiment, rule fixed on, what had been seen then] per pre-registered experiment (from each module's
    ``PREREGISTERED_ON`` and ``SEEN``, with its ``AMENDMENT`` where it has one), then `RECORD_EXTRA`."""
    rows = []

    for name in preregistered():
        fn = results.get(name).fn
        seen = str(_declared(fn, "SEEN") or "not recorded")
        if _declared(fn, "AMENDMENT") and _declared(fn, "AMENDED_ON"):
            seen += f" Amended {_declared(fn, 'AMENDED_ON')}: {_declared(fn, 'AMENDMENT')}"
        rows.append([f"`{name}`", str(_declared(fn, "PREREGISTERED_ON")), seen])
    rows += [[f"`{name}`", when, seen] for name, (when, seen) in RECORD_EXTRA.items()]
    return rows


def record_markdown() -> str:
    """The pre-registration record as a Markdown table (cells escaped)."""
    return md_table(["experiment", "rule fixed", "seen before the rule"], preregistration_record())
