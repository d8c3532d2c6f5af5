"""Fused Triton kernels for the roundings of `lpfail.bf16` on CUDA: an FP32 tensor rounded to bf16's exponent with
23 − SHIFT fraction bits (bf16 itself at SHIFT 16, the K-bit formats of the precision dial above), in one pass.

* `rne_fp32_to_bf16`: to nearest, ties to even (`lpfail.bf16.round_mantissa`, mode "rne");
* `sr_fp32_to_bf16`: stochastically, with the counter-based bits of `lpfail.sr_stream.RoundingKey` (draw 0, part 0),
  the key's words `a`, `t` folded on the host and the step read from the device (so a captured CUDA graph reads
  the current step at every replay)::

      h     = mix32(mix32(mix32(i ^ a) ^ step_word) ^ t)          # `RoundingKey.bits`
      noise = h >> (32 − SHIFT)

Both then compute `lpfail.bf16._round_pattern` on the FP32 pattern u: on the magnitude, a carry out of the largest
value giving ±inf, NaN made the quiet NaN with its sign. Everything is int64 arithmetic on values below 2^32 before
each multiply, exactly as the PyTorch path computes it: the same integers, so the same bits (`lpfail.fused` checks
this once per process before using a kernel). Imported only on first use (needs Triton)."""
import triton
import triton.language as tl


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


@triton.jit
def _pattern_out(u, r, out_ptr, offs, mask, SHIFT: tl.constexpr):
    """r: the rounded magnitude >> SHIFT; stores the bf16 pattern (as int16) with u's sign, NaN quiet."""
    sign = u & 0x80000000
    mag = u & 0x7FFFFFFF
    r = ((r << SHIFT) | sign) >> 16
    r = tl.where(mag > 0x7F800000, (sign >> 16) | 0x7FC0, r)
    r = tl.where(r >= 0x8000, r - 0x10000, r)
    tl.store(out_ptr + offs, r.to(tl.int16), mask=mask)


@triton.jit
def _load_pattern(x_ptr, offs, mask):
    return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF


@triton.jit(do_not_specialize=["n", "a", "t"])
def sr_fp32_to_bf16(x_ptr, out_ptr, step_ptr, n, a, t, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    s = tl.load(step_ptr).to(tl.int64)
    sw = _mix32(_mix32((s & 0xFFFFFFFF) ^ 0x85EBCA6B) ^ ((s >> 32) & 0xFFFFFFFF))
    h = _mix32((offs & 0xFFFFFFFF) ^ a.to(tl.int64))
    h = _mix32(h ^ sw)
    h = _mix32(h ^ t.to(tl.int64))
    u = _load_pattern(x_ptr, offs, mask)
    _pattern_out(u, ((u & 0x7FFFFFFF) + (h >> (32 - SHIFT))) >> SHIFT, out_ptr, offs, mask, SHIFT)


@triton.jit(do_not_specialize=["n"])
def rne_fp32_to_bf16(x_ptr, out_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    u = _load_pattern(x_ptr, offs, mask)
    mag = u & 0x7FFFFFFF
    lsb = (mag >> SHIFT) & 1
    _pattern_out(u, (mag + ((1 << (SHIFT - 1)) - 1) + lsb) >> SHIFT, out_ptr, offs, mask, SHIFT)
