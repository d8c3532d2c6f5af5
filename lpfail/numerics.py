"""CPU numerics that do not depend on the machine: the pins, what is in effect, and the perturbation test.

Floating-point results on a CPU depend on more than the code: ATen picks vectorised kernels by the instruction
set (AVX2, AVX-512), MKL and oneDNN pick code paths by processor, and reductions split by the thread count. A
stored result or a printed chapter output that a test compares exactly must come out the same on any x86-64
machine, so the library pins all of them (`PINS`) when it is imported:

* ``ATEN_CPU_CAPABILITY=default`` — ATen's portable kernels, not its AVX2 / AVX-512 ones;
* ``MKL_CBWR=COMPATIBLE`` and ``ONEDNN_MAX_CPU_ISA=AVX2`` — MKL's and oneDNN's processor-independent paths;
* ``OMP_NUM_THREADS=2``, ``MKL_NUM_THREADS=2`` — a fixed thread count (reductions split by it).

The pins act only when they are set before torch starts, so `apply()` runs at the top of ``lpfail/__init__``
and sets each one that the environment does not already set (an explicit setting wins: that is how a test runs
the same code under other settings). `state()` reads what is actually in effect, `deviations()` lists how it
differs from the pins, and `require_pinned()` refuses, with the remedy, to store a result computed otherwise.
`provenance()` is what every stored result records: the processor, its best instruction set and the state.

Pins make the arithmetic repeatable; they cannot make a chaotic computation meaningful. The test of that is the
*nudge*: with ``LPFAIL_NUDGE=1`` in the environment when lpfail is imported, every random draw (torch's and
numpy's, model initialisation included) is moved up by one unit in the last place. An output that changes under
the nudge depends on the last bit of its inputs, so it will differ between machines whatever the pins; the
two-settings check (`tools/cpu_invariance.py`, part of ``make test``) executes the chapters under other thread
counts, instruction sets and the nudge, and requires every compared output to stay the same.
"""
from __future__ import annotations

import functools
import os
import platform
import sys

#: The numeric pins (environment variables read when torch, MKL, oneDNN and OpenMP start).
PINS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
#: Threads the pins give torch (`torch.get_num_threads()`).
THREADS = int(PINS["OMP_NUM_THREADS"])
#: ATen's name for the pinned capability (`torch.backends.cpu.get_cpu_capability()`).
CAPABILITY = "DEFAULT"
NUDGE_VAR = "LPFAIL_NUDGE"
#: ``LPFAIL_CPU_PINS=0`` leaves the CPU numerics to the machine. The GPU scripts set it (tools/gpu.sh,
#: tools/gpu_batch.sh): a training run draws its initial weights on the CPU, and ATen's portable normal sampler
#: gives other values than its AVX2 / AVX-512 one (which agree), so pinned runs would not reproduce the stored GPU
#: runs, all drawn with the machine's vector kernels. A pinned CPU run of the same TrainConfig starts from the
#: portable sampler's weights.
OFF_VAR = "LPFAIL_CPU_PINS"


class NumericsError(RuntimeError):
    """The CPU numerics in effect are not the pinned ones, where a result is about to be stored."""


def apply() -> list[str]:
    """Set every pin the environment does not set already; returns the names set here. Called when lpfail is
    imported, before it imports torch. If torch was imported first, ATen and the thread pool may already have
    read their settings: `state()` tells, and `require_pinned()` refuses to store a result then."""
    global _TORCH_FIRST
    _TORCH_FIRST = "torch" in sys.modules
    if os.environ.get(OFF_VAR, "").strip() == "0":
        return []
    set_here = []
    for key, value in PINS.items():
        if key not in os.environ:
            os.environ[key] = value
            set_here.append(key)
    _SET_HERE.update(set_here)
    if os.environ.get(NUDGE_VAR, "").strip() not in ("", "0"):
        install_nudge()
    return set_here


