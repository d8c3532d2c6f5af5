"""The book's first page: the answer in one screen, generated from the verdicts (`lpfail.book.verdict`) and the
stored results, never typed.

* `findings(vs, load)` — five or six sentences of what we found, each linked to its chapter. Each sentence has
  the wording for the outcome it expects and a plain fallback that states the verdicts when the outcome differs,
  so the page follows the evidence when the notebook is re-executed.
* `chain(vs)` — the paper's causal chain (its Fig. 1), each link marked reproduced / partly / not reproduced /
  not yet tested by `link_status` over the claims that test it; `lpfail.book.plots.causal_chain` draws it.
* `reading_paths()` — who should read what, and how long each path takes at `tools/book_checks.WPM` words a
  minute, from the words of prose the pages hold now.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import nbformat

from lpfail import results
from lpfail.book import beyond_report, dial_report, symptom_report
from lpfail.book.text import SIZE_WORDS, listing
from lpfail.book.verdict import (CONTRADICTED, NO_CLAIM, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED, Verdict,
                                 load_or_none)

#: Words a minute (the same as tools/book_checks.py's WPM).
WPM = 200
BOOK = Path(__file__).resolve().parents[2] / "book"


def by_claim(vs: list[Verdict]) -> dict[str, Verdict]:
    return {v.claim: v for v in vs}


def _is(v: Verdict | None, *words) -> bool:
    return v is not None and v.verdict in words


def _status(vs: Mapping[str, Verdict], *claims) -> str:
    """'C3b reproduced, C3a reproduced' (the verdicts of ``claims``, as the fallback sentences say them)."""
    return listing([f"{c} {vs[c].verdict}" for c in claims if c in vs], none="no verdict")


# -- the findings -------------------------------------------------------------------------------------------------
def _bias(vs) -> str:
    a, b = vs.get("C3a"), vs.get("C3b")
    if _is(a, REPRODUCED) and _is(b, REPRODUCED):
        return ("**The rounding bias is real and bit-exact:** the paper's worked addition comes out bit for bit, "
                "and rows with tied maxima round away from zero ({doc}`04_rounding`).")
    return f"**The rounding bias:** {_status(vs, 'C3a', 'C3b')} ({{doc}}`04_rounding`)."


def _size(conf: Mapping | None, key: str) -> str:
    """'8 × 512': a size of the confirmation grid's config ('the larger size' / 'the smaller size' without it)."""
    cfg = (getattr(conf, "meta", None) or {}).get("config") or {}
    return f"{cfg[key][0]} × {cfg[key][-1]}" if cfg.get(key) else f"the {SIZE_WORDS.get(key, key)} size"


def _harm(vs, conf: Mapping | None = None) -> str:
    c0 = vs.get("C0")
    if _is(c0, REPRODUCED):
        cs = vs.get("C0-size")
        size = (f", more so at {_size(conf, 'large')} than at {_size(conf, 'small')}"
                + (f" (on {cs.seeds} seeds)" if (cs.seeds or 10) < 10 else "") if _is(cs, REPRODUCED) else "")
        return (f"**On {proxy_words(conf)}, the paper's arithmetic harms training:** a worse loss than FP32 "
                f"attention at high learning rates{size}, though not the paper's explosion ({{doc}}`01_symptom`).")
    return (f"**Does the paper's arithmetic harm training?** On {proxy_words(conf)}: {_status(vs, 'C0', 'C0-size')} "
            "({doc}`01_symptom`).")


#: The confirmation grid's half-gap hypotheses (`lpfail.experiments.confirmation.HYPOTHESES`) by remedy.
HALF_GAP = {"A_sr": "H2", "A_qk": "H3", "D": "HD", "B": "HB", "R": "HR"}
REMEDY = {"A_sr": "stochastic rounding", "B": "the official fix", "R": "the robust fix", "A_qk": "QK-norm",
          "D": "production (FA2) arithmetic, with its FP32 scores and accumulators,"}


def ten_seed_words(conf: Mapping | None) -> dict[str, str] | None:
    """Per remedy, the confirmation grid's word for 'closes at least half of the gap' on ten paired seeds (the
    call on seeds 3–9), or None where that grid has not called H1 and every half-gap hypothesis."""
    if conf is None:
        return None
    claims = conf["analysis"].get("claims") or {}
    if (claims.get("H1") or {}).get("verdict") != "supported" or any(claims.get(h) is None for h in HALF_GAP.values()):
        return None
    return {v: claims[h]["verdict"] for v, h in HALF_GAP.items()}


