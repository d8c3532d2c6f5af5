"""lpfail.monitor: attaches without code changes, never changes the numbers, agrees with the model's own
diagnostics, alerts at thresholds, fails loudly when it finds nothing."""
import json
import logging
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lpfail.model import GPT, GPTConfig, capture_attention_logits, head_query_norms
from lpfail.monitor import (Monitor, MonitorError, MonitorWarning, Thresholds, attention_logit_stats,
                            find_qk, read_jsonl, spectral_entropy)
from lpfail.sdpa_hook import parse_call


class ProjAttention(nn.Module):
    """Llama-style names, explicit softmax (no SDPA): only the projections can be monitored."""

    def __init__(self, c=16, h=2):
        super().__init__()
        self.num_heads = h
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(c, c, bias=False) for _ in range(3))

    def forward(self, x):
        B, T, C = x.shape
        h = self.num_heads
        q, k, v = (p(x).view(B, T, h, C // h).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(C // h)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


class PackedSDPA(nn.Module):
    """Calls SDPA directly from a packed parameter: no recognisable projections, only the call."""

    def __init__(self, c=16, h=2):
        super().__init__()
        self.w = nn.Parameter(torch.randn(c, 3 * c) * 0.3)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        from torch.nn.functional import scaled_dot_product_attention as sdpa  # imported name: still seen
        q, k, v = (x @ self.w).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        return sdpa(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)


class Toy(nn.Module):
    def __init__(self, attn_cls, layers=2, c=16, vocab=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList(attn_cls(c) for _ in range(layers))
        self.head = nn.Linear(c, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for layer in self.layers:
            x = x + layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _train(model, steps, monitor=None, lr=1e-2, seed=0):
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, 32, (2, 12), generator=g)
        loss = model(idx, torch.roll(idx, -1, 1))
        loss = loss[1] if isinstance(loss, tuple) else loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if monitor is not None:
            monitor.step(loss=loss.item())
    return losses


def _gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16))


@pytest.mark.parametrize("make", [lambda: Toy(ProjAttention), lambda: Toy(PackedSDPA), _gpt],
                         ids=["projections", "sdpa-direct", "lpfail-gpt"])
def test_losses_bit_identical_with_and_without_monitor(make, tmp_path):
    torch.manual_seed(0)
    plain = make()
    torch.manual_seed(0)
    watched = make()
    base = _train(plain, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        with Monitor(watched, every=1, window=2, path=tmp_path / "m.jsonl") as mon:
            seen = _train(watched, 6, mon)
    assert base == seen  # exact equality of every loss
    for p, q in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(p, q)
    assert len(mon.records) == 6


def test_what_each_model_exposes(tmp_path):
    for make, logits, weights in [(lambda: Toy(ProjAttention), False, True),
                                  (lambda: Toy(PackedSDPA), True, False), (_gpt, True, True)]:
        torch.manual_seed(0)
        model = make()
        with Monitor(model, every=2, window=4) as mon, warnings.catch_warnings():
            warnings.simplefilter("ignore", MonitorWarning)  # the toy's repeated tokens tie at init
            _train(model, 5, mon)
        steps = [r["step"] for r in mon.records]
        assert steps == [0, 2, 4]
        rec = mon.records[-1]
        assert ("max_logit" in rec) == logits and ("wq" in rec) == weights
        if logits:
            assert np.shape(rec["max_logit"]) == (2, 2) and np.shape(rec["tied_frac"]) == (2, 2)
        if weights:
            assert np.shape(rec["wqk"]) == (2, 2)
            assert np.shape(rec["update_entropy"]) == (2, 2)  # window 4: ΔW between steps 0 and 4
            assert rec["update_window"] == [0, 4]


def test_agrees_with_the_models_own_diagnostics():
    model = _gpt(3)
    with torch.no_grad():  # large logits, so that BF16 ties happen
        for b in model.transformer.h:
            b.attn.c_attn.weight[:32] *= 12
    idx = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(1))
    ref = capture_attention_logits(model, idx)
    norms = head_query_norms(model)
    with Monitor(model, every=1, sample_batch=3, thresholds=Thresholds(None, None)) as mon:
        with torch.no_grad():
            model(idx)
        rec = mon.step()
    # the model reports the maximum in BF16, the monitor in FP32: equal up to one BF16 rounding
    np.testing.assert_allclose(rec["max_logit"], ref.max_logit_per_head, rtol=2 ** -8)
    np.testing.assert_allclose(rec["tied_frac"], ref.tied_frac_per_head)
    assert ref.tied_frac_per_head.max() > 0  # the comparison covers ties
    np.testing.assert_allclose(rec["wq"], norms["wq"], rtol=1e-5)
    np.testing.assert_allclose(rec["wqk"], norms["wqk"], rtol=1e-4)


def test_logit_stats_on_planted_ties():
    # head 0: keys 0 and 1 equal -> every row from 1 on has a tie; head 1: distinct keys
    q = torch.zeros(1, 2, 4, 4)
    q[..., 0] = 1.0
    k = torch.zeros(1, 2, 4, 4)
    k[0, 0, :, 0] = torch.tensor([5.0, 5.0, 1.0, 2.0])
    k[0, 1, :, 0] = torch.tensor([5.0, 4.0, 1.0, 2.0])
    call = parse_call(0, (q, k, k), {"is_causal": True, "scale": 1.0})
    mx, tied, rows = attention_logit_stats(call)
    assert mx.tolist() == [5.0, 5.0] and tied.tolist() == [3, 0] and rows == 4
    # the same scores through a boolean mask hiding key 1: no ties left
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[:, 1] = False
    call = parse_call(0, (q, k, k, mask), {"scale": 1.0})
    assert attention_logit_stats(call)[1].tolist() == [0, 0]


def test_spectral_entropy_limits():
    u = torch.randn(8, 1)
    rank_one = u @ torch.randn(1, 6)
    assert spectral_entropy(rank_one) == pytest.approx(0.0, abs=1e-9)
    assert spectral_entropy(torch.eye(6)) == pytest.approx(1.0)
    assert math.isnan(spectral_entropy(torch.zeros(4, 4)))
    batched = spectral_entropy(torch.stack([torch.eye(3), torch.diag(torch.tensor([1.0, 1.0, 0.0]))]))
    assert batched[0] == pytest.approx(1.0) and batched[1] == pytest.approx(math.log(2) / math.log(3))


def test_alerts_warn_log_callback_and_jsonl(tmp_path, caplog):
    model = _gpt()
    got = []
    path = tmp_path / "run.jsonl"
    with Monitor(model, every=1, window=1, path=path, callback=got.append,
                 thresholds=Thresholds(max_logit=-1e9, tied_frac=None)) as mon:
        # logging is configured (pytest's capture): each alert is a log record, and no warning besides
        with warnings.catch_warnings(record=True) as warned, caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            _train(model, 3, mon)
    assert len(got) == 4  # 2 layers × 2 heads, once each: still above on steps 1, 2
    assert {(a.layer, a.head) for a in got} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    logged = [r.getMessage() for r in caplog.records if r.name == "lpfail.monitor" and r.levelno == logging.WARNING]
    assert len(logged) == 4 and "max_logit of layer 0 head 0" in logged[0]
    assert not [w for w in warned if issubclass(w.category, MonitorWarning)]
    lines = read_jsonl(path)
    assert [x["kind"] for x in lines].count("record") == 3 and [x["kind"] for x in lines].count("alert") == 4
    assert lines[0]["kind"] == "header" and lines[1]["loss"] == pytest.approx(mon.records[0]["loss"])
    json.dumps(lines)  # plain JSON


def test_entropy_threshold_alerts_below():
    t = Thresholds(max_logit=None, tied_frac=None, update_entropy=0.5)
    assert t.crossed("update_entropy", 0.2) and not t.crossed("update_entropy", 0.8)
    assert not t.crossed("update_entropy", float("nan"))


def test_nothing_to_monitor_is_an_error():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with Monitor(model) as mon:
        model(torch.randn(2, 4))
        with pytest.raises(MonitorError, match="scaled_dot_product_attention.*q_proj/k_proj"):
            mon.step()


def test_forward_outside_attach_is_not_seen_and_step_needs_attach():
    model = Toy(PackedSDPA)
    mon = Monitor(model)
    with pytest.raises(MonitorError, match="not attached"):
        mon.step()
    with mon:
        pass
    with mon:  # reattach works; a step without any forward finds nothing
        with pytest.raises(MonitorError, match="nothing to monitor"):
            mon.step()


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of every"):
        Monitor(_gpt(), every=3, window=4)
    with pytest.raises(ValueError, match="positive int"):
        Monitor(_gpt(), every=0)
    with pytest.raises(TypeError, match="nn.Module"):
        Monitor(lambda x: x)
    bad = Toy(ProjAttention)
    for layer in bad.layers:
        del layer.num_heads
    with pytest.raises(MonitorError, match="no head count"):
        find_qk(bad)
    assert len(find_qk(bad, n_head=2)) == 2


def test_multihead_attention_weights_found():
    mha = nn.MultiheadAttention(8, 2, bias=False)
    (src,) = find_qk(mha)
    wq, wk = src.get()
    assert wq.shape == (2, 4, 8) and torch.equal(wq.reshape(8, 8), mha.in_proj_weight[:8])


class _ModeProbe(nn.Module):
    """Records, at every forward, whether a TorchFunctionMode is active."""

    def __init__(self):
        super().__init__()
        self.inner = Toy(PackedSDPA)
        self.seen: list[bool] = []

    def forward(self, idx, targets):
        self.seen.append(torch._C._is_torch_function_mode_enabled())
        return self.inner(idx, targets)


def test_hot_path_has_no_mode_on_unsampled_steps():
    # the interceptor is entered only for the forwards of sampled steps (a mode around the whole loop made
    # every torch call of every step pass through Python: 4.8 % median overhead on the H200, 2026-12-01)
    torch.manual_seed(0)
    model = _ModeProbe()
    with Monitor(model, every=3, window=3) as mon:
        _train(model, 7, mon)
        assert not torch._C._is_torch_function_mode_enabled()  # between steps: nothing active
    assert model.seen == [s % 3 == 0 for s in range(7)]
    assert [r["step"] for r in mon.records] == [0, 3, 6] and all("max_logit" in r for r in mon.records)


def test_forward_that_raises_leaves_no_mode_behind():
    torch.manual_seed(0)
    model = Toy(PackedSDPA)
    with Monitor(model, every=1, window=1):
        with pytest.raises(ValueError):
            model(torch.zeros(2, 12, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))  # bad target shape
        assert not torch._C._is_torch_function_mode_enabled()


def test_logits_are_fp32_under_autocast():
    # under torch.autocast the model's matmuls run in BF16; the monitor's logits must not
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 8, 16, generator=g) * 3
    k = torch.randn(1, 2, 8, 16, generator=g) * 3
    truth = ((q @ k.transpose(-1, -2)) / 4).tril().masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -math.inf)
    call = parse_call(0, (q, k, k), {"is_causal": True})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mx, _, rows = attention_logit_stats(call)
    assert np.array_equal(mx, truth.amax(dim=(-1, -2))[0].double().numpy()) and rows == 8


