#!/bin/bash
# Issue 39's long horizon: the dial's 25 runs of 10,000 steps at 8e-3 (notes/gpu_plan.md), first call of a session.
#   LPFAIL_GIT=<commit> BUDGET=<driver seconds> [PARALLEL=5] bash notes/gpu_calls/next/long_start.sh
# 1. A smoke test of the δ signature on the card (a long run's config, 3 steps, delta every step: one record per
#    step with finite sums), ≈ 20 s; the driver is not started if it fails.
# 2. The driver for dial_training (only the long runs are missing), PARALLEL at a time through the control file.
# 3. A wait that ends this call in time; later calls: `bash tools/gpu.sh wait dial_training --wait S`.
set -u
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
PYTHONPATH=$PWD LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 120 python3 - > $OUT/a/smoke.log 2>&1 <<'PY'
import dataclasses, json, math, tempfile, time
from lpfail.experiments import dial_training as D
from lpfail.train import read_diag, train
c = D.DialConfig()
for arm in ("A_3", "SR_3"):
    tc = dataclasses.replace(D.long_config(c, arm, 20), max_steps=3, warmup=1, val_every=0, diag_every=1,
                             delta_every=1, checkpoint_every=0, out_dir=tempfile.mkdtemp())
    t = time.time(); res = train(tc, progress=False); dt = time.time() - t
    d = read_diag(tc.out_dir)
    ok = res.status == "completed" and d["delta_all"].shape[0] == 3 and all(map(math.isfinite, d["delta_all"].ravel()))
    print(arm, "ok" if ok else "FAILED", f"{dt:.1f} s", json.dumps({k: d[k][-1].tolist() for k in
          ("delta_tied", "delta_all", "delta_n_tied")})[:400], flush=True)
    assert ok
PY
rc=$?; echo "smoke rc $rc"; tail -3 $OUT/a/smoke.log
[ $rc -eq 0 ] || exit 1
bash tools/gpu.sh start dial_training --budget ${BUDGET:-1300} > $OUT/a/start.log 2>&1
echo "{\"parallel\": ${PARALLEL:-5}}" > /tmp/lpfail_session/runs/control.json
echo "start rc $?" >> $OUT/a/start.log; tail -4 $OUT/a/start.log
W=$(( 570 - SECONDS )); [ $W -gt 30 ] || W=30
bash tools/gpu.sh wait dial_training --wait $W 2>&1 | tail -8
