"""Power beside every call of the confirmation grid, and its families simulated through the calls that judge them.

**The families** (`families`) are rebuilt from the stored analysis itself (`lpfail.experiments.confirmation`):
"claims" (H1–HR at 4 × 256, Holm over 6), "gaps_SIZE" (A − C in final held-out loss at each learning rate of a
size, Holm over its rates; H5 and H6 read them) and "fix_lr" (B and R at each rate of 4 × 256, Holm over 12),
each with its rows' stored per-seed values, seeds, confirmatory seeds (3–9 at 4 × 256, 3–4 at 8 × 512, 0–4 at
12 × 768), test (the paired t test) and α. `lpfail.sweep.power` judges simulated draws of them with the same
`stats.paired` and `stats.judge_family` calls.

**Power** (`power_rows`, `power_table`). Each row's detectable gap is the true gap its family calls on the row's
side with 80 % probability (`power.detectable_sd`: the paired t test on the fresh seeds, Holm's first step,
normal noise), in standard deviations of the row's per-seed values and in nats (× that standard deviation over
all the row's seeds). The one-sided 95 % upper bound of each row's mean over all seeds (`power.upper_bound`) says
what the estimate rules out.

**No power.** A row that is not called reads *no power* instead of 'inconclusive' when its detectable gap in
nats exceeds its size's **healthy margin** (`margin`): `confirmation.HEALTHY` (10 %) × FP32 attention's best mean
held-out loss at that size, the loss by which the pre-registered rule tells a healthy learning rate from a
degraded one. A true A − C gap that large where C sits at its best would put A outside the margin — the paper's
regime at its plainest — and such a row would still miss it more than one time in five, so its silence says
nothing about a gap. H5 at a size reads *no power* instead of 'not distinguishable' when that holds at every
learning rate where C is healthy (`h5_word`). The pre-registered words in the stored analysis stay as they are;
these words are what the book prints beside them.

**The stored simulation** (``python -m lpfail run confirmation_power``, CPU, a few minutes): per family, the
family-wise false-call rate under the null, each row's call rate and interval coverage, for the paired rule and
the legacy seed-bootstrap rule, under normal noise (every size) and under null grids rebuilt from the stored runs
(`stored_runs`; the smaller size, whose ten seeds and ten variants the model needs), and the simulated detectable
gap (normal noise, each row's own standard deviation) beside `power.detectable_sd`. It records the
``confirmation`` result it was computed from (``npz_sha256``); tests/test_power.py fails when that has changed
since.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lpfail import results
from lpfail.experiments import confirmation as CF

#: Each claim's half gap (X − Y) − ½·(A − C), as `confirmation.claims` computes it: (X, Y).
HALF_GAPS = {"H2": ("A_sr", "C"), "H3": ("A_qk", "C_qk"), "HD": ("D", "C"), "HB": ("B", "C"), "HR": ("R", "C")}
FIXES = ("B", "R")
SIZE_NAMES = {"small": "4 × 256", "large": "8 × 512", "gpt2": "12 × 768"}
#: The hypotheses each family decides, in words.
FAMILY_HYPOTHESES = {"claims": "H1–HR", "fix_lr": "B, R per learning rate"}


def _analysis(res) -> Mapping:
    return res["analysis"] if "analysis" in res else res


def families(res) -> list:
    """The `power.Family` of each family of a stored confirmation analysis (or a result holding one under
    ``"analysis"``): "claims", "gaps_SIZE" per judged size, "fix_lr"."""
    from lpfail.sweep import power as P
    from lpfail.sweep import stats

    a = _analysis(res)
    alpha = float(a.get("alpha", stats.ALPHA))
    out = []
    if a.get("claims"):
        out.append(P.family_from_rows("small", "claims", {h: a["claims"].get(h) for h in CF.SIDES}, alpha))
    for size, g in (a.get("sizes") or {}).items():
        out.append(P.family_from_rows(size, f"gaps_{size}", g["cells"], alpha))
    if a.get("fix_lr"):
        out.append(P.family_from_rows("small", "fix_lr", a["fix_lr"], alpha))
    return out


def roles(fam) -> tuple[str, ...]:
    """The variants a family's rows are computed from."""
    if fam.name == "claims":
        return tuple(dict.fromkeys(["A", "C", *(v for xy in HALF_GAPS.values() for v in xy)]))
    if fam.name == "fix_lr":
        return ("A", "C", *FIXES)
    return ("A", "C")


