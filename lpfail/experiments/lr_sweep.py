"""Chapter 1 ("Symptom"), rebuilt: learning-rate sensitivity as the small-scale proxy of the paper's failure.

Issue 11. Wortsman et al., *Small-scale proxies for large-scale Transformer training instabilities* (arXiv
2309.14322), reproduce attention-logit growth in small models by training them at high learning rates, and
summarise a curve of final loss against learning rate by its **LR sensitivity** (their Sec. 3):

    S = mean over the grid of  min(L(η), L_init)  −  min over the grid of L(η)

where L(η) is the final (validation) loss at learning rate η and L_init the loss at initialization; a run whose
loss turns non-finite counts as L_init. A model that trains well at every learning rate has S ≈ 0; one that
degrades or diverges at the high end has a large S. Here every point of the grid is trained under several
attention arithmetics (variants: same init, same batches, only the attention differs) and two model sizes,
and the sensitivities are compared by rules fixed in code before any run of this experiment
(`PREREGISTERED_ON`, `HYPOTHESES`, `judge`).

Variants (`VARIANTS`; every one runs the pure-PyTorch reference `lpfail.attention` except S):

====== ============================================ ====================================================
A      ``reference(PAPER_BF16)``                    the paper's failing arithmetic
C      ``reference(FP32)``                          the high-precision control (same tiling)
D      ``reference(FA2_BF16)``                      production-kernel arithmetic (FP32 scores, m, ℓ, Ō)
B      ``reference(PAPER_BF16_OFFICIAL_FIX)``       the paper's official fix, clamp and masking included
S      ``sdpa``                                     PyTorch's fused attention, what users run
A_sr   ``reference(PAPER_BF16,rounding=sr)``        A with stochastic rounding of P̄V, Ō and O: the same
                                                    8-bit mantissas without the bias (the direct test of
                                                    "harmful because biased")
A_qk   A + ``qk_norm``                              LayerNorm of q and k per head
C_qk   C + ``qk_norm``
====== ============================================ ====================================================

The pieces, usable separately:

* `train_config(c, point, out_dir)` — the `TrainConfig` of one (size, variant, lr, seed) point.
* `plan(c)` — every `Point` of the grid, in the order the driver starts them.
* `run_points(c, points, root, budget_s)` — the runs as subprocesses (`lpfail.experiments.driver.sweep`,
  N at a time per GPU, a wall-clock budget, continuation of cut-off runs from their checkpoints), each
  finished run summarised (`summarize_run`) and added at once to a *part* file under
  ``results/lr_sweep_parts/`` (so a call that is cut off keeps every run it finished).
* `load_parts()` — the stored run summaries of every part, keyed by point; parts from several GPU calls merge,
  and a point already stored is never run again (its key includes a hash of its TrainConfig).
* `assemble(c, runs)` — the arrays of the stored result; `analyse(res)` — sensitivities, bootstrap CIs over
  seeds, the learning rate where the loss first exceeds the best by 10 %, and the pre-registered verdicts.

``python -m lpfail run lr_sweep [--set variants=A,C --set lrs=0.01,0.02 ...]`` runs the missing points of a
(sub)grid (with a progress bar and ETA on a terminal) and stores the result once every point is in;
``python -m lpfail.experiments.lr_sweep collect`` stores it from the parts on any machine (e.g. the CPU that
the parts were copied to); ``... status`` says what is stored. Scheduling — ``LPFAIL_LR_SWEEP_ROOT`` (default
/tmp/lpfail_lr_sweep), ``LPFAIL_LR_SWEEP_BUDGET_S`` (default 3,600 s), ``LPFAIL_LR_SWEEP_PARALLEL`` (default
12 processes per GPU), ``LPFAIL_LR_SWEEP_UNCAPTURED`` (variants whose steps run without CUDA-graph capture,
e.g. "A_sr" when `graph_checks` found its captured random draws differ) — is not part of the config: a run's
numbers do not depend on it.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpfail import precision as _precision
from lpfail import results
from lpfail.experiments import driver

# -- the pre-registration ----------------------------------------------------------------------------------
#: Fixed on 2026-12-01, before any run of this experiment. The only outcomes seen then were those of two
#: unregistered probes with other settings (../shared/proxy-findings.md: 2 seeds, a constant schedule,
#: training loss), which suggested A − C > 0 at lr ≥ 1e-2.
PREREGISTERED_ON = "2026-12-01"
CONFIDENCE = 0.95  # two-sided percentile bootstrap interval
N_BOOTSTRAP = 10_000  # resamples of the seeds (with replacement; the same resample for every variant and lr)
BOOTSTRAP_SEED = 0

HYPOTHESES = {
    "H1": "the LR sensitivity of A (PAPER_BF16) exceeds that of C (FP32) at the smaller size: S(A) − S(C) > 0",
    "H2": "stochastic rounding of A's output path closes at least half of the A − C gap at the smaller size: "
          "S(A_sr) − S(C) − ½·(S(A) − S(C)) < 0",
    "H3": "QK-norm closes at least half of the A − C gap at the smaller size: "
          "S(A_qk) − S(C_qk) − ½·(S(A) − S(C)) < 0",
    "H4": "(descriptive) the A − C gap at the larger size is at least the gap at the smaller: "
          "(S(A) − S(C))_large − (S(A) − S(C))_small ≥ 0",
}
RULE = ("A statistic's hypothesis is 'supported' when its 95 % bootstrap interval (10,000 resamples of the seeds, "
        "paired across variants) lies entirely on the hypothesised side of 0, 'refuted' when it lies entirely on "
        "the other side, else 'inconclusive'. H2 and H3 need a gap to close: unless H1 is supported they read "
        "'no gap to close' (their statistics are still reported). H4 is descriptive: its point estimate and "
        "interval are reported with the same three words.")


def sensitivity(loss_eff: np.ndarray) -> np.ndarray:
    """LR sensitivity of curves ``loss_eff[..., lr]`` (already min(L, L_init), non-finite → L_init):
    mean over the grid minus the minimum over the grid (Wortsman et al. 2023, Sec. 3)."""
    x = np.asarray(loss_eff, dtype=np.float64)
    return x.mean(axis=-1) - x.min(axis=-1)


def effective_loss(val_final: np.ndarray, val_init: np.ndarray) -> np.ndarray:
    """min(final loss, loss at initialization), with a non-finite final loss counted as the init loss."""
    final = np.asarray(val_final, dtype=np.float64)
    init = np.asarray(val_init, dtype=np.float64)
    return np.where(np.isfinite(final), np.minimum(final, init), init)


def bootstrap_seed_indices(n_seeds: int, n: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(n, n_seeds) indices into the seed axis: the resamples every statistic shares (paired design)."""
    return np.random.default_rng(seed).integers(0, n_seeds, size=(n, n_seeds))


