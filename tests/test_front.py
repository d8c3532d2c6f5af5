"""The first page's answer (`lpfail.book.front.thesis`, `advice`) follows the verdicts and the stored results: a
fixture that flips a verdict, a call or the dial's state changes the sentence that rests on it."""
import dataclasses
import functools

from lpfail import results
from lpfail.book import front, verdict


@functools.lru_cache(maxsize=1)
def _stored_verdicts():
    return tuple(verdict.verdicts())


def _vs(**flips):
    return [dataclasses.replace(v, verdict=flips.get(v.claim, v.verdict)) for v in _stored_verdicts()]


def _load(**over):
    def load(name):
        if name in over:
            if over[name] is None:
                raise results.ResultMissing(name)
            return over[name]
        return results.load(name)
    return load


def test_the_thesis_says_what_is_real_and_names_the_proxy():
    t = front.thesis(_vs())
    assert t.startswith("The rounding bias the paper blames") and "is real" in t
    assert "layers ×" in t and "steps" in t and "learning rates" in t  # "on our proxy" names size, steps and rates
    assert "<01_symptom>`" in t


def test_flipping_a_verdict_changes_the_thesis():
    base = front.thesis(_vs())
    flipped = front.thesis(_vs(C3b=verdict.NOT_REPRODUCED))
    assert flipped != base and "is real" not in flipped and "C3b not reproduced" in flipped
    assert "not shown" in front.thesis(_vs(C1b=verdict.NOT_REPRODUCED, C2=verdict.NOT_REPRODUCED))
    assert "C1b reproduced" in front.thesis(_vs(C1b=verdict.REPRODUCED))


def test_the_dial_reads_pending_until_its_result_is_complete():
    assert "no stored run yet" in front.thesis(_vs(), _load(dial_training=None))
    dial = results.load("dial_training")
    pending = {**dict(dial), "analysis": {**dial["analysis"], "calls": {}}}
    assert (f"is pending: {int(dial['runs_stored'])} of {int(dial['runs_planned'])} runs"
            in front.thesis(_vs(), _load(dial_training=pending)))
    row = {"verdict": "supported", "estimate": 0.05, "ci": [0.01, 0.09], "p_adjusted": 0.01}
    done = {**dict(dial), "complete": True, "runs_stored": 265, "runs_planned": 265,
            "analysis": {"calls": {"H8": {"A_3 − SR_3 @lr=0.008": row}}}}
    t = front.thesis(_vs(), _load(dial_training=done))
    assert "of 265 runs" not in t and "At every K" in t and f"(the precision dial: *{verdict.REPRODUCED}*," in t
    partly = {**done, "analysis": {"calls": {"H8": {"A_3 − SR_3 @lr=0.008": row, "A_5 − SR_5 @lr=0.004": {
        **row, "verdict": "inconclusive"}}}}}
    assert ("At equal precision, biased rounding trained worse than unbiased only at 3 fraction bits and "
            f"8e-3 (the precision dial: *{verdict.PARTLY}*" in front.thesis(_vs(), _load(dial_training=partly)))
    flipped = {**done, "analysis": {"calls": {"H8": {"A_3 − SR_3 @lr=0.008": {**row, "verdict": "inconclusive"}}}}}
    assert "At no K or rate" in front.thesis(_vs(), _load(dial_training=flipped))


def test_advice_follows_the_calls():
    conf = results.load("confirmation")
    a = front.advice(_vs())
    assert len(a) == 5 and all("{doc}`" in line for line in a)
    # the dial's narrow finding (2 of H8's 12 rows) is the thesis' to state, never generalised into advice
    assert "stochastic" not in a[2] and "fraction bits" not in a[2]
    # HD tests the whole production arithmetic: the advice names the scores with the accumulators
    assert a[1].startswith("**BF16 scores and accumulators**") and "use FP32" in a[1]
    claims = conf["analysis"]["claims"]
    if claims["HD"]["verdict"] == "supported":
        flipped = {**dict(conf), "analysis": {**conf["analysis"], "claims": {**claims, "HD": {**claims["HD"],
                                                                             "verdict": "inconclusive"}}}}
        b = front.advice(_vs(), _load(confirmation=flipped))
        assert "not shown to close" in b[1] and "at least half" in a[1]
    assert "toward zero" not in front.advice(_vs(**{"K-bias:sdpa_flash": verdict.REPRODUCED}))[0]
    assert a[3].startswith("**Monitor**") and "against FP32 attention" in a[3]   # neither alert tells a failure
    # the fixes and QK-norm are two sentences, each a whole clause whatever Fix-b reads, each linked to its chapter
    assert a[4].startswith("**Both fixes** remove the bias; in training ") and "**QK-norm**" in a[4]
    assert "05_fix" in a[4] and "06_beyond" in a[4]
    for word in (verdict.NOT_REPRODUCED, verdict.CONTRADICTED, verdict.REPRODUCED):
        line = front.advice(_vs(**{"Fix-b": word}))[4]
        assert line.startswith("**Both fixes** remove the bias; in training ") and "; are" not in line



def test_the_thesis_words_stochastic_rounding_by_its_call():
    """H2 refuted: the thesis says stochastic rounding closes less than half; inconclusive: that
    removing the bias is not shown to close it — never the weaker sentence for the stronger evidence."""
    conf = results.load("confirmation")
    claims = conf["analysis"]["claims"]

    def with_h2(word):
        return {**dict(conf), "analysis": {**conf["analysis"], "claims": {**claims, "H2": {**claims["H2"],
                                                                                          "verdict": word}}}}
    refuted = front.thesis(_vs(), _load(confirmation=with_h2("refuted")))
    assert "stochastic rounding (unbiased, noisier) closes less than half" in refuted
    unshown = front.thesis(_vs(), _load(confirmation=with_h2("inconclusive")))
    assert "removing the bias is not shown to" in unshown and "stochastic rounding" not in unshown


def test_the_remedies_of_the_bias_are_worded_by_their_calls():
    from lpfail.book import confirmation_report as CR, dial_report

    a = {"claims": {"H2": {"verdict": "refuted"}, "HB": {"verdict": "inconclusive"}, "HR": {"verdict": "inconclusive"}}}
    assert CR.bias_cures_said(a) == ("Stochastic rounding closes significantly less than half of it; the official "
                                     "fix and the robust fix leave too much of it for the rule to call")
    a["claims"]["HR"]["verdict"] = "supported"
    assert CR.bias_cures_said(a).startswith("The robust fix closes at least half of it; stochastic rounding closes")
    h2 = {"estimate": 0.04, "ci": [0.02, 0.06], "n": 10, "p_adjusted": 0.008, "verdict": "refuted"}
    assert dial_report.sr_says({"analysis": {"claims": {"H2": h2}}}).startswith("It does not: it closes significantly")
    assert dial_report.sr_says({"analysis": {"claims": {"H2": {**h2, "verdict": "inconclusive"}}}}).startswith(
        "It is not shown to: (S(A_sr)")
