"""fix_sweep (the experiment on a tiny grid), its figure, the chapter-5 verdict rules on fabricated results, and
the pre-registered Fix-b analysis of fix_training on fabricated runs."""
import matplotlib

matplotlib.use("Agg")
import numpy as np
import pytest

from lpfail.book import verdict as V
from lpfail.book import fix_report as R5
from lpfail.book.fix_sweep_report import outcome_map, plot_bias_vs_rm, plot_safe_region
from lpfail.experiments import fix_sweep as FS
from lpfail.experiments import fix_training as FT


@pytest.fixture(scope="module")
def tiny():
    cfg = FS.FixSweepConfig(n_rows=24, betas=(2.0, 8.0), r_ms=(-1000.0, 16.0, 100.0))
    return FS.fix_sweep_experiment(cfg)


def test_tiny_sweep_shows_each_failure_mode(tiny):
    j = {r: i for i, r in enumerate(tiny["r_ms"])}
    assert tiny["alg3_nonfinite"][0, j[-1000.0]] == 1 and tiny["alg3_l_zero"][0, j[-1000.0]] == 1   # 0/0
    assert tiny["official_silenced"][0, j[100.0]] == 1                                              # clamp
    assert tiny["nofix_pbar_one"][0, j[16.0]] == 1 and tiny["alg3_pbar_one"][0, j[16.0]] == 0
    assert (tiny["robust_nonfinite"] == 0).all() and (tiny["robust_silenced"] == 0).all()
    assert tiny["robust_nonfinite_points"] == 0 and tiny["alg3_nonfinite_points"] >= 2
    m = outcome_map(tiny, "alg3")
    assert m[0, j[-1000.0]] == 3 and outcome_map(tiny, "official")[0, j[100.0]] == 2
    plot_safe_region(tiny)
    plot_bias_vs_rm(tiny)


def test_config_is_checked():
    with pytest.raises(ValueError):
        FS.FixSweepConfig(betas=(1.0,))
    with pytest.raises(ValueError):
        FS.FixSweepConfig(r_ms=(2.0, 1.0))


def fake_sweep(alg3_bias=1e-5, robust_bias=1e-5, robust_nonfinite=0, alg3_nonfinite_far=1):
    betas, r_ms = np.array([2.0, 8.0]), np.array([-1000.0, 16.0, 64.0, 1000.0])
    shape = (2, 4)
    r = {"betas": betas, "r_ms": r_ms}
    for name in FS.POLICIES:
        for stat in FS.STATS:
            r[f"{name}_{stat}"] = np.zeros(shape)
        r[f"{name}_bias_ci"] = np.full(shape, 2e-5)
    r["nofix_bias"] = np.full(shape, -1.4e-3)
    r["alg3_bias"] = np.full(shape, alg3_bias)
    r["alg3_nonfinite"][:, [0, 3]] = alg3_nonfinite_far
    r["official_bias"] = np.full(shape, 1e-5)
    r["official_silenced"][:, 3] = 1
    r["robust_bias"] = np.full(shape, robust_bias)
    r["robust_nonfinite"][:, 3] = robust_nonfinite
    r.update(FS.summary(r))
    return r


@pytest.mark.parametrize("kw, expected", [
    (dict(), V.REPRODUCED),
    (dict(alg3_bias=-1.3e-3), V.NOT_REPRODUCED),
])
def test_fix_beta_rule(kw, expected):
    assert R5.judge_fix_beta(fake_sweep(**kw)).verdict == expected


@pytest.mark.parametrize("kw, expected", [
    (dict(), V.REPRODUCED),
    (dict(robust_nonfinite=1), V.NOT_REPRODUCED),
    (dict(robust_bias=-1.3e-3), V.PARTLY),
])
def test_robust_fix_rule(kw, expected):
    v = R5.judge_robust_fix(fake_sweep(**kw))
    assert v.verdict == expected, v.evidence


