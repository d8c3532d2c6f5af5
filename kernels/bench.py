"""Benchmark of the Triton kernels against PyTorch's SDPA (flash and cuDNN backends) and the reference.

Shown in chapter 5 ("Fix"): what the fix costs and how fast the paper's emulation mode runs. Run on a GPU:
``python -m lpfail run bench_kernels`` (or ``python -m lpfail bench kernels``). FLOPs are counted as
FlashAttention's papers do: forward 4·B·H·N²·d (halved when causal), backward 2.5× and forward+backward 3.5×
the forward. Each time is the median over `reps` CUDA-event timings after warm-up, rotating among
`input_sets` freshly drawn random inputs so that no timing reads the previous one's inputs from L2.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

from lpfail.results import experiment

MODES = ("fwd", "bwd", "fwd_bwd")


@dataclass(frozen=True)
class BenchKernelsConfig:
    seq_lens: tuple = (1024, 2048, 4096, 8192)
    head_dims: tuple = (64, 128)
    tokens: int = 16384            # batch × N: 16k tokens per step
    width: int = 2048              # heads × head_dim: 32 heads of 64 or 16 of 128
    causal: bool = True
    methods: tuple = ("sdpa_flash", "sdpa_cudnn", "triton", "triton_fix", "triton_fma", "triton_fma_fix",
                      "triton_paper", "reference_paper")
    # the fix's cost is timed a second time with the two kernels alternating (drift cancels in the ratio)
    pairs: tuple = (("triton", "triton_fix"), ("triton_fma", "triton_fma_fix"))
    pair_modes: tuple = ("fwd", "fwd_bwd")
    pair_reps: int = 60
    reference_max_n: int = 2048    # the pure-PyTorch reference is slow: time it up to this length only
    reps: int = 30
    warmup: int = 5
    input_sets: int = 3
    matmul_size: int = 8192        # the BF16 matrix product that gives the card's ceiling
    time_budget_s: float = 300.0   # stop measuring (leaving NaN) after this long, so a device call ends in time


def flops(b, h, n, d, causal, mode):
    """The attention FLOPs of one call (4·b·h·n²·d forward, halved when causal; ×2.5 backward, ×3.5 both)."""
    fwd = 4.0 * b * h * n * n * d / (2 if causal else 1)
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]


def _method_fn(method, causal):
    """(q, k, v) -> O for one method, or None when this machine lacks it."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lpfail import kernels
    from lpfail.precision import FA2_BF16, PAPER_BF16

    if method.startswith("sdpa"):
        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[method]

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn
    if method == "reference_paper":
        try:
            from lpfail.attention import attention
        except ImportError:
            return None
        return lambda q, k, v: attention(q, k, v, PAPER_BF16, causal=causal)
    policy = {"triton": FA2_BF16, "triton_fix": FA2_BF16.with_fix(), "triton_fma": FA2_BF16.replace(sub="fma"),
              "triton_fma_fix": FA2_BF16.replace(sub="fma").with_fix(), "triton_paper": PAPER_BF16,
              "triton_bk128": FA2_BF16.replace(block_k=128),
              "triton_bk128_fix": FA2_BF16.replace(block_k=128).with_fix(),
              "triton_robust": FA2_BF16.with_bounded_fix(),
              "triton_fma_robust": FA2_BF16.replace(sub="fma").with_bounded_fix()}[method]
    return lambda q, k, v: kernels.flash_attention(q, k, v, policy, causal=causal)


def _runner(fn, sets, mode):
    """(call, timed) for one method and mode: `call(i)` runs it on input set i % len(sets); `timed(i)` does the
    same between two CUDA events and returns the milliseconds. "bwd" replays a stored graph's backward."""
    import torch

    outs = [fn(q, k, v) for q, k, v, _ in sets] if mode == "bwd" else None

    def call(i):
        q, k, v, do = sets[i % len(sets)]
        if mode == "fwd":
            with torch.no_grad():
                fn(q, k, v)
        elif mode == "bwd":
            torch.autograd.grad(outs[i % len(sets)], (q, k, v), do, retain_graph=True)
        else:
            o = fn(q, k, v)
            torch.autograd.grad(o, (q, k, v), do)

    def timed(i):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call(i)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    return call, timed


def _time(fn, sets, mode, reps, warmup):
    """Median milliseconds of `mode` over `reps` CUDA-event timings, rotating among input sets."""
    import torch

    call, timed = _runner(fn, sets, mode)
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    return statistics.median(timed(i) for i in range(reps))