def sensitivities(loss_eff: np.ndarray, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """loss_eff (variants, lrs, seeds) → (point estimates (variants,), bootstrap draws (variants, n)).

    The curve of a variant is the mean over seeds at each learning rate; a resample replaces the seeds by
    ``idx`` (the same for every variant, so differences between variants are paired by seed)."""
    x = np.asarray(loss_eff, dtype=np.float64)
    point = sensitivity(x.mean(axis=-1))
    if idx is None:
        idx = bootstrap_seed_indices(x.shape[-1])
    curves = x[..., idx].mean(axis=-1)  # (variants, lrs, n)
    return point, sensitivity(np.moveaxis(curves, 1, -1))


def sensitivity_draws(res, size: str = "small") -> tuple[dict[str, tuple[float, np.ndarray]], list[str]]:
    """Per variant of an assembled result (`assemble`; also fix_training's, compiled_sweep's) at ``size``: its
    LR sensitivity S and S's bootstrap draws over the seeds (the shared resamples), as {variant: (S, draws)},
    and the variants in the result's order."""
    eff = effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])   # (V, lrs, seeds)
    variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
    point, boot = sensitivities(eff, bootstrap_seed_indices(eff.shape[-1]))
    return {v: (float(point[i]), boot[i]) for i, v in enumerate(variants)}, variants


def interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    a = (1 - confidence) / 2
    return float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a))


def judge(lo: float, hi: float, side: str) -> str:
    """'supported' / 'refuted' / 'inconclusive' for an interval [lo, hi] and the hypothesised side of 0
    ("above" or "below")."""
    if side not in ("above", "below"):
        raise ValueError(f"side must be 'above' or 'below' (got {side!r})")
    above, below = lo > 0, hi < 0
    if side == "above":
        return "supported" if above else "refuted" if below else "inconclusive"
    return "supported" if below else "refuted" if above else "inconclusive"


def lr_exceeding(curve: np.ndarray, lrs, factor: float = 1.10) -> float:
    """The smallest learning rate above the best one whose loss exceeds the best loss by ``factor`` (NaN if
    none does): where the curve turns up."""
    curve = np.asarray(curve, dtype=np.float64)
    best = int(np.argmin(curve))
    for i in range(best + 1, len(curve)):
        if curve[i] > factor * curve[best]:
            return float(lrs[i])
    return float("nan")


# -- variants, sizes, the config ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    attention: str  # TrainConfig.attention
    qk_norm: bool
    label: str
    train: tuple = ()  # further TrainConfig fields as (name, value) pairs (the `cures` variants' z-loss, soft-cap)


VARIANTS: dict[str, Variant] = {
    "A": Variant("reference(PAPER_BF16)", False, "A: PAPER_BF16 (the paper's failing arithmetic)"),
    "C": Variant("reference(FP32)", False, "C: FP32 attention (the control)"),
    "D": Variant("reference(FA2_BF16)", False, "D: FA2_BF16 (production-kernel arithmetic)"),
    "B": Variant("reference(PAPER_BF16_OFFICIAL_FIX)", False, "B: the paper's official fix"),
    "S": Variant("sdpa", False, "S: PyTorch SDPA"),
    "A_sr": Variant("reference(PAPER_BF16,rounding=sr)", False, "A + stochastic rounding (P̄V, Ō, O)"),
    "A_qk": Variant("reference(PAPER_BF16)", True, "A + QK-norm"),
    "C_qk": Variant("reference(FP32)", True, "C + QK-norm"),
    # the cures of experiment `cures` (chapter 6; lpfail.experiments.cures), never in this experiment's grid
    "A_hp": Variant("reference(PAPER_BF16,delta=dO.O_hp)", False, "A + δ from an FP32 O (dO·O_hp)"),
    "A_res": Variant("reference(PAPER_BF16,delta=dO.O_res)", False, "A + output-residual compensation"),
    "A_ds": Variant("reference(PAPER_BF16,ds_rowsum=true)", False, "A + dS row-sum correction"),
    "A_z": Variant("reference(PAPER_BF16)", False, "A + z-loss 1e-4", (("z_loss", 1e-4),)),
    "A_cap": Variant("reference(PAPER_BF16)", False, "A + output-logit soft-cap 30", (("logit_softcap", 30.0),)),
    # added for lpfail.experiments.fix_training (issue 13); not in this experiment's grid
    "Bp": Variant("reference(PAPER_BF16+fix)", False, "B′: Algorithm 3 without the official clamp"),
    "R": Variant("reference(PAPER_BF16_ROBUST_FIX)", False, "R: the robust fix (BoundedMax)"),
    # added for lpfail.experiments.compiled_sweep (issue 16); not in this experiment's grid. The preset's knobs are
    # spelled out, so that the runs' TrainConfig hash changes whenever the preset is corrected (a run of an
    # earlier definition is then not reused).
    "A_comp": Variant(f"reference({_precision.PAPER_BF16_COMPILED})", False,
                      "A_comp: PAPER_BF16_COMPILED (the official code under torch.compile)"),
}


