"""What a run reads: the corpus' tokens (`load_tokens`), the held-out part and its windows (`split_validation`,
`validation_offsets`), a step's rows (`step_rows`), the batch order a run follows (`batch_order`: drawn from the
data seed, or a recorded one replayed), and the record of the order each rank consumed (`BatchRecord`, read back
by `load_batch_record`). Part of `lpfail.train`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from lpfail import data as lpdata
from lpfail.train.config import TrainConfig
from lpfail.train.log import atomic_write_text


def load_tokens(cfg: TrainConfig) -> tuple[np.ndarray, str, int]:
    """(token ids, a description, the tokenizer's vocabulary size) for `cfg.data`."""
    if cfg.data in lpdata.CORPORA:
        tok = lpdata.get_tokenizer(cfg.tokenizer)
        return lpdata.tokens(cfg.data, tok), f"{cfg.data} ({cfg.tokenizer})", tok.n_vocab
    if cfg.data == "openwebtext":
        path = Path(cfg.data_dir) / "train.bin"
        if not path.is_file():
            raise FileNotFoundError(
                f"OpenWebText is not prepared: no {path}. Prepare it once, with network access (≈ 54 GB of "
                f"download, 17 GB of tokens): `python -m lpfail train --prepare-data --set data=openwebtext --set data_dir="
                f"{cfg.data_dir}` or lpfail.data.openwebtext_bins({str(cfg.data_dir)!r})")
        return lpdata.load_bin(path), f"openwebtext ({path})", 50257
    path = Path(cfg.data)
    if path.suffix == ".bin":
        return lpdata.load_bin(path), str(path), 50257
    raise ValueError(f"TrainConfig.data: unknown data {cfg.data!r}; use an embedded corpus "
                     f"{list(lpdata.CORPORA)}, 'openwebtext', or a path to a nanoGPT .bin token file")


def split_validation(tokens: np.ndarray, cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """(training tokens, held-out tokens or None): the corpus' last ``val_fraction`` is never trained on."""
    if cfg.val_fraction <= 0:
        return tokens, None
    n_val = int(len(tokens) * cfg.val_fraction)
    if n_val < cfg.block_size + 1 or len(tokens) - n_val < cfg.block_size + 1:
        raise ValueError(f"TrainConfig.val_fraction={cfg.val_fraction} leaves {n_val} held-out and "
                         f"{len(tokens) - n_val} training tokens; each part needs block_size + 1 = "
                         f"{cfg.block_size + 1}")
    return tokens[:-n_val], tokens[-n_val:]


def validation_offsets(n_val: int, cfg: TrainConfig) -> np.ndarray:
    """The ``val_rows`` start offsets of the validation windows: evenly spaced over the held-out tokens, the
    same for every run on the same corpus and context length."""
    return np.linspace(0, n_val - cfg.block_size - 1, cfg.val_rows).round().astype(np.int64)


def step_rows(tokens, offsets, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs and targets, (b, T) int64 each, of the windows of T + 1 tokens starting at `offsets`."""
    rows = np.stack([np.asarray(tokens[o:o + T + 1], dtype=np.int64) for o in offsets])  # (b, T+1)
    xy = torch.from_numpy(rows)
    return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()  # (b, T) each


class BatchRecord:
    """Writes, per rank, the start offsets that rank consumed at each step: int64 rows [step, offsets...]."""

    def __init__(self, out_dir: Path, rank: int, world: int, cfg: TrainConfig, n_tokens: int, source: str):
        self.path = out_dir / f"batches_rank{rank}.i64"
        self.width = 1 + cfg.batch_size // world
        self.meta = {"format": "lpfail.batches", "version": 1, "world_size": world, "batch_size": cfg.batch_size,
                     "rows_per_rank": cfg.batch_size // world, "block_size": cfg.block_size, "n_tokens": n_tokens,
                     "data": cfg.data, "tokenizer": cfg.tokenizer, "source": source}
        self.rank = rank
        self.f = None

    def open(self, start: int, order: lpdata.BatchOrder, local: slice):
        """Keep steps [0, start) (rewritten from `order` if the file does not already hold them)."""
        if self.rank == 0:
            atomic_write_text(self.path.parent / "batches.json", json.dumps(self.meta, indent=1) + "\n")
        have = -1
        if self.path.is_file() and self.path.stat().st_size % (8 * self.width) == 0:
            old = np.fromfile(self.path, dtype=np.int64).reshape(-1, self.width)
            have = int(np.sum(old[:, 0] == np.arange(len(old)))) if len(old) else 0
        if have >= start:
            self.f = open(self.path, "r+b")
            self.f.truncate(start * 8 * self.width)
            self.f.seek(0, os.SEEK_END)
        else:
            self.f = open(self.path, "wb")
            for s in range(start):
                self.write(s, order.offsets(s)[local], flush=False)
            self.f.flush()

    def write(self, step: int, offsets: np.ndarray, flush: bool = True):
        self.f.write(np.concatenate([[step], offsets]).astype("<i8").tobytes())
        if flush:
            self.f.flush()

    def close(self):
        if self.f is not None:
            self.f.close()
            self.f = None


def load_batch_record(path) -> lpdata.BatchOrder:
    """The global batch order a run consumed, from its directory (or its batches.json), or a BatchOrder
    file (.npz / .json): the ranks' offsets side by side, for the steps every rank recorded."""
    path = Path(path)
    if path.suffix in (".npz",) or (path.suffix == ".json" and path.name != "batches.json"):
        return lpdata.BatchOrder.load(path)
    run_dir = path.parent if path.name == "batches.json" else path
    meta_path = run_dir / "batches.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no recorded batch order in {run_dir} (no batches.json): pass a run's out_dir "
                                "or a BatchOrder .npz/.json file")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != "lpfail.batches":
        raise ValueError(f"{meta_path} is not a batch record (format {meta.get('format')!r})")
    parts = []
    for r in range(meta["world_size"]):
        f = run_dir / f"batches_rank{r}.i64"
        arr = np.fromfile(f, dtype=np.int64)
        width = 1 + meta["rows_per_rank"]
        arr = arr[:len(arr) // width * width].reshape(-1, width)
        n = int(np.sum(arr[:, 0] == np.arange(len(arr))))  # steps recorded in order from 0
        parts.append(arr[:n, 1:])
    n = min(len(p) for p in parts)
    if n == 0:
        raise ValueError(f"the batch record in {run_dir} holds no complete step")
    offsets = np.concatenate([p[:n] for p in parts], axis=1)  # (n, batch_size), rank order = row order
    order = lpdata.BatchOrder.from_offsets(offsets, meta["block_size"], meta["n_tokens"])
    order.recorded_from = {k: meta[k] for k in ("data", "tokenizer", "n_tokens")}
    return order


def batch_order(cfg: TrainConfig, replay, n_tokens: int) -> tuple[lpdata.BatchOrder, str]:
    """(the global batch order of the run, where it comes from): `replay`'s recorded order, checked against the
    data and the batch shape, or the order drawn from ``cfg.data_seed`` over the `n_tokens` training tokens."""
    if replay is not None:
        order = load_batch_record(replay)
        rec = getattr(order, "recorded_from", None)
        if rec is not None and (rec["data"], rec["tokenizer"], rec["n_tokens"]) != (cfg.data, cfg.tokenizer,
                                                                                   n_tokens):
            raise ValueError(f"the recorded order in {replay} was drawn from {rec}, not from data={cfg.data!r}, "
                             f"tokenizer={cfg.tokenizer!r} ({n_tokens} tokens)")
        if order.batch_size != cfg.batch_size or order.block_size != cfg.block_size:
            raise ValueError(f"the recorded order has batch_size {order.batch_size}, block_size "
                             f"{order.block_size}; TrainConfig has {cfg.batch_size}, {cfg.block_size}")
        if order.n_steps < cfg.max_steps:
            raise ValueError(f"TrainConfig.max_steps ({cfg.max_steps}) exceeds the {order.n_steps} recorded steps "
                             f"of {replay}")
        source = f"replay of {replay}"
    else:
        order = lpdata.BatchOrder(n_tokens, cfg.block_size, cfg.batch_size, cfg.data_seed)
        source = f"seed {cfg.data_seed}"
    return order, source
