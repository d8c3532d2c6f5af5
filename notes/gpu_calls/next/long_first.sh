#!/bin/bash
# First call of a session on an H100 (prepared 2026-12-07, seventh session): the dial's 11 long runs left, in waves.
#   T0=<epoch s when the call was made> LEFT0=<lease s at that moment> LPFAIL_GIT=<commit> \
#     bash notes/gpu_calls/next/long_first.sh
# left = LEFT0 − (now − T0) (as if the machine's start counted in full); the driver's budget = left − 90 s (a collect
# call after it). 6 at a time (≈ 400–520 s a wave; the other 5 follow as slots free), 3 at a time below 450 s of
# budget. Why waves (2026-12-07, 16:55): the machine was taken back for other work ≈ 17 minutes after its start,
# with 11 of 13 long runs at 13 at a time (≈ 850–950 s each) unfinished and lost; a wave of 6 finishes in half that,
# and chained waits of ≈ 280 s (`bash tools/gpu.sh wait dial_training --wait 280`: each ends with a collect) bring
# each finished run back within ≈ 5 minutes. The H100 rows of the rerun check and the fused test are done.
set -u
LEFT=$(( LEFT0 - ($(date +%s) - T0) )); B=$(( LEFT - 90 ))
# (2026-12-08) 6 at a time only where a wave's upper prediction (520 s) fits; the driver starts all P at once before
# any run has finished (no pace yet), so a run too long for the budget is lost
if [ $B -ge 540 ]; then P=6; elif [ $B -ge 330 ]; then P=3; elif [ $B -ge 220 ]; then P=2; else echo "lease too short for a long run ($B s)"; exit 1; fi
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader); $(date -u); start took $(( $(date +%s) - T0 )) s; lease ≈ $LEFT s: driver budget $B s, $P at a time"
PARALLEL=$P BUDGET=$B CALL_LEFT=60 bash notes/gpu_calls/next/long_start.sh || exit 1
echo "call s $SECONDS"; tail -3 /tmp/lpfail_session/runs/driver.log 2>/dev/null
