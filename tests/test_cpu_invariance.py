"""The CPU experiments' headlines (`lpfail.results.Experiment.headline`), which tools/cpu_invariance.py compares
under two CPU settings in `make test`: every CPU experiment declares one, each reads its stored result into plain
values that agree with what the book prints, and the library's own numeric pins reproduce fix_rows' stored
thresholds with no numeric variable in the environment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lpfail import results

REPO = Path(__file__).resolve().parent.parent

CPU_EXPERIMENTS = sorted(name for name, exp in results.registry().items() if not exp.gpu)


def test_every_cpu_experiment_declares_a_headline():
    """A new CPU experiment cannot skip the two-settings check: tools/cpu_invariance.py compares only headlines."""
    assert CPU_EXPERIMENTS, "no CPU experiment registered"
    missing = [name for name in CPU_EXPERIMENTS if results.get(name).headline is None]
    assert not missing, f"CPU experiments without a headline= (tools/cpu_invariance.py cannot check them): {missing}"


@pytest.mark.parametrize("name", CPU_EXPERIMENTS)
def test_headline_reads_the_stored_result_into_plain_values(name):
    exp = results.get(name)
    head = exp.headline(results.load(name))
    assert isinstance(head, dict) and head, f"{name}: the headline must be a non-empty dict"
    for key, value in head.items():
        assert isinstance(key, str), f"{name}: headline key {key!r} is not a string"
        assert type(value) in (str, bool, int), f"{name}: headline[{key!r}] = {value!r} is not a str, bool or int"
    assert json.loads(json.dumps(head)) == head


@pytest.mark.parametrize("name", CPU_EXPERIMENTS)
def test_check_config_is_a_config_of_the_experiment(name):
    exp = results.get(name)
    cfg = exp.check_config()
    assert isinstance(cfg, exp.config)


def _agrees(name, facts) -> dict:
    """The headline of the stored `name`; every entry it shares with the chapter's `facts` reads the same."""
    head = results.get(name).headline(results.load(name))
    shared = {k: (v, facts[k]) for k, v in head.items() if k in facts}
    assert shared, f"{name}: no headline entry is among the chapter's facts"
    assert all(a == b for a, b in shared.values()), f"{name}: headline vs chapter: {shared}"
    return head


def test_headlines_print_what_the_book_prints():
    """On the stored results, each headline entry reads as the chapter's own formatting of the same number."""
    from lpfail.book import beyond_report, fix_report, gradient_report, rounding_report, training_claims, verdict
    from lpfail.experiments import fix_rows, prod_kernels, rounding

    assert (rounding.STRONG, rounding.REMOVED_RATIO) == (rounding_report.STRONG, rounding_report.REMOVED_RATIO)
    rr = results.load("rounding")
    head = _agrees("rounding", rounding_report.facts(rr))
    assert (head["fix_removes_acc_away"] and head["fix_removes_out_away"]) == (
        rounding_report.judge_fix_bias(rr).verdict == verdict.REPRODUCED)
    _agrees("fix_sweep", fix_report.sweep_facts(results.load("fix_sweep")))
    _agrees("gradient_error", gradient_report.facts(results.load("gradient_error"), reps=10))
    sr = results.load("sr_confound")
    text = training_claims.confound_text(sr)
    head = results.get("sr_confound").headline(sr)
    assert all(value in text for value in head.values()), (head, text)
    fr = results.load("fix_rows")
    th = fix_rows.thresholds(fr)
    assert results.get("fix_rows").headline(fr) == {
        "b_suppress_m": f"{th['b_suppress_m']:g}", "bp_nonfinite_m": f"{th['bp_nonfinite_m']:g}",
        "b_clamp_m_theory": f"{fr['b_clamp_m_theory']:.1f}"}
    pk = results.load("prod_kernels_cpu")
    head = results.get("prod_kernels_cpu").headline(pk)
    row = next(r for r in prod_kernels.summary(pk) if r["method"] == "sdpa_math")
    # lab 6's table: the closest of these four, bit for bit
    assert head["sdpa_math_closest"] == max(prod_kernels.CPU_CLOSEST,
                                            key=lambda o: beyond_report.match(pk, "sdpa_math", o))
    assert head["sdpa_math_side"] == ("FA2" if row["away"] + row["away_ci"] < 0 else "paper")


#: The numeric variables that `lpfail.numerics` pins (or perturbs): none of them is set in the subprocess below.
NUMERIC_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "LPFAIL_NUDGE")

_FIX_ROWS = """
import json
from lpfail import numerics, results
res = results.run("fix_rows", store=False)
print("RESULT " + json.dumps({"deviations": numerics.deviations(),
                              **{k: res[k] for k in ("b_suppress_m", "bp_nonfinite_m", "bp_inaccurate_m")}}))
"""


@pytest.mark.slow  # the whole fix_rows sweep: about 10 s of one core, more on a loaded machine
def test_the_librarys_own_pins_reproduce_fix_rows_stored_thresholds():
    """`python -m lpfail run fix_rows`'s computation, in a fresh process with no numeric variable set (not the
    Makefile's exports either), gives the stored thresholds exactly: the pins that lpfail sets on import are what
    reproduce the stored result. bp_inaccurate_m is included: it is the one that moves (90.5 → 86.5) where oneDNN
    may use native BF16 instructions, so it tells whether the pins took effect."""
    env = {k: v for k, v in os.environ.items() if k not in NUMERIC_VARS}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _FIX_ROWS], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert got.pop("deviations") == []
    stored = results.load("fix_rows")
    assert got == {k: stored[k] for k in ("b_suppress_m", "bp_nonfinite_m", "bp_inaccurate_m")}


def test_headlines_agree_but_for_one_unit_of_a_last_digit_and_no_more():
    import sys
    sys.path.insert(0, str(REPO / "tools"))
    from cpu_invariance import agreement

    assert agreement({"a": "7.1e-03"}, {"a": "7.1e-03"}) == "same"
    assert agreement({"a": "7.1e-03", "b": "12 %"}, {"a": "7.0e-03", "b": "13 %"}) == "same but for a last digit"
    # what the check exists to catch: chapter 7's chaotic run of aeeda67 (3.280 against 3.283, 54.8 against 62.8)
    assert agreement({"loss": "3.280"}, {"loss": "3.283"}) == "DIFFERENT"
    assert agreement({"alert": "54.8"}, {"alert": "62.8"}) == "DIFFERENT"
    assert agreement({"a": "2.76 × 10⁻⁵"}, {"a": "3.02 × 10⁻⁵"}) == "DIFFERENT"      # over-precise
    assert agreement({"a": "0.017"}, {"a": "0.0171"}) == "DIFFERENT"                   # printed otherwise
    assert agreement({"a": "toward zero"}, {"a": "none"}) == "DIFFERENT"
    assert agreement({"a": "1"}, {"b": "1"}) == "DIFFERENT"
