"""Chapter 4 ("Rounding"): the numbers its text quotes (`facts`) and its claims (`claims`: C3a, the paper's
worked addition bit for bit; C3b, the rounding bias on tied rows; Fix-a, Algorithm 3 removes that bias), from
the live `lpfail.bf16.paper_example` and the stored ``rounding`` result. The notebook glues `facts` and draws
the figures of `lpfail.book.plots`; the verdict page collects `claims`."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from lpfail.book.verdict import (CONTRADICTED, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED, Verdict, _e4, _f,
                                _load_or_none, _prov, pending, sig_neg, sig_pos)


#: The paper's worked addition (its §4): the BF16 result and the error of that one addition.
PAPER_SUM_BF16 = -4.71875

PAPER_SUM_ERROR = -0.014759540557861328

PAPER_SUM_FP32_BITS = "1 10000001 00101101000011100010111"

#: The fix "removes" the bias when what it leaves is at most this fraction of the bias without it
#: (or is not significant at all); it "partly" removes it up to PARTLY_RATIO.
REMOVED_RATIO = 0.1

PARTLY_RATIO = 0.5


# -- the claims ------------------------------------------------------------------------------------------------
def judge_worked_addition(result: float, error: float, fp32_bits: str) -> Verdict:
    """C3a: the paper's worked addition, bit for bit. Reproduced iff result, error and exact-sum bits all
    equal the paper's."""
    same = (result == PAPER_SUM_BF16 and error == PAPER_SUM_ERROR
            and fp32_bits.replace(" ", "") == PAPER_SUM_FP32_BITS.replace(" ", ""))
    return Verdict(
        "C3a", "The paper's worked addition −2.40625 (+ a residual ≈ −0.00087) + (−2.296875) rounds to "
        "−4.71875 in BF16, an error of −0.014759540557861328, because the rounding bit is 1 and sticky "
        "bits are set.",
        REPRODUCED if same else NOT_REPRODUCED,
        f"`lpfail.bf16.paper_example()` gives {result!r} with error {error!r} (exact sum `{fp32_bits}`); "
        "see {doc}`04_rounding` and `tests/test_bf16.py`.",
        "reproduced iff the BF16 result, the error and the FP32 bits of the exact sum all equal the paper's; "
        "otherwise not reproduced",
        "The second operand (−2.296875) and the exact bits of the running sum's residual are inferred "
        "from the paper's stated exact sum.")

def judge_rounding_bias(r: Mapping) -> Verdict:
    """C3b: with tied row maxima (P̄ = 1), the FP32-accumulated P̄V product rounds to BF16 away from zero.

    Rule, on the default rows of the ``rounding`` experiment (2 tied maxima, 90 % negative V):
      * A: the P̄V accumulation error toward larger magnitude (``default_nofix_acc_away``) is significantly
        positive (the paper's direction);
      * B: the signed error of the stored output (``default_nofix_out_signed``) is significantly negative
        (Ō "more negative" for mostly negative V);
      * C: it needs ties: the bias with 2 tied maxima exceeds the bias with 1 by more than the sum of their
        CIs (``ties_nofix_acc_away``).
    A, B and C → reproduced; A and one of B, C → partly; A significantly *negative* → contradicted;
    otherwise not reproduced.
    """
    m, ci = r["default_nofix_acc_away"], r["default_nofix_acc_away_ci"]
    s, sci = r["default_nofix_out_signed"], r["default_nofix_out_signed_ci"]
    ties = np.asarray(r["ties_values"]).astype(int).tolist()
    tb, tci = np.asarray(r["ties_nofix_acc_away"]), np.asarray(r["ties_nofix_acc_away_ci"])
    a = sig_pos(m, ci)
    b = sig_neg(s, sci)
    if 1 in ties and 2 in ties:
        i1, i2 = ties.index(1), ties.index(2)
        c = tb[i2] - tb[i1] > tci[i2] + tci[i1]
        ties_txt = f"{_e4(tb[i1], tci[i1])} with one maximum, {_e4(tb[i2], tci[i2])} with two"
    else:
        c, ties_txt = False, "the stored sweep has no 1-vs-2 ties comparison"
    if sig_neg(m, ci):
        v = CONTRADICTED
    elif a and b and c:
        v = REPRODUCED
    elif a and (b or c):
        v = PARTLY
    else:
        v = NOT_REPRODUCED
    gaps = np.asarray(r.get("gap_values", []))
    strong = ""
    if len(gaps):
        g, gci = np.asarray(r["gap_nofix_acc_away"]), np.asarray(r["gap_nofix_acc_away_ci"])
        where = gaps[(g - gci) > 0.5 * _f(m)]
        if len(where):
            strong = (f" The bias is at least half its default size only for tied scores "
                      f"{where.min():g}–{where.max():g} above the row's background ({len(gaps)} gaps tried).")
    return Verdict(
        "C3b", "With several tied row maxima (P̄ = 1), the BF16 rounding of the FP32-accumulated P̄V product "
        "is biased away from zero (Ō too negative where V is mostly negative), because the tiny terms of the "
        "other keys act as sticky bits.",
        v,
        f"Default rows: accumulation error toward larger magnitude {_e4(m, ci)} (A: "
        f"{'yes' if a else 'no'}); signed error of the stored output {_e4(s, sci)} (B: "
        f"{'yes' if b else 'no'}); needs ties — {ties_txt} (C: {'yes' if c else 'no'}). See "
        "{numref}`fig-rounding-sweep` and {numref}`fig-running-error`; " + _prov(r) + "." + strong,
        "A: accumulation bias significantly > 0; B: signed output error significantly < 0; C: bias(2 ties) − "
        "bias(1 tie) > sum of CIs. A∧B∧C → reproduced; A∧(B∨C) → partly; bias significantly < 0 → "
        "contradicted; else not reproduced",
        "Synthetic rows (N(0, 1) scores, tied maxima planted 16–17 above them, V of magnitude 0.5–2.5, 90 % "
        "negative), not rows captured from a trained model; one 512-key tile.")

