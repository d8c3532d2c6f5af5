"""Where `lpfail.bf16`'s FP32 roundings run as one fused Triton kernel (`lpfail.round_kernels`) instead of a chain
of elementwise int64 PyTorch ops, and the check that lets them.

The kernels compute the PyTorch path's integers, so they give its bits; still, each process checks a kernel
against the PyTorch path once per (kernel, device, shift) on `check_tensor` before using it, and keeps the PyTorch
path, with a warning, where the two differ. The check reads its answer back, so it never runs while a CUDA graph is
being captured: until it has run eagerly (a training run's eager warm-up steps come first), the PyTorch path is
taken. ``LPFAIL_FUSED_ROUNDING=0`` turns the kernels off.

    usable(x, shift, interpret=False) -> whether a fused kernel may round x at shift (FP32, CUDA, 16 ≤ shift ≤ 22)
    kernel(name)                       -> the jit kernel of `lpfail.round_kernels`, or None without Triton
    checked(name, device, shift, compare) -> the once-per-process check (compare() -> bool runs it)
    apply(name, x, shift, interpret, compare, go) -> go(kernel) where usable and checked, else None
    launch(kernel, x, shift, pre, post) -> bf16 tensor of x's shape: kernel[grid](x, out, *pre, n, *post, ...)
    check_tensor(device)               -> the check's FP32 values
"""
from __future__ import annotations

import math
import os
import warnings

import torch

OFF_VAR = "LPFAIL_FUSED_ROUNDING"
BLOCK = 1024
_KERNELS: dict = {}
_CHECKED: dict = {}


def usable(x: torch.Tensor, shift: int, interpret: bool = False) -> bool:
    """An FP32 tensor of fewer than 2^31 elements, rounded to 16 … 22 dropped bits, on CUDA (or in Triton's
    interpreter when `interpret`), with the kernels not turned off, outside torch.compile (whose compiler fuses the
    PyTorch path's elementwise ops by itself)."""
    return (x.dtype == torch.float32 and 16 <= shift <= 22 and x.numel() < 1 << 31
            and (x.is_cuda or interpret) and os.environ.get(OFF_VAR, "1") != "0"
            and not torch.compiler.is_compiling())


def kernel(name: str):
    """`lpfail.round_kernels.<name>`, imported on first use (Triton is imported only then: the tests set its
    interpreter mode before that), or None without Triton."""
    if name not in _KERNELS:
        try:
            from lpfail import round_kernels
        except ImportError:
            _KERNELS[name] = None
        else:
            _KERNELS[name] = getattr(round_kernels, name)
    return _KERNELS[name]


def apply(name: str, x: torch.Tensor, shift: int, interpret: bool, compare, go):
    """``go(kernel)`` for kernel `name` where it may round x at `shift` (`usable`, then `checked` with
    ``compare(kernel, device, shift)`` unless `interpret`), else None: the caller then takes the PyTorch path."""
    kern = kernel(name) if usable(x, shift, interpret) else None
    if kern is None:
        return None
    if not interpret and not checked(name, x.device, shift, lambda: compare(kern, x.device, shift)):
        return None
    return go(kern)


def launch(kern, x: torch.Tensor, shift: int, pre: tuple = (), post: tuple = ()) -> torch.Tensor:
    """The bf16 result of `kern` over the contiguous x: ``kern[grid](x, out, *pre, n, *post, SHIFT=shift, BLOCK)``."""
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.int16, device=x.device)
    n = x.numel()
    if n:
        kern[(-(-n // BLOCK),)](x, out, *pre, n, *post, SHIFT=shift, BLOCK=BLOCK)
    return out.view(torch.bfloat16)


def check_tensor(device) -> torch.Tensor:
    """FP32 values for the check: zeros, ±inf, NaN, the largest finite values, subnormals and normals over the
    whole exponent range, 8,192 in all (several blocks of a kernel)."""
    g = torch.Generator().manual_seed(20261207)
    x = torch.randn(8192, generator=g) * torch.exp2(torch.randint(-149, 128, (8192,), generator=g).float())
    x[:10] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45,
                           1.0])
    return x.to(device)


def checked(name: str, device, shift: int, compare) -> bool:
    """Whether kernel `name` may be used on `device` at `shift`: `compare()` (the kernel against the PyTorch path,
    True when equal) run once per process, never while a CUDA graph is being captured (False until then)."""
    device = torch.device(device)
    ck = (name, str(device), shift)
    if ck not in _CHECKED:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
        _CHECKED[ck] = bool(compare())
        if not _CHECKED[ck]:
            warnings.warn(f"lpfail.fused: the kernel {name} differs from the PyTorch path on {device} at shift "
                          f"{shift}; using the PyTorch path (same bits, slower)", RuntimeWarning)
    return _CHECKED[ck]
