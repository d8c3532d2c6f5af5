#!/bin/bash
# The `cures` experiment (issue 14, chapter 6) on a GPU machine: lr_sweep's driver (tools/gpu_lr_sweep.sh, whose
# steps this script repeats) with the cures grid — lr_sweep's small-size grid with the 7 new cure variants
# A_hp, A_res, Bp, R, A_ds, A_z, A_cap (126 runs; Bp and R are shared with fix_training); lr_sweep's stored runs of A, C, S, D, B, A_sr, A_qk are copied
# in from results/lr_sweep_parts and reused, not rerun.
#   start    MPS, graph checks of the new variants (captured == uncaptured), then the driver in its own session
#   wait     progress every 60 s until done or $WAIT s have passed, then collect
#   collect  copy the new part files, the checks and the logs to $OUT
# Cost: lr_sweep's measured pace for the smaller model, 72–100 s per run with 12 at a time on one H200
# (2026-12-01) → 126 runs ≈ 13–18 min of driver time:
# one `start` call with BUDGET=1500 WAIT=540, then `wait` calls until done (≈ 3 calls of 10 min).
# Here afterwards: cp $OUT/part-*.json results/lr_sweep_parts/ && python -m lpfail.experiments.cures collect
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> BUDGET=1500 WAIT=540 bash tools/gpu_cures.sh start|wait|collect
set -o pipefail
MODE=${1:-wait}
case "$MODE" in start|wait|collect) ;; *) echo "usage: $0 start|wait|collect" >&2; exit 2;; esac
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
export LPFAIL_LR_SWEEP_ROOT=${LPFAIL_LR_SWEEP_ROOT:-/tmp/lpfail_cures}
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
    log "$(python3 -m lpfail.experiments.cures status 2>&1 | tr -d '\n ' | cut -c1-300)"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    grep -c "done (rc 0)" "$BASE/drive.log" | sed 's/^/runs done this driver: /'
    tail -n 2 "$BASE/drive.log"
}
if [ "$MODE" = start ]; then
    rm -rf "$BASE" "$LPFAIL_RESULTS_DIR/lr_sweep_parts"; mkdir -p "$BASE" "$LPFAIL_RESULTS_DIR/lr_sweep_parts"
    cp results/lr_sweep_parts/part-*.json "$LPFAIL_RESULTS_DIR/lr_sweep_parts/" 2>/dev/null  # stored runs are not rerun
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,memory.used,temperature.gpu --format=csv
    python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
    if command -v nvidia-cuda-mps-control >/dev/null; then
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        setsid nvidia-cuda-mps-control -d && log "MPS control daemon started" || log "MPS did not start"
        if ! timeout 120 python3 -c "import torch; x = torch.ones(4, device='cuda'); print('a CUDA client under MPS:', float(x.sum()))"; then
            log "a CUDA client failed under MPS: stopping MPS"
            echo quit | nvidia-cuda-mps-control; sleep 2
        fi
    else
        log "no nvidia-cuda-mps-control on this machine: processes time-slice the GPU"
    fi
    log "graph checks"
    python3 -m lpfail.experiments.cures checks --root "$BASE" 2>&1 | tail -n 12
    ok=$?
    cp "$BASE/checks.json" "$OUT/" 2>/dev/null
    if [ $ok -ne 0 ]; then
        # a variant whose captured steps differ from its uncaptured ones runs uncaptured (the same arithmetic);
        # if the continue check failed too, every variant does
        export LPFAIL_LR_SWEEP_UNCAPTURED=$(python3 -c "
import json; c = json.load(open('$BASE/checks.json'))
bad = [v for v, ok in c['equal'].items() if not ok]
print(','.join(['A_hp', 'A_res', 'Bp', 'R', 'A_ds', 'A_z', 'A_cap'] if not c['resume_equal'] else bad))")
        log "graph checks: uncaptured variants: $LPFAIL_LR_SWEEP_UNCAPTURED (the same arithmetic, slower)"
    fi
    log "starting the driver, budget $BUDGET s"
    setsid nohup python3 -m lpfail.experiments.cures drive --budget "$BUDGET" --root "$BASE" \
        >"$BASE/drive.log" 2>&1 </dev/null &
    echo $! >"$BASE/drive.pid"
    sleep 5
fi
steer "$BASE/runs/control.json"
if [ "$MODE" != collect ]; then
    wait_for_driver
fi
log "collecting"
python3 -m lpfail.experiments.cures status
for f in "$LPFAIL_RESULTS_DIR"/lr_sweep_parts/part-*.json; do  # only this machine's new parts
    [ -e "$f" ] && [ ! -e "results/lr_sweep_parts/$(basename "$f")" ] && cp "$f" "$OUT/"
done
cp "$BASE/drive.log" "$OUT/" 2>/dev/null
cp "$BASE/checks.json" "$OUT/" 2>/dev/null
(cd "$BASE/runs" 2>/dev/null && tar czf "$OUT/cures_runs.tgz" --exclude='ckpt_*' --exclude='batches_rank*' \
    --exclude='train_config.json' . 2>/dev/null)
ls -la "$OUT"
