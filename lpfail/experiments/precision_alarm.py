"""The precision alarm's pre-registered alert rule and its evaluation (chapter 7).

`lpfail.monitor.Alarm` recomputes, on a sampled step, one batch's attention in high precision from the same
inputs and records, per call (= layer) and head, the relative error of the model's own dQ and dK against the
reference (``alarm_dq_rel`` / ``alarm_dk_rel``) and ρ_K of the error's running sum over the latest K
measurements (``alarm_rho_q`` / ``alarm_rho_k``; chapter 3's ρ: ‖Σ ΔW_k‖ / √(Σ ‖ΔW_k‖²), whose square has mean 1
under random signs whatever the terms' sizes). The rule below turns those records into one alarm step per run.

What had been seen when the rule was written (`SEEN`): simulations only. The rule is the draft of
notes/beyond.md (2026-12-01), whose thresholds came from simulated error terms (random signs, one direction,
equal and log-normal sizes); no run of the alarm on real training, on any card, existed. The evaluation grid
(`GRID`) is fresh: seeds 10–14, which no experiment has trained.

The grid (`PrecisionAlarmConfig`, `python -m lpfail sweep precision_alarm status | plan | drive | collect`) trains
lr_sweep's runs with `TrainConfig.monitor` set (the monitor inside lpfail's own loop, uncaptured, no checkpoints:
a run cut off restarts, as the monitor's windows must start at step 0) into its own store, keeps each run's
monitor records (rounded to 4 significant digits), and `evaluate`s the rule on them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from lpfail.alarm import SCALED_RULE, ScaledRule, head_value, scaled_fires, scaled_statistic  # noqa: F401
from lpfail.sweep import lr as L
from lpfail.sweep import GridBase, Run, Store, register_grid, summarize_run
from lpfail.sweep.stats import binomial_interval

# -- the pre-registration (fixed 2026-12-02, before any run of the alarm on training) -----------------------------
PREREGISTERED_ON = "2026-12-02"
SEEN = ("Simulated error terms only (random signs along one direction, equal and "
        "log-normal sizes, 32 tests × ≈ 85 windows per run). No record of the alarm on a training run existed, "
        "on the CPU or a GPU; the logit alert's evaluation on lr_sweep's stored runs (chapter 7) had been seen.")


@dataclass(frozen=True)
class Rule:
    """The alert rule. Per run, at each measurement k and for each (layer, head, side ∈ {q, k}):

    gate    the median of the relative error over the latest `window` measurements ≥ `gate` (the attention's
            gradient is computed at BF16-level precision; FP32 attention gives ≈ 1e-6–1e-5)
    signal  ρ over the latest `window` measurements ≥ `rho`
    fire    at the first measurement where gate and signal have held for the same (layer, head, side) at
            `consecutive` measurements in a row; the run's alarm step is that measurement's step."""

    gate: float = 1e-3
    rho: float = 4.0
    window: int = 16
    consecutive: int = 3

    def __post_init__(self):
        if not (self.gate > 0 and self.rho > 0):
            raise ValueError(f"Rule.gate and Rule.rho must be > 0 (got {self.gate}, {self.rho})")
        for name in ("window", "consecutive"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"Rule.{name} must be a positive int (got {v!r})")


RULE = Rule()
#: The monitor the grid's runs carry (every = 10 steps: 100 measurements in 1,000 steps; the alarm's window of
#: 16 measurements = 160 steps, so it cannot fire before ≈ 180 steps).
MONITOR = {"every": 10, "window": 10, "sample_batch": 1, "alarm_window": RULE.window, "reference": "FP64"}
#: The evaluation grid: lr_sweep's smaller size (4 × 256, 1,000 steps, its batches and schedule) at its two
#: highest learning rates, the paper's arithmetic (A), FP32 attention (C) and production arithmetic (D), fresh seeds.
GRID = {"size": "small", "lrs": (1.6e-2, 3.2e-2), "variants": ("A", "C", "D"), "seeds": tuple(range(10, 15))}
#: A's divergence step: chapter 7's definition (`divergence_steps`), the first bin of
#: the training-loss curve where A's loss exceeds C's (same rate and seed) by more than 5 %.
DIVERGENCE_MARGIN = 0.05
#: What the evaluation reports, fixed with the rule.
GOALS = {
    "false_alarm": "the fraction of C runs and of D runs with an alarm; goal ≤ 10 % each",
    "lead": "per A run that diverges: divergence step − alarm step, beside the logit alert's on the same runs",
    "overhead": "the monitor with the alarm at every = 100 on GPT-2 small (H200) against the plain loop: ≤ 2 %",
}
PREDICTIONS = {
    "C": "no false alarm (95 %): the gate cannot open at FP32 precision",
    "D": "false alarms in ≤ 1 of 10 D runs (55 %): D passes the gate, ρ alone tells it from A",
    "A": "an alarm before divergence in ≥ half of A's diverging runs (50 %); some diverge before step ≈ 180",
}


def divergence_steps(loss_a: np.ndarray, loss_c: np.ndarray, bin_steps: int, margin: float = DIVERGENCE_MARGIN
                     ) -> np.ndarray:
    """Loss curves (…, n_bins) of A and C → the first bin's first step where A > (1 + margin)·C, NaN if never."""
    worse = np.asarray(loss_a, dtype=np.float64) > (1 + margin) * np.asarray(loss_c, dtype=np.float64)
    first = np.argmax(worse, axis=-1)
    return np.where(worse.any(axis=-1), first * float(bin_steps), np.nan)


