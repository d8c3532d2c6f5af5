"""Chapter 2 ("Substitution"): which cast point carries the failure — one change at a time from A.

The paper (Sec. 3) found its failing cast point by a chain of substitutions, each a training run on
the replayed batches of a failing run. Here each substitution is a *row*: A (``reference(PAPER_BF16)``) with
one change, trained at the two learning rates where lr_sweep's stored result shows an A − C gap in held-out loss
at the smaller size (1.6e-2: +0.10, 3.2e-2: +0.42), with the same three seeds — the same initialization and
batches as lr_sweep's runs of A and C, which are the baselines (the same TrainConfig hash: the same run).

Rows (`ROWS`, in the order of the paper's Sec. 3, then the cast points the paper did not test): the tiling
(FA2's 128 × 64 tiles; one tile per row is A itself at T = 256, `SAME_AS_A`); one layer (PAPER_BF16 in layer ℓ
only, FP32 in layer ℓ only); δ = rowsum(dP ∘ P), O recomputed in FP32 for δ, O stored in FP32, only Ō = P̄V in
FP32; PAPER_BF16 only in the two heads with the largest ‖W_Q^h‖ of one layer, and only in the others; and,
beyond the paper, every cast where A and D (FA2_BF16) differ, one at a time (`a_d_knobs`).

The rule (`RULE`, `judge_row`) was fixed on 2026-12-01 before any run of this experiment. The amendment of the
same day (`AMENDED_ROWS`, `AMENDMENT_WHY`; its own experiment ``substitution_amendment``, `AmendmentConfig`) was
written after the grid's GPU run and before any run of its rows: two FP32-score rows with m and the stored L in
FP32, judged by the same rule against the same baselines. ``python -m lpfail sweep substitution status | plan |
checks | drive | collect`` (and ``substitution_amendment``). The paper's own method — replay a recorded run bit
for bit, then branch with each change — is `lpfail.train.replay.replay_branch` (``... substitution replay``).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpfail import results
from lpfail.sweep import GridBase, Run, Store, lookup, register_grid, stats
from lpfail.sweep import lr as L
from lpfail.sweep.store import final_val
from lpfail.sweep.stats import (bootstrap_seed_indices, effective_loss, gap_word, half_gap_seeds, interval, judge,
                                mean_draws)
from lpfail.precision import FA2_BF16, PAPER_BF16, Precision
from lpfail.train.replay import replay_branch  # noqa: F401  (chapter 2 calls it here)

# -- the pre-registration ----------------------------------------------------------------------------------
#: Fixed on 2026-12-01, before any run of this experiment; the outcomes seen then were lr_sweep's (A, C, D,
#: B, S, A_sr at every learning rate), from which the two learning rates were chosen.
PREREGISTERED_ON = "2026-12-01"
#: What had been seen when the rule was written. The disclosure of the probe was added on 2026-12-02; the rule is
#: unchanged.
SEEN = ("lr_sweep's results (A, C, D, B, S, A_sr at every learning rate), from which the two learning rates were "
        "chosen; and the earlier two-seed exploratory probe (the lab notebook's 'probes'), which preceded every rule "
        "and had already tried FP32 scores, an FP32 backward and δ from an O recomputed in FP32 at 1e-2 and 3e-2 "
        "(none of them matched FP32 attention at 3e-2).")
LRS = (1.6e-2, 3.2e-2)  # where lr_sweep's A − C gap lies (+0.10, +0.42 at the smaller size)
SEEDS = (0, 1, 2)
CONFIDENCE = stats.CONFIDENCE
N_BOOTSTRAP = stats.N_BOOTSTRAP
RULE = ("At each learning rate, L is the final held-out loss (a non-finite run counts as the loss at init). A row "
        "'closes the gap' when the 95 % bootstrap interval (10,000 resamples of the seeds, paired across rows) of "
        "(L_row − L_C) − ½·(L_A − L_C) lies entirely below 0, 'does not close it' when it lies entirely above 0, "
        "else 'inconclusive'. When the interval of L_A − L_C does not lie above 0 at that learning rate, every row "
        "there reads 'no gap to close'. The fraction closed, (L_A − L_row)/(L_A − L_C), is descriptive.")
HEADS_PER_ROW = 2  # of the smaller model's 4 heads per layer


@dataclass(frozen=True)
class Row:
    """One substitution. `changes`: Precision overrides of PAPER_BF16 for every head, or a special kind:
    "layer_a" / "layer_c" (PAPER_BF16 only in `layer` / FP32 only in `layer`), "heads_top" / "heads_rest"
    (PAPER_BF16 only in the chosen heads / the other heads of the chosen layer, the rest FP32; chosen per seed
    by `head_choice`). `lrs`: the learning rates it runs at. `paper`: the paper's finding for it."""

    name: str
    label: str
    group: str
    changes: str = ""
    kind: str = "policy"
    layer: int | None = None
    lrs: tuple[float, ...] = LRS
    paper: str = "not tested by the paper"
    amends: str = ""  # an amended row (AMENDED_ROWS): the grid's row it replaces as a measurement


