#!/bin/bash
# Chapters 2 and 3 on a GPU machine (issue 12), as a driver that outlives each device call (the pattern of
# tools/gpu_lr_sweep.sh):
#   start    CUDA MPS if present; graph checks of three rows (captured == uncaptured, ≈ 1 min); then, each in its
#            own session:
#            (1) `python -m lpfail.experiments.substitution drive --budget $BUDGET`: the substitution grid's missing
#                runs (108 runs of 1,000 steps at the smaller size + 1 rerun of A that must equal lr_sweep's stored
#                run bit for bit), 12 at a time, each finished run's summary stored at once in a part file;
#            (2) the extras, one process after the other: lr_sweep's A at lr 3.2e-2, seed 0, retrained with a
#                checkpoint every 100 steps (all kept) → chapter 3's checks at steps 300, 600, 900, every layer
#                (`python -m lpfail.experiments.gradient_error gpu`) → the replay from step 100 to 500, bit for bit
#                (the call of 2026-12-01 replayed from 600, after A's held-out loss had left C's between
#                steps 250 and 500; the issue asks for a start ≥ 200 steps before that), and
#                a branch per row (`python -m lpfail.experiments.substitution replay`) → chapter 3's item 3: Eq. 2's
#                δ-term accumulated over steps 601–700 in layer 0 for A, A + fix, A_sr and D on A's trajectory
#                (`python -m lpfail.experiments.gradient_error accumulate`; added after the call of 2026-12-01,
#                not run yet: estimated 2–5 min)
#   wait     progress every 60 s until both have ended or $WAIT seconds have passed, then collect
#   collect  copy the part files, the extras' JSON and the logs to $OUT
# Measured on 2026-12-01 (one H200, results/gpu_calls/20261201T0749/): the grid's driver 818 s for 109 runs; the
# extras 56 s of training + 129 s of replay and branches + the checks (seconds). With the grid stored, a rerun
# of `start` finds no run missing and does only the extras.
# Afterwards, here: copy $OUT/part-*.json to results/substitution_parts/, then
# `python -m lpfail.experiments.substitution collect`; copy $OUT/gradient_error_gpu.json, $OUT/replay.json,
# $OUT/accumulation.json and $OUT/a_diag.jsonl to results/substitution_gpu/ (read by chapters 2 and 3), then
# `python -m lpfail run gradient_error` (merges the GPU records and the accumulation).
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> BUDGET=900 WAIT=540 bash tools/gpu_substitution.sh start|wait|collect
# Steering: STOP_IN=<s> brings the driver's deadline to <s> s from now; PARALLEL=<n> changes how many run at once.
set -o pipefail
MODE=${1:-wait}
case "$MODE" in start|wait|collect) ;; *) echo "usage: $0 start|wait|collect" >&2; exit 2;; esac
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
export LPFAIL_SUBSTITUTION_ROOT=${LPFAIL_SUBSTITUTION_ROOT:-/tmp/lpfail_substitution}
export LPFAIL_RESULTS_DIR=${LPFAIL_RESULTS_DIR:-/tmp/lpfail_results}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/lpfail_mps CUDA_MPS_LOG_DIRECTORY=/tmp/lpfail_mps_log
OUT=${OUT:-/tmp/lpfail_out}
BUDGET=${BUDGET:-900}
WAIT=${WAIT:-540}
BASE=$LPFAIL_SUBSTITUTION_ROOT
EXTRA=$BASE/extras
mkdir -p "$OUT" "$LPFAIL_RESULTS_DIR"
T0=$(date +%s)
source "$(dirname "$0")/gpu_driver.sh"
extras_running() { [ -f "$EXTRA/extras.pid" ] && kill -0 "$(cat "$EXTRA/extras.pid")" 2>/dev/null; }
progress() {
    log "$(python3 -m lpfail.experiments.substitution status 2>&1 | cut -c1-200)"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    tail -n 1 "$BASE/drive.log"
    tail -n 2 "$EXTRA/extras.log" 2>/dev/null
}
if [ "$MODE" = start ]; then
    rm -rf "$BASE"; mkdir -p "$BASE" "$EXTRA" "$LPFAIL_RESULTS_DIR"
    # stored runs are not rerun: lr_sweep's parts hold the baselines A and C, ours any earlier call's rows
    for d in lr_sweep_parts substitution_parts; do
        rm -rf "$LPFAIL_RESULTS_DIR/$d"; mkdir -p "$LPFAIL_RESULTS_DIR/$d"
        cp results/$d/part-*.json "$LPFAIL_RESULTS_DIR/$d/" 2>/dev/null
    done
    cp results/lr_sweep.json results/lr_sweep.npz "$LPFAIL_RESULTS_DIR/" 2>/dev/null  # head_choice reads it
    machine_info
    start_mps
    log "graph checks of the new code paths (captured == uncaptured, 30 steps)"
    if ! python3 -m lpfail.experiments.substitution checks --root "$BASE" 2>&1 | tail -n 5; then
        # a row whose captured steps differ runs uncaptured (the same arithmetic, slower); to be safe, every row
        export LPFAIL_SUBSTITUTION_UNCAPTURED='*'
        log "graph checks failed: every row runs uncaptured"
    fi
    cp "$BASE/checks.json" "$OUT/substitution_checks.json" 2>/dev/null
    log "starting the substitution driver, budget $BUDGET s"
    setsid nohup python3 -m lpfail.experiments.substitution drive --budget "$BUDGET" --root "$BASE" \
        >"$BASE/drive.log" 2>&1 </dev/null &
    echo $! >"$BASE/drive.pid"
    log "starting the extras (A with checkpoints → gradient_error gpu → replay)"
    setsid nohup bash -c "
        set -e
        python3 -m lpfail.experiments.gradient_error a-config --run '$EXTRA/a'
        python3 -m lpfail train --config '$EXTRA/a/train_config.json' --no-progress
        python3 -m lpfail.experiments.gradient_error gpu --run '$EXTRA/a' --steps 300,600,900 --rows 8 \
            --out '$EXTRA/gradient_error_gpu.json'
        python3 -m lpfail.experiments.substitution replay --run '$EXTRA/a' --step 100 --until 500 \
            --out '$EXTRA/replay.json'
        LPFAIL_NO_CAPTURE=1 python3 -m lpfail.experiments.gradient_error accumulate --run '$EXTRA/a' --step 600 \
            --k 100 --layer 0 --rows 8 --out '$EXTRA/accumulation.json'
    " >"$EXTRA/extras.log" 2>&1 </dev/null &
    echo $! >"$EXTRA/extras.pid"
    sleep 5
fi
steer "$BASE/runs/control.json"
if [ "$MODE" != collect ]; then
    wait_for_driver
    while extras_running && [ $(( $(date +%s) - T0 )) -lt "$WAIT" ]; do sleep 5; done
    extras_running && log "the extras are still running" || log "the extras have ended"
fi
log "collecting"
python3 -m lpfail.experiments.substitution status
copy_new_parts substitution_parts
cp "$BASE/drive.log" "$EXTRA/extras.log" "$EXTRA/gradient_error_gpu.json" "$EXTRA/replay.json" \
    "$EXTRA/accumulation.json" "$OUT/" 2>/dev/null
cp "$EXTRA/a/diag.jsonl" "$OUT/a_diag.jsonl" 2>/dev/null  # per-head ‖W_Q^h‖ of the retrained A (Fig. 3)
cp "$EXTRA/a/log.jsonl" "$OUT/a_log.jsonl" 2>/dev/null; cp "$EXTRA/a/val.jsonl" "$OUT/a_val.jsonl" 2>/dev/null
ls -la "$OUT"
