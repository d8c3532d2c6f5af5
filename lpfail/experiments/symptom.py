"""Chapter 1 ("Symptom"): the search for a small-scale loss explosion caused by BF16 flash attention.

Issue 3. Several variants of one run — same init, same batches, only the attention's arithmetic differs —
trained side by side on one GPU, each in its own process (`python -m lpfail train`), and judged by a failure
criterion fixed in code before any outcome was seen (`failed`).

Variants (`VARIANTS`; the keys are the result's labels):

==== ================================ ====================================================================
A    ``PAPER_BF16``                   the paper's failing code: Triton kernel on CUDA (after `checks` found
                                      its step-0 loss bit-identical to the reference's), else the reference
B    ``PAPER_BF16_OFFICIAL_FIX``      the paper's official fix exactly, with its 1e-10 row-sum clamp and its
                                      masking; always the reference: the kernel refuses ``masked_ties``
Bp   ``PAPER_BF16.with_fix()``        B′: the same fix (Algorithm 3, β = 2, ε = 1e-3) without the clamp
                                      artifact; Triton after the same check as A
C    ``FP32``                         the high-precision control (same tiling, FP32 everywhere)
D    ``FA2_BF16``                     what production kernels compute (FP32 scores and accumulator)
==== ================================ ====================================================================

The pieces, usable separately:

* `failed(losses, warmup)` — the pre-registered criterion; `outcome(...)` applies it to a run directory.
* `plan(c, root)` — one `RunSpec` (a `TrainConfig` and a directory) per (variant, seed).
* `sweep(specs, parallel, budget_s, ...)` — the driver (`lpfail.experiments.driver`, its names imported
  here): N subprocesses at a time on one GPU, a wall-clock budget after which running processes are stopped
  (SIGTERM: everything up to the last checkpoint is kept), and ``cont=True`` to continue incomplete runs from
  their newest checkpoint in a later call (the GPU machine keeps /tmp between consecutive calls while it
  stays warm).
* `checks(c, root)` — before trusting the driver: (1) each Triton variant against the reference for
  ``check_steps`` steps (step-0 loss must be bit-identical for A and B′, whose forward the kernel emulates
  bit for bit; close for C and D); (2) a run stopped by the driver and continued from its checkpoint in a
  new process gives exactly the losses of an uninterrupted run.
* `collect(c, specs)` — loss and gradient-norm curves (full and downsampled), max logit, tied-max fraction,
  spectral norms, and the per-seed outcome table.
* `run_symptom(c, root, budget_s)` — all of the above; the registered experiment ``symptom`` calls it with
  ``LPFAIL_SYMPTOM_ROOT`` (default /tmp/lpfail_symptom) and ``LPFAIL_SYMPTOM_BUDGET_S`` (default 450 s).
  Scheduling (root, budget, continuation) is not part of the config: the result depends only on the config.

``python -m lpfail.experiments.symptom sweep [--continue] [--budget S] [--set key=value ...]`` runs the
driver without storing anything; ``python -m lpfail run symptom`` runs (or continues) it and stores the
result; ``tools/gpu_symptom.sh`` wraps both for a GPU call. Plan and numbers: notes/symptom.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpfail import results
# the driver's names stay available here (S.sweep, S.RunSpec ...)
from lpfail.sweep.driver import (  # noqa: F401
    bins as _bins,
    RunSpec, _last_record, _last_step, _stop, _terminated, default_parallel, gpu_ids, latest_checkpoint,
    run_state, sweep)

# -- the failure criterion (pre-registered) --------------------------------------------------------------
#: Fixed on 2026-11-29, before any run of the `symptom` experiment had been made (the only outcomes seen
#: then were those of the first probe, ../shared/probe-findings.md, which used a different, stricter test).
CRITERION_FIXED_ON = "2026-11-29"
WINDOW = 100
RISE = 0.25


def failed(losses, warmup: int, grad_norms=None, window: int = WINDOW, rise: float = RISE
           ) -> tuple[bool, int | None]:
    """The pre-registered failure criterion (fixed on 2026-11-29, before any outcome of the search was seen).

    ``losses[i]`` is the training loss of step i (steps 0, 1, 2, ... with no gaps); ``grad_norms`` optionally
    the pre-clip gradient norms of the same steps. A run **fails** at the first step i at which either

    1. the loss (or the gradient norm) of step i is not finite (NaN or ±inf) — at any step, warm-up included;
    2. i ≥ warmup + window − 1 and the mean loss of the ``window`` steps ending at i exceeds, by more than
       ``rise`` (25 %), the smallest such ``window``-step mean seen at or before i — means over windows that
       lie entirely after the warm-up.

    Returns ``(True, i)`` or ``(False, None)``. A run shorter than warmup + window steps can only fail by (1).
    A short spike does not fail a run: it must lift a whole 100-step mean by 25 % (e.g. 10 steps at 3.5×
    the loss, or 25 steps at 2×). Pure function: no I/O, no state.
    """
    loss = np.asarray(losses, dtype=np.float64).ravel()
    if window < 1 or not rise > 0 or warmup < 0:
        raise ValueError(f"window must be >= 1, rise > 0 and warmup >= 0 (got {window}, {rise}, {warmup})")
    bad = ~np.isfinite(loss)
    if grad_norms is not None:
        g = np.asarray(grad_norms, dtype=np.float64).ravel()
        if g.shape != loss.shape:
            raise ValueError(f"grad_norms has {g.size} steps, losses {loss.size}")
        bad |= ~np.isfinite(g)
    first_bad = int(np.argmax(bad)) if bad.any() else None
    rise_at = None
    n = loss.size if first_bad is None else first_bad  # means only over finite losses
    start = warmup
    if n - start >= window:
        c = np.concatenate([[0.0], np.cumsum(loss[start:n])])
        means = (c[window:] - c[:-window]) / window  # means[j] = mean of steps start+j .. start+j+window-1
        best = np.minimum.accumulate(means)
        hit = np.nonzero(means > (1.0 + rise) * best)[0]
        if hit.size:
            rise_at = int(start + hit[0] + window - 1)
    if first_bad is not None and (rise_at is None or first_bad < rise_at):
        return True, first_bad
    if rise_at is not None:
        return True, rise_at
    return False, None


def final_loss(losses, window: int = WINDOW) -> float:
    """Mean of the last ``window`` finite losses (NaN when there are none)."""
    loss = np.asarray(losses, dtype=np.float64)
    loss = loss[np.isfinite(loss)]
    return float(loss[-window:].mean()) if loss.size else float("nan")


# -- variants ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    policy: str  # a preset name (Precision.parse)
    kernel: bool  # whether the Triton kernel can run this policy (and so may, after `checks`)
    exact_forward: bool  # whether the kernel's forward is expected to be bit-identical to the reference
    label: str


VARIANTS: dict[str, Variant] = {
    "A": Variant("PAPER_BF16", True, True, "A: PAPER_BF16 (the paper's failing code)"),
    "B": Variant("PAPER_BF16_OFFICIAL_FIX", False, False, "B: the official fix (with its 1e-10 clamp)"),
    "Bp": Variant("PAPER_BF16+fix", True, True, "B′: PAPER_BF16 + our fix (no clamp)"),
    "C": Variant("FP32", True, False, "C: FP32 attention"),
    "D": Variant("FA2_BF16", True, False, "D: FA2_BF16 (production kernels)"),
}


@dataclass(frozen=True)
class SymptomConfig:
    """One configuration of the search: a model, data and optimizer, the variants and the seeds.

    Defaults: the first configuration to try, from the probe (../shared/probe-findings.md: 4 layers × 256,
    T 1024, 16 sequences per step, lr 1.5e-2 where its A rose from step 600 while C did not), on the Python
    documentation corpus, with the three cheapest variants first."""

    # model and data
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    block_size: int = 1024
    data: str = "pydocs"
    tokenizer: str = "bytes"
    batch_size: int = 16  # 16,384 tokens per step
    micro_batch: int = 0  # 0: the whole batch in one forward
    # optimizer
    optimizer: str = "adamw"
    lr: float = 1.5e-2
    warmup: int = 100
    schedule: str = "constant"
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    beta2: float = 0.95
    max_steps: int = 2000
    # the search
    variants: tuple[str, ...] = ("A", "C", "Bp", "B", "D")
    seeds: tuple[int, ...] = (0, 1, 2)  # each seed is both the init seed and the batch-order seed
    impl: str = "auto"  # "auto": Triton where `checks` passed on CUDA, else the reference; "reference"; "triton"
    autotune: bool = False  # LPFAIL_KERNELS_AUTOTUNE: off, so every process picks the same kernel configs
    # logging
    diag_every: int = 50
    checkpoint_every: int = 100  # also the most work a run loses when the budget stops it
    curve_points: int = 400  # the downsampled curves' length
    check_steps: int = 20  # steps of each Triton-vs-reference check and of the continue check

    def __post_init__(self):
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"SymptomConfig.variants: unknown variant {v!r}; variants: {list(VARIANTS)}")
        if len(set(self.variants)) != len(self.variants) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("SymptomConfig: variants and seeds must not repeat")
        if self.impl not in ("auto", "reference", "triton"):
            raise ValueError(f"SymptomConfig.impl must be auto, reference or triton (got {self.impl!r})")
        if self.curve_points < 1 or self.check_steps < 4 or self.max_steps < 1:
            raise ValueError("SymptomConfig: curve_points >= 1, check_steps >= 4 and max_steps >= 1 required")
        if not self.seeds:
            raise ValueError("SymptomConfig.seeds must not be empty")
        # the runs' TrainConfig validates the rest (shapes, lr, warm-up ...)
        train_config(self, self.variants[0], self.seeds[0], "reference", "/nonexistent/validate")


def train_config(c: SymptomConfig, variant: str, seed: int, impl: str, out_dir: str, **changes):
    """The `TrainConfig` of one run; ``impl`` is "reference" or "triton"."""
    from lpfail.train import TrainConfig

    v = VARIANTS[variant]
    if impl == "triton" and not v.kernel:
        raise ValueError(f"variant {variant} ({v.policy}) cannot run on the Triton kernel")
    fields = dict(
        n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.block_size, data=c.data,
        tokenizer=c.tokenizer, batch_size=c.batch_size, micro_batch=c.micro_batch, optimizer=c.optimizer,
        lr=c.lr, min_lr=c.lr, warmup=c.warmup, schedule=c.schedule, grad_clip=c.grad_clip,
        weight_decay=c.weight_decay, beta2=c.beta2, max_steps=c.max_steps, autocast="bf16",
        attention=f"{impl}({v.policy})", init_seed=seed, data_seed=seed, diag_every=c.diag_every,
        checkpoint_every=c.checkpoint_every, keep_checkpoints=2, out_dir=out_dir, log_every=1)
    return TrainConfig(**{**fields, **changes})


# -- checks before trusting the driver and the kernel ----------------------------------------------------
def _use_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _env(c: SymptomConfig) -> dict:
    return {"LPFAIL_KERNELS_AUTOTUNE": "1" if c.autotune else "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def checks(c: SymptomConfig, root, parallel: int | None = None, log=print) -> dict:
    """The two checks, run once per root (cached in <root>/checks.json).

    kernel: for each variant with a Triton path (on CUDA, impl != "reference"), ``check_steps`` steps of the
        triton and the reference run (seed = the first seed). ``trusted`` when the run completed, the step-0
        loss is bit-identical (A, B′: the kernel emulates their forward bit for bit) or within 1e-4 relative
        (C, D: different summation order), and the losses of all steps stay within 0.02 (the backward is not
        bit-identical, so later steps drift by reduction-order noise; train_ddp measured 6e-4 over 10 steps).
    continue: one run of 2·k steps (k = check_steps / 2, checkpoint every k/2) uninterrupted, and the same run
        stopped by the driver past step k and continued from its checkpoint in a new process: ``equal``
        when its losses and gradient norms equal the uninterrupted run's bit for bit.
    """
    from lpfail.train import read_log

    root = Path(root)
    path = root / "checks.json"
    if path.is_file():
        return json.loads(path.read_text())
    cuda = _use_cuda()
    gpus = gpu_ids() if cuda else []
    parallel = parallel or default_parallel(gpus)
    first = c.seeds[0]
    k = c.check_steps
    short = dict(max_steps=k, warmup=min(c.warmup, k // 2), diag_every=0, checkpoint_every=0,
                 keep_checkpoints=0)
    specs: list[RunSpec] = []
    kernel_variants = [v for v in c.variants if VARIANTS[v].kernel] if cuda and c.impl != "reference" else []
    for v in kernel_variants:
        for impl in ("triton", "reference"):
            specs.append(RunSpec(f"check_{v}_{impl}", train_config(c, v, first, impl, str(root / "checks" /
                                                                                     f"{v}_{impl}"), **short)))
    v0 = c.variants[0]
    impl0 = "triton" if v0 in kernel_variants else "reference"
    half, total = k, 4 * k  # stopped once past step k (of 4k), checkpoints every k/2
    cont = dict(max_steps=total, warmup=min(c.warmup, half), diag_every=half, checkpoint_every=max(1, k // 2),
                keep_checkpoints=0)
    whole = RunSpec("check_continue_whole", train_config(c, v0, first, impl0, str(root / "checks" / "whole"),
                                                         **cont))
    cut = RunSpec("check_continue_cut", train_config(c, v0, first, impl0, str(root / "checks" / "cut"), **cont),
                  interrupt_at_step=half)
    t0 = time.monotonic()
    st1 = sweep(specs + [whole, cut], parallel, budget_s=1e9, cont=False, env=_env(c), min_start_s=0,
                poll_s=0.1, log=log, gpus=gpus)
    stopped_at = _last_step(cut.dir)
    st2 = sweep([dataclasses.replace(cut, interrupt_at_step=None)], 1, budget_s=1e9, cont=True, env=_env(c),
                min_start_s=0, log=log, gpus=gpus)
    out = {"cuda": cuda, "check_steps": k, "kernel": {}, "wall_s": 0.0}
    for v in kernel_variants:
        t, r = read_log(root / "checks" / f"{v}_triton"), read_log(root / "checks" / f"{v}_reference")
        ok_runs = st1[f"check_{v}_triton"]["state"] == "done" and st1[f"check_{v}_reference"]["state"] == "done"
        n = min(len(t["loss"]), len(r["loss"]))
        d = np.abs(t["loss"][:n] - r["loss"][:n]) if n else np.array([np.inf])
        step0 = float(d[0]) if n else float("inf")
        tol0 = 0.0 if VARIANTS[v].exact_forward else 1e-4 * abs(float(r["loss"][0]) if n else 1.0)
        trusted = bool(ok_runs and n == k and step0 <= tol0 and float(d.max()) <= 0.02)
        tps = lambda a: float(np.nanmedian(a["tokens_per_s"][1:])) if len(a["tokens_per_s"]) > 1 else float("nan")  # noqa: E731
        out["kernel"][v] = {"trusted": trusted, "step0_abs_diff": step0, "max_abs_diff": float(d.max()),
                            "steps": int(n), "loss_triton": t["loss"][:n].tolist(),
                            "loss_reference": r["loss"][:n].tolist(), "tokens_per_s_triton": tps(t),
                            "tokens_per_s_reference": tps(r), "states": [st1[f"check_{v}_triton"]["state"],
                                                                         st1[f"check_{v}_reference"]["state"]]}
        log(f"check kernel {v}: trusted {trusted}; step-0 |Δloss| {step0:.3g}, max over {n} steps "
            f"{float(d.max()):.3g}; tokens/s triton {tps(t):,.0f} vs reference {tps(r):,.0f}")
    w, cu = read_log(whole.dir), read_log(cut.dir)
    resumed = st2[cut.name]["resumed_from"]
    equal = bool(len(w["loss"]) == total and np.array_equal(w["loss"], cu["loss"])
                 and np.array_equal(w["grad_norm"], cu["grad_norm"]))
    exercised = bool(st1[cut.name]["state"] == "stopped" and resumed is not None and resumed > 0)
    out["continue"] = {"equal": equal, "exercised": exercised, "variant": v0, "impl": impl0, "steps": total,
                       "stopped_state": st1[cut.name]["state"], "stopped_at_step": stopped_at,
                       "resumed_from": resumed, "loss_whole": w["loss"].tolist(),
                       "loss_continued": cu["loss"].tolist()}
    out["wall_s"] = round(time.monotonic() - t0, 2)
    log(f"check continue: {cut.name} {st1[cut.name]['state']} at step {stopped_at}, resumed from step {resumed}: "
        f"losses equal to the uninterrupted run's: {equal}")
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def impl_for(c: SymptomConfig, variant: str, chk: dict) -> str:
    """The implementation a variant's runs use, given the checks."""
    if c.impl == "reference" or not VARIANTS[variant].kernel or not chk.get("cuda"):
        return "reference"
    if c.impl == "triton":
        return "triton"
    return "triton" if chk["kernel"].get(variant, {}).get("trusted") else "reference"


