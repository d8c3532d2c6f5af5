"""The loop: `train(cfg)` and its parts, in the order a run meets them — the set-up (`_setup`: the batch
shape, the data and batch order, the model and optimizer, a resume from a checkpoint, the run's files), then per
step the validation when due, the step (`_forward_backward`), its records, the stop on a non-finite value, the
update, the checkpoint when due (`_checkpoint_if_due`); `train_loop` is the loop itself. Part of `lpfail.train`."""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lpfail import data as lpdata
from lpfail.model import GPT, unavailable
from lpfail.train.batches import BatchRecord, batch_order, step_rows, load_tokens, split_validation, validation_offsets
from lpfail.train.config import TrainConfig, check_resume
from lpfail.train.log import (RunFiles, TrainResult, check_out_dir, checkpoint_path, load_checkpoint,
                              save_checkpoint)
from lpfail.train.step import (GRAPH_WARMUP, CapturedStep, Dist, EagerStep, apply_hparams, build_optimizer,
                               capture_logits, delta_record, deterministic_numerics, device_lr, diagnostics, is_finite,
                               lr_factor, nonfinite_error, set_lr, validation_loss)
from lpfail.train.watch import open_monitor


def train(cfg: TrainConfig, resume_from=None, replay=None, replay_from: int | None = None,
          progress: bool | None = None, hook=None, force: bool = False) -> TrainResult:
    """Train under `cfg`; returns a `TrainResult` (a non-finite loss ends the run, it does not raise; any other
    error, and Ctrl-C, is recorded in run.json as "failed" or "interrupted", then raised).

    resume_from  a checkpoint: continue from its step with its weights, optimizer state and RNG — bit-exactly
                 when cfg equals the checkpoint's config; with another attention / lr / clip / max_steps it is a
                 branch that shares steps 0..step−1 with the run that wrote it.
    replay       a run directory (its batches_rank*.i64), or a BatchOrder file: train on that recorded global
                 batch order instead of the one drawn from cfg.data_seed.
    replay_from  with `replay` (a run directory) and no `resume_from`: start at that step from the run's
                 checkpoint there (the paper's replay of the window before a failure).
    progress     a tqdm bar with ETA on rank 0 (default: when stderr is a terminal).
    hook         called as hook(step, model) after each update (tests inject faults with it).
    force        train into an out_dir that holds a finished run of another config, overwriting it (without
                 it that is refused: `check_out_dir`).

    Under `torchrun` (WORLD_SIZE > 1) each process calls train(); the process group is set up from the
    environment (NCCL on CUDA, gloo on the CPU) and rank 0 writes the logs and checkpoints.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train takes a TrainConfig (got {type(cfg).__name__})")
    if replay_from is not None:
        if replay is None:
            raise ValueError("replay_from needs replay (the run directory whose batches and checkpoint to use)")
        if resume_from is None:
            resume_from = checkpoint_path(replay, replay_from)
            if not Path(resume_from).is_file():
                have = sorted(p.name for p in Path(replay).glob("ckpt_*.pt"))
                raise FileNotFoundError(f"replay_from={replay_from}: no checkpoint {resume_from.name} in {replay} "
                                        f"(checkpoints there: {have or 'none'})")
    check_out_dir(cfg, force)
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("TrainConfig.device is 'cuda' but no CUDA GPU is available")
    _check_attention(cfg, "cuda" if use_cuda else "cpu")
    dist = Dist.from_env(use_cuda)
    try:
        device = torch.device("cuda", dist.local_rank) if use_cuda else torch.device("cpu")
        with deterministic_numerics(cfg, device):
            return train_loop(cfg, dist, device, resume_from, replay, replay_from, progress, hook)
    finally:
        if dist.created:
            import torch.distributed as tdist
            tdist.destroy_process_group()


def _check_attention(cfg: TrainConfig, device: str):
    """Raise ValueError, before anything is trained or written, where an attention of the config's table cannot
    run on `device` here (`lpfail.model.unavailable`)."""
    for _layers, _heads, spec in cfg.attention_table():
        why = unavailable(spec, device)
        if why is not None:
            raise ValueError(f"attention {spec} cannot run here: {why}. Train on a CUDA machine with the kernels, "
                             f"or use {str(spec)[:-1]}, fallback=reference) for the reference under the same "
                             "policy")


def train_loop(cfg, dist: Dist, device, resume_from, replay, replay_from, progress, hook) -> TrainResult:
    """The loop (`train`'s `replay_from` has become `resume_from` by now): set up, then per step the validation
    when due, the step, its records, the stop on a non-finite value, the update, the checkpoint when due; at
    the end the last validation, and the status."""
    run = _setup(cfg, dist, device, resume_from, replay, progress)
    result, optimizer = run.result, run.optimizer
    mon = open_monitor(cfg, run.raw, run.files.out, run.start, dist.world, run.use_graph)
    unwatched = mon.paused if mon is not None else contextlib.nullcontext  # validation forwards are not seen
    optimizer.zero_grad(set_to_none=True)
    t_prev = time.perf_counter()
    side = torch.cuda.Stream(device) if run.use_graph else None  # warm-up and capture off the default stream
    stream_ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
    stream_ctx.__enter__()
    try:
        for step in range(run.start, cfg.max_steps):
            if step == 0 or (cfg.val_every and step % cfg.val_every == 0):
                with unwatched():
                    _validate(run, step)
                t_prev = time.perf_counter()  # the evaluation is not part of the step's time
            factor = lr_factor(cfg, step)
            for g in optimizer.param_groups:
                set_lr(g, g["base_lr"] * factor)
            offsets = run.order.offsets(step)[run.rows]
            if run.record is not None:
                run.record.write(step, offsets)
            diag_now = bool(cfg.diag_every) and step % cfg.diag_every == 0
            dsig = _delta_if_due(run, step, offsets, unwatched)
            _capture_if_due(run, step)
            try:
                loss_v, gn_v, drec_pre, cap_rec = _forward_backward(run, offsets, diag_now and run.lead)
            except (ValueError, RuntimeError) as e:
                reason = nonfinite_error(e)
                if reason is None:
                    raise  # bad config, shapes, a backend that cannot run: not ours to swallow
                _stop_on_error(run, step, factor, reason, time.perf_counter() - t_prev)
                if dist.world > 1:
                    raise  # the other ranks may wait in this step's all-reduce: torchrun tears the job down
                break
            now = time.perf_counter()
            dt, t_prev = now - t_prev, now
            rec = {"step": step, "loss": loss_v, "grad_norm": gn_v, "lr": cfg.lr * factor,
                   "tokens_per_s": cfg.tokens_per_step / dt if dt > 0 else None, "time_s": dt}
            if diag_now and run.lead:
                drec = {"step": step, **(drec_pre if drec_pre is not None else diagnostics(run.raw, cap_rec)),
                        **(dsig or {})}
                result.diag.append(drec)
                run.files.write("diag", drec)
            if not (is_finite(loss_v) and is_finite(gn_v)):
                rec["nonfinite"] = "loss" if not is_finite(loss_v) else "grad_norm"
                _stop_nonfinite(run, step, rec)
                break
            if run.captured is None:  # the captured step has already updated the weights
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            result.steps = step + 1
            if hook is not None:
                hook(step, run.raw)
            if mon is not None:
                mon.step(loss=loss_v)
            if step % cfg.log_every == 0 or step == cfg.max_steps - 1:
                result.log.append(rec)
                run.files.write("log", rec)
            _show_progress(run.bar, loss_v, gn_v, rec)
            _checkpoint_if_due(run, step + 1)
        if result.status == "completed":
            with unwatched():
                _validate(run, result.steps)
    except BaseException as e:
        _stop_on_exception(run, e)
        raise
    finally:
        if mon is not None:
            mon.detach()
        stream_ctx.__exit__(None, None, None)
        if side is not None:
            torch.cuda.current_stream(device).wait_stream(side)
        run.close()
    result.wall_s = time.perf_counter() - run.t_start
    run.files.status(result.status, result.steps, result.nonfinite_step, result.wall_s)
    return result


# -- the set-up ----------------------------------------------------------------------------------------------
@dataclass
class _Run:
    """What the loop's parts share: made once by `_setup`; `captured` and `saved_ckpts` change as it runs."""

    cfg: TrainConfig
    dist: Dist
    device: torch.device
    t_start: float  # time.perf_counter() when the run began (the status' wall time)
    start: int  # the first step (a resumed run's checkpoint step)
    rows: slice  # this rank's rows of the global batch
    micro: int  # rows per forward pass
    tokens: np.ndarray  # the training tokens
    val_tokens: np.ndarray | None  # the held-out tokens (val_fraction > 0)
    val_offsets: np.ndarray | None  # the validation windows' starts in val_tokens
    order: lpdata.BatchOrder
    model: torch.nn.Module  # `raw`, or its DDP wrapper
    raw: GPT
    optimizer: torch.optim.Optimizer
    amp: torch.autocast
    use_graph: bool  # steps are captured as a CUDA graph after GRAPH_WARMUP eager ones
    eager: EagerStep
    files: RunFiles
    record: BatchRecord | None  # this rank's batch record (with an out_dir)
    result: TrainResult
    bar: object | None  # the tqdm progress bar (rank 0)
    saved_ckpts: list[Path]  # the checkpoints in out_dir, oldest first (rank 0)
    captured: CapturedStep | None = None

    @property
    def lead(self) -> bool:
        return self.dist.rank == 0

    def close(self):
        if self.bar is not None:
            self.bar.close()
        self.files.close()
        if self.record is not None:
            self.record.close()


def _setup(cfg: TrainConfig, dist: Dist, device, resume_from, replay, progress) -> _Run:
    """Everything the loop reads: the batch shape, the tokens and the batch order, the model and optimizer (from
    the checkpoint when resuming), the run's files and the result so far (a resumed run's earlier records),
    autocast, whether steps are captured, the progress bar."""
    t_start = time.perf_counter()
    world, rank = dist.world, dist.rank
    local_rows, micro, n_micro = _batch_shape(cfg, world)
    tokens, val_tokens, data_desc, vocab = _load_data(cfg)
    order, source = batch_order(cfg, replay, len(tokens))
    model, optimizer = _build_model(cfg, vocab, device)
    start, parent_log = 0, None
    if resume_from is not None:
        start, parent_log = _resume(cfg, resume_from, model, optimizer, device, dist)
    raw = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    params = [p for p in raw.parameters()]
    rows = slice(rank * local_rows, (rank + 1) * local_rows)
    header = {"config": cfg.to_dict(), "world_size": world, "vocab_size": vocab, "data": data_desc,
              "batch_order": source, "resumed_from": str(resume_from) if resume_from else None,
              "start_step": start, "attention": str(raw.attention_specs()), "parameters": raw.num_params()}
    files, (prefix_log, prefix_diag, prefix_val) = RunFiles.open(cfg, dist, start, parent_log, header)
    record = None
    if files.out is not None:
        record = BatchRecord(files.out, rank, world, cfg, len(tokens), source)
        record.open(start, order, rows)
    result = TrainResult("completed", start, cfg, log=list(prefix_log), diag=list(prefix_diag),
                         val=list(prefix_val), world_size=world, out_dir=str(files.out or ""))
    # a captured graph must not reuse autocast's cache of cast weights (same values either way)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast == "bf16",
                         cache_enabled=not cfg.cuda_graph)
    use_graph = (cfg.cuda_graph and device.type == "cuda" and world == 1
                 and os.environ.get("LPFAIL_NO_CAPTURE", "") != "1")
    if cfg.cuda_graph and world > 1:
        raise ValueError("TrainConfig.cuda_graph runs one process only (DDP's all-reduce is not captured)")
    show = rank == 0 and (progress if progress is not None else sys.stderr.isatty())
    bar = None
    if show:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    saved_ckpts = sorted(files.out.glob("ckpt_*.pt")) if (files.out is not None and rank == 0) else []
    val_offsets = validation_offsets(len(val_tokens), cfg) if val_tokens is not None else None
    eager = EagerStep(model, raw, params, cfg, n_micro, micro, dist, device, amp)
    return _Run(cfg, dist, device, t_start, start, rows, micro, tokens, val_tokens, val_offsets, order, model, raw,
                optimizer, amp, use_graph, eager, files, record, result, bar, saved_ckpts)


