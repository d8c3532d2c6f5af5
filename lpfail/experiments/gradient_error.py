"""Chapter 3 ("The gradient error"): the paper's Eq. 1–3 checked line by line on captured tensors.

`lpfail.gradient_error.derivation_check` computes, for one attention layer and batch, Δδ = δ_lp − δ_hp,
the two sides of Eq. 1 (dQ) and Eq. 2 (dW_Q) — the formula, and autograd's gradients with the exact and with
the low-precision δ — Eq. 3's approximation, and the δ channel's share of the policy's whole dW_Q error.
This module runs it on

* ``cpu`` (the stored result, `GradientErrorConfig`): synthetic large-logit inputs (`synthetic_inputs`) and a
  small model trained here on the CPU under A's attention (``reference(PAPER_BF16)``), at several checkpoints,
  every layer, on the batch the run consumed at that step (its recorded batch order);
* ``gpu`` (`check_run`, tools/gpu_gradient_error.sh): lr_sweep's A at lr 3.2e-2, seed 0, retrained
  with a checkpoint every 100 steps, at ≥ 3 steps and every layer, the same function; a small JSON to $OUT.

Checked: Eq. 1 and 2 must match autograd to `lpfail.gradient_error.TOL` (relative); that is the test of the
derivation. Measured, not checked: Eq. 3's error, the cosine of the rank-one terms, the sign of ΣΔδ, and the
share of A's error the δ channel carries.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lpfail import results
from lpfail.gradient_error import TOL, capture_layer, delta_terms, derivation_check, synthetic_inputs, \
    tail_slopes
from lpfail.precision import Precision
from lpfail.sweep.store import part_files, part_name, read_part

_SCALARS = ("eq1_rel_err", "eq2_rel_err", "eq3_rel_err", "eq3_cos_mean", "share_cos", "share_norm", "sum_dd",
            "frac_dd_pos", "dd_abs_mean", "dw_err_norm", "sum_dd_tied", "sum_dd_untied", "frac_tied")
_SKETCHES = ("sketch_rbar", "sketch_dterm")  # per head, SKETCH_DIM numbers: GPU records only (cross-step cosines)


@dataclass(frozen=True)
class GradientErrorConfig:
    """The CPU result: synthetic inputs (seeds × logit scales) and a small CPU-trained model under A."""

    synthetic_seeds: tuple[int, ...] = (0, 1, 2)
    logit_scales: tuple[float, ...] = (0.5, 2.0)  # max logits ≈ tens and ≈ hundreds
    synthetic_shape: tuple[int, int, int, int] = (2, 128, 64, 2)  # B, T, C, heads
    # the CPU-trained model (autocast off on the CPU: q, k, v reach the attention in FP32, A casts them)
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    block_size: int = 64
    batch_size: int = 8
    lr: float = 3e-2
    max_steps: int = 60
    steps: tuple[int, ...] = (15, 30, 45)  # checkpoints checked, each on the batch its step consumed
    # (a checkpoint at step s holds the weights before step s; s < max_steps so that step s has a batch)
    attention: str = "reference(PAPER_BF16)"
    policy: str = "PAPER_BF16"
    seed: int = 0
    # the GPU records of `tools/gpu_batch.sh ge-extras` (A's checkpoints), merged in when the file exists under the
    # results directory; rerun `python -m lpfail run gradient_error` after copying it there
    gpu_file: str = "substitution_gpu/gradient_error_gpu.json"
    # chapter 3's item 3 (`accumulation_run`, the ``accumulate`` command of `tools/gpu_batch.sh ge-extras`):
    # merged in as "accumulation" when the file exists
    acc_file: str = "substitution_gpu/accumulation.json"


def _summary(r: dict) -> dict:
    return {k: [float(x) for x in r[k]] for k in _SCALARS} | {"max_logit": r["max_logit"]}


def check_run(run_dir, steps, layers=None, rows: int | None = None, policy: Precision | str = "PAPER_BF16",
              input_dtype=torch.bfloat16, device="cpu", log=print) -> list[dict]:
    """`derivation_check` at each checkpoint ``step`` of a run, for each layer, on the batch the run consumed
    at that step (its recorded order; the first `rows` sequences). Returns one record per (step, layer)."""
    from lpfail.model import GPT
    from lpfail.train import (step_rows, checkpoint_path, load_batch_record, load_checkpoint, load_config,
                              load_tokens, split_validation)

    policy = Precision.parse(policy) if isinstance(policy, str) else policy
    if torch.device(device).type == "cuda":  # the reference needs true FP32 matmuls (no TF32), as in training
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.json")
    bad = [s for s in steps if not 0 <= int(s) < cfg.max_steps]
    if bad:
        raise ValueError(f"check_run: steps {bad} outside 0..{cfg.max_steps - 1}: a checkpoint at step s is checked "
                         "on the batch step s consumed")
    tokens, _, n_vocab = load_tokens(cfg)
    tokens, _ = split_validation(tokens, cfg)
    order = load_batch_record(run_dir)
    out = []
    for step in steps:
        ck = load_checkpoint(checkpoint_path(run_dir, step))
        vocab = cfg.vocab_size or -(-n_vocab // 64) * 64
        model = GPT(cfg.gpt_config(vocab))
        model.load_state_dict(ck["model"])
        for layers_, heads_, spec in cfg.attention_table():
            model.set_attention(spec, layers=layers_, heads=heads_)
        model.to(device)
        offs = order.offsets(step)[: rows or None]
        x, y = step_rows(tokens, offs, cfg.block_size)
        x, y = x.to(device), y.to(device)
        amp = (torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
               if cfg.autocast == "bf16" else torch.autocast(device_type="cpu", enabled=False))
        for layer in (range(cfg.n_layer) if layers is None else layers):
            with amp:
                cap = capture_layer(model, x, y, layer)
            r = derivation_check(cap["x"].cpu(), cap["w_q"].cpu(), cap["w_k"].cpu(), cap["w_v"].cpu(),
                                 cap["do"].cpu(), policy, n_head=cap["n_head"], input_dtype=input_dtype,
                                 qkv=tuple(a.cpu() for a in cap["qkv"]))
            rec = {"step": int(step), "layer": int(layer), "loss": cap["loss"], **_summary(r),
                   **{k: [[round(x, 6) for x in v] for v in r[k]] for k in _SKETCHES},
                   "dd_rows": r["dd"].sum(dim=(0, 1)).tolist()}  # Σ over batch and heads of Δδ per position
            out.append(rec)
            log(f"gradient_error: step {step} layer {layer}: eq1 {max(rec['eq1_rel_err']):.1e} eq2 "
                f"{max(rec['eq2_rel_err']):.1e} share_cos {np.round(rec['share_cos'], 2).tolist()} "
                f"ΣΔδ {np.round(rec['sum_dd'], 4).tolist()}")
    return out


def train_cpu_model(c: GradientErrorConfig, out_dir) -> Path:
    """The small CPU run the CPU result checks (checkpoints at `c.steps`, all kept)."""
    from lpfail.train import TrainConfig, train

    step = int(np.gcd.reduce(np.array(c.steps)))
    tc = TrainConfig(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.block_size,
                     batch_size=c.batch_size, lr=c.lr, min_lr=c.lr / 10, warmup=c.max_steps // 10,
                     schedule="cosine", max_steps=c.max_steps, attention=c.attention, autocast="none",
                     device="cpu", init_seed=c.seed, data_seed=c.seed, diag_every=0, checkpoint_every=step,
                     keep_checkpoints=0, out_dir=str(out_dir))
    train(tc)
    return Path(out_dir)


def headline(res) -> dict:
    """What chapter 3 and its lab page state from the CPU part of a `gradient_error` result that does not depend on
    the machine: Eq. 1–2 match autograd within the tolerance (``passed``, the only CPU input of verdict C2), the
    number of cases (``ge_n``), the tolerance (``ge_tol``), and that the largest relative error is below 1e-12,
    i.e. float64 rounding (``max_rel_err_below_1e-12``).

    Not in it, although the pages print them, because they depend on the machine (measured 2026-12-04 on the
    default config, pinned vs one thread, AVX-512 ATen, oneDNN ALL and the one-ulp nudge):

    * the largest relative error itself (``ge_max_err``, ``.1e``: 2.6e-14 vs 1.8e-13): a float64 rounding error,
      it moves with any change of summation order, on the synthetic tensors too;
    * everything read off the small CPU-trained model (``ge_cos_range``: −0.26 to +1.00 vs −0.63 to +1.00;
      ``ge_pos``; the lab page's table rows): at lr 3e-2 its 60 steps of training are chaotic, so the checkpoints
      differ between the settings. The nudge alone or one thread alone is enough: the loss at step 45 reads 3.258
      pinned, 3.388 nudged, 3.260 on one thread, 3.337 under the second setting (max logit at step 45, layer 0:
      170, 213, 211, 204).

    The records of A's GPU checkpoints (``gpu``, ``accumulation``) are read from files, not computed here."""
    return {"passed": bool(res["passed"]), "ge_tol": f"{float(res['tol']):g}",
            "ge_n": f"{len(res['synthetic']) + len(res['model'])}",
            "max_rel_err_below_1e-12": bool(float(res["max_rel_err"]) < 1e-12)}


@results.experiment("gradient_error", config=GradientErrorConfig, headline=headline,
                    description="Eq. 1–3 of the paper checked against autograd on captured tensors (chapter 3; CPU)")
def gradient_error(c: GradientErrorConfig) -> dict:
    import tempfile

    policy = Precision.parse(c.policy)
    b, t, ch, nh = c.synthetic_shape
    synth = []
    for scale in c.logit_scales:
        for seed in c.synthetic_seeds:
            inp = synthetic_inputs(b=b, t=t, c=ch, n_head=nh, logit_scale=scale, seed=seed)
            r = derivation_check(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"], policy, n_head=nh)
            synth.append({"logit_scale": scale, "seed": seed, **_summary(r)})
    with tempfile.TemporaryDirectory() as d:
        run = train_cpu_model(c, Path(d) / "run")
        model_recs = check_run(run, c.steps, policy=policy, input_dtype=torch.float32, log=lambda *_: None)
    every = [x for rec in synth + model_recs for k in ("eq1_rel_err", "eq2_rel_err") for x in rec[k]]
    out = {"tol": TOL, "synthetic": synth, "model": model_recs, "max_rel_err": float(max(every)),
           "passed": bool(max(every) <= TOL)}
    gpu = results.results_dir() / c.gpu_file
    if gpu.is_file():
        try:
            g = json.loads(gpu.read_text())
            if not isinstance(g.get("records"), list) or "passed" not in g:
                raise ValueError("no records")
        except (ValueError, AttributeError) as e:
            raise results.ResultCorrupt(f"{gpu} is not a gradient_error GPU record file ({e}); copy "
                                        "gradient_error_gpu.json from `tools/gpu_batch.sh ge-extras` again") from None
        out["gpu"] = g
        out["gpu_provenance"] = g.get("provenance") or _call_provenance(gpu.parent.parent)
    acc = results.results_dir() / c.acc_file
    if acc.is_file():
        a = json.loads(acc.read_text())
        if not isinstance(a.get("by_policy"), dict):
            raise results.ResultCorrupt(f"{acc} is not an accumulation_run record (no 'by_policy')")
        out["accumulation"] = a
    return out


def _call_provenance(results_dir: Path) -> dict | None:
    """Where and when the GPU records were measured, for a record file that does not say so itself: the GPU
    script ran these extras beside the substitution grid in one call,
    so the grid's part file (results/substitution_parts/) carries that call's device, git and date."""
    parts = part_files(results_dir / "substitution_parts")
    if not parts:
        return None
    meta = read_part(parts[0])
    return {k: meta.get(k) for k in ("device", "git", "created")} | {
        "source": f"substitution_parts/{part_name(parts[0])}"}


def _provenance() -> dict:
    """Device, tree and date of a GPU record file, written into it (`main`'s gpu command)."""
    import datetime

    return {"device": results.device_name(), "git": results.git_commit(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def a_run_config(out_dir: str, lr: float = 3.2e-2, seed: int = 0, checkpoint_every: int = 100):
    """lr_sweep's run of A at (lr, seed), smaller size, with a checkpoint every `checkpoint_every` steps, all
    kept (for the GPU checks and `substitution.replay_branch`): the same run, so its final held-out loss must
    equal lr_sweep's stored one."""
    from lpfail.sweep import lr as L

    tc = L.train_config(L.LRSweepConfig(), L.Point("small", "A", lr, seed), out_dir)
    return dataclasses.replace(tc, checkpoint_every=checkpoint_every, keep_checkpoints=0)


#: Chapter 3's item 3: the policies whose δ error is accumulated along one trajectory (`accumulation_run`).
ACC_POLICIES = {"A": "PAPER_BF16", "A_fix": "PAPER_BF16_OFFICIAL_FIX", "A_sr": "PAPER_BF16,rounding=sr,sr_stream=1",
                "D": "FA2_BF16"}


def accumulation_run(run_dir, step: int, k: int, layer: int, policies: dict | None = None, rows: int = 8,
                     n_signs: int = 16, device="cpu", log=print) -> dict:
    """Biased vs unbiased accumulation over K consecutive real steps (the paper's Eq. 3 over time).

    Replays the recorded run `run_dir` from its checkpoint at `step` for `k` steps on its recorded batches
    (bit for bit the run: `lpfail.train.train` with replay and resume), and after each update captures layer
    `layer` on the first `rows` sequences of the next step's batch. For each policy (name → Precision string;
    default `ACC_POLICIES`: A, A with the official fix, A with stochastic rounding, D) it adds Eq. 2's δ-term
    (`lpfail.gradient_error.delta_terms`, per head) to a running sum E_K, on the *same* tensors, so that only
    the arithmetic of δ differs. Beside it, `n_signs` sums of the same terms with random signs (seeded): what
    the same terms give when their signs carry no bias (∝ √K). Returns per policy the norms ‖E_K‖ per head and
    K, the sign-randomized RMS norms (and each sign draw's norm, "norm_signs_each": K × n_signs × H), Σ Δδ per
    step and head, and the fitted exponents (log‖E‖ vs log K after
    the first tenth): ≈ 1 when biased, ≈ ½ when not."""
    from lpfail.train import step_rows, checkpoint_path, load_batch_record, load_config, load_tokens, read_log, \
        split_validation, train, window_config

    policies = {n: Precision.parse(p) for n, p in (policies or ACC_POLICIES).items()}
    if k < 10:
        raise ValueError(f"accumulation_run: need k >= 10 steps (got {k})")
    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.json")
    if step < 0 or step + k > cfg.max_steps - 1:
        raise ValueError(f"accumulation_run: the window's batches {step + 1}..{step + k} must lie inside the run's "
                         f"0..{cfg.max_steps - 1}")
    if not 0 <= layer < cfg.n_layer:
        raise ValueError(f"accumulation_run: layer {layer} outside 0..{cfg.n_layer - 1}")
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    tokens, _, _ = load_tokens(cfg)
    tokens, _ = split_validation(tokens, cfg)
    order = load_batch_record(run_dir)
    g = torch.Generator().manual_seed(0)
    acc: dict = {n: None for n in policies}
    signed: dict = {n: None for n in policies}
    out = {n: {"norm": [], "norm_signs": [], "norm_signs_each": [], "sum_dd": []} for n in policies}
    amp = (torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
           if cfg.autocast == "bf16" else torch.autocast(device_type="cpu", enabled=False))

    def hook(s: int, model):
        nxt = s + 1  # the weights after step s (= step .. step + k − 1) are the ones step s + 1 uses
        x, y = step_rows(tokens, order.offsets(nxt)[:rows], cfg.block_size)
        with amp:
            cap = capture_layer(model, x.to(device), y.to(device), layer)
        signs = torch.randint(0, 2, (n_signs,), generator=g).double() * 2 - 1
        terms = delta_terms(cap["x"], cap["w_q"], cap["w_k"], cap["w_v"], cap["do"], policies,
                            n_head=cap["n_head"], qkv=cap["qkv"])           # on the run's device, in float64
        for name in policies:
            r = terms[name]
            t = r["term"].cpu()                                                             # (H, D, C)
            acc[name] = t.clone() if acc[name] is None else acc[name] + t
            st = signs.view(-1, 1, 1, 1) * t
            signed[name] = st if signed[name] is None else signed[name] + st
            out[name]["norm"].append([float(v) for v in acc[name].flatten(1).norm(dim=1)])
            each = signed[name].flatten(2).norm(dim=2)                                   # (n_signs, H)
            out[name]["norm_signs"].append([float(v) for v in each.pow(2).mean(0).sqrt()])
            out[name]["norm_signs_each"].append(each.tolist())  # for the spread of ρ under random signs
            out[name]["sum_dd"].append(r["sum_dd"])


    tc = window_config(cfg, step + k, out_dir="", diag_every=0)
    t0 = time.time()
    res = train(tc, replay=run_dir, resume_from=checkpoint_path(run_dir, step), hook=hook)
    # the window must be the run itself: its losses equal the recorded ones bit for bit
    rec, got = read_log(run_dir), res.arrays()
    want = np.asarray(rec["loss"])[(rec["step"] >= step) & (rec["step"] < step + k)]
    have = np.asarray(got["loss"])[np.asarray(got["step"]) >= step]
    on_run = bool(have.shape == want.shape and np.array_equal(have, want))
    if not on_run:
        log("accumulation: the window's losses differ from the recorded run's (not on A's trajectory)")
    for name in policies:
        n = np.asarray(out[name]["norm"])                                                   # (K, H)
        ns = np.asarray(out[name]["norm_signs"])
        out[name]["exponent"] = tail_slopes(np.maximum(n, 1e-300)) if len(n) > 2 else []
        out[name]["exponent_signs"] = tail_slopes(np.maximum(ns, 1e-300)) if len(ns) > 2 else []
        log(f"accumulation {name}: exponent per head {np.round(out[name]['exponent'], 2).tolist()} "
            f"(random signs {np.round(out[name]['exponent_signs'], 2).tolist()})")
    return {"step": int(step), "k": int(k), "layer": int(layer), "rows": int(rows), "status": res.status,
            "on_run_bit_exact": on_run,
            "policies": {n: str(p) for n, p in policies.items()}, "by_policy": out,
            "wall_s": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lpfail.experiments.gradient_error")
    ap.add_argument("command", choices=("gpu", "a-config", "accumulate"))
    ap.add_argument("--run", required=True, help="a run directory with checkpoints and its batch record "
                    "(a-config: where the run will write; its train_config.json is written there)")
    ap.add_argument("--steps", default="300,600,900")
    ap.add_argument("--rows", type=int, default=8, help="sequences of the step's batch to use")
    ap.add_argument("--out", default=None, help="gpu, accumulate: the JSON file to write")
    ap.add_argument("--step", type=int, default=600, help="accumulate: the checkpoint the window starts at")
    ap.add_argument("--k", type=int, default=100, help="accumulate: the number of consecutive steps")
    ap.add_argument("--layer", type=int, default=0, help="accumulate: the layer (0: the largest dW_Q error "
                    "in the GPU records of 2026-12-01)")
    args = ap.parse_args(argv)
    if args.command == "a-config":
        Path(args.run).mkdir(parents=True, exist_ok=True)
        (Path(args.run) / "train_config.json").write_text(json.dumps(a_run_config(args.run).to_dict()))
        print(Path(args.run) / "train_config.json")
        return 0
    if not args.out:
        ap.error(f"{args.command} needs --out")
    if args.command == "accumulate":
        res = accumulation_run(args.run, args.step, args.k, args.layer, rows=args.rows,
                               device="cuda" if torch.cuda.is_available() else "cpu")
        Path(args.out).write_text(json.dumps({**res, "provenance": _provenance()}) + "\n")
        return 0
    steps = [int(s) for s in args.steps.split(",")]
    recs = check_run(args.run, steps, rows=args.rows, device="cuda" if torch.cuda.is_available() else "cpu")
    every = [x for rec in recs for k in ("eq1_rel_err", "eq2_rel_err") for x in rec[k]]
    Path(args.out).write_text(json.dumps({"tol": TOL, "records": recs, "max_rel_err": max(every),
                                          "passed": max(every) <= TOL, "provenance": _provenance()}) + "\n")
    print(f"gradient_error gpu: {len(recs)} (step, layer) checks, max relative error {max(every):.2e} "
          f"(tol {TOL:g}): {'passed' if max(every) <= TOL else 'FAILED'}")
    return 0 if max(every) <= TOL else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
