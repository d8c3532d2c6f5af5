"""The stored GPU check of the training loop (appendix A): a small model trained on 1 GPU and with torchrun on
N GPUs over the same global batch order, determinism on 1 GPU, and GPT-2 small's tokens/s per attention
implementation. Experiment ``train_ddp``: ``python -m lpfail run train_ddp`` (``tools/gpu_batch.sh train-ddp`` on two GPUs)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lpfail import results
from lpfail.train import TrainConfig, read_diag, read_log, read_status, train


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
