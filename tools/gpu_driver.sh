# Shared by tools/gpu_symptom.sh and tools/gpu_lr_sweep.sh (sourced, not run): a sweep driver that runs in its
# own session across device calls, steered through a control file and waited for with a progress line.
# The caller sets T0, WAIT and BASE (where drive.pid lives) and defines `progress` (prints one report).
log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
running() { [ -f "$BASE/drive.pid" ] && kill -0 "$(cat "$BASE/drive.pid")" 2>/dev/null; }

# steer CONTROL_JSON: STOP_IN=<s> brings the driver's deadline to <s> s from now; PARALLEL=<n> runs n at once
# (read by lpfail.experiments.driver.sweep's `control` file).
steer() {
    [ -n "${STOP_IN:-}${PARALLEL:-}" ] || return 0
    mkdir -p "$(dirname "$1")"
    python3 - "$1" <<PY
import json, sys, time
ctl = {}
if "${STOP_IN:-}": ctl["stop_at"] = time.time() + float("${STOP_IN:-0}")
if "${PARALLEL:-}": ctl["parallel"] = int("${PARALLEL:-1}")
open(sys.argv[1], "w").write(json.dumps(ctl))
print("control:", ctl)
PY
}

# wait_for_driver: until the driver ends or WAIT seconds have passed since T0, `progress` every 60 s.
wait_for_driver() {
    running || log "the driver is not running (ended, or this is a fresh machine)"
    local last=0
    while running && [ $(( $(date +%s) - T0 )) -lt "$WAIT" ]; do
        sleep 5
        if [ $(( $(date +%s) - last )) -ge 60 ]; then
            last=$(date +%s)
            progress
        fi
    done
    running && log "the driver is still running (it continues while the machine stays up)" || log "the driver has ended"
}

# start_mps: the CUDA MPS control daemon where the machine has it (many small processes then share the GPU without
# time-slicing), checked with one CUDA client; stopped again if that client fails. The caller exports
# CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY.
start_mps() {
    if ! command -v nvidia-cuda-mps-control >/dev/null; then
        log "no nvidia-cuda-mps-control on this machine: processes time-slice the GPU"
        return 0
    fi
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    setsid nvidia-cuda-mps-control -d && log "MPS control daemon started" || log "MPS did not start"
    if ! timeout 120 python3 -c "import torch; x = torch.ones(4, device='cuda'); print('a CUDA client under MPS:', float(x.sum()))"; then
        log "a CUDA client failed under MPS: stopping MPS"
        echo quit | nvidia-cuda-mps-control; sleep 2
    fi
}

# machine_info: the GPU, its driver and the Python / torch / triton versions, for the call's log.
machine_info() {
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,memory.used,temperature.gpu --format=csv
    python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
}

# copy_new_parts PARTS: the part files this machine wrote under $LPFAIL_RESULTS_DIR/PARTS (those not already in
# the repository's results/PARTS) to $OUT.
copy_new_parts() {
    local f
    for f in "$LPFAIL_RESULTS_DIR/$1"/part-*.json; do
        [ -e "$f" ] && [ ! -e "results/$1/$(basename "$f")" ] && cp "$f" "$OUT/"
    done
    return 0
}