def time_paired(fn_a, fn_b, sets, mode, reps, warmup):
    """Two methods timed in alternation (A B, then B A, ...) on the same inputs, so that clock and thermal drift
    hit both alike: (median ms of A, median ms of B, median of the per-pair ratios B/A)."""
    import torch

    (call_a, timed_a), (call_b, timed_b) = _runner(fn_a, sets, mode), _runner(fn_b, sets, mode)
    for i in range(warmup):
        call_a(i)
        call_b(i)
    torch.cuda.synchronize()
    ta, tb = [], []
    for i in range(reps):
        if i % 2:
            tb.append(timed_b(i))
            ta.append(timed_a(i))
        else:
            ta.append(timed_a(i))
            tb.append(timed_b(i))
    return statistics.median(ta), statistics.median(tb), statistics.median(b / a for a, b in zip(ta, tb))


def _sync():
    import torch

    torch.cuda.synchronize()


def time_interleaved(fns: dict, sets, mode, rounds, reps, warmup, runner=None, sync=None) -> dict:
    """Every method of ``fns`` {name: fn} timed in ``rounds`` rounds that visit each in turn (the order reversed
    every other round), ``reps`` CUDA-event timings per visit. Clock and thermal drift over the minutes one shape
    takes then hit every method alike; timing each method once, one after the other, let two timings of one
    forward kernel in one run differ by ≈ 10 % (on an H200). Returns {name: {"ms": the median of the round
    medians, "rounds": the round medians, "spread": (max − min) / median of the rounds}}.
    ``runner``/``sync``: `_runner` and a CUDA synchronize (replaced in CPU tests)."""
    runner, sync = runner or _runner, sync or _sync
    if rounds < 1 or reps < 1:
        raise ValueError(f"time_interleaved: rounds and reps must be ≥ 1 (got {rounds}, {reps})")
    made = {name: runner(fn, sets, mode) for name, fn in fns.items()}
    for call, _ in made.values():
        for i in range(warmup):
            call(i)
    sync()
    per = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            timed = made[name][1]
            per[name].append(statistics.median(timed(i) for i in range(reps)))
    out = {}
    for name, xs in per.items():
        med = statistics.median(xs)
        out[name] = {"ms": med, "rounds": xs, "spread": (max(xs) - min(xs)) / med if med > 0 else float("nan")}
    return out


def _chosen_configs():
    """The autotuner's last pick for each kernel (what the timings just above ran), as text."""
    from lpfail.kernels import bwd as kb
    from lpfail.kernels import fwd as kf
    out = {}
    for name, fn in (("fwd", kf._attn_fwd), ("dkdv", kb._bwd_dkdv), ("dq", kb._bwd_dq)):
        cfg = getattr(fn, "best_config", None)
        if cfg is not None:
            out[name] = f"{cfg.kwargs} warps={cfg.num_warps} stages={cfg.num_stages}"
    return out


def _matmul_tflops(size, reps=10):
    import torch
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2.0 * size ** 3 * reps / (start.elapsed_time(end) * 1e-3) / 1e12


def _guard(fn, inputs, causal: bool, name: str) -> dict:
    """The timed kernel computes attention: its relative error against float64 SDPA on the first batch entry,
    and whether its second launch (the autotuner's pick, launched directly) gives the first's bits."""
    import torch

    q, k, v, _ = inputs
    with torch.no_grad():
        ref = torch.nn.functional.scaled_dot_product_attention(q[:1].double(), k[:1].double(), v[:1].double(),
                                                               is_causal=causal)
        o = fn(q[:1], k[:1], v[:1]).double()
        o2 = fn(q[:1], k[:1], v[:1]).double()   # the second launch runs the autotuner's pick
    return {name: float((o - ref).norm() / ref.norm()), f"{name}_second_launch_equal": bool(torch.equal(o, o2))}


