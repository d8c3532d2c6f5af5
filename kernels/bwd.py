"""Triton flash attention, backward pass (FlashAttention-2, Algorithm 2) with the policy's δ source.

Explained in chapter 5 ("Fix"); the launcher is in `kernels/launcher.py`, the `autograd.Function` in
`kernels/autograd.py`.
Order as in Triton's fused-attention tutorial: helpers → δ preprocess → the dK/dV loop → the dQ loop.

P is recomputed from the stored log-sum-exp L = m + log ℓ (so the forward's fix needs nothing here), in FP32,
by the same `SUB_FMA` rule as the forward. δ (DELTA) comes from one of three sources, the policy's `delta`:

* ``"dO.O"``    δ = rowsum(dO ∘ O) with O as the forward stored it (BF16 in the paper's code) — `_bwd_delta_dot`;
* ``"dO.O_hp"`` the same with O recomputed by the forward in FP32 (the launcher does that) — `_bwd_delta_dot`;
* ``"dP.P"``    δ = rowsum(dP ∘ P), dP = dO Vᵀ, equal in exact arithmetic — `_bwd_delta_dpp` (a pass over K, V).

Two kernels then make the gradients without atomics: `_bwd_dkdv` (one program per key block, walking the
query blocks) and `_bwd_dq` (one program per query block, walking the key blocks); or one fused kernel doing both
(`_bwd_fused_kernel`); or, at the end of this file, the five-matmul backward (`_bwd_dq_atomic_kernel`, dQ added with
atomics, `launch_dq_atomic`). Operands of every dot are
rounded to MATMUL, the dots accumulate in FP32.

The gradient accumulators follow the policy's tiles, not the hardware's. With a 16-bit `grad_acc` (GACC) the
reference adds one rounded product per *policy* tile: dK_j and dV_j get one per query tile of `block_q` rows
(QUERY_BLOCK), dQ one per key tile of `block_k` keys (KEY_BLOCK), tiles aligned at multiples of the block.
The kernels walk BLOCK_M queries / BLOCK_N keys at a time, so they chain the dots of one policy tile in an
FP32 partial (the dot's own accumulator, like the forward's two-pass path) and round it to GACC, and add it,
only where the policy tile or the walk ends (`_flush_tile`); the accumulators themselves are held in GACC.
A policy tile must therefore be a whole number of hardware tiles: every reduction tile (BLOCK_M of
`_bwd_dkdv`, BLOCK_N of `_bwd_dq`) divides GRAD_TILE, and `kernel_policy` asks for policy blocks that are
multiples of it. With an FP32 `grad_acc` the tiling does not matter (nothing is rounded between tiles) and
each hardware tile's product is added straight to the accumulator, as before (the same instructions).
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl

from .fwd import (INTERPRET, LOG2E, TUNE_ENV, _bench, _bh_offset, _config, _imin, _load_rows, _load_tile, _round,
                  _rows_mask, _rows_source, _space_configs, _tune)

#: Every reduction tile of the backward (BLOCK_M of the dK/dV kernel, BLOCK_N of the dQ kernel, in every
#: config, interpreter and FP32 fallbacks included) divides this: a policy tile that is a multiple of it is a
#: whole number of hardware tiles whatever the autotuner picks (asserted where the configs are defined).
GRAD_TILE = 64


# -- device helpers --------------------------------------------------------------------------------------
@triton.jit
def _exp(x, FTZ: tl.constexpr):
    """exp(x) in FP32. FTZ (`lpfail.kernels.Tuning.ftz_exp`): exp2(x·log2 e) through ex2.approx.ftz, one MUFU.EX2
    and the multiply, as the forward's exp; else `tl.exp`, whose ex2.approx without .ftz adds a range test and two
    predicated multiplies per score (to return subnormal results). The two differ only where exp(x) < 2^−126,
    which FTZ returns as 0 (such a P adds less than 2^−126 of dO or dS to a gradient)."""
    if FTZ:
        return tl.math.exp2(x * LOG2E)
    else:
        return tl.exp(x)


@triton.jit
def _recompute_p(qk, lse_row, scale, QK_OUT: tl.constexpr, SCORES: tl.constexpr, SUB_FMA: tl.constexpr,
                 RAW: tl.constexpr, FTZ: tl.constexpr):
    """P = exp(S − L) in FP32 from a raw QKᵀ tile (S rounded as in the forward, or one FMA);
    `lse_row` broadcasts along the key axis of the tile. RAW (sub mode, α a power of two): S = α·round(QKᵀ)
    is exact, so one FMA gives fl(S − L) bit for bit — one multiply fewer per score."""
    if SUB_FMA:
        # as the forward's FMA mode: base 2 with log2(e) folded in, one FFMA and one ex2 per score
        return tl.math.exp2(tl.fma(qk, scale * LOG2E, -(lse_row * LOG2E)))
    elif RAW:
        return _exp(tl.fma(_round(_round(qk, QK_OUT), SCORES), scale, -lse_row), FTZ)
    else:
        return _exp(_round(_round(qk, QK_OUT) * scale, SCORES) - lse_row, FTZ)


@triton.jit
def _add_rounded(acc, part, GACC: tl.constexpr):
    """acc + part with both rounded to GACC (the policy's grad_acc) — plain FP32 addition when GACC is FP32."""
    return _round(acc + _round(part, GACC), GACC)


@triton.jit
def _flush_tile(acc, part, end, GRAD_BLOCK, last, GACC: tl.constexpr):
    """Close a policy tile (16-bit GACC only). `part` is the FP32 product of the policy tile so far and `end`
    the end of the hardware tile just added into it: at a policy-tile boundary (a multiple of GRAD_BLOCK) or
    at the end of the walk (`end` ≥ `last`), add `part` rounded to GACC into `acc`, rounding once per policy
    tile as the reference does, and start the next tile's product at 0."""
    if (end % GRAD_BLOCK == 0) | (end >= last):
        acc = _add_rounded(acc.to(tl.float32), part, GACC).to(GACC)
        part = tl.zeros_like(part)
    return acc, part


# -- δ preprocess -------------------------------------------------------------------------------------------
@triton.jit
def _bwd_delta_dot(O, DO, DELTA, DQ,
                   stride_oz, stride_oh, stride_om, stride_od,
                   stride_dz, stride_dh, stride_dm, stride_dd,
                   H, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PROD: tl.constexpr,
                   ZERO_DQ: tl.constexpr = False, D_VALID: tl.constexpr = 0):
    """δ = rowsum(dO ∘ O): each product rounded to PROD (the policy's delta_prod, widened), summed in FP32.
    ZERO_DQ (the atomic backward): also zero these rows of the FP32 dQ accumulator DQ (contiguous, O's shape),
    which saves the launch of a separate memset. D_VALID: a head dim narrower than the tile HEAD_DIM
    (`lpfail.kernels.fwd._attn_fwd_kernel`)."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    O += _bh_offset(off_hz, H, stride_oz, stride_oh)
    DO += _bh_offset(off_hz, H, stride_dz, stride_dh)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o = _load_rows(O + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, offs_m, N_CTX, True, D_VALID)
    do = _load_rows(DO + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, offs_m, N_CTX, True, D_VALID)
    delta = tl.sum(_round(o.to(tl.float32) * do.to(tl.float32), PROD), 1)
    tl.store(DELTA + off_hz.to(tl.int64) * N_CTX + offs_m, delta, mask=offs_m < N_CTX)
    if ZERO_DQ and D_VALID:   # rows of D_VALID values
        DQ += off_hz.to(tl.int64) * N_CTX * D_VALID
        tl.store(DQ + offs_m[:, None] * D_VALID + offs_d[None, :], tl.zeros([BLOCK_M, HEAD_DIM], tl.float32),
                 mask=_rows_mask(offs_m[:, None] < N_CTX, offs_d, D_VALID))
    elif ZERO_DQ:
        DQ += off_hz.to(tl.int64) * N_CTX * HEAD_DIM
        tl.store(DQ + offs_m[:, None] * HEAD_DIM + offs_d[None, :], tl.zeros([BLOCK_M, HEAD_DIM], tl.float32),
                 mask=offs_m[:, None] < N_CTX)


# -- the query-side loop: dQ, or δ = rowsum(dP ∘ P), or δ = rowsum(dO ∘ O_hp) -------------------------------------
@triton.jit
def _q_side_tiles(dq, dq_part, aux, q, do, lse, delta, K_src, V_src, stride_kn, stride_vn, offs_m, offs_n0,
                  lo, hi, last, N_CTX, KEY_BLOCK, scale,
                  BLOCK_N: tl.constexpr, MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr,
                  DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr, GACC: tl.constexpr,
                  SUB_FMA: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, MODE: tl.constexpr,
                  DOT_PREC: tl.constexpr, DS_PREC: tl.constexpr, RAW: tl.constexpr, TMA: tl.constexpr,
                  FTZ: tl.constexpr, D_VALID: tl.constexpr = 0):
    """Walk the key tiles lo:hi for one query block. dQ (MODE 0) with a 16-bit GACC: `dq_part` holds the FP32
    product of the current policy key block (KEY_BLOCK keys) across tiles and across the two calls (unmasked,
    then masked range); `last` is where the whole walk ends."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = _load_tile(K_src, start_n, offs_n, N_CTX, stride_kn, MASK, TMA, D_VALID)      # (BLOCK_N, D)
        v = _load_tile(V_src, start_n, offs_n, N_CTX, stride_vn, MASK, TMA, D_VALID)
        qk = tl.dot(q, tl.trans(k.to(MATMUL)), input_precision=DOT_PREC)               # (BLOCK_M, BLOCK_N)
        p = _recompute_p(qk, lse[:, None], scale, QK_OUT, SCORES, SUB_FMA, RAW, FTZ)
        if MASK:
            valid = offs_n[None, :] < N_CTX
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(valid, p, 0.0)
        if MODE == 2:
            aux = tl.dot(p, v.to(tl.float32), aux, input_precision="ieee")              # O_hp = Σ P V in FP32
        else:
            dp = _round(tl.dot(do, tl.trans(v.to(MATMUL)), input_precision=DOT_PREC), DP)  # dP = dO Vᵀ
            if MODE == 1:
                aux += tl.sum(dp * p, 1)
            else:
                ds = _round((p * scale) * (dp - delta[:, None]), DS)                  # dS = (P·α)(dP − δ)
                if GACC == tl.float32:
                    part = tl.dot(ds.to(DS_DT), k.to(DS_DT), input_precision=DS_PREC)
                    dq += part
                else:
                    dq_part = tl.dot(ds.to(DS_DT), k.to(DS_DT), dq_part, input_precision=DS_PREC)
                    dq, dq_part = _flush_tile(dq, dq_part, start_n + BLOCK_N, KEY_BLOCK, last, GACC)
    return dq, dq_part, aux


#: Autotune spaces of the two backward kernels (`lpfail.kernels.Tuning.space`),
#: (BLOCK_M, BLOCK_N, warps, stages, maxnreg):
#: "v1" is the first space (first entry: what LPFAIL_KERNELS_AUTOTUNE=0 runs); "sm90" adds deeper
#: pipelines and 8-warp tiles. Every reduction tile (dK/dV's BLOCK_M, dQ's BLOCK_N) divides GRAD_TILE.
DQ_SPACES = {"v1": ((128, 64, 8, 2, None), (128, 32, 4, 3, None), (64, 64, 4, 3, None)),
             "sm90": ((128, 64, 8, 3, None), (64, 64, 4, 2, None), (128, 32, 8, 2, None), (64, 32, 4, 3, None))}
DKDV_SPACES = {"v1": ((64, 128, 8, 2, None), (32, 128, 4, 3, None), (64, 64, 4, 3, None)),
               "sm90": ((64, 128, 8, 3, None), (64, 128, 4, 2, None), (32, 128, 8, 2, None),
                        (64, 64, 4, 2, None), (64, 128, 8, 2, 128))}


def _q_side_configs(space: str = "v1"):
    return _space_configs(DQ_SPACES, space, [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4,
                                                           num_stages=1)])


