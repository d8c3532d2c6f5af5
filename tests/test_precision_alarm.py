"""The precision alarm's pre-registered rule (`lpfail.experiments.precision_alarm`): when it fires on monitor
records, its false-alarm rate on simulated null data (error terms of random sign along one direction, the
widest case of chapter 3) and its power when the error keeps one sign, and the evaluation's arithmetic."""
import math

import numpy as np
import pytest

from lpfail.experiments import precision_alarm as P

LAYERS, HEADS = 4, 4  # the smaller size: 4 layers × 4 heads, Q and K: 32 tests per run


def _records(signs: np.ndarray, err: float = 2e-3, every: int = 10, window: int = P.RULE.window):
    """Monitor-style records from per-measurement error signs (n, side, layer, head), equal sizes along one
    direction: ρ over the latest `window` terms is |Σ s| / √(terms) (None with fewer than two terms)."""
    out = []
    for k in range(signs.shape[0]):
        lo = max(0, k + 1 - window)
        w = signs[lo:k + 1]
        rho = np.abs(w.sum(axis=0)) / math.sqrt(w.shape[0]) if w.shape[0] >= 2 else None
        rec = {"kind": "record", "step": every * k}
        for i, side in enumerate("qk"):
            rec[f"alarm_d{side}_rel"] = np.full((LAYERS, HEADS), err).tolist()
            rec[f"alarm_rho_{side}"] = [[None] * HEADS] * LAYERS if rho is None else rho[i].tolist()
        out.append(rec)
    return out


def test_fires_after_consecutive_measurements_and_only_past_the_gate():
    n = 40
    same = np.ones((n, 2, LAYERS, HEADS))
    hit = P.fires(_records(same))
    # ρ of k equal terms is √k: ≥ 4 from the 16th measurement (k = 15), held at 15, 16, 17 → fires at step 170
    assert hit == {"step": 170, "layer": 0, "head": 0, "side": "q"}
    assert P.fires(_records(same, err=5e-4)) is None                 # FP32-level errors: the gate stays shut
    assert P.fires(_records(same), P.Rule(consecutive=1))["step"] == 150
    # a NaN or missing value holds neither gate nor signal; records without the alarm's fields are skipped
    recs = _records(same)
    for r in recs[:20]:
        r["alarm_dq_rel"] = [[float("nan")] * HEADS] * LAYERS
        r["alarm_dk_rel"] = [[float("nan")] * HEADS] * LAYERS
    # the gate opens at the first measurement with a finite error in its window (k = 20): fires at k = 22
    assert P.fires(recs)["step"] == 220
    assert P.fires([{"kind": "header"}, {"kind": "record", "step": 0}]) is None
    with pytest.raises(ValueError, match="positive int"):
        P.Rule(window=0)
    with pytest.raises(ValueError, match="> 0"):
        P.Rule(gate=0)


def test_false_alarm_rate_on_null_data_and_power():
    """Null: every error term along one direction with a random sign (ρ² has mean 1), 32 tests and 100
    measurements per run, as on the smaller size's grid. The pre-registered rule must alarm in ≤ 5 % of such runs
    (notes/beyond.md simulated 1.3 %), and in most runs whose signs are + with probability 0.9 (simulated 84 %)."""
    g = np.random.default_rng(0)
    runs = 200
    null = sum(P.fires(_records(g.choice([-1.0, 1.0], size=(100, 2, LAYERS, HEADS)))) is not None
               for _ in range(runs)) / runs
    biased = sum(P.fires(_records(np.where(g.random((100, 2, LAYERS, HEADS)) < 0.9, 1.0, -1.0))) is not None
                 for _ in range(50)) / 50
    print(f"alarm rate: null {null:.3f}, signs + with p = 0.9: {biased:.2f}")
    assert null <= 0.05
    assert biased >= 0.6
    # the looser threshold the draft rejected (x = 3.5) alarms far more often under the same null
    loose = sum(P.fires(_records(g.choice([-1.0, 1.0], size=(100, 2, LAYERS, HEADS))), P.Rule(rho=3.5)) is not None
                for _ in range(50)) / 50
    assert loose > null


