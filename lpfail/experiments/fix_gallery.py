"""Chapter 5's gallery of the fixes on tied rows: for each state of the explorer's gallery (the tied maximum r_m,
the number of ties, β, ε, the spread of the other logits), per fix, the maximum m′ the forward subtracts, P̄ of the
tied keys, ℓ and the output error of one row, and the bias of the stored output over many rows with its 95 % CI.

Stored once (``python -m lpfail run fix_gallery``, CPU, seconds) so that the page's static twin reads numbers
computed under the pinned CPU numerics: the bias over 64 tied rows moves in its third digit with the order of a
sum, so a live computation would print other digits on another instruction set. The chapter's live explorer
(`lpfail.book.fix_widgets`) calls `fix_state` directly. Rows: the chapter-4 generator
(`lpfail.experiments.rounding.make_rows`), the other scores at r_m − spread·(gap − background), BF16 values, one
512-key tile, PAPER_BF16 arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lpfail import attention as attn
from lpfail.experiments.rounding import RowSpec, make_rows, mean_ci
from lpfail.precision import PAPER_BF16, PAPER_BF16_OFFICIAL_FIX, BoundedMax, DynamicMax
from lpfail.results import experiment

#: The gallery's states: (title, r_m, n_ties, β, ε, spread).
GALLERY = (
    ("Two ties at 16: the chapter-4 rows; Algorithm 3 removes the bias", 16.0, 2, 2.0, 1e-3, 1.0),
    ("Ties at 100: Algorithm 3's ℓ underflows (0/0); the clamp silences the row", 100.0, 2, 2.0, 1e-3, 1.0),
    ("Ties at −100: Algorithm 3's m' = 0, every P̄ underflows", -100.0, 2, 2.0, 1e-3, 1.0),
    ("Ties at 1000, BF16 spacing 4: the robust fix still moves m", 1000.0, 2, 2.0, 1e-3, 1.0),
    ("β = 1.001 at 0.5: β·r_m rounds back to r_m, P̄ = 1, the bias stays", 0.5, 2, 1.001, 1e-3, 1.0),
    ("Eight ties at 16", 16.0, 8, 2.0, 1e-3, 1.0),
    ("β = 8 at 16: P̄ = e^−112 underflows for Algorithm 3", 16.0, 2, 8.0, 1e-3, 1.0),
    ("Spread 0.25: the other logits crowd the maximum, ε = 0.1 counts them as ties", 16.0, 2, 2.0, 0.1, 0.25),
)
#: What `fix_state` measures per fix, in the stored array's last axis.
FIELDS = ("m", "pbar", "l", "rel_err", "bias", "bias_ci", "nonfinite")


def rows(r_m: float, n_ties: int, spread: float, n_rows: int = 64, seed: int = 0):
    """Scores (rows, 1, 512) as BF16 values with `n_ties` keys tied near r_m, V (rows, 512, 64)."""
    spec = RowSpec(n_ties=int(n_ties), gap=16.0)
    s, v, _ = make_rows(spec, n_rows, seed)
    top = s.amax(dim=-1, keepdim=True)
    s = (top.double() + spread * (s.double() - top.double()) + (r_m - spec.gap)).to(torch.bfloat16).float()
    return s, v


def fix_policies(beta: float, eps: float) -> dict:
    return {"no fix": PAPER_BF16, "Algorithm 3": PAPER_BF16.replace(fix=DynamicMax(beta, eps)),
            "official (clamp)": PAPER_BF16_OFFICIAL_FIX.replace(fix=DynamicMax(beta, eps)),
            "robust": PAPER_BF16.replace(fix=BoundedMax(beta, eps) if beta >= 1.0 else None)}


def fix_state(r_m: float, n_ties: int, beta: float, eps: float, spread: float, n_rows: int = 64) -> list[dict]:
    """Per policy: m' and P̄ of the tied keys, ℓ and |O − O_exact|/|O_exact| of row 0, the bias over rows."""
    s, v = rows(r_m, n_ties, spread, n_rows)
    o_true = (torch.softmax(s.double(), -1) @ v.double())[:, 0]
    out = []
    for name, policy in fix_policies(beta, eps).items():
        res = attn.forward_from_scores(s, v, policy)
        o = res.o.double()[:, 0]
        top = s[:1, 0].amax(-1, keepdim=True)
        pbar = attn.exp_scores(top, res.m[:1, 0].reshape(1, 1), policy).to(policy.dtype("pbar"))
        finite = torch.isfinite(o).all(-1)
        err = (o - o_true).mean(-1)[finite].numpy()
        bias = mean_ci(err) if err.size >= 2 else (float("nan"), float("nan"))
        rel = ((o[0] - o_true[0]).norm() / o_true[0].norm()).item()
        out.append({"policy": name, "m": float(res.m[0].reshape(())), "pbar": float(pbar.reshape(())),
                    "l": float(res.l[0].reshape(())), "rel_err": rel, "bias": bias[0], "bias_ci": bias[1],
                    "nonfinite": float((~finite).double().mean())})
    return out


@dataclass(frozen=True)
class FixGalleryConfig:
    cases: tuple = GALLERY
    n_rows: int = 64


def states(res) -> list[tuple[str, tuple, list[dict]]]:
    """The stored gallery as (title, (r_m, n_ties, β, ε, spread), `fix_state`'s list) per case."""
    vals, fields, pols = np.asarray(res["values"]), [str(f) for f in res["fields"]], [str(p) for p in res["policies"]]
    params = np.asarray(res["params"])
    out = []
    for i, title in enumerate(str(t) for t in res["titles"]):
        r_m, n_ties, beta, eps, spread = (float(x) for x in params[i])
        st = [{"policy": p, **{f: float(vals[i, j, k]) for k, f in enumerate(fields)}} for j, p in enumerate(pols)]
        out.append((title, (r_m, int(n_ties), beta, eps, spread), st))
    return out


def headline(res) -> dict[str, str]:
    """What the page's gallery shows that does not depend on the order of a sum: per case and fix, m′ of row 0 as
    the table prints it and the share of non-finite rows (the biases move in their third digit with the
    instruction set, so they are stored, not checked)."""
    out = {}
    for i, (title, _params, sts) in enumerate(states(res)):
        for st in sts:
            m = format(st["m"], ".6g") if np.isfinite(st["m"]) else "non-finite"
            out[f"case {i} {st['policy']}"] = f"m′ {m}, non-finite {st['nonfinite']:.0%}"
    return out


@experiment("fix_gallery", config=FixGalleryConfig, chapter="05_fix", headline=headline,
            description="chapter 5's gallery: each fix on tied rows, per state of the explorer (CPU)")
def fix_gallery(cfg: FixGalleryConfig) -> dict:
    names = list(fix_policies(2.0, 1e-3))
    vals = np.full((len(cfg.cases), len(names), len(FIELDS)), np.nan)
    for i, (_title, *a) in enumerate(cfg.cases):
        for j, st in enumerate(fix_state(*a, n_rows=cfg.n_rows)):
            vals[i, j] = [st[f] for f in FIELDS]
    return {"values": vals, "fields": np.array(FIELDS), "policies": np.array(names),
            "titles": np.array([c[0] for c in cfg.cases]), "params": np.array([c[1:] for c in cfg.cases], float)}