def _fp32_prune(small):
    """FP32 dots (4-byte tiles): one small config that fits shared memory at head dim 128."""
    def prune(configs, named_args, **kwargs):
        if INTERPRET or tl.float32 not in (kwargs["MATMUL"], kwargs["DS_DT"], kwargs.get("PV_DT")):
            return configs if _tune() else configs[:1]
        return [small]
    return prune


def _assert_tiles_divide_grad_tile(configs, axis: str, what: str):
    """Every config's reduction tile `axis` divides GRAD_TILE, so policy blocks are whole hardware tiles."""
    assert all(GRAD_TILE % c.kwargs[axis] == 0 for c in configs), \
        f"a {what} tile ({axis}) does not divide GRAD_TILE: policy blocks would not be whole tiles"


_DQ_SMALL = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)
_assert_tiles_divide_grad_tile((*_q_side_configs("sm90"), _DQ_SMALL), "BLOCK_N", "dQ key")


@triton.jit
def _grid_pos(ORDER: tl.constexpr):
    """(block index along the sequence, (batch, head) index, number of blocks) of this program: ORDER 0 puts the
    blocks on grid axis 0 (within each (batch, head)), ORDER 1 on axis 1 behind every (batch, head)."""
    if ORDER == 1:
        return tl.program_id(1), tl.program_id(0), tl.num_programs(1)
    else:
        return tl.program_id(0), tl.program_id(1), tl.num_programs(0)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
            stride_qz, stride_qh, stride_qm, stride_qd,
            stride_kz, stride_kh, stride_kn, stride_kd,
            stride_vz, stride_vh, stride_vn, stride_vd,
            stride_dz, stride_dh, stride_dm, stride_dd,
            H, N_CTX, KEY_BLOCK, scale,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, DP: tl.constexpr,
            DS: tl.constexpr, DS_DT: tl.constexpr, GACC: tl.constexpr, SUB_FMA: tl.constexpr,
            CAUSAL: tl.constexpr, MODE: tl.constexpr, DOT_PREC: tl.constexpr, DS_PREC: tl.constexpr,
            RAW: tl.constexpr, TMA: tl.constexpr = False, ORDER: tl.constexpr = 0, FTZ: tl.constexpr = False,
            D_VALID: tl.constexpr = 0):
    """MODE 0: dQ = Σ_j dS K with dS = (P·α) ∘ (dP − δ).  MODE 1: δ = rowsum(dP ∘ P) into DELTA.
    MODE 2: δ = rowsum(dO ∘ O_hp), O_hp = Σ_j P V recomputed in FP32 from L, into DELTA.
    DQ shares Q's strides (stride_q*); DO has its own (stride_d*). KEY_BLOCK: the policy's key block for dQ's
    GACC roundings (a multiple of BLOCK_N, at least N_CTX for one block over the row; unused for FP32 GACC).
    Causal with ORDER 1: the longest query blocks (the last) first over the whole grid. D_VALID: a head dim narrower
    than the tile HEAD_DIM (`lpfail.kernels.fwd._attn_fwd_kernel`; no TMA then)."""
    tl.static_assert(not (TMA and D_VALID), "a head dim narrower than the tile (D_VALID) is read without TMA")
    pid, off_hz, n_blocks = _grid_pos(ORDER)
    if CAUSAL and ORDER == 1:
        start_m = n_blocks - 1 - pid
    else:
        start_m = pid
    _dq_program(Q, K, V, DO, LSE, DELTA, DQ, stride_qz, stride_qh, stride_qm, stride_qd,
                stride_kz, stride_kh, stride_kn, stride_kd, stride_vz, stride_vh, stride_vn, stride_vd,
                stride_dz, stride_dh, stride_dm, stride_dd, H, N_CTX, KEY_BLOCK, scale, start_m, off_hz,
                HEAD_DIM, BLOCK_M, BLOCK_N, MATMUL, QK_OUT, SCORES, DP, DS, DS_DT, GACC, SUB_FMA, CAUSAL, MODE,
                DOT_PREC, DS_PREC, RAW, TMA, FTZ, D_VALID)


