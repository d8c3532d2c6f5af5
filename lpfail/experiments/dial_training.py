"""The precision dial in training: is the paper's *bias* what harms, or only low precision? (Pre-registered.)

The arms (`lpfail.experiments.dial`): A_K, the paper's arithmetic with V and the output path at K fraction bits to
nearest even (A_7 is A, the paper's BF16 arithmetic, the same runs); SR_K, the same data with the output path
rounded stochastically at K bits (no bias, more noise: the calibration `dial_calibration` measured SR_K's error
variance at 1.5–1.7 times A_K's, and A_K's at 2.1–2.9 times SR_{K+1}'s, so A_K's noise lies between SR_{K+1}'s and
SR_K's); D_K, production arithmetic with V and O at K bits; R_3, A_3 with the robust fix; C, FP32 attention.

On our proxy: lr_sweep's 4 × 256 byte-level GPT (3.2 M parameters) on the Python documentation corpus, context 256,
32 sequences per step, AdamW (0.9, 0.95), 1,000 steps, warm-up 100 then cosine decay to lr / 10, at the two largest
learning rates where FP32 attention is healthy by the confirmation grid's definition (4e-3 and 8e-3), on ten seeds
no grid had trained (20–29). A **long horizon** beside it: 10,000 steps at 8e-3, arms C, A, A_3, SR_3 and SR_4, five
seeds (20–24). Every run is an lr_sweep run (the same `train_config`, store and keys), so C and A at these seeds are
ordinary C and A runs.

The pre-registration (`PREREGISTERED_ON`, `SEEN`, `HYPOTHESES`, `FAMILIES`, `RULE`, `PREDICTIONS`) is code,
committed before any run of this grid. ``python -m lpfail sweep dial_training status | plan | drive | collect``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lpfail import results
from lpfail.sweep import lr as L
from lpfail.sweep import GridBase, Run, register_grid, stats
from lpfail.sweep.store import Store
from lpfail.train.log import DELTA_KEYS

# -- the pre-registration (fixed 2026-12-04, before any run of this grid) ---------------------------------------------
PREREGISTERED_ON = "2026-12-04"
#: What had been seen when this was written (2026-12-04, 21:00 UTC).
SEEN = ("Every result stored in the repository on 2026-12-04: the confirmation grid (4 × 256 at seeds 0–9, where "
        "A − C is not distinguishable at the healthy rates 1e-3–8e-3), lr_sweep, the cures, chapter 1's search; the "
        "dial's CPU calibration (dial_calibration: A_K's tied-row bias −1.4e-3, −5.3e-3, −1.1e-2, −2.1e-2 at K = 7, "
        "5, 4, 3; SR_K's within its interval of 0 except K = 6, −1.3e-4 at 4σ; D_K biased the other way, +8.7e-4 "
        "at K = 7, doubling per bit); and an earlier exploratory probe at another setting (context 1,024, 16 × "
        "1,024 tokens per step, lr 1e-2, 1,200 steps, two seeds) in which the paper's arithmetic at 5 and 4 "
        "fraction bits ended 0.17–0.50 nats above FP32 attention, BF16 itself +0.21 and −0.09, with no failure by "
        "chapter 1's criterion, and a quick stochastic-rounding emulation gave a non-finite gradient at step 111, "
        "never investigated. No run of seeds 20–29, of any arm at K < 7, of the counter-based stochastic "
        "rounding in training, or of 10,000 steps existed.")
#: A dated addition, written before any long run (none of the 25 had been trained; all 240 short runs had been seen).
AMENDED_ON = "2026-12-07"
AMENDMENT = ("the long runs also record the δ signature every 1,000 steps (`TrainConfig.delta_every`: per layer and "
             "head, Σ (δ_lp − δ_hp) on rows with a tied maximum and on all rows), descriptive beside H11, with no rule "
             "of its own; their other settings are unchanged. Seen then: all 240 short runs and H8's calls; no long "
             "run had been trained.")
SEEDS = tuple(range(20, 30))
LRS = (4e-3, 8e-3)
KS_A = (7, 5, 4, 3)      # A_K: the dose (H7)
KS_BIAS = (5, 4, 3)      # A_K against SR_K and SR_{K+1} (H8)
KS_D = (4, 3)            # D_K (H10)
ARMS = ("C", "A", "A_5", "A_4", "A_3", "SR_6", "SR_5", "SR_4", "SR_3", "D_4", "D_3", "R_3")
LONG_LR, LONG_STEPS = 8e-3, 10_000
LONG_ARMS = ("C", "A", "A_3", "SR_3", "SR_4")
LONG_SEEDS = tuple(range(20, 25))
TEST = "t"               # the paired Student t test, two-sided, as in the confirmation grid
ALPHA = stats.ALPHA      # on the Holm-adjusted p within a family


def a_name(k: int) -> str:
    return "A" if k == 7 else f"A_{k}"


def sr_name(k: int) -> str:
    return "A_sr" if k == 7 else f"SR_{k}"


HYPOTHESES = {
    "H7": "dose: A_K − C grows as K falls — per seed, the least-squares slope of A_K − C on 2^(7−K) over K = 7, 5, "
          "4, 3 is > 0, at each learning rate",
    "H8": "bias, not noise: A_K is worse than both its unbiased brackets, SR_K (more noise) and SR_{K+1} (less "
          "noise): A_K − SR_K > 0 and A_K − SR_{K+1} > 0 at K = 5, 4, 3 and each learning rate",
    "gaps": "A_3 − C > 0 at each learning rate (the gate of H9)",
    "H9": "the fix: R_3 closes at least half of A_3 − C: (R_3 − C) − ½·(A_3 − C) < 0, at each learning rate where "
          "A_3 − C is supported",
    "H10": "direction: production arithmetic at K bits, which rounds the tied rows the other way, trains better "
           "than the paper's: D_K − A_K < 0 at K = 4, 3 and each learning rate (D_K − C reported beside)",
    "H11": "(descriptive, five seeds) over 10,000 steps at 8e-3, A_3 fails by chapter 1's criterion or ends above C, "
           "while SR_3, SR_4 and C do not",
}
SIDES = {"H7": "above", "H8": "above", "gaps": "above", "H9": "below", "H10": "below"}
FAMILIES = {"H7": "the slope at 4e-3 and 8e-3 (2 rows)",
            "H8": "A_K − SR_K and A_K − SR_{K+1} at K = 5, 4, 3 and both rates (12 rows)",
            "gaps": "A_3 − C at both rates (2 rows)", "H9": "R_3's half-gap at both rates (2 rows)",
            "H10": "D_K − A_K at K = 4, 3 and both rates (4 rows)"}
RULE = ("Per row, d_s is the paired per-seed statistic on the final held-out loss at one learning rate (same init and "
        "batches across arms; a diverged run counts as its loss at init): a difference between two arms, the "
        "half-gap (R_3 − C) − ½·(A_3 − C), or H7's per-seed least-squares slope of A_K − C on 2^(7−K) over K = 7, 5, "
        "4, 3. The call uses all ten seeds (20–29, none trained before this rule): the paired Student t test, "
        "two-sided, Holm–Bonferroni-adjusted within the row's family at α = 0.05: 'supported' when the adjusted p ≤ "
        "0.05 and the mean lies on the hypothesised side of 0, 'refuted' when on the other side, else "
        "'inconclusive'. The estimate is the mean with a 95 % Student t interval. H9's rows read 'no gap to close' "
        "unless the gaps row at their rate is supported. A family whose rows could not call a gap as large as the "
        "healthy margin (10 % of C's loss) at 80 % power reads 'no power' instead of 'inconclusive'. H11 is "
        "descriptive: per arm, the runs that fail by chapter 1's pre-registered criterion and the final held-out "
        "loss against C's, with its t interval over five seeds; no call.")
#: Written with the rule, before the runs; not part of it (for the closing note to compare against).
PREDICTIONS = {
    "H7": "supported at 8e-3 (60 %) and at 4e-3 (50 %): the probe's +0.2–0.5 nats at 4–5 bits was at lr 1e-2",
    "H8": "A_K − SR_K: inconclusive or refuted at most rows (60 %) — at 3–5 bits stochastic rounding's extra noise "
          "may cost as much as the bias; A_K − SR_{K+1} > 0 supported at K = 3 (55 %)",
    "gaps": "supported at 8e-3 (60 %)", "H9": "supported where gated (50 %)",
    "H10": "supported at K = 3 (55 %)",
    "H11": "A_3 ends above C in all five seeds (60 %); no run of any arm fails by the criterion (65 %)",
}


# -- the grid ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DialConfig(L.LRSweepConfig):
    """lr_sweep's setting at the smaller size, the dial's arms, its rates and fresh seeds, and the long horizon."""

    lrs: tuple[float, ...] = LRS
    seeds: tuple[int, ...] = SEEDS
    variants: tuple[str, ...] = ARMS
    large_variants: tuple[str, ...] = ()
    long_lr: float = LONG_LR
    long_steps: int = LONG_STEPS
    long_variants: tuple[str, ...] = LONG_ARMS
    long_seeds: tuple[int, ...] = LONG_SEEDS
    long_diag_every: int = 1000  # the long runs' logits, tied fraction and ‖W_Q‖ every 1,000 steps


LONG_STORE = Store("dial_parts", "lpfail.dial.part", "python -m lpfail sweep dial_training drive")


def long_key(v: str, seed: int, c: DialConfig) -> str:
    return f"long/{v}/lr{c.long_lr:.6g}/s{seed}"


def long_config(c: DialConfig, v: str, seed: int):
    """A long-horizon run's TrainConfig: the 1,000-step run's, stretched to `long_steps` (warm-up as before, the
    cosine decay over the whole run), evaluated and diagnosed every `long_diag_every` steps, the δ signature
    (`lpfail.gradient_error.delta_signature`) with the diagnostics."""
    base = L.train_config(c, L.Point("small", v, float(c.long_lr), int(seed)), "")
    return dataclasses.replace(base, max_steps=c.long_steps, val_every=c.long_diag_every,
                               diag_every=c.long_diag_every, delta_every=c.long_diag_every)


def plan(c: DialConfig) -> list[L.Point]:
    """The 1,000-step points in the order the driver starts them: 8e-3 first (the larger effect), seed by seed,
    every arm of a seed together (a cut-off call leaves whole seeds), then 4e-3."""
    return [L.Point("small", v, float(lr), int(s)) for lr in sorted(c.lrs, reverse=True) for s in c.seeds
            for v in c.variants]


class DialGrid(GridBase):
    name = "dial_training"
    store = L.STORE
    check_groups = ("A_3", "SR_3", "D_3", "R_3")  # a K-bit step captured == uncaptured before the grid trusts it
    partial_ok = True
    description = "the precision dial: A_K, SR_K, D_K and R_3 against C at 4e-3 and 8e-3, seeds 20–29 (pre-registered)"

    def __init__(self, config: DialConfig):
        self.config = config
        self.curve_points = config.curve_points

    def runs(self) -> list[Run]:
        c = self.config
        short = [L.grid_run(c, p) for p in plan(c)]
        long = [Run(long_key(v, s, c), LONG_STORE, long_config(c, v, s), group=f"long_{v}", seed=s,
                    checkpoint_every=c.long_diag_every) for s in c.long_seeds for v in c.long_variants]
        return short + long

    def summarize(self, run_dir, tc, key: str) -> dict:
        """lr_sweep's summary; a long run's also holds chapter 1's failure criterion applied to every step."""
        from lpfail.experiments.symptom import failed
        from lpfail.sweep.store import summarize_run
        from lpfail.train import read_log

        out = summarize_run(run_dir, tc, key, self.curve_points)
        if key.startswith("long/"):
            lg = read_log(run_dir)
            fail, step = failed(lg["loss"], tc.warmup, lg["grad_norm"])
            out.update(criterion_failed=bool(fail), criterion_step=step)
        return out

    def quick(self):
        """C, A_3, SR_3 and SR_4 at 8e-3, the first seed: A_3 − SR_3 of that seed."""
        from lpfail.sweep.quick import Quick

        c = self.config
        runs = [L.grid_run(c, L.Point("small", v, float(LONG_LR), c.seeds[0])) for v in ("C", "A_3", "SR_3", "SR_4")]

        def headline(have: dict, seed: int) -> float:
            loss = {}
            for v in ("A_3", "SR_3"):
                r = have.get(L.Point("small", v, float(LONG_LR), int(seed)).key)
                if r is None:
                    return float("nan")
                init, fin = L.final_val(r, c.max_steps)
                loss[v] = float(stats.effective_loss(fin, init))
            return loss["A_3"] - loss["SR_3"]

        return Quick(runs, headline, "A_3 − SR_3 at 8e-3, one seed (held-out nats)", c.seeds[0], tuple(c.seeds))

    def result(self, have: dict, parts: list[dict]) -> dict:
        c = self.config
        runs = self.runs()
        out: dict = {"preregistered_on": PREREGISTERED_ON, "runs_planned": len(runs),
                     "runs_stored": sum(r.id in have for r in runs), "complete": all(r.id in have for r in runs),
                     "parts": [{k: m.get(k) for k in ("file", "device", "created", "git", "runs", "wall_s")}
                               | {"long": sum(str(k).startswith("long/") for k in m.get("keys", ()))}
                               for m in parts],  # "long": how many of the part's runs are long ones
                     "small_lrs": np.array(c.lrs), "small_seeds": np.array(c.seeds)}
        out.update(L.assemble_size(c, "small", c.variants, c.lrs, c.seeds, have))
        out.update(long_arrays(c, have))
        out["analysis"] = analyse(out)
        return out


