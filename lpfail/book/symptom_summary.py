"""Chapter 1's summary sentences from the confirmation grid (`lpfail.experiments.confirmation`): where the A − C gap
is called at each size, against the paper's learning rate, and what the larger size shows — generated, so that the
chapter's "What we saw" says what the stored calls say."""
from __future__ import annotations

from collections.abc import Mapping

from lpfail.book.text import listing
from lpfail.book.claims import TEN, c0_size
from lpfail.book.training_claims import size_estimates

#: The paper's peak learning rate (GPT-2 small, its Sec. 2).
PAPER_LR = 1e-3
SIZE_WORDS = {"small": "4 × 256", "large": "8 × 512", "gpt2": "GPT-2 small's shape (12 × 768)"}


def _times(lr: float) -> str:
    k = lr / PAPER_LR
    return f"{k:g} times the paper's"


def where_called(conf: Mapping | None) -> str:
    """Per size: the learning rates where the A − C gap is called (supported) on the fresh seeds, as multiples of
    the paper's rate, and whether FP32 attention is healthy there."""
    if conf is None:
        return "The ten-seed grid is not stored yet."
    a = conf["analysis"]
    parts = []
    for size, d in (a.get("sizes") or {}).items():
        cells = d.get("cells") or {}
        called = [float(k.split("=")[1]) for k, r in cells.items() if (r or {}).get("verdict") == "supported"]
        n = d.get("n_seeds")
        where = SIZE_WORDS.get(size, size)
        if not called:
            parts.append(f"at none of {where}'s rates ({n} seeds)")
            continue
        healthy = set(float(x) for x in d.get("healthy_lrs") or [])
        sick = all(lr not in healthy for lr in called)
        parts.append(f"at {listing([f'{lr:g} ({_times(lr)})' for lr in sorted(called)])} for {where} ({n} seeds)"
                     + (", where FP32 attention has degraded too" if sick else ""))
    return "The gap is called " + "; ".join(parts) + "."


def larger_size(conf: Mapping | None) -> str:
    """S(A) − S(C) at each size with its seeds, the paired difference and C0-size's word with its seed count
    (`lpfail.book.training_claims.size_estimates`)."""
    if conf is None:
        return "not yet measured"
    return size_estimates(conf) or "not yet measured"


def size_word(conf: Mapping | None) -> str:
    """C0-size's word with its seed count ('reproduced on 5 seeds, fewer than the 10 a training verdict needs'),
    from the claims registry (`lpfail.book.claims.c0_size`, the verdict page's); 'not yet measured' without the runs."""
    c = c0_size(conf)
    if c is None:
        return "not yet measured"
    few = f", fewer than the {TEN} a training verdict needs" if c.seeds < TEN else ""
    return f"{c.word} on {c.seeds} seeds{few}"
