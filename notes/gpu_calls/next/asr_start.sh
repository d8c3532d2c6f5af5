#!/bin/bash
# Issue 38's last A_sr reruns: lr_sweep's 16 large runs (notes/gpu_plan.md, queue item 1). Usage on the device:
#   LPFAIL_GIT=<commit> BUDGET=<driver seconds> [CROSS_CARD=<seconds>] bash notes/gpu_calls/next/asr_start.sh
# The driver for lr_sweep, 16 at a time (one wave), detached, and a wait that ends this call in time; later calls:
# `bash tools/gpu.sh wait lr_sweep --wait S`. CROSS_CARD: on an H200, tools/cross_card.py on the dial's H100 runs
# beside the driver.
set -u
mkdir -p $OUT/a $OUT/cc
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
LPFAIL_SWEEP_PARALLEL=16 bash tools/gpu.sh start lr_sweep --budget ${BUDGET:-420} > $OUT/a/start.log 2>&1
echo "start rc $?" >> $OUT/a/start.log; tail -4 $OUT/a/start.log
if [ -n "${CROSS_CARD:-}" ]; then  # on an H200: do the dial's H100 runs reproduce here? (tools/cross_card.py)
  PYTHONPATH=$PWD LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 tools/cross_card.py $OUT/cc dial_training \
    --budget ${CROSS_CARD} > $OUT/cc/log.txt 2>&1 || true; tail -14 $OUT/cc/log.txt
fi
W=$(( 570 - SECONDS )); [ $W -gt 30 ] || W=30
bash tools/gpu.sh wait lr_sweep --wait $W 2>&1 | tail -8