def _removing_bias(vs, cures: Mapping | None, ten: Mapping | None = None) -> str:
    """The cures that remove the bias (stochastic rounding, the fixes) against the gap: on ten paired seeds where
    the confirmation grid has them (``ten``, `ten_seed_words`), else from the cures' K2."""
    names = {"A_sr": "stochastic rounding", "B": "the official fix", "Bp": "Algorithm 3 without its clamp",
             "R": "the robust fix"}
    if ten is not None:
        bias = ("A_sr", "B", "R")
        helps = [REMEDY[v] for v in bias if ten[v] == "supported"]
        short = [REMEDY[v] for v in bias if ten[v] == "refuted"]
        unshown = [REMEDY[v] for v in bias if ten[v] == "inconclusive"]
        if not helps:
            detail = []
            if unshown:
                detail.append(f"{listing(unshown)} {'is' if len(unshown) == 1 else 'are'} not shown to close half "
                              "of the gap in LR sensitivity")
            if short:
                detail.append(f"{listing(short)} {'closes' if len(short) == 1 else 'close'} less than half")
            against = " — against the paper's account" if short and not unshown else ""
            if _is(vs.get("Fix-b"), PARTLY, REPRODUCED):
                detail.append(f"per learning rate the official fix reads *{vs['Fix-b'].verdict}*")
            return (f"**Removing the bias is not shown to remove the harm**{against}: on ten paired seeds, "
                    f"{'; '.join(detail)} ({{doc}}`01_symptom`, {{doc}}`05_fix`).")
        return (f"**Removing the bias:** on ten paired seeds, {listing(helps)} close at least half of the gap; "
                f"{listing(unshown + short, none='no other')} do not show it ({{doc}}`01_symptom`, {{doc}}`05_fix`).")
    if cures is not None:
        k2 = {v: y["K2"]["verdict"] for v, y in cures["cures"].items() if "K2" in y}
        fails = [names[v] for v in names if k2.get(v) == "refuted"]
        helps = [names[v] for v in names if k2.get(v) == "supported"]
        if len(fails) == len(names):
            return ("**But removing the bias does not remove the harm**, against the paper's account: "
                    f"{listing(fails)} each leave most of the gap ({{doc}}`05_fix`, {{doc}}`06_beyond`).")
        return (f"**Removing the bias:** of the cures that remove it, {listing(helps)} close at least half of the "
                f"gap and {listing(fails)} do not ({{doc}}`06_beyond`).")
    return f"**Removing the bias:** {_status(vs, 'C0-bias', 'Fix-b')} ({{doc}}`05_fix`)."


def _what_works(vs, cures: Mapping | None, ten: Mapping | None = None) -> str:
    if ten is not None:
        works = [REMEDY[v] for v in ("D", "A_qk") if ten[v] == "supported"]
        if works:
            return (f"**What closes the gap:** {listing(works)} — each at least half of it on ten paired seeds "
                    "({doc}`01_symptom`, {doc}`06_beyond`).").replace(", —", " —")
        return ("**What closes the gap:** neither production arithmetic nor QK-norm is shown to close half of it on "
                "ten paired seeds ({doc}`01_symptom`).")
    if cures is not None:
        k2 = {v: y["K2"]["verdict"] for v, y in cures["cures"].items() if "K2" in y}
        if k2.get("D") == "supported" and k2.get("A_qk") == "supported":
            return ("**What closes the gap:** production (FA2) arithmetic, with its FP32 scores and accumulators, "
                    "and QK-norm ({doc}`06_beyond`).")
        works = [v for v, w in k2.items() if w == "supported"]
        return f"**What closes the gap:** {listing(works)} ({{doc}}`06_beyond`)."
    return f"**What closes the gap:** {_status(vs, 'C0-qk', 'K-cure:qk')} ({{doc}}`06_beyond`)."


