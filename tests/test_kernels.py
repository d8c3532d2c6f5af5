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
    runs = []
    for raw in (True, False):
        monkeypatch.setattr(kernels, "_raw_units", lambda kp, scale, raw=raw: raw)
        o, lse = kernels._forward(q, k, v, kp, True, 0.125)
        runs.append((o.cpu(), lse.cpu()))
        # the backward's P = exp(S − L) as one FMA on round(QKᵀ), from the same O and L for both
        grads = kernels._backward(do, q, k, v, runs[0][0].to(DEVICE), runs[0][1].to(DEVICE), kp, True, 0.125)
        runs[-1] += tuple(g.cpu() for g in grads)
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
    """After the first launch for a shape and policy, `kernels._launch` runs the autotuner's pick directly;
    the forward and all three gradients must come out bit for bit as from the first (autotuned) launch."""
    q, k, v, do = inputs(1, 2, 150, 64, seed=21)
    kernels._PICKS.clear()
    kernels._DIRECT.clear()
    monkeypatch.setenv(kernels.DIRECT_ENV, "1")   # the direct launch (the default since the GPU check)
    first = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=True), q, k, v, do)
    n_picks = len(kernels._PICKS)
    second = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=True), q, k, v, do)
    assert n_picks >= 3 and len(kernels._PICKS) == n_picks          # fwd, dK/dV, dQ (+ δ pass): no new picks
    # the third launch calls the compiled kernels directly (on CUDA; the interpreter has none: the JIT path again)
    third = run_with_grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=True), q, k, v, do)
    assert len(kernels._DIRECT) == (n_picks if CUDA else 0)
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
    monkeypatch.setattr(kernels, "interpreted", lambda: False)
    q = torch.randn(1, 1, 16, 64)
    with pytest.raises(RuntimeError, match="CUDA GPU.*lpfail.attention"):
        kernels.flash_attention(q, q, q, FP32)


def test_bad_shapes():
    q = torch.randn(1, 1, 16, 64, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        kernels.flash_attention(q[..., :48], q[..., :48], q[..., :48], FP32)
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
    """The direct launch of a compiled kernel (`kernels._launch` from the third launch on, CUDA only) must hand
    the launcher what Triton's JIT would: its binder's bound arguments in signature order (built here for an
    sm_90 target from the forward kernel's source), the grid and the current stream. Checked on the CPU with the
    arguments `_forward` really passes; refused for a misaligned tensor, LPFAIL_KERNELS_DIRECT=0 or a binding
    whose order differs. (On the GPU, the second-launch test and tools/gpu_overhead.py check the bits.)"""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction, create_function_from_signature

    captured = []
    monkeypatch.setattr(kernels, "_launch", lambda kernel, grid, key, *a, **kw: captured.append((grid, key, a, kw)))
    q, k, v, _ = inputs(2, 3, 100, 64, seed=5)
    kernels._forward(q, k, v, kernels.kernel_policy(FP32.with_fix()), True, 0.125)
    grid, key, args, kwargs = captured[0]
    jit = JITFunction(getattr(kernels._fwd._attn_fwd.fn, "fn", kernels._fwd._attn_fwd.fn))
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    jit.device_caches[0] = ({}, {}, None, backend, binder)
    meta = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3}
    kwargs = {**kwargs, "enable_fp_fusion": False, **meta}
    monkeypatch.setattr(kernels._fwd, "INTERPRET", False)
    monkeypatch.setattr(driver, "_active", _FakeDriver())
    compiled = _FakeCompiled()
    monkeypatch.setenv(kernels.DIRECT_ENV, "0")
    assert kernels._direct_entry(jit, compiled, args, kwargs, key) is None      # switched off
    monkeypatch.delenv(kernels.DIRECT_ENV, raising=False)
    entry = kernels._direct_entry(jit, compiled, args, kwargs, key)             # on by default (GPU-checked)
    assert entry is not None
    monkeypatch.undo()   # the real _launch again (and the driver, the interpreter flag, the switch)
    monkeypatch.setattr(driver, "_active", _FakeDriver())
    monkeypatch.setitem(kernels._DIRECT, ("kernel", key), entry)
    kernels._launch("kernel", grid, key, *args, **kwargs)
    (call,) = compiled.calls
    bound = list(binder(*args, **kwargs)[0].values())
    assert call[:9] == (2, 6, 1, 1234, "fn", ("meta",), None, triton.knobs.runtime.launch_enter_hook,
                        triton.knobs.runtime.launch_exit_hook)
    assert len(call[9:]) == len(bound) == len(jit.params)
    assert all(a is b for a, b in zip(call[9:], bound))
    # refusals: a misaligned tensor, the switch, a binder whose bound order is not args then constexprs
    monkeypatch.setattr(kernels._fwd, "INTERPRET", False)
    monkeypatch.setenv(kernels.DIRECT_ENV, "1")
    bad = (q.flatten()[1:1 + q.numel() - 8].view(-1),) + args[1:]
    assert kernels._direct_entry(jit, compiled, bad, kwargs, key) is None
    monkeypatch.setenv(kernels.DIRECT_ENV, "0")
    assert kernels._direct_entry(jit, compiled, args, kwargs, key) is None
    monkeypatch.setenv(kernels.DIRECT_ENV, "1")
    jit.device_caches[0] = ({}, {}, None, backend, lambda *a, **kw: ({"x": 0, **dict(enumerate(a))}, None, None))
    assert kernels._direct_entry(jit, compiled, args, kwargs, key) is None