@triton.jit
def _dq_program(Q, K, V, DO, LSE, DELTA, DQ,
                stride_qz, stride_qh, stride_qm, stride_qd,
                stride_kz, stride_kh, stride_kn, stride_kd,
                stride_vz, stride_vh, stride_vn, stride_vd,
                stride_dz, stride_dh, stride_dm, stride_dd,
                H, N_CTX, KEY_BLOCK, scale, start_m, off_hz,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, DP: tl.constexpr,
                DS: tl.constexpr, DS_DT: tl.constexpr, GACC: tl.constexpr, SUB_FMA: tl.constexpr,
                CAUSAL: tl.constexpr, MODE: tl.constexpr, DOT_PREC: tl.constexpr, DS_PREC: tl.constexpr,
                RAW: tl.constexpr, TMA: tl.constexpr, FTZ: tl.constexpr, D_VALID: tl.constexpr = 0):
    """The query-side work of query block `start_m` of (batch, head) `off_hz` (see `_bwd_dq_kernel`); also the
    second half of each program of the fused backward (`_bwd_fused_kernel`)."""
    q_base = _bh_offset(off_hz, H, stride_qz, stride_qh)
    K += _bh_offset(off_hz, H, stride_kz, stride_kh)
    V += _bh_offset(off_hz, H, stride_vz, stride_vh)
    DO += _bh_offset(off_hz, H, stride_dz, stride_dh)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < N_CTX
    q = _load_rows(Q + q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, offs_m, N_CTX,
                   True, D_VALID).to(MATMUL)
    do_in = _load_rows(DO + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, offs_m, N_CTX, True,
                       D_VALID)
    do = do_in.to(MATMUL)
    lse = tl.load(LSE + off_hz.to(tl.int64) * N_CTX + offs_m, mask=offs_m < N_CTX, other=float("inf"))
    if MODE == 0:
        delta = tl.load(DELTA + off_hz.to(tl.int64) * N_CTX + offs_m, mask=offs_m < N_CTX, other=0.0)
    else:
        delta = tl.zeros([BLOCK_M], tl.float32)
    K_src = _rows_source(K, stride_kn, stride_kd, N_CTX, offs_n0, offs_d, BLOCK_N, HEAD_DIM, TMA)
    V_src = _rows_source(V, stride_vn, stride_vd, N_CTX, offs_n0, offs_d, BLOCK_N, HEAD_DIM, TMA)

    dq = tl.zeros([BLOCK_M, HEAD_DIM], GACC)             # 16-bit GACC: holds only GACC values, in half the registers
    dq_part = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # FP32 GACC: never touched, so compiled away
    if MODE == 2:
        aux = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    else:
        aux = tl.zeros([BLOCK_M], tl.float32)
    if CAUSAL:
        lo_mask = start_m * BLOCK_M
        hi = _imin((start_m + 1) * BLOCK_M, N_CTX)
    else:
        lo_mask = (N_CTX // BLOCK_N) * BLOCK_N
        hi = N_CTX
    dq, dq_part, aux = _q_side_tiles(dq, dq_part, aux, q, do, lse, delta, K_src, V_src, stride_kn, stride_vn,
                                     offs_m, offs_n0, 0, lo_mask, hi, N_CTX, KEY_BLOCK, scale, BLOCK_N, MATMUL,
                                     QK_OUT, SCORES, DP, DS, DS_DT, GACC, SUB_FMA, False, CAUSAL, MODE,
                                     DOT_PREC, DS_PREC, RAW, TMA, FTZ, D_VALID)
    dq, dq_part, aux = _q_side_tiles(dq, dq_part, aux, q, do, lse, delta, K_src, V_src, stride_kn, stride_vn,
                                     offs_m, offs_n0, lo_mask, hi, hi, N_CTX, KEY_BLOCK, scale, BLOCK_N, MATMUL,
                                     QK_OUT, SCORES, DP, DS, DS_DT, GACC, SUB_FMA, True, CAUSAL, MODE,
                                     DOT_PREC, DS_PREC, RAW, TMA, FTZ, D_VALID)
    if MODE == 0:
        tl.store(DQ + q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                 _round(dq.to(tl.float32), DQ.dtype.element_ty).to(DQ.dtype.element_ty),
                 mask=_rows_mask(row_ok, offs_d, D_VALID))
    else:
        if MODE == 2:
            aux = tl.sum(do_in.to(tl.float32) * aux, 1)
        tl.store(DELTA + off_hz.to(tl.int64) * N_CTX + offs_m, aux, mask=offs_m < N_CTX)


#: code-changing constexprs are in the keys (Triton keys on listed args and tensor dtypes only; see kernels/fwd.py);
#: one autotuner per autotune space around the same JIT function (`lpfail.kernels.Tuning.space`)
DQ_KEY = ["N_CTX", "HEAD_DIM", "D_VALID", "CAUSAL", "MODE", "MATMUL", "DS_DT", "GACC", "SUB_FMA", "RAW", "TMA",
          "ORDER", "FTZ"]
DQ_TUNERS = {space: triton.autotune(configs=_q_side_configs(space), key=DQ_KEY, do_bench=_bench,
                                    prune_configs_by={"early_config_prune": _fp32_prune(_DQ_SMALL)})(_bwd_dq_kernel)
             for space in DQ_SPACES}
_bwd_dq = DQ_TUNERS["v1"]


# -- the key-side loop: dK and dV (and, in the atomic backward, dQ) ---------------------------------------------------
@triton.jit
def _kv_side_tiles(dk, dv, dk_part, dv_part, k, v, Q_src, DO_src, LSE, DELTA, DQ_ptrs, stride_qm, stride_dm,
                   offs_n, offs_m0, lo, hi, N_CTX, QUERY_BLOCK, scale,
                   BLOCK_M: tl.constexpr, MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr,
                   PBAR: tl.constexpr, PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr,
                   DS_DT: tl.constexpr, GACC: tl.constexpr, SUB_FMA: tl.constexpr, MASK: tl.constexpr,
                   DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr, DS_PREC: tl.constexpr, RAW: tl.constexpr,
                   TMA: tl.constexpr, FTZ: tl.constexpr, DQ_ATOMIC: tl.constexpr, D_VALID: tl.constexpr = 0):
    """Walk query blocks for one key block; tiles are held transposed (keys × queries) so that Pᵀ and dSᵀ
    feed the dV and dK dots directly. Query rows past the sequence load L = +inf, so their P is 0.
    With a 16-bit GACC, `dk_part` and `dv_part` hold the FP32 products of the current policy query tile
    (QUERY_BLOCK rows) across tiles and across the two calls; the walk always ends at N_CTX.
    DQ_ATOMIC (FP32 GACC only): also dQ_i += dS_ij K_j, added atomically into the FP32 accumulator at DQ_ptrs
    (FlashAttention-2's backward: 5 matmuls per tile pair instead of the split backward's 7; the order of the
    additions, and so dQ's last FP32 bits, then varies from run to run)."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        row_ok = offs_m < N_CTX
        q = _load_tile(Q_src, start_m, offs_m, N_CTX, stride_qm, True, TMA, D_VALID)            # (M, D)
        do = _load_tile(DO_src, start_m, offs_m, N_CTX, stride_dm, True, TMA, D_VALID).to(MATMUL)
        lse = tl.load(LSE + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
        kq = tl.dot(k, tl.trans(q.to(MATMUL)), input_precision=DOT_PREC)               # Sᵀ: (N, M)
        pT = _recompute_p(kq, lse[None, :], scale, QK_OUT, SCORES, SUB_FMA, RAW, FTZ)
        if MASK:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        pbarT = _round(pT, PBAR).to(PV_DT)
        if GACC == tl.float32:
            part = tl.dot(pbarT, do.to(PV_DT), input_precision=PV_PREC)                       # Pᵀ dO
        else:
            dv_part = tl.dot(pbarT, do.to(PV_DT), dv_part, input_precision=PV_PREC)
        dpT = _round(tl.dot(v, tl.trans(do), input_precision=DOT_PREC), DP)                  # dPᵀ = V dOᵀ
        dsT = _round((pT * scale) * (dpT - delta[None, :]), DS)
        if GACC == tl.float32:
            part_k = tl.dot(dsT.to(DS_DT), q.to(DS_DT), input_precision=DS_PREC)             # dSᵀ Q
            dv += part
            dk += part_k
            if DQ_ATOMIC:
                dq_part = tl.dot(tl.trans(dsT.to(DS_DT)), k.to(DS_DT), input_precision=DS_PREC)  # dS K: (M, D)
                tl.atomic_add(DQ_ptrs + start_m * stride_qm, dq_part, sem="relaxed",
                              mask=_rows_mask(row_ok[:, None], tl.arange(0, DQ_ptrs.shape[1]), D_VALID))
        else:
            dk_part = tl.dot(dsT.to(DS_DT), q.to(DS_DT), dk_part, input_precision=DS_PREC)
            dv, dv_part = _flush_tile(dv, dv_part, start_m + BLOCK_M, QUERY_BLOCK, N_CTX, GACC)
            dk, dk_part = _flush_tile(dk, dk_part, start_m + BLOCK_M, QUERY_BLOCK, N_CTX, GACC)
    return dk, dv, dk_part, dv_part


def _kv_side_configs(space: str = "v1"):
    return _space_configs(DKDV_SPACES, space, [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4,
                                                             num_stages=1)])


_DKDV_SMALL = triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=1)
_assert_tiles_divide_grad_tile((*_kv_side_configs("sm90"), _DKDV_SMALL), "BLOCK_M", "dK/dV query")


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                     stride_qz, stride_qh, stride_qm, stride_qd,
                     stride_kz, stride_kh, stride_kn, stride_kd,
                     stride_vz, stride_vh, stride_vn, stride_vd,
                     stride_dz, stride_dh, stride_dm, stride_dd,
                     H, N_CTX, QUERY_BLOCK, scale,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, PBAR: tl.constexpr,
                     PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr,
                     GACC: tl.constexpr, SUB_FMA: tl.constexpr, CAUSAL: tl.constexpr,
                     DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr, DS_PREC: tl.constexpr, RAW: tl.constexpr,
                     TMA: tl.constexpr = False, ORDER: tl.constexpr = 0, FTZ: tl.constexpr = False,
                     DQ_ATOMIC: tl.constexpr = False, D_VALID: tl.constexpr = 0):
    """dV = Σ_i Pᵀ dO and dK = Σ_i dSᵀ Q for one key block. DK shares K's strides, DV V's. QUERY_BLOCK: the
    policy's query block for the GACC roundings (a multiple of BLOCK_M, at least N_CTX for one block over the
    sequence; unused for FP32 GACC). DQ_ATOMIC: dQ too, atomically into DQ (FP32, Q's strides; zeroed before).
    In causal attention key block 0 has the most work: ORDER 1 runs every (batch, head)'s first blocks first.
    D_VALID: a head dim narrower than the tile HEAD_DIM (`lpfail.kernels.fwd._attn_fwd_kernel`; no TMA then)."""
    tl.static_assert(not (TMA and D_VALID), "a head dim narrower than the tile (D_VALID) is read without TMA")
    start_n, off_hz, n_blocks = _grid_pos(ORDER)
    _dkdv_program(Q, K, V, DO, LSE, DELTA, DK, DV, DQ, stride_qz, stride_qh, stride_qm, stride_qd,
                  stride_kz, stride_kh, stride_kn, stride_kd, stride_vz, stride_vh, stride_vn, stride_vd,
                  stride_dz, stride_dh, stride_dm, stride_dd, H, N_CTX, QUERY_BLOCK, scale, start_n, off_hz,
                  HEAD_DIM, BLOCK_M, BLOCK_N, MATMUL, QK_OUT, SCORES, PBAR, PV_DT, DP, DS, DS_DT, GACC, SUB_FMA,
                  CAUSAL, DOT_PREC, PV_PREC, DS_PREC, RAW, TMA, FTZ, DQ_ATOMIC, D_VALID)


@triton.jit
def _dkdv_program(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                  stride_qz, stride_qh, stride_qm, stride_qd,
                  stride_kz, stride_kh, stride_kn, stride_kd,
                  stride_vz, stride_vh, stride_vn, stride_vd,
                  stride_dz, stride_dh, stride_dm, stride_dd,
                  H, N_CTX, QUERY_BLOCK, scale, start_n, off_hz,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, PBAR: tl.constexpr,
                  PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr,
                  GACC: tl.constexpr, SUB_FMA: tl.constexpr, CAUSAL: tl.constexpr,
                  DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr, DS_PREC: tl.constexpr, RAW: tl.constexpr,
                  TMA: tl.constexpr, FTZ: tl.constexpr, DQ_ATOMIC: tl.constexpr, D_VALID: tl.constexpr = 0):
    """The key-side work of key block `start_n` of (batch, head) `off_hz` (see `_bwd_dkdv_kernel`); also the first
    half of each program of the fused backward (`_bwd_fused_kernel`)."""
    Q += _bh_offset(off_hz, H, stride_qz, stride_qh)
    DO += _bh_offset(off_hz, H, stride_dz, stride_dh)
    DQ += _bh_offset(off_hz, H, stride_qz, stride_qh)
    k_base = _bh_offset(off_hz, H, stride_kz, stride_kh)
    v_base = _bh_offset(off_hz, H, stride_vz, stride_vh)
    LSE += off_hz.to(tl.int64) * N_CTX
    DELTA += off_hz.to(tl.int64) * N_CTX

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n[:, None] < N_CTX
    k = _load_rows(K + k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, offs_n, N_CTX,
                   True, D_VALID).to(MATMUL)                                           # (BLOCK_N, D)
    v = _load_rows(V + v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, offs_n, N_CTX,
                   True, D_VALID).to(MATMUL)
    Q_src = _rows_source(Q, stride_qm, stride_qd, N_CTX, offs_m0, offs_d, BLOCK_M, HEAD_DIM, TMA)
    DO_src = _rows_source(DO, stride_dm, stride_dd, N_CTX, offs_m0, offs_d, BLOCK_M, HEAD_DIM, TMA)
    DQ_ptrs = DQ + offs_m0[:, None] * stride_qm + offs_d[None, :] * stride_qd

    dk = tl.zeros([BLOCK_N, HEAD_DIM], GACC)             # 16-bit GACC: holds only GACC values, in half the registers
    dv = tl.zeros([BLOCK_N, HEAD_DIM], GACC)
    dk_part = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)  # FP32 GACC: never touched, so compiled away
    dv_part = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # causal: queries on the diagonal block need the mask; those below it see every key of the block
    lo = start_n * BLOCK_N if CAUSAL else 0
    mid = _imin(lo + BLOCK_N, N_CTX) if CAUSAL else 0
    dk, dv, dk_part, dv_part = _kv_side_tiles(
        dk, dv, dk_part, dv_part, k, v, Q_src, DO_src, LSE, DELTA, DQ_ptrs, stride_qm, stride_dm, offs_n, offs_m0,
        lo, mid, N_CTX, QUERY_BLOCK, scale, BLOCK_M, MATMUL, QK_OUT, SCORES, PBAR, PV_DT, DP, DS, DS_DT,
        GACC, SUB_FMA, True, DOT_PREC, PV_PREC, DS_PREC, RAW, TMA, FTZ, DQ_ATOMIC, D_VALID)
    dk, dv, dk_part, dv_part = _kv_side_tiles(
        dk, dv, dk_part, dv_part, k, v, Q_src, DO_src, LSE, DELTA, DQ_ptrs, stride_qm, stride_dm, offs_n, offs_m0,
        _imin(lo + BLOCK_N, N_CTX) if CAUSAL else 0, N_CTX, N_CTX, QUERY_BLOCK, scale, BLOCK_M, MATMUL, QK_OUT,
        SCORES, PBAR, PV_DT, DP, DS, DS_DT, GACC, SUB_FMA, False, DOT_PREC, PV_PREC, DS_PREC, RAW, TMA, FTZ,
        DQ_ATOMIC, D_VALID)
    tl.store(DK + k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
             _round(dk.to(tl.float32), DK.dtype.element_ty).to(DK.dtype.element_ty),
             mask=_rows_mask(col_ok, offs_d, D_VALID))
    tl.store(DV + v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
             _round(dv.to(tl.float32), DV.dtype.element_ty).to(DV.dtype.element_ty),
             mask=_rows_mask(col_ok, offs_d, D_VALID))


_DKDV_KEY = ["N_CTX", "HEAD_DIM", "D_VALID", "CAUSAL", "MATMUL", "PV_DT", "DS_DT", "GACC", "SUB_FMA", "RAW", "TMA",
             "ORDER", "FTZ", "DQ_ATOMIC"]
_DKDV_PRUNE = {"early_config_prune": _fp32_prune(_DKDV_SMALL)}
#: (space, atomic) → the dK/dV kernel's autotuner (code-changing constexprs in the key, as for the other kernels).
#: The atomic backward's (DQ_ATOMIC) zero the dQ accumulator before every timed launch and before the launch they
#: keep, since each launch adds into it.
DKDV_TUNERS = {(space, atomic): triton.autotune(configs=_kv_side_configs(space), key=_DKDV_KEY, do_bench=_bench,
                                                prune_configs_by=_DKDV_PRUNE,
                                                reset_to_zero=["DQ"] if atomic else None)(_bwd_dkdv_kernel)
               for space in DKDV_SPACES for atomic in (False, True)}
_bwd_dkdv = DKDV_TUNERS[("v1", False)]
_bwd_dkdv_atomic = DKDV_TUNERS[("v1", True)]


# -- the fused backward (`lpfail.kernels.Tuning(bwd="fused")`): dK/dV of key block j, then dQ of query block j ------
@triton.jit
def _bwd_fused_kernel(Q, K, V, DO, LSE, DELTA, DQ, DK, DV,
                      stride_qz, stride_qh, stride_qm, stride_qd,
                      stride_kz, stride_kh, stride_kn, stride_kd,
                      stride_vz, stride_vh, stride_vn, stride_vd,
                      stride_dz, stride_dh, stride_dm, stride_dd,
                      H, N_CTX, QUERY_BLOCK, KEY_BLOCK, scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                      BLOCK_N2: tl.constexpr,
                      MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, PBAR: tl.constexpr,
                      PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr,
                      GACC: tl.constexpr, SUB_FMA: tl.constexpr, CAUSAL: tl.constexpr,
                      DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr, DS_PREC: tl.constexpr, RAW: tl.constexpr,
                      TMA: tl.constexpr = False, FTZ: tl.constexpr = False, D_VALID: tl.constexpr = 0):
    """Both halves of the split backward in one launch, no atomics: program j computes dK_j, dV_j for key block j
    (BLOCK_N1 keys, walking query tiles of BLOCK_M1 rows, as `_bwd_dkdv_kernel`) and then dQ_j for query block j
    (BLOCK_N1 rows, walking key tiles of BLOCK_N2, as `_bwd_dq_kernel` in MODE 0). Causal: key block j meets the
    n − j query blocks at or below the diagonal and query block j the j + 1 key blocks at or left of it, so every
    program does n + 1 blocks' work — no triangular tail, and one launch fewer. Each gradient is computed by exactly
    the code of the split kernels with these tiles, so with the same tiles the bits are the same. D_VALID: a head dim
    narrower than the tile HEAD_DIM (`lpfail.kernels.fwd._attn_fwd_kernel`; no TMA then)."""
    tl.static_assert(not (TMA and D_VALID), "a head dim narrower than the tile (D_VALID) is read without TMA")
    pid = tl.program_id(0)
    off_hz = tl.program_id(1)
    _dkdv_program(Q, K, V, DO, LSE, DELTA, DK, DV, DQ, stride_qz, stride_qh, stride_qm, stride_qd,
                  stride_kz, stride_kh, stride_kn, stride_kd, stride_vz, stride_vh, stride_vn, stride_vd,
                  stride_dz, stride_dh, stride_dm, stride_dd, H, N_CTX, QUERY_BLOCK, scale, pid, off_hz,
                  HEAD_DIM, BLOCK_M1, BLOCK_N1, MATMUL, QK_OUT, SCORES, PBAR, PV_DT, DP, DS, DS_DT, GACC, SUB_FMA,
                  CAUSAL, DOT_PREC, PV_PREC, DS_PREC, RAW, TMA, FTZ, False, D_VALID)
    _dq_program(Q, K, V, DO, LSE, DELTA, DQ, stride_qz, stride_qh, stride_qm, stride_qd,
                stride_kz, stride_kh, stride_kn, stride_kd, stride_vz, stride_vh, stride_vn, stride_vd,
                stride_dz, stride_dh, stride_dm, stride_dd, H, N_CTX, KEY_BLOCK, scale, pid, off_hz,
                HEAD_DIM, BLOCK_N1, BLOCK_N2, MATMUL, QK_OUT, SCORES, DP, DS, DS_DT, GACC, SUB_FMA, CAUSAL, 0,
                DOT_PREC, DS_PREC, RAW, TMA, FTZ, D_VALID)


#: The fused backward's autotune spaces, (BLOCK_M1, BLOCK_N1, BLOCK_N2, warps, stages, maxnreg): BLOCK_N1 is both the
#: key block of the dK/dV half and the query block of the dQ half. "v1" starts with the split kernels' first (and
#: their d 128 picks on the H200: dK/dV 64×128, dQ 128×64, 8 warps, 2 stages), so LPFAIL_KERNELS_AUTOTUNE=0 runs the
#: split's tiles; then d 64's picks (64×64, 4 warps, 3 stages) and the 32-row dK/dV tiles at 8 warps, the only ones
#: that compile without spills at d 128 (sm_90 SASS, tools/sass_count.py's count: 0 and 2 STL/LDL against 64 for
#: the first; all ≤ 253 registers). "sm90" adds deeper pipelines. BLOCK_M1 and BLOCK_N2 divide GRAD_TILE.
FUSED_SPACES = {"v1": ((64, 128, 64, 8, 2, None), (32, 128, 32, 8, 2, None), (64, 64, 64, 4, 3, None),
                       (32, 128, 32, 8, 3, None)),
                "sm90": ((64, 128, 32, 8, 3, None), (32, 128, 32, 4, 5, None), (64, 64, 64, 4, 4, None),
                         (32, 64, 32, 4, 3, None))}
_FUSED_SMALL = triton.Config({"BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_N2": 16}, num_warps=4, num_stages=1)


def _fused_config(m1, n1, n2, warps, stages, maxnreg):
    return triton.Config({"BLOCK_M1": m1, "BLOCK_N1": n1, "BLOCK_N2": n2}, num_warps=warps, num_stages=stages,
                         maxnreg=maxnreg)


def _fused_configs(space: str = "v1"):
    """The interpreter's one config has the split kernels' interpreter tiles (dK/dV 32 × 64, dQ 64 × 32), so that
    CPU tests compare the two backward forms bit for bit; the FP32 fallback (`_FUSED_SMALL`) has theirs too."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_N2": 32}, num_warps=4, num_stages=1)]
    return [_fused_config(*t) for t in FUSED_SPACES["v1"] + (FUSED_SPACES["sm90"] if space == "sm90" else ())]


