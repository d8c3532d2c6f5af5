"""lpfail: an executable edition of Qiu & Yao, "Why Low-Precision Transformer Training Fails: An Analysis on
Flash Attention" (ICLR 2026). See README.md and the book.

Layout: the core library is ``lpfail.bf16``, ``precision``, ``attention``, ``model``, ``data``, ``train``,
``optim``, ``results``, ``cli`` and the grid framework ``lpfail.sweep``; the registered experiments are in
``lpfail.experiments``, what only the book uses in ``lpfail.book``. A module that moved fails to import under its
old name with an error that names its new place (`MOVED`).

``lpfail.Monitor`` and ``lpfail.Alarm`` are `lpfail.monitor.Monitor` and `lpfail.alarm.Alarm`, imported on first
use (`LAZY`), as is ``lpfail.flash_attention``: ``import lpfail`` alone loads neither torch nor Triton.

The Triton kernels are ``lpfail.kernels`` (``from lpfail import flash_attention`` for the drop-in). Their source is
the folder ``kernels/`` at the top of the repository, beside ``lpfail/``, and nothing claims the top-level import
name ``kernels`` (Hugging Face publishes a package of that name, which ``transformers`` looks for):

* installed (a wheel, or ``pip install -e .``): the build maps the folder to ``lpfail/kernels``
  (``[tool.setuptools] package-dir`` in pyproject.toml), so ``lpfail.kernels`` is an ordinary subpackage;
* a plain checkout with ``PYTHONPATH`` at its root and nothing installed (how the GPU machines run it): no
  ``lpfail/kernels`` exists, so `_CheckoutKernels`, a finder added to ``sys.meta_path`` below, gives
  ``lpfail.kernels`` the spec of the checkout's ``kernels/`` folder (its submodules then load from there).

The finder acts only where ``lpfail/`` sits in a source checkout of lpfail (its parent holds this project's
``pyproject.toml`` and ``kernels/__init__.py``) and has no ``kernels`` subpackage of its own, so an installed
lpfail never picks up some other folder named ``kernels``. ``kernels/__init__.py`` refuses to be imported under
any name but ``lpfail.kernels``.
"""
import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

from lpfail import numerics as _numerics

# The CPU numeric pins (lpfail.numerics.PINS) act only if set before torch starts: set them first of all.
_numerics.apply()

__version__ = "0.5.8"

#: Old module name → where the module lives now (importing the old name raises, naming the new one).
MOVED = {
    "lpfail.symptom": "lpfail.experiments.symptom",
    "lpfail.rounding": "lpfail.experiments.rounding",
    "lpfail.fixrows": "lpfail.experiments.fix_rows",
    "lpfail.plots": "lpfail.book.plots",
    "lpfail.widgets": "lpfail.book.widgets",
    "lpfail.verdict": "lpfail.book.verdict",
    "lpfail.costs": "lpfail.book.costs",
    "lpfail.symptom_report": "lpfail.book.symptom_report",
    "lpfail.experiments.driver": "lpfail.sweep.driver",
}


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            raise ModuleNotFoundError(f"{fullname} has moved: import {MOVED[fullname]} instead", name=fullname)
        return None


def checkout_root() -> Path | None:
    """The root of the source checkout this ``lpfail`` was imported from (the folder holding lpfail's
    ``pyproject.toml`` beside ``lpfail/``), or None for an installed copy (a wheel in site-packages)."""
    root = Path(__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    try:
        if project.is_file() and 'name = "lpfail"' in project.read_text(encoding="utf-8"):
            return root
    except OSError:
        pass
    return None


def _checkout_kernels() -> Path | None:
    """``kernels/__init__.py`` of the checkout, where ``lpfail.kernels`` must come from it (see the docstring)."""
    if (Path(__file__).resolve().parent / "kernels").exists():   # installed with its own lpfail/kernels
        return None
    root = checkout_root()
    init = root / "kernels" / "__init__.py" if root is not None else None
    return init if init is not None and init.is_file() else None


class _CheckoutKernels(importlib.abc.MetaPathFinder):
    """``lpfail.kernels`` from the checkout's ``kernels/`` folder (a plain checkout or an editable install)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "lpfail.kernels":
            return None
        init = _checkout_kernels()
        if init is None:
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


for _finder in (_MovedFinder, _CheckoutKernels):   # once each, also across reload(lpfail)
    if not any(type(f).__name__ == _finder.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _finder())


#: The names ``lpfail`` offers at its top, each imported from its module on first use (`__getattr__`), so that
#: ``import lpfail`` loads neither torch nor Triton.
LAZY = {"flash_attention": "lpfail.kernels", "Monitor": "lpfail.monitor", "Alarm": "lpfail.alarm"}
__all__ = ["MOVED", "LAZY", "checkout_root", *LAZY]


def __getattr__(name):
    """``lpfail.flash_attention`` (the drop-in of ``lpfail.kernels``, which loads Triton), ``lpfail.Monitor``
    (`lpfail.monitor.Monitor`) and ``lpfail.Alarm`` (`lpfail.alarm.Alarm`): imported on first use."""
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'lpfail' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *LAZY})
