"""BF16 at the bit level: bit strings, rounding, neighbours, and BF16 addition traced step by step.

This is the toolkit of chapter 4, "Rounding", which explains every function here. The chapter uses it to
reproduce, bit for bit, the paper's worked addition (Qiu & Yao, ICLR 2026, §4 and Appendix B): two
same-sign, same-exponent "big" terms overflow the significand, the bit shifted out is the rounding bit,
and the low bits that many tiny terms left in the FP32 running sum (the sticky bits) turn what would be
an unbiased half-ulp tie into a rounding away from zero.

Formats (IEEE-754 style, bias 127 for both)::

    fp32  s eeeeeeee fffffffffffffffffffffff   1 sign, 8 exponent, 23 fraction bits
    bf16  s eeeeeeee fffffff                   the upper 16 bits of fp32: 7 fraction bits

Everything is integer bit manipulation on the int32 / int16 view (`round_bf16`), or exact arithmetic on
Python integers and `fractions.Fraction` (`add_trace`), so that each step can be shown and checked.

Public surface::

    bits(x, fmt="bf16") -> "1 10000000 0011010"     from_bits("1 10000000 0011010") -> -2.40625
    classify(x)          -> "zero" | "subnormal" | "normal" | "inf" | "nan"
    describe(x)          -> "-2.40625 = -1.0011010₂ × 2^1"
    round_bf16(x32, mode="rne" | "rtz" | "stochastic", generator=None) -> bf16 tensor
    round_mantissa(x, mantissa, mode="rne" | "rtz" | "stochastic", generator=None, key=None) -> bf16 tensor
                                                      bf16's exponent with `mantissa` <= 7 fraction bits
    round_stochastic(x, dtype=bf16 | fp16, generator=None, *, mantissa=None, key=None) -> unbiased stochastic
                                                      rounding of fp32/fp64
    ulp(x), next_up(x), next_down(x)                  of bf16 values (floats or tensors)
    add_trace(a, b)            -> AddTrace            bf16 + bf16, rounded once to bf16 (RNE)
    add_trace_acc(acc, term)   -> AddTrace            fp32 running sum + bf16 term → fp32 → bf16
    paper_example(sticky=True) -> AddTrace            the paper's worked addition (or its tie twin)
"""
from __future__ import annotations

import html
import math
import numbers
import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
import torch

__all__ = [
    "bits", "from_bits", "classify", "describe", "round_bf16", "round_mantissa", "round_stochastic", "ulp",
    "next_up", "next_down",
    "AddTrace", "add_trace", "add_trace_acc", "paper_example",
    "BF16_MAX", "BF16_SMALLEST_NORMAL", "BF16_SMALLEST_SUBNORMAL", "BF16_EPS",
    "PAPER_RUNNING_SUM", "PAPER_TERM",
]

# ---------------------------------------------------------------------------------------------------
# Format constants
# ---------------------------------------------------------------------------------------------------
_FMTS = {"bf16": (16, 7), "fp32": (32, 23)}  # fmt -> (total bits, fraction bits); both have 8 exp bits
EXP_BIAS = 127
EMIN = -126                                   # exponent of the smallest normal (and of all subnormals)
EMAX = 127                                    # exponent of the largest finite value
BF16_MAX = float.fromhex("0x1.fep127")        # 3.3895e38 = 1.1111111₂ × 2^127
BF16_SMALLEST_NORMAL = 2.0 ** EMIN            # 1.1755e-38, same as fp32
BF16_SMALLEST_SUBNORMAL = 2.0 ** (EMIN - 7)   # 9.1835e-41 = 2^-133
BF16_EPS = 2.0 ** -7                          # ulp(1.0)
_QNAN16 = 0x7FC0                              # quiet NaN (sign bit added separately)

# The paper's worked example (§4): an FP32 running sum whose BF16 truncation is -2.40625 and whose
# low bits (a residual of ≈ 0.00087 left by the many tiny P̄V terms) are the sticky bits, plus the next
# big term -2.296875. The running sum is derived from the stated exact FP32 result -4.703990459442139:
# -4.703990459442139 - (-2.296875) = -2.4071154594421387, exactly representable in FP32.
PAPER_TERM = -2.296875                        # bf16 1 10000000 0010011
PAPER_RUNNING_SUM = -2.4071154594421387       # fp32 1 10000000 0011010 0000111000101110


def _check_fmt(fmt):
    if fmt not in _FMTS:
        raise ValueError(f"fmt must be one of {sorted(_FMTS)} (got {fmt!r})")
    return _FMTS[fmt]


