"""Tests of the Triton backward (`kernels/bwd.py`) against the reference's bits, under a 16-bit `grad_acc`.

The reference (`lpfail.attention`) rounds the gradient accumulators once per *policy* tile: dK_j and dV_j get
one rounded product per query tile of `block_q` rows, dQ one per key tile of `block_k` keys. The kernels
walk smaller hardware tiles and must round at the same places, not after every hardware tile. Each test feeds
the kernels' backward (`kernels.launch_backward`, what the autograd function calls) the reference's own O and L, so
only the backward is compared, and counts the elements of dQ, dK and dV whose bits differ.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set here before `kernels` is
imported, as in tests/test_kernels.py), where only FP32 dots work: the CPU tests use PAPER_BF16 with
matmul="fp32" (its BF16 cast points pbar, ds, dp, grad_acc, … are conversions, which the interpreter does
right). The test marked `gpu` checks PAPER_BF16 itself on the GPU. Run `pytest -s` to see the rates.
"""
from __future__ import annotations

import pytest
import torch

from lpfail.precision import FP32, PAPER_BF16
from tests.kernel_env import CUDA, DEVICE, load_kernels

kernels = load_kernels()
from lpfail.kernels import bwd  # noqa: E402

from lpfail.attention import attention, flash_backward, flash_forward  # noqa: E402

SCALE = 0.125  # 1/√64, exact: the kernel and the reference multiply by the same α
PAPER_FP32_DOTS = PAPER_BF16.replace(matmul="fp32")  # the paper's casts, FP32 dot operands (interpreter)
interpreter_only = pytest.mark.skipif(CUDA, reason="rates measured under the CPU interpreter (NumPy's dots and "
                                      "exp); on a GPU the `gpu` test checks PAPER_BF16 itself")


def inputs(n, d=64, batch=1, heads=1, dtype=torch.float32, seed=0):
    """q, k, v, dO of shape (batch, heads, n, d), standard normal."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return tuple(torch.randn(batch, heads, n, d, generator=g).to(device=DEVICE, dtype=dtype) for _ in range(4))


def reference_forward(policy, n, causal, d=64, batch=1, heads=1, dtype=torch.float32, seed=0):
    """The inputs and the reference's forward of them (O, and L as the kernels store it: (B, H, N) FP32)."""
    q, k, v, do = inputs(n, d, batch, heads, dtype, seed)
    fwd = flash_forward(q, k, v, policy, causal=causal, scale=d ** -0.5)
    return (q, k, v, do), fwd.o, fwd.lse


def backward_pair(policy, n, causal, **shape):
    """(dq, dk, dv) of the kernels and of the reference, both from the reference's forward (O and L)."""
    (q, k, v, do), o, lse = reference_forward(policy, n, causal, **shape)
    scale = q.shape[-1] ** -0.5
    ref = flash_backward(q, k, v, o, lse, do, policy, causal=causal, scale=scale)
    got = kernels.launch_backward(do, q, k, v, o, lse.squeeze(-1).contiguous(), kernels.kernel_policy(policy), causal,
                                  scale)
    return got, ref


def bit_mismatch(x, ref):
    """Fraction of elements whose bit patterns differ (so −0 ≠ +0, and NaN counts unless bit-equal)."""
    assert x.dtype == ref.dtype and x.shape == ref.shape
    ints = {2: torch.int16, 4: torch.int32}[x.element_size()]
    return (x.view(ints) != ref.view(ints)).float().mean().item()


def row_diff(x, ref):
    """Largest |x − ref| relative to the largest |ref| of its row (a gradient row: one query or one key)."""
    return ((x.float() - ref.float()).abs() / ref.float().abs().amax(-1, keepdim=True)).max().item()


# Measured (this file's inputs, TRITON_INTERPRET=1, torch 2.13 CPU, triton 3.6): with the kernels rounding after
# every hardware tile (before the policy-tile accumulation) 56–76% of the elements of each gradient differed
# from the reference, in every case below. With it, 0.005–0.14%: dQ ≤ 0.047%, dK ≤ 0.023%, dV ≤ 0.14%.
# What is left is FP32 order, never a misplaced rounding: inside a policy tile the kernel sums its chunked dots
# (NumPy matmuls chained) where the reference makes one matmul, and NumPy's float32 exp differs from torch's
# in the last bit for ~40% of arguments, which moves P (so P̄ and dS) and weighs on dV most (with torch's exp
# swapped for NumPy's in the reference, dV's rate fell to ≈ 0.01%). The limits are 2–4× the largest measured
# rate and over 100× under the rate of per-hardware-tile rounding; a flipped rounding moves an element by a few
# BF16 ulps of its row's largest entry (≤ 1.2e-2 of it measured), so ROW_DIFF would still catch one wrong row
# (a missing or misplaced partial product is of the order of the row's entries).
# Re-measured 2026-12-02 under the pinned CPU numerics `make test` sets (ATEN_CPU_CAPABILITY=default: ATen's
# portable exp and reductions, another FP32 order than the AVX2 ones measured above): dQ ≤ 0.141 %, dK ≤ 0.086 %,
# dV ≤ 0.177 % (block 512×None, N = 600, full), which the old limits of 0.1 % for dQ and dK did not admit. The
# limits below are again 2.8–3.5× the largest rate and still over 100× under per-hardware-tile rounding's.
MISMATCH_LIMIT = {"dq": 4e-3, "dk": 3e-3, "dv": 5e-3}
ROW_DIFF = 2.0 ** -5