@dataclass(frozen=True)
class LRSweepConfig:
    """The grid, the two model sizes and the training setting shared by every run.

    Defaults: the setting of the probe in ../shared/proxy-findings.md (4 × 256 byte-level GPT on the Python
    documentation corpus, context 256, 32 sequences = 8,192 tokens per step, AdamW (0.9, 0.95), wd 0, clip 1,
    1,000 steps), with Wortsman et al.'s schedule (linear warm-up, then cosine decay, here to lr / 10) and a
    held-out validation split for the final loss."""

    lrs: tuple[float, ...] = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)  # 6 rates, factor 2, 32× span
    seeds: tuple[int, ...] = (0, 1, 2)  # each seed is both the init seed and the batch-order seed
    variants: tuple[str, ...] = ("A", "C", "A_sr", "A_qk", "C_qk", "D", "B", "S")  # at the smaller size
    large_variants: tuple[str, ...] = ("A", "C", "A_sr")  # at the larger size (the minimum)
    small: tuple[int, int, int] = (4, 4, 256)  # n_layer, n_head, n_embd: 3.2 M parameters
    large: tuple[int, int, int] = (8, 8, 512)  # 25 M parameters: ≈ 8× (head size 64 in both)
    # data and optimization
    data: str = "pydocs"
    tokenizer: str = "bytes"
    block_size: int = 256
    batch_size: int = 32
    max_steps: int = 1000
    warmup: int = 100
    min_lr_ratio: float = 0.1  # cosine floor: lr · this
    grad_clip: float = 1.0
    beta2: float = 0.95
    weight_decay: float = 0.0
    # measurement
    val_fraction: float = 0.05  # the corpus' last 5 % is never trained on
    val_rows: int = 64  # 64 × 256 = 16,384 held-out tokens per evaluation
    val_every: int = 250
    diag_every: int = 100  # max logit, tied-maximum fraction, ‖W_Q‖, ‖W_Q W_Kᵀ‖ per head
    curve_points: int = 100  # the stored loss / gradient-norm curves' length
    checkpoint_every: int = 250  # the most work a cut-off run loses
    cuda_graph: bool = True  # capture each step as a CUDA graph (TrainConfig.cuda_graph; checked by graph_checks)

    def __post_init__(self):
        for v in (*self.variants, *self.large_variants):
            if v not in VARIANTS:
                raise ValueError(f"LRSweepConfig: unknown variant {v!r}; variants: {list(VARIANTS)}")
        for name in ("lrs", "seeds", "variants", "large_variants"):
            items = getattr(self, name)
            if len(set(items)) != len(items):
                raise ValueError(f"LRSweepConfig.{name} must not repeat (got {items})")
        if not self.lrs or not self.seeds or not self.variants:
            raise ValueError("LRSweepConfig: lrs, seeds and variants must not be empty")
        if any(not (isinstance(x, float) and x > 0) for x in self.lrs) or list(self.lrs) != sorted(self.lrs):
            raise ValueError(f"LRSweepConfig.lrs must be positive floats in increasing order (got {self.lrs})")
        for name in ("small", "large"):
            shape = getattr(self, name)
            if len(shape) != 3 or any(int(x) <= 0 for x in shape) or shape[2] % shape[1]:
                raise ValueError(f"LRSweepConfig.{name} must be (n_layer, n_head, n_embd) with n_head | n_embd "
                                 f"(got {shape})")
        if not 0 < self.min_lr_ratio <= 1:
            raise ValueError(f"LRSweepConfig.min_lr_ratio must lie in (0, 1] (got {self.min_lr_ratio})")
        if self.curve_points < 1 or self.max_steps % self.curve_points:
            raise ValueError(f"LRSweepConfig.curve_points ({self.curve_points}) must divide max_steps "
                             f"({self.max_steps}): every curve has exactly curve_points bins")
        train_config(self, plan(self)[0], "")  # the runs' TrainConfig validates the rest

    def sizes(self) -> dict[str, tuple[str, ...]]:
        """size name → the variants run at that size."""
        out = {"small": tuple(self.variants)}
        if self.large_variants:
            out["large"] = tuple(self.large_variants)
        return out


@dataclass(frozen=True)
class Point:
    size: str
    variant: str
    lr: float
    seed: int

    @property
    def key(self) -> str:
        return f"{self.size}/{self.variant}/lr{self.lr:.6g}/s{self.seed}"


def plan(c: LRSweepConfig) -> list[Point]:
    """Every point of the grid, in the order the driver starts them (what a cut-off call should have done
    first): the smaller size's A, C, A_sr, A_qk and C_qk (hypotheses H1–H3), then the larger size (H4), then
    the rest of the smaller size (D, B, S: descriptive)."""
    sizes = c.sizes()
    core = [v for v in sizes["small"] if v in ("A", "C", "A_sr", "A_qk", "C_qk")]
    rest = [v for v in sizes["small"] if v not in core]
    groups = [("small", core)] + ([("large", list(sizes["large"]))] if "large" in sizes else []) + [("small", rest)]
    return [Point(size, v, float(lr), int(seed)) for size, vs in groups for seed in c.seeds for v in vs
            for lr in c.lrs]


def train_config(c: LRSweepConfig, p: Point, out_dir: str):
    """The `TrainConfig` of one point."""
    from lpfail.train import TrainConfig

    n_layer, n_head, n_embd = getattr(c, p.size)
    v = VARIANTS[p.variant]
    return TrainConfig(
        n_layer=int(n_layer), n_head=int(n_head), n_embd=int(n_embd), block_size=c.block_size, data=c.data,
        tokenizer=c.tokenizer, batch_size=c.batch_size, optimizer="adamw", lr=p.lr, min_lr=p.lr * c.min_lr_ratio,
        warmup=c.warmup, schedule="cosine", grad_clip=c.grad_clip, beta2=c.beta2, weight_decay=c.weight_decay,
        max_steps=c.max_steps, autocast="bf16", attention=v.attention, qk_norm=v.qk_norm, init_seed=p.seed,
        data_seed=p.seed, val_fraction=c.val_fraction, val_rows=c.val_rows, val_every=c.val_every,
        diag_every=c.diag_every, cuda_graph=c.cuda_graph, checkpoint_every=c.checkpoint_every if out_dir else 0, keep_checkpoints=1,
        log_every=1, out_dir=out_dir, **dict(v.train))


def run_hash(tc) -> str:
    """A hash of a run's TrainConfig that ignores where it writes and fields left at their defaults (so a
    field added to TrainConfig later does not orphan the stored runs)."""
    from lpfail.train import TrainConfig

    default = TrainConfig().to_dict()
    where = ("out_dir", "device", "checkpoint_every", "keep_checkpoints")  # where and how often: not what
    d = {k: v for k, v in tc.to_dict().items() if k not in where and v != default.get(k)}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# -- one run's summary -----------------------------------------------------------------------------------------
def _geometric_mean(x: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(np.maximum(x, 1e-30)))))


def _nan_list(a) -> list:
    return np.asarray(a, dtype=np.float64).tolist()


