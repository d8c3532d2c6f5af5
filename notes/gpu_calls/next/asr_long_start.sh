#!/bin/bash
# Issue 38's last 16 A_sr runs (lr_sweep large) and, beside them, LONG of the dial's long runs (issue 39), in one
# driver: lr_sweep's 16 first in its queue, then the dial's long runs by seed (seed 20's five arms first).
#   LPFAIL_GIT=<commit> BUDGET=<driver seconds> LONG=<0..25> bash notes/gpu_calls/next/asr_long_start.sh
# The driver starts 16 + LONG at once; once any run has finished, its pace check (seconds per step of the finished
# runs × 10,000 steps) starts no further long run that cannot end before the deadline. A δ-signature smoke test
# (long_start.sh's) runs first when LONG > 0; the driver is not started if it fails.
set -u
LONG=${LONG:-5}
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
date -u >> $OUT/a/gpu.txt
if [ "$LONG" -gt 0 ]; then
PYTHONPATH=$PWD LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 120 python3 notes/gpu_calls/next/delta_smoke.py > $OUT/a/smoke.log 2>&1
rc=$?; echo "smoke rc $rc"; tail -3 $OUT/a/smoke.log
[ $rc -eq 0 ] || LONG=0
fi
if [ "$LONG" -gt 0 ]; then NAMES="lr_sweep dial_training"; else NAMES="lr_sweep"; fi
LPFAIL_SWEEP_PARALLEL=$(( 16 + LONG )) bash tools/gpu.sh start $NAMES --budget ${BUDGET:-1300} > $OUT/a/start.log 2>&1
echo "start rc $? ($NAMES, $(( 16 + LONG )) at a time)" >> $OUT/a/start.log; tail -4 $OUT/a/start.log
W=$(( 570 - SECONDS )); [ $W -gt 30 ] || W=30
bash tools/gpu.sh wait $NAMES --wait $W 2>&1 | tail -8
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
