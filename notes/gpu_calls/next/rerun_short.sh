#!/bin/bash
# The rerun check (issue 38): its rows for this card within a budget (LPFAIL_RERUN_BUDGET), the result copied into
# $OUT/r (copy it into results/ here). The budget: from the lease left when T0 and LEFT0 are given, else RERUN_BUDGET
# (default 350 s):
#   T0=<epoch s of the call> LEFT0=<lease s then> LPFAIL_GIT=<commit> bash notes/gpu_calls/next/rerun_short.sh
#   RERUN_BUDGET=<s> LPFAIL_GIT=<commit> bash notes/gpu_calls/next/rerun_short.sh   (rerun_long.sh calls it so)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8
if [ -n "${T0:-}" ] && [ -n "${LEFT0:-}" ]; then
  LEFT=$(( LEFT0 - ($(date +%s) - T0) )); B=$(( (LEFT < 590 ? LEFT : 590) - 80 )); WHY="lease ≈ $LEFT s"
else
  B=${RERUN_BUDGET:-350}; WHY="budget given"
fi
mkdir -p $OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; echo "$WHY: rerun budget $B s"; } >> $OUT/r/rerun.log 2>&1
tail -3 $OUT/r/rerun.log
[ $B -ge 60 ] || { echo "too little lease left"; exit 1; }
# not LPFAIL_RESULTS_DIR=$OUT/r: the check's stored runs are read from the checkout's results/ (before 2026-12-07's
# fix of `lookup`, substitution's heads rows read lr_sweep from that variable's folder: 'no stored result lr_sweep');
# the result is written into the checkout's results/ and copied out
LPFAIL_RERUN_BUDGET=$B timeout $(( B + 45 )) python3 -m lpfail run rerun_check >> $OUT/r/rerun.log 2>&1; rc=$?
cp results/rerun_check.json results/rerun_check.npz $OUT/r/ 2>/dev/null
echo "rerun_check rc $rc ($SECONDS s)"; grep -E "rerun check:|: different|: failed" $OUT/r/rerun.log | tail -12; ls $OUT/r
exit $rc
