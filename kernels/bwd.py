"""Triton flash attention, backward pass (FlashAttention-2, Algorithm 2) with the policy's δ source.

Explained in chapter 5 ("Fix"); the launcher and the `autograd.Function` are in `kernels/__init__.py`.
Order as in Triton's fused-attention tutorial: helpers → δ preprocess → the dK/dV loop → the dQ loop.

P is recomputed from the stored log-sum-exp L = m + log ℓ (so the forward's fix needs nothing here), in FP32,
by the same `SUB_FMA` rule as the forward. δ (DELTA) comes from one of three sources, the policy's `delta`:

* ``"dO.O"``    δ = rowsum(dO ∘ O) with O as the forward stored it (BF16 in the paper's code) — `_bwd_delta_dot`;
* ``"dO.O_hp"`` the same with O recomputed by the forward in FP32 (the launcher does that) — `_bwd_delta_dot`;
* ``"dP.P"``    δ = rowsum(dP ∘ P), dP = dO Vᵀ, equal in exact arithmetic — `_bwd_delta_dpp` (a pass over K, V).

Two kernels then make the gradients without atomics: `_bwd_dkdv` (one program per key block, walking the
query blocks) and `_bwd_dq` (one program per query block, walking the key blocks). Operands of every dot are
rounded to MATMUL, the dots accumulate in FP32.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from kernels.fwd import INTERPRET, _imin, _round, _tune


# -- device helpers --------------------------------------------------------------------------------------
@triton.jit
def _recompute_p(qk, lse_row, scale, QK_OUT: tl.constexpr, SCORES: tl.constexpr, SUB_FMA: tl.constexpr):
    """P = exp(S − L) in FP32 from a raw QKᵀ tile (S rounded as in the forward, or one FMA);
    `lse_row` broadcasts along the key axis of the tile."""
    if SUB_FMA:
        return tl.exp(tl.fma(qk, scale, -lse_row))
    else:
        return tl.exp(_round(_round(qk, QK_OUT) * scale, SCORES) - lse_row)


@triton.jit
def _add_rounded(acc, part, GACC: tl.constexpr):
    """acc + part with both rounded to GACC (the policy's grad_acc) — plain FP32 addition when GACC is FP32."""
    return _round(acc + _round(part, GACC), GACC)


# -- δ preprocess -------------------------------------------------------------------------------------------
@triton.jit
def _bwd_delta_dot(O, DO, DELTA,
                   stride_oz, stride_oh, stride_om, stride_od,
                   stride_dz, stride_dh, stride_dm, stride_dd,
                   H, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PROD: tl.constexpr):
    """δ = rowsum(dO ∘ O): each product rounded to PROD (the policy's delta_prod, widened), summed in FP32."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < N_CTX
    o = tl.load(O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
                + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=row_ok, other=0.0)
    do = tl.load(DO + off_z.to(tl.int64) * stride_dz + off_h.to(tl.int64) * stride_dh
                 + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, mask=row_ok, other=0.0)
    delta = tl.sum(_round(o.to(tl.float32) * do.to(tl.float32), PROD), 1)
    tl.store(DELTA + off_hz.to(tl.int64) * N_CTX + offs_m, delta, mask=offs_m < N_CTX)


# -- the query-side loop: dQ, or δ = rowsum(dP ∘ P), or δ = rowsum(dO ∘ O_hp) -------------------------------------
@triton.jit
def _q_side_tiles(dq, aux, q, do, lse, delta, K_ptrs, V_ptrs, stride_kn, stride_vn, offs_m, offs_n0,
                  lo, hi, N_CTX, scale,
                  BLOCK_N: tl.constexpr, MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr,
                  DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr, GACC: tl.constexpr,
                  SUB_FMA: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, MODE: tl.constexpr,
                  DOT_PREC: tl.constexpr, DS_PREC: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        if MASK:
            kv_ok = offs_n[:, None] < N_CTX
            k = tl.load(K_ptrs + start_n * stride_kn, mask=kv_ok, other=0.0)                # (BLOCK_N, D)
            v = tl.load(V_ptrs + start_n * stride_vn, mask=kv_ok, other=0.0)
        else:
            k = tl.load(K_ptrs + start_n * stride_kn)
            v = tl.load(V_ptrs + start_n * stride_vn)
        qk = tl.dot(q, tl.trans(k.to(MATMUL)), input_precision=DOT_PREC)               # (BLOCK_M, BLOCK_N)
        p = _recompute_p(qk, lse[:, None], scale, QK_OUT, SCORES, SUB_FMA)
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
                part = tl.dot(ds.to(DS_DT), k.to(DS_DT), input_precision=DS_PREC)
                if GACC == tl.float32:
                    dq += part
                else:
                    dq = _add_rounded(dq, part, GACC)
    return dq, aux


def _q_side_configs():
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in ((128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3))]
    return configs


def _fp32_prune(small):
    """FP32 dots (4-byte tiles): one small config that fits shared memory at head dim 128."""
    def prune(configs, named_args, **kwargs):
        if INTERPRET or tl.float32 not in (kwargs["MATMUL"], kwargs["DS_DT"], kwargs.get("PV_DT")):
            return configs if _tune() else configs[:1]
        return [small]
    return prune


@triton.autotune(configs=_q_side_configs(), key=["N_CTX", "HEAD_DIM", "CAUSAL", "MODE"],
                 prune_configs_by={"early_config_prune": _fp32_prune(
                     triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1))})
@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
            stride_qz, stride_qh, stride_qm, stride_qd,
            stride_kz, stride_kh, stride_kn, stride_kd,
            stride_vz, stride_vh, stride_vn, stride_vd,
            stride_dz, stride_dh, stride_dm, stride_dd,
            H, N_CTX, scale,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, DP: tl.constexpr,
            DS: tl.constexpr, DS_DT: tl.constexpr, GACC: tl.constexpr, SUB_FMA: tl.constexpr,
            CAUSAL: tl.constexpr, MODE: tl.constexpr, DOT_PREC: tl.constexpr, DS_PREC: tl.constexpr):
    """MODE 0: dQ = Σ_j dS K with dS = (P·α) ∘ (dP − δ).  MODE 1: δ = rowsum(dP ∘ P) into DELTA.
    MODE 2: δ = rowsum(dO ∘ O_hp), O_hp = Σ_j P V recomputed in FP32 from L, into DELTA.
    DQ shares Q's strides (stride_q*); DO has its own (stride_d*)."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    q_base = off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    K += off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    V += off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    DO += off_z.to(tl.int64) * stride_dz + off_h.to(tl.int64) * stride_dh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < N_CTX
    q = tl.load(Q + q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=row_ok,
                other=0.0).to(MATMUL)
    do_in = tl.load(DO + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, mask=row_ok, other=0.0)
    do = do_in.to(MATMUL)
    lse = tl.load(LSE + off_hz.to(tl.int64) * N_CTX + offs_m, mask=offs_m < N_CTX, other=float("inf"))
    if MODE == 0:
        delta = tl.load(DELTA + off_hz.to(tl.int64) * N_CTX + offs_m, mask=offs_m < N_CTX, other=0.0)
    else:
        delta = tl.zeros([BLOCK_M], tl.float32)
    K_ptrs = K + offs_n0[:, None] * stride_kn + offs_d[None, :] * stride_kd
    V_ptrs = V + offs_n0[:, None] * stride_vn + offs_d[None, :] * stride_vd

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
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
    dq, aux = _q_side_tiles(dq, aux, q, do, lse, delta, K_ptrs, V_ptrs, stride_kn, stride_vn, offs_m, offs_n0,
                            0, lo_mask, N_CTX, scale, BLOCK_N, MATMUL, QK_OUT, SCORES, DP, DS, DS_DT, GACC,
                            SUB_FMA, False, CAUSAL, MODE, DOT_PREC, DS_PREC)
    dq, aux = _q_side_tiles(dq, aux, q, do, lse, delta, K_ptrs, V_ptrs, stride_kn, stride_vn, offs_m, offs_n0,
                            lo_mask, hi, N_CTX, scale, BLOCK_N, MATMUL, QK_OUT, SCORES, DP, DS, DS_DT, GACC,
                            SUB_FMA, True, CAUSAL, MODE, DOT_PREC, DS_PREC)
    if MODE == 0:
        tl.store(DQ + q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                 _round(dq, DQ.dtype.element_ty).to(DQ.dtype.element_ty), mask=row_ok)
    else:
        if MODE == 2:
            aux = tl.sum(do_in.to(tl.float32) * aux, 1)
        tl.store(DELTA + off_hz.to(tl.int64) * N_CTX + offs_m, aux, mask=offs_m < N_CTX)


# -- the key-side loop: dK and dV ----------------------------------------------------------------------------
@triton.jit
def _kv_side_tiles(dk, dv, k, v, Q_ptrs, DO_ptrs, LSE, DELTA, stride_qm, stride_dm, offs_n, offs_m0,
                   lo, hi, N_CTX, scale,
                   BLOCK_M: tl.constexpr, MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr,
                   PBAR: tl.constexpr, PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr,
                   DS_DT: tl.constexpr, GACC: tl.constexpr, SUB_FMA: tl.constexpr, MASK: tl.constexpr,
                   DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr, DS_PREC: tl.constexpr):
    """Walk query blocks for one key block; tiles are held transposed (keys × queries) so that Pᵀ and dSᵀ
    feed the dV and dK dots directly. Query rows past the sequence load L = +inf, so their P is 0."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        row_ok = offs_m < N_CTX
        q = tl.load(Q_ptrs + start_m * stride_qm, mask=row_ok[:, None], other=0.0)            # (M, D)
        do = tl.load(DO_ptrs + start_m * stride_dm, mask=row_ok[:, None], other=0.0).to(MATMUL)
        lse = tl.load(LSE + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
        kq = tl.dot(k, tl.trans(q.to(MATMUL)), input_precision=DOT_PREC)               # Sᵀ: (N, M)
        pT = _recompute_p(kq, lse[None, :], scale, QK_OUT, SCORES, SUB_FMA)
        if MASK:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        part = tl.dot(_round(pT, PBAR).to(PV_DT), do.to(PV_DT), input_precision=PV_PREC)     # Pᵀ dO
        dpT = _round(tl.dot(v, tl.trans(do), input_precision=DOT_PREC), DP)                  # dPᵀ = V dOᵀ
        dsT = _round((pT * scale) * (dpT - delta[None, :]), DS)
        part_k = tl.dot(dsT.to(DS_DT), q.to(DS_DT), input_precision=DS_PREC)                 # dSᵀ Q
        if GACC == tl.float32:
            dv += part
            dk += part_k
        else:
            dv = _add_rounded(dv, part, GACC)
            dk = _add_rounded(dk, part_k, GACC)
    return dk, dv


def _kv_side_configs():
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=1)]
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in ((64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3))]
    return configs


@triton.autotune(configs=_kv_side_configs(), key=["N_CTX", "HEAD_DIM", "CAUSAL"],
                 prune_configs_by={"early_config_prune": _fp32_prune(
                     triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=1))})
@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
              stride_qz, stride_qh, stride_qm, stride_qd,
              stride_kz, stride_kh, stride_kn, stride_kd,
              stride_vz, stride_vh, stride_vn, stride_vd,
              stride_dz, stride_dh, stride_dm, stride_dd,
              H, N_CTX, scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              MATMUL: tl.constexpr, QK_OUT: tl.constexpr, SCORES: tl.constexpr, PBAR: tl.constexpr,
              PV_DT: tl.constexpr, DP: tl.constexpr, DS: tl.constexpr, DS_DT: tl.constexpr,
              GACC: tl.constexpr, SUB_FMA: tl.constexpr, CAUSAL: tl.constexpr,
              DOT_PREC: tl.constexpr, PV_PREC: tl.constexpr, DS_PREC: tl.constexpr):
    """dV = Σ_i Pᵀ dO and dK = Σ_i dSᵀ Q for one key block. DK shares K's strides, DV V's."""
    start_n = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    Q += off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    DO += off_z.to(tl.int64) * stride_dz + off_h.to(tl.int64) * stride_dh
    k_base = off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    LSE += off_hz.to(tl.int64) * N_CTX
    DELTA += off_hz.to(tl.int64) * N_CTX

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n[:, None] < N_CTX
    k = tl.load(K + k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=col_ok,
                other=0.0).to(MATMUL)                                                  # (BLOCK_N, D)
    v = tl.load(V + v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=col_ok,
                other=0.0).to(MATMUL)
    Q_ptrs = Q + offs_m0[:, None] * stride_qm + offs_d[None, :] * stride_qd
    DO_ptrs = DO + offs_m0[:, None] * stride_dm + offs_d[None, :] * stride_dd

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    if CAUSAL:
        # queries on the diagonal block need the mask; those below it see every key of the block
        lo = start_n * BLOCK_N
        mid = _imin(lo + BLOCK_N, N_CTX)
        dk, dv = _kv_side_tiles(dk, dv, k, v, Q_ptrs, DO_ptrs, LSE, DELTA, stride_qm, stride_dm, offs_n,
                                offs_m0, lo, mid, N_CTX, scale, BLOCK_M, MATMUL, QK_OUT, SCORES, PBAR, PV_DT,
                                DP, DS, DS_DT, GACC, SUB_FMA, True, DOT_PREC, PV_PREC, DS_PREC)
        dk, dv = _kv_side_tiles(dk, dv, k, v, Q_ptrs, DO_ptrs, LSE, DELTA, stride_qm, stride_dm, offs_n,
                                offs_m0, lo + BLOCK_N, N_CTX, N_CTX, scale, BLOCK_M, MATMUL, QK_OUT, SCORES,
                                PBAR, PV_DT, DP, DS, DS_DT, GACC, SUB_FMA, False, DOT_PREC, PV_PREC, DS_PREC)
    else:
        dk, dv = _kv_side_tiles(dk, dv, k, v, Q_ptrs, DO_ptrs, LSE, DELTA, stride_qm, stride_dm, offs_n,
                                offs_m0, 0, N_CTX, N_CTX, scale, BLOCK_M, MATMUL, QK_OUT, SCORES, PBAR, PV_DT,
                                DP, DS, DS_DT, GACC, SUB_FMA, False, DOT_PREC, PV_PREC, DS_PREC)
    tl.store(DK + k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
             _round(dk, DK.dtype.element_ty).to(DK.dtype.element_ty), mask=col_ok)
    tl.store(DV + v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
             _round(dv, DV.dtype.element_ty).to(DV.dtype.element_ty), mask=col_ok)
