"""Chapter 4 ("Rounding"): the numbers its text quotes (`facts`) and its claims (`claims`: C3a, the paper's
worked addition bit for bit; C3b, the rounding bias on tied rows; Fix-a, Algorithm 3 removes that bias), from
the live `lpfail.bf16.paper_example` and the stored ``rounding`` result. The notebook glues `facts` and draws
the figures of `lpfail.book.plots`; the verdict page collects `claims`."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from lpfail import bf16
from lpfail.attention import exp_scores
from lpfail.book import handout
from lpfail.book.text import listing, md_table
from lpfail.book.verdict import (CONTRADICTED, NOT_REPRODUCED, NOT_TESTED, PARTLY, REPRODUCED, Verdict, as_float,
                                e4_text, load_or_none, pending, provenance_line, sig_neg, sig_pos)
from lpfail.precision import PAPER_BF16


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
        ties_txt = f"{e4_text(tb[i1], tci[i1])} with one maximum, {e4_text(tb[i2], tci[i2])} with two"
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
        where = gaps[(g - gci) > 0.5 * as_float(m)]
        if len(where):
            strong = (f" The bias is at least half its default size only for tied scores "
                      f"{where.min():g}–{where.max():g} above the row's background ({len(gaps)} gaps tried).")
    return Verdict(
        "C3b", "With several tied row maxima (P̄ = 1), the BF16 rounding of the FP32-accumulated P̄V product "
        "is biased away from zero (Ō too negative where V is mostly negative), because the tiny terms of the "
        "other keys act as sticky bits.",
        v,
        f"Default rows: accumulation error toward larger magnitude {e4_text(m, ci)} (A: "
        f"{'yes' if a else 'no'}); signed error of the stored output {e4_text(s, sci)} (B: "
        f"{'yes' if b else 'no'}); needs ties — {ties_txt} (C: {'yes' if c else 'no'}). See "
        "{numref}`fig-rounding-sweep` and {numref}`fig-running-error`; " + provenance_line(r) + "." + strong,
        "A: accumulation bias significantly > 0; B: signed output error significantly < 0; C: bias(2 ties) − "
        "bias(1 tie) > sum of CIs. A∧B∧C → reproduced; A∧(B∨C) → partly; bias significantly < 0 → "
        "contradicted; else not reproduced",
        "Synthetic rows (N(0, 1) scores, tied maxima planted 16–17 above them, V of magnitude 0.5–2.5, 90 % "
        "negative), not rows captured from a trained model; one 512-key tile.")

def _removal(nofix, nofix_ci, fix, fix_ci) -> str:
    """The fix's verdict on one statistic (see `judge_fix_bias`)."""
    if not sig_pos(nofix, nofix_ci):
        return NOT_TESTED  # nothing to remove
    if abs(as_float(fix)) - as_float(fix_ci) > abs(as_float(nofix)) + as_float(nofix_ci):
        return CONTRADICTED
    ratio = abs(as_float(fix)) / abs(as_float(nofix))
    if abs(as_float(fix)) <= as_float(fix_ci) or ratio <= REMOVED_RATIO:
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
    ev = "; ".join(f"{name}: {e4_text(r[f'default_nofix_{st}'], r[f'default_nofix_{st}_ci'])} without the fix, "
                   f"{e4_text(r[f'default_fix_{st}'], r[f'default_fix_{st}_ci'])} with it ({parts[st]})"
                   for st, name in (("acc_away", "accumulation error"), ("out_away", "stored output error")))
    return Verdict(
        "Fix-a", "The dynamic maximum (Algorithm 3: shift the maximum to β·r_m when a block has tied maxima) "
        "removes the rounding bias.",
        v, f"Default rows, β = 2 — {ev}. See {{numref}}`fig-rounding-sweep`; {provenance_line(r)}.{resid}",
        f"per statistic: fix's |bias| not significant or ≤ {REMOVED_RATIO:g}× the bias without it → "
        f"reproduced; ≤ {PARTLY_RATIO:g}× → partly; significantly larger → contradicted; else not reproduced; "
        "no bias without the fix → not yet tested. The verdict is the worse of the two statistics",
        "Synthetic rows, not a trained model; the reference implementation (`lpfail.attention`), β = 2 only.")


def claims(load: Callable, stored: Callable[[str], bool], worked_addition: tuple[float, float, str] | None = None
           ) -> list[Verdict]:
    """C3a (from ``worked_addition`` = (result, error, exact-sum bits), by default `lpfail.bf16.paper_example`),
    C3b and Fix-a (from the stored ``rounding`` result, or pending without it)."""
    if worked_addition is None:
        t = bf16.paper_example()
        worked_addition = (float(t.result), float(t.error), t.fp32_bits)
    out = [judge_worked_addition(*worked_addition)]
    rounding = load_or_none(load, "rounding")
    if rounding is not None:
        out += [judge_rounding_bias(rounding), judge_fix_bias(rounding)]
    else:
        out += [pending("C3b", "The rounding bias on rows with tied maxima.", "rounding", "04_rounding", stored),
                pending("Fix-a", "The fix removes the rounding bias.", "rounding", "04_rounding", stored)]
    return out