@experiment("bench_kernels", config=BenchKernelsConfig, gpu=True)
def bench_kernels(cfg: BenchKernelsConfig) -> dict:
    """TFLOP/s of the Triton kernels, SDPA flash / cuDNN and the reference, fwd, bwd and fwd+bwd."""
    import torch

    shape = (len(cfg.head_dims), len(cfg.seq_lens), len(cfg.methods), len(MODES))
    ms = np.full(shape, np.nan)
    tflops = np.full(shape, np.nan)
    pair_shape = (len(cfg.head_dims), len(cfg.seq_lens), len(cfg.pairs), len(cfg.pair_modes))
    pair_ratio = np.full(pair_shape, np.nan)   # median over alternating pairs of ms(fix) / ms(base)
    pair_ms = np.full(pair_shape + (2,), np.nan)
    errors = []
    check = {}
    chosen = {}
    t0 = time.time()
    for i, d in enumerate(cfg.head_dims):
        h = cfg.width // d
        for j, n in enumerate(cfg.seq_lens):
            b = max(1, cfg.tokens // n)
            g = torch.Generator(device="cuda").manual_seed(1000 * d + n)
            sets = []
            for _ in range(cfg.input_sets):
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                               for _ in range(4))
                sets.append((q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do))
            for m, method in enumerate(cfg.methods):
                if method == "reference_paper" and n > cfg.reference_max_n:
                    continue
                if time.time() - t0 > cfg.time_budget_s:
                    errors.append(f"time budget: {method} d={d} n={n} not measured")
                    continue
                fn = _method_fn(method, cfg.causal)
                if fn is None:
                    continue
                if j == 0 and method.startswith("triton"):  # a guard: the timed kernel computes attention
                    check.update(_guard(fn, sets[0], cfg.causal, f"{method}_d{d}"))
                for a, mode in enumerate(MODES):
                    reps = cfg.reps if method != "reference_paper" else max(3, cfg.reps // 10)
                    try:
                        t = _time(fn, sets, mode, reps, cfg.warmup if method != "reference_paper" else 1)
                    except Exception as e:  # a backend missing on this build: record it, keep going
                        errors.append(f"{method} d={d} n={n} {mode}: {type(e).__name__}: {str(e)[:200]}")
                        continue
                    ms[i, j, m, a] = t
                    tflops[i, j, m, a] = flops(b, h, n, d, cfg.causal, mode) / (t * 1e-3) / 1e12
                if method.startswith("triton"):
                    chosen[f"{method} d={d} n={n}"] = _chosen_configs()
                print(f"[{time.time() - t0:6.1f}s] d={d:3d} N={n:5d} {method:16s} "
                      + "  ".join(f"{mode} {tflops[i, j, m, a]:6.1f}" for a, mode in enumerate(MODES)),
                      flush=True)
            for p, (base, fix) in enumerate(cfg.pairs):
                if time.time() - t0 > cfg.time_budget_s:
                    errors.append(f"time budget: pair {base}/{fix} d={d} n={n} not measured")
                    continue
                fa, fb = _method_fn(base, cfg.causal), _method_fn(fix, cfg.causal)
                for a, mode in enumerate(cfg.pair_modes):
                    ta, tb, r = time_paired(fa, fb, sets, mode, cfg.pair_reps, cfg.warmup)
                    pair_ms[i, j, p, a] = ta, tb
                    pair_ratio[i, j, p, a] = r
                print(f"[{time.time() - t0:6.1f}s] d={d:3d} N={n:5d} {fix}/{base} alternating: "
                      + "  ".join(f"{mode} {100 * (pair_ratio[i, j, p, a] - 1):+5.1f}%"
                                  for a, mode in enumerate(cfg.pair_modes)), flush=True)
            del sets
            torch.cuda.empty_cache()
    return {
        "ms": ms, "tflops": tflops,
        "head_dims": np.array(cfg.head_dims), "seq_lens": np.array(cfg.seq_lens),
        "methods": np.array(cfg.methods), "modes": np.array(MODES),
        "matmul_tflops": float(_matmul_tflops(cfg.matmul_size)),
        "errors": "\n".join(errors),
        "check_rel_err": json.dumps(check),
        "pairs": np.array(["/".join(p) for p in cfg.pairs]), "pair_modes": np.array(cfg.pair_modes),
        "pair_ratio": pair_ratio, "pair_ms": pair_ms,
        "configs": json.dumps(chosen),
    }


#: The kernels' speed targets, at N ≥ 2048 (both head dims): (ratio name, bound, "min" = at least / "max" = at most)
TARGETS = (("fwd / SDPA flash", 1.2, "min"), ("fwd+bwd / SDPA flash", 1.0, "min"),
           ("fwd+bwd / cuDNN", 0.95, "min"),
           ("fix cost, fwd+bwd", 0.03, "max"), ("PAPER_BF16 kernel / reference", 5.0, "min"))
TARGET_MIN_N = 2048


# -- the robust fix's cost: alternating timings only -------------------------------------------------------------
@dataclass(frozen=True)
class RobustCostConfig:
    """The robust fix (`BoundedMax`) against the same kernel without a fix, in both modes, and against
    Algorithm 3 (sub mode): alternating timings as `bench_kernels`' pairs, causal BF16, 16k tokens per call."""
    seq_lens: tuple = (2048, 4096, 8192)
    head_dims: tuple = (64, 128)
    tokens: int = 16384
    width: int = 2048
    pairs: tuple = (("triton", "triton_robust"), ("triton_fma", "triton_fma_robust"), ("triton_fix", "triton_robust"))
    modes: tuple = ("fwd", "fwd_bwd")
    reps: int = 60
    warmup: int = 5
    input_sets: int = 3
    time_budget_s: float = 420.0


#: The targets for the robust fix over the same kernel without a fix, at N ≥ 2048, both head dims and
#: both modes: (mode, bound on the cost as a fraction of time).
ROBUST_TARGETS = (("fwd_bwd", 0.03), ("fwd", 0.08))


@experiment("robust_cost", config=RobustCostConfig, gpu=True,
            description="the robust fix's cost in the Triton kernel, alternating timings (ch. 5; GPU)")
def robust_cost(cfg: RobustCostConfig) -> dict:
    """Per (head dim, N, pair, mode): the medians of both methods' times and the median per-pair ratio."""
    import torch

    shape = (len(cfg.head_dims), len(cfg.seq_lens), len(cfg.pairs), len(cfg.modes))
    ratio, ms = np.full(shape, np.nan), np.full(shape + (2,), np.nan)
    t0, errors = time.time(), []
    for i, d in enumerate(cfg.head_dims):
        for j, n in enumerate(cfg.seq_lens):
            b, h = max(1, cfg.tokens // n), cfg.width // d
            g = torch.Generator(device="cuda").manual_seed(1000 * d + n)
            sets = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                          .requires_grad_(k < 3) for k in range(4)) for _ in range(cfg.input_sets)]
            for p, (a, bb) in enumerate(cfg.pairs):
                for m, mode in enumerate(cfg.modes):
                    if time.time() - t0 > cfg.time_budget_s:
                        errors.append(f"time budget: {a}/{bb} d={d} n={n} {mode} not measured")
                        continue
                    ta, tb, r = time_paired(_method_fn(a, True), _method_fn(bb, True), sets, mode, cfg.reps,
                                            cfg.warmup)
                    ms[i, j, p, m], ratio[i, j, p, m] = (ta, tb), r
                    print(f"[{time.time() - t0:6.1f}s] d={d} N={n} {bb}/{a} {mode}: {100 * (r - 1):+.1f} %", flush=True)
            del sets
            torch.cuda.empty_cache()
    return _robust_arrays(cfg, ratio, ms, errors)


