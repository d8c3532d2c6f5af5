"""Tests of lpfail.model: the GPT-2 model, per-layer / per-head attention specs, diagnostics."""
import math
import warnings

import numpy as np
import pytest
import torch

import lpfail.model as model_mod
from lpfail.model import (GPT, AttentionSpec, GPTConfig, capture_attention_logits, head_query_norms,
                          logit_capture, weight_spectral_norms)
from lpfail.precision import FP32, FP64, PAPER_BF16

TINY = dict(block_size=40, vocab_size=96, n_layer=2, n_head=4, n_embd=32)


def _has_reference():
    try:
        import lpfail.attention as a  # noqa: F401
    except ImportError:
        return False
    return hasattr(a, "attention") and hasattr(a, "naive_attention")


needs_reference = pytest.mark.skipif(not _has_reference(), reason="lpfail.attention has not landed yet")


def tiny_model(dtype=torch.float32, seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides})).to(dtype)


def batch(T=24, B=2, vocab=96, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (B, T), generator=g)
    y = torch.randint(0, vocab, (B, T), generator=g)
    return x, y


def loss_and_grads(m, x, y):
    m.zero_grad(set_to_none=True)
    _, loss = m(x, y)
    loss.backward()
    return loss.detach().clone(), {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def max_rel_diff(a: dict, b: dict) -> float:
    return max(((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(1e-30)).item() for n in a)


# -- config and structure -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(n_embd=30, n_head=4), "divisible"),
    (dict(n_layer=0), "n_layer"),
    (dict(vocab_size=-1), "vocab_size"),
    (dict(block_size=1.5), "block_size"),
    (dict(n_head=True), "n_head"),
    (dict(dropout=1.0), "dropout"),
    (dict(bias=True), "bias"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**kwargs)


def test_config_defaults_are_gpt2_small():
    c = GPTConfig()
    assert (c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.dropout, c.bias) == \
        (1024, 50304, 12, 12, 768, 0.0, False)
    assert c.vocab_size % 64 == 0 and c.vocab_size >= 50257


def test_shapes_and_loss():
    m = tiny_model()
    x, y = batch(T=24, B=3)
    logits, loss = m(x)
    assert logits.shape == (3, 24, TINY["vocab_size"]) and loss is None
    logits2, loss = m(x, y)
    assert torch.equal(logits, logits2)
    assert loss.shape == () and abs(loss.item() - math.log(TINY["vocab_size"])) < 0.1  # near-uniform at init
    ignored = y.clone()
    ignored[:, :12] = -1  # ignore_index
    direct = torch.nn.functional.cross_entropy(logits2[:, 12:].reshape(-1, TINY["vocab_size"]), y[:, 12:].reshape(-1))
    assert torch.allclose(m(x, ignored)[1], direct)
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, TINY["block_size"] + 1, dtype=torch.long))


def test_forward_matches_manual_computation():
    """The whole forward pass written out from the weights: pre-LN blocks, causal softmax attention,
    exact-GELU MLP, final LN, tied head."""
    m = tiny_model(torch.float64)
    x, _ = batch(T=20, B=2)
    W = {n: p.detach() for n, p in m.named_parameters()}
    C, nh = TINY["n_embd"], TINY["n_head"]
    hs = C // nh
    ln = lambda h, w: torch.nn.functional.layer_norm(h, (C,), w, None, 1e-5)  # noqa: E731
    h = W["transformer.wte.weight"][x] + W["transformer.wpe.weight"][:20]
    mask = torch.ones(20, 20, dtype=torch.bool).tril()
    for i in range(TINY["n_layer"]):
        p = f"transformer.h.{i}."
        a = ln(h, W[p + "ln_1.weight"]) @ W[p + "attn.c_attn.weight"].T
        heads = []
        for j in range(nh):
            q, k, v = (a[..., s * C + j * hs:s * C + (j + 1) * hs] for s in range(3))
            scores = (q @ k.transpose(-1, -2) / math.sqrt(hs)).masked_fill(~mask, -math.inf)
            heads.append(scores.softmax(-1) @ v)
        h = h + torch.cat(heads, dim=-1) @ W[p + "attn.c_proj.weight"].T
        f = torch.nn.functional.gelu(ln(h, W[p + "ln_2.weight"]) @ W[p + "mlp.c_fc.weight"].T)
        h = h + f @ W[p + "mlp.c_proj.weight"].T
    logits = ln(h, W["transformer.ln_f.weight"]) @ W["transformer.wte.weight"].T
    torch.testing.assert_close(m(x)[0], logits, rtol=1e-12, atol=1e-12)


