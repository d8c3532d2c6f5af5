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
error raised in a step because of non-finite values (``_nonfinite_error``) is recorded the same way, its
message in the log record (``"nonfinite": "error", "error": ...``); other errors still raise (and under
torchrun the error is recorded, then raised, so the job stops rather than hangs). Files in ``out_dir``
(nothing is written without one)::

    config.json              the config, the world size, the attention table
    log.jsonl                one record per step: step, loss, grad_norm, lr, tokens_per_s, time_s
    diag.jsonl               one record per diagnostic step
    batches.json, batches_rank{r}.i64   the start offsets each rank consumed, per step (int64 rows
                             [step, offsets...]): `load_batch_record` turns them back into the global order
    ckpt_{step:07d}.pt       model, optimizer, RNG, step (= data position), config; written atomically
    run.json                 status ("completed" | "nonfinite" | "running"), steps done, wall time

`read_log(out_dir)` / `read_diag(out_dir)` return numpy arrays for the plotting code.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lpfail import data as lpdata
from lpfail import results
from lpfail.attention import NonFiniteInputError
from lpfail.model import BACKENDS, GPT, AttentionSpec, GPTConfig, head_query_norms, logit_capture, \
    weight_spectral_norms
from lpfail.precision import Precision

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("constant", "cosine")
AUTOCASTS = ("bf16", "none")
DEVICES = ("auto", "cpu", "cuda")


