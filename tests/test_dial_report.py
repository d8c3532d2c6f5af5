"""Chapter 1's dial section: where the grid stands and the interim description, from an assembled grid."""
import numpy as np
import pytest

from lpfail.book import dial_report as DR
from lpfail.book import dial_report as R
from lpfail.experiments import dial_training as D


def _grid(full_seeds: int, some_seed: bool):
    n_v, n_l, n_s = len(D.ARMS), len(D.LRS), len(D.SEEDS)
    j = list(D.LRS).index(8e-3)
    stored = np.zeros((n_v, n_l, n_s), bool)
    stored[:, j, :full_seeds] = True
    if some_seed:
        stored[:3, j, full_seeds] = True
    rng = np.random.default_rng(2)
    final = 1.5 + 0.01 * rng.standard_normal((n_v, n_l, n_s)) + 0.02 * np.arange(n_v)[:, None, None]
    res = {"small_variants": np.array(D.ARMS), "small_lrs": np.array(D.LRS), "small_seeds": np.array(D.SEEDS),
           "small_val_final": np.where(stored, final, np.nan), "small_val_init": np.full((n_v, n_l, n_s), 5.5),
           "small_stored": stored, "long_stored": np.zeros((5, 5), bool), "runs_stored": int(stored.sum()),
           "runs_planned": 265, "complete": False,
           "parts": [{"device": "NVIDIA H100 80GB HBM3", "created": "2026-12-06T09:40:09"}]}
    res["analysis"] = D.analyse(res)
    return res


def test_seed_runs_groups_consecutive_seeds():
    assert DR.seed_runs([20]) == "seed 20"
    assert DR.seed_runs([20, 21]) == "seeds 20, 21"
    assert DR.seed_runs([20, 21, 22, 25]) == "seeds 20–22 and 25"
    assert DR.seed_runs([]) == "no seed"


def test_status_says_per_rate_which_seeds_have_every_arm_and_that_nothing_is_judged():
    s = DR.status(_grid(4, True))
    assert "every arm on seeds 20–23 and some arms on seed 24 at 0.008" in s
    assert "none at 0.004" in s and "0 of the 25 long runs" in s and "NVIDIA H100 80GB HBM3, 2026-12-06" in s
    assert "Nothing is judged" in s


def test_interim_gives_the_rows_in_numbers_at_rates_with_every_seed_and_counts_the_others():
    assert DR.interim(_grid(1, False)) == "No rate has two seeds of these arms yet."
    text = DR.interim(_grid(4, False))
    assert "no rate has all its seeds yet; 0.008 has 4 seeds so far (the figure)" in text and "no call" in text
    res = _grid(10, False)
    text = DR.interim(res)
    for name in ("A_3 − C", "A_3 − SR_3", "A_3 − SR_4"):
        r = res["analysis"]["interim"][f"{name} @lr=0.008"]
        assert f"{name} {r['estimate']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]" in text
    assert "at 0.008 on all 10 seeds" in text and "0.004" not in text


def test_interim_pairs_are_the_paired_differences_of_the_two_arms():
    res = _grid(10, False)
    rows = res["analysis"]["interim"]
    a3, sr3 = list(D.ARMS).index("A_3"), list(D.ARMS).index("SR_3")
    j = list(D.LRS).index(8e-3)
    d = res["small_val_final"][a3, j] - res["small_val_final"][sr3, j]
    assert rows["A_3 − SR_3 @lr=0.008"]["estimate"] == __import__("pytest").approx(d.mean())
    assert {f"{a} − {b} @lr=0.008" for a, b in D.PAIRS} <= set(rows)


def test_cards_name_every_card_and_the_days():
    res = _grid(2, False)
    res["parts"] = [{"device": "NVIDIA H100 80GB HBM3", "created": "2026-12-06T09:40:09"},
                    {"device": "NVIDIA H200", "created": "2026-12-07T10:00:00"}]
    assert DR.cards(res) == {"dial_card": "NVIDIA H100 80GB HBM3 and NVIDIA H200", "dial_when": "2026-12-06 – 2026-12-07"}
    assert DR.cards(None) == {"dial_card": "no card yet", "dial_when": "no run yet"}


def _full_short_grid():
    """Every 1,000-step run stored at both rates (A_3 clearly above the others), no long run."""
    n_v, n_l, n_s = len(D.ARMS), len(D.LRS), len(D.SEEDS)
    rng = np.random.default_rng(3)
    final = 1.5 + 0.01 * rng.standard_normal((n_v, n_l, n_s))
    final[list(D.ARMS).index("A_3")] += 0.2
    stored = np.ones((n_v, n_l, n_s), bool)
    res = {"small_variants": np.array(D.ARMS), "small_lrs": np.array(D.LRS), "small_seeds": np.array(D.SEEDS),
           "small_val_final": final, "small_val_init": np.full((n_v, n_l, n_s), 5.5), "small_stored": stored,
           "long_stored": np.zeros((5, 5), bool), "runs_stored": int(stored.sum()), "runs_planned": 265,
           "complete": False, "parts": [{"device": "NVIDIA H100 80GB HBM3", "created": "2026-12-07T09:40:09"}]}
    res["analysis"] = D.analyse(res)
    return res


