"""The precision policy: one frozen object that names every cast point of an attention call.

Explained in the book's introduction and used by every chapter. The same object drives the pure-PyTorch
reference (`lpfail.attention`), the Triton kernels (`kernels`) and the model's per-layer / per-head
overrides (`lpfail.model`). Its string form round-trips through `Precision.parse` and serves as cache key,
plot legend and CLI flag.

Knobs (DESIGN.md §2):

=========== ====================================================== ======= ======= =====
knob        meaning                                                PAPER   FA2     FP32
=========== ====================================================== ======= ======= =====
matmul      dtype of the matmul operands (accumulation is FP32    bf16    bf16    fp32
            for bf16 operands, like tensor cores)
scores      dtype S = αQKᵀ is stored in                            bf16    fp32    fp32
exp         dtype exp(S − m) is evaluated in                       fp32    fp32    fp32
pbar        dtype P̄ is rounded to before the P̄V product            bf16    bf16    fp32
pv_out      dtype the P̄V product is rounded to                     bf16    fp32    fp32
acc         dtype of the O accumulator and of the running m, ℓ     bf16    fp32    fp32
out         dtype the output O is stored in (what δ = dO·O reads)  bf16    bf16    fp32
delta       δ source: "dO.O", "dO.O_hp" (O recomputed in high      dO.O    dO.O    dO.O
            precision), "dP.P" or "dO.O_res" (O plus its stored
            16-bit rounding residual; see below)
block_q/k   tile sizes; None = one tile over the whole sequence    512     128/64  512
sub         how S − m is formed: "sub" (scale, round, subtract:    sub     sub     sub
            a tied maximum gives exactly P̄ = 1) or "fma" (one
            fused multiply-add from the raw QKᵀ, as production
            kernels do)
fix         None or DynamicMax(beta, eps): the paper's Algorithm 3 None    None    None
l_clamp     None, or the floor 1e-10 that the paper's official    None    None    None
            code puts under each key block's row sum
            (``rowsum(P̄).clamp(min=1e-10)``, before the online
            update); only for exact emulation of that code (preset
            PAPER_BF16_OFFICIAL_FIX), never part of our fix
qk_out      dtype the raw product QKᵀ is rounded to before it is   bf16    fp32    fp32
            scaled by α (a matmul under autocast returns bf16)
exp_in      dtype S − m and m_old − m_new are rounded to before    bf16    fp32    fp32
            exp in the forward (a bf16 tensor minus a bf16 one)
dp          dtype dP = dO·Vᵀ is rounded to (backward)              bf16    fp32    fp32
delta_prod  dtype each product dO∘O (or dP∘P) is rounded to        bf16    fp32    fp32
            before δ's row sum; widened to the operands' dtype
            when they are wider (so "dO.O_hp" multiplies in FP32)
ds          dtype dS is rounded to before dQ = dS·K, dK = dSᵀ·Q    bf16    bf16    fp32
grad_acc    dtype dQ, dK, dV accumulate in across tiles (each      bf16    fp32    fp32
            tile's product is rounded to it, then added)
masked_ties False: masked scores are −∞, never tie, and key tiles  False   False   False
            fully masked for a row are skipped. True: the official
            code's masking (most negative finite score, every tile
            visited), so under the fix a fully masked tile counts
            as r_s > 1 ties with r_m < 0 and sets m' = 0
rounding    how the output path's 16-bit casts round (P̄V to       rne     rne     rne
            `pv_out`, Ō·a and Ō·a + P̄V to `acc`, O to `out`):
            "rne" to nearest even, "sr" stochastically (unbiased;
            m, ℓ and all other casts stay "rne")
o_acc       None (= `acc`), or the dtype of the O accumulator Ō    None    None    None
            alone, with m and ℓ still in `acc`: torch.compile
            keeps the official code's Ō·a + P̄V chain in FP32
            registers across key tiles (PAPER_BF16_COMPILED)
l_div       None (= `acc`), or the dtype ℓ is rounded to before   None    None    None
            O = Ō / ℓ
l_store     None (= `acc`), or the dtype the final m and ℓ are     None    None    None
            stored in for the backward, L = log ℓ + m (the
            official code's BF16 buffers, which torch.compile
            rounds on store even where it keeps ℓ in FP32)
m_acc       None (= `acc`), or the dtype of the running maximum m  None    None    None
            alone (its block maximum r_m rounded to it)
m_rescale   None (= `m_acc`), or the dtype m_old and m_new are    None    None    None
            rounded to before the rescale factor
            a = exp(m_old − m_new) (the compiled code on the GPU
            reads them from BF16 buffers there, while S − m uses
            the FP32 maximum in registers)
l_div_last  None (= `l_div`), or the dtype ℓ is rounded to        None    None    None
            before O = Ō / ℓ in the last query tile (`block_q`)
            alone: where inductor's kernels divide the last
            tile by the stored BF16 ℓ and earlier tiles by FP32
masked_     None, or the dtype that the update of a key tile fully None    None    None
carry       masked for a row rounds that row's running state to
            (needs masked_ties): m_old and m_new before the
            rescale factor a, ℓ_old before a·ℓ + ℓ_j, and Ō·a;
            the compiled official fixed code does that step in
            separate kernels that read the BF16 row buffers
l_from      the source of each key block's row sum ℓ_j: "p", the   p       p       p
            probabilities exp(S − m) before their rounding to
            `pbar` (FlashAttention-2, the paper's code, the Triton
            tutorial), or "pbar", P̄ as rounded for the P̄V product
            (flash-attention PR #2721: numerator and normaliser
            then use the same P̄; only with a pbar narrower than exp)
v           None (= `matmul`), or the format V is rounded to where None    None    None
            it enters attention (its operand of P̄V and of dP, in
            both passes; rounded from the input directly)
=========== ====================================================== ======= ======= =====

Formats. Every dtype knob (and o_acc … masked_carry, v) takes "bf16", "fp16", "fp32", "fp64" or a format of the
precision dial: bf16's 8-bit exponent with K < 7 fraction bits, "bf16m6" … "bf16m1" (`DIAL`; K = 7 is "bf16"
itself, `dial_format(K)`). A K-bit value is stored in a torch.bfloat16 tensor (its low 7 − K fraction bits zero)
and rounded to by integer arithmetic on the FP32 bit pattern (`lpfail.bf16.round_mantissa`: to nearest even;
stochastically on the output path under ``rounding="sr"``), with bf16's range: overflow to ±inf past
(2 − 2^−K)·2^127, gradual underflow with spacing 2^(−126−K) below 2^−126. `Precision.format(knob)` gives a cast
point's `Format`; `Precision.dtype(knob)`, the torch dtype, refuses the K-bit formats (their storage dtype alone
would round at 7 bits). The K-bit formats run in the reference attention only (`kernels` refuses them).

Two knobs were added for the cures of chapter 6 (experiment `cures`), both off in every preset and shown in
the string form only when used, so no existing cache key changes:

* ``delta="dO.O_res"`` — output-residual compensation (after arXiv 2610.05854): the forward also stores the
  residual R = O_hp − O of its output's rounding, itself rounded to `out`, and the backward reads
  δ = rowsum(dO ∘ (O + R)) in FP32, recovering most of the FP32 output at the cost of one more 16-bit tensor.
* ``ds_rowsum=True`` — the dS row-sum correction (in the spirit of arXiv 2609.34272's projection): after dS is
  rounded to `ds`, the row sum of the rounding error within each key tile is removed again, evenly over the
  row's allowed keys of that tile, in FP32 on the dQ and dK products — so dQ does not pick up the tile's mean
  key in proportion to a rounding error.

The knobs from qk_out on were added with the reference attention (`lpfail.attention`, whose docstring gives
the order of operations), for cast points of the paper's official code that PAPER_BF16 must reproduce bit
for bit. FP64 sets every dtype knob to fp64. PAPER_BF16_OFFICIAL_FIX is PAPER_BF16 with fix=DynamicMax(2, 1e-3),
l_clamp=1e-10 and masked_ties=True. ``sub="fma"`` needs qk_out, scores and exp_in of at least FP32 (a
16-bit product or score would be rounded before the fused step, which is what the step exists to avoid).
``rounding="sr"`` is the control of the paper's claim that the rounding error harms because it is biased: the
same 8-bit significand, no bias (`lpfail.bf16.round_stochastic`); it needs at least one of pv_out, o_acc (default
acc), out in a 16-bit or K-bit format, and the string form shows it only when set, so the strings of all "rne"
policies, and with them every stored result's config hash, are those from before the knob existed. Its random bits
are counter-based (`lpfail.sr_stream`): a pure function of the run's seed, the training step, the call site and
the element, the same on every device and whether or not the step is captured in a CUDA graph. The string of an
"sr" policy names that stream's version, ",rounding=sr,sr_stream=1", and `Precision.parse` requires it: the
stream of the first stored "sr" runs (torch's generators, whose draws differed between captured and eager steps)
was ",rounding=sr" alone, which therefore no longer parses: a config that still names it fails instead of
matching the runs stored under it.
o_acc, l_div, l_store, m_acc, m_rescale and l_div_last (None by default, shown in the string only when set, like
``rounding``) describe what the official code computes under torch.compile (preset PAPER_BF16_COMPILED;
see `lpfail.experiments.official_check` and notes/official_check.md). masked_carry (None by default, shown only
when set) describes the compiled official *fixed* code (PAPER_BF16_COMPILED_OFFICIAL_FIX): under the fix a key
tile fully masked for a row still moves that row's maximum (its masked scores tie, r_m < 0, so m' = 0), and
inductor computes that update from the BF16 buffers the official code copies m and ℓ into (row_maxes.copy_,
row_sums.copy_) and stores Ō·a in the BF16 output buffer before P̄V is added; unlike the other compiled knobs it
does not fall back to `acc` (None: no extra rounding). l_from (default "p", shown only when set) is a second
biased path (flash-attention PR #2721): with ℓ summed from the FP32 P while P̄V uses P̄ = bf16(P), O = ΣP̄V / ΣP
is not a weighted mean of V (for V ≡ c it is c·ΣP̄/ΣP, not c); "pbar" sums the rounded P̄ instead, so O = ΣP̄V / ΣP̄.
v (default None, shown only when set) gives V a format of its own, for the precision dial's arms
(`lpfail.experiments.dial`): V at K bits while Q and K, and with them the scores and their ties, stay BF16.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
#: The precision dial: bf16's exponent with K < 7 fraction bits, name → K ("bf16" is K = 7).
DIAL = {f"bf16m{k}": k for k in range(6, 0, -1)}
DELTAS = ("dO.O", "dO.O_hp", "dP.P", "dO.O_res")
SUBS = ("sub", "fma")
ROUNDINGS = ("rne", "sr")
L_FROMS = ("p", "pbar")
_ACC_FIELDS = ("o_acc", "l_div", "l_store", "m_acc", "m_rescale", "l_div_last")  # optional dtypes (torch.compile's
#: arithmetic): each falls back to `acc`, except m_rescale (to `m_acc`) and l_div_last (to `l_div`)
_FALLBACK = {"m_rescale": "m_acc", "l_div_last": "l_div"}
#: Knobs added after the first stored results, with their defaults: a policy's string names one only when it
#: differs from its default, so the strings (cache keys) of every earlier policy stay as they were.
_SET_ONLY = (("rounding", "rne"), *((name, None) for name in _ACC_FIELDS), ("ds_rowsum", False),
             ("masked_carry", None), ("l_from", "p"), ("v", None))
_DTYPE_FIELDS = ("matmul", "scores", "exp", "pbar", "pv_out", "acc", "out",
                 "qk_out", "exp_in", "dp", "delta_prod", "ds", "grad_acc")
_FORMAT_LIST = sorted(DTYPES) + list(DIAL)


@dataclass(frozen=True)
class Format:
    """The number format of a cast point: its name, the torch dtype its values are stored in, and the fraction
    bits it keeps (7 for bf16, 10 for fp16, 23 for fp32, 52 for fp64, K for "bf16mK")."""

    name: str
    dtype: torch.dtype
    mantissa: int

    @property
    def native(self) -> bool:
        """Whether the format is its storage dtype's own (a `.to(dtype)` rounds to it)."""
        return self.name in DTYPES

    @property
    def narrow(self) -> bool:
        """16 bits or fewer: bf16, fp16 and the K-bit formats (the casts stochastic rounding acts on)."""
        return self.dtype.itemsize <= 2

    @property
    def max(self) -> float:
        """The largest finite value: (2 − 2^−K)·2^127 for the K-bit formats."""
        return float(torch.finfo(self.dtype).max) if self.native else (2.0 - 2.0 ** -self.mantissa) * 2.0 ** 127

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """x rounded to this format to nearest even, in its storage dtype: ``x.to(dtype)`` for a native format,
        `lpfail.bf16.round_mantissa` (exact from any float input) for a K-bit one."""
        if self.native:
            return x.to(self.dtype)
        from lpfail.bf16 import round_mantissa

        return round_mantissa(x, self.mantissa)

    def __str__(self) -> str:
        return self.name


