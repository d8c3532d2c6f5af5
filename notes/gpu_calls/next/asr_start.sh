#!/bin/bash
# Issue 38's A_sr reruns, first call of a session (notes/gpu_plan.md, queue item 1). Usage on the device:
#   LPFAIL_GIT=<commit> BUDGET=<driver seconds> bash notes/gpu_calls/next/asr_start.sh
# The 13 runs stored in call 17 (2026-12-07) go in first, so that the driver trains only the 65 left; then the
# driver for both grids, detached, and a wait that ends this call in time. Later calls: `bash tools/gpu.sh wait
# confirmation lr_sweep --wait S`.
set -u
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
PYTHONPATH=$PWD python3 -m lpfail.sweep.session unpack notes/gpu_calls/20261207/call17/grids.tgz > $OUT/a/unpack.log 2>&1
echo "unpack rc $?" >> $OUT/a/unpack.log; tail -2 $OUT/a/unpack.log
bash tools/gpu.sh start confirmation lr_sweep --budget ${BUDGET:-1350} > $OUT/a/start.log 2>&1
echo "start rc $?" >> $OUT/a/start.log; tail -4 $OUT/a/start.log
W=$(( 570 - SECONDS )); [ $W -gt 30 ] || W=30
bash tools/gpu.sh wait confirmation lr_sweep --wait $W 2>&1 | tail -8