def plan(c: SymptomConfig, root, chk: dict) -> list[RunSpec]:
    """One run per (variant, seed), in the order seed-major (so the first N started cover every variant)."""
    root = Path(root)
    specs = []
    for seed in c.seeds:
        for v in c.variants:
            impl = impl_for(c, v, chk)
            specs.append(RunSpec(f"{v}_s{seed}", train_config(c, v, seed, impl, str(root / "runs" / f"{v}_s{seed}")),
                                 variant=v, seed=seed))
    return specs


# -- collecting ----------------------------------------------------------------------------------------
def crash_note(run_dir) -> str | None:
    """The ``error: ...`` line that the run's last process ended with (its stdout.txt), or None."""
    p = Path(run_dir) / "stdout.txt"
    if not p.is_file():
        return None
    last = p.read_text(errors="replace").rsplit("\n# ", 1)[-1]  # each start appends a "# <date> <cmd>" line
    errs = [line.strip() for line in last.splitlines() if line.startswith("error:")]
    return errs[-1] if errs else None


def outcome(run_dir, warmup: int) -> dict:
    """The criterion applied to one run directory: failed, fail_step, final_loss, status, steps, note.

    A run whose process stopped with an error about non-finite values (an attention input check that saw
    NaN: the forward of the step after its last logged one was not finite) counts as non-finite at that step,
    status "nonfinite", with the error line as its note; any other error leaves status "error"."""
    from lpfail.train import is_nonfinite_message, read_log, read_status

    lg = read_log(run_dir)
    loss, gn = lg["loss"], lg["grad_norm"]
    if len(loss) and not np.array_equal(lg["step"], np.arange(len(loss))):
        raise ValueError(f"{run_dir}: log.jsonl steps are not 0..n-1 (log_every must be 1)")
    try:
        st = read_status(run_dir)
    except (OSError, ValueError):
        st = {"status": "missing", "steps": 0}
    f, step = failed(loss, warmup, grad_norms=gn)
    status, note = st["status"], ""
    if status not in ("completed", "nonfinite"):
        err = crash_note(run_dir)
        if err is not None:
            note = err
            if is_nonfinite_message(err):
                status = "nonfinite"
                if not f:
                    f, step = True, int(len(loss))
            else:
                status = "error"
    return {"failed": f, "fail_step": step, "final_loss": final_loss(loss), "status": status,
            "steps": int(len(loss)), "note": note,
            "min_loss": float(np.nanmin(loss)) if np.isfinite(loss).any() else float("nan")}


