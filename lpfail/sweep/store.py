"""The run store: every finished run of a grid, summarised into *part* files that merge across machines.

A part file (``results/<folder>/part-<UTC time>-<pid>.json.gz``) holds the runs one call of the driver finished,
keyed by the run's point key, with the provenance of that call (git commit, device, versions, host, date, wall
time) and last the hash of all that (`lpfail.results.CONTENT_KEY`: a part whose content does not match the hash
it holds was edited, and is refused; a part written before parts held one is read as it is). A part is stored
gzip-compressed (``.json.gz``, written deterministically: the same content gives the same bytes) or as plain JSON
(``.json``); both are read, and a part is named by its file name without the ``.gz`` (`part_name`), so the
hash, the name a result lists and the order of the parts do not depend on the form. A call writes a new part
and never touches another, so parts copied back from several GPU calls simply sit side by side; `Store.load`
merges them (the first part that holds a key wins), `Store.load_versions` keeps every version of a key. A run
is *stored* for a grid when a part holds its key **and** the hash of its TrainConfig (`run_hash`): a changed
setting orphans the old runs instead of silently reusing them. A run of a retired random stream
(`retired_hashes`) is read for the record, never counted as stored.

`summarize_run` is what a part keeps of one run (≈ 5 kB as JSON): held-out losses, the curves binned to
``curve_points``, the diagnostics, status and speed.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
import json
import os
import platform
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lpfail import results
from lpfail.sweep.driver import bins


def _hashed_text(tc) -> str:
    from lpfail.train import TrainConfig

    default = TrainConfig().to_dict()
    where = ("out_dir", "device", "checkpoint_every", "keep_checkpoints")  # where and how often: not what
    d = {k: v for k, v in tc.to_dict().items() if k not in where and v != default.get(k)}
    return json.dumps(d, sort_keys=True)


def _sha16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_hash(tc) -> str:
    """A hash of a run's TrainConfig that ignores where it writes and fields left at their defaults (so a
    field added to TrainConfig later does not orphan the stored runs)."""
    return _sha16(_hashed_text(tc))


def retired_hashes(tc) -> set[str]:
    """The hashes the same point had under a retired spelling of its policies (`lpfail.sr_stream.RETIRED_SPELLINGS`):
    a stored run with one of them is a run of a random stream this code no longer has."""
    from lpfail.sr_stream import RETIRED_SPELLINGS

    text = _hashed_text(tc)
    return {_sha16(text.replace(new, old)) for new, old in RETIRED_SPELLINGS if new in text}


# -- the two forms of a part file ------------------------------------------------------------------------------
GZ = ".gz"


def part_name(path) -> str:
    """A part's name: its file name without the ``.gz`` of the compressed form (``part-<time>-<pid>.json``)."""
    return Path(path).name.removesuffix(GZ)


def part_files(folder: Path) -> list[Path]:
    """The part files of a folder, both forms, in name order (`part_name`; the plain form first where a part is
    stored in both)."""
    if not Path(folder).is_dir():
        return []
    found = [*Path(folder).glob("part-*.json"), *Path(folder).glob("part-*.json" + GZ)]
    return sorted(found, key=lambda p: (part_name(p), p.name))


def decode_part(data: bytes, name: str) -> bytes:
    """The JSON bytes of a part file's ``data`` (decompressed when ``name`` ends in ``.gz``). A damaged
    compressed file raises ValueError."""
    if not name.endswith(GZ):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"not a readable gzip file ({e})") from None


def encode_part(text: bytes, name: str) -> bytes:
    """A part file's bytes for its JSON ``text``: gzip-compressed when ``name`` ends in ``.gz``, deterministically
    (no time and no file name in the header), else ``text`` itself."""
    return gzip.compress(text, compresslevel=9, mtime=0) if name.endswith(GZ) else text


def read_part(path) -> dict:
    """A part file, parsed (either form; no checks: `Store.parts` checks)."""
    path = Path(path)
    return json.loads(decode_part(path.read_bytes(), path.name))


