"""The kernels compile for an H100/H200 (sm_90) on this CPU machine, with launch-like specialisation.

Triton's CPU interpreter runs Python, so it accepts code the GPU compiler refuses (a jitted function reading a
non-constexpr global cost a device call once). `tools/compile_check.py --quick` compiles one variant per code
path for sm_90 and fails on a compile error, on a variant over the H200's shared memory per block, or on one
whose K/V loads are not software-pipelined. It runs in its own process: the kernel tests switch this one to
the interpreter (TRITON_INTERPRET=1), under which nothing compiles for a GPU.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_kernels_compile_for_sm90_with_pipelined_loads():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check.py"), "--quick"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "33 variants, 0 failed" in run.stdout