# -- configuration ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainConfig:
    """Everything one run depends on. Defaults: a small byte-level model on tiny Shakespeare; `preset()` gives
    the paper's GPT-2 small setting and the test model."""

    # model
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    block_size: int = 256  # context length T
    vocab_size: int = 0  # 0: the tokenizer's vocabulary padded to a multiple of 64 (bytes 256, GPT-2 50304)
    # data
    data: str = "tinyshakespeare"  # an embedded corpus, "openwebtext" (data_dir/train.bin) or a .bin path
    data_dir: str = "data/openwebtext"  # where openwebtext_bins() wrote train.bin / val.bin
    tokenizer: str = "bytes"  # "bytes" or "gpt2" (for the embedded corpus; .bin files are GPT-2 ids)
    # batch: tokens per step = batch_size · block_size, whatever the number of GPUs
    batch_size: int = 32  # sequences per optimizer step, all ranks together (the global batch)
    micro_batch: int = 0  # sequences per forward pass on one rank; 0 = batch_size / world_size
    # optimizer
    optimizer: str = "adamw"  # "adamw" or "muon" (Muon on hidden matrices, AdamW on the rest)
    lr: float = 1e-3  # peak lr of AdamW (of the AdamW half under Muon)
    min_lr: float = 1e-5  # cosine floor (the paper: 1e-5); Muon's floor is scaled by muon_lr / lr
    warmup: int = 100  # linear warm-up steps (the paper: 2000)
    schedule: str = "cosine"  # "constant" after warm-up, or "cosine" down to min_lr
    decay_steps: int = 0  # the step at which the cosine reaches min_lr; 0 = max_steps (the paper: 600k)
    beta1: float = 0.9
    beta2: float = 0.95  # the paper's (and GPT-3's) β2; 0.999 is less stable at this scale
    weight_decay: float = 0.0  # the paper uses none; applied to 2-D weights only
    eps: float = 1e-8
    grad_clip: float = 1.0  # global norm; 0 = no clipping (the norm is still logged)
    muon_lr: float = 0.02  # Muon's lr (its updates have unit spectral scale, hence the larger value)
    muon_momentum: float = 0.95
    ns_steps: int = 5  # Newton–Schulz iterations
    # precision
    autocast: str = "bf16"  # "bf16" (the paper) or "none" (FP32 everywhere); TF32 is always off
    attention: str = "sdpa"  # every head: "sdpa", "naive", "reference(POLICY)", "triton(POLICY)", or a policy
    #                          string / preset name alone, meaning the reference ("PAPER_BF16")
    overrides: tuple[str, ...] = ()  # "LAYERS[/HEADS]:SPEC", e.g. "1:sdpa", "1/0,6,7:reference(FP32)", "0-2:FP32"
    deterministic: bool = True  # torch.use_deterministic_algorithms + CUBLAS_WORKSPACE_CONFIG
    loss_impl: str = "torch"  # "torch": F.cross_entropy in FP32; "written": logsumexp − target logit (cross_entropy).
    #                           Both repeat bit for bit under deterministic mode on the H200; "torch" is 1.1× faster
    #                           (results/train_speed.json)
    # seeds
    init_seed: int = 0  # weights (drawn on the CPU, so identical on any device)
    data_seed: int = 0  # batch order (BatchOrder); ignored when a recorded order is replayed
    # run
    max_steps: int = 1000
    log_every: int = 1  # write a log.jsonl record every this many steps (1: every step)
    diag_every: int = 100  # diagnostics every this many steps; 0 = never
    diag_rows: int = 4  # sequences of the first micro-batch the logit statistics look at
    checkpoint_every: int = 0  # 0 = never (a final checkpoint is still written when > 0)
    keep_checkpoints: int = 0  # keep only the newest this many (0 = all: branching needs old ones)
    out_dir: str = ""  # "" = keep everything in memory
    device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = {"int": int, "float": float, "str": str, "bool": bool}.get(f.type)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))
                continue
            if kind is int and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise ValueError(f"TrainConfig.{f.name} must be an int (got {value!r})")
            if kind is not None and kind is not int and not isinstance(value, kind):
                raise ValueError(f"TrainConfig.{f.name} must be a {kind.__name__} (got {value!r})")
        if isinstance(self.overrides, (str, list)):
            object.__setattr__(self, "overrides", _split_overrides(self.overrides))
        for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "max_steps", "ns_steps",
                     "log_every", "diag_rows"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} must be positive (got {getattr(self, name)})")
        for name in ("vocab_size", "micro_batch", "warmup", "decay_steps", "diag_every", "checkpoint_every",
                     "keep_checkpoints", "init_seed", "data_seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0 (got {getattr(self, name)})")
        if self.n_embd % self.n_head:
            raise ValueError(f"TrainConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("autocast", self.autocast, AUTOCASTS)
        _choice("loss_impl", self.loss_impl, ("written", "torch"))
        _choice("device", self.device, DEVICES)
        _choice("tokenizer", self.tokenizer, ("bytes", "gpt2"))
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"TrainConfig.lr must be positive (got {self.lr})")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"TrainConfig.min_lr ({self.min_lr}) must lie in [0, lr = {self.lr}]")
        if self.optimizer == "muon" and not self.muon_lr > 0:
            raise ValueError(f"TrainConfig.muon_lr must be positive (got {self.muon_lr})")
        if self.warmup > self.max_steps:
            raise ValueError(f"TrainConfig.warmup ({self.warmup}) exceeds max_steps ({self.max_steps})")
        if self.schedule == "cosine" and self.decay_steps and self.decay_steps <= self.warmup:
            raise ValueError(f"TrainConfig.decay_steps ({self.decay_steps}) must exceed warmup ({self.warmup})")
        for name in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must lie in [0, 1) (got {getattr(self, name)})")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.eps <= 0:
            bad = "grad_clip" if self.grad_clip < 0 else "weight_decay" if self.weight_decay < 0 else "eps"
            raise ValueError(f"TrainConfig.{bad} is out of range (got {getattr(self, bad)})")
        if self.micro_batch and self.batch_size % self.micro_batch:
            raise ValueError(f"TrainConfig.micro_batch ({self.micro_batch}) must divide batch_size "
                             f"({self.batch_size})")
        if self.checkpoint_every and not self.out_dir:
            raise ValueError("TrainConfig.checkpoint_every needs an out_dir to write checkpoints into")
        self.attention_table()  # parse the specs now: unknown backends and policies fail here

    # -- derived -------------------------------------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size

    def attention_table(self) -> list[tuple[list[int] | None, list[int] | None, AttentionSpec]]:
        """[(layers, heads, spec)] in the order `set_attention` applies them (None = all)."""
        try:
            table = [(None, None, parse_spec(self.attention))]
        except ValueError as e:
            raise ValueError(f"TrainConfig.attention: {e}") from None
        for text in self.overrides:
            try:
                table.append(parse_override(text, self.n_layer, self.n_head))
            except ValueError as e:
                raise ValueError(f"TrainConfig.overrides: {text!r}: {e}") from None
        return table

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(block_size=self.block_size, vocab_size=vocab_size, n_layer=self.n_layer,
                         n_head=self.n_head, n_embd=self.n_embd)

    @classmethod
    def preset(cls, name: str, **overrides) -> "TrainConfig":
        """A named setting (`PRESETS`) with field overrides."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {sorted(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {sorted(unknown)}")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["overrides"] = list(self.overrides)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        if "overrides" in d:
            d["overrides"] = tuple(d["overrides"])
        return cls(**d)


#: Named settings. "gpt2-small" is the paper's run (App. B): 524,288 tokens per step = 512 sequences of 1024,
#: by gradient accumulation in micro-batches of 16 per GPU.
PRESETS: dict[str, dict] = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, micro_batch=4, lr=3e-3,
                 min_lr=3e-4, warmup=2, max_steps=20, diag_every=5, device="cpu", autocast="none"),
    "probe": dict(n_layer=4, n_head=4, n_embd=256, block_size=512, batch_size=64, lr=1.5e-2, min_lr=1.5e-2,
                  warmup=100, schedule="constant", max_steps=3000, diag_every=50),
    "gpt2-small": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, data="openwebtext",
                       tokenizer="gpt2", batch_size=512, micro_batch=16, lr=1e-3, min_lr=1e-5, warmup=2000,
                       schedule="cosine", decay_steps=600_000, max_steps=600_000, diag_every=100,
                       checkpoint_every=1000, out_dir="out/gpt2-small"),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50304,
                        data="openwebtext", tokenizer="gpt2", batch_size=512, micro_batch=8, lr=3e-4,
                        min_lr=3e-5, warmup=2000, schedule="cosine", decay_steps=600_000, max_steps=600_000,
                        diag_every=100, checkpoint_every=1000, out_dir="out/gpt2-medium"),
}


def _choice(name, value, options):
    if value not in options:
        raise ValueError(f"TrainConfig.{name}: unknown value {value!r}; choose one of {list(options)}")


def parse_spec(text: str) -> AttentionSpec:
    """"sdpa", "naive", "reference(PAPER_BF16)", "triton(FA2_BF16, fallback=reference)", or a policy alone
    (a preset name or policy string: the reference under it)."""
    text = text.strip()
    head = text.split("(", 1)[0].strip()
    if head in BACKENDS:
        return AttentionSpec.parse(text)
    try:
        return AttentionSpec("reference", Precision.parse(text))
    except ValueError as e:
        raise ValueError(f"{text!r} is neither an attention backend {list(BACKENDS)} (optionally with a policy "
                         f"in parentheses) nor a precision policy ({e})") from None


def _index_list(text: str, n: int, what: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            ids = range(int(lo), int(hi) + 1) if sep else [int(part)]
        except ValueError:
            raise ValueError(f"cannot read {what} list {text!r}: use e.g. 1 or 0,6,7 or 0-3") from None
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"{what} {i} out of range 0..{n - 1}")
            out.append(i)
    return out


def parse_override(text: str, n_layer: int, n_head: int):
    """"LAYERS[/HEADS]:SPEC" → (layers, heads or None, spec), e.g. "1/0,6,7:reference(FP32)"."""
    where, sep, spec = text.partition(":")
    if not sep:
        raise ValueError("expected LAYERS[/HEADS]:SPEC, e.g. 1:sdpa or 1/0,6,7:reference(FP32)")
    layers, slash, heads = where.partition("/")
    return (_index_list(layers, n_layer, "layer"), _index_list(heads, n_head, "head") if slash else None,
            parse_spec(spec))


def _split_overrides(value) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(";") if s.strip())
    return tuple(value)


def config_from_sets(preset: str | None, sets: dict[str, str], base: TrainConfig | None = None) -> TrainConfig:
    """A TrainConfig from `base`, a preset or the defaults, and ``key=value`` strings converted by field type
    (``overrides`` takes ";"-separated entries)."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    changes = {}
    for key, text in sets.items():
        if key not in fields:
            raise ValueError(f"unknown TrainConfig field {key!r}; fields: {sorted(fields)}")
        kind = fields[key].type
        try:
            if kind == "bool":
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError("expected true or false")
                changes[key] = text.lower() in ("true", "1")
            elif kind == "int":
                changes[key] = int(text)
            elif kind == "float":
                changes[key] = float(text)
            elif kind == "str":
                changes[key] = text
            else:
                changes[key] = _split_overrides(text)
        except ValueError as e:
            raise ValueError(f"cannot set {key}={text!r} ({e})") from None
    if base is not None:
        if preset:
            raise ValueError("give either a preset or a base config, not both")
        return TrainConfig.from_dict({**base.to_dict(), **changes})
    return TrainConfig.preset(preset, **changes) if preset else TrainConfig(**changes)