@dataclass(frozen=True)
class Store:
    """A folder of part files under the results cache, and the tag its parts carry (``format``)."""

    folder: str  # e.g. "lr_sweep_parts"
    fmt: str  # e.g. "lpfail.lr_sweep.part"
    rerun: str = ""  # the command that reruns a corrupt part's runs (named in the error)

    def path(self, directory: Path | None = None) -> Path:
        return (Path(directory) if directory is not None else results.results_dir()) / self.folder

    def part(self, directory: Path | None = None) -> "Part":
        """A new, empty part file of this store (written on the first `Part.add`)."""
        return Part(self, directory)

    def file(self, name: str, directory: Path | None = None) -> Path:
        """The file of the part named ``name`` (`part_name`): the compressed form where it exists, else the plain
        one."""
        d = self.path(directory)
        gz = d / (name + GZ)
        return gz if gz.is_file() else d / name

    def parts(self, directory: Path | None = None) -> list[tuple[Path, dict]]:
        """Every part file of this store (``.json`` or ``.json.gz``), parsed and checked, in name order (= the
        order they were written). A corrupt or foreign file, or one whose content does not match the hash it
        records, is an error naming it and the command that reruns its runs, never skipped. The hash check of a
        file is remembered for as long as the file's size, inode and modification time are unchanged
        (`_VERIFIED`)."""
        out = []
        d = self.path(directory)
        for path in part_files(d):
            try:
                st = path.stat()
                stamp = (st.st_size, st.st_ino, st.st_mtime_ns)
                part = json.loads(decode_part(path.read_bytes(), path.name).decode())
                if part.get("format") != self.fmt or not isinstance(part.get("runs"), dict):
                    raise ValueError(f"format {part.get('format')!r}")
                if results.CONTENT_KEY in part and _VERIFIED.get(path.resolve()) != stamp:
                    if not results.content_ok(part):
                        raise ValueError(f"its content does not match the hash it records ({results.CONTENT_KEY}): "
                                         "a value in it was edited by hand")
                    _VERIFIED[path.resolve()] = stamp
            except (ValueError, UnicodeDecodeError) as e:
                raise results.ResultCorrupt(
                    f"{self.folder.removesuffix('_parts')} part {path} is corrupt ({e}); delete it and rerun the "
                    f"runs it held with `{self.rerun or 'python -m lpfail sweep NAME drive'}`") from None
            out.append((path, part))
        return out

    def load(self, directory: Path | None = None) -> tuple[dict[str, dict], list[dict]]:
        """({point key: run summary}, [provenance of each part that holds at least one of them]) from every part
        file of this store (`parts`: a corrupt or foreign file is an error, never skipped)."""
        runs, metas = {}, []
        for path, part in self.parts(directory):
            new = {k: r for k, r in part["runs"].items() if k not in runs}
            runs.update(new)
            if new:
                meta = {k: part.get(k) for k in ("git", "device", "versions", "created", "wall_s", "host",
                                                 "uncaptured")}
                metas.append(meta | {"file": part_name(path), "runs": len(new), "keys": sorted(new)})
        return runs, metas

    def load_versions(self, directory: Path | None = None) -> tuple[dict[str, list[tuple[str, dict]]], list[dict]]:
        """Every stored summary of every key, in part order ({key: [(part name, summary), ...]}: a point
        trained again under another TrainConfig hash keeps both), and each part's provenance (as `load` gives it).
        The same checks as `load`."""
        versions: dict[str, list[tuple[str, dict]]] = {}
        metas = []
        for path, part in self.parts(directory):
            new = sorted(k for k in part["runs"] if k not in versions)  # as `load` counts them
            for k, r in part["runs"].items():
                versions.setdefault(k, []).append((part_name(path), r))
            meta = {k: part.get(k) for k in ("git", "device", "versions", "created", "wall_s", "host", "uncaptured")}
            metas.append(meta | {"file": part_name(path), "runs": len(new), "keys": new})
        return versions, metas


#: Part files whose content hash was checked, by resolved path: (size, inode, modification time in ns) when it
#: was. A file written since (a new part, a later state, an edit) is checked again.
_VERIFIED: dict[Path, tuple[int, int, int]] = {}


class Part:
    """One part file: the runs one call of the driver finished, with the provenance of that call. It is written
    compressed (``.json.gz``); a ``path`` set to a plain ``.json`` name is written as plain JSON."""

    def __init__(self, store: Store, directory: Path | None = None):
        created = _dt.datetime.now(_dt.timezone.utc)
        self.meta = {"format": store.fmt, "version": 1, "git": results.git_commit(), "device": results.device_name(),
                     "versions": results.library_versions(), "host": platform.node(),
                     "created": created.isoformat(timespec="seconds"), "wall_s": 0.0}
        self.runs: dict[str, dict] = {}
        d = store.path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"part-{created.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json{GZ}"
        self._t0 = time.perf_counter()

    @property
    def name(self) -> str:
        """The part's name (`part_name`), as `Store.load` and a result's list of parts give it."""
        return part_name(self.path)

    def add(self, summary: dict):
        self.runs[summary["key"]] = summary
        self.write()

    def write(self):
        self.meta["wall_s"] = round(time.perf_counter() - self._t0, 1)
        payload = json.dumps(results.with_content_hash({**self.meta, "runs": self.runs}), allow_nan=True) + "\n"
        results.atomic_write(self.path, encode_part(payload.encode(), self.path.name))

    def close(self):
        """Write what it holds, or remove the file when it holds nothing."""
        if self.runs:
            self.write()
        else:
            self.path.unlink(missing_ok=True)