def outcome_table(variants, seeds, failed_, fail_step, final, status, steps) -> str:
    """The per-seed outcome table as Markdown: one row per variant, one column per seed."""
    head = "| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | fails |\n"
    head += "|---|" + "---|" * len(seeds) + "---|\n"
    rows = []
    for i, v in enumerate(variants):
        cells = []
        for j in range(len(seeds)):
            if status[i][j] in ("missing", "pending"):
                cells.append("not run")
                continue
            tail = "" if status[i][j] in ("completed", "nonfinite") else f" ({status[i][j]}, {steps[i][j]} steps)"
            if failed_[i][j] and status[i][j] == "nonfinite" and not np.isfinite(final[i][j]):
                cells.append(f"**fails** at {fail_step[i][j]} (non-finite){tail}")
            elif failed_[i][j] and status[i][j] == "nonfinite":
                cells.append(f"**fails** at {fail_step[i][j]} (non-finite), final {final[i][j]:.3f}{tail}")
            elif failed_[i][j]:
                cells.append(f"**fails** at {fail_step[i][j]}, final {final[i][j]:.3f}{tail}")
            else:
                cells.append(f"ok, final {final[i][j]:.3f}{tail}")
        n_fail = int(sum(bool(failed_[i][j]) for j in range(len(seeds))))
        rows.append(f"| {VARIANTS[v].label} | " + " | ".join(cells) + f" | {n_fail}/{len(seeds)} |")
    return head + "\n".join(rows) + "\n"


