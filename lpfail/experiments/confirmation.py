"""The confirmation grid: the training verdicts on ten paired seeds, judged by a rule whose error rates
are measured, with a placebo, more seeds at the larger size, and GPT-2 small's shape (12 × 768) as a third size.

Every run is an `lr_sweep` run (the same `train_config`, the same store ``results/lr_sweep_parts``, the same keys),
so the stored seeds 0–2 are reused, never rerun; only the new seeds, the placebo and the third size are trained.
On our proxy: byte-level GPTs on the Python documentation corpus, context 256, 32 sequences per step, AdamW
(0.9, 0.95), 1,000 steps, warm-up 100 then cosine decay to lr / 10; held-out loss on the corpus' last 5 %.

====== ===================== ========================= ================================== ===============
size   shape (layers×width)  learning rates            variants                           seeds
====== ===================== ========================= ================================== ===============
small  4 × 256 (3.2 M)       1e-3 … 3.2e-2 (×2)        A C A_sr A_qk C_qk D B S R C_tile   0–9 (3–9 new)
large  8 × 512 (25 M)        1e-3 … 3.2e-2 (×2)        A C                                0–4 (3–4 new)
gpt2   12 × 768 (85 M)       5e-4 … 4e-3 (×2)          A C                                0–4 (all new)
====== ===================== ========================= ================================== ===============

The pre-registration (`PREREGISTERED_ON`, `SEEN`, `HYPOTHESES`, `FAMILIES`, `RULE`, `HEALTHY`, `PREDICTIONS`) is
code, committed before any run of seeds 3–9, of the placebo, of the larger size's seeds 3–4 and of the 12 × 768
size. One amendment (`AMENDMENT`, `AMENDED_ON`, before any 12 × 768 run of seeds 1–4): 12 × 768's rates were
2.5e-4 … 8e-3 and its variants A C, then D; the GPU time available cut them to the table's.
``python -m lpfail sweep confirmation status | plan | checks | drive | collect``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpfail.sweep import GridBase, Run, register_grid, stats
from lpfail.sweep import lr as L
from lpfail.sweep.variants import check as check_variants

# -- the pre-registration (fixed 2026-12-01, before any run it judges) ------------------------------------------
PREREGISTERED_ON = "2026-12-01"
#: What had been seen when this was written (2026-12-01, 22:15 UTC).
SEEN = ("Every result stored in the repository on 2026-12-01: lr_sweep's grid at seeds 0–2 (both sizes; its "
        "per-lr curves informed the healthy margin and the third size's learning rates), fix_training, cures, "
        "compiled_sweep, substitution and its amendment (all seeds 0–2), chapter 1's explosion search, and the "
        "two-seed exploratory probe (the lab notebook's 'probes') that preceded every rule. No run of seeds 3–9, "
        "of the placebo C_tile, of the larger size's seeds 3–4, or of the 12 × 768 size existed.")
SEEDS = tuple(range(10))  # the smaller size: the estimate pools seeds 0–9 ...
CONFIRM = tuple(range(3, 10))  # ... the confirmatory call uses the fresh seeds 3–9 alone
LARGE_SEEDS, LARGE_CONFIRM = tuple(range(5)), (3, 4)
GPT2_SEEDS = GPT2_CONFIRM = tuple(range(5))  # every run of the third size is fresh
#: 12 × 768's learning rates as pre-registered on 2026-12-01, and as amended on 2026-12-02 (`AMENDMENT`).
GPT2_LRS_REGISTERED = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
GPT2_LRS = (5e-4, 1e-3, 2e-3, 4e-3)
AMENDED_ON = "2026-12-02"
#: The one amendment of this rule, written 2026-12-02 18:40 UTC, before any 12 × 768 run of seeds 1–4.
AMENDMENT = ("12 × 768's grid cut from six learning rates (2.5e-4 to 8e-3) to the middle four (5e-4 to 4e-3), and its "
             "D dropped, because the issue's GPU budget (150 H200-minutes) cannot hold five seeds at six rates: a "
             "12 × 768 run takes 80–94 GPU-seconds (2026-12-02, 17:51–18:08 UTC), so 60 A and C runs need ≈ 85 "
             "minutes where ≈ 56 were left. The two ends were dropped by position, not by value; the four kept "
             "still run from rates where FP32 attention is healthy to where it degrades, as the issue asks. "
             "gaps_gpt2 is A − C at these four rates (Holm over four). Seen when amended: 12 × 768's seed 0 (A at "
             "all six rates, C at 2.5e-4 to 2e-3) and the larger size's five seeds; nothing of 12 × 768's seeds "
             "1–4. The seed-0 runs at 2.5e-4 and 8e-3 stay stored in their part, outside the grid.")
TEST = "t"  # the paired Student t test, two-sided (its level on our noise: tests/test_stats_null.py)
ALPHA = stats.ALPHA  # on the Holm-adjusted p within a family
HEALTHY = 0.10  # C is healthy where its mean held-out loss is within 10 % of its best (lr_sweep's turn-up factor)
PLACEBO = "C_tile"  # FP32 attention with FA2's 128 × 64 tiles: another summation order where it cannot matter

HYPOTHESES = {
    "H1": "the paper's arithmetic (A) has a higher LR sensitivity than FP32 attention (C): S(A) − S(C) > 0",
    "H2": "stochastic rounding closes at least half of the gap: (S(A_sr) − S(C)) − ½·(S(A) − S(C)) < 0",
    "H3": "QK-norm closes at least half of the gap: (S(A_qk) − S(C_qk)) − ½·(S(A) − S(C)) < 0",
    "HD": "production (FA2) arithmetic closes at least half of the gap: (S(D) − S(C)) − ½·(S(A) − S(C)) < 0",
    "HB": "the official fix closes at least half of the gap: (S(B) − S(C)) − ½·(S(A) − S(C)) < 0",
    "HR": "the robust fix closes at least half of the gap: (S(R) − S(C)) − ½·(S(A) − S(C)) < 0",
    "gap": "at a learning rate and size, A − C in final held-out loss ≠ 0 (called 'supported' when > 0)",
    "fix": "at a learning rate of the smaller size, a fix X ∈ {B, R} closes at least half of the A − C gap in final "
           "held-out loss: (L_X − L_C) − ½·(L_A − L_C) < 0",
    "H5": "(the regime) at each size, A − C is distinguishable from 0 at the learning rates where C is healthy",
    "H6": "the smallest learning rate at which A − C > 0 falls with size (4 × 256 → 8 × 512 → 12 × 768)",
    "placebo": "C_tile − C (S, and the final loss at each learning rate) is 0; its call rate under the same rule "
               "is the rule's false-positive rate in chaotic training",
}
SIDES = {"H1": "above", "H2": "below", "H3": "below", "HD": "below", "HB": "below", "HR": "below"}
#: The families within which Holm–Bonferroni adjusts. "claims": H1–HR at the smaller size; "gaps_SIZE": A − C at
#: each learning rate of that size; "fix_lr": B and R at each learning rate of the smaller size (12 cells). Later
#: grids that extend other experiments to ten seeds use the same rule and these families: "C1b" (substitution's
#: eight layer rows at 3.2e-2), "C1c" (its δ rows delta_dPP, delta_hp, out, obar at both rates) and "cures" (K2 of
#: every cure run at ten seeds).
FAMILIES = {"claims": tuple(SIDES), "gaps_small": "A − C at each of the 6 rates", "gaps_large": "likewise",
            "gaps_gpt2": "A − C at each of its 4 rates (6 until the AMENDMENT of 2026-12-02)",
            "fix_lr": "B and R at each of the 6 rates", "C1b": "substitution rows layer0–3_a, layer0–3_c at 3.2e-2",
            "C1c": "substitution rows delta_dPP, delta_hp, out, obar at 1.6e-2 and 3.2e-2",
            "cures": "K2 of each cure at ten seeds"}
RULE = ("Per hypothesis, d_s is the paired per-seed difference (same init and batches across variants): of LR "
        "sensitivities S computed from each seed's own curve (claims), of final held-out losses at one learning "
        "rate (gaps, fix_lr), or the half-gap statistic (X − Y) − ½·(A − C) per seed; a diverged run counts as its "
        "loss at init. The call is made on the confirmatory seeds alone (3–9 at the smaller size, 3–4 at the "
        "larger, 0–4 at 12 × 768) by the paired Student t test, two-sided, Holm–Bonferroni-adjusted within the "
        "hypothesis' family at α = 0.05: 'supported' when the adjusted p ≤ 0.05 and the mean lies on the "
        "hypothesised side of 0, 'refuted' when on the other side, else 'inconclusive'. The estimate is the mean "
        "over all seeds with a 95 % Student t interval. H2, H3, HD, HB and HR read 'no gap to close' unless H1 is "
        "supported; a fix_lr cell reads so unless the gaps_small cell at its rate is. H5 at a size: "
        "'distinguishable' when a gaps cell at a rate where C is healthy (its mean loss within 10 % of its best) "
        "is called either way, else 'not distinguishable'. H6: with lr*(size) the smallest rate whose gaps cell is "
        "supported (beyond the grid when none is), 'supported' when lr* never rises from one size to the next and "
        "is lower at 12 × 768 than at 4 × 256, 'refuted' when it is higher at 12 × 768 than at 4 × 256, else "
        "'inconclusive'. The placebo's S is judged as a member of 'claims', its per-rate cells as members of "
        "'gaps_small'; its raw and adjusted call rates are reported.")
#: Written with the rule, before the runs; not part of it (for the closing note to compare against).
PREDICTIONS = {
    "H1": "supported (70 %): the 3 seeds gave +0.083 in the legacy S with every seed agreeing",
    "H2": "refuted or inconclusive (80 %): stochastic rounding did not close the gap on 3 seeds",
    "H3": "supported (65 %)", "HD": "supported (70 %)",
    "HB": "refuted or inconclusive (75 %)", "HR": "refuted or inconclusive (75 %)",
    "gaps_small": "supported at 1.6e-2 and 3.2e-2 (80 %); no cell called where C is healthy (70 %)",
    "H5": "not distinguishable at 4 × 256 (65 %) and at 8 × 512 (60 %); at 12 × 768: a coin flip",
    "H6": "inconclusive or supported (70 %); refuted (30 %)",
    "placebo": "raw call rate ≤ 2 of 7 cells (75 %)",
}


# -- the grid ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfirmationConfig(L.LRSweepConfig):
    """lr_sweep's setting with ten seeds, the placebo and the robust fix at the smaller size, five seeds of A and C
    at the larger, and a third size (``gpt2``) with its own learning rates and seeds."""

    seeds: tuple[int, ...] = SEEDS
    variants: tuple[str, ...] = ("A", "C", "A_sr", "A_qk", "C_qk", PLACEBO, "D", "B", "S", "R")
    large_variants: tuple[str, ...] = ("A", "C")
    large_seeds: tuple[int, ...] = LARGE_SEEDS
    gpt2: tuple[int, int, int] = (12, 12, 768)
    gpt2_lrs: tuple[float, ...] = GPT2_LRS  # amended 2026-12-02 (AMENDMENT): GPT2_LRS_REGISTERED before
    gpt2_variants: tuple[str, ...] = ("A", "C")  # amended 2026-12-02 (AMENDMENT): ("A", "C", "D") before
    gpt2_seeds: tuple[int, ...] = GPT2_SEEDS

    def __post_init__(self):
        super().__post_init__()
        check_variants(self.gpt2_variants, "ConfirmationConfig.gpt2_variants")
        if list(self.gpt2_lrs) != sorted(self.gpt2_lrs) or len(set(self.gpt2_lrs)) != len(self.gpt2_lrs):
            raise ValueError(f"ConfirmationConfig.gpt2_lrs must increase (got {self.gpt2_lrs})")
        if self.gpt2[2] % self.gpt2[1]:
            raise ValueError("ConfirmationConfig.gpt2 must be (n_layer, n_head, n_embd) with n_head | n_embd "
                             f"(got {self.gpt2})")

    def size_grid(self) -> dict[str, tuple[tuple[str, ...], tuple[float, ...], tuple[int, ...]]]:
        """size → (variants, learning rates, seeds)."""
        return {"small": (self.variants, self.lrs, self.seeds),
                "large": (self.large_variants, self.lrs, self.large_seeds),
                "gpt2": (self.gpt2_variants, self.gpt2_lrs, self.gpt2_seeds)}


def plan(c: ConfirmationConfig) -> list[L.Point]:
    """Every point, in the order the driver starts them: the smaller size's A and C (H1, the gaps), its other
    hypotheses' variants and the placebo, the rest of the smaller size (D, B, S, R), the larger size's seeds,
    then 12 × 768's A and C (H5, H6; its D was dropped by the `AMENDMENT`). Within a group, seed by seed.

    The order is not part of the pre-registered rule (which judges complete families only); it was set before any
    run of the groups it orders, for the GPU time, which comes in stretches of ≈ 26 device-minutes. The smaller
    size's D, B, S and R come before 12 × 768's A and C because the smaller size's 168 runs fit in one stretch and
    complete HD, HB, HR and fix_lr, while 12 × 768's 60 runs need about three. The larger size's 24 runs (≈ 10
    minutes at twelve under MPS) come before 12 × 768's because a wave of twelve 12 × 768 runs takes ≈ 16 minutes:
    one stretch holds the larger size and one such wave, and a wave cut off at the end of a stretch stores
    nothing."""
    g = c.size_grid()
    groups = [("small", ("A", "C")), ("small", ("A_sr", "A_qk", "C_qk", PLACEBO)),
              ("small", ("D", "B", "S", "R")), ("large", ("A", "C")), ("gpt2", ("A", "C"))]
    out, seen = [], set()
    for size, vs in groups:
        variants, lrs, seeds = g[size]
        for seed in seeds:
            for v in (v for v in vs if v in variants):
                for lr in lrs:
                    p = L.Point(size, v, float(lr), int(seed))
                    if p.key not in seen:
                        seen.add(p.key)
                        out.append(p)
    for size, (variants, lrs, seeds) in g.items():  # any variant outside the groups, last
        out += [L.Point(size, v, float(lr), int(s)) for s in seeds for v in variants for lr in lrs
                if L.Point(size, v, float(lr), int(s)).key not in seen]
    return out


class ConfirmationGrid(GridBase):
    name = "confirmation"
    store = L.STORE
    check_groups = ("A", "A_sr", "S", PLACEBO, "R")
    partial_ok = True

    def __init__(self, config: ConfirmationConfig):
        self.config = config
        self.curve_points = config.curve_points

    def runs(self) -> list[Run]:
        return [L.grid_run(self.config, p) for p in plan(self.config)]

    def quick(self):
        """A and C at every rate of the smaller size, the first fresh seed (3): S(A) − S(C) of that seed, beside
        the interval one seed is expected in from all ten."""
        from lpfail.sweep.quick import Quick

        c = self.config
        lr_grid = L.LRGrid(c)
        runs = [L.grid_run(c, L.Point("small", v, float(lr), CONFIRM[0])) for v in ("A", "C") for lr in c.lrs]
        return Quick(runs, lr_grid.headline, "S(A) − S(C) at 4 × 256, one seed", CONFIRM[0], tuple(c.seeds))

    def result(self, have: dict, parts: list[dict]) -> dict:
        c = self.config
        ps = plan(c)
        out: dict = {"preregistered_on": PREREGISTERED_ON, "complete": all(p.key in have for p in ps),
                     "runs_stored": sum(p.key in have for p in ps), "runs_planned": len(ps),
                     "parts": [{k: m.get(k) for k in ("file", "device", "created", "git", "runs", "wall_s")}
                               for m in parts]}
        for size, (variants, lrs, seeds) in c.size_grid().items():
            out[f"{size}_lrs"], out[f"{size}_seeds"] = np.array(lrs), np.array(seeds)
            out.update(L.assemble_size(c, size, variants, lrs, seeds, have))
        out["analysis"] = analyse(out)
        return out


@register_grid("confirmation", config=ConfirmationConfig, chapter="verdict",
               description="ten paired seeds, a placebo and GPT-2 small's shape: the training verdicts (GPU)")
def confirmation_grid(config: ConfirmationConfig | None = None) -> ConfirmationGrid:
    return ConfirmationGrid(config or ConfirmationConfig())


# -- the analysis ------------------------------------------------------------------------------------------------
def _size(res, size: str) -> dict | None:
    """One size's effective losses (variant → (lrs, seeds)), for the variants whose runs are all stored, with the
    size's learning rates and seeds; None when the size has no complete variant."""
    if f"{size}_variants" not in res:
        return None
    eff = stats.effective_loss(res[f"{size}_val_final"], res[f"{size}_val_init"])
    stored = np.asarray(res[f"{size}_stored"], dtype=bool)
    by = {str(v): eff[i] for i, v in enumerate(np.asarray(res[f"{size}_variants"])) if stored[i].all()}
    if not by:
        return None
    return {"eff": by, "lrs": [float(x) for x in res[f"{size}_lrs"]], "seeds": [int(s) for s in res[f"{size}_seeds"]]}


