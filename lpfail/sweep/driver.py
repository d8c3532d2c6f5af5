"""A generic subprocess sweep driver: runs of `python -m lpfail train --config`, N processes at a time spread
over the GPUs, a wall-clock budget after which running processes are stopped (SIGTERM: everything up to the
last checkpoint is kept), continuation of incomplete runs from their newest checkpoint, and a control file to
steer a running sweep from outside.

* `RunSpec` — one run: a name and a `TrainConfig` (its ``out_dir`` is the run's directory).
* `run_state(spec)` — "done", "partial" or "new"; `latest_checkpoint(run_dir)`.
* `gpu_ids()`, `default_parallel(gpus)` — where and how many at a time ($LPFAIL_SYMPTOM_PARALLEL).
* `sweep(specs, parallel, budget_s, ...)` — the driver itself.

Used by every grid of `lpfail.sweep` (and chapter 1's search, `lpfail.experiments.symptom`); nothing here knows
about an experiment's variants, points or criterion.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from lpfail import numerics


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


def checkpoint_step(ck: Path) -> int:
    """The step a checkpoint ``ckpt_<step>.pt`` was written at."""
    return int(ck.stem.split("_")[1])


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


#: No run is started with less than this many seconds of the budget left (it would only be stopped).
MIN_START_S = 45.0


def sweep(specs: list[RunSpec], parallel: int, budget_s: float, cont: bool = True, env: dict | None = None,
          min_start_s: float = MIN_START_S, poll_s: float = 0.5, log=print, gpus: list[str] | None = None,
          control: Path | None = None, on_finish: Callable[[str, dict], None] | None = None
          ) -> dict[str, dict]:
    """Run `specs` as subprocesses (`python -m lpfail train --config`), `parallel` at a time, until all are
    done or `budget_s` seconds have passed; then stop the running ones (their checkpoints stay).

    cont         continue a run from its newest checkpoint (True), or start every unfinished run afresh
                 (False: its directory is wiped). Finished runs ("completed" or "nonfinite") are never rerun.
    min_start_s  no run is started with less than this left of the budget (it would only be stopped); once runs
                 of this sweep have finished, none is started either that their pace (seconds per step, the
                 median over them) says cannot reach its last step before the deadline (`_Sweep.expected_s`).
    gpus         GPU ids to spread the runs over (each process gets CUDA_VISIBLE_DEVICES = the GPU with the
                 fewest running processes); None or []: leave CUDA_VISIBLE_DEVICES alone.
    control      a JSON file read while the sweep runs, to steer it from outside: {"stop_at": unix time}
                 brings the deadline forward (never back), {"parallel": n} changes how many run at a time
                 (running ones are not stopped). Missing or unreadable: ignored.
    on_finish    called as ``on_finish(name, status[name])`` each time a run leaves the running set (done,
                 failed or stopped, also when the sweep itself is stopped), e.g. to drive a progress bar.
    Returns {name: {"state": done|stopped|failed|pending, "returncode", "resumed_from", "wall_s"}}.
    Per run, stdout and stderr go to <dir>/stdout.txt (appended across calls)."""
    s = _Sweep(specs, parallel, budget_s, cont, env, min_start_s, log, gpus, control, on_finish)
    old_term = None
    if threading.current_thread() is threading.main_thread():  # `timeout` sends SIGTERM: stop the runs too
        old_term = signal.signal(signal.SIGTERM, _terminated)
    try:
        while s.queue or s.running:
            s.steer()
            s.start_what_fits()
            if not s.running:
                break  # the rest cannot start within the budget
            time.sleep(poll_s)
            s.reap()
    finally:
        s.stop_all()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    return s.status


class _Sweep:
    """The state of one `sweep`: the queue, the running processes, each run's status, the deadline."""

    def __init__(self, specs, parallel, budget_s, cont, env, min_start_s, log, gpus, control, on_finish):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget_s
        self.parallel, self.cont, self.min_start_s, self.log = parallel, cont, min_start_s, log
        self.gpus, self.control, self.on_finish = gpus, control, on_finish
        self.env = {**os.environ, **(env or {})}
        if gpus:  # GPU runs draw their weights with the machine's CPU kernels, as the stored ones did
            self.env = numerics.unpinned_env(self.env)
        self.env.setdefault("OMP_NUM_THREADS", "1")  # N processes share the CPU cores
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.status: dict[str, dict] = {}
        self.pace: list[float] = []   # seconds per step of each run that finished in this sweep
        self._said_short: set[str] = set()
        self.queue: list[RunSpec] = []
        self.running: dict[str, tuple] = {}
        self._seen_mtime = None
        for spec in specs:
            state = run_state(spec)
            if state == "done":
                self.status[spec.name] = {"state": "done", "returncode": 0, "resumed_from": None, "wall_s": 0.0}
                continue
            if state == "partial" and not cont or state == "new":
                shutil.rmtree(spec.dir, ignore_errors=True)
            self.queue.append(spec)
            self.status[spec.name] = {"state": "pending", "returncode": None, "resumed_from": None, "wall_s": 0.0}

    def steer(self):
        """Read the control file (when it changed): bring the deadline forward, change `parallel`."""
        if self.control is None:
            return
        try:
            m = self.control.stat().st_mtime
            if m == self._seen_mtime:
                return
            self._seen_mtime = m
            ctl = json.loads(self.control.read_text())
        except (OSError, ValueError, AttributeError):
            return
        if "stop_at" in ctl:
            new_deadline = time.monotonic() + float(ctl["stop_at"]) - time.time()
            if new_deadline < self.deadline:
                self.deadline = new_deadline
                self.log(f"sweep: control: deadline brought forward to {self.deadline - self.t0:.0f} s")
        if "parallel" in ctl and int(ctl["parallel"]) >= 1:
            self.parallel = int(ctl["parallel"])
            self.log(f"sweep: control: {self.parallel} at a time")

    def _gpu(self) -> str:
        """The GPU with the fewest running processes ("" without GPUs)."""
        if not self.gpus:
            return ""
        load = {g: 0 for g in self.gpus}
        for *_rest, g in self.running.values():
            load[g] = load.get(g, 0) + 1
        return min(self.gpus, key=lambda x: load.get(x, 0))

    def _steps_left(self, spec: RunSpec) -> int | None:
        """Steps a run has still to train (from its newest checkpoint when continuing), None when unknown."""
        total = getattr(spec.cfg, "max_steps", None)
        if not isinstance(total, int):
            return None
        ck = latest_checkpoint(spec.dir) if self.cont and spec.dir.exists() else None
        return total - (checkpoint_step(ck) if ck is not None else 0)

    def expected_s(self, spec: RunSpec) -> float:
        """Seconds the run should take at the pace of the runs finished so far in this sweep (0 before any)."""
        steps = self._steps_left(spec)
        if not self.pace or steps is None:
            return 0.0
        return statistics.median(self.pace) * steps

    def _next_that_fits(self, left: float) -> RunSpec | None:
        """The first queued run expected to finish in the `left` seconds (removed from the queue), else None."""
        for i, spec in enumerate(self.queue):
            need = self.expected_s(spec)
            if need <= left:
                return self.queue.pop(i)
            if spec.name not in self._said_short:
                self._said_short.add(spec.name)
                self.log(f"sweep: not starting {spec.name}: ≈ {need:.0f} s at this sweep's pace, {left:.0f} s left")
        return None

    def start_what_fits(self):
        now = time.monotonic()
        while self.queue and len(self.running) < self.parallel and self.deadline - now > self.min_start_s:
            spec = self._next_that_fits(self.deadline - now)
            if spec is None:
                break
            spec.dir.mkdir(parents=True, exist_ok=True)
            cfg_path = spec.dir / "train_config.json"
            cfg_path.write_text(json.dumps(spec.cfg.to_dict(), indent=1) + "\n")
            cmd = [sys.executable, "-m", "lpfail", "train", "--config", str(cfg_path), "--no-progress"]
            ck = latest_checkpoint(spec.dir) if self.cont else None
            if ck is not None:
                cmd += ["--resume", str(ck)]
                self.status[spec.name]["resumed_from"] = checkpoint_step(ck)
            out = open(spec.dir / "stdout.txt", "a")
            out.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            out.flush()
            g = self._gpu()
            penv = {**self.env, **(spec.env or {}), **({"CUDA_VISIBLE_DEVICES": g} if g else {})}
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=penv, start_new_session=True)
            self.running[spec.name] = (proc, spec, now, out, g)
            self.log(f"sweep: start {spec.name}" + (f" on GPU {g}" if g else "")
                     + (f" (from step {self.status[spec.name]['resumed_from']})" if ck else ""))

    def reap(self):
        """Stop the runs past their interrupt step or the deadline; record every run that has ended. A run that
        ends unfinished once the deadline has passed is "stopped", however it ended: stopping one process under
        MPS can end others sharing the card before their own stop, and each continues from its checkpoint."""
        now = time.monotonic()
        past = now >= self.deadline
        for name in list(self.running):
            proc, spec, started, out, _g = self.running[name]
            rc = proc.poll()
            stop = rc is None and (past or (spec.interrupt_at_step is not None
                                            and _last_step(spec.dir) >= spec.interrupt_at_step))
            if stop:
                _stop(proc)
                rc, state = proc.returncode, "stopped"
            elif rc is None:
                continue
            elif rc == 0 and run_state(spec) == "done":
                state = "done"
                total = getattr(spec.cfg, "max_steps", None)
                trained = total - (self.status[name]["resumed_from"] or 0) if isinstance(total, int) else 0
                if trained > 0:
                    self.pace.append((now - started) / trained)
            else:
                state = "stopped" if past else "failed"
            out.close()
            self.status[name].update(state=state, returncode=rc, wall_s=round(time.monotonic() - started, 2))
            del self.running[name]
            self.log(f"sweep: {name} {state} (rc {rc}) at step {_last_step(spec.dir)} after "
                     f"{self.status[name]['wall_s']:.0f} s")
            if self.on_finish is not None:
                self.on_finish(name, dict(self.status[name]))

    def stop_all(self):
        for name, (proc, _spec, _started, out, _g) in self.running.items():
            _stop(proc)
            out.close()
            self.status[name].update(state="stopped", returncode=proc.returncode)
        if self.on_finish is not None:
            for name in self.running:
                self.on_finish(name, dict(self.status[name]))
        self.running.clear()


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
