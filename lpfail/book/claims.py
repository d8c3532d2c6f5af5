"""The claims registry: one place that says, for each claim of the verdict page, its word and its headline number.

Two layers.

* `registry(load)` / `claim(cid, load)`: for every claim id the verdict page lists (C0 … K-cure:hp), a `Claim` —
  its word (the verdict), its headline (the statistic with its 95 % interval and seeds, `verdict.one_line` uncut)
  and the numbers that headline states, each with its label (``S(A) − S(C)``, ``at 0.016``). It is built from the
  chapters' own rules (`lpfail.book.verdict.verdicts`), never typed: the stored results decide.
* The per-claim functions that the chapters' prose calls where it states a claim's word outside the verdict page:
  `fix_b` (the official fix per learning rate, on the confirmation grid) and `c0_size` (the larger size, H4 on the
  seeds both sizes have). The verdict page's rules (`training_claims.judge_fix_rates`, `judge_size_confirmed`) take
  their word and headline from the same functions, so chapter 1, 5, 6, the verdict page and the first page cannot
  say two things.

`lpfail.book.claim_check` reads the pages back against this registry (tests/test_claims.py).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping

import numpy as np

from lpfail.book import confirmation_report as CR
from lpfail.book.text import interval
from lpfail.book.verdict import SWEEP_WORDS, one_line, verdicts
from lpfail.experiments import confirmation as CF
from lpfail.sweep import stats

#: A training verdict rests on this many paired seeds.
TEN = 10
#: The per-rate statistic of a fix (`confirmation.fix_lr`) in words.
FIX_STAT = "(L_B − L_C) − ½·(L_A − L_C)"


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    word: str                      # the verdict, one of `verdict.VERDICTS`
    headline: str                  # the statistic(s) with interval and seeds, as the verdict page's table says it
    seeds: int | None = None
    chapter: str = ""
    numbers: tuple[tuple[str, str], ...] = ()  # (label, 'point [lo, hi]') for each interval the headline states


# -- the per-claim functions the prose shares with the verdict page ----------------------------------------------
def fix_b(a: Mapping) -> Claim:
    """Fix-b from a confirmation analysis: its word per learning rate with a gap (`confirmation_report.fix_rates`,
    `fix_rates_word`) and its headline, the per-rate statistic with its interval and, where it is a call, Holm's p."""
    rates = CR.fix_rates(a)
    head = f"{FIX_STAT}: " + "; ".join(
        f"{interval({'point': x['row']['estimate'], 'ci': x['row']['ci']}, '+.3f')} at {x['lr']:g} "
        + (f"(Holm p {x['row']['p_adjusted']:.2g})" if x["basis"] == "call" else "(estimate, not a call)")
        for x in rates)
    n = max((int(x["row"]["n"]) for x in rates if x["row"].get("n") is not None), default=None)
    return Claim("Fix-b", CR.fix_rates_word(rates), head, n, "05_fix", numbers_of(head))


def size_judgement(conf: Mapping | None) -> dict | None:
    """C0-size on the confirmation grid's seeds, where both sizes' A and C are all stored: S(A) − S(C) per size
    over that size's seeds, and H4's statistic (S(A) − S(C))_larger − (S(A) − S(C))_smaller per seed over the seeds
    both sizes have (paired by seed, as H4 was written), each mean with its 95 % Student t interval; H4's word by
    that interval (entirely above 0 → supported, entirely below → refuted, else inconclusive), the rule of
    `lpfail.sweep.stats.judge`. None without those runs or with fewer than two common seeds."""
    if conf is None:
        return None
    per = {}
    for size in ("large", "small"):
        d = CF._size(conf, size)  # the size's complete variants only
        if d is None or not {"A", "C"} <= set(d["eff"]):
            return None
        gap = stats.seed_sensitivity(d["eff"]["A"]) - stats.seed_sensitivity(d["eff"]["C"])
        per[size] = dict(zip(d["seeds"], gap.tolist()))
    common = [s for s in per["large"] if s in per["small"]]
    if len(common) < 2:
        return None
    diff = np.array([per["large"][s] - per["small"][s] for s in common])
    m, lo, hi = stats.t_interval(diff)
    out = {"diff": {"point": m, "ci": [lo, hi]}, "seeds": common, "n": len(common),
           "verdict": stats.judge(lo, hi, "above")}
    for size in ("large", "small"):
        g, gm = np.array(list(per[size].values())), stats.t_interval(np.array(list(per[size].values())))
        out[size] = {"point": gm[0], "ci": [gm[1], gm[2]], "n": g.size}
    return out


