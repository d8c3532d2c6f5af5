"""The δ signature's smoke test on the card, before the dial's long runs start (long_start.sh, asr_long_start.sh):
a long run's config for A_3 and SR_3, 3 steps with the signature at every step; exit 1 unless each run completes
with one record per step and finite sums."""
import dataclasses
import json
import math
import tempfile
import time

from lpfail.experiments import dial_training as D
from lpfail.train import read_diag, train

c = D.DialConfig()
for arm in ("A_3", "SR_3"):
    tc = dataclasses.replace(D.long_config(c, arm, 20), max_steps=3, warmup=1, val_every=0, diag_every=1,
                             delta_every=1, checkpoint_every=0, out_dir=tempfile.mkdtemp())
    t = time.time()
    res = train(tc, progress=False)
    dt = time.time() - t
    d = read_diag(tc.out_dir)
    ok = res.status == "completed" and d["delta_all"].shape[0] == 3 and all(map(math.isfinite, d["delta_all"].ravel()))
    print(arm, "ok" if ok else "FAILED", f"{dt:.1f} s", json.dumps({k: d[k][-1].tolist() for k in
          ("delta_tied", "delta_all", "delta_n_tied")})[:400], flush=True)
    if not ok:
        raise SystemExit(1)