# ---------------------------------------------------------------------------------------------------
# Bit patterns of floats and tensors
# ---------------------------------------------------------------------------------------------------
def _is_real(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _f32_pattern(x: float) -> int:
    """The fp32 bit pattern of a Python float that is exactly representable in fp32 (else ValueError)."""
    x = float(x)
    if math.isnan(x):
        return 0x7FC00000 | (0x80000000 if math.copysign(1.0, x) < 0 else 0)
    try:
        p = struct.unpack(">I", struct.pack(">f", x))[0]
    except OverflowError:
        p = None
    if p is None or struct.unpack(">f", struct.pack(">I", p))[0] != x:
        raise ValueError(f"{x!r} is not exactly representable in fp32; round it first, e.g. "
                         f"torch.tensor({x!r}, dtype=torch.float32).item()")
    return p


def _float_pattern(x, fmt: str) -> int:
    """Bit pattern (16 or 32 bits) of a real number in `fmt`; ValueError if it is not exact there."""
    p32 = _f32_pattern(x)
    if fmt == "fp32":
        return p32
    if (p32 & 0x7FFFFFFF) > 0x7F800000:        # NaN: canonical quiet NaN, sign kept
        return (p32 >> 16) & 0x8000 | _QNAN16
    if p32 & 0xFFFF:
        raise ValueError(f"{float(x)!r} is not exactly representable in bf16; round it first, e.g. "
                         f"round_bf16(torch.tensor({float(x)!r}, dtype=torch.float32)) or "
                         f"torch.tensor({float(x)!r}).to(torch.bfloat16)")
    return p32 >> 16


def _tensor_patterns(t: torch.Tensor, fmt: str) -> np.ndarray:
    """Bit patterns of a floating tensor in `fmt` as a numpy int64 array (ValueError if inexact)."""
    if not t.is_floating_point():
        raise TypeError(f"expected a floating-point tensor (got dtype {t.dtype})")
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        p16 = t.contiguous().view(torch.int16).numpy().astype(np.int64) & 0xFFFF
        return p16 << 16 if fmt == "fp32" else p16
    t32 = t.float()
    same = (t32.to(t.dtype) == t) | torch.isnan(t)
    if not bool(same.all()):
        bad = t[~same].flatten()[0].item()
        raise ValueError(f"tensor value {bad!r} is not exactly representable in fp32; round it first "
                         "(e.g. .to(torch.float32))")
    p32 = t32.contiguous().view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    if fmt == "fp32":
        return p32
    nan = (p32 & 0x7FFFFFFF) > 0x7F800000
    inexact = (p32 & 0xFFFF != 0) & ~nan
    if inexact.any():
        bad = t32.flatten()[int(np.flatnonzero(inexact.ravel())[0])].item()
        raise ValueError(f"tensor value {bad!r} is not exactly representable in bf16; round it first, e.g. "
                         "round_bf16(x) or x.to(torch.bfloat16)")
    return np.where(nan, (p32 >> 16) & 0x8000 | _QNAN16, p32 >> 16)


def _fmt_pattern(p: int, fmt: str) -> str:
    n, f = _FMTS[fmt]
    return f"{p >> (n - 1) & 1} {p >> f & 0xFF:08b} {p & ((1 << f) - 1):0{f}b}"


@lru_cache(maxsize=1)
def _bf16_table() -> np.ndarray:
    """All 65,536 bf16 bit strings, indexed by bit pattern (built once, ~50 ms)."""
    return np.array([_fmt_pattern(p, "bf16") for p in range(1 << 16)])


def bits(x, fmt: str = "bf16"):
    """Bit string "sign exponent fraction" of `x` in `fmt` ("bf16" or "fp32").

    A Python float (or a 0-d tensor) gives one string; a tensor with dimensions gives a numpy array of
    strings of the same shape. With fmt="bf16" the value must be exactly representable in bf16 (round it
    first with `round_bf16` or `.to(torch.bfloat16)`), else ValueError. NaN is shown as the canonical
    quiet NaN. Explained in chapter 4, "Rounding".

    >>> bits(-2.40625)
    '1 10000000 0011010'
    >>> bits(-4.703990459442139, "fp32")
    '1 10000001 00101101000011100010111'
    """
    _check_fmt(fmt)
    if isinstance(x, torch.Tensor):
        p = _tensor_patterns(x, fmt)
        if fmt == "bf16":
            out = np.asarray(_bf16_table()[p])
        else:
            out = np.array([_fmt_pattern(int(v), fmt) for v in p.ravel()], dtype="<U34").reshape(p.shape)
        return str(out[()]) if out.ndim == 0 else out
    if _is_real(x):
        return _fmt_pattern(_float_pattern(x, fmt), fmt)
    raise TypeError(f"bits() takes a real number or a torch tensor (got {type(x).__name__})")


def from_bits(s: str) -> float:
    """The value of a bit string: 16 bits (bf16) or 32 bits (fp32), spaces optional.

    >>> from_bits("1 10000000 0011010")
    -2.40625
    >>> from_bits("1 10000001 0010110 1 000011100010111")
    -4.703990459442139
    """
    if not isinstance(s, str):
        raise TypeError(f"from_bits() takes a string of 0s and 1s (got {type(s).__name__})")
    t = "".join(s.split())
    if not t or set(t) - {"0", "1"}:
        raise ValueError(f"a bit string may hold only 0, 1 and spaces (got {s!r})")
    if len(t) not in (16, 32):
        raise ValueError(f"a bit string needs 16 bits (bf16) or 32 bits (fp32); {s!r} has {len(t)}")
    p = int(t, 2) << (16 if len(t) == 16 else 0)
    return struct.unpack(">f", struct.pack(">I", p))[0]


def _bf16_input(x):
    """(bf16 patterns as an int64 tensor, a function that turns result patterns into x's kind)."""
    if isinstance(x, torch.Tensor):
        p = torch.from_numpy(np.asarray(_tensor_patterns(x, "bf16"), dtype=np.int64))
        dtype, device = x.dtype, x.device

        def back(q):
            return _patterns_to_bf16(q).to(device=device, dtype=dtype)
        return p, back
    if _is_real(x):
        p = torch.tensor(_float_pattern(x, "bf16"), dtype=torch.int64)
        return p, lambda q: _patterns_to_bf16(q).item()
    raise TypeError(f"expected a bf16 value: a float or a tensor (got {type(x).__name__})")


def _fp32_patterns(x: torch.Tensor) -> torch.Tensor:
    """The bit patterns of an fp32 tensor as int64 in [0, 2^32) (contiguous, x's shape)."""
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _patterns_to_bf16(p: torch.Tensor) -> torch.Tensor:
    """int64 tensor of 16-bit patterns (0..65535) -> bf16 tensor."""
    p = p.to(torch.int64)
    return torch.where(p >= 0x8000, p - 0x10000, p).to(torch.int16).view(torch.bfloat16)


def classify(x):
    """"zero", "subnormal", "normal", "inf" or "nan" for a bf16 value (or an array of these for a tensor).

    >>> classify(2.0 ** -130), classify(-0.0), classify(float("inf"))
    ('subnormal', 'zero', 'inf')
    """
    p, _ = _bf16_input(x)
    mag = p.numpy() & 0x7FFF
    e, f = mag >> 7, mag & 0x7F
    out = np.select([mag == 0, e == 0, e < 255, f == 0], ["zero", "subnormal", "normal", "inf"], "nan")
    return str(out[()]) if out.ndim == 0 else out


def describe(x, fmt: str = "bf16") -> str:
    """A value in scientific binary: sign, significand with its hidden bit, power of two.

    >>> describe(-2.40625)
    '-2.40625 = -1.0011010₂ × 2^1'
    """
    _, f = _check_fmt(fmt)
    p = _float_pattern(x, fmt)
    sign = "-" if p >> (f + 8) & 1 else ""
    e, frac = p >> f & 0xFF, p & ((1 << f) - 1)
    v = float(x)
    if e == 0xFF:
        return f"{v!r}"
    hidden, exp = (1, e - EXP_BIAS) if e else (0, EMIN)
    return f"{v!r} = {sign}{hidden}.{frac:0{f}b}₂ × 2^{exp}"


# ---------------------------------------------------------------------------------------------------
# Rounding fp32 -> bf16 on the int32 view
# ---------------------------------------------------------------------------------------------------
ROUNDING_MODES = ("rne", "rtz", "stochastic")


def round_bf16(x: torch.Tensor, mode: str = "rne", generator: torch.Generator | None = None) -> torch.Tensor:
    """Round an fp32 tensor to bf16 by integer arithmetic on its int32 view.

    mode "rne": round to nearest, ties to even (what `.to(torch.bfloat16)` does): add 0x7FFF plus the
    lowest kept bit, then drop the 16 low bits; overflow to ±inf falls out of the carry.
    mode "rtz": round toward zero, i.e. drop the 16 low bits (truncate).
    mode "stochastic": add a uniform random 16-bit integer (from `generator`), then drop the low bits,
    so x rounds away from zero with probability (distance to the lower-magnitude neighbour) / ulp.
    NaN becomes the quiet NaN 0x7FC0 with x's sign in every mode (torch's CPU cast gives 0xFFFF; both
    are NaN). Explained in chapter 4, "Rounding".

    >>> round_bf16(torch.tensor([1.00390625, 1.01171875])).tolist()   # two exact ties
    [1.0, 1.015625]
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"round_bf16 takes a float32 tensor (got {type(x).__name__}); "
                        "wrap it: torch.tensor(x, dtype=torch.float32)")
    if x.dtype != torch.float32:
        raise TypeError(f"round_bf16 takes a float32 tensor (got dtype {x.dtype}); convert with "
                        ".to(torch.float32) first (from float64 that is itself a rounding)")
    if mode not in ROUNDING_MODES:
        raise ValueError(f"mode must be one of {ROUNDING_MODES} (got {mode!r})")
    u = _fp32_patterns(x)
    if mode == "rne":
        lsb = (u >> 16) & 1                                              # lowest kept bit
        r = (u + 0x7FFF + lsb) >> 16                                     # > half: carry; = half: to even
    elif mode == "rtz":
        r = u >> 16
    else:
        noise = torch.randint(0, 1 << 16, u.shape, generator=generator, device=u.device, dtype=torch.int64)
        r = (u + noise) >> 16                                            # carry with prob low16 / 2^16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = torch.where(nan, (u >> 16) & 0x8000 | _QNAN16, r)
    return _patterns_to_bf16(r)


# ---------------------------------------------------------------------------------------------------
# Fewer fraction bits: bf16's exponent with K <= 7 fraction bits (the precision dial)
# ---------------------------------------------------------------------------------------------------
#: Fraction bits a K-bit format may keep: 1 … 7 (7 is bf16 itself).
MANTISSA_BITS = range(1, 8)


def _check_mantissa(mantissa) -> int:
    if isinstance(mantissa, bool) or not isinstance(mantissa, int) or mantissa not in MANTISSA_BITS:
        raise ValueError(f"mantissa must be an int in 1..7, the fraction bits kept of bf16's 7 (got {mantissa!r})")
    return mantissa


def _draw(shape, nbits: int, draw: int, device, generator, key) -> torch.Tensor:
    """Uniform random int64 in [0, 2^nbits): from the counter-based `key` (`lpfail.sr_stream.RoundingKey`) when
    given, else from torch.randint with `generator` (None: the device's default generator)."""
    if key is not None:
        return key.bits(shape, nbits, draw=draw, device=device)
    return torch.randint(0, 1 << nbits, shape, generator=generator, device=device, dtype=torch.int64)


def _round_pattern(u: torch.Tensor, shift: int, mode: str, noise: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 patterns u (int64, 0 … 2^32 − 1) rounded to 23 − shift fraction bits: the 16-bit pattern of the
    result (its low `shift` − 16 fraction bits are zero). Works on the magnitude, so no carry reaches the sign;
    a carry out of the largest finite value gives the pattern of ±inf; NaN becomes the quiet NaN with its sign."""
    sign = u & 0x80000000
    mag = u & 0x7FFFFFFF
    if mode == "rne":
        lsb = (mag >> shift) & 1                                         # lowest kept bit
        r = (mag + ((1 << (shift - 1)) - 1) + lsb) >> shift              # > half: carry; = half: to even
    elif mode == "rtz":
        r = mag >> shift
    else:
        r = (mag + noise) >> shift                                       # carry with prob low bits / 2^shift
    r = ((r << shift) | sign) >> 16
    return torch.where(mag > 0x7F800000, (sign >> 16) | _QNAN16, r)


def _round_to_odd_fp32(x: torch.Tensor) -> torch.Tensor:
    """fp32 patterns (int64) of float64 values rounded to fp32 *to odd*: truncated toward zero, and the last bit
    set when that dropped anything. Rounding to odd and then to nearest even in a format with at least two
    fraction bits fewer (here 7 or fewer of fp32's 23, at every exponent, subnormals included) equals rounding
    to nearest even directly; beyond fp32's largest value the truncation is that largest value (odd), which a
    K-bit format rounds on to ±inf as it must."""
    y = x.to(torch.float32)
    u = _fp32_patterns(y)
    sign, mag = u & 0x80000000, u & 0x7FFFFFFF
    ya, xa = y.double().abs(), x.abs()
    mag = torch.where(ya > xa, mag - 1, mag)                             # rounded away from zero: step back
    mag = torch.where((ya != xa) & ~torch.isnan(x), mag | 1, mag)        # inexact: odd
    return sign | mag


_BF16_TABLES: dict = {}


def _round_bf16_patterns(x: torch.Tensor, shift: int, mode: str) -> torch.Tensor:
    """bf16 values rounded to 7 − shift fraction bits: a look-up in the table of all 65,536 bf16 patterns rounded
    by `_round_pattern` (their fp32 patterns are the bf16 ones followed by 16 zero bits), made once per
    (shift, mode, device). NaN becomes the quiet NaN with its sign, as from fp32."""
    tkey = (shift, mode, x.device)
    table = _BF16_TABLES.get(tkey)
    if table is None:
        every = torch.arange(1 << 16, dtype=torch.int64, device=x.device)
        table = _patterns_to_bf16(_round_pattern(every << 16, shift + 16, mode)).view(torch.int16)
        _BF16_TABLES[tkey] = table
    idx = x.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return table.index_select(0, idx.reshape(-1)).view(torch.bfloat16).reshape(x.shape)


def round_mantissa(x: torch.Tensor, mantissa: int, mode: str = "rne", generator: torch.Generator | None = None,
                   key=None) -> torch.Tensor:
    """Round to bf16's exponent with only `mantissa` (K, 1 … 7) fraction bits; the result is a bf16 tensor whose
    low 7 − K fraction bits are zero. K = 7 is bf16 itself: mode "rne" then equals ``.to(torch.bfloat16)`` bit
    for bit.

    The arithmetic is `round_bf16`'s on the fp32 bit pattern, with the low 23 − K bits dropped instead of 16:

    * "rne": add 2^(22−K) − 1 plus the lowest kept bit, drop the low bits (ties to even);
    * "rtz": drop the low bits;
    * "stochastic": add a uniform random integer of 23 − K bits, then drop them, so the magnitude rounds up with
      probability (its distance to the lower neighbour) / spacing, exactly (see `round_stochastic`).

    Range: bf16's exponent (bias 127, largest finite value (2 − 2^−K)·2^127). Past it the value rounds to ±inf
    as in IEEE arithmetic (to nearest: from (2 − 2^(−K−1))·2^127 on; stochastically, with the last spacing
    continued). Subnormals are gradual, with K fraction bits: below 2^−126 the spacing is 2^(−126−K) (bf16's
    2^−133 at K = 7), which is what dropping the same low bits of an fp32 subnormal pattern gives. Zero keeps its
    sign, ±inf stays, NaN becomes the quiet NaN 0x7FC0 with x's sign.

    Input: float32, or bf16 / fp16 (widened to fp32 exactly). float64 is rounded exactly too: to nearest even
    through a round-to-odd to fp32 (`_round_to_odd_fp32`), stochastically by `round_stochastic`'s exact
    comparison. Random bits come from `key` (`lpfail.sr_stream.RoundingKey`, counter-based) when given, else from
    torch.randint with `generator`. On CUDA, FP32 input rounded to nearest or with a key runs as one fused Triton
    kernel with the same bits (`lpfail.fused`).

    >>> round_mantissa(torch.tensor([1.0625, 1.1875, 1.09375]), 3).tolist()   # K = 3: spacing 1/8 in [1, 2)
    [1.0, 1.25, 1.125]
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"round_mantissa takes a floating-point tensor (got {got})")
    k = _check_mantissa(mantissa)
    if mode not in ROUNDING_MODES:
        raise ValueError(f"mode must be one of {ROUNDING_MODES} (got {mode!r})")
    if generator is not None and key is not None:
        raise ValueError("give either a generator or a key, not both")
    if mode == "stochastic":
        if x.dtype != torch.float64:
            x = x.float()
        return round_stochastic(x, torch.bfloat16, generator, mantissa=k, key=key)
    if x.dtype == torch.bfloat16:
        return _round_bf16_patterns(x, 7 - k, mode)
    if x.dtype == torch.float64:
        u = _round_to_odd_fp32(x)
    else:
        x = x.float()
        fast = _fused_rne(x, 23 - k) if mode == "rne" else None   # one Triton kernel on CUDA, same bits
        if fast is not None:
            return fast
        u = _fp32_patterns(x)
    return _patterns_to_bf16(_round_pattern(u, 23 - k, mode))


def _fused_rne(x: torch.Tensor, shift: int, interpret: bool = False) -> torch.Tensor | None:
    """`round_mantissa`'s round to nearest even of the FP32 tensor x as one fused Triton kernel
    (`lpfail.round_kernels.rne_fp32_to_bf16`), or None where it does not apply (`lpfail.fused.usable`, its check
    not passed on x's device): the caller then takes the PyTorch path. `interpret`: Triton's interpreter, unchecked."""
    from lpfail import fused

    return fused.apply("rne_fp32_to_bf16", x, shift, interpret, _compare_rne, lambda k: fused.launch(k, x, shift))


def _compare_rne(kern, device, shift: int) -> bool:
    """The fused round to nearest against `_round_pattern` on `lpfail.fused.check_tensor`."""
    from lpfail import fused

    x = fused.check_tensor(device)
    want = _patterns_to_bf16(_round_pattern(_fp32_patterns(x), shift, "rne"))
    return torch.equal(fused.launch(kern, x, shift).view(torch.int16), want.view(torch.int16))


#: 16-bit formats `round_stochastic` rounds to: (fraction bits, exponent bias).
_SR_FORMATS = {torch.bfloat16: (7, 127), torch.float16: (10, 15)}
_SR_BITS = 62                                 # random bits per draw of the exact Bernoulli comparison


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as float64, exactly, for an int64 tensor k in [-1022, 1023] (built from its bit pattern)."""
    return ((k + 1023) << 52).view(torch.float64)


def _exact_up(p: torch.Tensor, device, generator, key) -> torch.Tensor:
    """Bernoulli(p) for exact dyadic probabilities p in [0, 1], exactly: up ⇔ U < p for U uniform in [0, 1),
    compared 62 random bits at a time, drawing again for the elements the bits so far leave undecided (which
    reads one flag back from the device per round)."""
    up = torch.zeros(p.shape, dtype=torch.bool, device=device)
    pending = torch.ones_like(up)
    draw = 0
    while True:
        t = p * float(1 << _SR_BITS)                      # exact: a power-of-two scaling
        whole = torch.floor(t)
        w = whole.to(torch.int64)                         # ≤ 2^62
        r = _draw(p.shape, _SR_BITS, draw, device, generator, key)
        up = up | (pending & (r < w))
        p = t - whole                                     # exact: the bits of p below these 62
        pending = pending & (r == w) & (p > 0)            # undecided: the next 62 bits of U decide
        draw += 1
        if not bool(pending.any()):
            return up


def round_stochastic(x: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                     generator: torch.Generator | None = None, *, mantissa: int | None = None,
                     key=None) -> torch.Tensor:
    """Stochastic rounding of an fp32 or fp64 tensor to bf16 or fp16: unbiased, E[result] = x exactly.

    Each finite nonzero x becomes one of its two neighbours in `dtype`, lo ≤ |x| < hi (magnitudes), the
    upper one with probability (|x| − lo) / (hi − lo); values representable in `dtype` never move. The
    expectation is x exactly for every finite x of the input whose magnitude is at most the largest finite
    value of `dtype`, subnormals included. fp32 → bf16 is the classic trick (`round_bf16` mode "stochastic":
    a uniform 16-bit integer added to the low 16 bits of the fp32 pattern, then truncation; bf16 has fp32's
    exponent range, so it is exact down to the subnormals). Every other pair (fp64 input: fp64 → fp32 would
    itself be a rounding; or fp16 output) computes the neighbours in float64 and compares the exact
    probability, a dyadic fraction, with uniform random integers of 62 bits, drawing 62 more bits for the
    (probability 2^-62) elements the first draw leaves undecided, so the comparison is exact; this path
    reads one flag back from the device per call.

    ``mantissa=K`` (1 … 7, bf16 only) rounds to bf16's exponent with K fraction bits instead of 7 (the format
    of `round_mantissa`; the result is still a bf16 tensor): from fp32 with a uniform integer of 23 − K bits, from
    fp64 by the exact comparison. K = 7 is plain bf16.

    Overflow: above the largest finite value M the format is continued by its last spacing (2^120 for bf16,
    32 for fp16), whose next value is ±inf: |x| in (M, M + spacing) becomes ±inf with probability
    (|x| − M) / spacing, larger values always do. Zero (either sign), ±inf and NaN pass through unchanged.

    Randomness: with `key` (a `lpfail.sr_stream.RoundingKey`), counter-based bits that depend only on the key,
    the round of draws and each element's index — the same on every device, eager or in a CUDA graph (this is
    what the attention's output path uses under ``Precision.rounding = "sr"``). Without it, `torch.randint`
    with `generator` (which must live on x's device), or that device's default generator when None, so results
    follow torch.manual_seed, are deterministic under torch.use_deterministic_algorithms, and resume
    bit-exactly from a checkpoint of torch's RNG state.

    >>> x = torch.full((100_000,), 1.0 + 2.0 ** -9)    # a quarter of the way from 1.0 to its bf16 successor
    >>> r = round_stochastic(x, generator=torch.Generator().manual_seed(0))
    >>> sorted(set(r.tolist())), abs(r.double().mean().item() - (1.0 + 2.0 ** -9)) < 1e-4
    ([1.0, 1.0078125], True)
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"round_stochastic takes a float32 or float64 tensor (got {type(x).__name__})")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"round_stochastic takes a float32 or float64 tensor (got dtype {x.dtype}): it rounds "
                        "a wider value to a 16-bit format, and a 16-bit input has nothing left to round")
    if dtype not in _SR_FORMATS:
        raise ValueError(f"round_stochastic rounds to torch.bfloat16 or torch.float16 (got {dtype}): the wider "
                         "formats are where the attention's values are computed, not rounded to")
    if generator is not None and key is not None:
        raise ValueError("give either a generator or a key, not both")
    if mantissa is not None and dtype != torch.bfloat16:
        raise ValueError(f"mantissa={mantissa!r} needs dtype=torch.bfloat16 (fewer fraction bits of bf16's "
                         f"exponent); got {dtype}")
    k = 7 if mantissa is None else _check_mantissa(mantissa)
    if dtype == torch.bfloat16:
        shift = 23 - k
        if x.dtype == torch.float32:
            fused = getattr(key, "round_fp32", None)   # a RoundingKey: one Triton kernel on CUDA, same bits
            fast = None if fused is None else fused(x, shift)
            if fast is not None:
                return fast
            u = _fp32_patterns(x)
            noise = _draw(u.shape, shift, 0, x.device, generator, key)
            return _patterns_to_bf16(_round_pattern(u, shift, "stochastic", noise))
        return _stochastic_bf16_from_fp64(x, k, generator, key)
    frac_bits, bias = _SR_FORMATS[dtype]
    regular = torch.isfinite(x) & (x != 0)
    a = torch.where(regular, x.abs().double(), torch.ones((), dtype=torch.float64, device=x.device))
    near = a.to(dtype)                                    # round to nearest: one of the two neighbours
    mag = near.view(torch.int16).to(torch.int64) & 0x7FFF
    mag = mag - (near.double() > a).to(torch.int64)       # the pattern of lo, the neighbour toward zero
    lo = mag.to(torch.int16).view(dtype).double()
    k = (mag >> frac_bits).clamp(min=1) - bias - frac_bits  # hi − lo = 2^k (past the max: the spacing continued)
    p = ((a - lo) * _pow2(-k)).clamp(max=1.0)             # exact dyadic P(hi); 1 for |x| ≥ max + spacing
    up = _exact_up(p, x.device, generator, key)
    mag = mag + up.to(torch.int64)                        # max finite + 1 is the pattern of +inf
    pattern = mag | (torch.signbit(x).to(torch.int64) << 15)
    out = torch.where(pattern >= 0x8000, pattern - 0x10000, pattern).to(torch.int16).view(dtype)
    return torch.where(regular, out, x.to(dtype))         # ±0, ±inf and NaN: unchanged


def _stochastic_bf16_from_fp64(x: torch.Tensor, k: int, generator, key) -> torch.Tensor:
    """`round_stochastic` of float64 values to bf16's exponent with k fraction bits. The lower neighbour lo is x
    truncated toward zero — to fp32 first (the pattern stepped back where the conversion rounded away), then to k
    bits by dropping the low 23 − k bits; truncations compose, since fp32's grid contains the k-bit one at every
    exponent. |x| − lo is then exactly the dropped bits, and P(hi) = (|x| − lo) / 2^e an exact dyadic fraction."""
    shift = 23 - k
    regular = torch.isfinite(x) & (x != 0)
    a = torch.where(regular, x.abs(), torch.ones((), dtype=torch.float64, device=x.device))
    y = a.to(torch.float32)
    t = y.view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    t = t - (y.double() > a).to(torch.int64)               # a truncated toward zero to fp32 (inf → the max)
    lo_pat = (t >> shift) << shift                         # ... and to k fraction bits
    lo = (lo_pat.to(torch.int32)).view(torch.float32).double()
    e = (lo_pat >> 23).clamp(min=1) - 127 - k              # spacing 2^e (subnormals: exponent field 1's)
    p = ((a - lo) * _pow2(-e)).clamp(max=1.0)              # exact dyadic P(hi); 1 for |x| ≥ max + spacing
    up = _exact_up(p, x.device, generator, key)
    pattern = (lo_pat + (up.to(torch.int64) << shift)) >> 16    # max finite + spacing is the pattern of +inf
    pattern = pattern | (torch.signbit(x).to(torch.int64) << 15)
    return torch.where(regular, _patterns_to_bf16(pattern), x.to(torch.bfloat16))  # ±0, ±inf, NaN: unchanged


# ---------------------------------------------------------------------------------------------------
# Neighbours and ulp
# ---------------------------------------------------------------------------------------------------
def _next_up_patterns(p: torch.Tensor) -> torch.Tensor:
    neg, mag = p >> 15 & 1, p & 0x7FFF
    r = torch.where(neg == 1, p - 1, p + 1)       # away from zero for +, toward zero for −
    r = torch.where(mag == 0, torch.ones_like(p), r)            # ±0 -> smallest subnormal
    r = torch.where((mag > 0x7F80) | (p == 0x7F80), p, r)       # NaN and +inf stay
    return r


def next_up(x):
    """The smallest bf16 value greater than x (x a bf16 float or tensor); +inf and NaN stay.

    >>> next_up(1.0), next_up(-0.0) == 2.0 ** -133
    (1.0078125, True)
    """
    p, back = _bf16_input(x)
    return back(_next_up_patterns(p))


def next_down(x):
    """The largest bf16 value less than x (x a bf16 float or tensor); -inf and NaN stay.

    >>> next_down(1.0)
    0.99609375
    """
    p, back = _bf16_input(x)
    return back(_next_up_patterns(p ^ 0x8000) ^ 0x8000)


def ulp(x):
    """Unit in the last place of a bf16 value: the spacing to the next larger-magnitude bf16 value.

    ulp(x) = 2^(e - 7) for a value with exponent e (2^-133 for zero and subnormals); for ±BF16_MAX it is
    2^120, the spacing the format would continue with; NaN for ±inf and NaN.

    >>> ulp(1.0), ulp(-2.40625), ulp(4.6875)
    (0.0078125, 0.015625, 0.03125)
    """
    p, back = _bf16_input(x)
    e = torch.clamp((p & 0x7FFF) >> 7, min=1)          # exponent field; subnormals share exponent 1's ulp
    k = e - EXP_BIAS - 7                              # ulp = 2^k, k in [-133, 120]
    r = torch.where(k >= EMIN, (k + EXP_BIAS).clamp(min=0) << 7, 1 << (k - (EMIN - 7)).clamp(min=0))
    r = torch.where(e == 255, torch.full_like(p, _QNAN16), r)
    return back(r)


# ---------------------------------------------------------------------------------------------------
# BF16 addition, step by step (paper Appendix B)
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Num:
    """A finite float as sign, exponent and integer significand: (-1)^sign · sig · 2^(exp - p)."""

    value: float
    fmt: str
    sign: int
    exp: int      # unbiased; EMIN for zero and subnormals
    sig: int      # significand with its hidden bit (0 for zero/subnormal)
    p: int        # fraction bits of the format

    @staticmethod
    def of(x: float, fmt: str) -> "_Num":
        _, f = _FMTS[fmt]
        pat = _float_pattern(x, fmt)
        sign, e, frac = pat >> (f + 8) & 1, pat >> f & 0xFF, pat & ((1 << f) - 1)
        if e == 0:
            return _Num(float(x), fmt, sign, EMIN, frac, f)
        return _Num(float(x), fmt, sign, e - EXP_BIAS, frac | 1 << f, f)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value)

    @property
    def exact(self) -> Fraction:
        return Fraction(self.value)


