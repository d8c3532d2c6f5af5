"""tools/gpu_kernels_tune.py (issue 25's one GPU call) on a machine without a GPU: the compile jobs it hands its
worker processes (recorded from the launcher's own launches, nothing launched), the levers each timed method uses,
and the summary table from known timings. Run in a subprocess without TRITON_INTERPRET: the script compiles for
the GPU, and the CPU test session has switched Triton to its interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import collections, math, pickle, sys
sys.path.insert(0, "tools")
import gpu_kernels_tune as g
from lpfail.kernels import NEXT_LEVERS, Tuning

jobs = g.compile_jobs("cpu")
kinds = collections.Counter(j[0][0] for j in jobs)
assert set(kinds) == {"fwd", "dq", "dkdv", "delta", "fused", "dqa", "dqep"} and 200 < len(jobs) < 900, (len(jobs),
                                                                                                kinds)
assert len({repr(j) for j in jobs}) == len(jobs)
pickle.loads(pickle.dumps(jobs))
consts = [dict(j[2]) for j in jobs if j[0][0] == "fwd"]
assert any(c["TMA"] == ("raw", True) for c in consts) and any(c["TIE"] == ("raw", 1) for c in consts)
assert any(c["CAUSAL"] == ("raw", False) for c in consts)                       # the normaliser's full attention
assert any(j[0] == ("fused", "sm90") for j in jobs) and any(j[0] == ("dq", "sm90") for j in jobs)
assert not any(j[0][0] == "dkdv" and j[0][1][1] for j in jobs)                   # no atomic backward timed any more
fused = [dict(j[2]) for j in jobs if j[0][0] == "fused"]
assert any(c["TMA"] == ("raw", True) for c in fused) and all("ORDER" not in c for c in fused)
assert all(g._decode(v) is not None for j in jobs for _, v in j[2])
warps = {dict(j[3]).get("num_warps") for j in jobs if j[3]}
assert warps == {4, 8}, warps
dqa = [dict(j[2]) for j in jobs if j[0][0] == "dqa"]                              # the five-matmul backward
assert {c["DESC_ATOMIC"] for c in dqa} == {("raw", True), ("raw", False)} and any(j[0] == ("dqa", "sm90") for j in jobs)
assert any(dict(j[2])["HEAD_DIM"] == ("raw", 64) for j in jobs if j[0][0] == "dqep")
assert g._uses_failed("next_fma_dqa", {"dqatma"}) and not g._uses_failed("fma_dqa_ptr", {"dqatma"})
assert g._uses_failed("fma_dqa_ptr", {"dqa"}) and g.EXTRA_SHAPES == ((8, 12, 1024, 64),)
assert g._uses_failed("next_fma", {"fused"}) and g._uses_failed("fma_tmab_fused", {"tmab"})
assert g._uses_failed("next_fma_robust", {"auto"}) and not g._uses_failed("fma_tmab_fused", {"tma"})
assert not g._uses_failed("base_fma", {"tma", "next"}) and not g._uses_failed("sdpa_cudnn", {"tma"})
for name, tie in (("next_fma_robust_count", "count"), ("next_fma_robust_max2", "max2")):
    t = g.FIX_METHODS[name][1]
    assert t.tie == tie and all(getattr(t, f) == getattr(NEXT_LEVERS, f) for f in ("tma", "space", "order", "bwd"))
    assert g.FIX_METHODS[name][2] in g.FIX_METHODS and any(p[1] == name for p in g.PAIRS)
cells = {f"{m} d={d} N={n}": {"fwd": {"tflops": 100.0 * (m == "sdpa_cudnn") + 80.0},
                              "fwd_bwd": {"tflops": 50.0}} for m in g.METHODS for d in g.HEAD_DIMS for n in g.SEQ_LENS}
pairs = {f"next_fma_alg3/next_fma d=64 N={n}": {"fwd": {"cost": 0.04}, "fwd_bwd": {"cost": 0.01}} for n in g.SEQ_LENS}
text = g.summary({"cells": cells}, pairs, {"dropin fwd": {"median_us": 31.0}}, {"checks": {"a": {"ok": True}},
                                                                              "check_failures": []})
assert "checks: 1 of 1 passed" in text and "180 /  180 /  180 /  180 ;" in text and "0.44 / 0.44" in text, text
assert "+4.0% /  +4.0%" in text and "+1.0%" in text and "dropin fwd 31" in text, text
print("OK", len(jobs), dict(kinds))
"""


def _run_script(script: str) -> None:
    """`script` in a fresh interpreter without Triton's interpreter switch; it must print OK."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    print(run.stdout[-2000:])
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


def test_dry_run_compile_jobs_methods_and_summary():
    _run_script(SCRIPT)


FOCUS_SCRIPT = r"""
import collections, sys
sys.path.insert(0, "tools")
import gpu_kernels_tune as g
from lpfail.kernels import NEXT_LEVERS

g.focus(g.FOCUS_DROPIN)
assert list(g.METHODS) == ["sdpa_cudnn", "sdpa_flash", "next_sub", "next_sub_dqa"], list(g.METHODS)
assert g.METHODS["next_sub"][2] is None and g.METHODS["next_sub_dqa"][2] == "next_sub"   # guarded against the default
assert g.METHODS["next_sub"][1] == NEXT_LEVERS and g.METHODS["next_sub_dqa"][1].bwd == "dq_atomic"
assert g.FIX_METHODS["next_sub_dqa_robust"][1] == g.METHODS["next_sub_dqa"][1]
assert g.FIX_METHODS["next_sub_dqa_robust"][0] == g.FIX_METHODS["next_sub_robust"][0]
assert set(g.LEVERS) == {"fused", "next", "dqa", "dqatma"} and len(g.PAIRS) == 2
jobs = g.compile_jobs("cpu")
kinds = collections.Counter(j[0][0] for j in jobs)
assert {"fwd", "fused", "dqa", "dqep"} <= set(kinds) and 20 < len(jobs), (len(jobs), kinds)
print("OK", len(jobs), dict(kinds))
"""


def test_focus_dropin_times_only_the_dropins_methods():
    _run_script(FOCUS_SCRIPT)
