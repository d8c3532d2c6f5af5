"""Compile the Triton kernels for an H100/H200 (sm_90) on a machine without a GPU, and report each variant's
shared memory. Catches what Triton's CPU interpreter lets through (e.g. a jitted
function reading a non-constexpr global, a tensor descriptor the GPU compiler refuses) before a device call is
spent on it. The constexprs and compile options come from the launcher's own plans (`kernels.fwd_plan`,
`kernels.bwd_plan`), so what compiles here is what a launch compiles.

    python tools/compile_check.py            # the benchmark's policies × every tuning lever, head dims 64 and 128,
                                             # causal, every config of each kernel's autotune space
    python tools/compile_check.py --quick    # one variant per code path and lever, first config (the CPU test)
    python tools/compile_check.py --tunings=dqa,dqa_tma   # the full run for these `TUNINGS` only
    python tools/compile_check.py --head-dims  # head dims narrower than their tile (48 and 96, one per tile
                                             # width; `--head-dims=48,80,96,112` names them): every kernel (δ,
                                             # the fused backward, the atomic dK/dV and the five-matmul
                                             # backward too), first config
"""
from __future__ import annotations

import dataclasses
import re
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lpfail import kernels
from lpfail.kernels import ALL_LEVERS, Tuning, bwd, fwd
from lpfail.precision import FA2_BF16, PAPER_BF16

POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
FLOATS = {"scale", "EPS", "BETA", "L_CLAMP", "SHIFT_LO", "SHIFT_HI", "SHIFT_SAFE"}
#: the tuning levers (`kernels.Tuning`), one at a time and all together
TUNINGS = {"default": Tuning(), "tma": Tuning(tma=True), "sm90": Tuning(space="sm90"), "lpt": Tuning(order="lpt"),
           "atomic": Tuning(bwd="atomic"), "count": Tuning(tie="count"), "ftz": Tuning(ftz_exp=True),
           "all": ALL_LEVERS, "dqa": Tuning(bwd="dq_atomic"), "dqa_tma": Tuning(bwd="dq_atomic", tma="bwd")}
POLICIES = {"FA2_BF16": FA2_BF16, "FA2_BF16+fix": FA2_BF16.with_fix(), "fma": FA2_BF16.replace(sub="fma"),
            "fma+fix": FA2_BF16.replace(sub="fma").with_fix(), "PAPER_BF16": PAPER_BF16,
            "PAPER_BF16+fix": PAPER_BF16.with_fix(), "FA2_BF16+robust": FA2_BF16.with_bounded_fix(),
            "fma+robust": FA2_BF16.replace(sub="fma").with_bounded_fix(),
            "PAPER_BF16+robust": PAPER_BF16.with_bounded_fix(), "FA2_BF16+lpbar": FA2_BF16.replace(l_from="pbar"),
            "fma+lpbar": FA2_BF16.replace(sub="fma", l_from="pbar")}


def _signature(fn, consts, elem="*bf16", fp32_ptrs=()):
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in fp32_ptrs:
            sig[name] = "*fp32"
        elif name in POINTERS:
            sig[name] = elem
        elif name in ("LSE", "DELTA", "DQ_ACC"):
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
            if name not in consts and (name in POINTERS or name in ("LSE", "DELTA", "DQ_ACC")
                                       or name.startswith("stride_"))}


def _source(jit_fn, consts):
    fn = jit_fn.fn if hasattr(jit_fn, "configs") else jit_fn  # the JIT function under an autotuner
    consts = _launch_constants(fn, consts)
    fp32 = ("DQ",) if consts.get("DQ_ATOMIC") or consts.get("ZERO_DQ") or "DESC_ATOMIC" in consts else ()
    return ASTSource(fn, _signature(fn, consts, fp32_ptrs=fp32),
                     constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                     attrs=_divisibility(fn, consts))


def compile_kernel(jit_fn, consts, options, target=GPUTarget("cuda", 90, 32)):
    """The compiled kernel of `jit_fn` with these constexprs and options (num_warps, num_stages, maxnreg, …)."""
    return triton.compile(_source(jit_fn, consts), target=target, options=options)