def _confirm(size: str) -> tuple[int, ...]:
    return {"small": CONFIRM, "large": LARGE_CONFIRM, "gpt2": GPT2_CONFIRM}[size]


def claims(d: dict) -> dict:
    """H1–HR at the smaller size (family "claims"), gated on H1."""
    s = {v: stats.seed_sensitivity(e) for v, e in d["eff"].items()}
    seeds, conf = d["seeds"], CONFIRM
    p = lambda x: stats.paired(x, seeds, conf, test=TEST)  # noqa: E731
    have = lambda *vs: all(v in s for v in vs)  # noqa: E731
    rows = {"H1": p(s["A"] - s["C"]) if have("A", "C") else None}
    for h, x, y in (("H2", "A_sr", "C"), ("H3", "A_qk", "C_qk"), ("HD", "D", "C"), ("HB", "B", "C"), ("HR", "R", "C")):
        rows[h] = p(stats.seed_half_gap(s[x], s["A"], s["C"], y=s[y])) if have("A", "C", x, y) else None
    fam = stats.judge_family(rows, SIDES, ALPHA)
    gap = fam["H1"]["verdict"] == "supported"
    for h in SIDES:
        if h != "H1" and rows[h] is not None:
            fam[h]["verdict"] = stats.gap_word(fam[h]["verdict"], gap)
    if have("S", "C"):
        fam["S_minus_C"] = p(s["S"] - s["C"])  # descriptive: what SDPA users get
    return fam


