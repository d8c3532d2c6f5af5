"""Chapter 1 ("Symptom"): the search for a small-scale loss explosion caused by BF16 flash attention.

Several variants of one run — same init, same batches, only the attention's arithmetic differs —
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
* `checks(c, root)` — before trusting the driver: (1) each Triton variant against the reference for
  ``check_steps`` steps (step-0 loss must be bit-identical for A and B′, whose forward the kernel emulates
  bit for bit; close for C and D); (2) a run stopped by the driver and continued from its checkpoint in a
  new process gives exactly the losses of an uninterrupted run. Stored beside the runs (`checks_path`): they
  decide which variants run on the kernel (`impl_for`), and so the runs' TrainConfigs.
* `SymptomGrid` — the `lpfail.sweep` grid of one configuration (variant × seed); `SymptomSweepGrid` the
  neighbouring configurations (`SymptomSweepConfig`). Each run's summary (`summarize`: the outcome, the
  per-step loss and gradient norm, the diagnostics) goes into the run store ``results/symptom_parts/``;
  `collect` turns the summaries into the result's arrays and the per-seed outcome table.
* `migrate` — the store built from the runs archive of the search's GPU run (``results/symptom_runs.tgz``),
  with that run's provenance.

``python -m lpfail sweep symptom status | plan | checks | drive [--budget S] [--quick] | collect`` (and
``symptom_sweep``); ``python -m lpfail run symptom`` runs what is missing and stores the result. Plan and
numbers: notes/symptom.md.
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
from lpfail.sweep import GridBase, Run, Store, register_grid
from lpfail.sweep.store import encode_part, part_files, read_part
# the driver's names stay available here (S.sweep, S.RunSpec ...)
from lpfail.sweep.driver import (  # noqa: F401
    bins as _bins,
    RunSpec, _last_step, default_parallel, gpu_ids, latest_checkpoint,
    run_state, sweep)

# -- the failure criterion (pre-registered) --------------------------------------------------------------
#: Fixed on 2026-11-29, before any run of the `symptom` experiment had been made (the only outcomes seen
#: then were those of the first exploratory probe (lpfail.book.probes), which used a different, stricter test).
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

    Defaults: the first configuration to try, from the first exploratory probe (lpfail.book.probes: 4 layers × 256,
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


def _f32(x) -> list:
    """A float32 series as the shortest decimals that round back to it (lossless for the logs' float32 losses and
    gradient norms; NaN and inf kept)."""
    return [float(str(np.float32(v))) if np.isfinite(v) else float(v) for v in np.asarray(x, dtype=np.float64)]


def summarize(run_dir, tc, key: str) -> dict:
    """What the run store keeps of one run of the search: the criterion's outcome, the per-step loss and
    gradient norm (the criterion reads every step), the median throughput and the diagnostics."""
    from lpfail.sweep import run_hash
    from lpfail.train import read_diag, read_log

    lg = read_log(run_dir)
    o = outcome(run_dir, tc.warmup)
    n = len(lg["loss"])
    d = read_diag(run_dir)
    diag = {"step": d["step"].tolist(), "spectral": {k: v.tolist() for k, v in d["spectral"].items()}}
    diag.update({k: d[k].tolist() for k in ("max_logit", "tied_frac", "wq", "wqk") if k in d})
    return {"key": key, "run_hash": run_hash(tc), "attention": tc.attention,
            "failed": bool(o["failed"]), "fail_step": o["fail_step"], "final_loss": float(o["final_loss"]),
            "status": o["status"], "steps": int(o["steps"]), "note": o["note"],
            "loss": _f32(lg["loss"]), "grad_norm": _f32(lg["grad_norm"]),
            "tokens_per_s": float(np.nanmedian(lg["tokens_per_s"][1:n])) if n > 1 else float("nan"), "diag": diag}


def _diag_into(out: dict, i: int, j: int, d: dict, diag_steps: np.ndarray, names: list[str]):
    """One run's diagnostics into the (variant, seed, diag step, ...) arrays of `collect`."""
    n_diag = len(diag_steps)
    steps = np.asarray(d["step"], dtype=np.int64)
    if not len(steps) or not n_diag:
        return
    idx = np.searchsorted(diag_steps, steps)
    keep = (idx < n_diag) & (diag_steps[np.minimum(idx, n_diag - 1)] == steps)
    idx, sel = idx[keep], np.nonzero(keep)[0]
    if "max_logit" in d:
        out["max_logit"][i, j, idx] = np.asarray(d["max_logit"], dtype=np.float64)[sel]
        out["tied_frac"][i, j, idx] = np.asarray(d["tied_frac"], dtype=np.float64)[sel]
    out["wq"][i, j, idx] = np.asarray(d["wq"], dtype=np.float64)[sel]
    out["wqk"][i, j, idx] = np.asarray(d["wqk"], dtype=np.float64)[sel]
    for kk, name in enumerate(names):
        out["spectral"][i, j, idx, kk] = np.asarray(d["spectral"][name], dtype=np.float64)[sel]