def test_no_biases_and_pre_ln():
    m = tiny_model()
    assert not any(n.endswith("bias") for n, _ in m.named_parameters())
    assert all(b.ln_1.bias is None and b.ln_2.bias is None for b in m.transformer.h)


def test_tied_weights():
    m = tiny_model()
    assert m.lm_head.weight is m.transformer.wte.weight
    names = [n for n, _ in m.named_parameters()]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    x, y = batch()
    m(x, y)[1].backward()
    assert m.lm_head.weight.grad is m.transformer.wte.weight.grad


def test_gpt2_small_param_count():
    with torch.device("meta"):  # no memory, no init cost
        m = GPT(GPTConfig())
    V, T, L, C = 50304, 1024, 12, 768
    per_layer = C + 3 * C * C + C * C + C + 4 * C * C + 4 * C * C  # ln_1, c_attn, c_proj, ln_2, c_fc, c_proj
    expected = V * C + T * C + L * per_layer + C  # wte (= lm_head), wpe, blocks, ln_f
    assert expected == 124_373_760
    assert m.num_params() == expected
    assert m.num_params(non_embedding=True) == 123_587_328  # nanoGPT's "123.59M"


def test_gpt2_init():
    m = tiny_model(n_layer=4, n_embd=64, n_head=4)
    for name, p in m.named_parameters():
        if p.ndim == 2:
            want = 0.02 / math.sqrt(2 * 4) if name.endswith("c_proj.weight") else 0.02
            assert abs(p.std().item() / want - 1) < 0.1, name
            assert abs(p.mean().item()) < 6 * want / math.sqrt(p.numel())  # 6 sigma
        else:
            assert torch.equal(p, torch.ones_like(p)), name  # LayerNorm gains


# -- attention backends ---------------------------------------------------------------------------------
@needs_reference
def test_backends_agree_fp64():
    """float64 model: sdpa, naive (float64 truth) and reference(FP64) agree to float64 rounding."""
    x, y = batch(T=40)
    results = {}
    for spec in [AttentionSpec("sdpa"), AttentionSpec("naive"), AttentionSpec("reference", FP64)]:
        m = tiny_model(torch.float64).set_attention(spec)
        results[str(spec)] = loss_and_grads(m, x, y)
    base_loss, base_grads = results["naive"]
    for name, (loss, grads) in results.items():
        print(name, (loss - base_loss).abs().item(), max_rel_diff(grads, base_grads))
        assert abs(loss.item() - base_loss.item()) < 1e-12
        assert max_rel_diff(grads, base_grads) < 1e-12  # every gradient, relative to its own max (seen: 1e-15)


@needs_reference
def test_backends_agree_fp32():
    """float32 model: sdpa and reference(FP32) agree with the float64-attention 'naive' to FP32 noise."""
    x, y = batch(T=33)
    results = {}
    for spec in [AttentionSpec("naive"), AttentionSpec("sdpa"), AttentionSpec("reference", FP32)]:
        results[str(spec)] = loss_and_grads(tiny_model(torch.float32).set_attention(spec), x, y)
    base_loss, base_grads = results["naive"]
    for name, (loss, grads) in results.items():
        print(name, (loss - base_loss).abs().item(), max_rel_diff(grads, base_grads))
        assert abs(loss.item() - base_loss.item()) < 1e-6
        assert max_rel_diff(grads, base_grads) < 1e-5  # FP32 eps 1.2e-7 × a few dozen ops (seen: 4e-7)


@needs_reference
def test_per_head_override_exact_policies_agree():
    """Heads of one layer split between two exact backends give the uniform result."""
    x, y = batch(T=40)
    uniform = tiny_model(torch.float64).set_attention("naive")
    split = tiny_model(torch.float64).set_attention("naive")
    split.set_attention("reference", FP64, layers=[1], heads=[0, 2])
    assert [s.backend for s in split.attention_specs()[1]] == ["reference", "naive", "reference", "naive"]
    l0, g0 = loss_and_grads(uniform, x, y)
    l1, g1 = loss_and_grads(split, x, y)
    assert abs(l0.item() - l1.item()) < 1e-12 and max_rel_diff(g1, g0) < 1e-12