# -- the numbers chapter 4's text quotes ---------------------------------------------------------------------------
#: "Strong" accumulation bias, in units of the output: the chapter's words for the gaps where it is large.
STRONG = 5e-4


def _ci(res: Mapping, name: str) -> str:
    return _pm(float(res[name]), float(res[name + "_ci"]))


def facts(res: Mapping) -> dict[str, str]:
    """Every number chapter 4's text quotes from the stored ``rounding`` result, formatted (×10⁻⁴ where a bias):
    the default rows' biases without and with the fix, the bias by number of ties, the gaps where it is strong,
    weak or of the other sign, the fix's largest residual and where it stays significant."""
    gaps = np.asarray(res["gap_values"], dtype=float)
    acc, acc_ci = np.asarray(res["gap_nofix_acc_away"]), np.asarray(res["gap_nofix_acc_away_ci"])
    fix_sig = np.abs(np.asarray(res["gap_fix_acc_away"])) > np.asarray(res["gap_fix_acc_away_ci"])
    fmt = lambda xs: listing([f"{x:g}" for x in xs])  # noqa: E731
    axes = ("ties", "neg_frac", "gap")
    fix_all = np.concatenate([np.asarray(res[f"{a}_fix_acc_away"]) for a in axes])
    nofix_all = np.concatenate([np.asarray(res[f"{a}_nofix_acc_away"]) for a in axes])
    ties = np.asarray(res["ties_values"]).astype(int)
    tb = np.asarray(res["ties_nofix_acc_away"])
    out = {"gap_strong": fmt(gaps[acc > STRONG]), "gap_weak": fmt(gaps[(acc - acc_ci > 0) & (acc <= STRONG)]),
           "gap_neg": fmt(gaps[acc + acc_ci < 0]), "fix_sig_gaps": fmt(gaps[fix_sig]), "n_gaps": f"{len(gaps)}",
           "strong_e4": f"{STRONG * 1e4:g}",
           "fix_max": f"{np.abs(fix_all).max() * 1e4:.2f}", "nofix_max": f"{np.abs(nofix_all).max() * 1e4:.2f}",
           "ties_list": listing([f"{n}: {a * 1e4:+.2f}" for n, a in zip(ties, tb)], last="and"),
           "ties_argmax": f"{ties[np.argmax(tb)]}"}
    for p in ("nofix", "fix"):
        out[f"acc_{p}"] = _ci(res, f"default_{p}_acc_away")
        out[f"out_{p}"] = _ci(res, f"default_{p}_out_away")
        out[f"signed_{p}"] = _ci(res, f"default_{p}_out_signed")
    meta = getattr(res, "meta", None) or {}
    out["n_rows"] = f"{(meta.get('config') or {}).get('n_rows', '?')}"
    return out


def default_table(res: Mapping) -> str:
    """Markdown: the default rows' three errors (×10⁻⁴, mean ± 95 % CI) without and with the fix."""
    names = {"acc_away": "P̄V accumulation, toward larger |Ō|", "out_away": "stored O, toward larger |O|",
             "out_signed": "stored O, signed"}
    return md_table(["error on the default rows (×10⁻⁴)", "no fix", "Algorithm 3"],
                    [[names[s], _ci(res, f"default_nofix_{s}"), _ci(res, f"default_fix_{s}")] for s in names])


def gap_table(res: Mapping) -> str:
    """Markdown: the accumulation bias at every gap (×10⁻⁴, mean ± 95 % CI) without and with the fix."""
    gaps = np.asarray(res["gap_values"], dtype=float)
    rows = []
    for k, g in enumerate(gaps):
        f, fc = float(res["gap_fix_acc_away"][k]), float(res["gap_fix_acc_away_ci"][k])
        rows.append([f"{g:g}", _pm(float(res["gap_nofix_acc_away"][k]), float(res["gap_nofix_acc_away_ci"][k])),
                     _pm(f, fc) + (" (significant)" if abs(f) > fc else "")])
    return md_table(["gap", "no fix", "Algorithm 3"], rows)


#: The operands of chapter 4's second exercise on paper (an exact tie after the carry, broken away from zero); its
#: statement spells their bits out, `tests/test_rounding.py` checks them against `bf16.describe`.
PAPER_EXERCISE_ADD = (-2.625, -2.171875)


