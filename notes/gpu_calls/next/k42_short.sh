#!/bin/bash
# Issue 42 on an H200 in a short lease (2026-12-07, fifth session): the stored training-step benchmark first
# (bench_step, ≈ 140 s on an H100), then the drop-in's tune (`--focus dropin`) for what is left of the call.
#   T0=<epoch s of the call> LEFT0=<lease s then> LPFAIL_GIT=<commit> bash notes/gpu_calls/next/k42_short.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0
LEFT=$(( LEFT0 - ($(date +%s) - T0) )); END=$(( LEFT < 585 ? LEFT - 25 : 585 ))
mkdir -p $OUT/tune $OUT/results
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader; echo "lease ≈ $LEFT s; call ends by $END s"; } > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
LPFAIL_RESULTS_DIR=$OUT/results timeout $(( END - SECONDS )) python3 -m lpfail bench step > $OUT/step.log 2>&1
echo "step rc $? ($SECONDS s)"; grep -v Warning $OUT/step.log | tail -12
T=$(( END - SECONDS - 20 ))
if [ $T -ge 60 ]; then
  OUT=$OUT/tune timeout $(( T + 15 )) python3 tools/gpu_kernels_tune.py --focus dropin --budget $T > $OUT/tune/tune.log 2>&1
  echo "tune rc $? ($SECONDS s)"; tail -22 $OUT/tune/summary.txt 2>/dev/null || tail -20 $OUT/tune/tune.log
fi