for _c in (*_fused_configs("sm90"), _FUSED_SMALL):
    assert GRAD_TILE % _c.kwargs["BLOCK_M1"] == 0 and GRAD_TILE % _c.kwargs["BLOCK_N2"] == 0, \
        "a fused backward's reduction tile does not divide GRAD_TILE: policy blocks would not be whole tiles"

_FUSED_KEY = ["N_CTX", "HEAD_DIM", "D_VALID", "CAUSAL", "MATMUL", "PV_DT", "DS_DT", "GACC", "SUB_FMA", "RAW", "TMA",
              "FTZ"]
#: space → the fused backward's autotuner (it writes dQ, dK, dV once each, so repeated timing launches are harmless)
FUSED_TUNERS = {space: triton.autotune(configs=_fused_configs(space), key=_FUSED_KEY, do_bench=_bench,
                                       prune_configs_by={"early_config_prune": _fp32_prune(_FUSED_SMALL)})(
                    _bwd_fused_kernel)
                for space in FUSED_SPACES}


# -- the five-matmul backward (`lpfail.kernels.Tuning(bwd="dq_atomic")`) ----------------------------------------
# FlashAttention-2/3's way of making dQ. The split and fused backwards (above) run seven matmuls per (query tile, key
# tile) pair: the dK/dV walk recomputes S = QKᵀ and dP = dO Vᵀ and makes Pᵀ dO and dSᵀ Q, and the dQ walk recomputes S
# and dP once more for dS K. Here one program per key block walks the query tiles as `_bwd_dkdv_kernel` does and also
# makes dQ_partial = dS K (the fifth matmul) for each query tile, which it adds into a zeroed FP32 dQ accumulator (B,
# H, N, D) with atomics; an epilogue kernel (`dq_epilogue`) then rounds that FP32 dQ to the output dtype.
#
# * The adds: where tensor descriptors are on (``DESC_ATOMIC``: the tuning's ``tma`` in the backward, a power-of-two
#   head dim, 16-byte aligned tensors, a GPU), through the descriptor's ``atomic_add`` (Triton 3.6 lowers it to a TMA
#   reduce-add, ``cp.reduce.async.bulk.tensor``, on sm_90, as FA3 adds dQ); else `tl.atomic_add` on pointers (FA2's
#   way; the interpreter's only way: Triton 3.6's interpreter has no descriptor reduce).
# * What is computed: dK and dV by the code of `_bwd_dkdv_kernel` (the same tiles give the same bits); dQ = Σ_j dS_ij
#   K_j in FP32, the sum the split backward makes for an FP32 ``grad_acc``, in another order: by key tile of this
#   kernel's BLOCK_N and in whatever order the programs' atomics land, so dQ's last FP32 bits (and, after the
#   epilogue's rounding, rarely its last BF16 bit) vary from run to run. dS keeps the softmax scale inside, dS =
#   round_ds((P·α)(dP − δ)), as the other backwards do: deferring α to the epilogue would move the policy's ``ds``
#   rounding (and FP32's), so nothing is deferred and the epilogue only converts.
# * The causal mask: key block j skips the query tiles above the diagonal, masks only the query tiles that cross it
#   and runs the rest unmasked (as `_dkdv_program`).
# * A 16-bit ``grad_acc`` rounds dQ once per policy key block *in key order*, which FP32 atomics cannot reproduce;
#   `dq_atomic_honours` says no and the launcher runs the fused backward instead (deterministic, the policy's
#   arithmetic), as it does under ``torch.use_deterministic_algorithms(True)`` (atomics are not deterministic).

