"""The precision dial's training grid: its pre-registration, its runs, the rule's error rates and power."""
import dataclasses
import tempfile

import numpy as np
import pytest

from lpfail.experiments import confirmation as CF
from lpfail.experiments import dial
from lpfail.experiments import dial_training as D
from lpfail.experiments import lr_sweep as L
from lpfail.sweep.variants import VARIANTS
from lpfail.precision import PAPER_BF16
from lpfail.sweep.grid import get, lookup, names


def test_the_rule_is_registered_before_the_runs_and_names_what_was_seen():
    assert D.PREREGISTERED_ON == "2026-12-04"
    assert set(D.SIDES) | {"H11"} == set(D.HYPOTHESES) and set(D.FAMILIES) == set(D.SIDES)
    assert "20–29" in D.RULE and "Holm" in D.RULE and "no power" in D.RULE
    assert "dial_calibration" in D.SEEN and "No run of seeds 20–29" in D.SEEN


def test_the_seeds_are_fresh_no_other_grid_has_trained_them():
    used = {s for n in names() if n != "dial_training" for r in get(n).runs() for s in [r.seed]}
    assert not set(D.SEEDS) & used
    lk = lookup(get("dial_training"))
    # every stored run of the dial was trained after its rule was fixed (the parts' dates), none before
    assert all(str(p["created"])[:10] > D.PREREGISTERED_ON for p in lk.parts) and (lk.parts or not lk.have)


def test_a7_is_a_and_the_runs_of_a_and_c_are_ordinary_lr_sweep_runs():
    assert dial.arm_a(7) == PAPER_BF16 and str(dial.arm_a(7)) == str(PAPER_BF16)
    c, conf = D.DialConfig(), CF.ConfirmationConfig()
    for v in ("A", "C"):
        p = L.Point("small", v, 8e-3, 20)
        assert L.grid_run(c, p).hash == L.grid_run(conf, p).hash
    assert VARIANTS["A_3"].attention == f"reference({dial.arm_a(3)})"
    assert VARIANTS["SR_3"].attention == f"reference({dial.arm_sr(3)})"


def test_the_grid_has_every_arm_at_both_rates_and_the_long_horizon():
    runs = get("dial_training").runs()
    short = [r for r in runs if r.key.startswith("small/")]
    long = [r for r in runs if r.key.startswith("long/")]
    assert len(short) == len(D.ARMS) * len(D.LRS) * len(D.SEEDS) == 240
    assert len(long) == 25 and all(r.config.max_steps == 10_000 and r.config.diag_every == 1000 for r in long)
    assert all(r.config.delta_every == 1000 for r in long)  # the mechanism's signature with the diagnostics
    assert short[0].key == "small/C/lr0.008/s20"  # 8e-3 first, whole seeds together


@pytest.mark.parametrize("arm", ["A_3", "SR_3", "D_3", "R_3"])
def test_each_arm_trains_a_few_steps_on_the_cpu_and_sr_repeats_bit_for_bit(arm):
    """Each new arm's attention trains end to end on the CPU (a one-layer model, 3 steps, the held-out loss on
    2 windows at the start and the end): finite losses; SR_3 trained twice gives the same losses bit for bit (its
    stochastic rounding is a function of the run, not of the process's random state)."""
    from lpfail.train import train

    base = L.train_config(D.DialConfig(), L.Point("small", arm, 8e-3, 20), "")
    losses = []
    for _ in range(2 if arm == "SR_3" else 1):
        tc = dataclasses.replace(base, n_layer=1, n_embd=64, n_head=1, block_size=32, batch_size=2, max_steps=3,
                                 warmup=1, val_every=0, val_rows=2, diag_every=0, cuda_graph=False, device="cpu",
                                 checkpoint_every=0, out_dir=tempfile.mkdtemp())
        res = train(tc)
        losses.append(np.array([r["loss"] for r in res.log], dtype=np.float64))
    assert np.isfinite(losses[0]).all()
    assert all(np.array_equal(losses[0], x) for x in losses)


def test_the_slope_is_the_least_squares_slope_on_the_dose():
    x = np.array([2.0 ** (7 - k) for k in D.KS_A])
    diffs = np.stack([0.01 * x + 0.3, 0.0 * x]).T  # two seeds: slope 0.01 and 0
    assert np.allclose(D.slope(diffs), [0.01, 0.0])


def test_null_grids_judged_by_the_rules_code_call_at_most_alpha():
    sd = {4e-3: 0.0088, 8e-3: 0.0127}  # the confirmation grid's A and C noise at these rates
    sim = D.simulate(sd, n_sims=400, seed=1)
    se = np.sqrt(0.05 * 0.95 / 400)
    for fam, rate in sim["family_rate"].items():
        assert rate <= 0.05 + 3 * se, (fam, rate)


def test_a_gap_of_the_detectable_size_is_called_about_four_times_in_five():
    sd = {4e-3: 0.0088, 8e-3: 0.0127}
    power = {r["family"]: r for r in D.power_rows(sd)}
    gap = power["gaps"]["detectable_nats"]["0.008"]
    sim = D.simulate(sd, n_sims=300, seed=2, gaps={"A_3": gap})
    assert 0.65 <= sim["row_rate"]["gaps:A_3 − C @lr=0.008"] <= 0.95


