"""Triton flash attention, forward pass, with the precision policy's cast points as compile-time knobs.

Explained in chapter 5 ("Fix") of the book; the launcher is in `kernels/launcher.py`, the `autograd.Function` in
`kernels/autograd.py`. File order follows Triton's fused-attention tutorial: device helpers → the inner loop
over key blocks → the forward kernel → its launcher.

One program owns BLOCK_M query rows of one (batch, head) and walks the key blocks, keeping the running row
maximum `m_i`, the running row sum `l_i` and the output accumulator `acc` (FlashAttention-2, Algorithm 1).
Every cast point of `lpfail.precision.Precision` is a constexpr:

=========== ==================================================================================
MATMUL      dtype of the dot operands (Q, K, V, P̄); the dots accumulate in FP32
SCORES      S = α·QKᵀ is rounded to this (scale-then-subtract mode only)
PBAR        P̄ = exp(S − m) is rounded to this before the P̄V dot
PV_OUT      the P̄V product is rounded to this before it is added to the accumulator
ACC         `acc`, `m_i` and `l_i` are rounded to this after every key block (BF16: the paper's code)
SUB_FMA     False: S is formed, rounded, then m subtracted (a tied maximum gives exactly P̄ = 1);
            True: exp2(QKᵀ·α·log2e − m·log2e) in one fused multiply-add, as production kernels do
FIX         0: none; 1: the paper's dynamic maximum (Algorithm 3) with BETA and EPS, applied per key block;
            2: the robust fix (BoundedMax): Algorithm 3's shift folded into [SHIFT_LO, SHIFT_HI]
=========== ==================================================================================

Key blocks are the policy's `block_k`. When it is one hardware tile (BLOCK_N) the loop is one pass per tile
(the fast path). When it is larger (the paper's 512, or one tile over the whole row) each policy block is
walked in BLOCK_N chunks twice — once for its maximum (and, when FIX is on, its second largest score: the tie
test), once to accumulate — so that every rounding happens exactly where the reference does it.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # a constexpr: jitted code may read no other globals
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
TUNE_ENV = "LPFAIL_KERNELS_AUTOTUNE"  # "0": every kernel takes its first eligible config (see `_tune`)


def _patch_interpreter_index():
    """Triton 3.6's interpreter turns a scalar into an int with ``int(array_of_shape_1)``, which NumPy 2 rejects,
    so loops bounded by ``tl.program_id`` arithmetic fail there. Make ``__index__`` take the one element."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_lpfail", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._lpfail = True
    interpreter._patch_lang_tensor = patched


def _elementwise_combine(fn):
    """Mark a `tl.reduce` combine function as elementwise (no control flow on its values, no cross-lane op) for
    `_patch_interpreter_reduce`: the interpreter may then apply it to whole slices instead of one element at a
    time."""
    getattr(fn, "fn", fn)._lpfail_elementwise = True
    return fn


