"""lpfail.book.symptom_report on fabricated runs (each measure can fail) and on the stored results (chapter 1)."""
import math

import matplotlib
import numpy as np
import pytest

from lpfail import results
from lpfail.book import plots
from lpfail.book import symptom_report as R
from lpfail.experiments import symptom as S

matplotlib.use("Agg")


def test_rise_is_the_criterions_statistic_without_its_threshold():
    loss = np.concatenate([np.linspace(4, 2, 300), np.full(300, 2.0), np.full(400, 2.4)])
    r = R.rise(loss, warmup=100)
    assert math.isclose(r, 1.2, rel_tol=1e-9)
    assert S.failed(loss, 100) == (False, None)  # 20 % < 25 %: the criterion says ok
    assert S.failed(np.concatenate([loss, np.full(400, 2.6)]), 100)[0]  # 30 %: fails
    assert math.isclose(R.rise(np.full(500, 3.0), 100), 1.0)
    assert math.isnan(R.rise(np.ones(150), 100))  # too short for one window after warm-up
    nan_late = np.concatenate([loss, [np.nan] * 50])
    assert math.isclose(R.rise(nan_late, 100), r)  # only the finite prefix counts


def test_late_grad_norm_and_sign_test():
    g = np.concatenate([np.full(1000, 0.3), np.full(500, 50.0), [np.nan]])
    assert R.late_grad_norm(g) == 50.0 and R.late_grad_norm(g, last=1000) == pytest.approx(25.15)
    assert math.isnan(R.late_grad_norm(np.full(3, np.nan)))
    assert R.sign_test_p(11, 11) == pytest.approx(2 / 2 ** 11)
    assert R.sign_test_p(5, 10) == 1.0 and math.isnan(R.sign_test_p(0, 0))


def fake_conf(label="cfg", overrides="", n=1200, a_rise=0.5, a_nan=None, c_steps=None):
    """Variants A, C, Bp over 2 seeds: A's loss steps up by `a_rise` at step 800; Bp turns NaN at 40."""
    V, S_, N = 3, 2, n
    loss = np.full((V, S_, N), np.nan, dtype=np.float32)
    gn = np.full((V, S_, N), np.nan, dtype=np.float32)
    base = np.linspace(4, 2.5, N).astype(np.float32)
    for j in range(S_):
        loss[1, j] = base
        gn[1, j] = 0.3
        loss[0, j] = base + np.where(np.arange(N) >= 800, a_rise, 0.0)
        gn[0, j] = np.where(np.arange(N) >= 800, 100.0, 0.3)
        loss[2, j, :40] = base[:40]
        gn[2, j, :40] = 0.3
    if c_steps is not None:
        loss[1, 1, c_steps:] = np.nan
    if a_nan is not None:
        loss[0, 0, a_nan:] = np.nan
    status = np.array([["completed"] * 2, ["completed", "completed" if c_steps is None else "incomplete"],
                       ["nonfinite"] * 2])
    failed = np.zeros((V, S_), bool)
    fail_step = np.full((V, S_), -1)
    for i in range(V):
        for j in range(S_):
            f, st = S.failed(loss[i, j][np.isfinite(loss[i, j])], 100)
            if status[i, j] == "nonfinite":
                f, st = True, 40
            failed[i, j], fail_step[i, j] = f, st if st is not None else -1
    arrays = dict(variants=np.array(["A", "C", "Bp"]), seeds=np.array([0, 1]), loss=loss, grad_norm=gn,
                  status=status, failed=failed, fail_step=fail_step,
                  final_loss=np.array([[S.final_loss(loss[i, j]) for j in range(2)] for i in range(3)]),
                  steps=np.isfinite(loss).sum(-1), tokens_per_s=np.full((V, S_), 1e5),
                  max_logit=np.ones((V, S_, 3, 4)), tied_frac=np.full((V, S_, 3, 4), 0.1),
                  attention=np.full((V, S_), "reference(X)"), notes=np.full((V, S_), ""))
    cfg = dict(warmup=100, batch_size=16, block_size=1024)
    return R.Conf(label, overrides, arrays, cfg)


