#!/bin/bash
# Call 1 of 2026-12-07: the split's gpu-marked tests not reached on 2026-12-06 (three pytest processes side by side:
# compilation is the cost, 16 cores), and beside them the cross-card reruns of dial_training (one stored run per
# arm, 300 steps, bit for bit against the H100 runs).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 LPFAIL_KERNELS_AUTOTUNE=0
OUT=${OUT:-/tmp/lpfail_out}; mkdir -p $OUT
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
  python3 -c "import torch,triton,sys;print('python',sys.version.split()[0],'torch',torch.__version__,'triton',triton.__version__)"; } > $OUT/gpu.txt 2>&1
( timeout 260 python3 tools/cross_card.py $OUT dial_training --budget 210 > $OUT/cross_card.log 2>&1; echo "rc $?" >> $OUT/cross_card.log ) &
t() { timeout 270 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 -rfE "$@"; echo "rc $?"; }
t tests/test_kernels_head_dims.py > $OUT/tests_head_dims.log 2>&1 &
t tests/test_dropin.py tests/test_robust_fix.py > $OUT/tests_dropin.log 2>&1 &
t tests/test_prod_kernels.py tests/test_model.py > $OUT/tests_prod_model.log 2>&1 &
wait
cat $OUT/gpu.txt; for f in $OUT/tests_*.log; do echo "== $f"; grep -E "passed|failed|FAILED|ERROR|^rc" $f | tail -6; done
echo "== cross_card"; tail -16 $OUT/cross_card.log
