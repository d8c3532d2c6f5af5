"""The verdict rules (lpfail.book.verdict) on fabricated results: each rule's outcomes, including flipped ones."""
import numpy as np
import pytest

from lpfail.book import verdict as V
from lpfail.results import ResultMissing


def rounding(acc=12.8e-4, acc_ci=0.2e-4, signed=-13.8e-4, signed_ci=0.2e-4, tie1=-0.6e-4, tie2=12.9e-4,
             fix_acc=0.1e-4, fix_acc_ci=0.2e-4, out=13.2e-4, fix_out=0.8e-4, fix_out_ci=0.25e-4):
    """A dict shaped like the stored 'rounding' result (the keys the rules read), default numbers ≈ ours."""
    return {
        "default_nofix_acc_away": acc, "default_nofix_acc_away_ci": acc_ci,
        "default_nofix_out_signed": signed, "default_nofix_out_signed_ci": signed_ci,
        "default_nofix_out_away": out, "default_nofix_out_away_ci": 0.2e-4,
        "default_fix_acc_away": fix_acc, "default_fix_acc_away_ci": fix_acc_ci,
        "default_fix_out_away": fix_out, "default_fix_out_away_ci": fix_out_ci,
        "ties_values": np.array([1.0, 2.0, 3.0]),
        "ties_nofix_acc_away": np.array([tie1, tie2, 7e-4]),
        "ties_nofix_acc_away_ci": np.array([0.1e-4, 0.2e-4, 0.2e-4]),
        "gap_values": np.array([8.0, 16.0]),
        "gap_nofix_acc_away": np.array([0.0, acc]), "gap_nofix_acc_away_ci": np.array([1e-5, acc_ci]),
        "gap_fix_acc_away": np.array([0.0, fix_acc]), "gap_fix_acc_away_ci": np.array([1e-5, fix_acc_ci]),
    }


def test_bias_reproduced_on_numbers_like_ours():
    v = V.judge_rounding_bias(rounding())
    assert v.verdict == V.REPRODUCED
    assert "A: yes" in v.evidence and "B: yes" in v.evidence and "C: yes" in v.evidence
    assert "Synthetic rows" in v.differs


@pytest.mark.parametrize("kw, expected", [
    (dict(acc=-5e-4), V.CONTRADICTED),                      # significantly toward zero: the flip
    (dict(acc=0.1e-4), V.NOT_REPRODUCED),                    # within its CI: no bias
    (dict(signed=+13.8e-4), V.PARTLY),                       # B fails: output pushed the other way
    (dict(tie1=12.9e-4), V.PARTLY),                          # C fails: a single maximum biases as much
    (dict(signed=+13.8e-4, tie1=12.9e-4), V.NOT_REPRODUCED),  # only A
])
def test_bias_verdict_flips(kw, expected):
    assert V.judge_rounding_bias(rounding(**kw)).verdict == expected


def test_fix_reproduced_on_numbers_like_ours():
    v = V.judge_fix_bias(rounding())
    assert v.verdict == V.REPRODUCED
    assert "(reproduced)" in v.evidence


@pytest.mark.parametrize("kw, expected", [
    (dict(fix_out=4e-4), V.PARTLY),              # the stored output keeps 30 % of the bias: worse of two
    (dict(fix_acc=10e-4), V.NOT_REPRODUCED),     # the fix leaves most of it
    (dict(fix_acc=30e-4), V.CONTRADICTED),       # the fix makes it worse
    (dict(acc=0.1e-4), V.NOT_TESTED),            # no bias without the fix: nothing to remove
])
def test_fix_verdict_flips(kw, expected):
    assert V.judge_fix_bias(rounding(**kw)).verdict == expected


def test_worked_addition():
    assert V.judge_worked_addition(-4.71875, -0.014759540557861328,
                                   "1 10000001 00101101000011100010111").verdict == V.REPRODUCED
    assert V.judge_worked_addition(-4.6875, 0.015625,   # the tie broken to even: not the paper's result
                                   "1 10000001 00101101000000000000000").verdict == V.NOT_REPRODUCED


def test_missing_evidence_is_never_reproduced():
    def load(name):
        raise ResultMissing(name)
    vs = V.verdicts(load=load, stored=lambda name: False)
    by = {v.claim: v.verdict for v in vs}
    assert by["C3a"] == V.REPRODUCED  # computed live from lpfail.bf16, needs no stored result
    assert all(by[c] == V.NOT_TESTED for c in by if c != "C3a")
    assert {"C1a", "C1b", "C1c", "C2", "C3b", "Fix-a", "Fix-b", "Fix-c", "β"} <= set(by)


