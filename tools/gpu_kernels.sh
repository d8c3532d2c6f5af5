#!/bin/bash
# One device call for the Triton kernels: GPU tests, then the benchmark (results cache under $OUT).
# Usage (on the GPU machine, from the repo root): LPFAIL_GIT=<commit> bash tools/gpu_kernels.sh [tests|bench|check|tune|all] [test timeout s]
# (tune: issue 25's lever checks and timings, tools/gpu_kernels_tune.py, alone: ≈ 4–6 min; TUNE_ARGS passes options)
# (the device copy of the tree has no .git: pass the commit so the stored results name it)
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/lpfail_out}
mkdir -p "$OUT"
WHAT=${1:-all}
TEST_TIMEOUT=${2:-200}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee "$OUT/nvsmi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/nvsmi.txt"
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  # the gpu-marked tests, then a CPU-suite test that matters most on the card (scores in units of α, bit for bit)
  LPFAIL_KERNELS_AUTOTUNE=0 timeout "$TEST_TIMEOUT" python3 -m pytest -q -s -p no:cacheprovider \
    $(ls tests/test_kernels.py tests/test_kernels_bwd.py tests/test_robust_fix.py tests/test_dropin.py 2>/dev/null) ${PYTEST_ARGS:--m gpu} 2>&1 | tee "$OUT/tests.txt" | grep -v "^$" | tail -60
  LPFAIL_KERNELS_AUTOTUNE=0 timeout "$TEST_TIMEOUT" python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernels.py ${PYTEST_ARGS2:--k "units_of_alpha or raw_threshold or masked_out or raw_products"} 2>&1 | tee -a "$OUT/tests.txt" | tail -5
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  timeout 60 python3 tools/gpu_overhead.py "$OUT/overhead.json" 2>&1 | tail -3
  LPFAIL_RESULTS_DIR=$OUT timeout 420 python3 -m lpfail run bench_kernels ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
  LPFAIL_RESULTS_DIR=$OUT python3 -c "
from lpfail import results; from kernels.bench import table
print(table(results._read('bench_kernels', results.results_dir())))" 2>&1 | tee "$OUT/table.txt"
fi
if [ "$WHAT" = tune ]; then
  OUT=$OUT timeout 560 python3 tools/gpu_kernels_tune.py ${TUNE_ARGS:---budget 520} 2>&1 | tail -150
fi
if [ "$WHAT" = check ] || [ "$WHAT" = all ]; then
  # the symptom search's kernel check (20 training steps, Triton vs the reference) for A (PAPER_BF16) and D
  timeout 200 python3 -c "
import json
from lpfail.experiments.symptom import SymptomConfig, checks
out = checks(SymptomConfig(variants=('A', 'D')), '/tmp/lpfail_kernel_check')
json.dump(out, open('$OUT/kernel_check.json', 'w'), indent=1)" 2>&1 | grep -v '^$' | tail -8
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$OUT/nvsmi.txt"
