"""Imports `lpfail.kernels` for the kernel tests: on a machine without CUDA, in Triton's CPU interpreter.

TRITON_INTERPRET=1 is set before `lpfail.kernels` is imported — or it is re-imported, if another module
imported it first — and stays set for the rest of the process, since Triton reads it at run time too."""
from __future__ import annotations

import importlib
import os
import sys

import torch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
#: The modules of `lpfail.kernels` that `load_kernels` reloads, in import order.
MODULES = ("fwd", "bwd", "runtime", "tuning", "policy", "launcher", "autograd", "dropin")


def load_kernels():
    """The `lpfail.kernels` package, interpreted when there is no CUDA."""
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
        if "lpfail.kernels" in sys.modules and not sys.modules["lpfail.kernels"].interpreted():
            # every module of the package, each after the modules whose names it binds
            for name in (*(f"lpfail.kernels.{m}" for m in MODULES), "lpfail.kernels"):
                importlib.reload(sys.modules[name])
    return importlib.import_module("lpfail.kernels")
