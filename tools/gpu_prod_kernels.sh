#!/bin/bash
# Chapter 6's GPU measurements in one device call (issue 14):
#   1. prod_kernels: the bias of SDPA's flash / cuDNN / memory-efficient / math back ends, the Triton kernel
#      (sub, fma), the reference and the mimics on chapter 4's tied rows; back ends that cannot run are
#      recorded with their error (results/prod_kernels.{json,npz} under $OUT)
#   2. the monitor's overhead on GPT-2 small (tools/gpu_monitor_overhead.py → $OUT/monitor_overhead.json)
#   3. the gpu-marked tests of the new modules
# Run `kernels` alone in its own call if `all` would pass the 10-minute limit of one device call.
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> bash tools/gpu_prod_kernels.sh [all|kernels|overhead|tests]
# Expected cost: prod_kernels ≈ 2–4 min (23 points × 1000 rows × 13 methods; the Triton kernel compiles two
# variants), overhead ≈ 2 min, tests < 1 min: one call of ≈ 8 device-minutes with start-up.
# Then here: cp $OUT/results/prod_kernels.* results/ and $OUT/monitor_overhead.json results/kernels_gpu/ (not an experiment of the cache).
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/lpfail_out}
WHAT=${1:-all}
mkdir -p "$OUT/results"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used,temperature.gpu --format=csv 2>&1 | tee "$OUT/nvsmi.txt"
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/nvsmi.txt"
if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_prod_kernels.py tests/test_monitor.py \
    tests/test_substitute.py tests/test_cures.py 2>&1 | tee "$OUT/tests.txt" | tail -15
fi
if [ "$WHAT" = all ] || [ "$WHAT" = kernels ]; then
  # TF32 off: the reference and the mimics need true FP32 matmuls (the reference checks it)
  LPFAIL_RESULTS_DIR=$OUT/results timeout 540 python3 -m lpfail run prod_kernels 2>&1 | tee "$OUT/prod_kernels.txt" | tail -20
  LPFAIL_RESULTS_DIR=$OUT/results python3 -c "
from lpfail import results
from lpfail.experiments.prod_kernels import summary
res = results.load('prod_kernels')
for r in summary(res):
    print(r)
print({k: float(res[k]) for k in res if k.startswith('match_') and float(res[k]) > 0.5})" 2>&1 | tee "$OUT/prod_kernels_summary.txt"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = overhead ]; then
  # deterministic kernels (and cuBLAS workspace), so that plain vs plain is equal and plain vs monitored
  # measures the monitor alone; 610 steps = 6 sampled steps at the default every=100 (≈ 3 × 21 s of GPU time);
  # OVERHEAD_ARGS="--steps 210 --every 10 --window 50" measures the old interval
  CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 300 python3 tools/gpu_monitor_overhead.py "$OUT/monitor_overhead.json" \
      ${OVERHEAD_ARGS:---steps 610} 2>&1 | tail -30
fi