def healthy_flags(c_mean) -> list[bool]:
    """Per learning rate, whether FP32 attention (C) is healthy there: its mean held-out loss within `HEALTHY` of
    its best. A rate without a mean (None: no stored run yet) is not healthy, and the best is over the others."""
    known = [float(m) for m in c_mean if m is not None]
    best = min(known) if known else None
    return [m is not None and float(m) <= (1 + HEALTHY) * best for m in c_mean]


def gaps(d: dict, size: str) -> dict:
    """A − C in final held-out loss at each learning rate of a size (family "gaps_SIZE"), the healthy rates of C,
    and H5 at that size."""
    e, lrs = d["eff"], d["lrs"]
    cells = stats.curve_tests(e["A"], e["C"], lrs, d["seeds"], _confirm(size), test=TEST)
    cells.pop("S")
    fam = stats.judge_family(cells, {k: "above" for k in cells}, ALPHA)
    c_mean = e["C"].mean(axis=-1)
    healthy = [lr for lr, ok in zip(lrs, healthy_flags(c_mean)) if ok]
    called = [lr for lr in healthy if fam[f"lr={lr:g}"]["p_adjusted"] <= ALPHA]
    supported = [lr for lr in lrs if fam[f"lr={lr:g}"]["verdict"] == "supported"]
    return {"cells": fam, "healthy_lrs": healthy, "c_mean": c_mean.tolist(), "c_best": float(c_mean.min()),
            "H5": "distinguishable" if called else "not distinguishable", "H5_called_lrs": called,
            "lr_star": min(supported) if supported else None, "n_seeds": len(d["seeds"]),
            "confirm_seeds": list(_confirm(size))}


