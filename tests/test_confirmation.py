"""The confirmation grid (issue 23): its runs reuse the stored seeds, its plan starts with what the verdicts need
most, and its pre-registered analysis on fabricated results calls what it should and nothing under the null."""
import numpy as np
import pytest

from lpfail import results, sweep
from lpfail.experiments import confirmation as CF
from lpfail.experiments import lr_sweep as L


def test_stored_seeds_are_reused_and_the_plan_order():
    c = CF.ConfirmationConfig()
    base = L.LRSweepConfig()
    for p in L.plan(base):  # every stored lr_sweep run is a run of this grid, by key and TrainConfig hash
        if p.size == "large" and p.variant not in c.large_variants:
            continue
        assert sweep.run_hash(L.train_config(c, p, "")) == sweep.run_hash(L.train_config(base, p, ""))
    pts = CF.plan(c)
    assert len(pts) == len({p.key for p in pts}) == 10 * 6 * 10 + 2 * 6 * 5 + 2 * 4 * 5  # 12 × 768 as amended
    first = pts[:2 * 6 * 10]
    assert {(p.size, p.variant) for p in first} == {("small", "A"), ("small", "C")}
    assert pts[-1].size == "gpt2" and pts[-1].variant == "C" and pts[-1].seed == 4
    small = [i for i, p in enumerate(pts) if p.size == "small"]
    assert small == list(range(len(small)))  # the smaller size's whole grid before any other size's run
    sizes = [p.size for p in pts]
    assert sizes.index("gpt2") > max(i for i, s in enumerate(sizes) if s == "large")  # then the larger size's
    tc = L.train_config(c, L.Point("gpt2", "A", 1e-3, 0), "")
    assert (tc.n_layer, tc.n_head, tc.n_embd, tc.block_size, tc.max_steps) == (12, 12, 768, 256, 1000)
    assert L.train_config(c, L.Point("small", CF.PLACEBO, 1e-3, 0), "").attention == "reference(FP32,block=128x64)"
    assert results.config_hash(c) != results.config_hash(base)  # lr_sweep's stored result stays fresh


def _fake(effect: float = 0.0, gpt2_gap_lr: float | None = None, seed: int = 0, noise: float = 0.01) -> dict:
    """An assembled result: C's curve a bowl, A = C + effect × a ramp rising at the high rates (+ paired noise),
    every other variant = C + noise; at 12 × 768 A's gap starts at ``gpt2_gap_lr``."""
    rng = np.random.default_rng(seed)
    c = CF.ConfirmationConfig()
    out = {}
    for size, (variants, lrs, seeds) in c.size_grid().items():
        if size != "gpt2":
            base, ramp = np.array([1.55, 1.42, 1.44, 1.55, 2.7, 2.9]), np.array([0, 0, 0, 0, 1.0, 1.0])
        else:  # C's bowl by rate (the amended grid keeps 5e-4 … 4e-3 of these)
            bowl = {2.5e-4: 1.6, 5e-4: 1.3, 1e-3: 1.25, 2e-3: 1.3, 4e-3: 1.6, 8e-3: 2.4}
            base = np.array([bowl[lr] for lr in lrs])
            ramp = (np.array(lrs) >= (gpt2_gap_lr if gpt2_gap_lr is not None else 4e-3)).astype(float)
        final = np.empty((len(variants), len(lrs), len(seeds)))
        shared = noise * rng.standard_normal((len(lrs), len(seeds)))  # the seed's own luck, shared by variants
        for i, v in enumerate(variants):
            final[i] = base[:, None] + shared + 0.3 * noise * rng.standard_normal((len(lrs), len(seeds)))
            if v in ("A", "A_sr", "B", "R"):
                final[i] += effect * ramp[:, None]
        out[f"{size}_variants"] = np.array(variants)
        out[f"{size}_val_final"], out[f"{size}_val_init"] = final, np.full(final.shape, 5.5)
        out[f"{size}_stored"] = np.ones(final.shape, bool)
        out[f"{size}_lrs"], out[f"{size}_seeds"] = np.array(lrs), np.array(seeds)
    return out


def test_null_data_calls_nothing():
    a = CF.analyse(_fake(0.0))
    assert a["claims"]["H1"]["verdict"] != "supported"
    assert all(a["claims"][h]["verdict"] == "no gap to close" for h in ("H2", "H3", "HD", "HB", "HR"))
    for size in ("small", "large", "gpt2"):
        assert a["sizes"][size]["lr_star"] is None
    assert a["H6"]["verdict"] == "inconclusive"
    assert a["placebo"]["n"] == 7 and a["placebo"]["rate_adjusted"] <= 1 / 7