def _rne(R: int, sh: int, E: int, W: int):
    """Round R · 2^(E - W - sh) (normalized to exponent E) to W fraction bits, ties to even.

    Returns kept significand, exponent, guard, round, sticky, the sh dropped bits as a string, decision,
    direction, and whether the result overflowed."""
    if sh <= 0:
        kept, rem, rest = R << -sh, 0, ""
    else:
        kept, rem, rest = R >> sh, R & ((1 << sh) - 1), format(R & ((1 << sh) - 1), f"0{sh}b")
    g = rem >> (sh - 1) & 1 if sh >= 1 else 0
    r = rem >> (sh - 2) & 1 if sh >= 2 else 0
    s = int(rem & ((1 << (sh - 2)) - 1) != 0) if sh >= 3 else 0
    if not g:
        decision, inc = ("exact" if rem == 0 else "down"), 0
    elif r or s:
        decision, inc = "up", 1
    else:
        decision, inc = "tie→even", kept & 1
    direction = "away from zero" if inc else ("toward zero" if rem else "none")
    kept += inc
    if kept >> (W + 1):                               # 1.1111111 + ulp = 10.0000000: renormalize
        kept, E = kept >> 1, E + 1
    return kept, E, g, r, s, rest, decision, direction, E > EMAX


def _value(sign: int, kept: int, E: int, W: int, overflow: bool) -> float:
    if overflow:
        return -math.inf if sign else math.inf
    v = float(Fraction(kept) * Fraction(2) ** (E - W))
    return -v if sign else v