def _knob_rows() -> list[Row]:
    p = lambda name, label, group, changes, paper="not tested by the paper": Row(  # noqa: E731
        name, label, group, changes, paper=paper)
    return [
        # the score path: where A and D differ before exp (the prime suspects after lr_sweep)
        p("scores", "QKᵀ and S in FP32", "scores", "qk_out=fp32,scores=fp32"),
        p("l", "row sum ℓ in FP32 (Ō and m in BF16)", "scores", "acc=fp32,o_acc=bf16,m_acc=bf16"),
        p("exp_in", "S − m (before exp) in FP32", "scores", "exp_in=fp32"),
        p("score_path", "QKᵀ, S, m and S − m in FP32", "scores", "qk_out=fp32,scores=fp32,m_acc=fp32,exp_in=fp32"),
        # the tiling
        p("tiles_fa2", "FA2's tiles (128 × 64)", "tiling", "block=128x64"),
        # the output path and δ (the paper's chain, Sec. 3 steps 3–4)
        p("delta_dPP", "δ = rowsum(dP ∘ P)", "delta", "delta=dP.P", "stable"),
        p("delta_hp", "O recomputed in FP32 for δ only", "delta", "delta=dO.O_hp", "stable"),
        p("out", "O stored in FP32 (forward)", "output", "out=fp32", "stable"),
        p("obar", "only Ō = P̄V in FP32 (product and accumulator; m, ℓ in BF16)", "output",
          "pv_out=fp32,o_acc=fp32", "stable (enough on its own)"),
        # the backward casts
        p("dp", "dP = dO Vᵀ in FP32", "backward", "dp=fp32"),
        p("delta_prod", "products dO ∘ O of δ in FP32", "backward", "delta_prod=fp32"),
        p("ds", "dS in FP32", "backward", "ds=fp32"),
        p("grad_acc", "dQ, dK, dV accumulators in FP32", "backward", "grad_acc=fp32"),
    ]


def rows(n_layer: int = 4) -> list[Row]:
    """Every row, in priority order (the order `plan` starts them): the knob rows at both learning rates, then
    the layer and head rows at 3.2e-2 only (where the gap is large enough to see with 3 seeds)."""
    out = _knob_rows()
    hi = (LRS[-1],)
    for layer in range(n_layer):
        out.append(Row(f"layer{layer}_a", f"PAPER_BF16 in layer {layer} only", "layer", kind="layer_a",
                       layer=layer, lrs=hi,
                       paper="fails for the anomalous layer (index 1)" if layer == 1 else "not tested by the paper"))
    for layer in range(n_layer):
        out.append(Row(f"layer{layer}_c", f"FP32 in layer {layer} only", "layer", kind="layer_c", layer=layer,
                       lrs=hi, paper="stable for the anomalous layer (standard attention there)" if layer == 1
                       else "not tested by the paper"))
    out.append(Row("heads_top", f"PAPER_BF16 only in the {HEADS_PER_ROW} heads with the largest ‖W_Q^h‖",
                   "heads", kind="heads_top", lrs=hi,
                   paper="high precision in 6 of 12 heads (incl. the largest ‖W_Q^h‖) of the layer is enough"))
    out.append(Row("heads_rest", "PAPER_BF16 only in the other heads of that layer", "heads", kind="heads_rest",
                   lrs=hi))
    return out


