#!/bin/bash
# Several GPU steps in one device call, each step's files packed into one archive under $OUT (the device tool
# returns at most 8 files a call, and one step alone writes more). Steps run in the order given, each under the
# call's deadline (CALL_S seconds from the start, default 570: a 600 s call with time to pack):
#   sub-start   tools/gpu_substitution.sh start (the missing runs only — next call: the amendment's 12 — and the
#               extras, in their own sessions; BUDGET, EXPECT_MISSING, CHECKS as there) → sub.tgz
#   sub-wait    tools/gpu_substitution.sh wait until the driver and the extras end or the deadline nears → sub.tgz
#   fix-start   tools/gpu_fix_training.sh start, not waiting (Fix-b's 36 runs)     → fix.tgz
#   fix-wait    tools/gpu_fix_training.sh wait                                     → fix.tgz
#   cures-start / cures-wait   the same for tools/gpu_cures.sh                     → cures.tgz
#   compiled-start / compiled-wait   the same for compiled_sweep (tools/gpu_lr_sweep.sh, EXP=compiled_sweep).
#               compiled-start starts nothing unless official_check confirms PAPER_BF16_COMPILED (≥ 99.9 % of
#               the bits of O, dQ, dK, dV on every case: `official_check confirmed`), read from this machine's
#               last `official` step (kept in $KEEP across calls) or else from the repository's results/
#                                                                                  → compiled.tgz
#   kernels     tools/gpu_kernels.sh tests (the gpu-marked kernel tests)           → kernels.tgz
#   trust       python -m lpfail.experiments.kernel_trust (Triton vs the reference, one step's gradients)
#                                                                                  → kernels.tgz
#   official    tools/gpu_official_check.sh (carry .official)                      → official.tgz
#   prod        tools/gpu_prod_kernels.sh all                                      → prod.tgz
#   overhead    tools/gpu_prod_kernels.sh overhead (the monitor's overhead; on an idle GPU) → prod.tgz
#   prod-tests  tools/gpu_prod_kernels.sh tests (the gpu-marked tests of prod_kernels, monitor, substitute, cures) → prod.tgz
#   robust-cost python tools/gpu_robust_cost.py                                    → robust.tgz
#   host        python3 tools/gpu_overhead.py (issue 13's host time per call of a tiny problem; on an idle GPU,
#               so first or after the waits)                                       → kernels.tgz (overhead.json)
# A "-wait" step waits at most until 30 s before the deadline; a step that would overrun it is stopped (timeout).
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> [CALL_S=570] [BUDGET=…] bash tools/gpu_batch.sh STEP...
# Afterwards, here: unpack each archive into a scratch folder and copy its files where the step's own script's
# header says.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
FINAL_OUT=${OUT:-/tmp/lpfail_out}
STAGE=${STAGE:-/tmp/lpfail_batch}
KEEP=${KEEP:-/tmp/lpfail_keep}   # survives the next call's clean-up of $STAGE (the machine stays up between calls)
CALL_S=${CALL_S:-570}
T0=$(date +%s)
DEADLINE=$(( T0 + CALL_S ))
left() { echo $(( DEADLINE - $(date +%s) )); }
say() { echo "[batch $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
rm -rf "$STAGE"; mkdir -p "$STAGE" "$FINAL_OUT"
exec > >(tee "$FINAL_OUT/batch.log") 2>&1
for step in "$@"; do
    case "$step" in
        sub-*) group=sub;; fix-*) group=fix;; cures-*) group=cures;; compiled-*) group=compiled;; kernels|trust|host) group=kernels;;
        official) group=official;; prod|overhead|prod-tests) group=prod;; robust-cost) group=robust;;
        *) echo "unknown step: $step" >&2; exit 2;;
    esac
    export OUT="$STAGE/$group"; mkdir -p "$OUT"
    avail=$(( $(left) - 10 ))
    if [ "$avail" -lt 20 ]; then say "no time left for $step"; continue; fi
    say "step $step ($avail s left)"
    case "$step" in
        sub-start) WAIT=0 timeout "$avail" bash tools/gpu_substitution.sh start;;
        sub-wait) WAIT=$(( avail - 20 )) timeout "$avail" bash tools/gpu_substitution.sh wait;;
        fix-start) WAIT=0 timeout "$avail" bash tools/gpu_fix_training.sh start;;
        fix-wait) WAIT=$(( avail - 20 )) timeout "$avail" bash tools/gpu_fix_training.sh wait;;
        cures-start) WAIT=0 timeout "$avail" bash tools/gpu_cures.sh start;;
        cures-wait) WAIT=$(( avail - 20 )) timeout "$avail" bash tools/gpu_cures.sh wait;;
        compiled-start)
            dir=$KEEP/official; [ -f "$dir/official_check.json" ] || dir=$PWD/results
            if LPFAIL_RESULTS_DIR=$dir python3 -m lpfail.experiments.official_check confirmed | tee "$OUT/gate.txt"; then
                EXP=compiled_sweep ALL_VARIANTS=A_comp WAIT=0 timeout "$avail" bash tools/gpu_lr_sweep.sh start
            else
                say "compiled-start: PAPER_BF16_COMPILED not confirmed by official_check ($dir): no run started"
            fi;;
        compiled-wait) EXP=compiled_sweep WAIT=$(( avail - 20 )) timeout "$avail" bash tools/gpu_lr_sweep.sh wait;;
        kernels) timeout "$avail" bash tools/gpu_kernels.sh tests "$(( avail / 2 ))";;
        trust) timeout "$avail" python3 -m lpfail.experiments.kernel_trust --out "$OUT/kernel_trust.json" \
                   2>&1 | tee "$OUT/kernel_trust.txt" | tail -n 25;;
        official) RUN_TIMEOUT=$(( avail - 120 )) timeout "$avail" bash tools/gpu_official_check.sh; rc=$?
                  mkdir -p "$KEEP/official"; cp "$OUT"/official_check.* "$KEEP/official/" 2>/dev/null
                  (exit $rc);;   # the step's status is the check's, not the copy's
        prod) timeout "$avail" bash tools/gpu_prod_kernels.sh all;;
        overhead) timeout "$avail" bash tools/gpu_prod_kernels.sh overhead;;
        prod-tests) timeout "$avail" bash tools/gpu_prod_kernels.sh tests;;
        robust-cost) timeout "$avail" python3 tools/gpu_robust_cost.py "$OUT";;   # robust_cost.{json,npz}
        host) timeout "$avail" python3 tools/gpu_overhead.py "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.txt" \
                  | tail -n 60;;
    esac
    say "step $step ended (rc $?)"