def _production(vs, prod: Mapping | None) -> str:
    """From chapter 6's facts (`lpfail.book.beyond_report.facts`): every production kernel's bias on tied rows
    lies on the other side of zero from the paper's arithmetic (``opposite``)."""
    k = vs.get("K-bias:sdpa_flash")
    if _is(k, CONTRADICTED) and prod is not None and prod["opposite"]:
        return (f"**GPU production kernels round the other way:** all {prod['n_production']} we measured on a GPU "
                "(SDPA's back ends, FlashAttention-2-style Triton) err on tied rows *toward* zero, by an error of the "
                "same size; PyTorch's CPU flash back end has the paper's bias in its AVX2 and AVX-512 builds "
                "({doc}`06_beyond`).")
    return f"**Production kernels on tied rows:** {_status(vs, 'K-bias:sdpa_flash', 'K-fma')} ({{doc}}`06_beyond`)."


def _chain(vs) -> str:
    b, g = vs.get("C1b"), vs.get("C2")
    if _is(b, NOT_REPRODUCED) and _is(g, NOT_REPRODUCED):
        return (f"**The chain from the bias to a failure is not shown on our runs:** no single layer is shown to "
                f"carry the gap (on {b.seeds or 3} seeds), and the gradient error of W_Q is not shown to keep one "
                f"sign (on {g.seeds or 1} run) ({{doc}}`02_substitution`, {{doc}}`03_gradient_error`).")
    return (f"**The chain from the bias to the failure:** {_status(vs, 'C1a', 'C1b', 'C1c', 'C2')} "
            "({doc}`02_substitution`, {doc}`03_gradient_error`).")


def findings(vs: list[Verdict], load: Callable | None = None) -> list[str]:
    """The first page's sentences of what we found (MyST Markdown, each linking its chapter)."""
    load = load or results.load
    by = by_claim(vs)
    cures = load_or_none(load, "cures")
    cures = cures["cures_analysis"] if cures is not None else None
    prod = load_or_none(load, "prod_kernels")
    if prod is not None:
        prod = beyond_report.facts(prod)
    conf = load_or_none(load, "confirmation")
    ten = ten_seed_words(conf)
    return [_bias(by), _harm(by, conf), _removing_bias(by, cures, ten), _what_works(by, cures, ten), _production(by, prod),
            _chain(by)]


# -- the thesis and what to do ------------------------------------------------------------------------------------
def proxy_words(conf: Mapping | None) -> str:
    """'our proxy (4 layers × 256, 1,000 steps, learning rates 0.001–0.032)': the proxy named by its size, steps and
    learning rates, from the stored confirmation grid's config ('our small proxy' without it)."""
    cfg = (getattr(conf, "meta", None) or {}).get("config") or {}
    if not cfg.get("small"):
        return "our small proxy"
    (nl, _, ne), lrs = cfg["small"], [float(x) for x in cfg.get("lrs", [])]
    return f"our proxy ({nl} layers × {ne}, {int(cfg['max_steps']):,} steps, learning rates {min(lrs):g}–{max(lrs):g})"


def dial_words(load: Callable) -> str:
    """Where the precision dial stands (`lpfail.experiments.dial_training`), in a sentence: pending with its count
    of runs, or its verdict and what it found."""
    dial = load_or_none(load, "dial_training")
    what = "The precision dial, our test of whether the bias is what harms,"
    if dial is None:
        return f"{what} has no stored run yet."
    word = dial_report.verdict_word(dial)
    if word == NOT_TESTED:
        return (f"{what} is pending: {int(dial['runs_stored'])} of {int(dial['runs_planned'])} runs "
                f"({{doc}}`ch. 1 <01_symptom>`).")
    f = dial_report.finding_short(dial)
    return f"{f[0].upper()}{f[1:]} (the precision dial: *{word}*, {{doc}}`ch. 1 <01_symptom>`)."