def _robust_arrays(cfg: RobustCostConfig, ratio, ms, errors) -> dict:
    return {"head_dims": np.array(cfg.head_dims), "seq_lens": np.array(cfg.seq_lens),
            "pairs": np.array(["/".join(p) for p in cfg.pairs]), "modes": np.array(cfg.modes),
            "pair_ratio": np.asarray(ratio, dtype=np.float64), "pair_ms": np.asarray(ms, dtype=np.float64),
            "errors": "\n".join(errors)}


def import_robust_cost(raw: dict, git: str, created: str, versions: dict, wall_s: float,
                       directory=None):
    """Store the JSON that ``tools/gpu_robust_cost.py`` wrote before it became this experiment (rows of
    {d, n, pair, mode, ms, cost_pct}) as the result ``robust_cost``, with the provenance the file lacks: the
    commit the device ran (``git``), when (``created``, ISO UTC) and its versions (from the call's log). Raises
    ValueError when a row of the default config's grid is missing, a row is unknown, or a field is empty."""
    from lpfail import results

    cfg = RobustCostConfig()
    for name, val in (("git", git), ("created", created)):
        if not val:
            raise ValueError(f"import_robust_cost: {name} is required (the file does not record it)")
    if not versions.get("torch") or not versions.get("triton"):
        raise ValueError("import_robust_cost: versions must name torch and triton")
    pairs = ["/".join(p) for p in cfg.pairs]
    shape = (len(cfg.head_dims), len(cfg.seq_lens), len(cfg.pairs), len(cfg.modes))
    ratio, ms = np.full(shape, np.nan), np.full(shape + (2,), np.nan)
    for row in raw.get("rows", []):
        key = (row.get("d"), row.get("n"), "/".join(row.get("pair", [])), row.get("mode"))
        try:
            idx = (list(cfg.head_dims).index(key[0]), list(cfg.seq_lens).index(key[1]), pairs.index(key[2]),
                   list(cfg.modes).index(key[3]))
        except ValueError:
            raise ValueError(f"import_robust_cost: row {key} is not in the grid of RobustCostConfig") from None
        if "error" in row:
            continue
        ratio[idx] = 1 + row["cost_pct"] / 100
        ms[idx] = row["ms"]
    if np.isnan(ratio).any():
        raise ValueError(f"import_robust_cost: {int(np.isnan(ratio).sum())} of {ratio.size} timings missing")
    if raw.get("device") is None or raw.get("torch") != versions["torch"]:
        raise ValueError("import_robust_cost: the file's device/torch do not match the versions given")
    data = _robust_arrays(cfg, ratio, ms, [])
    prov = {"device": raw["device"], "git": git, "created": created, "versions": dict(versions),
            "imported_from": "tools/gpu_robust_cost.py JSON", "collected_on": results.device_name(),
            "collected_git": results.git_commit(), "runs_wall_s": float(wall_s), "runs_gpus": [raw["device"]]}
    return results.save("robust_cost", cfg, data, 0.0, directory=directory, provenance=prov)