def _arrays(c: SymptomConfig, n_diag: int) -> dict:
    V, S, N = len(c.variants), len(c.seeds), c.max_steps
    P = math.ceil(N / max(1, math.ceil(N / c.curve_points)))
    return {"loss": np.full((V, S, N), np.nan, dtype=np.float32), "grad_norm": np.full((V, S, N), np.nan,
                                                                                        dtype=np.float32),
            "loss_curve": np.full((V, S, P), np.nan), "grad_norm_curve": np.full((V, S, P), np.nan),
            "grad_norm_curve_max": np.full((V, S, P), np.nan),
            "max_logit": np.full((V, S, n_diag, c.n_layer), np.nan),
            "tied_frac": np.full((V, S, n_diag, c.n_layer), np.nan),
            "wq": np.full((V, S, n_diag, c.n_layer, c.n_head), np.nan),
            "wqk": np.full((V, S, n_diag, c.n_layer, c.n_head), np.nan),
            "failed": np.zeros((V, S), dtype=bool), "fail_step": np.full((V, S), -1, dtype=np.int64),
            "final_loss": np.full((V, S), np.nan), "steps": np.zeros((V, S), dtype=np.int64),
            "tokens_per_s": np.full((V, S), np.nan)}


def collect(c: SymptomConfig, runs: dict, chk: dict | None = None) -> dict:
    """Arrays over (variant, seed, ...) from the stored run summaries (``runs``: {(variant, seed): summary}),
    and the outcome table."""
    V, S, N = len(c.variants), len(c.seeds), c.max_steps
    b = max(1, math.ceil(N / c.curve_points))
    diag_steps = np.arange(0, N, c.diag_every) if c.diag_every else np.zeros(0, dtype=np.int64)
    out = _arrays(c, len(diag_steps))
    first = next((r for r in runs.values() if r["diag"]["step"]), None)
    names = sorted(first["diag"]["spectral"]) if first else []
    out["spectral"] = np.full((V, S, len(diag_steps), len(names)), np.nan) if first else np.zeros((V, S, len(diag_steps), 0))
    status = [["missing"] * S for _ in range(V)]
    notes, impls = [[""] * S for _ in range(V)], [[""] * S for _ in range(V)]
    for i, v in enumerate(c.variants):
        for j, seed in enumerate(c.seeds):
            r = runs.get((v, seed))
            if r is None:
                continue
            impls[i][j], notes[i][j] = r["attention"], r["note"]
            loss, gn = (np.asarray(r[k], dtype=np.float64).astype(np.float32).astype(np.float64)  # `_f32`'s values
                        for k in ("loss", "grad_norm"))
            n = min(N, len(loss))
            out["loss"][i, j, :n], out["grad_norm"][i, j, :n] = loss[:n], gn[:n]
            if n:
                P = out["loss_curve"].shape[-1]
                out["loss_curve"][i, j] = _bins(loss[:n], N, c.curve_points)[:P]
                out["grad_norm_curve"][i, j] = _bins(gn[:n], N, c.curve_points)[:P]
                out["grad_norm_curve_max"][i, j] = _bins(gn[:n], N, c.curve_points, np.max)[:P]
            out["failed"][i, j], out["fail_step"][i, j] = r["failed"], (r["fail_step"] if r["fail_step"] is not None
                                                                        else -1)
            out["final_loss"][i, j], out["steps"][i, j] = r["final_loss"], r["steps"]
            status[i][j] = r["status"] if r["status"] != "running" else "incomplete"
            if n > 1:
                out["tokens_per_s"][i, j] = r["tokens_per_s"]
            _diag_into(out, i, j, r["diag"], diag_steps, names)
    return _finish(c, out, status, notes, impls, b, diag_steps, names, chk)