def load_config(path) -> TrainConfig:
    """A TrainConfig from a JSON file: its fields, or a run's config.json (fields under "config")."""
    d = json.loads(Path(path).read_text())
    return TrainConfig.from_dict(d["config"] if "config" in d and isinstance(d["config"], dict) else d)


#: Fields a resumed (or branched) run must share with its checkpoint: they fix the weights' shapes, the
#: optimizer state's meaning, and which tokens a step reads.
STRUCTURAL = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "data", "tokenizer", "batch_size",
              "optimizer")


# -- data --------------------------------------------------------------------------------------------------
def load_tokens(cfg: TrainConfig) -> tuple[np.ndarray, str, int]:
    """(token ids, a description, the tokenizer's vocabulary size) for `cfg.data`."""
    if cfg.data in lpdata.CORPORA:
        tok = lpdata.get_tokenizer(cfg.tokenizer)
        return lpdata.tokens(cfg.data, tok), f"{cfg.data} ({cfg.tokenizer})", tok.n_vocab
    if cfg.data == "openwebtext":
        path = Path(cfg.data_dir) / "train.bin"
        if not path.is_file():
            raise FileNotFoundError(
                f"OpenWebText is not prepared: no {path}. Prepare it once, with network access (≈ 54 GB of "
                f"download, 17 GB of tokens): `python -m lpfail train --prepare-data --set data=openwebtext --set data_dir="
                f"{cfg.data_dir}` or lpfail.data.openwebtext_bins({str(cfg.data_dir)!r})")
        return lpdata.load_bin(path), f"openwebtext ({path})", 50257
    path = Path(cfg.data)
    if path.suffix == ".bin":
        return lpdata.load_bin(path), str(path), 50257
    raise ValueError(f"TrainConfig.data: unknown data {cfg.data!r}; use an embedded corpus "
                     f"{list(lpdata.CORPORA)}, 'openwebtext', or a path to a nanoGPT .bin token file")


def _rows(tokens, offsets, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.stack([np.asarray(tokens[o:o + T + 1], dtype=np.int64) for o in offsets])  # (b, T+1)
    xy = torch.from_numpy(rows)
    return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()  # (b, T) each


# -- the recorded batch order ----------------------------------------------------------------------------
class BatchRecord:
    """Writes, per rank, the start offsets that rank consumed at each step: int64 rows [step, offsets...]."""

    def __init__(self, out_dir: Path, rank: int, world: int, cfg: TrainConfig, n_tokens: int, source: str):
        self.path = out_dir / f"batches_rank{rank}.i64"
        self.width = 1 + cfg.batch_size // world
        self.meta = {"format": "lpfail.batches", "version": 1, "world_size": world, "batch_size": cfg.batch_size,
                     "rows_per_rank": cfg.batch_size // world, "block_size": cfg.block_size, "n_tokens": n_tokens,
                     "data": cfg.data, "tokenizer": cfg.tokenizer, "source": source}
        self.rank = rank
        self.f = None

    def open(self, start: int, order: lpdata.BatchOrder, local: slice):
        """Keep steps [0, start) (rewritten from `order` if the file does not already hold them)."""
        if self.rank == 0:
            _atomic_write_text(self.path.parent / "batches.json", json.dumps(self.meta, indent=1) + "\n")
        have = -1
        if self.path.is_file() and self.path.stat().st_size % (8 * self.width) == 0:
            old = np.fromfile(self.path, dtype=np.int64).reshape(-1, self.width)
            have = int(np.sum(old[:, 0] == np.arange(len(old)))) if len(old) else 0
        if have >= start:
            self.f = open(self.path, "r+b")
            self.f.truncate(start * 8 * self.width)
            self.f.seek(0, os.SEEK_END)
        else:
            self.f = open(self.path, "wb")
            for s in range(start):
                self.write(s, order.offsets(s)[local], flush=False)
            self.f.flush()

    def write(self, step: int, offsets: np.ndarray, flush: bool = True):
        self.f.write(np.concatenate([[step], offsets]).astype("<i8").tobytes())
        if flush:
            self.f.flush()

    def close(self):
        if self.f is not None:
            self.f.close()
            self.f = None


def load_batch_record(path) -> lpdata.BatchOrder:
    """The global batch order a run consumed, from its directory (or its batches.json), or a BatchOrder
    file (.npz / .json): the ranks' offsets side by side, for the steps every rank recorded."""
    path = Path(path)
    if path.suffix in (".npz",) or (path.suffix == ".json" and path.name != "batches.json"):
        return lpdata.BatchOrder.load(path)
    run_dir = path.parent if path.name == "batches.json" else path
    meta_path = run_dir / "batches.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no recorded batch order in {run_dir} (no batches.json): pass a run's out_dir "
                                "or a BatchOrder .npz/.json file")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != "lpfail.batches":
        raise ValueError(f"{meta_path} is not a batch record (format {meta.get('format')!r})")
    parts = []
    for r in range(meta["world_size"]):
        f = run_dir / f"batches_rank{r}.i64"
        arr = np.fromfile(f, dtype=np.int64)
        width = 1 + meta["rows_per_rank"]
        arr = arr[:len(arr) // width * width].reshape(-1, width)
        n = int(np.sum(arr[:, 0] == np.arange(len(arr))))  # steps recorded in order from 0
        parts.append(arr[:n, 1:])
    n = min(len(p) for p in parts)
    if n == 0:
        raise ValueError(f"the batch record in {run_dir} holds no complete step")
    offsets = np.concatenate([p[:n] for p in parts], axis=1)  # (n, batch_size), rank order = row order
    order = lpdata.BatchOrder.from_offsets(offsets, meta["block_size"], meta["n_tokens"])
    order.recorded_from = {k: meta[k] for k in ("data", "tokenizer", "n_tokens")}
    return order


# -- checkpoints and files ---------------------------------------------------------------------------------
def _atomic_write_text(path: Path, text: str):
    lpdata._atomic_write(Path(path), lambda f: f.write(text.encode()))


def save_checkpoint(path, model, optimizer, step: int, cfg: TrainConfig, world: int, extra: dict | None = None):
    """Model, optimizer, RNG states, step (the data position: the next step reads BatchOrder.offsets(step)),
    config — to a temporary file in the same folder, then renamed over `path`."""
    state = {"format": "lpfail.checkpoint", "version": 1, "step": int(step), "config": cfg.to_dict(),
             "world_size": world, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "rng_cpu": torch.get_rng_state(),
             "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
             **(extra or {})}
    lpdata._atomic_write(Path(path), lambda f: torch.save(state, f))
    return Path(path)


def load_checkpoint(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ck, dict) or ck.get("format") != "lpfail.checkpoint":
        raise ValueError(f"{path} is not an lpfail checkpoint")
    return ck


def checkpoint_path(out_dir, step: int) -> Path:
    return Path(out_dir) / f"ckpt_{step:07d}.pt"


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by a crash: what follows cannot be trusted
    return out


def read_log(out_dir) -> dict[str, np.ndarray]:
    """log.jsonl as arrays: step, loss, grad_norm, lr, tokens_per_s, time_s (float64; NaN where missing)."""
    return _log_arrays(_read_jsonl(Path(out_dir) / "log.jsonl"))


def _log_arrays(records: list[dict]) -> dict[str, np.ndarray]:
    keys = ("step", "loss", "grad_norm", "lr", "tokens_per_s", "time_s")
    out = {k: np.array([r.get(k, np.nan) if r.get(k) is not None else np.nan for r in records], dtype=np.float64)
           for k in keys}
    out["step"] = out["step"].astype(np.int64)
    return out


def read_diag(out_dir) -> dict:
    """diag.jsonl as arrays: step (n,), spectral {weight name: (n,)}, wq and wqk (n, layers, heads),
    max_logit and tied_frac (n, layers), max_logit_per_head and tied_frac_per_head (n, layers, heads)."""
    return _diag_arrays(_read_jsonl(Path(out_dir) / "diag.jsonl"))


def _diag_arrays(records: list[dict]) -> dict:
    if not records:
        return {"step": np.zeros(0, dtype=np.int64), "spectral": {}}
    out = {"step": np.array([r["step"] for r in records], dtype=np.int64),
           "spectral": {k: np.array([r["spectral"][k] for r in records]) for k in records[0]["spectral"]}}
    for k in ("wq", "wqk", "max_logit", "tied_frac", "max_logit_per_head", "tied_frac_per_head"):
        if k in records[0]:
            out[k] = np.array([r[k] for r in records], dtype=np.float64)
    return out


# -- results -----------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """What a run returns (on every rank): its status, the per-step log and the diagnostics, in memory."""

    status: str  # "completed" | "nonfinite"
    steps: int  # optimizer updates done (the next step would be this one)
    config: TrainConfig
    log: list[dict] = field(default_factory=list)
    diag: list[dict] = field(default_factory=list)
    nonfinite_step: int | None = None  # the step whose loss or gradient norm was not finite
    wall_s: float = 0.0
    world_size: int = 1
    out_dir: str = ""

    @property
    def losses(self) -> np.ndarray:
        return self.arrays()["loss"]

    @property
    def grad_norms(self) -> np.ndarray:
        return self.arrays()["grad_norm"]

    def arrays(self) -> dict[str, np.ndarray]:
        return _log_arrays(self.log)

    def diag_arrays(self) -> dict:
        return _diag_arrays(self.diag)

    def __repr__(self):
        last = f", last loss {self.log[-1]['loss']:.4f}" if self.log else ""
        nf = f" at step {self.nonfinite_step}" if self.nonfinite_step is not None else ""
        return f"<TrainResult {self.status}{nf}: {self.steps} steps{last}, {self.wall_s:.1f} s>"


# -- distributed set-up ------------------------------------------------------------------------------------
@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    created: bool = False  # whether train() initialized the process group (and so destroys it)

    @classmethod
    def from_env(cls, use_cuda: bool) -> "_Dist":
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if use_cuda:
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                device_id=torch.device("cuda", local) if use_cuda else None)
        return cls(rank, world, local, created=True)

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self):
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()