def test_losses_bit_identical_under_autocast(tmp_path):
    def run(monitored):
        torch.manual_seed(0)
        model = _gpt()
        mon = Monitor(model, every=1, window=1) if monitored else None
        with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
            warnings.simplefilter("ignore", MonitorWarning)
            if mon:
                mon.attach()
            out = _train(model, 4, mon)
            if mon:
                mon.detach()
        return out
    assert run(False) == run(True)


def test_norms_and_entropy_agree_with_svd():
    from lpfail.monitor import qk_norms
    g = torch.Generator().manual_seed(0)
    wq, wk = torch.randn(3, 4, 24, generator=g), torch.randn(3, 4, 24, generator=g)
    n_q, n_qk = qk_norms(wq, wk)
    ref_q = torch.linalg.matrix_norm(wq.double(), ord=2).numpy()
    ref_qk = torch.linalg.matrix_norm(wq.double().transpose(-1, -2) @ wk.double(), ord=2).numpy()
    assert np.allclose(n_q, ref_q, rtol=1e-10) and np.allclose(n_qk, ref_qk, rtol=1e-9)
    dw = torch.randn(5, 6, 20, generator=g) * torch.logspace(0, -3, 6)[:, None]
    sv = torch.linalg.svdvals(dw.double())
    p = sv ** 2 / (sv ** 2).sum(-1, keepdim=True)
    ref = (-(p * p.log()).sum(-1) / math.log(6)).numpy()
    assert np.allclose(spectral_entropy(dw), ref, rtol=1e-10)


