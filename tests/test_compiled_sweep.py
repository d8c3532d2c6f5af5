"""compiled_sweep (issue 16, item 4): PAPER_BF16_COMPILED on lr_sweep's grid; the rule and the run reuse."""
import dataclasses

import numpy as np
import pytest

from lpfail import precision as P
from lpfail.experiments import compiled_sweep as CS
from lpfail import sweep
from lpfail.experiments import lr_sweep as L
from lpfail.sweep.variants import VARIANTS


def fake(gap=0.08, comp=0.08, twin=None):
    """Arrays shaped like compiled_sweep's: A, C, A_comp × 6 lrs × 3 seeds of held-out losses (init 5.5); the
    extra loss of A and A_comp grows at the two highest rates. twin: the variant whose noise A_comp shares (its
    difference to that variant is then exactly the planted one)."""
    rng = np.random.default_rng(0)
    variants = ["A", "C", "A_comp"]
    base = np.array([1.6, 1.5, 1.45, 1.42, 1.45, 1.6])
    extra = {"A": gap, "C": 0.0, "A_comp": comp}
    noise = {v: rng.normal(0, 0.002, (6, 3)) for v in variants}
    if twin:
        noise["A_comp"] = noise[twin]
    final = np.stack([base[:, None] + np.array([0, 0, 0, 0, 1, 3])[:, None] * extra[v] / 4 + noise[v]
                      for v in variants])
    return {"small_variants": np.array(variants), "lrs": np.array(L.LRSweepConfig().lrs),
            "small_val_final": final, "small_val_init": np.full((3, 6, 3), 5.5),
            "small_status": np.zeros((3, 6, 3), dtype=np.int8)}


@pytest.mark.parametrize("comp, twin, symptom, eager", [
    (0.08, "A", "supported", "yes"),      # the compiled arithmetic fails exactly like the eager one
    (0.0, "C", "inconclusive", "lower"),  # it does not fail: it is C
    (0.3, None, "supported", "higher"),   # it fails worse
    (-0.2, None, "refuted", "lower"),     # it trains better than FP32
])
def test_rule(comp, twin, symptom, eager):
    a = CS.judge_compiled(fake(0.08, comp, twin))
    assert a["symptom"]["verdict"] == symptom and a["same_as_eager"]["verdict"] == eager
    assert a["preregistered_on"] == "2026-12-01" and a["nonfinite"] == {"A": 0, "C": 0, "A_comp": 0}
    lo, hi = a["symptom"]["ci"]
    assert lo <= a["symptom"]["point"] <= hi


def test_rule_refuses_a_result_without_its_variants():
    r = fake()
    r["small_variants"] = np.array(["A", "C", "D"])
    with pytest.raises(ValueError, match="A_comp"):
        CS.judge_compiled(r)


def test_reuses_lr_sweep_runs_and_spells_the_preset_out():
    """A and C are lr_sweep's runs (same TrainConfig hash: never run twice). A_comp's spec holds the preset's
    knobs, so correcting the preset changes the runs' hash and a run of the old definition is not reused."""
    c, s = CS.CompiledSweepConfig(), L.LRSweepConfig()
    for v in ("A", "C"):
        p = L.Point("small", v, 3.2e-2, 2)
        assert sweep.run_hash(L.train_config(c, p, "")) == sweep.run_hash(L.train_config(s, p, ""))
    assert {p.variant for p in L.plan(c)} == {"A", "C", "A_comp"} and {p.size for p in L.plan(c)} == {"small"}
    assert len(L.plan(c)) == 3 * 6 * 3
    from lpfail.train import parse_spec
    assert parse_spec(VARIANTS["A_comp"].attention).policy == P.PAPER_BF16_COMPILED
    tc = L.train_config(c, L.Point("small", "A_comp", 3.2e-2, 0), "")
    changed = dataclasses.replace(tc, attention=f"reference({dataclasses.replace(P.PAPER_BF16_COMPILED, l_div='bf16')})")
    assert sweep.run_hash(changed) != sweep.run_hash(tc)


def test_status_names_the_missing_variant(capsys):
    assert CS.compiled_sweep_grid.main(["status"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compiled_sweep: ") and "runs stored" in out


def test_collect_refuses_a_missing_grid(capsys):
    """Until A_comp's runs exist, collect stores nothing and says what to run."""
    if sweep.lookup(CS.compiled_sweep_grid()).complete:
        pytest.skip("A_comp's runs are stored: nothing missing to refuse")
    assert CS.compiled_sweep_grid.main(["collect"]) == 1
    assert "compiled_sweep drive" in capsys.readouterr().err


def test_chapter_section_pending_then_table(monkeypatch):
    from lpfail import results
    from lpfail.book import lr_sweep_report as LR

    def missing(name):
        raise results.ResultMissing(name)

    monkeypatch.setattr(results, "load", missing)
    if sweep.lookup(CS.compiled_sweep_grid()).complete:
        pytest.skip("A_comp's runs are stored")
    text = LR.compiled_section()
    assert text.startswith("**Pending.** 18 of the 54 runs") and "A_comp" in text and CS.PREREGISTERED_ON in text

    class Stored(dict):
        provenance = "computed on a test"

    a = CS.judge_compiled(fake(0.08, 0.3))
    monkeypatch.setattr(results, "load", lambda name: Stored(compiled_analysis=a))
    text = LR.compiled_section()
    assert "**supported**" in text and "**higher**" in text and "computed on a test" in text
    assert f"{a['S']['A_comp']['S']:+.3f}" in text
