"""The rerun check (lpfail.sweep.rerun): which stored runs it reruns and how it compares them."""
import dataclasses

import numpy as np
import pytest

from lpfail.sweep import rerun
from lpfail.sweep.grid import Run, get, lookup, names


def _item(stop_at, curve=None, val=None):
    g = get("lr_sweep")
    run = g.runs()[0]
    stored = {"loss_curve": list(curve if curve is not None else np.linspace(5, 1, 100)),
              "gnorm_curve": list(np.linspace(2, 1, 100)), "val_loss": val or [5.0, 2.0, 1.5, 1.4, 1.3]}
    return rerun.Item("lr_sweep", run, stored, stop_at, 100)


def test_compare_counts_only_the_bins_a_stopped_rerun_completed():
    it = _item(300)
    cut = {"loss_curve": np.array(it.stored["loss_curve"][:31] + [np.nan] * 69),
           "gnorm_curve": np.array(it.stored["gnorm_curve"][:30] + [np.nan] * 70), "steps_logged": 306}
    row = rerun.compare(it, cut)
    assert row["units"] == row["done"] == 30 and row["equal"] and row["first_diff_step"] is None
    assert rerun.word(row) == "bit-identical"


def test_a_rerun_cut_off_before_its_stop_is_not_called_different():
    it = _item(300)
    cut = {"loss_curve": np.array(it.stored["loss_curve"][:10] + [np.nan] * 90),
           "gnorm_curve": np.array(it.stored["gnorm_curve"][:10] + [np.nan] * 90), "steps_logged": 104}
    row = rerun.compare(it, cut)
    assert row["done"] == 10 and row["same_so_far"] and not row["equal"] and rerun.word(row) == "cut off"


def test_compare_names_the_first_step_that_differs_by_one_ulp():
    it = _item(300)
    loss = np.array(it.stored["loss_curve"])
    loss[12] = np.nextafter(loss[12], np.inf)
    row = rerun.compare(it, {"loss_curve": loss, "gnorm_curve": np.array(it.stored["gnorm_curve"]),
                             "steps_logged": 1000})
    assert not row["equal"] and row["first_diff_step"] == 120 and rerun.word(row) == "different"


def test_a_store_that_keeps_every_step_is_compared_step_by_step():
    g = get("symptom")
    run = g.runs()[0]
    loss = [float(np.float32(x)) for x in np.linspace(5, 2, 2000)]
    stored = {"loss": loss, "grad_norm": [1.0] * 2000}
    it = rerun.Item("symptom", run, stored, 300, 100)
    row = rerun.compare(it, {"loss": np.array(loss[:301]), "grad_norm": np.ones(301), "steps_logged": 301})
    assert row["units"] == row["done"] == 300 and row["unit_steps"] == 1 and row["equal"]


def test_a_full_rerun_compares_the_held_out_losses_too():
    it = _item(None)
    same = {**{k: np.array(it.stored[k]) for k in ("loss_curve", "gnorm_curve")}, "steps_logged": 1000}
    assert rerun.compare(it, same, {"val_loss": list(it.stored["val_loss"])})["equal"]
    other = list(it.stored["val_loss"])
    other[-1] = 1.31
    row = rerun.compare(it, same, {"val_loss": other})
    assert not row["equal"] and not row["val_equal"]


def test_the_plan_covers_every_stored_variant_and_size_of_every_grid_once():
    items = rerun.plan(full=("small/D/lr0.016/s9",))
    keys = [(i.run.store.folder, i.run.key) for i in items]
    assert len(keys) == len(set(keys))
    covered = {(i.run.store.folder, i.run.group, i.run.config.n_layer) for i in items}
    for name in names():
        lk = lookup(get(name))
        for r in lk.runs:
            if r.id in lk.have and r.id not in lk.retired:  # a retired stream's run cannot be repeated
                assert (r.store.folder, r.group, r.config.n_layer) in covered, (name, r.key)
    full = [i for i in items if i.stop_at is None]
    assert [i.run.key for i in full] == ["small/D/lr0.016/s9"]
    assert all(i.stop_at == 300 or i.stop_at is None for i in items)
    assert all(isinstance(i.run, Run) for i in items)
    heads = [i for i in items if i.run.group == "heads_top"]
    assert heads and heads[0].uncaptured  # its part records a call without CUDA-graph capture


