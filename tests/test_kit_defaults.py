"""Defaults of the diagnosis kit that a user can leave on: no alert at step 0 of a freshly initialised model, one
message per alert, a warning whenever Q/K projections are not found, and `substitute` choosing layers by module,
consistently across repeated forwards."""
import functools
import inspect
import io
import logging
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

from lpfail import data as lpdata
from lpfail.model import GPT, GPTConfig
from lpfail.monitor import Monitor, MonitorCoverageWarning, MonitorWarning, Thresholds
from lpfail.precision import PAPER_BF16
from lpfail.substitute import substitute

transformers.logging.set_verbosity_error()


# -- no alert at step 0 of a fresh model ----------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _pydocs_ids():
    return np.asarray(lpdata.tokens("pydocs", lpdata.get_tokenizer("bytes")), dtype=np.int64)


def _pydocs(t, seed):
    ids = _pydocs_ids()
    start = int(np.random.default_rng(seed).integers(0, len(ids) - t))
    return torch.from_numpy(ids[start:start + t])[None]


FRESH = {
    "lpfail GPT 4 x 4 x 256, bytes": (lambda: GPT(GPTConfig(block_size=256, vocab_size=256, n_layer=4, n_head=4,
                                                            n_embd=256)), lambda s: _pydocs(256, s)),
    "HF GPT-2 4 x 4 x 128": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=1000, n_positions=256, n_embd=128, n_layer=4, n_head=4, attn_implementation="sdpa")),
        lambda s: torch.randint(0, 1000, (1, 256), generator=torch.Generator().manual_seed(s))),
    "HF Llama 4 x 8 x 128, 4 key/value heads": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, attn_implementation="sdpa")),
        lambda s: torch.randint(0, 1000, (1, 256), generator=torch.Generator().manual_seed(s))),
}


@pytest.mark.parametrize("name", list(FRESH))
def test_a_fresh_model_does_not_alert_at_step_0(name):
    make, batch = FRESH[name]
    for seed in range(2):
        torch.manual_seed(seed)
        model = make()
        with Monitor(model) as mon, torch.no_grad():          # the defaults: every=100, Thresholds()
            model(batch(seed))
            rec = mon.step()
        print(name, seed, "largest tied fraction of a head:", np.max(rec["tied_frac"]))
        assert np.max(rec["tied_frac"]) > 0                   # ties happen at initialisation; they are not alerts
        assert mon.alerts == [], [a.message() for a in mon.alerts]


# -- one message per alert ------------------------------------------------------------------------------------
def _gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16))


def _alerting_run():
    """Three steps with a threshold every head crosses: 4 alerts (2 layers × 2 heads, once each). Returns the
    monitor and the MonitorWarnings issued."""
    model = _gpt()
    idx = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with Monitor(model, every=1, window=1, thresholds=Thresholds(max_logit=-1e9, tied_frac=None)) as mon:
            for _ in range(3):
                model(idx)
                mon.step()
    return mon, [w for w in warned if issubclass(w.category, MonitorWarning)]


def test_with_logging_configured_each_alert_is_one_log_line():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("lpfail")
    logger.addHandler(handler)
    try:
        mon, warned = _alerting_run()
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(mon.alerts) == 4
    assert len(lines) + len(warned) == 4 and len(lines) == 4, (lines, [str(w.message) for w in warned])


def test_without_logging_each_alert_is_one_warning(monkeypatch):
    monkeypatch.setattr(logging.root, "handlers", [])          # as in a script that never configured logging
    mon, warned = _alerting_run()
    assert len(mon.alerts) == 4 and len(warned) == 4 and "max_logit of layer 0 head 0" in str(warned[0].message)


# -- a warning whenever Q/K projections are not found ---------------------------------------------------------
class FusedNoHeads(nn.Module):
    """A fused q | k | v projection named ``qkv`` and no attribute that gives the head count (2 heads of 8)."""

    def __init__(self, c=16):
        super().__init__()
        self.qkv = nn.Linear(c, 3 * c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 2, 8).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)