def robust_summary(res) -> list[dict]:
    """One row per (pair, mode): worst and best cost over the stored shapes, and the target where
    `ROBUST_TARGETS` sets one (robust over the same kernel without a fix): met or not, and by how much the worst
    misses it."""
    pairs, modes = [str(p) for p in res["pairs"]], [str(m) for m in res["modes"]]
    ratio = np.asarray(res["pair_ratio"], dtype=np.float64)
    bounds = dict(ROBUST_TARGETS)
    out = []
    for p, pair in enumerate(pairs):
        base, fix = pair.split("/")
        for m, mode in enumerate(modes):
            c = ratio[:, :, p, m] - 1
            worst, best = float(np.nanmax(c)), float(np.nanmin(c))
            bound = bounds.get(mode) if fix.endswith("robust") and not base.endswith("fix") else None
            out.append({"pair": pair, "base": base, "fix": fix, "mode": mode, "worst": worst, "best": best,
                        "per_shape": {(int(d), int(n)): float(c[i, j]) for i, d in enumerate(res["head_dims"])
                                      for j, n in enumerate(res["seq_lens"])},
                        "bound": bound, "met": None if bound is None else worst <= bound,
                        "excess": None if bound is None else worst - bound,
                        "shapes_over": None if bound is None else int((c > bound).sum())})
    return out


def robust_markdown(res) -> str:
    """`robust_summary` as a Markdown table: pair, mode, target, worst and best measured, met, worst − target."""
    lines = ["| robust fix against | pass | target | worst | best | shapes over target | met | worst − target |",
             "|---|---|---|---|---|---|---|---|"]
    n_shapes = len(res["head_dims"]) * len(res["seq_lens"])
    for r in robust_summary(res):
        against = {"triton": "no fix, sub", "triton_fma": "no fix, fma", "triton_fix": "Algorithm 3, sub"}.get(
            r["base"], r["base"])
        tgt = "—" if r["bound"] is None else f"≤ {100 * r['bound']:g} %"
        met = {True: "yes", False: "**no**", None: "—"}[r["met"]]
        over = "—" if r["bound"] is None else f"{r['shapes_over']} of {n_shapes}"
        exc = "—" if r["excess"] is None else f"{100 * r['excess']:+.1f} points"
        lines.append(f"| {against} (`{r['fix']}`) | {r['mode'].replace('_', '+')} | {tgt} | "
                     f"{100 * r['worst']:+.1f} % | {100 * r['best']:+.1f} % | {over} | {met} | {exc} |")
    return "\n".join(lines)


