"""Where the training loop's time goes (appendix A): GPT-2 small's tokens/s under variants of the loop's
numerics settings (deterministic mode, loss implementation), each in its own process. Experiment
``train_speed``: ``python -m lpfail run train_speed``."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lpfail import results
from lpfail.experiments.train_ddp import _speed_cfg
from lpfail.train import read_log


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