def row_values(fam, eff: Mapping[str, np.ndarray], lrs: Sequence[float]) -> np.ndarray:
    """(rows, seeds): the per-seed values of ``fam``'s rows from effective losses ``eff`` (variant → (lrs, seeds)),
    computed as `confirmation` computes them (tests/test_power.py: the stored runs give the stored values)."""
    from lpfail.sweep import stats

    if fam.name == "claims":
        s = {v: stats.seed_sensitivity(e) for v, e in eff.items()}
        vals = {"H1": s["A"] - s["C"],
                **{h: stats.seed_half_gap(s[x], s["A"], s["C"], y=s[y]) for h, (x, y) in HALF_GAPS.items()}}
    elif fam.name == "fix_lr":
        vals = {f"{x}@lr={lr:g}": stats.seed_half_gap(eff[x][j], eff["A"][j], eff["C"][j])
                for x in FIXES for j, lr in enumerate(lrs)}
    else:
        vals = {f"lr={lr:g}": stats.paired_difference(eff["A"][j], eff["C"][j], f"lr={lr:g}")
                for j, lr in enumerate(lrs)}
    return np.array([vals[k] for k in fam.rows])


def stored_runs(res, size: str = "small"):
    """`power.Runs` of ``size`` from the assembled confirmation result: the residual curves of its variants whose
    runs are all stored, FP32 attention's seed-mean curve as every role's base, `roles` and `row_values`."""
    from lpfail.sweep import power as P
    from lpfail.sweep import stats

    d = CF._size(res, size)
    if d is None or "C" not in d["eff"]:
        raise ValueError(f"stored_runs: no complete variants with C at {size}")
    eff = np.stack(list(d["eff"].values()))
    return P.Runs(size, stats.seed_residuals(eff), d["eff"]["C"].mean(axis=-1), tuple(d["lrs"]), roles, row_values)


# -- power beside every call ---------------------------------------------------------------------------------
def margin(res, size: str) -> float:
    """The healthy margin at ``size``, in nats: `confirmation.HEALTHY` × FP32 attention's best mean loss there."""
    return CF.HEALTHY * float(_analysis(res)["sizes"][size]["c_best"])


def _judged_rows(a: Mapping, fam) -> Mapping:
    if fam.name == "claims":
        return a["claims"]
    if fam.name == "fix_lr":
        return a["fix_lr"]
    return a["sizes"][fam.size]["cells"]


def _word(verdict: str, detectable_nats: float, limit: float) -> str:
    return "no power" if verdict == "inconclusive" and detectable_nats > limit else verdict


def power_rows(res) -> list[dict]:
    """Per row of every family of a stored confirmation analysis: ``size``, ``family``, ``row``, ``n_confirm``,
    ``family_size``, ``test``, ``sd`` (of its per-seed values over all seeds, nats), ``detectable_gap_sd`` and
    ``detectable_gap_nats`` (`power.detectable_sd`; × ``sd``), ``margin_nats`` (`margin`), ``healthy`` (a gap
    row: whether C is healthy at its rate; else None), ``estimate``, ``upper_bound`` (one-sided 95 %, all
    seeds), the stored ``verdict`` and the ``word``: the verdict, or 'no power' for an inconclusive row whose
    detectable gap exceeds the margin."""
    from lpfail.sweep import power as P

    a = _analysis(res)
    out = []
    for fam in families(a):
        rows = _judged_rows(a, fam)
        healthy = a["sizes"][fam.size]["healthy_lrs"] if fam.name.startswith("gaps_") else None
        limit = margin(a, fam.size)
        dsd = P.detectable_sd(len(fam.confirm), fam.m, fam.alpha, P.POWER, fam.test)
        for k in fam.rows:
            r = rows[k]
            sd = float(r["sd"])
            out.append({"size": fam.size, "family": fam.name, "row": k, "n_confirm": len(fam.confirm),
                        "family_size": fam.m, "test": fam.test, "sd": sd, "detectable_gap_sd": dsd,
                        "detectable_gap_nats": dsd * sd, "margin_nats": limit,
                        "healthy": None if healthy is None else float(k.split("=", 1)[1]) in healthy,
                        "estimate": float(r["estimate"]), "upper_bound": P.upper_bound(r["per_seed"]),
                        "verdict": r["verdict"], "word": _word(r["verdict"], dsd * sd, limit)})
    return out