def class_facts() -> dict[str, str]:
    """The values of chapter 4's exercises on paper, computed by `lpfail.bf16` (their solutions glue them)."""
    x = -2.40625
    t2 = bf16.add_trace(*PAPER_EXERCISE_ADD)
    t3a = bf16.add_trace(-1.0078125, -1.0)
    t3b = bf16.add_trace_acc(float(np.float32(-1.0078125 - 0.003)), -1.0)
    return {"p1_bits": bf16.bits(x), "p1_ulp": f"{bf16.ulp(x):.10g}", "p1_down": f"{bf16.next_down(x):.10g}",
            "p1_up": f"{bf16.next_up(x):.10g}",
            "p2_exact": f"{float(t2.exact):.10g}", "p2_result": f"{float(t2.result):.10g}", "p2_decision": t2.decision,
            "p2_direction": t2.direction, "p2_bits": t2.result_bits, "p2_sum": f"{t2.sum_bits}₂",
            "p2_normalized": f"{t2.normalized_bits.replace('|', '')}₂", "p2_kept": t2.normalized_bits[2:9],
            "p3_tie_result": f"{float(t3a.result):.10g}", "p3_tie_direction": t3a.direction,
            "p3_exact": f"{float(t3b.exact):.7g}", "p3_result": f"{float(t3b.result):.10g}",
            "p3_direction": t3b.direction, "p3_error": f"{float(t3b.error):+.3g}"}


def _away_or_toward(x: float, r: float) -> str:
    return "away from zero" if abs(r) > abs(x) else "toward zero" if abs(r) < abs(x) else "exact"


def quiz_facts() -> dict[str, str]:
    """The answers of chapter 4's closing quiz and of its plan's questions, computed by `lpfail.bf16` and the
    reference attention's own exp step (`lpfail.attention.exp_scores`), never typed (the solutions glue them)."""
    x1 = float(torch.tensor(16.3, dtype=torch.float32))                      # 16.3 as FP32 holds it
    r1 = float(bf16.round_bf16(torch.tensor([x1]))[0])
    x2 = 1.01171875                                                          # 1.00000011₂: an exact tie
    r2 = float(bf16.round_bf16(torch.tensor([x2]))[0])
    t3 = bf16.add_trace_acc(float(np.float32(-2.40625 + 0.000865459)), bf16.PAPER_TERM)
    t4a, t4b = bf16.add_trace(-1.5, -1.25), bf16.add_trace(-1.5, -1.2578125)
    worked, tie = bf16.paper_example(), bf16.paper_example(sticky=False)
    out = {"q1_ulp": f"{bf16.ulp(r1):g}", "q1_result": f"{r1:g}", "q1_bits": bf16.bits(r1),
           "q2_result": f"{r2:.10g}", "q2_bits": bf16.bits(r2), "q2_direction": _away_or_toward(x2, r2),
           "q3_acc": f"{float(t3.a):.7g}", "q3_result": f"{float(t3.result):.10g}", "q3_direction": t3.direction,
           "q3_rounding_bit": str(t3.rounding_bit), "q3_error": f"{float(t3.error):+.4g}",
           "q4_decision": t4a.decision, "q4_result": f"{float(t4a.result):.10g}",
           "q4b_decision": t4b.decision, "q4b_result": f"{float(t4b.result):.10g}",
           "plan_case1": f"{float(worked.result):.10g}", "plan_case1_direction": worked.direction,
           "plan_case2": f"{float(tie.result):.10g}", "plan_case2_direction": tie.direction}
    for r in (3.0, 4.0):                      # a tied maximum r_m under Algorithm 3 (β = 2): P̄ = exp(r_m − 2·r_m)
        s, m = torch.tensor([r]), torch.tensor([2.0 * r])
        pbar = float(exp_scores(s, m, PAPER_BF16).to(torch.bfloat16))      # as the forward rounds it (`pbar`)
        out[f"q5_p{r:g}"], out[f"q5_err{r:g}"] = f"{pbar:.12g}", f"{pbar - float(np.exp(-r)):+.2g}"
    return out


#: Chapter 4's handout: where it is written (relative to book/) and its heading.
HANDOUT = "handouts/04_rounding_handout.md"

HANDOUT_TITLE = "Rounding: where the bias is born — questions for a class"

HANDOUT_INTRO = ("The exercises and the closing quiz of the book's chapter 4, without their solutions (the chapter "
                 "holds them). The first three exercises are for paper and pencil; the next three need the "
                 "`lpfail` library (`from lpfail import bf16`, `from lpfail.experiments import rounding`).")


def write_handout(notebook: str = "04_rounding.ipynb", path: str = HANDOUT):
    """Write chapter 4's handout from its notebook (`lpfail.book.handout`), paths relative to book/."""
    return handout.write_handout(notebook, path, HANDOUT_TITLE, HANDOUT_INTRO)


# -- the figures' captions and one exercise, from the data they show ---------------------------------------------------
def _e(x: float, fmt: str = "+.2e") -> str:
    return format(float(x), fmt)


