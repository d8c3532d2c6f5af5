"""Synthetic rows and the Ō rounding bias (chapter 4), and the addition explorer."""
import numpy as np
import pytest
import torch

from lpfail import bf16, results
from lpfail.book import widgets
from lpfail.experiments import rounding
from lpfail.precision import FP64, PAPER_BF16


def test_make_rows_structure_and_seed():
    spec = rounding.RowSpec(n_keys=128, n_ties=3, gap=12.0, neg_frac=0.75, head_dim=8)
    s, v, ties = rounding.make_rows(spec, 50, seed=3)
    assert s.shape == (50, 1, 128) and v.shape == (50, 128, 8) and ties.shape == (50, 128)
    row_max = s[:, 0].max(dim=1, keepdim=True).values
    assert torch.equal((s[:, 0] == row_max), ties)                 # exactly the tied keys hold the maximum
    assert (ties.sum(1) == 3).all()
    assert ((row_max >= 12.0) & (row_max <= 13.0)).all()
    assert torch.equal(v.to(torch.bfloat16).float(), v)           # BF16 values
    assert torch.equal(s.to(torch.bfloat16).float(), s)
    assert abs((v < 0).float().mean().item() - 0.75) < 0.03
    s2, v2, _ = rounding.make_rows(spec, 50, seed=3)
    assert torch.equal(s, s2) and torch.equal(v, v2)
    s3, _, _ = rounding.make_rows(spec, 50, seed=4)
    assert not torch.equal(s, s3)


@pytest.mark.parametrize("bad", [dict(n_ties=0), dict(neg_frac=1.5), dict(gap=float("inf")), dict(v_low=0.0),
                                 dict(n_keys=1), dict(gap_width=-1.0), dict(head_dim=0)])
def test_rowspec_validation(bad):
    with pytest.raises(ValueError, match="RowSpec"):
        rounding.RowSpec(**bad)


def test_fp64_policy_has_no_error():
    s, v, _ = rounding.make_rows(rounding.RowSpec(n_keys=256, head_dim=16), 20, seed=0)
    err = rounding.row_errors(s, v, FP64)
    for part in (err.o_err, err.acc_err, err.out_err):
        assert np.abs(part).max() < 1e-12


def test_paper_policy_rounds_away_from_zero_and_fix_removes_it():
    """The chapter's central measurement on 300 default rows (deterministic seeds): the P̄V accumulation
    error of PAPER_BF16 is biased toward larger magnitude, far outside its CI; with the fix it is not."""
    s, v, _ = rounding.make_rows(rounding.RowSpec(), 300, seed=11)
    nofix = rounding.mean_ci(rounding.row_errors(s, v, PAPER_BF16).away_from_zero("acc_err"))
    fix = rounding.mean_ci(rounding.row_errors(s, v, PAPER_BF16.with_fix()).away_from_zero("acc_err"))
    assert nofix[0] > 5e-4 and nofix[0] > 10 * nofix[1]
    assert abs(fix[0]) < 3 * fix[1] and abs(fix[0]) < 0.1 * nofix[0]


def test_single_maximum_is_not_biased_like_ties():
    s, v, _ = rounding.make_rows(rounding.RowSpec(n_ties=1), 300, seed=11)
    single = rounding.mean_ci(rounding.row_errors(s, v, PAPER_BF16).away_from_zero("acc_err"))
    assert abs(single[0]) < 2e-4


def test_running_error_jumps_at_tied_keys():
    s_row, v_col = rounding.demo_row(n_ties=2, seed=0)
    tied = rounding.running_error(s_row, v_col)
    idx = np.flatnonzero(tied["is_one"])
    assert len(idx) == 2 and (v_col[idx] < 0).all()
    err = tied["error"]
    jumps = np.abs(np.diff(err))
    assert jumps.argmax() + 1 in idx                       # the largest change of the error is at a P̄ = 1 key
    assert np.abs(tied["fp32_error"]).max() < 1e-5 < np.abs(err[-1])
    exact = rounding.running_error(s_row, v_col, FP64)
    assert np.abs(exact["error"]).max() < 1e-12
    fixed = rounding.running_error(s_row, v_col, PAPER_BF16.with_fix())
    assert not fixed["is_one"].any()                       # the fix leaves no P̄ = 1