#: Every format a knob may name.
FORMATS: dict[str, Format] = {
    **{name: Format(name, dt, {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}[dt])
       for name, dt in DTYPES.items()},
    **{name: Format(name, torch.bfloat16, k) for name, k in DIAL.items()},
}


def dial_format(k: int) -> str:
    """The format name of bf16's exponent with k fraction bits: "bf16" for k = 7, else "bf16m<k>" (k in 1 … 6)."""
    if k == 7:
        return "bf16"
    name = f"bf16m{k}"
    if isinstance(k, bool) or name not in DIAL:
        raise ValueError(f"the precision dial has 1 … 7 fraction bits (got {k!r})")
    return name


@dataclass(frozen=True)
class DynamicMax:
    """The paper's fix (Algorithm 3): per key block, if r_s > 1 scores lie within `eps` of the block's
    maximum r_m, use m' = beta·r_m when r_m > 0 and m' = 0 when r_m < 0; otherwise m' = r_m."""

    beta: float = 2.0
    eps: float = 1e-3

    def __post_init__(self):
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta > 1):
            raise ValueError(f"fix.beta must be a finite number > 1 (got {self.beta!r}): beta <= 1 would not "
                             "move the maximum above the tied scores, so P̄ = 1 would remain")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"fix.eps must be a finite number >= 0 (got {self.eps!r})")

    def __str__(self):
        return f"dynmax({_num(self.beta)},{_num(self.eps)})"


