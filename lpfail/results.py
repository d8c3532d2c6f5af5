"""The results cache: experiments registered by name, their outputs stored with provenance.

An experiment is a pure function of a frozen config dataclass that returns a dict of numpy arrays and JSON
scalars. ``python -m lpfail run NAME`` runs it and writes two files into ``results/``:

* ``NAME.npz``  — the arrays (loaded with ``allow_pickle=False``);
* ``NAME.json`` — ``name``, ``config``, ``config_hash``, ``git``, ``device``, ``versions``, ``numerics`` (the CPU
  numerics in effect, `lpfail.numerics.provenance`), ``created`` (UTC), ``wall_s``, the scalars, the sha256 of the ``.npz`` (so a half-written or mismatched pair is caught), and last
  ``content_sha256``, the hash of everything else in the JSON (`content_hash`: so an edited number is caught).

Chapters call ``load(NAME)``: it returns the stored result when its config hash matches the experiment's
current config and raises an error naming the regenerating command otherwise. With ``LPFAIL_RECOMPUTE=1``,
``load`` recomputes (and stores) instead — on a GPU machine for GPU experiments. Writes are atomic: each file
goes to a temporary name in the same folder and is renamed into place, the ``.npz`` first and the ``.json``
(which names the ``.npz``'s hash) last.

Where (`results_dir`): ``$LPFAIL_RESULTS_DIR`` if set (the GPU machine's calls point it at ``$OUT``); else, in a
source checkout, its ``results/`` (the stored results the book reads); else — lpfail installed from a wheel, where
the folder above the package is site-packages — ``results/`` in the user's lpfail folder (`user_dir`:
``$LPFAIL_HOME``, else ``$XDG_DATA_HOME/lpfail``, else ``~/.local/share/lpfail``), never site-packages. A CPU experiment's result is stored only under the pinned CPU
numerics (`lpfail.numerics.require_pinned`): computed otherwise, its numbers would depend on the machine.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as _dt
import hashlib
import importlib
import io
import json
import os
import platform
import subprocess
import tempfile
import time
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import numpy as np

import lpfail
from lpfail import numerics

#: Packages whose modules register experiments. `registry()` walks them on first use and imports every module
#: whose source registers one (`REGISTERS`): a new experiment module needs no entry here.
EXPERIMENT_PACKAGES = ("lpfail.experiments", "lpfail.kernels")
#: What marks a module that registers an experiment: a line that decorates with `experiment` (``@experiment(``,
#: ``@results.experiment(``) or with `lpfail.sweep.register_grid` (``@register_grid(``, ``@sweep.register_grid(``),
#: which registers a grid experiment here and in the sweep registry at once.
REGISTERS = r"^@((results|sweep)\.)?(experiment|register_grid)\("

#: The folder above the package: the repository in a source checkout, site-packages in an install (`checkout`).
REPO_ROOT = Path(__file__).resolve().parent.parent
#: The user's lpfail folder (results outside a checkout): this variable, else $XDG_DATA_HOME/lpfail or
#: ~/.local/share/lpfail (`user_dir`).
HOME_ENV = "LPFAIL_HOME"
#: Where results go, whatever else holds (`results_dir`).
RESULTS_ENV = "LPFAIL_RESULTS_DIR"


class ResultError(RuntimeError):
    """Base class of the cache's errors; each message names the command that fixes it."""


class ResultMissing(ResultError):
    pass


class ResultStale(ResultError):
    pass


class ResultCorrupt(ResultError):
    pass


