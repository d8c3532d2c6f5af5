#!/bin/bash
# Fix-b (issue 13): the `fix_training` experiment's new runs — B′ (Algorithm 3, no clamp) and R (the robust fix),
# 6 learning rates × 3 seeds at lr_sweep's smaller size, 36 runs — on one GPU, in one device call.
# A, C and B are lr_sweep's stored runs (results/lr_sweep_parts/, copied in so they are not rerun).
# It is lr_sweep's driver script (tools/gpu_lr_sweep.sh) run with EXP=fix_training: CUDA MPS when the machine has
# it, graph checks for Bp and R (a variant whose captured steps differ runs uncaptured, the same arithmetic), the
# driver, then the new part files, the checks and the logs to $OUT. `start` is the default mode; with
# WAIT ≥ BUDGET + 60 one call sees the driver through, else follow with `wait`.
# Expected cost (lead's measurement, 2026-12-01: a captured 4 × 256 run takes 30–120 s with 12 processes under
# MPS on one H200): 36 runs in 3 waves of 12 ≈ 2–6 min, plus ≈ 1–2 min of checks and start-up: under 10 min.
# Afterwards, here: cp $OUT/part-*.json results/lr_sweep_parts/ && python -m lpfail.experiments.fix_training collect
# Usage (GPU machine, repo root): LPFAIL_GIT=<commit> BUDGET=420 WAIT=540 bash tools/gpu_fix_training.sh [start|wait|collect]
BUDGET=${BUDGET:-420} EXP=fix_training ALL_VARIANTS=Bp,R exec bash "$(dirname "$0")/gpu_lr_sweep.sh" "${@:-start}"