def _abbrev(s: str, limit: int = 40) -> str:
    """Shorten a long run of bits for display, keeping both ends."""
    if len(s) <= limit:
        return s
    return f"{s[:12]}…({len(s) - 28} bits)…{s[-16:]}"


def _sig_segments(X: int, frac_bits: int, int_digits: int = 1, W: int = 7, roles=("lost",)):
    """Segments of X read as a significand with `frac_bits` fraction bits: 'h.fffffff' | extra bits."""
    s = format(X, f"0{frac_bits + int_digits}b")
    head = s[:len(s) - frac_bits].rjust(2) + "." + s[len(s) - frac_bits:][:W]
    rest = s[len(s) - frac_bits:][W:]
    segs = [(head, "kept")]
    if rest:
        segs += [("|", "sep"), (rest, roles[0])]
    return segs


def _round_segments(kept_pre: int, rest: str, W: int = 7):
    """Segments of a normalized significand split for rounding: kept | guard | round+sticky bits."""
    head = f"{kept_pre >> W:>2}.{kept_pre & ((1 << W) - 1):0{W}b}"
    segs = [(head, "kept")]
    if rest:
        segs += [("|", "sep"), (rest[0], "guard")]
        if rest[1:]:
            segs += [("|", "sep"), (rest[1:], "sticky")]
    return segs