#: Changes that are A itself in our setting, bit for bit (not run; the table says why; tests/test_substitution.py
#: checks each on BF16 inputs of the sweep's shape, forward and backward).
SAME_AS_A = {
    "one_tile": ("block=onexone", "one tile per row (block = sequence length): A's 512 × 512 tile already covers "
                                  "the whole 256-token row"),
    "m": ("m_acc=fp32", "the running maximum m in FP32 alone: m is the maximum of BF16 scores, so it is a BF16 "
                        "number whatever it is stored in (m matters only with FP32 scores: row score_path)"),
    "o_acc": ("o_acc=fp32", "the accumulator Ō alone in FP32: with one key tile Ō = 0·a + P̄V, and P̄V is "
                            "already rounded to BF16 (row obar changes both)"),
}

ROWS = rows()

# -- the amendment ---------------------------------------------------------------------------------------------------
#: Written on 2026-12-01 after the GPU run of the grid had shown the rows `scores` and `score_path` broken (every
#: run non-finite), and before any run of the rows below. Judged by the same rule (`judge_row`), against the same
#: baselines, at the same learning rates and seeds; stored as its own experiment (``substitution_amendment``), so
#: that the stored grid and its hash stay as they were measured.
AMENDED_ON = "2026-12-01"
AMENDMENT_WHY = ("The grid's rows 'scores' and 'score_path' broke by their own definition, not by a finding: with "
                 "FP32 scores, the row maximum m rounded to BF16 (scores) or the L = m + log ℓ stored for the "
                 "backward in BF16 (score_path) can lie up to half a BF16 spacing below the true maximum (32–256 "
                 "at logits of 10⁴–10⁵, 128 from 32,768 on), and exp overflows FP32 beyond 88. The amended rows keep m and the stored L in FP32 too, "
                 "as D does; every other cast stays A's.")
AMENDED_ROWS = [
    Row("score_path_l", "QKᵀ, S, m, S − m and the stored L in FP32", "scores",
        "qk_out=fp32,scores=fp32,m_acc=fp32,exp_in=fp32,l_store=fp32", amends="score_path"),
    Row("scores_l", "QKᵀ, S, m and the stored L in FP32 (S − m in BF16)", "scores",
        "qk_out=fp32,scores=fp32,m_acc=fp32,l_store=fp32", amends="scores"),
]
#: The predictions for the amended rows, written with them (2026-12-01), before any run; not part of the rule.
AMENDMENT_PREDICTIONS = {
    "score_path_l": "all 6 runs finite (85 %); closes the gap at 3.2e-2 (40 %), at 1.6e-2 (45 %); if not, "
                    "inconclusive rather than 'does not close it' at 3.2e-2 (60 %)",
    "scores_l": "all 6 runs finite (85 %); the same verdict as score_path_l at each learning rate (75 %): with FP32 S "
                "and m, S − m near the maximum is small and BF16 holds it closely",
}
ALL_ROWS = ROWS + AMENDED_ROWS


def row_by_name(name: str) -> Row:
    """A row of the grid or of the amendment, by name."""
    for r in ALL_ROWS:
        if r.name == name:
            return r
    raise ValueError(f"unknown row {name!r}; rows: {[r.name for r in ALL_ROWS]}")


def row_policy(row: Row) -> Precision:
    """The policy of a "policy" row: PAPER_BF16 with its changes."""
    if row.kind != "policy":
        raise ValueError(f"row {row.name!r} is a {row.kind!r} row, not one policy")
    return Precision.parse(f"PAPER_BF16,{row.changes}")


def a_d_knobs() -> dict[str, tuple]:
    """Every knob where A (PAPER_BF16) and D (FA2_BF16) differ, with (A's value, D's value); the knobs that
    default to `acc` (o_acc: Ō, m_acc: m, l_div and l_store: ℓ before O = Ō/ℓ and as stored for the backward)
    listed with the value they take, so that `acc` alone means the running ℓ."""
    out = {}
    for f in dataclasses.fields(Precision):
        a, d = getattr(PAPER_BF16, f.name), getattr(FA2_BF16, f.name)
        if f.name in ("o_acc", "m_acc", "l_div", "l_store"):
            a, d = getattr(PAPER_BF16, f.name) or PAPER_BF16.acc, getattr(FA2_BF16, f.name) or FA2_BF16.acc
        if a != d:
            out[f.name] = (a, d)
    return out