def compile_one(jit_fn, consts, options, target=GPUTarget("cuda", 90, 32)):
    k = compile_kernel(jit_fn, consts, options, target)
    md = k.metadata
    ptx = k.asm["ptx"]
    return {"shared": md.shared, "cp_async": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
            "tma": ptx.count("cp.async.bulk.tensor"), "tma_reduce": ptx.count("cp.reduce.async.bulk.tensor"),
            "atomics": len(re.findall(r"\b(?:red|atom)\.global", ptx)), "regs": None}


def _options(cfg, fusion):
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "enable_fp_fusion": fusion}
    if cfg.maxnreg is not None:
        opts["maxnreg"] = cfg.maxnreg
    return opts


def _configs(kernel, consts, every: bool):
    """The configs a launch may pick for these constexprs (the kernel's prune step), or only the first."""
    pruned = kernel.early_config_prune(kernel.configs, {}, **consts) if every else kernel.configs
    return pruned if every else pruned[:1]


def variants(policies=POLICIES, tunings=("default",), every=False, n=4096):
    """((policy, tuning, d, kernel, config), jit, constexprs, options) for every variant a causal BF16 launch makes."""
    for name, policy in policies.items():
        kp = kernels.kernel_policy(policy)
        for tname in tunings:
            tuning = TUNINGS[tname]
            if tuning.bwd in ("atomic", "dq_atomic") and kp.grad_acc != triton.language.float32:
                continue   # (the five-matmul backward runs the fused one there)
            for d in (64, 128):
                _, _, consts = kernels.fwd_plan(n, d, True, kp, d ** -0.5, torch.bfloat16, None, False, tuning)
                fusion = consts.pop("enable_fp_fusion")
                kernel = fwd.FWD_TUNERS[tuning.space]
                for cfg in _configs(kernel, consts, every):
                    yield (name, tname, d, "fwd", cfg), kernel, {**consts, **cfg.kwargs}, _options(cfg, fusion)
                _, bconsts, _, _ = kernels.bwd_plan(n, d, True, kp, d ** -0.5, torch.bfloat16, torch.bfloat16, None,
                                                    False, tuning)
                kv, dq = dict(bconsts["kv"]), dict(bconsts["dq"])
                fusion = kv.pop("enable_fp_fusion")
                dq.pop("enable_fp_fusion")
                if tuning.bwd == "dq_atomic":
                    yield from _dqa_variants(name, tname, d, kv, bool(tuning.tma), tuning.space, every, fusion)
                    continue
                atomic = tuning.bwd == "atomic"
                kernel = bwd.DKDV_TUNERS[(tuning.space, atomic)]
                for cfg in _configs(kernel, kv, every):
                    yield (name, tname, d, "dkdv", cfg), kernel, {**kv, **cfg.kwargs}, _options(cfg, fusion)
                if atomic:
                    continue
                kernel = bwd.DQ_TUNERS[tuning.space]
                for cfg in _configs(kernel, dq, every):
                    yield (name, tname, d, "dq", cfg), kernel, {**dq, **cfg.kwargs}, _options(cfg, fusion)


def _dqa_variants(name, tname, d, kv, desc_atomic, space, every, fusion):
    """The five-matmul backward's kernel (constexprs as its launcher makes them from the dK/dV plan) and epilogue."""
    consts = bwd.dq_atomic_consts(tuple(kv.items()), desc_atomic)
    kernel = bwd.DQA_TUNERS[space]
    for cfg in _configs(kernel, consts, every):
        yield (name, tname, d, "dqa", cfg), kernel, {**consts, **cfg.kwargs}, _options(cfg, fusion)
    epi = dict(HEAD_DIM=kv["HEAD_DIM"], D_VALID=kv["D_VALID"], BLOCK_M=64)
    cfg = triton.Config({}, num_warps=4, num_stages=1)
    yield (name, tname, d, "dqep", cfg), bwd.dq_epilogue, epi, _options(cfg, fusion)