def _fmt_exact(q) -> str:
    if not isinstance(q, Fraction):
        return repr(q)
    f = float(q)
    if Fraction(f) == q:
        return repr(f)
    return f"≈{f!r} (exactly {q})" if len(str(q)) <= 40 else f"≈{f!r}"


@dataclass(frozen=True)
class AddTrace:
    """One floating-point addition, recorded in the paper's four steps (Appendix B).

    Operands: `a`, `b` with formats `a_fmt`, `b_fmt` ("bf16" for `add_trace`; "fp32" accumulator and
    "bf16" term for `add_trace_acc`). `kind` is "bf16 + bf16" or "fp32 acc + bf16".

    1. alignment: `big` names the larger-magnitude operand ("a" or "b"); the other's significand is
       shifted right by `exponent_gap`; `shifted_out` are its bits that fall below the 7 BF16 fraction bits.
    2. `operation` "add" or "subtract" (mixed signs) of the aligned significands, exact: `sum_bits`.
    3. `normalization` "carry" (shift right by one: the bit shifted out becomes the rounding bit),
       "cancellation" (shift left by `-shift`), "none", or "zero" (exact cancellation); `shift` is +1, -k or 0.
       For `add_trace_acc`, the exact sum is first rounded to the fp32 accumulator: `fp32_result`.
    4. rounding to 7 fraction bits, ties to even, from `guard` (the paper's "rounding bit": the first bit
       below the kept ones), `round` (the second) and `sticky` (OR of all later bits); `sticky_bits` is
       the whole string after the guard bit (the paper's "sticky bits"). `decision` is "exact", "down",
       "up" or "tie→even"; `direction` is "none", "toward zero" or "away from zero".

    Outcome: `exact` (Fraction, the true sum), `result` (the bf16 float), `error` = result − exact
    (Fraction; NaN for non-finite cases), `result_bits`. `note` explains special cases (inf/NaN operands,
    overflow). `steps` gives (step, bits, note) rows; `str()` a text table; in a notebook it renders as
    an HTML table with the rounding bit and sticky bits highlighted.
    """

    a: float
    b: float
    a_fmt: str
    b_fmt: str
    kind: str
    exact: Fraction | float
    result: float
    error: Fraction | float
    result_bits: str
    big: str | None = None
    exponent_gap: int | None = None
    shifted_out: str = ""
    operation: str | None = None
    sum_bits: str = ""
    normalization: str | None = None
    shift: int = 0
    normalized_bits: str = ""
    fp32_result: float | None = None
    fp32_bits: str | None = None
    guard: int = 0
    round: int = 0
    sticky: int = 0
    sticky_bits: str = ""
    decision: str = "exact"
    direction: str = "none"
    note: str = ""
    _rows: tuple = ()

    @property
    def rounding_bit(self) -> int:
        """The paper's name for the guard bit: the first bit below the 7 kept fraction bits."""
        return self.guard

    @property
    def sticky_nonzero(self) -> bool:
        """Whether any bit after the rounding bit is 1 (a 'tie' is then really more than half an ulp)."""
        return "1" in self.sticky_bits

    @property
    def steps(self) -> list[tuple[str, str, str]]:
        """(step name, bits, note) rows, e.g. for a widget; bits use '|' to mark the rounding position."""
        return [(name, "".join(t for t, _ in segs), note) for name, segs, note in self._rows]

    def __str__(self) -> str:
        rows = [(n, "".join(_abbrev(t) for t, _ in segs), note) for n, segs, note in self._rows]
        wn = max(len(n) for n, _, _ in rows)
        wb = max(len(b) for _, b, _ in rows)
        head = f"{self.kind}: {self.a!r} + {self.b!r}"
        return "\n".join([head] + [f"  {n:<{wn}}  {b:<{wb}}  {note}".rstrip() for n, b, note in rows])

    def __repr__(self) -> str:
        return (f"AddTrace({self.kind}: {self.a!r} + {self.b!r} = {_fmt_exact(self.exact)} -> "
                f"{self.result!r}, {self.decision}, {self.direction}, error {_fmt_exact(self.error)})")

    def _repr_html_(self) -> str:
        style = {
            "guard": "background:#ffd54f;font-weight:bold",     # the rounding bit
            "sticky": "background:#90caf9",                      # the sticky bits
            "lost": "color:#9e9e9e",                             # bits below BF16 precision
            "sep": "color:#bdbdbd",
        }
        out = ['<table style="border-collapse:collapse">',
               f'<caption style="text-align:left">{html.escape(self.kind)}: '
               f'{html.escape(repr(self.a))} + {html.escape(repr(self.b))}</caption>']
        for name, segs, note in self._rows:
            cells = []
            for t, role in segs:
                t = html.escape(_abbrev(t, 64))
                cells.append(f'<span class="{role}" style="{style[role]}">{t}</span>' if role in style else t)
            # the explanation goes under the bits, in the same cell, and wraps to their width: a third column
            # beside 64 monospace bits would be wider than the book's text column
            out.append(f'<tr><td style="text-align:left;vertical-align:top;padding-right:1em">{html.escape(name)}'
                       f'</td><td style="text-align:left;padding-bottom:0.4em">'
                       f'<div style="font-family:monospace;white-space:pre">{"".join(cells)}</div>'
                       f'<div style="white-space:normal;font-size:0.9em;color:#555">{html.escape(note)}</div>'
                       f'</td></tr>')
        out.append("</table>")
        return "\n".join(out)


