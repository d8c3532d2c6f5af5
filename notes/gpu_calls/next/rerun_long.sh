#!/bin/bash
# Next session's first call (prepared 2026-12-07 after calls 23–26), on an H100 (name no kind; see below for an H200):
#   LPFAIL_GIT=<commit> BUDGET=<driver s> bash notes/gpu_calls/next/rerun_long.sh
# 1. The rerun check (`python -m lpfail run rerun_check`, issue 38) for the rows stored from this kind of card — on an
#    H100: the dial's 17 arms, both A_sr rows and precision_alarm_fresh's 3 (22 rows, 300 steps each; ≈ 150–250 s);
#    rows of other cards stay pending; the result into $OUT/r (copy it into results/ here).
# 2. Then long_start.sh: the δ smoke test and the dial's 13 long runs left, 13 at a time (≈ 850–950 s), and a wait
#    to ≈ 570 s of this call. Later calls: `bash tools/gpu.sh wait dial_training --wait S`, the last `collect`.
# On an H200 the rerun check runs the 12 H200 rows instead (chapter 1's search, GPT-2 small's A and C, substitution's
# heads rows); the long runs are then better left for an H100 session (every dial run is from one): pass LONG=0.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p $OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/r/rerun.log 2>&1
# 0. Is the fused rounding kernel taken in a captured training run at all? (call 23 timed it no faster alone: either
#    it is not the bottleneck there, or it is not used; the test now counts its launches), ≈ 30 s
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sr_stream.py -k "with_and_without" >> $OUT/r/rerun.log 2>&1
echo "fused-in-training test rc $?"
# RERUN=0: the fused test only (beside long runs on a short lease)
if [ "${RERUN:-1}" != 0 ]; then RERUN_BUDGET=350 T0= LEFT0= bash notes/gpu_calls/next/rerun_short.sh; fi
if [ "${LONG:-1}" != 0 ]; then CALL_LEFT=$(( 570 - SECONDS )) bash notes/gpu_calls/next/long_start.sh; fi