def _removal(nofix, nofix_ci, fix, fix_ci) -> str:
    """The fix's verdict on one statistic (see `judge_fix_bias`)."""
    if not sig_pos(nofix, nofix_ci):
        return NOT_TESTED  # nothing to remove
    if abs(_f(fix)) - _f(fix_ci) > abs(_f(nofix)) + _f(nofix_ci):
        return CONTRADICTED
    ratio = abs(_f(fix)) / abs(_f(nofix))
    if abs(_f(fix)) <= _f(fix_ci) or ratio <= REMOVED_RATIO:
        return REPRODUCED
    if ratio <= PARTLY_RATIO:
        return PARTLY
    return NOT_REPRODUCED

_ORDER = (CONTRADICTED, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED)

def judge_fix_bias(r: Mapping) -> Verdict:
    """Fix-a: the dynamic maximum (Algorithm 3) removes the rounding bias.

    Rule, on the default rows, for the accumulation error and for the stored output's error (both toward
    larger magnitude), each: no significant bias without the fix → not yet tested (nothing to remove);
    the fix's bias significantly larger in magnitude → contradicted; the fix's bias not significant or at
    most 10 % of the bias without it → reproduced; at most 50 % → partly; else not reproduced. The page's
    verdict is the worse of the two.
    """
    parts = {}
    for stat in ("acc_away", "out_away"):
        parts[stat] = _removal(r[f"default_nofix_{stat}"], r[f"default_nofix_{stat}_ci"],
                               r[f"default_fix_{stat}"], r[f"default_fix_{stat}_ci"])
    v = min(parts.values(), key=_ORDER.index)
    resid = ""
    if "gap_values" in r:
        gaps = np.asarray(r["gap_values"])
        sig = np.abs(np.asarray(r["gap_fix_acc_away"])) > np.asarray(r["gap_fix_acc_away_ci"])
        if sig.any():
            resid = (" A small residual accumulation error stays significant with the fix at gaps "
                     + ", ".join(f"{g:g}" for g in gaps[sig]) + f" (of {len(gaps)}).")
    ev = "; ".join(f"{name}: {_e4(r[f'default_nofix_{st}'], r[f'default_nofix_{st}_ci'])} without the fix, "
                   f"{_e4(r[f'default_fix_{st}'], r[f'default_fix_{st}_ci'])} with it ({parts[st]})"
                   for st, name in (("acc_away", "accumulation error"), ("out_away", "stored output error")))
    return Verdict(
        "Fix-a", "The dynamic maximum (Algorithm 3: shift the maximum to β·r_m when a block has tied maxima) "
        "removes the rounding bias.",
        v, f"Default rows, β = 2 — {ev}. See {{numref}}`fig-rounding-sweep`; {_prov(r)}.{resid}",
        f"per statistic: fix's |bias| not significant or ≤ {REMOVED_RATIO:g}× the bias without it → "
        f"reproduced; ≤ {PARTLY_RATIO:g}× → partly; significantly larger → contradicted; else not reproduced; "
        "no bias without the fix → not yet tested. The verdict is the worse of the two statistics",
        "Synthetic rows, not a trained model; the reference implementation (`lpfail.attention`), β = 2 only.")


def claims(load: Callable, stored: Callable[[str], bool], worked_addition: tuple[float, float, str] | None = None
           ) -> list[Verdict]:
    """C3a (from ``worked_addition`` = (result, error, exact-sum bits), by default `lpfail.bf16.paper_example`),
    C3b and Fix-a (from the stored ``rounding`` result, or pending without it)."""
    from lpfail import bf16

    if worked_addition is None:
        t = bf16.paper_example()
        worked_addition = (float(t.result), float(t.error), t.fp32_bits)
    out = [judge_worked_addition(*worked_addition)]
    rounding = _load_or_none(load, "rounding")
    if rounding is not None:
        out += [judge_rounding_bias(rounding), judge_fix_bias(rounding)]
    else:
        out += [pending("C3b", "The rounding bias on rows with tied maxima.", "rounding", "04_rounding", stored),
                pending("Fix-a", "The fix removes the rounding bias.", "rounding", "04_rounding", stored)]
    return out