#: C0-size's statistic in words.
SIZE_STAT = "(S(A) − S(C))_larger − (S(A) − S(C))_smaller"


def c0_size(conf: Mapping | None) -> Claim | None:
    """C0-size from the confirmation grid (`size_judgement`): its word (H4's, mapped by `SWEEP_WORDS`), its
    statistic with interval, and its seeds; None without those runs."""
    j = size_judgement(conf)
    if j is None:
        return None
    head = f"{SIZE_STAT} = {interval(j['diff'], '+.3f')}"
    return Claim("C0-size", SWEEP_WORDS[j["verdict"]], head, int(j["n"]), "01_symptom", numbers_of(head))


# -- the registry ----------------------------------------------------------------------------------------------
def from_verdicts(vs) -> dict[str, Claim]:
    """{claim id: `Claim`} from the verdict page's verdicts (`lpfail.book.verdict.verdicts`), in their order: the
    word is the verdict's, the headline its one line uncut (`verdict.one_line`)."""
    out = {}
    for v in vs:
        head = one_line(v, chars=100_000)
        out[v.claim] = Claim(v.claim, v.verdict, head, v.seeds, v.chapter, numbers_of(head))
    return out


def _build(load: Callable | None, stored: Callable | None) -> dict[str, Claim]:
    return from_verdicts(verdicts(load, stored))


@functools.lru_cache(maxsize=1)
def _stored_registry() -> dict[str, Claim]:
    return _build(None, None)


def registry(load: Callable | None = None, stored: Callable | None = None) -> dict[str, Claim]:
    """{claim id: `Claim`} for every claim the verdict page lists, in its order, from the stored results (``load``
    and ``stored`` may be replaced in tests; the stored results' registry is computed once per process)."""
    return dict(_stored_registry()) if load is None and stored is None else _build(load, stored)


def claim(cid: str, load: Callable | None = None) -> Claim:
    """The one answer for claim ``cid``: its word, headline and numbers (`registry`)."""
    return registry(load)[cid]


# -- reading a page back -----------------------------------------------------------------------------------------
#: A number as the pages write it, and an interval "point [lo, hi]".
NUMBER_RE = r"[+\-−]?\d+(?:\.\d+)?"
INTERVAL_RE = re.compile(rf"({NUMBER_RE}) \[({NUMBER_RE}), ({NUMBER_RE})\]")


def norm(s: str) -> str:
    """A number as written, with its minus sign (− or -) made one."""
    return s.replace("−", "-")


def intervals(text: str) -> list[tuple[int, str, str, str]]:
    """Every 'point [lo, hi]' in ``text``: (offset, point, lo, hi), minus signs made one."""
    return [(m.start(), norm(m.group(1)), norm(m.group(2)), norm(m.group(3))) for m in INTERVAL_RE.finditer(text)]


def numbers_of(head: str) -> tuple[tuple[str, str], ...]:
    """The labelled numbers of a headline: 'STAT = iv' → (STAT, iv); 'iv at LR' or 'at LR (iv' → ('at LR', iv)."""
    out = []
    for m in INTERVAL_RE.finditer(head):
        iv = f"{norm(m.group(1))} [{norm(m.group(2))}, {norm(m.group(3))}]"
        after, before = head[m.end():], head[:m.start()]
        if (a := re.match(r" at (\d[\d.e-]*)", after)) or (a := re.search(r"at (\d[\d.e-]*) \($", before)):
            out.append((f"at {a.group(1)}", iv))
        elif b := re.search(r"([^;:]*?) = $", before):
            out.append((b.group(1).strip(), iv))
        else:
            out.append(("", iv))
    return tuple(out)
