"""A user's benchmark: GPT-2 small's training step with SDPA's default back end and with the drop-in in its place
(``python -m lpfail bench step``; GPU), eager and under ``torch.compile``, tokens/s side by side in one run.

Every method trains its own copy of the same model (same initialisation, same batches, fused AdamW, BF16 autocast)
with ``torch.nn.functional.scaled_dot_product_attention`` replaced, for that model's steps only, by the drop-in with
the method's ``fix`` and backward (`METHODS`): what a user does who swaps SDPA for ``lpfail.flash_attention``. The
methods are timed in interleaved rounds (each round runs every method's `steps_per_round` steps, the order rotating
from round to round), so that clock and thermal drift fall on all of them; a method's speed against SDPA is the
median over rounds of the ratio of its tokens/s to SDPA's in the same round. Before timing, each method's loss on the
first batch is compared with SDPA's (same weights): the drop-in must compute the same model.

The targets (`STEP_TARGETS`): the drop-in with the robust fix at ≥ 0.98× SDPA's tokens/s, eager and compiled.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from dataclasses import dataclass

import numpy as np

from lpfail.results import experiment

#: method → the drop-in's keywords (None: SDPA itself, the baseline). "dqa": the five-matmul backward
#: (`Tuning(bwd="dq_atomic")` on the default tuning's other levers), not deterministic.
METHODS = {"sdpa": None, "dropin": {"fix": None}, "dropin_robust": {"fix": "robust"},
           "dropin_dqa": {"fix": None, "bwd": "dq_atomic"}, "dropin_dqa_robust": {"fix": "robust", "bwd": "dq_atomic"}}
#: (method, mode, bound): tokens/s against SDPA's at least `bound`
STEP_TARGETS = (("dropin_robust", "eager", 0.98), ("dropin_robust", "compiled", 0.98))


@dataclass(frozen=True)
class BenchStepConfig:
    """GPT-2 small (12 × 12 × 768, context 1024) at batch 16: 16 × 1,024 tokens per step."""
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50304
    batch: int = 16
    methods: tuple = tuple(METHODS)
    modes: tuple = ("eager", "compiled")
    rounds: int = 8
    steps_per_round: int = 4
    warmup: int = 3                # steps per method and mode before timing (compilation happens here)
    lr: float = 6e-4
    device: str = "cuda"
    compile_backend: str = "inductor"
    time_budget_s: float = 400.0   # stop timing (leaving NaN) after this long, so that a device call ends in time

    def __post_init__(self):
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or "sdpa" not in self.methods:
            raise ValueError(f"BenchStepConfig.methods must include 'sdpa' and name only {list(METHODS)} "
                             f"(got {list(self.methods)})")
        bad = [m for m in self.modes if m not in ("eager", "compiled")]
        if bad or not self.modes:
            raise ValueError(f"BenchStepConfig.modes: 'eager' and/or 'compiled' (got {list(self.modes)})")
        for nm in ("rounds", "steps_per_round", "batch"):
            if getattr(self, nm) < 1:
                raise ValueError(f"BenchStepConfig.{nm} must be ≥ 1 (got {getattr(self, nm)})")


def dropin_for(method: str):
    """The SDPA-signature function a method puts in SDPA's place (None for SDPA itself)."""
    kw = METHODS[method]
    if kw is None:
        return None
    import functools

    from lpfail import kernels

    tuning = (dataclasses.replace(kernels.DEFAULT_TUNING, bwd=kw["bwd"]) if "bwd" in kw else None)
    return functools.partial(kernels.flash_attention, fix=kw["fix"], tuning=tuning)


@contextlib.contextmanager
def sdpa_replaced(fn):
    """``torch.nn.functional.scaled_dot_product_attention`` is `fn` inside (unchanged where `fn` is None); restored
    on the way out, whatever happens."""
    import torch.nn.functional as F

    if fn is None:
        yield
        return
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = fn
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _allow_recompiles(n):
    """Raise dynamo's recompile limit to at least `n` (an int), or restore the limits `n` (a dict) returned by an
    earlier call; returns the limits before."""
    import torch._dynamo as dynamo

    names = [nm for nm in ("recompile_limit", "cache_size_limit") if hasattr(dynamo.config, nm)]
    before = {nm: getattr(dynamo.config, nm) for nm in names}
    for nm in names:
        setattr(dynamo.config, nm, n[nm] if isinstance(n, dict) else max(before[nm], n))
    return before