def test_lambda_max_by_squaring_matches_eigh():
    # the accelerator path of qk_norms (batched matmuls), checked on the CPU against LAPACK
    from lpfail.monitor import _lambda_max
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(6, 8, 40, generator=g, dtype=torch.float64), torch.randn(6, 8, 40, generator=g,
                                                                             dtype=torch.float64)
    ga, gb = a @ a.transpose(-1, -2), b @ b.transpose(-1, -2)
    assert torch.allclose(_lambda_max(ga), torch.linalg.eigvalsh(ga)[..., -1], rtol=1e-10)
    ref = torch.linalg.matrix_norm(a.transpose(-1, -2) @ b, ord=2) ** 2
    assert torch.allclose(_lambda_max(ga @ gb), ref, rtol=1e-9)
    tied = torch.diag(torch.tensor([3.0, 3.0, 1.0], dtype=torch.float64))  # a repeated top eigenvalue
    assert _lambda_max(tied).item() == pytest.approx(3.0, rel=1e-12)
    assert _lambda_max(torch.zeros(2, 4, 4, dtype=torch.float64)).tolist() == [0.0, 0.0]


def test_a_step_without_a_forward_call_is_flagged():
    # the interceptor is entered by the model's forward hooks: model.forward(...) bypasses them
    torch.manual_seed(0)
    model = _gpt()
    idx = torch.randint(0, 32, (2, 12))
    with Monitor(model, every=1, window=1) as mon:
        model(idx, idx)
        rec = mon.step()
        assert "max_logit" in rec and "warning" not in rec
        model.forward(idx, idx)
        rec = mon.step()
        assert "max_logit" not in rec and "model.forward" in rec["warning"] and "wq" in rec