def test_analyse_judges_every_family_on_an_assembled_grid():
    rng = np.random.default_rng(0)
    n_v, n_l, n_s = len(D.ARMS), len(D.LRS), len(D.SEEDS)
    res = {"small_variants": np.array(D.ARMS), "small_lrs": np.array(D.LRS), "small_seeds": np.array(D.SEEDS),
           "small_val_final": 1.5 + 0.01 * rng.standard_normal((n_v, n_l, n_s)),
           "small_val_init": np.full((n_v, n_l, n_s), 5.5), "small_stored": np.ones((n_v, n_l, n_s), bool)}
    a = D.analyse(res)
    assert set(a["calls"]) == set(D.SIDES)
    assert len(a["calls"]["H8"]) >= 12 and len(a["calls"]["H10"]) >= 4


def _partial_grid(seeds_at_8e3: int):
    """An assembled grid with every arm at 8e-3 for the first `seeds_at_8e3` seeds, nothing at 4e-3; each arm i's
    loss is C's + 0.01·i exactly (no noise)."""
    n_v, n_l, n_s = len(D.ARMS), len(D.LRS), len(D.SEEDS)
    rng = np.random.default_rng(1)
    base = 1.5 + 0.01 * rng.standard_normal(n_s)
    final = base[None, None, :] + 0.01 * np.arange(n_v)[:, None, None] + np.zeros((n_v, n_l, n_s))
    stored = np.zeros((n_v, n_l, n_s), bool)
    stored[:, list(D.LRS).index(8e-3), :seeds_at_8e3] = True
    return {"small_variants": np.array(D.ARMS), "small_lrs": np.array(D.LRS), "small_seeds": np.array(D.SEEDS),
            "small_val_final": np.where(stored, final, np.nan), "small_val_init": np.full((n_v, n_l, n_s), 5.5),
            "small_stored": stored}


def test_an_incomplete_grid_is_described_per_rate_and_never_judged():
    a = D.analyse(_partial_grid(4))
    assert "calls" not in a  # no family is judged before every arm has its ten seeds at both rates
    rows = a["interim"]
    assert set(rows) == ({f"{v} − C @lr=0.008" for v in D.ARMS if v != "C"}
                         | {f"{a} − {b} @lr=0.008" for a, b in D.PAIRS})  # nothing stored at 4e-3
    for i, v in enumerate(D.ARMS[1:], start=1):
        r = rows[f"{v} − C @lr=0.008"]
        assert r["n"] == 4 and r["estimate"] == pytest.approx(0.01 * i)
        assert r["ci"][0] <= r["estimate"] <= r["ci"][1]
    one = D.analyse(_partial_grid(1))["interim"]["A_3 − C @lr=0.008"]
    assert one["n"] == 1 and "ci" not in one  # one seed: an estimate, no interval


def test_the_dial_figure_draws_each_stored_arm_with_its_interval_and_says_the_seed_count():
    import matplotlib
    matplotlib.use("Agg")
    from lpfail.book import dial_report

    res = _partial_grid(4)
    res["analysis"] = D.analyse(res)
    fig = dial_report.dial_figure(res)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["lr 0.008 (4 seeds)", "lr 0.004 (no paired seeds yet)"]
    drawn = {tuple(np.round(line.get_ydata(), 6)) for line in fig.axes[0].lines if len(line.get_ydata()) > 1}
    assert (0.01, 0.02, 0.03, 0.04) in drawn  # A_K at K = 7, 5, 4, 3: arms 1–4 of the grid, C + 0.01·i
    matplotlib.pyplot.close(fig)


def test_the_long_runs_delta_signature_reaches_the_result_per_layer():
    """A long run's δ signature (per diagnostic step, layer and head in its summary) lands in ``long_delta_*``
    (variant, seed, diagnostic step, layer), summed over heads; steps it was not taken at stay NaN."""
    c = D.DialConfig()
    layers, heads = c.small[0], c.small[1]
    tied = [[[0.5 * (h + 1) for h in range(heads)] for _ in range(layers)], [[-1.0] * heads for _ in range(layers)]]
    r = {"status": "completed", "val_step": [0, c.long_steps], "val_loss": [5.0, 2.0], "diag_step": [0, 2000],
         "delta_tied": tied, "delta_all": tied, "delta_n_tied": [[[3] * heads] * layers] * 2}
    out = D.long_arrays(c, {D.long_key("A_3", 20, c): r})
    i = list(c.long_variants).index("A_3")
    got = out["long_delta_tied"][i, 0]
    assert got.shape == (c.long_steps // c.long_diag_every + 1, layers)
    np.testing.assert_array_equal(got[0], [sum(0.5 * (h + 1) for h in range(heads))] * layers)
    np.testing.assert_array_equal(got[2], [-heads] * layers)
    assert np.isnan(got[1]).all() and np.isnan(out["long_delta_tied"][i, 1]).all()
    np.testing.assert_array_equal(out["long_delta_n_tied"][i, 0, 2], [3 * heads] * layers)
