#!/bin/bash
# Issue 42 on an H200 (calls 15–16 of 2026-12-07 again, on the card the issue names), on an idle card, first call:
#   LPFAIL_GIT=<commit> bash notes/gpu_calls/next/k42_h200.sh
# 1. tools/gpu_kernels_tune.py --focus dropin (the drop-in's fused and five-matmul backwards, with and without the
#    robust fix, beside cuDNN and SDPA flash), ≈ 170 s on an H100;  2. the training-step benchmark (bench_step),
#    stored under $OUT/results, ≈ 140 s on an H100.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0
mkdir -p $OUT/tune $OUT/results
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader; } > $OUT/gpu.txt 2>&1
OUT=$OUT/tune timeout 300 python3 tools/gpu_kernels_tune.py --focus dropin --budget 270 > $OUT/tune/tune.log 2>&1
echo "tune rc $?"; tail -22 $OUT/tune/summary.txt 2>/dev/null || tail -20 $OUT/tune/tune.log
LPFAIL_RESULTS_DIR=$OUT/results timeout $(( 585 - SECONDS )) python3 -m lpfail bench step > $OUT/step.log 2>&1
echo "step rc $?"; grep -v Warning $OUT/step.log | tail -12