def summary(res, method: str = "triton") -> list[dict]:
    """One row per (head dim, N): `method`'s speed against SDPA flash and cuDNN (fwd, fwd+bwd), the fix's cost
    (fraction of time) from the alternating timings (NaN when not measured) and from the two methods' separate
    medians (`*_medians`), and the PAPER_BF16 kernel's speed-up over the reference (NaN where the reference
    was not timed). Every ratio the benchmark's table, chapter 5 and the verdict show comes from here."""
    names, modes = [str(m) for m in res["methods"]], [str(m) for m in res["modes"]]
    tf, ms = np.asarray(res["tflops"]), np.asarray(res["ms"])
    pairs = [str(p) for p in res["pairs"]] if "pairs" in res else []
    pmodes = [str(m) for m in res["pair_modes"]] if "pair_modes" in res else []
    fix_pair = f"{method}/{method}_fix"
    rows = []
    for i, d in enumerate(res["head_dims"]):
        for j, n in enumerate(res["seq_lens"]):
            def r(a, b, mode, arr=tf):
                if a not in names or b not in names:
                    return math.nan
                k = modes.index(mode)
                return float(arr[i, j, names.index(a), k] / arr[i, j, names.index(b), k])

            def cost(mode):
                if fix_pair in pairs and mode in pmodes:
                    return float(res["pair_ratio"][i, j, pairs.index(fix_pair), pmodes.index(mode)] - 1)
                return math.nan
            rows.append({
                "head_dim": int(d), "n": int(n),
                "fwd_vs_flash": r(method, "sdpa_flash", "fwd"), "fwd_bwd_vs_flash": r(method, "sdpa_flash", "fwd_bwd"),
                "fwd_vs_cudnn": r(method, "sdpa_cudnn", "fwd"), "fwd_bwd_vs_cudnn": r(method, "sdpa_cudnn", "fwd_bwd"),
                "fix_cost_fwd": cost("fwd"), "fix_cost_fwd_bwd": cost("fwd_bwd"),
                "fix_cost_fwd_medians": r(f"{method}_fix", method, "fwd", arr=ms) - 1,
                "fix_cost_fwd_bwd_medians": r(f"{method}_fix", method, "fwd_bwd", arr=ms) - 1,
                "paper_speedup": r("reference_paper", "triton_paper", "fwd_bwd", arr=ms),
            })
    return rows


def targets(res, method: str = "triton") -> list[dict]:
    """The speed targets (`TARGETS`) against `summary`: for each, the worst measured value at N ≥ 2048 (over both head
    dims; the PAPER_BF16 speed-up over every N where the reference was timed) and whether it is met."""
    rows = summary(res, method)
    big = [r for r in rows if r["n"] >= TARGET_MIN_N]
    keys = {"fwd / SDPA flash": ("fwd_vs_flash", big), "fwd+bwd / SDPA flash": ("fwd_bwd_vs_flash", big),
            "fwd+bwd / cuDNN": ("fwd_bwd_vs_cudnn", big),
            "fix cost, fwd+bwd": ("fix_cost_fwd_bwd", big), "PAPER_BF16 kernel / reference": ("paper_speedup", rows)}
    out = []
    for name, bound, kind in TARGETS:
        key, subset = keys[name]
        vals = [r[key] for r in subset if not math.isnan(r[key])]
        if not vals:
            out.append({"target": name, "bound": bound, "kind": kind, "worst": math.nan, "best": math.nan,
                        "met": None})
            continue
        worst, best = (min(vals), max(vals)) if kind == "min" else (max(vals), min(vals))
        out.append({"target": name, "bound": bound, "kind": kind, "worst": worst, "best": best,
                    "met": worst >= bound if kind == "min" else worst <= bound})
    return out


def _fmt(x, pct=False):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{100 * x:+.1f} %" if pct else f"{x:.2f}×"