def running_error_facts(tied: Mapping, single: Mapping, fixed: Mapping) -> dict[str, str]:
    """What {numref}`fig-running-error` shows, from its three rows (`rounding.running_error`): the jump of the error at
    each tied key with two tied maxima and with Algorithm 3, the largest step with one maximum, the final errors,
    and how Algorithm 3's final error compares with the paper's arithmetic's."""
    keys = np.flatnonzero(tied["is_one"])
    e2, e1, ef = (np.asarray(d["error"], dtype=float) for d in (tied, single, fixed))
    jump = lambda e: listing([_e(e[k] - e[k - 1]) for k in keys], last="and")  # noqa: E731
    same = np.sign(ef[-1]) == np.sign(e2[-1])
    size = "smaller" if abs(ef[-1]) < abs(e2[-1]) else "larger"
    return {"tied_jumps": jump(e2), "fixed_jumps": jump(ef), "single_step": _e(np.abs(np.diff(e1)).max(), ".1e"),
            "tied_final": _e(e2[-1]), "fixed_final": _e(ef[-1], "+.1e"), "single_final": _e(e1[-1], "+.1e"),
            "fixed_vs_tied": f"{'the same' if same else 'the other'} sign as the paper's arithmetic's, and {size}"}


def _pm(m: float, c: float, digits: int = 2) -> str:
    """A mean and its 95 % CI half-width in units of 10⁻⁴: '+12.83 ± 0.18'."""
    return f"{m * 1e4:+.{digits}f} ± {c * 1e4:.{digits}f}"


def sweep_caption_facts(res: Mapping) -> dict[str, str]:
    """What {numref}`fig-rounding-sweep` shows (×10⁻⁴), for its caption: the gaps where the accumulation bias is
    strong, the stored output's bias without the fix at the smaller gaps where it is significant, and with
    Algorithm 3 its largest value in the first two panels and in the gap panel."""
    gaps = np.asarray(res["gap_values"], dtype=float)
    acc = np.asarray(res["gap_nofix_acc_away"])
    strong = gaps[acc > STRONG]
    o, oc = np.asarray(res["gap_nofix_out_away"]), np.asarray(res["gap_nofix_out_away_ci"])
    small = [k for k in range(len(gaps)) if gaps[k] < strong.min() and o[k] - oc[k] > 0]
    f, fc = np.asarray(res["gap_fix_out_away"]), np.asarray(res["gap_fix_out_away_ci"])
    k = int(np.argmax(f))
    first = np.concatenate([np.asarray(res[f"{a}_fix_out_away"]) for a in ("ties", "neg_frac")])
    return {"sw_gap_strong": f"{strong.min():g}–{strong.max():g}",
            "sw_out_small": listing([f"{_pm(o[j], oc[j])} at gap {gaps[j]:g}" for j in small], last="and"),
            "sw_fix_out_first": f"{np.abs(first).max() * 1e4:.2f}",
            "sw_fix_out_peak": f"{_pm(f[k], fc[k])} at gap {gaps[k]:g}"}


def _bias_word(a: tuple[float, float], b: tuple[float, float]) -> str:
    """How bias b compares with bias a (mean, 95 % CI half-width): 'stronger', 'weaker' or 'about the same'."""
    if abs(b[0] - a[0]) <= a[1] + b[1]:
        return "about the same"
    return "stronger" if b[0] > a[0] else "weaker"


def keys_facts(n_rows: int = 500, seed: int = 1, n_keys: tuple[int, int] = (512, 4096)) -> dict[str, str]:
    """Exercise 4.5's answer, computed: the accumulation and stored-output biases (×10⁻⁴, toward larger magnitude,
    one tile of the paper's arithmetic) at a gap of 16 with `n_keys[0]` and `n_keys[1]` keys, and whether the second
    is stronger. Printed with one decimal: the last digit then stays put under another CPU setting."""
    from lpfail.experiments import rounding  # here: the experiment module is needed by this one exercise only

    one_tile = PAPER_BF16.replace(block_k=None, block_q=None)
    got = {}
    for n in n_keys:
        s, v, _ = rounding.make_rows(rounding.RowSpec(n_keys=n), n_rows, seed=seed)
        err = rounding.row_errors(s, v, one_tile)
        got[n] = {st: rounding.mean_ci(err.away_from_zero(st)) for st in ("acc_err", "out_err")}
    a, b = n_keys
    out = {"k_n_small": f"{a:,}", "k_n_large": f"{b:,}"}
    for st, key in (("acc_err", "acc"), ("out_err", "out")):
        out[f"k_{key}_small"], out[f"k_{key}_large"] = _pm(*got[a][st], 1), _pm(*got[b][st], 1)
        out[f"k_{key}_word"] = _bias_word(got[a][st], got[b][st])
    return out
