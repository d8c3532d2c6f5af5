"""Tests of the Triton kernels (`kernels`): against float64 truth, the reference policy, and tied maxima.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set here before `kernels` is
imported — or re-imported, if another test module imported it first), whose BF16 arithmetic is broken, so
the CPU tests use `matmul="fp32"` policies; rounding cast points to BF16 still work there (they are
conversions). Tests marked `gpu` run BF16 on the GPU. Pass rule (STYLE.md §6): an error is compared with the
error of the reference policy doing the same casts in plain PyTorch, err(kernel) ≤ 2·err(reference) + atol.
Run `pytest -s tests/test_kernels.py` to see the measured errors.
"""
from __future__ import annotations

import math

import pytest
import torch

from lpfail.precision import FA2_BF16, FP32, PAPER_BF16
from tests.kernel_env import CUDA, DEVICE, load_kernels

kernels = load_kernels()
import triton  # noqa: E402  (after load_kernels: under TRITON_INTERPRET=1 on a CPU)
import triton.language as tl  # noqa: E402

_max2 = kernels.fwd._max2   # a global of `_max2_probe` below (the interpreter runs it as Python)

try:  # the pure-PyTorch reference (the oracle for policy-matching tests), when it is there
    from lpfail.attention import attention as reference_attention
except ImportError:  # pragma: no cover
    reference_attention = None


def truth(q, k, v, causal, scale=None):
    """Naive softmax attention in float64: no casts at all."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def run_with_grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(do.to(o.dtype))
    return o.detach(), q.grad, k.grad, v.grad


def truth_with_grads(q, k, v, do, causal):
    return run_with_grads(lambda a, b, c: truth(a, b, c, causal), q.double(), k.double(), v.double(),
                          do.double())


def inputs(b, h, n, d, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, n, d, generator=g) for _ in range(4))
    return (t.to(device=DEVICE, dtype=dtype) for t in (q, k, v, do))


# -- CPU (interpreter) and GPU: the FP32 path against float64 truth ------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [113, 203])
def test_fp32_matches_truth(n, d, causal):
    q, k, v, do = inputs(1, 2, n, d, seed=n + d)
    got = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, FP32, causal=causal), q, k, v, do)
    ref = truth_with_grads(q, k, v, do, causal)
    errs = [rel(x, r) for x, r in zip(got, ref)]
    print(f"n={n} d={d} causal={causal}: rel err O, dQ, dK, dV = " + ", ".join(f"{e:.2e}" for e in errs))
    assert got[0].dtype == torch.float32
    assert all(e < 2e-5 for e in errs), errs


@pytest.mark.parametrize("policy", [
    FP32.replace(block_q=64, block_k=32),                 # one hardware tile per policy block, masked tail
    FP32.replace(block_k=64),
    FP32.replace(block_k=None),                           # one key block over the whole row (two passes)
    FP32.replace(sub="fma"),
    FP32.replace(block_k=64, sub="fma"),
], ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_fp32_block_paths(policy, causal):
    q, k, v, do = inputs(1, 2, 203, 64, seed=3)
    got = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=causal), q, k, v, do)
    ref = truth_with_grads(q, k, v, do, causal)
    errs = [rel(x, r) for x, r in zip(got, ref)]
    print(f"{policy.name}: " + ", ".join(f"{e:.2e}" for e in errs))
    assert all(e < 2e-5 for e in errs), errs


@pytest.mark.parametrize("policy", [FP32.replace(block_k=64).with_fix(), FP32.replace(block_k=32),
                                    PAPER_BF16.replace(matmul="fp32").with_fix(), PAPER_BF16.replace(matmul="fp32")],
                         ids=str)
def test_scores_in_units_of_alpha_change_no_bit(policy, monkeypatch):
    """With α a power of two the forward keeps scores in units of α and the backward forms S − L as one FMA on
    round(QKᵀ) (one multiply fewer per score each); rounding commutes with such a scaling and α·round(QKᵀ) is
    exact, so O, L, dQ, dK and dV must equal the natural-unit path's bit for bit. The rows get tied maxima so
    that the fix's threshold (ε/α in these units) is exercised too."""
    q, k, v, do = inputs(1, 2, 203, 64, seed=11)
    k[..., 40:44, :] = k[..., 7:8, :]                              # four copies of key 7: tied maxima in rows
    q, k = q.to(DEVICE), k.contiguous()
    kp = kernels.kernel_policy(policy)
    runs, asked = [], []
    for raw in (True, False):
        monkeypatch.setattr(kernels.launcher, "_raw_units", lambda kp, scale, raw=raw: asked.append(raw) or raw)
        kernels.fwd_plan.cache_clear(), kernels.bwd_plan.cache_clear()  # the plans cache RAW: recompute them
        o, lse = kernels.launch_forward(q, k, v, kp, True, 0.125)
        runs.append((o.cpu(), lse.cpu()))
        # the backward's P = exp(S − L) as one FMA on round(QKᵀ), from the same O and L for both
        grads = kernels.launch_backward(do, q, k, v, runs[0][0].to(DEVICE), runs[0][1].to(DEVICE), kp, True, 0.125)
        runs[-1] += tuple(g.cpu() for g in grads)
    assert asked.count(True) >= 2 and asked.count(False) >= 2  # both plans built in each unit, not reused
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("delta", ["dO.O", "dO.O_hp", "dP.P"])
def test_delta_sources(delta):
    q, k, v, do = inputs(1, 2, 113, 64, seed=5)
    policy = FP32.replace(delta=delta)
    got = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy), q, k, v, do)
    ref = truth_with_grads(q, k, v, do, True)
    errs = [rel(x, r) for x, r in zip(got, ref)]
    print(f"delta={delta}: " + ", ".join(f"{e:.2e}" for e in errs))
    assert all(e < 2e-5 for e in errs), errs


def tied_rows(n=203, d=64, ties=3, value=4.0, seed=7):
    """Q, K, V where every query row has `ties` keys at its (positive) maximum score."""
    q, k, v, do = inputs(1, 2, n, d, seed=seed)
    k = k.clone()
    for h in range(2):
        for t in range(ties):
            k[0, h, t + 1] = q[0, h, -1] * 0 + value  # identical keys: equal scores in every row
    return q, k, v, do


