"""Chapter 1 ("Symptom"), rebuilt: learning-rate sensitivity as the small-scale proxy of the paper's failure.

Wortsman et al., *Small-scale proxies for large-scale Transformer training instabilities* (arXiv
2309.14322), reproduce attention-logit growth in small models by training them at high learning rates, and
summarise a curve of final loss against learning rate by its **LR sensitivity** (their Sec. 3):

    S = mean over the grid of  min(L(η), L_init)  −  min over the grid of L(η)

where L(η) is the final (validation) loss at learning rate η and L_init the loss at initialization; a run whose
loss turns non-finite counts as L_init. A model that trains well at every learning rate has S ≈ 0; one that
degrades or diverges at the high end has a large S. Here every point of the grid is trained under several
attention arithmetics (`lpfail.sweep.variants`: same init, same batches, only the attention differs) and
two model sizes, and the sensitivities are compared by rules fixed in code before any run of this experiment
(`PREREGISTERED_ON`, `HYPOTHESES`, `RULE`; the statistics are `lpfail.sweep.stats`).

The grid is the framework's learning-rate grid (`lpfail.sweep.lr`: `LRSweepConfig`, `plan(c)` lists its points in
the order the driver starts them, `train_config(c, point, out_dir)` gives each point's `TrainConfig`, `assemble`
turns the stored run summaries into the result's arrays); this module holds the experiment: its pre-registration,
`analyse` (the sensitivities, intervals and verdicts) and its registration. The experiments built on the same runs
(`fix_training`, `cures`, `compiled_sweep`, ...) are that grid with other variants and their own analysis.

``python -m lpfail sweep lr_sweep status | plan | checks | drive [--budget S] [--quick] | collect [--partial]``;
``python -m lpfail run lr_sweep`` runs the missing points and stores the result once every point is in.
"""
from __future__ import annotations

import numpy as np

from lpfail.sweep import SweepIncomplete, register_grid, stats
# the grid's machinery, named here too for the pages and tests that read it through this module
from lpfail.sweep.lr import STORE, LRGrid, LRSweepConfig, Point, grid_run, plan, train_config  # noqa: F401
from lpfail.sweep.stats import (bootstrap_seed_indices, effective_loss, interval, judge, lr_exceeding,
                                sensitivities)
from lpfail.sweep.variants import VARIANTS  # noqa: F401

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



@register_grid("lr_sweep", config=LRSweepConfig, chapter="01_symptom",
               description="LR sensitivity of each attention arithmetic, two sizes (chapter 1; GPU)")
def lr_sweep_grid(config: LRSweepConfig | None = None) -> LRGrid:
    return LRGrid(config or LRSweepConfig(), analysis=analyse, preregistered_on=PREREGISTERED_ON)


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