#: The largest shift of a tied maximum that `BoundedMax` lets through after rounding: e^−80 ≈ 1.8e-35 is still a
#: normal FP32 (and BF16) number (the smallest is 2^−126 ≈ e^−87.3), so the tied keys' P̄ and the row sum ℓ of
#: their block stay normal, nonzero numbers with their full significand.
SAFE_SHIFT = 80.0


@dataclass(frozen=True)
class BoundedMax:
    """A robust fix: Algorithm 3 with its shift folded into [shift_min, shift_max] (chapter 5, Fix).

    Per key block, when r_s > 1 scores lie within `eps` of the block's maximum r_m (Algorithm 3's tie test),
    let m'₃ be Algorithm 3's maximum (β·r_m rounded to `scores` for r_m > 0, else 0) and x = m'₃ − r_m its
    shift (≥ 0; x = |r_m| for r_m < 0). With L = shift_min and H = shift_max:

    ============================ ======================================================================
    L ≤ x ≤ H                    m' = m'₃                                  Algorithm 3, bit for bit
    x < L  (r_m ≈ 0, or β ≈ 1)   m' = r_m + (x + L)                        shifted up to at least L
    x > H  (|r_m| large)         m' = r_m + H/2 + ((x − H/2) mod H/2)      folded into [H/2, H)
    ============================ ======================================================================

    (r_m + shift rounded to `scores`), then m' is rounded to `acc` like Algorithm 3's. If that leaves no shift
    (m' = r_m: `acc`'s spacing at r_m exceeds the shift, in BF16 from |r_m| ≳ 2^12) or a shift above
    `SAFE_SHIFT`, m' = r_m: the block is computed as without the fix. Blocks without a tie are untouched,
    so rows without ties are bit-identical to the unfixed policy.

    Why:

    * Upper bound. Algorithm 3's shift is unbounded: the tied keys get P̄ = exp(−x), and beyond x ≈ 87
      (β = 2: r_m ≳ 88, or r_m ≲ −88, where m' = 0) their P̄ and the block's ℓ leave FP32's normal range and
      reach 0, so O = 0/0. With x ≤ H = 64 they stay ≥ e^−64 ≈ 1.6e-28; the keys that the larger m' pushes
      out of FP32's range lie ≥ 23 below the maximum and weigh < e^−23 ≈ 1e-10 of a tied key, far below
      BF16's half-ulp 2^−9.
    * Folding, not clamping. A constant shift c gives every tied key of every row the same P̄ = exp(−c) and
      the same rounding error η of that P̄ to BF16 (ℓ is summed from the unrounded P̄), which biases O by
      about η times the tied keys' weight in one direction — measured up to 2e-3 at a gap of 8 on the
      chapter-4 rows, more than the bias the fix removes. Algorithm 3's shift moves with r_m, so η changes
      sign from row to row; the fold keeps that dependence on r_m (a saw-tooth of x) while bounding it.
    * Lower bound. Algorithm 3 does nothing at r_m = 0 and for (β − 1)·r_m below BF16's spacing P̄ rounds
      back to 1 (the bias returns); x + L keeps the shift ≥ L = 0.5, two BF16 spacings or more at |r_m| < 64.
    * The backward is unchanged: it recomputes P = exp(S − L) from L = m + log ℓ, which is the row's
      log-sum-exp whatever m the forward subtracted.

    ``shift_max`` must be a power of two (the fold's arithmetic is then exact, and the Triton kernels and the
    reference compute the same m' bit for bit) no larger than `SAFE_SHIFT`, with 0 < shift_min ≤ shift_max/2.
    """

    beta: float = 2.0
    eps: float = 1e-3
    shift_min: float = 0.5
    shift_max: float = 64.0

    def __post_init__(self):
        DynamicMax(self.beta, self.eps)  # the same checks of beta and eps
        for name in ("shift_min", "shift_max"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
                raise ValueError(f"fix.{name} must be a finite number (got {value!r})")
        if not (0 < self.shift_min <= self.shift_max / 2 and self.shift_max <= SAFE_SHIFT
                and math.frexp(self.shift_max)[0] == 0.5):
            raise ValueError(f"fix needs 0 < shift_min <= shift_max / 2 and shift_max a power of two <= "
                             f"{SAFE_SHIFT:g} (got shift_min={self.shift_min!r}, shift_max={self.shift_max!r}): a "
                             f"shift of 0 would leave P̄ = 1 for the tied keys, one above {SAFE_SHIFT:g} would let "
                             "their P̄ leave FP32's normal range")

    def __str__(self):
        return f"boundmax({_num(self.beta)},{_num(self.eps)},{_num(self.shift_min)},{_num(self.shift_max)})"


def _num(x: float) -> str:
    return repr(float(x)) if not float(x).is_integer() else str(int(x)) if abs(x) < 1e15 else repr(float(x))


@dataclass(frozen=True)
class Precision:
    """Every cast point of one attention call. See the module docstring for the meaning of each knob."""

    matmul: str = "bf16"
    scores: str = "fp32"
    exp: str = "fp32"
    pbar: str = "bf16"
    pv_out: str = "fp32"
    acc: str = "fp32"
    out: str = "bf16"
    delta: str = "dO.O"
    block_q: int | None = 128
    block_k: int | None = 64
    sub: str = "sub"
    fix: DynamicMax | BoundedMax | None = None
    l_clamp: float | None = None
    # added with lpfail.attention (defaults are the FA2-style values):
    qk_out: str = "fp32"
    exp_in: str = "fp32"
    dp: str = "fp32"
    delta_prod: str = "fp32"
    ds: str = "bf16"
    grad_acc: str = "fp32"
    masked_ties: bool = False
    # added with stochastic rounding (lpfail.bf16.round_stochastic):
    rounding: str = "rne"
    # added with the compiled official code (lpfail.experiments.official_check):
    o_acc: str | None = None
    l_div: str | None = None
    l_store: str | None = None
    m_acc: str | None = None
    # added after reading inductor's Triton code of the compiled official code (H200, torch 2.11):
    m_rescale: str | None = None
    l_div_last: str | None = None
    # added with experiment `cures` (chapter 6):
    ds_rowsum: bool = False
    # added after replaying the compiled official fixed code's first query tile:
    masked_carry: str | None = None
    # added with the normaliser's source (flash-attention PR #2721):
    l_from: str = "p"
    # added with the precision dial (lpfail.experiments.dial):
    v: str | None = None

    def __post_init__(self):
        for name in _DTYPE_FIELDS:
            value = getattr(self, name)
            if value not in FORMATS:
                raise ValueError(f"Precision.{name} must be one of {_FORMAT_LIST} (got {value!r})")
        if self.delta not in DELTAS:
            raise ValueError(f"Precision.delta must be one of {list(DELTAS)} (got {self.delta!r})")
        if self.sub not in SUBS:
            raise ValueError(f"Precision.sub must be one of {list(SUBS)} (got {self.sub!r})")
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"Precision.{name} must be a positive int or None for one tile (got {value!r})")
        if self.fix is not None and not isinstance(self.fix, (DynamicMax, BoundedMax)):
            raise ValueError(f"Precision.fix must be None, DynamicMax(beta, eps) or BoundedMax(beta, eps, shift_min, "
                             f"shift_max) (got {self.fix!r})")
        if self.l_clamp is not None and not (isinstance(self.l_clamp, (int, float)) and self.l_clamp > 0):
            raise ValueError(f"Precision.l_clamp must be None or a positive number (got {self.l_clamp!r})")
        if not isinstance(self.masked_ties, bool):
            raise ValueError(f"Precision.masked_ties must be True or False (got {self.masked_ties!r})")
        for name in _ACC_FIELDS:
            value = getattr(self, name)
            if value is not None and value not in FORMATS:
                raise ValueError(f"Precision.{name} must be None (the `{_FALLBACK.get(name, 'acc')}` dtype) or one "
                                 f"of {_FORMAT_LIST} (got {value!r})")
        if self.v is not None and self.v not in FORMATS:
            raise ValueError(f"Precision.v must be None (the `matmul` dtype) or one of {_FORMAT_LIST} (got {self.v!r})")
        if self.masked_carry is not None:
            if self.masked_carry not in FORMATS:
                raise ValueError(f"Precision.masked_carry must be None (no extra rounding) or one of {_FORMAT_LIST} "
                                 f"(got {self.masked_carry!r})")
            if not self.masked_ties:
                raise ValueError(f"Precision.masked_carry={self.masked_carry!r} needs masked_ties=True: it rounds "
                                 "the running state in the update of a key tile that is fully masked for the row, "
                                 "and without masked_ties such tiles are skipped (the setting would do nothing)")
        if self.l_from not in L_FROMS:
            raise ValueError(f"Precision.l_from must be one of {list(L_FROMS)} (got {self.l_from!r})")
        pbar_f, exp_f = FORMATS[self.pbar], FORMATS[self.exp]
        if self.l_from == "pbar" and not (pbar_f.dtype.itemsize < exp_f.dtype.itemsize
                                          or (not pbar_f.native and pbar_f.mantissa < exp_f.mantissa)):
            raise ValueError(f"Precision.l_from='pbar' would do nothing here: pbar={self.pbar} is as wide as exp="
                             f"{self.exp}, so P̄ is P and both sources give the same row sum; use l_from='p'")
        if not isinstance(self.ds_rowsum, bool):
            raise ValueError(f"Precision.ds_rowsum must be True or False (got {self.ds_rowsum!r})")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"Precision.rounding must be one of {list(ROUNDINGS)} (got {self.rounding!r})")
        sr_knobs = ("pv_out", "o_acc" if self.o_acc is not None else "acc", "out")
        if self.rounding == "sr" and not any(FORMATS[getattr(self, n)].narrow for n in sr_knobs):
            raise ValueError(f"Precision.rounding='sr' would do nothing here: it rounds only the 16-bit casts of "
                             f"the output path ({', '.join(f'{n}={getattr(self, n)}' for n in sr_knobs)}), "
                             "and none of them is bf16, fp16 or a K-bit format; use rounding='rne' for this policy")
        if self.sub == "fma":
            narrow = [name for name in ("qk_out", "scores", "exp_in") if FORMATS[getattr(self, name)].narrow]
            if narrow:
                raise ValueError(f"Precision.sub='fma' needs qk_out, scores and exp_in of at least fp32, but "
                                 f"{', '.join(f'{n}={getattr(self, n)}' for n in narrow)}: the fused step forms "
                                 "QKᵀ·α − m from the unrounded FP32 product, and a 16-bit product or score "
                                 "would already be rounded before it")

    def __hash__(self):  # the dataclass's hash, computed once: a policy keys the kernels' launch caches per call
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):  # a pickle must not carry this process's string hashes
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    # -- variants -------------------------------------------------------------------------------------
    def with_fix(self, beta: float = 2.0, eps: float = 1e-3) -> "Precision":
        """This policy plus the paper's dynamic-maximum fix (Algorithm 3)."""
        return dataclasses.replace(self, fix=DynamicMax(beta, eps))

    def with_bounded_fix(self, beta: float = 2.0, eps: float = 1e-3, shift_min: float = 0.5,
                         shift_max: float = 64.0) -> "Precision":
        """This policy plus the robust fix (`BoundedMax`): Algorithm 3's maximum with a bounded shift."""
        return dataclasses.replace(self, fix=BoundedMax(beta, eps, shift_min, shift_max))

    def replace(self, **changes) -> "Precision":
        """A copy with some knobs changed (validated like a new policy)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown Precision knob(s) {sorted(unknown)}; valid: {[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    def format(self, knob: str) -> Format:
        """The `Format` of a dtype knob, e.g. ``policy.format("acc")``; o_acc, l_div, l_store and m_acc fall back
        to `acc` when None, m_rescale to `m_acc`, l_div_last to `l_div`, v to `matmul`."""
        if knob in _ACC_FIELDS:
            value = getattr(self, knob)
            if value is None:
                return self.format(_FALLBACK[knob]) if knob in _FALLBACK else FORMATS[self.acc]
            return FORMATS[value]
        if knob == "v":
            return FORMATS[self.v] if self.v is not None else FORMATS[self.matmul]
        if knob not in _DTYPE_FIELDS:
            raise ValueError(f"{knob!r} is not a dtype knob; dtype knobs: {list(_DTYPE_FIELDS)}")
        return FORMATS[getattr(self, knob)]

    def dtype(self, knob: str) -> torch.dtype:
        """The torch dtype of a dtype knob, e.g. ``policy.dtype("acc")`` (fallbacks as in `format`). A K-bit format
        raises ValueError: its storage dtype (bfloat16) would round at 7 bits; use `format` and `Format.round`."""
        f = self.format(knob)
        if not f.native:
            raise ValueError(f"Precision.{knob}={f.name} is a K-bit format of the precision dial, stored in "
                             f"torch.bfloat16 but not rounded by a cast to it: use policy.format({knob!r}) and its "
                             "round(x), as lpfail.attention does")
        return f.dtype

    @property
    def name(self) -> str:
        """The preset's name when this policy is one (with "+fix" for the fixed variants, ",rounding=sr,sr_stream=1"
        appended for stochastic rounding: "PAPER_BF16,rounding=sr,sr_stream=1", and ",v=…" for V's own format),
        else its string."""
        if self.rounding != "rne":
            base = dataclasses.replace(self, rounding="rne")
            return f"{base.name},{_rounding_text(self.rounding)}" if base.name != str(base) else str(self)
        if self.v is not None:
            base = dataclasses.replace(self, v=None)
            return f"{base.name},v={self.v}" if base.name != str(base) else str(self)
        if self.l_from != "p":
            base = dataclasses.replace(self, l_from="p")
            return f"{base.name},l_from={self.l_from}" if base.name != str(base) else str(self)
        for preset_name, preset in PRESETS.items():  # exact matches first (PAPER_BF16_ROBUST_FIX, not PAPER_BF16+…)
            if self == preset:
                return preset_name
        for preset_name, preset in PRESETS.items():
            if self.fix is not None and dataclasses.replace(self, fix=None) == preset:
                return f"{preset_name}+fix" if self.fix == DynamicMax() else f"{preset_name}+{self.fix}"
        return str(self)

    # -- string form ----------------------------------------------------------------------------------
    def __str__(self) -> str:
        parts = [f"{name}={getattr(self, name)}" for name in _DTYPE_FIELDS]
        parts.append(f"delta={self.delta}")
        parts.append(f"block={_block(self.block_q)}x{_block(self.block_k)}")
        parts.append(f"sub={self.sub}")
        parts.append(f"fix={self.fix if self.fix is not None else 'none'}")
        parts.append(f"l_clamp={repr(float(self.l_clamp)) if self.l_clamp is not None else 'none'}")
        parts.append(f"masked_ties={'true' if self.masked_ties else 'false'}")
        for name, default in _SET_ONLY:  # only when set (see _SET_ONLY)
            value = getattr(self, name)
            if name == "rounding" and value != default:
                parts.append(_rounding_text(value))
            elif value != default:
                parts.append(f"{name}={'true' if value is True else value}")
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str) -> "Precision":
        """Inverse of ``str(policy)``. Also accepts a preset name (``"PAPER_BF16"``, ``"FP32+fix"``), and
        a preset followed by overrides: ``"FA2_BF16,acc=bf16"``. Unknown keys raise ValueError."""
        text = text.strip()
        items = [t.strip() for t in _split_top(text)] if text else []
        base = cls()
        if items and "=" not in items[0]:
            head = items.pop(0)
            fixed = head.endswith("+fix")
            key = head[:-4] if fixed else head
            if key not in PRESETS:
                raise ValueError(f"unknown preset {key!r}; presets: {list(PRESETS)}")
            base = PRESETS[key].with_fix() if fixed else PRESETS[key]
        changes: dict = {}
        valid = list(_DTYPE_FIELDS) + ["delta", "block", "block_q", "block_k", "sub", "fix", "l_clamp",
                                       "masked_ties", *(name for name, _ in _SET_ONLY), "sr_stream"]
        stream = None
        for item in items:
            if "=" not in item:
                raise ValueError(f"cannot parse {item!r} in {text!r}: expected key=value")
            key, value = (s.strip() for s in item.split("=", 1))
            if key not in valid:
                raise ValueError(f"unknown Precision key {key!r} in {text!r}; valid keys: {valid}")
            if key in _DTYPE_FIELDS or key in ("delta", "sub", "rounding", "l_from"):
                changes[key] = value
            elif key == "block":
                m = re.fullmatch(r"(\w+)x(\w+)", value)
                if not m:
                    raise ValueError(f"block must look like 512x512 or onextone (got {value!r})")
                changes["block_q"], changes["block_k"] = _parse_block(m.group(1)), _parse_block(m.group(2))
            elif key in ("block_q", "block_k"):
                changes[key] = _parse_block(value)
            elif key == "fix":
                changes["fix"] = _parse_fix(value)
            elif key == "l_clamp":
                changes["l_clamp"] = None if value == "none" else _parse_float(value, key)
            elif key in _ACC_FIELDS or key in ("masked_carry", "v"):
                changes[key] = None if value == "none" else value
            elif key == "sr_stream":
                stream = value
            elif key in ("masked_ties", "ds_rowsum"):
                if value not in ("true", "false"):
                    raise ValueError(f"{key} must be 'true' or 'false' (got {value!r})")
                changes[key] = value == "true"
        policy = dataclasses.replace(base, **changes)
        _check_stream(policy, stream, text)
        return policy


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def _rounding_text(rounding: str) -> str:
    """The string form of a rounding other than "rne": "sr" names its stream's version too."""
    from lpfail.sr_stream import STREAM_VERSION

    return f"rounding={rounding},sr_stream={STREAM_VERSION}" if rounding == "sr" else f"rounding={rounding}"