class UnknownExperiment(ResultError, KeyError):
    def __str__(self):  # KeyError would quote the message
        return self.args[0]


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    fn: Callable[[Any], dict]
    config: type
    gpu: bool
    description: str
    #: ``headline(result) -> {name: value}``: what the book states from the result, at the resolution it states it
    #: (compared across CPU settings by tools/cpu_invariance.py); None where the experiment declares none.
    headline: Callable[[Any], dict] | None = None
    #: ``check(config) -> config``: a cheaper config on which the headline is compared across CPU settings (the
    #: default config when None).
    check: Callable[[Any], Any] | None = None
    #: The book page that shows the experiment (``book/<chapter>.ipynb``, e.g. ``"05_fix"``); None where none is
    #: declared. Every grid experiment declares one (`lpfail.sweep.register_grid`); the book reads it from here.
    chapter: str | None = None

    def default_config(self):
        return self.config()

    def check_config(self):
        return self.default_config() if self.check is None else self.check(self.default_config())


_REGISTRY: dict[str, Experiment] = {}
_IMPORTED = False


def experiment(name: str, config: type, gpu: bool = False, description: str | None = None,
               headline: Callable[[Any], dict] | None = None, check: Callable[[Any], Any] | None = None,
               chapter: str | None = None):
    """Register ``fn(cfg) -> dict`` as experiment ``name`` with config dataclass ``config`` (`Experiment` says what
    `headline`, `check` and `chapter` are). A grid experiment is declared with `lpfail.sweep.register_grid`
    instead, which calls this."""
    if not (dataclasses.is_dataclass(config) and isinstance(config, type)):
        raise TypeError(f"experiment {name!r}: config must be a dataclass type (got {config!r})")
    if not config.__dataclass_params__.frozen:
        raise TypeError(f"experiment {name!r}: config dataclass {config.__name__} must be frozen")

    def register(fn):
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        if name in _REGISTRY and _REGISTRY[name].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"experiment {name!r} is registered twice ({_REGISTRY[name].fn.__module__} "
                             f"and {fn.__module__})")
        _REGISTRY[name] = Experiment(name, fn, config, gpu, doc, headline, check, chapter)
        return fn

    return register


def experiment_modules() -> list[str]:
    """The modules of `EXPERIMENT_PACKAGES` that register an experiment, found by a walk of the packages (each
    module's source is read, not imported, to decide)."""
    import pkgutil
    import re

    out = []
    for pkg_name in EXPERIMENT_PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ModuleNotFoundError as e:
            if e.name != pkg_name:
                raise
            continue
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            path = Path(info.module_finder.path) / f"{info.name}.py"
            if not info.ispkg and path.is_file() and re.search(REGISTERS, path.read_text(), re.MULTILINE):
                out.append(f"{pkg_name}.{info.name}")
    return out


def registry() -> dict[str, Experiment]:
    """All registered experiments (importing the modules that define them, found by `experiment_modules`)."""
    global _IMPORTED
    if not _IMPORTED:
        for mod in experiment_modules():
            importlib.import_module(mod)
        _IMPORTED = True
    return dict(_REGISTRY)


def get(name: str) -> Experiment:
    reg = registry()
    if name not in reg:
        raise UnknownExperiment(f"no experiment named {name!r}; registered: {sorted(reg)} "
                                "(`python -m lpfail list` shows them)")
    return reg[name]


