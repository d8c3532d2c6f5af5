#!/bin/bash
# Fix-b (issue 13): the `fix_training` experiment's new runs — B′ (Algorithm 3, no clamp) and R (the robust fix),
# 6 learning rates × 3 seeds at lr_sweep's smaller size, 36 runs — on one GPU, in one device call.
# A, C and B are lr_sweep's stored runs (results/lr_sweep_parts/, copied in so they are not rerun).
#   1. CUDA MPS when the machine has it (12 small processes share the GPU without time-slicing)
#   2. graph checks for Bp and R (captured == uncaptured bit for bit; continued == uninterrupted); a variant
#      that fails runs uncaptured (same arithmetic, slower)
#   3. `python -m lpfail.experiments.fix_training drive --budget $BUDGET` in the foreground
#   4. the new part files, the checks and the driver's log to $OUT
# Expected cost (lead's measurement, 2026-12-01: a captured 4 × 256 run takes 30–120 s with 12 processes under
# MPS on one H200): 36 runs in 3 waves of 12 ≈ 2–6 min, plus ≈ 1–2 min of checks and start-up: under 10 min.
# Afterwards, here: cp $OUT/part-*.json results/lr_sweep_parts/ && python -m lpfail.experiments.fix_training collect
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> BUDGET=420 bash tools/gpu_fix_training.sh
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
export LPFAIL_LR_SWEEP_ROOT=${LPFAIL_LR_SWEEP_ROOT:-/tmp/lpfail_fix_training}
export LPFAIL_RESULTS_DIR=${LPFAIL_RESULTS_DIR:-/tmp/lpfail_results}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/lpfail_mps CUDA_MPS_LOG_DIRECTORY=/tmp/lpfail_mps_log
OUT=${OUT:-/tmp/lpfail_out}
BUDGET=${BUDGET:-420}
BASE=$LPFAIL_LR_SWEEP_ROOT
T0=$(date +%s)
log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
rm -rf "$BASE" "$LPFAIL_RESULTS_DIR/lr_sweep_parts"; mkdir -p "$BASE" "$OUT" "$LPFAIL_RESULTS_DIR/lr_sweep_parts"
cp results/lr_sweep_parts/part-*.json "$LPFAIL_RESULTS_DIR/lr_sweep_parts/" 2>/dev/null
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
python3 -m lpfail.experiments.fix_training status
if command -v nvidia-cuda-mps-control >/dev/null; then
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    setsid nvidia-cuda-mps-control -d && log "MPS control daemon started" || log "MPS did not start"
fi
log "graph checks (Bp, R)"
if ! python3 -m lpfail.experiments.fix_training checks --root "$BASE" 2>&1 | tail -n 6; then
    export LPFAIL_LR_SWEEP_UNCAPTURED=$(python3 -c "
import json; c = json.load(open('$BASE/checks.json'))
print('Bp,R' if not c['resume_equal'] else ','.join(v for v, ok in c['equal'].items() if not ok))")
    log "uncaptured: $LPFAIL_LR_SWEEP_UNCAPTURED"
fi
cp "$BASE/checks.json" "$OUT/" 2>/dev/null
log "driving, budget $BUDGET s"
python3 -m lpfail.experiments.fix_training drive --budget "$BUDGET" --root "$BASE" 2>&1 | tee "$BASE/drive.log" | tail -n 5
python3 -m lpfail.experiments.fix_training status
for f in "$LPFAIL_RESULTS_DIR"/lr_sweep_parts/part-*.json; do  # only this machine's new parts
    [ -e "$f" ] && [ ! -e "results/lr_sweep_parts/$(basename "$f")" ] && cp "$f" "$OUT/"
done
cp "$BASE/drive.log" "$OUT/fix_training_drive.log" 2>/dev/null
echo quit | nvidia-cuda-mps-control 2>/dev/null
ls -la "$OUT"
log "done"