def check_bits(got, ref, label):
    rates = {name: bit_mismatch(x, r) for name, x, r in zip(("dq", "dk", "dv"), got, ref)}
    rows = {name: row_diff(x, r) for name, x, r in zip(("dq", "dk", "dv"), got, ref)}
    print(f"{label}: bits differ in " + ", ".join(f"{n} {v:.4%}" for n, v in rates.items())
          + "; max diff / row max " + ", ".join(f"{n} {v:.1e}" for n, v in rows.items()))
    for name in rates:
        assert rates[name] <= MISMATCH_LIMIT[name], (name, rates[name])
        assert rows[name] <= ROW_DIFF, (name, rows[name])


@interpreter_only
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_grads_match_reference_bits_paper_tiles(causal):
    """PAPER_BF16's 512×512 tiles (FP32 dots), N = 1100: two whole 512-blocks and a partial one, not a multiple
    of any hardware tile. Before: dQ, dK, dV differed in 63.4%, 66.5%, 66.8% (causal) and 76.2%, 75.5%, 75.4%
    (full) of their elements. After: 0.017%, 0.006%, 0.094% (causal) and 0.013%, 0.019%, 0.088% (full)."""
    got, ref = backward_pair(PAPER_FP32_DOTS, 1100, causal)
    check_bits(got, ref, f"PAPER_BF16 (fp32 dots) n=1100 causal={causal}")


@interpreter_only
@pytest.mark.parametrize("policy,n,causal", [
    (PAPER_FP32_DOTS.replace(block_q=256), 600, True),               # dK, dV per 256 queries, dQ per 512 keys
    (PAPER_FP32_DOTS.replace(block_q=256), 600, False),
    (PAPER_FP32_DOTS.replace(block_k=None), 600, False),             # dQ: one key block over the whole row
    (PAPER_FP32_DOTS.replace(block_k=None), 600, True),
    (PAPER_FP32_DOTS.replace(block_q=None), 600, True),              # dK, dV: one query block over the sequence
    (PAPER_FP32_DOTS.replace(block_q=128, block_k=64), 576, False),  # FA2's tiles; N a multiple of every tile
], ids=lambda x: (f"{x.block_q}x{x.block_k}" if hasattr(x, "block_q") else str(x)))
def test_grads_match_reference_bits_other_tiles(policy, n, causal):
    """Query and key blocks of different sizes, and one block over the row: before, 56–69% of the elements of
    each gradient differed (56–59% causal, 68–69% full); after, 0.005–0.14%."""
    got, ref = backward_pair(policy, n, causal)
    check_bits(got, ref, f"block {policy.block_q}x{policy.block_k} n={n} causal={causal}")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fp32_grad_acc_ignores_the_policy_tiles(causal):
    """With an FP32 grad_acc the kernels add every hardware tile's product unrounded, whatever the policy's
    blocks: from the same O and L, policies that differ only in their tiles give bit-identical gradients
    (and with a BF16 grad_acc they do not: the blocks reach the kernels)."""
    (q, k, v, do), o, lse = reference_forward(FP32, 203, causal, seed=3)
    lse = lse.squeeze(-1).contiguous()

    def grads(policy):
        return kernels.launch_backward(do, q, k, v, o, lse, kernels.kernel_policy(policy), causal, SCALE)

    tiles = dict(block_q=64, block_k=None)
    assert all(bit_mismatch(x, y) == 0 for x, y in zip(grads(FP32), grads(FP32.replace(**tiles))))
    bf16 = FP32.replace(grad_acc="bf16")
    assert any(bit_mismatch(x, y) > 0 for x, y in zip(grads(bf16), grads(bf16.replace(**tiles))))