def long_arrays(c: DialConfig, have: dict) -> dict:
    """The long horizon's (variant, seed) arrays: stored, final and initial held-out loss, the criterion's outcome,
    and the held-out loss, largest logit, tied fraction and ‖W_Q‖ every `long_diag_every` steps; per layer at the
    same steps, the δ signature summed over heads (``long_delta_tied``, ``long_delta_all``: Σ (δ_lp − δ_hp) over
    rows with a tied maximum and over all rows; ``long_delta_n_tied``: the tied rows counted)."""
    shape = (len(c.long_variants), len(c.long_seeds))
    n = c.long_steps // c.long_diag_every + 1
    out = {"long_variants": np.array(c.long_variants), "long_seeds": np.array(c.long_seeds),
           "long_stored": np.zeros(shape, bool), "long_failed": np.zeros(shape, bool),
           "long_fail_step": np.full(shape, np.nan), "long_val_init": np.full(shape, np.nan),
           "long_val_final": np.full(shape, np.nan), "long_val_curve": np.full((*shape, n), np.nan),
           "long_max_logit": np.full((*shape, n), np.nan), "long_tied_frac": np.full((*shape, n), np.nan),
           "long_wq": np.full((*shape, n), np.nan)}
    for k in DELTA_KEYS:  # summed over heads: (variant, seed, n, layer)
        out[f"long_{k}"] = np.full((*shape, n, c.small[0]), np.nan)
    for i, v in enumerate(c.long_variants):
        for j, s in enumerate(c.long_seeds):
            r = have.get(long_key(v, s, c))
            if r is None:
                continue
            out["long_stored"][i, j] = True
            out["long_failed"][i, j] = bool(r.get("criterion_failed"))
            out["long_fail_step"][i, j] = r.get("criterion_step") if r.get("criterion_step") is not None else np.nan
            init, fin = L.final_val(r, c.long_steps)
            out["long_val_init"][i, j], out["long_val_final"][i, j] = init, fin
            for st, vl in zip(r["val_step"], r["val_loss"]):
                out["long_val_curve"][i, j, int(st) // c.long_diag_every] = vl
            for k_out, k_in in (("long_max_logit", "max_logit"), ("long_tied_frac", "tied_frac"), ("long_wq", "wq")):
                vals = [np.nanmax(np.asarray(x, dtype=np.float64)) for x in r.get(k_in, [])]
                for st, x in zip(r.get("diag_step", []), vals):
                    out[k_out][i, j, int(st) // c.long_diag_every] = x
            for k in DELTA_KEYS:
                for st, x in zip(r.get("diag_step", []), r.get(k, [])):
                    out[f"long_{k}"][i, j, int(st) // c.long_diag_every] = np.asarray(x, dtype=np.float64).sum(-1)
    return out


@register_grid("dial_training", config=DialConfig, chapter="01_symptom",
               description="the precision dial in training: bias or noise, on ten fresh seeds (ch. 1; GPU)")
def dial_grid(config: DialConfig | None = None) -> DialGrid:
    return DialGrid(config or DialConfig())


# -- the analysis --------------------------------------------------------------------------------------------------
def _eff(res) -> dict[str, np.ndarray] | None:
    """Effective held-out loss per complete arm: {arm: (lrs, seeds)}."""
    if "small_val_final" not in res:
        return None
    eff = stats.effective_loss(res["small_val_final"], res["small_val_init"])
    stored = np.asarray(res["small_stored"], dtype=bool)
    return {str(v): eff[i] for i, v in enumerate(np.asarray(res["small_variants"])) if stored[i].all()}


def slope(diffs: np.ndarray, ks=KS_A) -> np.ndarray:
    """Per seed, the least-squares slope of A_K − C (rows: K in `ks`, columns: seeds) on x = 2^(7−K)."""
    x = np.array([2.0 ** (7 - k) for k in ks])
    xc = x - x.mean()
    return (xc[:, None] * (diffs - diffs.mean(axis=0))).sum(axis=0) / (xc ** 2).sum()


def rows(e: dict[str, np.ndarray], lrs) -> dict[str, dict[str, np.ndarray | None]]:
    """Every registered row's per-seed values, by family (None where an arm is missing)."""
    have = lambda *vs: all(v in e for v in vs)  # noqa: E731
    fam: dict[str, dict] = {f: {} for f in SIDES}
    for j, lr in enumerate(lrs):
        tag = f"lr={lr:g}"
        arms = [a_name(k) for k in KS_A]
        fam["H7"][tag] = slope(np.stack([e[a][j] - e["C"][j] for a in arms])) if have("C", *arms) else None
        for k in KS_BIAS:
            for other in (k, k + 1):
                a, s = a_name(k), sr_name(other)
                fam["H8"][f"A_{k} − SR_{other} @{tag}"] = e[a][j] - e[s][j] if have(a, s) else None
        fam["gaps"][f"A_3 − C @{tag}"] = e["A_3"][j] - e["C"][j] if have("A_3", "C") else None
        fam["H9"][f"R_3 @{tag}"] = (stats.seed_half_gap(e["R_3"][j], e["A_3"][j], e["C"][j])
                                    if have("R_3", "A_3", "C") else None)
        for k in KS_D:
            fam["H10"][f"D_{k} − A_{k} @{tag}"] = e[f"D_{k}"][j] - e[f"A_{k}"][j] if have(f"D_{k}", f"A_{k}") else None
    return fam


def judge(fam_rows: dict[str, dict], seeds) -> dict[str, dict]:
    """Each family judged by the rule (`RULE`), H9 gated on the gaps rows."""
    out = {}
    for f, rs in fam_rows.items():
        judged = {k: (stats.paired(v, seeds, seeds, test=TEST) if v is not None else None) for k, v in rs.items()}
        out[f] = stats.judge_family(judged, {k: SIDES[f] for k in judged}, ALPHA)
    for k, row in out["H9"].items():
        if fam_rows["H9"][k] is not None:
            tag = k.split("@")[1]
            row["verdict"] = stats.gap_word(row["verdict"], out["gaps"][f"A_3 − C @{tag}"]["verdict"] == "supported")
    return out


#: The registered comparisons between two arms (H8, H10) and the fix against its own arithmetic, described while the
#: grid is incomplete beside every arm − C.
PAIRS = (tuple((a_name(k), sr_name(o)) for k in KS_BIAS for o in (k, k + 1))
         + tuple((f"D_{k}", a_name(k)) for k in KS_D) + (("R_3", "A_3"),))


def interim(res) -> dict:
    """Descriptive, while the grid is incomplete: every arm − C, and every pair in `PAIRS`, at each learning rate over
    the seeds where both are stored (mean, 95 % t interval where n ≥ 2, n). No call: the rule judges only whole
    families on ten seeds."""
    if "small_val_final" not in res:
        return {}
    eff = stats.effective_loss(res["small_val_final"], res["small_val_init"])
    stored = np.asarray(res["small_stored"], dtype=bool)
    vs = [str(v) for v in np.asarray(res["small_variants"])]
    if "C" not in vs:
        return {}
    pairs = [(v, "C") for v in vs if v != "C"] + [(a, b) for a, b in PAIRS if a in vs and b in vs]
    out = {}
    for a, b in pairs:
        i, c = vs.index(a), vs.index(b)
        for j, lr in enumerate(float(x) for x in res["small_lrs"]):
            both = stored[i, j] & stored[c, j]
            d = (eff[i, j] - eff[c, j])[both]
            if d.size == 0:
                continue
            row = {"n": int(d.size), "estimate": float(d.mean())}
            if d.size >= 2:
                row["ci"] = list(stats.t_interval(d)[1:])
            out[f"{a} − {b} @lr={lr:g}"] = row
    return out


def long_summary(res) -> dict:
    """H11 (descriptive): per long arm, runs failed by the criterion, and the final held-out loss − C's."""
    if "long_variants" not in res:
        return {}
    vs = [str(v) for v in np.asarray(res["long_variants"])]
    stored = np.asarray(res["long_stored"], dtype=bool)
    fin = stats.effective_loss(np.asarray(res["long_val_final"]), np.asarray(res["long_val_init"]))
    out = {}
    for i, v in enumerate(vs):
        row = {"stored": int(stored[i].sum()), "failed": int(np.asarray(res["long_failed"])[i][stored[i]].sum())}
        if v != "C" and stored[i].all() and stored[vs.index("C")].all() and stored.shape[1] >= 2:
            mean, lo, hi = stats.t_interval(fin[i] - fin[vs.index("C")])
            row.update(minus_c=mean, ci=[lo, hi])
        out[v] = row
    return out


def analyse(res) -> dict:
    """The registered families from the assembled result (once every arm has its ten seeds at both rates), the
    descriptive differences over the seeds stored (`interim`, complete or not) and H11."""
    out = {"preregistered_on": PREREGISTERED_ON, "seen": SEEN, "rule": RULE, "test": TEST, "alpha": ALPHA,
           "hypotheses": dict(HYPOTHESES), "families": dict(FAMILIES), "predictions": dict(PREDICTIONS)}
    e = _eff(res)
    if e is not None and "C" in e:
        lrs = [float(x) for x in res["small_lrs"]]
        seeds = [int(s) for s in res["small_seeds"]]
        out["calls"] = judge(rows(e, lrs), seeds)
    out["interim"] = interim(res)
    out["H11"] = long_summary(res)
    return out


# -- the rule's error rates and power, measured through `rows` and `judge` (CPU) -----------------------------------
def noise_sd(conf=None) -> dict[float, float]:
    """Per learning rate, the seed standard deviation of one arm's held-out loss about its pairing, estimated from
    the confirmation grid's ten stored seeds of A and C at 4 × 256: sd(A − C) / √2."""
    conf = results.load("confirmation") if conf is None else conf
    lrs = [float(x) for x in conf["small_lrs"]]
    vs = [str(v) for v in np.asarray(conf["small_variants"])]
    eff = stats.effective_loss(conf["small_val_final"], conf["small_val_init"])
    return {lr: float(np.std(eff[vs.index("A"), lrs.index(lr)] - eff[vs.index("C"), lrs.index(lr)], ddof=1)
                      / np.sqrt(2)) for lr in LRS}


def simulate(sd: dict[float, float], n_sims: int = 500, seed: int = 0, gaps: dict[str, float] | None = None) -> dict:
    """Draw whole grids of per-seed effective losses (every arm = a common per-seed level + independent normal
    noise of `sd` per rate, plus `gaps` {arm: nats} added at both rates) and judge each with `rows` and `judge`,
    the code that makes the calls. Returns per family the share of draws with any row called (under no gaps: the
    family-wise false-call rate) and per row the share called on its hypothesised side."""
    rng = np.random.default_rng(seed)
    gaps = gaps or {}
    seeds = list(SEEDS)
    any_call: dict[str, int] = {f: 0 for f in SIDES}
    side: dict[str, int] = {}
    for _ in range(n_sims):
        e = {}
        common = rng.standard_normal((len(LRS), len(seeds)))
        for v in ARMS:
            e[v] = np.stack([2.0 + common[j] * sd[lr] + rng.standard_normal(len(seeds)) * sd[lr] + gaps.get(v, 0.0)
                             for j, lr in enumerate(LRS)])
        calls = judge(rows(e, LRS), seeds)
        for f, fam in calls.items():
            words = [r["verdict"] for r in fam.values() if isinstance(r, dict) and "verdict" in r]
            any_call[f] += any(w in ("supported", "refuted") for w in words)
            for k, r in fam.items():
                if isinstance(r, dict) and "verdict" in r:
                    side[f"{f}:{k}"] = side.get(f"{f}:{k}", 0) + (r["verdict"] == "supported")
    return {"family_rate": {f: n / n_sims for f, n in any_call.items()},
            "row_rate": {k: n / n_sims for k, n in side.items()}, "n_sims": n_sims}


def power_rows(sd: dict[float, float] | None = None) -> list[dict]:
    """Per family: its size, and the gap one row detects with 80 % power on the ten seeds (t test, Holm's first
    step; `lpfail.sweep.power.detectable_sd`), in seed sd and in nats at each rate (the sd of a difference of two
    arms is √2 · sd; H7's slope is per unit of 2^(7−K) and its sd that of a difference divided by the spread of x)."""
    from lpfail.sweep.power import detectable_sd

    sd = noise_sd() if sd is None else sd
    sizes = {"H7": 2, "H8": 12, "gaps": 2, "H9": 2, "H10": 4}
    x = np.array([2.0 ** (7 - k) for k in KS_A])
    spread = float(np.sqrt(((x - x.mean()) ** 2).sum()))
    out = []
    for f, m in sizes.items():
        d = detectable_sd(len(SEEDS), m, ALPHA)
        per = {}
        for lr in LRS:
            diff_sd = np.sqrt(2.0) * sd[lr]
            if f == "H9":
                diff_sd = np.sqrt(1.5) * sd[lr]  # (R − C) − ½(A − C) = R − ½A − ½C
            per[f"{lr:g}"] = d * (diff_sd / spread if f == "H7" else diff_sd)
        out.append({"family": f, "rows": m, "detectable_sd": d, "detectable_nats": per,
                    "unit": "nats per unit of 2^(7−K)" if f == "H7" else "nats"})
    return out