def summarize_run(run_dir, tc, key: str, curve_points: int) -> dict:
    """What the stored result keeps of one run (small: ~5 kB as JSON)."""
    from lpfail.train import read_diag, read_log, read_status, read_val

    run_dir = Path(run_dir)
    st = read_status(run_dir)
    log, diag, val = read_log(run_dir), read_diag(run_dir), read_val(run_dir)
    loss, gn = log["loss"], log["grad_norm"]
    finite = loss[np.isfinite(loss)]
    out = {
        "key": key, "run_hash": run_hash(tc), "status": st["status"], "steps": int(st["steps"]),
        "nonfinite_step": st.get("nonfinite_step"), "wall_s": float(st.get("wall_s") or 0.0),
        "tokens_per_s": float(np.nanmedian(log["tokens_per_s"][1:])) if len(loss) > 1 else float("nan"),
        "val_step": val["step"].tolist(), "val_loss": _nan_list(val["val_loss"]),
        "final_train_loss": float(finite[-100:].mean()) if finite.size else float("nan"),
        "loss_curve": _nan_list(driver.bins(loss, tc.max_steps, curve_points, np.mean)),
        "gnorm_curve": _nan_list(driver.bins(gn, tc.max_steps, curve_points, _geometric_mean)),
        "gnorm_max_curve": _nan_list(driver.bins(gn, tc.max_steps, curve_points, np.max)),
        "gnorm_max": float(np.nanmax(gn)) if np.isfinite(gn).any() else float("nan"),
        "diag_step": diag["step"].tolist(),
    }
    for k in ("max_logit", "tied_frac", "wq", "wqk"):
        out[k] = _nan_list(diag[k]) if k in diag else []
    return out


# -- parts: run summaries stored as they finish ------------------------------------------------------------------
PARTS_DIR = "lr_sweep_parts"
PART_FORMAT = "lpfail.lr_sweep.part"


def parts_dir(directory: Path | None = None) -> Path:
    return (Path(directory) if directory is not None else results.results_dir()) / PARTS_DIR


class Part:
    """One part file: the runs one call of `run_points` finished, with the provenance of that call."""

    def __init__(self, directory: Path | None = None, parts: str = PARTS_DIR, fmt: str = PART_FORMAT):
        """A new part file in ``<directory or the results cache>/<parts>/``, tagged ``fmt`` (another experiment
        built on these runs, e.g. `substitution`, passes its own folder and tag)."""
        created = _dt.datetime.now(_dt.timezone.utc)
        self.meta = {"format": fmt, "version": 1, "git": results._git(), "device": results._device(),
                     "versions": results._versions(), "host": platform.node(),
                     "created": created.isoformat(timespec="seconds"), "wall_s": 0.0}
        self.runs: dict[str, dict] = {}
        d = (Path(directory) if directory is not None else results.results_dir()) / parts
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"part-{created.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
        self._t0 = time.perf_counter()

    def add(self, summary: dict):
        self.runs[summary["key"]] = summary
        self.write()

    def write(self):
        self.meta["wall_s"] = round(time.perf_counter() - self._t0, 1)
        payload = json.dumps({**self.meta, "runs": self.runs}, allow_nan=True) + "\n"
        results._atomic_write(self.path, payload.encode())


def used_parts(metas: list[dict], have) -> list[dict]:
    """The part files' metadata (`load_parts`) of the parts that hold at least one of the runs ``have`` (keys)."""
    return [m for m in metas if any(k in have for k in m["keys"])]


def load_parts(directory: Path | None = None, parts: str = PARTS_DIR, fmt: str = PART_FORMAT,
               rerun: str = "python -m lpfail run lr_sweep") -> tuple[dict[str, dict], list[dict]]:
    """({point key: run summary}, [provenance of each part that holds at least one of them]) from every part
    file in ``parts`` tagged ``fmt``. A corrupt or foreign file is an error (named, with the ``rerun`` command),
    never skipped."""
    runs, metas = {}, []
    d = (Path(directory) if directory is not None else results.results_dir()) / parts
    for path in sorted(d.glob("part-*.json")) if d.is_dir() else []:
        try:
            part = json.loads(path.read_text())
            if part.get("format") != fmt or not isinstance(part.get("runs"), dict):
                raise ValueError(f"format {part.get('format')!r}")
        except (ValueError, UnicodeDecodeError) as e:
            raise results.ResultCorrupt(f"{parts.removesuffix('_parts')} part {path} is corrupt ({e}); delete it and "
                                        f"rerun the runs it held with `{rerun}`") from None
        new = {k: r for k, r in part["runs"].items() if k not in runs}
        runs.update(new)
        if new:
            metas.append({k: part.get(k) for k in ("git", "device", "versions", "created", "wall_s", "host")}
                         | {"file": path.name, "runs": len(new), "keys": sorted(new)})
    return runs, metas


def stored_for(c: LRSweepConfig, runs: dict[str, dict]) -> tuple[dict[str, dict], list[Point]]:
    """({key: summary} of the grid's points already stored for this config's TrainConfigs, [missing points])."""
    have, missing = {}, []
    for p in plan(c):
        r = runs.get(p.key)
        if r is not None and r.get("run_hash") == run_hash(train_config(c, p, "")):
            have[p.key] = r
        else:
            missing.append(p)
    return have, missing


# -- running --------------------------------------------------------------------------------------------------
DEFAULT_ROOT = "/tmp/lpfail_lr_sweep"
DEFAULT_BUDGET_S = 3600.0


class SweepIncomplete(results.ResultError):
    """Some points are still missing after the budget: the finished ones are stored in a part."""


def _parallel(gpus: list[str]) -> int:
    env = os.environ.get("LPFAIL_LR_SWEEP_PARALLEL", "").strip()
    if env:
        if int(env) < 1:
            raise ValueError(f"LPFAIL_LR_SWEEP_PARALLEL must be >= 1 (got {env!r})")
        return int(env)
    return 12 * len(gpus) if gpus else 2


