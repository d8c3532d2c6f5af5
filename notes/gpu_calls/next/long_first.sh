#!/bin/bash
# First call of a short lease (2026-12-07, fifth session): the dial's 13 long runs left first, then the rerun check
# beside them. How many at a time follows the lease left once the machine has started:
#   T0=<epoch s when the call was made> LEFT0=<lease s at that moment> LPFAIL_GIT=<commit> \
#     bash notes/gpu_calls/next/long_first.sh
# left = LEFT0 − (now − T0) (as if the machine's start counted in full); the driver's budget = left − 90 s (a collect
# call after it); 13 at a time (≈ 850–950 s on an H100) where that budget allows, else 8 (the other 5 are started
# after them and cut off by the budget: nothing lost but their time). The rerun check goes beside them only at 13.
set -u
LEFT=$(( LEFT0 - ($(date +%s) - T0) )); B=$(( LEFT - 90 ))
if [ $B -ge 1000 ]; then P=13; elif [ $B -ge 640 ]; then P=8; else P=5; fi
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader); $(date -u); start took $(( $(date +%s) - T0 )) s; lease ≈ $LEFT s: driver budget $B s, $P at a time"
PARALLEL=$P BUDGET=$B CALL_LEFT=60 bash notes/gpu_calls/next/long_start.sh || exit 1
pgrep -f nvidia-cuda-mps-control >/dev/null && export CUDA_MPS_PIPE_DIRECTORY=/tmp/lpfail_mps \
  CUDA_MPS_LOG_DIRECTORY=/tmp/lpfail_mps_log && echo "rerun check under the driver's MPS server"
# a short lease: no rerun check beside the long runs (its 24 processes would slow them past the budget), the fused test only
RERUN=$(( P == 13 )) LONG=0 bash notes/gpu_calls/next/rerun_long.sh
echo "call s $SECONDS"; tail -3 /tmp/lpfail_session/runs/driver.log 2>/dev/null