def test_status_gives_the_calls_once_the_short_runs_are_stored_and_counts_the_long_runs():
    s = DR.status(_full_short_grid())
    assert s.startswith("All 240 short runs are stored. The rule's verdict on bias, not noise (H8): partly. "
                        "Supported: A_3 − SR_3 at 4e-3 = +")
    assert "the dose (H7)" in s and "Nothing is judged" not in s and DR.interim(_full_short_grid()) == ""
    assert s.endswith("H11 (descriptive) is not described yet: none of its 25 long runs is stored.")


def test_the_first_pages_clause_says_pending_then_the_verdict_word():
    from lpfail.book import front

    partial = _grid(4, False)
    assert "is pending: 48 of 265 runs" in front.dial_words(lambda name: partial)
    full = _full_short_grid()
    words = front.dial_words(lambda name: full)
    assert words.startswith("At equal precision, biased rounding trained worse than unbiased only at 3 "
                            "fraction bits") and "(the precision dial: *partly*" in words


def test_the_finding_follows_h8s_words():
    """C0-dial's words (every row, some, none, the other way) each give their own finding; nothing judged, none."""
    import copy

    g = _full_short_grid()
    assert "only with V and the output path cut to 3 fraction bits (16 times" in DR.finding(g)
    flips = {"supported": "at every K the dial tests", "inconclusive": "at no K or rate",
             "refuted": "unbiased rounding trains worse than the paper's rounding to nearest"}
    for word, text in flips.items():
        h = copy.deepcopy(g)
        for r in h["analysis"]["calls"]["H8"].values():
            r["verdict"] = word
        assert text in DR.finding(h)
        assert DR.found_markdown(h).startswith(f"**Is the rounding bias what harms? "
                                               f"{DR.dial_verdict([word])[0].upper()}")
    assert DR.finding(_grid(4, False)) is None
    assert DR.found_markdown(_grid(4, False)).startswith("**Our runs do not show the paper's account")


def test_rows_table_holds_every_judged_row_and_escapes_cells():
    g = _full_short_grid()
    table = DR.rows_table(g).splitlines()
    assert len(table) == 2 + sum(len(f) for f in g["analysis"]["calls"].values())
    assert table[2].startswith("| the dose (H7) | the slope at 4e-3 | +")
    assert DR.rows_table(_grid(4, False)).startswith("Nothing is judged yet")
    assert DR.rate(8e-3) == "8e-3" and DR.rate(1.6e-2) == "1.6e-2" and DR.rate(0.1) == "0.1"


def test_power_table_has_every_family_with_its_detectable_gap_and_null_rate():
    table = DR.power_table(n_sims=40, dial=_full_short_grid()).splitlines()
    assert len(table) == 3 + len(D.SIDES)
    assert all(row.count("|") == 5 for row in table) and "% of 40" in table[-1]
    assert table[2].startswith("| the healthy margin ('no power' above it) | — | 0.15")  # 10 % of C's 1.5 nats
    assert table[4].startswith("| bias, not noise (H8) | 12 | ")


def _long_result(arms=("C", "A_3", "SR_3"), seeds=5):
    """dial_training's long-horizon arrays for `seeds` stored seeds of `arms` (the others not stored), through
    `long_arrays` from run summaries: A_3 ends 0.1 above C with a positive tied-row δ error, SR_3 with none."""
    c = D.DialConfig()
    layers, heads = c.small[0], c.small[1]
    have = {}
    for s in c.long_seeds[:seeds]:
        for arm in arms:
            up = {"C": 0.0, "A_3": 0.1, "SR_3": 0.02}[arm]
            sign = {"C": 0.0, "A_3": 1.0, "SR_3": -0.5 if s % 2 else 0.5}[arm]
            steps = list(range(0, c.long_steps + 1, c.long_diag_every))
            have[D.long_key(arm, s, c)] = {
                "status": "completed", "val_step": steps,
                "val_loss": [5.0 - 3 * k / len(steps) + up for k in range(len(steps))],
                "diag_step": steps, "wq": [[[1.0 + k] * heads] * layers for k in range(len(steps))],
                "max_logit": [[10.0] * layers] * len(steps), "tied_frac": [[0.1] * layers] * len(steps),
                "delta_tied": [[[sign * 1e-6] * heads] * layers] * len(steps),
                "delta_all": [[[sign * 2e-6] * heads] * layers] * len(steps),
                "delta_n_tied": [[[40] * heads] * layers] * len(steps)}
    out = D.long_arrays(c, have)
    out["analysis"] = {"H11": D.long_summary(out)}
    return out


