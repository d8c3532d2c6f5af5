"""The two-settings check: what a test compares exactly must not depend on the CPU, its BLAS path or threads.

`make test` runs the chapters under lpfail's pinned CPU numerics (`lpfail.numerics.PINS`) and compares every
output with the stored one. That proves nothing about another machine: a pinned computation can still be chaotic
(a training run at a high learning rate), or use a code path the pins do not cover. This check executes the same
outputs under a second setting that differs on any machine, and requires them to agree:

* one thread instead of two (reductions split differently);
* ATen's vectorised kernels (AVX-512 or AVX2, whichever the CPU has) instead of its portable ones, oneDNN with
  every instruction set the CPU offers (its native BF16 instructions where there are some) and MKL's automatic
  path;
* every random draw nudged up by one unit in the last place (``LPFAIL_NUDGE=1``, `lpfail.numerics`): an output
  that changes under the nudge depends on the last bit of its inputs, on whatever CPU.

``python tools/cpu_invariance.py notebooks`` re-executes every chapter under that setting with nbval (the stored
outputs are the pinned setting's, which the ordinary run checks), ``python tools/cpu_invariance.py experiments``
computes each CPU experiment's headline (`lpfail.results.Experiment.headline`, at its `check` config) once pinned
and once under the second setting and compares them; ``all`` does both. Exit status 1 on any difference.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def other_setting() -> dict[str, str]:
    """The second setting's environment variables (see the module's docstring)."""
    flags = _cpu_flags()
    capability = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "default"
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": capability,
            "ONEDNN_MAX_CPU_ISA": "ALL", "MKL_CBWR": "AUTO", "LPFAIL_NUDGE": "1"}


def pinned_setting() -> dict[str, str]:
    from lpfail.numerics import PINS

    return {**PINS, "LPFAIL_NUDGE": "0"}


def _env(setting: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in setting}
    return {**env, **setting}


def notebooks(workers: int = 2) -> int:
    """nbval over every chapter under the second setting; the pytest exit status."""
    setting = other_setting()
    print("chapters under " + ", ".join(f"{k}={v}" for k, v in setting.items()), flush=True)
    cmd = [sys.executable, "-m", "pytest", "book", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", "book/nbval_sanitize.cfg", "-p", "no:cacheprovider", "-q"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadfile"]
    return subprocess.run(cmd, cwd=ROOT, env=_env(setting)).returncode


_HEADLINE = """
import json, sys
from lpfail import numerics, results
exp = results.get(sys.argv[1])
cfg = exp.check_config()
res = results.run(exp.name, cfg, store=False)
print("HEADLINE " + json.dumps({"headline": exp.headline(res), "numerics": numerics.state()}, default=str))
"""


def _start(name: str, setting: dict[str, str]) -> subprocess.Popen:
    """The headline computation of `name` under `setting`, its output in temporary files (never a pipe that
    fills while other processes are waited for)."""
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-c", _HEADLINE, name], cwd=ROOT, env=_env(setting), text=True,
                            stdout=out, stderr=err)
    proc.files = (out, err)
    return proc


def _finish(name: str, setting: dict[str, str], proc: subprocess.Popen) -> dict:
    proc.wait()
    for f in proc.files:
        f.seek(0)
    stdout, stderr = (f.read() for f in proc.files)
    for f in proc.files:
        f.close()
    line = next((x for x in stdout.splitlines() if x.startswith("HEADLINE ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{name}: the headline computation failed under {setting}:\n{stderr[-3000:]}")
    return json.loads(line[len("HEADLINE "):])


def _threads(setting: dict[str, str]) -> int:
    return max(1, int(setting.get("OMP_NUM_THREADS", "1")))


def headlines(name: str, settings: list[dict[str, str]]) -> list[dict]:
    """Experiment `name`'s headline at its check config, computed in one fresh process per setting."""
    return headlines_all([name], settings)[name]


