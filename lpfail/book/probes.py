"""The exploratory probes that came before every pre-registered rule, described for the lab notebook.

Two short GPU probes, run before any grid of this book and never pre-registered, chose the proxy and suggested the
hypotheses; the pre-registration record (`lpfail.book.verdict.preregistration_record`) says which rules were
written after them. They are leads, not results: no number of theirs decides a verdict, and their runs are not
stored. What each measured is told here in words, so that a reader of the record knows what "the probes" had shown.
"""
from __future__ import annotations

#: (name, when, setting, what it suggested), in the order they ran.
PROBES = [
    ("The first probe", "2026-11-29",
     "a nanoGPT-style byte-level GPT of 4 layers × 256 on documentation text, context 1,024, 16 sequences a step, "
     "a constant learning rate after 100 warm-up steps, the paper's arithmetic (A), the official fix (B) and FP32 "
     "attention (C) in the paper's 512 × 512 tiles, one or two seeds, 2,000–3,000 steps",
     "no run exploded by a strict criterion within its time; at learning rate 1.5e-2 one seed of A climbed while B "
     "and C kept falling, with A's largest logit far above C's; at 2e-2 and above FP32 attention itself was "
     "unhealthy. It also found the official fix's row sum clamp, which silences whole rows at large tied logits "
     "(chapter 5), and that the sign of the tied-row bias depends on the gap between the tied scores and the rest "
     "(chapter 4)."),
    ("The second probe", "2026-12-01",
     "the learning-rate proxy this book uses (4 layers × 256, context 256, 32 sequences a step, 1,000 steps), two "
     "seeds, a constant schedule and the training loss; A, B, C, PyTorch SDPA and a bounded variant of Algorithm 3 "
     "at three learning rates; a first substitution of cast points; a larger model; and a first precision dial "
     "(fewer fraction bits)",
     "A − C > 0 at learning rates of 1e-2 and above, larger at 8 layers × 512; neither fix closing the gap at 3e-2; "
     "no single group of cast points closing it at 3e-2; the tied-row bias growing about twofold per fraction bit "
     "removed, and, at another setting (context 1,024, learning rate 1e-2, 1,200 steps), A at 5 and 4 fraction "
     "bits ending above FP32 attention. A quick stochastic-rounding emulation at few bits gave a non-finite "
     "gradient that was never investigated."),
]


def probes_markdown() -> str:
    """The probes as a bullet list (MyST Markdown)."""
    return "\n".join(f"- **{name}** ({when}): {setting}. *What it suggested:* {saw}" for name, when, setting, saw
                     in PROBES)
