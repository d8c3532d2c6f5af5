"""Chapter 7's figures and tables ("Diagnose your own model"). The demonstration runs (a small CPU training run
watched by `lpfail.monitor`, the same run without it, per-layer substitutions with `lpfail.substitute`) are the
stored experiment `monitor_demo` (`lpfail.experiments.monitor_demo`, whose functions are re-exported here);
`demo_runs` turns its stored result back into the runs the figures read."""
from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt
import numpy as np

from lpfail import results
from lpfail.book import plots
from lpfail.book.text import listing, md_table, span, wrap
from lpfail.book.verdict import load_or_none
from lpfail.experiments import precision_alarm as P
from lpfail.experiments.monitor_demo import (corpus_batches, demo_runs, headline, stored_substitution,
                                             substitution_losses, tiny_gpt, train_run)

__all__ = ["corpus_batches", "demo_runs", "headline", "stored_substitution", "substitution_losses", "tiny_gpt",
           "train_run"]  # the demonstration's functions, re-exported for the chapter; the rest is defined below


def series(records: list[dict], stat: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values (n_records, n_layer, n_head)) of one monitored statistic, over the records that have it."""
    rs = [r for r in records if stat in r]
    return np.array([r["step"] for r in rs]), np.array([r[stat] for r in rs], dtype=np.float64)


def monitor_figure(runs: dict):
    """Two rows of panels: the largest attention logit (max over heads) and the fraction of query rows with a
    tied BF16 maximum (max over heads), per layer, against the step, for each run in `runs` {label: run}."""
    fig, axes = plt.subplots(1, 3, figsize=(10.2, 3.4))
    styles = ["-", "--", ":"]
    # the runs are not variants (both are FP32 SDPA): shades of the sequential series map, never a variant colour
    for (label, run), color in zip(runs.items(), plots.series_colors(max(len(runs), 2))[::-1]):
        st, ml = series(run["records"], "max_logit")
        _, tf = series(run["records"], "tied_frac")
        for layer in range(ml.shape[1]):
            kw = dict(color=color, ls=styles[layer % 3], label=f"{label}, layer {layer}")
            axes[0].plot(st, ml[:, layer].max(axis=1), **kw)
            axes[1].plot(st, tf[:, layer].max(axis=1), **kw)
        axes[2].plot(np.arange(len(run["losses"])), run["losses"], color=color, label=label, lw=0.8)
    axes[0].set(xlabel="step", ylabel="max attention logit", title="largest logit")
    axes[1].set(xlabel="step", ylabel="fraction of rows", title="tied BF16 row maximum")
    axes[2].set(xlabel="step", ylabel="training loss (nats/byte)", title="loss")
    axes[0].legend()
    axes[2].legend()
    fig.tight_layout()
    return fig


# -- the monitor's overhead, as measured on a GPU (tools/gpu_monitor_overhead.py) ----------------------------
OVERHEAD_FILE = "kernels_gpu/monitor_overhead.json"  # beside the other GPU files: not an experiment of the cache
#: When the stored measurement was taken, and on what code (its json has no "when" or "git" field, which the tool
#: writes now; from notes/gpu_calls/20261201T0749/README.md). A json that has "when" is described by it.
OVERHEAD_PROVENANCE = {"when": "2026-12-01", "tree": "23f8cd9", "monitor": "before the hot-path fix"}


def overhead_lines(res: dict, provenance: dict | None = None) -> list[str]:
    """Plain-text lines (≤ 76 characters) for a stored monitor-overhead measurement: device, the median
    overhead of unsampled steps and the mean over whole intervals, the 2 % target, and whether the losses
    were bit-identical (and, where measured, whether two plain runs were: the noise floor)."""
    prov = {"when": res["when"], "monitor": f"git {res['git'][:12]}" if res.get("git") else None} \
        if res.get("when") else (provenance or {})
    med = res.get("overhead_pct_median_unsampled", res.get("overhead_pct_median"))
    lines = [f"{res['device']}, {prov.get('when', '?')}, {res['model']}, {res['steps']} steps"
             + (f"; monitor code: {prov['monitor']}" if prov.get("monitor") else ""),
             f"median step overhead: {med:+.1f} %; mean over the run: {res['overhead_pct_mean']:+.1f} % "
             f"(target ≤ 2 %: {'met' if res['overhead_pct_mean'] <= 2.0 else 'missed'})",
             f"mean step time: monitored {res['mean_monitored_s']:.3f} s, plain "
             + ", ".join(f"{t:.3f}" for t in res["mean_plain_s"]) + " s",
             f"losses bit-identical with and without the monitor: {res['losses_identical']} "
             f"(max difference {res['max_loss_diff']:.2g})"]
    if "plain_runs_identical" in res:
        lines.append(f"two plain runs bit-identical (the noise floor): {res['plain_runs_identical']} "
                     f"(max difference {res['max_loss_diff_plain_plain']:.2g})")
    else:
        lines.append("two plain runs were not compared: a non-deterministic kernel and the monitor cannot "
                     "be told apart in this measurement")
    return [wrap(x) for x in lines]


#: The same measurement at a shorter interval than the monitor's default (every=10, window=50).
OVERHEAD_EVERY10_FILE = "kernels_gpu/monitor_overhead_every10.json"


def load_overhead(name: str = OVERHEAD_FILE) -> dict | None:
    """A stored measurement (default: results/kernels_gpu/monitor_overhead.json, the monitor at its default
    interval), or None when there is none; ValueError when the file is not valid JSON."""
    p = results.results_dir() / name
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is corrupt: {e}") from None


def breakdown_lines(res: dict) -> list[str]:
    """Where a sampled step's extra time went (`sampled_step_breakdown_s`, medians, synchronised around each
    part), in ms, as plain-text lines (≤ 76 characters); [] for a measurement without a breakdown."""
    b = res.get("sampled_step_breakdown_s")
    if not b:
        return []
    ms = lambda k: f"{1e3 * b[k]:.1f} ms"  # noqa: E731
    parts = [f"forward {ms('forward_sampled')} sampled vs {ms('forward_plain')} plain"]
    parts += [f"{label} {ms(k)}" for k, label in (("qk_norms", "norms"), ("to_host", "copy to host"),
                                                  ("entropy_host", "update eigenvalues (host)")) if k in b]
    return [wrap("a sampled step's parts: " + "; ".join(parts))]


# -- the precision alarm's evaluation (lpfail.experiments.precision_alarm; results/precision_alarm.json) ----------
#: The alarm's overhead on GPT-2 small (tools/gpu_monitor_overhead.py --alarm), beside the monitor's own file.
ALARM_OVERHEAD_FILE = "kernels_gpu/alarm_overhead.json"


def _alarm_scalars(res):
    """The stored evaluation's entries: a `results.Result` (indexed by entry) or its JSON file's dict."""
    return res["scalars"] if isinstance(res, dict) and "scalars" in res else res


def _range(values):
    xs = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return (min(xs), max(xs)) if xs else None


def _steps(x) -> str:
    return "never" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.0f}"


def alarm_facts(res: dict, overhead: dict | None = None) -> dict:
    """The numbers chapter 7 states about the precision alarm, from the stored evaluation (``res`` =
    `results.load("precision_alarm")`) and its overhead measurement (`load_overhead(ALARM_OVERHEAD_FILE)`):
    runs, alarms, false alarms of C and D (the alarm's and the logit alert's), A's diverging runs and how many the
    alarm and the logit alert preceded, the logit alert's lead, the largest ρ per variant, the rule's thresholds,
    and the overhead (None where not measured)."""
    sc = _alarm_scalars(res)
    an, de = sc["analysis"], sc["description"]
    rule = an["rule"]
    lead = an["lead"].values()
    diverging = [d for d in lead if math.isfinite(d["divergence_step"])]
    logit_leads = [d["logit_lead"] for d in diverging if math.isfinite(d["logit_lead"])]
    cells = de["cells"]
    rho = {}
    for c in cells.values():
        lo, hi = c["rho_max_range"]
        old = rho.get(c["variant"], (lo, hi))
        rho[c["variant"]] = (min(old[0], lo), max(old[1], hi))
    out = {"runs": sc["runs_stored"], "planned": sc["runs_planned"], "complete": sc["complete"],
           "alarms": sum(v is not None for v in an["alarm_step"].values()),
           "false": {v: (d["alarms"], d["runs"]) for v, d in an["false_alarm"].items()},
           "logit_false": {v: (sum(c["logit_alerts"] for c in cells.values() if c["variant"] == v),
                               sum(c["runs"] for c in cells.values() if c["variant"] == v)) for v in ("C", "D")},
           "a_runs": len(an["lead"]), "a_diverging": len(diverging),
           "a_alarm_first": sum(d["alarm_step"] is not None and d["alarm_step"] < d["divergence_step"]
                                for d in diverging),
           "a_logit_first": sum(math.isfinite(d["logit_lead"]) and d["logit_lead"] > 0 for d in diverging),
           "logit_lead": (min(logit_leads), max(logit_leads)) if logit_leads else None,
           "divergence": (min(d["divergence_step"] for d in diverging),
                          max(d["divergence_step"] for d in diverging)) if diverging else None,
           "rho_max": rho, "rule_rho": rule["rho"], "rule_gate": rule["gate"], "window": rule["window"],
           "consecutive": rule["consecutive"], "lrs": sorted({c["lr"] for c in cells.values()}),
           "seeds": len({k.rsplit("/s", 1)[1] for k in de["runs"]}),
           "logit_steps": _range(d["logit_alert"] for d in de["runs"].values()),
           "dq_rel": {k: c["dq_rel_median"] for k, c in cells.items()},
           "dq_ratio_a_d": _range(cells[f"A@{lr:g}"]["dq_rel_median"] / cells[f"D@{lr:g}"]["dq_rel_median"]
                                  for lr in sorted({c["lr"] for c in cells.values()})
                                  if f"A@{lr:g}" in cells and f"D@{lr:g}" in cells),
           "overhead": None}
    if overhead is not None:
        out["overhead"] = {"alarm_pct": overhead["alarm_increment_pct"], "total_pct": overhead["overhead_pct_mean_alarm"],
                           "monitor_pct": overhead["overhead_pct_mean"], "every": overhead["every"],
                           "alarm_ms": 1e3 * overhead["alarm_step_breakdown_s"]["alarm"],
                           "device": overhead["device"], "when": overhead["when"], "model": overhead["model"]}
    return out


def alarm_table(res: dict) -> str:
    """Per variant and learning rate: runs, precision alarms, logit alerts, the largest ρ of any head in any run,
    and the median relative error of dQ against FP64 — a Markdown table (`md_table`)."""
    sc = _alarm_scalars(res)
    an, cells = sc["analysis"], sc["description"]["cells"]
    rows = []
    for key, c in sorted(cells.items(), key=lambda kv: ("ACD".index(kv[1]["variant"]), kv[1]["lr"])):
        alarms = sum(v is not None for k, v in an["alarm_step"].items() if k.startswith(key + "/"))
        lo, hi = c["rho_max_range"]
        rows.append([plots.label(c["variant"]), f"{c['lr']:g}", c["runs"], alarms, c["logit_alerts"],
                     span(lo, hi, ".2f", sep="–"), f"{c['dq_rel_median']:.2g}"])
    return md_table(["variant", "learning rate", "runs", "precision alarms", "logit alerts",
                     "largest ρ per run", "median relative dQ error"], rows)


def alarm_lead_table(res: dict) -> str:
    """Per run of the paper's arithmetic: the step its loss left FP32 attention's (same rate and seed), and the
    steps of the precision alarm and of the logit alert ('never' where none) — a Markdown table."""
    sc = _alarm_scalars(res)
    per_run = sc["description"]["runs"]
    return _lead_table(sc["analysis"]["lead"], lambda key, d: per_run[f"A@{key}"]["logit_alert"],
                       "precision alarm at step")


def _lr_seed(key: str) -> tuple[float, int]:
    """(learning rate, seed) of a lead key "0.016/s30"."""
    lr, seed = key.split("/s")
    return float(lr), int(seed)


def _lead_table(lead: dict, logit, alarm_header: str) -> str:
    """Per run of the paper's arithmetic, by rate and seed: the step its loss left FP32 attention's, the alarm's step
    and the logit alert's (`logit(key, row)`), 'never' where none — a Markdown table."""
    rows = []
    for key, d in sorted(lead.items(), key=lambda kv: _lr_seed(kv[0])):
        lr, seed = key.split("/s")
        rows.append([lr, seed, _steps(d["divergence_step"]), _steps(d["alarm_step"]), _steps(logit(key, d))])
    return md_table(["learning rate", "seed", "A leaves C at step", alarm_header, "logit alert at step"], rows)


