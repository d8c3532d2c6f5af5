"""lpfail.book.costs: the appendix's costs and estimates, on the stored results and on fabricated ones."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from lpfail.book import costs as C
from lpfail import results


# -- formatting ---------------------------------------------------------------------------------------------
def test_fmt_seconds_and_duration():
    assert C.fmt_seconds(102.588) == "102.6 s"
    assert C.fmt_seconds(1501.36) == "1,501 s"
    assert C.fmt_duration(1.74) == "≈ 1.7 h"
    assert C.fmt_duration(0.5864) == "≈ 35 min"
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            C.fmt_seconds(bad)
        with pytest.raises(ValueError):
            C.fmt_duration(bad)


def test_provenance_short_and_table():
    meta = {"device": "NVIDIA H100", "created": "2025-01-02T03:04:05+00:00", "versions": {"torch": "2.7.1+cu126"}}
    assert C.provenance_short(meta) == "NVIDIA H100, torch 2.7, 2025-01-02"
    assert C.short_device("NVIDIA H100") == "H100"
    assert C.markdown_table(("a", "b"), [(1, 2)]) == "| a | b |\n|---|---|\n| 1 | 2 |"


def test_html_table_and_provenance_html():
    t = C.html_table(("gap", "bias"), [(4, "+0.05 ± 0.2"), ("<b>", 1)], caption="by gap")
    assert t.startswith("<table") and t.endswith("</table>")
    assert t.count("<tr>") == 3 and "<caption" in t and "by gap" in t
    assert "&lt;b&gt;" in t and "<b>" not in t  # cells are escaped

    class R:
        provenance = "x: computed on cpu on 2030-01-01 (git <abc>, 1.0 s, config 0)"

    h = C.provenance_html(R(), R())
    assert h.count("<div>") == 2 and "&lt;abc&gt;" in h and "overflow-wrap:anywhere" in h
    # part files (chapter 6's cures): the same wrapping box (a long line overflowed the column on 2026-12-01)
    p = C.parts_html([{"file": "part-20301231T000000-1.json", "device": "NVIDIA <X>", "created": "2030-12-31",
                       "git": "0123456789abcdef"}])
    assert "overflow-wrap:anywhere" in p and "git 0123456789ab<" in p and "&lt;X&gt;" in p and p.count("<div>") == 1


# -- cost rows ----------------------------------------------------------------------------------------------
def test_cost_row_fabricated():
    single = {"name": "train_speed", "wall_s": 12.34, "device": "NVIDIA X1", "created": "2030-05-06T00:00:00",
              "config": {}}
    row = C.cost_row("train_speed", single)
    assert (row["wall_s"], row["gpus"], row["key"]) == (12.34, 1, "wall_s")
    assert C.gpu_cell(row) == "1 × X1" and C.wall_cell(row) == "12.3 s (`results/train_speed.json`)"
    multi = {**single, "config": {"nproc": 4}}
    assert C.cost_row("train_ddp", multi)["gpus"] == 4
    # a search collected from logs: the driver's wall time, not the collection's
    driven = {**single, "wall_s": 0.5, "runs_wall_s": 2000.0, "runs_gpus": ["0", "1", "2"]}
    row = C.cost_row("symptom", driven)
    assert (row["wall_s"], row["gpus"], row["key"]) == (2000.0, 3, "runs_wall_s")
    with pytest.raises(ValueError):  # an unknown experiment that does not say how many GPUs it used
        C.cost_row("mystery", single)
    with pytest.raises(ValueError):
        C.wall_seconds({"name": "x"})


def test_cost_rows_stored():
    rows = {n: C.cost_row(n, results.load(n).meta) for n in ("bench_kernels", "train_ddp", "train_speed", "symptom")}
    for n, row in rows.items():
        assert row["wall_s"] > 0 and row["device"]
    assert rows["bench_kernels"]["wall_s"] == results.load("bench_kernels").meta["wall_s"]
    assert rows["train_ddp"]["gpus"] == results.load("train_ddp").meta["config"]["nproc"]
    sym = results.load("symptom").meta
    assert rows["symptom"]["wall_s"] == sym["runs_wall_s"] and rows["symptom"]["gpus"] == len(sym["runs_gpus"])


def test_symptom_search_counts():
    def conf(over, nv, ns, steps=100):
        return SimpleNamespace(overrides=over, variants=["v"] * nv, seeds=list(range(ns)),
                               config={"max_steps": steps})

    s = C.symptom_search([conf("", 5, 3), conf("lr=1", 3, 3), conf("impl=reference variants=A", 1, 3)])
    assert s == {"runs": 27, "default": 15, "around": 12, "repeats": 3, "steps": 100}
    with pytest.raises(ValueError):
        C.symptom_search([conf("", 1, 1, 100), conf("lr=1", 1, 1, 200)])
    with pytest.raises(ValueError):
        C.symptom_search([])


def test_symptom_search_stored():
    from lpfail.book import symptom_report as R

    confs = R.configurations(results.load("symptom"), results.load("symptom_sweep"))
    s = C.symptom_search(confs)
    assert s["runs"] == s["default"] + s["around"] and s["repeats"] < s["around"]


def test_peak_parallel():
    log = "\n".join(["sweep: start a on GPU 0", "sweep: start b on GPU 1", "sweep: a done (rc 0) at step 9",
                     "sweep: start c on GPU 0", "sweep: start d on GPU 0", "sweep: b failed (rc 2) at step 3",
                     "check kernel A: trusted"])
    assert C.peak_parallel(log) == 3
    with pytest.raises(ValueError):
        C.peak_parallel("nothing here")
    stored = (results.REPO_ROOT / "results/symptom_gpu/drive.log").read_text()
    assert C.peak_parallel(stored) >= 1


# -- train_ddp / train_speed --------------------------------------------------------------------------------
def _fake_ddp():
    return {"loss_abs_diff": np.array([0.0, 0.1, 0.3, 0.2]), "noise_abs_diff": np.array([0.0, 0.05, 0.02, 0.01]),
            "deterministic_1gpu": True, "loss_1gpu": np.array([3.0, 2.0, 1.5, 1.25]),
            "loss_multi": np.array([3.0, 2.1, 1.8, 1.45]),
            "bench_attention": np.array(["sdpa", "reference(PAPER_BF16)", "triton(PAPER_BF16)", "broken"]),
            "bench_tokens_per_s": np.array([3600.0, 1800.0, 2400.0, np.nan]),
            "bench_step_ms": np.array([1.0, 2.0, 1.5, np.nan])}


def test_ddp_checks_fabricated():
    c = C.ddp_checks(_fake_ddp())
    assert (c["diff_step0"], c["diff_max"], c["diff_argmax"], c["noise_argmax"]) == (0.0, 0.3, 2, 1)
    assert (c["final_1gpu"], c["final_multi"], c["steps"]) == (1.25, 1.45, 4)
    s = C.ddp_setting({"n_layer": 2, "n_embd": 64, "block_size": 128, "batch_size": 32, "micro_batch": 4,
                       "nproc": 4, "lr": "0.01", "steps": 7})
    assert (s["tokens_per_step"], s["accum_1gpu"], s["accum_multi"], s["lr"]) == (4096, 8, 2, 0.01)


def test_ddp_checks_stored():
    res = results.load("train_ddp")
    c = C.ddp_checks(res)
    assert c["diff_max"] == pytest.approx(res["max_abs_diff"]) and c["noise_max"] == pytest.approx(
        res["noise_max_abs_diff"])
    assert c["diff_first_10"] == pytest.approx(res["max_abs_diff_first_10"])
    rates = C.bench_rates(res)
    assert set(C.FULL_SETTING_ATTENTIONS) <= set(rates)
    assert [r["attention"] for r in C.throughput_rows(res)] == [str(a) for a in res["bench_attention"]]


def test_bench_rates_drop_failures():
    rates = C.bench_rates(_fake_ddp())
    assert rates == {"sdpa": 3600.0, "reference(PAPER_BF16)": 1800.0, "triton(PAPER_BF16)": 2400.0}
    bad = {**_fake_ddp(), "bench_tokens_per_s": np.array([1.0])}
    with pytest.raises(ValueError):
        C.bench_rates(bad)


def test_speed_rows():
    fake = {"variants": np.array(["deterministic,torch", "nondeterministic,written"]),
            "tokens_per_s": np.array([100.0, 200.0]), "step_ms": np.array([5.0, 2.5]),
            "identical": np.array([True, False])}
    rows = C.speed_rows(fake)
    assert C.speed_of(rows, "deterministic,torch") == {"variant": "deterministic,torch", "deterministic": True,
                                                        "loss": "torch", "tokens_per_s": 100.0, "step_ms": 5.0,
                                                        "identical": True}
    assert C.speed_of(rows, "nondeterministic,written")["identical"] is False
    with pytest.raises(KeyError):
        C.speed_of(rows, "deterministic,written")
    once = {k: v for k, v in fake.items() if k != "identical"}  # a result that ran each variant once
    assert C.speed_rows(once)[0]["identical"] is None
    stored = C.speed_rows(results.load("train_speed"))
    assert len(stored) == len(results.load("train_speed")["variants"])
    assert all(r["tokens_per_s"] > 0 for r in stored)
    assert C.relative_difference(90.0, 100.0) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        C.relative_difference(0.0, 1.0)


# -- the full setting ---------------------------------------------------------------------------------------
def test_full_setting_fabricated():
    rates = {"sdpa": 3600.0, "reference(PAPER_BF16)": 1800.0, "triton(PAPER_BF16)": 2400.0}
    est = C.full_setting(rates, gpus=4, window_steps=10, tokens_to_failure=3600.0 * 3600,
                         schedule={"steps": 100, "tokens_per_step": 3600})
    sdpa = C.row_of(est, "sdpa")
    assert sdpa["gpu_hours"] == pytest.approx(1.0) and sdpa["wall_hours"] == pytest.approx(0.25)
    assert sdpa["window_gpu_min"] == pytest.approx(10 * 3600 / 3600 / 60)
    assert C.row_of(est, "reference(PAPER_BF16)")["gpu_hours"] == pytest.approx(2.0)
    assert sdpa["schedule_gpu_hours"] == pytest.approx(100 * 3600 / 3600 / 3600)
    assert est["failure_fraction"] == pytest.approx(3600.0 * 3600 / (100 * 3600))
    assert [r["attention"] for r in est["rows"]] == list(C.FULL_SETTING_ATTENTIONS)
    with pytest.raises(KeyError):
        C.full_setting({"sdpa": 1.0})
    with pytest.raises(ValueError):
        C.gpu_hours(1.0, 0.0)


def test_full_setting_stored():
    sched = C.paper_schedule()
    assert sched == {"steps": 600_000, "tokens_per_step": 524_288}  # the paper's schedule (qiu2026why)
    rates = C.bench_rates(results.load("train_ddp"))
    est = C.full_setting(rates)
    for r in est["rows"]:
        assert r["gpu_hours"] == pytest.approx(3.5e9 / rates[r["attention"]] / 3600)
        assert r["wall_hours"] == pytest.approx(r["gpu_hours"] / 8)
    assert est["total_tokens"] == 600_000 * 524_288
    assert math.isclose(est["failure_fraction"], 3.5e9 / (600_000 * 524_288))


def test_checkpoint_gb():
    gb = C.checkpoint_gb("gpt2-small")
    assert 1.3 < gb < 1.7  # ≈ 124 M parameters × 12 bytes
    assert C.checkpoint_gb("gpt2-medium") > gb
    with pytest.raises(ValueError):  # vocabulary from the tokenizer
        C.checkpoint_gb("probe")


def test_stored_at_commit():
    e = C.stored_at_commit("train_speed", "97c1916")  # the first train_speed result
    assert e["meta"]["name"] == "train_speed" and len(e["tokens_per_s"]) == len(e["variants"])
    with pytest.raises(RuntimeError):
        C.stored_at_commit("train_speed", "0" * 40)


def test_bench_table_reports_the_alternating_fix_cost():
    """kernels.bench.table prints the paired (alternating) fix-cost ratios when the result has them."""
    from lpfail.kernels.bench import table
    tf = np.full((1, 2, 2, 3), 100.0)
    res = {"methods": np.array(["triton", "triton_fix"]), "modes": np.array(["fwd", "bwd", "fwd_bwd"]),
           "head_dims": np.array([64]), "seq_lens": np.array([1024, 2048]), "tflops": tf, "ms": 1.0 / tf,
           "matmul_tflops": 700.0, "pairs": np.array(["triton/triton_fix"]), "pair_modes": np.array(["fwd", "fwd_bwd"]),
           "pair_ratio": np.array([[[[1.05, 1.02]], [[1.10, 0.99]]]])}
    text = table(res)
    assert "fix cost (triton_fix vs triton), alternating timings: fwd +5.0% / +10.0%, fwd_bwd +2.0% / -1.0%" in text


# -- the quick profiles' table (the appendix) -----------------------------------------------------------------
def test_quick_table_reads_the_measured_times_and_names_what_is_missing(tmp_path):
    import json

    rows = C.quick_rows()  # the stored records
    by = {r["grid"]: r for r in rows}
    for name in ("fix_training", "cures", "confirmation"):
        rec = json.loads((results.results_dir() / f"quick_{name}.json").read_text())
        assert by[name]["measured"] and by[name]["wall_s"] == rec["wall_s"]
    table = C.quick_table(rows)
    for r in rows:
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| `{r['grid']}` |"))
        if r["measured"]:
            assert C.fmt_seconds(r["wall_s"]) in line and "not yet measured" not in line
        elif r["headline"] is not None:
            assert "not yet measured on an H200" in line
    (tmp_path / "quick_symptom.json").write_text(json.dumps(
        {"wall_s": 12.0, "device": "NVIDIA H200", "created": "2026-12-02T01:00:00+00:00", "inside": False,
         "value": 0.1}))  # a record without the bit-identity count
    row = next(r for r in C.quick_rows(tmp_path) if r["grid"] == "symptom")
    line = C.quick_table([row]).splitlines()[-1]
    assert "12.0 s on an H200, 2026-12-02; outside" in line and "not recorded" in line and "None" not in line


def test_the_rerun_check_is_tabled_per_grid_with_its_cards_and_said_in_a_sentence():
    from lpfail.results import Result

    def row(grid, word, card="NVIDIA H100 80GB HBM3", here="NVIDIA H100 80GB HBM3"):
        base = {"grid": grid, "key": "k", "run_hash": "h", "card": card, "rerun_card": here}
        return base | {"bit-identical": {"equal": True, "same_so_far": True, "state": "done"},
                       "different": {"equal": False, "same_so_far": False, "state": "done"},
                       "cut off": {"equal": False, "same_so_far": True, "state": "stopped"},
                       "failed": {"equal": False, "state": "failed"},
                       "pending": {"equal": False, "state": "pending", "rerun_card": None}}[word]

    rows = [row("dial_training", "bit-identical"), row("dial_training", "different"),
            row("symptom", "pending", card="NVIDIA H200"), row("confirmation", "cut off"),
            row("confirmation", "bit-identical", card="", here=None)]
    res = Result({"rows": rows}, {"device": "NVIDIA H200"})
    table = C.rerun_rows(res)
    assert table[0] == ("`dial_training`", 2, 1, 1, 0, 0, 0, "H100 80GB HBM3", "H100 80GB HBM3")
    assert table[1] == ("`symptom`", 1, 0, 0, 0, 0, 1, "H200", "—")  # pending: not rerun anywhere yet
    assert table[2][-2:] == ("H100 80GB HBM3", "H100 80GB HBM3, H200")  # an older row: the check's own device
    words = C.rerun_words(res)
    assert words.startswith("Of the 5 runs the check covers, 2 came out bit-identical and 1 different; 1 was cut off")
    assert words.endswith("1 waits for a machine with the card it was trained on (H200).")
    assert "| grid | runs |" in C.rerun_table(res)