done
# A file that comes back may hold 16 MiB: each group's part files and small files (≤ 4 MiB: JSON, logs) go into
# GROUP.tgz; bigger ones (run-log archives) into GROUP_big.tgz, dropped with a notice if it is still too big. On
# 2026-12-01 a cures archive of 33 MB with both did not come back, and its part file with it.
for d in "$STAGE"/*/; do
    [ -d "$d" ] || continue
    g=$(basename "$d")
    (cd "$d" && find . -type f \( -size -4097k -o -name 'part-*.json' \) | sort >"$STAGE/$g.small" &&
        find . -type f -size +4096k ! -name 'part-*.json' | sort >"$STAGE/$g.big")
    tar czf "$FINAL_OUT/$g.tgz" -C "$d" -T "$STAGE/$g.small"
    if [ -s "$STAGE/$g.big" ]; then
        tar czf "$FINAL_OUT/${g}_big.tgz" -C "$d" -T "$STAGE/$g.big"
        if [ "$(stat -c %s "$FINAL_OUT/${g}_big.tgz")" -gt $(( 16 * 1024 * 1024 - 4096 )) ]; then
            say "dropped ${g}_big.tgz (over 16 MiB): $(tr '\n' ' ' <"$STAGE/$g.big")"
            rm -f "$FINAL_OUT/${g}_big.tgz"
        fi
    fi
done
ls -la "$FINAL_OUT"