def row_word(res, family: str, name: str) -> str:
    """Row ``name`` of ``family`` ("claims", "gaps_SIZE", "fix_lr") with power beside it: its stored verdict, or
    'no power' (as in `power_rows`); its verdict where the analysis lacks what power needs (a fabricated one)."""
    from lpfail.sweep import power as P

    a = _analysis(res)
    fams = {"claims": lambda: a["claims"], "fix_lr": lambda: a["fix_lr"]}
    size = "small" if family in fams else family.removeprefix("gaps_")
    rows = fams[family]() if family in fams else a["sizes"][size]["cells"]
    try:
        fam = P.family_from_rows(size, family, rows, a.get("alpha", P.stats.ALPHA))
        dsd = P.detectable_sd(len(fam.confirm), fam.m, fam.alpha, P.POWER, fam.test)
        return _word(rows[name]["verdict"], dsd * float(rows[name]["sd"]), margin(a, size))
    except (KeyError, TypeError, ValueError):
        return rows[name]["verdict"]


def h5_word(res, size: str) -> str:
    """H5 at ``size`` with power beside it: 'distinguishable' (a gap cell where C is healthy is called), 'no power'
    (none is, and at every healthy rate the detectable gap exceeds the healthy margin), else 'not
    distinguishable'. The stored word where the analysis lacks what power needs (a fabricated one)."""
    a = _analysis(res)
    g = a["sizes"][size]
    if g.get("H5") != "not distinguishable":
        return g.get("H5")
    healthy = [float(x) for x in g.get("healthy_lrs") or []]
    words = [row_word(a, f"gaps_{size}", k) for k in g.get("cells") or {} if float(k.split("=", 1)[1]) in healthy]
    return "no power" if words and all(w == "no power" for w in words) else g["H5"]


def power_table(res) -> list[dict]:
    """Per family and size of a stored confirmation analysis: ``size`` and ``size_name``, ``family``,
    ``hypotheses``, ``n_confirm`` (the seeds its call uses), ``family_size``, ``test``, ``detectable_gap_sd``,
    ``detectable_gap_nats`` (the smallest over the rows its word is about: the healthy rates for a gaps family,
    every row otherwise) and ``detectable_gap_nats_max`` (over every row), ``margin_nats``, ``healthy_lrs`` and
    ``upper_bound_healthy`` (the largest one-sided 95 % upper bound of A − C over the healthy rates; gaps families
    only, else None), ``calls`` (its rows called either way) and ``word``: for a gaps family H5's (`h5_word`),
    otherwise 'no power' when no row could detect a margin-sized gap and 'has power' when one could."""
    a = _analysis(res)
    rows = power_rows(a)
    out = []
    for fam in families(a):
        mine = [r for r in rows if r["family"] == fam.name and r["size"] == fam.size]
        gaps = fam.name.startswith("gaps_")
        about = [r for r in mine if r["healthy"]] if gaps else mine
        name = SIZE_NAMES.get(fam.size, fam.size)
        out.append({"size": fam.size, "size_name": name, "family": fam.name,
                    "hypotheses": f"H5, H6 at {name}" if gaps else FAMILY_HYPOTHESES.get(fam.name, fam.name),
                    "n_confirm": len(fam.confirm), "family_size": fam.m, "test": fam.test,
                    "detectable_gap_sd": mine[0]["detectable_gap_sd"],
                    "detectable_gap_nats": min(r["detectable_gap_nats"] for r in about),
                    "detectable_gap_nats_max": max(r["detectable_gap_nats"] for r in mine),
                    "margin_nats": mine[0]["margin_nats"],
                    "healthy_lrs": list(a["sizes"][fam.size]["healthy_lrs"]) if gaps else None,
                    "upper_bound_healthy": max(r["upper_bound"] for r in about) if gaps else None,
                    "calls": [r["row"] for r in mine if r["verdict"] in ("supported", "refuted")],
                    "word": h5_word(a, fam.size) if gaps else
                    "no power" if all(r["detectable_gap_nats"] > r["margin_nats"] for r in mine) else "has power"})
    return out


