"""GPT-2 in one file, with attention that can be swapped per layer and per head.

Used by chapter 1 ("Symptom": training, spectral norms, tied maxima), chapter 2 ("Substitution": the paper's
one-change-at-a-time replays are `set_attention` overrides), chapter 3 (captured Q, K, X) and chapter 7
("Diagnose your own model"). References: Radford et al. 2019 (GPT-2), Karpathy's nanoGPT `model.py` (the
style, not the code), and Qiu & Yao, Sec. 3 (the substitutions).

The model is nanoGPT-shaped: token + position embeddings, pre-LN blocks, no biases anywhere, GELU MLP,
weight-tied head, GPT-2 init. What is new is the attention call. Every layer holds one `AttentionSpec`
per head::

    AttentionSpec("sdpa")                    torch's fused scaled_dot_product_attention (what users run)
    AttentionSpec("naive")                   softmax(αQKᵀ)V in float64 (the truth)
    AttentionSpec("reference", PAPER_BF16)   lpfail.attention: tiled FlashAttention-2 under a Precision
    AttentionSpec("triton", FA2_BF16)        lpfail.kernels.flash_attention (CUDA only)

and the paper's substitutions are overrides::

    model.set_attention("reference", PAPER_BF16)                   # flash attention everywhere
    model.set_attention("sdpa", layers=[1])                        # ... except standard attention in layer 1
    model.set_attention("reference", FP32, layers=[1], heads=[0, 6, 7])  # FP32 for three heads of layer 1
    print(model.attention_specs())

Heads and layers are 0-based here; the paper counts heads from 1 (its "heads 1, 7, 8" are 0, 6, 7 here).
"""
from __future__ import annotations

import functools
import importlib
import math
import types
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lpfail import sdpa_hook
from lpfail.precision import Precision
from lpfail.sr_stream import RoundingKey, SRStream

BACKENDS = ("sdpa", "reference", "naive", "triton")
#: The backends that compute under a `Precision` policy (and need one).
POLICY_BACKENDS = ("reference", "triton")
FALLBACKS = (None, "reference")


# -- configuration ---------------------------------------------------------------------------------------
@dataclass
class GPTConfig:
    """GPT-2 small by default: the paper's model (12 layers, 12 heads, width 768, context 1024)."""

    block_size: int = 1024  # context length T of GPT-2 and of the paper's runs
    vocab_size: int = 50304  # GPT-2's 50257 tokens padded to a multiple of 64 (faster matmuls; as in the paper)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768  # head size n_embd / n_head = 64
    dropout: float = 0.0  # the paper (and nanoGPT pre-training) uses none; it would also perturb replays
    bias: bool = False  # no biases in Linear or LayerNorm: the paper's setting, a bit faster, no worse
    qk_norm: bool = False  # LayerNorm of q and k per head before the scores (Dehghani et al. 2023; Wortsman
    #                        et al. 2023, arXiv 2309.14322); off: the paper's model
    logit_softcap: float = 0.0  # > 0: output logits become cap·tanh(logits / cap) (Gemma 2's final soft-cap); a
    #                             non-precision control of experiment `cures`; 0: off, the paper's model
    sr_seed: int = 0  # the seed of the model's stochastic-rounding stream (`SRStream`: keys of "sr" policies'
    #                   roundings); the training loop passes TrainConfig.init_seed

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"GPTConfig.{name} must be a positive int (got {value!r})")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): "
                             "each head gets n_embd / n_head channels")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"GPTConfig.dropout must be in [0, 1) (got {self.dropout!r})")
        if not isinstance(self.qk_norm, bool):
            raise ValueError(f"GPTConfig.qk_norm must be True or False (got {self.qk_norm!r})")
        if not (isinstance(self.logit_softcap, (int, float)) and math.isfinite(self.logit_softcap)
                and self.logit_softcap >= 0):
            raise ValueError(f"GPTConfig.logit_softcap must be a finite number >= 0, 0 = off (got {self.logit_softcap!r})")
        if isinstance(self.sr_seed, bool) or not isinstance(self.sr_seed, int) or not 0 <= self.sr_seed < 1 << 64:
            raise ValueError(f"GPTConfig.sr_seed must be an int in [0, 2^64) (got {self.sr_seed!r})")
        if self.bias:
            raise ValueError("GPTConfig.bias=True is not supported: this model follows the paper, which has no "
                             "biases (the field exists only to say so)")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head


