#!/bin/bash
# The rerun check (issue 38) in a short lease: its rows for this card, within the lease left (LPFAIL_RERUN_BUDGET).
#   T0=<epoch s of the call> LEFT0=<lease s then> LPFAIL_GIT=<commit> bash notes/gpu_calls/next/rerun_short.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8
LEFT=$(( LEFT0 - ($(date +%s) - T0) )); B=$(( (LEFT < 590 ? LEFT : 590) - 80 ))
mkdir -p $OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; echo "lease ≈ $LEFT s: rerun budget $B s"; } > $OUT/r/rerun.log 2>&1
cat $OUT/r/rerun.log
[ $B -ge 60 ] || { echo "too little lease left"; exit 1; }
# not LPFAIL_RESULTS_DIR=$OUT/r: the grids read lr_sweep etc. from the results folder (2026-12-07: 'no stored
# result lr_sweep'); the result is written into the checkout's results/ and copied out
LPFAIL_RERUN_BUDGET=$B timeout $(( B + 45 )) python3 -m lpfail run rerun_check >> $OUT/r/rerun.log 2>&1; rc=$?; cp results/rerun_check.json results/rerun_check.npz $OUT/r/ 2>/dev/null
echo "rerun_check rc $rc ($SECONDS s)"; grep -E "rerun check:|: different|: failed" $OUT/r/rerun.log | tail -12; ls $OUT/r