def _batch_shape(cfg: TrainConfig, world: int) -> tuple[int, int, int]:
    """(rows per rank, rows per forward pass, micro-batches per step) of the global batch over `world` ranks."""
    if cfg.batch_size % world:
        raise ValueError(f"TrainConfig.batch_size ({cfg.batch_size}) must be divisible by the number of "
                         f"processes ({world}): each rank takes an equal slice of the global batch")
    local_rows = cfg.batch_size // world
    micro = cfg.micro_batch or local_rows
    if local_rows % micro:
        raise ValueError(f"TrainConfig.micro_batch ({micro}) must divide the rows per rank (batch_size / world "
                         f"size = {local_rows})")
    return local_rows, micro, local_rows // micro


def _load_data(cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray | None, str, int]:
    """(training tokens, held-out tokens or None, a description of the data, the model's vocabulary size)."""
    tokens, data_desc, n_vocab = load_tokens(cfg)
    tokens, val_tokens = split_validation(tokens, cfg)  # training never reads val_tokens
    vocab = cfg.vocab_size or -(-n_vocab // 64) * 64
    if vocab < n_vocab:
        raise ValueError(f"TrainConfig.vocab_size ({vocab}) is smaller than the tokenizer's {n_vocab} tokens")
    if len(tokens) < cfg.block_size + 1:
        raise ValueError(f"the data has {len(tokens)} tokens, fewer than block_size + 1")
    return tokens, val_tokens, data_desc, vocab


def _build_model(cfg: TrainConfig, vocab: int, device):
    """(the model, its optimizer): weights from ``cfg.init_seed``, each head's attention from the config's table."""
    torch.manual_seed(cfg.init_seed)  # weights drawn on the CPU: the same on every device and rank
    model = GPT(cfg.gpt_config(vocab))
    for layers, heads, spec in cfg.attention_table():
        model.set_attention(spec, layers=layers, heads=heads)
    model.to(device)
    optimizer = build_optimizer(cfg, model)
    return model, optimizer


def _resume(cfg: TrainConfig, resume_from, model, optimizer, device, dist: Dist) -> tuple[int, str | None]:
    """Load the checkpoint `resume_from` into `model` and `optimizer` (the config's hyper-parameters on top) and
    restore the RNG states: (its step, the directory of the run that wrote it, or None)."""
    ck = load_checkpoint(resume_from)
    saved = TrainConfig.from_dict(ck["config"])  # validates it too
    check_resume(cfg, saved.to_dict(), resume_from)
    if ck["step"] > cfg.max_steps:
        raise ValueError(f"the checkpoint {resume_from} is at step {ck['step']}, beyond max_steps "
                         f"({cfg.max_steps})")
    model.load_state_dict(ck["model"])
    optimizer.load_state_dict(ck["optimizer"])
    if any(isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups):
        device_lr(optimizer)  # the checkpoint's lr tensors were loaded onto the CPU
    apply_hparams(cfg, optimizer)
    torch.set_rng_state(ck["rng_cpu"])
    if device.type == "cuda" and ck["rng_cuda"]:
        torch.cuda.set_rng_state(ck["rng_cuda"][min(dist.local_rank, len(ck["rng_cuda"]) - 1)], device)
    start = int(ck["step"])
    parent_log = ck.get("out_dir") or None
    del ck
    return start, parent_log


# -- the parts of a step ---------------------------------------------------------------------------------------
def _validate(run: _Run, done: int):
    """Validation loss after `done` updates (rank 0; recorded once per step count)."""
    if run.val_offsets is None or not run.lead or any(r["step"] == done for r in run.result.val):
        return
    v = validation_loss(run.raw, run.val_tokens, run.val_offsets, run.cfg, run.micro, run.device, run.amp)
    vrec = {"step": done, "val_loss": v if is_finite(v) else None}
    run.result.val.append(vrec)
    run.files.write("val", vrec)


def _capture_if_due(run: _Run, step: int):
    """Capture the step as a CUDA graph once this process has run GRAPH_WARMUP eager steps (when it captures)."""
    try:
        if run.captured is None and run.use_graph and step - run.start >= GRAPH_WARMUP:
            run.captured = CapturedStep(run.model, run.optimizer, run.eager.params, run.cfg, run.eager.n_micro,
                                        run.micro, run.device, run.amp)
    except RuntimeError as e:
        raise RuntimeError(f"capturing the training step as a CUDA graph failed ({e}); "
                           "LPFAIL_NO_CAPTURE=1 runs the same arithmetic uncaptured") from e


def _delta_if_due(run: _Run, step: int, offsets: np.ndarray, unwatched) -> dict | None:
    """The δ signature of the step's first `diag_rows` sequences (`delta_record`), every `delta_every` steps on
    the lead rank, before the step changes the weights, unseen by a monitor (`unwatched`); None when not due."""
    cfg = run.cfg
    if not (cfg.delta_every and run.lead and step % cfg.delta_every == 0):
        return None
    x, y = step_rows(run.tokens, offsets[:min(cfg.diag_rows, run.micro)], cfg.block_size)
    with unwatched():
        return delta_record(run.raw, x.to(run.device), y.to(run.device), cfg, step, run.amp)


def _forward_backward(run: _Run, offsets: np.ndarray, diag: bool):
    """The step on this rank's rows `offsets`: (loss, gradient norm before clipping, the diagnostics taken
    before a captured replay or None, the logit capture of an eager step's first micro-batch or None; `diag`:
    whether to take them). The eager step leaves the update to the loop; the captured replay has done it."""
    captured, raw, cfg = run.captured, run.raw, run.cfg
    if captured is None:
        loss_v, gn_v, cap_rec = run.eager.run(run.tokens, offsets, capture=diag)
        return loss_v, gn_v, None, cap_rec
    drec_pre = None
    if diag:  # before the replay, which updates the weights
        x0, _ = step_rows(run.tokens, offsets[:run.micro], cfg.block_size)
        drec_pre = diagnostics(raw, capture_logits(raw, x0.to(run.device), cfg, run.amp))
    loss_v, gn_v = captured.run(run.tokens, offsets)
    return loss_v, gn_v, drec_pre, None


def _stop_nonfinite(run: _Run, step: int, rec: dict):
    """End the run at `step` as non-finite, with its log record `rec`."""
    run.result.log.append(rec)
    run.files.write("log", rec)
    run.result.status, run.result.nonfinite_step = "nonfinite", step


def _stop_on_error(run: _Run, step: int, factor: float, reason: str, dt: float):
    """The safety net: something in the step refused non-finite values (the model itself lets NaN through to the
    loss). Same record as a non-finite loss, with the message `reason`. Under torchrun the caller re-raises."""
    rec = {"step": step, "loss": math.nan, "grad_norm": math.nan, "lr": run.cfg.lr * factor,
           "tokens_per_s": None, "time_s": dt, "nonfinite": "error", "error": reason}
    _stop_nonfinite(run, step, rec)
    if run.dist.world > 1:
        # the other ranks may wait in this step's gradient all-reduce: stopping here alone would hang the job, so
        # record what we can (the caller raises and torchrun tears it down)
        run.files.status(run.result.status, run.result.steps, step, time.perf_counter() - run.t_start)


def _stop_on_exception(run: _Run, e: BaseException):
    """Record how the run ended when `e` raised out of the loop (the caller re-raises it): "interrupted" (Ctrl-C,
    or an exit requested) or "failed" with the error's first line, each with the updates done. A non-finite stop
    already recorded (under torchrun, before its error is raised) is left as it is."""
    if run.result.status == "nonfinite":
        return
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        status, error = "interrupted", None
    else:
        status, error = "failed", f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}".rstrip(": ")
    run.files.status(status, run.result.steps, None, time.perf_counter() - run.t_start, error)


def _show_progress(bar, loss_v: float, gn_v: float, rec: dict):
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss_v:.4f}", gnorm=f"{gn_v:.3g}", tok_s=f"{rec['tokens_per_s'] or 0:.3g}",
                        refresh=False)


def _checkpoint_if_due(run: _Run, done: int):
    """After `done` updates: a checkpoint every ``checkpoint_every`` and at the end (rank 0; the newest
    ``keep_checkpoints`` kept), and the status; every rank waits for it."""
    cfg = run.cfg
    if cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.max_steps):
        if run.lead:
            out = run.files.out
            path = save_checkpoint(checkpoint_path(out, done), run.raw, run.optimizer, done, cfg, run.dist.world,
                                   {"out_dir": str(out)})
            run.saved_ckpts = [p for p in run.saved_ckpts if p != path] + [path]
            if cfg.keep_checkpoints:
                for old in run.saved_ckpts[:-cfg.keep_checkpoints]:
                    old.unlink(missing_ok=True)
                run.saved_ckpts = run.saved_ckpts[-cfg.keep_checkpoints:]
            run.files.status("running", done, None, time.perf_counter() - run.t_start)
        run.dist.barrier()
