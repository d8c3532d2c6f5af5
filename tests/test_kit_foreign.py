"""The diagnosis kit on models this project did not write (issue 26): torch.nn.TransformerEncoder (batch_first,
norm_first) and Hugging Face's Llama (grouped-query attention, RoPE) and GPT-2 (a fused Conv1D projection), built
from small random configs (no download), each with the monitor and with `substitute`, eagerly and compiled.

Compiled runs use dynamo with its "eager" backend: what made the tools wrong under torch.compile was dynamo
(guards on the monitor's Python state: a recompile per sampled step) and inductor (dropped BF16 round trips:
tests/test_kit_failures.py::test_inductor_gives_the_eager_numbers); the eager backend keeps the first and runs
the captured graphs with PyTorch's own kernels, so its numbers must be the eager ones bit for bit, in seconds
rather than the minutes inductor takes to compile three models on a CPU."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import transformers

from lpfail.monitor import Alarm, Monitor, MonitorCoverageWarning, Thresholds, find_qk, qk_norms
from lpfail.precision import FP32, PAPER_BF16
from lpfail.substitute import substitute

transformers.logging.set_verbosity_error()
QUIET = Thresholds(max_logit=None, tied_frac=None)
VOCAB, T = 64, 12


class Encoder(nn.Module):
    """nn.TransformerEncoder (batch_first, norm_first) with an embedding and a head, as a language model."""

    def __init__(self, layers=2, d=32, nhead=4):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d, nhead, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, idx):
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        return self.head(self.enc(self.emb(idx), mask=mask, is_causal=True))


def _encoder():
    torch.manual_seed(0)
    return Encoder()


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg)


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                  attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _heads_by_hand(name, model):
    """Per layer (W_Q (H, hs, C), W_K (Hkv, hs, C)) read from each model's own weight layout."""
    if name == "encoder":
        return [(m.in_proj_weight[:32].view(4, 8, 32), m.in_proj_weight[32:64].view(4, 8, 32))
                for m in (layer.self_attn for layer in model.enc.layers)]
    if name == "llama":
        return [(a.q_proj.weight.view(4, 8, 32), a.k_proj.weight.view(2, 8, 32))
                for a in (layer.self_attn for layer in model.model.layers)]
    return [(h.attn.c_attn.weight[:, :32].t().reshape(4, 8, 32), h.attn.c_attn.weight[:, 32:64].t().reshape(4, 8, 32))
            for h in model.transformer.h]  # Conv1D: (in, out)


MODELS = {"encoder": _encoder, "llama": _llama, "gpt2": _gpt2}


def _loss(model, idx):
    out = model(idx)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (2, T), generator=g) for _ in range(n)]


def _monitored_run(model, run=None, steps=4):
    """`steps` SGD steps of `run` (default: `model`) watched by a Monitor (every=2); also returns the
    compiled-graph count after each step."""
    run = model if run is None else run
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    counts = []
    with Monitor(run, every=2, window=2, thresholds=QUIET) as mon, warnings.catch_warnings():
        warnings.simplefilter("error", MonitorCoverageWarning)
        for idx in _batches(steps):
            _loss(run, idx).backward()
            opt.step()
            opt.zero_grad()
            mon.step()
            counts.append(_graphs())
    return mon, counts


def _graphs():
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def _reset_dynamo():
    import importlib
    importlib.import_module("torch._dynamo").reset()


@pytest.mark.parametrize("name", list(MODELS))
def test_monitor(name):
    model = MODELS[name]()
    qk = find_qk(model)
    assert len(qk) == 2 and all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in
                                zip((src.get() for src in qk), _heads_by_hand(name, model)))
    mon, _ = _monitored_run(model, steps=3)     # records at steps 0 and 2 (the last update)
    rec = mon.records[-1]
    assert np.shape(rec["max_logit"]) == (2, 4) and "warning" not in rec and rec["update_window"] == [0, 2]
    assert np.isfinite(rec["max_logit"]).all() and np.isfinite(rec["update_entropy"]).all()
    now = [qk_norms(*(w.detach() for w in pair)) for pair in _heads_by_hand(name, model)]
    assert np.allclose(rec["wq"], [f[0] for f in now]) and np.allclose(rec["wqk"], [f[1] for f in now])


@pytest.mark.parametrize("name", list(MODELS))
def test_substitute(name):
    model = MODELS[name]()
    idx = _batches(1)[0]
    with torch.no_grad():
        plain = _loss(model, idx)
        with substitute(model, FP32) as rec:
            fp32 = _loss(model, idx)
    assert rec.calls == 2 and rec.substituted == 2 and rec.foreign == 0
    assert abs(fp32 - plain) < 1e-5
    with substitute(model, PAPER_BF16, layers=[1]):
        bf16 = _loss(model, idx)
        bf16.backward()                        # the reference's own backward
    assert bf16 != plain and all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_compiled(name):
    # the compiled model's records and substitutions are the eager ones, bit for bit, and neither the
    # monitor's sampled steps nor substitute blocks compile anything after the model's first unsampled step
    eager_mon, _ = _monitored_run(MODELS[name](), None, steps=4)
    _reset_dynamo()
    model = MODELS[name]()
    compiled = torch.compile(model, backend="eager")
    mon, counts = _monitored_run(model, compiled, steps=4)
    assert counts[1] > 0, "the compiled model was not compiled"
    for r, c in zip(eager_mon.records, mon.records, strict=True):
        assert all(r[k] == c[k] for k in ("max_logit", "tied_frac", "wq", "wqk")), r["step"]
    idx = _batches(1)[0]
    with torch.no_grad():
        with substitute(model, PAPER_BF16, layers=[1]):
            eager_bf16 = _loss(model, idx)
        for _ in range(2):
            with substitute(compiled, PAPER_BF16, layers=[1]):
                again = _loss(compiled, idx)
            assert torch.equal(again, eager_bf16)
    assert torch.equal(_loss(compiled, idx), _loss(model, idx))   # with grad: the training graph, reused
    assert _graphs() == counts[1], f"graphs after each monitored step {counts}, now {_graphs()}"


def test_alarm_on_llama():
    # RoPE between q_proj and SDPA, grouped-query attention: the errors reach W_Q and W_K through the model's own
    # graph; an FP32 model's attention against the FP64 truth is exact to FP32 rounding
    model = _llama()
    with Monitor(model, every=1, window=1, sample_batch=2, thresholds=QUIET, alarm=Alarm()) as mon:
        for idx in _batches(2):
            _loss(model, idx).backward()
            rec = mon.step()
    assert np.shape(rec["alarm_dq_rel"]) == (2, 4) and np.shape(rec["alarm_dk_rel"]) == (2, 2)
    assert np.max(rec["alarm_dq_rel"]) < 1e-5 and rec["alarm_terms"] == [2, 2]
    assert all(0 <= c <= 1 + 1e-12 for row in rec["alarm_coherence_q"] for c in row)
