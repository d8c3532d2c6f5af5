"""Chapter 7's demonstration, stored: a small GPT trained on a CPU at a healthy and at a high learning rate, watched
by `lpfail.monitor`, the high-rate run again without the monitor, and its attention substituted layer by layer.

At the high learning rate training is chaotic: a difference in the last bit of one reduction (another thread count,
instruction set or BLAS path) grows into a different run within the 150 steps. So the chapter does not train live;
it reads this experiment's stored result (`python -m lpfail run monitor_demo` trains the runs again, about two
minutes on a CPU, under lpfail's pinned CPU numerics). What the chapter states from it is what survives such a
change (`headline`): the monitor leaves training bit for bit unchanged, its logit alert fires in the high-rate run
and not in the healthy one, and FP32 attention substituted for SDPA changes the loss only by rounding.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from lpfail import data as lpdata
from lpfail.model import GPT, GPTConfig
from lpfail.monitor import Alert, Monitor, MonitorWarning, Thresholds
from lpfail.precision import FA2_BF16, FP32, PAPER_BF16
from lpfail.results import experiment
from lpfail.substitute import substitute

def corpus_batches(steps: int, batch: int, block: int, seed: int, corpus: str = "pydocs"):
    """`steps` batches (x, y) of byte tokens from an embedded corpus, drawn with a seeded generator."""
    tok = lpdata.get_tokenizer("bytes")
    ids = torch.from_numpy(np.asarray(lpdata.tokens(corpus, tok), dtype=np.int64))
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, len(ids) - block - 1, (batch,), generator=g)
        rows = torch.stack([ids[s:s + block + 1] for s in start.tolist()])  # (batch, block + 1)
        yield rows[:, :-1], rows[:, 1:]


def tiny_gpt(seed: int = 0, n_layer: int = 2, n_head: int = 4, n_embd: int = 64, block: int = 64) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=block, vocab_size=256, n_layer=n_layer, n_head=n_head, n_embd=n_embd))


#: The thresholds the stored demonstration runs with (chapter 7 quotes its alerts): `Thresholds()`'s logit
#: threshold and a tied fraction of 0.01 (`Thresholds()` has 0.25).
DEMO_THRESHOLDS = Thresholds(max_logit=30.0, tied_frac=0.01)


def train_run(lr: float, steps: int = 300, monitored: bool = True, every: int = 10, window: int = 50,
              seed: int = 0, batch: int = 16, block: int = 64, thresholds: Thresholds = DEMO_THRESHOLDS,
              **shape) -> dict:
    """AdamW (β₂ = 0.95, no weight decay, constant lr after 20 warm-up steps) on the bytes of the Python
    docs corpus, FP32 model with SDPA attention. Returns {"losses", "records", "alerts", "model"}; with
    `monitored` the run is watched by a `Monitor` (warnings collected in "alerts", not printed)."""
    model = tiny_gpt(seed, block=block, **shape)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    mon = Monitor(model, every=every, window=window, thresholds=thresholds) if monitored else None
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        if mon is not None:
            mon.attach()
        try:
            for x, y in corpus_batches(steps, batch, block, seed):
                _, loss = model(x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                losses.append(loss.item())
                if mon is not None:
                    mon.step(loss=losses[-1])
        finally:
            if mon is not None:
                mon.detach()
    return {"losses": np.array(losses), "records": mon.records if mon else [], "alerts": mon.alerts if mon else [],
            "model": model}


def substitution_losses(model: GPT, policies: dict, seed: int = 123, batch: int = 16, block: int = 64) -> dict:
    """Loss on one held batch with the model's own attention ("sdpa") and with each policy substituted in each
    layer alone and in all layers: {(policy name, layer or "all"): loss}."""
    (x, y), = list(corpus_batches(1, batch, block, seed))
    out = {}
    with torch.no_grad():
        out[("sdpa", "all")] = model(x, y)[1].item()
        for name, policy in policies.items():
            for layer in [*range(model.config.n_layer), "all"]:
                with substitute(model, policy, layers=None if layer == "all" else [layer]):
                    out[(name, layer)] = model(x, y)[1].item()
    return out


#: The attention policies substituted for SDPA, by the names the chapter prints.
SUBSTITUTIONS = {"FP32": FP32, "FA2_BF16": FA2_BF16, "PAPER_BF16": PAPER_BF16}


@dataclass(frozen=True)
class MonitorDemoConfig:
    lrs: tuple[float, ...] = (1e-3, 3e-2)   # a healthy rate and one where chapter 1's proxy degrades
    steps: int = 150
    batch: int = 8
    seed: int = 0
    every: int = 10                         # the monitor's sampling interval
    sub_seed: int = 123                     # the held batch of the substitution table
    sub_batch: int = 16


def label(lr: float) -> str:
    return f"lr {lr:g}"


def check(cfg: MonitorDemoConfig) -> MonitorDemoConfig:
    """The cheaper config on which the headline is compared across CPU settings: 60 steps (the logit alert of the
    high-rate run fires by step 30)."""
    return dataclasses.replace(cfg, steps=60)


@experiment("monitor_demo", config=MonitorDemoConfig, gpu=False, headline=lambda res: headline(res), check=check,
            description="chapter 7's demonstration: the monitor on a CPU run at two learning rates, substitution (CPU)")
def monitor_demo(cfg: MonitorDemoConfig) -> dict:
    """Train one run per learning rate with the monitor, the last rate again without it, and substitute each policy
    of `SUBSTITUTIONS` into each layer of the last run's model.

    Keys: ``lrs``; ``losses`` (rate, step); ``monitor_invisible`` (the unmonitored run's losses equal the monitored
    one's bit for bit); ``records`` and ``alerts`` {label: [record or alert as a dict]} (the monitor's records and
    alerts); ``substitution`` [{"policy", "layer", "loss"}] with policy "sdpa" for the model's own attention."""
    runs = {label(lr): train_run(lr, steps=cfg.steps, batch=cfg.batch, seed=cfg.seed, every=cfg.every)
            for lr in cfg.lrs}
    top = cfg.lrs[-1]
    plain = train_run(top, steps=cfg.steps, batch=cfg.batch, seed=cfg.seed, every=cfg.every, monitored=False)
    losses = substitution_losses(runs[label(top)]["model"], SUBSTITUTIONS, seed=cfg.sub_seed, batch=cfg.sub_batch)
    return {"lrs": np.array(cfg.lrs, dtype=np.float64),
            "losses": np.stack([r["losses"] for r in runs.values()]),
            "monitor_invisible": bool(np.array_equal(plain["losses"], runs[label(top)]["losses"])),
            "records": {k: r["records"] for k, r in runs.items()},
            "alerts": {k: [dataclasses.asdict(a) for a in r["alerts"]] for k, r in runs.items()},
            "substitution": [{"policy": p, "layer": layer, "loss": v} for (p, layer), v in losses.items()]}


