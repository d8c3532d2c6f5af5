"""Shared pytest set-up: tests marked `gpu` are skipped on machines without CUDA, and without CUDA Triton runs
in its CPU interpreter for the whole session.

TRITON_INTERPRET=1 must be set before Triton is first imported: Triton's own library functions (tl.zeros, …)
are built as interpreter functions or as GPU ones once, at import, and only the former run in the
interpreter. A test module that imports `lpfail.kernels` early (for its benchmark helpers, say) would otherwise
import Triton in GPU mode, and the kernel tests (tests/kernel_env.py) could not switch it back. lpfail is imported
before torch, so that its CPU numeric pins hold in every test (lpfail.numerics)."""
import os

import lpfail  # noqa: F401  first: its CPU numeric pins (lpfail.numerics) act only if set before torch starts
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here); run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