def fix_lr(d: dict, gap_cells: dict) -> dict:
    """B and R at each learning rate of the smaller size (family "fix_lr"), gated on the gap cell at that rate."""
    e, rows = d["eff"], {}
    for x in ("B", "R"):
        for j, lr in enumerate(d["lrs"]):
            key = f"{x}@lr={lr:g}"
            rows[key] = (stats.paired(stats.seed_half_gap(e[x][j], e["A"][j], e["C"][j]), d["seeds"], CONFIRM,
                                      test=TEST) if x in e else None)
    fam = stats.judge_family(rows, {k: "below" for k in rows}, ALPHA)
    for key, row in fam.items():
        if rows[key] is not None:
            lr = key.split("@")[1]
            row["verdict"] = stats.gap_word(row["verdict"], gap_cells[lr]["verdict"] == "supported")
    return fam


def h6(per_size: dict) -> dict:
    """H6 from each size's lr* (beyond the grid, +inf, when no gap cell is supported)."""
    order = [s for s in ("small", "large", "gpt2") if s in per_size]
    star = {s: per_size[s]["lr_star"] if per_size[s]["lr_star"] is not None else float("inf") for s in order}
    if "small" not in star or "gpt2" not in star:
        return {"verdict": "not measured (runs missing)", "lr_star": star}
    steps = [star[b] <= star[a] for a, b in zip(order, order[1:])]
    if star["gpt2"] < star["small"] and all(steps):
        v = "supported"
    elif star["gpt2"] > star["small"]:
        v = "refuted"
    else:
        v = "inconclusive"
    return {"verdict": v, "lr_star": {s: (None if np.isinf(x) else x) for s, x in star.items()}}