def demo_runs(res) -> dict:
    """The stored runs as {label: {"losses", "records", "alerts"}}, alerts as `Alert`s (what `train_run` returns,
    without the model)."""
    return {label(lr): {"losses": res["losses"][i], "records": res["records"][label(lr)],
                        "alerts": [Alert(**a) for a in res["alerts"][label(lr)]]}
            for i, lr in enumerate(res["lrs"].tolist())}


def stored_substitution(res) -> dict:
    """The stored substitution table as {(policy, layer or "all"): loss} (what `substitution_losses` returns)."""
    return {(r["policy"], r["layer"]): r["loss"] for r in res["substitution"]}


def headline(res, threshold: float | None = None) -> dict:
    """What the chapter states from the demonstration, at the resolution that does not depend on the machine: the
    monitor leaves training unchanged; per run, whether the logit alert fired; the largest change of the loss
    when FP32 attention replaces SDPA, as an order of magnitude."""
    threshold = Thresholds().max_logit if threshold is None else threshold
    runs = demo_runs(res)
    sub = stored_substitution(res)
    base = sub[("sdpa", "all")]
    fp32 = max(abs(v - base) for (p, _), v in sub.items() if p == "FP32")
    return {"monitor_invisible": bool(res["monitor_invisible"]),
            **{f"logit_alert {k}": any(a.stat == "max_logit" for a in r["alerts"]) for k, r in runs.items()},
            "fp32_substitution_below_1e-4": bool(fp32 < 1e-4)}