def _strip_curves(d):
    """`checks`' record without its per-step loss lists (they stay in checks.json)."""
    if isinstance(d, dict):
        return {k: _strip_curves(v) for k, v in d.items() if not k.startswith("loss_")}
    return d


def collect(c: SymptomConfig, specs: list[RunSpec], chk: dict | None = None) -> dict:
    """Arrays over (variant, seed, ...) from the run directories, and the outcome table."""
    from lpfail.train import read_diag, read_log

    V, S, N = len(c.variants), len(c.seeds), c.max_steps
    by = {(s.variant, s.seed): s for s in specs}
    full = lambda: np.full((V, S, N), np.nan, dtype=np.float32)  # noqa: E731
    loss, gnorm = full(), full()
    b = max(1, math.ceil(N / c.curve_points))
    P = math.ceil(N / b)
    loss_curve, gn_curve, gn_curve_max = (np.full((V, S, P), np.nan) for _ in range(3))
    n_diag = len(range(0, N, c.diag_every)) if c.diag_every else 0
    diag_steps = np.arange(0, N, c.diag_every) if c.diag_every else np.zeros(0, dtype=np.int64)
    max_logit = np.full((V, S, n_diag, c.n_layer), np.nan)
    tied = np.full((V, S, n_diag, c.n_layer), np.nan)
    wq = np.full((V, S, n_diag, c.n_layer, c.n_head), np.nan)
    wqk = np.full((V, S, n_diag, c.n_layer, c.n_head), np.nan)
    spectral_names: list[str] = []
    spectral = None
    failed_ = np.zeros((V, S), dtype=bool)
    fail_step = np.full((V, S), -1, dtype=np.int64)
    final = np.full((V, S), np.nan)
    steps = np.zeros((V, S), dtype=np.int64)
    tps = np.full((V, S), np.nan)
    status = [["missing"] * S for _ in range(V)]
    notes = [[""] * S for _ in range(V)]
    impls = [[""] * S for _ in range(V)]
    for i, v in enumerate(c.variants):
        for j, seed in enumerate(c.seeds):
            s = by.get((v, seed))
            if s is None or not (s.dir / "log.jsonl").is_file():
                continue
            impls[i][j] = s.cfg.attention
            o = outcome(s.dir, c.warmup)
            lg = read_log(s.dir)
            n = min(N, len(lg["loss"]))
            loss[i, j, :n], gnorm[i, j, :n] = lg["loss"][:n], lg["grad_norm"][:n]
            loss_curve[i, j] = _bins(lg["loss"][:n], N, c.curve_points)[:P] if n else np.nan
            gn_curve[i, j] = _bins(lg["grad_norm"][:n], N, c.curve_points)[:P] if n else np.nan
            gn_curve_max[i, j] = _bins(lg["grad_norm"][:n], N, c.curve_points, np.max)[:P] if n else np.nan
            failed_[i, j], fail_step[i, j] = o["failed"], (o["fail_step"] if o["fail_step"] is not None else -1)
            final[i, j], steps[i, j] = o["final_loss"], o["steps"]
            status[i][j] = o["status"] if not (o["status"] == "running") else "incomplete"
            notes[i][j] = o["note"]
            if n > 1:
                tps[i, j] = float(np.nanmedian(lg["tokens_per_s"][1:n]))
            d = read_diag(s.dir)
            if len(d["step"]) and n_diag:
                idx = np.searchsorted(diag_steps, d["step"])
                keep = (idx < n_diag) & (diag_steps[np.minimum(idx, n_diag - 1)] == d["step"])
                idx, sel = idx[keep], np.nonzero(keep)[0]
                if "max_logit" in d:
                    max_logit[i, j, idx], tied[i, j, idx] = d["max_logit"][sel], d["tied_frac"][sel]
                wq[i, j, idx], wqk[i, j, idx] = d["wq"][sel], d["wqk"][sel]
                if spectral is None:
                    spectral_names = sorted(d["spectral"])
                    spectral = np.full((V, S, n_diag, len(spectral_names)), np.nan)
                for kk, name in enumerate(spectral_names):
                    spectral[i, j, idx, kk] = d["spectral"][name][sel]
    table = outcome_table(c.variants, c.seeds, failed_, fail_step, final, status, steps)
    complete = all(status[i][j] in ("completed", "nonfinite") for i in range(V) for j in range(S))
    out = {
        "variants": np.array(list(c.variants)), "variant_labels": np.array([VARIANTS[v].label for v in c.variants]),
        "seeds": np.array(c.seeds, dtype=np.int64), "loss": loss, "grad_norm": gnorm,
        "curve_steps": (np.arange(P) * b + (b - 1) / 2.0), "loss_curve": loss_curve, "grad_norm_curve": gn_curve,
        "grad_norm_curve_max": gn_curve_max, "diag_steps": diag_steps, "max_logit": max_logit,
        "tied_frac": tied, "wq": wq, "wqk": wqk,
        "spectral": spectral if spectral is not None else np.zeros((V, S, n_diag, 0)),
        "spectral_names": np.array(spectral_names, dtype=str), "failed": failed_, "fail_step": fail_step,
        "final_loss": final, "steps": steps, "tokens_per_s": tps, "status": np.array(status, dtype=str),
        "notes": np.array(notes, dtype=str),
        "attention": np.array(impls, dtype=str),
        "outcome_table": table, "complete": complete,
        "criterion": f"fails at the first non-finite loss or gradient norm, or when a {WINDOW}-step mean loss "
                     f"after warm-up exceeds the run's best {WINDOW}-step mean by more than {RISE:.0%} "
                     f"(fixed {CRITERION_FIXED_ON}, lpfail.symptom.failed)",
        "n_failed": {v: int(failed_[i].sum()) for i, v in enumerate(c.variants)},
    }
    if chk is not None:
        out["checks"] = json.dumps(_strip_curves(chk))
        out["kernel_trusted"] = {v: bool(d["trusted"]) for v, d in chk.get("kernel", {}).items()}
        out["continue_equal"] = bool(chk.get("continue", {}).get("equal", False))
    return out


