"""Issue 26's list of failures of the diagnosis kit (lpfail.monitor, lpfail.substitute), one test each: every
test here failed on the code before the fix (see the commit message of that change)."""
import json
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from lpfail.monitor import (Monitor, MonitorCoverageWarning, MonitorError, MonitorWarning, Thresholds,
                            attention_logit_stats, describe_qk, find_qk, qk_norms, read_jsonl, scalars)
from lpfail.precision import FP32, PAPER_BF16
from lpfail.sdpa_hook import parse_call
from lpfail.substitute import SubstitutionError, substitute
from tests.test_monitor import PackedSDPA, Toy, _gpt

QUIET = Thresholds(max_logit=None, tied_frac=None)


def _encoder(seed=0, layers=2, d=16, nhead=2):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d, nhead, 32, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


# -- 1. SDPA inside nn.MultiheadAttention / nn.TransformerEncoder ----------------------------------------------
def test_monitor_sees_the_attention_of_a_transformer_encoder():
    enc = _encoder()
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1)) * 4
    with Monitor(enc, every=1, window=1, sample_batch=3, thresholds=QUIET) as mon, warnings.catch_warnings():
        warnings.simplefilter("error", MonitorCoverageWarning)
        enc(x).sum().backward()
        rec = mon.step()
    assert np.shape(rec["max_logit"]) == (2, 2) and np.shape(rec["wq"]) == (2, 2)
    # layer 0's logits by hand: pre-norm input, in_proj's q and k rows, 2 heads of 8, α = 1/√8
    lay = enc.layers[0]
    h = lay.norm1(x)
    w, b = lay.self_attn.in_proj_weight, lay.self_attn.in_proj_bias
    q, k = (F.linear(h, w[i * 16:(i + 1) * 16], b[i * 16:(i + 1) * 16]).view(3, 7, 2, 8).transpose(1, 2)
            for i in (0, 1))
    mx, _, _ = attention_logit_stats(parse_call(0, (q.detach(), k.detach(), k.detach()), {}), sample_batch=3)
    np.testing.assert_allclose(rec["max_logit"][0], mx, rtol=1e-6)


def test_substitute_reaches_the_attention_of_a_transformer_encoder():
    enc = _encoder()
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = enc(x)
        with substitute(enc, FP32) as rec:
            fp32 = enc(x)
        with substitute(enc, PAPER_BF16, layers=[1]):
            bf16 = enc(x)
    assert rec.calls == 2 and rec.substituted == 2
    torch.testing.assert_close(fp32, plain, rtol=1e-5, atol=1e-5)
    assert (bf16 - plain).abs().max() > 1e-4