def _check_stream(policy: "Precision", stream: str | None, text: str) -> None:
    """`Precision.parse`: an "sr" policy must name the current stream version, and only an "sr" policy may."""
    from lpfail.sr_stream import STREAM_VERSION

    if policy.rounding != "sr":
        if stream is not None:
            raise ValueError(f"sr_stream={stream} in {text!r} belongs to rounding=sr (got rounding={policy.rounding})")
        return
    if stream is None:
        raise ValueError(f"{text!r}: rounding=sr must name its random stream, ',rounding=sr,sr_stream="
                         f"{STREAM_VERSION}' (counter-based, lpfail.sr_stream). ',rounding=sr' alone was the first "
                         "stream (torch's generators, not reproducible under CUDA-graph capture), which is retired: "
                         "results stored under it are not results of the current stream")
    if stream != str(STREAM_VERSION):
        raise ValueError(f"{text!r}: sr_stream={stream} is not this code's stream; the current version is "
                         f"{STREAM_VERSION} (lpfail.sr_stream.STREAM_VERSION)")


def _block(b: int | None) -> str:
    return "one" if b is None else str(b)


def _parse_block(s: str) -> int | None:
    if s == "one":
        return None
    try:
        return int(s)
    except ValueError:
        raise ValueError(f"a block size must be an integer or 'one' (got {s!r})") from None