# -- config hashing -------------------------------------------------------------------------------------
def _canon(obj):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__type__": type(obj).__name__,
                **{f.name: _canon(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, (list, tuple)):
        return [_canon(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _canon(v) for k, v in sorted(obj.items())}
    if isinstance(obj, float):
        return repr(obj)  # exact and stable
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)  # e.g. a Precision: its string form is its identity


def config_dict(cfg) -> dict:
    return _canon(cfg)


def config_hash(cfg) -> str:
    """A short stable hash of a config dataclass (its type name and every field)."""
    text = json.dumps(_canon(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- provenance -----------------------------------------------------------------------------------------
def checkout() -> bool:
    """Whether this lpfail runs from a source checkout (a plain one or an editable install), not from a wheel."""
    return lpfail.checkout_root() is not None


def user_dir() -> Path:
    """The user's lpfail folder: ``$LPFAIL_HOME``, else ``$XDG_DATA_HOME/lpfail``, else ``~/.local/share/lpfail``."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share") / "lpfail"


_READING: contextvars.ContextVar[Path | None] = contextvars.ContextVar("lpfail_reading", default=None)


@contextlib.contextmanager
def reading_from(directory: Path | None):
    """Within the block, `results_dir` is ``directory`` (None: unchanged), so that what code inside reads by
    default — a grid's runs built from another stored result, e.g. substitution's heads rows from lr_sweep — comes
    from the folder its caller was given (`lpfail.sweep.grid.lookup`), not from ``$LPFAIL_RESULTS_DIR``."""
    token = _READING.set(Path(directory) if directory is not None else _READING.get())
    try:
        yield
    finally:
        _READING.reset(token)


def results_dir() -> Path:
    """Where results are stored and read: the folder of an enclosing `reading_from`, else ``$LPFAIL_RESULTS_DIR``,
    else the checkout's ``results/``, else ``results/`` in `user_dir` (an installed lpfail never writes into
    site-packages)."""
    reading = _READING.get()
    if reading is not None:
        return reading
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    return REPO_ROOT / "results" if checkout() else user_dir() / "results"


def git_commit() -> str:
    """The commit of the checkout that computes (``-dirty`` with uncommitted changes to lpfail/ or kernels/), or
    ``lpfail-VERSION`` for an installed lpfail (no repository of its own); ``$LPFAIL_GIT`` wins."""
    if os.environ.get("LPFAIL_GIT"):
        return os.environ["LPFAIL_GIT"]
    if not checkout():
        return f"lpfail-{lpfail.__version__}"
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return "unknown"
        # dirty = uncommitted changes to the code that computes results (untracked modules included)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "lpfail", "kernels"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name() -> str:
    """The name of the GPU results are computed on, or ``cpu (PROCESSOR)`` without one."""
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover - torch import problems are reported elsewhere
        pass
    return f"cpu ({platform.processor() or platform.machine()})"


def library_versions() -> dict:
    """The versions of Python, numpy, lpfail, torch, Triton and CUDA (None where one is missing)."""
    out = {"python": platform.python_version(), "numpy": np.__version__, "lpfail": lpfail.__version__}
    for mod in ("torch", "triton"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except Exception:
            out[mod] = None
    try:
        import torch
        out["cuda"] = torch.version.cuda
    except Exception:
        pass
    return out


# -- the content hash of a stored JSON ------------------------------------------------------------------
#: The key under which a stored JSON (a result's ``NAME.json``, a run store's part, a quick record) holds the hash
#: of the rest of its content.
CONTENT_KEY = "content_sha256"


def content_hash(record: dict) -> str:
    """The sha256 of ``record``'s content without `CONTENT_KEY`: of its canonical JSON (keys sorted, no spaces),
    taken after a JSON round trip, so it is the same for the dict as written and as read back, whatever the
    file's layout. A value changed by hand changes it; the same content written out differently does not."""
    body = json.loads(json.dumps({k: v for k, v in record.items() if k != CONTENT_KEY}, allow_nan=True))
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def with_content_hash(record: dict) -> dict:
    """``record`` with `CONTENT_KEY` (re)computed, last."""
    out = {k: v for k, v in record.items() if k != CONTENT_KEY}
    out[CONTENT_KEY] = content_hash(out)
    return out


def content_ok(record: dict) -> bool:
    """Whether ``record`` holds `CONTENT_KEY` and it matches its content."""
    return record.get(CONTENT_KEY) == content_hash(record)


# -- the stored result ----------------------------------------------------------------------------------
class Result(Mapping):
    """A stored result: mapping access to arrays and scalars, ``.meta`` for provenance."""

    def __init__(self, data: dict, meta: dict):
        self._data = data
        self.meta = meta

    def __getitem__(self, key):
        try:
            return self._data[key]
        except KeyError:
            raise KeyError(f"result {self.meta.get('name')!r} has no entry {key!r}; it has {sorted(self._data)}") from None

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    @property
    def provenance(self) -> str:
        """One line: where and when this result was computed."""
        m = self.meta
        if m.get("collected_on"):  # runs on one machine, collected later from their logs on another
            gpus = m.get("runs_gpus") or []
            return (f"{m['name']}: runs on {m['device']}" + (f" × {len(gpus)}" if len(gpus) > 1 else "")
                    + f" on {m['created'][:10]} (git {_short_git(m['git'])}, "
                    + (f"{m['runs_wall_s']:.0f} s, " if m.get("runs_wall_s") else "")
                    + f"config {m['config_hash']}); collected from their logs on {m['collected_on']} "
                    f"(git {_short_git(m.get('collected_git', '?'))})")
        return (f"{m['name']}: computed on {m['device']} on {m['created'][:10]} "
                f"(git {_short_git(m['git'])}, {m['wall_s']:.1f} s, config {m['config_hash']})")

    def __repr__(self):
        return f"<Result {self.provenance}; keys {sorted(self._data)}>"


def _short_git(git) -> str:
    """A commit, or the space-separated commits of runs from several trees, each to 12 hex digits: 'a1b2…',
    'a1b2… and c3d4…', 'a1b2…, c3d4… and e5f6…'."""
    gits = [g[:12] for g in str(git).split()] or ["?"]
    return gits[0] if len(gits) == 1 else ", ".join(gits[:-1]) + " and " + gits[-1]


def _split(name: str, data: dict) -> tuple[dict, dict]:
    if not isinstance(data, dict):
        raise TypeError(f"experiment {name!r} must return a dict (got {type(data).__name__})")
    arrays, scalars = {}, {}
    for k, v in data.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"experiment {name!r}: result key {k!r} must be an identifier string")
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                raise TypeError(f"experiment {name!r}: array {k!r} has dtype object (not storable)")
            arrays[k] = v
        elif isinstance(v, np.generic):
            scalars[k] = v.item()
        else:
            try:
                json.dumps(v, allow_nan=True)
            except TypeError:
                raise TypeError(f"experiment {name!r}: result {k!r} of type {type(v).__name__} is neither a numpy "
                                "array nor JSON-serializable") from None
            scalars[k] = v
    return arrays, scalars


def file_mode() -> int:
    """The mode open() gives a new file here: 0o666 less the process' umask (0o644 under the usual 022). A file
    written through a temporary file (`tempfile.mkstemp`: 0o600) is set to it before it is renamed into place."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` through a temporary file in the same folder renamed into place: a reader sees
    the old file or the new one, never half of one. The file gets `file_mode`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def require_storable(name: str) -> None:
    """Raise `lpfail.numerics.NumericsError` where ``name``'s result would depend on this machine: a CPU
    experiment (or an unregistered name) computed under other CPU numerics than the pinned ones. A GPU
    experiment's numbers come from the GPU: its result is stored whatever the CPU state (which it records)."""
    exp = registry().get(name)
    if exp is None or not exp.gpu:
        numerics.require_pinned(f"result {name!r}")


def require_writable(directory: Path) -> None:
    """Create `directory` where it is missing and raise `ResultError` where a result cannot be written into it,
    so that `run` says so before the computation rather than after it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise ResultError(f"cannot store results in {directory} ({e.strerror or e}); set ${RESULTS_ENV} to a "
                          "folder you can write, or pass --no-store") from None


def save(name: str, cfg, data: dict, wall_s: float, directory: Path | None = None,
         provenance: dict | None = None) -> Result:
    """Store ``data`` as result ``name`` (atomically, with provenance; refused by `require_storable` where the
    CPU numerics would make it depend on this machine).

    ``provenance`` adds to (or replaces) the recorded fields, for a result computed in two stages: e.g. GPU
    runs collected later on another machine from their logs (``device`` then names where the runs ran, and
    the added fields say where and from what they were collected)."""
    require_storable(name)
    arrays, scalars = _split(name, data)
    directory = Path(directory) if directory is not None else results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    npz_bytes = buf.getvalue()
    meta = {
        "name": name,
        "config": config_dict(cfg),
        "config_hash": config_hash(cfg),
        "git": git_commit(),
        "device": device_name(),
        "versions": library_versions(),
        "numerics": numerics.provenance(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(float(wall_s), 3),
        "npz_sha256": hashlib.sha256(npz_bytes).hexdigest(),
        "arrays": sorted(arrays),
        "scalars": scalars,
    }
    for key, value in (provenance or {}).items():
        if key in ("name", "config", "config_hash", "npz_sha256", "arrays", "scalars", CONTENT_KEY):
            raise ValueError(f"provenance cannot replace {key!r}")
        meta[key] = value
    meta = with_content_hash(meta)
    atomic_write(directory / f"{name}.npz", npz_bytes)
    atomic_write(directory / f"{name}.json", (json.dumps(meta, indent=1, allow_nan=True) + "\n").encode())
    return Result({**{k: v for k, v in arrays.items()}, **scalars}, meta)


def _command(name: str) -> str:
    return f"python -m lpfail run {name}"


def read_result(name: str, directory: Path) -> Result:
    """The stored result `name` in `directory`, its files checked (a ResultError when missing or corrupt)."""
    jpath, npath = directory / f"{name}.json", directory / f"{name}.npz"
    if not jpath.exists():
        raise ResultMissing(f"no stored result {name!r} in {directory}: run `{_command(name)}`"
                            + (" on a GPU machine" if name in _REGISTRY and _REGISTRY[name].gpu else ""))
    try:
        meta = json.loads(jpath.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        for key in ("name", "config_hash", "npz_sha256", "arrays", "scalars", "device", "created", "git",
                    CONTENT_KEY):
            if key not in meta:
                raise ValueError(f"missing key {key!r}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ResultCorrupt(f"stored result {jpath} is corrupt ({e}); delete it and run `{_command(name)}`") from None
    if not content_ok(meta):
        raise ResultCorrupt(f"stored result {jpath} does not match the content hash it records ({CONTENT_KEY}): a "
                            f"value in it was edited by hand; run `{_command(name)}`")
    if not npath.exists():
        raise ResultCorrupt(f"stored result {name!r} has {jpath.name} but no {npath.name}; run `{_command(name)}`")
    npz_bytes = npath.read_bytes()
    if hashlib.sha256(npz_bytes).hexdigest() != meta["npz_sha256"]:
        raise ResultCorrupt(f"stored result {npath} does not match the hash recorded in {jpath.name} (half-written "
                            f"or edited by hand); run `{_command(name)}`")
    try:
        with np.load(io.BytesIO(npz_bytes), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:
        raise ResultCorrupt(f"stored result {npath} cannot be read ({e}); run `{_command(name)}`") from None
    if sorted(arrays) != sorted(meta["arrays"]):
        raise ResultCorrupt(f"stored result {npath} holds arrays {sorted(arrays)}, its JSON names {meta['arrays']}")
    return Result({**arrays, **meta["scalars"]}, meta)


def _want_recompute() -> bool:
    return os.environ.get("LPFAIL_RECOMPUTE", "").strip().lower() in ("1", "true", "yes")


def lacks_gpu(name: str) -> bool:
    """Whether experiment ``name`` is registered as GPU work and this machine has no CUDA GPU (False for a name
    that is not registered: its own lookup says so)."""
    exp = registry().get(name)
    if exp is None or not exp.gpu:
        return False
    import torch

    return not torch.cuda.is_available()


def run(name: str, config=None, store: bool = True, directory: Path | None = None) -> Result:
    """Run experiment ``name`` (with its default config unless one is given) and store the result."""
    exp = get(name)
    cfg = exp.default_config() if config is None else config
    if not isinstance(cfg, exp.config):
        raise TypeError(f"experiment {name!r} takes a {exp.config.__name__} config (got {type(cfg).__name__})")
    if lacks_gpu(name):
        raise ResultError(f"experiment {name!r} needs a CUDA GPU and none is available here; run "
                          f"`{_command(name)}` on a GPU machine (chapters on CPU read its stored result)")
    if store:
        require_storable(name)  # before the computation, not only before the write
        require_writable(Path(directory) if directory is not None else results_dir())
    t0 = time.perf_counter()
    data = exp.fn(cfg)
    wall = time.perf_counter() - t0
    if not store:
        arrays, scalars = _split(name, data)
        return Result({**arrays, **scalars}, {"name": name, "config_hash": config_hash(cfg), "stored": False})
    return save(name, cfg, data, wall, directory)


def _require_fresh(exp: Experiment, cfg, res: Result) -> Result:
    if res.meta["config_hash"] != config_hash(cfg):
        raise ResultStale(f"stored result {exp.name!r} was computed for config {res.meta['config_hash']} but the "
                          f"current config hashes to {config_hash(cfg)}: its code or settings changed. Run "
                          f"`{_command(exp.name)}`" + (" on a GPU machine" if exp.gpu else "") + " to regenerate it")
    return res


def load(name: str, config=None, directory: Path | None = None) -> Result:
    """The stored result of ``name`` for its current (or the given) config.

    Raises ResultMissing / ResultStale / ResultCorrupt with the command that regenerates it. With
    ``LPFAIL_RECOMPUTE=1`` the experiment is run instead (it must be able to run here)."""
    exp = get(name)
    cfg = exp.default_config() if config is None else config
    directory = Path(directory) if directory is not None else results_dir()
    if _want_recompute():
        return run(name, cfg, directory=directory)
    return _require_fresh(exp, cfg, read_result(name, directory))


def inspect(name: str, directory: Path | None = None) -> tuple[str, Result | None]:
    """The state of the stored result of ``name`` against its default config — 'fresh', 'stale', 'missing' or
    'corrupt' — and the result itself when it could be read (fresh or stale). Reads the files once."""
    exp = get(name)
    try:
        res = read_result(name, Path(directory) if directory is not None else results_dir())
    except ResultMissing:
        return "missing", None
    except ResultCorrupt:
        return "corrupt", None
    try:
        return "fresh", _require_fresh(exp, exp.default_config(), res)
    except ResultStale:
        return "stale", res


def status(name: str, directory: Path | None = None) -> str:
    """'fresh', 'stale', 'missing' or 'corrupt' for the stored result of ``name``."""
    return inspect(name, directory)[0]


def typed_config(exp: Experiment, overrides: dict[str, str]):
    """Build ``exp``'s config from ``key=value`` strings (CLI ``--set``), converting by field type."""
    base = exp.default_config()
    fields = {f.name: f for f in dataclasses.fields(base)}
    hints = typing.get_type_hints(exp.config)
    changes = {}
    for key, text in overrides.items():
        if key not in fields:
            raise ValueError(f"{exp.name}: unknown config field {key!r}; fields: {sorted(fields)}")
        current = getattr(base, key)
        try:
            if isinstance(current, bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                changes[key] = text.lower() in ("true", "1")
            elif isinstance(current, (int, float, str)):
                changes[key] = type(current)(text)
            elif isinstance(current, tuple):
                elem = type(current[0]) if current else str
                changes[key] = tuple(elem(t) for t in text.split(",") if t != "")
            else:
                raise ValueError(f"field {key!r} of type {hints.get(key)} cannot be set from the command line")
        except ValueError as e:
            raise ValueError(f"{exp.name}: cannot set {key}={text!r} ({e})") from None
    return dataclasses.replace(base, **changes)
