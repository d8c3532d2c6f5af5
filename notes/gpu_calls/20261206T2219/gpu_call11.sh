#!/bin/bash
# Call 11 (untracked; deleted after the session): the alarm grid's driver, then kmerge's gpu tests beside it.
set -u
export LPFAIL_GIT=7b0e70d915d13186d9cb35134513042bdc7e0a1a
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${MEM:-0}" -gt 100000 ]; then export LPFAIL_SWEEP_PARALLEL=12; else export LPFAIL_SWEEP_PARALLEL=8; fi
echo "parallel $LPFAIL_SWEEP_PARALLEL (memory $MEM MiB)" | tee -a $OUT/a/gpu.txt
bash tools/gpu.sh start precision_alarm_fresh --budget 1150 > $OUT/a/start.log 2>&1; echo "start rc $?" >> $OUT/a/start.log
tail -5 $OUT/a/start.log
T0=$(date +%s)
( cd gpu_kmerge && ln -sfn ../results results && PYTHONPATH=$PWD PYTHONUNBUFFERED=1 timeout 300 python3 -m pytest -q -m gpu -x \
   tests/test_kernels.py tests/test_kernels_bwd.py tests/test_kernels_head_dims.py tests/test_dropin.py \
   tests/test_robust_fix.py tests/test_prod_kernels.py tests/test_model.py > $OUT/a/kmerge_gpu.log 2>&1; echo "rc $?" >> $OUT/a/kmerge_gpu.log )
tail -4 $OUT/a/kmerge_gpu.log
( cd gpu_kmerge && PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_KERNELS_AUTOTUNE=0 timeout 150 python3 -m pytest -q -s \
   tests/test_kernels_dq_atomic.py > $OUT/a/kmerge_dqa.log 2>&1; echo "rc $?" >> $OUT/a/kmerge_dqa.log )
tail -4 $OUT/a/kmerge_dqa.log
echo "tests took $(( $(date +%s) - T0 )) s"
W=$(( 575 - SECONDS )); [ $W -gt 30 ] || W=30
bash tools/gpu.sh wait precision_alarm_fresh --wait $W 2>&1 | tail -6
ls -la $OUT $OUT/a