def _parse_float(s: str, what: str) -> float:
    try:
        return float(s)
    except ValueError:
        raise ValueError(f"{what} must be a number (got {s!r})") from None


def _parse_fix(s: str) -> DynamicMax | BoundedMax | None:
    if s == "none":
        return None
    b = re.fullmatch(r"boundmax\(([^,]+),([^,]+),([^,]+),([^)]+)\)", s)
    if b:
        return BoundedMax(*(_parse_float(b.group(i), f"fix.{n}")
                            for i, n in enumerate(("beta", "eps", "shift_min", "shift_max"), 1)))
    m = re.fullmatch(r"dynmax\(([^,]+),([^)]+)\)", s)
    if not m:
        raise ValueError(f"fix must be 'none', 'dynmax(beta,eps)' or 'boundmax(beta,eps,shift_min,shift_max)' "
                         f"(got {s!r})")
    return DynamicMax(_parse_float(m.group(1), "fix.beta"), _parse_float(m.group(2), "fix.eps"))


# -- presets ------------------------------------------------------------------------------------------
#: What the paper's official pure-PyTorch flash attention computes under BF16 autocast, in both passes (see
#: the docstring of `lpfail.attention` for the order of operations): QKᵀ, S, S − m, m, ℓ and O in BF16;
#: exp, the block row sums, log ℓ and δ's sum in FP32; P̄ cast to BF16 before P̄V, P̄V rounded to BF16; in the
#: backward dP, the products dO∘O, dS and the dQ/dK/dV accumulators in BF16; 512×512 tiles.
PAPER_BF16 = Precision(matmul="bf16", scores="bf16", exp="fp32", pbar="bf16", pv_out="bf16", acc="bf16",
                       out="bf16", delta="dO.O", block_q=512, block_k=512,
                       qk_out="bf16", exp_in="bf16", dp="bf16", delta_prod="bf16", ds="bf16", grad_acc="bf16")
