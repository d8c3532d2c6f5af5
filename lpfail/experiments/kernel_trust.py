"""When may a sweep run the Triton kernel instead of the reference? A check that is not chaotic.

The symptom search (chapter 1) trusted the kernel when 20 steps of training with it and with the reference gave
losses within 0.02. At high learning rates that test says little: any change of summation order makes two
loss trajectories part within a few steps (A's drifted 0.063 in 20 steps, and only C was
trusted). What a sweep needs is that the kernel's *gradient errors* have the statistics of the reference's:
the same bias along the true gradient and the same size. That is a one-step property, so it is measured on
one step, many times:

* the same weights and the same batch, three ways: the candidate spec (e.g. ``triton(PAPER_BF16)``), the
  reference it stands in for (``reference(PAPER_BF16)``) and the truth (``reference(FP64)``), everything else
  identical (same autocast for the rest of the model);
* per parameter tensor p and batch i, the error e = g − g_truth, its **projected bias** along the truth,
  b = ⟨e, g_truth⟩ / ‖g_truth‖² (the relative error of the gradient's component along itself: the paper's
  bias shows up here, with a consistent sign), and its relative **RMS**, ‖e‖ / ‖g_truth‖;
* the rule (`agree`): for every tensor whose true gradient is not zero, the candidate's mean projected bias
  differs from the reference's by at most 3 standard errors of the paired difference (over batches) or by at
  most a quarter of the reference's own bias, and the ratio of their mean relative RMS lies in
  [1/1.5, 1.5] — or both errors are below 1e-6 of the gradient (both essentially exact).

`trust_report` returns the per-tensor statistics and the verdict; ``python -m lpfail.experiments.kernel_trust``
runs it for a list of policies on the GPU and writes JSON (see ``--help``). On the CPU the tests run the
kernel's FP32 path in Triton's interpreter, and a candidate known to differ (a BF16 policy standing in for FP32)
must fail.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

import numpy as np

BIAS_SE = 3.0  # standard errors of the paired bias difference allowed
BIAS_REL = 0.25  # ... or this fraction of the reference's own mean bias
RMS_RATIO = 1.5  # the mean relative RMS of the two may differ by this factor either way
EXACT = 1e-6  # relative RMS below which an error counts as none


@dataclass(frozen=True)
class TrustConfig:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    block_size: int = 256
    vocab_size: int = 256  # byte-level
    batch_size: int = 8
    n_batches: int = 8
    init_seed: int = 0
    q_scale: float = 1.0  # multiply W_Q by this at the start (larger logits, where ties and their bias appear)
    autocast: str = "bf16"  # for the rest of the model: the sweeps' setting

    def __post_init__(self):
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size", "n_batches"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v > 0):
                raise ValueError(f"TrustConfig.{name} must be a positive int (got {v!r})")
        if self.n_batches < 3:
            raise ValueError("TrustConfig.n_batches must be >= 3 (a standard error needs several batches)")
        if self.autocast not in ("bf16", "none"):
            raise ValueError(f"TrustConfig.autocast must be 'bf16' or 'none' (got {self.autocast!r})")
        if not (self.q_scale > 0 and math.isfinite(self.q_scale)):
            raise ValueError(f"TrustConfig.q_scale must be a positive finite number (got {self.q_scale!r})")


def _model(c: TrustConfig, spec: str, device):
    import torch

    from lpfail.model import GPT, AttentionSpec, GPTConfig

    torch.manual_seed(c.init_seed)  # the same weights for every spec (drawn on the CPU)
    m = GPT(GPTConfig(block_size=c.block_size, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                      n_embd=c.n_embd))
    m.set_attention(AttentionSpec.parse(spec))
    if c.q_scale != 1.0:
        with torch.no_grad():
            for block in m.transformer.h:
                block.attn.c_attn.weight[: c.n_embd].mul_(c.q_scale)  # the W_Q rows of the fused qkv projection
    return m.to(device)


def gradients(c: TrustConfig, spec: str, batches, device) -> dict[str, np.ndarray]:
    """{parameter name: (n_batches, numel) float64 gradients} of one step's loss, per batch, under ``spec``."""
    import torch

    m = _model(c, spec, device)
    out: dict[str, list] = {n: [] for n, _ in m.named_parameters()}
    for x, y in batches:
        m.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=c.autocast == "bf16"):
            _, loss = m(x.to(device), y.to(device))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"kernel_trust: the loss under {spec} is {loss.item()}")
        loss.backward()
        for n, p in m.named_parameters():
            out[n].append(p.grad.detach().double().flatten().cpu().numpy())
    return {n: np.stack(v) for n, v in out.items()}


