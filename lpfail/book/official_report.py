"""Chapter 4's section "Which arithmetic each preset reproduces" (issue 16): the knobs in which the compiled
preset differs, and the stored `official_check` table, or a plain statement that it is still pending."""
from __future__ import annotations

import dataclasses

from lpfail import results
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
    from lpfail.experiments.official_check import table

    try:
        res = results.load("official_check")
    except results.ResultMissing:
        return ("official_check: no stored result yet. It needs a GPU and the official code "
                "(tools/gpu_official_check.sh, one device call); the table is pending that run.")
    except results.ResultStale:
        return ("official_check: the stored result was measured for an earlier set of policies (its config "
                "changed since); the table is pending its re-run on a GPU (tools/gpu_official_check.sh).")
    return res.provenance + "\n" + table(res)
