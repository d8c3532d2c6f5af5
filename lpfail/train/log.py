"""What a run writes and what reads it back: the files of a run directory as they grow (`RunFiles`: log.jsonl,
diag.jsonl, val.jsonl, run.json's status), their readers (`read_log`, `read_diag`, `read_val`, `read_status`),
checkpoints (`save_checkpoint`, `load_checkpoint`, `checkpoint_path`), the refusal to overwrite a finished run
(`check_out_dir`), and what `train` returns (`TrainResult`). Part of `lpfail.train`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lpfail import data as lpdata
from lpfail.train.config import TrainConfig


def atomic_write_text(path: Path, text: str):
    """Write `text` to `path` atomically (a temporary file renamed over it)."""
    lpdata.write_atomically(Path(path), lambda f: f.write(text.encode()))


def save_checkpoint(path, model, optimizer, step: int, cfg: TrainConfig, world: int, extra: dict | None = None):
    """Model, optimizer, RNG states, step (the data position: the next step reads BatchOrder.offsets(step)),
    config — to a temporary file in the same folder, then renamed over `path`."""
    state = {"format": "lpfail.checkpoint", "version": 1, "step": int(step), "config": cfg.to_dict(),
             "world_size": world, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "rng_cpu": torch.get_rng_state(),
             "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
             **(extra or {})}
    lpdata.write_atomically(Path(path), lambda f: torch.save(state, f))
    return Path(path)


def load_checkpoint(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ck, dict) or ck.get("format") != "lpfail.checkpoint":
        raise ValueError(f"{path} is not an lpfail checkpoint")
    return ck


def checkpoint_path(out_dir, step: int) -> Path:
    return Path(out_dir) / f"ckpt_{step:07d}.pt"


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by a crash: what follows cannot be trusted
    return out


def read_log(out_dir) -> dict[str, np.ndarray]:
    """log.jsonl as arrays: step, loss, grad_norm, lr, tokens_per_s, time_s (float64; NaN where missing)."""
    return _log_arrays(_read_jsonl(Path(out_dir) / "log.jsonl"))


def _log_arrays(records: list[dict]) -> dict[str, np.ndarray]:
    keys = ("step", "loss", "grad_norm", "lr", "tokens_per_s", "time_s")
    out = {k: np.array([r.get(k, np.nan) if r.get(k) is not None else np.nan for r in records], dtype=np.float64)
           for k in keys}
    out["step"] = out["step"].astype(np.int64)
    return out


def read_val(out_dir) -> dict[str, np.ndarray]:
    """val.jsonl as arrays: step (updates done before the evaluation; 0 = at initialization) and val_loss."""
    return _val_arrays(_read_jsonl(Path(out_dir) / "val.jsonl"))


def _val_arrays(records: list[dict]) -> dict[str, np.ndarray]:
    return {"step": np.array([r["step"] for r in records], dtype=np.int64),
            "val_loss": np.array([np.nan if r["val_loss"] is None else r["val_loss"] for r in records],
                                 dtype=np.float64)}


#: The δ signature's fields of a diagnostic record (`lpfail.train.step.delta_record`), each (layers, heads).
DELTA_KEYS = ("delta_tied", "delta_all", "delta_n_tied")


def read_diag(out_dir) -> dict:
    """diag.jsonl as arrays: step (n,), spectral {weight name: (n,)}, wq and wqk (n, layers, heads),
    max_logit and tied_frac (n, layers), max_logit_per_head and tied_frac_per_head (n, layers, heads); with
    ``delta_every``, delta_tied, delta_all and delta_n_tied (n, layers, heads), NaN where not taken."""
    return _diag_arrays(_read_jsonl(Path(out_dir) / "diag.jsonl"))


def _diag_arrays(records: list[dict]) -> dict:
    if not records:
        return {"step": np.zeros(0, dtype=np.int64), "spectral": {}}
    out = {"step": np.array([r["step"] for r in records], dtype=np.int64),
           "spectral": {k: np.array([r["spectral"][k] for r in records]) for k in records[0]["spectral"]}}
    for k in ("wq", "wqk", "max_logit", "tied_frac", "max_logit_per_head", "tied_frac_per_head"):
        if k in records[0]:
            out[k] = np.array([r[k] for r in records], dtype=np.float64)
    for k in DELTA_KEYS:  # only at every delta_every-th diagnostic step: NaN at the others
        shape = next((np.shape(r[k]) for r in records if k in r), None)
        if shape is not None:
            out[k] = np.array([r[k] if k in r else np.full(shape, np.nan) for r in records], dtype=np.float64)
    return out


@dataclass
class TrainResult:
    """What a run returns (on every rank): its status, the per-step log and the diagnostics, in memory."""

    status: str  # "completed" | "nonfinite"
    steps: int  # optimizer updates done (the next step would be this one)
    config: TrainConfig
    log: list[dict] = field(default_factory=list)
    diag: list[dict] = field(default_factory=list)
    val: list[dict] = field(default_factory=list)  # {"step", "val_loss"}: with TrainConfig.val_fraction > 0
    nonfinite_step: int | None = None  # the step whose loss or gradient norm was not finite
    wall_s: float = 0.0
    world_size: int = 1
    out_dir: str = ""

    @property
    def losses(self) -> np.ndarray:
        return self.arrays()["loss"]

    @property
    def grad_norms(self) -> np.ndarray:
        return self.arrays()["grad_norm"]

    def arrays(self) -> dict[str, np.ndarray]:
        return _log_arrays(self.log)

    def diag_arrays(self) -> dict:
        return _diag_arrays(self.diag)

    def val_arrays(self) -> dict[str, np.ndarray]:
        return _val_arrays(self.val)

    def __repr__(self):
        last = f", last loss {self.log[-1]['loss']:.4f}" if self.log else ""
        nf = f" at step {self.nonfinite_step}" if self.nonfinite_step is not None else ""
        return f"<TrainResult {self.status}{nf}: {self.steps} steps{last}, {self.wall_s:.1f} s>"


def _write_status(out: Path, status, steps, cfg, nonfinite_step, wall_s, world, error: str | None = None):
    rec = {"status": status, "steps": steps, "max_steps": cfg.max_steps, "nonfinite_step": nonfinite_step,
           "wall_s": round(wall_s, 3), "world_size": world}
    if error is not None:
        rec["error"] = error
    atomic_write_text(out / "run.json", json.dumps(rec, indent=1) + "\n")


def read_status(out_dir) -> dict:
    """run.json of a run directory: status ("running", "completed", "nonfinite", "interrupted" or "failed"), steps
    (the updates done), max_steps, nonfinite_step, wall_s, world_size, and for a failed run its error's first
    line (error)."""
    return json.loads((Path(out_dir) / "run.json").read_text())


#: The statuses of a run that ended by itself: a finished run, which `check_out_dir` keeps another from overwriting.
FINISHED = ("completed", "nonfinite")


class RunExists(ValueError):
    """The out_dir holds a finished run of another config: training into it would overwrite it."""


def check_out_dir(cfg: TrainConfig, force: bool = False):
    """Raise `RunExists` where `cfg.out_dir` holds a finished run (`FINISHED`) of another config (every field but
    out_dir compared; a config.json that cannot be read counts as another), unless `force`. The same config is
    no overwrite: training it again, or continuing it from one of its checkpoints, gives the same run."""
    if force or not cfg.out_dir:
        return
    out = Path(cfg.out_dir)
    try:
        st = read_status(out)
        status = st["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no run.json (a new directory), or no run of ours
    if status not in FINISHED:
        return
    here = cfg.to_dict()
    try:
        there = TrainConfig.from_dict(json.loads((out / "config.json").read_text())["config"]).to_dict()
    except (OSError, ValueError, KeyError, TypeError):
        what = "whose config.json cannot be read"
    else:
        diff = [k for k in here if k != "out_dir" and here[k] != there.get(k)]
        if not diff:
            return
        what = ("of another config (" + "; ".join(f"{k}: {there.get(k)!r} there, {here[k]!r} here" for k in diff[:4])
                + ("; ..." if len(diff) > 4 else "") + ")")
    raise RunExists(f"{out} holds a finished run ({status}, {st.get('steps')} steps) {what}: training into it would "
                    "overwrite it. Choose another output directory, or overwrite it with --force (train(force=True))")


class RunFiles:
    """The files of a run directory that grow as the run goes: log.jsonl, diag.jsonl, val.jsonl and run.json
    (rank 0 writes them; nothing is written without an out_dir). Each record is flushed as it is written."""

    def __init__(self, out: Path | None, lead: bool, cfg: TrainConfig, world: int):
        self.out, self.lead, self.cfg, self.world = out, lead, cfg, world
        self._files = {}  # "log" | "diag" | "val" → the open file (rank 0, with an out_dir)

    @classmethod
    def open(cls, cfg: TrainConfig, dist, start: int, parent_log, header: dict):
        """(the files, (log, diag, val) records of the steps before `start`). A run that starts at `start` keeps
        the records before it: from its own directory's logs if they exist (a resume into the same directory),
        else from the directory `parent_log` that wrote its checkpoint (a branch). Writes config.json (`header`)
        and the status "running"."""
        out = Path(cfg.out_dir) if cfg.out_dir else None
        files = cls(out, dist.rank == 0, cfg, dist.world)
        prefix_log, prefix_diag, prefix_val = [], [], []
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            dist.barrier()
            if files.lead:
                src = out if (out / "log.jsonl").is_file() else Path(parent_log) if parent_log else None
                if src is not None:
                    prefix_log = [r for r in _read_jsonl(src / "log.jsonl") if r["step"] < start]
                    prefix_diag = [r for r in _read_jsonl(src / "diag.jsonl") if r["step"] < start]
                    prefix_val = [r for r in _read_jsonl(src / "val.jsonl") if r["step"] <= start]
                atomic_write_text(out / "config.json", json.dumps(header, indent=1) + "\n")
                for name, prefix in (("log", prefix_log), ("diag", prefix_diag), ("val", prefix_val)):
                    atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in prefix))
                files._files = {name: open(out / f"{name}.jsonl", "a") for name in ("log", "diag", "val")}
                files.status("running", start, None, 0.0)
        return files, (prefix_log, prefix_diag, prefix_val)

    def write(self, name: str, rec: dict):
        """Append `rec` to `name`.jsonl ("log", "diag" or "val")."""
        f = self._files.get(name)
        if f is not None:
            f.write(json.dumps(rec) + "\n")
            f.flush()

    def status(self, status: str, steps: int, nonfinite_step, wall_s: float, error: str | None = None):
        """run.json (rank 0, with an out_dir)."""
        if self.out is not None and self.lead:
            _write_status(self.out, status, steps, self.cfg, nonfinite_step, wall_s, self.world, error)

    def close(self):
        for f in self._files.values():
            f.close()
        self._files = {}