@contextlib.contextmanager
def _numerics(cfg: TrainConfig, device: torch.device):
    """Deterministic algorithms (restored afterwards) and no TF32 for FP32 matmuls."""
    was_det = torch.are_deterministic_algorithms_enabled()
    was_prec = torch.get_float32_matmul_precision()
    was_cudnn = torch.backends.cudnn.allow_tf32
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS' reproducible workspace
        torch.use_deterministic_algorithms(True)
    torch.set_float32_matmul_precision("highest")  # FP32 matmuls in FP32, not TF32 (the paper: TF32 off)
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_det)
        torch.set_float32_matmul_precision(was_prec)
        torch.backends.cudnn.allow_tf32 = was_cudnn


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Multiplier of the peak lr at `step`: linear warm-up to 1, then 1 or a cosine to min_lr / lr."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return 1.0
    floor = cfg.min_lr / cfg.lr
    end = cfg.decay_steps or cfg.max_steps
    progress = min(1.0, (step - cfg.warmup) / max(1, end - cfg.warmup))
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)


def _build_optimizer(cfg: TrainConfig, model: torch.nn.Module):
    if cfg.optimizer == "muon":
        from lpfail.optim import Muon, muon_param_groups

        groups = muon_param_groups(model, cfg.muon_lr, cfg.lr, cfg.weight_decay, cfg.muon_momentum,
                                   cfg.ns_steps, (cfg.beta1, cfg.beta2), cfg.eps)
    else:
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        groups = [dict(params=decay, weight_decay=cfg.weight_decay), dict(params=no_decay, weight_decay=0.0)]
        groups = [g for g in groups if g["params"]]
    for g in groups:
        g["base_lr"] = cfg.muon_lr if g.get("muon") else cfg.lr
    if cfg.optimizer == "muon":
        from lpfail.optim import Muon
        return Muon(groups)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def _apply_hparams(cfg: TrainConfig, optimizer):
    """The config's hyper-parameters in every group (after loading a checkpoint made under another config)."""
    for g in optimizer.param_groups:
        g["base_lr"] = cfg.muon_lr if g.get("muon") else cfg.lr
        if g.get("muon"):
            g.update(momentum=cfg.muon_momentum, ns_steps=cfg.ns_steps)
        else:
            g.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
        g["weight_decay"] = cfg.weight_decay if any(p.ndim >= 2 for p in g["params"]) else 0.0