@pytest.mark.parametrize("block_k", [64, 512])
@pytest.mark.parametrize("causal", [True, False])
def test_fix_leaves_fp32_output_unchanged(block_k, causal):
    q, k, v, do = tied_rows()
    policy = FP32.replace(block_k=block_k)
    got = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy.with_fix(), causal=causal),
                         q, k, v, do)
    ref = truth_with_grads(q, k, v, do, causal)
    errs = [rel(x, r) for x, r in zip(got, ref)]
    print(f"fix block_k={block_k}: " + ", ".join(f"{e:.2e}" for e in errs))
    assert all(e < 2e-5 for e in errs), errs


@pytest.mark.parametrize("policy", [FP32.replace(block_k=64).with_fix(), PAPER_BF16.replace(matmul="fp32"),
                                    FP32.replace(block_k=64, delta="dP.P")], ids=str)
def test_second_launch_skips_the_autotuner_and_changes_no_bit(policy, monkeypatch):
    """After the first launch for a shape and policy, `kernels.launch` runs the autotuner's pick directly;
    the forward and all three gradients must come out bit for bit as from the first (autotuned) launch."""
    q, k, v, do = inputs(1, 2, 150, 64, seed=21)
    kernels.PICKS.clear()
    kernels.DIRECT.clear()
    monkeypatch.setenv(kernels.DIRECT_ENV, "1")   # the direct launch (the default since the GPU check)
    first = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=True), q, k, v, do)
    n_picks = len(kernels.PICKS)
    second = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=True), q, k, v, do)
    assert n_picks >= 3 and len(kernels.PICKS) == n_picks          # fwd, dK/dV, dQ (+ δ pass): no new picks
    # the third launch calls the compiled kernels directly (on CUDA; the interpreter has none: the JIT path again)
    third = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=True), q, k, v, do)
    assert len(kernels.DIRECT) == (n_picks if CUDA else 0)
    for a, b, c in zip(first, second, third):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_bf16_cast_points_are_honoured_on_the_fp32_path():
    """The paper's roundings (S, m, ℓ, O, P̄ and P̄V in BF16) with FP32 dots: the error grows to BF16 size."""
    q, k, v, _ = inputs(1, 2, 203, 64, seed=11)
    ref = truth(q, k, v, True)
    exact = rel(kernels.flash_attention(q, k, v, FP32), ref)
    paperish = FP32.replace(scores="bf16", pbar="bf16", pv_out="bf16", acc="bf16", out="bf16")
    o = kernels.flash_attention(q, k, v, paperish)
    err = rel(o, ref)
    print(f"FP32 {exact:.2e}, FP32 with the paper's BF16 cast points {err:.2e}")
    assert o.dtype == torch.bfloat16
    assert 1e-3 < err < 3e-2 and exact < 1e-5
    if reference_attention is not None:
        r = reference_attention(q, k, v, paperish, causal=True)
        agree = (o == r).float().mean().item()
        print(f"bitwise agreement with lpfail.attention: {agree:.4%}; rel diff {rel(o, r.double()):.2e}")
        assert rel(o, r.double()) <= 0.5 * err


def probe_rows(d, m, n, seed, ties, base=3.0, step=0.0):
    """q (m, d) and k (n, d) where row i's maximum is tied `ties(i)` times (keys 4i …), and the mask of those
    tied entries: q_i = (base + step·i)·e_i, the tied keys 5·e_i, keys 4i … 4i+2 otherwise 0, the rest small."""
    q = torch.zeros(m, d)
    k = torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) * 0.05
    tied = torch.zeros(m, n, dtype=torch.bool)
    for i in range(m):
        q[i, i] = base + step * i
        k[4 * i:4 * i + 3] = 0.0
        k[4 * i:4 * i + ties(i), i] = 5.0
        tied[i, 4 * i:4 * i + ties(i)] = True
    return q, k, tied


def test_probe_tied_maximum_gives_pbar_one_in_sub_mode():
    q, k, tied = probe_rows(128, 16, 64, seed=0, ties=lambda i: 3)
    q, k = q.to(DEVICE), k.to(DEVICE)
    p = kernels.probe_pbar(q, k, FP32).cpu()
    assert (p[tied] == 1).all()
    fixed = kernels.probe_pbar(q, k, FP32.with_fix()).cpu()
    assert (fixed[tied] < 1).all() and (fixed[tied] > 0).all()


def test_fix_in_fma_mode_finds_ties():
    """FMA mode with the fix: tied maxima are found (P̄ < 1 everywhere on them) and a single maximum is not
    shifted (its P̄ stays within 1e-5 of 1: on the GPU the FFMA leaves the rounding error of m·log2(e) as a
    residual, so 1 ± a few ulps, as measured on the H200 on 2026-11-30; the interpreter gives exactly 1)."""
    m = 16
    q, k, tied = probe_rows(64, m, 64, seed=1, ties=lambda i: 3 if i % 2 else 1, step=0.25)  # odd rows tie
    q, k = q.to(DEVICE), k.to(DEVICE)
    p = kernels.probe_pbar(q, k, FP32.replace(sub="fma").with_fix()).cpu()
    odd = torch.arange(m) % 2 == 1
    assert (p[odd][tied[odd]] < 1).all() and (p[odd][tied[odd]] > 0).all()
    assert ((p[~odd][tied[~odd]] - 1).abs() < 1e-5).all()


@triton.jit
def _max2_probe(X, R1, R2, M: tl.constexpr, N: tl.constexpr):
    """Row-wise (largest, second largest) of an (M, N) tile, by the forward's own `_max2`."""
    r1, r2 = _max2(tl.load(X + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]))
    tl.store(R1 + tl.arange(0, M), r1)
    tl.store(R2 + tl.arange(0, M), r2)


