"""Reading the book's pages back against the claims registry (`lpfail.book.claims`): where a page binds a claim
id to a word ("Fix-b: *partly*", "C0-size reads reproduced", a verdict-page row, the first page's causal chain),
where it states a claim's labelled number ("(L_B − L_C) − ½·(L_A − L_C): … at 0.016", "S(A) − S(C) = …"), and
whether any of it differs from the registry (`conflicts`). tests/test_claims.py runs it over every main-path and
lab page's stored outputs; nothing in the book imports it."""
from __future__ import annotations

import ast
import re
from collections.abc import Mapping

from lpfail.book.claims import INTERVAL_RE, NUMBER_RE, Claim, intervals, norm
from lpfail.book.front import link_status
from lpfail.book.verdict import VERDICTS, Verdict

_WORDS = "|".join(re.escape(w) for w in sorted(VERDICTS, key=len, reverse=True))
_LINK_WORDS = "reproduced|partly|not reproduced|contradicted|not yet tested"


def _ids_pattern(ids) -> str:
    return "|".join(re.escape(c) for c in sorted(ids, key=len, reverse=True))


#: Prose that names a claim without its id.
ALIASES = {"Fix-b": ("the official fix reads",)}
#: Glue keys whose whole value opens with one claim's word.
GLUE_WORDS = {"gg_verdict": "C2", "size_word": "C0-size", "fix_b_word": "Fix-b"}


def bindings(text: str, ids) -> list[tuple[tuple[str, ...], str, str]]:
    """Where ``text`` binds claims to a word: (claim ids, word, kind), kind "word" (the claim's verdict) or "link"
    (the first page's causal chain: the mark `front.link_status` gives those claims together)."""
    i = _ids_pattern(ids)
    pats = [
        (rf"(?<![\w:-])((?:(?:{i}), )*(?:{i})) → ({_LINK_WORDS})", "link"),
        (rf"(?<![\w:-])({i})\)?: \*+({_WORDS})\*+", "word"),
        (rf"(?<![\w:-])({i}) on \{{doc\}}`verdict`: \*+({_WORDS})\*+", "word"),
        (rf"(?<![\w:-])({i}) reads \**({_WORDS})(?![\w])", "word"),
        (rf'<span class="lp-status [^"]*">({_WORDS})</span> \*\*({i})\.\*\*', "word-rev"),
        (rf'^\| ({i}) \|[^\n]*?\| <span class="lp-status [^"]*">({_WORDS})</span> \|', "word"),
        (rf"\*\*({i}) — ({_WORDS})\.\*\*", "word"),
    ]
    for cid, aliases in ALIASES.items():
        for al in aliases:
            pats.append((rf"({re.escape(al)}) \*+({_WORDS})\*+", f"alias:{cid}"))
    out = []
    for p, kind in pats:
        for m in re.finditer(p, text, re.M):
            a, b = m.group(1), m.group(2)
            if kind == "word-rev":
                out.append(((b,), a, "word"))
            elif kind.startswith("alias:"):
                out.append(((kind[6:],), b, "word"))
            else:
                out.append((tuple(a.split(", ")), b, kind))
    return out


def spellings(label: str) -> list[str]:
    """A statistic's label as the pages spell it: 'X − Y − ½·(…)' also as '(X − Y) − ½·(…)'."""
    out = [label]
    if " − ½·" in label and not label.startswith("("):
        head, rest = label.split(" − ½·", 1)
        out.append(f"({head}) − ½·{rest}")
    return out


def labelled(text: str, label: str) -> list[str]:
    """Every number ``text`` states under ``label``: 'LABEL = iv', 'LABEL: iv' and, for 'at LR', 'iv at LR' and
    'at LR (iv'."""
    out = []
    iv = rf"{NUMBER_RE} \[{NUMBER_RE}, {NUMBER_RE}\]"
    if label.startswith("at "):
        L = re.escape(label)
        pats = [rf"({iv}) {L}(?![\d.])", rf"{L} \(({iv})"]
    else:
        L = "|".join(re.escape(x) for x in spellings(label))
        pats = [rf"(?:{L}) = ({iv})", rf"(?:{L}): ({iv})"]
    for p in pats:
        out += [norm(m.group(1)) for m in re.finditer(p, text)]
    return out