# -- which attention runs where --------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionSpec:
    """One attention implementation, with its precision policy where it has one.

    backend   "sdpa" | "naive" | "reference" | "triton"
    policy    a `Precision` (or its string form / preset name, parsed); required by "reference" and "triton",
              refused by "sdpa" and "naive" (which have no cast points to choose, so a policy would be
              silently ignored)
    fallback  None, or "reference" (triton only): when the Triton kernel cannot run (no `kernels` package,
              no Triton, no CUDA tensors), warn once and run the reference with the same policy instead.
              Without it that situation is a RuntimeError: a substitution experiment must never quietly
              measure a different implementation.
    """

    backend: str
    policy: Precision | None = None
    fallback: str | None = None

    def __post_init__(self):
        if isinstance(self.policy, str):  # a preset name or policy string, e.g. "PAPER_BF16" or "FP32+fix"
            object.__setattr__(self, "policy", Precision.parse(self.policy))
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {self.backend!r}; backends: {list(BACKENDS)}")
        if self.backend in POLICY_BACKENDS:
            if not isinstance(self.policy, Precision):
                raise ValueError(f"backend {self.backend!r} needs a Precision policy, e.g. "
                                 f"AttentionSpec({self.backend!r}, PAPER_BF16) (got policy={self.policy!r})")
        elif self.policy is not None:
            raise ValueError(f"backend {self.backend!r} takes no policy (got {self.policy!r}); use "
                             "'reference' or 'triton' to choose cast points")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be None or 'reference' (got {self.fallback!r})")
        if self.fallback is not None and self.backend != "triton":
            raise ValueError(f"fallback is only meaningful for the 'triton' backend (got backend {self.backend!r})")

    def __str__(self) -> str:
        if self.policy is None:
            return self.backend
        extra = f", fallback={self.fallback}" if self.fallback else ""
        return f"{self.backend}({self.policy.name}{extra})"

    @classmethod
    def parse(cls, text: str) -> "AttentionSpec":
        """Inverse of ``str(spec)``: "sdpa", "reference(PAPER_BF16)", "triton(FA2_BF16, fallback=reference)",
        or a full policy string inside the parentheses."""
        text = text.strip()
        if "(" not in text:
            if text in POLICY_BACKENDS:   # the text form's example, not the constructor's
                raise ValueError(f"attention {text!r} needs a Precision policy in parentheses, e.g. "
                                 f"{text}(PAPER_BF16) or {text}(FA2_BF16)")
            return cls(text)
        if not text.endswith(")"):
            raise ValueError(f"cannot parse attention spec {text!r}: expected backend(policy)")
        backend, inner = text[:-1].split("(", 1)
        policy, sep, fallback = inner.rpartition(", fallback=")
        if not sep:
            policy, fallback = inner, None
        return cls(backend.strip(), policy.strip(), fallback)


DEFAULT_SPEC = AttentionSpec("sdpa")


class AttentionTable(dict):
    """layer → tuple of per-head `AttentionSpec`s, as returned by `GPT.attention_specs()`.

    ``table[1][7]`` is the spec of head 7 in layer 1; ``str(table)`` is one line per layer, listing head
    groups (``layer 1: heads 0-6,9-11 sdpa | heads 7,8 reference(FP32)``)."""

    def __str__(self) -> str:
        return "\n".join(f"layer {layer}: {_describe_heads(specs)}" for layer, specs in self.items())

    def __repr__(self) -> str:
        return f"AttentionTable(\n{self}\n)"

    def overrides(self, default: AttentionSpec = DEFAULT_SPEC) -> dict[tuple[int, int], AttentionSpec]:
        """(layer, head) → spec for every head that does not run `default`."""
        return {(layer, h): s for layer, specs in self.items() for h, s in enumerate(specs) if s != default}


