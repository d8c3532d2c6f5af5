"""How the kernels are launched: the per-(shape, policy, tuning) plans of constexprs (`fwd_plan`, `bwd_plan`),
the grids, the TMA descriptors' allocator, the autotuner's picks and the direct launch of a compiled kernel
(`launch`), and the forward and backward launchers (`launch_forward`, `launch_backward`)."""
from __future__ import annotations

import dataclasses
import functools
import math
import os

import torch

from . import runtime
from .policy import KernelPolicy, head_tile, shift_args, wider
from .runtime import TL
from .tuning import DEFAULT_TUNING, Tuning

if runtime.IMPORT_ERROR is None:
    import triton

    from . import bwd as _bwd
    from . import fwd as _fwd


def _raw_units(kp: KernelPolicy, scale: float) -> bool:
    """Sub mode with α a power of two (head dims 16 and 64 at the default α): the forward keeps scores in
    units of α, one multiply fewer per score, with bit-identical results (see `lpfail.kernels.fwd._attn_fwd`)."""
    return not kp.sub_fma and math.frexp(scale)[0] == 0.5


PICKS: dict = {}
DIRECT: dict = {}
#: "0" turns the direct launch of a compiled kernel off (on by default). It calls Triton 3.6's launcher with that
#: version's argument layout, which no CPU test can run; measured on an NVIDIA H200 (torch 2.11, triton 3.6,
#: results/kernels_gpu/overhead.json), it gave the same O, dQ, dK, dV bit for bit as the JIT path and cut the
#: drop-in's host time per forward from 100 to 40 µs. Another Triton's binder layout turns it off by itself.
DIRECT_ENV = "LPFAIL_KERNELS_DIRECT"


def launch(kernel, grid, key, args, consts, stream=None):
    """Launch an autotuned kernel (or a plain JIT one) on `args` with the constexpr keywords `consts`. Once the
    autotuner has picked a config for `key`, launch that config directly: Triton's autotuner rebuilds its own key
    from every argument on each call, ≈ 25 µs of Python per launch, which adds straight to a short kernel's time.
    `key` holds the shape, the input dtype and every constexpr (the whole KernelPolicy and Tuning), so it is at
    least as fine as the autotuner's key.

    From the third launch on (CUDA, triton's own launcher, LPFAIL_KERNELS_DIRECT not "0"), the compiled kernel that
    Triton's JIT returned is called directly with the same arguments (see `_direct_entry`), skipping the JIT's
    argument binding and cache key (≈ 18 µs of Python per launch on the CPU measured in notes/fix.md), on
    `stream` (the current stream when None). `key` must then also fix every
    integer argument's value (the callers put the batch and head counts and the strides in it) and the tensors'
    16-byte alignment, which Triton specialises on."""
    d = DIRECT.get((kernel, key))
    if d is not None:
        compiled, tail, meta, drv, hooks = d
        g = grid(meta) if callable(grid) else grid
        if stream is None:
            stream = drv.get_current_stream(drv.get_current_device())
        enter = hooks.launch_enter_hook
        md = compiled.launch_metadata(g, stream, *args, *tail) if enter is not None else None
        compiled.run(g[0], g[1], 1, stream, compiled.function, compiled.packed_metadata, md, enter,
                     hooks.launch_exit_hook, *args, *tail)
        return compiled
    tuned = hasattr(kernel, "configs")  # an autotuner, not a plain JIT function
    cfg = PICKS.get((kernel, key), PICKS)   # (PICKS itself: no launch yet)
    if cfg is PICKS or (not tuned and _fwd.INTERPRET):
        out = kernel[grid](*args, **consts)
        PICKS[(kernel, key)] = kernel.best_config if tuned else None
        return out
    meta = cfg.all_kwargs() if tuned else {}
    jit = kernel.fn if tuned else kernel
    out = jit.run(*args, grid=grid, warmup=False, **consts, **meta)
    entry = _direct_entry(jit, out, args, {**consts, **meta}, key)
    if entry is not None:
        DIRECT[(kernel, key)] = entry[:2] + (meta,) + entry[2:]    # (compiled, tail, meta, driver, hooks)
    return out


def _current_stream():
    """The current CUDA stream's handle, as Triton's launcher takes it (one lookup per backward, not per launch)."""
    from triton.runtime import driver

    drv = driver.active
    return drv.get_current_stream(drv.get_current_device())