# -- the points ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    row: str  # a row name, or "A" / "C" (the baselines)
    lr: float
    seed: int

    @property
    def key(self) -> str:
        return f"{self.row}/lr{self.lr:.6g}/s{self.seed}"

    def baseline(self) -> L.Point | None:
        """The lr_sweep point this point is (A and C only)."""
        return L.Point("small", self.row, self.lr, self.seed) if self.row in ("A", "C") else None


def head_choice(lr_sweep_result, lr: float, seed: int, k: int = HEADS_PER_ROW) -> tuple[int, tuple[int, ...]]:
    """(layer, heads) for the head rows, fixed by a rule before the runs: in lr_sweep's run of A at this lr and
    seed, at its last diagnostic step, the layer holding the largest per-head ‖W_Q^h‖, and that layer's k
    heads with the largest ‖W_Q^h‖ (sorted). Per seed: the largest head differs between seeds."""
    variants = [str(v) for v in np.asarray(lr_sweep_result["small_variants"])]
    lrs = [float(x) for x in np.asarray(lr_sweep_result["lrs"])]
    seeds = [int(s) for s in np.asarray(lr_sweep_result["seeds"])]
    if "A" not in variants or lr not in lrs or seed not in seeds:
        raise ValueError(f"head_choice: lr_sweep holds no run of A at lr {lr}, seed {seed}")
    wq = np.asarray(lr_sweep_result["small_wq"], dtype=np.float64)[variants.index("A"), lrs.index(lr),
                                                                  seeds.index(seed)]  # (n_diag, layer, head)
    ok = np.isfinite(wq).all(axis=(1, 2))
    if not ok.any():
        raise ValueError(f"head_choice: no finite ‖W_Q^h‖ in lr_sweep's A at lr {lr}, seed {seed}")
    last = wq[np.nonzero(ok)[0][-1]]  # (layer, head)
    layer = int(np.argmax(last.max(axis=1)))
    if not 0 < k < last.shape[1]:
        raise ValueError(f"head_choice: k must lie in 1..{last.shape[1] - 1} (got {k})")
    heads = tuple(sorted(int(h) for h in np.argsort(-last[layer], kind="stable")[:k]))
    return layer, heads


@dataclass(frozen=True)
class SubstitutionConfig:
    """The grid: the rows, the learning rates, the seeds; the rest is lr_sweep's smaller-size setting."""

    rows: tuple[str, ...] = tuple(r.name for r in ROWS)
    lrs: tuple[float, ...] = LRS
    seeds: tuple[int, ...] = SEEDS
    check_baseline: bool = True  # rerun A at (3.2e-2, seed 0) first: the stored baseline must come out bit-equal

    def __post_init__(self):
        known = {r.name for r in ROWS}
        bad = [r for r in self.rows if r not in known]
        if bad:
            raise ValueError(f"SubstitutionConfig: unknown row(s) {bad}; rows: {sorted(known)}")
        if not set(self.lrs) <= set(L.LRSweepConfig().lrs):
            raise ValueError(f"SubstitutionConfig.lrs must be lr_sweep learning rates (got {self.lrs}): the "
                             "baselines A and C come from lr_sweep")
        if not self.seeds or not set(self.seeds) <= set(L.LRSweepConfig().seeds):
            raise ValueError(f"SubstitutionConfig.seeds must be lr_sweep seeds (got {self.seeds})")

    def row_objects(self) -> list[Row]:
        by = {r.name: r for r in ROWS}
        return [by[n] for n in self.rows]


@dataclass(frozen=True)
class AmendmentConfig:
    """The amendment of 2026-12-01 (`AMENDED_ROWS`): its rows at the grid's learning rates and seeds, judged
    against the same baselines A and C. Its own config (and stored result), so `SubstitutionConfig`'s hash and
    the stored grid stay as they were."""

    rows: tuple[str, ...] = tuple(r.name for r in AMENDED_ROWS)
    lrs: tuple[float, ...] = LRS
    seeds: tuple[int, ...] = SEEDS
    amended_on: str = AMENDED_ON

    def __post_init__(self):
        known = {r.name for r in AMENDED_ROWS}
        bad = [r for r in self.rows if r not in known]
        if bad or not self.rows:
            raise ValueError(f"AmendmentConfig: unknown or no row(s) {bad}; amended rows: {sorted(known)}")
        SubstitutionConfig(rows=(), lrs=self.lrs, seeds=self.seeds)  # the same checks of lrs and seeds

    def row_objects(self) -> list[Row]:
        return [row_by_name(n) for n in self.rows]


