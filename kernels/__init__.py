"""Triton flash attention that takes the same `Precision` policy as the pure-PyTorch reference.

Explained in chapter 5 ("Fix"). ``flash_attention(q, k, v, is_causal=False, scale=None, fix="robust")`` is a
drop-in for ``F.scaled_dot_product_attention`` (a ``torch.library`` custom op, SDPA's defaults), and
``flash_attention(q, k, v, policy, causal=True)`` runs any `Precision` the kernels support, for
(batch, heads, seq, head_dim) tensors, head_dim a multiple of 16 up to 128 (`HEAD_DIMS`): a Triton forward
(`kernels/fwd.py`), a Triton backward (`kernels/bwd.py`) and the `autograd.Function` that joins them. The
policy's knobs are compile-time constants of the kernels, so one source compiles every precision variant:

* ``pbar``      P̄ rounded to BF16 (FP16) or kept in FP32 before the P̄V dot;
* ``acc``, ``pv_out``, ``scores``  FP32, or rounded to BF16 (FP16) after every key block — the paper's code;
* ``fix``       the paper's dynamic maximum (Algorithm 3, β and ε) in the forward, or the robust fix
  (`lpfail.precision.BoundedMax`: Algorithm 3's shift folded into a bounded range, finite at every logit);
* ``delta``     the δ source of the backward: ``"dO.O"``, ``"dO.O_hp"`` (O recomputed in FP32), ``"dP.P"``;
* ``sub``       ``"sub"`` (scale, round, subtract: a tied maximum gives P̄ = 1 exactly) or ``"fma"``;
* ``block_k``   the key block in which the fix and the roundings act: one hardware tile when ≤ 128, else
  walked in 64-key chunks with two passes per block (the paper's 512, or ``None`` for one tile per row);
* ``l_clamp``   the row-sum clamp of the paper's official code;
* ``l_from``    ℓ summed from the FP32 P (as FlashAttention-2) or from P̄ as rounded for P̄V (PR #2721).

How they run is a separate object, `Tuning` (TMA descriptors, the autotune space, the causal grid order, the split,
atomic or fused backward, the tie test's form, the FTZ exp), which never changes what is computed beyond the last FP32 bits
of the backward's sums: ``flash_attention(..., tuning=Tuning(...))``; `DEFAULT_TUNING` (= `NEXT_LEVERS`) unless given.

``exp`` must be FP32, nothing may be FP64 and ``rounding`` must be ``"rne"`` (stochastic rounding lives in the
reference only), and no knob may name a K-bit format of the precision dial ("bf16m1" … "bf16m6") or give V a
format of its own (``v``): such policies raise ``ValueError`` naming the knob. The kernels need a CUDA GPU; with
``TRITON_INTERPRET=1`` set before this package is imported they run in Triton's CPU interpreter, which is slow and
whose BF16 arithmetic is broken, so only ``matmul="fp32"`` policies are accepted there (rounding cast points to
BF16 still work: they are conversions). Without either, ``flash_attention`` raises ``RuntimeError`` naming the
call of the pure-PyTorch reference, ``lpfail.attention.attention(q, k, v, policy, causal=..., scale=...)``, that
computes the same (for the SDPA style, with ``policy_for(q.dtype, fix)`` as the policy and ``causal=is_causal``).

The package's modules, by job (this file re-exports their public names):

* ``runtime``   whether the kernels can run here: Triton's import, the CPU interpreter (`interpreted`, `available`),
  Triton's dtypes by name (`TL`);
* ``policy``    a `Precision` checked and translated into the kernels' constexprs (`KernelPolicy`, `kernel_policy`,
  `policy_for_launch`), the head dims (`HEAD_DIMS`) and their tiles;
* ``tuning``    `Tuning` and the named tunings (`ALL_LEVERS`, `NEXT_LEVERS`, `DEFAULT_TUNING`);
* ``launcher``  the launch plans, grids, TMA allocator, autotuner picks and direct launches (`launch`,
  `launch_forward`, `launch_backward`, `fwd_plan`, `bwd_plan`, `PICKS`, `DIRECT`);
* ``autograd``  `FlashAttention` (the `autograd.Function`) and the custom ops ``torch.ops.lpfail.flash_attention_fwd``
  / ``_bwd``;
* ``dropin``    `flash_attention`, its argument checks (`check_inputs`) and errors, `policy_for`, `SDPA_POLICIES`,
  `deterministic`, `probe_pbar`;
* ``fwd``, ``bwd`` the Triton kernels; ``bench`` their benchmark and targets.
"""
from __future__ import annotations

if __name__ != "lpfail.kernels":
    # This folder imported under another name: a checkout's root on sys.path makes it importable as a top-level
    # `kernels`, which probes look for (transformers' check for Hugging Face's package of that name imports it).
    # The import then returns lpfail.kernels itself (one copy of the kernels and of their registered ops; no
    # __version__, so such a probe finds no usable `kernels`); the rest of this file runs once more in a namespace
    # that is then dropped. Its imports are absolute, so they bind lpfail.kernels's modules, already loaded: no
    # module of this folder runs a second time. The repository's code imports lpfail.kernels.
    import importlib as _importlib
    import sys as _sys

    _sys.modules[__name__] = _importlib.import_module("lpfail.kernels")

from lpfail.kernels.autograd import FlashAttention, parse_policy
from lpfail.kernels.dropin import SDPA_POLICIES, check_inputs, deterministic, flash_attention, policy_for, probe_pbar
from lpfail.kernels.launcher import (DIRECT, DIRECT_ENV, PICKS, bwd_plan, fwd_plan, launch, launch_backward,
                                     launch_forward)
from lpfail.kernels.policy import CHUNK, HEAD_DIMS, KernelPolicy, kernel_policy, policy_for_launch
from lpfail.kernels.runtime import TL, available, interpreted
from lpfail.kernels.tuning import ALL_LEVERS, DEFAULT_TUNING, NEXT_LEVERS, Tuning

__all__ = ["flash_attention", "FlashAttention", "KernelPolicy", "kernel_policy", "available", "probe_pbar",
           "policy_for", "Tuning", "DEFAULT_TUNING", "ALL_LEVERS", "HEAD_DIMS", "deterministic"]
