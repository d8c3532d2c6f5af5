"""Compile the Triton kernels for an H100/H200 (sm_90) on a machine without a GPU, and report each variant's
shared memory. Catches what Triton's CPU interpreter lets through (e.g. a jitted
function reading a non-constexpr global) before a device call is spent on it.

    python tools/compile_check.py            # the benchmark's policies, head dims 64 and 128, causal
    python tools/compile_check.py --quick    # one variant per code path (what the CPU test suite runs)
"""
from __future__ import annotations

import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import kernels
from kernels import bwd, fwd
from lpfail.precision import FA2_BF16, PAPER_BF16

POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
FLOATS = {"scale", "EPS", "BETA", "L_CLAMP", "SHIFT_LO", "SHIFT_HI", "SHIFT_SAFE"}


def _signature(fn, consts, elem="*bf16"):
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name] = elem
        elif name in ("LSE", "DELTA"):
            sig[name] = "*fp32"
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _launch_constants(fn, consts):
    """What a launch on contiguous (B, H, N, D) tensors specialises: head-dim strides equal 1 (constexpr)."""
    ones = {name: 1 for name in fn.arg_names if name.startswith("stride_") and name.endswith("d")}
    return {**consts, **ones}


def _divisibility(fn, consts):
    """What a launch also tells the compiler: 16-byte aligned pointers and strides divisible by 16 (without it
    no load is pipelined, and the shared memory figures would mean nothing)."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
            if name not in consts and (name in POINTERS or name in ("LSE", "DELTA") or name.startswith("stride_"))}


def compile_one(jit_fn, consts, warps, stages, target=GPUTarget("cuda", 90, 32)):
    fn = jit_fn.fn  # under the autotuner
    consts = _launch_constants(fn, consts)
    src = ASTSource(fn, _signature(fn, consts), constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                    attrs=_divisibility(fn, consts))
    k = triton.compile(src, target=target, options={"num_warps": warps, "num_stages": stages})
    md = k.metadata
    return {"shared": md.shared, "cp_async": k.asm["ptx"].count("cp.async.cg") + k.asm["ptx"].count("cp.async.ca")}


def variants():
    policies = {"FA2_BF16": FA2_BF16, "FA2_BF16+fix": FA2_BF16.with_fix(), "fma": FA2_BF16.replace(sub="fma"),
                "fma+fix": FA2_BF16.replace(sub="fma").with_fix(), "PAPER_BF16": PAPER_BF16,
                "PAPER_BF16+fix": PAPER_BF16.with_fix(), "FA2_BF16+robust": FA2_BF16.with_bounded_fix(),
                "fma+robust": FA2_BF16.replace(sub="fma").with_bounded_fix(),
                "PAPER_BF16+robust": PAPER_BF16.with_bounded_fix()}
    for name, policy in policies.items():
        kp = kernels.kernel_policy(policy)
        for d in (64, 128):
            raw = kernels._raw_units(kp, d ** -0.5)
            f = dict(HEAD_DIM=d, BLOCK_N=kp.block_n, MATMUL=kp.matmul, QK_OUT=kp.qk_out, SCORES=kp.scores,
                     EXP_IN=kp.exp_in, PBAR=kp.pbar, PV_DT=kp.pv_dt, PV_OUT=kp.pv_out, ACC=kp.acc,
                     SUB_FMA=kp.sub_fma, FIX=kp.fix_mode, CLAMP=kp.clamp, CAUSAL=True, TWO_PASS=kp.two_pass,
                     DOT_PREC=kp.dot_prec, PV_PREC=kp.pv_prec, RAW=raw)
            for cfg in fwd._fwd_configs():
                yield (name, d, "fwd", cfg), fwd._attn_fwd, {**f, **cfg.kwargs}, cfg.num_warps, cfg.num_stages
            b = dict(HEAD_DIM=d, MATMUL=kp.matmul, QK_OUT=kp.qk_out, SCORES=kp.scores, DP=kp.dp, DS=kp.ds,
                     DS_DT=kp.ds_dt, GACC=kp.grad_acc, SUB_FMA=kp.sub_fma, CAUSAL=True, DOT_PREC=kp.dot_prec,
                     DS_PREC=kp.ds_prec, RAW=raw)
            cfg = bwd._kv_side_configs()[0]
            yield ((name, d, "dkdv", cfg), bwd._bwd_dkdv,
                   {**b, **cfg.kwargs, "PBAR": kp.pbar, "PV_DT": kp.pv_dt, "PV_PREC": kp.pv_prec},
                   cfg.num_warps, cfg.num_stages)
            cfg = bwd._q_side_configs()[0]
            yield (name, d, "dq", cfg), bwd._bwd_dq, {**b, **cfg.kwargs, "MODE": 0}, cfg.num_warps, cfg.num_stages


SMEM_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (opt-in maximum)
#: one variant per kind of code path: the fast path with the fix in both modes, the two-pass emulation, and
#: the backward kernels with FP32 and BF16 gradient accumulators, at both head dims (first config only)
QUICK = {("FA2_BF16+fix", "fwd"), ("fma+fix", "fwd"), ("PAPER_BF16+fix", "fwd"), ("PAPER_BF16", "dkdv"),
         ("PAPER_BF16", "dq"), ("FA2_BF16", "dkdv"), ("FA2_BF16", "dq"), ("FA2_BF16+robust", "fwd"),
         ("fma+robust", "fwd"), ("PAPER_BF16+robust", "fwd")}


def main(argv=None) -> int:
    """Compile every variant (or, with --quick, one per code path); fail when one does not compile, does not
    fit in shared memory, or has no asynchronous copies (its loads would not be pipelined)."""
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    failed, seen = 0, set()
    for (name, d, kern, cfg), fn, consts, warps, stages in variants():
        if quick and ((name, kern) not in QUICK or (name, d, kern) in seen):
            continue
        seen.add((name, d, kern))
        tag = f"{name:15s} d={d:3d} {kern:4s} {str(cfg.kwargs):38s} w{warps} s{stages}"
        try:
            r = compile_one(fn, consts, warps, stages)
        except Exception as e:  # report every variant, then fail
            failed += 1
            print(f"{tag}  FAILED: {type(e).__name__}: {str(e).splitlines()[-1][:200]}", flush=True)
            continue
        bad = [] if r["shared"] <= SMEM_LIMIT else ["over the shared-memory limit"]
        bad += [] if r["cp_async"] else ["no asynchronous copies (loads not pipelined)"]
        failed += bool(bad)
        print(f"{tag}  shared memory {r['shared']:6d} B, {r['cp_async']:3d} async copies"
              + (f"  FAILED: {'; '.join(bad)}" if bad else ""), flush=True)
    print(f"{len(seen)} variants, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