class Stack(nn.Module):
    def __init__(self, make=FusedNoHeads, layers=2):
        super().__init__()
        self.blocks = nn.ModuleList(make() for _ in range(layers))

    def forward(self, x, skip=None):
        for i, block in enumerate(self.blocks):
            if i != skip:
                x = x + block(x)
        return x


class TopLevelCAttn(FusedNoHeads):
    """The model itself holds the fused projection, as ``c_attn``, and no head count."""

    def __init__(self, c=16):
        super().__init__(c)
        self.c_attn = self.qkv
        del self.qkv

    def forward(self, x):
        self.qkv = self.c_attn
        return super().forward(x)


class PackedOnly(nn.Module):
    """SDPA on slices of one parameter: no module that looks like a projection."""

    def __init__(self, c=16):
        super().__init__()
        self.w = nn.Parameter(torch.randn(c, 3 * c) * 0.3)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 2, 8).transpose(1, 2) for t in (x @ self.w).split(C, -1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)


QUIET = Thresholds(max_logit=None, tied_frac=None)


@pytest.mark.parametrize("make, where, layers", [(Stack, "blocks.0 (FusedNoHeads: qkv", 2),
                                                 (TopLevelCAttn, "(the model) (TopLevelCAttn: c_attn", 1)])
def test_a_projection_without_a_head_count_warns_when_the_monitor_is_built(make, where, layers):
    model = make()
    with pytest.warns(MonitorCoverageWarning, match="no head count") as got:
        mon = Monitor(model, every=1, window=1, thresholds=QUIET)
    assert where in str(got[0].message) and "n_head=" in str(got[0].message)
    with mon, warnings.catch_warnings():
        warnings.simplefilter("error", MonitorCoverageWarning)  # once: not again at the first step
        model(torch.randn(2, 5, 16))
        rec = mon.step()
    assert "max_logit" in rec and "wq" not in rec
    with warnings.catch_warnings():                           # told the head count, it finds them: no warning
        warnings.simplefilter("error", MonitorCoverageWarning)
        assert len(Monitor(make(), n_head=2).qk) == layers


def test_attention_calls_without_any_projection_warn_at_the_first_step():
    model = Stack(PackedOnly)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MonitorCoverageWarning)   # nothing looks like a projection: silent so far
        mon = Monitor(model, every=1, window=1, thresholds=QUIET)
    with mon:
        model(torch.randn(2, 5, 16))
        with pytest.warns(MonitorCoverageWarning, match="2 attention calls were seen but no Q/K projections"):
            mon.step()


# -- substitute: by module, across repeated forwards -----------------------------------------------------------
def _gpt3():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=3, n_head=4, n_embd=32))


def test_model_forward_called_twice_substitutes_the_same_layer_twice():
    model = _gpt3()
    idx = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    signature = inspect.signature(model.forward)
    with torch.no_grad():
        with substitute(model, PAPER_BF16, layers=[2]) as rec:
            assert inspect.signature(model.forward) == signature   # what Hugging Face's generate inspects
            first, second = model.forward(idx)[0], model.forward(idx)[0]
            called = model(idx)[0]
        plain = model(idx)[0]
    assert rec.calls == 9 and rec.substituted == 3 and rec.calls_per_forward == {3}
    assert torch.equal(first, second) and torch.equal(first, called) and not torch.equal(first, plain)
    assert "forward" not in model.__dict__                     # the block leaves the model as it found it


def test_a_forward_that_skips_a_layer_substitutes_the_same_module():
    torch.manual_seed(0)
    model = Stack(PackedOnly, layers=4)
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(2)) * 3
    with torch.no_grad():
        with substitute(model.blocks[2], PAPER_BF16):           # block 2 alone, whatever its position
            expected = model(x, skip=1)
        with substitute(model, PAPER_BF16, layers=[2]) as rec:
            model(x)                                           # the first forward: block 2 makes call 2
            skipped = model(x, skip=1)                         # here block 2 makes call 1 (LayerDrop)
        plain = model(x, skip=1)
    assert rec.substituted == 2 and torch.equal(skipped, expected) and not torch.equal(skipped, plain)
