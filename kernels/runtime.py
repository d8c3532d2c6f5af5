"""Whether the kernels can run here: Triton's import, the CPU interpreter, Triton's dtypes by name.

The other modules call `interpreted` through this module (``runtime.interpreted()``), so that one replacement of
it (a test's monkeypatch, tools/host_breakdown.py) is seen by every check that reads it."""
from __future__ import annotations

import torch

try:
    import triton  # noqa: F401  (the other modules import Triton and the kernels only where this succeeded)
    import triton.language as tl

    from . import bwd  # noqa: F401
    from . import fwd as _fwd
    IMPORT_ERROR: Exception | None = None
except ImportError as e:  # pragma: no cover - triton is in requirements.txt
    IMPORT_ERROR = e

#: The Triton dtypes the kernels' constexprs name: "bf16", "fp16", "fp32" (empty without Triton).
TL = {}
if IMPORT_ERROR is None:
    TL = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}


def interpreted() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return IMPORT_ERROR is None and _fwd.INTERPRET


def available(device: torch.device | str | None = None) -> bool:
    """Whether `flash_attention` can run on tensors of `device` (CUDA, or CPU under the interpreter)."""
    if IMPORT_ERROR is not None:
        return False
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cpu":
        return interpreted()
    return torch.cuda.is_available() or interpreted()
