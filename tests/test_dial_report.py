"""Chapter 1's dial section: where the grid stands and the interim description, from an assembled grid."""
import numpy as np

from lpfail.book import dial_report as DR
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


def test_interim_gives_each_arm_minus_c_with_its_interval_only_from_two_seeds():
    assert DR.interim(_grid(1, False)) == "No rate has two seeds of these arms yet."
    res = _grid(4, False)
    text = DR.interim(res)
    r = res["analysis"]["interim"]["A_3 − C @lr=0.008"]
    assert f"A_3 {r['estimate']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]" in text
    assert "at 0.008 on 4 seeds" in text and "0.004" not in text and "no call" in text


def test_cards_name_every_card_and_the_days():
    res = _grid(2, False)
    res["parts"] = [{"device": "NVIDIA H100 80GB HBM3", "created": "2026-12-06T09:40:09"},
                    {"device": "NVIDIA H200", "created": "2026-12-07T10:00:00"}]
    assert DR.cards(res) == {"dial_card": "NVIDIA H100 80GB HBM3 and NVIDIA H200", "dial_when": "2026-12-06 – 2026-12-07"}
    assert DR.cards(None) == {"dial_card": "no card yet", "dial_when": "no run yet"}