def thesis(vs: list[Verdict], load: Callable | None = None) -> str:
    """The first screen's answer in three sentences: what is real, what it does in training at the scales we ran,
    what is not shown — each chosen by the verdicts it rests on, with a plain fallback."""
    load = load or results.load
    by = by_claim(vs)
    conf = load_or_none(load, "confirmation")
    ten = ten_seed_words(conf)
    h5 = ((conf["analysis"].get("sizes") or {}).get("small") or {}).get("H5") if conf is not None else None
    if _is(by.get("C3a"), REPRODUCED) and _is(by.get("C3b"), REPRODUCED):
        real = ("The rounding bias the paper blames is real: on tied rows, BF16 flash attention rounds P̄V away "
                "from zero, bit for bit.")
    else:
        real = f"The rounding bias the paper blames: {_status(by, 'C3a', 'C3b')}."
    train = f"On {proxy_words(conf)}, it trains worse than FP32 attention"
    if not _is(by.get("C0"), REPRODUCED):
        train = f"On {proxy_words(conf)}, whether it harms training: {_status(by, 'C0')}"
    elif h5 == "not distinguishable":
        train += " only where FP32 attention degrades"
    if ten is not None:
        works = [{"D": "FP32 scores and accumulators (production arithmetic)", "A_qk": "QK-norm"}[v]
                 for v in ("D", "A_qk") if ten[v] == "supported"]
        biased = [v for v in ("A_sr", "B", "R") if ten[v] == "supported"]
        train += f"; {listing(works)} close at least half of the gap" if works else ""
        if ten.get("A_sr") == "refuted" and not biased:
            train += "; stochastic rounding (unbiased, noisier) closes less than half"
        elif not biased:
            train += ", removing the bias is not shown to" if works else "; removing the bias is not shown to close it"
    chain = ("The chain from bias to failure is not shown"
             if all(_is(by.get(c), NOT_REPRODUCED, CONTRADICTED, NOT_TESTED) for c in ("C1b", "C2")) else
             f"The chain from bias to failure: {_status(by, 'C1b', 'C2')}")
    return f"{real} {train}. {chain}. {dial_words(load)}"


def advice(vs: list[Verdict], load: Callable | None = None) -> list[str]:
    """**What to do**, by situation: one line each, linked to its evidence and worded by the verdicts it rests on."""
    load = load or results.load
    by = by_claim(vs)
    ten = ten_seed_words(load_or_none(load, "confirmation")) or {}
    out = []
    if _is(by.get("K-bias:sdpa_flash"), CONTRADICTED):
        out.append("**PyTorch SDPA's GPU back ends:** no change; ties round toward zero ({doc}`ch. 6 <06_beyond>`).")
    else:
        out.append(f"**GPU with a production kernel:** its tied rows read {_status(by, 'K-bias:sdpa_flash')} "
                   "({doc}`ch. 6 <06_beyond>`).")
    # HD tests the whole production arithmetic (FP32 scores, m, ℓ and Ō), not FP32 accumulators alone: chapter 2
    # shows that Ō or ℓ in FP32 by itself does not close the gap
    out.append("**BF16 scores and accumulators** (the paper's code, PyTorch's CPU flash back end): use FP32 ones"
               + ("; that closed at least half of the gap on ten seeds" if ten.get("D") == "supported"
                  else "; that is not shown to close the gap on our proxy") + " ({doc}`ch. 1 <01_symptom>`).")
    # (what the dial found for a kernel below BF16's precision is the thesis' last sentence, where it holds: 2 of
    # H8's 12 rows; the advice does not generalise it)
    out.append("**Your own kernel:** keep O, m, ℓ in FP32; test tied rows with `lpfail.attention`; else "
               "the robust fix" + ("" if _is(by.get("Robust"), REPRODUCED) else f" ({_status(by, 'Robust')})")
               + " ({doc}`ch. 5 <05_fix>`).")
    # neither alert tells a failure from the arithmetic or the rate (chapter 7's tests): the advice is the comparison
    out.append("**Monitor** with `lpfail.Monitor`; check an alert against FP32 attention ({doc}`ch. 7 <07_diagnose>`).")
    qk = "closed at least half of the gap on ten seeds" if ten.get("A_qk") == "supported" else f"reads {_status(by, 'C0-qk')}"
    if _is(by.get("Fix-b"), NOT_REPRODUCED, CONTRADICTED):
        fix = "in training neither is shown to help"
    elif _is(by.get("Fix-b"), PARTLY) and ten.get("R") not in (None, "supported"):
        fix = "in training the official helps partly, the robust is not shown to"
    else:
        fix = f"in training they read {_status(by, 'Fix-b')}"
    out.append(f"**Both fixes** remove the bias; {fix} ({{doc}}`ch. 5 <05_fix>`). "
               f"**QK-norm** {qk} ({{doc}}`ch. 6 <06_beyond>`).")
    return out