def _median_window(xs: Sequence[float], window: int) -> float:
    """The median of the finite values among the latest `window` (NaN when none is)."""
    tail = sorted(x for x in xs[-window:] if x is not None and math.isfinite(x))
    n = len(tail)
    if not n:
        return float("nan")
    return float(tail[n // 2]) if n % 2 else 0.5 * (tail[n // 2 - 1] + tail[n // 2])


def fires(records: Iterable[Mapping], rule: Rule = RULE) -> dict | None:
    """The rule on one run's monitor records (`Monitor.records` or `lpfail.monitor.read_jsonl`, in step order):
    {"step", "layer", "head", "side"} of the first alarm, or None. Records without the alarm's fields are skipped;
    a None or non-finite value holds neither gate nor signal."""
    errs: dict[tuple, list] = {}
    run: dict[tuple, int] = {}
    for rec in records:
        if rec.get("kind", "record") != "record" or "alarm_dq_rel" not in rec:
            continue
        for side in ("q", "k"):
            rel, rho = rec.get(f"alarm_d{side}_rel") or [], rec.get(f"alarm_rho_{side}") or []
            for layer, heads in enumerate(rel):
                for head, e in enumerate(heads or []):
                    key = (layer, head, side)
                    errs.setdefault(key, []).append(e)
                    r = head_value(rho, layer, head)
                    ok = (_median_window(errs[key], rule.window) >= rule.gate and r is not None
                          and math.isfinite(r) and r >= rule.rho)
                    run[key] = run.get(key, 0) + 1 if ok else 0
                    if run[key] >= rule.consecutive:
                        return {"step": int(rec["step"]), "layer": layer, "head": head, "side": side}
    return None


def evaluate(runs: Mapping[tuple[str, float, int], dict], rule: Rule = RULE) -> dict:
    """The evaluation of `GOALS` from the grid's runs: ``runs[(variant, lr, seed)]`` = {"records": the monitor
    records, "loss": the training-loss curve (one value per bin), "bin_steps": steps per bin, "logit_alert": the
    logit alert's step or None}. Per variant and rate: the alarm's steps; the false-alarm fractions of C and D;
    for A, per run, its divergence step (against C of the same rate and seed), the alarm's and the logit alert's
    lead times (NaN where A never diverges or the alert never fires)."""
    alarms = {key: fires(r["records"], rule) for key, r in runs.items()}
    out: dict = {"rule": rule.__dict__, "preregistered_on": PREREGISTERED_ON, "alarm_step": {}, "false_alarm": {},
                 "lead": {}}
    for (v, lr, s), a in alarms.items():
        out["alarm_step"][f"{v}@{lr:g}/s{s}"] = None if a is None else a["step"]
    for v in ("C", "D"):
        keys = [k for k in alarms if k[0] == v]
        if keys:
            out["false_alarm"][v] = {"runs": len(keys), "alarms": sum(alarms[k] is not None for k in keys),
                                     "frac": sum(alarms[k] is not None for k in keys) / len(keys)}
    for (v, lr, s) in sorted(k for k in alarms if k[0] == "A"):
        c = runs.get(("C", lr, s))
        if c is None:
            continue
        a = runs[("A", lr, s)]
        div = float(divergence_steps(np.asarray(a["loss"]), np.asarray(c["loss"]), a["bin_steps"],
                                     DIVERGENCE_MARGIN))
        alarm = alarms[("A", lr, s)]
        logit = a.get("logit_alert")
        out["lead"][f"{lr:g}/s{s}"] = {
            "divergence_step": div, "alarm_step": None if alarm is None else alarm["step"],
            "alarm_lead": div - alarm["step"] if alarm is not None and math.isfinite(div) else float("nan"),
            "logit_lead": div - logit if logit is not None and math.isfinite(div) else float("nan")}
    return out


#: `describe` was written on 2026-12-02 after the evaluation had been seen (the rule fired in none of the 30 runs):
#: it says why, and adds the logit alert's false alarms on the same C and D runs. Description, not a test.
DESCRIBED_AFTER = ("written 2026-12-02 after the pre-registered evaluation had been seen (no alarm in 30 runs); "
                   "descriptive only, no decision rests on it")


def _finite(values) -> list[float]:
    return [float(x) for x in values if x is not None and isinstance(x, (int, float)) and math.isfinite(x)]


def _flat(rec: Mapping, field: str) -> list[float]:
    return _finite(v for row in rec.get(field) or [] for v in (row or []))


def describe(runs: Mapping[tuple[str, float, int], dict], rule: Rule = RULE) -> dict:
    """What the runs' records show beside the rule (`DESCRIBED_AFTER`). Per run "variant@lr/sseed": the largest
    ρ over every layer, head, side and measurement ("rho_max"), the fraction of (measurement, head, side) values
    at or above the rule's ρ ("rho_frac_over"), the median relative error of dQ over the run ("dq_rel_median"),
    and the logit alert's step. Per variant and rate ("cells"): the runs, the logit alert's count, the range of
    rho_max and the median of dq_rel_median. "rho_by_step": per variant and rate, the steps and, at each, the
    median over seeds of the largest ρ over heads and sides (the figure's curves)."""
    per_run, curves = {}, {}
    for (v, lr, s), r in sorted(runs.items()):
        recs = [x for x in r["records"] if "alarm_rho_q" in x]
        rhos = [_flat(x, "alarm_rho_q") + _flat(x, "alarm_rho_k") for x in recs]
        allr = [x for row in rhos for x in row]
        dq = [x for rec in recs for x in _flat(rec, "alarm_dq_rel")]
        per_run[f"{v}@{lr:g}/s{s}"] = {
            "rho_max": max(allr) if allr else float("nan"),
            "rho_frac_over": sum(x >= rule.rho for x in allr) / len(allr) if allr else float("nan"),
            "dq_rel_median": float(np.median(dq)) if dq else float("nan"),
            "logit_alert": r.get("logit_alert")}
        curves.setdefault((v, lr), []).append(([int(x["step"]) for x in recs],
                                               [max(row) if row else float("nan") for row in rhos]))
    cells, by_step = {}, {}
    for (v, lr), series in sorted(curves.items()):
        mine = [d for k, d in per_run.items() if k.startswith(f"{v}@{lr:g}/")]
        rmax = _finite(d["rho_max"] for d in mine)
        cells[f"{v}@{lr:g}"] = {"variant": v, "lr": lr, "runs": len(mine),
                                "logit_alerts": sum(d["logit_alert"] is not None for d in mine),
                                "rho_max_range": [min(rmax), max(rmax)] if rmax else None,
                                "dq_rel_median": float(np.median(_finite(d["dq_rel_median"] for d in mine)))}
        steps = series[0][0]
        if all(st == steps for st, _ in series):
            by_step[f"{v}@{lr:g}"] = {"steps": steps, "rho_max_median": [
                float(np.nanmedian(col)) if np.isfinite(col).any() else float("nan")
                for col in np.asarray([vals for _, vals in series], dtype=np.float64).T]}
    return {"described": DESCRIBED_AFTER, "runs": per_run, "cells": cells, "rho_by_step": by_step}


# -- the second rule: the gradient's error per unit of logit (fixed 2026-12-06, before any run of its grid) --------
SCALED_PREREGISTERED_ON = "2026-12-06"
#: What had been seen when the second rule was written (2026-12-06, 17:30 UTC).
SCALED_SEEN = (
    "The 30 runs of the first rule's evaluation (seeds 10–14; A, C and D at 1.6e-2 and 3.2e-2; an H200, "
    "2026-12-02), every monitor record of them, and the first rule's outcome (no alarm). On those runs we compared, "
    "by their hits (an alarm at least 50 steps before A's divergence) and their alarms on C and D: the median, "
    "per-layer median and maximum over heads of the dQ/dK relative error at thresholds 0.01–0.5 and 1–3 "
    "consecutive measurements (every one fired on 5–10 of the 10 D runs: production arithmetic's error is as large "
    "once its logits are); ρ over time (≈ 1 in every variant: no coherence to detect at this sampling); and the "
    "error divided by the head's largest logit, and by its square root, at four thresholds each and 3, 5 or 8 "
    "consecutive measurements. The rule below is the best of those on the 30 runs (7 of 7 divergences hit with "
    "90–430 steps of lead, 0 of 10 C runs and 2 of 10 D runs alarmed; it fires at step 70, its earliest, in all 10 "
    "A runs, the 3 that never diverge included: it tells the paper's arithmetic from production arithmetic and FP32 "
    "attention rather than timing a divergence): chosen on them, so its numbers there are development numbers, not "
    "an evaluation. No run of seeds 30–49 existed.")


#: The rule itself — `ScaledRule`, `SCALED_RULE` (threshold 5e-4, 8 measurements in a row, logit floor 1),
#: `scaled_statistic`, `scaled_fires` — was written here with this registration and moved unchanged into `lpfail.alarm`
#: after its evaluation, so that users of the monitor can apply it; it is imported above.
#: Its evaluation grid: the first grid's rates, variants and monitor on twenty seeds no grid has trained.
SCALED_GRID = {"size": "small", "lrs": GRID["lrs"], "variants": GRID["variants"], "seeds": tuple(range(30, 50))}
#: A hit: the alarm at least this many steps before A's divergence (`divergence_steps`, against C, same rate and seed).
LEAD_STEPS = 50
#: The goal of issue "kit": at least 80 % of A's divergences hit, at most 10 % of C runs and of D runs alarmed.
SCALED_GOAL = {"hit": 0.80, "false_alarm": 0.10}
SCALED_DECISION = (
    "Hits: among A's runs that diverge (`divergence_steps`), the fraction with an alarm at least 50 steps before the "
    "divergence. False alarms: the fraction of C runs, and of D runs, with an alarm at any step. Each with its exact "
    "(Clopper–Pearson) 95 % interval. The goal is 'met' when the hit rate's interval lies at or above 0.80 and both "
    "false-alarm intervals at or below 0.10; 'missed' when the hit rate's interval lies below 0.80 or a false-alarm "
    "interval above 0.10; else 'undecided', naming the part the runs could not decide. The logit alert's hits and "
    "false alarms on the same runs are reported beside it, without a call.")
#: Written with the rule, before its runs (for the closing note to compare against).
SCALED_PREDICTIONS = {
    "hit": "≥ 80 % of A's divergences hit (65 %); the interval decides it (45 %)",
    "C": "no alarm on any C run (80 %)",
    "D": "alarms on 5–30 % of D runs (60 %), so the goal is missed or undecided on D (70 %)",
}


def decide(hits: int, diverged: int, false_alarms: Mapping[str, tuple[int, int]],
           goal: Mapping[str, float] = SCALED_GOAL) -> dict:
    """`SCALED_DECISION` from counts: hits of `diverged`, and per variant (alarms, runs). Returns the word, the
    rates with their intervals, and which parts are undecided."""
    out = {"hit": None, "false_alarm": {}, "undecided": []}
    missed = False
    if diverged:
        lo, hi = binomial_interval(hits, diverged)
        out["hit"] = {"k": int(hits), "n": int(diverged), "rate": hits / diverged, "ci": [lo, hi]}
        if hi < goal["hit"]:
            missed = True
        elif lo < goal["hit"]:
            out["undecided"].append("hit")
    else:
        out["undecided"].append("hit")
    for v, (k, n) in false_alarms.items():
        if not n:
            out["undecided"].append(v)
            continue
        lo, hi = binomial_interval(k, n)
        out["false_alarm"][v] = {"k": int(k), "n": int(n), "rate": k / n, "ci": [lo, hi]}
        if lo > goal["false_alarm"]:
            missed = True
        elif hi > goal["false_alarm"]:
            out["undecided"].append(v)
    out["word"] = "missed" if missed else "undecided" if out["undecided"] else "met"
    return out


def evaluate_scaled(runs: Mapping[tuple[str, float, int], dict], rule: ScaledRule = SCALED_RULE) -> dict:
    """The second rule on a grid's runs (the layout of `evaluate`): per run its alarm step; per A run that diverges,
    the divergence step and the alarm's and the logit alert's lead; the hits, the false alarms on C and D, and the
    decision (`decide`); the logit alert's counts on the same runs beside it."""
    alarms = {key: scaled_fires(r["records"], rule) for key, r in runs.items()}
    out: dict = {"rule": dataclasses.asdict(rule), "preregistered_on": SCALED_PREREGISTERED_ON, "alarm_step": {},
                 "lead": {}}
    for (v, lr, s), step in sorted(alarms.items()):
        out["alarm_step"][f"{v}@{lr:g}/s{s}"] = step
    hits = logit_hits = diverged = quiet_alarms = quiet = 0
    for (v, lr, s) in sorted(k for k in alarms if k[0] == "A"):
        c = runs.get(("C", lr, s))
        if c is None:
            continue
        a = runs[("A", lr, s)]
        div = float(divergence_steps(np.asarray(a["loss"]), np.asarray(c["loss"]), a["bin_steps"]))
        alarm, logit = alarms[("A", lr, s)], a.get("logit_alert")
        row = {"divergence_step": div if math.isfinite(div) else None, "alarm_step": alarm, "logit_alert": logit,
               "alarm_lead": div - alarm if alarm is not None and math.isfinite(div) else None,
               "logit_lead": div - logit if logit is not None and math.isfinite(div) else None}
        out["lead"][f"{lr:g}/s{s}"] = row
        if math.isfinite(div):
            diverged += 1
            hits += row["alarm_lead"] is not None and row["alarm_lead"] >= LEAD_STEPS
            logit_hits += row["logit_lead"] is not None and row["logit_lead"] >= LEAD_STEPS
        else:
            quiet += 1
            quiet_alarms += alarm is not None
    fa = {v: (sum(alarms[k] is not None for k in alarms if k[0] == v), sum(k[0] == v for k in alarms))
          for v in ("C", "D")}
    out["decision"] = decide(hits, diverged, fa)
    #: not part of the goal, reported beside it: A's runs that never diverge, and how many of them alarmed
    out["A_without_divergence"] = {"runs": quiet, "alarms": quiet_alarms}
    out["logit_alert"] = {"hits": logit_hits, "diverged": diverged,
                          "false_alarms": {v: [sum(runs[k].get("logit_alert") is not None for k in runs if k[0] == v),
                                               fa[v][1]] for v in fa}}
    return out


def decision_rates(p_hit: float, p_false: Mapping[str, float], diverged: int, runs: Mapping[str, int],
                   n_sims: int = 2000, seed: int = 0) -> dict[str, float]:
    """How often `decide` says each word when the true hit rate is `p_hit` and the true false-alarm rates are
    `p_false`, with `diverged` A runs diverging and `runs` C and D runs (binomial draws, the code that makes the
    call): the design's power and false-call rate."""
    rng = np.random.default_rng(seed)
    words = {"met": 0, "missed": 0, "undecided": 0}
    for _ in range(n_sims):
        fa = {v: (int(rng.binomial(runs[v], p_false[v])), runs[v]) for v in runs}
        words[decide(int(rng.binomial(diverged, p_hit)), diverged, fa)["word"]] += 1
    return {w: k / n_sims for w, k in words.items()}


# -- the grid --------------------------------------------------------------------------------------------------
#: `MONITOR` as a `TrainConfig.monitor` spec
MONITOR_SPEC = (f"every={MONITOR['every']} window={MONITOR['window']} sample_batch={MONITOR['sample_batch']} "
                f"alarm={MONITOR['alarm_window']} reference={MONITOR['reference']}")
STORE = Store("precision_alarm_parts", "lpfail.precision_alarm.part", "python -m lpfail sweep precision_alarm drive")
#: the monitor's fields a part keeps per record (per call or projection layer, per head)
KEPT = ("step", "max_logit", "alarm_dq_rel", "alarm_dk_rel", "alarm_rho_q", "alarm_rho_k")


@dataclass(frozen=True)
class PrecisionAlarmConfig(L.LRSweepConfig):
    """lr_sweep's setting at `GRID`'s rates, variants and fresh seeds, every run watched by the monitor and its
    alarm (`MONITOR_SPEC`), uncaptured and without checkpoints."""

    lrs: tuple[float, ...] = GRID["lrs"]
    seeds: tuple[int, ...] = GRID["seeds"]
    variants: tuple[str, ...] = GRID["variants"]
    large_variants: tuple[str, ...] = ()
    cuda_graph: bool = False
    checkpoint_every: int = 0
    monitor: str = MONITOR_SPEC

    def __post_init__(self):
        super().__post_init__()
        from lpfail.train.watch import parse

        if not parse(self.monitor).get("alarm"):
            raise ValueError(f"PrecisionAlarmConfig.monitor must switch the alarm on (alarm=K; got {self.monitor!r})")
        if self.cuda_graph:
            raise ValueError("PrecisionAlarmConfig.cuda_graph must be False (the monitor's hooks are not captured)")


def _round(x, digits: int = 4):
    if isinstance(x, list):
        return [_round(v, digits) for v in x]
    if isinstance(x, float) and math.isfinite(x) and x != 0.0:
        return float(f"{x:.{digits}g}")
    return x


def logit_alert(records: Sequence[Mapping], threshold: float | None = None) -> int | None:
    """The monitor's max-logit alert on a run's records: the first step where a head's largest logit exceeds
    `Thresholds().max_logit` (30) — chapter 7's logit alert, at the monitor's own resolution."""
    from lpfail.monitor import Thresholds

    limit = Thresholds().max_logit if threshold is None else threshold
    for rec in records:
        vals = [v for row in rec.get("max_logit") or [] for v in (row or []) if v is not None and math.isfinite(v)]
        if vals and max(vals) > limit:
            return int(rec["step"])
    return None


class PrecisionAlarmGrid(GridBase):
    name = "precision_alarm"
    store = STORE
    description = "the precision alarm on fresh runs of A, C and D at lr_sweep's two highest rates (chapter 7)"

    def __init__(self, config: PrecisionAlarmConfig):
        self.config = config
        self.curve_points = config.curve_points

    def runs(self) -> list[Run]:
        c = self.config
        out = []
        for p in L.plan(c):
            tc = dataclasses.replace(L.train_config(c, p, ""), monitor=c.monitor)
            out.append(Run(p.key, self.store, tc, group=p.variant, seed=p.seed, checkpoint_every=0))
        return out

    def quick(self):
        """A, C and D at the highest rate, the first seed: the step of the alarm in A's run (the run's length when
        it never fires; NaN while A's run is missing)."""
        from lpfail.sweep.quick import Quick

        c, lr = self.config, float(self.config.lrs[-1])
        runs = [r for r in self.runs() if r.seed == c.seeds[0] and float(r.config.lr) == lr]

        def alarm_step(have: dict, seed: int) -> float:
            a = have.get(L.Point("small", "A", lr, int(seed)).key)
            if a is None:
                return float("nan")
            step = self.alarm_step(a.get("monitor", []))
            return float(step) if step is not None else float(c.max_steps)

        return Quick(runs, alarm_step, f"step of {self.rule_words} in A's run at lr {lr:g} (the run's length if it "
                     "never fires), one seed", c.seeds[0], tuple(c.seeds))

    rule_words = "the precision alarm"

    @staticmethod
    def alarm_step(records) -> int | None:
        """The step at which the grid's rule alarms on one run's records (the first rule, `fires`), or None."""
        hit = fires(records)
        return None if hit is None else int(hit["step"])

    def summarize(self, run_dir, tc, key: str) -> dict:
        from lpfail.monitor import read_jsonl

        out = summarize_run(run_dir, tc, key, self.curve_points)
        path = Path(run_dir) / "monitor.jsonl"
        recs = [r for r in read_jsonl(path) if r.get("kind") == "record"] if path.is_file() else []
        out["monitor"] = [{k: _round(r[k]) for k in KEPT if k in r} for r in recs]
        return out

    def stored_runs(self, have: dict, planned: list[Run]) -> dict[tuple[str, float, int], dict]:
        """The stored runs among `planned` in `evaluate`'s layout: (variant, lr, seed) → records, loss curve, bin,
        logit alert."""
        c, runs = self.config, {}
        for r in planned:
            s = have.get(r.id)
            if s is None:
                continue
            runs[(r.group, float(r.config.lr), int(r.seed))] = {
                "records": s.get("monitor", []), "loss": s["loss_curve"], "bin_steps": c.max_steps // c.curve_points,
                "logit_alert": logit_alert(s.get("monitor", [])), "status": s["status"]}
        return runs

    def result(self, have: dict, parts: list[dict]) -> dict:
        planned = self.runs()
        runs = self.stored_runs(have, planned)
        return {"preregistered_on": PREREGISTERED_ON, "complete": len(runs) == len(planned),
                "runs_stored": len(runs), "runs_planned": len(planned), "analysis": evaluate(runs),
                "scaled_development": evaluate_scaled(runs),
                "description": describe(runs)}


@register_grid("precision_alarm", config=PrecisionAlarmConfig, chapter="07_diagnose",
               description="the precision alarm against the logit alert on fresh runs (chapter 7; GPU)")
def precision_alarm_grid(config: PrecisionAlarmConfig | None = None) -> PrecisionAlarmGrid:
    """The grid; its result evaluates the pre-registered rule on the runs' monitor records."""
    return PrecisionAlarmGrid(config or PrecisionAlarmConfig())


# -- the second rule's evaluation on fresh seeds (pre-registered above, `SCALED_*`) -------------------------------------
SCALED_STORE = Store("precision_alarm_fresh_parts", "lpfail.precision_alarm_fresh.part",
                     "python -m lpfail sweep precision_alarm_fresh drive")


@dataclass(frozen=True)
class FreshAlarmConfig(PrecisionAlarmConfig):
    """The first grid's setting (rates, variants, monitor) on `SCALED_GRID`'s twenty fresh seeds."""

    seeds: tuple[int, ...] = SCALED_GRID["seeds"]


class FreshAlarmGrid(PrecisionAlarmGrid):
    """`ScaledRule`'s pre-registered evaluation: the first grid's runs on fresh seeds, into their own store."""

    name = "precision_alarm_fresh"
    store = SCALED_STORE
    description = "the alarm's second rule (ScaledRule) on twenty fresh seeds of A, C and D (chapter 7)"
    rule_words = "the alarm's second rule"

    @staticmethod
    def alarm_step(records) -> int | None:
        """The step at which `ScaledRule` alarms on one run's records, or None."""
        return scaled_fires(records)

    def result(self, have: dict, parts: list[dict]) -> dict:
        planned = self.runs()
        runs = self.stored_runs(have, planned)
        return {"preregistered_on": SCALED_PREREGISTERED_ON, "complete": len(runs) == len(planned),
                "runs_stored": len(runs), "runs_planned": len(planned), "analysis": evaluate_scaled(runs),
                "first_rule": evaluate(runs), "description": describe(runs)}


@register_grid("precision_alarm_fresh", config=FreshAlarmConfig, chapter="07_diagnose",
               description="the alarm's second rule on twenty fresh seeds of A, C and D (chapter 7; GPU)",
               preregistered_on=SCALED_PREREGISTERED_ON, seen=SCALED_SEEN)
def precision_alarm_fresh_grid(config: FreshAlarmConfig | None = None) -> FreshAlarmGrid:
    """The fresh grid; its result evaluates the pre-registered second rule (and the first beside it)."""
    return FreshAlarmGrid(config or FreshAlarmConfig())
