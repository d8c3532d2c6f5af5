"""lpfail.numerics: the CPU numeric pins set when lpfail is imported, what is in effect, and the one-ulp nudge."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lpfail import numerics

REPO = Path(__file__).resolve().parent.parent
PIN_VARS = (*numerics.PINS, numerics.OFF_VAR, numerics.NUDGE_VAR)


def _py(code: str, **env) -> dict:
    """Run `code` in a fresh interpreter whose environment holds none of the pins (plus `env`); its last line of
    output parsed as JSON."""
    base = {k: v for k, v in os.environ.items() if k not in PIN_VARS}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**base, **env}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


STATE = "import json, lpfail, torch; from lpfail import numerics; print(json.dumps([numerics.state(), numerics.deviations()]))"


def test_importing_lpfail_pins_the_cpu_numerics_with_no_environment():
    state, dev = _py(STATE)
    assert dev == []
    assert state["ATEN_CPU_CAPABILITY"] == numerics.CAPABILITY and state["threads"] == numerics.THREADS
    assert state["MKL_CBWR"] == "COMPATIBLE" and state["ONEDNN_MAX_CPU_ISA"] == "AVX2"


def test_an_explicit_setting_wins_and_is_reported():
    state, dev = _py(STATE, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    assert state["threads"] == 1
    assert any("OMP_NUM_THREADS=1" in d for d in dev) and any("threads" in d for d in dev)


def test_pins_off_leaves_the_machine_alone():
    state, dev = _py(STATE, LPFAIL_CPU_PINS="0")
    assert state["MKL_CBWR"] is None and not state["pins"]
    assert any("pins are off" in d for d in dev)


def test_require_pinned_refuses_with_the_remedy(monkeypatch):
    monkeypatch.setattr(numerics, "deviations", lambda st=None: ["torch uses 1 threads (pinned: 2)"])
    with pytest.raises(numerics.NumericsError, match="not stored.*1 threads.*import lpfail before torch"):
        numerics.require_pinned("result 'x'")


def test_the_nudge_moves_every_random_draw_up_by_one_ulp():
    code = ("import json, lpfail, torch, numpy as np; "
            "a = torch.randn(64, generator=torch.Generator().manual_seed(0)); "
            "b = torch.empty(64).normal_(generator=torch.Generator().manual_seed(1)); "
            "c = np.random.default_rng(0).normal(size=8); "
            "print(json.dumps([a.tolist(), b.tolist(), c.tolist()]))")
    plain, nudged = _py(code), _py(code, LPFAIL_NUDGE="1")
    import numpy as np
    import torch

    for p, n, dtype in zip(plain, nudged, (torch.float32, torch.float32, torch.float64)):
        p, n = torch.tensor(p, dtype=dtype), torch.tensor(n, dtype=dtype)
        assert torch.equal(n, torch.nextafter(p, torch.full_like(p, float("inf"))))
    assert np.all(np.array(nudged[2]) > np.array(plain[2]))


def test_provenance_names_the_processor_and_the_state():
    prov = numerics.provenance()
    assert {"model", "isa", "ATEN_CPU_CAPABILITY", "threads", "MKL_CBWR", "nudge", "pins"} <= set(prov)


def test_unpinned_env_drops_only_what_lpfail_set(monkeypatch):
    monkeypatch.setattr(numerics, "_SET_HERE", {"MKL_CBWR"})
    env = numerics.unpinned_env({"MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "4", "PATH": "/bin"})
    assert env == {"OMP_NUM_THREADS": "4", "PATH": "/bin", numerics.OFF_VAR: "0"}


def test_the_gpu_driver_runs_training_unpinned(tmp_path, monkeypatch):
    """A GPU sweep's runs draw their weights with the machine's CPU kernels, as every stored GPU run did."""
    from lpfail.sweep import driver

    monkeypatch.setattr(numerics, "_SET_HERE", {"ATEN_CPU_CAPABILITY"})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    s = driver._Sweep([], 1, 10.0, True, None, 0.0, print, ["0"], None, None)
    assert "ATEN_CPU_CAPABILITY" not in s.env and s.env[numerics.OFF_VAR] == "0"
    cpu = driver._Sweep([], 1, 10.0, True, None, 0.0, print, [], None, None)
    assert cpu.env["ATEN_CPU_CAPABILITY"] == "default"


def test_a_nudged_generator_passes_through_default_rng_as_numpys_own_does():
    """numpy's default_rng(gen) returns gen; the nudge keeps that (confirmation_power passes its generators on)."""
    code = ("import json, lpfail, numpy as np; g = np.random.default_rng(0); "
            "print(json.dumps([np.random.default_rng(g) is g, np.random.default_rng(g).normal()]))")
    plain, nudged = _py(code), _py(code, LPFAIL_NUDGE="1")
    assert plain[0] is True and nudged[0] is True
    import numpy as np

    assert nudged[1] == float(np.nextafter(plain[1], np.inf))
