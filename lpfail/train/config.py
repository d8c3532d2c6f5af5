"""What a run depends on: `TrainConfig` (every field, its default and why), the named settings `PRESETS`, the
attention specs and per-layer / per-head overrides it parses, ``key=value`` and JSON configs
(`config_from_sets`, `load_config`), and what a resumed run or a replayed window may change (`STRUCTURAL`,
`window_config`). Part of `lpfail.train`."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpfail.model import BACKENDS, AttentionSpec, GPTConfig
from lpfail.precision import Precision

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("constant", "cosine")
AUTOCASTS = ("bf16", "none")
DEVICES = ("auto", "cpu", "cuda")


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
    init_seed: int = 0  # weights (drawn on the CPU, so identical on any device), and the seed of the stream of
    #                     stochastic rounding's bits under an "sr" policy (GPTConfig.sr_seed, lpfail.sr_stream)
    data_seed: int = 0  # batch order (BatchOrder); ignored when a recorded order is replayed
    # run
    max_steps: int = 1000
    log_every: int = 1  # write a log.jsonl record every this many steps (1: every step)
    diag_every: int = 100  # diagnostics every this many steps; 0 = never
    diag_rows: int = 4  # sequences of the first micro-batch the logit statistics look at
    delta_every: int = 0  # the δ signature (`lpfail.gradient_error.delta_signature`: per layer and head, the δ
    #                       error on rows with a tied maximum and on all rows) every this many steps, on the
    #                       step's first diag_rows sequences, in the diagnostic record; 0 = never. A multiple of
    #                       diag_every; needs one reference(POLICY) attention for every head. Changes nothing the
    #                       run computes
    checkpoint_every: int = 0  # 0 = never (a final checkpoint is still written when > 0)
    keep_checkpoints: int = 0  # keep only the newest this many (0 = all: branching needs old ones)
    out_dir: str = ""  # "" = keep everything in memory
    device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda"
    # non-precision controls (experiment `cures`, chapter 6); 0 = off, and a field left at 0 changes no run hash
    z_loss: float = 0.0  # coefficient of the z-loss mean(log² Z) of the output softmax (PaLM), added to the
    #                      training loss only (the logged training loss includes it; validation is plain CE)
    logit_softcap: float = 0.0  # > 0: output logits soft-capped as cap·tanh(logits / cap) (GPTConfig.logit_softcap)
    # the diagnosis kit's monitor (and precision alarm) on the run, e.g. "every=10 window=10 alarm=16"
    # (`lpfail.train.watch`); "" = none. Changes nothing the run computes; records in out_dir/monitor.jsonl
    monitor: str = ""

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
        if self.delta_every < 0:
            raise ValueError(f"TrainConfig.delta_every must be >= 0 (got {self.delta_every})")
        if self.delta_every:
            if not self.diag_every or self.delta_every % self.diag_every:
                raise ValueError(f"TrainConfig.delta_every ({self.delta_every}) must be a multiple of diag_every "
                                 f"({self.diag_every}): the δ signature goes into the diagnostic record")
            spec = self.attention_table()
            if len(spec) != 1 or spec[0][2].backend != "reference":
                raise ValueError("TrainConfig.delta_every needs one reference(POLICY) attention for every head (no "
                                 f"overrides): the δ signature recomputes that policy's δ (got {self.attention!r}"
                                 f"{' with overrides' if len(spec) > 1 else ''})")
        if self.checkpoint_every and not self.out_dir:
            raise ValueError("TrainConfig.checkpoint_every needs an out_dir to write checkpoints into")
        self.attention_table()  # parse the specs now: unknown backends and policies fail here
        from lpfail.train.watch import parse as parse_monitor

        if parse_monitor(self.monitor) and self.cuda_graph:
            raise ValueError("TrainConfig.monitor needs cuda_graph=False (the monitor's hooks cannot be captured)")

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
                         logit_softcap=self.logit_softcap, sr_seed=self.init_seed)

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


def window_config(cfg: TrainConfig, last: int, **changes) -> TrainConfig:
    """`cfg` for a window of a recorded run that stops at `last` (<= cfg.max_steps): the same learning-rate
    schedule as the whole run (decay_steps 0 means max_steps, so stopping early must pin the cosine's end),
    no checkpoints, and `changes` on top."""
    if not 0 < int(last) <= cfg.max_steps:
        raise ValueError(f"window_config: the window must stop inside the run's 1..{cfg.max_steps} (got {last})")
    base = dict(max_steps=int(last), decay_steps=cfg.decay_steps or cfg.max_steps, checkpoint_every=0,
                keep_checkpoints=0)
    return dataclasses.replace(cfg, **{**base, **changes})


def check_resume(cfg: TrainConfig, saved: dict, path):
    """Raise a ValueError when `cfg` changes a STRUCTURAL field of the checkpoint's config `saved`."""
    for name in STRUCTURAL:
        if saved.get(name) != getattr(cfg, name):
            raise ValueError(f"cannot resume from {path}: TrainConfig.{name} is {getattr(cfg, name)!r} here but "
                             f"{saved.get(name)!r} in the checkpoint (a branch may change the attention, lr, "
                             f"schedule, clip, steps, but not {', '.join(STRUCTURAL)})")