# -- the causal chain -------------------------------------------------------------------------------------------
#: The paper's chain (its Fig. 1), link by link: (the link in words, the chapter, the claims that test it).
LINKS = [
    ("Several keys tie at a row's\nmaximum, so P̄ = 1 for them", "ch. 4", ("C3b",)),
    ("P̄V is rounded away from zero\n(a carry, and sticky bits)", "ch. 4", ("C3a", "C3b")),
    ("The stored O, and δ from it,\nare biased: it runs through δ", "ch. 2", ("C1c",)),
    ("One layer carries it", "ch. 2", ("C1b",)),
    ("dW_Q's error adds up along\none direction, step after step", "ch. 3", ("C2",)),
    ("‖W_Q‖ and the logits grow;\ntraining fails", "ch. 1", ("failure",)),
    ("Without the bias, training\nis stable", "ch. 1, 5", ("C0-bias", "C0-dial", "Fix-b")),
]
CHAIN_STATUSES = ("reproduced", "partly", NOT_REPRODUCED, "contradicted", NOT_TESTED)  # the verdict page's words


def link_status(vs: Mapping[str, Verdict], claims) -> str:
    """One mark for a link from its claims' verdicts: every one reproduced → reproduced; none with evidence →
    not yet tested; every judged one contradicted (a call pointing the other way) → contradicted; every judged
    one not reproduced or contradicted → not reproduced (the test could not see it); else partly (the verdict
    page's words, so that a link tested by one claim reads as that claim does)."""
    words = [vs[c].verdict for c in claims if c in vs]
    judged = [w for w in words if w not in (NOT_TESTED, NO_CLAIM)]
    if not judged:
        return NOT_TESTED
    if all(w == REPRODUCED for w in judged) and len(judged) == len(words):
        return "reproduced"
    if all(w == CONTRADICTED for w in judged):
        return "contradicted"
    if all(w in (NOT_REPRODUCED, CONTRADICTED) for w in judged):
        return NOT_REPRODUCED
    return "partly" if any(w in (REPRODUCED, PARTLY) for w in judged) else NOT_REPRODUCED


def search_failures(load: Callable | None = None) -> tuple[int, int, int, int] | None:
    """(runs of the paper's arithmetic failed, its runs, FP32 attention's failed, its runs) in the stored explosion
    search, by its pre-registered criterion; None without it."""
    search = symptom_report.search_evidence(load or results.load)
    if search is None:
        return None
    per = search[0]["per_config"]
    return tuple(int(sum(d[v][i] for d in per if v in d)) for v in ("A", "C") for i in (0, 1))


def failure_status(load: Callable | None = None) -> str:
    """The chain's failure link: 'reproduced' or 'partly' where a run of the paper's arithmetic failed by the
    explosion search's pre-registered criterion (`lpfail.book.symptom_report.judge_symptom`), 'not reproduced'
    where none did, 'not yet tested' without the search."""
    search = symptom_report.search_evidence(load or results.load)
    if search is None:
        return NOT_TESTED
    a_failed = sum(d["A"][0] for d in search[0]["per_config"] if "A" in d)
    if not a_failed:
        return NOT_REPRODUCED
    v = symptom_report.judge_symptom(*search).verdict
    return {REPRODUCED: "reproduced", CONTRADICTED: "contradicted"}.get(v, "partly")


def chain(vs: list[Verdict], load: Callable | None = None) -> list[dict]:
    """`LINKS` with each link's status (`link_status`; the failure link by `failure_status`), for
    `lpfail.book.plots.causal_chain`."""
    by = by_claim(vs)
    return [{"text": t, "chapter": ch, "claims": cl,
             "status": failure_status(load) if cl == ("failure",) else link_status(by, cl)} for t, ch, cl in LINKS]


def chain_caption(links: list[dict]) -> str:
    """The figure's caption line: which claims decided each link."""
    names = {"failure": "the explosion search's pre-registered failure criterion"}
    return "; ".join(f"{k + 1}: {', '.join(names.get(c, c) for c in link['claims'])} → {link['status']}"
                     for k, link in enumerate(links))


# -- reading paths ---------------------------------------------------------------------------------------------
_WORD = re.compile(r"[0-9A-Za-zÀ-ÿ\u0370-\u03ff]+(?:[’'.,/−–-][0-9A-Za-zÀ-ÿ\u0370-\u03ff]+)*")


_GLUE = re.compile(r"```\{glue(?::md|:figure)?\}\s*([\w-]+)[^\n]*\n.*?```|\{glue(?::md|:text)?\}`([\w-]+)[^`]*`", re.S)
_TAGS = re.compile(r"<[A-Za-z/!][^<>]*>")  # a tag, never a "<" of the prose or the math


