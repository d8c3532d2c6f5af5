"""lpfail: an executable edition of Qiu & Yao, "Why Low-Precision Transformer Training Fails: An Analysis on
Flash Attention" (ICLR 2026). See README.md and the book.

Layout: the core library is ``lpfail.bf16``, ``precision``, ``attention``, ``model``, ``data``, ``train``,
``optim``, ``results``, ``cli`` and the grid framework ``lpfail.sweep``; the registered experiments are in
``lpfail.experiments``, what only the book uses in ``lpfail.book``. A module that moved fails to import under its
old name with an error that names its new place (`MOVED`)."""
import importlib.abc
import sys

from lpfail import numerics as _numerics

# The CPU numeric pins (lpfail.numerics.PINS) act only if set before torch starts: set them first of all.
_numerics.apply()

__version__ = "0.1.0"

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


if not any(type(f).__name__ == "_MovedFinder" for f in sys.meta_path):  # once, also across reload(lpfail)
    sys.meta_path.insert(0, _MovedFinder())
