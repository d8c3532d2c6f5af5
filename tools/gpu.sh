#!/bin/bash
# Grids of training runs on a GPU machine, across device calls (lpfail/sweep/session.py says how). The runs of
# every grid come from Python (`python -m lpfail sweep NAME plan`), never from this script.
#   LPFAIL_GIT=<commit> bash tools/gpu.sh start NAME... [--budget S] [--checks]   one driver for every NAME, detached
#   bash tools/gpu.sh wait NAME... [--wait S]      progress every 60 s, then $OUT/grids.tgz (new parts, checks, log)
#   bash tools/gpu.sh collect                      $OUT/grids.tgz now
#   LPFAIL_GIT=<commit> bash tools/gpu.sh quick NAME...   each grid's quick profile in turn → $OUT/quick.tgz
# LPFAIL_GIT: the commit of the tree sent, computed where it was committed (the device's copy of .git may differ).
# Here, afterwards: `python -m lpfail.sweep.session unpack grids.tgz` (or quick.tgz), then
# `python -m lpfail sweep NAME collect`. Plans, predictions and call logs: notes/gpu_plan.md.
set -o pipefail
# LPFAIL_CPU_PINS=0: the machine's own CPU kernels, as every stored GPU run had them (lpfail.numerics.OFF_VAR)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 LPFAIL_CPU_PINS=0
exec python3 -m lpfail.sweep.session "$@"
