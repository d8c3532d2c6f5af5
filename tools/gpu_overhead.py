"""Host-side cost of one attention call, issue 13's "host time per call of a tiny problem" (target ≤ 40 µs).

Times N back-to-back calls on a tiny problem (B = 1, H = 1, N = 128, d = 64, BF16, causal), so that the GPU
finishes each kernel long before the host issues the next: the wall time per call is then the launch path's host
cost. Measured: the drop-in (`kernels.flash_attention(q, k, v, is_causal=True)`, without and with the robust
fix), the policy-style call, and SDPA (flash and cuDNN backends), each forward alone (no_grad) and forward +
backward (`torch.autograd.grad`, no gradient accumulation), and the floor of a Python autograd.Function that
launches nothing (`NoOpAttention`); the drop-in both with the direct launch of the
compiled kernels (LPFAIL_KERNELS_DIRECT=1; the default since this bit check passed on an H200 on 2026-12-01) and
through Triton's JIT (LPFAIL_KERNELS_DIRECT=0), with a bit check that both paths give the same O, dQ, dK, dV. Run on a GPU, repo root:
``LPFAIL_GIT=<commit> PYTHONPATH=$PWD python3 tools/gpu_overhead.py OUT.json`` (gpu_batch.sh step `host`);
the JSON carries its provenance (card, UTC time, commit, torch, triton).
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lpfail import kernels
from lpfail import results
from lpfail.precision import FA2_BF16

SHAPE = (1, 1, 128, 64)
CALLS, REPEATS = 400, 5


def per_call_us(fn, calls=CALLS, warmup=50, repeats=REPEATS):
    """Median over `repeats` of the wall time per call of `calls` back-to-back calls (µs)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append(1e6 * (time.perf_counter() - t0) / calls)
    return round(statistics.median(out), 2)


class NoOpAttention(torch.autograd.Function):
    """The floor of any drop-in whose backward is Python: an `autograd.Function` that allocates O and L, saves them
    with Q, K, V, and in the backward allocates dQ, dK, dV, launching nothing. Its fwd+bwd per call is what the
    autograd engine's Python round trip costs (on CUDA tensors the backward runs on the engine's device thread)."""

    @staticmethod
    def forward(ctx, q, k, v, meta):
        o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.meta = meta
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


def noop_attention(q, k, v):
    return NoOpAttention.apply(q, k, v, (None, True, 0.125, None))


def _fwd_bwd(attn, q, k, v, do):
    def run():
        o = attn(q, k, v)
        return (o, *torch.autograd.grad(o, (q, k, v), do))
    return run


def _measure_dropin(q, k, v, do, qg, kg, vg):
    out = {}
    with torch.no_grad():
        out["fwd"] = per_call_us(lambda: kernels.flash_attention(q, k, v, is_causal=True))
        out["robust_fwd"] = per_call_us(lambda: kernels.flash_attention(q, k, v, is_causal=True, fix="robust"))
        out["policy_fwd"] = per_call_us(lambda: kernels.flash_attention(q, k, v, FA2_BF16, causal=True))
    out["fwd_bwd"] = per_call_us(_fwd_bwd(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True),
                                          qg, kg, vg, do))
    out["robust_fwd_bwd"] = per_call_us(_fwd_bwd(
        lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix="robust"), qg, kg, vg, do))
    return out


def main(path):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    import triton
    res = {"what": "host time per call of a tiny problem (issue 13, target <= 40 us): wall time per call of "
                   f"{CALLS} back-to-back calls, median of {REPEATS}",
           "device": torch.cuda.get_device_name(), "when_utc": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": results.git_commit(), "torch": torch.__version__,
           "triton": triton.__version__, "shape": list(SHAPE), "dtype": "bf16", "causal": True, "calls": CALLS,
           "repeats": REPEATS, "unit": "us"}
    os.environ[kernels.DIRECT_ENV] = "1"        # the direct launch (the default)
    ref = _fwd_bwd(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True), qg, kg, vg, do)
    res["dropin"] = _measure_dropin(q, k, v, do, qg, kg, vg)
    res["direct_launches"] = len(kernels.DIRECT)
    first = [t.clone() for t in ref()]           # direct path (after the warm-up above)
    os.environ[kernels.DIRECT_ENV] = "0"        # the JIT path for every launch, as before
    kernels.DIRECT.clear()
    kernels.PICKS.clear()
    res["dropin_jit_path"] = _measure_dropin(q, k, v, do, qg, kg, vg)
    second = ref()
    res["direct_equals_jit_bits"] = all(torch.equal(a, b) for a, b in zip(first, second))
    del os.environ[kernels.DIRECT_ENV]
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:   # (a backend that refuses the shape must not cost the drop-in's numbers)
            with sdpa_kernel(backend):
                sdpa = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True)  # noqa: E731
                with torch.no_grad():
                    fwd = per_call_us(lambda: sdpa(q, k, v))
                res[name] = {"fwd": fwd, "fwd_bwd": per_call_us(_fwd_bwd(sdpa, qg, kg, vg, do))}
        except RuntimeError as e:
            res[name] = {"error": str(e)[:300]}
    with torch.no_grad():
        noop_fwd = per_call_us(lambda: noop_attention(q, k, v))
    res["noop_function"] = {"fwd": noop_fwd, "fwd_bwd": per_call_us(_fwd_bwd(noop_attention, qg, kg, vg, do)),
                            "what": "NoOpAttention: a Python autograd.Function that launches nothing (the floor)"}
    res["target_us"] = 40
    res["dropin_fwd_meets_target"] = res["dropin"]["fwd"] <= 40
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
