"""Chapter 4's section "Which arithmetic each preset reproduces": the knobs in which the compiled
preset differs, and the stored `official_check` table, or a plain statement that it is still pending."""
from __future__ import annotations

import dataclasses
import html

import numpy as np

from lpfail import results
from lpfail.book.costs import html_table
from lpfail.book.text import breakable
from lpfail.experiments.official_check import CONFIRM_PCT, preset_confirmed, table
from lpfail.precision import _ACC_FIELDS, _FALLBACK, DTYPES, PAPER_BF16, PAPER_BF16_COMPILED, Precision

#: What each knob that PAPER_BF16_COMPILED changes means for the official code under inductor, as read from its
#: Triton code for the H200 (torch 2.11; notes/official_check.md).
WHY = {
    "scores": "S = QKᵀ·α is recomputed from the BF16 QKᵀ in every kernel that uses it, never stored: FP32",
    "exp_in": "S − m and m_old − m_new are fused into exp: never rounded to BF16",
    "acc": "m, ℓ and Ō are carried across key tiles in FP32 inside fused kernels: S − m uses the FP32 "
           "maximum, and Ō·a + P̄V is not rounded between tiles",
    "delta_prod": "dO∘O is fused into δ's row sum: the products stay FP32",
    "l_store": "the final ℓ and m are stored in the official code's BF16 buffers, which L = log ℓ + m reads",
    "m_rescale": "the rescale factor a = exp(m_old − m_new) reads the row maxima from BF16 buffers that an "
                 "earlier kernel wrote",
    "l_div_last": "the last query tile divides by the stored BF16 ℓ, earlier ones by the FP32 ℓ they hold "
                  "(where the kernel boundaries fall; with STABLE=1 the rescale factor reads FP32 maxima)",
    "masked_carry": "with STABLE=1 the fully masked key tile moves the maximum (m' = 0); that update reads m and "
                    "ℓ from the BF16 row buffers and stores Ō·a in BF16",
    "l_div": "O = Ō / ℓ divides by the stored BF16 ℓ in every query tile",
}

_NAMES = {v: k for k, v in DTYPES.items()}


def _value(policy: Precision, name: str) -> str:
    value = getattr(policy, name)
    if value is None and name in _ACC_FIELDS:            # a fallback: say to what, and what it is
        return f"= {_FALLBACK.get(name, 'acc')} ({_NAMES[policy.dtype(name)]})"
    return str(value)


def preset_diff(a: Precision = PAPER_BF16, b: Precision = PAPER_BF16_COMPILED) -> list[list[str]]:
    """Rows [knob, value in a, value in b, why] for every knob in which the two policies differ."""
    rows = []
    for f in dataclasses.fields(Precision):
        if getattr(a, f.name) != getattr(b, f.name):
            rows.append([f.name, _value(a, f.name), _value(b, f.name), WHY.get(f.name, "")])
    return rows


def table_or_pending() -> str:
    """The stored official_check table with its provenance, or why there is none yet."""
    try:
        res = results.load("official_check")
    except results.ResultMissing:
        return ("official_check: no stored result yet. It needs a GPU and the official code "
                "(`tools/gpu_batch.sh official`, one device call); the table is pending that run.")
    except results.ResultStale:
        return ("official_check: the stored result was measured for an earlier set of policies (its config "
                "changed since); the table is pending its re-run on a GPU (`tools/gpu_batch.sh official`).")
    return res.provenance + "\n" + table(res)


RUNS = (("eager", "eager, autocast around forward and backward"),
        ("compiled", "torch.compile (the paper's train.py)"),
        ("compiled_emulate", "torch.compile, emulate_precision_casts=True"))
TENSORS = ("O", "dQ", "dK", "dV")
CRITERION = CONFIRM_PCT   # % of elements bit-identical a preset must reach against the code it describes