def fake_training(gap=0.08, fix_s=None, nonfinite_r=0):
    """Arrays shaped like fix_training's: 5 variants × 6 lrs × 3 seeds of held-out losses (init 5.5)."""
    rng = np.random.default_rng(0)
    fix_s = fix_s or {"B": 0.065, "Bp": 0.0, "R": 0.0}
    variants = ["A", "C", "B", "Bp", "R"]
    lrs = np.array([1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2])
    base = np.array([1.6, 1.5, 1.45, 1.42, 1.45, 1.6])
    extra = {"A": gap, "C": 0.0, **fix_s}
    final = np.stack([base[:, None] + np.array([0, 0, 0, 0, 1, 3])[:, None] * extra[v] / 4
                      + rng.normal(0, 0.002, (6, 3)) for v in variants])
    status = np.zeros((5, 6, 3), dtype=np.int8)
    status[4, 5, :nonfinite_r] = 1
    return {"small_variants": np.array(variants), "lrs": lrs, "small_val_final": final,
            "small_val_init": np.full((5, 6, 3), 5.5), "small_status": status}


@pytest.mark.parametrize("kw, fix_b, r_word", [
    (dict(), "refuted", "supported"),                                    # B closes under half; R all of it
    (dict(fix_s={"B": 0.0, "Bp": 0.0, "R": 0.08}), "supported", "refuted"),
    (dict(gap=0.0), "no gap to close", "no gap to close"),
])
def test_fix_training_rule(kw, fix_b, r_word):
    a = FT.judge_fixes(fake_training(**kw))
    assert a["fix_b"] == fix_b and a["fixes"]["R"]["closes_half"]["verdict"] == r_word
    v = R5.judge_fix_training_sweep(a)
    assert v.verdict == V.SWEEP_WORDS[fix_b]


def test_fix_training_reports_nonfinite_runs_and_pending():
    a = FT.judge_fixes(fake_training(nonfinite_r=2))
    assert a["fixes"]["R"]["finite"][5]["nonfinite"] == 2
    assert R5.judge_fix_training_sweep(None).verdict == V.NOT_TESTED


def test_fix_training_reuses_lr_sweep_runs():
    """A, C and B of fix_training are lr_sweep's runs: same TrainConfig hash, so they are never run twice."""
    from lpfail.experiments import lr_sweep as L
    from lpfail.sweep import run_hash
    c, s = FT.FixTrainingConfig(), L.LRSweepConfig()
    for v in ("A", "C", "B"):
        p = L.Point("small", v, 1.6e-2, 1)
        assert run_hash(L.train_config(c, p, "")) == run_hash(L.train_config(s, p, ""))
    assert {p.variant for p in L.plan(c)} == {"A", "C", "B", "Bp", "R"} and {p.size for p in L.plan(c)} == {"small"}


def test_chapter5_verdicts_from_loaders():
    from lpfail.results import ResultMissing
    sweep = fake_sweep()

    def load(name):
        if name == "fix_sweep":
            return sweep
        raise ResultMissing(f"{name} missing")

    rows = {r.claim: r for r in V.verdicts(load, stored=lambda name: name == "fix_sweep")}
    assert {"Fix-β", "Robust", "Fix-b"} <= set(rows)
    assert rows["Fix-β"].verdict in V.VERDICTS and rows["Robust"].verdict in V.VERDICTS
    assert rows["Fix-b"].verdict == V.NOT_TESTED and "pending" in rows["Fix-b"].evidence


def _with_runs(d, nonfinite_bp=()):
    """fake_training plus what the chapter's per-lr report reads: stored flags and non-finite steps; B′ turned
    non-finite (init loss) at the lr indices ``nonfinite_bp``."""
    d = dict(d)
    d["small_stored"] = np.ones((5, 6, 3), bool)
    d["small_nonfinite_step"] = np.full((5, 6, 3), np.nan)
    d["small_val_final"] = d["small_val_final"].copy()
    d["small_val_final"][:, :4] = d["small_val_final"][1, :4]   # the four lowest lrs: every variant = C
    for j in nonfinite_bp:
        d["small_status"][3, j] = 1
        d["small_nonfinite_step"][3, j] = [30, 40, 50]
        d["small_val_final"][3, j] = np.nan
    return d


