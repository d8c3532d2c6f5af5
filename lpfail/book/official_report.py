"""Chapter 4's section "Which arithmetic each preset reproduces" (issue 16): the knobs in which the compiled
preset differs, and the stored `official_check` table, or a plain statement that it is still pending."""
from __future__ import annotations

import dataclasses

from lpfail import results
from lpfail.precision import PAPER_BF16, PAPER_BF16_COMPILED, Precision

#: What each knob that PAPER_BF16_COMPILED changes means for the official code under inductor.
WHY = {
    "scores": "S = QKᵀ·α is not stored between the scaling and its uses (amax, S − m): it stays FP32",
    "exp_in": "S − m and m_old − m_new are fused into exp: never rounded to BF16",
    "acc": "ℓ and Ō are carried across key tiles inside fused kernels in FP32: Ō·a + P̄V is not rounded between tiles",
    "delta_prod": "dO∘O is fused into δ's row sum: the products stay FP32",
    "l_store": "the final ℓ is stored in the official code's BF16 buffer, which L = log ℓ + m reads",
    "m_acc": "the row maximum m is a BF16 buffer (reduction output) while S stays FP32",
}


def preset_diff(a: Precision = PAPER_BF16, b: Precision = PAPER_BF16_COMPILED) -> list[list[str]]:
    """Rows [knob, value in a, value in b, why] for every knob in which the two policies differ."""
    rows = []
    for f in dataclasses.fields(Precision):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            rows.append([f.name, f"= acc ({a.acc})" if va is None else str(va),
                         f"= acc ({b.acc})" if vb is None else str(vb), WHY.get(f.name, "")])
    return rows


def table_or_pending() -> str:
    """The stored official_check table with its provenance, or why there is none yet."""
    from lpfail.experiments.official_check import table

    try:
        res = results.load("official_check")
    except results.ResultMissing:
        return ("official_check: no stored result yet. It needs a GPU and the official code "
                "(tools/gpu_official_check.sh, one device call); the table is pending that run.")
    return res.provenance + "\n" + table(res)
