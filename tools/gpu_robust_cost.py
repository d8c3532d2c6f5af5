"""The robust fix's cost in the Triton kernel (issue 13, item 6), on a GPU: the `robust_cost` experiment
(`kernels.bench.robust_cost`: alternating timings of the kernel without a fix against the same kernel with the
robust fix, and of Algorithm 3 against the robust fix, both modes, forward and forward + backward, causal BF16,
16k tokens per call, head dims 64 and 128, N 2048–8192), stored with provenance in the results folder given.

Usage (GPU machine, repo root): LPFAIL_GIT=<commit> PYTHONPATH=$PWD python3 tools/gpu_robust_cost.py $OUT
then copy $OUT/robust_cost.{json,npz} to results/. Expected cost: ≈ 2–3 minutes (measured 134 s on an H200,
2026-12-01: 12 shapes × 3 pairs × 2 modes × 60 alternating pairs, plus compiling).

The first measurement (2026-12-01, commit 23f8cd9) came from this script's earlier form, which wrote a bare
JSON; it was stored with `kernels.bench.import_robust_cost` (provenance from the device call's log)."""
from __future__ import annotations

import sys
from pathlib import Path

from lpfail import results


def main(out: str) -> int:
    res = results.run("robust_cost", results.get("robust_cost").default_config(), directory=Path(out))
    print(res.provenance)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