def _sync(device: str):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class _Trainer:
    """One method's model, optimizer and (for "compiled") compiled forward, advanced a step at a time on a fixed
    cycle of batches, under its own replacement of SDPA."""

    def __init__(self, cfg: BenchStepConfig, attention, batches):
        import torch

        from lpfail.model import GPT, GPTConfig

        torch.manual_seed(0)
        self.cfg, self.attention, self.batches, self.i = cfg, attention, batches, 0
        gcfg = GPTConfig(block_size=cfg.block_size, vocab_size=cfg.vocab_size, n_layer=cfg.n_layer,
                         n_head=cfg.n_head, n_embd=cfg.n_embd)
        self.model = GPT(gcfg).to(cfg.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                     **({"fused": True} if cfg.device == "cuda" else {}))
        self.compiled, self.failed = None, False

    def forward(self, mode: str):
        import torch

        if mode == "compiled" and self.compiled is None:
            self.compiled = torch.compile(self.model, backend=self.cfg.compile_backend)
        return self.compiled if mode == "compiled" else self.model

    def loss(self, idx, mode: str = "eager"):
        import torch

        with sdpa_replaced(self.attention), torch.autocast(self.cfg.device, dtype=torch.bfloat16):
            return self.forward(mode)(idx[:, :-1], idx[:, 1:])[1]

    def step(self, mode: str) -> None:
        idx = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.loss(idx, mode).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def bench_step(cfg: BenchStepConfig, attention: dict | None = None) -> dict:
    """Tokens/s per (mode, method, round), SDPA's in the same round beside it, the step-0 loss check and each
    method's warm-up (compile) time. `attention`: method → SDPA-signature function (None: SDPA), by default
    `dropin_for` of each method (a test passes stand-ins)."""
    import torch

    attention = attention if attention is not None else {m: dropin_for(m) for m in cfg.methods}
    methods = tuple(attention)
    g = torch.Generator(device=cfg.device).manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.block_size + 1), device=cfg.device, generator=g)
               for _ in range(4)]
    tokens = cfg.batch * cfg.block_size
    shape = (len(cfg.modes), len(methods), cfg.rounds)
    tps = np.full(shape, np.nan)
    warm_s = np.full((len(cfg.modes), len(methods)), np.nan)
    errors = []
    trainers = {m: _Trainer(cfg, attention[m], batches) for m in methods}
    limits = _allow_recompiles(4 * len(methods))   # one compiled graph per method: each guards on its SDPA
    with torch.no_grad():   # the same model before any step: the drop-in computes what SDPA computes
        loss0 = {m: float(t.loss(batches[0])) for m, t in trainers.items()}
    t0 = time.time()
    for a, mode in enumerate(cfg.modes):
        for j, m in enumerate(methods):
            start = time.perf_counter()
            try:
                for _ in range(cfg.warmup):
                    trainers[m].step(mode)
                _sync(cfg.device)
            except Exception as e:   # a method that cannot run here: said, the others go on
                errors.append(f"{m} {mode} warm-up: {type(e).__name__}: {str(e)[:300]}")
                trainers[m].failed = True
                continue
            warm_s[a, j] = time.perf_counter() - start
        for r in range(cfg.rounds):
            if time.time() - t0 > cfg.time_budget_s:
                errors.append(f"time budget: {mode} rounds {r}–{cfg.rounds - 1} not measured")
                break
            order = methods[r % len(methods):] + methods[:r % len(methods)]   # rotate who goes first
            for m in order:
                if trainers[m].failed:
                    continue
                _sync(cfg.device)
                start = time.perf_counter()
                for _ in range(cfg.steps_per_round):
                    trainers[m].step(mode)
                _sync(cfg.device)
                tps[a, methods.index(m), r] = tokens * cfg.steps_per_round / (time.perf_counter() - start)
        print(f"[{time.time() - t0:6.1f}s] {mode}: " + "  ".join(
            f"{m} {np.nanmedian(tps[a, j]) if np.isfinite(tps[a, j]).any() else float('nan'):,.0f} tok/s"
            for j, m in enumerate(methods)), flush=True)
    _allow_recompiles(limits)
    return {"tokens_per_s": tps, "warmup_s": warm_s, "methods": np.array(methods), "modes": np.array(cfg.modes),
            "loss_step0": np.array([loss0[m] for m in methods]), "tokens_per_step": tokens,
            "errors": "\n".join(errors)}


@experiment("bench_step", config=BenchStepConfig, gpu=True,
            description="GPT-2 small's training step with SDPA and with the drop-in in its place, tokens/s (GPU)")
def bench_step_experiment(cfg: BenchStepConfig) -> dict:
    return bench_step(cfg)


def ratios(res) -> dict[tuple[str, str], dict]:
    """(method, mode) → the median over rounds of tokens/s against SDPA's in the same round, its range, and the
    median tokens/s; SDPA's own row has ratio 1."""
    tps, methods, modes = np.asarray(res["tokens_per_s"]), [str(m) for m in res["methods"]], [str(m) for m in
                                                                                               res["modes"]]
    base = methods.index("sdpa")
    out = {}
    for a, mode in enumerate(modes):
        for j, m in enumerate(methods):
            r = tps[a, j] / tps[a, base]
            r = r[np.isfinite(r)]
            tj = tps[a, j][np.isfinite(tps[a, j])]
            out[(m, mode)] = {"ratio": float(np.median(r)) if r.size else float("nan"),
                              "range": (float(r.min()), float(r.max())) if r.size else None,
                              "tokens_per_s": float(statistics.median(tj)) if tj.size else float("nan"),
                              "rounds": int(r.size)}
    return out


def step_targets(res) -> list[dict]:
    """Each `STEP_TARGETS` row: its measured ratio and whether it is met (None where not measured)."""
    rs = ratios(res)
    out = []
    for m, mode, bound in STEP_TARGETS:
        x = rs.get((m, mode), {}).get("ratio", float("nan"))
        out.append({"method": m, "mode": mode, "bound": bound, "ratio": x,
                    "met": None if not np.isfinite(x) else bool(x >= bound)})
    return out


def step_markdown(res, names: dict | None = None) -> str:
    """One table: per method, tokens/s and the ratio to SDPA (median over rounds, [range]) in each mode; `names`:
    method → the words shown for it (default: its name as code)."""
    from lpfail.book.text import md_table

    rs, modes = ratios(res), [str(m) for m in res["modes"]]
    rows = []
    for j, m in enumerate(str(x) for x in res["methods"]):
        cells = [names[m] if names and m in names else f"`{m}`"]
        for mode in modes:
            d = rs[(m, mode)]
            cells += (["not measured", ""] if not np.isfinite(d["tokens_per_s"]) else
                      [f"{d['tokens_per_s']:,.0f}", f"{d['ratio']:.3f}× [{d['range'][0]:.3f}, {d['range'][1]:.3f}]"])
        rows.append(cells)
    head = ["method"] + [h for mode in modes for h in (f"{mode}: tokens/s", f"{mode}: ÷ SDPA")]
    return md_table(head, rows)
