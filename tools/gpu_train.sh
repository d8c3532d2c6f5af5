#!/bin/bash
# One device call on a machine with 2 GPUs: the `train_ddp` experiment (results cache under $OUT).
#   1 GPU vs `torchrun --nproc_per_node=2` on the same global batch order (4 layers x 256, T 256, 300 steps),
#   the 1-GPU run twice (determinism) and with 2x micro-batches (a yardstick for reduction-order noise),
#   then GPT-2 small training tokens/s on one GPU for SDPA, the reference (PAPER_BF16) and the Triton kernel.
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> bash tools/gpu_train.sh [timeout s]
# (the device copy of the tree has no .git: pass the commit so the stored result names it)
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off (shared hosts); cuBLAS' reproducible workspace for deterministic runs
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
OUT=${OUT:-/tmp/lpfail_out}
mkdir -p "$OUT"
TIMEOUT=${1:-360}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee "$OUT/nvsmi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'GPUs', torch.cuda.device_count(), torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/nvsmi.txt"
LPFAIL_RESULTS_DIR=$OUT timeout "$TIMEOUT" python3 -m lpfail run train_ddp ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train_ddp.txt"
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$OUT/nvsmi.txt"
