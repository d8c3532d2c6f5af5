"""Stochastic rounding: `lpfail.bf16.round_stochastic` and the attention's output path under
``Precision(rounding="sr")`` — the control of the paper's claim that the rounding error harms because it is
biased (same 8-bit significand, no bias)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import lpfail.bf16 as bf16
from lpfail.experiments import rounding
from lpfail.attention import attention, flash_forward, forward_from_scores, naive_attention
from lpfail.bf16 import BF16_MAX, next_down, next_up, round_bf16, round_stochastic
from lpfail.precision import FA2_BF16, PAPER_BF16

PAIRS = [(torch.float32, torch.bfloat16), (torch.float64, torch.bfloat16),
         (torch.float32, torch.float16), (torch.float64, torch.float16)]
N_DRAWS = 100_000


# ---------------------------------------------------------------------------------------------------
# exact neighbours, computed independently of round_stochastic
# ---------------------------------------------------------------------------------------------------
def neighbours(x: float, dtype: torch.dtype) -> tuple[float, float]:
    """(lo, hi): the magnitude-ordered neighbours of x in `dtype`, lo toward zero, hi away (hi = lo if exact).
    Past the largest finite value, hi is ±inf (stochastic rounding overflows there)."""
    near = torch.tensor(x, dtype=torch.float64).to(dtype)
    if float(near) == x:
        return x, x
    if dtype == torch.bfloat16:
        up, down = next_up(float(near)), next_down(float(near))
    else:
        h = np.float16(float(near))
        with np.errstate(over="ignore"):                                     # next after 65504 is inf
            up, down = float(np.nextafter(h, np.float16(np.inf))), float(np.nextafter(h, np.float16(-np.inf)))
    if float(near) > x:
        lo, hi = down, float(near)
    else:
        lo, hi = float(near), up
    return (lo, hi) if x > 0 else (hi, lo)


def fp32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


ULP1 = 2.0 ** -7   # bf16 spacing in [1, 2)
#: FP32 values: just above / below powers of two, 1/4, 1/2, 3/4 of the way between bf16 neighbours,
#: negative values, tiny subnormals, values near the largest bf16.
BF16_VALUES = [
    1.0 + 2.0 ** -23, 2.0 - 2.0 ** -23, 0.5 + 2.0 ** -24, 2.0 ** 20 * (1 - 2.0 ** -24),   # around powers of two
    1.0 + ULP1 / 4, 1.0 + ULP1 / 2, 1.0 + 3 * ULP1 / 4, 3.0 + 2 * ULP1 / 4,               # ¼, ½, ¾ (3: ulp 2^-6)
    -(1.0 + ULP1 / 4), -(5.0 + 3 * 2.0 ** -5 / 4), fp32(-0.1), fp32(-7e-3),                          # negative
    2.0 ** -149, 3 * 2.0 ** -140, -(2.0 ** -134), 2.0 ** -126 + 2.0 ** -140,              # subnormal range
    fp32(1e-30), fp32(12345.678), fp32(-3.14159265),
    float(np.float32(BF16_MAX) - np.float32(2.0 ** 118)),                                  # just under max
    1.0, -2.40625, BF16_MAX,                                                               # exact: never move
]
FP16_VALUES = [
    1.0 + 2.0 ** -12, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -12, 2.0 - 2.0 ** -23, -(1.0 + 2.0 ** -12),
    2.0 ** -25, 3 * 2.0 ** -27, -(2.0 ** -24 + 2.0 ** -26), 2.0 ** -14 + 2.0 ** -30,       # fp16 subnormal range
    65504.0 - 8.0, fp32(-0.1), fp32(1000.3), 65504.0, 1.0,
]


def check_unbiased(values: list[float], in_dtype, out_dtype, n: int = N_DRAWS, seed: int = 0):
    """Each value: every draw is one of its two neighbours, and the mean over n draws equals the value
    within 5 σ of the exact Bernoulli spread σ = √(p(1−p)/n)·(hi − lo) (exactly equal when representable)."""
    x = torch.tensor(values, dtype=in_dtype)
    assert x.tolist() == values                                    # the test values are exact in the input
    g = torch.Generator().manual_seed(seed)
    r = round_stochastic(x.expand(n, -1).contiguous(), out_dtype, generator=g).double()   # (n, len(values))
    for j, v in enumerate(values):
        lo, hi = neighbours(v, out_dtype)
        col = r[:, j]
        is_hi = col == hi
        assert bool(((col == lo) | is_hi).all()), f"{v!r}: a result that is not a neighbour ({lo!r}, {hi!r})"
        if lo == hi:
            continue
        p = float((Fraction(v) - Fraction(lo)) / (Fraction(hi) - Fraction(lo)))
        k = int(is_hi.sum())
        err = (Fraction(lo) + Fraction(k, n) * (Fraction(hi) - Fraction(lo))) - Fraction(v)   # mean − v, exact
        sigma = math.sqrt(p * (1 - p) / n) * abs(hi - lo)
        assert abs(float(err)) <= 5 * sigma, f"{v!r} -> {out_dtype}: mean off by {float(err):.3g}, σ {sigma:.3g}"


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float64])
def test_unbiased_to_bf16(in_dtype):
    check_unbiased(BF16_VALUES, in_dtype, torch.bfloat16)


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float64])
def test_unbiased_to_fp16(in_dtype):
    check_unbiased(FP16_VALUES, in_dtype, torch.float16)


def test_unbiased_for_float64_values_between_float32_values():
    """fp64 input is not first rounded to fp32 (that would be a biased rounding of its own)."""
    values = [1.0 + ULP1 / 4 + 2.0 ** -40, -(3.0 + 2.0 ** -30), 2.0 ** -140 * (1 + 2.0 ** -30), 1e-300]
    check_unbiased(values, torch.float64, torch.bfloat16)
    check_unbiased([1.0 + 2.0 ** -12 + 2.0 ** -40, 1e-300], torch.float64, torch.float16)


def test_the_exact_comparison_with_few_random_bits(monkeypatch):
    """With 3 random bits per draw, p needs many rounds of draws; the mean must still be exact in law."""
    monkeypatch.setattr(bf16, "_SR_BITS", 3)
    check_unbiased([fp32(1.0 + 0.3 * 2.0 ** -10), fp32(-0.7), 1.0 + 1 / 3 * 2.0 ** -10], torch.float64,
                   torch.float16, n=50_000)
    check_unbiased([1.0 + ULP1 * 0.3, fp32(-0.1), -0.1], torch.float64, torch.bfloat16, n=50_000)


@pytest.mark.parametrize("in_dtype,out_dtype", PAIRS)
def test_random_values_round_to_a_neighbour(in_dtype, out_dtype):
    g = torch.Generator().manual_seed(1)
    n = 2000
    scale = torch.exp2(torch.randint(-40, 14, (n,), generator=g).double())
    x = (torch.randn(n, generator=g, dtype=torch.float64) * scale).to(in_dtype)
    r = round_stochastic(x, out_dtype, generator=g)
    assert r.dtype == out_dtype and r.shape == x.shape
    moved = 0
    for xi, ri in zip(x.tolist(), r.double().tolist()):
        lo, hi = neighbours(xi, out_dtype)
        assert ri in (lo, hi), (xi, ri, lo, hi)
        moved += ri == hi != lo
    assert 0 < moved < n


@pytest.mark.parametrize("in_dtype,out_dtype", PAIRS)
def test_zero_inf_nan_pass_through(in_dtype, out_dtype):
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan], dtype=in_dtype)
    for _ in range(20):
        r = round_stochastic(x, out_dtype)
        assert r[:4].tolist() == [0.0, 0.0, math.inf, -math.inf]
        assert torch.signbit(r[:2]).tolist() == [False, True]
        assert torch.isnan(r[4:]).all()


def test_fp32_to_bf16_is_the_truncation_trick():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(2))
    a = round_stochastic(x, generator=torch.Generator().manual_seed(5))
    b = round_bf16(x, "stochastic", generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_overflow_past_the_largest_value():
    """Above the largest finite value M the last spacing continues to ±inf: |x| in (M, M + spacing) is M or
    ±inf, inf with probability (|x| − M) / spacing."""
    g = torch.Generator().manual_seed(3)
    x = torch.full((40_000,), 65504.0 + 16.0, dtype=torch.float32)         # halfway from M to 65536
    r = round_stochastic(x, torch.float16, generator=g).double()
    assert set(r.unique().tolist()) == {65504.0, math.inf}
    assert abs((r == math.inf).double().mean().item() - 0.5) < 0.01
    half = BF16_MAX + 2.0 ** 119                                             # fp32, halfway from M to 2^128
    top = torch.tensor([half, -half]).expand(40_000, 2).contiguous()
    r = round_stochastic(top, generator=g).double()
    assert set(r[:, 0].unique().tolist()) == {BF16_MAX, math.inf}
    assert set(r[:, 1].unique().tolist()) == {-BF16_MAX, -math.inf}
    assert abs((r.abs() == math.inf).double().mean().item() - 0.5) < 0.01
    assert round_stochastic(torch.tensor([1e39, -1e300], dtype=torch.float64)).tolist() == [math.inf, -math.inf]


@pytest.mark.parametrize("in_dtype,out_dtype", PAIRS)
def test_seeded_reproducibility(in_dtype, out_dtype):
    x = torch.rand(5000, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(in_dtype) + 1
    bits = lambda r: r.view(torch.int16)  # noqa: E731
    a = round_stochastic(x, out_dtype, generator=torch.Generator().manual_seed(10))
    b = round_stochastic(x, out_dtype, generator=torch.Generator().manual_seed(10))
    c = round_stochastic(x, out_dtype, generator=torch.Generator().manual_seed(11))
    assert torch.equal(bits(a), bits(b)) and not torch.equal(bits(a), bits(c))
    torch.manual_seed(4)                                   # the default generator, and its saved state
    d = round_stochastic(x, out_dtype)
    state = torch.get_rng_state()
    e = round_stochastic(x, out_dtype)
    torch.manual_seed(4)
    assert torch.equal(bits(round_stochastic(x, out_dtype)), bits(d))
    torch.set_rng_state(state)                             # a checkpoint's rng_cpu resumes bit-exactly
    assert torch.equal(bits(round_stochastic(x, out_dtype)), bits(e))


def test_deterministic_algorithms_allowed():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x = torch.rand(1000, dtype=torch.float64)
        for dt in (torch.bfloat16, torch.float16):
            torch.manual_seed(0)
            a = round_stochastic(x, dt)
            torch.manual_seed(0)
            assert torch.equal(a.view(torch.int16), round_stochastic(x, dt).view(torch.int16))
    finally:
        torch.use_deterministic_algorithms(was)


def test_bad_inputs():
    with pytest.raises(TypeError, match="float32 or float64"):
        round_stochastic(torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="float32 or float64"):
        round_stochastic([1.0])
    with pytest.raises(ValueError, match="bfloat16 or torch.float16"):
        round_stochastic(torch.ones(3), torch.float32)


# ---------------------------------------------------------------------------------------------------
# the attention's output path under rounding="sr"
# ---------------------------------------------------------------------------------------------------
SR = PAPER_BF16.replace(rounding="sr")


def qkv(seed=0, t=200, d=32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, t, d, generator=g).to(torch.bfloat16) for _ in range(3)]


def test_rne_draws_no_random_numbers_and_is_the_plain_cast():
    """The default path never calls the random generator, and rne equals the policy from before the knob
    (the field's default): its results are the `.to(dtype)` casts of before, bit for bit."""
    q, k, v = qkv()
    state = torch.get_rng_state()
    for policy in (PAPER_BF16, FA2_BF16, PAPER_BF16.replace(block_k=64, rounding="rne")):
        flash_forward(q, k, v, policy)
    assert torch.equal(torch.get_rng_state(), state)


def test_sr_changes_only_the_output_path():
    q, k, v = qkv()
    policy = SR.replace(block_q=64, block_k=64)
    rne = flash_forward(q, k, v, policy.replace(rounding="rne"))
    torch.manual_seed(0)
    sr = flash_forward(q, k, v, policy)
    for name in ("m", "l", "lse", "fix_pos", "fix_neg"):                # the running max and ℓ stay RNE
        assert torch.equal(getattr(sr, name), getattr(rne, name)), name
    assert sr.o.dtype == rne.o.dtype and not torch.equal(sr.o, rne.o)
    torch.manual_seed(0)
    assert torch.equal(flash_forward(q, k, v, policy).o.view(torch.int16), sr.o.view(torch.int16))
    torch.manual_seed(1)
    assert not torch.equal(flash_forward(q, k, v, policy).o, sr.o)
    truth = naive_attention(q, k, v)
    assert (sr.o.double() - truth).abs().max() < 0.05                   # still a good attention


def test_sr_backward_runs_and_matches_rne_closely():
    q, k, v = (t.requires_grad_() for t in qkv(seed=1, t=96))
    policy = SR.replace(block_q=32, block_k=32)
    torch.manual_seed(0)
    attention(q, k, v, policy).float().square().sum().backward()
    g_sr = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attention(q, k, v, policy.replace(rounding="rne")).float().square().sum().backward()
    for a, b in zip(g_sr, (q.grad, k.grad, v.grad)):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).abs().max() < 0.1 * b.float().abs().max()


