#!/bin/bash
# Issue 16 in one device call: what the paper's official attention.py computes under torch.compile on the GPU.
#   1. the gpu-marked test of tests/test_official_check.py (PAPER_BF16 bit-identical to the eager official code)
#   2. `python -m lpfail run official_check` (results under $OUT/official_check.{json,npz}), with inductor's
#      generated Triton code logged to $OUT/inductor_output_code.log.gz (TORCH_LOGS=output_code)
#   3. the table (`python -m lpfail.experiments.official_check table`) to $OUT/table.txt
# The official code is not in the repository: carry the git-ignored folder that holds it, e.g. run(carry=
# [".official"]) after `git clone https://github.com/ucker/why-low-precision-training-fails .official` here.
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> bash tools/gpu_official_check.sh
# Afterwards, here: copy $OUT/official_check.{json,npz} into results/ and re-execute book/04_rounding.ipynb.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/lpfail_out}
mkdir -p "$OUT"
export LPFAIL_OFFICIAL_DIR=${LPFAIL_OFFICIAL_DIR:-$PWD/.official}
if [ ! -f "$LPFAIL_OFFICIAL_DIR/attention.py" ]; then
    echo "no official attention.py in $LPFAIL_OFFICIAL_DIR: carry the folder that holds it (see the header)" >&2
    exit 2
fi
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,memory.used --format=csv 2>&1 | tee "$OUT/nvsmi.txt"
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/nvsmi.txt"
( cd "$LPFAIL_OFFICIAL_DIR" && sha256sum attention.py; cat COMMIT 2>/dev/null ) | tee "$OUT/official_code.txt"
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -s -p no:cacheprovider tests/test_official_check.py -m gpu 2>&1 \
    | tee "$OUT/tests.txt" | grep -v "^$" | tail -15
echo "tests done at +$(( $(date +%s) - T0 )) s"
TORCH_LOGS=output_code TORCH_LOGS_OUT="$OUT/inductor_output_code.log" LPFAIL_RESULTS_DIR="$OUT" \
    timeout ${RUN_TIMEOUT:-400} python3 -m lpfail run official_check 2>&1 | tee "$OUT/run.txt" | grep -v "^$" | tail -20
echo "run done at +$(( $(date +%s) - T0 )) s"
gzip -f "$OUT/inductor_output_code.log" 2>/dev/null
LPFAIL_RESULTS_DIR="$OUT" python3 -m lpfail.experiments.official_check table 2>&1 | tee "$OUT/table.txt"
ls -la "$OUT"