def _glued(nb) -> dict[str, str]:
    """{name: the text a glued value shows} from a notebook's stored outputs (markdown, else plain text)."""
    out = {}
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            name = ((o.get("metadata") or {}).get("scrapbook") or {}).get("name")
            data = o.get("data") or {}
            if name:
                pre = "application/papermill.record/"
                out[name] = data.get(pre + "text/markdown") or (  # a figure (html or png) shows no words
                    "" if {pre + "image/png", pre + "text/html"} & set(data) else data.get(pre + "text/plain", ""))
    return out


def _shown_outputs(nb) -> str:
    """The text of the outputs a code cell shows where it stands (not glued values, not code)."""
    parts = []
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            if (o.get("metadata") or {}).get("scrapbook"):
                continue
            data = o.get("data") or {}
            text = data.get("text/markdown") or _TAGS.sub(" ", data.get("text/html", "")) or o.get("text", "")
            parts.append(text if isinstance(text, str) else "".join(text))
    return "\n".join(parts)


def page_words(page: str, book: Path = BOOK) -> int:
    """Words a reader reads on a page: its Markdown cells (without code blocks, math and directive options) with
    every glued value counted as the text it shows (a figure's caption, a table's cells), and the outputs its code
    cells show — what the built page shows, from the notebook's stored outputs."""
    p = book / f"{page}.ipynb"
    glued, shown = {}, ""
    if p.is_file():
        nb = nbformat.read(str(p), as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        glued, shown = _glued(nb), _shown_outputs(nb)
    else:
        text = (book / f"{page}.md").read_text()
    text = _GLUE.sub(lambda m: " " + glued.get(m.group(1) or m.group(2), "x") + " "
                     + (m.group(0).split("\n", 1)[1].rsplit("```", 1)[0] if m.group(0).startswith("```{glue:figure")
                        else "") + " ", text)
    text += "\n" + shown
    text = re.sub(r"```(?!\{(?:exercise|solution|admonition|note|tip))[^\n]*\n.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", " ", text, flags=re.S)
    text = re.sub(r"^:[\w-]+:.*$", " ", text, flags=re.M)
    text = re.sub(r"\{[\w:-]+\}`[^`]*`", " x ", text)
    return len(_WORD.findall(_TAGS.sub(" ", text)))


#: Who reads what: (reader, what they get, the pages in order).
PATHS = [
    ("A researcher with a BF16 blow-up", "what we found, what to check in your own model, which cure to pick",
     ("verdict", "01_symptom", "06_beyond", "07_diagnose")),
    ("A teacher planning a class",
     "BF16 addition and its bias, with a 50-minute plan, paper exercises, a quiz and a handout",
     ("primer", "04_rounding", "05_fix")),
    ("A newcomer", "the whole argument, from the BF16 format to the fix",
     ("primer", "01_symptom", "02_substitution", "03_gradient_error", "04_rounding", "05_fix", "verdict")),
]


def minutes(pages, book: Path = BOOK) -> int:
    """Reading time of ``pages`` at `WPM`, rounded up to 5 minutes."""
    m = sum(page_words(p, book) for p in pages) / WPM
    return int(-(-m // 5) * 5)


def reading_paths(book: Path = BOOK) -> list[dict]:
    return [{"reader": r, "what": w, "pages": p, "minutes": minutes(p, book)} for r, w, p in PATHS]


def paths_markdown(paths: list[dict], titles: Mapping[str, str]) -> str:
    """The reading paths as a bullet list (MyST), each page linked."""
    out = []
    for p in paths:
        pages = " → ".join(f"{{doc}}`{titles.get(x, x)} <{x}>`" for x in p["pages"])
        out.append(f"- **{p['reader']}** (about {p['minutes']} minutes): {p['what']}. {pages}.")
    return "\n".join(out)


def titles(book: Path = BOOK) -> dict[str, str]:
    """{page: its title} from each page's first heading (``# ...``), for links that name the page."""
    out = {}
    for p in sorted(book.glob("*.ipynb")) + sorted(book.glob("*.md")):
        if p.suffix == ".ipynb":
            cells = nbformat.read(str(p), as_version=4).cells
            text = next((c.source for c in cells if c.cell_type == "markdown"), "")
        else:
            text = p.read_text()
        m = re.search(r"^# (.+)$", text, flags=re.M)
        if m:
            out[p.stem] = m.group(1).strip()
    return out
