"""The precision dial: bf16's exponent with K < 7 fraction bits ("bf16m1" … "bf16m6") at the cast points of a
policy, rounded exactly (against an integer oracle), its arms (`lpfail.experiments.dial`) and their calibration."""
from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from lpfail import results
from lpfail.attention import attention, flash_forward, naive_attention
from lpfail.bf16 import round_mantissa, round_stochastic
from lpfail.experiments import dial as D
from lpfail.precision import (DIAL, FA2_BF16, FORMATS, PAPER_BF16, PAPER_BF16_ROBUST_FIX, BoundedMax, Precision,
                              dial_format)
from lpfail.sr_stream import RoundingKey

KS = (1, 2, 3, 4, 5, 6, 7)


# ---------------------------------------------------------------------------------------------------
# an independent oracle: exact rounding of a rational number to bf16's exponent with k fraction bits
# ---------------------------------------------------------------------------------------------------
def _spacing(a: Fraction, k: int) -> Fraction:
    """The spacing of the k-bit format at magnitude a > 0: 2^(e − k), e = max(floor(log2 a), −126)."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return Fraction(2) ** (max(e, -126) - k)


def oracle(x: float, k: int) -> float:
    """x rounded to nearest, ties to even, with bf16's range: ±inf past (2 − 2^−k)·2^127, gradual underflow."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    a = Fraction(abs(x))
    sp = _spacing(a, k)
    q = a / sp
    n = q.numerator // q.denominator
    rest = q - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    val = n * sp
    if val > (2 - Fraction(1, 2 ** k)) * Fraction(2) ** 127:
        return math.copysign(math.inf, x)
    return math.copysign(float(val), x)


def same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def f32(p: int) -> float:
    return struct.unpack(">f", struct.pack(">I", p))[0]


def random_fp32(n: int, seed: int) -> list[float]:
    """Random fp32 values from random bit patterns: every exponent, subnormals, infinities and NaN included."""
    g = np.random.default_rng(seed)
    return [f32(int(p)) for p in g.integers(0, 1 << 32, n, dtype=np.int64)]


def edge_fp32(k: int) -> list[float]:
    """Exact ties of the k-bit format (normal and subnormal), values one fp32 ulp either side of them, the largest
    value, the overflow threshold and its neighbours, the boundary of the subnormals."""
    g = np.random.default_rng(k)
    out = []
    for _ in range(300):
        e = int(g.integers(-150, 128))
        sp = 2.0 ** (max(e, -126) - k)
        base = math.ldexp(float(g.integers(2 ** k, 2 ** (k + 1))), e - k) if e >= -126 else \
            float(g.integers(0, 2 ** k)) * sp
        tie = base + sp / 2
        if not math.isfinite(tie) or abs(tie) > 3.4e38:
            continue
        for v in (tie, np.nextafter(np.float32(tie), np.float32(np.inf)), np.nextafter(np.float32(tie), np.float32(0))):
            out += [float(v), -float(v)]
    top = (2 - 2.0 ** -k) * 2.0 ** 127
    over = (2 - 2.0 ** (-k - 1)) * 2.0 ** 127                    # halfway from the top to 2^128: rounds to inf
    for v in (top, over, float(np.nextafter(np.float32(over), np.float32(0))), float(np.finfo(np.float32).max),
              2.0 ** -126, 2.0 ** -126 - 2.0 ** (-127 - k), 2.0 ** -149, 2.0 ** (-127 - k), 0.0, -0.0,
              math.inf, -math.inf, math.nan):
        out += [v, -v]
    return out


# ---------------------------------------------------------------------------------------------------
# round_mantissa against the oracle
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", KS)
def test_round_mantissa_equals_the_oracle_on_fp32(k):
    values = random_fp32(4000, k) + edge_fp32(k)
    x = torch.tensor(values, dtype=torch.float32)
    assert all(same(a, float(b)) for a, b in zip(values, x.tolist()))    # exact in fp32
    got = round_mantissa(x, k).float().tolist()
    bad = [(v, g, oracle(v, k)) for v, g in zip(values, got) if not same(g, oracle(v, k))]
    assert not bad, bad[:5]
    low = round_mantissa(x, k).view(torch.int16).to(torch.int32) & ((1 << (7 - k)) - 1)
    assert bool((low[~torch.isnan(x)] == 0).all())                   # k fraction bits kept, the rest zero


