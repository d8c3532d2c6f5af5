"""Grids trained on a GPU machine across device calls: ``tools/gpu.sh start | wait | collect | quick NAME...``.

A device call lasts at most 10 minutes, but the machine stays up (and keeps /tmp) while calls follow each other.
So ``start`` launches one driver for the missing runs of every grid named, detached from the call, and returns;
``wait`` reports progress every 60 s until the driver ends or ``--wait`` seconds have passed; ``collect`` packs
what came out (the new part files, the checks, the driver's log) into ``$OUT/grids.tgz`` for the results cache
here. ``quick`` runs the grids' quick profiles one after another (on an idle GPU: their times are what a user
with one GPU sees) and packs their records into ``$OUT/quick.tgz``.

The stored runs are not rerun: ``start`` first copies the repository's results cache (its part files, and the
results a grid reads, e.g. lr_sweep's for substitution's head rows) into ``$LPFAIL_RESULTS_DIR``
(default /tmp/lpfail_results), where the drivers look runs up by key and TrainConfig hash. The lists of runs come
from Python (`lpfail.sweep.grid.get(NAME).runs()`), never from the shell. Where the machine has CUDA MPS, many
small training processes share the GPU without time-slicing.

Here, afterwards: ``python -m lpfail.sweep.session unpack GRIDS.TGZ`` copies the new parts into ``results/``;
then ``python -m lpfail sweep NAME collect`` stores each result.
"""
from __future__ import annotations

import argparse
import fnmatch
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from lpfail import results
from lpfail.sweep import store

BASE = Path(os.environ.get("LPFAIL_SESSION_ROOT", "/tmp/lpfail_session"))
MPS = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/lpfail_mps", "CUDA_MPS_LOG_DIRECTORY": "/tmp/lpfail_mps_log"}


def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


def _scratch() -> Path:
    return Path(os.environ.setdefault("LPFAIL_RESULTS_DIR", "/tmp/lpfail_results"))


def seed_cache(repo_results: Path, scratch: Path):
    """Copy the repository's results cache into the scratch cache (part files in either form and results, not
    archives); a file already there is kept (another driver of this machine may have written it)."""
    for src in repo_results.rglob("*"):
        if src.is_file() and src.name.endswith((".json", ".npz", ".json.gz")) and "gpu_calls" not in src.parts:
            dst = scratch / src.relative_to(repo_results)
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


def machine_info() -> str:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,clocks.sm,memory.used,"
                              "temperature.gpu", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = "no nvidia-smi"
    import torch
    import triton

    return f"{smi}; python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}"


def start_mps():
    """The CUDA MPS control daemon where the machine has it, checked with one CUDA client (stopped again if
    that client fails)."""
    if shutil.which("nvidia-cuda-mps-control") is None:
        log("no nvidia-cuda-mps-control: processes time-slice the GPU")
        return
    os.environ.update(MPS)
    for d in MPS.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    started = subprocess.run(["nvidia-cuda-mps-control", "-d"], start_new_session=True).returncode == 0
    # a daemon left by an earlier call (`quick`, then `start`) answers on its pipe: keep it (`-d` then fails with
    # "already running"; stopping the daemon made the driver's runs time-slice the GPU)
    running = started or subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\n", text=True,
                                        capture_output=True, timeout=30).returncode == 0
    probe = subprocess.run([sys.executable, "-c", "import torch; print(float(torch.ones(4, device='cuda').sum()))"],
                           capture_output=True, text=True, timeout=180)
    if running and probe.returncode == 0:
        log("MPS control daemon started" if started else "MPS control daemon already running: kept")
    else:
        log(f"MPS did not work ({probe.stderr[-300:]}): stopping it")
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True)


