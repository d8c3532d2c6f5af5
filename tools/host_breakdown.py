"""Where the drop-in's host time per call goes, measured on a machine WITHOUT a GPU (CPU-side Python time of
this machine, not the H200's host): ``python tools/host_breakdown.py [OUT.json]``.

The kernels cannot launch here, so every launch is replaced: (a) by nothing, which times our own Python (the
argument checks, the policy lookups, the custom op's dispatch and autograd, the output allocation, the
launch bookkeeping), and (b) by an emulation of `triton.runtime.jit.JITFunction.run`'s Python up to the C
launcher — its argument binder (built for an sm_90 target), the cache key, the kernel-cache lookup, the used
globals' check and the grid — which is what each launch adds on the GPU before the driver call itself, and
(c) by `kernels.launch`'s direct path (since 2026-12-01) into a stand-in compiled kernel whose launcher does
nothing (the C launcher and CUDA's allocations are in none of these numbers). Run it with
``PYTHONPATH=<a checkout>`` to time that checkout's `kernels` (notes/fix.md compares main and a branch). Tensors
are CPU tensors (the device check is let through by patching `interpreted`); the policies are the
drop-in's BF16 ones, so the kernels' constexprs are the H200's.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from lpfail import kernels
from lpfail.kernels import bwd as _bwd
from lpfail.kernels import fwd as _fwd

CALLS, REPEATS = 2000, 7


def per_call_us(fn, calls=CALLS, repeats=REPEATS):
    """Median over `repeats` of the mean time of `calls` back-to-back calls, in µs."""
    for _ in range(200):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(out)


def _emulated_jit(jit):
    """JITFunction.run's Python for a cached kernel, without the driver calls and the C launcher."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    binder = create_function_from_signature(jit.signature, jit.params, make_backend(GPUTarget("cuda", 90, 32)))
    key_cache, kernel_cache = {}, {}

    def run(*args, grid, warmup, **kwargs):
        kwargs["debug"] = kwargs.get("debug", jit.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound_args, specialization, options = binder(*args, **kwargs)
        key = compute_cache_key(key_cache, specialization, options)
        kernel_cache.get(key, None)
        not_present = object()
        for (name, _), (val, globals_dict) in jit.used_global_vals.items():
            if globals_dict.get(name, not_present) != val:
                raise RuntimeError(name)
        grid = grid(bound_args) if callable(grid) else grid
        tuple(bound_args.values())
        return None
    return run


class _Stub:
    """Stands for a JIT function or autotuner: `fn.run` and `[grid](...)` do `run` (nothing, or the emulation)."""

    def __init__(self, run, best):
        self.fn, self.best_config = self, best
        self.run = run
        if best is not None:
            self.configs = [best]   # an autotuner (kernels.launch tells them apart by this)

    def __getitem__(self, grid):
        cfg = self.best_config.all_kwargs() if self.best_config is not None else {}  # as the autotuner does
        return lambda *a, **kw: self.run(*a, grid=grid, warmup=False, **kw, **cfg)


class _Compiled:
    """Stands for a compiled kernel in `kernels.DIRECT`: its launcher does nothing (the C launch is not timed)."""
    function, packed_metadata = 0, ()

    def run(self, *args):
        return None

    def launch_metadata(self, *args):
        return None


class _Driver:
    get_current_device = staticmethod(lambda: 0)
    get_current_stream = staticmethod(lambda idx: 0)



def measure(mode: str) -> dict:
    """mode "none": launches do nothing; "jit": launches run the emulated JIT binding; "direct": from the
    second call on, `kernels.launch` takes its direct path to a stand-in compiled kernel (if this code has it)."""
    import triton
    orig = {name: getattr(mod, name) for mod, name in ((_fwd, "_attn_fwd"), (_bwd, "_bwd_dkdv"), (_bwd, "_bwd_dq"),
                                                       (_bwd, "_bwd_delta_dot"))}
    cfg = triton.Config({"BLOCK_M": 64}, num_warps=4, num_stages=3)
    cfg_kv = triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3)

    def stub(kernel, best):
        jit = kernel.fn if hasattr(kernel, "best_config") or hasattr(kernel, "configs") else kernel
        run = _emulated_jit(jit) if mode != "none" else (lambda *a, **kw: None)
        return _Stub(run, best)

    for mod, name in ((_fwd, "_attn_fwd"), (_bwd, "_bwd_dkdv"), (_bwd, "_bwd_dq"), (_bwd, "_bwd_delta_dot")):
        setattr(mod, name, stub(orig[name], {"_attn_fwd": cfg, "_bwd_delta_dot": None}.get(name, cfg_kv)))
    # the other autotune spaces' tuners (the default tuning since 2026-12-04 runs the sm90 space and the fused
    # backward): each stands in with its own first config, as LPFAIL_KERNELS_AUTOTUNE=0 would pick
    tuner_dicts = [getattr(mod, name) for mod, name in ((_fwd, "FWD_TUNERS"), (_bwd, "DQ_TUNERS"),
                                                        (_bwd, "DKDV_TUNERS"), (_bwd, "FUSED_TUNERS"))
                   if hasattr(mod, name)]
    orig_tuners = [dict(d) for d in tuner_dicts]
    for d in tuner_dicts:
        for key, tuner in d.items():
            d[key] = stub(tuner, tuner.configs[0])
    for fx in (None, "robust"):   # the policy memo, filled while the device check still sees no interpreter
        pol, txt = kernels.SDPA_POLICIES[(torch.bfloat16, fx)]
        kernels.policy_for_launch(pol), kernels.policy_for_launch(kernels.parse_policy(txt))
    # the device check reads `interpreted` from lpfail.kernels.runtime (from the package itself where it is one file)
    home = getattr(kernels, "runtime", kernels)
    interpreted = home.interpreted
    home.interpreted = lambda: True             # let CPU tensors through the device check (after the policy memo)
    kernels.PICKS.clear()
    try:
        q, k, v, do = (torch.randn(1, 1, 128, 64, dtype=torch.bfloat16) for _ in range(4))
        text = kernels.SDPA_POLICIES[(torch.bfloat16, None)][1]
        policy = kernels.SDPA_POLICIES[(torch.bfloat16, None)][0]
        kp = kernels.policy_for_launch(policy)
        scale = 0.125
        r = {}
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        for _ in range(3):   # fill the picks (and, where the code has it, the direct launches)
            for fx in (None, "robust"):
                kernels.flash_attention(qg, kg, vg, is_causal=True, fix=fx).backward(do)
                with torch.no_grad():
                    kernels.flash_attention(q, k, v, is_causal=True, fix=fx)
                    kernels.flash_attention(q, k, v, policy, causal=True)
            kernels.launch_backward(do, q, k, v, q, q[..., 0].float(), kp, True, scale)
        direct = getattr(kernels, "DIRECT", None)
        if mode == "direct":
            if direct is None:
                return {}
            from triton import knobs
            for (kern, key), cfg in kernels.PICKS.items():
                direct[(kern, key)] = (_Compiled(), (), cfg.all_kwargs() if cfg is not None else {}, _Driver,
                                       knobs.runtime)
        with torch.no_grad():
            r["dropin_fwd"] = per_call_us(lambda: kernels.flash_attention(q, k, v, is_causal=True))
            r["dropin_robust_fwd"] = per_call_us(lambda: kernels.flash_attention(q, k, v, is_causal=True,
                                                                                 fix="robust"))
            r["custom_op_call"] = per_call_us(lambda: torch.ops.lpfail.flash_attention_fwd(q, k, v, text, True, scale))
            r["op_body"] = per_call_us(lambda: kernels.launch_forward(
                q.contiguous(), k.contiguous(), v.contiguous(), kernels.policy_for_launch(kernels.parse_policy(text)),
                True, scale))
            r["policy_lookups"] = per_call_us(lambda: kernels.policy_for_launch(kernels.parse_policy(text)))
            r["forward_fn"] = per_call_us(lambda: kernels.launch_forward(q, k, v, kp, True, scale))
            r["two_empty"] = per_call_us(lambda: (torch.empty((1, 1, 128, 64), dtype=torch.bfloat16),
                                                  torch.empty((1, 1, 128), dtype=torch.float32)))
            r["check_inputs"] = per_call_us(lambda: kernels.check_inputs(q, k, v))
            r["policy_style_fwd"] = per_call_us(lambda: kernels.flash_attention(q, k, v, policy, causal=True))
        def fwd_bwd():
            kernels.flash_attention(qg, kg, vg, is_causal=True).backward(do)
        r["dropin_fwd_bwd"] = per_call_us(fwd_bwd, calls=CALLS // 4)
        r["backward_fn"] = per_call_us(
            lambda: kernels.launch_backward(do, q, k, v, q, q[..., 0].float(), kp, True, scale))
        from gpu_overhead import noop_attention   # (tools/ is on sys.path when this script runs)
        r["noop_function_fwd_bwd"] = per_call_us(lambda: noop_attention(qg, kg, vg).backward(do), calls=CALLS // 4)
        return {key: round(val, 2) for key, val in r.items()}
    finally:
        for mod, name in ((_fwd, "_attn_fwd"), (_bwd, "_bwd_dkdv"), (_bwd, "_bwd_dq"), (_bwd, "_bwd_delta_dot")):
            setattr(mod, name, orig[name])
        for d, o in zip(tuner_dicts, orig_tuners):
            d.update(o)
        home.interpreted = interpreted
        kernels.PICKS.clear()
        if hasattr(kernels, "DIRECT"):
            kernels.DIRECT.clear()


def main(path=None):
    out = {"what": "CPU-side Python time per call of the drop-in on the machine that ran this (launches stubbed;"
                   " not the GPU host's time)",
           "shape": [1, 1, 128, 64], "dtype": "bf16", "causal": True, "torch": torch.__version__,
           "calls": CALLS, "repeats": REPEATS,
           "stubbed": measure("none"), "with_jit_binding": measure("jit"), "direct": measure("direct")}
    text = json.dumps(out, indent=1)
    print(text)
    if path:
        open(path, "w").write(text + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.exit(f"usage: python tools/host_breakdown.py [OUT.json] (got {' '.join(args)!r}; an option is not a path)")
    main(*args)
