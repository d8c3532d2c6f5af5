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
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lpfail import data as lpdata
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
    qk_norm: bool = False  # LayerNorm of q and k per head before the scores (GPTConfig.qk_norm)
    # data
    data: str = "tinyshakespeare"  # an embedded corpus, "openwebtext" (data_dir/train.bin) or a .bin path
    data_dir: str = "data/openwebtext"  # where openwebtext_bins() wrote train.bin / val.bin
    tokenizer: str = "bytes"  # "bytes" or "gpt2" (for the embedded corpus; .bin files are GPT-2 ids)
    val_fraction: float = 0.0  # > 0: hold out the corpus' last fraction as validation data, never trained on
    val_rows: int = 64  # validation windows of block_size + 1 tokens, evenly spaced over the held-out part
    val_every: int = 0  # validation loss every this many steps (0: only before the first and after the last)
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
    cuda_graph: bool = False  # on CUDA, one process: after GRAPH_WARMUP eager steps, each step (forward, backward,
    #                           clip, update) is replayed from one captured CUDA graph — the small models are
    #                           launch-bound. AdamW then runs in its capturable form (lr and step count on the
    #                           device), whose last bits differ from the default form's; a captured and an
    #                           uncaptured run (LPFAIL_NO_CAPTURE=1) of the same config agree bit for bit
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
    # non-precision controls (experiment `cures`, chapter 6); 0 = off, and a field left at 0 changes no run hash
    z_loss: float = 0.0  # coefficient of the z-loss mean(log² Z) of the output softmax (PaLM), added to the
    #                      training loss only (the logged training loss includes it; validation is plain CE)
    logit_softcap: float = 0.0  # > 0: output logits soft-capped as cap·tanh(logits / cap) (GPTConfig.logit_softcap)

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
                     "keep_checkpoints", "init_seed", "data_seed", "val_every"):
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
        if not 0.0 <= self.val_fraction < 0.5:
            raise ValueError(f"TrainConfig.val_fraction must lie in [0, 0.5) (got {self.val_fraction})")
        if self.val_rows <= 0:
            raise ValueError(f"TrainConfig.val_rows must be positive (got {self.val_rows})")
        if self.cuda_graph and self.optimizer != "adamw":
            raise ValueError("TrainConfig.cuda_graph needs optimizer='adamw' (Muon's step is not captured)")
        if not (math.isfinite(self.z_loss) and self.z_loss >= 0):
            raise ValueError(f"TrainConfig.z_loss must be a finite number >= 0 (got {self.z_loss})")
        if not (math.isfinite(self.logit_softcap) and self.logit_softcap >= 0):
            raise ValueError(f"TrainConfig.logit_softcap must be a finite number >= 0, 0 = off (got {self.logit_softcap})")
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
                         n_head=self.n_head, n_embd=self.n_embd, qk_norm=self.qk_norm,
                         logit_softcap=self.logit_softcap)

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
              "optimizer", "qk_norm", "val_fraction")


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