def test_the_long_horizon_is_drawn_and_said_only_once_runs_are_stored():
    empty = _long_result(seeds=0)
    assert R.long_figure(empty) is None and R.long_words(empty) == ""
    res = _long_result()
    fig = R.long_figure(res)
    assert fig is not None and len(fig.axes) == 4
    titles = [ax.get_title() for ax in fig.axes[:3]]
    assert titles == ["held-out loss (nats)", "largest ‖W_Q‖ of a head", "running Σ of the δ error on tied rows"]
    # the running sum: A_3's grows to 11 checkpoints × 16 heads·layers × 1e-6
    a3 = [ln for ln in fig.axes[2].lines if ln.get_linewidth() == 1.8 and ln.get_color() == R.plots.color("A_3")]
    assert a3 and a3[0].get_ydata()[-1] == pytest.approx(11 * 16 * 1e-6)
    labels = [t.get_text() for t in fig.axes[3].get_legend().get_texts()]
    assert labels == ["C (5 seeds)", "A_3 (5 seeds)", "SR_3 (5 seeds)"]
    words = R.long_words(res)
    assert words.startswith("Over 10,000 steps at 8e-3 (H11, descriptive): C: 5 seeds, 0 failed; A_3: 5 seeds, "
                            "+0.100 [+0.100, +0.100] against C, 0 failed, tied-row δ error positive over the run in "
                            "5 of 5; SR_3: 5 seeds, +0.020")
    assert "positive over the run in 3 of 5." in words
    # with two of five seeds stored, no difference is given (H11 compares all five), the rest is said
    part = R.long_words(_long_result(seeds=2))
    assert "against C" not in part and "A_3: 2 seeds, 0 failed, tied-row δ error positive over the run in 2 of 2" in part
    R.plt.close("all")


def test_the_long_horizon_says_how_many_runs_it_has_and_where_its_diagnostics_stop():
    assert R.long_facts(_long_result(seeds=0))["long_status"].startswith("None of the ")
    assert R.long_facts(None) == {"long_status": "No long run is stored yet.", "long_last_diag": "none",
                                  "long_card": "no card yet", "long_when": "no run yet"}
    part = R.long_facts(_long_result(seeds=2))
    n, planned = 2 * 3, 5 * 5  # the fixture stores three of the five arms
    assert part["long_status"].startswith(f"{n} of the {planned} long runs are stored so far")
    assert "H11 is described when every arm has its five" in part["long_status"]
    full = _long_result()
    full["long_stored"] = np.ones_like(full["long_stored"])
    assert R.long_facts(full)["long_status"] == f"All {planned} long runs are stored."
    res = _long_result()
    res["long_wq"][..., -1] = np.nan  # no record at the last step: the diagnostics stop one interval before
    step = int(R._long(res)[2][-2])
    assert R.long_facts(res)["long_last_diag"] == f"{step:,}"


def test_the_chapter_says_h11_only_once_every_long_run_is_stored():
    assert R.long_brief(_long_result(seeds=2)) == "" and R.long_brief(None) == ""
    res = _long_result()
    res["long_stored"] = np.ones_like(res["long_stored"])  # every arm and seed, as the chapter needs
    for i in (1, 4):  # A and SR_4: C's values (the fixture trains C, A_3 and SR_3 only)
        for k in ("long_val_final", "long_val_init", "long_failed"):
            res[k][i] = res[k][0]
    res["analysis"] = {"H11": R.D.long_summary(res)}
    text = R.long_brief(res)
    assert text.startswith("Over 10,000 steps at 8e-3 (H11, 5 seeds, descriptive), held-out loss minus C's: "
                           "A_3 +0.10 [+0.10, +0.10]; SR_3 +0.02 [+0.02, +0.02]; SR_4 +0.00 [+0.00, +0.00].")
    # SR_3 ends 0.02 above C in every seed: the unbiased arm is harmed too
    assert text.endswith("A_3 is harmed, and so is SR_3, which carries no bias: precision costs too, not the bias "
                         "alone.")
    res["long_val_final"][3] = res["long_val_final"][0]
    res["analysis"] = {"H11": R.D.long_summary(res)}
    assert R.long_brief(res).endswith("the pattern the paper's account predicts.")
    res["long_val_final"][2] = res["long_val_final"][0]
    res["analysis"] = {"H11": R.D.long_summary(res)}
    assert R.long_brief(res).endswith("the amplified regime does not appear here.")


def test_the_long_horizon_names_the_cards_and_days_of_the_parts_that_hold_long_runs():
    res = _long_result(seeds=2)
    res["parts"] = [{"file": "a", "device": "NVIDIA H200", "created": "2026-12-06T01:00", "long": 0},
                    {"file": "b", "device": "NVIDIA H100 80GB HBM3", "created": "2026-12-07T09:34", "long": 12}]
    f = R.long_facts(res)
    assert (f["long_card"], f["long_when"]) == ("NVIDIA H100 80GB HBM3", "2026-12-07")
    for p in res["parts"]:
        del p["long"]  # an older result does not say which parts hold long runs: every part's
    f = R.long_facts(res)
    assert (f["long_card"], f["long_when"]) == ("NVIDIA H100 80GB HBM3 and NVIDIA H200", "2026-12-06 – 2026-12-07")
