"""The robust fix (`lpfail.precision.BoundedMax`): the policy object, the reference, and the Triton kernels.

Reference tests run on the CPU. Kernel tests run in Triton's CPU interpreter through FP32-dot policies (the
interpreter's BF16 arithmetic is broken; BF16 *cast points* still work there), and on the GPU (marked `gpu`)
with BF16 inputs against the reference. The hostile rows: ties at ±1000 and beyond, fully masked key tiles,
a single key, rows made of ties only.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lpfail import attention as attn
from lpfail.experiments.rounding import RowSpec, make_rows, mean_ci, row_errors
from lpfail.precision import (FA2_BF16, FA2_BF16_ROBUST_FIX, FP32, PAPER_BF16, PAPER_BF16_ROBUST_FIX,
                              BoundedMax, DynamicMax, Precision)
from tests.kernel_env import DEVICE, load_kernels

kernels = load_kernels()


def hostile(level: float, n: int = 96, d: int = 64, all_ties: bool = False, dtype=torch.float32, seed=0):
    """q, k, v (1, 2, n, d) whose scores are `level` at every third key (ties, from the row's third key on
    under causal masking) and level − |level|/2 − 1 elsewhere (all keys equal to `level` when `all_ties`).
    Row 0 sees a single key under causal masking."""
    alpha = d ** -0.5
    g = torch.Generator().manual_seed(seed)
    q = torch.zeros(1, 2, n, d)
    q[..., 0] = 1.0
    k = torch.zeros(1, 2, n, d)
    low = level - abs(level) / 2 - 1
    k[..., 0] = low / alpha
    if all_ties:
        k[..., 0] = level / alpha
    else:
        k[..., ::3, 0] = level / alpha
    v = torch.randn(1, 2, n, d, generator=g)
    return (t.to(device=DEVICE, dtype=dtype) for t in (q, k, v))


# -- the policy object ---------------------------------------------------------------------------------------
def test_string_form_round_trips_and_old_presets_keep_their_strings():
    p = PAPER_BF16_ROBUST_FIX
    assert str(p.fix) == "boundmax(2,0.001,0.5,64)"
    assert Precision.parse(str(p)) == p
    assert p.name == "PAPER_BF16_ROBUST_FIX" and FA2_BF16_ROBUST_FIX.name == "FA2_BF16_ROBUST_FIX"
    assert Precision.parse("PAPER_BF16_ROBUST_FIX") == p == PAPER_BF16.with_bounded_fix()
    assert "boundmax" not in str(PAPER_BF16) and "fix=none" in str(PAPER_BF16)
    assert PAPER_BF16.with_fix().name == "PAPER_BF16+fix"   # Algorithm 3's names are unchanged


@pytest.mark.parametrize("kwargs", [dict(beta=1.0), dict(beta=0.5), dict(eps=-1.0), dict(shift_min=0.0),
                                    dict(shift_min=40.0), dict(shift_max=48.0), dict(shift_max=128.0),
                                    dict(shift_max=float("inf"))])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        BoundedMax(**kwargs)


# -- the reference ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [1000.0, -1000.0, 3e4, -1e5, 120.0, -120.0])
@pytest.mark.parametrize("all_ties", [False, True])
def test_reference_is_finite_where_algorithm_3_is_not(level, all_ties):
    """Ties far from 0: Algorithm 3 (no clamp) turns NaN; the robust fix stays finite and close to the truth."""
    q, k, v = hostile(level, all_ties=all_ties)
    policy = PAPER_BF16.replace(block_q=32, block_k=16)              # fully masked key tiles for early rows
    truth = attn.naive_attention(q, k, v)
    alg3 = attn.attention(q, k, v, policy.with_fix())
    robust = attn.attention(q, k, v, policy.with_bounded_fix())
    nofix = attn.attention(q, k, v, policy)
    assert not torch.isfinite(alg3).all()
    assert torch.isfinite(robust).all()
    err = ((robust.double() - truth).norm() / truth.norm()).item()
    err0 = ((nofix.double() - truth).norm() / truth.norm()).item()
    assert err <= 2 * err0 + 1e-2, (err, err0)


def test_reference_matches_algorithm_3_bit_for_bit_between_the_bounds():
    """For β = 2 and |r_m| in [shift_min, shift_max], m' is Algorithm 3's: same outputs, same counters."""
    for level in (0.75, 5.0, 17.5, 60.0, -0.75, -30.0, -63.5):
        q, k, v = hostile(level)
        a3 = attn.flash_forward(q, k, v, PAPER_BF16.with_fix())
        rb = attn.flash_forward(q, k, v, PAPER_BF16_ROBUST_FIX)
        assert (a3.fix_pos + a3.fix_neg).sum() > 0
        for x, y in zip(a3, rb):
            assert torch.equal(x, y), level


@pytest.mark.parametrize("policy", [PAPER_BF16, FA2_BF16, FP32, FA2_BF16.replace(sub="fma")], ids=lambda p: p.name)
def test_rows_without_ties_are_bit_identical_to_no_fix(policy):
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, 150, 64, generator=g) * 2 for _ in range(4))
    fixed = policy.with_bounded_fix()
    a, b = attn.flash_forward(q, k, v, policy), attn.flash_forward(q, k, v, fixed)
    untouched = (b.fix_pos + b.fix_neg) == 0                  # (1, 2, T): rows in which no block had a tie
    assert untouched.float().mean() > 0.5                     # (scores within ε of the block max count as ties)
    for x, y in zip(a[:5], b[:5]):
        assert torch.equal(x[untouched], y[untouched])



def test_backward_does_not_depend_on_the_fix():
    """The backward reads only L = m + log ℓ: given the same (O, L) it computes the same gradients whatever the
    fix, and with the robust fix's own (O, L) the gradients stay close to the truth on tied rows."""
    q, k, v = hostile(300.0, dtype=torch.float32)
    do = torch.randn_like(q)
    res = attn.flash_forward(q, k, v, PAPER_BF16_ROBUST_FIX)
    g_fix = attn.flash_backward(q, k, v, res.o, res.lse, do, PAPER_BF16_ROBUST_FIX)
    g_nofix = attn.flash_backward(q, k, v, res.o, res.lse, do, PAPER_BF16)
    for x, y in zip(g_fix, g_nofix):
        assert torch.equal(x, y)
    assert all(torch.isfinite(x).all() for x in g_fix)