# -- the cost of a sampled step (issue 14: ≤ 2 % of step time on an H200) ------------------------------------
def _reference_logit_stats(call, score_dtype=torch.bfloat16, sample_batch=1):
    """The monitor's logit statistics as first written (one pass per quantity; before 2026-12-01 12:00):
    the fewer-pass version must give the same numbers, bit for bit."""
    q, (k, _) = call.q, call.kv_for_heads()
    allowed = call.allowed()
    nh = q.shape[1]
    max_logit = torch.full((nh,), -math.inf, dtype=torch.float64)
    tied = torch.zeros(nh, dtype=torch.int64)
    rows = 0
    for b in range(min(sample_batch, q.shape[0])):
        s = (q[b].float() @ k[b].float().transpose(-1, -2)) * call.alpha
        if allowed is not None:
            a = allowed if allowed.dim() == 2 else allowed.expand(q.shape[0], nh, *s.shape[-2:])[b]
            s = s.masked_fill(~torch.broadcast_to(a, s.shape), -math.inf)
            a0 = torch.broadcast_to(allowed, (*q.shape[:2], *s.shape[-2:]))[b, 0]
            rows += int(a0.any(dim=-1).sum()) if call.attn_mask is not None else s.shape[-2]
        else:
            rows += s.shape[-2]
        live = torch.isfinite(s).any(dim=-1)
        sr = s.to(score_dtype)
        n_at_max = ((sr == sr.amax(dim=-1, keepdim=True)) & torch.isfinite(sr)).sum(dim=-1)
        tied += ((n_at_max >= 2) & live).sum(dim=-1)
        mx = s.masked_fill(~torch.isfinite(s), -math.inf).amax(dim=(-1, -2)).double()
        max_logit = torch.maximum(max_logit, mx)
    return max_logit.numpy(), tied.numpy(), rows