#: What FlashAttention-2-style production kernels compute: FP32 scores, m, ℓ and accumulator; P̄ in BF16
#: for the tensor-core P̄V product; output stored in BF16; backward in FP32 except the BF16 operands P and dS.
FA2_BF16 = Precision(matmul="bf16", scores="fp32", exp="fp32", pbar="bf16", pv_out="fp32", acc="fp32",
                     out="bf16", delta="dO.O", block_q=128, block_k=64,
                     qk_out="fp32", exp_in="fp32", dp="fp32", delta_prod="fp32", ds="bf16", grad_acc="fp32")
#: The same tiling as the paper's code, everything in FP32 (the paper's "high precision" control).
FP32 = Precision(matmul="fp32", scores="fp32", exp="fp32", pbar="fp32", pv_out="fp32", acc="fp32",
                 out="fp32", delta="dO.O", block_q=512, block_k=512,
                 qk_out="fp32", exp_in="fp32", dp="fp32", delta_prod="fp32", ds="fp32", grad_acc="fp32")
#: Everything in float64: equal to the truth up to float64 rounding.
FP64 = Precision(matmul="fp64", scores="fp64", exp="fp64", pbar="fp64", pv_out="fp64", acc="fp64",
                 out="fp64", delta="dO.O", block_q=512, block_k=512,
                 qk_out="fp64", exp_in="fp64", dp="fp64", delta_prod="fp64", ds="fp64", grad_acc="fp64")