def summary_markdown(res, methods=("triton", "triton_fma")) -> str:
    """`summary` of each method as one Markdown table: speed against SDPA flash and cuDNN, and the fix's cost."""
    head = ("| method | d | N | fwd / flash | fwd+bwd / flash | fwd / cuDNN | fwd+bwd / cuDNN | fix: fwd | "
            "fix: fwd+bwd |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for m in methods:
        for r in summary(res, m):
            lines.append(f"| `{m}` | {r['head_dim']} | {r['n']} | {_fmt(r['fwd_vs_flash'])} | "
                         f"{_fmt(r['fwd_bwd_vs_flash'])} | {_fmt(r['fwd_vs_cudnn'])} | {_fmt(r['fwd_bwd_vs_cudnn'])} | "
                         f"{_fmt(r['fix_cost_fwd'], True)} | {_fmt(r['fix_cost_fwd_bwd'], True)} |")
    return "\n".join(lines)


def targets_markdown(res, methods=("triton", "triton_fma")) -> str:
    """`targets` of each method as one Markdown table: the bound, the worst and best measured value, met or not."""
    lines = ["| method | target | bound | worst measured | best measured | met |", "|---|---|---|---|---|---|"]
    for m in methods:
        for t in targets(res, m):
            pct = t["target"].startswith("fix")
            bound = (f"≤ {100 * t['bound']:g} %" if pct else f"≥ {t['bound']:g}×")
            met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
            lines.append(f"| `{m}` | {t['target']} | {bound} | {_fmt(t['worst'], pct)} | {_fmt(t['best'], pct)} | "
                         f"{met} |")
    return "\n".join(lines)


def table(res) -> str:
    """The benchmark as a text table: TFLOP/s per method and mode, and the ratios `TARGETS` uses."""
    methods = [str(m) for m in res["methods"]]
    modes = [str(m) for m in res["modes"]]
    tf = res["tflops"]
    lines = []
    for i, d in enumerate(res["head_dims"]):
        lines.append(f"head dim {int(d)}: TFLOP/s at N = " + " / ".join(str(int(n)) for n in res["seq_lens"]))
        for m, method in enumerate(methods):
            cells = []
            for a, mode in enumerate(modes):
                cells.append(mode + " " + " / ".join("  -  " if math.isnan(x) else f"{x:5.0f}" for x in tf[i, :, m, a]))
            lines.append(f"  {method:16s} " + " | ".join(cells))
        rows = {m: [r for r in summary(res, m) if r["head_dim"] == int(d)] for m in ("triton", "triton_fma")
                if m in methods}
        join = lambda key, m, fmt: " / ".join(fmt(r[key]) for r in rows[m])  # noqa: E731  (one value per N)
        ratio, pct = (lambda x: f"{x:4.2f}"), (lambda x: f"{100 * x:+.1f}%")  # noqa: E731
        for m in rows:
            for ref, name in (("flash", "sdpa_flash"), ("cudnn", "sdpa_cudnn")):
                if name in methods:
                    lines.append(f"  {m}/{name}: fwd {join(f'fwd_vs_{ref}', m, ratio)}, "
                                 f"fwd+bwd {join(f'fwd_bwd_vs_{ref}', m, ratio)}")
        for m in rows:
            if f"{m}_fix" in methods:
                lines.append(f"  fix cost ({m}_fix vs {m}), fwd+bwd time: {join('fix_cost_fwd_bwd_medians', m, pct)}")
        if "pair_ratio" in res:
            for m in rows:
                if f"{m}/{m}_fix" in [str(p) for p in res["pairs"]]:
                    lines.append(f"  fix cost ({m}_fix vs {m}), alternating timings: "
                                 f"fwd {join('fix_cost_fwd', m, pct)}, fwd_bwd {join('fix_cost_fwd_bwd', m, pct)}")
        if rows and "triton_paper" in methods and "reference_paper" in methods:
            lines.append("  PAPER_BF16 speed-up of the kernel over the reference, fwd+bwd: " + join(
                "paper_speedup", next(iter(rows)), lambda x: "  -  " if math.isnan(x) else f"{x:.1f}x"))
    lines.append(f"BF16 {8192}^3 matmul: {res['matmul_tflops']:.0f} TFLOP/s")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    import sys

    from lpfail import results
    print(table(results.read_result("bench_kernels", results.results_dir())) if len(sys.argv) < 2 else "")


# -- host time per call of a tiny problem (tools/gpu_overhead.py; target HOST_TARGET_US) ----------------------------
HOST_FILE = "kernels_gpu/overhead.json"   # beside the other GPU files (not an experiment of the cache)
HOST_TARGET_US = 40.0
_HOST_ROWS = (("dropin", "fwd", "drop-in, forward"), ("dropin", "robust_fwd", "drop-in + robust fix, forward"),
              ("dropin", "policy_fwd", "policy style, forward"), ("dropin", "fwd_bwd", "drop-in, fwd + bwd"),
              ("dropin", "robust_fwd_bwd", "drop-in + robust fix, fwd + bwd"))
_HOST_KEYS = ("device", "when_utc", "commit", "shape", "dropin", "dropin_jit_path", "direct_equals_jit_bits",
              "sdpa_flash", "sdpa_cudnn", "target_us")


def load_host_time(directory=None) -> dict:
    """The stored host-time measurement (results/kernels_gpu/overhead.json): FileNotFoundError naming the
    command that makes it when absent, ValueError when it is not such a record."""
    from lpfail import results

    p = (directory or results.results_dir()) / HOST_FILE
    if not p.is_file():
        raise FileNotFoundError(f"no stored host-time measurement ({HOST_FILE}); make it on a GPU with "
                                "`python3 tools/gpu_overhead.py OUT.json` and copy it there")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{HOST_FILE} is corrupt: {e}") from None
    missing = [k for k in _HOST_KEYS if k not in d]
    if missing:
        raise ValueError(f"{HOST_FILE} is not a host-time record (missing {missing})")
    return d


#: The host-time target for forward + backward: the drop-in's at most this multiple of SDPA flash's
HOST_FWD_BWD_TARGET = 1.5


def host_fwd_bwd_facts(d: dict) -> dict[str, str]:
    """The forward + backward host time of a `load_host_time` record as phrases for the book: the drop-in's and SDPA
    flash's µs per call, their ratio against `HOST_FWD_BWD_TARGET` ("met"/"missed"), and — where the record has it
    (older records of tools/gpu_overhead.py lack it) — the no-op Python autograd.Function's fwd+bwd, the floor of any
    drop-in whose backward is Python, and its share of the drop-in's time. ValueError if a needed value is missing
    or not positive."""
    def pos(grp, key):
        v = (d.get(grp) or {}).get(key)
        if not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"host-time record: {grp}.{key} must be a positive number (got {v!r})")
        return float(v)

    ours, sdpa = pos("dropin", "fwd_bwd"), pos("sdpa_flash", "fwd_bwd")
    ratio = ours / sdpa
    out = {"host_fb": f"{ours:.0f} µs", "host_fb_sdpa": f"{sdpa:.0f} µs", "host_fb_ratio": f"{ratio:.2f} ×",
           "host_fb_target": f"{HOST_FWD_BWD_TARGET:g} ×",
           "host_fb_met": "met" if ratio <= HOST_FWD_BWD_TARGET else "missed"}
    if "noop_function" in d:
        floor = pos("noop_function", "fwd_bwd")
        out.update(host_floor=f"{floor:.0f} µs", host_floor_sdpa=f"{floor / sdpa:.2f} ×",
                   host_floor_share=f"{100 * floor / ours:.0f} %", host_above_floor=f"{ours - floor:.0f} µs")
    return out