@pytest.mark.parametrize("scale", [None, 0.3, 1.0])
def test_fewer_pass_logit_stats_equal_the_reference(scale):
    g = torch.Generator().manual_seed(3)
    b, h, t, d = 3, 4, 24, 16
    q = (torch.randn(b, h, t, d, generator=g) * 4).to(torch.bfloat16)
    k = (torch.randn(b, h, t, d, generator=g) * 4).to(torch.bfloat16)
    k[:, :, 5] = k[:, :, 2]                                     # planted ties (equal keys)
    k[:, 1, 7:9] = k[:, 1, 3:4]
    q_nan = q.clone()
    q_nan[0, 2, 6, 0] = math.nan                                # a NaN row in one head
    q_nan[1, 3, 9, 1] = math.inf                                # an infinite query entry: ±∞ and NaN scores
    fmask = torch.zeros(b, 1, t, t)
    fmask[:, :, 4] = -math.inf                                  # a query row with no allowed key
    fmask[1, :, :, 0] = -math.inf
    bmask = torch.rand(t, t, generator=g) > 0.3
    kw = {} if scale is None else {"scale": scale}
    cases = [((q, k, k), {"is_causal": True}), ((q_nan, k, k), {"is_causal": True}), ((q, k, k), {}),
             ((q, k, k, fmask), {}), ((q_nan, k, k, fmask), {"is_causal": True}), ((q, k, k, bmask), {})]
    for args, extra in cases:
        for nb in (1, 3):
            call = parse_call(0, args, {**extra, **kw})
            mx, tied, rows = attention_logit_stats(call, sample_batch=nb)
            rmx, rtied, rrows = _reference_logit_stats(call, sample_batch=nb)
            assert np.array_equal(mx, rmx) and np.array_equal(tied, rtied) and rows == rrows, (extra, nb)
    assert _reference_logit_stats(parse_call(0, (q, k, k), {"is_causal": True}))[1].sum() > 0  # ties seen


class _Count(TorchDispatchMode):
    """ATen ops that launch work (views excluded): on a GPU, one kernel launch each."""

    VIEWS = {"view", "_unsafe_view", "transpose", "t", "expand", "select", "slice", "unsqueeze", "squeeze",
             "as_strided", "detach", "alias", "permute", "split", "split_with_sizes", "unbind", "lift_fresh",
             "_reshape_alias", "reshape", "flatten", "chunk", "narrow", "diagonal"}

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += func.overloadpacket.__name__ not in self.VIEWS
        return func(*args, **(kwargs or {}))