def _patch_interpreter_reduce():
    """Triton 3.6's interpreter reduces with a user combine function (`_max2`'s `_top2`) one element at a time: a
    Python loop over every element of the tile, each step building tensors and running the combine function on
    1-element arrays (≈ 3 s per 64×64 tile, ~80 % of a fix test's time on the CPU). For combine functions marked
    with `_elementwise_combine`, run the same left fold along the reduced axis — acc = x₀, then
    acc = combine(acc, x_k) for k = 1, 2, … in index order, as the interpreter does — for all output positions at
    once, on slices: the combine function's operations are elementwise, so every output gets the same operations
    on the same values in the same order (bit for bit the interpreter's result; `tests/test_kernels.py` checks
    it). Other combine functions keep the interpreter's own loop."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter.ReduceOps.generic_reduce
    if getattr(original, "_lpfail", False):
        return

    def generic_reduce(self, input):
        if not getattr(getattr(self.combine_fn, "fn", None), "_lpfail_elementwise", False):
            return original(self, input)
        original_axis = self.axis
        input, axis = self.unravel(input, self.axis)
        datas = [arg.handle.data for arg in input]
        input_shape = datas[0].shape
        output_shape = input_shape[0:axis] + input_shape[axis + 1:]
        acc = [np.take(d, 0, axis=axis).astype(d.dtype) for d in datas]
        for k in range(1, input_shape[axis]):
            acc_tuple = tuple(self.to_tensor(a, arg.dtype) for a, arg in zip(acc, input))
            input_tuple = tuple(self.to_tensor(np.take(d, k, axis=axis), arg.dtype) for d, arg in zip(datas, input))
            ret = self.combine_fn.fn(*acc_tuple, *input_tuple)
            ret = ret if isinstance(ret, tuple) else (ret,)
            acc = [np.asarray(r.handle.data if isinstance(r, tl.core.tensor) else r).reshape(output_shape)
                   .astype(d.dtype) for r, d in zip(ret, datas)]
        out = []
        for i, data in enumerate(acc):   # packed as the interpreter packs its result
            if self.keep_dims:
                if original_axis is not None:
                    data = np.expand_dims(data, axis)
                else:
                    for _ in range(len(input_shape)):
                        data = np.expand_dims(data, 0)
            elif original_axis is None:
                data = data.item()
            out.append(self.to_tensor(data, input[i].dtype))
        return out

    generic_reduce._lpfail = True
    generic_reduce._lpfail_original = original
    interpreter.ReduceOps.generic_reduce = generic_reduce


def _patch_interpreter_device_calls():
    """Triton 3.6's interpreter re-patches `triton.language` on every call of a device function (`_round`, `_scores`,
    …: ~17,000 calls in one backward of tests/test_kernels_bwd.py, 2 ms each, ~30 % of the test's time): one
    `inspect.getmembers` walk over `tl`, `tl.tensor` and `tl.math` per call, only to find that the kernel's own launch
    already replaced every builtin (a replaced builtin is no builtin and is skipped) and to set a few attributes
    again to equivalent functions, in a scope that is never restored. Skip that walk where it can change nothing:
    during a launch, for a device function whose language modules (`tl`, `tl.core` among its globals) the launch, or
    an earlier device call of it, has already patched. Any other call (a device function of another module, one
    outside a launch) runs the interpreter's own code, patching as before."""
    import inspect

    from triton.runtime import interpreter

    device_call = interpreter.InterpretedFunction.__call__
    if getattr(device_call, "_lpfail", False):
        return
    grid_call = interpreter.GridExecutor.__call__
    patched = []   # stack, one entry per running launch: the ids of the language modules patched in it

    def langs(fn):
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def launch(self, *args, **kwargs):
        patched.append(langs(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def call(self, *args, **kwargs):
        mine = self.__dict__.get("_lpfail_langs")
        if mine is None:
            mine = self._lpfail_langs = langs(self.fn)
        if not patched or not mine <= patched[-1]:
            out = device_call(self, *args, **kwargs)   # patches its modules (for the rest of the launch too)
            if patched:
                patched[-1] |= mine
            return out
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    call._lpfail = launch._lpfail = True
    call._lpfail_original, launch._lpfail_original = device_call, grid_call
    interpreter.InterpretedFunction.__call__ = call
    interpreter.GridExecutor.__call__ = launch


def _patch_interpreter_dtypes():
    """Triton 3.6's interpreter maps a Triton dtype to its NumPy one (`_get_np_dtype`, on every operation) by
    building a dict of 19 dtypes anew on each call (~5 % of an interpreted kernel's time). Look each scalar dtype up
    once instead: the same answer (the original's, memoised by the same dict lookup), pointers and blocks as there."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._get_np_dtype
    if getattr(original, "_lpfail", False):
        return
    table = {}
    u64 = np.dtype(np.uint64)

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.pointer_type):
            return u64
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
            if isinstance(tt_dtype, tl.pointer_type):
                return u64
        np_dtype = table.get(tt_dtype)
        if np_dtype is None:
            np_dtype = table[tt_dtype] = original(tt_dtype)
        return np_dtype

    get_np_dtype._lpfail = True
    get_np_dtype._lpfail_original = original
    interpreter._get_np_dtype = get_np_dtype


if INTERPRET:
    _patch_interpreter_index()
    _patch_interpreter_reduce()
    _patch_interpreter_device_calls()
    _patch_interpreter_dtypes()
_INTERPRET = tl.constexpr(INTERPRET)


# -- device helpers --------------------------------------------------------------------------------------
@triton.jit
def _round(x, DT: tl.constexpr):
    """Round an FP32 tile to DT and back (a cast point, round to nearest even); the identity for FP32."""
    if DT == tl.float32:
        return x
    elif (DT == tl.bfloat16) and _INTERPRET:
        # the interpreter truncates FP32 → BF16; round to nearest even on the bits instead
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def _imin(a, b):
    """min of two scalar ints (written as a branch: Triton's interpreter mishandles tl.minimum on scalars)."""
    if b < a:
        a = b
    return a


@triton.jit
def _bh_offset(off_hz, H, stride_z, stride_h):
    """Offset (int64) of one (batch, head) slice of a (B, H, N, D) tensor, from the grid's flattened axis."""
    return (off_hz // H).to(tl.int64) * stride_z + (off_hz % H).to(tl.int64) * stride_h


@triton.jit
def _load_rows(ptrs, offs, N_CTX, MASK: tl.constexpr, D_VALID: tl.constexpr = 0):
    """A (rows, HEAD_DIM) tile whose row indices are `offs`; rows at or past N_CTX read 0 when MASK. D_VALID (a
    head dim narrower than the tile, see `_attn_fwd_kernel`): columns at or past D_VALID read 0 as well."""
    if D_VALID:
        cols = tl.arange(0, ptrs.shape[1])
        if MASK:
            return tl.load(ptrs, mask=(offs[:, None] < N_CTX) & (cols[None, :] < D_VALID), other=0.0)
        else:
            return tl.load(ptrs, mask=cols[None, :] < D_VALID, other=0.0)
    elif MASK:
        return tl.load(ptrs, mask=offs[:, None] < N_CTX, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _rows_mask(rows_ok, offs_d, D_VALID: tl.constexpr):
    """The store mask of a (rows, HEAD_DIM) tile from its rows' (rows, 1) mask: those rows, and with D_VALID only
    the columns below it (the tile's padding is never written)."""
    if D_VALID:
        return rows_ok & (offs_d[None, :] < D_VALID)
    else:
        return rows_ok


@_elementwise_combine
@triton.jit
def _top2(a1, a2, b1, b2):
    """Combine of a (largest, second largest) reduction: the two largest of the union of two multisets, each
    given by its largest and second largest (−inf where it has none). Three min/max, no compare-and-count."""
    return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2, propagate_nan=tl.PropagateNan.ALL))


@triton.jit
def _max2(qk):
    """Per row: (largest, second largest) of a tile, in one reduction (the second may equal the first)."""
    return tl.reduce((qk, tl.full(qk.shape, float("-inf"), tl.float32)), 1, _top2)


@triton.jit
def _has_tie(r_m, second, EPS, SCORES: tl.constexpr):
    """Algorithm 3's tie test as a flag (2.0: "more than one score at the maximum", else 0.0): at least two
    scores S ≥ round(r_m − ε) ⇔ the second largest score ≥ round(r_m − ε) — the count the reference takes, read
    off the second order statistic instead of counted. A row whose maximum is −inf (fully masked) has none.
    (Rows holding a NaN score have a NaN output either way.)"""
    thresh = _round(r_m - EPS, SCORES)
    return tl.where((second >= thresh) & (r_m > float("-inf")), 2.0, 0.0)


@triton.jit
def _tie_count(qk, r_m, scale, EPS, SCORES: tl.constexpr, SUB_FMA: tl.constexpr, POW2: tl.constexpr):
    """TIE = 1: Algorithm 3's count r_s = #{S ≥ round(r_m − ε)} of one tile, taken after the max reduction (one
    compare and one add per score; no second running value, so no second register tile). `qk` holds the raw
    products in FMA mode: with α a power of two (POW2) fl(x·α) = x·α, so the threshold divides back exactly
    and the count reads the raw products; otherwise each product is scaled first (one multiply more per score).
    A row whose maximum is −inf (fully masked) has none."""
    thresh = _round(r_m - EPS, SCORES)
    if SUB_FMA:
        if POW2:
            n = tl.sum(tl.where(qk >= (thresh * (1.0 / scale))[:, None], 1.0, 0.0), 1)
        else:
            n = tl.sum(tl.where(qk * scale >= thresh[:, None], 1.0, 0.0), 1)
    else:
        n = tl.sum(tl.where(qk >= thresh[:, None], 1.0, 0.0), 1)
    return tl.where(r_m > float("-inf"), n, 0.0)


@triton.jit
def _block_max(qk, scale, EPS, BETA, SHIFT_LO, SHIFT_HI, SHIFT_SAFE, SCORES: tl.constexpr, SUB_FMA: tl.constexpr,
               FIX: tl.constexpr, ACC: tl.constexpr, TIE: tl.constexpr, POW2: tl.constexpr):
    """The maximum that this key block contributes: r_m, or Algorithm 3's m' when FIX (1), or the robust fix's
    (FIX = 2, `lpfail.precision.BoundedMax`). In natural units, except in RAW mode (units of α).

    The tie test has two exact forms (same m' bit for bit; `lpfail.kernels.Tuning.tie`): TIE = 0 reads the row's two
    largest scores from one (max, second max) reduction (three min/max per score, and a second running value
    per score in registers); TIE = 1 counts the scores at or above the threshold after a plain max reduction
    (`_tie_count`). In FMA mode the two largest raw products are scaled after the reduction: x ↦ fl(x·α) is
    monotone for α > 0, so the second largest of fl(QKᵀ·α) is fl(second largest of QKᵀ · α) and the test gives
    the count's answer bit for bit."""
    if FIX:
        if TIE == 1:
            r_m = tl.max(qk, 1)
            if SUB_FMA:
                r_m = r_m * scale   # = max of the FP32 products α·QKᵀ (rounding is monotone)
            ties = _tie_count(qk, r_m, scale, EPS, SCORES, SUB_FMA, POW2)
        else:
            r_m, second = _max2(qk)
            if SUB_FMA:
                r_m = r_m * scale   # = max of the FP32 products α·QKᵀ (rounding is monotone)
                second = second * scale
            ties = _has_tie(r_m, second, EPS, SCORES)
        r_m = _dynamic_max(r_m, ties, BETA, SHIFT_LO, SHIFT_HI, SHIFT_SAFE, SCORES, FIX, ACC)
    elif SUB_FMA:
        r_m = tl.max(qk, 1) * scale  # = max of the FP32 products α·QKᵀ (rounding is monotone)
    else:
        r_m = tl.max(qk, 1)  # qk already holds the rounded scores S in this mode
    return r_m


@triton.jit
def _dynamic_max(r_m, ties, BETA, SHIFT_LO, SHIFT_HI, SHIFT_SAFE, SCORES: tl.constexpr, FIX: tl.constexpr,
                 ACC: tl.constexpr):
    """Algorithm 3: with more than one score at the maximum, m' = β·r_m (r_m > 0) or 0 (r_m < 0).
    FIX = 2: the robust fix (`lpfail.precision.BoundedMax`): Algorithm 3's shift x = m' − r_m kept where it
    lies in [SHIFT_LO, SHIFT_HI], else r_m + x + SHIFT_LO (x below) or r_m + H/2 + ((x − H/2) mod H/2) (x above,
    H = SHIFT_HI); m' rounded to ACC, and r_m kept where that leaves no shift or one above SHIFT_SAFE. In the
    order of `lpfail.attention._bounded_max`, so that both give the same m' bit for bit."""
    multi = ties > 1.5
    shifted = tl.where(r_m > 0, _round(BETA * r_m, SCORES), tl.where(r_m < 0, 0.0, r_m))
    if FIX == 2:
        half = SHIFT_HI * 0.5
        x = shifted - r_m
        x = tl.where(multi & (r_m > float("-inf")), x, 0.0)            # r_m = −inf (fully masked): no tie
        folded = half + ((x - half) - half * tl.floor((x - half) * (1.0 / half)))
        delta = tl.where(x < SHIFT_LO, x + SHIFT_LO, folded)
        moved = _round(r_m + delta, SCORES)
        keep3 = (x >= SHIFT_LO) & (x <= SHIFT_HI)
        m_b = _round(tl.where(keep3, shifted, moved), ACC)
        shift = m_b - r_m
        use = multi & (r_m > float("-inf")) & (shift > 0) & (shift <= SHIFT_SAFE)
        return tl.where(use, m_b, r_m)
    else:
        return tl.where(multi, shifted, r_m)


@triton.jit
def _load_tile(src, start, offs, N_CTX, stride, MASK: tl.constexpr, TMA: tl.constexpr, D_VALID: tl.constexpr = 0):
    """Rows start … start + len(offs) − 1 of one (batch, head)'s (N_CTX, HEAD_DIM) matrix. TMA: `src` is a
    tensor descriptor (`tl.make_tensor_descriptor`, shape (N_CTX, HEAD_DIM)): the Hopper tensor memory
    accelerator copies the tile, rows past N_CTX read 0. Else `src` points at row 0's tile of pointers and
    rows past N_CTX read 0 when MASK, columns at or past D_VALID when it is set (as `_load_rows`)."""
    if TMA:
        return src.load([start, 0])
    else:
        return _load_rows(src + start * stride, offs, N_CTX, MASK, D_VALID)


@triton.jit
def _rows_source(X, stride_row, stride_d, N_CTX, offs_rows, offs_d, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
                 TMA: tl.constexpr):
    """What `_load_tile` reads tiles of BLOCK rows from: a TMA descriptor over one (batch, head)'s rows (TMA; the
    launcher makes the head dim contiguous), or the pointers of rows 0 … BLOCK − 1."""
    if TMA:
        return tl.make_tensor_descriptor(X, shape=[N_CTX, HEAD_DIM], strides=[stride_row, 1],
                                         block_shape=[BLOCK, HEAD_DIM])
    else:
        return X + offs_rows[:, None] * stride_row + offs_d[None, :] * stride_d


@triton.jit
def _scores(q, k, offs_m, offs_n, N_CTX, scale,
            MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, SUB_FMA: tl.constexpr,
            MASK: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr, RAW: tl.constexpr):
    """One tile of scores from a loaded key tile k (BLOCK_N, HEAD_DIM): raw QKᵀ (FMA mode) or S = round(α·QKᵀ)
    (sub mode); masked entries are −inf. RAW (sub mode with α a power of two): S/α = round(round(QKᵀ)), the
    scores in units of α (see `_attn_fwd`)."""
    qk = tl.dot(q, tl.trans(k.to(MATMUL)), input_precision=DOT_PREC)   # (BLOCK_M, BLOCK_N)
    if RAW:
        qk = _round(_round(qk, QK_OUT), SCORES)                        # S/α, exactly
    elif not SUB_FMA:
        qk = _round(_round(qk, QK_OUT) * scale, SCORES)                # S = round(round(QKᵀ)·α)
    if MASK:
        valid = offs_n[None, :] < N_CTX
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(valid, qk, float("-inf"))
    return qk


@triton.jit
def _probs(qk, m_new, scale, exp_c, EXP_IN: tl.constexpr, SUB_FMA: tl.constexpr):
    """P = exp(S − m) in FP32 (before any rounding to PBAR); S − m rounded to EXP_IN, or one FMA.
    Sub mode: exp2((S − m)·exp_c), exp_c = log2(e) (α·log2(e) in RAW units) — on the GPU the same two
    instructions tl.exp(x) compiles to (a multiply by log2(e), then ex2)."""
    if SUB_FMA:
        # base 2 with log2(e) folded into both operands: one FFMA and one ex2 per score, as FlashAttention does
        # (tl.exp would add a multiply by log2(e) before its ex2)
        return tl.math.exp2(tl.fma(qk, scale * LOG2E, -(m_new * LOG2E)[:, None]))
    else:
        return tl.math.exp2(_round(qk - m_new[:, None], EXP_IN) * exp_c)


@triton.jit
def _alpha(m_i, m_new, exp_c, EXP_IN: tl.constexpr):
    """The online softmax's rescale factor exp(m_old − m_new), rounded and exponentiated as P is."""
    return tl.math.exp2(_round(m_i - m_new, EXP_IN) * exp_c)


@triton.jit
def _accumulate(acc, l_i, m_i, m_new, l_blk, pv, exp_c, ACC: tl.constexpr, EXP_IN: tl.constexpr,
                PV_OUT: tl.constexpr):
    """Online-softmax update with one block's row sum and P̄V product (FP32): rescale, add, round."""
    alpha = _alpha(m_i, m_new, exp_c, EXP_IN)
    l_i = _round(l_i * alpha + l_blk, ACC)
    acc = _round(_round(acc * alpha[:, None], ACC) + _round(pv, PV_OUT), ACC)
    return acc, l_i


@triton.jit
def _row_sum(p, pbar, L_CLAMP, CLAMP: tl.constexpr, L_PBAR: tl.constexpr):
    """ℓ_j of one key block: rowsum of P (FP32, before its rounding) or, with L_PBAR (the policy's
    l_from="pbar", flash-attention PR #2721), of P̄ as rounded for the P̄V dot; the official code's per-block
    floor when CLAMP."""
    if L_PBAR:
        l_blk = tl.sum(pbar.to(tl.float32), 1)
    else:
        l_blk = tl.sum(p, 1)
    if CLAMP:
        l_blk = tl.maximum(l_blk, L_CLAMP)
    return l_blk


# -- the inner loops ---------------------------------------------------------------------------------------
@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, K_src, V_src, stride_kn, stride_vn, offs_m, offs_n0,
               lo, hi, N_CTX, scale, exp_c, EPS, BETA, L_CLAMP, SHIFT_LO, SHIFT_HI, SHIFT_SAFE,
               BLOCK_N: tl.constexpr, MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr,
               EXP_IN: tl.constexpr, PBAR: tl.constexpr, PV_DT: tl.constexpr, PV_OUT: tl.constexpr,
               ACC: tl.constexpr, SUB_FMA: tl.constexpr, FIX: tl.constexpr, CLAMP: tl.constexpr,
               MASK: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr,
               RAW: tl.constexpr, TMA: tl.constexpr, TIE: tl.constexpr, POW2: tl.constexpr,
               L_PBAR: tl.constexpr, D_VALID: tl.constexpr = 0):
    """Fast path: the policy's key block is one tile, so each tile is read once. (There is no rotated loop that
    issues the next tile's QKᵀ before this tile's softmax: offered on the H200, the autotuner chose it in 1 of 32
    shapes.)"""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = _load_tile(K_src, start_n, offs_n, N_CTX, stride_kn, MASK, TMA, D_VALID)  # (BLOCK_N, HEAD_DIM)
        qk = _scores(q, k, offs_m, offs_n, N_CTX, scale, MATMUL, QK_OUT, SCORES, SUB_FMA, MASK, CAUSAL, DOT_PREC,
                     RAW)
        m_blk = _block_max(qk, scale, EPS, BETA, SHIFT_LO, SHIFT_HI, SHIFT_SAFE, SCORES, SUB_FMA, FIX, ACC, TIE,
                           POW2)
        m_new = _round(tl.maximum(m_i, m_blk), ACC)
        p = _probs(qk, m_new, scale, exp_c, EXP_IN, SUB_FMA)            # (BLOCK_M, BLOCK_N) FP32
        pbar = _round(p, PBAR).to(PV_DT)                                # cast: P̄ right before the P̄V dot
        l_blk = _row_sum(p, pbar, L_CLAMP, CLAMP, L_PBAR)
        v = _load_tile(V_src, start_n, offs_n, N_CTX, stride_vn, MASK, TMA, D_VALID).to(PV_DT)
        if (ACC == tl.float32) and (PV_OUT == tl.float32):
            # FP32 accumulator: let the dot add into the rescaled accumulator (one pass over acc)
            alpha = _alpha(m_i, m_new, exp_c, EXP_IN)
            l_i = l_i * alpha + l_blk
            acc = tl.dot(pbar, v, acc * alpha[:, None], input_precision=PV_PREC)
        else:
            pv = tl.dot(pbar, v, input_precision=PV_PREC)
            acc, l_i = _accumulate(acc, l_i, m_i, m_new, l_blk, pv, exp_c, ACC, EXP_IN, PV_OUT)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_policy_blocks(acc, l_i, m_i, q, K_src, V_src, stride_kn, stride_vn, offs_m, offs_n0,
                       hi, N_CTX, KEY_BLOCK, scale, exp_c, EPS, BETA, L_CLAMP, SHIFT_LO, SHIFT_HI, SHIFT_SAFE,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                       MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, EXP_IN: tl.constexpr,
                       PBAR: tl.constexpr, PV_DT: tl.constexpr, PV_OUT: tl.constexpr, ACC: tl.constexpr,
                       SUB_FMA: tl.constexpr, FIX: tl.constexpr, CLAMP: tl.constexpr, CAUSAL: tl.constexpr,
                       DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr, RAW: tl.constexpr, TMA: tl.constexpr,
                       L_PBAR: tl.constexpr, D_VALID: tl.constexpr = 0):
    """Emulation path: policy key blocks of KEY_BLOCK keys (a multiple of BLOCK_N), walked in chunks. The tie
    test here is always the (max, second max) form: a count would need the block's maximum first, a third walk."""
    for kb in range(0, hi, KEY_BLOCK):
        kb_hi = _imin(kb + KEY_BLOCK, hi)
        # pass 1: the block's maximum (with FIX also its second largest score, for the tie test: the chunks'
        # pairs merge with `_top2`, so the block is not walked a third time to count ties)
        r_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        second = tl.full([BLOCK_M], float("-inf"), tl.float32)
        for start_n in range(kb, kb_hi, BLOCK_N):
            offs_n = start_n + offs_n0
            k = _load_tile(K_src, start_n, offs_n, N_CTX, stride_kn, True, TMA, D_VALID)
            qk = _scores(q, k, offs_m, offs_n, N_CTX, scale, MATMUL, QK_OUT, SCORES, SUB_FMA, True, CAUSAL,
                         DOT_PREC, RAW)
            if FIX:
                c1, c2 = _max2(qk)
                if SUB_FMA:
                    c1, c2 = c1 * scale, c2 * scale
                r_m, second = _top2(r_m, second, c1, c2)
            elif SUB_FMA:
                r_m = tl.maximum(r_m, tl.max(qk, 1) * scale)
            else:
                r_m = tl.maximum(r_m, tl.max(qk, 1))
        if FIX:
            ties = _has_tie(r_m, second, EPS, SCORES)
            r_m = _dynamic_max(r_m, ties, BETA, SHIFT_LO, SHIFT_HI, SHIFT_SAFE, SCORES, FIX, ACC)
        m_new = _round(tl.maximum(m_i, r_m), ACC)
        # pass 2: P for the whole block, the row sum and the P̄V product (accumulated in FP32 over the block)
        l_blk = tl.zeros([BLOCK_M], tl.float32)
        pv = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start_n in range(kb, kb_hi, BLOCK_N):
            offs_n = start_n + offs_n0
            k = _load_tile(K_src, start_n, offs_n, N_CTX, stride_kn, True, TMA, D_VALID)
            qk = _scores(q, k, offs_m, offs_n, N_CTX, scale, MATMUL, QK_OUT, SCORES, SUB_FMA, True, CAUSAL,
                         DOT_PREC, RAW)
            p = _probs(qk, m_new, scale, exp_c, EXP_IN, SUB_FMA)
            pbar = _round(p, PBAR).to(PV_DT)                            # cast: P̄ right before the P̄V dot
            l_blk += _row_sum(p, pbar, 0.0, False, L_PBAR)
            v = _load_tile(V_src, start_n, offs_n, N_CTX, stride_vn, True, TMA, D_VALID).to(PV_DT)
            pv = tl.dot(pbar, v, pv, input_precision=PV_PREC)
        if CLAMP:
            l_blk = tl.maximum(l_blk, L_CLAMP)
        acc, l_i = _accumulate(acc, l_i, m_i, m_new, l_blk, pv, exp_c, ACC, EXP_IN, PV_OUT)
        m_i = m_new
    return acc, l_i, m_i


# -- the forward kernel --------------------------------------------------------------------------------------
#: Autotune spaces (`lpfail.kernels.Tuning.space`): (BLOCK_M, warps, stages, maxnreg). "v1" is the first space
#: (its first entry is what LPFAIL_KERNELS_AUTOTUNE=0, the GPU tests, runs; its picks on the H200: 128/8/3
#: without the fix, 64/4/3 with it (the tie test's registers), 128/8/4 once). "sm90" adds deeper pipelines,
#: 256-row tiles at head dim ≤ 64 (half the K/V traffic per query), and 8-warp configs capped at 128 registers
#: per thread (two CTAs per SM, at the risk of spills).
FWD_SPACES = {
    "v1": ((128, 8, 3, None), (128, 4, 3, None), (64, 4, 3, None), (128, 8, 2, None), (128, 8, 4, None),
           (64, 4, 4, None)),
    "sm90": ((128, 8, 5, None), (64, 4, 2, None), (64, 8, 3, None), (256, 8, 2, None), (256, 8, 3, None),
             (128, 8, 3, 128), (128, 8, 4, 128)),
}


def _config(*entry):
    """A triton.Config from an autotune-space entry: (BLOCK_M, warps, stages, maxnreg) of the forward, or
    (BLOCK_M, BLOCK_N, warps, stages, maxnreg) of a backward kernel."""
    if len(entry) == 5:
        kwargs, rest = {"BLOCK_M": entry[0], "BLOCK_N": entry[1]}, entry[2:]
    else:
        kwargs, rest = {"BLOCK_M": entry[0]}, entry[1:]
    warps, stages, maxnreg = rest
    return triton.Config(kwargs, num_warps=warps, num_stages=stages, maxnreg=maxnreg)


def _config_key(c) -> tuple:
    return tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages, c.maxnreg


def _space_configs(table: dict, space: str, interpreted: list):
    """The configs of autotune space `space` ("v1", or "sm90" = v1 plus its additions) of a kernel's `table`; the
    interpreter's one config under TRITON_INTERPRET=1."""
    if INTERPRET:
        return list(interpreted)
    return [_config(*t) for t in table["v1"] + (table["sm90"] if space == "sm90" else ())]


def _fwd_configs(space: str = "v1"):
    return _space_configs(FWD_SPACES, space, [triton.Config({"BLOCK_M": 64}, num_warps=4, num_stages=1)])


def _tune() -> bool:
    """LPFAIL_KERNELS_AUTOTUNE=0 takes the first eligible config instead of timing them (tests: less compiling).
    Done in the prune step, because Triton's autotuner skips pruning when it holds one config."""
    return os.environ.get(TUNE_ENV, "1") != "0"


def _fwd_prune(configs, named_args, **kwargs):
    """Keep the configs whose BLOCK_M is a multiple of the policy's tile BLOCK_N (and at most 128 rows at head dim
    128: a 256-row FP32 accumulator would not fit the registers); FP32 dots (4-byte tiles) get one small config
    that fits shared memory at head dim 128."""
    block_n = kwargs["BLOCK_N"]
    if tl.float32 in (kwargs["MATMUL"], kwargs["PV_DT"]) and not INTERPRET:
        return [triton.Config({"BLOCK_M": max(block_n, 64)}, num_warps=4, num_stages=1)]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] % block_n == 0
            and (c.kwargs["BLOCK_M"] <= 128 or kwargs["HEAD_DIM"] <= 64)]
    keep = keep or [triton.Config({"BLOCK_M": max(block_n, 64)}, num_warps=4, num_stages=2)]
    return keep if _tune() else keep[:1]