def split_validation(tokens: np.ndarray, cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """(training tokens, held-out tokens or None): the corpus' last ``val_fraction`` is never trained on."""
    if cfg.val_fraction <= 0:
        return tokens, None
    n_val = int(len(tokens) * cfg.val_fraction)
    if n_val < cfg.block_size + 1 or len(tokens) - n_val < cfg.block_size + 1:
        raise ValueError(f"TrainConfig.val_fraction={cfg.val_fraction} leaves {n_val} held-out and "
                         f"{len(tokens) - n_val} training tokens; each part needs block_size + 1 = "
                         f"{cfg.block_size + 1}")
    return tokens[:-n_val], tokens[-n_val:]


def validation_offsets(n_val: int, cfg: TrainConfig) -> np.ndarray:
    """The ``val_rows`` start offsets of the validation windows: evenly spaced over the held-out tokens, the
    same for every run on the same corpus and context length."""
    return np.linspace(0, n_val - cfg.block_size - 1, cfg.val_rows).round().astype(np.int64)


@torch.no_grad()
def validation_loss(model, val_tokens: np.ndarray, offsets: np.ndarray, cfg: TrainConfig, rows: int, device,
                    amp) -> float:
    """Mean next-token cross-entropy (nats per token, FP32 loss of the model's own arithmetic) over the
    validation windows, `rows` windows per forward pass. NaN or inf when the model produces them."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(0, len(offsets), rows):
        x, y = _rows(val_tokens, offsets[i:i + rows], cfg.block_size)
        x, y = x.to(device), y.to(device)
        with amp:
            logits, _ = model(x)  # (b, T, vocab)
        total += torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                                   reduction="sum").double()
    return total.item() / (len(offsets) * cfg.block_size)


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


def window_config(cfg: TrainConfig, last: int, **changes) -> TrainConfig:
    """`cfg` for a window of a recorded run that stops at `last` (<= cfg.max_steps): the same learning-rate
    schedule as the whole run (decay_steps 0 means max_steps, so stopping early must pin the cosine's end),
    no checkpoints, and `changes` on top."""
    if not 0 < int(last) <= cfg.max_steps:
        raise ValueError(f"window_config: the window must stop inside the run's 1..{cfg.max_steps} (got {last})")
    base = dict(max_steps=int(last), decay_steps=cfg.decay_steps or cfg.max_steps, checkpoint_every=0,
                keep_checkpoints=0)
    return dataclasses.replace(cfg, **{**base, **changes})


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


def read_val(out_dir) -> dict[str, np.ndarray]:
    """val.jsonl as arrays: step (updates done before the evaluation; 0 = at initialization) and val_loss."""
    return _val_arrays(_read_jsonl(Path(out_dir) / "val.jsonl"))


def _val_arrays(records: list[dict]) -> dict[str, np.ndarray]:
    return {"step": np.array([r["step"] for r in records], dtype=np.int64),
            "val_loss": np.array([np.nan if r["val_loss"] is None else r["val_loss"] for r in records],
                                 dtype=np.float64)}


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
    val: list[dict] = field(default_factory=list)  # {"step", "val_loss"}: with TrainConfig.val_fraction > 0
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

    def val_arrays(self) -> dict[str, np.ndarray]:
        return _val_arrays(self.val)

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
        from lpfail.optim import muon_param_groups

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
        from lpfail.optim import MuonAdamW
        return MuonAdamW(groups, lr=cfg.muon_lr, adam_lr=cfg.lr, weight_decay=cfg.weight_decay,
                         momentum=cfg.muon_momentum, ns_steps=cfg.ns_steps, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    capturable = cfg.cuda_graph and any(p.is_cuda for p in model.parameters())
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, capturable=capturable)
    if capturable:
        _device_lr(opt)
    return opt


def _device_lr(optimizer):
    """Each group's lr as a 0-d FP32 tensor on the parameters' device (what a captured step reads)."""
    for g in optimizer.param_groups:
        g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=g["params"][0].device)


def _set_lr(group: dict, value: float):
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)  # in place: a captured graph reads this memory
    else:
        group["lr"] = value


#: Eager steps before a step is captured as a CUDA graph (torch.cuda.graphs: warm up on a side stream first).
GRAPH_WARMUP = 3


def _clip(cfg: TrainConfig) -> float:
    return cfg.grad_clip if cfg.grad_clip > 0 else math.inf  # 0: no clipping (the norm is still computed)


def _capture_logits(raw: GPT, x: torch.Tensor, cfg: TrainConfig, amp):
    """The diagnostic forward pass of a step: logit statistics of its first `diag_rows` sequences."""
    with torch.no_grad(), amp, logit_capture(raw) as cap:
        raw(x[:cfg.diag_rows])
    return cap


def _loss(cfg: TrainConfig, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if cfg.loss_impl == "written":
        loss = cross_entropy(logits, y)
    else:
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())  # FP32 like `cross_entropy`
    if cfg.z_loss:
        loss = loss + z_loss_term(logits, cfg.z_loss)
    return loss


def z_loss_term(logits: torch.Tensor, coef: float) -> torch.Tensor:
    """coef · mean over positions of (log Σ exp logits)², in FP32: the z-loss (Chowdhery et al. 2022, PaLM),
    which keeps the output softmax's normaliser near 1. A non-precision control in experiment `cures`."""
    return coef * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


class _CapturedStep:
    """One training step — forward and backward over the micro-batches, the loss, the clip, the AdamW update —
    captured once as a CUDA graph and replayed for every later step, with the batch copied into static
    inputs first. Same kernels in the same order as the eager step, so the same bits."""

    def __init__(self, model, optimizer, params, cfg: TrainConfig, n_micro: int, micro: int, device, amp):
        self.n_micro, self.micro, self.T = n_micro, micro, cfg.block_size
        self.x = torch.zeros((n_micro, micro, cfg.block_size), dtype=torch.long, device=device)
        self.y = torch.zeros_like(self.x)
        optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients itself
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            for i in range(n_micro):
                with amp:
                    logits, _ = model(self.x[i])  # (b, T, vocab)
                loss = _loss(cfg, logits, self.y[i])
                (loss / n_micro).backward()
                loss_sum += loss.detach().double()
            self.loss = loss_sum / n_micro
            self.grad_norm = torch.nn.utils.clip_grad_norm_(params, _clip(cfg), foreach=True)
            optimizer.step()

    def run(self, tokens, offsets) -> tuple[float, float]:
        for i in range(self.n_micro):
            x, y = _rows(tokens, offsets[i * self.micro:(i + 1) * self.micro], self.T)
            self.x[i].copy_(x)
            self.y[i].copy_(y)
        self.graph.replay()
        return self.loss.item(), self.grad_norm.item()


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
    tokens, val_tokens = split_validation(tokens, cfg)  # training never reads val_tokens
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
        if any(isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups):
            _device_lr(optimizer)  # the checkpoint's lr tensors were loaded onto the CPU
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
    log_f = diag_f = val_f = record = None
    prefix_log, prefix_diag, prefix_val = [], [], []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        if lead:
            src = out if (out / "log.jsonl").is_file() else Path(parent_log) if parent_log else None
            if src is not None:
                prefix_log = [r for r in _read_jsonl(src / "log.jsonl") if r["step"] < start]
                prefix_diag = [r for r in _read_jsonl(src / "diag.jsonl") if r["step"] < start]
                prefix_val = [r for r in _read_jsonl(src / "val.jsonl") if r["step"] <= start]
            _atomic_write_text(out / "config.json", json.dumps(
                {"config": cfg.to_dict(), "world_size": world, "vocab_size": vocab, "data": data_desc,
                 "batch_order": source, "resumed_from": str(resume_from) if resume_from else None,
                 "start_step": start, "attention": str(raw.attention_specs()),
                 "parameters": raw.num_params()}, indent=1) + "\n")
            _atomic_write_text(out / "log.jsonl", "".join(json.dumps(r) + "\n" for r in prefix_log))
            _atomic_write_text(out / "diag.jsonl", "".join(json.dumps(r) + "\n" for r in prefix_diag))
            _atomic_write_text(out / "val.jsonl", "".join(json.dumps(r) + "\n" for r in prefix_val))
            log_f, diag_f = open(out / "log.jsonl", "a"), open(out / "diag.jsonl", "a")
            val_f = open(out / "val.jsonl", "a")
            _write_status(out, "running", start, cfg, None, 0.0, world)
        record = BatchRecord(out, rank, world, cfg, len(tokens), source)
        record.open(start, order, slice(rank * local_rows, (rank + 1) * local_rows))

    result = TrainResult("completed", start, cfg, log=list(prefix_log), diag=list(prefix_diag),
                         val=list(prefix_val), world_size=world, out_dir=str(out or ""))
    # a captured graph must not reuse autocast's cache of cast weights (same values either way)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast == "bf16",
                         cache_enabled=not cfg.cuda_graph)
    use_graph = (cfg.cuda_graph and device.type == "cuda" and world == 1
                 and os.environ.get("LPFAIL_NO_CAPTURE", "") != "1")
    if cfg.cuda_graph and world > 1:
        raise ValueError("TrainConfig.cuda_graph runs one process only (DDP's all-reduce is not captured)")
    captured = None
    show = lead and (progress if progress is not None else sys.stderr.isatty())
    bar = None
    if show:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    saved_ckpts = sorted(out.glob("ckpt_*.pt")) if (out is not None and lead) else []
    val_offsets = validation_offsets(len(val_tokens), cfg) if val_tokens is not None else None

    def validate(done: int):
        """Validation loss after `done` updates (rank 0; recorded once per step count)."""
        if val_offsets is None or not lead or any(r["step"] == done for r in result.val):
            return
        v = validation_loss(raw, val_tokens, val_offsets, cfg, micro, device, amp)
        vrec = {"step": done, "val_loss": v if _finite(v) else None}
        result.val.append(vrec)
        if val_f is not None:
            val_f.write(json.dumps(vrec) + "\n")
            val_f.flush()

    optimizer.zero_grad(set_to_none=True)
    t_prev = time.perf_counter()
    side = torch.cuda.Stream(device) if use_graph else None  # warm-up and capture off the default stream
    stream_ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
    stream_ctx.__enter__()
    try:
        for step in range(start, cfg.max_steps):
            if step == 0 or (cfg.val_every and step % cfg.val_every == 0):
                validate(step)
                t_prev = time.perf_counter()  # the evaluation is not part of the step's time
            factor = lr_factor(cfg, step)
            for g in optimizer.param_groups:
                _set_lr(g, g["base_lr"] * factor)
            offsets = order.offsets(step)[rank * local_rows:(rank + 1) * local_rows]
            if record is not None:
                record.write(step, offsets)
            diag_now = bool(cfg.diag_every) and step % cfg.diag_every == 0
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            cap_rec = drec_pre = None
            try:
                if captured is None and use_graph and step - start >= GRAPH_WARMUP:
                    captured = _CapturedStep(model, optimizer, params, cfg, n_micro, micro, device, amp)
            except RuntimeError as e:
                raise RuntimeError(f"capturing the training step as a CUDA graph failed ({e}); "
                                   "LPFAIL_NO_CAPTURE=1 runs the same arithmetic uncaptured") from e
            try:
                if captured is not None:
                    if diag_now and lead:  # before the replay, which updates the weights
                        x0, _ = _rows(tokens, offsets[:micro], cfg.block_size)
                        drec_pre = _diagnostics(raw, _capture_logits(raw, x0.to(device), cfg, amp))
                    loss_v, gn_v = captured.run(tokens, offsets)
                for i in range(n_micro if captured is None else 0):
                    x, y = _rows(tokens, offsets[i * micro:(i + 1) * micro], cfg.block_size)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    sync = model.no_sync() if (world > 1 and i < n_micro - 1) else contextlib.nullcontext()
                    with sync:
                        with amp:
                            logits, _ = model(x)  # (b, T, vocab)
                        loss = _loss(cfg, logits, y)
                        (loss / n_micro).backward()
                    loss_sum += loss.detach().double()
                    if diag_now and i == 0 and lead:
                        cap_rec = _capture_logits(raw, x, cfg, amp)
                if captured is None:
                    loss_t = dist.all_sum(loss_sum) / (n_micro * world)
                    grad_norm = torch.nn.utils.clip_grad_norm_(params, _clip(cfg), foreach=True)
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
                drec = {"step": step, **(drec_pre if drec_pre is not None else _diagnostics(raw, cap_rec))}
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
            if captured is None:  # the captured step has already updated the weights
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
        if result.status == "completed":
            validate(result.steps)
    finally:
        stream_ctx.__exit__(None, None, None)
        if side is not None:
            torch.cuda.current_stream(device).wait_stream(side)
        if bar is not None:
            bar.close()
        for f in (log_f, diag_f, val_f):
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
