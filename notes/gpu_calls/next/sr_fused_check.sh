#!/bin/bash
# First call of the next session (before any run trains with the fused rounding kernels of 0.5.3):
#   LPFAIL_GIT=<commit> bash notes/gpu_calls/next/sr_fused_check.sh            (≈ 200–300 s)
# 1. Timing, alone on the card, 120 captured steps each of lr_sweep's large A_sr and the dial's SR_3 and A_3, with
#    the fused kernels and with the PyTorch path (LPFAIL_FUSED_ROUNDING=0), each in its own process; the last
#    losses of the two must be equal (printed).
# 2. The fused kernels' gpu tests (tests/test_sr_stream.py -m gpu: eager, captured, a training run; fused = PyTorch).
# 3. Beside 2: the stored stochastic-rounding runs (PyTorch path: confirmation's A_sr, the dial's SR_3 … SR_6, with
#    C and A_3 beside them as controls; all from an H100) trained again for 300 steps with the fused kernel and
#    compared bit for bit (`lpfail.sweep.rerun`).
# Then: asr_long_start.sh (the driver) in the next call if 2 and 3 pass; with LPFAIL_FUSED_ROUNDING=0 exported if not.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LPFAIL_CPU_PINS=0 CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p $OUT/f
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/f/gpu.txt 2>&1
cat > /tmp/sr_time.py <<'PY'
import dataclasses, json, os, sys, tempfile, time
from lpfail.sweep import grid as G
from lpfail.train import train
grid, key = sys.argv[1], sys.argv[2]
run = [r for r in G.get(grid).runs() if r.key == key][0]
tc = dataclasses.replace(run.config, max_steps=120, val_every=0, diag_every=0, checkpoint_every=0,
                         out_dir=tempfile.mkdtemp())
t = time.time(); res = train(tc, progress=False); dt = time.time() - t
print(json.dumps({"run": key, "fused": os.environ.get("LPFAIL_FUSED_ROUNDING", "1"), "seconds_120_steps": round(dt, 2),
                  "last_losses": [float(x) for x in res.losses[-3:]], "status": res.status}), flush=True)
PY
for R in "lr_sweep large/A_sr/lr0.008/s0" "dial_training small/SR_3/lr0.008/s20" "dial_training small/A_3/lr0.008/s20"; do
  for F in 1 0; do LPFAIL_FUSED_ROUNDING=$F timeout 90 python3 /tmp/sr_time.py $R 2>&1 | tail -1; done
done | tee $OUT/f/timing.txt
cat > /tmp/sr_rerun.py <<'PY'
import json, sys
from pathlib import Path
from lpfail.sweep import rerun
from lpfail.sweep.session import machine_info
items = [i for i in rerun.plan(300, grids=("confirmation", "dial_training"))
         if i.run.group in ("A_sr", "SR_3", "SR_4", "SR_5", "SR_6", "C", "A_3") and i.run.config.n_layer == 4]
rows = rerun.execute(items, Path("/tmp/lpfail_sr_rerun"), 230, len(items))
Path(sys.argv[1]).write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1) + "\n")
print("\n".join(f"{r['key']}: {rerun.word(r)}" for r in rows))
PY
if [ -n "${START_DRIVER:-}" ]; then  # issue 38's driver now, the checks below beside it (see call23.sh)
  python3 - $OUT/f/timing.txt > $OUT/f/decision.txt <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows: by.setdefault(r["run"], {})[r["fused"]] = r
same = [k for k, v in by.items() if "1" in v and "0" in v and v["1"]["last_losses"] == v["0"]["last_losses"]]
ok = len(same) == 3
big = by.get("lr_sweep large/A_sr/lr0.008/s0".split()[1], {})
ratio = big["1"]["seconds_120_steps"] / big["0"]["seconds_120_steps"] if len(big) == 2 else None
print(json.dumps({"fused_ok": ok, "pairs_equal": same, "large_asr_ratio": ratio}))
PY
  cat $OUT/f/decision.txt
  grep -q '"fused_ok": true' $OUT/f/decision.txt || export LPFAIL_FUSED_ROUNDING=0
  mkdir -p $OUT/a
  LPFAIL_SWEEP_PARALLEL=${PARALLEL:-8} bash tools/gpu.sh start lr_sweep --budget ${BUDGET:-1200} > $OUT/a/start.log 2>&1
  echo "start rc $? (lr_sweep, ${PARALLEL:-8} at a time, fused ${LPFAIL_FUSED_ROUNDING:-1})" >> $OUT/a/start.log
  tail -3 $OUT/a/start.log
fi
( timeout 280 python3 /tmp/sr_rerun.py $OUT/f/sr_rerun.json > $OUT/f/sr_rerun.log 2>&1; echo "rc $?" >> $OUT/f/sr_rerun.log ) &
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_sr_stream.py > $OUT/f/tests.log 2>&1; echo "tests rc $?"
tail -4 $OUT/f/tests.log
wait
echo "== reruns"; grep -v "^\[" $OUT/f/sr_rerun.log | tail -20
if [ -n "${START_DRIVER:-}" ]; then
  W=$(( 570 - SECONDS )); [ $W -gt 30 ] || W=30
  bash tools/gpu.sh wait lr_sweep --wait $W 2>&1 | tail -6
fi
