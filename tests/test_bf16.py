"""Tests for lpfail.bf16, the bit-level BF16 toolkit of chapter 4, "Rounding".

Exhaustive over all 65,536 bf16 bit patterns; round_bf16 against torch and ml_dtypes on a few million fp32
patterns; add_trace against torch on many random pairs; the paper's worked addition bit for bit.
"""
import math
import struct
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from lpfail import bf16 as B
from lpfail.bf16 import (BF16_MAX, PAPER_RUNNING_SUM, PAPER_TERM, add_trace, add_trace_acc, bits,
                         classify, describe, from_bits, next_down, next_up, paper_example, round_bf16, ulp)

BF16 = ml_dtypes.bfloat16
PATTERNS = np.arange(1 << 16, dtype=np.int64)                   # every bf16 bit pattern


def bf16_from_patterns(p) -> torch.Tensor:
    p = torch.as_tensor(np.asarray(p, dtype=np.int64))
    return torch.where(p >= 0x8000, p - 0x10000, p).to(torch.int16).view(torch.bfloat16)


def patterns_of(t: torch.Tensor) -> np.ndarray:
    """16-bit patterns of a bf16 tensor."""
    return t.view(torch.int16).numpy().astype(np.int64) & 0xFFFF


def f32_patterns(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF


def f32_from_patterns(u) -> torch.Tensor:
    u = np.asarray(u, dtype=np.int64)
    return torch.from_numpy(np.where(u >= 1 << 31, u - (1 << 32), u).astype(np.int32)).view(torch.float32)


def same_float(x: float, y: float) -> bool:
    """Equal as floats, with NaN == NaN and -0.0 != +0.0."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


ALL = bf16_from_patterns(PATTERNS)                               # (65536,) bf16

def as_f64(t: torch.Tensor) -> np.ndarray:
    """Exact float64 copy of a bf16/fp32 tensor (numpy warns on signalling-NaN payloads; they stay NaN)."""
    with np.errstate(invalid="ignore"):
        return t.float().numpy().astype(np.float64)


ALL_F = as_f64(ALL)                                              # the same values, exactly, in float64
NAN = np.isnan(ALL_F)


# ------------------------------------------------------------------------------------------------------
# bits / from_bits / classify: all 65,536 patterns
# ------------------------------------------------------------------------------------------------------
def test_bits_all_patterns_match_int16_view():
    s = bits(ALL)
    assert isinstance(s, np.ndarray) and s.shape == (1 << 16,)
    # independent formatting of the int16 view
    raw = patterns_of(ALL)
    assert np.array_equal(raw, PATTERNS)
    expected = np.array([f"{p:016b}" for p in raw])
    assert np.array_equal(np.char.replace(s, " ", ""), expected)
    assert (np.char.str_len(s) == 18).all()
    assert all(x[1] == " " and x[10] == " " for x in s[:: 257])


def test_bits_fp32_of_bf16_pads_with_zeros():
    s32 = bits(ALL, "fp32")
    s16 = bits(ALL)
    assert (np.char.str_len(s32) == 34).all()
    assert all(a.startswith(b) and a[18:] == "0" * 16
               for a, b in zip(s32.tolist(), s16.tolist()))


def test_ml_dtypes_agrees_with_torch_on_all_patterns():
    ours = ALL.float().numpy()
    theirs = PATTERNS.astype(np.uint16).view(BF16).astype(np.float32)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.array_equal(ours.view(np.uint32)[~NAN], theirs.view(np.uint32)[~NAN])


def test_from_bits_round_trips_all_patterns():
    strings = bits(ALL).tolist()
    values = ALL_F.tolist()
    for p, s, v in zip(PATTERNS.tolist(), strings, values):
        x = from_bits(s)
        if math.isnan(v):
            assert math.isnan(x), s
        else:
            assert same_float(x, v), s
            assert struct.unpack(">I", struct.pack(">f", x))[0] == p << 16, s


def test_bits_of_floats_agree_with_tensors():
    strings = bits(ALL).tolist()
    for s, v in zip(strings, ALL_F.tolist()):
        if not math.isnan(v):
            assert bits(v) == s
    assert bits(float("nan")) == "0 11111111 1000000"
    assert bits(-float("nan")) == "1 11111111 1000000"


def test_classify_all_patterns():
    c = classify(ALL)
    a = np.abs(ALL_F)
    fi = ml_dtypes.finfo(BF16)
    expected = np.select([NAN, np.isinf(ALL_F), a == 0, a < float(fi.smallest_normal)],
                         ["nan", "inf", "zero", "subnormal"], "normal")
    assert np.array_equal(c, expected)
    counts = {k: int((c == k).sum()) for k in ("zero", "subnormal", "normal", "inf", "nan")}
    assert counts == {"zero": 2, "subnormal": 254, "normal": 65536 - 512, "inf": 2, "nan": 254}
    assert (classify(0.0), classify(-0.0), classify(-float("inf")), classify(float("nan"))) == \
        ("zero", "zero", "inf", "nan")
    assert classify(2.0 ** -133) == "subnormal" and classify(2.0 ** -126) == "normal"


def test_constants_match_ml_dtypes_finfo():
    fi = ml_dtypes.finfo(BF16)
    assert B.BF16_MAX == float(fi.max)
    assert B.BF16_SMALLEST_NORMAL == float(fi.smallest_normal)
    assert B.BF16_SMALLEST_SUBNORMAL == float(fi.smallest_subnormal)
    assert B.BF16_EPS == float(fi.eps)
    assert bits(BF16_MAX) == "0 11111110 1111111"
    assert bits(B.BF16_SMALLEST_SUBNORMAL) == "0 00000000 0000001"
    # finfo identity: the smallest subnormal halves to zero (under RNE: a tie, broken to even 0)
    half = torch.tensor([B.BF16_SMALLEST_SUBNORMAL / 2], dtype=torch.float32)
    assert round_bf16(half).item() == 0.0


# ------------------------------------------------------------------------------------------------------
# next_up / next_down / ulp: all patterns, vectorized
# ------------------------------------------------------------------------------------------------------
def _ordered_values():
    return np.unique(ALL_F[~NAN])                                 # sorted, -0 and +0 merged


def test_next_up_is_the_successor_for_all_patterns():
    vals = _ordered_values()
    up = as_f64(next_up(ALL))
    assert np.isnan(up[NAN]).all()
    x, u = ALL_F[~NAN], up[~NAN]
    top = x == math.inf
    assert (u[top] == math.inf).all()
    idx = np.searchsorted(vals, x[~top], side="right")
    assert np.array_equal(u[~top], vals[idx])
    assert next_up(-2.0 ** -133) == 0.0 and math.copysign(1, next_up(-2.0 ** -133)) < 0   # -0, as IEEE
    assert next_up(BF16_MAX) == math.inf and next_up(-math.inf) == -BF16_MAX


def test_next_down_is_the_predecessor_for_all_patterns():
    vals = _ordered_values()
    down = as_f64(next_down(ALL))
    assert np.isnan(down[NAN]).all()
    x, d = ALL_F[~NAN], down[~NAN]
    bottom = x == -math.inf
    assert (d[bottom] == -math.inf).all()
    idx = np.searchsorted(vals, x[~bottom], side="left") - 1
    assert np.array_equal(d[~bottom], vals[idx])
    # inverse of each other away from the ends (as values: zeros compare equal)
    inner = ~NAN & np.isfinite(ALL_F)
    back = next_down(next_up(ALL)).float().numpy()
    assert np.array_equal(back[inner], ALL_F[inner])


def test_ulp_is_the_spacing_for_all_patterns():
    sign = PATTERNS >> 15
    away = np.where(sign == 0, as_f64(next_up(ALL)), as_f64(next_down(ALL)))
    u = as_f64(ulp(ALL))
    finite = np.isfinite(ALL_F)
    ends = np.abs(ALL_F) == BF16_MAX
    ok = finite & ~ends
    assert np.array_equal(u[ok], np.abs(away[ok] - ALL_F[ok]))
    assert (u[ends] == 2.0 ** 120).all()
    assert np.isnan(u[~finite]).all()
    m, e = np.frexp(u[finite])
    assert (m == 0.5).all()                                        # always a power of two
    assert ulp(1.0) == 2 ** -7 and ulp(-2.40625) == 2 ** -6 and ulp(0.0) == 2.0 ** -133
    assert ulp(2.0 ** -126) == 2.0 ** -133 == ulp(2.0 ** -130)


def test_neighbour_functions_keep_the_input_kind():
    t32 = torch.tensor([1.0, -2.0])
    assert next_up(t32).dtype == torch.float32 and next_up(t32).tolist() == [1.0078125, -1.9921875]
    assert next_up(torch.tensor(1.0, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert isinstance(ulp(1.0), float) and isinstance(next_down(1.0), float)


# ------------------------------------------------------------------------------------------------------
# round_bf16
# ------------------------------------------------------------------------------------------------------
def _fp32_test_patterns(n: int = 1_500_000) -> np.ndarray:
    """Uniform random 32-bit patterns, plus patterns whose low half sits at the rounding edges, plus
    subnormals, NaN, inf and the values next to overflow."""
    rng = np.random.default_rng(1234)
    uniform = rng.integers(0, 1 << 32, n, dtype=np.int64)
    hi = rng.integers(0, 1 << 16, n, dtype=np.int64)
    lo = rng.choice(np.array([0, 1, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFF]), n)
    edges = hi << 16 | lo
    subn = rng.integers(0, 1 << 23, 200_000, dtype=np.int64) | rng.integers(0, 2, 200_000) << 31
    special = np.array([0, 1 << 31, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF,
                        0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7FFFFF, 0xFF7F8000, 0xFF7FFFFF, 0x7F7E8000,
                        0x00008000, 0x00018000, 0x80008000, 0x0000FFFF, 0x007FFFFF], dtype=np.int64)
    return np.concatenate([uniform, edges, subn, special])


def _check_rne(u: np.ndarray):
    x = f32_from_patterns(u)
    ours = round_bf16(x)
    assert ours.dtype == torch.bfloat16 and ours.shape == x.shape
    p = patterns_of(ours)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    torch_p = patterns_of(x.to(torch.bfloat16))
    assert np.array_equal(p[~nan], torch_p[~nan])
    assert np.isnan(ours.float().numpy()[nan]).all()
    ml_p = x.numpy().astype(BF16).view(np.uint16).astype(np.int64)
    assert np.array_equal(p, ml_p)                                # ml_dtypes: bitwise, NaN included
    return p


def test_round_rne_matches_torch_and_ml_dtypes_on_millions():
    u = _fp32_test_patterns()
    assert len(u) > 3_000_000
    with np.errstate(invalid="ignore"):
        _check_rne(u)


def test_round_rne_on_every_halfway_case():
    hi = PATTERNS
    ties = hi << 16 | 0x8000                                      # exactly half an ulp above hi
    finite = (hi & 0x7F80) != 0x7F80
    with np.errstate(invalid="ignore"):
        p = _check_rne(ties[finite])
    h = hi[finite]
    assert np.array_equal(p, np.where(h & 1, h + 1, h) & 0xFFFF)  # ties go to the even neighbour
    below = _check_rne((h << 16 | 0x7FFF))
    above = _check_rne((h << 16 | 0x8001))
    assert np.array_equal(below, h) and np.array_equal(above, (h + 1) & 0xFFFF)
    # overflow: the tie above the largest finite value is broken to the even "neighbour" inf
    tie = float.fromhex("0x1.ffp127")                              # 1.1111111|1 × 2^127
    assert round_bf16(torch.tensor([tie, -tie])).tolist() == [math.inf, -math.inf]


def test_round_rtz_is_truncation():
    u = _fp32_test_patterns(400_000)
    x = f32_from_patterns(u)
    p = patterns_of(round_bf16(x, "rtz"))
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    assert np.array_equal(p[~nan], (u >> 16)[~nan])
    assert np.array_equal(p[nan], (u >> 16 & 0x8000 | 0x7FC0)[nan])     # NaN stays NaN, sign kept
    r = round_bf16(x[~torch.from_numpy(nan)], "rtz").float()
    assert (r.abs() <= x[~torch.from_numpy(nan)].abs()).all()      # never away from zero


def test_round_stochastic_reproducible_and_only_neighbours():
    rng = np.random.default_rng(7)
    u = np.concatenate([rng.integers(0, 0x7F800000, 100_000), rng.integers(0x80000000, 0xFF800000, 100_000),
                        np.array([0x7F7FFFFF, 0x00000001, 0x3F800000])])
    x = f32_from_patterns(u)
    r1 = round_bf16(x, "stochastic", generator=torch.Generator().manual_seed(0))
    r2 = round_bf16(x, "stochastic", generator=torch.Generator().manual_seed(0))
    r3 = round_bf16(x, "stochastic", generator=torch.Generator().manual_seed(1))
    assert torch.equal(r1.view(torch.int16), r2.view(torch.int16))
    assert not torch.equal(r1.view(torch.int16), r3.view(torch.int16))
    p = patterns_of(r1)
    lo = u >> 16                                                    # toward zero
    assert np.isin(p - lo, [0, 1]).all()                           # ... or the next one away from zero
    exact = (u & 0xFFFF) == 0
    assert np.array_equal(p[exact], lo[exact])                      # representable values never move
    assert ((p - lo) == 1).any() and ((p - lo) == 0).any()


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.9])
def test_round_stochastic_is_unbiased(frac):
    n = 200_000
    for base in (1.0, -3.0):
        x = torch.full((n,), base + math.copysign(frac * ulp(base), base), dtype=torch.float32)
        r = round_bf16(x, "stochastic", generator=torch.Generator().manual_seed(42)).double()
        p_away = ((r.abs() > abs(base)).double().mean()).item()
        assert abs(p_away - frac) < 0.01                            # 8σ at n = 200k
        assert abs((r - x.double()).mean().item()) < 0.01 * ulp(base)
    # random values: stochastic rounding is unbiased, truncation is not (the bound separates them)
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(1_000_000, generator=g) + 1.0)                  # in [1, 2): ulp = 2^-7
    err = lambda mode: ((round_bf16(x, mode, generator=g).double() - x.double()).mean() / 2 ** -7).item()
    assert abs(err("stochastic")) < 0.005
    assert err("rtz") < -0.4


def test_round_bf16_bad_inputs():
    with pytest.raises(TypeError, match="float32"):
        round_bf16(torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32"):
        round_bf16(torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="float32"):
        round_bf16(1.5)
    with pytest.raises(ValueError, match="rne"):
        round_bf16(torch.ones(3), mode="nearest")


# ------------------------------------------------------------------------------------------------------
# add_trace: agreement with torch
# ------------------------------------------------------------------------------------------------------
def _random_pairs(n_each: int = 2500):
    """bf16 pattern pairs: uniform (all gaps, inf, NaN, subnormals), nearby exponents with both signs,
    near-cancellation, large gaps, subnormal pairs."""
    rng = np.random.default_rng(2026)
    pa, pb = [], []
    pa.append(rng.integers(0, 1 << 16, n_each)); pb.append(rng.integers(0, 1 << 16, n_each))
    a = rng.integers(0x0080, 0x7F00, n_each) | rng.integers(0, 2, n_each) << 15
    e = np.clip((a >> 7 & 0xFF) + rng.integers(-10, 11, n_each), 1, 254)
    b = rng.integers(0, 2, n_each) << 15 | e << 7 | rng.integers(0, 128, n_each)
    pa.append(a); pb.append(b)
    a = rng.integers(0x0100, 0x7F00, n_each)                        # cancellation: -(a + k ulp)
    b = (a + rng.integers(-3, 4, n_each)) | 0x8000
    sw = rng.integers(0, 2, n_each).astype(bool)
    pa.append(np.where(sw, a ^ 0x8000, a)); pb.append(np.where(sw, b ^ 0x8000, b))
    a = rng.integers(0x1000, 0x7F00, n_each) | rng.integers(0, 2, n_each) << 15
    gap = rng.integers(8, 40, n_each)
    b = rng.integers(0, 2, n_each) << 15 | ((a >> 7 & 0xFF) - gap) << 7 | rng.integers(0, 128, n_each)
    pa.append(a); pb.append(b)
    pa.append(rng.integers(0, 0x100, 500) | rng.integers(0, 2, 500) << 15)
    pb.append(rng.integers(0, 0x100, 500) | rng.integers(0, 2, 500) << 15)
    return np.concatenate(pa), np.concatenate(pb)


def test_add_trace_matches_torch_on_random_pairs():
    pa, pb = _random_pairs()
    assert len(pa) >= 10_000
    a, b = bf16_from_patterns(pa), bf16_from_patterns(pb)
    expected = (a.float() + b.float()).to(torch.bfloat16).float().tolist()
    av, bv = a.float().tolist(), b.float().tolist()
    kinds = set()
    for x, y, want in zip(av, bv, expected):
        t = add_trace(x, y)
        assert same_float(t.result, want), (x, y, t.result, want)
        if math.isfinite(x) and math.isfinite(y):
            assert t.exact == Fraction(x) + Fraction(y)
            if math.isfinite(t.result):
                assert t.error == Fraction(t.result) - t.exact
                assert abs(t.error) <= Fraction(ulp(t.result)) / 2       # RNE: within half an ulp
                assert (t.direction == "none") == (t.error == 0)
            assert t.result_bits == bits(t.result)
            kinds.add((t.operation, t.normalization, t.decision))
    assert {("add", "carry", "tie→even"), ("subtract", "cancellation", "exact"), ("add", "none", "up"),
            ("add", "none", "down"), ("subtract", "zero", "exact")} <= kinds


def test_add_trace_acc_matches_torch_fp32_accumulation():
    rng = np.random.default_rng(99)
    n = 3000
    term_p = rng.integers(0x0080, 0x7F00, n) | rng.integers(0, 2, n) << 15
    term = bf16_from_patterns(term_p).float()
    # accumulators within a few binades of the term, any sign, all 23 fraction bits random
    e = np.clip((term_p >> 7 & 0xFF) + rng.integers(-12, 13, n), 1, 254)
    acc_p = rng.integers(0, 2, n) << 31 | e << 23 | rng.integers(0, 1 << 23, n)
    acc = f32_from_patterns(acc_p)
    s32 = acc + term
    s16 = s32.to(torch.bfloat16).float()
    for x, y, w32, w16 in zip(acc.tolist(), term.tolist(), s32.tolist(), s16.tolist()):
        t = add_trace_acc(x, y)
        assert same_float(t.fp32_result, w32), (x, y)
        assert same_float(t.result, w16), (x, y)
        assert t.fp32_bits == bits(w32, "fp32")
        assert t.exact == Fraction(x) + Fraction(y)
        # the bf16 rounding reads the fp32 sum: its bits after the rounding bit are the sticky bits
        if math.isfinite(w32) and w32 != 0:
            assert t.fp32_bits.replace(" ", "")[9 + 7 + 1:] == t.sticky_bits
            assert t.fp32_bits.replace(" ", "")[9 + 7] == str(t.guard)


# ------------------------------------------------------------------------------------------------------
# add_trace: specific cases
# ------------------------------------------------------------------------------------------------------
def test_carry_with_tie_to_even_both_ways():
    down = add_trace(-2.40625, -2.296875)                           # 10.0101101 -> 1.0010110|1, even
    assert (down.normalization, down.shift, down.guard, down.sticky_bits) == ("carry", 1, 1, "")
    assert (down.decision, down.direction, down.result) == ("tie→even", "toward zero", -4.6875)
    assert down.error == Fraction(1, 64)
    up = add_trace(-2.40625, -2.265625)                             # 10.0101011 -> 1.0010101|1, odd
    assert (up.normalization, up.guard, up.decision) == ("carry", 1, "tie→even")
    assert (up.direction, up.result, up.error) == ("away from zero", -4.6875, Fraction(-1, 64))
    assert down.error + up.error == 0                               # ties to even: no bias on average
    t = add_trace(1.0078125, 1.015625)                              # positive carry, tie, odd -> up
    assert (t.result, t.direction) == (2.03125, "away from zero")


def test_cancellation_shifts_left():
    t = add_trace(1.0, -0.99609375)                                 # 1.0000000 - 0.1111111|1
    assert t.operation == "subtract" and t.normalization == "cancellation" and t.shift == -8
    assert t.exponent_gap == 1 and t.shifted_out == "1"
    assert (t.result, t.decision, t.error) == (2.0 ** -8, "exact", 0)
    t = add_trace(-1.5, 1.0078125)                                  # 1.1000000 - 1.0000001 = 0.0111111
    assert (t.normalization, t.shift, t.result, t.decision) == ("cancellation", -2, -0.4921875, "exact")
    assert t.big == "a" and t.result < 0
    t = add_trace(3.0, -3.0)
    assert t.normalization == "zero" and same_float(t.result, 0.0)


def test_exponent_gap_larger_than_8_goes_to_sticky():
    b = from_bits("0 01110101 1010101")                             # 1.1010101 × 2^-10
    t = add_trace(1.0, b)
    assert t.exponent_gap == 10 and t.shifted_out == "0011010101"   # all of b leaves the window
    assert t.normalized_bits.startswith("1.0000000|0|")
    assert (t.guard, t.decision, t.direction, t.result) == (0, "down", "toward zero", 1.0)
    assert t.error == -Fraction(b) and t.sticky == 1
    almost_half = from_bits("0 01110110 1111111")                   # 1.1111111 × 2^-9: just under half an ulp
    t = add_trace(1.0, almost_half)
    assert t.exponent_gap == 9 and t.shifted_out == "011111111"
    assert (t.guard, t.round, t.decision, t.result) == (0, 1, "down", 1.0)
    t = add_trace(1.0, 2.0 ** -8)                                   # gap 8: b's hidden bit is the guard
    assert (t.guard, t.round, t.sticky, t.decision, t.result) == (1, 0, 0, "tie→even", 1.0)
    t = add_trace(1.0, 2.0 ** -8 * 1.0078125)
    assert (t.guard, t.sticky, t.decision, t.result) == (1, 1, "up", 1.0078125)
    t = add_trace(1.0, 2.0 ** -130)                                 # huge gap, subnormal operand (exp -126)
    assert t.exponent_gap == 126 and t.result == 1.0 and t.decision == "down"


def test_subnormal_zero_and_overflow_cases():
    s = 2.0 ** -133
    assert add_trace(s, s).result == 2 * s
    t = add_trace(2.0 ** -126 - s, s)                               # subnormal carries into the normal range
    assert t.result == 2.0 ** -126 and classify(t.result) == "normal"
    assert same_float(add_trace(0.0, -0.0).result, 0.0)
    assert same_float(add_trace(-0.0, -0.0).result, -0.0)
    assert add_trace(-2.5, 0.0).result == -2.5 and add_trace(0.0, 1.5).decision == "exact"
    t = add_trace(BF16_MAX, 2.0 ** 119)                             # tie above the max -> even = inf
    want = (torch.tensor(BF16_MAX) + torch.tensor(2.0 ** 119)).to(torch.bfloat16).item()
    assert t.result == want == math.inf and "inf" in t.note
    assert add_trace(BF16_MAX, BF16_MAX).result == math.inf
    t = add_trace(-BF16_MAX, 2.0 ** 119)                            # a tie below: even is 1.1111110
    assert (t.decision, t.result) == ("tie→even", -BF16_MAX + 2.0 ** 120)
    assert t.result == (torch.tensor(-BF16_MAX) + 2.0 ** 119).to(torch.bfloat16).item()


def test_special_operands_give_a_trivial_trace():
    t = add_trace(math.inf, -math.inf)
    assert math.isnan(t.result) and "NaN" in t.note and t.result_bits == "0 11111111 1000000"
    t = add_trace(float("nan"), 1.0)
    assert math.isnan(t.result) and "NaN" in t.note
    t = add_trace(-math.inf, 1.0)
    assert t.result == -math.inf and "infinite" in t.note
    assert [name for name, _, _ in t.steps] == ["a", "b", "result"]
    assert "NaN" in str(add_trace(math.inf, -math.inf))


# ------------------------------------------------------------------------------------------------------
# The paper's worked example (§4), bit for bit
# ------------------------------------------------------------------------------------------------------
PAPER_SUM = -4.703990459442139
PAPER_ERROR = -0.014759540557861328


def test_paper_operands():
    assert bits(-2.40625) == "1 10000000 0011010"
    assert bits(PAPER_TERM) == "1 10000000 0010011" and PAPER_TERM == -2.296875
    assert bits(-4.71875) == "1 10000001 0010111"
    assert from_bits("1 10000001 0010110 1 000011100010111") == PAPER_SUM
    assert bits(PAPER_SUM, "fp32") == "1 10000001 00101101000011100010111"
    # the running sum is derived from the stated sum and term; it is exact in fp32
    running = PAPER_SUM - PAPER_TERM
    assert running == PAPER_RUNNING_SUM
    assert Fraction(running) == Fraction(PAPER_SUM) - Fraction(PAPER_TERM)     # the subtraction was exact
    assert torch.tensor(running, dtype=torch.float32).item() == running           # representable in fp32
    trunc = round_bf16(torch.tensor([running]), "rtz").item()
    assert trunc == -2.40625 and bits(running, "fp32").startswith("1 10000000 0011010")
    residual = running - trunc                                      # what the tiny terms left behind
    assert 0.00086 < -residual < 0.00088
    assert describe(-2.40625) == "-2.40625 = -1.0011010₂ × 2^1"


def test_paper_worked_addition_bit_for_bit():
    t = add_trace_acc(PAPER_RUNNING_SUM, PAPER_TERM)
    assert t.kind == "fp32 acc + bf16" and (t.a_fmt, t.b_fmt) == ("fp32", "bf16")
    # 1. alignment: equal exponents, nothing shifted
    assert t.exponent_gap == 0 and t.operation == "add"
    # 2. the significand sum overflows into a second integer bit
    assert t.sum_bits == "10.0101101|0000111000101110"
    # 3. carry: shift right by one; the shifted-out bit becomes the rounding bit
    assert t.normalization == "carry" and t.shift == 1
    assert t.normalized_bits == "1.0010110|1|0000111000101110"
    # the fp32 accumulator holds the exact sum
    assert t.exact == Fraction(PAPER_SUM) and t.fp32_result == PAPER_SUM
    assert t.fp32_bits == "1 10000001 00101101000011100010111"
    # 4. rounding: rounding bit 1, sticky bits nonzero -> more than half: away from zero
    assert t.rounding_bit == t.guard == 1
    assert t.sticky_bits == "000011100010111" and t.sticky_nonzero
    assert (t.round, t.sticky) == (0, 1)
    assert (t.decision, t.direction) == ("up", "away from zero")
    assert t.result == -4.71875 and t.result_bits == "1 10000001 0010111"
    assert t.error == Fraction(PAPER_ERROR) and float(t.error) == PAPER_ERROR
    assert t.error == Fraction(-4.71875) - Fraction(PAPER_SUM)
    # and this is what torch does: fp32 accumulation, then the cast
    acc = torch.tensor(PAPER_RUNNING_SUM) + torch.tensor(PAPER_TERM, dtype=torch.bfloat16).float()
    assert acc.item() == PAPER_SUM and acc.to(torch.bfloat16).item() == -4.71875
    assert paper_example().result == t.result


def test_paper_contrast_tie_without_sticky_is_unbiased():
    tie = paper_example(sticky=False)                               # the same two big terms, no residual
    assert tie.exact == Fraction(-4.703125)                         # exactly half-way between two bf16
    assert tie.guard == 1 and not tie.sticky_nonzero
    assert (tie.decision, tie.direction, tie.result) == ("tie→even", "toward zero", -4.6875)
    assert tie.error == Fraction(1, 64)
    sticky = paper_example(sticky=True)
    assert (sticky.decision, sticky.direction) == ("up", "away from zero")
    # the residual's sign decides: same sign as the big terms -> away; opposite sign -> toward zero
    opposite = add_trace_acc(-2.40625 - (PAPER_RUNNING_SUM + 2.40625), PAPER_TERM)
    assert (opposite.guard, opposite.decision, opposite.direction) == (0, "down", "toward zero")
    assert opposite.result == -4.6875


def test_trace_renders_as_text_html_and_rows():
    t = paper_example()
    names = [n for n, _, _ in t.steps]
    assert names == ["a", "b", "1 align", "1 align", "2 add", "3 normalize", "3b fp32 acc", "4 round", "result"]
    assert all(isinstance(x, str) for row in t.steps for x in row)
    rows = dict((n, (b, note)) for n, b, note in t.steps)
    assert rows["3b fp32 acc"][0] == "1 10000001 0010110 1 000011100010111"      # the paper's notation
    rnd = rows["4 round"]
    assert rnd[0].strip() == "1.0010110|1|000011100010111" and "away from zero" in rnd[1]
    s = str(t)
    for label in ("1 align", "2 add", "3 normalize", "4 round", "result", "1 10000001 0010111",
                  "-0.014759540557861328", "carry"):
        assert label in s, label
    lines = s.splitlines()
    col = {ln.index("1.00") for ln in lines if "1.00" in ln and ("align" in ln or "normalize" in ln)}
    assert len(col) == 1                                           # binary points line up
    h = t._repr_html_()
    assert h.startswith("<table") and h.count("<tr>") == len(t.steps)
    assert 'class="guard" style="background' in h and '>1</span>' in h
    assert 'class="sticky" style="background' in h and ">000011100010111</span>" in h
    assert "font-family:monospace" in h
    assert "-4.71875" in repr(t)


# ------------------------------------------------------------------------------------------------------
# Kinds of input and bad inputs
# ------------------------------------------------------------------------------------------------------
def test_bits_input_kinds():
    x = torch.tensor([[1.5, -2.0, 0.0], [3.0, 4.0, 5.0]])
    s = bits(x)
    assert isinstance(s, np.ndarray) and s.shape == (2, 3) and s[0, 1] == "1 10000000 0000000"
    assert bits(x.to(torch.bfloat16)).tolist() == s.tolist()
    assert bits(torch.tensor(-2.40625, dtype=torch.bfloat16)) == "1 10000000 0011010"
    assert isinstance(bits(torch.tensor(1.0)), str)
    assert bits(torch.tensor([0.1]), "fp32")[0] == "0 01111011 10011001100110011001101"
    assert bits(3) == "0 10000000 1000000"
    assert add_trace(torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor([2.0])).result == 3.0


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="fmt must be one of"):
        bits(1.0, "fp16")
    with pytest.raises(ValueError, match="round it first"):
        bits(0.1)
    with pytest.raises(ValueError, match="round it first"):
        bits(torch.tensor([1.0, 0.1]))
    with pytest.raises(ValueError, match="not exactly representable in fp32"):
        bits(0.1, "fp32")
    with pytest.raises(ValueError, match="not exactly representable in fp32"):
        bits(1e300, "fp32")
    with pytest.raises(TypeError):
        bits("1.0")
    with pytest.raises(TypeError):
        bits(torch.tensor([1, 2]))
    for s in ("101", "0" * 17, "0" * 31, "", "1 10000000 001101a", "1 10000000 0011010 0"):
        with pytest.raises(ValueError):
            from_bits(s)
    with pytest.raises(ValueError, match="16 bits"):
        from_bits("1 10000000 001101")
    with pytest.raises(TypeError):
        from_bits(0b1010)
    with pytest.raises(ValueError, match="round it first"):
        add_trace(0.1, 1.0)
    with pytest.raises(ValueError, match="fp32"):
        add_trace_acc(0.1, 1.0)
    with pytest.raises(ValueError, match="bf16"):
        add_trace_acc(1.0, PAPER_RUNNING_SUM)
    with pytest.raises(ValueError, match="single value"):
        add_trace(torch.ones(2), 1.0)
    with pytest.raises(ValueError, match="round it first"):
        next_up(0.1)
    with pytest.raises(TypeError):
        ulp("1")


def test_docstring_examples():
    import doctest
    res = doctest.testmod(B, optionflags=doctest.ELLIPSIS)
    assert res.attempted >= 10 and res.failed == 0
