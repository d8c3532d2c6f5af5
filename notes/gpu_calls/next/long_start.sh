#!/bin/bash
# Issue 39's long horizon: the dial's 25 runs of 10,000 steps at 8e-3 (notes/gpu_plan.md), first call of a session.
#   LPFAIL_GIT=<commit> BUDGET=<driver seconds> [PARALLEL=13] bash notes/gpu_calls/next/long_start.sh
# 1. A smoke test of the δ signature on the card (a long run's config, 3 steps, delta every step: one record per
#    step with finite sums), ≈ 20 s; the driver is not started if it fails.
# 2. The driver for dial_training (only the long runs are missing), PARALLEL at a time.
# 3. A wait that ends this call in time; later calls: `bash tools/gpu.sh wait dial_training --wait S`.
set -u
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
PYTHONPATH=$PWD LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 120 python3 notes/gpu_calls/next/delta_smoke.py > $OUT/a/smoke.log 2>&1
rc=$?; echo "smoke rc $rc"; tail -3 $OUT/a/smoke.log
[ $rc -eq 0 ] || exit 1
# PARALLEL at a time from the start (on 2026-12-07 the control file, written after `start`, came too late: the
# driver had already started 12)
LPFAIL_SWEEP_PARALLEL=${PARALLEL:-13} bash tools/gpu.sh start dial_training --budget ${BUDGET:-1300} > $OUT/a/start.log 2>&1
echo "start rc $? (${PARALLEL:-13} at a time)" >> $OUT/a/start.log; tail -4 $OUT/a/start.log
W=$(( ${CALL_LEFT:-570} - SECONDS )); [ $W -gt 30 ] || W=30  # CALL_LEFT: a caller that spent part of the call
bash tools/gpu.sh wait dial_training --wait $W 2>&1 | tail -8