@pytest.mark.parametrize("k", KS)
def test_round_mantissa_equals_the_oracle_on_fp64(k):
    """float64 input is rounded once (through a round-to-odd to fp32): values just off a tie, which a plain
    fp32 conversion would turn into ties, round the right way; beyond fp32's range too."""
    g = np.random.default_rng(100 + k)
    values = [math.ldexp(float(m), int(e)) for m, e in zip(g.uniform(-2, 2, 3000), g.integers(-160, 140, 3000))]
    for v in edge_fp32(k)[:400]:
        if math.isfinite(v) and v != 0:
            values += [v, v * (1 + 2.0 ** -40), v * (1 - 2.0 ** -40)]
    values += [1e300, -1e300, 1e-300, 5e-324, 3.4e38 * 1.001]
    x = torch.tensor(values, dtype=torch.float64)
    got = round_mantissa(x, k).float().tolist()
    bad = [(v, r, oracle(v, k)) for v, r in zip(values, got) if not same(r, oracle(v, k))]
    assert not bad, bad[:5]


def test_round_mantissa_of_16_bit_inputs():
    every = torch.arange(1 << 16, dtype=torch.int32)
    bf = torch.where(every >= 1 << 15, every - (1 << 16), every).to(torch.int16).view(torch.bfloat16)
    half = torch.tensor(np.random.default_rng(3).standard_normal(5000) * 1000, dtype=torch.float16)
    for k in KS:
        a = round_mantissa(bf, k)                                    # the look-up table of bf16 patterns
        b = round_mantissa(bf.float(), k)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert torch.equal(round_mantissa(half, k).view(torch.int16), round_mantissa(half.float(), k).view(torch.int16))