def _ranges(heads: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] → "0-2,5,7,8" (runs of three or more are collapsed)."""
    out, i = [], 0
    while i < len(heads):
        j = i
        while j + 1 < len(heads) and heads[j + 1] == heads[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{heads[i]}-{heads[j]}")
        else:
            out.extend(str(h) for h in heads[i:j + 1])
        i = j + 1
    return ",".join(out)


def _groups(specs) -> dict[AttentionSpec, list[int]]:
    """Heads grouped by equal spec, in order of first appearance."""
    groups: dict[AttentionSpec, list[int]] = {}
    for h, s in enumerate(specs):
        groups.setdefault(s, []).append(h)
    return groups


def _describe_heads(specs) -> str:
    groups = _groups(specs)
    if len(groups) == 1:
        return f"all {len(specs)} heads {specs[0]}"
    return " | ".join(f"head{'s' if len(hs) > 1 else ''} {_ranges(hs)} {s}" for s, hs in groups.items())


# -- the attention backends ------------------------------------------------------------------------------
def _no_autocast(device_type: str):
    # The policy names every cast of the reference and the kernel; autocast must not add hidden ones.
    return torch.autocast(device_type=device_type, enabled=False)


# The model calls the reference and the naive attention with check_finite=False: an inf or NaN reaching a
# layer's q, k or v (e.g. a row sum that underflowed to 0 in the layer before: 0/0) must flow on to the loss,
# where the training loop records the step as non-finite, instead of raising mid-forward; and the check's
# torch.isfinite(...).all() would force a host-device synchronization per layer per step. The Triton kernel
# and SDPA do not check either. Shape and dtype checks still run.
def _reference(q, k, v, policy, sr_key: RoundingKey | None = None):
    from lpfail.attention import attention  # lazy: the reference is only imported when a layer uses it

    with _no_autocast(q.device.type):
        return attention(q, k, v, policy=policy, causal=True, check_finite=False, sr_key=sr_key)


def _triton_function():
    """(lpfail.kernels.flash_attention, whether Triton's CPU interpreter is on, None), or (None, False, the reason
    it cannot be had)."""
    try:
        kernels = importlib.import_module("lpfail.kernels")
        fn = getattr(kernels, "flash_attention", None)
        if fn is None:
            fn = importlib.import_module("lpfail.kernels.flash_attention")
        if isinstance(fn, types.ModuleType):  # kernels/flash_attention.py holding a function of the same name
            fn = getattr(fn, "flash_attention")
        interpreted = getattr(kernels, "interpreted", None)
        return fn, bool(interpreted()) if callable(interpreted) else False, None
    except (ImportError, AttributeError) as e:
        return None, False, f"cannot import lpfail.kernels.flash_attention ({type(e).__name__}: {e})"


def unavailable(spec: AttentionSpec, device) -> str | None:
    """Why `spec` cannot run on tensors of `device` here, or None when it can. Only the Triton kernel without a
    fallback can: without the `kernels` package, or off CUDA without Triton's interpreter (TRITON_INTERPRET=1)."""
    if spec.backend != "triton" or spec.fallback == "reference":
        return None
    _fn, interpreted, reason = _triton_function()
    if reason is None and torch.device(device).type != "cuda" and not interpreted:
        reason = f"the Triton kernel needs a CUDA device (CUDA available: {torch.cuda.is_available()})"
    return reason


def _triton(q, k, v, spec: AttentionSpec, state: dict, sr_key: RoundingKey | None = None):
    fn, interpreted, reason = _triton_function()
    if reason is None and not q.is_cuda and not interpreted:  # TRITON_INTERPRET=1 runs the kernels on the CPU
        reason = ("the Triton kernel needs CUDA tensors (CUDA available: "
                  f"{torch.cuda.is_available()}, tensors on {q.device})")
    if reason is None:
        with _no_autocast(q.device.type):
            return fn(q, k, v, policy=spec.policy, causal=True)
    if spec.fallback != "reference":
        raise RuntimeError(f"attention backend 'triton' cannot run: {reason}. Run on a CUDA machine with the "
                           "kernels installed, or use AttentionSpec('triton', policy, fallback='reference') "
                           "to fall back to the pure-PyTorch reference with the same policy.")
    if not state.get("warned"):
        warnings.warn(f"attention backend 'triton' cannot run ({reason}); falling back to the reference "
                      f"implementation with policy {spec.policy.name} (warned once per model)",
                      RuntimeWarning, stacklevel=4)
        state["warned"] = True
    return _reference_keyed(q, k, v, spec.policy, sr_key)


