"""The fused kernel of `lpfail.sr_stream.RoundingKey.round_fp32`: an FP32 tensor rounded stochastically to bf16's
exponent with 23 − SHIFT fraction bits, its random bits from the counter-based stream, in one pass.

Per element i of the contiguous input, with the key's words `a`, `t` (folded on the host) and the step read from
the device (so a captured CUDA graph reads the current step at every replay)::

    h     = mix32(mix32(mix32(i ^ a) ^ step_word) ^ t)          # `RoundingKey.bits`, draw 0, part 0
    noise = h >> (32 − SHIFT)
    r     = ((|u| + noise) >> SHIFT << SHIFT | sign(u)) >> 16   # `lpfail.bf16._round_pattern`, NaN made quiet

all in int64 holding values below 2^32 before each multiply, exactly as the PyTorch path computes them: the same
integers, so the same bits. Imported only on first use (needs Triton)."""
import triton
import triton.language as tl


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


@triton.jit(do_not_specialize=["n", "a", "t"])
def sr_fp32_to_bf16(x_ptr, out_ptr, step_ptr, n, a, t, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    s = tl.load(step_ptr).to(tl.int64)
    sw = _mix32(_mix32((s & 0xFFFFFFFF) ^ 0x85EBCA6B) ^ ((s >> 32) & 0xFFFFFFFF))
    h = _mix32((offs & 0xFFFFFFFF) ^ a.to(tl.int64))
    h = _mix32(h ^ sw)
    h = _mix32(h ^ t.to(tl.int64))
    noise = h >> (32 - SHIFT)
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    sign = u & 0x80000000
    mag = u & 0x7FFFFFFF
    r = (mag + noise) >> SHIFT
    r = ((r << SHIFT) | sign) >> 16
    r = tl.where(mag > 0x7F800000, (sign >> 16) | 0x7FC0, r)
    r = tl.where(r >= 0x8000, r - 0x10000, r)
    tl.store(out_ptr + offs, r.to(tl.int16), mask=mask)