# -- the experiment ------------------------------------------------------------------------------------
DEFAULT_ROOT = "/tmp/lpfail_symptom"
DEFAULT_BUDGET_S = 450.0


def symptom_root(c: SymptomConfig, root=None) -> Path:
    """<LPFAIL_SYMPTOM_ROOT or /tmp/lpfail_symptom>/<config hash>: one directory per configuration."""
    base = Path(root or os.environ.get("LPFAIL_SYMPTOM_ROOT") or DEFAULT_ROOT)
    return base / results.config_hash(c)


def run_symptom(c: SymptomConfig, root=None, budget_s: float | None = None, cont: bool = True,
                log=print) -> dict:
    """Checks (once per root), then the sweep within `budget_s` (continuing what an earlier call left), then
    `collect`. With budget_s = 0 nothing is trained: only collected."""
    t0 = time.monotonic()
    if budget_s is None:
        budget_s = float(os.environ.get("LPFAIL_SYMPTOM_BUDGET_S", DEFAULT_BUDGET_S))
    root = symptom_root(c, root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "symptom_config.json").write_text(json.dumps(results.config_dict(c), indent=1) + "\n")
    chk = json.loads((root / "checks.json").read_text()) if (root / "checks.json").is_file() else None
    if chk is None and budget_s > 0:
        chk = checks(c, root, log=log)
    chk = chk or {"cuda": _use_cuda(), "kernel": {}}
    specs = plan(c, root, chk)
    st = {}
    left = budget_s - (time.monotonic() - t0)
    if left > 0:
        gpus = gpu_ids() if chk.get("cuda") else []
        st = sweep(specs, default_parallel(gpus), left, cont=cont, env=_env(c), log=log, gpus=gpus)
    out = collect(c, specs, chk)
    out["driver"] = json.dumps(st)
    out["root"] = str(root)
    (root / "outcome_table.md").write_text(out["outcome_table"])
    log(out["outcome_table"])
    return out


