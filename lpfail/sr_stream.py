"""Counter-based random bits for stochastic rounding: the same bits on CPU and CUDA, eager or in a CUDA graph.

Stochastic rounding (``Precision(rounding="sr")``, `lpfail.bf16.round_stochastic`) needs uniform random bits for
every element it rounds. Drawn from torch's generators, those bits depend on how many numbers were drawn before,
on the device, and on whether the training step was captured in a CUDA graph (a captured graph replays the
generator's offsets its own way), so a stored run could not be repeated. Here the bits are a pure function of
integers instead (a counter-based generator)::

    bits = H(seed, site..., draw, part; step; element index)

* ``seed``    the run's seed (`lpfail.train.TrainConfig.init_seed`, through `lpfail.model.GPTConfig.sr_seed`);
* ``step``    the training step: a 0-d int64 tensor on the model's device (`SRStream.step`, a buffer of the
  model, saved with its checkpoints), advanced in place once per step, so that a graph captured once reads the
  current step at every replay — or a plain int;
* ``site``    which rounding: the global micro-batch, the layer, the head group, the cast point of the output
  path and the key tile (see `lpfail.attention`); Python ints, fixed for a given call site, so a captured graph
  bakes in the same values the eager step uses;
* ``draw``, ``part``  the round of draws (`round_stochastic`'s exact comparison may draw again) and which 32-bit
  half of a wider draw;
* the element's index in the (contiguous) tensor being rounded.

H is three rounds of `mix32`, a bijective 32-bit integer hash (xor-shift, multiply by an odd constant, twice),
computed in int64 tensors whose values stay in [0, 2^32): both multipliers are below 2^31, so no product reaches
2^63 and no signed overflow happens on any device. The Python words are folded on the host with the same
arithmetic; only the step is folded on the device. For a fixed key the map from element index to the first
round's output is a bijection, so the elements of one call (fewer than 2^32) never share an input to the later
rounds.

On a CUDA device the commonest use, an FP32 tensor rounded stochastically to bf16 (or to K bits of bf16's
exponent), runs as one fused Triton kernel (`RoundingKey.round_fp32`): the same integers as `bits` followed by
`lpfail.bf16`'s pattern rounding, computed element by element in registers instead of a chain of PyTorch ops
(82 per call, most of them elementwise int64 over the whole tensor). Integer arithmetic is exact, so the result
is the same bits; tests compare the two paths in Triton's interpreter, and `lpfail.fused` checks them on the card
before a process relies on the kernel.

Public surface::

    mix32(x)                           int or int64 tensor in [0, 2^32) -> same kind, bijective
    RoundingKey(seed, step=0, site=())  .at(*words) -> a key for a sub-site; .bits(shape, nbits, draw, part, device);
                                       .round_fp32(x, shift) -> bf16 (the fused kernel) or None where it does not apply
    SRStream(seed)                     nn.Module: buffer `step`, attribute `micro`; .key(*site), .advance()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

__all__ = ["M32", "mix32", "fold", "RoundingKey", "SRStream", "STREAM_VERSION"]

#: The version of the counter-based stream, shown in the string form of stochastic-rounding policies
#: (",rounding=sr,sr_stream=1"): a change of `mix32`, of the key's layout or of the sites the attention uses changes
#: the bits, and must come with a new version so that stored runs of the old stream are not taken for new ones.
STREAM_VERSION = 1

#: Spellings of stochastic-rounding policies whose random stream this code no longer has: (current, retired).
#: Stream 0 drew from torch's default generator (",rounding=sr" alone); its bits depended on whether a step was
#: captured in a CUDA graph, so its runs cannot be repeated. `lpfail.sweep.store.retired_hashes` finds their stored
#: runs under this spelling; a grid reads them for the record (marked retired) until the current stream's run of
#: the same point is trained, and never counts them as done.
RETIRED_SPELLINGS = ((f",rounding=sr,sr_stream={STREAM_VERSION}", ",rounding=sr"),)

M32 = 0xFFFFFFFF
_C1 = 0x21F0AAAD  # odd multipliers below 2^31: x·c < 2^63 for every x < 2^32
_C2 = 0x735A2D97
_A0 = 0x9E3779B9  # starting words of the host fold and the device fold, and the third round's tweak
_B0 = 0x85EBCA6B
_T0 = 0xC2B2AE35


def mix32(x):
    """A bijection of [0, 2^32): x ^= x >> 16; x *= 0x21f0aaad; x ^= x >> 15; x *= 0x735a2d97; x ^= x >> 15
    (mod 2^32). Works on Python ints and on int64 tensors with values in [0, 2^32), bit for bit alike."""
    x = x ^ (x >> 16)
    x = (x * _C1) & M32
    x = x ^ (x >> 15)
    x = (x * _C2) & M32
    return x ^ (x >> 15)


def fold(words, start: int = _A0) -> int:
    """A 32-bit key from non-negative Python ints below 2^64: each word's low and high halves are folded in turn,
    k = mix32(k ^ half)."""
    k = start
    for w in words:
        w = int(w)
        if not 0 <= w < 1 << 64:
            raise ValueError(f"a rounding key word must be an int in [0, 2^64) (got {w!r})")
        k = mix32(k ^ (w & M32))
        k = mix32(k ^ (w >> 32))
    return k


@dataclass(frozen=True)
class RoundingKey:
    """Where a stochastic rounding draws its bits: the run's seed, the step (a 0-d int64 tensor, read when the bits
    are computed, or an int) and the call site (a tuple of ints). `bits` is a pure function of these, the draw
    counters and the element index."""

    seed: int
    step: torch.Tensor | int = 0
    site: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise ValueError(f"RoundingKey.seed must be an int in [0, 2^64) (got {self.seed!r})")
        if isinstance(self.step, torch.Tensor):
            if self.step.dtype != torch.int64 or self.step.dim() != 0:
                raise ValueError(f"RoundingKey.step must be a 0-d int64 tensor or an int (got {self.step!r})")
        elif isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"RoundingKey.step must be a non-negative int or a 0-d int64 tensor (got {self.step!r})")
        object.__setattr__(self, "site", tuple(int(w) for w in self.site))

    def at(self, *words: int) -> "RoundingKey":
        """The key of a sub-site: these words appended to the site."""
        return replace(self, site=self.site + tuple(words))

    def _step_word(self, device):
        """The step folded into one 32-bit word: an int, or a 0-d int64 tensor on `device`."""
        s = self.step
        if isinstance(s, torch.Tensor) and s.device != device:
            s = s.to(device)
        return mix32(mix32((s & M32) ^ _B0) ^ ((s >> 32) & M32))

    def _words(self, draw: int, part: int) -> tuple[int, int]:
        """The key's two host-side words for (draw, part): `a`, mixed with each element's index first, and `t`,
        mixed in last (`bits`, and the fused kernel's arguments)."""
        a = fold((self.seed, len(self.site), *self.site, draw, part))
        return a, mix32(a ^ _T0)

    def bits(self, shape, nbits: int, draw: int = 0, part: int = 0, device=None) -> torch.Tensor:
        """Uniform random integers in [0, 2^nbits), int64, of `shape`, on `device` (default: the step's, or the
        CPU): for nbits <= 32 the top nbits of one hash per element; up to 62 bits from two (parts 2·part and
        2·part + 1). Pure: the same arguments give the same bits, on any device."""
        if not (isinstance(nbits, int) and 1 <= nbits <= 62):
            raise ValueError(f"nbits must be an int in [1, 62] (got {nbits!r})")
        if device is None:
            device = self.step.device if isinstance(self.step, torch.Tensor) else torch.device("cpu")
        device = torch.device(device)
        shape = tuple(shape)
        if nbits > 32:
            hi = self.bits(shape, nbits - 32, draw, 2 * part + 1, device)
            lo = self.bits(shape, 32, draw, 2 * part, device)
            return (hi << 32) | lo
        a, t = self._words(draw, part)
        n = math.prod(shape)
        idx = torch.arange(n, dtype=torch.int64, device=device)
        h = mix32((idx & M32) ^ a)
        if n > 1 << 32:
            h = mix32(h ^ (idx >> 32))
        h = mix32(h ^ self._step_word(device))
        h = mix32(h ^ t)
        return (h >> (32 - nbits)).reshape(shape)

    def round_fp32(self, x: torch.Tensor, shift: int, interpret: bool = False) -> torch.Tensor | None:
        """`lpfail.bf16.round_stochastic` of the FP32 tensor `x` to bf16's exponent with 23 − `shift` fraction bits
        (shift 16 … 22: bf16 and its K-bit formats), as one fused Triton kernel (`lpfail.round_kernels`): draw 0,
        part 0 of this key's bits added to the low bits of each FP32 pattern, then truncated — the PyTorch path's
        bits. None where it does not apply (`lpfail.fused.usable`; its check not passed on this device): the
        caller then takes the PyTorch path. `interpret`: in Triton's interpreter, unchecked (the tests)."""
        from lpfail import fused

        return fused.apply("sr_fp32_to_bf16", x, shift, interpret, _compare, lambda k: self._launch(k, x, shift))

    def _launch(self, kern, x: torch.Tensor, shift: int) -> torch.Tensor:
        from lpfail import fused

        step = self.step if isinstance(self.step, torch.Tensor) else torch.tensor(self.step, dtype=torch.int64)
        return fused.launch(kern, x, shift, pre=(step.to(x.device),), post=self._words(0, 0))


def _compare(kern, device, shift: int) -> bool:
    """The fused kernel against the PyTorch path on `lpfail.fused.check_tensor`, under three keys (a step tensor
    above 2^32 among them)."""
    from lpfail.bf16 import _fp32_patterns, _patterns_to_bf16, _round_pattern
    from lpfail.fused import check_tensor

    x = check_tensor(device)
    u = _fp32_patterns(x)
    keys = (RoundingKey(0), RoundingKey(7, torch.tensor(123456789012, device=device), (1, 2, 3)),
            RoundingKey((1 << 64) - 1, 5, (9,)))
    for key in keys:
        want = _patterns_to_bf16(_round_pattern(u, shift, "stochastic", key.bits(x.shape, shift, device=device)))
        if not torch.equal(key._launch(kern, x, shift).view(torch.int16), want.view(torch.int16)):
            return False
    return True


class SRStream(nn.Module):
    """The model's source of rounding keys: its seed, the training step as a buffer (saved in checkpoints, moved
    with the model, advanced in place by `advance` once per training step) and the global micro-batch index
    `micro` (a Python int the training step sets before each micro-batch's forward). ``key(layer, group)`` is
    the key of one attention call. A checkpoint written before the stream existed loads without its step (the
    step then stays where it is)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
            raise ValueError(f"SRStream seed must be an int in [0, 2^64) (got {seed!r})")
        self.seed = seed
        self.micro = 0
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))

    def key(self, *site: int) -> RoundingKey:
        """The key of a call at `site`, in the current micro-batch, reading the step buffer when bits are drawn."""
        return RoundingKey(self.seed, self.step, (self.micro, *site))

    @torch.no_grad()
    def advance(self) -> None:
        """Count one training step (in place: a captured graph reads the same memory)."""
        self.step.add_(1)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        n = len(missing_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        missing_keys[n:] = [k for k in missing_keys[n:] if k != prefix + "step"]

    def extra_repr(self) -> str:
        return f"seed={self.seed}, stream version {STREAM_VERSION}"