def error_stats(g: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(projected bias, relative RMS) per batch of gradients ``g`` against ``truth``, both (batches, numel)."""
    g, truth = np.asarray(g, np.float64), np.asarray(truth, np.float64)
    if g.shape != truth.shape or g.ndim != 2:
        raise ValueError(f"error_stats needs two (batches, numel) arrays of one shape (got {g.shape}, {truth.shape})")
    e = g - truth
    nt2 = np.einsum("bn,bn->b", truth, truth)
    safe = np.where(nt2 > 0, nt2, 1.0)
    bias = np.where(nt2 > 0, np.einsum("bn,bn->b", e, truth) / safe, 0.0)
    rms = np.where(nt2 > 0, np.sqrt(np.einsum("bn,bn->b", e, e) / safe), 0.0)
    return bias, rms


def agree(bias_c, rms_c, bias_r, rms_r) -> dict:
    """The rule (module docstring) for one tensor, from per-batch statistics of candidate and reference."""
    bias_c, bias_r = np.asarray(bias_c, np.float64), np.asarray(bias_r, np.float64)
    rms_c, rms_r = np.asarray(rms_c, np.float64), np.asarray(rms_r, np.float64)
    d = bias_c - bias_r
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("inf")
    mc, mr = float(rms_c.mean()), float(rms_r.mean())
    exact = mc < EXACT and mr < EXACT
    bias_ok = bool(abs(d.mean()) <= BIAS_SE * se or abs(d.mean()) <= BIAS_REL * abs(bias_r.mean()) or exact)
    ratio = mc / mr if mr > 0 else (1.0 if mc == 0 else float("inf"))
    rms_ok = bool(exact or (1 / RMS_RATIO <= ratio <= RMS_RATIO))
    return {"bias_candidate": float(bias_c.mean()), "bias_reference": float(bias_r.mean()),
            "bias_diff": float(d.mean()), "bias_diff_se": se, "rms_candidate": mc, "rms_reference": mr,
            "rms_ratio": ratio, "bias_ok": bias_ok, "rms_ok": rms_ok, "ok": bias_ok and rms_ok}


def random_batches(c: TrustConfig, seed: int = 1):
    """``n_batches`` (x, y) pairs of byte tokens from the pydocs corpus (random windows, fixed seed)."""
    import torch

    from lpfail import data

    toks = np.asarray(data.tokens("pydocs", "bytes"), dtype=np.int64)
    if toks.max() >= c.vocab_size:
        raise ValueError(f"the corpus has token ids up to {toks.max()}, above vocab_size {c.vocab_size}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(c.n_batches):
        starts = rng.integers(0, len(toks) - c.block_size - 1, size=c.batch_size)
        w = np.stack([toks[s:s + c.block_size + 1] for s in starts])
        out.append((torch.from_numpy(w[:, :-1].copy()), torch.from_numpy(w[:, 1:].copy())))
    return out


def trust_report(c: TrustConfig, candidate: str, reference: str, truth: str = "reference(FP64)", batches=None,
                 device="cpu", g_truth: dict[str, np.ndarray] | None = None) -> dict:
    """Per parameter tensor, the rule's statistics for ``candidate`` against ``reference`` (both measured against
    ``truth`` on the same weights and batches), and ``trusted``: every tensor with a non-zero true gradient
    agrees. ``g_truth``: `gradients` of ``truth`` on these batches, when the caller has them already."""
    batches = batches if batches is not None else random_batches(c)
    t0 = time.perf_counter()
    g_t = g_truth if g_truth is not None else gradients(c, truth, batches, device)
    g_c = gradients(c, candidate, batches, device)
    g_r = gradients(c, reference, batches, device)
    tensors = {}
    for n in g_t:
        if not np.any(g_t[n]):
            continue
        bc, rc = error_stats(g_c[n], g_t[n])
        br, rr = error_stats(g_r[n], g_t[n])
        tensors[n] = agree(bc, rc, br, rr)
    bad = [n for n, s in tensors.items() if not s["ok"]]
    return {"candidate": candidate, "reference": reference, "truth": truth, "config": c.__dict__,
            "trusted": not bad, "disagreeing": bad, "tensors": tensors, "wall_s": round(time.perf_counter() - t0, 2),
            "rule": {"bias_se": BIAS_SE, "bias_rel": BIAS_REL, "rms_ratio": RMS_RATIO, "exact": EXACT}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lpfail.experiments.kernel_trust",
                                description="One-step gradient check: may triton(POLICY) stand in for "
                                            "reference(POLICY)? Writes JSON; exit 0 when every policy is trusted, "
                                            "1 when one is not.")
    p.add_argument("--policies", default="PAPER_BF16,FA2_BF16,FP32", help="comma-separated policies")
    p.add_argument("--q-scale", type=float, default=1.0, help="scale W_Q (larger logits); default 1")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--device", default=None, help="default: cuda when available")
    p.add_argument("--out", required=True, help="JSON file to write (atomically)")
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return run([x.strip() for x in args.policies.split(",") if x.strip()],
               TrustConfig(n_batches=args.batches, q_scale=args.q_scale), device, args.out)


def worst_rms(report: dict) -> dict:
    """The tensor whose RMS ratio (candidate / reference) lies farthest from 1, as {"tensor", "rms_ratio"}."""
    name, st = max(report["tensors"].items(), key=lambda kv: abs(math.log(max(kv[1]["rms_ratio"], 1e-30))))
    return {"tensor": name, "rms_ratio": st["rms_ratio"]}


#: where the GPU check is stored (written by `run`, copied from the device)
STORED = "kernels_gpu/kernel_trust.json"


def load_stored(path=None) -> dict:
    """The stored JSON of `run` (default: results/kernels_gpu/kernel_trust.json), checked: a missing file, a
    corrupt one or one without provenance raises with what to do."""
    from pathlib import Path

    from lpfail import results

    path = Path(path) if path is not None else results.REPO_ROOT / "results" / STORED
    if not path.is_file():
        raise results.ResultMissing(f"no stored kernel_trust report at {path.name}: run `python -m "
                                    "lpfail.experiments.kernel_trust --out FILE` on a GPU machine")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"kernel_trust report {path.name} is not valid JSON ({e})") from None
    missing = [k for k in ("device", "versions", "git", "created", "reports") if k not in d]
    if missing:
        raise ValueError(f"kernel_trust report {path.name} lacks {missing}")
    return d


def summary_rows(d: dict) -> list[dict]:
    """One row per candidate of a stored report: candidate, reference, trusted, tensors disagreeing / checked,
    the worst RMS ratio and its tensor, the wall time."""
    rows = []
    for r in d["reports"]:
        w = worst_rms(r)
        rows.append({"candidate": r["candidate"], "reference": r["reference"], "trusted": bool(r["trusted"]),
                     "disagree": len(r["disagreeing"]), "tensors": len(r["tensors"]),
                     "worst_rms_ratio": w["rms_ratio"], "worst_tensor": w["tensor"], "wall_s": r["wall_s"]})
    return rows


def summary_markdown(d: dict) -> str:
    """`summary_rows` as a Markdown table, and the report's provenance (card, date, versions, commit) below it."""
    lines = ["| candidate | stands in for | tensors disagreeing | worst RMS ratio | verdict |",
             "|---|---|---|---|---|"]
    for r in summary_rows(d):
        lines.append(f"| `{r['candidate']}` | `{r['reference']}` | {r['disagree']} of {r['tensors']} | "
                     f"{r['worst_rms_ratio']:.3f} | {'trusted' if r['trusted'] else '**not trusted**'} |")
    v = d["versions"]
    lines += ["", f"Measured on {d['device']} on {d['created'][:10]} (torch {v.get('torch')}, triton "
                  f"{v.get('triton')}), code of commit `{d['git'][:7]}`."]
    return "\n".join(lines)


def run(policies: list[str], c: TrustConfig, device: str, out, batches=None, log=print) -> int:
    """`trust_report` of ``triton(P)`` against ``reference(P)`` for each policy P, written to ``out`` (JSON, with
    provenance, atomically); 0 when every policy is trusted, else 1."""
    from pathlib import Path

    from lpfail import results

    if not policies:
        raise ValueError("kernel_trust: no policy given")
    batches = batches if batches is not None else random_batches(c)
    g_truth = gradients(c, "reference(FP64)", batches, device)  # the same for every policy: computed once
    reports = []
    for pol in policies:
        r = trust_report(c, f"triton({pol})", f"reference({pol})", batches=batches, device=device, g_truth=g_truth)
        log(f"kernel_trust {pol}: trusted {r['trusted']}; {len(r['disagreeing'])} of {len(r['tensors'])} tensors "
            f"disagree; worst RMS ratio {worst_rms(r)['rms_ratio']:.3f}; {r['wall_s']} s")
        reports.append(r)
    payload = {"device": results.device_name(), "versions": results.library_versions(), "git": results.git_commit(),
               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reports": reports}
    results.atomic_write(Path(out), (json.dumps(payload, indent=1) + "\n").encode())
    return 0 if all(r["trusted"] for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