@pytest.mark.skipif(CUDA, reason="the CPU interpreter's reduce only")
def test_interpreter_reduce_on_slices_gives_the_element_loops_bits(monkeypatch):
    """`kernels.fwd` runs the interpreter's reduce for `_max2` on whole slices instead of element by element (the
    same left fold along the row): the row's two largest scores must come out bit for bit as from the
    interpreter's own loop, on rows with ties, −inf, fully −inf rows, ±0, +inf and NaN."""
    from triton.runtime import interpreter

    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, 32, generator=g).round(decimals=1)      # rounded: many ties
    x[1, 3] = x[1, 9] = x[1].max() + 1
    x[2], x[3, ::2] = float("-inf"), float("-inf")
    x[4], x[4, 5], x[4, 6] = 0.0, -0.0, 0.0
    x[4, ::3] = -0.0
    x[5, 7], x[6, 2], x[6, 30] = float("inf"), float("nan"), float("nan")
    x[7, 0], x[7, 31] = float("nan"), 5.0
    x = x.to(DEVICE)
    fast = getattr(interpreter.ReduceOps.generic_reduce, "_lpfail", False)
    assert fast

    def run():
        r1, r2 = torch.empty(16, device=DEVICE), torch.empty(16, device=DEVICE)
        _max2_probe[(1,)](x, r1, r2, M=16, N=32)
        return r1.view(torch.int32), r2.view(torch.int32)

    sliced = run()
    monkeypatch.setattr(interpreter.ReduceOps, "generic_reduce", interpreter.ReduceOps.generic_reduce._lpfail_original)
    looped = run()
    for a, b in zip(sliced, looped):
        assert torch.equal(a, b)
    assert torch.equal(sliced[0].view(torch.float32)[1], sliced[1].view(torch.float32)[1])   # a tied maximum


@pytest.mark.skipif(CUDA, reason="the CPU interpreter only")
def test_interpreter_patches_change_no_bit(monkeypatch):
    """`kernels.fwd`'s speed-ups of Triton's interpreter (the reduce on slices, device calls without re-patching
    `triton.language`, the memoised dtype table) must leave every bit as Triton's own interpreter computes it: O and
    the three gradients of the robust fix (full attention: every key of a tile in every row's maximum) and of
    Algorithm 3 on the two-pass path, with tied maxima (the `_max2` reduce, `tl.max` from `triton.language.standard`),
    the same with all of them undone."""
    from triton.runtime import interpreter as interp

    q, k, v, do = inputs(1, 1, 70, 32, seed=17)
    k[..., 30:33, :] = k[..., 3:4, :]                               # tied maxima

    def run(policy, causal):
        return run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=causal), q, k, v, do)

    cases = [(FP32.replace(block_k=32).with_bounded_fix(), False), (PAPER_BF16.replace(matmul="fp32").with_fix(), True)]
    fast = [run(*c) for c in cases]
    for obj, name in ((interp.ReduceOps, "generic_reduce"), (interp.InterpretedFunction, "__call__"),
                      (interp.GridExecutor, "__call__"), (interp, "_get_np_dtype")):
        patched = getattr(obj, name)
        assert patched._lpfail
        monkeypatch.setattr(obj, name, patched._lpfail_original)
    for got, ref in zip(fast, [run(*c) for c in cases]):
        for a, b in zip(got, ref):
            assert torch.equal(a, b)


@pytest.mark.parametrize("sub", ["sub", "fma"])
def test_fix_ignores_rows_masked_out_of_a_tile(sub):
    """Causal rows in the first half of a diagonal query block see no key of the block's second key tile. Those
    scores are all −inf and must not count as tied maxima (which would shift the row's maximum to 0): with
    row maxima near −100 that shift underflows ℓ to 0 and O to NaN. Scores are distinct, so the fix itself
    changes nothing here."""
    n, d = 64, 64
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, n, d, generator=g) * 0.3
    k = torch.randn(1, 1, n, d, generator=g) * 0.3
    q[..., 0], k[..., 0] = 20.0, -40.0                            # S ≈ −100 + distinct small parts
    q, k, v = (t.to(DEVICE) for t in (q, k, torch.randn(1, 1, n, d, generator=g)))
    policy = FP32.replace(block_k=32, sub=sub).with_fix()         # two key tiles per 64-row query block
    out = kernels.flash_attention(q, k, v, policy, causal=True)
    ref = truth(q.double(), k.double(), v.double(), True)
    assert torch.isfinite(out).all()
    assert rel(out, ref) < 2e-5


# -- the API's promises ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("knob,value", [("exp", "fp64"), ("matmul", "fp64"), ("acc", "fp64"), ("out", "fp64"),
                                        ("block_k", 96), ("block_k", 200)])
def test_unsupported_policies_name_the_knob(knob, value):
    with pytest.raises(ValueError, match=knob):
        kernels.kernel_policy(FP32.replace(**{knob: value}))


def test_fma_with_rounded_scores_is_refused():
    with pytest.raises(ValueError, match="scores"):
        kernels.kernel_policy(PAPER_BF16.replace(sub="fma"))


@pytest.mark.skipif(CUDA, reason="the interpreter's refusal of BF16 dots only applies on CPU")
def test_interpreter_refuses_bf16_dots():
    with pytest.raises(ValueError, match="matmul"):
        kernels.kernel_policy(FA2_BF16)


def test_no_cuda_and_no_interpreter_is_a_clear_runtime_error(monkeypatch):
    monkeypatch.setattr(kernels.runtime, "interpreted", lambda: False)
    q = torch.randn(1, 1, 16, 64)
    with pytest.raises(RuntimeError, match="CUDA GPU.*lpfail.attention"):
        kernels.flash_attention(q, q, q, FP32)