def _finish(c, out, status, notes, impls, b, diag_steps, names, chk) -> dict:
    V, S = len(c.variants), len(c.seeds)
    table = outcome_table(c.variants, c.seeds, out["failed"], out["fail_step"], out["final_loss"], status, out["steps"])
    P = out["loss_curve"].shape[-1]
    res = {"variants": np.array(list(c.variants)), "variant_labels": np.array([VARIANTS[v].label for v in c.variants]),
           "seeds": np.array(c.seeds, dtype=np.int64), "loss": out["loss"], "grad_norm": out["grad_norm"],
           "curve_steps": (np.arange(P) * b + (b - 1) / 2.0), "loss_curve": out["loss_curve"],
           "grad_norm_curve": out["grad_norm_curve"], "grad_norm_curve_max": out["grad_norm_curve_max"],
           "diag_steps": diag_steps, "max_logit": out["max_logit"], "tied_frac": out["tied_frac"], "wq": out["wq"],
           "wqk": out["wqk"], "spectral": out["spectral"], "spectral_names": np.array(names, dtype=str),
           "failed": out["failed"], "fail_step": out["fail_step"], "final_loss": out["final_loss"],
           "steps": out["steps"], "tokens_per_s": out["tokens_per_s"], "status": np.array(status, dtype=str),
           "notes": np.array(notes, dtype=str), "attention": np.array(impls, dtype=str),
           "outcome_table": table,
           "complete": all(status[i][j] in ("completed", "nonfinite") for i in range(V) for j in range(S)),
           "criterion": f"fails at the first non-finite loss or gradient norm, or when a {WINDOW}-step mean loss "
                        f"after warm-up exceeds the run's best {WINDOW}-step mean by more than {RISE:.0%} "
                        f"(fixed {CRITERION_FIXED_ON}, lpfail.symptom.failed)",
           "n_failed": {v: int(out["failed"][i].sum()) for i, v in enumerate(c.variants)}}
    if chk is not None:
        res["checks"] = json.dumps(_strip_curves(chk))
        res["kernel_trusted"] = {v: bool(d["trusted"]) for v, d in chk.get("kernel", {}).items()}
        res["continue_equal"] = bool(chk.get("continue", {}).get("equal", False))
    return res


# -- the grid: the search's runs in the run store --------------------------------------------------------------
STORE = Store("symptom_parts", "lpfail.symptom.part", "python -m lpfail sweep symptom drive")


def run_key(c: SymptomConfig, variant: str, seed: int) -> str:
    """A run's key: its configuration's hash, variant and seed (the search's configurations share one store)."""
    return f"{results.config_hash(c)}/{variant}_s{seed}"


def checks_path(c: SymptomConfig, directory=None) -> Path:
    """Where a configuration's checks live: beside its runs' parts (they decide which runs use the kernel)."""
    return STORE.path(directory) / f"checks-{results.config_hash(c)}.json"


def stored_checks(c: SymptomConfig, directory=None) -> dict | None:
    p = checks_path(c, directory)
    return json.loads(p.read_text()) if p.is_file() else None


def _shareable(c: SymptomConfig, base: SymptomConfig, chk: dict) -> bool:
    """Whether ``base``'s checks hold for ``c``: the same model shape (the checks compare the kernel with the
    reference and a continued run with an uninterrupted one; neither depends on lr or warm-up)."""
    shape = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "micro_batch", "data", "tokenizer",
             "optimizer")
    if any(getattr(c, k) != getattr(base, k) for k in shape):
        return False
    return not (chk.get("cuda") and any(VARIANTS[v].kernel and v not in chk.get("kernel", {}) for v in c.variants))