#: Tests only: run the descriptor path (``DESC_ATOMIC``) under the interpreter too, whose builder then needs a
#: descriptor reduce (Triton 3.6's has none; tests/test_kernels_dq_atomic.py adds one for the test).
DESC_ATOMIC_IN_INTERPRETER = False


@triton.jit
def _dqa_tiles(dk, dv, k, k_raw, v, Q_src, DO_src, LSE, DELTA, DQ, DQ_desc, stride_qm, stride_dm, offs_n, offs_m0,
               offs_d, lo, hi, N_CTX, scale,
               BLOCK_M: tl.constexpr, MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr,
               PBAR: tl.constexpr, PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr,
               SUB_FMA: tl.constexpr, MASK: tl.constexpr, DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr,
               DS_PREC: tl.constexpr, RAW: tl.constexpr, TMA: tl.constexpr, FTZ: tl.constexpr,
               DESC_ATOMIC: tl.constexpr, DQ_W: tl.constexpr, D_VALID: tl.constexpr = 0):
    """Query tiles lo:hi of one key block: `_kv_side_tiles`'s FP32-grad_acc arithmetic (Sᵀ, Pᵀ dO, dPᵀ, dSᵀ Q,
    held transposed), plus dQ_partial = dS K added into the FP32 accumulator (rows of DQ_W values at DQ, or through
    DQ_desc). MASK: the tiles crossing the causal diagonal."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        row_ok = offs_m < N_CTX
        q = _load_tile(Q_src, start_m, offs_m, N_CTX, stride_qm, True, TMA, D_VALID)            # (M, D)
        do = _load_tile(DO_src, start_m, offs_m, N_CTX, stride_dm, True, TMA, D_VALID).to(MATMUL)
        lse = tl.load(LSE + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
        kq = tl.dot(k, tl.trans(q.to(MATMUL)), input_precision=DOT_PREC)                        # Sᵀ: (N, M)
        pT = _recompute_p(kq, lse[None, :], scale, QK_OUT, SCORES, SUB_FMA, RAW, FTZ)
        if MASK:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        pbarT = _round(pT, PBAR).to(PV_DT)
        dv += tl.dot(pbarT, do.to(PV_DT), input_precision=PV_PREC)                               # Pᵀ dO
        dpT = _round(tl.dot(v, tl.trans(do), input_precision=DOT_PREC), DP)                     # dPᵀ = V dOᵀ
        dsT = _round((pT * scale) * (dpT - delta[None, :]), DS).to(DS_DT)
        dk += tl.dot(dsT, q.to(DS_DT), input_precision=DS_PREC)                                  # dSᵀ Q
        dq_part = tl.dot(tl.trans(dsT), k_raw.to(DS_DT), input_precision=DS_PREC)                # dS K: (M, D)
        if DESC_ATOMIC:
            DQ_desc.atomic_add([start_m, 0], dq_part)       # TMA reduce-add; rows past N_CTX are clipped
        else:
            tl.atomic_add(DQ + offs_m[:, None] * DQ_W + offs_d[None, :], dq_part, sem="relaxed",
                          mask=_rows_mask(row_ok[:, None], offs_d, D_VALID))
    return dk, dv


@triton.jit
def _bwd_dq_atomic_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                          stride_qz, stride_qh, stride_qm, stride_qd,
                          stride_kz, stride_kh, stride_kn, stride_kd,
                          stride_vz, stride_vh, stride_vn, stride_vd,
                          stride_dz, stride_dh, stride_dm, stride_dd,
                          H, N_CTX, scale,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, PBAR: tl.constexpr,
                          PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr,
                          SUB_FMA: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
                          PV_PREC: tl.constexpr, DS_PREC: tl.constexpr, RAW: tl.constexpr,
                          TMA: tl.constexpr = False, ORDER: tl.constexpr = 0, FTZ: tl.constexpr = False,
                          DESC_ATOMIC: tl.constexpr = False, D_VALID: tl.constexpr = 0):
    """dK_j, dV_j of key block j (BLOCK_N keys) and its share Σ_i dS_ij K_j of every dQ_i, added into DQ: FP32,
    contiguous (B, H, N, D) with D = D_VALID or HEAD_DIM, zeroed before. DK shares K's strides, DV V's.
    DESC_ATOMIC: the adds through a tensor descriptor over DQ (TMA reduce-add; needs D_VALID = 0)."""
    tl.static_assert(not (TMA and D_VALID), "a head dim narrower than the tile (D_VALID) is read without TMA")
    tl.static_assert(not (DESC_ATOMIC and D_VALID), "descriptor atomics need a head dim that fills its tile")
    start_n, off_hz, n_blocks = _grid_pos(ORDER)
    DQ_W: tl.constexpr = D_VALID if D_VALID else HEAD_DIM
    Q += _bh_offset(off_hz, H, stride_qz, stride_qh)
    DO += _bh_offset(off_hz, H, stride_dz, stride_dh)
    DQ += off_hz.to(tl.int64) * N_CTX * DQ_W
    k_base = _bh_offset(off_hz, H, stride_kz, stride_kh)
    v_base = _bh_offset(off_hz, H, stride_vz, stride_vh)
    LSE += off_hz.to(tl.int64) * N_CTX
    DELTA += off_hz.to(tl.int64) * N_CTX

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n[:, None] < N_CTX
    k_raw = _load_rows(K + k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, offs_n, N_CTX,
                       True, D_VALID)                                                  # (BLOCK_N, D)
    k = k_raw.to(MATMUL)
    v = _load_rows(V + v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, offs_n, N_CTX,
                   True, D_VALID).to(MATMUL)
    Q_src = _rows_source(Q, stride_qm, stride_qd, N_CTX, offs_m0, offs_d, BLOCK_M, HEAD_DIM, TMA)
    DO_src = _rows_source(DO, stride_dm, stride_dd, N_CTX, offs_m0, offs_d, BLOCK_M, HEAD_DIM, TMA)
    if DESC_ATOMIC:
        DQ_desc = tl.make_tensor_descriptor(DQ, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_M, HEAD_DIM])
    else:
        DQ_desc = DQ

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # causal: the query tiles above the diagonal are skipped, those crossing it masked, those below it run unmasked
    lo = start_n * BLOCK_N if CAUSAL else 0
    mid = _imin(lo + BLOCK_N, N_CTX) if CAUSAL else 0
    dk, dv = _dqa_tiles(dk, dv, k, k_raw, v, Q_src, DO_src, LSE, DELTA, DQ, DQ_desc, stride_qm, stride_dm, offs_n,
                        offs_m0, offs_d, lo, mid, N_CTX, scale, BLOCK_M, MATMUL, QK_OUT, SCORES, PBAR, PV_DT, DP,
                        DS, DS_DT, SUB_FMA, True, DOT_PREC, PV_PREC, DS_PREC, RAW, TMA, FTZ, DESC_ATOMIC, DQ_W,
                        D_VALID)
    dk, dv = _dqa_tiles(dk, dv, k, k_raw, v, Q_src, DO_src, LSE, DELTA, DQ, DQ_desc, stride_qm, stride_dm, offs_n,
                        offs_m0, offs_d, mid, N_CTX, N_CTX, scale, BLOCK_M, MATMUL, QK_OUT, SCORES, PBAR, PV_DT,
                        DP, DS, DS_DT, SUB_FMA, False, DOT_PREC, PV_PREC, DS_PREC, RAW, TMA, FTZ, DESC_ATOMIC,
                        DQ_W, D_VALID)
    tl.store(DK + k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
             _round(dk, DK.dtype.element_ty).to(DK.dtype.element_ty), mask=_rows_mask(col_ok, offs_d, D_VALID))
    tl.store(DV + v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
             _round(dv, DV.dtype.element_ty).to(DV.dtype.element_ty), mask=_rows_mask(col_ok, offs_d, D_VALID))


@triton.jit
def dq_epilogue(DQ_ACC, DQ, stride_qz, stride_qh, stride_qm, stride_qd, H, N_CTX,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, D_VALID: tl.constexpr = 0):
    """dQ in the output's dtype (Q's strides) from the FP32 accumulator (contiguous rows of D_VALID or HEAD_DIM
    values): one rounding to nearest even, nothing else (the scale is inside dS)."""
    DQ_W: tl.constexpr = D_VALID if D_VALID else HEAD_DIM
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = _load_rows(DQ_ACC + off_hz.to(tl.int64) * N_CTX * DQ_W + offs_m[:, None] * DQ_W + offs_d[None, :],
                     offs_m, N_CTX, True, D_VALID)
    tl.store(DQ + _bh_offset(off_hz, H, stride_qz, stride_qh) + offs_m[:, None] * stride_qm
             + offs_d[None, :] * stride_qd, _round(acc, DQ.dtype.element_ty).to(DQ.dtype.element_ty),
             mask=_rows_mask(offs_m[:, None] < N_CTX, offs_d, D_VALID))


#: Autotune spaces, (BLOCK_M, BLOCK_N, warps, stages, maxnreg). The dK/dV kernel's v1 space first (its first config
#: gives the split backward's dK/dV tiles), then FA2-tutorial-like tiles of 32 query rows (the extra dS K product
#: and its FP32 (BLOCK_M, D) tile raise register pressure at d 128); "sm90" adds deeper pipelines.
DQA_SPACES = {"v1": ((64, 128, 8, 2, None), (32, 128, 4, 3, None), (64, 64, 4, 3, None), (32, 128, 8, 2, None)),
              "sm90": ((64, 128, 8, 3, None), (32, 128, 8, 3, None), (32, 64, 4, 3, None), (64, 64, 4, 2, None))}
_DQA_SMALL = triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=1)


def _dqa_configs(space: str = "v1"):
    """The interpreter's one config has the dK/dV kernel's interpreter tiles (32 × 64), so that CPU tests compare
    dK and dV with the split backward's bit for bit."""
    return _space_configs(DQA_SPACES, space, [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4,
                                                            num_stages=1)])


