"""The monitor's replayed max-logit alert on fabricated lr_sweep-like results."""
import numpy as np

from lpfail.book import monitor_eval as me


def _res():
    # 2 variants (A, C) × 2 lrs × 2 seeds, 5 diag steps, 2 layers; 10 loss bins over 100 steps
    ml = np.full((2, 2, 2, 5, 2), 5.0)
    ml[0, 1, :, 2:, 1] = 50.0            # A at the high lr: layer 1 passes 30 at diag step 40
    ml[1, 1, 0, 4, 0] = 31.0             # C at the high lr, seed 0: a late crossing (a false alarm)
    loss = np.full((2, 2, 2, 10), 2.0)
    loss[0, 1, :, 6:] = 2.5              # A at the high lr leaves C from bin 6 (step 60)
    return {"small_variants": np.array(["A", "C"]), "small_stored": np.ones((2, 2, 2), bool),
            "lrs": np.array([1e-3, 3e-2]), "diag_step": np.arange(5) * 20, "val_step": np.array([0, 100]),
            "small_max_logit": ml, "small_loss_curve": loss}


def test_alert_divergence_and_lead():
    out = me.evaluate(_res())
    assert out["threshold"] == 30.0
    assert out["variants"]["A"]["alert_frac"] == [0.0, 1.0]
    assert out["variants"]["A"]["alert_step_median"] == [None, 40.0]
    assert out["variants"]["C"]["alert_frac"] == [0.0, 0.5]
    assert np.isnan(out["A_divergence_step"][0]).all() and out["A_divergence_step"][1] == [60.0, 60.0]
    assert out["A_lead_steps"][1] == [20.0, 20.0]
    assert out["false_alarm_frac"] == {"C": 0.25}


def test_threshold_and_missing_variants():
    r = _res()
    assert me.evaluate(r, threshold=60.0)["variants"]["A"]["alert_frac"] == [0.0, 0.0]
    r["small_stored"][1, 0, 0] = False
    out = me.evaluate(r)
    assert out["missing"] == ["C"] and "A_lead_steps" not in out


def test_nan_records_do_not_alert():
    ml = np.array([[np.nan, np.nan], [40.0, np.nan]])
    assert me.alert_steps(ml, np.array([0, 100]), 30.0) == 100.0


def test_overhead_lines_say_missed_and_name_the_missing_floor():
    from lpfail.book.diagnose import overhead_lines
    old = {"device": "GPU", "model": "m", "steps": 60, "overhead_pct_median": 4.8, "overhead_pct_mean": 5225.0,
           "mean_monitored_s": 1.41, "mean_plain_s": [0.027, 0.026], "losses_identical": False,
           "max_loss_diff": 2.4e-4}
    lines = overhead_lines(old, {"when": "2026-12-01", "monitor": "old"})
    assert all(len(x) <= 76 for x in "\n".join(lines).splitlines())
    text = " ".join(" ".join(lines).split())
    assert "target ≤ 2 %: missed" in text and "2026-12-01" in text and "not compared" in text
    new = dict(old, overhead_pct_median_unsampled=0.3, overhead_pct_mean=1.5, losses_identical=True,
               max_loss_diff=0.0, plain_runs_identical=True, max_loss_diff_plain_plain=0.0,
               when="2026-12-02 10:00 UTC", git="abcdef1234567890")
    text = " ".join(" ".join(overhead_lines(new, {"when": "2026-12-01"})).split())
    assert "target ≤ 2 %: met" in text and "2026-12-02" in text and "git abcdef123456" in text
    assert "noise floor): True" in text and "+0.3 %" in text


def test_overhead_loader_and_breakdown(tmp_path, monkeypatch):
    import json

    import pytest

    from lpfail.book import diagnose as dg

    monkeypatch.setenv("LPFAIL_RESULTS_DIR", str(tmp_path))
    assert dg.load_overhead() is None
    p = tmp_path / dg.OVERHEAD_FILE
    p.parent.mkdir(parents=True)
    p.write_text("{")
    with pytest.raises(ValueError, match="corrupt"):
        dg.load_overhead()
    p.write_text(json.dumps({"sampled_step_breakdown_s": {"forward_sampled": 0.0324, "forward_plain": 0.0199,
                                                           "qk_norms": 0.0038, "entropy_host": 0.0196}}))
    lines = dg.breakdown_lines(dg.load_overhead())
    text = " ".join(" ".join(lines).split())
    assert "forward 32.4 ms sampled vs 19.9 ms plain" in text and "norms 3.8 ms" in text
    assert "copy to host" not in text and all(len(x) <= 76 for x in "\n".join(lines).splitlines())
    assert dg.breakdown_lines({}) == []
