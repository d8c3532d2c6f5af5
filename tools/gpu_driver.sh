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