def _reference_keyed(q, k, v, policy, sr_key: RoundingKey | None):
    """`_reference`, passing a rounding key only where there is one."""
    return _reference(q, k, v, policy) if sr_key is None else _reference(q, k, v, policy, sr_key)


def run_attention(spec: AttentionSpec, q, k, v, state: dict | None = None, sr_key: RoundingKey | None = None):
    """Causal attention of (B, nh, T, hs) tensors under one spec; the output's dtype is the backend's own.
    `sr_key`: the rounding key of a "reference" spec whose policy rounds stochastically (see
    `lpfail.attention.attention`)."""
    if spec.backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if spec.backend == "naive":
        from lpfail.attention import naive_attention

        with _no_autocast(q.device.type):
            return naive_attention(q, k, v, causal=True, check_finite=False)
    if spec.backend == "reference":
        return _reference_keyed(q, k, v, spec.policy, sr_key)
    return _triton(q, k, v, spec, state if state is not None else {}, sr_key)


def _run(spec: AttentionSpec, q, k, v, state: dict, key: RoundingKey | None):
    """`run_attention`, passing a rounding key only where there is one."""
    if key is None:
        return run_attention(spec, q, k, v, state)
    return run_attention(spec, q, k, v, state, sr_key=key)


# -- the model -------------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.layer, self.n_head, self.n_embd = layer, config.n_head, config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)  # x → q, k, v for all heads
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)  # residual projection
        self.resid_dropout = nn.Dropout(config.dropout)
        self.specs: tuple[AttentionSpec, ...] = (DEFAULT_SPEC,) * config.n_head  # one per head
        self.fallback_state: dict = {}  # shared by all layers of a GPT: "warn once" for the triton fallback
        self.capture: dict | None = None  # set by logit_capture(): {"dtype": ..., "out": list}
        self.sr_stream: SRStream | None = None  # the GPT's stream (not a submodule here: one per model), or None
        if config.qk_norm:
            # QK-norm: LayerNorm over each head's channels, one gain vector shared by the heads, no bias (the
            # model has none). LayerNorm, not RMSNorm, because LayerNorm is what both papers that showed it
            # removes attention-logit growth used (ViT-22B, Dehghani et al. 2023; Wortsman et al. 2023).
            hs = config.n_embd // config.n_head
            self.q_norm = nn.LayerNorm(hs, bias=False)
            self.k_norm = nn.LayerNorm(hs, bias=False)
        else:
            self.q_norm = self.k_norm = None

    def _sr_key(self, spec: AttentionSpec, group: int) -> RoundingKey | None:
        """The rounding key of head group `group` (0 when all heads share one spec) under a stochastic-rounding
        policy: the model's stream at (this layer, the group); None otherwise or without a stream."""
        if self.sr_stream is None or spec.policy is None or spec.policy.rounding != "sr":
            return None
        return self.sr_stream.key(self.layer, group)

    def attend(self, q, k, v):
        """(B, nh, T, hs) q, k, v → (B, nh, T, hs) attention output, heads grouped by their spec."""
        groups = _groups(self.specs)
        if len(groups) == 1:
            spec = self.specs[0]
            if spec.backend == "sdpa":
                return run_attention(spec, q, k, v, self.fallback_state)
            key = self._sr_key(spec, 0)
            # seen by an active SDPA interceptor (the monitor, `substitute`) as one call per layer, like SDPA
            return sdpa_hook.presented(q, k, v, lambda: _run(spec, q, k, v, self.fallback_state, key))
        ys, order = [], []
        for gi, (spec, heads) in enumerate(groups.items()):
            idx = torch.tensor(heads, device=q.device)
            ys.append(_run(spec, q[:, idx], k[:, idx], v[:, idx], self.fallback_state,
                           self._sr_key(spec, gi)))  # (B, len(heads), T, hs)
            order.extend(heads)
        wide = functools.reduce(torch.promote_types, [y.dtype for y in ys])  # groups' out dtypes may differ
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return torch.cat([y.to(wide) for y in ys], dim=1)[:, inverse.to(q.device)]  # (B, nh, T, hs), in head order

    def forward(self, x):
        B, T, C = x.shape  # batch, sequence, n_embd
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 × (B, T, C)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        if self.q_norm is not None:
            # every backend (sdpa, naive, reference, triton) sees the normalised q and k; under autocast
            # layer_norm computes and returns FP32, so the result goes back to v's dtype (the matmul dtype)
            q = self.q_norm(q).to(v.dtype)  # (B, nh, T, hs)
            k = self.k_norm(k).to(v.dtype)  # (B, nh, T, hs)
        if self.capture is not None:
            self.capture["out"].append(_logit_stats(q, k, self.capture["dtype"]))
        y = self.attend(q, k, v).to(x.dtype)  # (B, nh, T, hs), cast to the residual stream's dtype
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        qk = ", qk_norm" if self.q_norm is not None else ""
        return f"layer={self.layer}, n_head={self.n_head}{qk}, attention: {_describe_heads(self.specs)}"


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)  # (B, T, C) → (B, T, 4C)
        self.gelu = nn.GELU()  # exact erf GELU, as nanoGPT (GPT-2 used the tanh approximation)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)  # residual projection
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=False)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=False)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig | None = None):
        super().__init__()
        self.config = config = config if config is not None else GPTConfig()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT needs a GPTConfig (got {type(config).__name__})")
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),  # token embedding, tied to lm_head
            wpe=nn.Embedding(config.block_size, config.n_embd),  # learned position embedding
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=False),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying (GPT-2; saves 38.6M parameters)
        # the stream of stochastic rounding's keys: its step is a buffer (saved in checkpoints); the layers hold
        # a reference that is not a submodule of theirs (one stream, one state-dict entry: sr_stream.step)
        self.sr_stream = SRStream(config.sr_seed)
        shared: dict = {}
        for block in self.transformer.h:
            block.attn.fallback_state = shared
            object.__setattr__(block.attn, "sr_stream", self.sr_stream)
        self.apply(self._init_weights)
        # GPT-2: the projections that write into the residual stream are scaled by 1/sqrt(2·n_layer), since
        # every layer adds two of them to the stream.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights once); `non_embedding` leaves out the position embedding, as GPT-2's
        papers do (the token embedding is the output head too, so it stays)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None):
        """idx (B, T) int64 token ids → logits (B, T, vocab_size) and, with targets (B, T), the mean
        cross-entropy (targets of -1 are ignored); loss is None without targets."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)  # (B, T, C)
        x = self.transformer.ln_f(x)  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)  # (B, T, vocab_size), |logits| < cap
        loss = None
        if targets is not None:
            flat = logits.view(B * T, -1)  # (B·T, vocab_size)
            if flat.dtype not in (torch.float32, torch.float64):
                flat = flat.float()  # the loss of a low-precision model is still taken in FP32
            loss = F.cross_entropy(flat, targets.reshape(B * T), ignore_index=-1)
        return logits, loss

    # -- attention overrides ----------------------------------------------------------------------------
    def set_attention(self, spec_or_backend: AttentionSpec | str, policy: Precision | None = None,
                      layers=None, heads=None) -> "GPT":
        """Run `spec_or_backend` (an AttentionSpec, or a backend name plus `policy`) in `layers` (None = all;
        an int or a list of 0-based layer indices) and, within them, in `heads` (None = all heads; else a
        per-head override, 0-based). Returns the model, so calls chain."""
        if isinstance(spec_or_backend, AttentionSpec):
            if policy is not None:
                raise ValueError("pass either an AttentionSpec or a backend name with a policy, not both")
            spec = spec_or_backend
        elif isinstance(spec_or_backend, str):
            spec = AttentionSpec(spec_or_backend, policy)
        else:
            raise TypeError(f"set_attention takes an AttentionSpec or a backend name {list(BACKENDS)} "
                            f"(got {type(spec_or_backend).__name__})")
        layer_ids = _indices(layers, self.config.n_layer, "layer")
        head_ids = _indices(heads, self.config.n_head, "head")
        for i in layer_ids:
            attn = self.transformer.h[i].attn
            specs = list(attn.specs)
            for h in head_ids:
                specs[h] = spec
            attn.specs = tuple(specs)
        return self

    def attention_specs(self) -> AttentionTable:
        """The spec of every head of every layer: ``table[layer][head]``; ``print(table)`` for a summary."""
        return AttentionTable((i, block.attn.specs) for i, block in enumerate(self.transformer.h))

    def describe(self) -> str:
        """Config, parameter count and where attention is overridden — what a chapter prints above a run."""
        c = self.config
        lines = [f"GPT: {c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, context {c.block_size}, "
                 f"vocab {c.vocab_size}, {self.num_params() / 1e6:.2f}M parameters"
                 + (", QK-norm (LayerNorm of q and k per head)" if c.qk_norm else "")]
        table = self.attention_specs()
        uniform = {s for specs in table.values() for s in specs}
        if len(uniform) == 1:
            lines.append(f"attention: {next(iter(uniform))} in every head of every layer")
        else:
            lines.append("attention (overrides of the default " f"'{DEFAULT_SPEC}' marked *):")
            for layer, specs in table.items():
                mark = "*" if any(s != DEFAULT_SPEC for s in specs) else " "
                lines.append(f" {mark} layer {layer}: {_describe_heads(specs)}")
        return "\n".join(lines)


def _indices(which, n: int, what: str) -> list[int]:
    if which is None:
        return list(range(n))
    items = [which] if isinstance(which, (int, np.integer)) and not isinstance(which, bool) else which
    try:
        items = list(items)
    except TypeError:
        raise TypeError(f"{what}s must be None, an int or a list of ints (got {which!r})") from None
    if not items:
        raise ValueError(f"empty list of {what}s: pass None for all {what}s")
    out = []
    for i in items:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"{what} indices must be ints (got {i!r})")
        if not 0 <= i < n:
            raise ValueError(f"{what} index {i} out of range: the model has {n} {what}s, numbered 0..{n - 1}")
        out.append(int(i))
    if len(set(out)) != len(out):
        raise ValueError(f"repeated {what} index in {items}")
    return out


# -- diagnostics (chapters 1, 2 and 7) -------------------------------------------------------------------
@torch.no_grad()
def weight_spectral_norms(model: nn.Module) -> dict[str, float]:
    """Largest singular value of every 2-D weight (name → σ_max, computed in float32): the paper's fast
    indicator (Fig. 11). Tied weights appear once, under their first name (transformer.wte.weight)."""
    return {name: torch.linalg.matrix_norm(p.detach().float(), ord=2).item()
            for name, p in model.named_parameters() if p.ndim == 2}


@torch.no_grad()
def head_query_norms(model: GPT) -> dict[str, np.ndarray]:
    """Per layer and head, the spectral norm of the query projection W_Q^h (C × hs) and of the bilinear form
    W_Q^h W_K^hᵀ (C × C) whose entries x W_Q^h W_K^hᵀ yᵀ are the raw attention logits (before the scale α).
    Returns {"wq": (n_layer, n_head), "wqk": (n_layer, n_head)} float64 arrays (paper Fig. 3)."""
    c = model.config
    hs = c.head_size
    wq = np.zeros((c.n_layer, c.n_head))
    wqk = np.zeros((c.n_layer, c.n_head))
    for i, block in enumerate(model.transformer.h):
        w = block.attn.c_attn.weight.detach().float()  # (3C, C): rows [0, C) give q, [C, 2C) give k
        for h in range(c.n_head):
            q_h = w[h * hs:(h + 1) * hs].T  # (C, hs): x @ q_h is head h's query
            k_h = w[c.n_embd + h * hs:c.n_embd + (h + 1) * hs].T  # (C, hs)
            wq[i, h] = torch.linalg.matrix_norm(q_h, ord=2).item()
            wqk[i, h] = torch.linalg.matrix_norm(q_h @ k_h.T, ord=2).item()  # (C, C)
    return {"wq": wq, "wqk": wqk}


def _logit_stats(q, k, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Per head: the largest causal attention logit S = αQKᵀ, and the number of query rows whose maximum,
    with S rounded to `dtype`, is attained by ≥ 2 keys. One sequence at a time to bound memory."""
    with torch.no_grad():
        B, nh, T, hs = q.shape
        alpha = 1.0 / math.sqrt(hs)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # (T, T): key after query
        max_logit = torch.full((nh,), -math.inf, dtype=torch.float64, device=q.device)
        tied = torch.zeros(nh, dtype=torch.long, device=q.device)
        for b in range(B):
            s = (q[b].float() @ k[b].float().transpose(-1, -2)) * alpha  # (nh, T, T) in FP32
            s = s.to(dtype).masked_fill(future, -math.inf)  # rounded to the scores' dtype, causal
            row_max = s.amax(dim=-1, keepdim=True)  # (nh, T, 1)
            n_at_max = (s == row_max).sum(dim=-1)  # (nh, T)
            tied += (n_at_max >= 2).sum(dim=-1)
            max_logit = torch.maximum(max_logit, row_max.amax(dim=(-1, -2)).double())
        return {"max_logit": max_logit.cpu(), "tied_rows": tied.cpu(), "rows": B * T}