# -- the policy's blocks must be whole hardware tiles (16-bit grad_acc only) -----------------------------------
@pytest.mark.parametrize("knob,value", [("block_q", 96), ("block_q", 32), ("block_k", 32), ("block_k", 16)])
def test_grad_acc_blocks_must_be_whole_tiles(knob, value):
    with pytest.raises(ValueError, match=f"{knob}={value}.*multiple of {bwd.GRAD_TILE}"):
        kernels.kernel_policy(PAPER_FP32_DOTS.replace(**{knob: value}))
    kernels.kernel_policy(PAPER_FP32_DOTS.replace(**{knob: value}, grad_acc="fp32"))  # FP32: any tile will do


def test_kernel_policy_blocks():
    kp = kernels.kernel_policy(PAPER_FP32_DOTS.replace(block_q=256))
    assert (kp.query_block, kp.key_block) == (256, 512)
    kp = kernels.kernel_policy(PAPER_FP32_DOTS.replace(block_q=None, block_k=None))
    assert (kp.query_block, kp.key_block) == (0, 0)


# -- GPU: PAPER_BF16 itself ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n,d", [(1100, 64), (517, 128)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_bf16_grads_agree_with_the_reference_bits(n, d, causal, record_property):
    """PAPER_BF16 on the GPU, BF16 inputs, the kernels' backward from the reference's O and L: dQ, dK and dV
    agree bit for bit except where FP32 sums taken in a different order (wgmma tiles vs cuBLAS) or Triton's
    exp vs torch's land on different sides of a BF16 rounding. Rounding per hardware tile instead made 56–76%
    of the elements differ on the CPU; 5% (the forward's limit in tests/test_kernels.py) separates the two.
    Also records the end-to-end rates (kernel forward, then backward, vs `attention`), which include the
    forward's own O differences through δ; those are printed, not checked."""
    shape = dict(d=d, batch=2, heads=4, dtype=torch.bfloat16, seed=n)
    got, ref = backward_pair(PAPER_BF16, n, causal, **shape)
    rates = {name: bit_mismatch(x, r) for name, x, r in zip(("dq", "dk", "dv"), got, ref)}

    q, k, v, do = inputs(n, **shape)
    grads = []
    for fn in (kernels.flash_attention, attention):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, PAPER_BF16, causal=causal, scale=d ** -0.5).backward(do)
        grads.append([t.grad for t in leaves])
    e2e = {name: bit_mismatch(x, r) for name, x, r in zip(("dq", "dk", "dv"), *grads)}
    for name in rates:
        record_property(f"bits_differ_{name}", rates[name])
        record_property(f"bits_differ_end_to_end_{name}", e2e[name])
    print(f"PAPER_BF16 n={n} d={d} causal={causal}: bits differ (backward only) "
          + ", ".join(f"{k} {v:.3%}" for k, v in rates.items()) + "; end to end "
          + ", ".join(f"{k} {v:.3%}" for k, v in e2e.items()))
    assert all(torch.isfinite(x).all() for x in got)
    for name, rate in rates.items():
        assert rate < 0.05, (name, rate)


# -- the fused backward (kernels.Tuning(bwd="fused"), issue 25): the split's two halves in one launch ---------------
@interpreter_only
@pytest.mark.parametrize("policy,n,causal", [
    (PAPER_FP32_DOTS.replace(block_q=128, block_k=64), 200, True),   # 16-bit grad_acc: the policy tiles' roundings
    (PAPER_FP32_DOTS.replace(block_q=128, block_k=64), 200, False),
    (FP32.replace(delta="dP.P"), 150, True),                         # δ from its own pass over K, V first
], ids=lambda x: (f"{x.grad_acc}/{x.delta}" if hasattr(x, "grad_acc") else str(x)))
def test_fused_backward_gives_the_split_bits(policy, n, causal):
    """Program j of the fused backward runs the split kernels' code for key block j and then for query block j, with
    the split's interpreter tiles: dQ, dK, dV bit for bit as the split backward gives them (a 16-bit grad_acc
    rounded once per policy tile, a partial last tile, causal and full, δ from dP ∘ P), and one launch fewer."""
    (q, k, v, do), o, lse = reference_forward(policy, n, causal)
    kp, lse = kernels.kernel_policy(policy), lse.squeeze(-1).contiguous()
    split = kernels.launch_backward(do, q, k, v, o, lse, kp, causal, 0.125, kernels.Tuning())
    launches, real = [], kernels.launcher.launch
    kernels.launcher.launch = lambda kernel, *a, **kw: (launches.append(kernel), real(kernel, *a, **kw))[1]
    try:
        fused = kernels.launch_backward(do, q, k, v, o, lse, kp, causal, 0.125, kernels.Tuning(bwd="fused"))
    finally:
        kernels.launcher.launch = real
    for name, x, y in zip(("dQ", "dK", "dV"), fused, split):
        assert x.dtype == y.dtype and bit_mismatch(x, y) == 0, name
    assert launches[-1] is bwd.FUSED_TUNERS["v1"] and len(launches) == 2