def _bench(fn, quantiles):
    """The autotuner's timing: Triton's do_bench with 5 ms of warm-up and 25 ms of repetitions instead of 25 and
    100 (the sm_90 space holds up to 13 configs per kernel and shape, all timed within one device call)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)


@triton.jit
def _attn_fwd_kernel(Q, K, V, O, LSE,
              stride_qz, stride_qh, stride_qm, stride_qd,
              stride_kz, stride_kh, stride_kn, stride_kd,
              stride_vz, stride_vh, stride_vn, stride_vd,
              stride_oz, stride_oh, stride_om, stride_od,
              H, N_CTX, KEY_BLOCK, scale, EPS, BETA, L_CLAMP, SHIFT_LO, SHIFT_HI, SHIFT_SAFE,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, EXP_IN: tl.constexpr,
              PBAR: tl.constexpr, PV_DT: tl.constexpr, PV_OUT: tl.constexpr, ACC: tl.constexpr,
              SUB_FMA: tl.constexpr, FIX: tl.constexpr, CLAMP: tl.constexpr,
              CAUSAL: tl.constexpr, TWO_PASS: tl.constexpr, DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr,
              RAW: tl.constexpr, TMA: tl.constexpr = False, ORDER: tl.constexpr = 0, TIE: tl.constexpr = 0,
              POW2: tl.constexpr = False, L_PBAR: tl.constexpr = False, D_VALID: tl.constexpr = 0):
    """One program: BLOCK_M query rows of one (batch, head). Writes O and L = m + log ℓ (natural units).

    HEAD_DIM is the tile's width along the head dim, a power of two (Triton's tiles are). A head dim that is not
    one (48, 80, 96, 112) comes as D_VALID, with HEAD_DIM the next power of two: columns D_VALID … HEAD_DIM − 1
    of Q, K and V read as 0, so every dot and sum gets zeros there (QKᵀ, ℓ and the first D_VALID columns of P̄V
    are the narrow ones' values), and they are not written. D_VALID = 0: HEAD_DIM is the head dim (the same code
    as without the knob). Pointer loads only (the launcher turns TMA off for such dims).

    RAW (sub mode, α a power of two, which the launcher checks): scores, maxima and the fix's threshold are
    kept in units of α — S/α = round(QKᵀ) — and α is folded into the exponent's constant, saving one multiply
    per score. Rounding commutes with a power-of-two scaling, so every value is the one the natural-unit path
    computes, bit for bit (EPS arrives divided by α).

    Scheduling knobs (`lpfail.kernels.Tuning`; none changes a bit of O or L): TMA reads Q, K, V and writes O through
    tensor descriptors (Hopper's tensor memory accelerator) instead of pointer tiles; ORDER 0 puts the query blocks
    on grid axis 0 (longest first within each (batch, head)), ORDER 1 on axis 1 behind every (batch, head) (longest
    first over the whole grid); TIE picks the fix's tie test (`_block_max`); the autotune space: `FWD_TUNERS`."""
    tl.static_assert(not (TMA and D_VALID), "a head dim narrower than the tile (D_VALID) is read without TMA")
    if RAW:
        exp_c = scale * LOG2E
    else:
        exp_c = LOG2E
    if ORDER == 1:
        pid_m, off_hz, n_m = tl.program_id(1), tl.program_id(0), tl.num_programs(1)
    else:
        pid_m, off_hz, n_m = tl.program_id(0), tl.program_id(1), tl.num_programs(0)
    if CAUSAL:
        start_m = n_m - 1 - pid_m        # longest rows first: the short ones fill the last wave
    else:
        start_m = pid_m
    Q += _bh_offset(off_hz, H, stride_qz, stride_qh)
    K += _bh_offset(off_hz, H, stride_kz, stride_kh)
    V += _bh_offset(off_hz, H, stride_vz, stride_vh)
    O += _bh_offset(off_hz, H, stride_oz, stride_oh)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    Q_src = _rows_source(Q, stride_qm, stride_qd, N_CTX, tl.arange(0, BLOCK_M), offs_d, BLOCK_M, HEAD_DIM, TMA)
    q = _load_tile(Q_src, start_m * BLOCK_M, offs_m, N_CTX, stride_qm, True, TMA, D_VALID).to(MATMUL)  # (M, D)
    K_src = _rows_source(K, stride_kn, stride_kd, N_CTX, offs_n0, offs_d, BLOCK_N, HEAD_DIM, TMA)
    V_src = _rows_source(V, stride_vn, stride_vd, N_CTX, offs_n0, offs_d, BLOCK_N, HEAD_DIM, TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        hi = _imin((start_m + 1) * BLOCK_M, N_CTX)
    else:
        hi = N_CTX
    if TWO_PASS:
        acc, l_i, m_i = _fwd_policy_blocks(acc, l_i, m_i, q, K_src, V_src, stride_kn, stride_vn, offs_m,
                                           offs_n0, hi, N_CTX, KEY_BLOCK, scale, exp_c, EPS, BETA, L_CLAMP,
                                           SHIFT_LO, SHIFT_HI, SHIFT_SAFE, BLOCK_M, BLOCK_N, HEAD_DIM, MATMUL,
                                           QK_OUT, SCORES, EXP_IN, PBAR, PV_DT, PV_OUT, ACC, SUB_FMA, FIX, CLAMP,
                                           CAUSAL, DOT_PREC, PV_PREC, RAW, TMA, L_PBAR, D_VALID)
    else:
        # tiles strictly below the diagonal (and inside the sequence) need no mask; the diagonal ones do
        if CAUSAL:
            lo_mask = start_m * BLOCK_M
        else:
            lo_mask = (N_CTX // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K_src, V_src, stride_kn, stride_vn, offs_m, offs_n0,
                                   0, lo_mask, N_CTX, scale, exp_c, EPS, BETA, L_CLAMP, SHIFT_LO, SHIFT_HI,
                                   SHIFT_SAFE, BLOCK_N, MATMUL, QK_OUT, SCORES, EXP_IN, PBAR, PV_DT, PV_OUT, ACC,
                                   SUB_FMA, FIX, CLAMP, False, CAUSAL, DOT_PREC, PV_PREC, RAW, TMA, TIE, POW2,
                                   L_PBAR, D_VALID)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K_src, V_src, stride_kn, stride_vn, offs_m, offs_n0,
                                   lo_mask, hi, N_CTX, scale, exp_c, EPS, BETA, L_CLAMP, SHIFT_LO, SHIFT_HI,
                                   SHIFT_SAFE, BLOCK_N, MATMUL, QK_OUT, SCORES, EXP_IN, PBAR, PV_DT, PV_OUT, ACC,
                                   SUB_FMA, FIX, CLAMP, True, CAUSAL, DOT_PREC, PV_PREC, RAW, TMA, TIE, POW2,
                                   L_PBAR, D_VALID)
    _write_out(O, LSE, acc, l_i, m_i, off_hz, start_m, offs_m, offs_d, N_CTX, stride_om, stride_od, scale,
               BLOCK_M, HEAD_DIM, RAW, TMA, D_VALID)


@triton.jit
def _write_out(O, LSE, acc, l_i, m_i, off_hz, start_m, offs_m, offs_d, N_CTX, stride_om, stride_od, scale,
               BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, RAW: tl.constexpr, TMA: tl.constexpr,
               D_VALID: tl.constexpr = 0):
    """O = Ō / ℓ, rounded once to the stored dtype (through a TMA descriptor or pointers), and L = log ℓ + m;
    with D_VALID, O's columns below it only."""
    o = acc / l_i[:, None]
    if RAW:
        m_i = m_i * scale                                    # back to natural units (exact)
    lse = tl.log(l_i) + m_i                                  # L = log ℓ + m
    tl.store(LSE + off_hz.to(tl.int64) * N_CTX + offs_m, lse, mask=offs_m < N_CTX)
    o = _round(o, O.dtype.element_ty).to(O.dtype.element_ty)
    if TMA:
        tl.make_tensor_descriptor(O, shape=[N_CTX, HEAD_DIM], strides=[stride_om, 1],
                                  block_shape=[BLOCK_M, HEAD_DIM]).store([start_m * BLOCK_M, 0], o)
    else:
        tl.store(O + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, o,
                 mask=_rows_mask(offs_m[:, None] < N_CTX, offs_d, D_VALID))


#: Every constexpr that changes the code is in the key: Triton's autotuner keys on the listed arguments and the
#: tensors' dtypes only, so a variant left out would reuse another variant's tuned (and pruned) config.
FWD_KEY = ["N_CTX", "HEAD_DIM", "D_VALID", "CAUSAL", "TWO_PASS", "BLOCK_N", "MATMUL", "PV_DT", "ACC", "PV_OUT",
           "SUB_FMA", "FIX", "CLAMP", "RAW", "TMA", "ORDER", "TIE", "POW2", "L_PBAR"]
#: One autotuner per autotune space (`lpfail.kernels.Tuning.space`) around the same JIT function, so that the configs
#: the spaces share compile once.
FWD_TUNERS = {space: triton.autotune(configs=_fwd_configs(space), key=FWD_KEY, do_bench=_bench,
                                     prune_configs_by={"early_config_prune": _fwd_prune})(_attn_fwd_kernel)
              for space in FWD_SPACES}
_attn_fwd = FWD_TUNERS["v1"]


# -- a probe: P̄ of one tile, by the same device functions --------------------------------------------------------
@triton.jit
def _probe_pbar(Q, K, P, stride_qm, stride_kn, stride_pm, M, N, scale, EPS, BETA, SHIFT_LO, SHIFT_HI, SHIFT_SAFE,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, EXP_IN: tl.constexpr,
                PBAR: tl.constexpr, ACC: tl.constexpr, SUB_FMA: tl.constexpr, FIX: tl.constexpr,
                DOT_PREC: tl.constexpr, TIE: tl.constexpr = 0, POW2: tl.constexpr = False,
                D_VALID: tl.constexpr = 0):
    """P̄ (as rounded before the P̄V dot) of the first key block of a row, computed exactly as `_fwd_tiles`
    computes it: used by the tests and chapter 6 to see whether tied maxima give P̄ = 1 on this hardware."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=_rows_mask(offs_m[:, None] < M, offs_d,
                D_VALID), other=0.0)
    k = _load_rows(K + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, N, True, D_VALID)
    qk = _scores(q.to(MATMUL), k, offs_m, offs_n, N, scale, MATMUL, QK_OUT, SCORES, SUB_FMA, True, False, DOT_PREC,
                 False)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m_blk = _block_max(qk, scale, EPS, BETA, SHIFT_LO, SHIFT_HI, SHIFT_SAFE, SCORES, SUB_FMA, FIX, ACC, TIE, POW2)
    m_new = _round(tl.maximum(m_i, m_blk), ACC)
    pbar = _round(_probs(qk, m_new, scale, LOG2E, EXP_IN, SUB_FMA), PBAR)
    tl.store(P + offs_m[:, None] * stride_pm + offs_n[None, :], pbar,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