SMEM_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (opt-in maximum)
#: one variant per kind of code path and lever (first config only), as (policy, tuning, kernel, head dims): the fast
#: path with the fix in both modes, the two-pass emulation, the backward kernels with FP32 and BF16 gradient
#: accumulators (the fix does not reach them), ℓ from P̄; then the levers (TMA, the count tie test, the causal
#: order, the atomic backward, the FTZ exp) in the forward's three paths and the backward's kernels
QUICK = (("FA2_BF16+fix", "default", "fwd", (64, 128)), ("fma+fix", "default", "fwd", (64, 128)),
         ("PAPER_BF16+fix", "default", "fwd", (64, 128)), ("FA2_BF16+robust", "default", "fwd", (64, 128)),
         ("fma+robust", "default", "fwd", (64, 128)), ("PAPER_BF16+robust", "default", "fwd", (64, 128)),
         ("PAPER_BF16", "default", "dkdv", (64, 128)), ("PAPER_BF16", "default", "dq", (64, 128)),
         ("FA2_BF16", "default", "dkdv", (64, 128)), ("FA2_BF16", "default", "dq", (64, 128)),
         ("FA2_BF16+lpbar", "default", "fwd", (64,)),
         ("FA2_BF16+fix", "all", "fwd", (64, 128)), ("FA2_BF16", "all", "dkdv", (64, 128)),
         ("fma+robust", "all", "fwd", (64,)), ("PAPER_BF16+fix", "all", "fwd", (64,)),
         ("FA2_BF16", "tma", "dq", (64,)), ("PAPER_BF16", "tma", "dkdv", (64,)),
         ("FA2_BF16", "dqa", "dqa", (64, 128)), ("fma+robust", "dqa_tma", "dqa", (64, 128)),
         ("FA2_BF16", "dqa", "dqep", (64,)))


#: (policy, tuning) pairs compiled at every head dim narrower than its tile (`--head-dims`): the fast path with
#: each fix and the FMA form, the two-pass emulation with BF16 gradient accumulators, δ from dP ∘ P, the default
#: levers (fused backward) and every lever (atomic backward).
PADDED = (("FA2_BF16+robust", "default"), ("fma+fix", "default"), ("PAPER_BF16+fix", "default"),
          ("FA2_BF16", "dpp"), ("FA2_BF16+robust", "next"), ("FA2_BF16", "all"), ("fma+robust", "dqa_tma"))


def padded_variants(dims=(48, 96), n=4096):
    """Every kernel a causal BF16 launch makes at head dims that are not powers of two, with the launcher's
    constexprs (HEAD_DIM the next power of two, D_VALID the head dim; TMA off, as the launcher turns it off there),
    first config of each kernel."""
    tunings = {**TUNINGS, "next": kernels.NEXT_LEVERS, "dpp": Tuning()}
    for name, tname in PADDED:
        policy = POLICIES[name].replace(delta="dP.P") if tname == "dpp" else POLICIES[name]
        kp = kernels.kernel_policy(policy)
        tuning = dataclasses.replace(tunings[tname], tma=False)
        for d in dims:
            _, _, consts = kernels.fwd_plan(n, d, True, kp, d ** -0.5, torch.bfloat16, None, False, tuning)
            assert consts["D_VALID"] == d and consts["HEAD_DIM"] > d
            fusion = consts.pop("enable_fp_fusion")
            kernel = fwd.FWD_TUNERS[tuning.space]
            cfg = _configs(kernel, consts, False)[0]
            yield (name, tname, d, "fwd", cfg), kernel, {**consts, **cfg.kwargs}, _options(cfg, fusion)
            _, bconsts, _, _ = kernels.bwd_plan(n, d, True, kp, d ** -0.5, torch.bfloat16, torch.bfloat16, None,
                                                False, tuning)
            bconsts = {key: dict(c) for key, c in bconsts.items()}
            fusion = bconsts["kv"]["enable_fp_fusion"]
            for c in bconsts.values():
                c.pop("enable_fp_fusion")
            if tuning.bwd == "dq_atomic":
                kv = dict(bconsts["kv"])
                yield from _dqa_variants(name, tname, d, kv, bool(tuning.tma), tuning.space, False, fusion)
                kinds = []
            else:
                kinds = [("dkdv", bwd.DKDV_TUNERS[(tuning.space, tuning.bwd == "atomic")], bconsts["kv"])]
            if tuning.bwd == "fused":
                kinds.append(("fused", bwd.FUSED_TUNERS[tuning.space], bconsts["fused"]))
            elif tuning.bwd == "split":
                kinds.append(("dq", bwd.DQ_TUNERS[tuning.space], bconsts["dq"]))
            if kp.delta == "dP.P":
                kinds.append(("dpp", bwd.DQ_TUNERS[tuning.space], bconsts["dpp"]))
            for kern, kernel, c in kinds:
                cfg = _configs(kernel, c, False)[0]
                yield (name, tname, d, kern, cfg), kernel, {**c, **cfg.kwargs}, _options(cfg, fusion)
            delta = dict(HEAD_DIM=consts["HEAD_DIM"], D_VALID=d, BLOCK_M=64, PROD=kernels.TL["fp32"],
                         ZERO_DQ=tuning.bwd in ("atomic", "dq_atomic"))
            cfg = triton.Config({}, num_warps=4, num_stages=1)
            yield (name, tname, d, "delta", cfg), bwd._bwd_delta_dot, delta, _options(cfg, fusion)