class DirectMHA(nn.Module):
    """nn.MultiheadAttention called with its default need_weights=True: its attention is not SDPA."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0]


def test_weights_without_attention_calls_warn_once_and_say_why():
    model = DirectMHA()
    with Monitor(model, every=1, window=1, thresholds=QUIET) as mon:
        with pytest.warns(MonitorCoverageWarning, match="need_weights=True"):
            model(torch.randn(2, 5, 16))
            rec = mon.step()
        assert "wq" in rec and "max_logit" not in rec and "need_weights" in rec["warning"]
        with warnings.catch_warnings():
            warnings.simplefilter("error", MonitorCoverageWarning)   # once only
            model(torch.randn(2, 5, 16))
            mon.step()


# -- 2. torch.compile ------------------------------------------------------------------------------------------
def _graphs():
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def _reset_dynamo():
    import importlib
    importlib.import_module("torch._dynamo").reset()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_compiled_model_is_not_recompiled_per_sampled_step(how):
    _reset_dynamo()
    torch.manual_seed(0)
    model = Toy(PackedSDPA)
    run = torch.compile(model, backend="aot_eager") if how == "torch.compile(model)" else model
    if how == "model.compile()":
        model.compile(backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    counts = []
    with Monitor(run, every=2, window=2, thresholds=QUIET) as mon:
        for s in range(6):
            run(idx, idx).backward()
            opt.step()
            opt.zero_grad()
            mon.step()
            counts.append(_graphs())
    assert counts[2] == counts[-1], counts       # steps 3..5 (one sampled) compiled nothing new
    assert len(mon.records) == 3 and all(len(r["max_logit"]) == 2 for r in mon.records)


class Tied(nn.Module):
    """SDPA on x @ w with repeated tokens and large weights: BF16 ties in every head (no position embedding)."""

    def __init__(self, c=16, vocab=8):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, c)
        self.w = nn.Parameter(torch.randn(c, 3 * c) * 2.0)

    def forward(self, idx):
        B, T = idx.shape
        q, k, v = (self.emb(idx) @ self.w).split(16, dim=-1)
        q, k, v = (t.view(B, T, 2, 8).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().mean()


@pytest.mark.slow
def test_inductor_gives_the_eager_numbers():
    # inductor drops the BF16 round trips of code it compiles (unless emulate_precision_casts): the
    # statistics and the reference run eagerly at a graph break, so they are the eager ones, bit for bit
    # (forwards only, to keep the compile short)
    _reset_dynamo()
    idx = torch.randint(0, 8, (2, 16), generator=torch.Generator().manual_seed(3))
    model = Tied()
    compiled = torch.compile(model)

    def watch(m):
        with Monitor(m, every=1, window=1, sample_batch=2, thresholds=QUIET) as mon, torch.no_grad():
            loss = m(idx)
            mon.step()
        return loss.item(), mon.records[-1]
    (le, re_), (lc, rc) = watch(model), watch(compiled)
    assert np.max(re_["tied_frac"]) > 0 and rc["tied_frac"] == re_["tied_frac"]
    assert rc["max_logit"] == re_["max_logit"] and lc == le
    with torch.no_grad():
        with substitute(model, PAPER_BF16):
            eager_bf16 = model(idx)
        with substitute(compiled, PAPER_BF16):
            compiled_bf16 = compiled(idx)
    assert torch.equal(eager_bf16, compiled_bf16) and eager_bf16 != model(idx)


# -- 3. grouped-query attention without a key/value-head attribute -------------------------------------------
class GQAttention(nn.Module):
    """4 query heads, 2 key/value heads of 8, and no attribute that says 2."""

    def __init__(self, kv_out=16):
        super().__init__()
        self.num_heads = 4
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(32, 32), nn.Linear(32, kv_out), nn.Linear(32, kv_out)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, 4, 8).transpose(1, 2)
        k, v = (p(x).view(B, T, -1, 8).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(B, T, 32)


def test_grouped_query_heads_are_inferred_and_checked_when_built():
    torch.manual_seed(0)
    model = nn.Sequential(GQAttention(), GQAttention())
    with Monitor(model, every=1, window=1, thresholds=QUIET) as mon:
        model(torch.randn(2, 6, 32))
        rec = mon.step()
    wq, wk = mon.qk[0].get()
    assert wq.shape == (4, 8, 32) and wk.shape == (2, 8, 32)
    n_q, n_qk = qk_norms(wq, wk)
    assert np.allclose(rec["wqk"][0], n_qk) and np.shape(rec["max_logit"]) == (2, 4)
    with pytest.raises(MonitorError, match="0: .*key projection has 12 output features"):
        Monitor(nn.Sequential(GQAttention(kv_out=12)))


# -- 4. activation checkpointing -------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, ckpt):
        super().__init__()
        self.attn, self.ckpt = PackedSDPA(), ckpt

    def forward(self, x):
        if self.ckpt is None:
            return x + self.attn(x)
        return x + checkpoint(self.attn, x, use_reentrant=self.ckpt)


class Stack(nn.Module):
    def __init__(self, ckpt, n=3):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(Block(ckpt) for _ in range(n))

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_substitute_under_activation_checkpointing(reentrant):
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))

    def grads(ckpt):
        model = Stack(ckpt)
        with substitute(model, PAPER_BF16, layers=[1]) as rec:
            model(idx).backward()
        return [p.grad for p in model.parameters()], rec
    plain, _ = grads(None)
    ck, rec = grads(reentrant)
    assert rec.substituted == 1 and rec.recomputed == 1
    assert all(torch.equal(a, b) for a, b in zip(plain, ck))  # the recomputation ran the same reference


def test_a_recomputed_call_that_cannot_be_told_is_refused():
    class Twice(PackedSDPA):
        def forward(self, x):
            return super().forward(x) + super().forward(x)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Twice()

        def forward(self, x):
            return checkpoint(self.a, x, use_reentrant=False).sum()
    m = M()
    with pytest.raises(SubstitutionError, match="recomputed during the backward.*several"):
        with substitute(m, PAPER_BF16):
            m(torch.randn(2, 5, 16)).backward()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_monitor_under_activation_checkpointing(reentrant):
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))

    def run(ckpt):
        model = Stack(ckpt)
        with Monitor(model, every=1, window=1, thresholds=QUIET) as mon:
            loss = model(idx)
            loss.backward()
            mon.step()
        return loss.item(), mon.records[-1]
    (lp, rp), (lc, rc) = run(None), run(reentrant)
    assert lp == lc and rc["max_logit"] == rp["max_logit"] and len(rc["max_logit"]) == 3


# -- 5. smaller ones ---------------------------------------------------------------------------------------------
class ThreeD(nn.Module):
    """Single-head attention on (B, T, C) tensors: SDPA's 3-D form."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Linear(16, 48, bias=False)

    def forward(self, x):
        q, k, v = self.w(x).split(16, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_three_dimensional_inputs():
    model = ThreeD()
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(0)) * 3
    with Monitor(model, every=1, window=1, sample_batch=3, thresholds=QUIET) as mon:
        plain = model(x)
        rec = mon.step()
    q, k, _ = model.w(x).detach().split(16, dim=-1)
    mx, _, rows = attention_logit_stats(parse_call(0, (q[:, None], k[:, None], k[:, None]), {"is_causal": True}),
                                        sample_batch=3)
    assert rec["max_logit"] == [mx.tolist()] and rec["rows"] == [rows] == [18]
    with torch.no_grad(), substitute(model, FP32):
        sub = model(x)
    assert sub.shape == plain.shape
    torch.testing.assert_close(sub, plain, rtol=1e-5, atol=1e-6)