def test_evaluate_counts_false_alarms_and_lead_times():
    n = 60
    ones, zeros = np.ones((n, 2, LAYERS, HEADS)), np.zeros((n, 2, LAYERS, HEADS))
    flat = np.full(n // 10, 2.0)
    rising = flat.copy()
    rising[4:] = 3.0   # A worse than C by > 5 % from bin 4 (bins of 100 steps): divergence at step 400
    runs = {("A", 0.032, 10): {"records": _records(ones), "loss": rising, "bin_steps": 100, "logit_alert": 300},
            ("C", 0.032, 10): {"records": _records(ones, err=1e-6), "loss": flat, "bin_steps": 100},
            ("D", 0.032, 10): {"records": _records(zeros), "loss": flat, "bin_steps": 100}}
    out = P.evaluate(runs)
    assert out["false_alarm"]["C"] == {"runs": 1, "alarms": 0, "frac": 0.0}
    assert out["false_alarm"]["D"]["frac"] == 0.0   # ρ of zero terms is 0: no signal
    lead = out["lead"]["0.032/s10"]
    assert lead["divergence_step"] == 400 and lead["alarm_step"] == 170
    assert lead["alarm_lead"] == 230 and lead["logit_lead"] == 100


def test_the_grid_end_to_end_on_the_cpu(tmp_path):
    """Two tiny runs (A and C) through the sweep framework with the monitor on: their records reach the part,
    the result evaluates the rule on them, and the grid refuses a monitor without the alarm."""
    from lpfail import sweep

    tiny = dict(lrs=(1e-2,), seeds=(0,), variants=("A", "C"), small=(1, 2, 32), block_size=16, batch_size=4,
                max_steps=6, warmup=2, val_rows=4, val_every=3, diag_every=3, curve_points=3,
                monitor="every=2 window=2 sample_batch=1 alarm=2")
    grid = P.PrecisionAlarmGrid(P.PrecisionAlarmConfig(**tiny))
    assert all(r.config.monitor == tiny["monitor"] and not r.config.cuda_graph for r in grid.runs())
    sweep.drive(grid, root=tmp_path / "root", directory=tmp_path, parallel=2, budget_s=600, log=lambda *_: None)
    lk = sweep.lookup(grid, tmp_path)
    assert lk.complete
    a = lk.have["small/A/lr0.01/s0"]
    assert [r["step"] for r in a["monitor"]] == [0, 2, 4]
    assert np.shape(a["monitor"][0]["alarm_dq_rel"]) == (1, 2)
    assert min(min(row) for row in a["monitor"][0]["alarm_dq_rel"]) > 1e-4     # A's BF16 gradient error is seen
    res = grid.result(lk.have, [])
    assert res["complete"] and res["runs_stored"] == 2
    assert set(res["analysis"]["lead"]) == {"0.01/s0"} and "C" in res["analysis"]["false_alarm"]
    with pytest.raises(ValueError, match="alarm"):
        P.PrecisionAlarmConfig(monitor="every=10 window=10")
    assert P.logit_alert([{"step": 0, "max_logit": [[3.0, 40.0]]}]) == 0
    assert P.logit_alert([{"step": 0, "max_logit": [[3.0, None]]}]) is None


def test_quick_profile_is_a_c_and_d_at_the_highest_rate():
    q = P.precision_alarm_grid().quick()
    assert [r.id for r in q.runs] == ["small/A/lr0.032/s10", "small/C/lr0.032/s10", "small/D/lr0.032/s10"]
    n = 30
    recs = _records(np.ones((n, 2, LAYERS, HEADS)))
    assert q.statistic({"small/A/lr0.032/s10": {"monitor": recs}}, 10) == 170.0
    assert math.isnan(q.statistic({}, 10))
    assert q.statistic({"small/A/lr0.032/s10": {"monitor": []}}, 10) == 1000.0   # never fired: the run's length


def test_describe_reports_rho_errors_and_the_logit_alert_per_run_and_cell():
    """`describe` (written after the evaluation was seen): per run the largest ρ, the share at or above the rule's
    ρ, the median dQ error and the logit alert; per cell their ranges and counts; per step the seeds' median of
    the largest ρ."""
    g = np.random.default_rng(1)
    same = _records(np.ones((20, 2, LAYERS, HEADS)), err=3e-3)
    noise = _records(g.choice([-1.0, 1.0], size=(20, 2, LAYERS, HEADS)), err=1e-2)
    runs = {("A", 0.032, 10): {"records": same, "logit_alert": 20},
            ("A", 0.032, 11): {"records": noise, "logit_alert": None},
            ("C", 0.032, 10): {"records": noise, "logit_alert": 30}}
    d = P.describe(runs)
    a10 = d["runs"]["A@0.032/s10"]
    assert a10["rho_max"] == pytest.approx(4.0)          # 16 equal terms in the window: √16
    assert a10["rho_frac_over"] == pytest.approx(5 / 19)  # measurements 15..19 of the 19 with a ρ
    assert a10["dq_rel_median"] == pytest.approx(3e-3) and a10["logit_alert"] == 20
    assert d["runs"]["A@0.032/s11"]["rho_max"] < 4.0
    cell = d["cells"]["A@0.032"]
    assert cell["runs"] == 2 and cell["logit_alerts"] == 1
    assert cell["rho_max_range"][1] == pytest.approx(4.0) and cell["rho_max_range"][0] < 4.0
    curve = d["rho_by_step"]["A@0.032"]
    assert curve["steps"] == list(range(0, 200, 10))
    assert math.isnan(curve["rho_max_median"][0])         # the first measurement has no ρ yet
    both = [max(x for row in r["alarm_rho_q"] + r["alarm_rho_k"] for x in row) for r in same[1:]]
    other = [max(x for row in r["alarm_rho_q"] + r["alarm_rho_k"] for x in row) for r in noise[1:]]
    assert curve["rho_max_median"][1:] == pytest.approx([(a + b) / 2 for a, b in zip(both, other)])
    assert "after" in d["described"]


def test_chapter_7_tables_and_facts_from_the_stored_evaluation():
    """The chapter's numbers come from results/precision_alarm.json: every run is in the tables, the counts
    agree with the evaluation's alarm steps, and a cell never reads 'x–x'."""
    from lpfail import results
    from lpfail.book import diagnose as dg

    res = results.load("precision_alarm")
    f = dg.alarm_facts(res, dg.load_overhead(dg.ALARM_OVERHEAD_FILE))
    an = res["analysis"]
    assert f["runs"] == len(an["alarm_step"]) == 30
    assert f["alarms"] == sum(v is not None for v in an["alarm_step"].values())
    assert f["false"]["C"][1] == f["false"]["D"][1] == 10 and f["a_runs"] == 10
    assert f["a_diverging"] == sum(np.isfinite(d["divergence_step"]) for d in an["lead"].values())
    assert f["overhead"]["every"] == 100 and f["overhead"]["alarm_pct"] < f["overhead"]["total_pct"]
    table = dg.alarm_table(res)
    assert len(table.splitlines()) == 2 + 6
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        lo_hi = cells[5].split("–")
        assert len(lo_hi) in (1, 2) and (len(lo_hi) == 1 or lo_hi[0] != lo_hi[1])
    lead = dg.alarm_lead_table(res)
    assert len(lead.splitlines()) == 2 + 10
    assert "nan" not in (table + lead).lower()


# -- the second rule (ScaledRule), its decision and the design's power ---------------------------------------------
def _rec(step, dq, dk, logit, layers=2, heads=2):
    grid = lambda x: [[x] * heads for _ in range(layers)]  # noqa: E731
    return {"kind": "record", "step": step, "alarm_dq_rel": grid(dq), "alarm_dk_rel": grid(dk),
            "max_logit": grid(logit)}


def test_binomial_interval_is_scipys_exact_interval():
    from scipy.stats import binomtest

    from lpfail.sweep.stats import binomial_interval

    for k, n in [(0, 10), (2, 10), (7, 7), (13, 27), (1, 40)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert binomial_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    with pytest.raises(ValueError):
        binomial_interval(3, 2)


def test_scaled_statistic_is_the_median_error_per_unit_of_logit():
    rec = _rec(0, 0.02, 0.04, 60.0)
    assert P.scaled_statistic(rec) == pytest.approx(0.5 * (0.02 + 0.04) / 60.0)
    rec["max_logit"][0][0] = 0.2  # below the floor of 1: divided by 1
    rec["alarm_dq_rel"][1][1] = float("nan")  # a head without finite values is left out
    vals = sorted([0.03 / 1.0, 0.03 / 60, 0.03 / 60])
    assert P.scaled_statistic(rec) == pytest.approx(vals[1])
    assert np.isnan(P.scaled_statistic({"alarm_dq_rel": [[float("nan")]], "alarm_dk_rel": [[1.0]],
                                        "max_logit": [[1.0]]}))


def test_scaled_rule_fires_after_its_consecutive_measurements_and_a_gap_restarts_the_count():
    rule = P.ScaledRule(threshold=1e-3, consecutive=3)
    hi, lo = (0.1, 0.1, 10.0), (0.001, 0.001, 10.0)  # statistic 1e-2 and 1e-4
    recs = [_rec(10 * i, *x) for i, x in enumerate([hi, hi, lo, hi, hi, hi, hi])]
    assert P.scaled_fires(recs, rule) == 50
    assert P.scaled_fires(recs[:5], rule) is None
    nan = _rec(20, float("nan"), float("nan"), 10.0)
    assert P.scaled_fires([recs[0], recs[1], nan, recs[3], recs[4]], rule) is None
    with pytest.raises(ValueError):
        P.ScaledRule(consecutive=0)


def test_decide_says_met_missed_or_undecided_from_the_exact_intervals():
    met = P.decide(40, 40, {"C": (0, 60), "D": (0, 60)})
    assert met["word"] == "met" and met["undecided"] == []
    assert P.decide(10, 20, {"C": (0, 60), "D": (0, 60)})["word"] == "missed"   # hit interval below 0.8
    assert P.decide(40, 40, {"C": (0, 60), "D": (20, 60)})["word"] == "missed"  # D's interval above 0.1
    und = P.decide(7, 7, {"C": (0, 10), "D": (2, 10)})
    assert und["word"] == "undecided" and set(und["undecided"]) == {"hit", "C", "D"}
    assert P.decide(0, 0, {"C": (0, 60), "D": (0, 60)})["undecided"] == ["hit"]


def test_decision_rates_measure_power_and_never_call_met_when_false_alarms_are_common():
    strong = P.decision_rates(1.0, {"C": 0.0, "D": 0.0}, 40, {"C": 60, "D": 60}, n_sims=200)
    assert strong["met"] == 1.0
    bad = P.decision_rates(0.95, {"C": 0.0, "D": 0.3}, 27, {"C": 40, "D": 40}, n_sims=300)
    assert bad["met"] == 0.0 and bad["missed"] > 0.5


def test_evaluate_scaled_counts_hits_false_alarms_and_quiet_a_runs():
    loud = [_rec(10 * i, 0.1, 0.1, 10.0) for i in range(20)]   # statistic 1e-2: fires at step 70
    calm = [_rec(10 * i, 0.001, 0.001, 10.0) for i in range(20)]
    flat, bad = [3.0] * 20, [3.0] * 10 + [4.0] * 10   # A's loss 33 % above C's from bin 10 (step 500)
    runs = {("A", 0.032, 1): {"records": loud, "loss": bad, "bin_steps": 50, "logit_alert": 20},
            ("C", 0.032, 1): {"records": calm, "loss": flat, "bin_steps": 50, "logit_alert": 20},
            ("D", 0.032, 1): {"records": loud, "loss": flat, "bin_steps": 50, "logit_alert": None},
            ("A", 0.032, 2): {"records": loud, "loss": flat, "bin_steps": 50, "logit_alert": None},
            ("C", 0.032, 2): {"records": calm, "loss": flat, "bin_steps": 50, "logit_alert": None},
            ("D", 0.032, 2): {"records": calm, "loss": flat, "bin_steps": 50, "logit_alert": None}}
    out = P.evaluate_scaled(runs)
    assert out["lead"]["0.032/s1"]["divergence_step"] == 500 and out["lead"]["0.032/s1"]["alarm_lead"] == 430
    d = out["decision"]
    assert d["hit"]["k"] == 1 and d["hit"]["n"] == 1
    assert d["false_alarm"]["C"]["k"] == 0 and d["false_alarm"]["D"]["k"] == 1 and d["false_alarm"]["D"]["n"] == 2
    assert out["A_without_divergence"] == {"runs": 1, "alarms": 1}
    assert out["logit_alert"]["false_alarms"]["C"] == [1, 2]


def _three_runs(d_alarms: bool) -> dict:
    """One seed of A (diverging at step 500, alarmed at 70), C (quiet) and D (alarmed or quiet)."""
    loud = [_rec(10 * i, 0.1, 0.1, 10.0) for i in range(20)]
    calm = [_rec(10 * i, 0.001, 0.001, 10.0) for i in range(20)]
    return {("A", 0.032, 1): {"records": loud, "loss": [3.0] * 10 + [4.0] * 10, "bin_steps": 50},
            ("C", 0.032, 1): {"records": calm, "loss": [3.0] * 20, "bin_steps": 50},
            ("D", 0.032, 1): {"records": loud if d_alarms else calm, "loss": [3.0] * 20, "bin_steps": 50}}


def test_chapter_7s_paragraph_on_the_second_rule_comes_from_the_stored_development_numbers():
    from lpfail.book import diagnose as dg

    text = dg.scaled_rule_text({"scaled_development": P.evaluate_scaled(_three_runs(d_alarms=False))})
    assert "precedes 1 of 1 divergences" in text and "0 of 1 FP32 runs and 0 of 1 production runs" in text
    assert "at step 70, its earliest," in text and "development numbers" in text and "has not run yet" in text
    assert dg.scaled_rule_text({}).endswith("Its numbers on these runs are not stored.")


def test_the_second_rules_grid_is_fresh_and_evaluates_the_second_rule():
    from lpfail import sweep

    grid = sweep.get("precision_alarm_fresh")
    runs = grid.runs()
    assert len(runs) == 120 and {r.seed for r in runs} == set(P.SCALED_GRID["seeds"])
    assert all(r.store.folder == "precision_alarm_fresh_parts" for r in runs)
    for name in sweep.names():
        if name != "precision_alarm_fresh":
            assert not {r.seed for r in sweep.get(name).runs()} & set(P.SCALED_GRID["seeds"]), name
    loud = [_rec(10 * i, 0.1, 0.1, 10.0) for i in range(20)]
    assert grid.alarm_step(loud) == 70 and sweep.get("precision_alarm").alarm_step(loud) is None


def test_chapter_7s_paragraph_gives_the_fresh_decision_once_stored():
    from lpfail.book import diagnose as dg

    runs = _three_runs(d_alarms=True)
    dev = {"scaled_development": P.evaluate_scaled(runs)}
    partial = {"complete": False, "runs_stored": 12, "runs_planned": 120}
    assert dg.scaled_rule_text(dev, partial).endswith("has not run yet (12 of 120 runs stored).")
    fresh = {"complete": True, "runs_stored": 3, "runs_planned": 3, "analysis": P.evaluate_scaled(runs)}
    text = dg.scaled_rule_text(dev, fresh)
    assert "divergences hit 1 of 1 [" in text and "on production runs 1 of 1 [" in text
    assert ("The goal is undecided (the hit rate, the false alarms on FP32 attention and those on production "
            "arithmetic not decided by the runs).") in text
    from lpfail.sweep.stats import binomial_interval

    lo, _ = binomial_interval(1, 1)
    assert f"divergences hit 1 of 1 [{100 * lo:.0f}–100 %]" in text and "**" not in text  # glue:text: plain text


def test_chapter_7s_first_screen_and_lab_table_come_from_the_fresh_test():
    from lpfail.book import diagnose as dg

    runs = _three_runs(d_alarms=True)
    runs[("A", 0.016, 1)] = {"records": runs[("A", 0.032, 1)]["records"], "loss": [3.0] + [4.0] * 19,   # diverges
                             "bin_steps": 50}                                                          # before 70
    runs[("C", 0.016, 1)] = runs[("C", 0.032, 1)]
    pa = {"scalars": {"analysis": {"alarm_step": {"A@0.032/s1": None, "C@0.032/s1": None}}}}
    partial = {"complete": False, "runs_stored": 2, "runs_planned": 5}
    assert dg.fresh_facts(partial) is None and dg.fresh_lead_table(partial) is None
    assert dg.kit_found(partial, pa).endswith("fired in 0 of 2 runs: the error is large but changes sign. A second "
                                              "rule, on the error's size, waits for its test on fresh seeds.")
    an = P.evaluate_scaled(runs)
    an_first = {"alarm_step": {k: None for k in an["alarm_step"]}}
    fresh = {"complete": True, "runs_stored": 5, "runs_planned": 5, "analysis": an, "first_rule": an_first}
    f = dg.fresh_facts(fresh)
    assert f["a_runs"] == 2 and f["a_alarmed"] == 2 and (f["earliest"], f["at_earliest"]) == (70, 2)
    assert f["missed"] == [(0.016, 1, 50.0, 70)] and f["lead"] == (430.0, 430.0)
    text = dg.kit_found(fresh, pa)
    assert "fired in 0 of 7 runs" in text and "before 1 of 2 [" in text and "is undecided (the hit rate" in text
    assert "fires in all 2 runs of the paper's arithmetic: it recognises" in text   # no A run without divergence
    para = dg.scaled_rule_text({"scaled_development": an}, fresh)
    assert "The divergence it missed: at 0.016, seed 1, A left C at step 50, the alarm came at step 70." in para
    table = dg.fresh_lead_table(fresh).splitlines()
    assert table[0].startswith("| learning rate | seed | A leaves C at step | second rule's alarm at step |")
    assert table[2] == "| 0.016 | 1 | 50 | 70 | never |" and table[3] == "| 0.032 | 1 | 500 | 70 | never |"
    # a rule that never fires in the paper's arithmetic is said so, with no step
    quiet = {**fresh, "analysis": {**an, "alarm_step": {k: None for k in an["alarm_step"]}}}
    assert "It fires in none of the 2 runs of the paper's arithmetic." in dg.kit_found(quiet, pa)
    assert "It fires in none of the 2 runs of the paper's arithmetic; the logit alert" in dg.scaled_rule_text(
        {"scaled_development": an}, quiet)
    saw = dg.kit_saw(fresh, pa)
    assert saw.startswith("The precision alarm's first rule, on whether the gradient error keeps one direction, "
                          "fired in none of its 7 runs:")
    assert ("fired in 2 of the 2 fresh runs of the paper's arithmetic by step 70, whether or not the run went on to "
            "fail, in 0 of 2 runs of FP32 attention and in 1 of 1 of production arithmetic. On this proxy") in saw
    assert dg.kit_saw(quiet, pa).endswith("cannot warn of a precision failure before it happens.")
    assert dg.kit_saw(partial, pa).endswith("cannot warn of a precision failure before it happens.")