# -- the stored simulation ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfirmationPowerConfig:
    n_null: int = 20_000  # normal-noise draws per family, under the null
    n_runs: int = 10_000  # null draws per family from the stored runs (the smaller size)
    n_legacy: int = 2_000  # the legacy rule's draws per family and noise model (10,000 resamples each)
    n_power: int = 2_000  # critical gaps per family, normal noise (its rows are alike in standard deviations)
    seed: int = 0


def _rates(sim: dict) -> dict:
    return {k: sim[k] for k in ("n_sims", "family_rate", "call", "cover")}


def simulate_family(fam, c: ConfirmationPowerConfig, seed: int, runs=None) -> dict:
    """One family's record of the stored simulation (`confirmation_power`): its design, under normal noise the
    paired and the legacy rule's null rates (``family_rate``, per row ``call`` and ``cover``), the simulated
    detectable gap (``detectable_sd``, the 80 % quantile of `power.critical_gaps`) and the share of draws called
    at `power.detectable_sd` (``power_at_detectable_sd``); under the runs model (its size only) the null rates of
    both rules and each row's null standard deviation there (``null_sd``). The runs model measures calibration
    only: its null pools every variant's noise, not the row's own, so its power would be another row's."""
    from lpfail.sweep import power as P

    k = len(fam.confirm)
    analytic = P.detectable_sd(k, fam.m, fam.alpha, P.POWER, fam.test)
    crit = P.critical_gaps(fam, 0, "normal", c.n_power, seed + 3)
    row = {"size": fam.size, "family": fam.name, "rows": list(fam.rows), "n_seeds": len(fam.seeds),
           "n_confirm": k, "family_size": fam.m, "test": fam.test, "sd": fam.sd.tolist(), "detectable_sd": analytic,
           "normal": {"paired": _rates(P.simulate(fam, "normal", c.n_null, seed)),
                      "legacy": _rates(P.simulate(fam, "normal", c.n_legacy, seed + 1, rule="legacy")),
                      "detectable_sd": float(np.quantile(crit, P.POWER, method="higher")),
                      "power_at_detectable_sd": float((crit <= analytic).mean()), "n_power": c.n_power},
           "runs": None}
    if runs is not None and fam.size == runs.size:
        null = P.noise_draws(fam, "runs", 2000, np.random.default_rng(seed + 6), runs)
        row["runs"] = {"paired": _rates(P.simulate(fam, "runs", c.n_runs, seed + 4, runs=runs)),
                       "legacy": _rates(P.simulate(fam, "runs", c.n_legacy, seed + 5, rule="legacy", runs=runs)),
                       "null_sd": null.std(axis=(0, 2), ddof=1).tolist()}
    return row


def headline(res) -> dict[str, str]:
    """Per family (``SIZE/FAMILY``): under normal noise, the paired rule's and the legacy rule's family-wise
    false-call rates (``.3f``, a share of draws: a count, the same on any CPU) and the simulated detectable gap in
    seed standard deviations (``.2f``)."""
    out = {}
    for f in res["families"]:
        tag, n = f"{f['size']}/{f['family']}", f["normal"]
        out[f"{tag} paired"] = f"{n['paired']['family_rate']:.3f}"
        out[f"{tag} legacy"] = f"{n['legacy']['family_rate']:.3f}"
        out[f"{tag} detectable_sd"] = f"{n['detectable_sd']:.2f}"
    return out


def check(cfg: ConfirmationPowerConfig) -> ConfirmationPowerConfig:
    """The two-settings check's config: a fortieth of the draws (the same code path, seconds instead of minutes)."""
    return dataclasses.replace(cfg, n_null=500, n_runs=250, n_legacy=50, n_power=100)


@results.experiment("confirmation_power", config=ConfirmationPowerConfig, headline=headline, check=check,
                    description="the confirmation families' false-call rates, coverage and power, simulated through "
                                "the calls that judge them (CPU)")
def confirmation_power(c: ConfirmationPowerConfig) -> dict:
    from lpfail.sweep import power as P

    conf = results.load("confirmation")
    runs = stored_runs(conf, "small")
    fams = [simulate_family(fam, c, c.seed + 1000 * i, runs) for i, fam in enumerate(families(conf))]
    return {"families": fams, "power": P.POWER, "alpha": float(conf["analysis"]["alpha"]),
            "confirmation_npz_sha256": conf.meta.get("npz_sha256"),
            "confirmation_config_hash": conf.meta.get("config_hash")}
