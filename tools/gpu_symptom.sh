#!/bin/bash
# The `symptom` search (issue 3) on a GPU machine, as a driver that outlives each device call: the machine
# stays up (and keeps /tmp) while calls follow each other, so one driver can use several 10-minute calls.
#   start     wipe $LPFAIL_SYMPTOM_ROOT, start `python -m lpfail.experiments.symptom drive --budget $BUDGET` in its own
#             session (setsid: it survives the end of this call), then `wait`
#   wait      print progress every 60 s until the driver has ended or $WAIT seconds have passed, then collect
#   collect   store what the runs directory holds now: $OUT/symptom.{json,npz} and symptom_sweep.{json,npz}
#             (complete=false while runs are unfinished), checks.json, drive.log, symptom_runs.tgz
# The driver runs the default configuration (all five variants) and the symptom_sweep points, spread over
# every visible GPU (LPFAIL_SYMPTOM_PARALLEL processes at a time, default 8 per GPU).
# Usage (GPU machine, repo root):  LPFAIL_GIT=<commit> BUDGET=1400 WAIT=540 bash tools/gpu_symptom.sh start|wait|collect
# Steering a running driver: STOP_IN=<s> brings its deadline to <s> seconds from now; PARALLEL=<n> changes
# how many runs go at a time (both through $LPFAIL_SYMPTOM_ROOT/control.json, read by lpfail.experiments.driver.sweep).
set -o pipefail
MODE=${1:-wait}
case "$MODE" in start|wait|collect) ;; *) echo "usage: $0 start|wait|collect" >&2; exit 2;; esac
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
export LPFAIL_SYMPTOM_ROOT=${LPFAIL_SYMPTOM_ROOT:-/tmp/lpfail_symptom}
OUT=${OUT:-/tmp/lpfail_out}
BUDGET=${BUDGET:-1400}
WAIT=${WAIT:-540}
BASE=$LPFAIL_SYMPTOM_ROOT
mkdir -p "$OUT"
T0=$(date +%s)
source "$(dirname "$0")/gpu_driver.sh"
progress() {
    log "progress"; python3 -m lpfail.experiments.symptom progress | grep -v "^  .*step    -1" | head -60
    tail -n 3 "$BASE/drive.log"
}
if [ "$MODE" = start ]; then
    rm -rf "$BASE"; mkdir -p "$BASE"
    nvidia-smi --query-gpu=index,name,clocks.sm,memory.used,temperature.gpu,power.draw --format=csv
    log "starting the driver, budget $BUDGET s"
    setsid nohup python3 -m lpfail.experiments.symptom drive --budget "$BUDGET" >"$BASE/drive.log" 2>&1 </dev/null &
    echo $! >"$BASE/drive.pid"
    sleep 5
fi
steer "$BASE/control.json"
if [ "$MODE" != collect ]; then
    wait_for_driver
fi
log "collecting"
LPFAIL_SYMPTOM_BUDGET_S=0 LPFAIL_RESULTS_DIR=$OUT python3 -m lpfail run symptom 2>&1 | tail -n 25
LPFAIL_SYMPTOM_BUDGET_S=0 LPFAIL_RESULTS_DIR=$OUT python3 -m lpfail run symptom_sweep 2>&1 | tail -n 5
cp -f "$BASE/drive.log" "$OUT/drive.log" 2>/dev/null
CHK=$(grep -L shared_from "$BASE"/*/checks.json 2>/dev/null | head -n 1); [ -n "$CHK" ] && cp -f "$CHK" "$OUT/checks.json"  # the default configuration's (the others share it)
[ -d "$BASE" ] && tar -C "$BASE" --exclude='*.pt' --exclude='batches_rank*' -czf "$OUT/symptom_runs.tgz" .
grep -h "check \|Error\|error" "$BASE/drive.log" | head -20
nvidia-smi --query-gpu=index,clocks.sm,memory.used,temperature.gpu,power.draw,utilization.gpu --format=csv
log "done"; ls -la "$OUT"