@results.experiment("symptom", config=SymptomConfig, gpu=True,
                    description="the search for a small-scale BF16 flash-attention loss explosion (chapter 1)")
def symptom(c: SymptomConfig) -> dict:
    """Variants A, B, B′, C, D of one small GPT on identical batches and init, several seeds, judged by the
    pre-registered criterion; continues from checkpoints left by earlier calls (LPFAIL_SYMPTOM_ROOT)."""
    return run_symptom(c)


# -- neighbouring configurations (the search around the default) -----------------------------------------
@dataclass(frozen=True)
class SymptomSweepConfig:
    """Configurations next to the default one (`SymptomConfig()`), each given as ``key=value`` overrides
    of it (several separated by spaces), run with the same seeds and the cheaper variants. Listed in the
    order the driver starts them: when the GPU time runs out, the later points are the ones left incomplete
    (the result says which)."""

    points: tuple[str, ...] = ("lr=0.02", "impl=reference variants=A", "lr=0.01", "warmup=50")
    variants: tuple[str, ...] = ("A", "C", "Bp")
    seeds: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self):
        if not self.points:
            raise ValueError("SymptomSweepConfig.points must not be empty")
        if len(set(self.points)) != len(self.points):
            raise ValueError("SymptomSweepConfig.points must not repeat")
        for k in range(len(self.points)):
            point_config(self, k)  # raises on an unknown field or a bad value


def _overrides(point: str) -> dict[str, str]:
    out = {}
    for kv in point.split():
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise ValueError(f"a sweep point is `key=value [key=value ...]` (got {point!r})")
        if key == "seeds":
            raise ValueError(f"sweep point {point!r}: the seeds are set for all points at once")
        out[key] = value
    return out


def point_config(sc: SymptomSweepConfig, k: int) -> SymptomConfig:
    """The `SymptomConfig` of sweep point k: the default with the point's overrides, the sweep's seeds, and
    the sweep's variants unless the point names its own (e.g. ``impl=reference variants=A``: A on the
    bit-faithful reference, to compare with A on the kernel)."""
    ov = _overrides(sc.points[k])
    c = results.typed_config(results.get("symptom"), ov)
    variants = c.variants if "variants" in ov else tuple(sc.variants)
    return dataclasses.replace(c, variants=variants, seeds=tuple(sc.seeds))