_DQA_KEY = ["N_CTX", "HEAD_DIM", "D_VALID", "CAUSAL", "MATMUL", "PV_DT", "DS_DT", "SUB_FMA", "RAW", "TMA", "ORDER",
            "FTZ", "DESC_ATOMIC"]
#: space → the five-matmul kernel's autotuner. Each launch adds into DQ, so the autotuner zeroes it before every
#: timed launch and before the one it keeps.
DQA_TUNERS = {space: triton.autotune(configs=_dqa_configs(space), key=_DQA_KEY, do_bench=_bench,
                                     prune_configs_by={"early_config_prune": _fp32_prune(_DQA_SMALL)},
                                     reset_to_zero=["DQ"])(_bwd_dq_atomic_kernel)
              for space in DQA_SPACES}

_DQA_TL = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}


def dq_atomic_honours(kp) -> bool:
    """Whether this backward computes what `kp` asks, and may run now: an FP32 ``grad_acc`` (a 16-bit one rounds
    dQ once per policy key block in key order, which atomics cannot) and ``torch.use_deterministic_algorithms``
    off. Where not, `lpfail.kernels.launch_backward` runs the fused backward (the same arithmetic, deterministic)."""
    return kp.grad_acc == tl.float32 and not torch.are_deterministic_algorithms_enabled()


