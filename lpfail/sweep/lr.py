"""The learning-rate grid: a framework part that several experiments build on (`lr_sweep`, `fix_training`, `cures`,
`compiled_sweep`, `confirmation`, `dial_training`, `precision_alarm`, `substitution`'s baselines, `gradient_error`).

A grid of small byte-level GPTs trained at several learning rates, seeds and attention arithmetics
(`lpfail.sweep.variants`: same init, same batches, only the attention differs), at one or two model sizes:
`LRSweepConfig` (the grid and the training setting), `Point` (one run: size, variant, lr, seed; its ``key``),
`plan(c)` (the points in the order the driver starts them), `train_config(c, point, out_dir)` (each point's
`TrainConfig`), `STORE` (the part files, ``results/lr_sweep_parts/``, shared by every experiment on this grid),
`grid_run` (the framework's `Run` of a point), `LRGrid` (the `Grid` an experiment registers, with its own variants and
analysis), and `assemble` / `assemble_size` (the run summaries as (variant, lr, seed[, ...]) arrays).

A run's identity is its key and the hash of its TrainConfig (`lpfail.sweep.store.run_hash`), so an experiment that
lists a point another experiment already stored reuses that run; the stored results' config hashes
(`lpfail.results.config_hash`) name a config's type by its class name only, not its module, so this module's
place changes no hash.

The framework imports no experiment: the pre-registered analysis every result of this grid also stores (lr_sweep's
H1–H4 and its date, under "analysis") is the registered grid `BASE`'s, looked up by name (`lpfail.sweep.grid.get`)
where an `LRGrid` is not given its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from lpfail.sweep import stats
from lpfail.sweep.grid import GridBase, Run, get
from lpfail.sweep.stats import effective_loss
from lpfail.sweep.store import Store, final_val
from lpfail.sweep.variants import VARIANTS, check as check_variants

#: The registered experiment whose pre-registered analysis (its ``analyse`` and ``PREREGISTERED_ON``) an `LRGrid`
#: stores where it is given none of its own: found by name in the sweep registry, never imported.
BASE = "lr_sweep"


# -- the grid, the two model sizes, the training setting --------------------------------------------------
@dataclass(frozen=True)
class LRSweepConfig:
    """The grid, the two model sizes and the training setting shared by every run.

    Defaults: the setting of the second exploratory probe (lpfail.book.probes: 4 × 256 byte-level GPT on the Python
    documentation corpus, context 256, 32 sequences = 8,192 tokens per step, AdamW (0.9, 0.95), wd 0, clip 1,
    1,000 steps), with Wortsman et al.'s schedule (linear warm-up, then cosine decay, here to lr / 10) and a
    held-out validation split for the final loss."""

    lrs: tuple[float, ...] = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)  # 6 rates, factor 2, 32× span
    seeds: tuple[int, ...] = (0, 1, 2)  # each seed is both the init seed and the batch-order seed
    variants: tuple[str, ...] = ("A", "C", "A_sr", "A_qk", "C_qk", "D", "B", "S")  # at the smaller size
    large_variants: tuple[str, ...] = ("A", "C", "A_sr")  # at the larger size
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
        check_variants((*self.variants, *self.large_variants), "LRSweepConfig")
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


STORE = Store("lr_sweep_parts", "lpfail.lr_sweep.part", "python -m lpfail sweep lr_sweep drive")


def grid_run(c: LRSweepConfig, p: Point) -> Run:
    """The framework's view of one point: its key, store, TrainConfig (as the driver trains it), variant."""
    return Run(p.key, STORE, train_config(c, p, ""), group=p.variant, seed=p.seed, checkpoint_every=c.checkpoint_every)


