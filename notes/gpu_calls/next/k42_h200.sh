#!/bin/bash
# Issue 42 on an H200 (calls 15–16 of 2026-12-07 again, on the card the issue names), on an idle card:
#   [T0=<epoch s of the call> LEFT0=<lease s then>] LPFAIL_GIT=<commit> bash notes/gpu_calls/next/k42_h200.sh
# 1. the training-step benchmark (bench_step), stored under $OUT/results, ≈ 140 s on an H100 — first, so that a
#    short lease still stores it;  2. tools/gpu_kernels_tune.py --focus dropin (the drop-in's fused and five-matmul
#    backwards, with and without the robust fix, beside cuDNN and SDPA flash), ≈ 170 s on an H100, budget 270 s or
#    what is left of the call. Without T0/LEFT0 the lease is taken to outlast the call (585 s).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0
LEFT=$(( ${LEFT0:-100000} - ($(date +%s) - ${T0:-$(date +%s)}) )); END=$(( LEFT < 610 ? LEFT - 25 : 585 ))
mkdir -p $OUT/tune $OUT/results
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader; echo "call ends by $END s"; } > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
LPFAIL_RESULTS_DIR=$OUT/results timeout $(( END - SECONDS )) python3 -m lpfail bench step > $OUT/step.log 2>&1
echo "step rc $? ($SECONDS s)"; grep -v Warning $OUT/step.log | tail -12
T=$(( END - SECONDS - 20 )); [ $T -le 270 ] || T=270
if [ $T -ge 60 ]; then
  OUT=$OUT/tune timeout $(( T + 15 )) python3 tools/gpu_kernels_tune.py --focus dropin --budget $T > $OUT/tune/tune.log 2>&1
  echo "tune rc $? ($SECONDS s)"; tail -22 $OUT/tune/summary.txt 2>/dev/null || tail -20 $OUT/tune/tune.log
fi