@needs_reference
def test_per_head_override_low_precision_differs():
    """One head of layer 1 in PAPER_BF16 changes the result, and only downstream of layer 1."""
    x, y = batch(T=40)
    exact = tiny_model(torch.float64).set_attention("reference", FP64)
    bf16 = tiny_model(torch.float64).set_attention("reference", FP64).set_attention(
        "reference", PAPER_BF16, layers=1, heads=[3])
    l0, g0 = loss_and_grads(exact, x, y)
    l1, g1 = loss_and_grads(bf16, x, y)
    diff = abs(l0.item() - l1.item())
    w = "transformer.h.1.attn.c_attn.weight"
    gdiff = max_rel_diff({w: g1[w]}, {w: g0[w]})
    print("loss diff", diff, "layer-1 c_attn grad diff", gdiff)
    assert diff > 1e-9 and gdiff > 1e-6  # BF16 rounding of one head's O: far above float64 noise (1e-15)
    outs = []
    for m in (exact, bf16):  # the forward pass of layer 0 is untouched; layer 1's output changes
        hooks = [blk.register_forward_hook(lambda mod, i, o: outs.append(o.detach())) for blk in m.transformer.h]
        with torch.no_grad():
            m(x)
        for hk in hooks:
            hk.remove()
    assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[1], outs[3])


def test_head_groups_are_concatenated_in_order(monkeypatch):
    """Heads split across specs are computed per group and put back in their own positions."""
    calls = []

    def fake(spec, q, k, v, state=None):  # returns each head's v, scaled by a per-spec factor
        calls.append((spec.backend, q.shape[1]))
        return v * (2.0 if spec.backend == "naive" else 1.0)

    monkeypatch.setattr(model_mod, "run_attention", fake)
    attn = tiny_model().transformer.h[0].attn
    attn.specs = (AttentionSpec("naive"), AttentionSpec("sdpa"), AttentionSpec("sdpa"), AttentionSpec("naive"))
    q, k, v = (torch.randn(2, 4, 8, 8) for _ in range(3))
    out = attn.attend(q, k, v)  # groups: heads [0, 3], then [1, 2] (a permutation that is not its own inverse)
    assert calls == [("naive", 2), ("sdpa", 2)]  # one call per group
    torch.testing.assert_close(out, v * torch.tensor([2.0, 1.0, 1.0, 2.0]).view(1, 4, 1, 1))


def test_per_head_sdpa_groups_match_uniform(monkeypatch):
    """Splitting heads into groups that run the same computation changes nothing (no lpfail.attention needed)."""
    m = tiny_model()
    x, y = batch()
    l0, g0 = loss_and_grads(m, x, y)
    m.transformer.h[1].attn.specs = (AttentionSpec("sdpa"),) * 2 + (AttentionSpec("triton", FP32, "reference"),) * 2
    real = model_mod.run_attention
    monkeypatch.setattr(model_mod, "run_attention", lambda spec, q, k, v, state=None: real(AttentionSpec("sdpa"), q, k, v))
    l1, g1 = loss_and_grads(m, x, y)
    # bit-equal loss: SDPA's CPU kernel computes each (batch, head) alone with the same T and head size, so a
    # head's arithmetic does not depend on how many heads share the call (held with AVX-512, AVX2 and AMX)
    assert torch.equal(l0, l1) and max_rel_diff(g1, g0) < 1e-6


def test_set_attention_targets_layers_and_heads():
    m = tiny_model(n_layer=3)
    m.set_attention("reference", PAPER_BF16, layers=1)
    m.set_attention(AttentionSpec("reference", FP32), layers=[1, 2], heads=[1, 3])
    t = m.attention_specs()
    assert set(t) == {0, 1, 2} and all(len(s) == 4 for s in t.values())
    assert t[0] == (AttentionSpec("sdpa"),) * 4
    assert [s.policy.name for s in t[1]] == ["PAPER_BF16", "FP32", "PAPER_BF16", "FP32"]
    assert [str(s) for s in t[2]] == ["sdpa", "reference(FP32)", "sdpa", "reference(FP32)"]
    assert set(t.overrides()) == {(1, 0), (1, 1), (1, 2), (1, 3), (2, 1), (2, 3)}
    text = str(t)
    assert "layer 0: all 4 heads sdpa" in text
    assert "layer 1: heads 0,2 reference(PAPER_BF16) | heads 1,3 reference(FP32)" in text
    assert "reference(FP32)" in repr(m) and "layer 2: heads 0,2 sdpa | heads 1,3 reference(FP32)" in m.describe()
    assert "* layer 1" in m.describe() and "  layer 0" in m.describe()
    m.set_attention("sdpa")
    assert "sdpa in every head of every layer" in m.describe()