class SymptomGrid(GridBase):
    """The runs of one configuration of the search (variant × seed); their TrainConfigs depend on the checks
    (which variants may run on the Triton kernel), stored beside the parts."""

    store = STORE
    partial_ok = True

    def __init__(self, config: SymptomConfig, chk: dict | None = None, name: str = "symptom"):
        self.config, self.name, self._chk = config, name, chk

    def chk(self) -> dict:
        return self._chk or stored_checks(self.config) or {"cuda": False, "kernel": {}}

    def runs(self) -> list[Run]:
        c, chk = self.config, self.chk()
        return [Run(run_key(c, v, seed), STORE, train_config(c, v, seed, impl_for(c, v, chk), "", checkpoint_every=0),
                    group=v, seed=seed, checkpoint_every=c.checkpoint_every) for seed in c.seeds for v in c.variants]

    def summarize(self, run_dir, tc, key: str) -> dict:
        return summarize(run_dir, tc, key)

    def result(self, have: dict, parts: list[dict]) -> dict:
        by = {(r.group, r.seed): have[r.id] for r in self.runs() if r.id in have}
        return collect(self.config, by, self.chk())

    def checks(self, root: Path, log=print) -> dict:
        """The search's own checks (`checks`: kernel vs reference, stop and continue), stored beside the parts."""
        chk = checks(self.config, root, log=log)
        path = checks_path(self.config)
        path.parent.mkdir(parents=True, exist_ok=True)
        results.atomic_write(path, (json.dumps(chk, indent=1) + "\n").encode())
        return {**chk, "ok": bool(chk["continue"]["equal"]), "resume_equal": bool(chk["continue"]["equal"])}

    def quick(self):
        """The default configuration's A and C, seed 0: A − C in final loss (`final_loss`, the criterion's)."""
        from lpfail.sweep.quick import Quick

        seed = self.config.seeds[0]
        runs = [r for r in self.runs() if r.seed == seed and r.group in ("A", "C")]

        def headline(have: dict, s: int) -> float:
            a, c = (have.get(run_key(self.config, v, s)) for v in ("A", "C"))
            return float(a["final_loss"] - c["final_loss"]) if a and c else float("nan")

        return Quick(runs, headline, "final loss of A − C (the search's default configuration), one seed", seed,
                     tuple(self.config.seeds))


@register_grid("symptom", config=SymptomConfig, chapter="lab_01_symptom",
               description="the search for a small-scale BF16 flash-attention loss explosion (chapter 1)")
def symptom_grid(config: SymptomConfig | None = None) -> SymptomGrid:
    """Variants A, B, B′, C, D of one small GPT on identical batches and init, several seeds, judged by the
    pre-registered criterion (`python -m lpfail sweep symptom checks` first, on the GPU)."""
    return SymptomGrid(config or SymptomConfig())


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


class SymptomSweepGrid(GridBase):
    """The search's neighbouring configurations, each a `SymptomGrid` (checks shared from the default
    configuration where the model shape is the same), stored with a ``p{k}_`` prefix per point."""

    store = STORE
    partial_ok = True
    name = "symptom_sweep"

    def __init__(self, config: SymptomSweepConfig):
        self.config = config
        base = SymptomConfig()
        base_chk = stored_checks(base)
        self.points = []
        for c in sweep_configs(config):
            chk = stored_checks(c)
            if chk is None and base_chk is not None and _shareable(c, base, base_chk):
                chk = {**base_chk, "shared_from": results.config_hash(base)}
            self.points.append(SymptomGrid(c, chk, name="symptom_sweep"))

    def runs(self) -> list[Run]:
        return [r for g in self.points for r in g.runs()]

    def summarize(self, run_dir, tc, key: str) -> dict:
        return summarize(run_dir, tc, key)

    def result(self, have: dict, parts: list[dict]) -> dict:
        out: dict = {"points": np.array(self.config.points, dtype=str)}
        completes = []
        for k, g in enumerate(self.points):
            d = g.result(have, parts)
            out.update({f"p{k}_{key}": value for key, value in d.items()})
            completes.append(bool(d["complete"]))
        out["point_complete"] = np.array(completes)
        out["complete"] = all(completes)
        return out

    def checks(self, root: Path, log=print) -> dict:
        return self.points[0].checks(root, log=log)

    def quick(self):
        """The first neighbouring configuration's A and C, seed 0: A − C in final loss, as `SymptomGrid.quick`."""
        q = self.points[0].quick()
        q.label = f"final loss of A − C at the search's first neighbour ({self.config.points[0]}), one seed"
        return q


@register_grid("symptom_sweep", config=SymptomSweepConfig, chapter="lab_01_symptom",
               description="chapter 1's search around the default configuration (lr, warm-up)")
def symptom_sweep_grid(config: SymptomSweepConfig | None = None) -> SymptomSweepGrid:
    """Each point's result, stored with a ``p{k}_`` prefix per point (variants and seeds included), plus
    ``points``, ``point_complete`` and ``complete``."""
    return SymptomSweepGrid(config or SymptomSweepConfig())


def sweep_configs(sc: SymptomSweepConfig) -> list[SymptomConfig]:
    return [point_config(sc, k) for k in range(len(sc.points))]


