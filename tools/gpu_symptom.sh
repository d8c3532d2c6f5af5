#!/bin/bash
# One device call of the `symptom` search (issue 3) on one H200; results under $OUT.
#   first     wipe the runs directory, run the checks (Triton vs reference for each kernel variant; stop +
#             continue from a checkpoint) and the sweep for at most $BUDGET s, then store what exists
#   continue  keep the runs directory (the machine stayed warm since the last call): continue every
#             unfinished run from its newest checkpoint for at most $BUDGET s, then store
#   store     train nothing: collect the runs directory and store
# Usage (GPU machine, repo root):
#   LPFAIL_GIT=<commit> [BUDGET=420] [SYMPTOM_SET="lr=0.02 variants=A,C,Bp"] bash tools/gpu_symptom.sh first|continue|store
# Every mode writes $OUT/symptom.{json,npz} (a partial result says complete=false and which runs are
# incomplete), $OUT/symptom_<mode>.txt (the log), $OUT/outcome_table.md, $OUT/checks.json and
# $OUT/symptom_runs.tgz (every run's log.jsonl, diag.jsonl, run.json, stdout.txt; no checkpoints).
# The runs live in $LPFAIL_SYMPTOM_ROOT (default /tmp/lpfail_symptom)/<config hash>/: a different
# SYMPTOM_SET is a different directory, so several configurations can be continued side by side.
set -o pipefail
MODE=${1:-first}
case "$MODE" in first|continue|store) ;; *) echo "usage: $0 first|continue|store" >&2; exit 2;; esac
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
export LPFAIL_SYMPTOM_ROOT=${LPFAIL_SYMPTOM_ROOT:-/tmp/lpfail_symptom}
OUT=${OUT:-/tmp/lpfail_out}
mkdir -p "$OUT" "$LPFAIL_SYMPTOM_ROOT"
BUDGET=${BUDGET:-420}
[ "$MODE" = store ] && BUDGET=0
SETS=()
for kv in ${SYMPTOM_SET:-}; do SETS+=(--set "$kv"); done
ROOT=$(python3 -c "import sys; from lpfail import results, symptom as S; c = results.typed_config(results.get('symptom'), dict(a.split('=', 1) for a in sys.argv[1:])); print(S.symptom_root(c))" ${SYMPTOM_SET:-})
echo "mode $MODE, budget $BUDGET s, runs in $ROOT, sets: ${SYMPTOM_SET:-none}" | tee "$OUT/symptom_$MODE.txt"
[ "$MODE" = first ] && rm -rf "$ROOT"
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$OUT/symptom_$MODE.txt"
# the sweep stops its runs at the budget; timeout is the backstop (SIGTERM: the driver stops its runs too)
LPFAIL_SYMPTOM_BUDGET_S=$BUDGET LPFAIL_RESULTS_DIR=$OUT timeout -k 20 $((BUDGET + 120)) \
    python3 -m lpfail run symptom "${SETS[@]}" 2>&1 | tee -a "$OUT/symptom_$MODE.txt"
RC=$?
cp -f "$ROOT/outcome_table.md" "$ROOT/checks.json" "$OUT/" 2>/dev/null
[ -d "$ROOT" ] && tar -C "$ROOT" --exclude='*.pt' --exclude='batches_rank*' -czf "$OUT/symptom_runs.tgz" .
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$OUT/symptom_$MODE.txt"
du -sh "$LPFAIL_SYMPTOM_ROOT" 2>&1 | tee -a "$OUT/symptom_$MODE.txt"
exit $RC