def test_stored_but_unjudged_result_stays_not_tested():
    v = V.pending("C2", "claim", "gradient_error", "03_gradient_error", stored=lambda name: True)
    assert v.verdict == V.NOT_TESTED and "no rule" in v.evidence


def test_page_from_the_stored_results():
    vs = V.verdicts()
    md = V.summary_table(vs) + V.details(vs)
    assert "{numref}`fig-rounding-sweep`" in md
    assert sum(V.counts(vs).values()) == len(vs)
    with pytest.raises(ValueError):
        V.Verdict("x", "y", "maybe", "", "")


# -- C0 and Fix-b: training (chapter 1) -------------------------------------------------------------------
def sym_ev(a=((0, 3), (1, 3)), c=((0, 3), (0, 3)), b=((0, 3), None), pairs=11, worse=11, bp_nan=6):
    per = []
    for k, (af, cf, bf) in enumerate(zip(a, c, b)):
        d = {"config": f"cfg{k}", "A": af, "C": cf}
        if bf is not None:
            d["B"] = bf
        per.append(d)
    return {"per_config": per, "pairs": pairs, "pairs_a_worse": worse, "pairs_p": 0.001, "bp_nan": bp_nan,
            "bp_runs": 6, "a_rise_max": 1.27, "c_rise_max": 1.016}


@pytest.mark.parametrize("kw, expected", [
    ({}, V.PARTLY),  # like ours: A fails once, C never; A above C in every pair
    (dict(a=((3, 3), (0, 3))), V.REPRODUCED),  # A fails in every seed of one configuration, C in none
    (dict(a=((3, 3), (0, 3)), c=((1, 3), (0, 3))), V.PARTLY),  # ... but C fails there once
    (dict(a=((0, 3), (0, 3)), worse=6), V.NOT_REPRODUCED),  # nothing fails; pairs split
    (dict(a=((0, 3), (0, 3))), V.PARTLY),  # nothing fails, but A above C in 11 of 11 pairs (post hoc)
    (dict(a=((0, 3), (1, 3)), c=((1, 3), (0, 3))), V.CONTRADICTED),  # C fails as often as A
    (dict(a=((0, 3), (0, 3)), pairs=4, worse=4), V.NOT_REPRODUCED),  # too few pairs to say anything
])
def test_symptom_verdict_flips(kw, expected):
    v = V.judge_symptom(sym_ev(**kw))
    assert v.verdict == expected, (kw, v.verdict)
    assert "cfg0: A" in v.evidence


@pytest.mark.parametrize("kw, expected", [
    ({}, V.NOT_TESTED),  # like ours: B ran only where A did not fail
    (dict(a=((2, 3), (1, 3)), b=((0, 3), None)), V.REPRODUCED),
    (dict(a=((2, 3), (1, 3)), b=((1, 3), None)), V.PARTLY),
    (dict(a=((2, 3), (1, 3)), b=((2, 3), None)), V.NOT_REPRODUCED),
])
def test_fix_training_verdict_flips(kw, expected):
    v = V.judge_fix_training(sym_ev(**kw))
    assert v.verdict == expected, (kw, v.verdict)
    assert "NaN in 6 of 6" in v.evidence


def test_symptom_verdicts_from_the_stored_results():
    vs = {v.claim: v for v in V.verdicts()}
    assert vs["C0"].verdict in V.VERDICTS and vs["C0"].verdict != V.NOT_TESTED
    assert "Pre-registered failures" in vs["C0"].evidence and "symptom" in vs["C0"].evidence


def test_fix_cost_prefers_alternating_timings():
    """Fix-c states the alternating (paired) measurement when the benchmark has it, else the separate medians."""
    from tests.test_bench import fake
    res = fake(fix_cost=(0.10, 0.02))
    v = V.fix_cost(res)
    assert "+2.0 % to +2.0 %" in v.evidence and "+10.0 % to +10.0 %" in v.evidence and "alternation" in v.evidence
    single = {k: x for k, x in res.items() if not k.startswith("pair")}
    v = V.fix_cost(single)
    assert "+22.2 % to +22.2 %" in v.evidence and "single runs" in v.evidence  # 110 vs 90 TFLOP/s