def test_bad_shapes():
    q = torch.randn(1, 1, 16, 64, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        kernels.flash_attention(q[..., :40], q[..., :40], q[..., :40], FP32)   # 48 is a head dim the kernels take
    with pytest.raises(ValueError, match="one shape"):
        kernels.flash_attention(q, q[:, :, :8], q, FP32)


# -- GPU: BF16 ---------------------------------------------------------------------------------------------------
def bf16_baseline(q, k, v, causal):
    """A plain BF16 attention in PyTorch (the error any BF16 arithmetic makes), autograd-differentiable."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)).float() * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1).to(q.dtype) @ v


GPU_POLICIES = [FA2_BF16, FA2_BF16.replace(sub="fma"), FA2_BF16.with_fix(), FA2_BF16.replace(delta="dP.P"),
                FA2_BF16.replace(delta="dO.O_hp"), PAPER_BF16, PAPER_BF16.with_fix()]


GPU_CASES = [(p, True) for p in GPU_POLICIES] + [(FA2_BF16, False), (PAPER_BF16, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("policy,causal", GPU_CASES, ids=lambda x: x.name if hasattr(x, "name") else str(x))
@pytest.mark.parametrize("n,d", [(1000, 64), (517, 128)])
def test_bf16_within_a_small_multiple_of_the_reference_error(policy, causal, n, d):
    q, k, v, do = inputs(2, 4, n, d, dtype=torch.bfloat16, seed=n)
    ref = truth_with_grads(q, k, v, do, causal)
    got = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=causal), q, k, v, do)
    if reference_attention is not None:
        base = run_with_grads(lambda a, b, c: reference_attention(a, b, c, policy, causal=causal), q, k, v, do)
    else:
        base = run_with_grads(lambda a, b, c: bf16_baseline(a, b, c, causal), q, k, v, do)
    e_got = [rel(x, r) for x, r in zip(got, ref)]
    e_base = [rel(x, r) for x, r in zip(base, ref)]
    print(f"{policy.name} n={n} d={d} causal={causal}: kernel " + ", ".join(f"{e:.2e}" for e in e_got)
          + " | reference " + ", ".join(f"{e:.2e}" for e in e_base))
    assert all(torch.isfinite(x).all() for x in got)
    for name, eg, eb in zip("O dQ dK dV".split(), e_got, e_base):
        assert eg <= 2 * eb + 1e-3, (name, eg, eb)


@pytest.mark.gpu
@pytest.mark.skipif(reference_attention is None, reason="lpfail.attention (the reference) is not there yet")
@pytest.mark.parametrize("policy", [PAPER_BF16, PAPER_BF16.with_fix(), FA2_BF16, FA2_BF16.replace(sub="fma")],
                         ids=lambda p: p.name)
def test_bf16_forward_agrees_with_the_reference_bits(policy):
    """Same casts in the same places: O agrees bit for bit except where FP32 sums taken in a different order
    (tensor-core tiles vs cuBLAS) or exp2-based vs libm exp land on different sides of a BF16 rounding."""
    q, k, v, _ = inputs(2, 4, 1024, 64, dtype=torch.bfloat16, seed=1)
    o = kernels.flash_attention(q, k, v, policy)
    r = reference_attention(q, k, v, policy, causal=True)
    mismatch = (o.view(torch.int16) != r.to(o.dtype).view(torch.int16)).float().mean().item()
    ulps = (o.float() - r.float()).abs().max().item()
    print(f"{policy.name}: O bit mismatch rate vs lpfail.attention {mismatch:.3%}, max |diff| {ulps:.3g}")
    assert mismatch < 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("pbar", ["bf16", "fp32"])
def test_tied_maxima_on_the_hardware(pbar):
    """'sub' gives P̄ = 1 exactly at a tied maximum; record what 'fma' gives (α = 1/√128 is not a power of
    two, so α·QKᵀ rounds and the fused form leaves S − m slightly off 0)."""
    q, k, tied = probe_rows(128, 16, 64, seed=0, ties=lambda i: 3, step=0.25)
    q, k = q.cuda().bfloat16(), k.cuda().bfloat16()
    sub = kernels.probe_pbar(q, k, FA2_BF16.replace(pbar=pbar)).cpu()
    fma = kernels.probe_pbar(q, k, FA2_BF16.replace(pbar=pbar, sub="fma")).cpu()
    ones_fma = (fma[tied] == 1).float().mean().item()
    print(f"pbar={pbar}: P̄ == 1 at tied maxima: sub {(sub[tied] == 1).float().mean().item():.0%}, "
          f"fma {ones_fma:.0%}; fma values {sorted(set(fma[tied].tolist()))[:6]}")
    assert (sub[tied] == 1).all()
    assert ((fma[tied] - 1).abs() < 1e-5).all()  # recorded above: whether they are exactly 1 is the hardware's


class _FakeCompiled:
    """A compiled kernel's stand-in: its launcher records what it is given."""
    function, packed_metadata = "fn", ("meta",)

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)

    def launch_metadata(self, *args):  # pragma: no cover - only with a launch hook
        return None


class _FakeDriver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, idx):
        return 1234