def _direct_entry(jit, compiled, args, kwargs, key):
    """What `launch` needs to call `compiled` (the kernel `jit.run` just launched) without the JIT: the
    constexpr values in signature order after the positional `args`, checked against Triton's own binder
    (its bound arguments, in the launcher's order, must be `args` then those values). None where the direct
    call is not possible or not wanted: the interpreter, a hook on the JIT, LPFAIL_KERNELS_DIRECT=0, a
    misaligned tensor, or a binding whose layout this code does not know (another Triton version's)."""
    if _fwd.INTERPRET or not hasattr(compiled, "packed_metadata") or os.environ.get(DIRECT_ENV, "1") == "0":
        return None
    if any(isinstance(a, torch.Tensor) and a.data_ptr() % 16 for a in args):
        return None
    try:
        from triton import knobs
        from triton.runtime import driver
        drv = driver.active
        if jit.pre_run_hooks or knobs.runtime.debug:
            return None
        binder = jit.device_caches[drv.get_current_device()][4]
        bound = list(binder(*args, **kwargs)[0].values())
    except Exception:  # noqa: BLE001 - an internal layout other than triton 3.6's: keep the JIT path
        return None
    if len(bound) < len(args) or any(a is not b for a, b in zip(bound, args)):
        return None
    return compiled, tuple(bound[len(args):]), drv, knobs.runtime


_ENV_DATA = getattr(os.environ, "_data", None)   # CPython's os.environ store: a lookup without KeyError handling
_TUNE_KEY = b"LPFAIL_KERNELS_AUTOTUNE"            # fwd.TUNE_ENV, encoded as os.environ stores it on POSIX


def _tune_env():
    """LPFAIL_KERNELS_AUTOTUNE's value (part of the launch plans' keys: the prune step reads it when it tunes),
    read from os.environ's own store where it has one: ≈ 0.1 µs instead of ≈ 1 µs per call."""
    if _ENV_DATA is not None and os.name == "posix":
        value = _ENV_DATA.get(_TUNE_KEY)
        return None if value is None else value.decode()
    return os.environ.get(_fwd.TUNE_ENV)


def _device_index(t: torch.Tensor):
    """The current CUDA device (Triton launches there), or None off CUDA: part of the direct launch's key."""
    return torch.cuda.current_device() if t.is_cuda else None


def _tma_alloc(size: int, alignment: int, stream):
    """Global scratch for the kernels' device-side tensor descriptors (128 bytes per program)."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _ensure_tma_allocator() -> None:
    """Triton's allocator for descriptor scratch is a context variable: set it in every thread that launches (the
    autograd engine runs the backward in its own thread)."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is not _tma_alloc:
        triton.set_allocator(_tma_alloc)