def _quick_variants():
    want = {(p, t, k, d) for p, t, k, ds in QUICK for d in ds}
    policies = {p: POLICIES[p] for p, _, _, _ in QUICK}
    tunings = tuple(dict.fromkeys(t for _, t, _, _ in QUICK))
    for v in variants(policies, tunings):
        (name, tname, d, kern, _), *_ = v
        if (name, tname, kern, d) in want:
            yield v


def main(argv=None) -> int:
    """Compile every variant (or, with --quick, one per code path and lever); fail when one does not compile, does
    not fit in shared memory, or has neither asynchronous copies nor TMA loads (its loads would not be pipelined).
    Variants that compile to the same kernel (same constexprs and options) are compiled once."""
    args = sys.argv[1:] if argv is None else argv
    quick = "--quick" in args
    dims = [a.partition("=")[2] for a in args if a.startswith("--head-dims")]
    if dims:
        source = padded_variants(tuple(int(d) for d in dims[0].split(","))) if dims[0] else padded_variants()
    else:
        names = [a.partition("=")[2] for a in args if a.startswith("--tunings=")]
        chosen = tuple(names[0].split(",")) if names else tuple(TUNINGS)
        source = _quick_variants() if quick else variants(POLICIES, chosen, every=True)
    failed, seen = 0, set()
    for (name, tname, d, kern, cfg), fn, consts, options in source:
        same = (kern, tuple(sorted((k, str(v)) for k, v in consts.items())), tuple(sorted(options.items())))
        if same in seen:
            continue
        seen.add(same)
        label = f"{name:15s} {tname:7s} d={d:3d} {kern:4s} {str(cfg.kwargs):30s} w{cfg.num_warps} s{cfg.num_stages}" \
                f"{' r' + str(cfg.maxnreg) if cfg.maxnreg else ''}"
        try:
            r = compile_one(fn, consts, options)
        except Exception as e:  # report every variant, then fail
            failed += 1
            print(f"{label}  FAILED: {type(e).__name__}: {str(e).splitlines()[-1][:200]}", flush=True)
            continue
        bad = [] if r["shared"] <= SMEM_LIMIT else ["over the shared-memory limit"]
        bad += [] if (r["cp_async"] or r["tma"] or kern in ("delta", "dqep")) else ["no asynchronous copies (loads "
                                                                                    "not pipelined)"]
        if kern == "dqa":   # the five-matmul backward's dQ adds: TMA reduce-adds with DESC_ATOMIC, else atomics
            bad += [] if (r["tma_reduce"] if consts["DESC_ATOMIC"] else r["atomics"]) else ["no dQ reduce-adds"]
        failed += bool(bad)
        adds = f", {r['tma_reduce']} TMA reduce-adds, {r['atomics']} atomics" if kern == "dqa" else ""
        print(f"{label}  shared memory {r['shared']:6d} B, {r['cp_async']:3d} async copies, {r['tma']:3d} TMA loads"
              + adds + (f"  FAILED: {'; '.join(bad)}" if bad else ""), flush=True)
    print(f"{len(seen)} variants, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