@dataclass
class LogitStats:
    """What `logit_capture` saw: per layer and head (arrays of shape (n_layer, n_head)) and per layer."""

    max_logit_per_head: np.ndarray  # largest causal logit αqkᵀ (in the scores' dtype) per (layer, head)
    tied_frac_per_head: np.ndarray  # fraction of query rows with ≥ 2 keys at the row maximum
    max_logit: np.ndarray  # (n_layer,) over heads
    tied_frac: np.ndarray  # (n_layer,) over all (row, head) pairs of the layer
    rows: int  # query rows per head that were examined (B·T, summed over forward calls)
    dtype: str = ""


class _Capture:
    def __init__(self, modules, dtype):
        self.modules, self.dtype = modules, dtype
        self.outs = [[] for _ in modules]

    def stats(self) -> LogitStats:
        if not all(self.outs):
            raise RuntimeError("no forward pass was run inside the logit_capture block")
        mx = np.stack([np.max(np.stack([o["max_logit"].numpy() for o in outs]), axis=0) for outs in self.outs])
        tied = np.stack([np.sum(np.stack([o["tied_rows"].numpy() for o in outs]), axis=0) for outs in self.outs])
        rows = sum(o["rows"] for o in self.outs[0])
        frac = tied / rows
        return LogitStats(mx, frac, mx.max(axis=1), frac.mean(axis=1), rows, str(self.dtype).replace("torch.", ""))


@contextmanager
def logit_capture(model: GPT, dtype: torch.dtype = torch.bfloat16):
    """Inside this block every forward pass of `model` also records, per layer and head, the largest
    attention logit and the count of query rows with tied maxima (scores rounded to `dtype`), computed from
    the layer's q and k without touching the forward result. Use it around a training step::

        with logit_capture(model) as cap:
            logits, loss = model(x, y)
        stats = cap.stats()
    """
    modules = [block.attn for block in model.transformer.h]
    cap = _Capture(modules, dtype)
    for m, out in zip(modules, cap.outs):
        m.capture = {"dtype": dtype, "out": out}
    try:
        yield cap
    finally:
        for m in modules:
            m.capture = None


def capture_attention_logits(model: GPT, idx, dtype: torch.dtype = torch.bfloat16) -> LogitStats:
    """One no-grad forward pass of `idx` (B, T); returns its `LogitStats` (paper Fig. 13: tied maxima)."""
    with torch.no_grad(), logit_capture(model, dtype) as cap:
        model(idx)
    return cap.stats()