def plan(c: SubstitutionConfig | AmendmentConfig, baselines: bool = True) -> list[Point]:
    """The baselines (A, C at every lr and seed; normally already stored by lr_sweep; left out with
    ``baselines=False``), then every row's points in priority order (row by row, so a cut-off call leaves
    whole rows)."""
    pts = [Point(b, lr, s) for b in ("A", "C") for lr in c.lrs for s in c.seeds] if baselines else []
    for r in c.row_objects():
        pts += [Point(r.name, lr, s) for lr in r.lrs if lr in c.lrs for s in c.seeds]
    return pts


def train_config(c: SubstitutionConfig | AmendmentConfig, p: Point, out_dir: str, lr_sweep_result=None):
    """The TrainConfig of one point: lr_sweep's smaller-size A at this lr and seed, with the row's attention.
    A and C are lr_sweep's own configs. Head rows need the stored lr_sweep result (`head_choice`)."""
    base_c = L.LRSweepConfig()
    if p.row in ("A", "C"):
        return L.train_config(base_c, p.baseline(), out_dir)
    tc = L.train_config(base_c, L.Point("small", "A", p.lr, p.seed), out_dir)
    row = row_by_name(p.row)
    if row.kind == "policy":
        return dataclasses.replace(tc, attention=f"reference({row_policy(row).name})")
    if row.kind == "layer_a":
        return dataclasses.replace(tc, attention="reference(FP32)", overrides=(f"{row.layer}:reference(PAPER_BF16)",))
    if row.kind == "layer_c":
        return dataclasses.replace(tc, overrides=(f"{row.layer}:reference(FP32)",))
    if lr_sweep_result is None:
        lr_sweep_result = results.load("lr_sweep")
    layer, heads = head_choice(lr_sweep_result, p.lr, p.seed)
    n_head = base_c.small[1]
    chosen = heads if row.kind == "heads_top" else tuple(h for h in range(n_head) if h not in heads)
    return dataclasses.replace(tc, attention="reference(FP32)",
                               overrides=(f"{layer}/{','.join(map(str, chosen))}:reference(PAPER_BF16)",))


# -- the grid ---------------------------------------------------------------------------------------------------
STORE = Store("substitution_parts", "lpfail.substitution.part", "python -m lpfail sweep substitution drive")
CHECK_KEY = "check/A/lr0.032/s0"


def grid_runs(c: SubstitutionConfig | AmendmentConfig, baselines: bool = True, lr_sweep_result=None) -> list[Run]:
    """The framework's view of the points: A and C are lr_sweep's own runs (its store, its keys), the rows ours."""
    out = []
    if lr_sweep_result is None and any(r.kind.startswith("heads") for r in c.row_objects()):
        lr_sweep_result = results.load("lr_sweep")
    base_c = L.LRSweepConfig()
    for p in plan(c, baselines):
        if p.row in ("A", "C"):
            out.append(dataclasses.replace(L.grid_run(base_c, p.baseline()), name=p.key))
        else:
            out.append(Run(p.key, STORE, train_config(c, p, "", lr_sweep_result), group=p.row, seed=p.seed,
                           checkpoint_every=base_c.checkpoint_every))
    return out


