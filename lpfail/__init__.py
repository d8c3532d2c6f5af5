"""lpfail: an executable edition of Qiu & Yao, "Why Low-Precision Transformer Training Fails: An Analysis on
Flash Attention" (ICLR 2026). See README.md and the book.

Layout: the core library is ``lpfail.bf16``, ``precision``, ``attention``, ``model``, ``data``, ``train``,
``optim``, ``results`` and ``cli``; the registered experiments are in ``lpfail.experiments``, what only the book
uses in ``lpfail.book``. The modules' old names (``lpfail.symptom``, ``lpfail.plots`` ...) still import: `MOVED`
maps each to its new place, resolved lazily (importing ``lpfail`` imports neither package), and the old name
gives the very same module object as the new one."""
import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

#: Old module name → where the module lives now.
MOVED = {
    "lpfail.symptom": "lpfail.experiments.symptom",
    "lpfail.rounding": "lpfail.experiments.rounding",
    "lpfail.fixrows": "lpfail.experiments.fix_rows",
    "lpfail.plots": "lpfail.book.plots",
    "lpfail.widgets": "lpfail.book.widgets",
    "lpfail.verdict": "lpfail.book.verdict",
    "lpfail.costs": "lpfail.book.costs",
    "lpfail.symptom_report": "lpfail.book.symptom_report",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new place (imported once, under its new name)."""

    def __init__(self, target: str):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__  # the import system sets __spec__ to the alias spec: restored below
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec

    def is_package(self, fullname):
        return False

    def get_code(self, fullname):  # `python -m lpfail.symptom ...` runs the new module's code as __main__
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _AliasLoader(new))


if not any(type(f).__name__ == "_AliasFinder" for f in sys.meta_path):  # once, also across reload(lpfail)
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str):  # `lpfail.symptom` after a plain `import lpfail`
    if f"{__name__}.{name}" in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
