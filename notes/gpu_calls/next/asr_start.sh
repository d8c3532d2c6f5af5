#!/bin/bash
# Issue 38's A_sr reruns, first call of a session (notes/gpu_plan.md, queue item 1). Usage on the device:
#   LPFAIL_GIT=<commit> BUDGET=<driver seconds> [CROSS_CARD=<seconds>] bash notes/gpu_calls/next/asr_start.sh
# The 13 runs stored in call 17 (2026-12-07) go in first, so that the driver trains only the 65 left; then the
# driver for both grids, detached, and a wait that ends this call in time. Later calls: `bash tools/gpu.sh wait
# confirmation lr_sweep --wait S`.
set -u
mkdir -p $OUT/a $OUT/cc
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
PYTHONPATH=$PWD python3 -m lpfail.sweep.session unpack notes/gpu_calls/20261207/call17/grids.tgz > $OUT/a/unpack.log 2>&1
echo "unpack rc $?" >> $OUT/a/unpack.log; tail -2 $OUT/a/unpack.log
bash tools/gpu.sh start confirmation lr_sweep --budget ${BUDGET:-1350} > $OUT/a/start.log 2>&1
echo "start rc $?" >> $OUT/a/start.log; tail -4 $OUT/a/start.log
if [ -n "${CROSS_CARD:-}" ]; then  # on an H200: do the dial's H100 runs reproduce here? (tools/cross_card.py)
  PYTHONPATH=$PWD LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 tools/cross_card.py $OUT/cc dial_training \
    --budget ${CROSS_CARD} > $OUT/cc/log.txt 2>&1 || true; tail -14 $OUT/cc/log.txt
fi
W=$(( 570 - SECONDS )); [ $W -gt 30 ] || W=30
bash tools/gpu.sh wait confirmation lr_sweep --wait $W 2>&1 | tail -8