def test_attention_spec_strings():
    assert AttentionSpec("reference", "PAPER_BF16") == AttentionSpec("reference", PAPER_BF16)
    assert AttentionSpec("reference", "FP32+fix").policy == FP32.with_fix()
    odd = FP32.replace(block_q=None, acc="bf16").with_fix(beta=4.0)
    for spec in [AttentionSpec("sdpa"), AttentionSpec("naive"), AttentionSpec("reference", FP64),
                 AttentionSpec("reference", odd), AttentionSpec("triton", PAPER_BF16.with_fix(), "reference")]:
        assert AttentionSpec.parse(str(spec)) == spec, str(spec)
    assert str(AttentionSpec("triton", FP32, "reference")) == "triton(FP32, fallback=reference)"
    with pytest.raises(ValueError, match="cannot parse"):
        AttentionSpec.parse("reference(FP32")


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_a_spec_string_without_its_policy_names_the_string_form(backend):
    """The text form (the command line's --attention, a config's attention) is told its own form, backend(POLICY),
    not the constructor's AttentionSpec(backend, POLICY); the constructor keeps its own."""
    with pytest.raises(ValueError, match=rf"attention '{backend}' needs a Precision policy in parentheses, e\.g\. "
                                         rf"{backend}\(PAPER_BF16\)") as err:
        AttentionSpec.parse(f" {backend} ")
    assert "AttentionSpec(" not in str(err.value)
    with pytest.raises(ValueError, match=rf"AttentionSpec\('{backend}', PAPER_BF16\)"):
        AttentionSpec(backend)


@pytest.mark.parametrize("call, exc, match", [
    (lambda m: m.set_attention("flash"), ValueError, "unknown attention backend"),
    (lambda m: m.set_attention("reference"), ValueError, "needs a Precision"),
    (lambda m: m.set_attention("triton"), ValueError, "needs a Precision"),
    (lambda m: m.set_attention("sdpa", FP32), ValueError, "takes no policy"),
    (lambda m: m.set_attention("reference", "FP33"), ValueError, "unknown preset"),
    (lambda m: m.set_attention("reference", 32), ValueError, "needs a Precision"),
    (lambda m: m.set_attention(AttentionSpec("sdpa"), FP32), ValueError, "not both"),
    (lambda m: m.set_attention(3), TypeError, "AttentionSpec or a backend"),
    (lambda m: m.set_attention("sdpa", layers=2), ValueError, "layer index 2 out of range"),
    (lambda m: m.set_attention("sdpa", layers=[-1]), ValueError, "out of range"),
    (lambda m: m.set_attention("sdpa", heads=[0, 4]), ValueError, "head index 4 out of range"),
    (lambda m: m.set_attention("sdpa", heads=[]), ValueError, "empty"),
    (lambda m: m.set_attention("sdpa", heads=[1, 1]), ValueError, "repeated"),
    (lambda m: m.set_attention("sdpa", layers=True), TypeError, "ints"),
    (lambda m: m.set_attention("sdpa", heads=[0.0]), TypeError, "ints"),
    (lambda m: AttentionSpec("sdpa", fallback="reference"), ValueError, "only meaningful for the 'triton'"),
    (lambda m: AttentionSpec("triton", FP32, fallback="sdpa"), ValueError, "fallback must be"),
])
def test_set_attention_validation(call, exc, match):
    m = tiny_model()
    before = m.attention_specs()
    with pytest.raises(exc, match=match):
        call(m)
    assert m.attention_specs() == before  # a refused call changes nothing