@functools.lru_cache(maxsize=1)
def cpu() -> dict:
    """The processor: its model name and the best vector instruction set it reports (from /proc/cpuinfo where
    there is one)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = next((name for name, flag in (("AVX-512", "avx512f"), ("AVX2", "avx2"), ("AVX", "avx"),
                                        ("SSE4.2", "sse4_2")) if flag in flags), platform.machine())
    return {"model": model, "isa": isa}


def state() -> dict:
    """The CPU numerics in effect now: ATen's capability and torch's threads as torch reports them, and the MKL /
    oneDNN variables as the environment holds them."""
    import torch

    return {"ATEN_CPU_CAPABILITY": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "MKL_CBWR": os.environ.get("MKL_CBWR"),
            "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
            "nudge": nudged(), "pins": os.environ.get(OFF_VAR, "").strip() != "0"}


def deviations(st: dict | None = None) -> list[str]:
    """How `state()` differs from the pins, one phrase each; empty when everything is pinned."""
    st = state() if st is None else st
    out = []
    if str(st["ATEN_CPU_CAPABILITY"]).upper() != CAPABILITY:
        out.append(f"ATen runs its {st['ATEN_CPU_CAPABILITY']} kernels (pinned: {CAPABILITY})")
    if st["threads"] != THREADS:
        out.append(f"torch uses {st['threads']} threads (pinned: {THREADS})")
    for key in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if st[key] != PINS[key]:
            out.append(f"{key}={st[key]} (pinned: {PINS[key]})")
    if not st.get("pins", True):
        out.append(f"{OFF_VAR}=0: the pins are off")
    if st["nudge"]:
        out.append(f"{NUDGE_VAR} is set: every random draw is nudged by one ulp")
    return out


def require_pinned(what: str) -> None:
    """Raise NumericsError naming the remedy unless the pinned numerics are in effect."""
    dev = deviations()
    if dev:
        raise NumericsError(
            f"{what}: not stored, because the CPU numerics are not the pinned ones ({'; '.join(dev)}), so the "
            "result would depend on this machine. Unset those variables, and import lpfail before torch "
            "(`python -m lpfail run NAME` does both).")


def provenance() -> dict:
    """What a stored result records about the CPU numerics it was computed under."""
    return {**cpu(), **state()}


# -- the nudge ------------------------------------------------------------------------------------------------
_NUDGED = False


def nudged() -> bool:
    return _NUDGED


def _up(t):
    """`t` moved up by one ulp where it is a floating-point tensor (in place, returned)."""
    import torch

    if isinstance(t, torch.Tensor) and t.is_floating_point():
        with torch.no_grad():
            t.copy_(torch.nextafter(t, torch.full_like(t, float("inf"))))
    return t


def install_nudge() -> None:
    """Move every later random draw of torch and numpy up by one ulp (see the module's docstring). Idempotent."""
    global _NUDGED
    if _NUDGED:
        return
    import numpy as np
    import torch

    def wrap_fn(fn):
        @functools.wraps(fn)
        def nudged_fn(*args, **kwargs):
            return _up(fn(*args, **kwargs))
        return nudged_fn

    for name in ("randn", "rand", "randn_like", "rand_like", "normal"):
        setattr(torch, name, wrap_fn(getattr(torch, name)))
    for name in ("normal_", "uniform_", "exponential_", "log_normal_", "cauchy_", "geometric_"):
        setattr(torch.Tensor, name, wrap_fn(getattr(torch.Tensor, name)))

    class NudgedGenerator:
        """numpy's Generator with its floating-point draws moved up by one ulp."""
        _FLOAT = {"random", "standard_normal", "normal", "uniform", "exponential", "standard_exponential",
                  "lognormal", "gamma", "standard_gamma", "beta", "laplace", "logistic", "standard_cauchy"}

        def __init__(self, gen):
            self._gen = gen

        def __getattr__(self, name):
            attr = getattr(self._gen, name)
            if name not in self._FLOAT:
                return attr

            def draw(*args, **kwargs):
                x = attr(*args, **kwargs)
                return np.nextafter(x, np.inf) if np.asarray(x).dtype.kind == "f" else x
            return draw

    default_rng = np.random.default_rng
    def nudged_default_rng(*a, **k):
        # default_rng(generator) returns that generator, as numpy's does: a nudged one is not wrapped twice
        if a and isinstance(a[0], NudgedGenerator):
            return a[0]
        return NudgedGenerator(default_rng(*a, **k))

    np.random.default_rng = nudged_default_rng
    for name in ("randn", "rand", "random", "normal", "uniform", "standard_normal"):
        fn = getattr(np.random, name)
        setattr(np.random, name, (lambda f: lambda *a, **k: np.nextafter(f(*a, **k), np.inf))(fn))
    _NUDGED = True


_TORCH_FIRST = False
_SET_HERE: set[str] = set()


def unpinned_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process that leaves the CPU numerics to the machine: without the pins this process set
    (an explicit setting from outside stays) and with ``LPFAIL_CPU_PINS=0``."""
    return {**{k: v for k, v in env.items() if k not in _SET_HERE}, OFF_VAR: "0"}


def torch_imported_first() -> bool:
    """Whether torch had been imported before lpfail set the pins (then ATen, MKL and OpenMP may have read their
    settings already)."""
    return _TORCH_FIRST