def test_run_rows_tables_pairs_and_summary_on_fabricated_runs():
    big, small = fake_conf("big", a_rise=1.0), fake_conf("small", "lr=0.01", a_rise=0.5, c_steps=1100)
    rows = R.run_rows([big, small])
    a = R.select(rows, config="big", variant="A", seed=0)[0]
    assert a["failed"] and a["fail_step"] > 800 and a["fail_tokens"] == a["fail_step"] * 16384
    assert a["late_grad_norm"] == 100.0 and a["rise"] > 1.25
    sm = R.select(rows, config="small", variant="A", seed=0)[0]
    assert not sm["failed"] and 1.05 < sm["rise"] < 1.25  # rose, but below the threshold
    bp = R.select(rows, variant="Bp")[0]
    assert bp["status"] == "nonfinite" and bp["fail_step"] == 40
    t = R.outcome_markdown(rows, "small")
    assert "**NaN at step 40**" in t and "ok; final" in t and "(stopped at 1100 steps)" in t and "1 unfinished" in t
    pairs = R.paired([big, small])
    assert len(pairs) == 4 and all(p["diff"] > 0 for p in pairs)
    p_short = [p for p in pairs if p["config"] == "small" and p["seed"] == 1][0]
    assert p_short["step"] == 1099  # compared where both stopped, not at their own ends
    assert p_short["diff"] == pytest.approx(0.5, abs=1e-5)
    s = R.summary([big, small])
    assert s["fails"]["A"] == 2 and s["fails"]["C"] == 0 and s["bp_nan"] == 4 and s["pairs_a_worse"] == 4
    ev = R.evidence([big, small])
    assert ev["per_config"][0]["A"] == (2, 2) and ev["per_config"][1]["A"] == (0, 2)


def test_deterministic_repeat_detects_a_single_differing_step():
    a, b = fake_conf(), fake_conf(overrides="impl=reference variants=A")
    assert all(d["equal"] and d["steps"] == 1200 for d in R.deterministic_repeat(a, b))
    b.arrays["loss"][0, 1, 700] += 1e-6
    d = R.deterministic_repeat(a, b)
    assert d[0]["equal"] and not d[1]["equal"]


# -- the stored results ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stored():
    res, sweep = results.load("symptom"), results.load("symptom_sweep")
    return res, sweep, R.configurations(res, sweep)


def test_stored_results_and_the_chapters_numbers(stored):
    res, sweep, confs = stored
    assert confs[0].variants == ["A", "C", "Bp", "B", "D"] and len(confs) == 1 + len(sweep["points"])
    rows = R.run_rows(confs)
    assert all(r["status"] in ("completed", "nonfinite", "incomplete") for r in rows)
    s = R.summary(confs)
    assert s["runs"]["A"] == 12 and s["n_runs"] == 42  # the repeat of A is not counted twice
    # the chapter's claims, as measured: B′ NaN in every run, A above C in every paired comparison
    assert s["bp_nan"] == s["runs"]["Bp"] and s["pairs_a_worse"] == s["pairs"] >= 10
    repeat = [c for c in confs if "impl=" in c.overrides][0]
    assert all(d["equal"] and d["steps"] > 1800 for d in R.deterministic_repeat(confs[0], repeat))
    assert "| model | 4 layers × 256" in R.setting_table(confs[0], 9_375_052)
    assert "continuation trusted" in R.checks_table(res)


def test_figures_draw_from_the_stored_results(stored):
    import matplotlib.pyplot as plt
    _, _, confs = stored
    others = [c for c in confs[1:] if "impl=" not in c.overrides]
    for fig in (plots.symptom_loss_figure(confs[0]), plots.symptom_sweep_figure(others),
                plots.symptom_grad_norm_figure(confs[0]), plots.spectral_figure(confs[0]),
                plots.ties_loss_figure(confs[0]), plots.fix_rows_figure(results.load("fix_rows"))):
        assert fig.axes and any(ax.lines for ax in fig.axes)
        plt.close(fig)


def test_failures_text_follows_the_numbers():
    base = {"a_fail_steps": [], "runs": {"Bp": 3}, "bp_nan": 0, "bp_nan_first": None, "bp_nan_last": None}
    assert R.failures_text(base) == "No A run failed by the criterion. B′ — our fix without the clamp — stayed " \
                                    "finite in all 3 runs."
    one = dict(base, a_fail_steps=[("lr 0.02", 1, 1698, 27_820_032, 376.0)], bp_nan=3, bp_nan_first=27,
               bp_nan_last=104)
    t = R.failures_text(one)
    assert "The one failing A run" in t and "step 1,698" in t and "27.8 M" in t and "every one" in t
    two = dict(one, a_fail_steps=one["a_fail_steps"] * 2, bp_nan=2)
    t = R.failures_text(two)
    assert "The 2 failing A runs" in t and "2 of 3 runs," in t and "every one" not in t


def test_runs_twin_holds_every_configuration_and_seed(stored):
    import re

    from lpfail.book import widgets
    _, _, confs = stored
    h = widgets.runs_twin(confs[:2], dpi=30)._repr_html_()
    n = sum(len(c.seeds) for c in confs[:2])
    assert h.count("<option") == n and len(re.findall(r"data-case='\d+'", h)) == n
    assert h.count("data:image/png;base64,") == 3 * n and "data-lpfail-twin='runs_explorer'" in h  # 3 panels a run