class SubstitutionGrid(GridBase):
    """The substitution grid (`SubstitutionConfig`), or the amendment's (`AmendmentConfig`): the rows, their
    baselines A and C from lr_sweep, and (the grid's first run) A rerun at (3.2e-2, seed 0) under `CHECK_KEY`,
    which the analysis compares with lr_sweep's stored run bit for bit."""

    store = STORE
    check_groups = ("delta_dPP", "score_path", "heads_top")
    no_parts = "lr_sweep's runs only"

    def __init__(self, config: SubstitutionConfig | AmendmentConfig, lr_sweep_result=None):
        self.config = config
        self.amendment = isinstance(config, AmendmentConfig)
        self.name = "substitution_amendment" if self.amendment else "substitution"
        self._lsr = lr_sweep_result
        self.curve_points = L.LRSweepConfig().curve_points
        if self.amendment:
            self.check_groups = tuple(config.rows)

    def runs(self) -> list[Run]:
        out = grid_runs(self.config, lr_sweep_result=self._lsr)
        if not self.amendment and self.config.check_baseline:
            a = next(r for r in out if r.id == Point("A", LRS[-1], SEEDS[0]).key)
            out.insert(0, dataclasses.replace(a, key=CHECK_KEY, store=STORE, group="check", name=""))
        return out

    def result(self, have: dict, parts: list[dict]) -> dict:
        rows = {k: v for k, v in have.items() if k != CHECK_KEY}
        if self.amendment:
            return {"analysis": analyse_amendment(self.config, rows), "parts": parts, "complete": True}
        return {"analysis": analyse(self.config, rows, have.get(CHECK_KEY)), "parts": parts, "complete": True}

    def quick(self):
        """Seed 0 of A, C and δ = rowsum(dP ∘ P) at 1.6e-2 (where it closes the gap); the amendment's first row."""
        from lpfail.sweep.quick import Quick

        row, lr = (self.config.rows[0], LRS[-1]) if self.amendment else ("delta_dPP", LRS[0])
        seed, by_id = self.config.seeds[0], {r.id: r for r in grid_runs(self.config, lr_sweep_result=self._lsr)}
        runs = [by_id[Point(n, lr, seed).key] for n in ("A", "C", row)]

        def headline(have: dict, s: int) -> float:
            l_row, l_a, l_c = final_losses(self.config, have, [row, "A", "C"], lr)[:, list(self.config.seeds).index(s)]
            return float((l_row - l_c) - 0.5 * (l_a - l_c))

        return Quick(runs, headline, f"(L_{row} − L_C) − ½·(L_A − L_C) at lr {lr:g}, one seed", seed,
                     tuple(self.config.seeds))


@register_grid("substitution", config=SubstitutionConfig, chapter="02_substitution",
               description="One cast point at a time from A, at the lr_sweep gap (chapter 2; GPU)")
def substitution_grid(config: SubstitutionConfig | None = None) -> SubstitutionGrid:
    """The grid; its result is the rule's verdict per row and learning rate (`analyse`)."""
    return SubstitutionGrid(config or SubstitutionConfig())


@register_grid("substitution_amendment", config=AmendmentConfig, chapter="02_substitution",
               description="Chapter 2's amendment (2026-12-01): the FP32-score rows with m and L in FP32 (GPU)")
def amendment_grid(config: AmendmentConfig | None = None) -> SubstitutionGrid:
    """The amendment's grid (its rows, with A and C as baselines); its result `analyse_amendment`."""
    return SubstitutionGrid(config or AmendmentConfig())


def stored_for(c: SubstitutionConfig | AmendmentConfig, directory: Path | None = None, lr_sweep_result=None,
               baselines: bool = True) -> tuple[dict[str, dict], list[Point]]:
    """({key: summary} stored, [missing points]) of the grid or the amendment (``baselines=False``: without A, C)."""
    pts = {p.key: p for p in plan(c, baselines)}
    with results.reading_from(directory):  # the heads rows' lr_sweep from the same folder, as `lookup` reads it
        runs = grid_runs(c, baselines, lr_sweep_result)
    lk = lookup(SubstitutionGrid(c, lr_sweep_result), directory, runs=runs)
    return lk.have, [pts[r.id] for r in lk.missing]


# -- the analysis -------------------------------------------------------------------------------------------------------
def final_losses(c: SubstitutionConfig, have: dict[str, dict], names: list[str], lr: float) -> np.ndarray:
    """(len(names), seeds) effective final held-out losses (min(L, L_init), non-finite → L_init; NaN if absent)."""
    max_steps, out = L.LRSweepConfig().max_steps, np.full((len(names), len(c.seeds)), np.nan)
    for i, n in enumerate(names):
        for k, s in enumerate(c.seeds):
            if (r := have.get(Point(n, lr, s).key)) is not None:
                init, fin = final_val(r, max_steps)
                out[i, k] = float(effective_loss(fin, init))
    return out