def run_points(c: LRSweepConfig, points: list[Point], root=None, budget_s: float | None = None,
               directory: Path | None = None, parallel: int | None = None, log=print) -> dict[str, dict]:
    """Train `points` (N processes at a time) until done or `budget_s` has passed; every finished run is
    summarised into a new part file at once, and its checkpoints are deleted. Returns {key: summary}."""
    root = Path(root or os.environ.get("LPFAIL_LR_SWEEP_ROOT", DEFAULT_ROOT))
    budget_s = float(budget_s if budget_s is not None else os.environ.get("LPFAIL_LR_SWEEP_BUDGET_S",
                                                                          DEFAULT_BUDGET_S))
    gpus = driver.gpu_ids()
    parallel = parallel or _parallel(gpus)
    # variants whose captured step did not reproduce the uncaptured one (graph_checks) run uncaptured: the same
    # arithmetic, only slower
    uncaptured = {v.strip() for v in os.environ.get("LPFAIL_LR_SWEEP_UNCAPTURED", "").split(",") if v.strip()}
    specs, by_name = [], {}
    for p in points:
        tc = train_config(c, p, str(root / p.key.replace("/", "_")))
        specs.append(driver.RunSpec(p.key.replace("/", "_"), tc, variant=p.variant, seed=p.seed,
                                    env={"LPFAIL_NO_CAPTURE": "1"} if p.variant in uncaptured else None))
        by_name[specs[-1].name] = (p, tc)
    part = Part(directory)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(specs), desc="lr_sweep", unit="run", disable=None)

    def on_finish(name: str, st: dict):
        p, tc = by_name[name]
        if st["state"] == "done":
            part.add(summarize_run(tc.out_dir, tc, p.key, c.curve_points))
            for ck in Path(tc.out_dir).glob("ckpt_*.pt"):
                ck.unlink(missing_ok=True)
            bar.update(1)
        bar.set_postfix(stored=len(part.runs), refresh=False)

    log(f"lr_sweep: {len(specs)} runs, {parallel} at a time on GPUs {gpus or 'none'}, budget {budget_s:.0f} s, "
        f"root {root}, part {part.path.name}, uncaptured: {sorted(uncaptured) or 'none'}")
    try:
        status = driver.sweep(specs, parallel, budget_s, cont=True, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                              log=log, gpus=gpus, on_finish=on_finish, control=root / "control.json")
        for name, st in status.items():  # runs finished before this call (their summaries were not stored)
            p, tc = by_name[name]
            if st["state"] == "done" and p.key not in part.runs:
                part.add(summarize_run(tc.out_dir, tc, p.key, c.curve_points))
                bar.update(1)
    finally:
        bar.close()
        if part.runs:
            part.write()
        else:
            part.path.unlink(missing_ok=True)
    failed = [n for n, st in status.items() if st["state"] == "failed"]
    if failed:
        log(f"lr_sweep: {len(failed)} runs failed (not non-finite: crashed): {failed[:5]}; see their stdout.txt")
    return part.runs


@results.experiment("lr_sweep", config=LRSweepConfig, gpu=True,
                    description="LR sensitivity of each attention arithmetic, two sizes (chapter 1; GPU)")
def lr_sweep(c: LRSweepConfig) -> dict:
    """Run the grid's missing points, then assemble the result (raises `SweepIncomplete` while points remain)."""
    have, metas = run_missing(c, "lr_sweep")
    return assemble(c, have, metas)


def run_missing(c: LRSweepConfig, name: str, again: str | None = None) -> tuple[dict[str, dict], list[dict]]:
    """Train the points of ``c``'s grid that no part file holds yet, then ({key: summary} of the whole grid,
    [provenance of the parts that hold them]). Raises `SweepIncomplete` (naming experiment ``name`` and the
    command ``again`` that continues) while points remain. Shared by every experiment built on these runs."""
    runs, metas = load_parts()
    have, missing = stored_for(c, runs)
    if missing:
        run_points(c, missing)
        runs, metas = load_parts()
        have, missing = stored_for(c, runs)
    if missing:
        raise SweepIncomplete(f"{name}: {len(have)} of {len(have) + len(missing)} runs stored in {parts_dir()}; "
                              f"run `{again or f'python -m lpfail run {name}'}` again to continue")
    return have, used_parts(metas, have)


def store_from_parts(c: LRSweepConfig | None = None, directory: Path | None = None,
                     partial: bool = False) -> results.Result:
    """Store the result from the parts alone, on any machine (the runs' GPU, git and dates are kept as the
    result's provenance, the collecting machine's as ``collected_on``). With ``partial`` a grid with missing
    points is stored too, marked ``complete=False`` (the analysis then leaves out every variant with a missing
    run, and says so); a later `python -m lpfail run lr_sweep` runs the rest and stores it whole."""
    c = c or LRSweepConfig()
    runs, metas = load_parts(directory)
    have, missing = stored_for(c, runs)
    if not have:
        raise SweepIncomplete(f"lr_sweep: none of the {len(missing)} runs is stored yet; run "
                              "`python -m lpfail run lr_sweep` on a GPU machine")
    if missing and not partial:
        raise SweepIncomplete(f"lr_sweep: {len(missing)} of {len(have) + len(missing)} runs are not stored yet "
                              f"(first: {missing[0].key}); run `python -m lpfail run lr_sweep` on a GPU machine")
    used = used_parts(metas, have)
    data = assemble(c, have, used)
    return results.save("lr_sweep", c, data, 0.0, directory, provenance=parts_provenance(used))