#: The paper's official fixed code exactly: PAPER_BF16 + Algorithm 3 (β = 2, ε = 1e-3) + its 1e-10 floor under
#: each block's row sum (which shrinks rows whose tied maximum exceeds ≈ 23 toward zero; see chapter 1) + its
#: masking (fully masked key tiles are visited, and under the fix their masked scores count as ties).
PAPER_BF16_OFFICIAL_FIX = dataclasses.replace(PAPER_BF16, fix=DynamicMax(2.0, 1e-3), l_clamp=1e-10,
                                              masked_ties=True)

#: The official code as its own train.py runs it: under torch.compile (inductor, no emulate_precision_casts),
#: forward under BF16 autocast, backward outside it (lpfail.experiments.official_check). Read from inductor's
#: Triton code for the H200 (torch 2.11, notes/official_check.md): each fused kernel computes in FP32 and rounds
#: only what it stores, so against PAPER_BF16: S = QKᵀ·α and S − m stay FP32 (scores, exp_in; QKᵀ itself is a
#: BF16 bmm output), m, ℓ and Ō are carried in FP32 across key tiles (acc), but the rescale factor
#: a = exp(m_old − m_new) reads the row maxima from BF16 buffers (m_rescale), the final ℓ and m are stored in
#: BF16 for L = log ℓ + m (l_store), the last query tile divides by that stored BF16 ℓ and earlier tiles by the
#: FP32 one (l_div_last; where inductor's kernel boundaries fall), and δ's products dO∘O stay FP32 (delta_prod).
#: P̄ for P̄V, P̄V, dP, dS and each tile's dQ/dK/dV product stay BF16 (bmm operands and outputs); the
#: products are summed in FP32 and rounded once (with ≤ 2 key tiles the same as PAPER_BF16's grad_acc=bf16).
#: Checked on CPU by replaying inductor's generated GPU kernels in Triton's interpreter (tools/inductor_replay.py):
#: ≥ 99.9 % of O, dQ, dK, dV bit for bit; what the interpreter cannot show (the GPU's division, FMA contraction,
#: reduction order) is left to the GPU call (`tools/gpu_batch.sh official`).
PAPER_BF16_COMPILED = dataclasses.replace(PAPER_BF16, scores="fp32", exp_in="fp32", acc="fp32",
                                          delta_prod="fp32", l_store="bf16", m_rescale="bf16", l_div_last="bf16")