def test_fix_training_per_lr_classes():
    from lpfail.book import fix_training_report as R

    # A − C gap only at the two highest lrs; B closes half of it, R none, B′ non-finite at the last two lrs
    d = _with_runs(fake_training(gap=0.4, fix_s={"B": 0.2, "Bp": 0.0, "R": 0.4}), nonfinite_bp=(4, 5))
    rows = R.per_lr(d)
    assert [r["gap"] for r in rows] == [False] * 4 + [True] * 2
    assert [r["fixes"]["Bp"]["class"] for r in rows] == ["no gap"] * 4 + ["non-finite"] * 2
    assert rows[5]["fixes"]["Bp"]["steps"] == [30, 40, 50] and rows[5]["fixes"]["Bp"]["nonfinite"] == 3
    assert rows[5]["fixes"]["B"]["class"] == "partly" and rows[5]["fixes"]["R"]["class"] == "no help"
    w = R.where(d)
    assert w["none_helps"] == "none" and w["gap_lrs"] == "0.016, 0.032"
    assert w["Bp"] == "non-finite at lr 0.016, 0.032" and "no help at lr 0.016, 0.032" in w["R"]
    d2 = _with_runs(fake_training(gap=0.4, fix_s={"B": 0.0, "Bp": 0.4, "R": 0.4}))
    assert R.per_lr(d2)[5]["fixes"]["B"]["class"] == "closed"
    assert R.where(d2)["none_helps"] == "none"
    d3 = _with_runs(fake_training(gap=0.4, fix_s={"B": 0.4, "Bp": 0.4, "R": 0.4}))
    assert R.where(d3)["none_helps"] == "0.016, 0.032"
    assert "B (official fix)" in R.per_lr_table(d)


def test_fix_training_report_refuses_a_partial_store():
    from lpfail.book import fix_training_report as R
    from lpfail.sweep import SweepIncomplete

    d = _with_runs(fake_training())
    d["small_stored"][4, 0, 0] = False
    with pytest.raises(SweepIncomplete):
        R.per_lr(d)


def test_fix_training_part_lines(tmp_path):
    from lpfail.book import fix_training_report as R

    assert R.part_lines(tmp_path) == []                       # no part files: nothing to list
    lines = R.part_lines()                                    # the committed parts: B′ and R ran in one part
    assert any("Bp × 18" in line and "R × 18" in line for line in lines), lines


def _fake_cost(fwd_pct: float, fwd_bwd_pct: float):
    """A robust_cost result (arrays only) whose every shape costs the given per cents, in both modes."""
    from lpfail.kernels.bench import RobustCostConfig

    cfg = RobustCostConfig()
    ratio = np.empty((len(cfg.head_dims), len(cfg.seq_lens), len(cfg.pairs), len(cfg.modes)))
    ratio[..., 0], ratio[..., 1] = 1 + fwd_pct / 100, 1 + fwd_bwd_pct / 100
    return {"head_dims": np.array(cfg.head_dims), "seq_lens": np.array(cfg.seq_lens),
            "pairs": np.array(["/".join(p) for p in cfg.pairs]), "modes": np.array(cfg.modes), "pair_ratio": ratio}


def test_robust_verdict_reports_its_cost_without_depending_on_it():
    ok, slow = R5.judge_robust_fix(fake_sweep(), _fake_cost(5.0, 2.0)), R5.judge_robust_fix(fake_sweep(), _fake_cost(20.0, 4.0))
    assert ok.verdict == slow.verdict == V.REPRODUCED
    assert ok.note == "cost targets met" and "missed" not in ok.evidence
    assert slow.note == "cost targets missed (4 of 4)" and "+20.0 to +20.0 % (target ≤ 8 %: missed)" in slow.evidence
    mixed = R5.judge_robust_fix(fake_sweep(), _fake_cost(5.0, 4.0))
    assert mixed.note == "cost targets missed (2 of 4)"
    assert R5.judge_robust_fix(fake_sweep()).note == ""                    # no cost stored: nothing said


def test_fix_training_verdict_table_gives_no_share_for_a_fix_with_nonfinite_runs():
    """A non-finite run counts at its initial loss in S: its 'share of the gap closed' would read thousands of
    per cent (B′ on 2026-12-01: −2620 %). The table says why there is no share instead."""
    from lpfail.book import fix_training_report as R

    d = _with_runs(fake_training(gap=0.4, fix_s={"B": 0.2, "Bp": 0.0, "R": 0.4}), nonfinite_bp=(4, 5))
    d["fix_analysis"] = FT.judge_fixes(d)
    html = R.verdict_table(d)
    rows = {r.split("</td>")[0].rsplit(">", 1)[-1]: r for r in html.split("<tr>")[2:]}
    bp = next(v for k, v in rows.items() if k.startswith("B′"))
    assert "— (6 runs non-finite)" in bp and "%" not in bp.split("</td>")[-2]
    b = next(v for k, v in rows.items() if k.startswith("B (official"))
    assert b.split("</td>")[-2].endswith(" %")
