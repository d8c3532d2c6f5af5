"""Host-side cost of one attention call (a diagnostic for the kernel notes, not a stored result).

Times N back-to-back calls on a tiny problem, so that the GPU finishes each kernel long before the host issues
the next: the wall time per call is then the launch path's host cost. Run on a GPU:
``python tools/gpu_overhead.py OUT.json``.
"""
from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels
from lpfail.precision import FA2_BF16


def per_call_us(fn, calls=400, warmup=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t0) / calls


def main(path):
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "shape": [1, 1, 128, 64], "calls": 400}
    with torch.no_grad():
        out["triton_fwd_us"] = per_call_us(lambda: kernels.flash_attention(q, k, v, FA2_BF16, causal=True))
        out["triton_fix_fwd_us"] = per_call_us(
            lambda: kernels.flash_attention(q, k, v, FA2_BF16.with_fix(), causal=True))
        # the drop-in (SDPA-style keywords, through the torch.library custom op), without and with the robust fix
        out["dropin_fwd_us"] = per_call_us(lambda: kernels.flash_attention(q, k, v, is_causal=True))
        out["dropin_robust_fwd_us"] = per_call_us(lambda: kernels.flash_attention(q, k, v, is_causal=True,
                                                                                  fix="robust"))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out["sdpa_flash_fwd_us"] = per_call_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out["sdpa_cudnn_fwd_us"] = per_call_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    json.dump(out, open(path, "w"), indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
