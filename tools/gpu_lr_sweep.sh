#!/bin/bash
# The `lr_sweep` experiment (issue 11) on a GPU machine, as a driver that outlives each device call: the
# machine stays up (and keeps /tmp) while calls follow each other within its 30 s of warmth.
#   start    CUDA MPS if the machine has it (many small processes then share the GPU without time-slicing),
#            the graph checks (captured == uncaptured, bit for bit; continue == uninterrupted), then
#            `python -m lpfail.experiments.lr_sweep drive --budget $BUDGET` in its own session, then `wait`
#   wait     print progress every 60 s until the driver has ended or $WAIT seconds have passed, then collect
#   collect  copy the part files (every finished run's summary), the checks and the logs to $OUT
# Call 1 of 2026-12-01 ran every variant uncaptured because A_sr's check failed (captured random draws
# differ); since then only the variants whose check fails run uncaptured (LPFAIL_LR_SWEEP_UNCAPTURED).
# Parts are written under $LPFAIL_RESULTS_DIR/lr_sweep_parts (default /tmp/lpfail_results): copy them from
# $OUT into results/lr_sweep_parts/ here, then `python -m lpfail.experiments.lr_sweep collect`.
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> BUDGET=1500 WAIT=540 bash tools/gpu_lr_sweep.sh start|wait|collect
# LPFAIL_GIT: the commit of the tree sent, computed where it was committed — the device tool's copy of .git
# may point elsewhere (on 2026-12-01 `git rev-parse HEAD` there gave the session's first commit).
# Steering: STOP_IN=<s> brings the driver's deadline to <s> s from now; PARALLEL=<n> changes how many run at once.
# Other experiments built on lr_sweep's runs and part files use this script with EXP=<module> (its `status`,
# `checks` and `drive` commands) and ALL_VARIANTS=<the variants to run uncaptured if the continue check fails>,
# e.g. tools/gpu_cures.sh.
set -o pipefail
MODE=${1:-wait}
case "$MODE" in start|wait|collect) ;; *) echo "usage: $0 start|wait|collect" >&2; exit 2;; esac
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
EXP=${EXP:-lr_sweep}
ALL_VARIANTS=${ALL_VARIANTS:-A,C,D,B,S,A_sr,A_qk,C_qk}
export LPFAIL_LR_SWEEP_ROOT=${LPFAIL_LR_SWEEP_ROOT:-/tmp/lpfail_$EXP}
export LPFAIL_RESULTS_DIR=${LPFAIL_RESULTS_DIR:-/tmp/lpfail_results}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/lpfail_mps CUDA_MPS_LOG_DIRECTORY=/tmp/lpfail_mps_log
OUT=${OUT:-/tmp/lpfail_out}
BUDGET=${BUDGET:-1500}
WAIT=${WAIT:-540}
BASE=$LPFAIL_LR_SWEEP_ROOT
mkdir -p "$OUT" "$LPFAIL_RESULTS_DIR"
T0=$(date +%s)
source "$(dirname "$0")/gpu_driver.sh"
progress() {
    log "$(python3 -m lpfail.experiments.$EXP status 2>&1 | tr '\n' ' ' | cut -c1-300)"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    grep -c "done (rc 0)" "$BASE/drive.log" | sed 's/^/runs done this driver: /'
    tail -n 2 "$BASE/drive.log"
}
if [ "$MODE" = start ]; then
    # the parts folder is shared by every driver of this machine (lr_sweep, fix_training, cures, compiled_sweep,
    # substitution's baselines): never removed or overwritten here, since another driver may be writing its part
    # file; a part already on this machine is a real run of this tree and is reused
    rm -rf "$BASE"; mkdir -p "$BASE" "$LPFAIL_RESULTS_DIR/lr_sweep_parts"
    cp -n results/lr_sweep_parts/part-*.json "$LPFAIL_RESULTS_DIR/lr_sweep_parts/" 2>/dev/null  # stored runs are not rerun
    machine_info
    start_mps
    log "graph checks"
    python3 -m lpfail.experiments.$EXP checks --root "$BASE" 2>&1 | tail -n 12
    ok=$?
    cp "$BASE/checks.json" "$OUT/" 2>/dev/null
    if [ $ok -ne 0 ]; then
        # a variant whose captured steps differ from its uncaptured ones runs uncaptured (the same arithmetic);
        # if the continue check failed too, every variant does
        export LPFAIL_LR_SWEEP_UNCAPTURED=$(python3 -c "
import json; c = json.load(open('$BASE/checks.json'))
bad = [v for v, ok in c['equal'].items() if not ok]
print('$ALL_VARIANTS' if not c['resume_equal'] else ','.join(bad))")
        log "graph checks: uncaptured variants: $LPFAIL_LR_SWEEP_UNCAPTURED (the same arithmetic, slower)"
    fi
    log "starting the driver, budget $BUDGET s"
    setsid nohup python3 -m lpfail.experiments.$EXP drive --budget "$BUDGET" --root "$BASE" \
        >"$BASE/drive.log" 2>&1 </dev/null &
    echo $! >"$BASE/drive.pid"
    sleep 5
fi
steer "$BASE/runs/control.json"
if [ "$MODE" != collect ]; then
    wait_for_driver
fi
log "collecting"
python3 -m lpfail.experiments.$EXP status
copy_new_parts lr_sweep_parts
cp "$BASE/drive.log" "$OUT/" 2>/dev/null
cp "$BASE/checks.json" "$OUT/" 2>/dev/null
# The runs' own files, small ones only: a file that comes back from a device call must stay under 16 MiB
# (2026-12-01, call 5: 33 MB with every run's per-step log.jsonl, did not come back, and the logs were lost).
# The per-step logs (log.jsonl), batch lists and checkpoints stay out — every run's summary, its curves
# included, is in the part files; kept: run.json, config.json, val.jsonl, diag.jsonl and the last 20 kB
# of stdout.txt. Capped: above MAX_TGZ bytes (15 MiB) only run.json and the stdout tails are kept, and if
# even that is too big the archive is dropped with a notice (the part files never depend on it).
MAX_TGZ=${MAX_TGZ:-15728640}
pack_runs() {  # $1: what to keep (find -name patterns, space-separated)
    local tmp; tmp=$(mktemp -d)
    (cd "$BASE/runs" 2>/dev/null && for pat in $1; do
        find . -type f -name "$pat" -size -2M | while read -r f; do
            mkdir -p "$tmp/$(dirname "$f")"
            if [ "$pat" = stdout.txt ]; then tail -c 20000 "$f" >"$tmp/$f"; else cp "$f" "$tmp/$f"; fi
        done
    done)
    tar czf "$OUT/${EXP}_runs.tgz" -C "$tmp" . 2>/dev/null
    rm -rf "$tmp"
}
tgz_size() { stat -c %s "$OUT/${EXP}_runs.tgz" 2>/dev/null || echo 0; }
if [ -d "$BASE/runs" ]; then
    pack_runs "run.json config.json val.jsonl diag.jsonl stdout.txt"
    if [ "$(tgz_size)" -gt "$MAX_TGZ" ]; then
        log "runs archive $(tgz_size) B > $MAX_TGZ B: keeping run.json and the stdout tails only"
        pack_runs "run.json stdout.txt"
    fi
    if [ "$(tgz_size)" -gt "$MAX_TGZ" ]; then
        log "runs archive still $(tgz_size) B > $MAX_TGZ B: dropped (the part files hold every run's summary)"
        rm -f "$OUT/${EXP}_runs.tgz"
    fi
fi
ls -la "$OUT"