def _check_resume(cfg: TrainConfig, saved: dict, path):
    for name in STRUCTURAL:
        if saved.get(name) != getattr(cfg, name):
            raise ValueError(f"cannot resume from {path}: TrainConfig.{name} is {getattr(cfg, name)!r} here but "
                             f"{saved.get(name)!r} in the checkpoint (a branch may change the attention, lr, "
                             f"schedule, clip, steps, but not {', '.join(STRUCTURAL)})")


def _diagnostics(model: GPT, cap) -> dict:
    hq = head_query_norms(model)
    rec = {"spectral": weight_spectral_norms(model), "wq": hq["wq"].tolist(), "wqk": hq["wqk"].tolist()}
    if cap is not None:
        st = cap.stats()
        rec.update(max_logit=st.max_logit.tolist(), tied_frac=st.tied_frac.tolist(),
                   max_logit_per_head=st.max_logit_per_head.tolist(),
                   tied_frac_per_head=st.tied_frac_per_head.tolist(), diag_rows=st.rows)
    return rec


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in FP32, as logsumexp − the target's logit (`loss_impl="written"`).
    Written out because PyTorch's documentation lists NLLLoss on CUDA among the operations that may raise
    under torch.use_deterministic_algorithms; on the H200 with torch 2.11, F.cross_entropy ran and repeated
    bit for bit there (results/train_speed.json), so it is the default and this is the fallback."""
    logits = logits.float()  # (b, T, vocab): the loss of a BF16 model is still taken in FP32
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (b, T)
    return (torch.logsumexp(logits, dim=-1) - picked).mean()


def _finite(x: float) -> bool:
    return math.isfinite(x)


_NONFINITE_MESSAGE = re.compile(r"non-?finite|returned nan values", re.IGNORECASE)


def is_nonfinite_message(text: str) -> bool:
    """Whether an error message reports non-finite values (the one test, also for the symptom search's
    reading of a crashed run's last error line)."""
    return bool(_NONFINITE_MESSAGE.search(text))


def _nonfinite_error(e: BaseException) -> str | None:
    """"Type: message" when `e` (or an exception it was raised from) reports non-finite values met in the step:
    lpfail.attention's `NonFiniteInputError`, or a ValueError / RuntimeError saying "non-finite" (torch.linalg,
    the kernels) or autograd's anomaly mode's "returned nan values"; else None (the error is re-raised)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NonFiniteInputError) or (isinstance(e, (ValueError, RuntimeError))
                                                   and is_nonfinite_message(str(e))):
            return f"{type(e).__name__}: {e}"
        e = e.__cause__
    return None


# -- the loop ----------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, resume_from=None, replay=None, replay_from: int | None = None,
          progress: bool | None = None, hook=None) -> TrainResult:
    """Train under `cfg`; returns a `TrainResult` (a non-finite loss ends the run, it does not raise).

    resume_from  a checkpoint: continue from its step with its weights, optimizer state and RNG — bit-exactly
                 when cfg equals the checkpoint's config; with another attention / lr / clip / max_steps it is a
                 branch that shares steps 0..step−1 with the run that wrote it.
    replay       a run directory (its batches_rank*.i64), or a BatchOrder file: train on that recorded global
                 batch order instead of the one drawn from cfg.data_seed.
    replay_from  with `replay` (a run directory) and no `resume_from`: start at that step from the run's
                 checkpoint there (the paper's replay of the window before a failure).
    progress     a tqdm bar with ETA on rank 0 (default: when stderr is a terminal).
    hook         called as hook(step, model) after each update (tests inject faults with it).

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
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("TrainConfig.device is 'cuda' but no CUDA GPU is available")
    dist = _Dist.from_env(use_cuda)
    try:
        device = torch.device("cuda", dist.local_rank) if use_cuda else torch.device("cpu")
        with _numerics(cfg, device):
            return _train(cfg, dist, device, resume_from, replay, replay_from, progress, hook)
    finally:
        if dist.created:
            import torch.distributed as tdist
            tdist.destroy_process_group()


def _train(cfg, dist: _Dist, device, resume_from, replay, replay_from, progress, hook) -> TrainResult:
    t_start = time.perf_counter()
    world, rank = dist.world, dist.rank
    if cfg.batch_size % world:
        raise ValueError(f"TrainConfig.batch_size ({cfg.batch_size}) must be divisible by the number of "
                         f"processes ({world}): each rank takes an equal slice of the global batch")
    local_rows = cfg.batch_size // world
    micro = cfg.micro_batch or local_rows
    if local_rows % micro:
        raise ValueError(f"TrainConfig.micro_batch ({micro}) must divide the rows per rank (batch_size / world "
                         f"size = {local_rows})")
    n_micro = local_rows // micro

    tokens, data_desc, n_vocab = load_tokens(cfg)
    vocab = cfg.vocab_size or -(-n_vocab // 64) * 64
    if vocab < n_vocab:
        raise ValueError(f"TrainConfig.vocab_size ({vocab}) is smaller than the tokenizer's {n_vocab} tokens")
    if len(tokens) < cfg.block_size + 1:
        raise ValueError(f"the data has {len(tokens)} tokens, fewer than block_size + 1")
    if replay is not None:
        order = load_batch_record(replay)
        rec = getattr(order, "recorded_from", None)
        if rec is not None and (rec["data"], rec["tokenizer"], rec["n_tokens"]) != (cfg.data, cfg.tokenizer,
                                                                                   len(tokens)):
            raise ValueError(f"the recorded order in {replay} was drawn from {rec}, not from data={cfg.data!r}, "
                             f"tokenizer={cfg.tokenizer!r} ({len(tokens)} tokens)")
        if order.batch_size != cfg.batch_size or order.block_size != cfg.block_size:
            raise ValueError(f"the recorded order has batch_size {order.batch_size}, block_size "
                             f"{order.block_size}; TrainConfig has {cfg.batch_size}, {cfg.block_size}")
        if order.n_steps < cfg.max_steps:
            raise ValueError(f"TrainConfig.max_steps ({cfg.max_steps}) exceeds the {order.n_steps} recorded steps "
                             f"of {replay}")
        source = f"replay of {replay}"
    else:
        order = lpdata.BatchOrder(len(tokens), cfg.block_size, cfg.batch_size, cfg.data_seed)
        source = f"seed {cfg.data_seed}"

    torch.manual_seed(cfg.init_seed)  # weights drawn on the CPU: the same on every device and rank
    model = GPT(cfg.gpt_config(vocab))
    for layers, heads, spec in cfg.attention_table():
        model.set_attention(spec, layers=layers, heads=heads)
    model.to(device)
    optimizer = _build_optimizer(cfg, model)
    start, parent_log = 0, None
    if resume_from is not None:
        ck = load_checkpoint(resume_from)
        saved = TrainConfig.from_dict(ck["config"])  # validates it too
        _check_resume(cfg, saved.to_dict(), resume_from)
        if ck["step"] > cfg.max_steps:
            raise ValueError(f"the checkpoint {resume_from} is at step {ck['step']}, beyond max_steps "
                             f"({cfg.max_steps})")
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        _apply_hparams(cfg, optimizer)
        torch.set_rng_state(ck["rng_cpu"])
        if device.type == "cuda" and ck["rng_cuda"]:
            torch.cuda.set_rng_state(ck["rng_cuda"][min(dist.local_rank, len(ck["rng_cuda"]) - 1)], device)
        start = int(ck["step"])
        parent_log = ck.get("out_dir") or None
        del ck
    raw = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    params = [p for p in raw.parameters()]

    # -- files -----------------------------------------------------------------------------------------
    out = Path(cfg.out_dir) if cfg.out_dir else None
    lead = rank == 0
    log_f = diag_f = record = None
    prefix_log, prefix_diag = [], []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        if lead:
            src = out if (out / "log.jsonl").is_file() else Path(parent_log) if parent_log else None
            if src is not None:
                prefix_log = [r for r in _read_jsonl(src / "log.jsonl") if r["step"] < start]
                prefix_diag = [r for r in _read_jsonl(src / "diag.jsonl") if r["step"] < start]
            _atomic_write_text(out / "config.json", json.dumps(
                {"config": cfg.to_dict(), "world_size": world, "vocab_size": vocab, "data": data_desc,
                 "batch_order": source, "resumed_from": str(resume_from) if resume_from else None,
                 "start_step": start, "attention": str(raw.attention_specs()),
                 "parameters": raw.num_params()}, indent=1) + "\n")
            _atomic_write_text(out / "log.jsonl", "".join(json.dumps(r) + "\n" for r in prefix_log))
            _atomic_write_text(out / "diag.jsonl", "".join(json.dumps(r) + "\n" for r in prefix_diag))
            log_f, diag_f = open(out / "log.jsonl", "a"), open(out / "diag.jsonl", "a")
            _write_status(out, "running", start, cfg, None, 0.0, world)
        record = BatchRecord(out, rank, world, cfg, len(tokens), source)
        record.open(start, order, slice(rank * local_rows, (rank + 1) * local_rows))

    result = TrainResult("completed", start, cfg, log=list(prefix_log), diag=list(prefix_diag), world_size=world,
                         out_dir=str(out or ""))
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast == "bf16")
    show = lead and (progress if progress is not None else sys.stderr.isatty())
    bar = None
    if show:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    saved_ckpts = sorted(out.glob("ckpt_*.pt")) if (out is not None and lead) else []
    optimizer.zero_grad(set_to_none=True)
    t_prev = time.perf_counter()
    try:
        for step in range(start, cfg.max_steps):
            factor = lr_factor(cfg, step)
            for g in optimizer.param_groups:
                g["lr"] = g["base_lr"] * factor
            offsets = order.offsets(step)[rank * local_rows:(rank + 1) * local_rows]
            if record is not None:
                record.write(step, offsets)
            diag_now = bool(cfg.diag_every) and step % cfg.diag_every == 0
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            cap_rec = None
            try:
                for i in range(n_micro):
                    x, y = _rows(tokens, offsets[i * micro:(i + 1) * micro], cfg.block_size)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    sync = model.no_sync() if (world > 1 and i < n_micro - 1) else contextlib.nullcontext()
                    with sync:
                        with amp:
                            logits, _ = model(x)  # (b, T, vocab)
                        if cfg.loss_impl == "written":
                            loss = cross_entropy(logits, y)
                        else:  # FP32 like `cross_entropy`
                            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                        (loss / n_micro).backward()
                    loss_sum += loss.detach().double()
                    if diag_now and i == 0 and lead:
                        with torch.no_grad(), amp, logit_capture(raw) as cap:
                            raw(x[:cfg.diag_rows])
                        cap_rec = cap
                loss_t = dist.all_sum(loss_sum) / (n_micro * world)
                clip = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
                grad_norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
                loss_v, gn_v = loss_t.item(), grad_norm.item()
            except (ValueError, RuntimeError) as e:
                reason = _nonfinite_error(e)
                if reason is None:
                    raise  # bad config, shapes, a backend that cannot run: not ours to swallow
                # The safety net: something in the step refused non-finite values (the model itself lets NaN
                # through to the loss). Same record as a non-finite loss, with the message.
                now = time.perf_counter()
                rec = {"step": step, "loss": math.nan, "grad_norm": math.nan, "lr": cfg.lr * factor,
                       "tokens_per_s": None, "time_s": now - t_prev, "nonfinite": "error", "error": reason}
                result.log.append(rec)
                if log_f is not None:
                    log_f.write(json.dumps(rec) + "\n")
                    log_f.flush()
                result.status, result.nonfinite_step = "nonfinite", step
                if world > 1:
                    # the other ranks may wait in this step's gradient all-reduce: stopping here alone would hang
                    # the job, so record what we can and let torchrun tear it down
                    if out is not None and lead:
                        _write_status(out, result.status, result.steps, cfg, step, time.perf_counter() - t_start,
                                      world)
                    raise
                break
            now = time.perf_counter()
            dt, t_prev = now - t_prev, now
            rec = {"step": step, "loss": loss_v, "grad_norm": gn_v, "lr": cfg.lr * factor,
                   "tokens_per_s": cfg.tokens_per_step / dt if dt > 0 else None, "time_s": dt}
            if diag_now and lead:
                drec = {"step": step, **_diagnostics(raw, cap_rec)}
                result.diag.append(drec)
                if diag_f is not None:
                    diag_f.write(json.dumps(drec) + "\n")
                    diag_f.flush()
            if not (_finite(loss_v) and _finite(gn_v)):
                rec["nonfinite"] = "loss" if not _finite(loss_v) else "grad_norm"
                result.log.append(rec)
                if log_f is not None:
                    log_f.write(json.dumps(rec) + "\n")
                result.status, result.nonfinite_step = "nonfinite", step
                break
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            result.steps = step + 1
            if hook is not None:
                hook(step, raw)
            if step % cfg.log_every == 0 or step == cfg.max_steps - 1:
                result.log.append(rec)
                if log_f is not None:
                    log_f.write(json.dumps(rec) + "\n")
                    log_f.flush()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_v:.4f}", gnorm=f"{gn_v:.3g}", tok_s=f"{rec['tokens_per_s'] or 0:.3g}",
                                refresh=False)
            done = step + 1
            if cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.max_steps):
                if lead:
                    path = save_checkpoint(checkpoint_path(out, done), raw, optimizer, done, cfg, world,
                                           {"out_dir": str(out)})
                    saved_ckpts = [p for p in saved_ckpts if p != path] + [path]
                    if cfg.keep_checkpoints:
                        for old in saved_ckpts[:-cfg.keep_checkpoints]:
                            old.unlink(missing_ok=True)
                        saved_ckpts = saved_ckpts[-cfg.keep_checkpoints:]
                    _write_status(out, "running", done, cfg, None, time.perf_counter() - t_start, world)
                dist.barrier()
    finally:
        if bar is not None:
            bar.close()
        for f in (log_f, diag_f):
            if f is not None:
                f.close()
        if record is not None:
            record.close()
    result.wall_s = time.perf_counter() - t_start
    if out is not None and lead:
        _write_status(out, result.status, result.steps, cfg, result.nonfinite_step, result.wall_s, world)
    return result