@functools.lru_cache(maxsize=1024)
def dq_atomic_consts(kv_items: tuple, desc_atomic: bool) -> dict:
    """The kernel's constexprs from the dK/dV kernel's plan (`lpfail.kernels.bwd_plan`'s "kv"): the same, without
    the 16-bit-accumulator and atomic switches of `_bwd_dkdv_kernel`, with DESC_ATOMIC."""
    kv = dict(kv_items)
    return {**{k: v for k, v in kv.items() if k not in ("GACC", "DQ_ATOMIC")}, "DESC_ATOMIC": desc_atomic}


def _dqa_grid(order: int, n: int, bh: int, block: str):
    """(blocks, B·H), or (B·H, blocks) for ORDER 1, as the package's other backward launches."""
    if order:
        return lambda meta: (bh, -(-n // meta[block]))
    return lambda meta: (-(-n // meta[block]), bh)


def launch_dq_atomic(do, q, k, v, o, lse, kp, causal: bool, scale: float, tuning):
    """δ (and the FP32 dQ accumulator zeroed in the same pass), the five-matmul kernel, the epilogue; returns dQ (Q's
    dtype), dK, dV. Called by `lpfail.kernels.launch_backward` for ``Tuning(bwd="dq_atomic")`` where
    `dq_atomic_honours`."""
    from lpfail.kernels import launcher as _k   # the launch helpers (read at call time: tools stub `launch`)

    B, H, N, D = q.shape
    do = do.contiguous()
    aligned = not ((q.data_ptr() | k.data_ptr() | v.data_ptr() | do.data_ptr() | o.data_ptr() | lse.data_ptr()) & 15)
    if tuning.tma and (not aligned or D & (D - 1)):   # as in `lpfail.kernels.launch_backward`
        tuning = dataclasses.replace(tuning, tma=False)
    key, consts, key_block, _ = _k.bwd_plan(N, D, causal, kp, scale, q.dtype, do.dtype, os.environ.get(TUNE_ENV),
                                            INTERPRET, tuning)
    desc_atomic = bool(tuning.tma) and (not INTERPRET or DESC_ATOMIC_IN_INTERPRETER)
    if tuning.tma and not INTERPRET:
        _k._ensure_tma_allocator()
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    key = (key, B, H, strides, o.stride(), aligned, torch.cuda.current_device() if q.is_cuda else None)
    bh, width, d_valid = B * H, consts["kv"]["HEAD_DIM"], consts["kv"]["D_VALID"]
    delta = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)   # contiguous (B, H, N, D)
    if kp.delta in ("dP.P", "dO.O_hp"):   # δ from a pass over K, V (as the other backwards); then zero dQ
        mode = 1 if kp.delta == "dP.P" else 2
        dq_kernel = _bwd_dq if tuning.space == "v1" else DQ_TUNERS[tuning.space]
        grid = _dqa_grid(consts["kv"]["ORDER"], N, bh, "BLOCK_M")
        _k.launch(dq_kernel, grid, (key, mode), (q, k, v, do, lse, delta, q, *strides, H, N, key_block, scale),
                  consts["dpp" if mode == 1 else "o_hp"])
        dq_acc.zero_()
    else:
        prod = "fp32" if torch.float32 in (o.dtype, do.dtype) or "fp32" == kp.delta_prod else kp.delta_prod
        _k.launch(_bwd_delta_dot, (-(-N // 64), bh), (key, o.dtype, True),
                  (o, do, delta, dq_acc, *o.stride(), *do.stride(), H, N),
                  dict(HEAD_DIM=width, D_VALID=d_valid, BLOCK_M=64, PROD=_DQA_TL[prod], ZERO_DQ=True))
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    kv = consts["kv"]
    _k.launch(DQA_TUNERS[tuning.space], _dqa_grid(kv["ORDER"], N, bh, "BLOCK_N"), (key, "dq_atomic", desc_atomic),
              (q, k, v, do, lse, delta, dk, dv, dq_acc, *strides, H, N, scale),
              dq_atomic_consts(tuple(kv.items()), desc_atomic))
    dq = torch.empty_like(q)
    _k.launch(dq_epilogue, (-(-N // 64), bh), (key, "epilogue"), (dq_acc, dq, *dq.stride(), H, N),
              dict(HEAD_DIM=width, D_VALID=d_valid, BLOCK_M=64))
    return dq, dk, dv
