"""One training loop: the paper's recipe, small-scale runs, replays and branches, on 1 or N GPUs.

Used by chapter 1 ("Symptom": the small-scale failure), chapter 2 ("Substitution": replays of a recorded
batch order with one attention change at a time, branched from a shared checkpoint) and appendix A
("Reproducing on a GPU": GPT-2 small on OpenWebText, `python -m lpfail train`). References: Karpathy's
nanoGPT `train.py` (the shape, not the code) and Qiu & Yao, Sec. 3 and App. B (the setting: AdamW β (0.9,
0.95), wd 0, lr 1e-3, 2000 warm-up steps, cosine to 1e-5, clip 1.0, BF16 autocast, TF32 off, 524,288 tokens
per step).

    cfg = TrainConfig.preset("tiny", max_steps=50, attention="PAPER_BF16")   # reference(PAPER_BF16) everywhere
    res = train(cfg)                               # TrainResult: status, losses, grad norms, diagnostics
    res = train(cfg2, resume_from="out/a/ckpt_0000200.pt")      # branch: steps 0..199 shared with run a
    res = train(cfg, replay="out/a")               # the batches run a consumed, whatever cfg.data_seed says

What one step does (step s = the s-th optimizer update, 0-based)::

    rows  = BatchOrder.offsets(s)                  the global batch: batch_size windows of block_size + 1
    rank r takes rows[r·b : (r+1)·b], b = batch_size / world_size, in micro-batches of micro_batch rows;
    loss  = mean over micro-batches (and ranks) of the mean token cross-entropy, BF16 autocast
    g     = its gradient (DDP averages over ranks)   →  grad_norm = ‖g‖ before clipping  →  clip  →  update

so 1 GPU and N GPUs see the same global batch and differ only in the order of the gradient sums. Every
``diag_every`` steps, before the update: spectral norm of every weight matrix, per head ‖W_Q^h‖ and
‖W_Q^h W_K^hᵀ‖, and per layer the largest attention logit and the fraction of rows with tied maxima (from the
step's first micro-batch). A non-finite loss or gradient norm stops the run with ``status="nonfinite"``
(recorded, never raised): the model lets inf/NaN flow through every attention backend to the loss, and an
error raised in a step because of non-finite values (``nonfinite_error``) is recorded the same way, its
message in the log record (``"nonfinite": "error", "error": ...``); other errors still raise (and under
torchrun the error is recorded, then raised, so the job stops rather than hangs). Files in ``out_dir``
(nothing is written without one)::

    config.json              the config, the world size, the attention table
    log.jsonl                one record per step: step, loss, grad_norm, lr, tokens_per_s, time_s
    diag.jsonl               one record per diagnostic step
    batches.json, batches_rank{r}.i64   the start offsets each rank consumed, per step (int64 rows
                             [step, offsets...]): `load_batch_record` turns them back into the global order
    ckpt_{step:07d}.pt       model, optimizer, RNG, step (= data position), config; written atomically
    run.json                 status ("completed" | "nonfinite" | "running", or "interrupted" | "failed" when
                             Ctrl-C or an error ended it: the error's first line then in "error"), steps done,
                             wall time

`read_log(out_dir)` / `read_diag(out_dir)` return numpy arrays for the plotting code.

Where what is (a reader's order: the loop first, then what it calls): ``loop.py`` holds `train` and the loop
itself, `train_loop`, with its parts — the set-up (the batch shape, the data, the model and optimizer, a resume
from a checkpoint), the validation, the step's forward and backward, the stop on a non-finite value, the checkpoint;
``step.py`` what one step computes and the settings it runs under — deterministic numerics, the process group
(DDP), the optimizer and the lr schedule, the loss and the z-loss, the eager step and the same step captured as a
CUDA graph, the diagnostics and the held-out loss, which errors count as non-finite; ``config.py`` `TrainConfig`,
its presets, the attention specs and overrides it parses, configs from ``key=value`` strings and JSON files, what
a resume may change; ``batches.py`` the tokens a run reads, its validation windows, a step's rows, the batch
order (drawn or replayed) and the record of it; ``log.py`` the files a run writes as it goes and their readers,
checkpoints, and `TrainResult`. Every name is importable from ``lpfail.train`` itself, as it was when this was
one module.
"""
from __future__ import annotations

from lpfail.train.config import (AUTOCASTS, DEVICES, OPTIMIZERS, PRESETS, SCHEDULES, STRUCTURAL, TrainConfig,
                                 check_resume, config_from_sets, load_config, parse_override, parse_spec,
                                 window_config)
from lpfail.train.batches import (BatchRecord, batch_order, load_batch_record, load_tokens, split_validation,
                                  step_rows, validation_offsets)
from lpfail.train.log import (FINISHED, RunExists, RunFiles, TrainResult, atomic_write_text, check_out_dir,
                              checkpoint_path, load_checkpoint, read_diag, read_log, read_status, read_val,
                              save_checkpoint)
from lpfail.train.step import (GRAPH_WARMUP, CapturedStep, Dist, EagerStep, apply_hparams, build_optimizer,
                               capture_logits, cross_entropy, deterministic_numerics, device_lr, diagnostics,
                               is_finite, is_nonfinite_message, lr_factor, nonfinite_error, set_lr, validation_loss,
                               z_loss_term)
from lpfail.train.loop import train, train_loop

__all__ = ["AUTOCASTS", "DEVICES", "FINISHED", "GRAPH_WARMUP", "OPTIMIZERS", "PRESETS", "SCHEDULES", "STRUCTURAL",
           "BatchRecord", "RunExists", "RunFiles", "TrainConfig", "TrainResult", "check_out_dir", "checkpoint_path",
           "config_from_sets", "cross_entropy",
           "is_nonfinite_message", "load_batch_record", "load_checkpoint", "load_config", "load_tokens", "lr_factor",
           "parse_override", "parse_spec", "read_diag", "read_log", "read_status", "read_val", "save_checkpoint",
           "split_validation", "train", "validation_loss", "validation_offsets", "window_config", "z_loss_term"]