def analyse(res) -> dict:
    """Every pre-registered family from the assembled result, with the placebo's call rates."""
    out = {"preregistered_on": PREREGISTERED_ON, "seen": SEEN, "rule": RULE, "test": TEST, "alpha": ALPHA,
           "hypotheses": dict(HYPOTHESES), "predictions": dict(PREDICTIONS), "sizes": {}}
    sizes = {s: _size(res, s) for s in ("small", "large", "gpt2")}
    small = sizes["small"]
    for size, d in sizes.items():
        if d is not None and {"A", "C"} <= set(d["eff"]):
            out["sizes"][size] = gaps(d, size)
    if small is not None:
        out["claims"] = claims(small)
        if "small" in out["sizes"]:
            out["fix_lr"] = fix_lr(small, out["sizes"]["small"]["cells"])
        if {PLACEBO, "C"} <= set(small["eff"]) and "small" in out["sizes"]:
            tests = stats.curve_tests(small["eff"][PLACEBO], small["eff"]["C"], small["lrs"], small["seeds"],
                                      CONFIRM, test=TEST)
            s_row = stats.placebo({"placebo S": tests.pop("S")}, family={k: v for k, v in out["claims"].items()
                                                                          if k in SIDES})
            lr_rows = stats.placebo({f"placebo {k}": v for k, v in tests.items()},
                                    family=out["sizes"]["small"]["cells"])
            rows = {**s_row["rows"], **lr_rows["rows"]}
            out["placebo"] = {"rows": rows, "n": len(rows),
                              "rate_raw": sum(r["called_raw"] for r in rows.values()) / len(rows),
                              "rate_adjusted": sum(r["called_adjusted"] for r in rows.values()) / len(rows)}
    out["H6"] = h6(out["sizes"])
    return out