def headlines_all(names: list[str], settings: list[dict[str, str]], cores: int | None = None,
                  poll_s: float = 0.05) -> dict[str, list[dict]]:
    """Every experiment's headline under every setting, one fresh process each, as many at once as fit the
    cores by their OMP_NUM_THREADS (a process needing more threads than there are cores runs alone): never more
    threads than cores, so no OpenMP thread waits for a core. name → headlines in the order of `settings`;
    the computations are those of `headlines`, scheduled differently."""
    cores = cores or os.cpu_count() or 1
    todo = [(name, k) for name in names for k in range(len(settings))]
    todo.sort(key=lambda job: -_threads(settings[job[1]]))  # the widest first, the narrow ones fill in
    out: dict[str, list] = {name: [None] * len(settings) for name in names}
    running: list[tuple[str, int, subprocess.Popen]] = []
    try:
        _schedule(todo, running, out, settings, cores, poll_s)
    finally:
        for _, _, proc in running:
            proc.kill()
            proc.wait()
    return out


def _schedule(todo, running, out, settings, cores, poll_s):
    while todo or running:
        used = sum(_threads(settings[k]) for _, k, _ in running)
        fits = [job for job in todo if not running or used + _threads(settings[job[1]]) <= cores]
        if fits:
            name, k = fits[0]
            todo.remove(fits[0])
            running.append((name, k, _start(name, settings[k])))
            continue
        done = [job for job in running if job[2].poll() is not None]
        for job in done:
            name, k, proc = job
            out[name][k] = _finish(name, settings[k], proc)
            running.remove(job)
        if not done:
            time.sleep(poll_s)


_NUMBER = re.compile(r"[-+−]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")


def _last_unit(text: str) -> float:
    """One unit of the last printed digit of a number as printed ('7.1e-03' → 1e-4, '0.0170' → 1e-4, '12' → 1)."""
    mant, _, exp = text.replace(",", "").replace("−", "-").lower().partition("e")
    return 10.0 ** (int(exp or 0) - len(mant.partition(".")[2]))


def _value(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def agreement(a: dict, b: dict) -> str:
    """'same'; 'same but for a last digit' where every difference is one number, printed alike, moved by one unit
    of its last digit (a value near a rounding boundary crosses it under any perturbation: that is not a
    machine-dependent result); else 'DIFFERENT' (a chaotic or over-precise output moves by more)."""
    if a == b:
        return "same"
    if a.keys() != b.keys():
        return "DIFFERENT"
    for k in a:
        x, y = str(a[k]), str(b[k])
        if x == y:
            continue
        nx, ny = _NUMBER.findall(x), _NUMBER.findall(y)
        if _NUMBER.sub("#", x) != _NUMBER.sub("#", y) or len(nx) != len(ny):
            return "DIFFERENT"
        for p, q in zip(nx, ny):
            if p != q and not (_last_unit(p) == _last_unit(q)
                               and abs(_value(p) - _value(q)) <= 1.0001 * _last_unit(p)):
                return "DIFFERENT"
    return "same but for a last digit"


def experiments(names: list[str] | None = None) -> int:
    """Each CPU experiment's headline pinned and under the second setting; 1 if any differs."""
    from lpfail import results

    todo = [e for e in results.registry().values() if not e.gpu and e.headline is not None
            and (not names or e.name in names)]
    t0 = time.perf_counter()
    got = headlines_all([e.name for e in todo], [pinned_setting(), other_setting()])
    bad = 0
    for exp in todo:
        a, b = got[exp.name]
        word = agreement(a["headline"], b["headline"])
        ha, hb = a["headline"], b["headline"]
        moved = ", ".join(f"{k}: {ha[k]} / {hb.get(k)}" for k in ha if ha[k] != hb.get(k))
        detail = {"same": "", "DIFFERENT": f"\n  pinned: {ha}\n  other:  {hb}"}.get(word, f"\n  {moved}")
        print(f"{exp.name}: {word} under both settings{detail}", flush=True)
        bad += word == "DIFFERENT"
    print(f"{len(todo) - bad} of {len(todo)} CPU experiments' headlines agree under both settings "
          f"({time.perf_counter() - t0:.0f} s)")
    return int(bad > 0)


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "all"
    if what not in ("notebooks", "experiments", "all"):
        print(__doc__)
        return 2
    rc = 0
    if what in ("experiments", "all"):
        rc |= experiments(argv[1:] or None)
    if what in ("notebooks", "all"):
        rc |= notebooks() != 0
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
