#!/bin/bash
# This session's first call (2026-12-07, fourth session), one command whatever card comes:
#   LPFAIL_GIT=<commit> BUDGET=<driver s> bash notes/gpu_calls/next/call23.sh
# On an H200 (unless SKIP42 is set): issue 42's measurements on the idle card (k42_h200.sh) and nothing else; the
# next call is this one again with SKIP42=1. Otherwise: sr_fused_check.sh with START_DRIVER=1 — the timing pairs
# alone on the card, then lr_sweep's 16 large A_sr runs (PARALLEL at a time, default 8: two waves, so that a
# deadline loses at most the second) with the fused kernels if every timing pair's losses are equal, and the gpu
# tests and the 300-step reruns beside the driver; a wait to ≈ 570 s.
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ -z "${SKIP42:-}" ]; then
  exec bash notes/gpu_calls/next/k42_h200.sh
fi
START_DRIVER=1 exec bash notes/gpu_calls/next/sr_fused_check.sh