class LRGrid(GridBase):
    """The learning-rate grid of a config as a registered grid: lr_sweep itself, or an experiment that reuses its
    runs with other variants (``name``) and stores ``analysis(data)`` under ``key`` instead of lr_sweep's
    hypotheses."""

    store = STORE
    check_groups = ("A", "A_sr", "S")

    def __init__(self, config: LRSweepConfig, name: str = BASE, key: str = "analysis",
                 analysis: Callable[[dict], dict] | None = None, new: tuple[str, ...] = (), lr_analysis: bool = True,
                 experiment_config=None, preregistered_on: str | None = None):
        """``analysis``: the analysis stored under ``key`` (default: `BASE`'s); ``preregistered_on``: the date the
        assembled data carries (default: `BASE`'s); ``lr_analysis``: also store `BASE`'s analysis (its H1–H4 on
        these variants) under "analysis"; ``experiment_config``: the registered experiment's config when it is not
        ``config`` itself (cures)."""
        self.sweep_config, self.name, self.key, self.lr_analysis = config, name, key, lr_analysis
        self.config = experiment_config if experiment_config is not None else config
        self._analysis, self._preregistered_on = analysis, preregistered_on
        self.curve_points = config.curve_points
        self.partial_ok = name == BASE
        if new:
            self.check_groups = tuple(new)

    @staticmethod
    def base() -> "LRGrid":
        """The registered grid `BASE` (lr_sweep), whose analysis and date a grid without its own uses."""
        return get(BASE)

    @property
    def analysis(self) -> Callable[[dict], dict]:
        return self._analysis if self._analysis is not None else self.base().analysis

    @property
    def preregistered_on(self) -> str:
        return self._preregistered_on if self._preregistered_on is not None else self.base().preregistered_on

    def runs(self) -> list[Run]:
        return [grid_run(self.sweep_config, p) for p in plan(self.sweep_config)]

    def result(self, have: dict, parts: list[dict]) -> dict:
        also = self.lr_analysis and self.key != "analysis"  # BASE's analysis beside this grid's own
        base = self.base() if also else self  # self's date is BASE's where it has none of its own
        out = assemble(self.sweep_config, have, parts, preregistered_on=base.preregistered_on,
                       analyse=base.analysis if also else None)
        out[self.key] = self.analysis(out)
        return out

    #: the quick profile: these variants at every learning rate of the smaller size, seed 0, and its headline
    quick_variants: tuple[str, ...] = ("A", "C")
    quick_label = "S(A) − S(C) at the smaller size, one seed"

    def seed_sensitivity(self, have: dict, variant: str, seed: int, size: str = "small") -> float:
        """S of one seed's curve (effective held-out loss over the learning rates; NaN if a run is missing)."""
        curve = []
        for lr in self.sweep_config.lrs:
            r = have.get(Point(size, variant, float(lr), int(seed)).key)
            if r is None:
                return float("nan")
            init, fin = final_val(r, self.sweep_config.max_steps)
            curve.append(float(effective_loss(fin, init)))
        return float(stats.sensitivity(np.array(curve)))

    def headline(self, have: dict, seed: int) -> float:
        """The quick profile's statistic for one seed: S(A) − S(C)."""
        return self.seed_sensitivity(have, "A", seed) - self.seed_sensitivity(have, "C", seed)

    def quick(self):
        from lpfail.sweep.quick import Quick

        c = self.sweep_config
        runs = [grid_run(c, Point("small", v, float(lr), c.seeds[0])) for v in self.quick_variants for lr in c.lrs]
        return Quick(runs, self.headline, self.quick_label, c.seeds[0], tuple(c.seeds))


# -- assembling the result --------------------------------------------------------------------------------------
_STATUS = {"completed": 0, "nonfinite": 1}


