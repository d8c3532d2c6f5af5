#!/bin/bash
# The GPU steps that are not grids of training runs (those go through tools/gpu.sh), several in one device call
# under one deadline, each step's files packed into one archive under $OUT (a call returns at most 8 files).
# Steps run in the order given, each under the call's deadline (CALL_S seconds from the start, default 570):
#   kernels      the gpu-marked kernel tests, then the CPU tests that matter most on the card   → kernels.tgz
#   bench        `python -m lpfail run bench_kernels` and its table (on an idle GPU)           → kernels.tgz
#   host         the drop-in's host time per call (tools/gpu_overhead.py; idle GPU)            → kernels.tgz
#   trust        python -m lpfail.experiments.kernel_trust (Triton vs the reference)           → kernels.tgz
#   tune         issue 25's lever checks and timings beside cuDNN, the fix's costs, host time, prod_normaliser
#                (tools/gpu_kernels_tune.py; ≈ 4–6 min; TUNE_ARGS adds options, e.g. --pytest) → tune.tgz
#   robust-cost  the robust fix's cost in the kernel (tools/gpu_robust_cost.py)                → robust.tgz
#   official     official_check: the paper's attention.py eager and under torch.compile (carry .official;
#                its gpu test first; inductor's generated code logged)                         → official.tgz
#   prod         prod_kernels: the production back ends' bias on tied rows                     → prod.tgz
#   overhead     the monitor's overhead on GPT-2 small (tools/gpu_monitor_overhead.py; idle GPU) → prod.tgz
#   prod-tests   the gpu-marked tests of prod_kernels, monitor, substitute, cures              → prod.tgz
#   ge-extras    chapter 3's records: lr_sweep's A (3.2e-2, seed 0) retrained with checkpoints every 100
#                steps, the derivation checked on the GPU at steps 300/600/900, the replay 100→500 with a
#                branch per substitution.REPLAY_ROWS, the δ-term accumulated over 601–700     → extras.tgz
#   train-ddp    train_ddp (needs 2 GPUs): 1 GPU vs torchrun, determinism, tokens/s           → train.tgz
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> [CALL_S=570] bash tools/gpu_batch.sh STEP...
# Afterwards, here: unpack each archive into a scratch folder; results/*.{json,npz} files go to results/, the
# rest to results/kernels_gpu/ (kernels, prod, robust), results/substitution_gpu/ (extras). Plans, predictions and
# call logs: notes/gpu_plan.md.
set -o pipefail
# LPFAIL_CPU_PINS=0: the machine's own CPU kernels, as every stored GPU run had them (lpfail.numerics.OFF_VAR)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 LPFAIL_CPU_PINS=0
FINAL_OUT=${OUT:-/tmp/lpfail_out}
STAGE=${STAGE:-/tmp/lpfail_batch}
CALL_S=${CALL_S:-570}
T0=$(date +%s)
DEADLINE=$(( T0 + CALL_S ))
left() { echo $(( DEADLINE - $(date +%s) )); }
say() { echo "[batch $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
info() {
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,memory.used,temperature.gpu --format=csv,noheader
    python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
}
rm -rf "$STAGE"; mkdir -p "$STAGE" "$FINAL_OUT"
exec > >(tee "$FINAL_OUT/batch.log") 2>&1
info
step_kernels() {
    LPFAIL_KERNELS_AUTOTUNE=0 timeout "$1" python3 -m pytest -q -s -p no:cacheprovider -m gpu \
        $(ls tests/test_kernels*.py tests/test_robust_fix.py tests/test_dropin.py 2>/dev/null) 2>&1 \
        | tee "$OUT/tests.txt" | grep -v "^$" | tail -40
    LPFAIL_KERNELS_AUTOTUNE=0 timeout "$1" python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
        -k "units_of_alpha or raw_threshold or masked_out or raw_products" 2>&1 | tee -a "$OUT/tests.txt" | tail -3
}
step_bench() {
    LPFAIL_RESULTS_DIR=$OUT timeout "$1" python3 -m lpfail run bench_kernels ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt" | tail -5
    LPFAIL_RESULTS_DIR=$OUT python3 -c "
from lpfail import results; from lpfail.kernels.bench import table
print(table(results.read_result('bench_kernels', results.results_dir())))" 2>&1 | tee "$OUT/table.txt"
}
step_official() {
    export LPFAIL_OFFICIAL_DIR=${LPFAIL_OFFICIAL_DIR:-$PWD/.official}
    if [ ! -f "$LPFAIL_OFFICIAL_DIR/attention.py" ]; then say "official: no attention.py in $LPFAIL_OFFICIAL_DIR (carry .official)"; return 2; fi
    ( cd "$LPFAIL_OFFICIAL_DIR" && sha256sum attention.py; cat COMMIT 2>/dev/null ) | tee "$OUT/official_code.txt"
    timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/test_official_check.py -m gpu 2>&1 | tee "$OUT/tests.txt" | tail -10
    TORCH_LOGS=output_code TORCH_LOGS_OUT="$OUT/inductor_output_code.log" LPFAIL_RESULTS_DIR="$OUT" \
        timeout $(( $1 - 160 )) python3 -m lpfail run official_check 2>&1 | tee "$OUT/run.txt" | tail -15
    gzip -f "$OUT/inductor_output_code.log" 2>/dev/null
    LPFAIL_RESULTS_DIR="$OUT" python3 -m lpfail.experiments.official_check table 2>&1 | tee "$OUT/table.txt"
}
step_prod() {
    LPFAIL_RESULTS_DIR=$OUT timeout "$1" python3 -m lpfail run prod_kernels 2>&1 | tee "$OUT/prod_kernels.txt" | tail -15
}
step_ge_extras() {
    local a=$STAGE/extras_run
    python3 -m lpfail.experiments.gradient_error a-config --run "$a" &&
    python3 -m lpfail train --config "$a/train_config.json" --no-progress | tail -2 &&
    python3 -m lpfail.experiments.gradient_error gpu --run "$a" --steps 300,600,900 --rows 8 --out "$OUT/gradient_error_gpu.json" &&
    python3 -m lpfail.experiments.substitution replay --run "$a" --step 100 --until 500 --out "$OUT/replay.json"
    LPFAIL_NO_CAPTURE=1 python3 -m lpfail.experiments.gradient_error accumulate --run "$a" --step 600 --k 100 \
        --layer 0 --rows 8 --out "$OUT/accumulation.json"
    cp "$a/diag.jsonl" "$OUT/a_diag.jsonl" 2>/dev/null
}
for step in "$@"; do
    case "$step" in
        kernels|bench|host|trust) group=kernels;; tune) group=tune;; robust-cost) group=robust;; official) group=official;;
        prod|overhead|prod-tests) group=prod;; ge-extras) group=extras;; train-ddp) group=train;;
        *) echo "unknown step: $step (grids: tools/gpu.sh)" >&2; exit 2;;
    esac
    export OUT="$STAGE/$group"; mkdir -p "$OUT"
    avail=$(( $(left) - 10 ))
    if [ "$avail" -lt 20 ]; then say "no time left for $step"; continue; fi
    say "step $step ($avail s left)"
    case "$step" in
        kernels) step_kernels $(( avail / 2 ));;
        bench) step_bench "$avail";;
        host) timeout "$avail" python3 tools/gpu_overhead.py "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.txt" | tail -30;;
        trust) timeout "$avail" python3 -m lpfail.experiments.kernel_trust --out "$OUT/kernel_trust.json" 2>&1 \
                   | tee "$OUT/kernel_trust.txt" | tail -n 25;;
        robust-cost) timeout "$avail" python3 tools/gpu_robust_cost.py "$OUT";;
        tune) timeout "$avail" python3 tools/gpu_kernels_tune.py --budget $(( avail - 40 )) ${TUNE_ARGS:-} 2>&1 | tail -150;;
        official) step_official "$avail";;
        prod) step_prod "$avail";;
        overhead) timeout "$avail" python3 tools/gpu_monitor_overhead.py "$OUT/monitor_overhead.json" \
                      ${OVERHEAD_ARGS:---steps 610} 2>&1 | tail -30;;
        prod-tests) timeout "$avail" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_prod_kernels.py \
                        tests/test_monitor.py tests/test_substitute.py tests/test_cures.py 2>&1 | tee "$OUT/tests.txt" | tail -15;;
        ge-extras) timeout "$avail" bash -c "$(declare -f step_ge_extras); STAGE=$STAGE OUT=$OUT step_ge_extras";;
        train-ddp) NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 LPFAIL_RESULTS_DIR=$OUT \
                       timeout "$avail" python3 -m lpfail run train_ddp 2>&1 | tee "$OUT/train_ddp.txt" | tail -20;;
    esac
    say "step $step ended (rc $?)"
done
# A file that comes back may hold 16 MiB: each group's small files (≤ 4 MiB) go into GROUP.tgz, bigger ones into
# GROUP_big.tgz, dropped with a notice if it is still too big.
for d in "$STAGE"/*/; do
    [ -d "$d" ] || continue
    g=$(basename "$d")
    [ "$g" = extras_run ] && continue
    (cd "$d" && find . -type f -size -4097k | sort >"$STAGE/$g.small" && find . -type f -size +4096k | sort >"$STAGE/$g.big")
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
