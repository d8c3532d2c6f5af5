"""Experiments depend on the framework, not on each other: no module of `lpfail.sweep` imports an experiment, and a
module of `lpfail.experiments` imports another only where `ALLOWED` says why (imports inside functions count, as
in `test_import_cycles`). The learning-rate grid the GPU experiments share is `lpfail.sweep.lr` (and its variants
`lpfail.sweep.variants`), so no experiment imports `lr_sweep`."""
from __future__ import annotations

from test_import_cycles import _modules, imports

EXPERIMENTS = "lpfail.experiments"

#: (importer, imported) → why. Two kinds: an experiment that reads another's stored result or pre-registered
#: rule (a real dependency of the science), and shared machinery still living in an experiment module (debt: move
#: it into the framework as `lpfail.sweep.lr` was, and delete its line here).
ALLOWED = {
    ("compiled_sweep", "official_check"): "result: its grid waits until official_check's stored result confirms "
                                          "the preset (`preset_confirmed`)",
    ("confirmation_power", "confirmation"): "result: the power of confirmation's rule, computed from its result",
    ("dial_training", "symptom"): "rule: chapter 1's pre-registered failure criterion (`failed`) on the long runs",
    ("dial", "rounding"): "machinery: chapter 4's synthetic tied rows (`make_rows`, `RowSpec`, `mean_ci`)",
    ("fix_sweep", "rounding"): "machinery: chapter 4's synthetic tied rows",
    ("official_check", "rounding"): "machinery: chapter 4's synthetic tied rows",
    ("prod_kernels", "rounding"): "machinery: chapter 4's synthetic tied rows",
    ("sr_confound", "rounding"): "machinery: chapter 4's synthetic tied rows",
    ("sr_confound", "cures"): "machinery: `cures.gradient_errors`",
    ("fix_gallery", "rounding"): "machinery: chapter 4's synthetic tied rows",
    ("beyond_cpu", "rounding"): "machinery: chapter 4's synthetic tied rows",
    ("beyond_cpu", "prod_kernels"): "machinery: `prod_kernels.truth` and `point_stats`, the table's statistic",
    ("beyond_cpu", "cures"): "machinery: `cures.gradient_errors`, the table's statistic",
    ("train_speed", "train_ddp"): "machinery: the GPT-2 small speed config (`train_ddp._speed_cfg`)",
}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: imports(path, mods, name) for name, path in mods.items()}


def _short(module: str) -> str:
    return module.removeprefix(EXPERIMENTS + ".")


def test_the_framework_imports_no_experiment():
    bad = {m: sorted(d for d in deps if d == EXPERIMENTS or d.startswith(EXPERIMENTS + "."))
           for m, deps in _graph().items() if m == "lpfail.sweep" or m.startswith("lpfail.sweep.")}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"lpfail.sweep must import no experiment (found {bad})"


def test_experiments_import_each_other_only_where_allowed():
    edges = {(_short(m), _short(d)) for m, deps in _graph().items() if m.startswith(EXPERIMENTS + ".")
             for d in deps if d.startswith(EXPERIMENTS + ".")}
    new = sorted(edges - set(ALLOWED))
    assert not new, ("experiments importing other experiments (import the framework, lpfail.sweep, instead; or "
                     f"add the pair to ALLOWED with the reason): {new}")
    stale = sorted(set(ALLOWED) - edges)
    assert not stale, f"ALLOWED names imports that no longer exist (delete them): {stale}"
    assert not any(d == "lr_sweep" for _, d in edges), "the learning-rate grid is lpfail.sweep.lr, not lr_sweep"