def _bias(s, v, policy, part):
    err = getattr(rounding.row_errors(s, v, policy), part).mean(axis=1)     # per row, mean over features
    return float(err.mean()), float(err.std(ddof=1) / math.sqrt(err.size))


@pytest.mark.parametrize("policy,part", [
    (PAPER_BF16, "acc_err"),                                           # one 512-key tile: P̄V to `pv_out`
    (PAPER_BF16.replace(block_k=128, pv_out="fp32"), "o_err"),         # four tiles: Ō·a + P̄V to `acc`
], ids=["pv_out", "acc"])
def test_sr_removes_the_bias_on_tied_rows(policy, part):
    """Two tied maxima and mostly negative V: round-to-nearest biases Ō by ≈ −1.4e-3 (relative to ℓ); the
    same 8-bit significand rounded stochastically has no bias left."""
    s, v, _ = rounding.make_rows(rounding.RowSpec(n_ties=2), 160, seed=0)
    rne, rne_se = _bias(s, v, policy, part)
    torch.manual_seed(0)
    sr, sr_se = _bias(s, v, policy.replace(rounding="sr"), part)
    assert rne < -1e-3 and abs(rne) > 20 * rne_se                       # the paper's bias, far outside noise
    assert abs(sr) < 5 * sr_se and abs(sr) < abs(rne) / 10, (rne, sr, sr_se)


def test_forward_from_scores_takes_the_sr_policy():
    s, v, _ = rounding.make_rows(rounding.RowSpec(n_keys=64, head_dim=8), 4, seed=0)
    torch.manual_seed(0)
    a = forward_from_scores(s, v, SR)
    torch.manual_seed(0)
    assert torch.equal(forward_from_scores(s, v, SR).o_unnorm, a.o_unnorm)


def test_kernels_refuse_sr():
    kernels = pytest.importorskip("lpfail.kernels")
    with pytest.raises(ValueError, match="rounding='sr'.*lpfail.attention"):
        kernels.kernel_policy(SR)