def _running() -> bool:
    pid = BASE / "drive.pid"
    if not pid.is_file():
        return False
    try:
        os.kill(int(pid.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def start(names: list[str], budget_s: float, checks: bool, skip: tuple[str, ...] = ()):
    """Seed the cache, start MPS, run each grid's checks (when asked), then the one driver, detached; runs whose
    group matches a `skip` pattern (fnmatch) are left for a later call."""
    from lpfail.sweep import grid as G
    from lpfail.sweep import run as R

    BASE.mkdir(parents=True, exist_ok=True)
    scratch = _scratch()
    seed_cache(results.REPO_ROOT / "results", scratch)
    log(machine_info())
    start_mps()
    uncaptured = set()
    for name in names:
        grid = G.get(name)
        why = grid.ready() if hasattr(grid, "ready") else ""
        if why:
            raise SystemExit(f"{name}: not started: {why}")
        log(R.status_text(grid).splitlines()[0])
        if checks:
            out = grid.checks(BASE / "checks" / name, log=log)
            (BASE / f"checks-{name}.json").write_text(json.dumps(out, indent=1) + "\n")
            uncaptured |= set(filter(None, R.uncaptured_from_checks(out).split(",")))
    env = {**os.environ, "LPFAIL_SWEEP_UNCAPTURED": ",".join(sorted(uncaptured)), "PYTHONUNBUFFERED": "1"}
    log(f"starting the driver for {', '.join(names)}: budget {budget_s:.0f} s, uncaptured {sorted(uncaptured) or 'none'}"
        + (f", skipping groups {list(skip)}" if skip else ""))
    cmd = [sys.executable, "-m", "lpfail.sweep.session", "_drive", *names, "--budget", str(budget_s),
           *[f"--skip={p}" for p in skip]]
    proc = subprocess.Popen(cmd, stdout=open(BASE / "drive.log", "a"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=results.REPO_ROOT)
    (BASE / "drive.pid").write_text(str(proc.pid))


def skipped(group: str, skip: tuple[str, ...]) -> bool:
    """Whether a run's group matches one of the `--skip` patterns (fnmatch: ``long_*``)."""
    return any(fnmatch.fnmatchcase(group, p) for p in skip)


def _drive(names: list[str], budget_s: float, skip: tuple[str, ...] = ()):
    """The detached driver: every named grid's missing runs in one queue, in the order the grids are named, less
    the runs whose group matches a `skip` pattern."""
    from lpfail.sweep import grid as G
    from lpfail.sweep import run as R

    todo = []
    for name in names:
        grid = G.get(name)
        todo += [(grid, r) for r in G.lookup(grid).missing if not skipped(r.group, skip)]
    R.drive_many(todo, BASE / "runs", budget_s, label="+".join(names), log=log)
    for name in names:
        log(R.status_text(G.get(name)).splitlines()[0])


def progress(names: list[str]) -> str:
    from lpfail.sweep import grid as G
    from lpfail.sweep import run as R

    lines = [R.status_text(G.get(n)).splitlines()[0] for n in names]
    try:
        lines.append(subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    tail = (BASE / "drive.log").read_text().splitlines()[-2:] if (BASE / "drive.log").is_file() else []
    return "\n".join(lines + tail)


def wait(names: list[str], wait_s: float):
    t0, last = time.monotonic(), 0.0
    if not _running():
        log("the driver is not running (ended, or this is a fresh machine)")
    while _running() and time.monotonic() - t0 < wait_s:
        time.sleep(5)
        if time.monotonic() - last >= 60:
            last = time.monotonic()
            log(progress(names))
    log("the driver is still running (it continues while the machine stays up)" if _running() else
        "the driver has ended")


def collect(out: Path):
    """Pack the new part files (those whose content the repository's cache does not hold, in either form), the
    checks and the log into grids.tgz."""
    scratch, repo = _scratch(), results.REPO_ROOT / "results"
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "grids.tgz", "w:gz") as tf:
        n = 0
        for f in sorted([*scratch.glob("*_parts/*.json"), *scratch.glob("*_parts/*.json.gz")]):
            rel = f.relative_to(scratch)
            stored = _stored_content(repo / rel)
            if stored is None or stored != _content(f.read_bytes(), f.name):
                tf.add(f, arcname=str(rel))
                n += 1
        for f in [*sorted(BASE.glob("checks-*.json")), BASE / "drive.log"]:
            if f.is_file():
                tf.add(f, arcname=f"session/{f.name}")
        tails = crashed_tails(BASE / "runs")
        for name, text in tails.items():
            data = text.encode()
            info = tarfile.TarInfo(f"session/crashed/{name}.txt")
            info.size, info.mtime = len(data), int(time.time())
            tf.addfile(info, io.BytesIO(data))
    log(f"collected {n} new or changed part/checks files into {out / 'grids.tgz'}"
        + (f", and the last lines of {len(tails)} crashed runs" if tails else ""))


def crashed_tails(runs: Path, most: int = 24, chars: int = 4000) -> dict[str, str]:
    """The end of each run's stdout.txt that holds a Python traceback (a crash, not a stop at the budget): at most
    `most` runs, the last `chars` characters of each, so that a call's archive says why its runs failed."""
    out = {}
    for f in sorted(runs.glob("*/stdout.txt")) if runs.is_dir() else []:
        text = f.read_text(errors="replace")
        if "Traceback (most recent call last)" in text:
            out[f.parent.name] = text[-chars:]
            if len(out) >= most:
                break
    return out


def quick(names: list[str], out: Path, budget_s: float):
    """Each grid's quick profile in turn, on this machine's GPU; records packed into quick.tgz."""
    from lpfail.sweep import grid as G
    from lpfail.sweep import quick as Q

    seed_cache(results.REPO_ROOT / "results", _scratch())
    log(machine_info())
    start_mps()  # as the grids' drivers run (without it the 12-run profiles time-slice the GPU)
    recs = BASE / "quick"
    recs.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        rec = Q.run_quick(G.get(name), BASE / "quick_runs" / name, budget_s=budget_s, log=lambda m: None)
        log(Q.text(rec))
        if not Q.has_headline(rec):
            continue  # no record: a record holds a headline
        Q.save(rec, recs / f"quick_{name}.json")
        # packed after every profile: a call cut off by its time limit keeps the profiles already measured
        tmp = out / "quick.tgz.tmp"
        with tarfile.open(tmp, "w:gz") as tf:
            for f in sorted(recs.glob("quick_*.json")):
                tf.add(f, arcname=f.name)
        os.replace(tmp, out / "quick.tgz")


def unpack(archive: Path, repo_results: Path | None = None) -> list[str]:
    """Here, after a call: the new part and checks files of grids.tgz into the results cache, quick records as
    results/quick_NAME.json. Returns the paths written.

    A part is written in the form the archive holds it (``.json`` or ``.json.gz``), and a part already stored, in
    either form, is replaced only by a later state of the same part: a driver that ran across several calls writes
    one part file that grows, so the archive of a later call holds every run of an earlier one, unchanged, and
    more. The same content is not written again; any other difference leaves the stored part as it is (and says so
    on stderr)."""
    repo_results = repo_results or results.REPO_ROOT / "results"
    written = []
    with tarfile.open(archive) as tf:
        for m in tf.getmembers():
            if not m.isfile() or m.name.startswith("session/"):
                continue
            dst = repo_results / m.name
            data = tf.extractfile(m).read()
            stored = []
            if Path(m.name).name.startswith("part-"):
                stored = [f for f in _forms(dst) if f.exists()]
                new = _content(data, dst.name)
                olds = [_content(f.read_bytes(), f.name) for f in stored]
                if any(old == new for old in olds):
                    continue
                if not all(old is not None and new is not None and _grows(old, new) for old in olds):
                    print(f"unpack: {stored[0]} kept: the archive's {m.name} is not a later state of it",
                          file=sys.stderr)
                    continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(dst)
            for f in stored:
                if f != dst:
                    f.unlink()  # the earlier state, in the other form
            written.append(str(dst))
    return written


def _forms(path: Path) -> list[Path]:
    """A part file's path in both forms (plain, then compressed)."""
    name = store.part_name(path)
    return [path.with_name(name), path.with_name(name + store.GZ)]


def _content(data: bytes, name: str) -> bytes | None:
    """A part file's JSON bytes (decompressed where ``name`` ends in ``.gz``); None when it does not decompress."""
    try:
        return store.decode_part(data, name)
    except ValueError:
        return None


def _stored_content(path: Path) -> bytes | None:
    """The JSON bytes of the part at ``path`` as the repository's cache holds it, in either form; None when it
    holds none."""
    for f in _forms(path):
        if f.is_file():
            return _content(f.read_bytes(), f.name)
    return None


def _grows(old: bytes, new: bytes) -> bool:
    """Whether part ``new`` is a later state of part ``old`` (their JSON bytes): the same header (but its wall time
    and its content hash), every run of ``old`` in ``new`` unchanged, and at least one run more."""
    try:
        a, b = json.loads(old), json.loads(new)
    except ValueError:
        return False
    if not (isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get("runs"), dict)
            and isinstance(b.get("runs"), dict)):
        return False
    head = lambda d: {k: v for k, v in d.items() if k not in ("runs", "wall_s", results.CONTENT_KEY)}
    return (head(a) == head(b) and all(b["runs"].get(k) == v for k, v in a["runs"].items())
            and len(b["runs"]) > len(a["runs"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/gpu.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("start", "wait", "collect", "quick", "unpack", "_drive"))
    ap.add_argument("names", nargs="*", help="grids (start, wait, quick, _drive) or the archive (unpack)")
    ap.add_argument("--budget", type=float, default=1500.0, help="start: the driver's budget in seconds")
    ap.add_argument("--wait", type=float, default=540.0, help="wait: at most this many seconds")
    ap.add_argument("--checks", action="store_true", help="start: the grids' checks first")
    ap.add_argument("--skip", action="append", default=[], metavar="GROUP",
                    help="start: leave runs whose group matches this pattern (fnmatch, e.g. 'long_*'); repeatable")
    args = ap.parse_args(argv)
    out = Path(os.environ.get("OUT", "/tmp/lpfail_out"))
    if args.command != "unpack":
        _scratch()  # every command reads and writes the scratch cache, never the repository's
    if args.command == "unpack":
        for p in unpack(Path(args.names[0])):
            print(p)
        return 0
    if args.command == "_drive":
        _drive(args.names, args.budget, tuple(args.skip))
    elif args.command == "start":
        start(args.names, args.budget, args.checks, tuple(args.skip))
        wait(args.names, min(args.wait, 10.0))
    elif args.command == "wait":
        wait(args.names, args.wait)
        collect(out)
    elif args.command == "collect":
        collect(out)
    else:
        quick(args.names, out, args.budget)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