def test_seven_bits_is_bf16():
    x = torch.tensor([v for v in random_fp32(20000, 7) + edge_fp32(7) if not math.isnan(v)], dtype=torch.float32)
    assert torch.equal(round_mantissa(x, 7).view(torch.int16), x.to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("k", [4, 5, 6, 7])
def test_probability_of_rounding_up_is_the_fractional_distance_exactly(k):
    """Every noise value of the 23 − k dropped bits, once each: the number of draws that round up is the
    fractional distance times 2^(23 − k), exactly (values on a grid of sixteenths of the spacing, normal and
    subnormal, both signs; k ≥ 4 keeps the 2^(23 − k) draws per value affordable, smaller k are checked in law
    by test_sr_stream)."""
    shift = 23 - k

    class EveryNoise:                                                 # each row gets the bits 0 … 2^shift − 1
        def bits(self, shape, nbits, draw=0, device=None):
            assert nbits == shift
            return torch.arange(1 << shift, dtype=torch.int64).expand(shape)

    rows, want = [], []
    for e in (0, -126, -130, 100):
        sp = 2.0 ** (max(e, -126) - k)
        lo = 2.0 ** e if e >= -126 else 3 * sp
        for j in (0, 1, 5, 8, 11, 15):
            for sign in (1, -1):
                rows.append(sign * (lo + j * sp / 16))
                want.append((lo, sp, j * (1 << shift) // 16))
    x = torch.tensor(rows, dtype=torch.float32)[:, None].expand(-1, 1 << shift)
    r = round_stochastic(x, mantissa=k, key=EveryNoise()).double().abs()
    for i, (lo, sp, up) in enumerate(want):
        assert int((r[i] > lo).sum()) == up, (k, rows[i])
        assert set(r[i].unique().tolist()) <= {lo, lo + sp}


def test_round_mantissa_checks_its_arguments():
    with pytest.raises(ValueError, match="mantissa must be an int in 1..7"):
        round_mantissa(torch.ones(2), 8)
    with pytest.raises(TypeError, match="floating-point"):
        round_mantissa(torch.ones(2, dtype=torch.int32), 3)
    with pytest.raises(ValueError, match="needs dtype=torch.bfloat16"):
        round_stochastic(torch.ones(2), torch.float16, mantissa=5)


# ---------------------------------------------------------------------------------------------------
# the formats in a policy
# ---------------------------------------------------------------------------------------------------
def test_formats_and_their_names():
    assert list(DIAL) == ["bf16m6", "bf16m5", "bf16m4", "bf16m3", "bf16m2", "bf16m1"]
    assert dial_format(7) == "bf16" and dial_format(3) == "bf16m3"
    with pytest.raises(ValueError, match="1 … 7"):
        dial_format(8)
    f = FORMATS["bf16m4"]
    assert f.dtype == torch.bfloat16 and f.mantissa == 4 and not f.native and f.narrow
    assert f.max == float(round_mantissa(torch.tensor([3.4e38]), 4, "rtz")) == (2 - 2 ** -4) * 2.0 ** 127
    assert FORMATS["bf16"].native and FORMATS["bf16"].max == float(torch.finfo(torch.bfloat16).max)


@pytest.mark.parametrize("knob", ["matmul", "scores", "pbar", "pv_out", "acc", "out", "qk_out", "exp_in", "dp",
                                  "delta_prod", "ds", "grad_acc", "o_acc", "l_div", "m_acc", "v"])
def test_every_cast_point_takes_a_k_bit_format(knob):
    p = PAPER_BF16.replace(**{knob: "bf16m4"})
    assert f"{knob}=bf16m4" in str(p) and Precision.parse(str(p)) == p
    assert p.format(knob).name == "bf16m4"
    with pytest.raises(ValueError, match="K-bit format"):
        p.dtype(knob)
    with pytest.raises(ValueError, match="must be one of|must be None"):
        PAPER_BF16.replace(**{knob: "bf16m7"})


def test_v_knob_string_and_fallback():
    assert PAPER_BF16.v is None and PAPER_BF16.format("v").name == "bf16"
    assert FA2_BF16.replace(matmul="fp32").format("v").name == "fp32"
    p = FA2_BF16.replace(v="bf16m5")
    assert str(p) == str(FA2_BF16) + ",v=bf16m5" and p.name == "FA2_BF16,v=bf16m5"
    assert Precision.parse("FA2_BF16,v=bf16m5") == p


def test_k_bit_policies_reach_stochastic_rounding_and_not_fma():
    assert FA2_BF16.replace(pv_out="fp32", out="bf16m3", rounding="sr").rounding == "sr"
    with pytest.raises(ValueError, match="sub='fma'"):
        FA2_BF16.replace(sub="fma", scores="bf16m6")


def test_kernels_refuse_the_dial():
    kernels = pytest.importorskip("lpfail.kernels")
    for p, knob in ((FA2_BF16.replace(out="bf16m5"), "out"), (FA2_BF16.replace(o_acc="bf16m3"), "o_acc"),
                    (FA2_BF16.replace(v="bf16"), "v")):
        with pytest.raises(ValueError, match=rf"Precision\.{knob}=.*lpfail\.attention"):
            kernels.kernel_policy(p)


# ---------------------------------------------------------------------------------------------------
# the arms
# ---------------------------------------------------------------------------------------------------
def test_arms_at_seven_bits_are_the_bf16_policies():
    assert D.arm("A", 7) == PAPER_BF16 and str(D.arm("A", 7)) == str(PAPER_BF16)
    assert D.arm("SR", 7) == PAPER_BF16.replace(rounding="sr")
    assert D.arm("D", 7) == FA2_BF16 and str(D.arm("D", 7)) == str(FA2_BF16)
    assert D.arm("R", 7) == PAPER_BF16_ROBUST_FIX and D.arm("R", 7).name == "PAPER_BF16_ROBUST_FIX"


def test_the_knobs_of_each_arm():
    a, sr, d, r = (D.arm(n, 5) for n in ("A", "SR", "D", "R"))
    assert a == PAPER_BF16.replace(v="bf16m5", pv_out="bf16m5", o_acc="bf16m5", out="bf16m5")
    assert (a.scores, a.pbar, a.acc, a.matmul, a.rounding) == ("bf16", "bf16", "bf16", "bf16", "rne")
    assert sr == a.replace(rounding="sr") and sr.v == "bf16m5"
    assert d == FA2_BF16.replace(v="bf16m5", out="bf16m5") and (d.acc, d.pv_out) == ("fp32", "fp32")
    assert r == a.replace(fix=BoundedMax())
    for n in D.ARMS:
        for k in D.KS:
            p = D.arm(n, k)
            assert Precision.parse(str(p)) == p and D.ARMS[n].words
    assert D.label("SR", 3) == "SR_3"
    with pytest.raises(ValueError, match="unknown arm"):
        D.arm("B", 5)


def qkv(t=80, d=16, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(2, 2, t, d, generator=g) * scale).to(torch.bfloat16)
    return q, *(torch.randn(2, 2, t, d, generator=g).to(torch.bfloat16) for _ in range(2))


@pytest.mark.parametrize("k", D.KS)
@pytest.mark.parametrize("name", list(D.ARMS))
def test_every_arm_runs_forward_and_backward(name, k):
    q, kk, v = (t.clone().requires_grad_() for t in qkv())
    pol = D.arm(name, k).replace(block_q=32, block_k=32)
    o = attention(q, kk, v, pol, sr_key=RoundingKey(0))
    o.float().square().sum().backward()
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
    assert all(torch.isfinite(t.grad).all() and t.grad.dtype == torch.bfloat16 for t in (q, kk, v))
    low = o.view(torch.int16).to(torch.int32) & ((1 << (7 - k)) - 1)
    assert bool((low == 0).all())                                    # O holds k fraction bits
    assert (o.double() - naive_attention(q, kk, v)).abs().max() < 3 * 2.0 ** -k * 4


def test_fewer_bits_change_the_output_and_v_is_rounded_where_it_enters():
    q, k, v = qkv(seed=1)
    a7 = flash_forward(q, k, v, D.arm("A", 7))
    assert torch.equal(a7.o.view(torch.int16), flash_forward(q, k, v, PAPER_BF16).o.view(torch.int16))
    for kb in (6, 5, 4, 3):
        pol = D.arm("A", kb)
        ak = flash_forward(q, k, v, pol)
        assert not torch.equal(ak.o, a7.o)
        v_k = FORMATS[dial_format(kb)].round(v)
        pre = flash_forward(q, k, v_k, pol.replace(v=None, matmul="bf16"))
        assert torch.equal(ak.o.view(torch.int16), pre.o.view(torch.int16))  # V at K bits = V rounded first
        assert torch.equal(ak.m, a7.m) and torch.equal(ak.l, a7.l)   # scores, P̄, m, ℓ stay as in BF16


# ---------------------------------------------------------------------------------------------------
# the calibration
# ---------------------------------------------------------------------------------------------------
def test_calibration_scales_the_bias_and_brackets_the_noise():
    cfg = D.DialCalibrationConfig(ks=(7, 6, 5, 4), n_rows=300, head_dim=8)
    res = D.dial_calibration(cfg)
    a, a_ci = res["A_bias"], res["A_bias_ci"]
    assert (a < -5 * a_ci).all()                                     # round-to-nearest: biased, toward larger |O|
    ratio = a[1:] / a[:-1]
    assert (np.abs(ratio - 2) < 0.4).all(), ratio                    # one bit fewer: twice the bias
    assert (np.abs(res["SR_bias"]) < np.maximum(4 * res["SR_bias_ci"], 1e-4)).all()
    assert (res["ratio_sr_over_a"] > 1).all()                        # SR_K noisier than A_K ...
    assert (res["ratio_a_over_sr_next"][1:] > 1).all()               # ... and A_K noisier than SR_{K+1}
    assert np.isnan(res["bracketed"][0]) and (res["bracketed"][1:] == 1).all()
    assert list(res["SR_policy"])[0] == str(PAPER_BF16.replace(rounding="sr"))
    assert "bracketed" in D.summary(res)
    results._split("dial_calibration", res)                         # storable


@pytest.mark.parametrize("knob", ["matmul", "scores", "exp", "pbar", "pv_out", "acc", "out", "qk_out", "exp_in",
                                  "dp", "delta_prod", "ds", "grad_acc", "o_acc", "l_div", "l_store", "m_acc",
                                  "m_rescale", "l_div_last", "v"])
def test_the_reference_honours_a_k_bit_format_at_every_cast_point(knob):
    """PAPER_BF16 with one cast point at 4 bits: forward and backward run, finite, and something they return
    changes (the cast point is not silently rounded at bf16's 7 bits)."""
    base = PAPER_BF16.replace(block_q=32, block_k=32)
    q, k, v = qkv(seed=2)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)

    def run(pol):
        ts = [t.clone().requires_grad_() for t in (q, k, v)]
        o = attention(*ts, pol)
        o.backward(do)
        return [o.detach()] + [t.grad for t in ts]

    ref, got = run(base), run(base.replace(**{knob: "bf16m4"}))
    assert all(torch.isfinite(t).all() for t in got)
    assert any(not torch.equal(a, b) for a, b in zip(ref, got))