def test_direct_launch_passes_the_arguments_triton_binds(monkeypatch):
    """The direct launch of a compiled kernel (`kernels.launch` from the third launch on, CUDA only) must hand
    the launcher what Triton's JIT would: its binder's bound arguments in signature order (built here for an
    sm_90 target from the forward kernel's source), the grid and the current stream. Checked on the CPU with the
    arguments `launch_forward` really passes; refused for a misaligned tensor, LPFAIL_KERNELS_DIRECT=0 or a binding
    whose order differs. (On the GPU, the second-launch test and tools/gpu_overhead.py check the bits.)"""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction, create_function_from_signature

    captured = []
    monkeypatch.setattr(kernels.launcher, "launch", lambda kernel, grid, key, a, kw, stream=None: captured.append(
        (grid, key, a, kw)))
    q, k, v, _ = inputs(2, 3, 100, 64, seed=5)
    kernels.launch_forward(q, k, v, kernels.kernel_policy(FP32.with_fix()), True, 0.125)
    grid, key, args, kwargs = captured[0]
    jit = JITFunction(getattr(kernels.fwd._attn_fwd.fn, "fn", kernels.fwd._attn_fwd.fn))
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    jit.device_caches[0] = ({}, {}, None, backend, binder)
    meta = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3}
    kwargs = {**kwargs, "enable_fp_fusion": False, **meta}
    monkeypatch.setattr(kernels.fwd, "INTERPRET", False)
    monkeypatch.setattr(driver, "_active", _FakeDriver())
    compiled = _FakeCompiled()
    monkeypatch.setenv(kernels.DIRECT_ENV, "0")
    assert kernels.launcher._direct_entry(jit, compiled, args, kwargs, key) is None      # switched off
    monkeypatch.delenv(kernels.DIRECT_ENV, raising=False)
    entry = kernels.launcher._direct_entry(jit, compiled, args, kwargs, key)             # on by default (GPU-checked)
    assert entry is not None
    monkeypatch.undo()   # the real launch again (and the driver, the interpreter flag, the switch)
    monkeypatch.setattr(driver, "_active", _FakeDriver())
    monkeypatch.setitem(kernels.DIRECT, ("kernel", key), (entry[0], entry[1], meta, *entry[2:]))
    kernels.launch("kernel", grid, key, args, kwargs)
    kernels.launch("kernel", grid, key, args, kwargs, stream=77)                # a stream given: that one
    (call, call77) = compiled.calls
    bound = list(binder(*args, **kwargs)[0].values())
    assert call[:9] == (2, 6, 1, 1234, "fn", ("meta",), None, triton.knobs.runtime.launch_enter_hook,
                        triton.knobs.runtime.launch_exit_hook)
    assert call77[3] == 77 and call77[9:] == call[9:]
    assert len(call[9:]) == len(bound) == len(jit.params)
    assert all(a is b for a, b in zip(call[9:], bound))
    # refusals: a misaligned tensor, the switch, a binder whose bound order is not args then constexprs
    monkeypatch.setattr(kernels.fwd, "INTERPRET", False)
    monkeypatch.setenv(kernels.DIRECT_ENV, "1")
    bad = (q.flatten()[1:1 + q.numel() - 8].view(-1),) + args[1:]
    assert kernels.launcher._direct_entry(jit, compiled, bad, kwargs, key) is None
    monkeypatch.setenv(kernels.DIRECT_ENV, "0")
    assert kernels.launcher._direct_entry(jit, compiled, args, kwargs, key) is None
    monkeypatch.setenv(kernels.DIRECT_ENV, "1")
    jit.device_caches[0] = ({}, {}, None, backend, lambda *a, **kw: ({"x": 0, **dict(enumerate(a))}, None, None))
    assert kernels.launcher._direct_entry(jit, compiled, args, kwargs, key) is None


def test_autotune_env_is_read_from_the_environment(monkeypatch):
    """The launch plans key on LPFAIL_KERNELS_AUTOTUNE read from os.environ's own store (cheaper than a lookup):
    the same value os.environ.get gives, set, changed and unset."""
    assert kernels.launcher._TUNE_KEY == kernels.fwd.TUNE_ENV.encode()
    monkeypatch.delenv(kernels.fwd.TUNE_ENV, raising=False)
    assert kernels.launcher._tune_env() is None
    for value in ("0", "1"):
        monkeypatch.setenv(kernels.fwd.TUNE_ENV, value)
        assert kernels.launcher._tune_env() == value == __import__("os").environ.get(kernels.fwd.TUNE_ENV)


# -- the tuning levers (issue 25): how the kernels run, never what they compute --------------------------------
LEVER_POLICY = FP32.replace(block_k=32).with_fix()


@pytest.mark.parametrize("tuning", [kernels.Tuning(tma=True), kernels.Tuning(order="lpt"),
                                    kernels.Tuning(tie="count"), kernels.Tuning(space="sm90"),
                                    kernels.Tuning(bwd="fused"), kernels.Tuning(tie="auto"),
                                    kernels.Tuning(tma="bwd")], ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_tuning_levers_change_no_bit(tuning, causal):
    """TMA descriptors (both passes, or the backward's only), the grid order, the tie test's form (count, or "auto":
    count at d 64), the autotune space (one config in the interpreter) and the fused backward (the split's code and
    interpreter tiles in one launch) must leave O and all three gradients bit for bit as ``Tuning()`` (every lever off) gives them, on rows with
    tied maxima (so that the fix's test fires) and a masked tail."""
    q, k, v, do = tied_rows(n=100)
    base = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, LEVER_POLICY, causal=causal,
                                                                  tuning=kernels.Tuning()), q, k, v, do)
    got = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, LEVER_POLICY, causal=causal,
                                                                 tuning=tuning), q, k, v, do)
    for name, x, y in zip(("O", "dQ", "dK", "dV"), got, base):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("policy,d", [(FP32.replace(sub="fma", block_k=64).with_fix(), 64),      # α = 1/8: raw count
                                      (FP32.replace(sub="fma", block_k=64).with_bounded_fix(), 32),  # α = 1/√32
                                      (FP32.replace(block_k=64).with_bounded_fix(), 32),
                                      (PAPER_BF16.replace(matmul="fp32", block_k=64).with_fix(), 64)], ids=str)
def test_tie_count_gives_the_same_maximum_as_max2(policy, d):
    """The count form of the tie test (after the max) against the (max, second max) form, on rows whose maxima
    are tied 1, 2 or 3 times, with a second key ε/2 and 2ε below a single maximum in two rows: P̄ bit for bit, in
    sub and FMA mode, with α a power of two (the count reads the raw products) and not."""
    m = 16
    q, k, tied = probe_rows(d, m, 64, seed=3, ties=lambda i: 1 + i % 3, step=0.25)
    alpha = d ** -0.5
    k[1, 0] = 5.0 - 0.5e-3 / (3.0 * alpha)          # row 0 (one tie): a second key ε/2 below its maximum
    k[13, 3] = 5.0 - 2e-3 / (3.75 * alpha)          # row 3 (one tie): a second key 2ε below
    q, k = q.to(DEVICE), k.to(DEVICE)
    a = kernels.probe_pbar(q, k, policy)
    b = _probe_with_tie(q, k, policy, 1)
    assert torch.equal(a, b)
    if policy.sub == "sub":                          # both outcomes of the test are seen
        assert (a[tied] < 1).any() and (a[tied] == 1).any()


