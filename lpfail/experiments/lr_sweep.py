"""Chapter 1 ("Symptom"), rebuilt: learning-rate sensitivity as the small-scale proxy of the paper's failure.

Wortsman et al., *Small-scale proxies for large-scale Transformer training instabilities* (arXiv
2309.14322), reproduce attention-logit growth in small models by training them at high learning rates, and
summarise a curve of final loss against learning rate by its **LR sensitivity** (their Sec. 3):

    S = mean over the grid of  min(L(η), L_init)  −  min over the grid of L(η)

where L(η) is the final (validation) loss at learning rate η and L_init the loss at initialization; a run whose
loss turns non-finite counts as L_init. A model that trains well at every learning rate has S ≈ 0; one that
degrades or diverges at the high end has a large S. Here every point of the grid is trained under several
attention arithmetics (`lpfail.experiments.variants`: same init, same batches, only the attention differs) and
two model sizes, and the sensitivities are compared by rules fixed in code before any run of this experiment
(`PREREGISTERED_ON`, `HYPOTHESES`, `RULE`; the statistics are `lpfail.sweep.stats`).

The grid is a `lpfail.sweep` grid (`LRGrid`): `plan(c)` lists its points in the order the driver starts them,
`train_config(c, point, out_dir)` gives each point's `TrainConfig`, `assemble` turns the stored run summaries into
the result's arrays and `analyse` gives the sensitivities, intervals and verdicts. The experiments built on the
same runs (`fix_training`, `cures`, `compiled_sweep`) are this grid with other variants and their own analysis.

``python -m lpfail sweep lr_sweep status | plan | checks | drive [--budget S] [--quick] | collect [--partial]``;
``python -m lpfail run lr_sweep`` runs the missing points and stores the result once every point is in.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lpfail.experiments.variants import VARIANTS, Variant, check as check_variants  # noqa: F401
from lpfail.sweep import GridBase, Run, Store, SweepIncomplete, register_grid, stats
from lpfail.sweep.store import final_val
from lpfail.sweep.stats import (bootstrap_seed_indices, effective_loss, interval, judge, lr_exceeding,
                                sensitivities)

# -- the pre-registration ----------------------------------------------------------------------------------
#: Fixed on 2026-12-01, before any run of this experiment. The only outcomes seen then were those of two
#: unregistered probes with other settings (lpfail.book.probes: 2 seeds, a constant schedule,
#: training loss), which suggested A − C > 0 at lr ≥ 1e-2.
PREREGISTERED_ON = "2026-12-01"
#: What had been seen when the rule was written (the comment above, as the verdict page's record shows it).
SEEN = ("Two unregistered exploratory probes with other settings (the lab notebook's 'probes': 2 seeds, a constant "
        "schedule, training loss), which suggested A − C > 0 at lr ≥ 1e-2; no run of this grid.")
CONFIDENCE = stats.CONFIDENCE  # two-sided percentile bootstrap interval
N_BOOTSTRAP = stats.N_BOOTSTRAP  # resamples of the seeds (with replacement; the same resample for every variant and lr)
BOOTSTRAP_SEED = stats.BOOTSTRAP_SEED

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
    """The learning-rate grid of a config: lr_sweep itself, or an experiment that reuses its runs with other
    variants (``name``) and stores ``analysis(data)`` under ``key`` instead of lr_sweep's hypotheses."""

    store = STORE
    check_groups = ("A", "A_sr", "S")

    def __init__(self, config: LRSweepConfig, name: str = "lr_sweep", key: str = "analysis", analysis=None,
                 new: tuple[str, ...] = (), lr_analysis: bool = True, experiment_config=None):
        """``lr_analysis``: also store lr_sweep's own analysis (its H1–H4 on these variants) under "analysis";
        ``experiment_config``: the registered experiment's config when it is not ``config`` itself (cures)."""
        self.sweep_config, self.name, self.key, self.lr_analysis = config, name, key, lr_analysis
        self.config = experiment_config if experiment_config is not None else config
        self.analysis = analysis or analyse
        self.curve_points = config.curve_points
        self.partial_ok = name == "lr_sweep"
        if new:
            self.check_groups = tuple(new)

    def runs(self) -> list[Run]:
        return [grid_run(self.sweep_config, p) for p in plan(self.sweep_config)]

    def result(self, have: dict, parts: list[dict]) -> dict:
        out = assemble(self.sweep_config, have, parts, analysed=self.lr_analysis and self.key != "analysis")
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


@register_grid("lr_sweep", config=LRSweepConfig, chapter="01_symptom",
               description="LR sensitivity of each attention arithmetic, two sizes (chapter 1; GPU)")
def lr_sweep_grid(config: LRSweepConfig | None = None) -> LRGrid:
    return LRGrid(config or LRSweepConfig())


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
    for size, variants in c.sizes().items():
        out.update(assemble_size(c, size, variants, c.lrs, c.seeds, runs))
    n_diag = -(-c.max_steps // c.diag_every) if c.diag_every else 0
    out["diag_step"] = np.arange(n_diag) * c.diag_every
    out["val_step"] = (np.arange(c.max_steps // c.val_every + 1) * c.val_every if c.val_every
                       else np.array([0, c.max_steps]))
    if analysed:  # an experiment built on these runs with its own hypotheses skips lr_sweep's
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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(lr_sweep_grid.main())