def judge_row(l_row: np.ndarray, l_a: np.ndarray, l_c: np.ndarray, idx: np.ndarray | None = None) -> dict:
    """The pre-registered rule for one row at one learning rate; arrays over seeds (same order = paired)."""
    l_row, l_a, l_c = (np.asarray(x, dtype=np.float64) for x in (l_row, l_a, l_c))
    if not (l_row.shape == l_a.shape == l_c.shape) or l_row.ndim != 1:
        raise ValueError("judge_row: l_row, l_a, l_c must be 1-D arrays over the same seeds")
    if np.isnan(np.concatenate([l_row, l_a, l_c])).any():
        return {"verdict": "not measured (runs missing)", "point": None, "ci": None}
    idx = bootstrap_seed_indices(len(l_row)) if idx is None else idx
    gap_p, gap_d = mean_draws(l_a - l_c, idx)
    gap = {"point": float(gap_p), "ci": list(interval(gap_d))}
    point, stat_d = half_gap_seeds(l_row, l_a, l_c, idx=idx)
    ci = list(interval(stat_d))
    words = {"supported": "closes the gap", "refuted": "does not close it", "inconclusive": "inconclusive"}
    verdict = gap_word(words[judge(*ci, "below")], gap["ci"][0] > 0)
    frac = float((l_a.mean() - l_row.mean()) / (l_a.mean() - l_c.mean())) if l_a.mean() != l_c.mean() else None
    return {"verdict": verdict, "point": point, "ci": ci, "gap": gap, "fraction_closed": frac,
            "loss": float(l_row.mean()), "loss_sd": float(l_row.std(ddof=1)) if len(l_row) > 1 else 0.0}


def analyse(c: SubstitutionConfig, have: dict[str, dict], check: dict | None = None) -> dict:
    """Per row and learning rate, the rule's verdict with its interval; the baseline check."""
    idx = bootstrap_seed_indices(len(c.seeds))
    out = {"preregistered_on": PREREGISTERED_ON, "rule": RULE, "lrs": list(c.lrs), "seeds": list(c.seeds),
           "rows": {}, "same_as_a": dict(SAME_AS_A)}
    for lr in c.lrs:
        base = final_losses(c, have, ["A", "C"], lr)
        for r in c.row_objects():
            if lr not in r.lrs:
                continue
            l_row = final_losses(c, have, [r.name], lr)[0]
            res = judge_row(l_row, base[0], base[1], idx)
            out["rows"].setdefault(r.name, {"label": r.label, "group": r.group, "paper": r.paper, "by_lr": {}})
            out["rows"][r.name]["by_lr"][f"{lr:g}"] = res
    if check is not None:
        ref = have.get(Point("A", LRS[-1], SEEDS[0]).key)
        out["baseline_reproduced"] = bool(ref is not None and check["val_loss"] == ref["val_loss"]
                                          and check["loss_curve"] == ref["loss_curve"])
    return out


# -- the amendment's result ---------------------------------------------------------------------------------------
def analyse_amendment(c: AmendmentConfig, have: dict[str, dict]) -> dict:
    """`analyse` of the amended rows (the same rule, the same baselines), with what they amend and why."""
    out = analyse(c, have)
    out.pop("same_as_a")
    out["amended_on"] = c.amended_on
    out["why"] = AMENDMENT_WHY
    out["predictions"] = {r.name: AMENDMENT_PREDICTIONS[r.name] for r in c.row_objects()}
    for r in c.row_objects():
        out["rows"][r.name]["amends"] = r.amends
        out["rows"][r.name]["changes"] = r.changes
    return out


#: The replay's branches (the ``replay`` command's default): the seven rows of the grid's first GPU run, with
#: the two broken FP32-score rows replaced by their amendments.
REPLAY_ROWS = ("l", "scores_l", "score_path_l", "exp_in", "out", "delta_dPP", "obar")


# -- command line -------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    """``replay --run DIR --out FILE [--step N] [--until N] [--rows a,b]``: `replay_branch` with a branch per row
    (policy rows; default `REPLAY_ROWS`); any other command is ``python -m lpfail sweep substitution CMD``."""
    from lpfail.train import replay

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["replay"]:
        return substitution_grid.main(argv)
    rows = list(REPLAY_ROWS)
    if "--rows" in argv:
        i = argv.index("--rows")
        rows, argv = argv[i + 1].split(","), argv[:i] + argv[i + 2:]
    branches = [f"--branch={n}=reference({row_policy(row_by_name(n)).name})" for n in rows]
    return replay.main(argv[1:] + branches)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