def _operand_row(name: str, n: _Num):
    b = _fmt_pattern(_float_pattern(n.value, n.fmt), n.fmt)
    segs = [(b, "bits")]
    if n.fmt == "fp32":                           # show where bf16 precision ends
        segs = [(b[:18], "bits"), ("|", "sep"), (b[18:], "lost")]
        low = Fraction(n.value) - Fraction(from_bits(b[:18]))
        return (name, segs, f"{describe(n.value, 'fp32')}; its bits below bf16 precision are worth "
                            f"{float(low):+.6g}")
    return (name, segs, describe(n.value, n.fmt))


def _special(a: _Num, b: _Num, kind: str) -> AddTrace:
    """inf or NaN operands: no significand arithmetic, IEEE rules decide."""
    v = a.value + b.value
    if math.isnan(v):
        why = "a NaN operand" if math.isnan(a.value) or math.isnan(b.value) else "inf + (−inf)"
        note = f"{why}: the result is NaN, no rounding happens"
        v = math.nan
    else:
        note = "an infinite operand: the result is that infinity, no rounding happens"
    rb = bits(v)
    rows = (_operand_row("a", a), _operand_row("b", b), ("result", [(rb, "bits")], note))
    return AddTrace(a.value, b.value, a.fmt, b.fmt, kind, v, v, math.nan, rb, note=note, _rows=rows)