def _probe_with_tie(q, k, policy, tie):
    """`kernels.probe_pbar` with the tie test's form TIE (1: the count)."""
    kp = kernels.kernel_policy(policy)
    (M, D), N = q.shape, k.shape[0]
    scale = 1.0 / math.sqrt(D)
    p = torch.full((M, N), float("nan"), device=q.device, dtype=torch.float32)
    extra = {} if kernels.interpreted() else {"enable_fp_fusion": kp.sub_fma}
    kernels.fwd._probe_pbar[(1,)](q, k, p, q.stride(0), k.stride(0), p.stride(0), M, N, scale, kp.eps, kp.beta,
                                   *kernels.policy.shift_args(kp, 1.0), HEAD_DIM=D, BLOCK_M=64, BLOCK_N=64,
                                   MATMUL=kp.matmul, QK_OUT=kp.qk_out, SCORES=kp.scores, EXP_IN=kp.exp_in,
                                   PBAR=kp.pbar, ACC=kp.acc, SUB_FMA=kp.sub_fma, FIX=kp.fix_mode,
                                   DOT_PREC=kp.dot_prec, TIE=tie, POW2=math.frexp(scale)[0] == 0.5, **extra)
    return p


@pytest.mark.parametrize("causal", [True, False])
def test_atomic_backward_matches_the_split_one(causal):
    """The atomic backward (one kernel, dQ summed with FP32 atomics) computes dK and dV as the split one does, bit
    for bit, and dQ up to the order of its FP32 additions; both against float64 truth."""
    q, k, v, do = inputs(1, 2, 150, 64, seed=31)
    fn = lambda t: (lambda a, b, c: kernels.flash_attention(a, b, c, FP32, causal=causal, tuning=t))  # noqa: E731
    split = run_with_grads(fn(kernels.Tuning()), q, k, v, do)
    atomic = run_with_grads(fn(kernels.Tuning(bwd="atomic")), q, k, v, do)
    ref = truth_with_grads(q, k, v, do, causal)
    assert torch.equal(split[0], atomic[0]) and torch.equal(split[2], atomic[2]) and torch.equal(split[3], atomic[3])
    assert rel(atomic[1], split[1].double()) < 1e-6
    assert all(rel(x, r) < 2e-5 for x, r in zip(atomic, ref))


def test_ftz_exp_is_close_and_refusals_are_clear():
    """The backward's FTZ exp (exp2 of x·log2 e) changes P only in its last bits here (NumPy's exp2 and exp in the
    interpreter; on the GPU the same MUFU.EX2), so the gradients stay within FP32 noise of the default's. The
    atomic backward refuses a 16-bit grad_acc, and bad tunings name the field."""
    q, k, v, do = inputs(1, 2, 96, 64, seed=33)
    fn = lambda t: (lambda a, b, c: kernels.flash_attention(a, b, c, FP32, tuning=t))  # noqa: E731
    base = run_with_grads(fn(kernels.Tuning()), q, k, v, do)
    ftz = run_with_grads(fn(kernels.Tuning(ftz_exp=True)), q, k, v, do)
    assert torch.equal(base[0], ftz[0]) and all(rel(x, y.double()) < 1e-6 for x, y in zip(ftz[1:], base[1:]))
    with pytest.raises(ValueError, match="grad_acc='fp32'"):
        kernels.flash_attention(q, k, v, PAPER_BF16.replace(matmul="fp32"), tuning=kernels.Tuning(bwd="atomic"))
    with pytest.raises(ValueError, match=r"Tuning.order must be one of \['head', 'lpt'\]"):
        kernels.Tuning(order="random")
    with pytest.raises(ValueError, match="Tuning.tma must be True, False or 'bwd'"):
        kernels.Tuning(tma=1)
    with pytest.raises(TypeError, match="kernels.Tuning"):
        kernels.flash_attention(q, k, v, FP32, tuning="tma")
    assert kernels.Tuning.parse(str(kernels.ALL_LEVERS)) == kernels.ALL_LEVERS
    assert str(kernels.Tuning()) == "default" and kernels.Tuning.parse("default") == kernels.Tuning()
    with pytest.raises(ValueError, match="unknown Tuning key 'fast'"):
        kernels.Tuning.parse("fast=True")


def test_autotune_spaces_prune_to_their_configs(monkeypatch):
    """The autotune spaces and prune steps as on the GPU (the interpreter has one config and skips them): space "v1"
    holds exactly the configs measured until 2026-12-01 and "sm90" those plus its own, in every kernel; the forward
    keeps 256-row tiles only at head dim ≤ 64, FP32 dots get one small config, and LPFAIL_KERNELS_AUTOTUNE=0 takes
    the space's first config (v1's first, in both spaces). One autotuner per space, around one JIT function."""
    from lpfail.kernels import bwd, fwd

    monkeypatch.setattr(fwd, "INTERPRET", False)
    monkeypatch.setattr(bwd, "INTERPRET", False)
    monkeypatch.setenv(fwd.TUNE_ENV, "1")
    tables = {"fwd": (fwd.FWD_SPACES, fwd._fwd_configs, fwd._fwd_prune),
              "dq": (bwd.DQ_SPACES, bwd._q_side_configs, bwd._fp32_prune(bwd._DQ_SMALL)),
              "dkdv": (bwd.DKDV_SPACES, bwd._kv_side_configs, bwd._fp32_prune(bwd._DKDV_SMALL))}
    bf16 = dict(BLOCK_N=64, MATMUL=kernels.TL["bf16"], PV_DT=kernels.TL["bf16"], DS_DT=kernels.TL["bf16"])
    for kern, (table, configs, prune) in tables.items():
        v1, sm90 = configs("v1"), configs("sm90")
        assert [fwd._config_key(c) for c in v1] == [fwd._config_key(fwd._config(*t)) for t in table["v1"]]
        assert len(sm90) == len(table["v1"]) + len(table["sm90"]) and sm90[:len(v1)] == v1
        assert prune(sm90, {}, HEAD_DIM=64, **bf16) == sm90
    wide = fwd._fwd_prune(fwd._fwd_configs("sm90"), {}, HEAD_DIM=128, **bf16)
    assert all(c.kwargs["BLOCK_M"] <= 128 for c in wide) and len(wide) == len(fwd._fwd_configs("sm90")) - 2
    fp32 = fwd._fwd_prune(fwd._fwd_configs("sm90"), {}, HEAD_DIM=128, **{**bf16, "MATMUL": kernels.TL["fp32"]})
    assert len(fp32) == 1 and fp32[0].num_stages == 1
    monkeypatch.setenv(fwd.TUNE_ENV, "0")
    for kern, (table, configs, prune) in tables.items():
        (first,) = prune(configs("sm90"), {}, HEAD_DIM=64, **bf16)
        assert fwd._config_key(first) == fwd._config_key(fwd._config(*table["v1"][0]))
    assert fwd.FWD_TUNERS["v1"].fn is fwd.FWD_TUNERS["sm90"].fn is fwd._attn_fwd.fn
    assert bwd.DKDV_TUNERS[("sm90", True)].fn is bwd._bwd_dkdv.fn and bwd.DQ_TUNERS["sm90"].fn is bwd._bwd_dq.fn