def sdpa_host_spread(record: dict, directory=None) -> dict[str, str]:
    """SDPA flash's forward + backward host time per call over every stored record of it: `record` (the host-time
    record `load_host_time` gave) and each tune call's host.json beside it (results/kernels_gpu/tune_*/): how much
    the host, not the code, moves the number. Phrases ``host_sdpa_lo``, ``host_sdpa_hi`` (µs) and ``host_sdpa_n``
    (records); ValueError when fewer than two."""
    from lpfail import results

    root = ((directory or results.results_dir()) / HOST_FILE).parent
    vals = [float(record["sdpa_flash"]["fwd_bwd"])]
    for p in sorted(root.glob("tune_*/host.json")):
        cell = json.loads(p.read_text()).get("sdpa_flash fwd_bwd")
        if cell is not None:
            vals.append(float(cell["median_us"]))
    if len(vals) < 2:
        raise ValueError(f"SDPA flash's host time needs two stored records to spread (found {len(vals)} under {root})")
    return {"host_sdpa_lo": f"{min(vals):.0f} µs", "host_sdpa_hi": f"{max(vals):.0f} µs", "host_sdpa_n": str(len(vals))}


def host_time_rows(d: dict) -> list[list[str]]:
    """Rows (call, direct launch µs, through Triton's JIT µs, SDPA flash µs, SDPA cuDNN µs, target met) of a
    `load_host_time` record; SDPA's columns on the forward and forward + backward rows only."""
    tgt = float(d.get("target_us", HOST_TARGET_US))
    rows = []
    for grp, key, label in _HOST_ROWS:
        v, jit = d[grp].get(key), d["dropin_jit_path"].get(key)
        if v is None:
            continue
        sd = key if key in ("fwd", "fwd_bwd") else None
        cell = lambda x: "—" if x is None else f"{x:.0f}"
        met = ("yes" if v <= tgt else "no") if key in ("fwd", "robust_fwd", "policy_fwd") else "—"
        rows.append([label, f"{v:.1f}", cell(jit), cell(d["sdpa_flash"].get(sd) if sd else None),
                     cell(d["sdpa_cudnn"].get(sd) if sd else None), met])
    return rows
