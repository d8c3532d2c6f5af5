"""Issue 25 in one device call: the GPU checks of every tuning lever and of ℓ from P̄, then their timings beside
SDPA (cuDNN and flash), the fix's cost with alternating timings, the host time per call, and chapter 6's
normaliser experiment. Run on the GPU machine from the repo root (it fits one call of ≤ 9 minutes):

    LPFAIL_GIT=<commit> OUT=$OUT timeout 560 python3 tools/gpu_kernels_tune.py [--budget 520] [--pytest] [--focus dropin]

Phases, each under the one deadline (a phase that would start too late is skipped and said so):
  1. compile: every kernel variant the later phases launch is compiled ahead, in parallel worker processes
     (Triton's on-disk cache then serves the timing process); serial compilation would take ≈ 5 of the 9 minutes;
  2. checks (fail loudly): each lever against the default kernel — bits where a lever must not change them (TMA in
     both passes or the backward's only, the tie count, the tie form "auto", the forward of every lever),
     closeness where it may (the fused backward, whose bits are recorded, the FTZ exp) — the kernels against the reference and float64, ℓ from P̄ against the reference, the
     drop-in against SDPA (default is_causal, enable_gqa); a failed variant is not timed and the exit code is 1;
  3. optionally (--pytest) the gpu-marked kernel tests (LPFAIL_KERNELS_AUTOTUNE=0), output in tests.txt;
  4. timings: BF16, causal, width 2048, d 64 and 128, N 1k–8k, 16k tokens per call, fwd and fwd+bwd, every
     method of a shape timed together in interleaved rounds (`ROUNDS`; each cell keeps its rounds and spread),
     variant (autotuned in its space: the split backward, the fused one, NEXT_LEVERS: the default since 2026-12-04,
     the five-matmul backward `Tuning(bwd="dq_atomic")` on NEXT_LEVERS (TMA reduce-adds) and alone (pointer
     atomics); first GPT-2 small's step shape (8, 12, 1024, 64), `EXTRA_SHAPES`)
     beside SDPA cuDNN and flash; each timed variant's forward is compared bit
     for bit with its base's on the timed inputs, its gradients for closeness;
  5. the fix's cost: Algorithm 3 and the robust fix against the same kernel without a fix, alternating timings
     (on NEXT_LEVERS, the tie test's form "auto" beside both explicit forms);
  6. host time per call (1 × 1 × 128 × 64), every method interleaved round by round;
  7. `prod_normaliser` (chapter 6) stored in the results cache format under $OUT.
(6 and 7 run before 4 and 5, which take what the budget leaves.)
Files under $OUT (8): checks.json, tune_bench.json, tune_pairs.json, host.json, prod_normaliser.json and .npz,
summary.txt, tests.txt (with --pytest). The summary table is printed last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lpfail import kernels  # noqa: E402
from lpfail.kernels import NEXT_LEVERS, Tuning  # noqa: E402
from lpfail.kernels.bench import flops, time_interleaved, time_paired  # noqa: E402
from lpfail.precision import FA2_BF16  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/lpfail_out"))
SUB, FMA = FA2_BF16, FA2_BF16.replace(sub="fma")
#: the default since 2026-12-04 (kernels.NEXT_LEVERS = DEFAULT_TUNING: TMA in the backward, sm90 space, fused backward, tie "auto", FTZ exp);
#: FTZ acts in sub mode only, so the same tuning serves both modes
NEXT = NEXT_LEVERS
#: timed methods: name → (policy, tuning, base method whose forward bits it must give); None: SDPA.
#: Dropped after the call of 2026-12-02 (tree 526baca, results/kernels_gpu/tune_20261202): the LPT order (−5…−15 %
#: fwd and fwd+bwd, both d), the atomic backward (−15…−25 % fwd+bwd), all levers together (their product) and the
#: FTZ exp on its own (inside NEXT now); the split backward stays as the base.
METHODS = {
    "sdpa_cudnn": None, "sdpa_flash": None,
    "base_sub": (SUB, Tuning(), None), "base_fma": (FMA, Tuning(), None),
    "fma_tma": (FMA, Tuning(tma=True), "base_fma"), "fma_sm90": (FMA, Tuning(space="sm90"), "base_fma"),
    "fma_fused": (FMA, Tuning(bwd="fused"), "base_fma"),
    "fma_fused_sm90": (FMA, Tuning(bwd="fused", space="sm90"), "base_fma"),
    "fma_tmab_fused": (FMA, Tuning(tma="bwd", bwd="fused"), "base_fma"),
    "next_fma": (FMA, NEXT, "base_fma"), "next_sub": (SUB, NEXT, "base_sub"),
    # the five-matmul backward: beside the fused default, with TMA reduce-adds (NEXT's tma="bwd") and,
    # without descriptors, with pointer atomics
    "next_fma_dqa": (FMA, dataclasses.replace(NEXT, bwd="dq_atomic"), "base_fma"),
    "next_sub_dqa": (SUB, dataclasses.replace(NEXT, bwd="dq_atomic"), "base_sub"),
    "fma_dqa_ptr": (FMA, Tuning(bwd="dq_atomic"), "base_fma"),
}
#: the fix's cost: (method without a fix, method with it), timed in alternation; the tie test's two explicit forms
#: beside "auto" (at each head dim one of them is auto's code: a repeat that shows the pairs' noise)
FIX_METHODS = {
    "base_fma_alg3": (FMA.with_fix(), Tuning(), None),
    "next_fma_alg3": (FMA.with_fix(), NEXT, None),
    "next_fma_robust": (FMA.with_bounded_fix(), NEXT, None),
    "next_fma_robust_count": (FMA.with_bounded_fix(), dataclasses.replace(NEXT, tie="count"), "next_fma_robust"),
    "next_fma_robust_max2": (FMA.with_bounded_fix(), dataclasses.replace(NEXT, tie="max2"), "next_fma_robust"),
    "next_sub_robust": (SUB.with_bounded_fix(), NEXT, None),
    "next_sub_alg3": (SUB.with_fix(), NEXT, None),
    "next_sub_dqa_robust": (SUB.with_bounded_fix(), dataclasses.replace(NEXT, bwd="dq_atomic"), None),
}
#: `--focus dropin`: what issue 42's targets need and nothing else — the drop-in's arithmetic (subtract form) with the
#: default deterministic backward and the five-matmul one, each with and without the robust fix, beside SDPA's two
#: back ends (the lever exploration above is left out, so that every shape fits one call)
FOCUS_DROPIN = {
    "methods": ("sdpa_cudnn", "sdpa_flash", "next_sub", "next_sub_dqa"),
    "fix_methods": ("next_sub_robust", "next_sub_dqa_robust"),
    "pairs": (("next_sub", "next_sub_robust"), ("next_sub_dqa", "next_sub_dqa_robust")),
    "levers": ("fused", "next", "dqa", "dqatma"),
}
PAIRS = (("base_fma", "base_fma_alg3"), ("next_fma", "next_fma_alg3"), ("next_fma", "next_fma_robust"),
         ("next_fma", "next_fma_robust_count"), ("next_fma", "next_fma_robust_max2"), ("next_sub", "next_sub_robust"),
         ("next_sub", "next_sub_alg3"))
#: the checks' levers (phase 2), each against the default tuning
LEVERS = {"tma": Tuning(tma=True), "tmab": Tuning(tma="bwd"), "count": Tuning(tie="count"), "auto": Tuning(tie="auto"),
          "ftz": Tuning(ftz_exp=True), "fused": Tuning(bwd="fused"), "next": NEXT,
          "dqa": Tuning(bwd="dq_atomic"), "dqatma": Tuning(bwd="dq_atomic", tma="bwd")}
HEAD_DIMS, SEQ_LENS, TOKENS, WIDTH = (64, 128), (1024, 2048, 4096, 8192), 16384, 2048
#: shapes timed besides the grid, (batch, heads, N, d): GPT-2 small's training step (batch 8, 12 heads of 64)
EXTRA_SHAPES = ((8, 12, 1024, 64),)
MODES = ("fwd", "fwd_bwd")


class Deadline:
    def __init__(self, budget_s: float):
        self.t0, self.budget = time.time(), budget_s

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)

    def stamp(self) -> str:
        return f"[{time.time() - self.t0:6.1f}s]"


def log(dl: Deadline, *parts):
    print(dl.stamp(), *parts, flush=True)


def _spec(name):
    return METHODS.get(name) or FIX_METHODS[name]


def method_fn(name):
    """(q, k, v) -> O of one method (SDPA back ends under their sdpa_kernel context)."""
    if name.startswith("sdpa_"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[name]

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return fn
    policy, tuning, _ = _spec(name)
    return lambda q, k, v: kernels.flash_attention(q, k, v, policy, causal=True, tuning=tuning)


# -- phase 1: compile every variant ahead, in parallel -----------------------------------------------------------
def _compile_variants():
    """(policy, tuning, d, heads, causal, scale, every config) of every kernel launch the later phases make: the
    timed methods (every config of their autotune space, at 16 heads: the same compiled code as 32), the checks
    (first config: they run with LPFAIL_KERNELS_AUTOTUNE=0), the normaliser experiment's kernel calls (one head,
    full attention, α = 1) and the host-time phase's (one head, causal). Triton specialises integer arguments on
    "= 1" and "divisible by 16", so one head compiles apart from 16 or 32, while N and B do not matter here."""
    timed = [(p, t) for spec in (*METHODS.values(), *FIX_METHODS.values()) if spec for p, t, _ in [spec]]
    checked = [(pol, t) for pol in (FMA.with_fix(), SUB.with_bounded_fix())
               for t in (Tuning(), *LEVERS.values())]
    checked += [(p.replace(l_from="pbar"), Tuning()) for p in (SUB, FMA)] + [(SUB, Tuning()), (FMA, Tuning())]
    checked += [(FA2_BF16.replace(out="fp32", l_from=lf), Tuning()) for lf in ("p", "pbar")]
    out = [(p, t, d, 16, True, d ** -0.5, True) for p, t in dict.fromkeys(timed) for d in HEAD_DIMS]
    out += [(p, t, d, 16, True, d ** -0.5, False) for p, t in dict.fromkeys(checked) for d in HEAD_DIMS]
    out += [(p, t, d, h, True, d ** -0.5, True) for p, t in dict.fromkeys(timed) for _, h, _, d in EXTRA_SHAPES
            if h % 16]                                       # ↑ EXTRA_SHAPES' head counts, where not 16's code
    out += [(p, Tuning(), 64, 1, False, 1.0, True) for p in (SUB, SUB.replace(l_from="pbar"), FMA,
                                                             FMA.replace(l_from="pbar"))]
    out += [(p, t, 64, 1, True, 0.125, True) for p in (SUB, SUB.with_bounded_fix()) for t in (Tuning(), NEXT)]
    return out                                               # ↑ the host-time phase's drop-in calls (one head)


def _record_launches(policy, tuning, d, heads=16, causal=True, scale=None, device="cuda"):
    """The launches (kernel, args, constexprs) of one forward and one backward, recorded instead of made (on CPU
    tensors for a dry run: nothing is launched)."""
    rec = []
    real = kernels.launcher.launch     # what launch_forward and launch_backward call
    kernels.launcher.launch = lambda kernel, grid, key, args, consts, stream=None: rec.append((kernel, args, consts))
    scale = d ** -0.5 if scale is None else scale
    try:
        q, k, v = (torch.empty(1, heads, 1024, d, device=device, dtype=torch.bfloat16) for _ in range(3))
        kp = kernels.kernel_policy(policy)
        kernels.launch_forward(q, k, v, kp, causal, scale, tuning)
        o = torch.empty(q.shape, device=device, dtype=kp.out_dtype)
        lse = torch.empty(q.shape[:-1], device=device, dtype=torch.float32)
        kernels.launch_backward(q, q, k, v, o, lse, kp, causal, scale, tuning)
    finally:
        kernels.launcher.launch = real
    return rec


def _tuner_id(kernel):
    from lpfail.kernels import bwd, fwd
    for table, name in ((fwd.FWD_TUNERS, "fwd"), (bwd.DQ_TUNERS, "dq"), (bwd.DKDV_TUNERS, "dkdv"),
                        (bwd.FUSED_TUNERS, "fused"), (bwd.DQA_TUNERS, "dqa")):
        for key, tuner in table.items():
            if tuner is kernel:
                return name, key
    plain = {bwd._bwd_delta_dot: "delta", bwd.dq_epilogue: "dqep"}
    return (plain[kernel], None) if kernel in plain else None


def _encode(x):
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype).split(".")[-1])
    if type(x).__name__ == "dtype" and type(x).__module__.startswith("triton"):
        return ("tl", {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[str(x)])
    return ("raw", x)


def compile_jobs(device="cuda"):
    """Picklable warm-up jobs: (kernel id, encoded args, encoded constexprs, config kwargs) for every config the
    autotuners may time (the first config only where the launch is a check's)."""
    jobs, seen = [], set()
    for policy, tuning, d, heads, causal, scale, every in _compile_variants():
        for kernel, args, consts in _record_launches(policy, tuning, d, heads, causal, scale, device):
            tid = _tuner_id(kernel)
            if tid is None:
                continue
            cfgs = [None] if tid[0] in ("delta", "dqep") else kernel.early_config_prune(kernel.configs, {}, **consts)
            for cfg in cfgs if every else cfgs[:1]:
                job = (tid, tuple(_encode(a) for a in args), tuple((k, _encode(v)) for k, v in consts.items()),
                       tuple(sorted(cfg.all_kwargs().items())) if cfg else ())
                if repr(job) not in seen:
                    seen.add(repr(job))
                    jobs.append(job)
    return jobs


def _decode(x):
    kind, value = x
    if kind == "tensor":
        return getattr(torch, value)
    if kind == "tl":
        return kernels.TL[value]
    return value


def run_job(job):
    """In a worker: compile one kernel variant into Triton's cache (JITFunction.warmup, nothing launched)."""
    from lpfail.kernels import bwd, fwd
    (name, key), args, consts, cfg = job
    jit = {"fwd": lambda: fwd.FWD_TUNERS[key].fn, "dq": lambda: bwd.DQ_TUNERS[key].fn,
           "dkdv": lambda: bwd.DKDV_TUNERS[key].fn, "fused": lambda: bwd.FUSED_TUNERS[key].fn,
           "delta": lambda: bwd._bwd_delta_dot, "dqa": lambda: bwd.DQA_TUNERS[key].fn,
           "dqep": lambda: bwd.dq_epilogue}[name]()
    t0 = time.time()
    try:
        jit.warmup(*[_decode(a) for a in args], grid=(1,), **{k: _decode(v) for k, v in consts}, **dict(cfg))
        return name, time.time() - t0, None
    except Exception as e:  # noqa: BLE001 - reported; the timing process then compiles it itself
        return name, time.time() - t0, f"{type(e).__name__}: {str(e)[-300:]}"


def precompile(dl: Deadline, record: dict) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = compile_jobs()
    workers = max(2, min(len(jobs), (os.cpu_count() or 4) - 2))
    log(dl, f"compile: {len(jobs)} kernel variants on {workers} worker processes")
    t0, errors, secs = time.time(), [], []
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        for name, s, err in pool.map(run_job, jobs, chunksize=2):
            secs.append(s)
            if err:
                errors.append(f"{name}: {err}")
    record["compile"] = {"jobs": len(jobs), "workers": workers, "wall_s": round(time.time() - t0, 1),
                         "sum_compile_s": round(sum(secs), 1), "errors": errors[:20]}
    log(dl, f"compile: done in {time.time() - t0:.0f} s (serially {sum(secs):.0f} s), {len(errors)} errors")
    for e in errors[:5]:
        log(dl, "  compile error:", e)


# -- phase 2: checks --------------------------------------------------------------------------------------------
def _inputs(d, n=1040, heads=16, seed=0, tied=False):
    """(1, heads, n, d) BF16 q, k, v, dO (n = 1040: a partial last tile at every tile size; heads = 16 and
    n a multiple of 16, so the checks reuse the timed kernels' compiled code). `tied`: every row's maximum tied
    three times (keys 1–3 equal and large), as the fix's hostile rows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(1, heads, n, d, device="cuda", generator=g) for _ in range(4))
    if tied:
        k[:, :, 1:4] = 3.0                                  # three equal keys: equal scores in every row
    return [t.to(torch.bfloat16) for t in (q, k, v, do)]


def _grads(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    o.backward(do.to(o.dtype))
    return [o.detach(), *(t.grad for t in leaves)]


def _rel(x, ref):
    return float((x.double() - ref.double()).norm() / ref.double().norm())


def _mismatch(x, ref):
    return float((x.view(torch.int16) != ref.view(torch.int16)).float().mean()) if x.dtype == torch.bfloat16 else \
        float((x != ref).float().mean())


def _truth_grads(q, k, v, do):
    from lpfail.attention import naive_attention
    return _grads(lambda a, b, c: naive_attention(a, b, c, causal=True, check_finite=False), q.double(),
                  k.double(), v.double(), do.double())


def check_levers(d, out):
    """Each lever against the default kernel, on tied rows (the fix fires) with a partial last tile."""
    q, k, v, do = _inputs(d, tied=True, seed=d)
    fails = []
    for policy, levers in ((FMA.with_fix(), ("tma", "tmab", "count", "auto", "fused", "next", "dqa", "dqatma")),
                           (SUB.with_bounded_fix(), ("tma", "tmab", "count", "auto", "ftz", "fused", "next", "dqa",
                                                     "dqatma"))):
        base = _grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, tuning=Tuning()), q, k, v, do)
        for lever in levers:
            if lever not in LEVERS:   # left out by --focus
                continue
            t = LEVERS[lever]
            try:
                got = _grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, tuning=t), q, k, v, do)
            except Exception as e:  # noqa: BLE001 - a lever that does not run on the card fails its check
                out[f"lever d={d} {policy.name} {lever}"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
                fails.append(f"{lever} ({policy.name}, d={d})")
                continue
            exact = lever in ("tma", "tmab", "count", "auto")
            r = {f"{n}_mismatch": _mismatch(x, y) for n, x, y in zip(("O", "dQ", "dK", "dV"), got, base)}
            r.update({f"{n}_rel": _rel(x, y) for n, x, y in zip(("dQ", "dK", "dV"), got[1:], base[1:])})
            ok = r["O_mismatch"] == 0 and (all(r[f"{n}_mismatch"] == 0 for n in ("dQ", "dK", "dV")) if exact else
                                           all(r[f"{n}_rel"] < 1e-2 for n in ("dQ", "dK", "dV")))
            # (the fused backward runs the split one's code on its first config's tiles, the split's: its bit
            # mismatch, expected 0 as in the interpreter and tests/test_kernels.py's gpu test, is recorded; the pass
            # rule is closeness, so that a compiler's other schedule of the larger kernel does not keep the lever
            # from being timed)
            out[f"lever d={d} {policy.name} {lever}"] = {**r, "ok": bool(ok), "rule": "bits" if exact else "close"}
            if not ok:
                fails.append(f"{lever} ({policy.name}, d={d})")
    return fails


def check_reference(d, out):
    """The default kernels (sub, fma) and ℓ from P̄ against float64 and the reference policy (err ≤ 2·ref + 1e-3);
    with V ≡ c and an FP32 output ℓ from P̄ gives c to FP32 rounding where ℓ from P does not."""
    from lpfail.attention import attention
    q, k, v, do = _inputs(d, seed=10 + d)
    truth = _truth_grads(q, k, v, do)
    fails = []
    for policy in (SUB, FMA, SUB.replace(l_from="pbar"), FMA.replace(l_from="pbar")):
        got = _grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy), q, k, v, do)
        ref = _grads(lambda a, b, c: attention(a, b, c, policy, causal=True), q, k, v, do)
        e_got, e_ref = [_rel(x, t) for x, t in zip(got, truth)], [_rel(x, t) for x, t in zip(ref, truth)]
        ok = all(a <= 2 * b + 1e-3 for a, b in zip(e_got, e_ref))
        out[f"reference d={d} {policy.name}"] = {"kernel": e_got, "reference": e_ref,
                                                  "O_bits_vs_reference": _mismatch(got[0], ref[0]), "ok": ok}
        fails += [] if ok else [f"reference ({policy.name}, d={d})"]
    c = torch.full_like(v, 1.5)
    dev = {lf: float((kernels.flash_attention(q, k, c, FA2_BF16.replace(out="fp32", l_from=lf)).double() - 1.5)
                     .abs().max()) for lf in ("p", "pbar")}
    ok = dev["pbar"] < 1e-6 < 1e-4 < dev["p"]
    out[f"l_from V=c d={d}"] = {**dev, "ok": ok}
    return fails + ([] if ok else [f"l_from V=c (d={d})"])


def check_dropin(out):
    """SDPA's defaults and keywords on the GPU: full attention by default, enable_gqa, as SDPA computes them."""
    import torch.nn.functional as F
    q, k, v, do = _inputs(64, n=512, seed=3)
    full = _rel(kernels.flash_attention(q, k, v), F.scaled_dot_product_attention(q.double(), k.double(), v.double()))
    kq, vq = k[:, :4], v[:, :4]
    gqa = _rel(kernels.flash_attention(q, kq, vq, is_causal=True, enable_gqa=True),
               F.scaled_dot_product_attention(q.double(), kq.double(), vq.double(), is_causal=True, enable_gqa=True))
    out["dropin"] = {"default_full_rel": full, "gqa_rel": gqa, "ok": full < 1e-2 and gqa < 1e-2}
    return [] if out["dropin"]["ok"] else ["drop-in vs SDPA"]


def run_checks(dl: Deadline, record: dict) -> set:
    """Every check; returns the failed levers' names (their methods are not timed)."""
    os.environ[kernels.fwd.TUNE_ENV] = "0"          # the first config: the checks compare code, not picks
    out, fails = {}, []
    checks = [(f"levers d={d}", check_levers, (d, out)) for d in HEAD_DIMS]
    checks += [(f"reference d={d}", check_reference, (d, out)) for d in HEAD_DIMS] + [("dropin", check_dropin, (out,))]
    try:
        for name, fn, args in checks:
            try:
                fails += fn(*args)
            except Exception as e:  # noqa: BLE001 - a check that crashes fails, loudly; the others still run
                out[f"{name} (crashed)"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
                fails.append(f"{name.split()[0]}-crash ({name})")
    finally:
        os.environ[kernels.fwd.TUNE_ENV] = "1"
    record["checks"], record["check_failures"] = out, fails
    for name, r in out.items():
        if not r["ok"]:
            print(f"CHECK FAILED: {name}: {json.dumps(r)}", flush=True)
    log(dl, f"checks: {sum(r['ok'] for r in out.values())} of {len(out)} passed")
    return {f.split(" ")[0] for f in fails}


def _uses_failed(name: str, failed: set) -> bool:
    """Whether a method's tuning uses a lever whose check failed."""
    spec = _spec(name) if not name.startswith("sdpa_") else None
    if spec is None:
        return False
    t = spec[1]
    on = {"tma": t.tma is True, "tmab": bool(t.tma), "count": t.tie == "count", "auto": t.tie == "auto",
          "ftz": t.ftz_exp, "fused": t.bwd == "fused", "next": t == NEXT,
          "dqa": t.bwd == "dq_atomic", "dqatma": t.bwd == "dq_atomic" and bool(t.tma)}
    return any(on.get(f, False) for f in failed)


# -- phases 4 and 5: timings ------------------------------------------------------------------------------------
def _sets(d, n, count=3, bh=None):
    b, h = bh or (max(1, TOKENS // n), WIDTH // d)
    g = torch.Generator(device="cuda").manual_seed(1000 * d + n)
    return [tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(i < 3)
                  for i in range(4)) for _ in range(count)]


def _new_picks(seen: set) -> list:
    """The autotuner picks made since the last call (kernel name and config)."""
    out = []
    for (kernel, key), cfg in list(kernels.PICKS.items()):
        if (id(kernel), repr(key)) not in seen and cfg is not None:
            seen.add((id(kernel), repr(key)))
            name = getattr(getattr(kernel, "base_fn", None), "__name__", str(kernel))
            out.append(f"{name}: {cfg}")
    return out


def _guard(name, sets, base_out):
    """The timed variant (its autotuned configs) against its base on the timed inputs: the share of O's elements
    whose bits differ (0 expected: the forward's per-row arithmetic does not depend on the query tile, but a config
    that Triton lowers to another MMA instruction could sum a k-block in another order, so up to 0.5 % passes and
    is recorded), and the gradients' closeness."""
    q, k, v, do = sets[0]
    fn = method_fn(name)
    got = _grads(fn, q, k, v, do)
    if base_out is None:
        return got, {}
    g = {"O_mismatch": _mismatch(got[0], base_out[0]), "O_rel": _rel(got[0], base_out[0]),
         **{f"{n}_rel": _rel(x, y) for n, x, y in zip(("dQ", "dK", "dV"), got[1:], base_out[1:])}}
    g["ok"] = g["O_mismatch"] < 5e-3 and all(g[f"{n}_rel"] < 2e-2 for n in ("O", "dQ", "dK", "dV"))
    return got, g


#: Timing rounds per shape: every method is timed `ROUNDS` times, interleaved (`kernels.bench.time_interleaved`),
#: `reps // ROUNDS` timings each; the cell keeps the rounds and their spread.
ROUNDS = 5


def time_shape(d, n, names, reps, record, dl, seen, bh=None):
    """Every method at one (d, N): guards first (which also autotune), then per mode the methods timed together
    in interleaved rounds (`ROUNDS` × reps // ROUNDS timings each; the median of the round medians). `bh`: (batch,
    heads) instead of the grid's (16k tokens, width 2048); its cells' keys end in " B=b H=h"."""
    sets = _sets(d, n, bh=bh)
    b, h = bh or (max(1, TOKENS // n), WIDTH // d)
    where = f" B={b} H={h}" if bh else ""
    outs, cells = {}, {}
    for name in names:
        if dl.left() < 30:
            record["errors"].append(f"deadline: {name} d={d} N={n}{where} not timed")
            continue
        spec = METHODS.get(name)
        base = spec[2] if spec else None
        guard = {}
        try:
            outs[name], guard = _guard(name, sets, outs.get(base)) if not name.startswith("sdpa_") else (None, {})
            cells[name] = {"guard": guard, "picks": _new_picks(seen)}
        except Exception as e:  # noqa: BLE001 - a back end missing on this build: recorded, the rest goes on
            record["cells"][f"{name} d={d} N={n}{where}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        if guard and not guard.get("ok", True):
            print(f"GUARD FAILED: {name} d={d} N={n}{where}: {json.dumps(guard)}", flush=True)
    for mode in MODES:
        if not cells or dl.left() < 15:
            break
        try:
            got = time_interleaved({name: method_fn(name) for name in cells}, sets, mode, ROUNDS,
                                   max(1, reps // ROUNDS), 3)
        except Exception as e:  # noqa: BLE001 - one method failing its timing: time the others one by one
            record["errors"].append(f"interleaved d={d} N={n}{where} {mode}: {type(e).__name__}: {str(e)[:200]}")
            got = {}
            for name in cells:
                try:
                    got.update(time_interleaved({name: method_fn(name)}, sets, mode, ROUNDS, max(1, reps // ROUNDS), 3))
                except Exception as e2:  # noqa: BLE001
                    cells[name]["error"] = f"{type(e2).__name__}: {str(e2)[:300]}"
        for name, t in got.items():
            cells[name][mode] = {"ms": t["ms"], "rounds_ms": t["rounds"], "spread": t["spread"],
                                 "tflops": flops(b, h, n, d, True, mode) / (t["ms"] * 1e-3) / 1e12}
    for name, cell in cells.items():
        record["cells"][f"{name} d={d} N={n}{where}"] = cell
        log(dl, f"d={d} N={n}{where} {name:14s} " + "  ".join(
            f"{m} {cell[m]['tflops']:6.1f} (±{50 * cell[m]['spread']:.0f} %)" for m in MODES if m in cell)
            + (f" {cell.get('error', '')}"))
    return sets


def time_pairs(d, n, sets, pairs, reps, record, dl):
    """Each (method, method with a fix) pair timed in alternation: the fix's cost as the median per-pair ratio."""
    outs = {}
    for base, fix in pairs:
        if dl.left() < 15:
            record["errors"].append(f"deadline: pair {base}/{fix} d={d} N={n} not timed")
            continue
        twin = FIX_METHODS[fix][2]                   # a tie test's other form: the same forward bits
        try:
            with torch.no_grad():
                outs[fix] = method_fn(fix)(*sets[0][:3])
                cell = {"O_mismatch_vs_" + twin: _mismatch(outs[fix], outs[twin])} if twin in outs else {}
            for mode in MODES:
                ta, tb, r = time_paired(method_fn(base), method_fn(fix), sets, mode, reps, 3)
                cell[mode] = {"ms_base": ta, "ms_fix": tb, "cost": r - 1}
        except Exception as e:  # noqa: BLE001 - recorded, the other pairs go on
            cell = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        record["pairs"][f"{fix}/{base} d={d} N={n}"] = cell
        log(dl, f"d={d} N={n} {fix}/{base}: " + "  ".join(f"{m} {100 * cell[m]['cost']:+5.1f}%" for m in MODES
                                                            if m in cell) + f" {cell.get('error', '')}")


def run_timings(dl: Deadline, bench: dict, pairs_rec: dict, failed: set, reps: int, pair_reps: int):
    names = [m for m in METHODS if not _uses_failed(m, failed)]
    pairs = [p for p in PAIRS if not (_uses_failed(p[0], failed) or _uses_failed(p[1], failed))]
    seen = set()
    for b, h, n, d in EXTRA_SHAPES:   # first: the training step's shape (small, quick)
        time_shape(d, n, names, reps, bench, dl, seen, bh=(b, h))
        torch.cuda.empty_cache()
    for d in HEAD_DIMS:
        for n in SEQ_LENS:
            sets = time_shape(d, n, names, reps, bench, dl, seen)
            time_pairs(d, n, sets, pairs, pair_reps, pairs_rec, dl)
            del sets
            torch.cuda.empty_cache()


# -- phase 6: host time per call ---------------------------------------------------------------------------------
def host_times(dl: Deadline, record: dict, calls=200, rounds=7):
    """Wall time per call of `calls` back-to-back calls on (1, 1, 128, 64), causal BF16, every method once per round
    (interleaved, so that host drift hits all alike); median over rounds, in µs."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def sdpa(backend):
        def fn(a, b, c):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(a, b, c, is_causal=True)
        return fn
    attn = {"sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
            "dropin": lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True),
            "dropin_robust": lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix="robust"),
            "dropin_next": lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, tuning=NEXT),
            "dropin_robust_next": lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix="robust",
                                                                          tuning=NEXT)}
    runs = {}
    for name, fn in attn.items():
        runs[f"{name} fwd"] = lambda fn=fn: fn(q, k, v)
        runs[f"{name} fwd_bwd"] = lambda fn=fn: torch.autograd.grad(fn(qg, kg, vg), (qg, kg, vg), do)
    samples = {key: [] for key in runs}
    for r in range(rounds + 1):
        for key, run in runs.items():
            with torch.no_grad() if key.endswith(" fwd") else torch.enable_grad():
                for _ in range(20 if r == 0 else 0):
                    run()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    run()
                torch.cuda.synchronize()
            if r:
                samples[key].append(1e6 * (time.perf_counter() - t0) / calls)
        if dl.left() < 20:
            break
    record.update({key: {"median_us": round(statistics.median(v), 2), "min_us": round(min(v), 2)}
                   for key, v in samples.items() if v})
    record["shape"], record["calls"], record["rounds"] = [1, 1, 128, 64], calls, rounds
    log(dl, "host: " + ", ".join(f"{key} {val['median_us']:.0f}" for key, val in record.items()
                                  if isinstance(val, dict)))



# -- phase 7: chapter 6's normaliser experiment, and the summary ------------------------------------------------
def normaliser(dl: Deadline, record: dict) -> None:
    from lpfail import results
    from lpfail.experiments import prod_kernels as pk
    t0 = time.time()
    res = results.run("prod_normaliser", directory=OUT)
    rows = pk.normaliser_summary(res)
    record["normaliser"] = {"wall_s": round(time.time() - t0, 1), "methods_run": str(res["methods_run"]),
                            "rows": [{**r, "shares": {k: round(v, 4) for k, v in r["shares"].items()}} for r in rows]}
    log(dl, f"prod_normaliser stored under {OUT} ({time.time() - t0:.0f} s)")


def summary(bench: dict, pairs: dict, host: dict, checks: dict) -> str:
    """The short table: TFLOP/s per method (fwd ; fwd+bwd at N = 1k / 2k / 4k / 8k), ratios to cuDNN, fix costs."""
    lines = [f"checks: {sum(r['ok'] for r in checks.get('checks', {}).values())} of {len(checks.get('checks', {}))} "
             f"passed; failures: {checks.get('check_failures') or 'none'}"]
    cells = bench["cells"]

    def tf(name, d, n, mode):
        c = cells.get(f"{name} d={d} N={n}", {})
        return c[mode]["tflops"] if mode in c else math.nan
    for d in HEAD_DIMS:
        lines.append(f"d={d}: TFLOP/s fwd ; fwd+bwd at N = " + " / ".join(str(n) for n in SEQ_LENS)
                     + " | ratio to cuDNN fwd ; fwd+bwd")
        for name in METHODS:
            vals = {m: [tf(name, d, n, m) for n in SEQ_LENS] for m in MODES}
            ratio = {m: [tf(name, d, n, m) / tf("sdpa_cudnn", d, n, m) for n in SEQ_LENS] for m in MODES}
            fmt = lambda xs, f: " / ".join("  -  " if math.isnan(x) else f.format(x) for x in xs)  # noqa: E731
            lines.append(f"  {name:11s} {fmt(vals['fwd'], '{:4.0f}')} ; {fmt(vals['fwd_bwd'], '{:4.0f}')} | "
                         f"{fmt(ratio['fwd'], '{:4.2f}')} ; {fmt(ratio['fwd_bwd'], '{:4.2f}')}")
    lines.append("fix cost (alternating), fwd ; fwd+bwd at N = " + " / ".join(str(n) for n in SEQ_LENS))
    for base, fix in PAIRS:
        for d in HEAD_DIMS:
            get = lambda m: [pairs.get(f"{fix}/{base} d={d} N={n}", {}).get(m, {}).get("cost", math.nan)  # noqa: E731
                             for n in SEQ_LENS]
            fmt = lambda xs: " / ".join("  -  " if math.isnan(x) else f"{100 * x:+5.1f}%" for x in xs)  # noqa: E731
            lines.append(f"  {fix + '/' + base:32s} d={d:3d} {fmt(get('fwd'))} ; {fmt(get('fwd_bwd'))}")
    for b, h, n, d in EXTRA_SHAPES:
        lines.append(f"B={b} H={h} N={n} d={d}: TFLOP/s fwd ; fwd+bwd")
        for name in METHODS:
            c = cells.get(f"{name} d={d} N={n} B={b} H={h}", {})
            if any(m in c for m in MODES):
                lines.append(f"  {name:14s} " + " ; ".join(f"{c[m]['tflops']:4.0f}" if m in c else "  - "
                                                            for m in MODES))
    if host:
        keys = [k for k, v in host.items() if isinstance(v, dict)]
        lines.append("host µs per call (median): " + ", ".join(f"{k} {host[k]['median_us']:.0f}" for k in keys))
    norm = checks.get("normaliser", {}).get("rows", [])
    for r in norm:
        if r["tied"] and r["gap"] == 16.0 and r["n_ties"] == 2:
            lines.append(f"normaliser {r['pair']}: gap 16, 2 ties: {r['from_p']:+.2e} (ℓ from P) vs "
                         f"{r['from_pbar']:+.2e} (from P̄); share of back ends' bias " + ", ".join(
                             f"{k} {100 * v:.0f}%" for k, v in r["shares"].items()))
    return "\n".join(lines)


def _write(name: str, obj) -> None:
    (OUT / name).write_text(json.dumps(obj, indent=1, default=str) + "\n")


def _environment() -> dict:
    import triton
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw",
                          "--format=csv"], capture_output=True, text=True).stdout.strip()
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": sys.version.split()[0], "commit": os.environ.get("LPFAIL_GIT", "unknown"), "nvidia_smi": smi,
            "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _phase(dl: Deadline, record: dict, name: str, fn, *args) -> None:
    """Run one phase; an exception is recorded and printed, and the later phases still run."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the call's other phases are worth their minutes
        record.setdefault("phase_errors", {})[name] = f"{type(e).__name__}: {str(e)[-500:]}"
        log(dl, f"PHASE FAILED: {name}: {type(e).__name__}: {str(e)[-300:]}")


def run_pytest(dl: Deadline, record: dict) -> None:
    """The gpu-marked kernel tests (first configs), output in tests.txt; at most 150 s."""
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                              "tests/test_kernels.py", "tests/test_kernels_bwd.py", "tests/test_robust_fix.py",
                              "tests/test_dropin.py"], cwd=ROOT, capture_output=True, text=True, timeout=150,
                             env={**os.environ, kernels.fwd.TUNE_ENV: "0"})
        text, record["pytest_rc"] = run.stdout[-20000:] + run.stderr[-5000:], run.returncode
    except subprocess.TimeoutExpired as e:
        text, record["pytest_rc"] = f"timed out after 150 s\n{(e.stdout or b'')[-20000:]!r}", "timeout"
    (OUT / "tests.txt").write_text(text)
    log(dl, "pytest: " + (text.strip().splitlines() or ["no output"])[-1])


def focus(spec: dict) -> None:
    """Narrow the module's tables to `spec` (`FOCUS_DROPIN`): the timed methods, the fix methods, the pairs and the
    checked levers; a timed method whose base is left out is guarded against the first kernel timed instead."""
    global METHODS, FIX_METHODS, PAIRS, LEVERS
    first = next(m for m in spec["methods"] if METHODS[m] is not None)

    def rebased(m):
        if METHODS[m] is None:
            return None
        policy, tuning, base = METHODS[m]
        return policy, tuning, None if m == first else base if base in (None, *spec["methods"]) else first
    METHODS = {m: rebased(m) for m in spec["methods"]}
    FIX_METHODS = {m: FIX_METHODS[m] for m in spec["fix_methods"]}
    PAIRS = tuple(spec["pairs"])
    LEVERS = {k: LEVERS[k] for k in spec["levers"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=520.0, help="seconds for every phase together")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--pair-reps", type=int, default=40)
    ap.add_argument("--pytest", action="store_true", help="also run the gpu-marked kernel tests (≈ 90 s)")
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--focus", choices=["all", "dropin"], default="all",
                    help="dropin: only the drop-in's methods and fix pairs (FOCUS_DROPIN); no normaliser, "
                         "no host times")
    args = ap.parse_args(argv)
    if args.focus == "dropin":
        focus(FOCUS_DROPIN)
    dl = Deadline(args.budget)
    OUT.mkdir(parents=True, exist_ok=True)
    checks = {"environment": _environment(), "args": vars(args)}
    log(dl, json.dumps(checks["environment"]))
    if not args.no_precompile:
        _phase(dl, checks, "compile", precompile, dl, checks)
    failed = run_checks(dl, checks)
    _write("checks.json", checks)
    if args.pytest and dl.left() > 300:
        _phase(dl, checks, "pytest", run_pytest, dl, checks)
    bench, pairs, host = {"cells": {}, "errors": []}, {"pairs": {}, "errors": []}, {}
    # the cheap phases first, so that the timings use whatever the budget leaves and none of these is lost
    if dl.left() > 120 and args.focus == "all":
        _phase(dl, checks, "normaliser", normaliser, dl, checks)
        _write("checks.json", checks)
    if dl.left() > 100 and args.focus == "all":
        _phase(dl, checks, "host", host_times, dl, host)
        _write("host.json", host)
    try:
        run_timings(dl, bench, pairs, failed, args.reps, args.pair_reps)
    finally:
        _write("tune_bench.json", {**bench, "methods": {m: [str(s[0]), str(s[1])] if s else "sdpa"
                                                        for m, s in {**METHODS, **FIX_METHODS}.items()}})
        _write("tune_pairs.json", pairs)
    text = summary(bench, pairs["pairs"], host, checks)
    (OUT / "summary.txt").write_text(text + "\n")
    print(text, flush=True)
    bad = checks["check_failures"] or any(not c.get("guard", {}).get("ok", True) for c in bench["cells"].values())
    return 1 if bad or checks.get("pytest_rc") else 0


if __name__ == "__main__":
    sys.exit(main())
