#!/bin/bash
# The `cures` experiment (issue 14, chapter 6) on a GPU machine: lr_sweep's driver script (tools/gpu_lr_sweep.sh,
# run with EXP=cures) with the cures grid — lr_sweep's small-size grid with the 7 new cure variants
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
EXP=cures ALL_VARIANTS=A_hp,A_res,Bp,R,A_ds,A_z,A_cap exec bash "$(dirname "$0")/gpu_lr_sweep.sh" "$@"