def _shared_checks(c: SymptomConfig, root: Path, source: Path, log=print) -> dict | None:
    """Use the default configuration's checks for a neighbouring one with the same model shape (the checks
    compare the kernel with the reference and a continued run with an uninterrupted one: neither depends on
    lr or warm-up). Written to <root>/checks.json with ``shared_from``; None when they cannot be shared."""
    src = source / "checks.json"
    if not src.is_file():
        return None
    base = json.loads((source / "symptom_config.json").read_text())
    shape = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "micro_batch", "data", "tokenizer",
             "optimizer")
    mine = results.config_dict(c)
    if any(base.get(k) != mine.get(k) for k in shape):
        return None
    chk = json.loads(src.read_text())
    if any(v in VARIANTS and VARIANTS[v].kernel and v not in chk.get("kernel", {}) for v in c.variants) \
            and chk.get("cuda"):
        return None
    chk["shared_from"] = str(source)
    root.mkdir(parents=True, exist_ok=True)
    (root / "checks.json").write_text(json.dumps(chk, indent=1) + "\n")
    log(f"checks for {root.name}: shared from {source.name} (same model, data and batch shape)")
    return chk


def drive(configs: list[SymptomConfig], budget_s: float, root=None, log=print) -> dict:
    """The whole search in one driver: the checks of the first configuration (shared with the others where
    the model shape is the same, else their own), then one sweep over every run of every configuration, in
    the order given (so the first configuration's runs start first), until all are done or `budget_s` has
    passed (<base>/control.json can bring that forward or change the number of processes: `sweep`).
    Nothing is collected or stored here: `python -m lpfail run symptom` and `... run symptom_sweep`
    (with LPFAIL_SYMPTOM_BUDGET_S=0) collect what the driver left. Writes <base>/drive.json when it ends."""
    t0 = time.monotonic()
    base = Path(root or os.environ.get("LPFAIL_SYMPTOM_ROOT") or DEFAULT_ROOT)
    roots = [symptom_root(c, base) for c in configs]
    chks = []
    for i, (c, r) in enumerate(zip(configs, roots)):
        r.mkdir(parents=True, exist_ok=True)
        (r / "symptom_config.json").write_text(json.dumps(results.config_dict(c), indent=1) + "\n")
        chk = json.loads((r / "checks.json").read_text()) if (r / "checks.json").is_file() else None
        if chk is None and i > 0:
            chk = _shared_checks(c, r, roots[0], log=log)
        if chk is None:
            chk = checks(c, r, log=log)
        chks.append(chk)
    specs = [dataclasses.replace(s, name=f"c{i}_{s.name}")  # names unique across the configurations
             for i, (c, r, chk) in enumerate(zip(configs, roots, chks)) for s in plan(c, r, chk)]
    gpus = gpu_ids() if chks[0].get("cuda") else []
    env = _env(configs[0])
    if any(_env(c) != env for c in configs):
        raise ValueError("drive: the configurations must agree on `autotune`")
    left = budget_s - (time.monotonic() - t0)
    st = sweep(specs, default_parallel(gpus), left, cont=True, env=env, log=log, gpus=gpus,
               control=base / "control.json") if left > 0 else {}
    rec = {"roots": [str(r) for r in roots], "runs": st, "wall_s": round(time.monotonic() - t0, 2),
           "budget_s": budget_s, "gpus": gpus, "ended": time.strftime("%Y-%m-%d %H:%M:%S")}
    (base / "drive.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def progress(base) -> str:
    """One line per run under <base>/<config hash>/runs/: its last logged step, loss and status."""
    from lpfail.train import read_status

    lines = []
    for cfg_path in sorted(Path(base).glob("*/symptom_config.json")):
        conf = json.loads(cfg_path.read_text())
        lines.append(f"{cfg_path.parent.name}: lr {conf.get('lr')} warmup {conf.get('warmup')}")
        for run in sorted((cfg_path.parent / "runs").glob("*")):
            rec = _last_record(run) or {}
            step = int(rec.get("step", -1))
            loss = float(rec["loss"]) if rec.get("loss") is not None else float("nan")
            try:
                st = read_status(run)["status"]
            except (OSError, ValueError, KeyError):
                st = "-"
            lines.append(f"  {run.name:8s} step {step:5d} loss {loss:8.4f} {st}")
    return "\n".join(lines)


def sweep_configs(sc: SymptomSweepConfig) -> list[SymptomConfig]:
    return [point_config(sc, k) for k in range(len(sc.points))]


@results.experiment("symptom_sweep", config=SymptomSweepConfig, gpu=True,
                    description="chapter 1's search around the default configuration (lr, warm-up)")
def symptom_sweep(sc: SymptomSweepConfig) -> dict:
    """Each point's `collect` (after a sweep within LPFAIL_SYMPTOM_BUDGET_S, continuing what earlier calls
    left), stored with a ``p{k}_`` prefix per point (variants and seeds included), plus ``points``,
    ``point_complete`` and ``complete``."""
    out: dict = {"points": np.array(sc.points, dtype=str)}
    completes = []
    for k, c in enumerate(sweep_configs(sc)):
        d = run_symptom(c)
        for key, value in d.items():
            out[f"p{k}_{key}"] = value
        completes.append(bool(d["complete"]))
    out["point_complete"] = np.array(completes)
    out["complete"] = all(completes)
    return out


def recollect(archive, gpu_results, directory=None, log=print) -> dict:
    """Collect `symptom` and `symptom_sweep` again, here, from the runs' logs (``archive``: the
    symptom_runs.tgz that a GPU call brought back, or an unpacked copy of it) and store both.

    For results whose runs are finished but whose collection code changed after the GPU machine went away:
    the collection is a pure function of the logs. ``gpu_results``: the directory holding the JSON files that
    the GPU call stored itself (their provenance is carried over: ``device``, ``git`` and ``versions`` are the
    runs'; ``collected_*`` say where, when and by which code this collection ran; ``runs_archive`` names the
    archive and its sha256). Returns {name: Result}."""
    import hashlib
    import tarfile
    import tempfile

    archive, gpu_results = Path(archive), Path(gpu_results)
    tmp = None
    if archive.is_file():
        tmp = tempfile.TemporaryDirectory(prefix="lpfail_recollect_")
        with tarfile.open(archive) as tf:
            tf.extractall(tmp.name, filter="data")
        runs = Path(tmp.name)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    else:
        runs, digest = archive, None
    drive_rec = json.loads((runs / "drive.json").read_text()) if (runs / "drive.json").is_file() else {}
    stored = {}
    old_env = {k: os.environ.get(k) for k in ("LPFAIL_SYMPTOM_ROOT", "LPFAIL_SYMPTOM_BUDGET_S")}
    try:
        os.environ["LPFAIL_SYMPTOM_ROOT"], os.environ["LPFAIL_SYMPTOM_BUDGET_S"] = str(runs), "0"
        for name in ("symptom", "symptom_sweep"):
            gmeta = json.loads((gpu_results / f"{name}.json").read_text())
            exp = results.get(name)
            cfg = exp.default_config()
            if gmeta["config_hash"] != results.config_hash(cfg):
                raise results.ResultStale(f"{gpu_results / (name + '.json')} is for config {gmeta['config_hash']}, "
                                          f"the default now hashes to {results.config_hash(cfg)}")
            t0 = time.perf_counter()
            data = exp.fn(cfg)
            prov = {"device": gmeta["device"], "git": gmeta["git"], "versions": gmeta["versions"],
                    "created": gmeta["created"], "runs_wall_s": drive_rec.get("wall_s"),
                    "runs_gpus": drive_rec.get("gpus"), "runs_ended": drive_rec.get("ended"),
                    "collected_on": results._device(), "collected_git": results._git(),
                    "collected_versions": results._versions(),
                    "collected": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                    "runs_archive": {"path": archive.name, "sha256": digest}}
            stored[name] = results.save(name, cfg, data, time.perf_counter() - t0, directory, provenance=prov)
            log(f"{name}: recollected from {archive} (runs on {gmeta['device']}, git {gmeta['git'][:12]})")
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if tmp is not None:
            tmp.cleanup()
    return stored


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lpfail.experiments.symptom", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["sweep", "collect", "plan", "drive", "progress", "recollect"],
                    help="drive: the default configuration and the symptom_sweep points in one driver "
                         "(checks, then every run, until done or --budget; nothing stored)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a SymptomConfig field")
    ap.add_argument("--continue", dest="cont", action="store_true",
                    help="continue incomplete runs from their checkpoints (default: start them afresh)")
    ap.add_argument("--budget", type=float, default=None, help="seconds (default $LPFAIL_SYMPTOM_BUDGET_S or 450)")
    ap.add_argument("--root", default=None, help="runs directory (default $LPFAIL_SYMPTOM_ROOT or /tmp/lpfail_symptom)")
    ap.add_argument("--summary", default=None, help="also write the collected arrays here (.npz) with a .json")
    ap.add_argument("--archive", default=None, help="recollect: the runs archive (symptom_runs.tgz)")
    ap.add_argument("--gpu-results", default=None, help="recollect: directory of the GPU call's symptom*.json")
    args = ap.parse_args(argv)
    sets = {}
    for p in args.set or []:
        k, _, v = p.partition("=")
        sets[k.strip()] = v.strip()
    c = results.typed_config(results.get("symptom"), sets)
    if args.cmd == "recollect":
        if not (args.archive and args.gpu_results):
            ap.error("recollect needs --archive (symptom_runs.tgz) and --gpu-results (the GPU call's JSON files)")
        recollect(args.archive, args.gpu_results)
        return 0
    if args.cmd == "progress":
        base = Path(args.root or os.environ.get("LPFAIL_SYMPTOM_ROOT") or DEFAULT_ROOT)
        print(progress(base))
        return 0
    if args.cmd == "drive":
        budget = args.budget if args.budget is not None else float(
            os.environ.get("LPFAIL_SYMPTOM_BUDGET_S", DEFAULT_BUDGET_S))
        rec = drive([c] + sweep_configs(SymptomSweepConfig()), budget, args.root)
        print(json.dumps({k: rec[k] for k in ("wall_s", "budget_s", "gpus", "ended")}))
        return 0
    root = symptom_root(c, args.root)
    if args.cmd == "plan":
        chk = json.loads((root / "checks.json").read_text()) if (root / "checks.json").is_file() else {}
        for s in plan(c, root, chk):
            print(s.name, s.cfg.attention, s.dir, run_state(s))
        return 0
    out = run_symptom(c, args.root, 0.0 if args.cmd == "collect" else args.budget, cont=args.cont)
    if args.summary:
        arrays, scalars = results._split("symptom", out)
        path = Path(args.summary)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)
        path.with_suffix(".json").write_text(json.dumps({"config": results.config_dict(c),
                                                         "config_hash": results.config_hash(c),
                                                         "scalars": scalars}, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    from lpfail.experiments.symptom import main as _main  # the registered module, not this __main__ copy

    sys.exit(_main())
