"""The robust fix's cost in the Triton kernel (issue 13, item 6), on a GPU: alternating timings (as
`kernels.bench._time_paired`) of the kernel without a fix against the same kernel with the robust fix, and with
Algorithm 3 against the robust fix, in both modes, forward and forward + backward, causal BF16, 16k tokens per
call (width 2048), head dims 64 and 128, N 2048–8192. Writes one JSON file (path: the first argument).

Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 tools/gpu_robust_cost.py $OUT/robust_cost.json
Expected cost: ≈ 2–4 minutes (12 shapes × 3 pairs × 2 modes × 60 alternating pairs, plus compiling)."""
from __future__ import annotations

import json
import sys
import time

import torch

from kernels.bench import _method_fn, _time_paired

PAIRS = (("triton", "triton_robust"), ("triton_fma", "triton_fma_robust"), ("triton_fix", "triton_robust"))


def main(path: str, budget_s: float = 420.0) -> int:
    t0 = time.time()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "pairs": PAIRS, "rows": []}
    for d in (64, 128):
        for n in (2048, 4096, 8192):
            b, h = max(1, 16384 // n), 2048 // d
            g = torch.Generator(device="cuda").manual_seed(1000 * d + n)
            sets = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(i < 3)
                          for i in range(4)) for _ in range(3)]
            for a, bb in PAIRS:
                for mode in ("fwd", "fwd_bwd"):
                    if time.time() - t0 > budget_s:
                        out["rows"].append({"d": d, "n": n, "pair": [a, bb], "mode": mode, "error": "time budget"})
                        continue
                    ms_a, ms_b, ratio = _time_paired(_method_fn(a, True), _method_fn(bb, True), sets, mode, 60, 5)
                    row = {"d": d, "n": n, "pair": [a, bb], "mode": mode, "ms": [ms_a, ms_b],
                           "cost_pct": 100 * (ratio - 1)}
                    print(row, flush=True)
                    out["rows"].append(row)
    out["wall_s"] = round(time.time() - t0, 1)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "robust_cost.json"))