def _trace(a: _Num, b: _Num, acc: bool) -> AddTrace:
    """a + b in the paper's four steps (`acc`: `a` is the fp32 accumulator, and the exact sum is rounded to fp32
    before bf16). Each step appends its rows of bits to `rows` and the AddTrace fields it decides to `fields`."""
    kind = "fp32 acc + bf16" if acc else "bf16 + bf16"
    if not (a.finite and b.finite):
        return _special(a, b, kind)
    W = 7
    exact = a.exact + b.exact
    rows = [_operand_row("a", a), _operand_row("b", b)]
    fields = dict(a=a.value, b=b.value, a_fmt=a.fmt, b_fmt=b.fmt, kind=kind, exact=exact)
    big, F, A, S = _align(a, b, W, rows, fields)
    R = _add_significands(a, b, A, S, F, W, rows, fields)
    if R == 0:                                        # exact cancellation: +0 (−0 only for −0 + −0)
        v = -0.0 if a.sign and b.sign else 0.0
        rb = bits(v)
        rows.append(("3 normalize", [(" 0." + "0" * W, "kept")], "exact cancellation: the sum is zero"))
        rows.append(("result", [(rb, "bits")], f"{v!r}, exact, error 0"))
        return AddTrace(**fields, result=v, error=Fraction(0), result_bits=rb, normalization="zero",
                        fp32_result=v if acc else None, fp32_bits=bits(v, "fp32") if acc else None,
                        _rows=tuple(rows))
    E, shift, sh, kept_pre = _normalize(R, F, big, W, rows, fields)
    sign = big.sign
    if acc:                                           # the fp32 accumulator rounds first (23 bits)
        k32, E32, ovf = _round_fp32(R, F - 23 + shift, E, sign, exact, rows, fields)
        if ovf:                                       # the accumulator's infinity is the result
            return AddTrace(**fields, error=math.nan, _rows=tuple(rows))
        R, E, sh = k32, E32, 23 - W                   # bf16 rounding now reads the fp32 significand
        kept_pre = R >> sh
    return _round_bf16(R, sh, E, W, sign, kept_pre, exact, rows, fields)


def _align(a: _Num, b: _Num, W: int, rows: list, fields: dict):
    """Step 1, exponent alignment: shift the smaller-magnitude operand right by the exponent gap. Returns (the
    larger operand, the fraction bits F that hold both exactly, both significands on that scale)."""
    a_big = abs(a.exact) >= abs(b.exact)
    big, small = (a, b) if a_big else (b, a)
    bname, sname = ("a", "b") if a_big else ("b", "a")
    d = big.exp - small.exp if small.sig else 0       # adding zero needs no alignment
    F = max(big.p, small.p + d)                       # fraction bits that hold both exactly
    A = big.sig << (F - big.p)
    S = small.sig << (F - small.p - d)
    shifted_out = format(S, f"0{F + 1}b")[1 + W:]     # the smaller operand's bits below bf16 precision
    if small.fmt == "bf16":
        shifted_out = shifted_out[:d]                 # a bf16 operand loses exactly its last d bits
    rows.append(("1 align", _sig_segments(A, F, W=W), f"{bname}: larger magnitude, exponent {big.exp}"))
    if d == 0:
        snote = f"{sname}: same exponent, no shift" if small.sig else f"{sname} is zero: nothing to align"
    else:
        snote = (f"{sname}: shifted right by {d} (exponent {small.exp} → {big.exp}); bits shifted below "
                 f"bf16 precision: {_abbrev(shifted_out) or 'none'}")
    rows.append(("1 align", _sig_segments(S, F, W=W), snote))
    fields.update(big=bname, exponent_gap=d, shifted_out=shifted_out)
    return big, F, A, S


def _add_significands(a: _Num, b: _Num, A: int, S: int, F: int, W: int, rows: list, fields: dict) -> int:
    """Step 2: the aligned significands added (subtracted for mixed signs), exactly: their sum R."""
    subtract = a.sign != b.sign
    R = A - S if subtract else A + S
    carry = R >> (F + 1) != 0
    rows.append(("2 subtract" if subtract else "2 add", _sig_segments(R, F, 2 if carry else 1, W=W),
                 f"exact {'difference' if subtract else 'sum'} of the significands"
                 + (", carry into a second integer bit" if carry else "")))
    sum_bits = "".join(t for t, _ in rows[-1][1]).strip()
    fields.update(operation="subtract" if subtract else "add", sum_bits=sum_bits)
    return R