def compress_parts(directory: Path | None = None, log=print) -> tuple[list[Path], list[Path]]:
    """Store every plain part file (``*_parts/part-*.json``) under ``directory`` (default: the results cache) in
    the compressed form. Each is checked first (it parses, and it holds a content hash that matches its content),
    its bytes are compressed as they are into ``part-….json.gz`` (atomically), and the ``.json`` is removed only
    once the ``.gz`` reads back to the same bytes. A part that fails the check, or whose ``.gz`` already exists
    with other content, is left as it is and named. Returns (the plain files replaced, the files left)."""
    root = Path(directory) if directory is not None else results.results_dir()
    done, left = [], []
    for path in sorted(root.glob("*_parts/part-*.json")):
        data = path.read_bytes()
        try:
            record = json.loads(data)
            why = ("" if isinstance(record, dict) and results.content_ok(record) else
                   f"no {results.CONTENT_KEY} matching its content (tools/content_hash.py --check)")
        except (ValueError, UnicodeDecodeError) as e:
            why = f"not JSON ({e})"
        gz = path.with_name(path.name + GZ)
        if not why and gz.exists():
            try:
                same = decode_part(gz.read_bytes(), gz.name) == data
            except ValueError:
                same = False
            why = "" if same else f"{gz.name} exists with other content"
        elif not why:
            results.atomic_write(gz, encode_part(data, gz.name))
            if decode_part(gz.read_bytes(), gz.name) != data:
                gz.unlink()
                why = "its compressed copy did not read back to the same bytes"
        if why:
            log(f"{path}: left as it is: {why}")
            left.append(path)
            continue
        path.unlink()
        done.append(path)
    return done, left


def used_parts(metas: list[dict], have) -> list[dict]:
    """The part files' metadata (`Store.load`) of the parts that hold at least one of the runs ``have`` (keys)."""
    return [m for m in metas if any(k in have for k in m["keys"])]


def parts_provenance(used: list[dict], none: str = "") -> dict:
    """A result's provenance from the parts that hold its runs: their GPUs, the latest date, every commit, the
    drivers' summed wall time, and the collecting machine (``none``: the device named when no part is used,
    e.g. a result made only of another experiment's runs)."""
    devices = sorted({str(m.get("device") or "unknown device") for m in used}) or ([none] if none else [])
    return {"device": " + ".join(devices), "created": max((str(m.get("created") or "") for m in used), default=""),
            "git": " ".join(sorted({str(m.get("git"))[:12] for m in used})),
            "runs_wall_s": float(sum(m.get("wall_s") or 0.0 for m in used)), "runs_gpus": devices,
            "collected_on": results.device_name(),
            "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "collected_git": results.git_commit()}


# -- one run's summary -----------------------------------------------------------------------------------------
def _geometric_mean(x: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(np.maximum(x, 1e-30)))))


def _nan_list(a) -> list:
    return np.asarray(a, dtype=np.float64).tolist()


def summarize_run(run_dir, tc, key: str, curve_points: int) -> dict:
    """What a part keeps of one run (small: ~5 kB as JSON)."""
    from lpfail.train import read_diag, read_log, read_status, read_val
    from lpfail.train.log import DELTA_KEYS

    run_dir = Path(run_dir)
    st = read_status(run_dir)
    log, diag, val = read_log(run_dir), read_diag(run_dir), read_val(run_dir)
    loss, gn = log["loss"], log["grad_norm"]
    finite = loss[np.isfinite(loss)]
    out = {
        "key": key, "run_hash": run_hash(tc), "status": st["status"], "steps": int(st["steps"]),
        "nonfinite_step": st.get("nonfinite_step"), "wall_s": float(st.get("wall_s") or 0.0),
        "tokens_per_s": float(np.nanmedian(log["tokens_per_s"][1:])) if len(loss) > 1 else float("nan"),
        "val_step": val["step"].tolist(), "val_loss": _nan_list(val["val_loss"]),
        "final_train_loss": float(finite[-100:].mean()) if finite.size else float("nan"),
        "loss_curve": _nan_list(bins(loss, tc.max_steps, curve_points, np.mean)),
        "gnorm_curve": _nan_list(bins(gn, tc.max_steps, curve_points, _geometric_mean)),
        "gnorm_max_curve": _nan_list(bins(gn, tc.max_steps, curve_points, np.max)),
        "gnorm_max": float(np.nanmax(gn)) if np.isfinite(gn).any() else float("nan"),
        "diag_step": diag["step"].tolist(),
    }
    for k in ("max_logit", "tied_frac", "wq", "wqk"):
        out[k] = _nan_list(diag[k]) if k in diag else []
    for k in DELTA_KEYS:  # the δ signature, only where the run took it
        if k in diag:
            out[k] = _nan_list(diag[k])
    return out


def final_val(r: dict, max_steps: int) -> tuple[float, float]:
    """(held-out loss at step 0, at ``max_steps``) of a run summary; the final one is NaN unless the run
    completed and was evaluated there (a non-finite run has no final loss)."""
    vs, vl = np.asarray(r["val_step"]), np.asarray(r["val_loss"], dtype=np.float64)
    init = float(vl[vs == 0][0]) if (vs == 0).any() else float("nan")
    ok = r["status"] == "completed" and (vs == max_steps).any()
    return init, float(vl[vs == max_steps][0]) if ok else float("nan")