def test_shift_is_bounded_and_survives_bf16_rounding():
    """Ties at r_m: the robust fix's m − r_m lies in (0, 64] for |r_m| < 2^12 (BF16 m), and is 0 where no BF16
    m within the bound exists (the block then runs as without the fix)."""
    for level, expect_shift in ((1000.0, True), (-1000.0, True), (4000.0, True), (-2e5, False)):
        q, k, v = hostile(level, all_ties=True)
        res = attn.flash_forward(q, k, v, PAPER_BF16_ROBUST_FIX)
        s = attn.flash_forward(q, k, v, PAPER_BF16)
        shift = (res.m.double() - s.m.double())[..., 2:, :]   # rows that see ≥ 2 keys
        if expect_shift:
            assert (shift > 0).all() and (shift <= 64).all(), (level, shift.min(), shift.max())
        else:
            assert (shift == 0).all()
        assert torch.isfinite(res.o).all()


def test_robust_fix_removes_the_tied_row_bias_like_algorithm_3():
    """On the chapter-4 rows (two ties at gap 16): the stored output's bias without a fix is significant; with the
    robust fix it is at most a tenth of it, and, at the same rows shifted to ±300 (where Algorithm 3 is NaN),
    too."""
    s, v, _ = make_rows(RowSpec(gap=16.0), 300, 5)
    base = mean_ci(row_errors(s, v, PAPER_BF16).out_err.mean(1))
    assert abs(base[0]) > 3 * base[1]
    for offset in (0.0, 284.0, -316.0):
        s2 = (s + offset).bfloat16().float()
        m, ci = mean_ci(row_errors(s2, v, PAPER_BF16_ROBUST_FIX).out_err.mean(1))
        assert np.isfinite(m) and abs(m) <= 0.1 * abs(base[0]), (offset, m, base)


# -- the Triton kernels (interpreter on the CPU, FP32 dots) ------------------------------------------------------
KERNEL_POLICIES = [FP32.replace(block_k=64), FP32.replace(block_k=None), FP32.replace(block_k=64, sub="fma"),
                   FP32.replace(block_k=None, sub="fma"),
                   FP32.replace(block_k=64, scores="bf16", acc="bf16", pbar="bf16", pv_out="bf16", out="bf16",
                                qk_out="bf16", exp_in="bf16"),
                FP32.replace(block_k=None, scores="bf16", acc="bf16", pbar="bf16", pv_out="bf16", out="bf16",
                                qk_out="bf16", exp_in="bf16")]


@pytest.mark.parametrize("policy", KERNEL_POLICIES, ids=str)
@pytest.mark.parametrize("level", [1000.0, -1000.0, 20.0, -3e4])
def test_kernel_matches_the_reference_on_hostile_rows(policy, level):
    fixed = policy.with_bounded_fix()
    q, k, v = hostile(level, n=160)
    out = kernels.flash_attention(q, k, v, fixed, causal=True)
    ref = attn.attention(q, k, v, fixed, causal=True)
    assert torch.isfinite(out).all()
    diff = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert diff < 1e-5 or (out.dtype == torch.bfloat16 and diff < 4e-3), diff
    all_ties = kernels.flash_attention(*hostile(level, n=70, all_ties=True), fixed, causal=True)
    assert torch.isfinite(all_ties).all()