@pytest.fixture
def no_interpreter(monkeypatch):
    """These tests check the behaviour on a CPU machine without Triton's interpreter. test_kernels.py turns the
    interpreter on for the whole process when it is collected first, so switch it off here."""
    import lpfail.model as model_mod
    real = model_mod._triton_function

    def without_interpreter():
        fn, _, reason = real()
        return fn, False, reason

    monkeypatch.setattr(model_mod, "_triton_function", without_interpreter)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_triton_without_cuda_raises(no_interpreter):
    m = tiny_model().set_attention("triton", PAPER_BF16, layers=[0])
    with pytest.raises(RuntimeError, match="'triton' cannot run.*fallback='reference'"):
        m(batch()[0])


@needs_reference
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_triton_fallback_warns_once_and_uses_reference(no_interpreter):
    x, y = batch()
    ref = tiny_model().set_attention("reference", PAPER_BF16)
    fb = tiny_model().set_attention(AttentionSpec("triton", PAPER_BF16, fallback="reference"))
    with pytest.warns(RuntimeWarning, match="falling back to the reference"):
        out = fb(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call (and the other layer) must not warn again
        out2 = fb(x, y)
    expected = ref(x, y)
    assert torch.equal(out[0], expected[0]) and torch.equal(out2[1], expected[1])
    assert "triton(PAPER_BF16, fallback=reference)" in str(fb.attention_specs())


_INTERPRETER_SCRIPT = """
import torch
from lpfail.model import GPT, GPTConfig, AttentionSpec
from lpfail.precision import FP32
cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32)  # head_dim 16: a kernel size
x = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(0))
res = []
for backend in ("reference", "triton"):
    torch.manual_seed(0)
    m = GPT(cfg).set_attention(backend, FP32).set_attention("sdpa", layers=0, heads=[1])
    loss = m(x, x)[1]
    loss.backward()
    res.append((loss.item(), {n: p.grad for n, p in m.named_parameters()}))
(l0, g0), (l1, g1) = res
rel = max(((g0[n] - g1[n]).abs().max() / g0[n].abs().max()).item() for n in g0)
print("loss diff", abs(l0 - l1), "grad rel diff", rel)
assert abs(l0 - l1) < 1e-6 and rel < 1e-5
print("OK")
"""


@needs_reference
def test_triton_backend_in_the_model_under_the_interpreter():
    """The model's triton path end to end (FP32, per-head groups) on the CPU through Triton's interpreter."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}  # must be set before `kernels` is imported: a fresh process
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT], env=env, cwd=root, capture_output=True,
                       text=True, timeout=300)
    print(r.stdout, r.stderr[-2000:])
    assert r.returncode == 0 and "OK" in r.stdout


@pytest.mark.gpu
@needs_reference
@pytest.mark.parametrize("policy", [FP32, PAPER_BF16])
def test_triton_backend_on_gpu(policy):
    """On CUDA: the Triton kernel in the model, per-head groups included, against the reference under the
    same policy. FP32: equal to FP32 noise. PAPER_BF16: within BF16 noise of each other relative to the
    float64 truth (the two implementations may round differently)."""
    cfg = dict(block_size=256, vocab_size=128, n_layer=2, n_head=4, n_embd=256)  # head_dim 64
    x, y = batch(T=256, B=2, vocab=128)
    x, y = x.cuda(), y.cuda()
    runs = {}
    for name, spec in [("naive", AttentionSpec("naive")), ("ref", AttentionSpec("reference", policy)),
                       ("triton", AttentionSpec("triton", policy))]:
        m = tiny_model(**cfg).cuda().set_attention(spec).set_attention("naive", layers=0, heads=[1, 2])
        runs[name] = loss_and_grads(m, x, y)
    err = {k: max_rel_diff(runs[k][1], runs["naive"][1]) for k in ("ref", "triton")}
    print(policy.name, err, runs["ref"][0].item(), runs["triton"][0].item())
    if policy == FP32:
        assert abs(runs["ref"][0].item() - runs["triton"][0].item()) < 1e-5
        assert max_rel_diff(runs["triton"][1], runs["ref"][1]) < 1e-4
    else:
        assert err["triton"] <= 2 * err["ref"] + 1e-3


# -- diagnostics ----------------------------------------------------------------------------------------
def test_weight_spectral_norms():
    m = tiny_model()
    norms = weight_spectral_norms(m)
    two_d = [n for n, p in m.named_parameters() if p.ndim == 2]
    assert list(norms) == two_d and "lm_head.weight" not in norms and len(two_d) == 2 + 4 * TINY["n_layer"]
    for name, p in m.named_parameters():
        if p.ndim == 2:
            sv = np.linalg.svd(p.detach().double().numpy(), compute_uv=False)[0]
            assert abs(norms[name] - sv) < 1e-5 * sv, name


def test_head_query_norms():
    m = tiny_model()
    C, nh, hs = TINY["n_embd"], TINY["n_head"], TINY["n_embd"] // TINY["n_head"]
    res = head_query_norms(m)
    assert res["wq"].shape == res["wqk"].shape == (TINY["n_layer"], nh)
    for i, block in enumerate(m.transformer.h):
        with torch.no_grad():
            qkv = block.attn.c_attn(torch.eye(C, dtype=torch.float64).float()).double()  # row j: image of e_j
        for h in range(nh):
            q_h = qkv[:, h * hs:(h + 1) * hs]  # (C, hs): x @ q_h is head h's query
            k_h = qkv[:, C + h * hs:C + (h + 1) * hs]
            assert abs(res["wq"][i, h] - np.linalg.norm(q_h.numpy(), 2)) < 1e-5
            assert abs(res["wqk"][i, h] - np.linalg.norm((q_h @ k_h.T).numpy(), 2)) < 1e-5


def _direct_logit_stats(m, x, dtype):
    """Oracle: q, k from a hook on c_attn, logits and ties computed with explicit loops over rows."""
    qkvs = []
    hooks = [b.attn.c_attn.register_forward_hook(lambda mod, inp, out: qkvs.append(out.detach()))
             for b in m.transformer.h]
    with torch.no_grad():
        m(x)
    for hk in hooks:
        hk.remove()
    C, nh = m.config.n_embd, m.config.n_head
    hs = C // nh
    B, T = x.shape
    mx = np.full((len(qkvs), nh), -np.inf)
    tied = np.zeros((len(qkvs), nh))
    for i, qkv in enumerate(qkvs):
        for h in range(nh):
            for b in range(B):
                q = qkv[b, :, h * hs:(h + 1) * hs].double()
                k = qkv[b, :, C + h * hs:C + (h + 1) * hs].double()
                for t in range(T):
                    s = ((q[t] @ k[:t + 1].T) / math.sqrt(hs)).float().to(dtype)
                    top = s.max()
                    mx[i, h] = max(mx[i, h], top.item())
                    tied[i, h] += int((s == top).sum() >= 2)
    return mx, tied / (B * T)


def _tie_prone_model():
    """Tokens from a set of 4 and tiny position embeddings: keys of equal tokens differ by ~1e-3 relative,
    so their logits coincide once rounded to BF16 but not in FP32."""
    m = tiny_model()
    with torch.no_grad():
        m.transformer.wpe.weight.mul_(0.01)
        for b in m.transformer.h:
            b.attn.c_attn.weight[:2 * TINY["n_embd"]].mul_(8.0)  # larger q, k: logits of order 1
    x = torch.randint(0, 4, (2, 40), generator=torch.Generator().manual_seed(0))
    return m, x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_capture_attention_logits_matches_direct(dtype):
    m, x = _tie_prone_model()
    stats = capture_attention_logits(m, x, dtype=dtype)
    mx, frac = _direct_logit_stats(m, x, dtype)
    print(dtype, stats.tied_frac_per_head.tolist())
    assert stats.max_logit_per_head.shape == stats.tied_frac_per_head.shape == (TINY["n_layer"], TINY["n_head"])
    np.testing.assert_allclose(stats.max_logit_per_head, mx, rtol=4e-3 if dtype == torch.bfloat16 else 1e-6)
    # the oracle's products are float64 rounded once, ours FP32 matmuls: allow one flipped row of 80
    np.testing.assert_allclose(stats.tied_frac_per_head, frac, rtol=0, atol=1.01 / 80)
    np.testing.assert_allclose(stats.max_logit, mx.max(axis=1), rtol=4e-3)
    np.testing.assert_allclose(stats.tied_frac, frac.mean(axis=1), rtol=0, atol=1.01 / 80)
    assert stats.rows == 80 and stats.dtype == str(dtype).replace("torch.", "")
    if dtype == torch.bfloat16:
        assert stats.tied_frac[0] > 0.05  # ties that exist only after rounding to BF16 ...
    else:
        assert stats.tied_frac.max() == 0  # ... and not in FP32


def test_capture_counts_ties_exactly():
    """W_K = 0 in layer 0: every score is 0, so every row with ≥ 2 keys is tied and the max logit is 0."""
    m = tiny_model()
    with torch.no_grad():
        m.transformer.h[0].attn.c_attn.weight[TINY["n_embd"]:2 * TINY["n_embd"]].zero_()
    x, _ = batch(T=16)
    stats = capture_attention_logits(m, x)
    assert np.all(stats.max_logit_per_head[0] == 0)
    np.testing.assert_array_equal(stats.tied_frac_per_head[0], np.full(TINY["n_head"], 15 / 16))
    assert np.all(stats.tied_frac_per_head[1] < 15 / 16)


def test_capture_leaves_forward_unchanged():
    m = tiny_model()
    x, y = batch()
    l0, g0 = loss_and_grads(m, x, y)
    with logit_capture(m) as cap:
        l1, g1 = loss_and_grads(m, x, y)
        l2, _ = loss_and_grads(m, x, y)
    assert torch.equal(l0, l1) and torch.equal(l0, l2) and max_rel_diff(g1, g0) == 0
    assert cap.stats().rows == 2 * x.numel()  # two forward passes were seen
    assert all(b.attn.capture is None for b in m.transformer.h)  # switched off after the block
    with pytest.raises(RuntimeError, match="no forward pass"):
        with logit_capture(m) as cap:
            pass
        cap.stats()


# -- QK-norm (issue 11) ------------------------------------------------------------------------------------
def test_qk_norm_is_off_by_default_and_adds_only_two_gains_per_layer():
    plain, normed = tiny_model(), tiny_model(qk_norm=True)
    assert not GPTConfig().qk_norm
    extra = set(normed.state_dict()) - set(plain.state_dict())
    assert extra == {f"transformer.h.{i}.attn.{n}.weight" for i in range(TINY["n_layer"])
                     for n in ("q_norm", "k_norm")}
    # LayerNorm gains start at 1 and draw no random numbers: every other weight is the same as without
    for k, v in plain.state_dict().items():
        assert torch.equal(v, normed.state_dict()[k]), k
    with pytest.raises(ValueError, match="qk_norm"):
        GPTConfig(qk_norm=1)


@pytest.mark.parametrize("backend", ["sdpa", "naive"])
def test_every_backend_sees_normalised_q_and_k(monkeypatch, backend):
    """The norm sits before the dispatch, so whatever runs the attention (sdpa, naive, reference, the Triton
    kernel) gets q and k with zero mean and unit variance over each head's channels (gains at init = 1)."""
    import lpfail.model as M

    seen = []
    real = M.run_attention

    def spy(spec, q, k, v, state=None):
        seen.append((q.detach().double(), k.detach().double()))
        return real(spec, q, k, v, state)

    monkeypatch.setattr(M, "run_attention", spy)
    m = tiny_model(qk_norm=True).set_attention(backend)
    x, _ = batch()
    m(x)
    assert len(seen) == TINY["n_layer"]
    for q, k in seen:
        for t in (q, k):
            assert t.mean(-1).abs().max() < 1e-5
            assert (t.var(-1, unbiased=False) - 1).abs().max() < 1e-2  # var = σ²/(σ² + 1e-5): σ² is small at init
    # without the norm they are not normalised
    seen.clear()
    tiny_model().set_attention(backend)(x)
    assert max(float((q.var(-1, unbiased=False) - 1).abs().max()) for q, _ in seen) > 0.5


def test_qk_norm_bounds_the_logits():
    """|αqkᵀ| ≤ α·‖q‖‖k‖ = √hs with unit-variance, zero-mean rows (gains 1), however large W_Q grows."""
    m = tiny_model(qk_norm=True)
    with torch.no_grad():
        for block in m.transformer.h:
            block.attn.c_attn.weight.mul_(1000.0)
    x, _ = batch()
    st = capture_attention_logits(m, x, dtype=torch.float32)
    hs = TINY["n_embd"] // TINY["n_head"]
    assert st.max_logit.max() <= hs ** 0.5 * (1 + 1e-4)
