"""The checks before a grid trusts its fast path (GPU): a step captured in a CUDA graph must give the uncaptured
step's numbers bit for bit, and a run continued from its checkpoint the uninterrupted run's (`graph_checks`);
`uncaptured_from_checks` turns a failed check into the groups the driver then runs without capture.

Imported by `lpfail.sweep.grid` (a grid's default `checks`) and `lpfail.sweep.run`; it imports neither.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lpfail import numerics

if TYPE_CHECKING:
    from lpfail.sweep.grid import Grid

CUBLAS = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # deterministic cuBLAS in every run


def _train_process(tc, env=None, resume=None) -> subprocess.Popen:
    d = Path(tc.out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "train_config.json").write_text(json.dumps(tc.to_dict()))
    cmd = [sys.executable, "-m", "lpfail", "train", "--config", str(d / "train_config.json"), "--no-progress"]
    if resume:
        cmd += ["--resume", str(resume)]
    # the checks run on the GPU: the machine's CPU kernels, as the grids' runs have them (lpfail.numerics)
    full = {**numerics.unpinned_env(dict(os.environ)), "OMP_NUM_THREADS": "1", **CUBLAS, **(env or {})}
    return subprocess.Popen(cmd, stdout=open(d / "stdout.txt", "w"), stderr=subprocess.STDOUT, env=full)


def _same(a: dict, b: dict, steps: int) -> bool:
    return bool(len(a["loss"]) == steps and np.array_equal(a["loss"], b["loss"])
                and np.array_equal(a["grad_norm"], b["grad_norm"]))


def graph_checks(grid: Grid, root, groups: tuple[str, ...] | None = None, steps: int = 30, log=print) -> dict:
    """Before a grid trusts CUDA graphs: the first run of each group, trained ``steps`` steps captured and
    uncaptured (LPFAIL_NO_CAPTURE=1), must give bit-identical losses and gradient norms (same kernels in the same
    order, the same random draws), and a captured run stopped at steps/2 and continued from its checkpoint in a
    new process must give the uninterrupted run's numbers. All runs at once, one process each. Returns
    {"equal": {group: bool}, "resume_equal": bool, "tokens_per_s": {...}, "ok": bool}."""
    from lpfail.train import read_log

    root = Path(root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    groups = tuple(groups if groups is not None else grid.check_groups)
    first = {}
    for r in grid.runs():
        first.setdefault(r.group, r)
    unknown = [g for g in groups if g not in first]
    if unknown or not groups:
        raise ValueError(f"{grid.name} checks: no runs of group(s) {unknown or 'none given'}; groups: {sorted(first)}")
    short = dict(max_steps=steps, warmup=steps // 4, val_every=0, diag_every=steps // 2,
                 checkpoint_every=steps // 2, keep_checkpoints=0)
    t0 = time.monotonic()
    jobs = {f"{g}_{mode}": _train_process(dataclasses.replace(first[g].at(root / f"{g}_{mode}"), **short), env)
            for g in groups for mode, env in (("graph", {}), ("eager", {"LPFAIL_NO_CAPTURE": "1"}))}
    rcs = {n: j.wait() for n, j in jobs.items()}
    whole = root / f"{groups[0]}_graph"
    cont = dataclasses.replace(first[groups[0]].at(root / "continued"), **short)
    rcs["continued"] = _train_process(cont, resume=whole / f"ckpt_{steps // 2:07d}.pt").wait()
    out = {"rc": rcs, "equal": {}, "tokens_per_s": {}, "steps": steps, "wall_s": round(time.monotonic() - t0, 1)}
    for g in groups:
        a, b = read_log(root / f"{g}_graph"), read_log(root / f"{g}_eager")
        out["equal"][g] = _same(a, b, steps)
        out["tokens_per_s"][g] = {m: float(np.nanmedian(x["tokens_per_s"][5:])) if len(x["loss"]) > 5 else None
                                  for m, x in (("graph", a), ("eager", b))}
        log(f"{grid.name} graph check {g}: captured == uncaptured: {out['equal'][g]}; tokens/s "
            f"{out['tokens_per_s'][g]} (rc {rcs[g + '_graph']}, {rcs[g + '_eager']})")
    out["resume_equal"] = _same(read_log(whole), read_log(root / "continued"), steps)
    out["ok"] = bool(all(out["equal"].values()) and out["resume_equal"])
    log(f"{grid.name} graph check: continued from step {steps // 2} == uninterrupted: {out['resume_equal']}; "
        f"ok {out['ok']}")
    return out


def uncaptured_from_checks(chk: dict) -> str:
    """The LPFAIL_SWEEP_UNCAPTURED value the checks call for: every group ("*") when the continue check
    failed, else the groups whose captured step differed ("" when none)."""
    if not chk.get("resume_equal", True):
        return "*"
    return ",".join(g for g, ok in chk.get("equal", {}).items() if not ok)