#: The official fixed code (STABLE=1) under torch.compile: PAPER_BF16_COMPILED + what PAPER_BF16_OFFICIAL_FIX adds,
#: with two differences read from its Triton code for the H200 (torch 2.11): the rescale factor of the visible key
#: tiles reads the FP32 maxima (m_rescale back to m_acc = acc; the unfixed code reads BF16 buffers), and the update
#: of a key tile fully masked for the row — under the fix its masked scores tie, so m' = 0 and the row's maximum
#: can move — reads m and ℓ from the official code's BF16 row buffers and stores Ō·a in BF16 (masked_carry). The
#: division is the unfixed code's (l_div_last): the first query tile divides by its FP32 ℓ, which after that
#: update is a·bf16(ℓ₀) + 1e-10 (notes/official_check.md).
PAPER_BF16_COMPILED_OFFICIAL_FIX = dataclasses.replace(PAPER_BF16_COMPILED, fix=DynamicMax(2.0, 1e-3),
                                                       l_clamp=1e-10, masked_ties=True, m_rescale=None,
                                                       masked_carry="bf16")
#: PAPER_BF16 with the robust fix (`BoundedMax` with its defaults: β = 2, ε = 1e-3, shifts in [0.5, 64]): the
#: paper's code with Algorithm 3 made finite at every logit scale; no clamp, masked entries never tie.
PAPER_BF16_ROBUST_FIX = dataclasses.replace(PAPER_BF16, fix=BoundedMax())
#: FA2_BF16 with the robust fix: what the drop-in kernel runs with ``fix="robust"``.
FA2_BF16_ROBUST_FIX = dataclasses.replace(FA2_BF16, fix=BoundedMax())

PRESETS: dict[str, Precision] = {
    "PAPER_BF16": PAPER_BF16,
    "FA2_BF16": FA2_BF16,
    "FP32": FP32,
    "FP64": FP64,
    "PAPER_BF16_OFFICIAL_FIX": PAPER_BF16_OFFICIAL_FIX,
    "PAPER_BF16_COMPILED": PAPER_BF16_COMPILED,
    "PAPER_BF16_COMPILED_OFFICIAL_FIX": PAPER_BF16_COMPILED_OFFICIAL_FIX,
    "PAPER_BF16_ROBUST_FIX": PAPER_BF16_ROBUST_FIX,
    "FA2_BF16_ROBUST_FIX": FA2_BF16_ROBUST_FIX,
}


# -- the precision dial's arms (experiments `dial_calibration`, `dial_training`; the learning-rate grid's variants)
#: The dial's settings of the calibration and of the training arms: 7 (BF16) down to 3 fraction bits.
DIAL_KS = (7, 6, 5, 4, 3)


def _at_k(base: Precision, k: int, knobs: tuple[str, ...]) -> Precision:
    """`base` with each of `knobs` at bf16's exponent with k fraction bits. A knob that falls back to another when
    None (v, o_acc) stays None where that other knob already has the format, so at k = 7 the result is `base`
    itself (same string, same bits)."""
    f = dial_format(k)
    changes = {}
    for knob in knobs:
        if knob in ("v", "o_acc"):
            changes[knob] = None if dataclasses.replace(base, **{knob: None}).format(knob).name == f else f
        else:
            changes[knob] = f
    return base.replace(**changes)


def arm_a(k: int) -> Precision:
    """A_K: PAPER_BF16 with V, P̄V, Ō (Ō·a and Ō·a + P̄V) and O at k fraction bits, to nearest even."""
    return _at_k(PAPER_BF16, k, ("v", "pv_out", "o_acc", "out"))


def arm_sr(k: int) -> Precision:
    """SR_K: A_K with P̄V, Ō and O rounded stochastically at k fraction bits (V still to nearest even)."""
    return arm_a(k).replace(rounding="sr")


def arm_d(k: int) -> Precision:
    """D_K: FA2_BF16 (FP32 scores, accumulator, m and ℓ) with V and O at k fraction bits."""
    return _at_k(FA2_BF16, k, ("v", "out"))


def arm_r(k: int) -> Precision:
    """R_K: A_K with the robust fix (BoundedMax with its defaults)."""
    return arm_a(k).replace(fix=BoundedMax())