def test_tie_auto_and_tma_bwd_pick_the_code_they_say():
    """Tuning(tie="auto") compiles the count form of the tie test at head dim ≤ 64 and max2 above (with a fix on the
    fast path only); Tuning(tma="bwd") turns the descriptors on in the backward's kernels and off in the forward."""
    fa2 = FA2_BF16.replace(matmul="fp32")                         # (the interpreter refuses BF16 dots)
    fix, robust = kernels.kernel_policy(fa2.with_fix()), kernels.kernel_policy(fa2.with_bounded_fix())
    auto = kernels.Tuning(tie="auto")
    for kp in (fix, robust):
        assert kernels.launcher._fwd_levers(kp, 0.125, True, auto, 64)["TIE"] == 1
        assert kernels.launcher._fwd_levers(kp, 128 ** -0.5, True, auto, 128)["TIE"] == 0
        assert kernels.launcher._fwd_levers(kp, 128 ** -0.5, True, kernels.Tuning(tie="count"), 128)["TIE"] == 1
    assert kernels.launcher._fwd_levers(kernels.kernel_policy(fa2), 0.125, True, auto, 64)["TIE"] == 0
    t = kernels.Tuning(tma="bwd")
    assert kernels.launcher._fwd_levers(fix, 0.125, True, t, 64)["TMA"] is False
    _, consts, _, _ = kernels.bwd_plan(256, 64, True, fix, 0.125, torch.bfloat16, torch.bfloat16, None, True, t)
    assert consts["kv"]["TMA"] is True and consts["dq"]["TMA"] is True
    assert kernels.Tuning.parse(str(t)) == t and kernels.Tuning.parse(str(kernels.NEXT_LEVERS)) == kernels.NEXT_LEVERS
    _, consts, _, _ = kernels.bwd_plan(256, 64, True, fix, 0.125, torch.bfloat16, torch.bfloat16, None, True,
                                       kernels.Tuning(bwd="fused", order="lpt"))
    assert "ORDER" not in consts["fused"] and "DQ_ATOMIC" not in consts["fused"] and "MODE" not in consts["fused"]


def test_fused_backward_spaces(monkeypatch):
    """The fused backward's autotune spaces as on the GPU: its first config has the split kernels' first tiles (so
    LPFAIL_KERNELS_AUTOTUNE=0 gives the split's bits), "sm90" is "v1" plus its additions, FP32 dots get the small
    config with the split kernels' small tiles, and both spaces wrap one JIT function."""
    from lpfail.kernels import bwd, fwd

    monkeypatch.setattr(bwd, "INTERPRET", False)
    monkeypatch.setenv(fwd.TUNE_ENV, "1")
    v1, sm90 = bwd._fused_configs("v1"), bwd._fused_configs("sm90")
    assert len(sm90) == len(bwd.FUSED_SPACES["v1"]) + len(bwd.FUSED_SPACES["sm90"]) and sm90[:len(v1)] == v1
    first, kv, dq = v1[0], fwd._config(*bwd.DKDV_SPACES["v1"][0]), fwd._config(*bwd.DQ_SPACES["v1"][0])
    assert (first.kwargs["BLOCK_M1"], first.kwargs["BLOCK_N1"]) == (kv.kwargs["BLOCK_M"], kv.kwargs["BLOCK_N"])
    assert (first.kwargs["BLOCK_N1"], first.kwargs["BLOCK_N2"]) == (dq.kwargs["BLOCK_M"], dq.kwargs["BLOCK_N"])
    assert first.num_warps == kv.num_warps == dq.num_warps and first.num_stages == kv.num_stages == dq.num_stages
    small = bwd._FUSED_SMALL.kwargs
    assert (small["BLOCK_M1"], small["BLOCK_N1"]) == (bwd._DKDV_SMALL.kwargs["BLOCK_M"], bwd._DKDV_SMALL.kwargs["BLOCK_N"])
    assert (small["BLOCK_N1"], small["BLOCK_N2"]) == (bwd._DQ_SMALL.kwargs["BLOCK_M"], bwd._DQ_SMALL.kwargs["BLOCK_N"])
    prune = bwd._fp32_prune(bwd._FUSED_SMALL)
    bf16 = dict(MATMUL=kernels.TL["bf16"], PV_DT=kernels.TL["bf16"], DS_DT=kernels.TL["bf16"])
    assert prune(sm90, {}, **bf16) == sm90 and prune(sm90, {}, **{**bf16, "MATMUL": kernels.TL["fp32"]}) == [
        bwd._FUSED_SMALL]
    assert bwd.FUSED_TUNERS["v1"].fn is bwd.FUSED_TUNERS["sm90"].fn


# -- the normaliser's source (l_from, issue 25) ------------------------------------------------------------------
@pytest.mark.parametrize("block_k", [32, None], ids=["one tile", "two-pass"])
def test_l_from_pbar_kernel_matches_the_reference(block_k):
    """ℓ summed from P̄ (BF16 cast point on the FP32 path): the kernel's O is the reference's to FP32 summation
    order, ten times closer than the two sources of ℓ are to each other, in the fast path and in the two-pass one;
    and with V ≡ c it gives c to FP32 rounding where ℓ from P does not (the mismatch of numerator and normaliser
    that the knob removes)."""
    policy = FP32.replace(pbar="bf16", block_k=block_k, l_from="pbar")
    q, k, v, _ = inputs(1, 2, 100, 64, seed=35)
    q = q * 2
    o = kernels.flash_attention(q, k, v, policy)
    o_p = kernels.flash_attention(q, k, v, policy.replace(l_from="p"))
    if reference_attention is not None:
        r = reference_attention(q, k, v, policy, causal=True)
        impl, knob = rel(o, r.double()), rel(o, o_p.double())
        print(f"block_k={block_k}: kernel vs reference {impl:.1e}; ℓ from P̄ vs from P {knob:.1e}")
        assert impl < 0.1 * knob
    c = torch.full_like(v, 1.5)
    dev = {lf: (kernels.flash_attention(q, k, c, policy.replace(l_from=lf)).double() - 1.5).abs().max().item()
           for lf in ("p", "pbar")}
    print(f"block_k={block_k}: max |O − c|: ℓ from P {dev['p']:.1e}, from P̄ {dev['pbar']:.1e}")
    assert dev["pbar"] < 1e-6 < 1e-4 < dev["p"]


