"""prod_kernels: the mimics are the reference where they should be, the kernels see the generator's scores
exactly, unavailable back ends are reported, and the statistics agree with chapter 4's."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from lpfail import attention as attn
from lpfail.experiments import prod_kernels as pk
from lpfail.experiments.rounding import RowSpec, make_rows, row_errors
from lpfail.precision import FA2_BF16, PAPER_BF16

SPEC = RowSpec(n_keys=256, head_dim=16)


def test_mimic_without_exp2_and_fma_is_the_reference_fa2():
    s, v, _ = make_rows(SPEC, 50, 1)
    o, p = pk.mimic_forward(s, v, exp2=False, fma=False, block_k=64)
    ref = attn.forward_from_scores(s, v, FA2_BF16)
    assert torch.equal(o, ref.o)
    assert torch.equal(p, attn.exp_scores(s, ref.m, FA2_BF16).float())


def test_fma_moves_p_off_one_but_not_pbar():
    s, v, ties = make_rows(dataclasses.replace(SPEC, gap=20.0), 200, 2)
    _, p_sub = pk.mimic_forward(s, v, exp2=True, fma=False)
    _, p_fma = pk.mimic_forward(s, v, exp2=True, fma=True)
    t = ties[:, None, :]
    assert (p_sub[t] == 1.0).all()          # subtract after rounding S·c: exactly 1 at a tied maximum
    assert (p_fma[t] != 1.0).float().mean() > 0.5  # fused: the product's rounding error survives
    assert (p_fma[t].to(torch.bfloat16) == 1.0).all()  # …far below BF16's spacing, so P̄ is still 1


def test_round_first_differs_from_divide_first():
    s, v, _ = make_rows(SPEC, 50, 3)
    a, _ = pk.mimic_forward(s, v, round_first=False)
    b, _ = pk.mimic_forward(s, v, round_first=True)
    assert not torch.equal(a, b)
    with pytest.raises(ValueError, match="FP32 scores"):
        pk.mimic_forward(s.double(), v)


def test_kernel_inputs_reproduce_the_scores_exactly():
    s, v, _ = make_rows(SPEC, 8, 4)
    q, k, vv = pk._qkv(s, v, 4, "cpu")
    assert q.dtype == k.dtype == vv.dtype == torch.bfloat16
    prod = q.double() @ k.double().transpose(-1, -2)      # (rows, 1, 4, Tk)
    assert torch.equal(prod[:, 0, 0], s[:, 0].double())
    assert torch.equal(prod[:, 0, 3], s[:, 0].double())
    assert torch.equal(vv[:, 0].float(), v)


def test_math_back_end_on_cpu_is_close_to_truth():
    s, v, _ = make_rows(SPEC, 20, 5)
    o, p = pk.run_method("sdpa_math", s, v)
    assert p is None
    torch.testing.assert_close(o, pk.truth(s, v), atol=0.05, rtol=0.02)


def test_reference_stats_agree_with_chapter_4():
    s, v, ties = make_rows(SPEC, 300, 6)
    o, p = pk.run_method("ref_PAPER_BF16", s, v)
    st = pk.point_stats(o, pk.truth(s, v), p, ties)
    err = row_errors(s, v, PAPER_BF16)
    assert st["signed"][0] == pytest.approx(err.out_err.mean(axis=1).mean(), rel=1e-12)
    assert st["away"][0] == pytest.approx(err.away_from_zero("out_err").mean(), rel=1e-12)
    assert st["p_one"] == 1.0 and st["pbar_one"] == 1.0
    assert st["away"][0] > 0  # the paper's direction: |O| rounded up (chapter 4)


def test_measure_reports_unavailable_methods_and_shapes():
    cfg = pk.ProdKernelsConfig(n_rows=30, base=SPEC, gaps=(8.0, 16.0), ties=(1, 2), neg_fracs=(0.5,),
                               methods=("sdpa_cudnn", "triton_fma", "ref_PAPER_BF16", "mimic_exp2_fma"),
                               device="cpu", match_rows=20, n_query=2)
    out = pk.measure(cfg)
    if not torch.cuda.is_available():
        assert out["available_sdpa_cudnn"] is False and "Error" in out["unavailable_sdpa_cudnn"]
        assert out["available_triton_fma"] is False and out["unavailable_triton_fma"]  # no CUDA (or interpreter)
        assert out["methods_run"] == "ref_PAPER_BF16,mimic_exp2_fma"
    assert out["grid_ref_PAPER_BF16_signed"].shape == (2, 2)
    assert (out["grid_ref_PAPER_BF16_away_ci"] > 0).all()
    assert out["neg_mimic_exp2_fma_away"].shape == (1,)
    assert 0.0 <= out["match_ref_PAPER_BF16__mimic_exp2_fma"] <= 1.0
    # at gap 8 with one tie the maximum is a single key: P̄ = 1 there too (the generator plants it)
    assert out["grid_ref_PAPER_BF16_pbar_one"][0, 0] == 1.0
    rows = pk.summary({**out, "gaps": np.array([8.0, 16.0]), "ties": np.array([1.0, 2.0])})
    by = {r["method"]: r for r in rows}
    assert by["ref_PAPER_BF16"]["available"] and math.isfinite(by["ref_PAPER_BF16"]["away"])
    if not torch.cuda.is_available():
        assert not by["sdpa_cudnn"]["available"] and by["sdpa_cudnn"]["reason"]


def test_unknown_method():
    s, v, _ = make_rows(SPEC, 2, 0)
    with pytest.raises(ValueError, match="unknown method"):
        pk.run_method("sdpa_nope", s, v)


@pytest.mark.gpu
def test_every_cuda_method_runs():
    s, v, ties = make_rows(RowSpec(), 64, 0)
    for name in pk.METHODS:
        if name == "sdpa_cudnn":
            continue  # may be refused for these shapes; the experiment records why
        o, _ = pk.run_method(name, s, v, "cuda")
        assert o.shape == (64, 64) and torch.isfinite(o).all(), name


# -- chapter 6's report (lpfail.book.beyond_report) on fabricated results -------------------------------------
def _fab(away: dict, unavailable=()):
    """A prod_kernels-shaped result: every method's error toward larger |O| is `away[m]` everywhere (CI 1e-5),
    its signed error the opposite (V mostly negative), P̄ = 1; matches 1.0 within a sign group, 0.7 across."""
    from lpfail.book import beyond_report as br
    gaps, ties, negs = np.array([8.0, 16.0]), np.array([1.0, 2.0]), np.array([0.5, 0.9])
    out = {"gaps": gaps, "ties": ties, "neg_fracs": negs}
    names = list(away)
    for m in names:
        out[f"available_{m}"] = m not in unavailable
        if m in unavailable:
            out[f"unavailable_{m}"] = "RuntimeError: no such back end"
            continue
        for key, val in (("away", away[m]), ("signed", -away[m])):
            out[f"grid_{m}_{key}"] = np.full((2, 2), val)
            out[f"grid_{m}_{key}_ci"] = np.full((2, 2), 1e-5)
            out[f"neg_{m}_{key}"] = np.full(2, val)
        out[f"grid_{m}_p_one"] = out[f"grid_{m}_pbar_one"] = np.ones((2, 2))
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out[f"match_{a}__{b}"] = 1.0 if np.sign(away[a]) == np.sign(away[b]) else 0.7
    assert set(br.PRODUCTION) <= set(names)
    return out


def _all(prod_away, paper=1.3e-3):
    from lpfail.book import beyond_report as br
    d = {m: prod_away for m in br.PRODUCTION}
    d.update({m: -0.9e-3 for m in br.DIVIDE_FIRST})
    d.update({m: paper for m in br.ROUND_FIRST})
    return d


def test_report_says_opposite_only_when_every_kernel_is():
    from lpfail.book import beyond_report as br
    f = br.facts(_fab(_all(-1.0e-3)))
    assert f["opposite"] and "other way" in f["statement"]
    assert f["prod_away_lo"] == "-10.00" and f["paper_away"] == "+13.00" and f["prod_signed_hi"] == "+10.00"
    assert f["match_prod_divide_lo"] == "100.0%" and f["match_prod_round_hi"] == "70.0%"
    d = _all(-1.0e-3)
    d["sdpa_cudnn"] = 1.0e-3  # one kernel on the paper's side
    f = br.facts(_fab(d))
    assert not f["opposite"] and "not uniformly" in f["statement"]
    d = _all(-1.0e-3)
    d["sdpa_math"] = -1e-6    # CI reaches 0: not "biased the other way"
    assert not br.facts(_fab(d))["opposite"]
    assert not br.facts(_fab(_all(-1.0e-3, paper=-1e-4)))["opposite"]  # the paper's kernel not biased up


def test_report_tables_name_unavailable_back_ends():
    from lpfail.book import beyond_report as br
    res = _fab(_all(-1.0e-3), unavailable=("sdpa_cudnn",))
    import re

    plain = lambda t: re.sub(r"</?span[^>]*>", "", t)  # noqa: E731  (numbers are wrapped so they never break)
    table = plain(br.kernels_table(res))
    assert "| `sdpa_cudnn` | not available: RuntimeError: no such back end" in table
    assert "| `sdpa_flash` | +10.00 ± 0.10 | -10.00 ± 0.10 | 100% (p: 100%) |" in table
    m = plain(br.match_table(res))
    assert "sdpa_cudnn" not in m and "| `sdpa_flash` | 100.0% | 100.0% | 70.0% | 70.0% | 70.0% |" in m
    assert br.facts(res)["n_production"] == len(br.PRODUCTION) - 1


def test_report_refuses_a_result_without_production_kernels():
    from lpfail.book import beyond_report as br
    with pytest.raises(ValueError, match="no production method"):
        br.facts(_fab(_all(-1.0e-3), unavailable=br.PRODUCTION))


# -- the normaliser's source (issue 25): ℓ from P or from P̄ ----------------------------------------------------------
def test_mimic_with_l_from_pbar_is_the_reference_with_it():
    s, v, _ = make_rows(dataclasses.replace(SPEC, gap=2.0, n_ties=1), 50, 11)   # many mid-sized P: ℓ's source shows
    o, _ = pk.mimic_forward(s, v, exp2=False, fma=False, block_k=64, l_pbar=True)
    ref = attn.forward_from_scores(s, v, FA2_BF16.replace(l_from="pbar"))
    assert torch.equal(o, ref.o)
    assert not torch.equal(o, pk.mimic_forward(s, v, exp2=False, fma=False, block_k=64)[0])


def test_normaliser_bias_of_rows_without_a_dominant_key():
    """Rows without a dominant key (gap 2, one maximum): with ℓ summed from the FP32 P the output is biased toward
    smaller |O| (P̄ = bf16(P) of the many mid-sized probabilities rounds down more often than up, and the numerator
    uses P̄ while the normaliser does not); summing P̄ removes most of it, in the reference and in the mimic. On rows
    with two tied maxima at gap 16 the normaliser changes the bias by less than a tenth."""
    cfg = pk.NormaliserConfig(n_rows=400, base=dataclasses.replace(RowSpec(), head_dim=16),
                              points=((2.0, 1), (16.0, 2)), device="cpu", n_query=2,
                              methods=("ref_FA2_BF16", "ref_FA2_BF16_lpbar", "mimic_exp2_fma", "mimic_exp2_fma_lpbar",
                                       "sdpa_cudnn"))
    res = pk.measure_normaliser(cfg)
    for a, b in (("ref_FA2_BF16", "ref_FA2_BF16_lpbar"), ("mimic_exp2_fma", "mimic_exp2_fma_lpbar")):
        (p2, p16), (q2, q16) = res[f"{a}_away"], res[f"{b}_away"]
        print(f"{a}: toward larger |O| {p2:+.2e} (ℓ from P) vs {q2:+.2e} (from P̄) at gap 2; {p16:+.2e} vs {q16:+.2e}")
        assert p2 < -5 * res[f"{a}_away_ci"][0] and abs(q2) < 0.2 * abs(p2)
        assert abs(p16 - q16) < 0.1 * abs(p16)
    if not torch.cuda.is_available():
        assert res["available_sdpa_cudnn"] is False and res["methods_run"].count(",") == 3
    rows = pk.normaliser_summary(res, "away")
    assert {r["pair"] for r in rows} == {"ref_FA2_BF16/ref_FA2_BF16_lpbar", "mimic_exp2_fma/mimic_exp2_fma_lpbar"}


def test_normaliser_summary_shares():
    res = {"gaps": np.array([16.0, 2.0]), "ties": np.array([2.0, 1.0]),
           "available_triton_fma": True, "available_triton_fma_lpbar": True, "available_sdpa_flash": True,
           "available_sdpa_cudnn": False, "triton_fma_signed": np.array([1e-3, 3e-4]),
           "triton_fma_lpbar_signed": np.array([8e-4, 1e-5]), "sdpa_flash_signed": np.array([2e-3, 2e-4])}
    res.update({k + "_ci": np.array([1e-5, 1e-5]) for k in list(res) if k.endswith("_signed")})
    tied, untied = pk.normaliser_summary(res)
    assert tied["pair"] == "triton_fma/triton_fma_lpbar" and tied["tied"] and not untied["tied"]
    assert tied["normaliser_part"] == pytest.approx(2e-4) and tied["shares"] == {"sdpa_flash": pytest.approx(0.1)}
    assert math.isnan(untied["shares"]["sdpa_flash"]) and untied["normaliser_part"] == pytest.approx(2.9e-4)