def assemble(c: LRSweepConfig, runs: dict[str, dict], metas: list[dict], preregistered_on: str | None = None,
             analyse: Callable[[dict], dict] | None = None) -> dict:
    """The stored arrays: per size, (variant, lr, seed[, ...]) arrays of every run's numbers. Points not in
    `runs` (a partial store) are NaN, ``{size}_stored`` says which are there, and ``complete`` whether all.
    ``preregistered_on``: the date of the rule the result is judged by (stored where given); ``analyse``: an
    analysis of the arrays stored under "analysis" (lr_sweep's, `LRGrid.result`), where given."""
    planned = plan(c)
    out: dict = {"lrs": np.array(c.lrs), "seeds": np.array(c.seeds)}
    if preregistered_on is not None:
        out["preregistered_on"] = preregistered_on
    out |= {"complete": all(p.key in runs for p in planned),
            "runs_stored": sum(p.key in runs for p in planned), "runs_planned": len(planned),
            "parts": [{k: m.get(k) for k in ("file", "device", "created", "git", "runs", "wall_s")} for m in metas]}
    for size, variants in c.sizes().items():
        out.update(assemble_size(c, size, variants, c.lrs, c.seeds, runs))
    n_diag = -(-c.max_steps // c.diag_every) if c.diag_every else 0
    out["diag_step"] = np.arange(n_diag) * c.diag_every
    out["val_step"] = (np.arange(c.max_steps // c.val_every + 1) * c.val_every if c.val_every
                       else np.array([0, c.max_steps]))
    if analyse is not None:
        out["analysis"] = analyse(out)
    return out


def _size_arrays(c: LRSweepConfig, size: str, shape: tuple[int, int, int]) -> dict:
    n_layer, n_head, _ = getattr(c, size)
    n_diag = -(-c.max_steps // c.diag_every) if c.diag_every else 0
    full = lambda *tail: np.full((*shape, *tail), np.nan)  # noqa: E731
    return {"scalars": {k: full() for k in ("val_init", "val_final", "final_train_loss", "wall_s", "tokens_per_s",
                                           "gnorm_max", "nonfinite_step")},
            "status": np.zeros(shape, dtype=np.int8), "stored": np.zeros(shape, dtype=bool),
            "val_curve": full(c.max_steps // c.val_every + 1 if c.val_every else 2),
            "curves": {k: full(c.curve_points) for k in ("loss_curve", "gnorm_curve", "gnorm_max_curve")},
            "diag": {"max_logit": full(n_diag, n_layer), "tied_frac": full(n_diag, n_layer),
                     "wq": full(n_diag, n_layer, n_head), "wqk": full(n_diag, n_layer, n_head)}, "n_diag": n_diag}


def _put_run(c: LRSweepConfig, a: dict, ijk: tuple[int, int, int], r: dict):
    """One run summary into the arrays of `_size_arrays` at (variant, lr, seed) index ``ijk``."""
    a["stored"][ijk] = True
    vs, vl = np.asarray(r["val_step"]), np.asarray(r["val_loss"], dtype=np.float64)
    a["scalars"]["val_init"][ijk] = vl[vs == 0][0] if (vs == 0).any() else np.nan
    ok = r["status"] == "completed" and (vs == c.max_steps).any()
    a["scalars"]["val_final"][ijk] = vl[vs == c.max_steps][0] if ok else np.nan
    for s_, l_ in zip(vs, vl):
        if c.val_every and s_ % c.val_every == 0:
            a["val_curve"][(*ijk, s_ // c.val_every)] = l_
        elif not c.val_every:
            a["val_curve"][(*ijk, 0 if s_ == 0 else 1)] = l_
    a["status"][ijk] = _STATUS[r["status"]]
    a["scalars"]["nonfinite_step"][ijk] = r["nonfinite_step"] if r["nonfinite_step"] is not None else np.nan
    for key in ("final_train_loss", "wall_s", "tokens_per_s", "gnorm_max"):
        a["scalars"][key][ijk] = r[key]
    for key, arr in a["curves"].items():
        arr[ijk] = np.asarray(r[key], dtype=np.float64)
    steps = np.asarray(r["diag_step"], dtype=np.int64)
    for key, arr in a["diag"].items():
        vals = np.asarray(r[key], dtype=np.float64)
        for t, s_ in enumerate(steps):
            if s_ % c.diag_every == 0 and s_ // c.diag_every < a["n_diag"]:
                arr[(*ijk, s_ // c.diag_every)] = vals[t]


def assemble_size(c: LRSweepConfig, size: str, variants, lrs, seeds, runs: dict[str, dict]) -> dict:
    """One size's (variant, lr, seed[, ...]) arrays, keyed ``{size}_...``, from the run summaries ``runs``
    (keyed by `Point.key`); a point without a run is NaN and not ``{size}_stored``."""
    a = _size_arrays(c, size, (len(variants), len(lrs), len(seeds)))
    for i, v in enumerate(variants):
        for j, lr in enumerate(lrs):
            for k, seed in enumerate(seeds):
                r = runs.get(Point(size, v, float(lr), int(seed)).key)
                if r is not None:
                    _put_run(c, a, (i, j, k), r)
    out = {f"{size}_variants": np.array(variants), f"{size}_status": a["status"], f"{size}_stored": a["stored"],
           f"{size}_val_curve": a["val_curve"]}
    for key, arr in {**a["scalars"], **a["curves"], **a["diag"]}.items():
        out[f"{size}_{key}"] = arr
    return out