# -- GPU: the levers and ℓ from P̄ in BF16 ---------------------------------------------------------------------------
GPU_LEVERS = [kernels.Tuning(tma=True), kernels.Tuning(order="lpt"), kernels.Tuning(tie="count"),
              kernels.Tuning(bwd="atomic"), kernels.Tuning(ftz_exp=True), kernels.Tuning(space="sm90"),
              kernels.ALL_LEVERS, kernels.Tuning(bwd="fused"), kernels.Tuning(tie="auto"), kernels.Tuning(tma="bwd"),
              kernels.NEXT_LEVERS]
#: levers that must keep every bit on the card under LPFAIL_KERNELS_AUTOTUNE=0 (the fused backward's first config has
#: the split kernels' first tiles, so it runs their code on the same tiles)
GPU_EXACT = [kernels.Tuning(tma=True), kernels.Tuning(order="lpt"), kernels.Tuning(tie="count"),
             kernels.Tuning(bwd="fused"), kernels.Tuning(tie="auto"), kernels.Tuning(tma="bwd")]


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", GPU_LEVERS, ids=str)
@pytest.mark.parametrize("policy", [FA2_BF16.with_fix(), FA2_BF16.replace(sub="fma").with_bounded_fix()],
                         ids=lambda p: p.name)
def test_bf16_levers_keep_the_forward_bits_and_the_gradients(policy, tuning):
    """BF16 on the card, tied rows: every lever gives the default tuning's O bit for bit (LPFAIL_KERNELS_AUTOTUNE=0
    in the GPU runs: the same first config) and gradients within BF16 noise of it; the atomic backward's dK and dV
    bit for bit too; all within the reference rule against float64."""
    q, k, v, do = tied_rows(n=1000)
    q, k, v, do = (t.to(torch.bfloat16) for t in (q, k, v, do))
    fn = lambda t: (lambda a, b, c: kernels.flash_attention(a, b, c, policy, tuning=t))  # noqa: E731
    base, got = run_with_grads(fn(kernels.Tuning()), q, k, v, do), run_with_grads(fn(tuning), q, k, v, do)
    ref = truth_with_grads(q, k, v, do, True)
    exact = tuning in GPU_EXACT
    print(f"{policy.name} {tuning}: " + ", ".join(f"{n} {rel(x, y.double()):.1e}"
                                                 for n, x, y in zip("O dQ dK dV".split(), got, base)))
    assert torch.equal(got[0], base[0])
    for name, x, y, r in zip("O dQ dK dV".split(), got, base, ref):
        assert torch.equal(x, y) if exact else rel(x, y.double()) < 1e-2, name
        assert rel(x, r) <= 2 * rel(y, r) + 1e-3, name
    if tuning.bwd == "atomic":
        assert torch.equal(got[2], base[2]) and torch.equal(got[3], base[3])


@pytest.mark.gpu
@pytest.mark.skipif(reference_attention is None, reason="lpfail.attention (the reference) is not there yet")
@pytest.mark.parametrize("policy,tuning", [(PAPER_BF16, kernels.Tuning(tma=True, order="lpt", tie="count")),
                                           (PAPER_BF16.with_fix(), kernels.Tuning(tma=True, order="lpt", tie="count")),
                                           (FA2_BF16.replace(l_from="pbar"), kernels.Tuning()),
                                           (FA2_BF16.replace(sub="fma", l_from="pbar"), kernels.ALL_LEVERS)],
                         ids=lambda x: str(x) if isinstance(x, kernels.Tuning) else x.name)
def test_bf16_forward_bits_with_levers_and_l_from_pbar(policy, tuning):
    """The bit-faithful emulation keeps its bits under the levers (PAPER_BF16's two-pass path through TMA), and ℓ
    from P̄ agrees with the reference as FA2_BF16 does (≈ 0.15 % of O's bits: the fused P̄V accumulation)."""
    q, k, v, _ = inputs(2, 4, 1024, 64, dtype=torch.bfloat16, seed=1)
    o = kernels.flash_attention(q, k, v, policy, tuning=tuning)
    r = reference_attention(q, k, v, policy, causal=True)
    mismatch = (o.view(torch.int16) != r.to(o.dtype).view(torch.int16)).float().mean().item()
    print(f"{policy.name} {tuning}: O bit mismatch vs lpfail.attention {mismatch:.3%}")
    assert mismatch < (1e-4 if policy.pbar == policy.acc == "bf16" else 0.05)


def test_deterministic_algorithms_replace_the_atomic_backward_with_the_fused_one(monkeypatch):
    """Under torch.use_deterministic_algorithms(True) a call with the atomic backward runs the fused one (the same
    tiles without atomics); other tunings and the default mode are left as given."""
    atomic = kernels.Tuning(bwd="atomic", space="sm90")
    assert kernels.deterministic(atomic) is atomic
    seen = []
    real = kernels.FlashAttention.apply
    monkeypatch.setattr(kernels.FlashAttention, "apply", lambda *a: seen.append(a[3][3]) or real(*a))
    q, k, v, do = inputs(1, 1, 40, 16, seed=5)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert kernels.deterministic(atomic) == kernels.Tuning(bwd="fused", space="sm90")
        assert kernels.deterministic(kernels.Tuning(bwd="split")) == kernels.Tuning(bwd="split")
        run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, FP32, tuning=atomic), q, k, v, do)
    finally:
        torch.use_deterministic_algorithms(was)
    run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, FP32, tuning=atomic), q, k, v, do)
    assert [t.bwd for t in seen] == ["fused", "atomic"]