def migrate(archive, gpu_results, directory=None, log=print) -> Path:
    """The run store from a runs archive of the driver's run directories (``symptom_runs.tgz``, as the GPU call
    brought it back) — one part holding every run's summary, with the provenance of the GPU call
    that made the runs (``gpu_results``: the folder of that call's own symptom.json / symptom_sweep.json) — and
    each configuration's checks, from those stored results. Writes nothing when a part of this archive exists.
    Returns the part's path."""
    import hashlib
    import tarfile
    import tempfile

    from lpfail.sweep import Part
    from lpfail.train import TrainConfig

    archive, gpu_results = Path(archive), Path(gpu_results)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    for old in part_files(STORE.path(directory)):
        if read_part(old).get("migrated_from", {}).get("sha256") == digest:
            log(f"symptom migrate: {old.name} already holds {archive.name}")
            return old
    gmeta = json.loads((gpu_results / "symptom.json").read_text())
    with tempfile.TemporaryDirectory(prefix="lpfail_migrate_") as tmp:
        with tarfile.open(archive) as tf:
            tf.extractall(tmp, filter="data")
        drive_rec = json.loads((Path(tmp) / "drive.json").read_text())
        part = Part(STORE, directory)
        part.meta.update(device=gmeta["device"], git=gmeta["git"], versions=gmeta["versions"],
                         created=gmeta["created"], host="the GPU call of 2026-11-29 (migrated)",
                         migrated_from={"archive": archive.name, "sha256": digest, "git": results.git_commit(),
                                        "runs_gpus": drive_rec.get("gpus"), "runs_ended": drive_rec.get("ended")})
        part.path = part.path.with_name(f"part-{gmeta['created'][:19].replace('-', '').replace(':', '')}-0.json.gz")
        for conf_path in sorted(Path(tmp).glob("*/symptom_config.json")):
            c = results.typed_config(results.get("symptom"), {k: (",".join(map(str, v)) if isinstance(v, list)
                                                                   else str(v))
                                                               for k, v in json.loads(conf_path.read_text()).items()
                                                               if k != "__type__"})
            for run_dir in sorted((conf_path.parent / "runs").iterdir()):
                v, seed = run_dir.name.rsplit("_s", 1)
                tc = TrainConfig.from_dict(json.loads((run_dir / "train_config.json").read_text()))
                part.runs[run_key(c, v, int(seed))] = summarize(run_dir, tc, run_key(c, v, int(seed)))
        part.meta["wall_s"] = float(drive_rec.get("wall_s") or 0.0)  # the GPU call's (Part.write would put ours)
        results.atomic_write(part.path, encode_part((json.dumps({**part.meta, "runs": part.runs}, allow_nan=True)
                                                     + "\n").encode(), part.path.name))
    _migrate_checks(gpu_results, directory)
    log(f"symptom migrate: {len(part.runs)} runs from {archive.name} into {part.path}")
    return part.path


def _migrate_checks(gpu_results: Path, directory=None):
    """Each configuration's checks (as its stored result holds them) into the store's checks files."""
    sym = results.load("symptom", directory=directory)
    pairs = [(SymptomConfig(), sym["checks"])]
    sw = results.load("symptom_sweep", directory=directory)
    pairs += [(c, sw[f"p{k}_checks"]) for k, c in enumerate(sweep_configs(SymptomSweepConfig()))]
    for c, text in pairs:
        path = checks_path(c, directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        results.atomic_write(path, (json.dumps(json.loads(text), indent=1) + "\n").encode())


def main(argv=None) -> int:
    """``migrate --archive TGZ --gpu-results DIR``; any other command is ``python -m lpfail sweep symptom CMD``
    (``... sweep symptom_sweep CMD`` for the neighbouring configurations)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["migrate"]:
        return symptom_grid.main(argv)
    ap = argparse.ArgumentParser(prog="python -m lpfail.experiments.symptom migrate")
    ap.add_argument("command", choices=("migrate",))
    ap.add_argument("--archive", required=True, help="the runs archive (symptom_runs.tgz)")
    ap.add_argument("--gpu-results", required=True, help="directory of the GPU call's symptom*.json")
    args = ap.parse_args(argv)
    migrate(args.archive, args.gpu_results)
    return 0


if __name__ == "__main__":  # pragma: no cover
    from lpfail.experiments.symptom import main as _main  # the registered module, not this __main__ copy

    sys.exit(_main())