class FusedByName(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_heads = 2
        self.qkv = nn.Linear(16, 48)


class FusedByShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_head = 2
        self.mix = nn.Linear(16, 48, bias=False)
        self.out = nn.Linear(16, 16)


class MysteryAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)


def test_projections_found_by_name_and_by_shape_with_a_report():
    model = nn.ModuleDict({"x": FusedByName(), "y": FusedByShape(), "z": MysteryAttention()})
    found = find_qk(model)
    assert [f.name for f in found] == ["x", "y"]
    wq, wk = found[1].get()
    assert torch.equal(wq.reshape(16, 16), model["y"].mix.weight[:16]) and torch.equal(
        wk.reshape(16, 16), model["y"].mix.weight[16:32])
    text = describe_qk(model, found)
    assert "x: qkv (fused q | k | v, by name), 2 heads × 8" in text
    assert "y: mix (fused q | k | v, found by its shape)" in text
    assert "not recognised" in text and "z (MysteryAttention)" in text
    assert Monitor(model).found == text


def _strict_loads(line):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(line, parse_constant=refuse)


def test_jsonl_is_strict_json_with_a_header(tmp_path):
    model = _gpt()
    path = tmp_path / "run.jsonl"
    with Monitor(model, every=1, window=1, path=path, thresholds=QUIET) as mon:
        for _ in range(2):           # no optimizer step: ΔW = 0, so the update entropy is NaN
            model(torch.zeros(0, 4, dtype=torch.long))      # an empty batch: the max logit is −∞
            mon.step(loss=math.inf)
    lines = path.read_text().splitlines()
    parsed = [_strict_loads(line) for line in lines]            # raises on NaN / Infinity tokens
    head = parsed[0]
    assert head["kind"] == "header" and head["versions"]["torch"] == torch.__version__
    assert head["settings"]["every"] == 1 and head["model"]["class"] == "lpfail.model.GPT"
    assert head["model"]["qk_layers"] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert parsed[2]["loss"] == "Infinity" and "NaN" in parsed[2]["update_entropy"][0]
    assert parsed[2]["max_logit"][0][0] == "-Infinity"
    back = read_jsonl(path)                                    # read back as floats
    assert back[2]["loss"] == math.inf and math.isnan(back[2]["update_entropy"][0][0])


def test_an_extra_step_argument_is_refused():
    model = Toy(PackedSDPA)
    with Monitor(model, every=1, window=1, thresholds=QUIET) as mon:
        model(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
        with pytest.raises(ValueError, match="'step'.*global_step"):
            mon.step(step=1000)
        with pytest.raises(ValueError, match="'max_logit'"):
            mon.step(max_logit=3.0)


def test_substitute_is_confined_to_its_model():
    ours, other = Toy(PackedSDPA), Toy(PackedSDPA)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = other(idx, idx)
        with substitute(ours, PAPER_BF16) as rec:
            ours(idx, idx)
            inside = other(idx, idx)
    assert torch.equal(inside, plain) and rec.foreign == 2 and rec.substituted == 2


def test_flat_scalars_for_loggers():
    model = _gpt()
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with Monitor(model, every=1, window=1, thresholds=QUIET) as mon, warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        assert mon.scalars() == {}
        model(idx, idx)[1].backward()
        rec = mon.step(loss=1.5)
    flat = mon.scalars()
    assert flat["loss"] == 1.5 and flat["attn/layer1/max_logit"] == max(rec["max_logit"][1])
    assert flat["attn/layer0/wq"] == max(rec["wq"][0]) and all(isinstance(v, float) for v in flat.values())
    assert {k.split("/")[-1] for k in flat if k.startswith("attn/")} == {"max_logit", "tied_frac", "wq", "wqk"}
    per_head = mon.scalars(heads=True)
    assert per_head["attn/layer1/head0/tied_frac"] == rec["tied_frac"][1][0]
    assert scalars(rec) == flat       # the same from a record alone (e.g. one read back with read_jsonl)
