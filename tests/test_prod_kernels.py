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