def alarm_figure(res: dict):
    """One panel per learning rate: the median over seeds of the largest ρ over heads and sides at each
    measurement, for A, C and D, with the rule's threshold."""
    sc = _alarm_scalars(res)
    by, rule = sc["description"]["rho_by_step"], sc["analysis"]["rule"]
    lrs = sorted({float(k.split("@")[1]) for k in by})
    fig, axes = plt.subplots(1, len(lrs), figsize=(4.6 * len(lrs), 3.4), sharey=True, squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        for v in ("A", "D", "C"):
            d = by.get(f"{v}@{lr:g}")
            if d:
                ax.plot(d["steps"], d["rho_max_median"], label=plots.label(v), **plots.style(v, lw=1.2))
        ax.axhline(rule["rho"], color="#555555", ls="--", lw=1.0)
        ax.text(0.02, rule["rho"] - 0.1, f"the rule's ρ ≥ {rule['rho']:g}", transform=ax.get_yaxis_transform(),
                va="top", fontsize=9, color="#555555")
        ax.set(xlabel="step", title=f"learning rate {lr:g}", ylim=(0, rule["rho"] + 0.6))
        ax.legend(loc="upper right", bbox_to_anchor=(1.0, 0.86), fontsize=9)
    axes[0][0].set_ylabel("largest ρ over heads\n(median of seeds)")
    fig.tight_layout()
    return fig


def fresh_alarm(load=None):
    """The stored evaluation of the alarm's second rule on fresh seeds (experiment ``precision_alarm_fresh``), or
    None while it is not stored."""
    return load_or_none(load or results.load, "precision_alarm_fresh")


def scaled_rule_text(res: dict, fresh: dict | None = None) -> str:
    """Chapter 7's paragraph on the second alarm rule (`lpfail.experiments.precision_alarm.ScaledRule`): what it
    measures, its numbers on the runs it was chosen on (``scaled_development`` of the stored `precision_alarm`, said
    to be development numbers), and its pre-registered evaluation on fresh seeds (`fresh_alarm`): its decision with
    the exact intervals where stored, else that it has not run."""
    dev = res.get("scaled_development") if hasattr(res, "get") else None
    rule = P.SCALED_RULE
    head = (f"So a size rule was chosen on these runs and registered before any fresh run (ScaledRule in "
            f"lpfail.experiments.precision_alarm, {P.SCALED_PREREGISTERED_ON}): the median over heads of the gradient's "
            f"relative error divided by the head's largest logit, at or above {rule.threshold:g} for "
            f"{rule.consecutive} measurements in a row. Rounding makes the error grow with the logits; the paper's "
            "arithmetic makes it grow faster per unit of logit than production arithmetic.")
    if not dev:
        return head + " Its numbers on these runs are not stored."
    d, quiet = dev["decision"], dev["A_without_divergence"]
    steps = sorted({v for k, v in dev["alarm_step"].items() if k.startswith("A@") and v is not None})
    when = ("" if not steps else f"at step {steps[0]}, its earliest," if len(steps) == 1
            else f"between steps {steps[0]} and {steps[-1]}")
    fa = d["false_alarm"]
    goal = (f"goal: at least {100 * P.SCALED_GOAL['hit']:.0f} % of divergences hit, at most "
            f"{100 * P.SCALED_GOAL['false_alarm']:.0f} % of FP32 or production runs alarmed")
    text = (f"{head} On the runs it was chosen on (development numbers, not a test) it precedes "
            f"{d['hit']['k']} of {d['hit']['n']} divergences by at least {P.LEAD_STEPS} steps and alarms on "
            f"{fa['C']['k']} of {fa['C']['n']} FP32 runs and {fa['D']['k']} of {fa['D']['n']} production runs; it "
            f"fires {when} in the paper's arithmetic, including the {quiet['runs']} runs that never diverge, so it "
            "tells which arithmetic a model runs more than when a run will fail.")
    ev = ((fresh or {}).get("analysis") or {}).get("decision")
    if not ev or not fresh.get("complete", False):
        n = f" ({int(fresh['runs_stored'])} of {int(fresh['runs_planned'])} runs stored)" if fresh else ""
        return (f"{text} Its pre-registered test on {len(P.SCALED_GRID['seeds'])} fresh seeds ({goal}) has not run "
                f"yet{n}.")

    hit = _rate(ev["hit"]) if ev.get("hit") else "no divergence"
    fal, f = ev["false_alarm"], fresh_facts(fresh)
    miss = "; ".join(f"at {lr:g}, seed {s}, A left C at step {dv:.0f}, the alarm came at step {_steps(al)}"
                     for lr, s, dv, al in f["missed"])
    return (f"{text} On {len(P.SCALED_GRID['seeds'])} fresh seeds ({f['device']}, {f['when']}), its pre-registered "
            f"test ({goal}, exact 95 % intervals): divergences hit {hit}; alarms on FP32 runs {_rate(fal['C'])} and on "
            f"production runs {_rate(fal['D'])}. The goal is {ev['word']}"
            + (f" ({listing([_PARTS.get(x, x) for x in ev['undecided']])} not decided by the runs)."
               if ev["word"] == "undecided" else ".")
            + (f" The divergence it missed: {miss}." if len(f["missed"]) == 1 else
               f" The divergences it missed: {miss}." if f["missed"] else "")
            + (f" It fires in none of the {f['a_runs']} runs of the paper's arithmetic;" if not f["a_alarmed"] else
               f" As on the runs it was chosen on, it fires in {f['a_alarmed']} of {f['a_runs']} runs of the paper's "
               f"arithmetic, at step {f['earliest']} in {f['at_earliest']}"
               + (f", the {f['quiet']['runs']} that never diverge included" if f["quiet"]["runs"] else "") + ", so "
               "its hits measure which arithmetic a model runs, not a forecast of the failure;")
            + f" the logit alert, beside it, precedes {f['logit']['hits']} of {f['logit']['diverged']} divergences and "
            f"fires in {f['logit']['false']['C'][0]} of {f['logit']['false']['C'][1]} FP32 runs.")


def fresh_facts(fresh) -> dict | None:
    """The numbers chapter 7 states about the second rule's pre-registered test on fresh seeds (`fresh_alarm`), or
    None while its grid is incomplete: the decision (`P.decide`'s dict), A's runs and how many alarmed at the rule's
    earliest step, A's runs that never diverge and how many of them alarmed, the divergences it missed (lr, seed,
    divergence step, alarm step), the hits' lead range, the logit alert's hits and false alarms, the card and date."""
    if not fresh or not fresh.get("complete", False):
        return None
    an = fresh["analysis"]
    a_steps = [v for k, v in an["alarm_step"].items() if k.startswith("A@")]
    fired = [v for v in a_steps if v is not None]
    earliest = min(fired) if fired else None
    leads = [d["alarm_lead"] for d in an["lead"].values()
             if d["divergence_step"] is not None and d["alarm_lead"] is not None and d["alarm_lead"] >= P.LEAD_STEPS]
    missed = [(*_lr_seed(k), d["divergence_step"], d["alarm_step"])
              for k, d in sorted(an["lead"].items(), key=lambda kv: _lr_seed(kv[0])) if d["divergence_step"] is not None
              and (d["alarm_lead"] is None or d["alarm_lead"] < P.LEAD_STEPS)]
    meta = getattr(fresh, "meta", {}) or {}
    la = an["logit_alert"]
    return {"decision": an["decision"], "a_runs": len(a_steps), "a_alarmed": len(fired), "earliest": earliest,
            "at_earliest": sum(v == earliest for v in fired), "fired_steps": sorted(fired),
            "quiet": an["A_without_divergence"],
            "missed": missed, "lead": (min(leads), max(leads)) if leads else None,
            "logit": {"hits": la["hits"], "diverged": la["diverged"],
                      "false": {v: tuple(x) for v, x in la["false_alarms"].items()}},
            "runs": int(fresh.get("runs_stored", 0)),
            "device": meta.get("device", "a GPU"), "when": str(meta.get("created", ""))[:10]}


def _rate(r: dict) -> str:
    """'32 of 33 [84–100 %]': a count with its exact 95 % interval."""
    return f"{r['k']} of {r['n']} [{span(100 * r['ci'][0], 100 * r['ci'][1], '.0f', sep='–')} %]"


def _first_rule_tally(pa, fresh=None) -> tuple[int, int]:
    """(runs in which the first rule fired, runs): its own grid (`pa`) and, where given, the complete fresh grid's
    evaluation of it beside the second rule."""
    steps = list(_alarm_scalars(pa)["analysis"]["alarm_step"].values())
    if fresh is not None:
        steps += list(fresh["first_rule"]["alarm_step"].values())
    return sum(v is not None for v in steps), len(steps)


def kit_found(fresh, pa) -> str:
    """Chapter 7's first-screen finding about the precision alarm, from the stored first test (`pa` =
    `results.load("precision_alarm")`) and fresh test (`fresh_alarm`, `fresh_facts`); while the fresh grid is
    incomplete, the first rule's outcome alone."""
    f = fresh_facts(fresh)
    n_fired, n_runs = _first_rule_tally(pa, fresh if f is not None else None)
    first = (f"The precision alarm's first rule (does the gradient error keep one direction?) fired in {n_fired} of "
             f"{n_runs} runs" + (": the error is large but changes sign." if n_fired == 0 else "."))
    if f is None:
        return first + " A second rule, on the error's size, waits for its test on fresh seeds."
    d, q = f["decision"], f["quiet"]
    hit = _rate(d["hit"]) if d.get("hit") else "no divergence"
    fal = d["false_alarm"]
    open_parts = (f" ({listing([_FOUND_PARTS.get(x, x) for x in d['undecided']])} not decided)"
                  if d["word"] == "undecided" else "")
    every = ("none of the" if not f["a_alarmed"] else "all" if f["a_alarmed"] == f["a_runs"]
             else f"{f['a_alarmed']} of")
    quiet = (f", the {q['runs']} that never diverge included" if q["runs"] and q["alarms"] == q["runs"] else
             f", {q['alarms']} of the {q['runs']} that never diverge" if q["runs"] else "")
    return (f"{first} Its second rule, the error's size per unit of logit (`lpfail.monitor.scaled_fires`), tested on "
            f"{f['runs']} fresh runs, fired at least {P.LEAD_STEPS} steps before {hit} divergences, in "
            f"{_rate(fal['C'])} FP32-attention runs and {_rate(fal['D'])} production runs: its goal (at least "
            f"{100 * P.SCALED_GOAL['hit']:.0f} % hit, at most {100 * P.SCALED_GOAL['false_alarm']:.0f} % false "
            f"alarms) is {d['word']}{open_parts}. It fires in {every} {f['a_runs']} runs of the paper's arithmetic"
            + (f"{quiet}: it recognises that arithmetic, not a coming failure." if f["a_alarmed"] else "."))


def kit_saw(fresh, pa) -> str:
    """Chapter 7's "What we saw" item on the precision alarm (both rules), from the stored tests."""
    f = fresh_facts(fresh)
    n_fired, n_runs = _first_rule_tally(pa, fresh if f is not None else None)
    first = (f"The precision alarm's first rule, on whether the gradient error keeps one direction, fired in "
             f"{'none' if n_fired == 0 else n_fired} of its {n_runs} runs: the error is large in the paper's "
             "arithmetic but does not keep one direction, and production arithmetic, which does not fail, has "
             "errors of the same size.")
    if f is None:
        return first + " On this proxy the kit cannot warn of a precision failure before it happens."
    fal, q = f["decision"]["false_alarm"], f["quiet"]
    if not f["a_alarmed"]:
        return (first + f" Its second rule, on the error's size per unit of logit, fired in none of the {f['a_runs']} "
                "fresh runs of the paper's arithmetic. On this proxy the kit cannot warn of a precision failure "
                "before it happens.")
    return (first + f" Its second rule, on the error's size per unit of logit, fired in {f['a_alarmed']} of the "
            f"{f['a_runs']} fresh runs of the paper's arithmetic by step {f['fired_steps'][-1]}, whether or not the "
            "run went on to fail" + (f" ({q['alarms']} of the {q['runs']} that never diverge alarmed)" if q["runs"]
                                     else "")
            + f", in {fal['C']['k']} of {fal['C']['n']} runs of FP32 attention and in {fal['D']['k']} of "
            f"{fal['D']['n']} of production arithmetic. On this proxy the kit can tell that a model's attention "
            "computes the way the paper's failing code does; it cannot tell that a failure is coming.")


def fresh_lead_table(fresh) -> str | None:
    """Per run of the paper's arithmetic in the fresh grid: the step its loss left FP32 attention's (same rate and
    seed), the second rule's alarm and the logit alert ('never' where none) — a Markdown table; None while the
    grid is incomplete."""
    if not fresh or not fresh.get("complete", False):
        return None
    return _lead_table(fresh["analysis"]["lead"], lambda key, d: d["logit_alert"], "second rule's alarm at step")


#: The parts of the alarm's decision in words.
_PARTS = {"hit": "the hit rate", "C": "the false alarms on FP32 attention", "D": "those on production arithmetic"}
#: The same, each part named in full (a sentence of its own).
_FOUND_PARTS = {"hit": "the hit rate", "C": "the false alarms on FP32 attention",
                "D": "the false alarms on production arithmetic"}
