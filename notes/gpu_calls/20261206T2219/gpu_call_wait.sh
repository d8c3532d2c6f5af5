#!/bin/bash
# Calls 12–13 (untracked; deleted after the session): wait for the alarm grid's driver, collect.
set -u
mkdir -p $OUT/a
bash tools/gpu.sh wait precision_alarm_fresh --wait ${1:-540} 2>&1 | tail -8
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
ls -la $OUT