def test_mean_ci():
    m, h = rounding.mean_ci(np.array([1.0, 2.0, 3.0, 4.0]))
    assert m == 2.5 and h == pytest.approx(1.96 * np.std([1, 2, 3, 4], ddof=1) / 2)


def test_rounding_experiment_is_registered_with_a_stable_config():
    exp = results.get("rounding")
    assert exp.gpu is False
    assert results.config_hash(exp.default_config()) == results.config_hash(rounding.RoundingConfig())


def test_rounding_experiment_small_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LPFAIL_RESULTS_DIR", str(tmp_path))
    cfg = rounding.RoundingConfig(n_rows=40, ties=(1, 2), neg_fracs=(0.5,), gaps=(16.0,),
                                  base=rounding.RowSpec(n_keys=128, head_dim=8))
    res = results.run("rounding", cfg)
    for axis in ("ties", "neg_frac", "gap"):
        for p in ("nofix", "fix"):
            for stat in rounding.STATS:
                assert res[f"{axis}_{p}_{stat}"].shape == res[f"{axis}_values"].shape
    assert res.meta["config"]["n_rows"] == 40
    assert np.isfinite(res["default_nofix_acc_away"])


def test_gallery_cases_are_what_their_titles_say():
    kinds = {title: widgets.trace(kind, a, b) for title, kind, a, b in widgets.ADDITION_GALLERY}
    paper, tie, odd, opposite, cancel, gap = kinds.values()
    assert float(paper.result) == -4.71875 and paper.direction == "away from zero"
    assert tie.decision == "tie→even" and tie.direction == "toward zero"
    assert odd.decision == "tie→even" and odd.direction == "away from zero"
    assert opposite.direction == "toward zero"
    assert cancel.normalization == "cancellation"
    assert gap.decision in ("down", "up") and gap.exponent_gap > 8
    html = widgets.addition_gallery_html()
    assert html.count("<table") == len(widgets.ADDITION_GALLERY)
    with pytest.raises(ValueError, match="kind"):
        widgets.trace("fp8", 1.0, 1.0)


def test_explorer_updates_on_input():
    box = widgets.addition_explorer()
    presets, mode, inputs, out = box.children
    first = out.value
    assert "-4.71875" in first
    a_box, b_box = inputs.children
    mode.value = "bf16"
    a_box.value, b_box.value = 1.5, 2.25
    assert "3.75" in out.value and out.value != first
    b_box.value = 0.1                                      # not representable: the explorer says so
    assert "not representable" in out.value
    presets.value = 4
    assert mode.value == "bf16" and a_box.value == widgets.ADDITION_GALLERY[4][2]
    assert float(bf16.add_trace(a_box.value, b_box.value).result) == a_box.value + b_box.value


def test_paper_exercise_operands_are_the_bits_its_statement_spells():
    """Exercise 4.2 states its operands' bits by hand; they must be what `bf16.describe` gives, and the pair must be
    an exact tie after the carry, broken away from zero (the point of the exercise)."""
    from lpfail import bf16
    from lpfail.book import rounding_report as RR

    a, b = RR.PAPER_EXERCISE_ADD
    assert bf16.describe(a) == "-2.625 = -1.0101000₂ × 2^1" and bf16.describe(b) == "-2.171875 = -1.0001011₂ × 2^1"
    t = bf16.add_trace(a, b)
    assert (t.normalization, t.decision, t.direction) == ("carry", "tie→even", "away from zero")


def test_fix_twin_labels_agree_with_their_tables():
    from lpfail import results
    from lpfail.book import fix_widgets as F

    labels = [F.case_label(t, a, sts) for t, a, sts in F.states(results.load("fix_gallery"))]
    assert labels[0].endswith("leaves 11 % of the bias") and "16–17" in labels[0]
    assert "e^−116" in labels[6] and "0.5–1.5" in labels[4]