@pytest.mark.parametrize("sub", ["sub", "fma"])
def test_kernel_shift_equals_the_reference_shift(sub):
    """P̄ of tied keys from the kernel's own device functions equals the reference's exp(r_m − m')."""
    q, k, v = hostile(-500.0, n=64, all_ties=True)
    policy = FP32.replace(sub=sub, block_k=64).with_bounded_fix()
    p = kernels.probe_pbar(q[0, 0, :8], k[0, 0], policy).cpu()
    res = attn.flash_forward(q.cpu(), k.cpu(), v.cpu(), policy.replace(block_k=None), causal=False)
    expect = torch.exp(res.lse.new_tensor(0.0) + (-500.0) - res.m[0, 0, :8].double()).float()
    assert torch.allclose(p, expect.expand_as(p), rtol=1e-5), (p[0, 0], expect[0])
    assert (p < 1).all() and (p > 0).all()


def test_kernel_gradients_are_finite_and_match_the_reference():
    q, k, v = hostile(-1000.0, n=96)
    do = torch.randn_like(q)
    policy = FP32.replace(block_k=32).with_bounded_fix()
    outs = []
    for fn in (lambda a, b, c: kernels.flash_attention(a, b, c, policy), lambda a, b, c: attn.attention(a, b, c, policy)):
        a, b, c = (t.clone().requires_grad_() for t in (q, k, v))
        o = fn(a, b, c)
        o.backward(do)
        outs.append((o.detach(), a.grad, b.grad, c.grad))
    for name, x, y in zip(("O", "dQ", "dK", "dV"), *outs):
        assert torch.isfinite(x).all(), name
        if name in ("O", "dV"):  # dQ, dK of exact ties at −1000 are sums that cancel to ≈ 0: compared loosely
            assert ((x - y).norm() / y.norm()).item() < 1e-4, name
        else:
            assert (x - y).abs().max().item() < 1e-3 * k.abs().max().item(), name


# -- GPU: BF16 against the reference ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("policy", [PAPER_BF16_ROBUST_FIX, FA2_BF16_ROBUST_FIX, FA2_BF16_ROBUST_FIX.replace(sub="fma")],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("level", [1000.0, -1000.0, 20.0])
def test_gpu_bf16_robust_fix_agrees_with_the_reference(policy, level):
    q, k, v = hostile(level, n=1024, dtype=torch.bfloat16)
    o = kernels.flash_attention(q, k, v, policy)
    r = attn.attention(q, k, v, policy, causal=True)
    assert torch.isfinite(o).all()
    mismatch = (o.view(torch.int16) != r.to(o.dtype).view(torch.int16)).float().mean().item()
    print(f"{policy.name} level={level}: O bit mismatch vs reference {mismatch:.3%}")
    assert mismatch < 0.05


# -- the tie test of the kernels (a second-largest score since 2026-12-01) against a count ----------------------
@pytest.mark.parametrize("sub", ["sub", "fma"])
@pytest.mark.parametrize("fix", ["alg3", "robust"])
def test_kernel_tie_test_equals_the_count_of_scores_at_the_maximum(sub, fix):
    """Rows whose maximum is held by 1, 2 or 3 keys, with a near-tie just inside ε or just outside it, at a
    scale that is not a power of two (so FMA mode's fl(x·α) rounds): the kernel shifts a row's maximum exactly
    where at least two scores S = fl(QKᵀ·α) satisfy S ≥ fl(r_m − ε), as the reference's count says."""
    d, m, n, scale, eps = 16, 48, 96, 0.3, 1e-3
    g = torch.Generator().manual_seed(5)
    k = torch.rand(n, d, generator=g) * 3.0                              # the background, below every maximum
    expect = torch.zeros(m, dtype=torch.bool)
    q = torch.zeros(m, d)
    for i in range(m):
        c = i % d
        q[i, c] = 1.0
    for c in range(d):
        top = 5.0 + 0.37 * c
        copies, near = 1 + c % 3, (0.0, 0.5 * eps / scale, 2.0 * eps / scale, 0.99 * eps / scale)[(c // 3) % 4]
        k[:copies, c] = top
        if near:
            k[copies, c] = top - near
    s = (k.float() * torch.tensor(scale, dtype=torch.float32)).T           # (d, n): S of a row with q = e_c
    r_m = s.max(1).values
    thresh = (r_m - torch.tensor(eps, dtype=torch.float32))
    count = (s >= thresh[:, None]).sum(1)
    expect = (count >= 2)[torch.arange(m) % d]
    assert expect.any() and (~expect).any()
    base = FP32.replace(sub=sub)
    policy = base.with_fix() if fix == "alg3" else base.with_bounded_fix()
    p = kernels.probe_pbar(q.to(DEVICE), k.to(DEVICE), policy, scale=scale).cpu()
    at_max = p[torch.arange(m), 0]                                       # key 0 holds every row's maximum
    shifted = (at_max - 1).abs() > 1e-5
    assert torch.equal(shifted, expect), (shifted.int().tolist(), expect.int().tolist())
