"""Chapter 7's computations ("Diagnose your own model"): a small CPU training run watched by `lpfail.monitor`,
the same run without it, and per-layer substitutions with `lpfail.substitute`. The chapter calls these and
plots what they return; the numbers come from running them (seconds on a CPU)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

from lpfail import data as lpdata
from lpfail.model import GPT, GPTConfig
from lpfail.monitor import Monitor, MonitorWarning, Thresholds
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


def train_run(lr: float, steps: int = 300, monitored: bool = True, every: int = 10, window: int = 50,
              seed: int = 0, batch: int = 16, block: int = 64, thresholds: Thresholds = Thresholds(),
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


def series(records: list[dict], stat: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values (n_records, n_layer, n_head)) of one monitored statistic, over the records that have it."""
    rs = [r for r in records if stat in r]
    return np.array([r["step"] for r in rs]), np.array([r[stat] for r in rs], dtype=np.float64)


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


def monitor_figure(runs: dict):
    """Two rows of panels: the largest attention logit (max over heads) and the fraction of query rows with a
    tied BF16 maximum (max over heads), per layer, against the step, for each run in `runs` {label: run}."""
    import matplotlib.pyplot as plt

    from lpfail.book import plots

    fig, axes = plt.subplots(1, 3, figsize=(10.2, 3.4))
    styles = ["-", "--", ":"]
    # the runs are not variants (both are FP32 SDPA): shades of the sequential series map, never a variant colour
    for (label, run), color in zip(runs.items(), plots.series_colors(max(len(runs), 2))[::-1]):
        st, ml = series(run["records"], "max_logit")
        _, tf = series(run["records"], "tied_frac")
        for layer in range(ml.shape[1]):
            kw = dict(color=color, ls=styles[layer % 3], label=f"{label}, layer {layer}")
            axes[0].plot(st, ml[:, layer].max(axis=1), **kw)
            axes[1].plot(st, tf[:, layer].max(axis=1), **kw)
        axes[2].plot(np.arange(len(run["losses"])), run["losses"], color=color, label=label, lw=0.8)
    axes[0].set(xlabel="step", ylabel="max attention logit", title="largest logit")
    axes[1].set(xlabel="step", ylabel="fraction of rows", title="tied BF16 row maximum")
    axes[2].set(xlabel="step", ylabel="training loss (nats/byte)", title="loss")
    axes[0].legend()
    axes[2].legend()
    fig.tight_layout()
    return fig


# -- the monitor's overhead, as measured on a GPU (tools/gpu_monitor_overhead.py) ----------------------------
OVERHEAD_FILE = "kernels_gpu/monitor_overhead.json"  # beside the other GPU files: not an experiment of the cache
#: When the measurement of 2026-12-01 was taken, and on what code (its json predates the tool's "when" and
#: "git" fields; from results/gpu_calls/20261201T0749/README.md). A json that has "when" is described by it.
OVERHEAD_PROVENANCE = {"when": "2026-12-01", "tree": "23f8cd9", "monitor": "before the hot-path fix"}


def overhead_lines(res: dict, provenance: dict | None = None) -> list[str]:
    """Plain-text lines (≤ 76 characters) for a stored monitor-overhead measurement: device, the median
    overhead of unsampled steps and the mean over whole intervals, the 2 % target, and whether the losses
    were bit-identical (and, where measured, whether two plain runs were: the noise floor)."""
    from lpfail.book.text import wrap

    prov = {"when": res["when"], "monitor": f"git {res['git'][:12]}" if res.get("git") else None} \
        if res.get("when") else (provenance or {})
    med = res.get("overhead_pct_median_unsampled", res.get("overhead_pct_median"))
    lines = [f"{res['device']}, {prov.get('when', '?')}, {res['model']}, {res['steps']} steps"
             + (f"; monitor code: {prov['monitor']}" if prov.get("monitor") else ""),
             f"median step overhead: {med:+.1f} %; mean over the run: {res['overhead_pct_mean']:+.1f} % "
             f"(target ≤ 2 %: {'met' if res['overhead_pct_mean'] <= 2.0 else 'missed'})",
             f"mean step time: monitored {res['mean_monitored_s']:.3f} s, plain "
             + ", ".join(f"{t:.3f}" for t in res["mean_plain_s"]) + " s",
             f"losses bit-identical with and without the monitor: {res['losses_identical']} "
             f"(max difference {res['max_loss_diff']:.2g})"]
    if "plain_runs_identical" in res:
        lines.append(f"two plain runs bit-identical (the noise floor): {res['plain_runs_identical']} "
                     f"(max difference {res['max_loss_diff_plain_plain']:.2g})")
    else:
        lines.append("two plain runs were not compared: a non-deterministic kernel and the monitor cannot "
                     "be told apart in this measurement")
    return [wrap(x) for x in lines]


#: The same measurement at the interval that was the default until 2026-12-01 (every=10, window=50).
OVERHEAD_EVERY10_FILE = "kernels_gpu/monitor_overhead_every10.json"


def load_overhead(name: str = OVERHEAD_FILE) -> dict | None:
    """A stored measurement (default: results/kernels_gpu/monitor_overhead.json, the monitor at its default
    interval), or None when there is none; ValueError when the file is not valid JSON."""
    import json

    from lpfail import results

    p = results.results_dir() / name
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is corrupt: {e}") from None


def breakdown_lines(res: dict) -> list[str]:
    """Where a sampled step's extra time went (`sampled_step_breakdown_s`, medians, synchronised around each
    part), in ms, as plain-text lines (≤ 76 characters); [] for a measurement without a breakdown."""
    from lpfail.book.text import wrap

    b = res.get("sampled_step_breakdown_s")
    if not b:
        return []
    ms = lambda k: f"{1e3 * b[k]:.1f} ms"  # noqa: E731
    parts = [f"forward {ms('forward_sampled')} sampled vs {ms('forward_plain')} plain"]
    parts += [f"{label} {ms(k)}" for k, label in (("qk_norms", "norms"), ("to_host", "copy to host"),
                                                  ("entropy_host", "update eigenvalues (host)")) if k in b]
    return [wrap("a sampled step's parts: " + "; ".join(parts))]