def _grid(order: int):
    """The grid of a kernel whose blocks run along the sequence: (blocks, B·H), or (B·H, blocks) for ORDER 1."""
    if order:
        return lambda n, bh, block: (lambda meta: (bh, -(-n // meta[block])))
    return lambda n, bh, block: (lambda meta: (-(-n // meta[block]), bh))


_GRIDS = (_grid(0), _grid(1))


@functools.lru_cache(maxsize=1024)
def fwd_plan(N: int, D: int, causal: bool, kp: KernelPolicy, scale: float, dtype, tune, interp: bool,
             tuning: Tuning = DEFAULT_TUNING):
    """The forward launch's per-(shape, policy, tuning) constants: the key-block argument, the scalars after it and
    the constexpr keywords (computed once instead of on every call)."""
    raw = _raw_units(kp, scale)
    key_block = kp.key_block or triton.cdiv(N, kp.block_n) * kp.block_n
    scalars = (key_block, scale, kp.eps / scale if raw else kp.eps, kp.beta, kp.l_clamp,
               *shift_args(kp, scale if raw else 1.0))
    width, d_valid = head_tile(D)
    consts = dict(RAW=raw, HEAD_DIM=width, D_VALID=d_valid, BLOCK_N=kp.block_n, MATMUL=kp.matmul,
                  QK_OUT=kp.qk_out, SCORES=kp.scores, EXP_IN=kp.exp_in, PBAR=kp.pbar, PV_DT=kp.pv_dt,
                  PV_OUT=kp.pv_out, ACC=kp.acc, SUB_FMA=kp.sub_fma, FIX=kp.fix_mode, CLAMP=kp.clamp, CAUSAL=causal,
                  TWO_PASS=kp.two_pass, DOT_PREC=kp.dot_prec, PV_PREC=kp.pv_prec,
                  **_fwd_levers(kp, scale, causal, tuning, D))
    if not interp:
        consts["enable_fp_fusion"] = kp.sub_fma
    return (N, D, causal, kp, raw, dtype, tune, tuning), scalars, consts


def _fwd_levers(kp: KernelPolicy, scale: float, causal: bool, tuning: Tuning, head_dim: int = 64) -> dict:
    """The forward's tuning constexprs, each set only where it changes the code (so that variants that compute
    the same code share one compiled kernel): TIE and POW2 with the fix on the fast path, ORDER when causal.
    Tuning.tie "auto" counts at head dim ≤ 64 and keeps max2 above."""
    count = tuning.tie == "count" or (tuning.tie == "auto" and head_dim <= 64)
    tie = int(count and kp.fix_mode != 0 and not kp.two_pass)
    return dict(TMA=tuning.tma is True, ORDER=int(causal and tuning.order == "lpt"), TIE=tie,
                POW2=bool(tie and kp.sub_fma and math.frexp(scale)[0] == 0.5), L_PBAR=kp.l_pbar)


def _aligned(*tensors) -> bool:
    """All data pointers 16-byte aligned (Triton specialises on it; TMA descriptors need it)."""
    ptrs = 0
    for t in tensors:
        ptrs |= t.data_ptr()
    return not (ptrs & 15)


def launch_forward(q, k, v, kp: KernelPolicy, causal: bool, scale: float, tuning: Tuning = DEFAULT_TUNING):
    """Launch the forward kernel; returns O (in the policy's `out` dtype) and L = m + log ℓ (FP32). (The grids
    divide with -(-a // b), not triton.cdiv, which is a JIT function: ≈ 5 µs per call on the host.)"""
    B, H, N, D = q.shape
    o = torch.empty((B, H, N, D), device=q.device, dtype=kp.out_dtype)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    aligned = _aligned(q, k, v, o)                                      # Triton specialises on it
    if tuning.tma and (not aligned or D & (D - 1)):   # a descriptor needs 16-byte alignment; D_VALID, pointers
        tuning = dataclasses.replace(tuning, tma=False)
    key, scalars, consts = fwd_plan(N, D, causal, kp, scale, q.dtype, _tune_env(), _fwd.INTERPRET, tuning)
    if consts["TMA"] and not _fwd.INTERPRET:
        _ensure_tma_allocator()
    strides = (*q.stride(), *k.stride(), *v.stride())
    launch(_fwd._attn_fwd if tuning.space == "v1" else _fwd.FWD_TUNERS[tuning.space],
           _GRIDS[consts["ORDER"]](N, B * H, "BLOCK_M"),
           (key, B, H, strides, aligned, _device_index(q)),
           (q, k, v, o, lse, *strides, *o.stride(), H, N, *scalars), consts)
    return o, lse


def launch_backward(do, q, k, v, o, lse, kp: KernelPolicy, causal: bool, scale: float,
                    tuning: Tuning = DEFAULT_TUNING):
    """Launch the backward: δ (its own pass, or a pass over K, V for "dP.P" / "dO.O_hp"), then the split dK/dV
    and dQ kernels, or the atomic kernel (dK, dV and dQ in one; dQ summed in FP32 and cast after)."""
    if tuning.bwd == "dq_atomic":   # five matmuls (kernels/bwd.py), or the fused backward where it can't run
        if _bwd.dq_atomic_honours(kp):
            return _bwd.launch_dq_atomic(do, q, k, v, o, lse, kp, causal, scale, tuning)
        tuning = dataclasses.replace(tuning, bwd="fused")
    B, H, N, D = q.shape
    do = do.contiguous()
    aligned = _aligned(q, k, v, do, o, lse)
    if tuning.tma and (not aligned or D & (D - 1)):   # as in `launch_forward`
        tuning = dataclasses.replace(tuning, tma=False)
    key, consts, key_block, query_block = bwd_plan(N, D, causal, kp, scale, q.dtype, do.dtype, _tune_env(),
                                                   _fwd.INTERPRET, tuning)
    if tuning.tma and not _fwd.INTERPRET:
        _ensure_tma_allocator()
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    # Triton specialises on the integers' values (mod 16, = 1) and the tensors' 16-byte alignment
    key = (key, B, H, strides, o.stride(), aligned, _device_index(q))
    stream = _current_stream() if q.is_cuda else None
    grids, bh = _GRIDS[consts["kv"]["ORDER"]], B * H
    atomic = tuning.bwd == "atomic"
    # (the v1 space's kernels are read from the module at each call, so that tools/host_breakdown.py can stub them)
    dq_kernel = _bwd._bwd_dq if tuning.space == "v1" else _bwd.DQ_TUNERS[tuning.space]
    delta = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    dq = torch.empty(q.shape, device=q.device, dtype=torch.float32) if atomic else torch.empty_like(q)
    if kp.delta in ("dP.P", "dO.O_hp"):   # a pass over K, V per query block: δ from dP ∘ P or dO ∘ O_hp
        mode = 1 if kp.delta == "dP.P" else 2
        launch(dq_kernel, grids(N, bh, "BLOCK_M"), (key, mode), (q, k, v, do, lse, delta, q, *strides, H, N,
               key_block, scale), consts["dpp" if mode == 1 else "o_hp"], stream)
        if atomic:
            dq.zero_()
    else:
        wide = "fp32" if torch.float32 in (o.dtype, do.dtype) else kp.delta_prod
        launch(_bwd._bwd_delta_dot, (-(-N // 64), bh), (key, o.dtype, atomic),
               (o, do, delta, dq, *o.stride(), *do.stride(), H, N),
               dict(HEAD_DIM=consts["kv"]["HEAD_DIM"], D_VALID=consts["kv"]["D_VALID"], BLOCK_M=64,
                    PROD=TL[wider(kp.delta_prod, wide)], ZERO_DQ=atomic), stream)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if tuning.bwd == "fused":
        launch(_bwd.FUSED_TUNERS[tuning.space], _GRIDS[0](N, bh, "BLOCK_N1"), key, (q, k, v, do, lse, delta, dq, dk, dv,
               *strides, H, N, query_block, key_block, scale), consts["fused"], stream)
        return dq, dk, dv
    args = (q, k, v, do, lse, delta, dk, dv, dq if atomic else dk, *strides, H, N, query_block, scale)
    kv_kernel = _bwd.DKDV_TUNERS[(tuning.space, atomic)] if tuning.space != "v1" or atomic else _bwd._bwd_dkdv
    launch(kv_kernel, grids(N, bh, "BLOCK_N"), key, args, consts["kv"], stream)
    if atomic:
        return dq.to(q.dtype), dk, dv
    launch(dq_kernel, grids(N, bh, "BLOCK_M"), (key, 0), (q, k, v, do, lse, delta, dq, *strides, H, N, key_block,
           scale), consts["dq"], stream)
    return dq, dk, dv


@functools.lru_cache(maxsize=1024)
def bwd_plan(N: int, D: int, causal: bool, kp: KernelPolicy, scale: float, dtype, do_dtype, tune, interp: bool,
             tuning: Tuning = DEFAULT_TUNING):
    """The backward launches' per-(shape, policy, tuning) constants (computed once instead of on every call)."""
    width, d_valid = head_tile(D)
    common = dict(HEAD_DIM=width, D_VALID=d_valid, MATMUL=kp.matmul, QK_OUT=kp.qk_out, SCORES=kp.scores,
                  DP=kp.dp, DS=kp.ds, DS_DT=kp.ds_dt, GACC=kp.grad_acc, SUB_FMA=kp.sub_fma, CAUSAL=causal,
                  DOT_PREC=kp.dot_prec, DS_PREC=kp.ds_prec, RAW=_raw_units(kp, scale), TMA=bool(tuning.tma),
                  ORDER=int(causal and tuning.order == "lpt"), FTZ=bool(tuning.ftz_exp and not kp.sub_fma))
    if not interp:
        common["enable_fp_fusion"] = kp.sub_fma
    # the policy's blocks for the grad_acc roundings; one block over the sequence (0) is a boundary past its end
    whole = triton.cdiv(N, _bwd.GRAD_TILE) * _bwd.GRAD_TILE
    kv = {**common, "PBAR": kp.pbar, "PV_DT": kp.pv_dt, "PV_PREC": kp.pv_prec, "DQ_ATOMIC": tuning.bwd == "atomic"}
    consts = {"dq": {**common, "MODE": 0}, "dpp": {**common, "MODE": 1}, "o_hp": {**common, "MODE": 2}, "kv": kv}
    if tuning.bwd == "fused":   # one grid order (its programs all do the same work), no atomics
        consts["fused"] = {k: v for k, v in kv.items() if k not in ("ORDER", "DQ_ATOMIC")}
    return (N, D, causal, kp, dtype, do_dtype, tune, tuning), consts, kp.key_block or whole, kp.query_block or whole