def test_a_real_gap_is_called_and_the_cures_judged():
    a = CF.analyse(_fake(0.4, gpt2_gap_lr=1e-3))
    cl = a["claims"]
    assert cl["H1"]["verdict"] == "supported" and cl["H1"]["seeds_confirm"] == list(CF.CONFIRM)
    assert cl["H1"]["n"] == 10 and cl["H1"]["family_size"] == 6 and cl["H1"]["test"] == "t"
    assert cl["H2"]["verdict"] == "refuted"  # A_sr carries A's whole gap
    assert cl["H3"]["verdict"] == "supported" and cl["HD"]["verdict"] == "supported"
    small = a["sizes"]["small"]
    assert [small["cells"][f"lr={lr:g}"]["verdict"] for lr in (1.6e-2, 3.2e-2)] == ["supported"] * 2
    assert small["lr_star"] == pytest.approx(1.6e-2) and small["H5"] == "not distinguishable"
    assert small["healthy_lrs"] == pytest.approx([1e-3, 2e-3, 4e-3, 8e-3])  # within 10 % of 1.42
    assert a["sizes"]["gpt2"]["lr_star"] == pytest.approx(1e-3) and a["sizes"]["gpt2"]["H5"] == "distinguishable"
    assert a["H6"]["verdict"] == "supported"
    from lpfail.book import confirmation_report as CR  # the book's sentences from this very analysis
    h5 = CR.h5_text(a)
    assert "at 12 × 768 (called at 0.001 and 0.002)" in h5 and "*not distinguishable* at 4 × 256" in h5
    assert CR.h6_text(a).endswith("is 0.016 at 4 × 256, 0.016 at 8 × 512 and 0.001 at 12 × 768.")
    fx = a["fix_lr"]
    assert fx["B@lr=0.032"]["verdict"] == "refuted" and fx["B@lr=0.001"]["verdict"] == "no gap to close"


def test_h6_refuted_when_the_gap_opens_later_at_the_larger_model():
    per = {"small": {"lr_star": 1.6e-2}, "large": {"lr_star": 1.6e-2}, "gpt2": {"lr_star": None}}
    assert CF.h6(per)["verdict"] == "refuted"
    per["gpt2"]["lr_star"] = 4e-3
    assert CF.h6(per)["verdict"] == "supported"
    per["large"]["lr_star"] = None  # rises at the middle size
    assert CF.h6(per)["verdict"] == "inconclusive"
    assert CF.h6({"small": {"lr_star": None}})["verdict"].startswith("not measured")


def test_the_rule_is_dated_and_says_what_was_seen():
    assert CF.PREREGISTERED_ON == "2026-12-01" and "seeds 3–9" in CF.SEEN and "probes" in CF.SEEN
    assert set(CF.SIDES) <= set(CF.HYPOTHESES) and CF.TEST in CF.RULE.lower() or "t test" in CF.RULE
    assert set(CF.CONFIRM).isdisjoint(L.LRSweepConfig().seeds)  # the call never uses a seed seen before


def test_the_amendment_keeps_the_middle_rates_and_says_what_was_seen():
    c = CF.ConfirmationConfig()
    assert c.gpt2_lrs == CF.GPT2_LRS == CF.GPT2_LRS_REGISTERED[1:-1]  # the two ends dropped, by position
    assert c.gpt2_variants == ("A", "C") and CF.AMENDED_ON > CF.PREREGISTERED_ON
    assert "seed 0" in CF.AMENDMENT and "seeds 1–4" in CF.AMENDMENT and "budget" in CF.AMENDMENT
    gpt2 = [p for p in CF.plan(c) if p.size == "gpt2"]
    assert {p.lr for p in gpt2} == set(CF.GPT2_LRS) and [p.seed for p in gpt2[:8]] == [0] * 8
    from lpfail.book import verdict as V
    row = next(r for r in V.preregistration_record() if r[0] == "`confirmation`")
    assert "Amended 2026-12-02" in row[2] and CF.AMENDMENT in row[2]


def test_healthy_flags_skip_rates_without_runs():
    assert CF.healthy_flags([1.5, 1.42, 1.55, 1.6]) == [True, True, True, False]  # 1.6 > 1.1 × 1.42
    assert CF.healthy_flags([None, 1.30, 1.45]) == [False, True, False]          # no run yet: not healthy