class _HostReads(TorchFunctionMode):
    """Reads of tensor values by the host: on a GPU, each waits for the device's queue to drain."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        self.n += name in ("cpu", "item", "tolist", "__int__", "__float__", "__bool__") or \
            (name == "to" and any(str(a) == "cpu" for a in (*args[1:], *(kwargs or {}).values())))
        return func(*args, **(kwargs or {}))


def _sampled_step_cost(layers):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=layers, n_head=4, n_embd=32))
    idx = torch.randint(0, 32, (2, 17))
    mon = Monitor(model, every=1, window=2)
    mon._host_linalg = False  # the accelerator path: the squarings, as on a GPU
    out = []
    with torch.no_grad(), _Count() as plain:
        model(idx[:, :-1], idx[:, 1:])
    with mon, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        for _ in range(3):  # step 0: first snapshot; 1: norms only; 2: norms and the update entropy
            with _Count() as fwd, _HostReads() as fwd_reads:
                model(idx[:, :-1], idx[:, 1:])
            with _Count() as stp, _HostReads() as stp_reads:
                rec = mon.step()
            out.append((fwd.ops - plain.ops, fwd_reads.n, stp.ops, stp_reads.n))
    assert "update_entropy" in rec and len(rec["wq"]) == layers
    return out


def test_sampled_step_cost_does_not_grow_with_the_layers():
    # before 2026-12-01 12:00 a sampled step of GPT-2 small ran ≈ 2 400 ATen ops and 36 host reads (+ 12 on
    # an entropy step): ≈ 70-90 ms on the H200 (results/kernels_gpu/monitor_overhead.json)
    two, six = _sampled_step_cost(2), _sampled_step_cost(6)
    for (f2, fr2, s2, sr2), (f6, fr6, s6, sr6) in zip(two, six):
        assert fr2 == fr6 == 0              # nothing read from the device during the forward
        assert sr2 == sr6 == 1              # one copy to the host per sampled step
        assert s2 == s6 and s6 <= 150       # step(): a constant number of ops, whatever the depth
        assert f2 <= 2 * 25 + 5 and f6 <= 6 * 25 + 5     # the forward: ≤ 25 ops per attention call


def test_lambda_max_on_gpt2_shaped_weights():
    # GPT-2-small heads (64 × 768; 2 layers of 12, to keep the test quick on a CPU) in one batch, as on a
    # sampled step; 1e-6 relative against an SVD
    from lpfail.monitor import _qk_norms_device
    g = torch.Generator().manual_seed(4)
    wq = torch.randn(2, 12, 64, 768, generator=g) * 0.02
    wk = torch.randn(2, 12, 64, 768, generator=g) * 0.02
    wq[0, 0, 1] = wq[0, 0, 0] * 1.0000001 + 1e-9               # a nearly repeated row: one dominant σ
    dev, host = _qk_norms_device(wq, wk, host_linalg=False), _qk_norms_device(wq, wk, host_linalg=True)
    ref_q = torch.linalg.svdvals(wq.double())[..., 0]
    r_q, r_k = (torch.linalg.qr(w.double().transpose(-1, -2))[1] for w in (wq, wk))  # Wᵀ = Q R (thin)
    ref_qk = torch.linalg.svdvals(r_q @ r_k.transpose(-1, -2))[..., 0]  # W_Qᵀ W_K = Q_q (R_q R_kᵀ) Q_kᵀ
    for got in (dev, host):
        assert torch.allclose(got[0], ref_q, rtol=1e-6, atol=0) and torch.allclose(got[1], ref_qk, rtol=1e-6, atol=0)


def test_threaded_host_eigenvalues_equal_one_batched_call():
    from lpfail.monitor import _sq_singular_values
    g = torch.Generator().manual_seed(5)
    x = torch.randn(144, 16, 40, generator=g, dtype=torch.float64)
    gram = x @ x.transpose(-1, -2)
    assert torch.equal(_sq_singular_values(gram.reshape(12, 12, 16, 16)),
                       torch.linalg.eigvalsh(gram).clamp_min(0.0).reshape(12, 12, 16))


def test_layers_of_different_shapes_are_batched_per_shape():
    # a qk= function with two head layouts (4 × 8 and 2 × 16 of width 32), interleaved: the record keeps the
    # layer order and each layer's numbers are those of qk_norms / spectral_entropy on that layer alone
    from lpfail.monitor import QKWeights, qk_norms
    torch.manual_seed(0)
    model = Toy(ProjAttention, layers=3, c=32)
    layout = [4, 2, 4]

    def qk(m):
        return [QKWeights(f"l{i}", lambda a=a, h=h: (a.q_proj.weight.detach().reshape(h, -1, 32),
                                                  a.k_proj.weight.detach().reshape(h, -1, 32)))
                for i, (a, h) in enumerate(zip(m.layers, layout))]
    with Monitor(model, every=1, window=2, qk=qk) as mon:
        _train(model, 1, mon)                                   # step 0: the snapshot after its update
        before = [s.get()[0].clone() for s in mon.qk]
        _train(model, 2, mon)
    rec = mon.records[-1]
    assert rec["layers"] == ["l0", "l1", "l2"] and rec["update_window"] == [0, 2]
    for i, src in enumerate(mon.qk):
        wq, wk = src.get()
        n_q, n_qk = qk_norms(wq, wk)
        assert np.allclose(rec["wq"][i], n_q, rtol=1e-12) and np.allclose(rec["wqk"][i], n_qk, rtol=1e-12)
        assert len(rec["wq"][i]) == layout[i]
        ent = spectral_entropy((wq - before[i]).transpose(-1, -2))
        assert np.allclose(rec["update_entropy"][i], ent, rtol=1e-12)


def test_lambda_max_near_tied_top_eigenvalues():
    # the squarings converge slowest when λ₂ is just below λ₁: 16 squarings (before 2026-12-01 12:00) were
    # off by ≈ 6e-6 at a relative gap of 1e-5; the default must stay within 1e-6 for every gap
    from lpfail.monitor import _lambda_max
    g = torch.Generator().manual_seed(6)
    n = 64
    for gap in (1e-3, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 3e-7):
        q, _ = torch.linalg.qr(torch.randn(20, n, n, generator=g, dtype=torch.float64))
        lam = torch.rand(20, n, generator=g, dtype=torch.float64) * 0.9
        lam[:, 0], lam[:, 1] = 2.0, 2.0 * (1 - gap)
        m = q @ torch.diag_embed(lam) @ q.transpose(-1, -2)
        assert torch.allclose(_lambda_max(m), torch.full((20,), 2.0, dtype=torch.float64), rtol=1e-6, atol=0), gap


@pytest.mark.gpu
def test_on_cuda_the_records_agree_with_the_host_linear_algebra():
    # the accelerator path (squarings, one copy) against LAPACK on a CPU copy of the same weights; the
    # logit statistics against the same computation on the CPU
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=128, n_layer=3, n_head=4, n_embd=64)).cuda()
    idx = torch.randint(0, 128, (2, 65), device="cuda")
    calls = []
    with Monitor(model, every=1, window=1) as mon, warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        model(idx[:, :-1], idx[:, 1:])
        mon.step()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        orig = mon._mode.handler  # the interceptor holds the handler (patching mon._on_sdpa would not reach it)
        mon._mode.handler = lambda call, original: (calls.append(call), orig(call, original))[1]
        model(idx[:, :-1], idx[:, 1:])
        rec = mon.step()
    assert len(calls) == 3
    from lpfail.monitor import qk_norms
    for i, src in enumerate(mon.qk):
        wq, wk = (w.cpu() for w in src.get())
        n_q, n_qk = qk_norms(wq, wk)
        assert np.allclose(rec["wq"][i], n_q, rtol=1e-6, atol=0) and np.allclose(rec["wqk"][i], n_qk, rtol=1e-6)
    assert all(math.isfinite(v) for row in rec["update_entropy"] for v in row)
    for i, call in enumerate(calls):
        cpu = parse_call(0, (call.q.cpu(), call.k.cpu(), call.v.cpu()), {"is_causal": call.is_causal})
        mx, _, rows = attention_logit_stats(cpu)
        assert np.allclose(rec["max_logit"][i], mx, rtol=1e-5) and rec["rows"][i] == rows


class MaskedSDPA(PackedSDPA):
    """SDPA with an explicit boolean mask (causal, and the first two queries see nothing but key 0)."""

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (x @ self.w).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        mask[:2, :] = False
        mask[:2, 0] = True
        mask[5] = False                                         # query 5: no allowed key, not a row
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.nan_to_num().transpose(1, 2).reshape(B, T, C)


def test_an_explicit_mask_is_not_read_during_the_forward():
    # the rows of an explicit mask are counted on the device and read with everything else in step()
    torch.manual_seed(0)
    model = Toy(MaskedSDPA)
    idx = torch.randint(0, 32, (2, 12))
    with Monitor(model, every=1, window=1) as mon, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        with _HostReads() as reads:
            model(idx, idx)
        rec = mon.step()
    assert reads.n == 0 and rec["rows"] == [11, 11] and all(isinstance(r, int) for r in rec["rows"])


class PaddingSDPA(PackedSDPA):
    """SDPA with a mask built by `mask(B, T)` (None: no mask); `zero_q`: q ≡ 0, so every score of a row is equal
    and every row with ≥ 2 allowed keys is tied."""

    def __init__(self, c=16, h=2, mask=None, zero_q=False):
        super().__init__(c, h)
        self.mask, self.zero_q = mask, zero_q

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (x @ self.w).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        q = q * 0 if self.zero_q else q
        m = None if self.mask is None else self.mask(B, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).transpose(1, 2).reshape(B, T, C)


class PaddedMHA(nn.Module):
    """nn.MultiheadAttention given a key_padding_mask (True = padding: the last two keys of sequence 1)."""

    def __init__(self, c=16, h=2):
        super().__init__()
        self.mha = nn.MultiheadAttention(c, h, bias=False, batch_first=True)

    def forward(self, x):
        pad = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
        pad[1, -2:] = True
        return self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]


def _one_record(layer, sample_batch=2):
    torch.manual_seed(0)
    model = Toy(layer)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(3))
    with Monitor(model, every=1, window=1, sample_batch=sample_batch) as mon, torch.no_grad(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")                         # toy ties; no Q/K projections found
        model(idx, idx)
        rec = mon.step()
    return {key: rec[key] for key in ("max_logit", "tied_frac", "rows")}


ALLOW_ALL = {
    "(B,1,1,Tk)": lambda b, t: torch.ones(b, 1, 1, t, dtype=torch.bool),
    "(1,Tk)": lambda b, t: torch.ones(1, t, dtype=torch.bool),
    "(1,1,1,Tk)": lambda b, t: torch.ones(1, 1, 1, t, dtype=torch.bool),
    "float zeros (B,1,1,Tk)": lambda b, t: torch.zeros(b, 1, 1, t),
    "(B,1,Tq,Tk)": lambda b, t: torch.ones(b, 1, t, t, dtype=torch.bool),
}


@pytest.mark.parametrize("name", list(ALLOW_ALL))
@pytest.mark.parametrize("sample_batch", [1, 2])
def test_a_broadcast_mask_that_allows_every_key_gives_the_record_of_no_mask(name, sample_batch):
    """A key-padding mask holds one row per sequence for all its query rows; the monitor broadcasts it as SDPA
    does (once it counted one live row per sequence, so tied fractions could exceed 1)."""
    plain = _one_record(lambda c: PaddingSDPA(c), sample_batch)
    assert plain["rows"] == [12 * sample_batch] * 2
    assert _one_record(lambda c: PaddingSDPA(c, mask=ALLOW_ALL[name]), sample_batch) == plain


def _padding(b, t):
    m = torch.ones(b, 1, 1, t, dtype=torch.bool)
    m[1, ..., -2:] = False                                       # sequence 1: two padding keys
    return m


@pytest.mark.parametrize("layer", [lambda c: PaddingSDPA(c, mask=_padding, zero_q=True),
                                   lambda c: PaddingSDPA(c, mask=lambda b, t: _padding(b, t)[:, 0, 0][:1, None],
                                                         zero_q=True),
                                   PaddedMHA], ids=["(B,1,1,Tk)", "(1,1,Tk)", "MultiheadAttention"])
def test_tied_fractions_stay_at_most_one_with_real_padding(layer):
    """q ≡ 0 ties every row with ≥ 2 allowed keys: the fraction is exactly 1, every query row counted."""
    rec = _one_record(layer)
    assert rec["rows"] == [24, 24]
    assert max(max(row) for row in rec["tied_frac"]) <= 1.0
    if not isinstance(layer, type):
        assert rec["tied_frac"] == [[1.0, 1.0], [1.0, 1.0]]


def test_score_dtype_must_be_a_floating_dtype():
    for bad in (torch.int32, "bf16", torch.bool, None):
        with pytest.raises(ValueError, match="score_dtype must be a floating torch.dtype"):
            Monitor(Toy(PackedSDPA), score_dtype=bad)
    assert Monitor(Toy(PackedSDPA), score_dtype=torch.float16).score_dtype == torch.float16