def agreement_rows(res, extra: bool = False) -> list[list[str]]:
    """Rows [official run, fix, our policy, cases, min % over the cases for O, dQ, dK, dV, ≥ CRITERION
    everywhere] from a stored `official_check` result: the presets only, or also the one-knob variants
    (`extra`), and the official run against the eager official run (what compiling changes, "—" as our
    policy). Cases the run did not cover (NaN) are left out of the minimum and of the count."""
    rows = []
    for fix in ("nofix", "fix"):
        names = [str(p) for p in res[f"policies_{fix}"]]
        for run, label in RUNS:
            key = f"agree_{fix}_{run}"
            if key not in res:
                continue
            a = res[key]                                             # (policies, cases, 4)
            for i, name in enumerate(names):
                if "," in name and not extra:
                    continue
                done = ~np.isnan(a[i]).any(axis=1)
                m = a[i][done].min(axis=0)
                rows.append([label, "official fix" if fix == "fix" else "none", name, str(int(done.sum()))]
                            + [f"{x:.3f}" for x in m] + ["yes" if m.min() >= CRITERION else "no"])
            ref = f"official_{run}_vs_eager_{fix}"
            if run != "eager" and ref in res:
                b = res[ref]
                done = ~np.isnan(b).any(axis=1)
                m = b[done].min(axis=0)
                rows.append([label, "official fix" if fix == "fix" else "none", "— (the eager official run)",
                             str(int(done.sum()))] + [f"{x:.3f}" for x in m] + ["—"])
    return rows


def tied_rows(res) -> list[list[str]]:
    """Rows [implementation, mean signed error of O on chapter 4's tied rows ± 95 % half-width]."""
    out = [[f"ours, {res['tied_policy_names'][i]}", res[f"tied_policy_{i}"]]
           for i in range(len(res["tied_policy_names"]))]
    out += [[f"official, {label}", res[f"tied_official_{run}"]] for run, label in RUNS
            if f"tied_official_{run}" in res]
    return [[name, f"{v[0]:+.4e} ± {v[1]:.1e}"] for name, v in out]


def preset_verdict(res) -> dict:
    """Whether each compiled preset meets the criterion against the compiled official run, and PAPER_BF16's
    agreement with the eager official run: {"compiled": bool, "compiled_fix": bool, "eager": bool,
    "worst": {name: (tensor, %)}}."""
    out, worst = {}, {}
    for fix, name, run, key in (("nofix", "PAPER_BF16_COMPILED", "compiled", "compiled"),
                                ("fix", "PAPER_BF16_COMPILED_OFFICIAL_FIX", "compiled", "compiled_fix"),
                                ("nofix", "PAPER_BF16", "eager", "eager")):
        out[key] = preset_confirmed(res, name, fix, run)[0]    # the gate's own rule (`confirmed` command)
        names = [str(p) for p in res[f"policies_{fix}"]]
        m = res[f"agree_{fix}_{run}"][names.index(name)].min(axis=0)
        worst[name] = (TENSORS[int(m.argmin())], float(m.min()))
    return {**out, "worst": worst}


def tied_same(res) -> bool:
    """Whether every implementation and way of running the official code gives the same mean error of O on the
    tied rows (point estimates equal to within a tenth of the smallest 95 % half-width)."""
    keys = [f"tied_policy_{i}" for i in range(len(res["tied_policy_names"]))]
    keys += [f"tied_official_{run}" for run, _ in RUNS if f"tied_official_{run}" in res]
    v = np.array([res[k] for k in keys], dtype=float)
    return bool(np.ptp(v[:, 0]) <= 0.1 * v[:, 1].min())


def agreement_table(res, extra: bool = False) -> str:
    """`agreement_rows` as a narrow HTML table: the four tensors' shares in one cell (O / dQ / dK / dV), policy
    names breakable at their underscores and commas (`lpfail.book.text.breakable`)."""
    rows = [[html.escape(r[0]), html.escape(r[1]), f"<code>{html.escape(breakable(r[2]))}</code>",
             r[3], " / ".join(r[4:8]), r[8]] for r in agreement_rows(res, extra)]
    return html_table(["official code run", "fix", "our policy", "cases", "O / dQ / dK / dV, % bit-identical",
                       f"≥ {CRITERION} %"], rows, caption="the minimum over the cases", escape=False)