def _write_status(out: Path, status, steps, cfg, nonfinite_step, wall_s, world):
    _atomic_write_text(out / "run.json", json.dumps(
        {"status": status, "steps": steps, "max_steps": cfg.max_steps, "nonfinite_step": nonfinite_step,
         "wall_s": round(wall_s, 3), "world_size": world}, indent=1) + "\n")


def read_status(out_dir) -> dict:
    """run.json of a run directory: status, steps, nonfinite_step, wall_s, world_size."""
    return json.loads((Path(out_dir) / "run.json").read_text())


# -- the stored GPU check: 1 GPU vs N GPUs, determinism, tokens/s (appendix A) -------------------------------
@dataclass(frozen=True)
class TrainDDPConfig:
    """A small model trained on 1 GPU and with torchrun on `nproc` GPUs over the same global batch order (and
    on 1 GPU twice: determinism), then GPT-2 small's training throughput per attention implementation."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    block_size: int = 256
    batch_size: int = 64  # 16k tokens per step
    micro_batch: int = 16  # 1 GPU: 4 accumulated micro-batches; 2 GPUs: 2 each
    steps: int = 300
    lr: float = 3e-3
    warmup: int = 30
    attention: str = "sdpa"
    diag_every: int = 50
    nproc: int = 2
    bench_attention: tuple[str, ...] = ("sdpa", "reference(PAPER_BF16)", "triton(FA2_BF16)", "triton(PAPER_BF16)")
    bench_micro_batch: int = 16  # GPT-2 small, T 1024: 16,384 tokens per forward
    bench_warmup: int = 3  # steps left out of the timing (compilation, autotuning, allocator)
    bench_steps: int = 10


def _small_cfg(c: TrainDDPConfig, out_dir: str = "") -> TrainConfig:
    return TrainConfig(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.block_size,
                       batch_size=c.batch_size, micro_batch=c.micro_batch, lr=c.lr, min_lr=c.lr / 10,
                       warmup=c.warmup, max_steps=c.steps, attention=c.attention, diag_every=c.diag_every,
                       out_dir=out_dir, device="cuda")


def _speed_cfg(attention: str, micro_batch: int, steps: int, **overrides) -> TrainConfig:
    """GPT-2 small (vocab 50304, T 1024) on byte tokens of the embedded corpus, one micro-batch per step: the
    same compute per token as the paper's run (the token ids do not change the FLOPs), without needing
    OpenWebText on the machine."""
    return TrainConfig.preset("gpt2-small", data="tinyshakespeare", tokenizer="bytes",
                              batch_size=micro_batch, micro_batch=micro_batch, warmup=0, max_steps=steps,
                              decay_steps=0, diag_every=0, checkpoint_every=0, out_dir="", attention=attention,
                              device="cuda", **overrides)


def _bench_cfg(c: TrainDDPConfig, attention: str) -> TrainConfig:
    return _speed_cfg(attention, c.bench_micro_batch, c.bench_warmup + c.bench_steps)


@results.experiment("train_ddp", config=TrainDDPConfig, gpu=True,
                    description="1 GPU vs torchrun on 2 GPUs (same batches), determinism, GPT-2 small tokens/s")
def train_ddp(c: TrainDDPConfig) -> dict:
    """1 GPU vs torchrun on N GPUs (same global batches), determinism, and GPT-2 small tokens/s per attention."""
    import subprocess
    import tempfile

    if torch.cuda.device_count() < c.nproc:
        raise RuntimeError(f"train_ddp needs {c.nproc} GPUs; this machine has {torch.cuda.device_count()}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (the machines we use forbid it)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    out: dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="lpfail_train_ddp_"))
    t0 = time.perf_counter()
    one = train(_small_cfg(c, str(tmp / "one")), progress=False)
    out["wall_1gpu_s"] = time.perf_counter() - t0
    again = train(_small_cfg(c), progress=False)
    # a yardstick for "reduction-order noise": 1 GPU, half as many micro-batches of twice the size
    other = train(dataclasses.replace(_small_cfg(c), micro_batch=2 * c.micro_batch), progress=False)
    print(f"train_ddp: 1 GPU {one}; again {again}; micro-batch x2 {other}", flush=True)
    cfg_path = tmp / "cfg.json"
    cfg_path.write_text(json.dumps(_small_cfg(c, str(tmp / "multi")).to_dict()))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={c.nproc}", "-m", "lpfail", "train", "--config", str(cfg_path),
                           "--no-progress"], capture_output=True, text=True, timeout=600)
    out["wall_multi_s"] = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    multi = read_log(tmp / "multi")
    a, b = one.arrays(), multi
    n = min(len(a["loss"]), len(b["loss"]))
    out.update(loss_1gpu=a["loss"], loss_multi=b["loss"], loss_1gpu_again=again.losses,
               grad_norm_1gpu=a["grad_norm"], grad_norm_multi=b["grad_norm"],
               tokens_per_s_1gpu=a["tokens_per_s"], tokens_per_s_multi=b["tokens_per_s"])
    diff = np.abs(a["loss"][:n] - b["loss"][:n])
    out["loss_abs_diff"] = diff
    out["max_abs_diff"] = float(diff.max())
    out["max_abs_diff_first_10"] = float(diff[:10].max())
    noise = np.abs(a["loss"][:n] - other.losses[:n])
    out["loss_1gpu_micro2x"], out["noise_abs_diff"] = other.losses, noise
    out["noise_max_abs_diff"] = float(noise.max())
    out["deterministic_1gpu"] = bool(np.array_equal(one.losses, again.losses)
                                     and np.array_equal(one.grad_norms, again.grad_norms))
    out["steps_1gpu"], out["steps_multi"] = one.steps, n
    out["status_1gpu"], out["status_multi"] = one.status, read_status(tmp / "multi")["status"]
    d1, dm = read_diag(tmp / "one"), read_diag(tmp / "multi")
    if "max_logit" in d1 and "max_logit" in dm:
        out["diag_steps"] = d1["step"]
        out["max_logit_1gpu"], out["max_logit_multi"] = d1["max_logit"], dm["max_logit"]
    print(f"train_ddp: max |loss(1 GPU) − loss({c.nproc} GPUs)| = {out['max_abs_diff']:.3g} over {n} steps; "
          f"(1 GPU with 2x micro-batches: {out['noise_max_abs_diff']:.3g}); 1 GPU deterministic: "
          f"{out['deterministic_1gpu']}", flush=True)

    names, tps, step_ms, mem, errors = [], [], [], [], []
    for spec in c.bench_attention:
        names.append(spec)
        try:
            torch.cuda.reset_peak_memory_stats()
            res = train(_bench_cfg(c, spec), progress=False)
            arr = res.arrays()
            t = arr["time_s"][c.bench_warmup:]
            tps.append(float(c.bench_steps * c.bench_micro_batch * 1024 / t.sum()))
            step_ms.append(float(np.median(t) * 1e3))
            mem.append(torch.cuda.max_memory_allocated() / 2 ** 30)
            errors.append("" if res.status == "completed" else res.status)
        except Exception as e:  # one implementation failing must not lose the others' numbers
            tps.append(float("nan"))
            step_ms.append(float("nan"))
            mem.append(float("nan"))
            errors.append(f"{type(e).__name__}: {str(e)[:300]}")
        print(f"train_ddp: GPT-2 small, {spec}: {tps[-1]:,.0f} tokens/s, {step_ms[-1]:.1f} ms/step, "
              f"{mem[-1]:.1f} GiB {errors[-1]}", flush=True)
    out.update(bench_attention=np.array(names), bench_tokens_per_s=np.array(tps),
               bench_step_ms=np.array(step_ms), bench_peak_gib=np.array(mem), bench_errors=json.dumps(errors),
               bench_autotune=os.environ.get("LPFAIL_KERNELS_AUTOTUNE", "1"), gpus=torch.cuda.device_count(),
               gpu_name=torch.cuda.get_device_name(0))
    return out



# -- where the training loop's time goes (GPU) --------------------------------------------------------------
@dataclass(frozen=True)
class TrainSpeedConfig:
    """GPT-2 small with SDPA attention, timed under variants of the loop's numerics settings, each in its own
    process (CUBLAS_WORKSPACE_CONFIG only takes effect in a fresh process)."""
    variants: tuple = ("deterministic,written", "nondeterministic,written", "nondeterministic,torch",
                       "deterministic,torch")
    attention: str = "sdpa"
    micro_batch: int = 16  # 16 × 1024 tokens per step
    warmup_steps: int = 3
    timed_steps: int = 10
    runs: int = 2  # each variant runs this often; `identical` says whether losses and grad norms repeat bit for bit


@results.experiment("train_speed", config=TrainSpeedConfig, gpu=True,
                    description="GPT-2 small tokens/s with/without deterministic mode and with each loss (GPU)")
def train_speed(c: TrainSpeedConfig) -> dict:
    """Tokens/s of GPT-2 small training per (deterministic, loss implementation) variant, and whether each
    variant repeats bit for bit over `runs` runs."""
    import subprocess

    names, tps, step_ms, identical, errors = [], [], [], [], []
    for variant in c.variants:
        det, loss_impl = variant.split(",")
        cfg = _speed_cfg(c.attention, c.micro_batch, c.warmup_steps + c.timed_steps,
                         deterministic=(det == "deterministic"), loss_impl=loss_impl)
        logs, err = [], ""
        for _ in range(c.runs):
            with tempfile.TemporaryDirectory(prefix="lpfail_speed_") as tmp:
                run_cfg = dataclasses.replace(cfg, out_dir=str(Path(tmp) / "run"))
                cfg_path = Path(tmp) / "cfg.json"
                cfg_path.write_text(json.dumps(run_cfg.to_dict()))
                env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
                proc = subprocess.run([sys.executable, "-m", "lpfail", "train", "--config", str(cfg_path),
                                       "--no-progress"], capture_output=True, text=True, timeout=300, env=env)
                if proc.returncode != 0:
                    err = (proc.stderr or proc.stdout)[-400:]
                    break
                logs.append(read_log(Path(tmp) / "run"))
        names.append(variant)
        errors.append(err)
        if err:
            tps.append(float("nan"))
            step_ms.append(float("nan"))
            identical.append(False)
        else:
            t = np.asarray(logs[0]["time_s"][c.warmup_steps:], dtype=np.float64)
            tps.append(float(c.timed_steps * c.micro_batch * cfg.block_size / t.sum()))
            step_ms.append(float(np.median(t) * 1e3))
            identical.append(all(np.array_equal(lg["loss"], logs[0]["loss"])
                                 and np.array_equal(lg["grad_norm"], logs[0]["grad_norm"]) for lg in logs[1:]))
        print(f"train_speed: {variant}: {tps[-1]:,.0f} tokens/s, {step_ms[-1]:.1f} ms/step, identical over "
              f"{c.runs} runs: {identical[-1]} {errors[-1][-200:]}", flush=True)
    return {"variants": np.array(names), "tokens_per_s": np.array(tps), "step_ms": np.array(step_ms),
            "identical": np.array(identical), "errors": json.dumps(errors), "gpu_name": torch.cuda.get_device_name(0)}