def test_a_run_is_checked_only_on_its_own_kind_of_card():
    assert rerun.same_card("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")
    assert not rerun.same_card("NVIDIA H200", "NVIDIA H100 80GB HBM3")
    assert rerun.same_card("", "NVIDIA H200")  # no card recorded: anywhere
    items = rerun.plan(grids=("dial_training", "substitution"))
    cards = {i.card for i in items}
    assert "NVIDIA H100 80GB HBM3" in cards and "NVIDIA H200" in cards  # the parts' devices, per run


def test_the_check_builds_up_across_cards_and_calls():
    from lpfail.experiments import rerun_check as RC

    a, b, c = (dataclasses.replace(_item(300), card=card) for card in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", ""))
    b = dataclasses.replace(b, run=get("lr_sweep").runs()[1])
    c = dataclasses.replace(c, run=get("lr_sweep").runs()[2])
    old = {"key": a.run.key, "run_hash": a.run.hash, "equal": True, "same_so_far": True, "state": "done"}
    cut = {"key": c.run.key, "run_hash": c.run.hash, "equal": False, "same_so_far": True, "state": "stopped"}
    done = RC.finished([old, cut])
    assert list(done) == [(a.run.key, a.run.hash)]  # a cut-off row is run again
    new = [{"key": c.run.key, "run_hash": c.run.hash, "equal": True, "same_so_far": True, "state": "done",
            "card": "", "rerun_card": "NVIDIA H200"}]
    rows = RC.merge([a, b, c], done, new, "NVIDIA H200")
    assert rows[0]["card"] == rows[0]["rerun_card"] == "NVIDIA H200" and rerun.word(rows[0]) == "bit-identical"
    assert rerun.word(rows[1]) == "pending" and rows[1]["card"] == "NVIDIA H100 80GB HBM3"
    assert rows[2] is new[0]
    out = RC.summary(rows)
    assert (out["n_runs"], out["n_equal"], out["all_equal"], out["n_pending"]) == (3, 2, False, 1)
    assert out["pending_cards"] == ["NVIDIA H100 80GB HBM3"]
    assert RC.finished(rows).keys() == {(a.run.key, a.run.hash), (c.run.key, c.run.hash)}


def test_a_short_lease_shortens_the_rerun_budget_through_the_environment_and_bad_values_are_refused(monkeypatch):
    from lpfail.experiments import rerun_check as RC

    cfg = RC.RerunCheckConfig()
    monkeypatch.delenv("LPFAIL_RERUN_BUDGET", raising=False)
    assert RC.call_budget(cfg) == cfg.budget_s
    monkeypatch.setenv("LPFAIL_RERUN_BUDGET", "150")
    assert RC.call_budget(cfg) == 150.0 and cfg.budget_s == RC.RerunCheckConfig().budget_s  # the config is untouched
    for bad in ("0", "-5", "soon", "nan"):
        monkeypatch.setenv("LPFAIL_RERUN_BUDGET", bad)
        with pytest.raises(ValueError, match="LPFAIL_RERUN_BUDGET"):
            RC.call_budget(cfg)


def test_a_lookup_reads_the_results_its_grid_is_built_from_in_the_folder_it_was_given(tmp_path, monkeypatch):
    # the rerun check on the GPU (2026-12-07) pointed $LPFAIL_RESULTS_DIR at an empty $OUT and looked the stored runs
    # up in the checkout's results/: substitution's heads rows, built from lr_sweep, read it from the empty folder
    from lpfail import results

    repo = results.REPO_ROOT / "results"
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path))
    with pytest.raises(results.ResultMissing):
        get("substitution").runs()  # outside a lookup the variable still decides
    lk = lookup(get("substitution"), repo)
    assert any(r.group.startswith("heads") for r in lk.runs) and lk.have
    assert results.results_dir() == tmp_path  # the folder is the lookup's only while it builds the runs