def _blocks(text: str) -> list[str]:
    """A page text cut into the blocks a claim's mention governs: table rows, and paragraphs elsewhere."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.split("\n")
        if sum(ln.startswith("|") for ln in lines) > 1:
            out += lines
        else:
            out.append(para)
    return out


#: The verdict page's bullet for an earlier criterion (another rule, on other seeds), which it shows beside the
#: verdict without letting it decide: its numbers are not the claim's headline.
OLD_CRITERION = re.compile(r"^- \*\*Old criterion[^\n]*", re.M)


def conflicts(pages: Mapping[str, list[tuple[str, str]]], reg: Mapping[str, Claim]) -> list[str]:
    """Every place where a page says something else than the registry: ``pages`` maps a page name to its texts as
    (where, text) — stored outputs, glue values, Markdown. Three checks:

    * words: a binding (`bindings`) whose word is not the claim's (for the causal chain's links, not the mark
      `front.link_status` gives those claims' words); a glue key of `GLUE_WORDS` whose value opens otherwise;
    * labelled numbers: a statistic that only one claim's headline states (C0-bias's 'S(A_sr) − S(C) − ½·(S(A) −
      S(C))'), stated anywhere with another value; and in a block (paragraph or table row) that names a claim or
      binds it, each of the claim's labelled numbers ('at 0.016', 'S(cure) − S(A)') stated under its label with
      another value (the verdict page's "Old criterion" bullet, another rule on other seeds shown beside the
      verdict, left out of both);
    * stray variants: anywhere, an interval that shares two of its three numbers with a registered one but not the
      third (the same quantity, a different number)."""
    vs = {c: Verdict(c, "", x.word, "", "") for c, x in reg.items()}
    owners: dict[str, set] = {}
    for c, x in reg.items():
        for lab, _ in x.numbers:
            owners.setdefault(lab, set()).add(c)
    own = {lab: next(iter(cs)) for lab, cs in owners.items() if len(cs) == 1 and lab and not lab.startswith("at ")}
    idp = re.compile(rf"(?<![\w:-])({_ids_pattern(reg)})(?![\w-])")
    known = {(lab, iv): c for c, x in reg.items() for lab, iv in x.numbers}
    parts = {}
    for (lab, iv), c in known.items():
        m = INTERVAL_RE.match(iv)
        parts[(m.group(1), m.group(2), m.group(3))] = (c, iv)
    out = []
    for page, texts in pages.items():
        for where, text in texts:
            name = where.split(":")[0]
            if name in GLUE_WORDS and (c := GLUE_WORDS[name]) in reg:
                val = text.strip().strip("'\"")
                if not val.startswith(reg[c].word) or (reg[c].word == "reproduced" and val.startswith("not ")):
                    out.append(f"{page} {where}: glue {name} = {val[:40]!r}, but {c} is {reg[c].word!r}")
            for ids, word, kind in bindings(text, reg):
                if not all(c in reg for c in ids):
                    continue
                want = link_status(vs, ids) if kind == "link" else reg[ids[0]].word
                if word != want:
                    out.append(f"{page} {where}: {', '.join(ids)} → {word!r}, but the registry says {want!r}")
            for lab, c in own.items():
                iv = dict(reg[c].numbers)[lab]
                for got in labelled(OLD_CRITERION.sub("", text), lab):
                    if got != iv:
                        out.append(f"{page} {where}: {c}'s {lab} reads {got}, but the registry says {iv}")
            for block in _blocks(text):
                block = OLD_CRITERION.sub("", block)
                named = set(idp.findall(block)) | {c for ids, _, _ in bindings(block, reg) for c in ids}
                for c in named & set(reg):
                    for lab, iv in reg[c].numbers:
                        if not lab:
                            continue
                        for got in labelled(block, lab):
                            if got != iv:
                                out.append(f"{page} {where}: {c}'s {lab} reads {got}, but the registry says {iv}")
            for _, p, lo, hi in intervals(text):
                for (rp, rlo, rhi), (c, iv) in parts.items():
                    same = (p == rp) + (lo == rlo) + (hi == rhi)
                    if same == 2:
                        out.append(f"{page} {where}: {p} [{lo}, {hi}] is a variant of {c}'s {iv}")
    return sorted(set(out))


#: The main path's pages, in the book's order.
MAIN_PATH = ("intro", "01_symptom", "02_substitution", "03_gradient_error", "04_rounding", "05_fix", "06_beyond",
             "07_diagnose", "verdict")
_RECORD = "application/papermill.record/"


_GLUE_ROLE = re.compile(r"```\{glue(?::md)?\}\s*([\w.-]+)[^\n]*\n.*?```|\{glue(?::md|:text)?\}`([\w.-]+)[^`]*`", re.S)


def glue_values(nb: Mapping) -> dict[str, str]:
    """{glue key: the text it shows} from a stored notebook (its Markdown, else its plain text unquoted)."""
    out = {}
    for cell in nb["cells"]:
        for o in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            name = ((o.get("metadata") or {}).get("scrapbook") or {}).get("name")
            data = {k[len(_RECORD):]: "".join(v) if isinstance(v, list) else v for k, v in (o.get("data") or {}).items()
                    if k.startswith(_RECORD)}
            if not name or "image/png" in data or "text/html" in data:
                continue
            text = data.get("text/markdown") or data.get("text/plain", "")
            if "text/markdown" not in data:
                try:
                    text = str(ast.literal_eval(text))
                except (ValueError, SyntaxError):
                    pass
            out[name] = text
    return out


def page_texts(nb: Mapping) -> list[tuple[str, str]]:
    """A stored notebook's words as (where, text): each Markdown cell as the page shows it, its glue roles replaced
    by the glued values ("md N"), each code cell's stored text outputs and glue values ("KEY:text/markdown",
    "cell N:stream"), HTML left out (figures, widgets), numbers taken out of their table spans (`plain`)."""
    out = []
    glued = glue_values(nb)
    for n, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"])
            shown = _GLUE_ROLE.sub(lambda m: glued.get(m.group(1) or m.group(2), m.group(0)), src)
            out.append((f"md {n}", plain(shown)))
            continue
        for o in cell.get("outputs", []):
            name = ((o.get("metadata") or {}).get("scrapbook") or {}).get("name") or f"cell {n}"
            if o.get("output_type") == "stream":
                out.append((f"{name}:stream", "".join(o["text"])))
            for mime, v in (o.get("data") or {}).items():
                mime = mime[len(_RECORD):] if mime.startswith(_RECORD) else mime
                if mime in ("text/plain", "text/markdown"):
                    out.append((f"{name}:{mime}", plain("".join(v) if isinstance(v, list) else v)))
    return out


_NUM_SPAN = re.compile(r'<span class="lp-num">([^<]*)</span>')


def plain(text: str) -> str:
    """A stored output with the tables' number spans (`lpfail.book.text`'s ``lp-num``) taken off their numbers."""
    return _NUM_SPAN.sub(r"\1", text)