def parts_provenance(used: list[dict], none: str = "") -> dict:
    """A result's provenance from the parts that hold its runs (`load_parts`' metas): their GPUs, the latest
    date, every commit, the drivers' summed wall time, and the collecting machine (``none``: the device named
    when no part is used, e.g. a result made only of another experiment's runs). Shared by every experiment
    that stores from part files."""
    devices = sorted({m["device"] for m in used}) or ([none] if none else [])
    return {"device": " + ".join(devices), "created": max((m["created"] for m in used), default=""),
            "git": " ".join(sorted({str(m["git"])[:12] for m in used})),
            "runs_wall_s": float(sum(m["wall_s"] for m in used)), "runs_gpus": devices,
            "collected_on": results._device(),
            "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "collected_git": results._git()}


def sweep_command(command: str, c: LRSweepConfig, root: Path, budget_s: float | None, name: str,
                  check_variants: tuple[str, ...] | None = None, log=print) -> int:
    """The ``checks`` and ``drive`` commands of every experiment built on these runs: graph checks of
    ``check_variants`` (default: `graph_checks`' own) written to ``root/checks.json`` (exit 1 when one fails),
    or the grid's missing points trained under ``root/runs``, each stored in a part as it finishes."""
    if command == "checks":
        out = graph_checks(c, root / "checks", **({"variants": check_variants} if check_variants else {}))
        (root / "checks.json").write_text(json.dumps(out, indent=1) + "\n")
        return 0 if out["ok"] else 1
    if command == "drive":
        runs, _ = load_parts()
        _, missing = stored_for(c, runs)
        log(f"{name} drive: {len(missing)} runs missing")
        run_points(c, missing, root=root / "runs", budget_s=budget_s)
        return 0
    raise ValueError(f"sweep_command: unknown command {command!r} (checks or drive)")


def run_and_analyse(c: LRSweepConfig, name: str, key: str, analyse) -> dict:
    """The body of an experiment that adds variants to this grid: run its missing points (only the new variants
    when this grid's parts are there), assemble them, and store ``analyse(result)`` under ``key``."""
    have, metas = run_missing(c, name)
    return _assemble_analysed(c, have, metas, key, analyse)


def _assemble_analysed(c: LRSweepConfig, have: dict, metas: list[dict], key: str, analyse) -> dict:
    out = assemble(c, have, metas)
    out[key] = analyse(out)
    return out


def extra_variants_main(argv, name: str, c: LRSweepConfig, new: tuple[str, ...], key: str, analyse) -> int:
    """The command line of an experiment that adds variants to this grid and reuses its runs (fix_training,
    compiled_sweep): ``status`` (runs stored / missing), ``checks`` (captured == uncaptured for the ``new``
    variants), ``drive --budget S`` (the missing runs) and ``collect`` (stores the result named ``name`` from the
    part files, with ``analyse(data)`` under ``key``; refuses, writing nothing, while runs are missing)."""
    ap = argparse.ArgumentParser(prog=f"python -m lpfail.experiments.{name}")
    ap.add_argument("command", choices=("status", "checks", "drive", "collect"))
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--root", default=None)
    args = ap.parse_args(argv)
    if args.command in ("checks", "drive"):
        root = Path(args.root or os.environ.get("LPFAIL_LR_SWEEP_ROOT", DEFAULT_ROOT))
        return sweep_command(args.command, c, root, args.budget, name, new, log=lambda m: print(m, flush=True))
    runs, metas = load_parts()
    have, missing = stored_for(c, runs)
    if args.command == "status":
        print(f"{name}: {len(have)} of {len(have) + len(missing)} runs stored; missing: "
              f"{sorted({p.variant for p in missing}) or 'none'}")
        return 0
    if missing:
        print(f"error: {len(missing)} runs missing (first {missing[0].key}); run "
              f"`python -m lpfail.experiments.{name} drive` on a GPU machine", file=sys.stderr)
        return 1
    used = used_parts(metas, have)
    data = _assemble_analysed(c, have, used, key, analyse)
    print(results.save(name, c, data, 0.0, provenance=parts_provenance(used)).provenance)
    return 0


# -- assembling the result --------------------------------------------------------------------------------------
_STATUS = {"completed": 0, "nonfinite": 1}


def assemble(c: LRSweepConfig, runs: dict[str, dict], metas: list[dict], analysed: bool = True) -> dict:
    """The stored arrays: per size, (variant, lr, seed[, ...]) arrays of every run's numbers. Points not in
    `runs` (a partial store) are NaN, ``{size}_stored`` says which are there, and ``complete`` whether all."""
    planned = plan(c)
    out: dict = {"lrs": np.array(c.lrs), "seeds": np.array(c.seeds), "preregistered_on": PREREGISTERED_ON,
                 "complete": all(p.key in runs for p in planned),
                 "runs_stored": sum(p.key in runs for p in planned), "runs_planned": len(planned),
                 "parts": [{k: m.get(k) for k in ("file", "device", "created", "git", "runs", "wall_s")} for m in metas]}
    n_diag = -(-c.max_steps // c.diag_every) if c.diag_every else 0
    for size, variants in c.sizes().items():
        n_layer, n_head, _ = getattr(c, size)
        V, L, S = len(variants), len(c.lrs), len(c.seeds)
        arr = {k: np.full((V, L, S), np.nan) for k in ("val_init", "val_final", "final_train_loss", "wall_s",
                                                       "tokens_per_s", "gnorm_max", "nonfinite_step")}
        status = np.zeros((V, L, S), dtype=np.int8)
        stored = np.zeros((V, L, S), dtype=bool)
        val_curve = np.full((V, L, S, c.max_steps // c.val_every + 1 if c.val_every else 2), np.nan)
        curves = {k: np.full((V, L, S, c.curve_points), np.nan) for k in ("loss_curve", "gnorm_curve",
                                                                         "gnorm_max_curve")}
        diag = {"max_logit": np.full((V, L, S, n_diag, n_layer), np.nan),
                "tied_frac": np.full((V, L, S, n_diag, n_layer), np.nan),
                "wq": np.full((V, L, S, n_diag, n_layer, n_head), np.nan),
                "wqk": np.full((V, L, S, n_diag, n_layer, n_head), np.nan)}
        for i, v in enumerate(variants):
            for j, lr in enumerate(c.lrs):
                for k, seed in enumerate(c.seeds):
                    r = runs.get(Point(size, v, float(lr), int(seed)).key)
                    if r is None:
                        continue
                    stored[i, j, k] = True
                    vs, vl = np.asarray(r["val_step"]), np.asarray(r["val_loss"], dtype=np.float64)
                    arr["val_init"][i, j, k] = vl[vs == 0][0] if (vs == 0).any() else np.nan
                    ok = r["status"] == "completed" and (vs == c.max_steps).any()
                    arr["val_final"][i, j, k] = vl[vs == c.max_steps][0] if ok else np.nan
                    for s_, l_ in zip(vs, vl):
                        if c.val_every and s_ % c.val_every == 0:
                            val_curve[i, j, k, s_ // c.val_every] = l_
                        elif not c.val_every:
                            val_curve[i, j, k, 0 if s_ == 0 else 1] = l_
                    status[i, j, k] = _STATUS[r["status"]]
                    arr["nonfinite_step"][i, j, k] = r["nonfinite_step"] if r["nonfinite_step"] is not None else np.nan
                    for key in ("final_train_loss", "wall_s", "tokens_per_s", "gnorm_max"):
                        arr[key][i, j, k] = r[key]
                    for key in curves:
                        curves[key][i, j, k] = np.asarray(r[key], dtype=np.float64)
                    steps = np.asarray(r["diag_step"], dtype=np.int64)
                    for key, a in diag.items():
                        vals = np.asarray(r[key], dtype=np.float64)
                        for t, s_ in enumerate(steps):
                            if s_ % c.diag_every == 0 and s_ // c.diag_every < n_diag:
                                a[i, j, k, s_ // c.diag_every] = vals[t]
        out[f"{size}_variants"] = np.array(variants)
        out[f"{size}_status"] = status
        out[f"{size}_stored"] = stored
        out[f"{size}_val_curve"] = val_curve
        for key, a in {**arr, **curves, **diag}.items():
            out[f"{size}_{key}"] = a
    out["diag_step"] = np.arange(n_diag) * c.diag_every
    out["val_step"] = (np.arange(c.max_steps // c.val_every + 1) * c.val_every if c.val_every
                       else np.array([0, c.max_steps]))
    if analysed:  # an experiment built on these runs with its own hypotheses skips lr_sweep's
        out["analysis"] = analyse(out)
    return out


# -- the analysis (the chapter and the verdict page read it) -------------------------------------------------------
def analyse(res) -> dict:
    """Sensitivities with bootstrap intervals, per-lr curves, where each curve turns up, non-finite counts, and
    the pre-registered verdicts, from a result (or the dict `assemble` builds)."""
    lrs = np.asarray(res["lrs"], dtype=np.float64)
    seeds = np.asarray(res["seeds"])
    idx = bootstrap_seed_indices(len(seeds))
    out = {"preregistered_on": PREREGISTERED_ON, "rule": RULE, "hypotheses": dict(HYPOTHESES),
           "n_seeds": int(len(seeds)), "n_bootstrap": N_BOOTSTRAP, "sizes": {}}
    draws, effs = {}, {}
    for size in ("small", "large"):
        if f"{size}_variants" not in res:
            continue
        variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
        eff = effs[size] = effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])  # (V, L, S)
        stored = np.asarray(res[f"{size}_stored"]) if f"{size}_stored" in res else np.ones(eff.shape, bool)
        point, boot = sensitivities(eff, idx)
        sz, missing = {}, {}
        for i, v in enumerate(variants):
            if not stored[i].all():  # a sensitivity needs the whole curve and every seed
                missing[v] = {"stored": int(stored[i].sum()), "runs": int(stored[i].size)}
                continue
            curve = eff[i].mean(axis=-1)
            lo, hi = interval(boot[i])
            sz[v] = {"S": float(point[i]), "ci": [lo, hi], "curve": curve.tolist(),
                     "curve_sd": eff[i].std(axis=-1, ddof=1).tolist() if len(seeds) > 1 else [0.0] * len(lrs),
                     "best_lr": float(lrs[int(np.argmin(curve))]), "best_loss": float(curve.min()),
                     "lr_10pct": lr_exceeding(curve, lrs),
                     "nonfinite": int(np.asarray(res[f"{size}_status"])[i].sum()),
                     "runs": int(eff[i].size)}
            draws[(size, v)] = (float(point[i]), boot[i])
        out["sizes"][size] = sz
        if missing:
            out.setdefault("incomplete", {})[size] = missing

    def diff(a, b, half=None):
        """point and draws of S(a) − S(b) [− ½·(S(half[0]) − S(half[1]))]."""
        pa, da = draws[a]
        pb, db = draws[b]
        p, d = pa - pb, da - db
        if half is not None:
            (ph0, dh0), (ph1, dh1) = draws[half[0]], draws[half[1]]
            p, d = p - 0.5 * (ph0 - ph1), d - 0.5 * (dh0 - dh1)
        lo, hi = interval(d)
        return {"point": float(p), "ci": [lo, hi]}, d

    verdicts = {}
    have = lambda *ks: all(k in draws for k in ks)  # noqa: E731
    if have(("small", "A"), ("small", "C")):
        h1, _ = diff(("small", "A"), ("small", "C"))
        h1["verdict"] = judge(*h1["ci"], "above")
        verdicts["H1"] = h1
        for name, a, b in (("H2", "A_sr", "C"), ("H3", "A_qk", "C_qk")):
            if have(("small", a), ("small", b)):
                h, _ = diff(("small", a), ("small", b), half=(("small", "A"), ("small", "C")))
                h["verdict"] = judge(*h["ci"], "below") if h1["verdict"] == "supported" else "no gap to close"
                verdicts[name] = h
    if have(("small", "A"), ("small", "C"), ("large", "A"), ("large", "C")):
        pl, dl = diff(("large", "A"), ("large", "C"))
        ps, ds = diff(("small", "A"), ("small", "C"))
        d = dl - ds
        lo, hi = interval(d)
        verdicts["H4"] = {"point": pl["point"] - ps["point"], "ci": [lo, hi], "gap_large": pl, "gap_small": ps,
                          "verdict": judge(lo, hi, "above")}
    for name in HYPOTHESES:
        verdicts.setdefault(name, {"point": None, "ci": None, "verdict": "not measured (runs missing)"})
    out["verdicts"] = verdicts
    # per learning rate, A − C in final loss with a bootstrap interval (descriptive)
    per_lr = {}
    for size in out["sizes"]:
        variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
        if "A" in out["sizes"][size] and "C" in out["sizes"][size]:
            dlt = effs[size][variants.index("A")] - effs[size][variants.index("C")]  # (L, S)
            boot = dlt[:, idx].mean(axis=-1)  # (L, n)
            per_lr[size] = [{"lr": float(lr), "point": float(dlt[j].mean()), "ci": list(interval(boot[j]))}
                            for j, lr in enumerate(lrs)]
    out["a_minus_c_per_lr"] = per_lr
    return out


def versus_control(res, size: str = "small", control: str = "C", ref: str = "A",
                   lrs_of_interest: tuple[float, ...] = (1.6e-2, 3.2e-2)) -> list[dict]:
    """Descriptive, after the runs (no hypothesis rests on it): for each stored variant of ``size`` other than
    ``ref`` and ``control``, S(variant) − S(control) and the share of the ``ref`` − ``control`` gap it closes,
    1 − (S(v) − S(control)) / (S(ref) − S(control)), each with a 95 % paired bootstrap interval over seeds (the
    resamples `analyse` uses); and v − control in held-out loss at ``lrs_of_interest``. The share is reported
    only where the ref − control gap is positive in every resample (else it has no meaning: ``None``)."""
    lrs = np.asarray(res["lrs"], dtype=np.float64)
    variants = [str(v) for v in np.asarray(res[f"{size}_variants"])]
    for v in (ref, control):
        if v not in variants:
            raise KeyError(f"lr_sweep: variant {v!r} is not in the {size} size's variants {variants}")
    eff = effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])
    stored = np.asarray(res[f"{size}_stored"]) if f"{size}_stored" in res else np.ones(eff.shape, bool)
    idx = bootstrap_seed_indices(eff.shape[-1])
    point, boot = sensitivities(eff, idx)
    i_ref, i_c = variants.index(ref), variants.index(control)
    if not (stored[i_ref].all() and stored[i_c].all()):
        raise SweepIncomplete(f"lr_sweep: {ref} and {control} at the {size} size are not all stored")
    gap_p, gap_d = point[i_ref] - point[i_c], boot[i_ref] - boot[i_c]
    out = []
    for i, v in enumerate(variants):
        if v in (ref, control) or not stored[i].all():
            continue
        dp, dd = point[i] - point[i_c], boot[i] - boot[i_c]
        row = {"variant": v, "minus_control": {"point": float(dp), "ci": list(interval(dd))}, "closed": None,
               "per_lr": []}
        if (gap_d > 0).all():
            row["closed"] = {"point": float(1 - dp / gap_p), "ci": list(interval(1 - dd / gap_d))}
        dl = eff[i] - eff[i_c]  # (L, S), paired by seed
        for lr in lrs_of_interest:
            j = int(np.argmin(np.abs(lrs - lr)))
            if not np.isclose(lrs[j], lr):
                continue
            b = dl[j][idx].mean(axis=-1)
            row["per_lr"].append({"lr": float(lrs[j]), "point": float(dl[j].mean()), "ci": list(interval(b))})
        out.append(row)
    return out


# -- checks before trusting the fast path (GPU) -----------------------------------------------------------------
def graph_checks(c: LRSweepConfig, root, variants=("A", "A_sr", "S"), steps: int = 30, lr: float = 1.6e-2,
                 log=print) -> dict:
    """Before the sweep trusts CUDA graphs: each variant trained ``steps`` steps captured and uncaptured
    (LPFAIL_NO_CAPTURE=1) must give bit-identical losses and gradient norms (same kernels in the same order;
    for A_sr also the same random draws), and a captured run stopped at steps/2 and continued from its
    checkpoint in a new process must give the uninterrupted run's numbers. All runs at once, one process each.
    Returns {"equal": {variant: bool}, "resume_equal": bool, "tokens_per_s": {...}, "ok": bool}."""
    import subprocess

    from lpfail.train import read_log

    root = Path(root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    short = dict(max_steps=steps, warmup=steps // 4, val_every=0, diag_every=steps // 2)
    jobs = {}

    def start(name, tc, extra_env=None, resume=None):
        d = Path(tc.out_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "train_config.json").write_text(json.dumps(tc.to_dict()))
        cmd = [sys.executable, "-m", "lpfail", "train", "--config", str(d / "train_config.json"), "--no-progress"]
        if resume:
            cmd += ["--resume", str(resume)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", **(extra_env or {})}
        jobs[name] = subprocess.Popen(cmd, stdout=open(d / "stdout.txt", "w"), stderr=subprocess.STDOUT, env=env)

    t0 = time.monotonic()
    for v in variants:
        p = Point("small", v, lr, c.seeds[0])
        for mode, env in (("graph", {}), ("eager", {"LPFAIL_NO_CAPTURE": "1"})):
            tc = dataclasses.replace(train_config(c, p, str(root / f"{v}_{mode}")), checkpoint_every=steps // 2,
                                     keep_checkpoints=0, **short)
            start(f"{v}_{mode}", tc, env)
    rcs = {n: j.wait() for n, j in jobs.items()}
    p = Point("small", variants[0], lr, c.seeds[0])
    whole = root / f"{variants[0]}_graph"
    cont = dataclasses.replace(train_config(c, p, str(root / "continued")), checkpoint_every=steps // 2,
                               keep_checkpoints=0, **short)
    jobs.clear()
    start("continued", cont, None, resume=whole / f"ckpt_{steps // 2:07d}.pt")
    rcs["continued"] = jobs["continued"].wait()
    out = {"rc": rcs, "equal": {}, "tokens_per_s": {}, "steps": steps, "lr": lr,
           "wall_s": round(time.monotonic() - t0, 1)}
    same = lambda a, b: bool(len(a["loss"]) == steps and np.array_equal(a["loss"], b["loss"])  # noqa: E731
                             and np.array_equal(a["grad_norm"], b["grad_norm"]))
    for v in variants:
        g, e = read_log(root / f"{v}_graph"), read_log(root / f"{v}_eager")
        out["equal"][v] = same(g, e)
        out["tokens_per_s"][v] = {m: float(np.nanmedian(a["tokens_per_s"][5:])) if len(a["loss"]) > 5 else None
                                  for m, a in (("graph", g), ("eager", e))}
        log(f"graph check {v}: captured == uncaptured: {out['equal'][v]}; tokens/s {out['tokens_per_s'][v]} "
            f"(rc {rcs[v + '_graph']}, {rcs[v + '_eager']})")
    out["resume_equal"] = same(read_log(whole), read_log(root / "continued"))
    out["ok"] = bool(all(out["equal"].values()) and out["resume_equal"])
    log(f"graph check: continued from step {steps // 2} == uninterrupted: {out['resume_equal']}; ok {out['ok']}")
    return out


# -- command line ---------------------------------------------------------------------------------------------
def status_text(c: LRSweepConfig | None = None, directory: Path | None = None) -> str:
    c = c or LRSweepConfig()
    runs, metas = load_parts(directory)
    have, missing = stored_for(c, runs)
    by_size: dict[str, list[int]] = {}
    for p in plan(c):
        n = by_size.setdefault(p.size, [0, 0])
        n[1] += 1
        n[0] += p.key in have
    parts = ", ".join(f"{m['file']} ({m['runs']} runs, {m['device']}, {str(m['created'])[:16]})" for m in metas)
    return (f"lr_sweep: {len(have)} of {len(have) + len(missing)} runs stored ("
            + ", ".join(f"{s} {a}/{b}" for s, (a, b) in by_size.items()) + f"); parts: {parts or 'none'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lpfail.experiments.lr_sweep",
                                 description="the lr_sweep experiment's parts: status, or store from parts")
    ap.add_argument("command", choices=("status", "collect", "checks", "drive"))
    ap.add_argument("--budget", type=float, default=None, help="drive: seconds before running runs are stopped")
    ap.add_argument("--partial", action="store_true", help="collect: store an incomplete grid too")
    ap.add_argument("--root", default=None, help="checks/drive: where the runs write (default "
                    "$LPFAIL_LR_SWEEP_ROOT or /tmp/lpfail_lr_sweep)")
    args = ap.parse_args(argv)
    c = LRSweepConfig()
    root = Path(args.root or os.environ.get("LPFAIL_LR_SWEEP_ROOT", DEFAULT_ROOT))
    if args.command == "status":
        print(status_text())
        return 0
    if args.command in ("checks", "drive"):  # drive: the missing points, stored in parts as they finish
        rc = sweep_command(args.command, c, root, args.budget, "lr_sweep", log=lambda m: print(m, flush=True))
        if args.command == "drive":
            print(status_text(), flush=True)
        return rc
    try:
        res = store_from_parts(partial=args.partial)
    except results.ResultError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(res.provenance)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