def _normalize(R: int, F: int, big: _Num, W: int, rows: list, fields: dict):
    """Step 3, normalization: the leading one of R back to the units position (or the subnormal floor). Returns
    (the exponent E, the shift, the number sh of R's bits below the bf16 ulp 2^(E - 7), the kept bits)."""
    top = R.bit_length() - 1
    E = max(big.exp + top - F, EMIN)
    shift = E - big.exp                               # +1 carry, -k cancellation
    if shift > 0:
        norm, nnote = "carry", (f"carry: shift right by 1, exponent {big.exp} → {E}; the bit shifted out "
                                "becomes the rounding bit")
    elif shift < 0:
        norm, nnote = "cancellation", f"cancellation: shift left by {-shift}, exponent {big.exp} → {E}"
    else:
        norm, nnote = "none", "already normalized" if R >> F else "subnormal: no shift below exponent -126"
    sh = F - W + shift                                # bits of R below the bf16 ulp 2^(E - 7)
    kept_pre = R >> sh if sh > 0 else R << -sh
    rest = format(R & ((1 << sh) - 1), f"0{sh}b") if sh > 0 else ""
    rows.append(("3 normalize", _round_segments(kept_pre, rest, W), nnote))
    normalized_bits = "".join(t for t, _ in rows[-1][1]).strip()
    fields.update(normalization=norm, shift=shift, normalized_bits=normalized_bits)
    return E, shift, sh, kept_pre


def _round_fp32(R: int, sh32: int, E: int, sign: int, exact: Fraction, rows: list, fields: dict):
    """Step 3b (`add_trace_acc` only): the exact sum rounded to the fp32 accumulator's 23 fraction bits, ties to
    even. Returns (its significand, its exponent, whether it overflowed: then `fields` hold the whole result)."""
    k32, E32, g, r, s, _, dec32, _, ovf = _rne(R, sh32, E, 23)
    fp32_result = _value(sign, k32, E32, 23, ovf)
    fp32_bits = bits(fp32_result, "fp32")
    fields.update(fp32_result=fp32_result, fp32_bits=fp32_bits)
    if ovf:
        note = "the fp32 accumulator overflows to infinity"
        rows.append(("result", [(bits(fp32_result), "bits")], note))
        fields.update(result=fp32_result, result_bits=bits(fp32_result), note=note)
        return k32, E32, ovf
    exact32 = Fraction(fp32_result)
    anote = ("the exact sum fits in fp32: no rounding" if dec32 == "exact" else
             f"rounded to 23 fraction bits ({dec32}): fp32 error {_fmt_exact(exact32 - exact)}")
    split = [(fp32_bits[:18], "bits"), (" ", "sep"), (fp32_bits[18], "guard"), (" ", "sep"),
             (fp32_bits[19:], "sticky")]            # the paper's notation: kept, rounding bit, sticky bits
    rows.append(("3b fp32 acc", split, f"{fp32_result!r}; {anote}"))
    return k32, E32, ovf


def _round_bf16(R: int, sh: int, E: int, W: int, sign: int, kept_pre: int, exact: Fraction, rows: list,
                fields: dict) -> AddTrace:
    """Step 4: rounding to 7 fraction bits, ties to even, from the guard, round and sticky bits; the result."""
    kept, E2, g, r, s, rest, decision, direction, ovf = _rne(R, sh, E, W)
    result = _value(sign, kept, E2, W, ovf)
    rb = bits(result)
    sticky_bits = rest[1:]
    why = {
        "exact": "no bits below the kept ones are set: exact",
        "down": "less than half an ulp, round down",
        "up": "more than half an ulp, round up",
        "tie→even": ("exactly half an ulp, a tie broken to even "
                     f"(last kept bit {kept_pre & 1}), round {'up' if kept_pre & 1 else 'down'}"),
    }[decision]
    # the Primer's names: the rounding bit is the first dropped bit (`g`), the sticky bit the OR of all later ones
    rows.append(("4 round", _round_segments(kept_pre, rest, W),
                 f"rounding bit (first dropped) {g}, sticky bit (OR of the later ones) {int(bool(r or s))}; {why}"
                 + (f" → {direction}" if direction != "none" else "")))
    note = ""
    if ovf:
        note = "rounding overflowed the largest bf16 value: the result is infinite"
    elif kept >> W and not kept_pre >> W:
        note = "rounding carried into the hidden bit: the subnormal became normal"
    elif E2 != E:
        note = "rounding carried into the exponent"
    error = Fraction(result) - exact if math.isfinite(result) else math.nan
    rows.append(("result", [(rb, "bits")],
                 f"{result!r}; exact {_fmt_exact(exact)}; error {_fmt_exact(error)}" + (f"; {note}" if note else "")))
    return AddTrace(**fields, result=result, error=error, result_bits=rb, guard=g, round=r, sticky=s,
                    sticky_bits=sticky_bits, decision=decision, direction=direction, note=note, _rows=tuple(rows))


def _scalar(x, name: str) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"{name} must be a single value (got a tensor of shape {tuple(x.shape)})")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point value (got dtype {x.dtype})")
        return float(x.reshape(()).item())
    if _is_real(x):
        return float(x)
    raise TypeError(f"{name} must be a float or a one-element tensor (got {type(x).__name__})")


def add_trace(a, b) -> AddTrace:
    """Trace the BF16 addition a + b of two bf16 values: align, add, normalize, round (RNE) once.

    The result equals `(a.float() + b.float()).to(torch.bfloat16)` (the fp32 sum of two bf16 values
    rounds to the same bf16 as the exact sum). Explained in chapter 4, "Rounding".

    >>> t = add_trace(-2.40625, -2.296875)     # the paper's two big terms, no residual
    >>> t.normalization, t.decision, t.direction, t.result
    ('carry', 'tie→even', 'toward zero', -4.6875)
    """
    return _trace(_Num.of(_scalar(a, "a"), "bf16"), _Num.of(_scalar(b, "b"), "bf16"), acc=False)


def add_trace_acc(acc, term) -> AddTrace:
    """Trace one step of the P̄V accumulation: fp32 running sum `acc` + bf16 `term` → fp32 → bf16.

    The exact sum is rounded to the fp32 accumulator, then that fp32 value is rounded to bf16; the bits
    of the fp32 sum below the bf16 rounding bit are the sticky bits. `acc` must be exact in fp32 and
    `term` exact in bf16. Explained in chapter 4, "Rounding".

    >>> t = add_trace_acc(-2.4071154594421387, -2.296875)   # the paper's worked example
    >>> t.fp32_bits, t.guard, t.sticky_nonzero, t.direction, t.result
    ('1 10000001 00101101000011100010111', 1, True, 'away from zero', -4.71875)
    """
    return _trace(_Num.of(_scalar(acc, "acc"), "fp32"), _Num.of(_scalar(term, "term"), "bf16"), acc=True)


def paper_example(sticky: bool = True) -> AddTrace:
    """The paper's worked addition (§4): with the residual (sticky bits) it rounds away from zero to
    -4.71875; without it (sticky=False) the same two big terms tie exactly and round to even (-4.6875).

    >>> paper_example().error == Fraction(-0.014759540557861328)
    True
    """
    if sticky:
        return add_trace_acc(PAPER_RUNNING_SUM, PAPER_TERM)
    return add_trace(-2.40625, PAPER_TERM)
