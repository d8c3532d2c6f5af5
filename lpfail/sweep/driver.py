"""A generic subprocess sweep driver: runs of `python -m lpfail train --config`, N processes at a time spread
over the GPUs, a wall-clock budget after which running processes are stopped (SIGTERM: everything up to the
last checkpoint is kept), continuation of incomplete runs from their newest checkpoint, and a control file to
steer a running sweep from outside.

* `RunSpec` — one run: a name and a `TrainConfig` (its ``out_dir`` is the run's directory).
* `run_state(spec)` — "done", "partial" or "new"; `latest_checkpoint(run_dir)`.
* `gpu_ids()`, `default_parallel(gpus)` — where and how many at a time ($LPFAIL_SYMPTOM_PARALLEL).
* `sweep(specs, parallel, budget_s, ...)` — the driver itself.

Used by chapter 1's search (`lpfail.experiments.symptom`); nothing here knows about its variants or criterion.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np


@dataclass
class RunSpec:
    name: str
    cfg: object  # TrainConfig
    variant: str = ""
    seed: int = 0
    interrupt_at_step: int | None = None  # the driver stops the run once its log reaches this step (checks)
    env: dict | None = None  # extra environment variables of this run's process only

    @property
    def dir(self) -> Path:
        return Path(self.cfg.out_dir)


def latest_checkpoint(run_dir) -> Path | None:
    ck = sorted(Path(run_dir).glob("ckpt_*.pt"))
    return ck[-1] if ck else None


def run_state(spec: RunSpec) -> str:
    """"done" (completed or non-finite), "partial" (has a checkpoint to continue from) or "new"."""
    p = spec.dir / "run.json"
    if p.is_file():
        try:
            st = json.loads(p.read_text())
            if st["status"] in ("completed", "nonfinite") and (st["status"] == "nonfinite"
                                                               or st["steps"] >= spec.cfg.max_steps):
                return "done"
        except (ValueError, KeyError):
            pass
    return "partial" if latest_checkpoint(spec.dir) is not None else "new"


def _last_record(run_dir: Path) -> dict | None:
    """The last complete line of log.jsonl as a dict (None when there is none); reads only the file's tail."""
    p = Path(run_dir) / "log.jsonl"
    try:
        with open(p, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().split(b"\n")
    except OSError:
        return None
    for line in reversed(lines[:-1] if lines and lines[-1] else lines):
        try:
            rec = json.loads(line)
            int(rec["step"])
            return rec
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _last_step(run_dir: Path) -> int:
    """The step of the last complete line of log.jsonl (-1 when none)."""
    rec = _last_record(run_dir)
    return -1 if rec is None else int(rec["step"])


def _stop(proc: subprocess.Popen, grace: float = 15.0):
    """SIGTERM the run's process group, then SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def gpu_ids() -> list[str]:
    """The GPUs the driver spreads its runs over: $CUDA_VISIBLE_DEVICES if set, else every GPU torch sees;
    [] without CUDA."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [g.strip() for g in vis.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # pragma: no cover - torch always imports here
        return []


def default_parallel(gpus: list[str] | None = None) -> int:
    """Processes at a time: $LPFAIL_SYMPTOM_PARALLEL, else 8 per GPU (2 without one). Scheduling only: the
    result of a run does not depend on it."""
    env = os.environ.get("LPFAIL_SYMPTOM_PARALLEL", "").strip()
    if env:
        n = int(env)
        if n < 1:
            raise ValueError(f"LPFAIL_SYMPTOM_PARALLEL must be >= 1 (got {env!r})")
        return n
    gpus = gpu_ids() if gpus is None else gpus
    return 8 * len(gpus) if gpus else 2


def sweep(specs: list[RunSpec], parallel: int, budget_s: float, cont: bool = True, env: dict | None = None,
          min_start_s: float = 45.0, poll_s: float = 0.5, log=print, gpus: list[str] | None = None,
          control: Path | None = None, on_finish: Callable[[str, dict], None] | None = None
          ) -> dict[str, dict]:
    """Run `specs` as subprocesses (`python -m lpfail train --config`), `parallel` at a time, until all are
    done or `budget_s` seconds have passed; then stop the running ones (their checkpoints stay).

    cont         continue a run from its newest checkpoint (True), or start every unfinished run afresh
                 (False: its directory is wiped). Finished runs ("completed" or "nonfinite") are never rerun.
    min_start_s  no run is started with less than this left of the budget (it would only be stopped).
    gpus         GPU ids to spread the runs over (each process gets CUDA_VISIBLE_DEVICES = the GPU with the
                 fewest running processes); None or []: leave CUDA_VISIBLE_DEVICES alone.
    control      a JSON file read while the sweep runs, to steer it from outside: {"stop_at": unix time}
                 brings the deadline forward (never back), {"parallel": n} changes how many run at a time
                 (running ones are not stopped). Missing or unreadable: ignored.
    on_finish    called as ``on_finish(name, status[name])`` each time a run leaves the running set (done,
                 failed or stopped, also when the sweep itself is stopped), e.g. to drive a progress bar.
    Returns {name: {"state": done|stopped|failed|pending, "returncode", "resumed_from", "wall_s"}}.
    Per run, stdout and stderr go to <dir>/stdout.txt (appended across calls)."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    env = {**os.environ, **(env or {})}
    env.setdefault("OMP_NUM_THREADS", "1")  # N processes share the CPU cores
    env.setdefault("PYTHONUNBUFFERED", "1")
    status: dict[str, dict] = {}
    queue: list[RunSpec] = []
    for s in specs:
        state = run_state(s)
        if state == "done":
            status[s.name] = {"state": "done", "returncode": 0, "resumed_from": None, "wall_s": 0.0}
        else:
            if state == "partial" and not cont or state == "new":
                shutil.rmtree(s.dir, ignore_errors=True)
            queue.append(s)
            status[s.name] = {"state": "pending", "returncode": None, "resumed_from": None, "wall_s": 0.0}
    running: dict[str, tuple[subprocess.Popen, RunSpec, float, object]] = {}
    old_term = None
    if threading.current_thread() is threading.main_thread():  # `timeout` sends SIGTERM: stop the runs too
        old_term = signal.signal(signal.SIGTERM, _terminated)
    seen_mtime = None

    def steer():
        nonlocal deadline, parallel, seen_mtime
        try:
            m = control.stat().st_mtime
            if m == seen_mtime:
                return
            seen_mtime = m
            ctl = json.loads(control.read_text())
        except (OSError, ValueError, AttributeError):
            return
        if "stop_at" in ctl:
            new_deadline = time.monotonic() + float(ctl["stop_at"]) - time.time()
            if new_deadline < deadline:
                deadline = new_deadline
                log(f"sweep: control: deadline brought forward to {deadline - t0:.0f} s")
        if "parallel" in ctl and int(ctl["parallel"]) >= 1:
            parallel = int(ctl["parallel"])
            log(f"sweep: control: {parallel} at a time")

    try:
        while queue or running:
            if control is not None:
                steer()
            now = time.monotonic()
            while queue and len(running) < parallel and deadline - now > min_start_s:
                s = queue.pop(0)
                s.dir.mkdir(parents=True, exist_ok=True)
                cfg_path = s.dir / "train_config.json"
                cfg_path.write_text(json.dumps(s.cfg.to_dict(), indent=1) + "\n")
                cmd = [sys.executable, "-m", "lpfail", "train", "--config", str(cfg_path), "--no-progress"]
                ck = latest_checkpoint(s.dir) if cont else None
                if ck is not None:
                    cmd += ["--resume", str(ck)]
                    status[s.name]["resumed_from"] = int(ck.stem.split("_")[1])
                out = open(s.dir / "stdout.txt", "a")
                out.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
                out.flush()
                penv, where = {**env, **(s.env or {})}, ""
                if gpus:
                    load = {g: 0 for g in gpus}
                    for _p, _s, _t, _o, g in running.values():
                        load[g] = load.get(g, 0) + 1
                    g = min(gpus, key=lambda x: load.get(x, 0))
                    penv, where = {**penv, "CUDA_VISIBLE_DEVICES": g}, f" on GPU {g}"
                else:
                    g = ""
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=penv, start_new_session=True)
                running[s.name] = (proc, s, now, out, g)
                log(f"sweep: start {s.name}{where}" + (f" (from step {status[s.name]['resumed_from']})" if ck else ""))
            if not running:
                break  # the rest cannot start within the budget
            time.sleep(poll_s)
            now = time.monotonic()
            for name in list(running):
                proc, s, started, out, _g = running[name]
                rc = proc.poll()
                stop = False
                if rc is None and s.interrupt_at_step is not None and _last_step(s.dir) >= s.interrupt_at_step:
                    stop = True
                if rc is None and now >= deadline:
                    stop = True
                if stop:
                    _stop(proc)
                    rc = proc.returncode
                    state = "stopped"
                elif rc is None:
                    continue
                else:
                    state = "done" if rc == 0 and run_state(s) == "done" else "failed"
                out.close()
                status[name].update(state=state, returncode=rc, wall_s=round(time.monotonic() - started, 2))
                del running[name]
                log(f"sweep: {name} {state} (rc {rc}) at step {_last_step(s.dir)} after "
                    f"{status[name]['wall_s']:.0f} s")
                if on_finish is not None:
                    on_finish(name, dict(status[name]))
    finally:
        for name, (proc, s, started, out, _g) in running.items():
            _stop(proc)
            out.close()
            status[name].update(state="stopped", returncode=proc.returncode)
        if on_finish is not None:
            for name in running:
                on_finish(name, dict(status[name]))
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    return status


def _terminated(signum, frame):
    raise SystemExit(f"sweep: terminated by signal {signum}; runs stopped, their checkpoints kept")


# -- collecting the runs' curves ---------------------------------------------------------------------------
def bins(x: np.ndarray, n_total: int, points: int, how=np.nanmean) -> np.ndarray:
    """A per-step series x (steps 0..len(x)−1 of n_total) reduced to ≈ `points` values: `how` over each bin of
    ceil(n_total / points) steps, finite values only; NaN for bins the run never reached (exactly `points`
    values when points divides n_total)."""
    b = max(1, math.ceil(n_total / points))
    out = np.full(math.ceil(n_total / b), np.nan)
    for j in range(len(out)):
        seg = x[j * b:(j + 1) * b]
        seg = seg[np.isfinite(seg)]
        if seg.size:
            out[j] = how(seg)
    return out
