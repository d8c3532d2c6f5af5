"""Attention masks in the diagnosis kit: the reference attention (`lpfail.attention`) and `substitute` take SDPA's
``attn_mask`` — boolean or additive; a padding mask as Hugging Face builds it, a causal mask given as a mask, a
sliding window — and the monitor's logit statistics see only the keys a mask allows."""
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

from lpfail.attention import NonFiniteInputError, attention, naive_attention
from lpfail.monitor import Monitor, Thresholds
from lpfail.precision import FA2_BF16, FP32, FP64, PAPER_BF16
from lpfail.substitute import SubstitutionError, substitute

transformers.logging.set_verbosity_error()
QUIET = Thresholds(max_logit=None, tied_frac=None)
B, H, T, D = 2, 3, 37, 16          # 37: two full tiles of 16 and a partial one


def _qkv(dtype=torch.float32, scale=1.0, seed=0, t=T):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, t, D, generator=g) * scale).to(dtype) for _ in range(3)]


def _masks(t=T):
    """Name → mask, SDPA's convention (bool True = allowed; float added to the scores)."""
    g = torch.Generator().manual_seed(5)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    pad = torch.ones(B, 1, t, t, dtype=torch.bool)
    pad[1, ..., :5] = False                                   # sequence 1: five left-padding keys
    window = causal & ~torch.ones(t, t, dtype=torch.bool).tril(-8)  # each query sees itself and 7 keys back
    bias = torch.randn(B, H, t, t, generator=g).masked_fill(~causal, -math.inf)
    return {"padding+causal": pad & causal, "causal": causal, "sliding window": window, "additive": bias,
            "padding": pad}


def _grads(o, inputs, seed=9):
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(o.dtype)
    return [o.detach()] + list(torch.autograd.grad(o, inputs, do))


# -- the reference attention ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(_masks()))
@pytest.mark.parametrize("dtype, policy, tol", [(torch.float32, FP32, 2e-6), (torch.float64, FP64, 1e-13)],
                         ids=["fp32", "fp64"])
@pytest.mark.parametrize("tiles", [None, 16], ids=["one tile", "tiles of 16"])
def test_reference_with_a_mask_is_sdpa(name, dtype, policy, tol, tiles):
    mask = _masks()[name]
    mask = mask if mask.dtype == torch.bool else mask.to(dtype)
    if tiles is not None:
        policy = dataclasses.replace(policy, block_q=tiles, block_k=tiles)
    ins = [t.requires_grad_() for t in _qkv(dtype)]
    ours = _grads(attention(*ins, policy=policy, causal=False, attn_mask=mask), ins)
    ref_in = [t.detach().clone().requires_grad_() for t in ins]
    theirs = _grads(F.scaled_dot_product_attention(*ref_in, attn_mask=mask), ref_in)
    truth = _grads(naive_attention(*ref_in, causal=False, attn_mask=mask), ref_in)
    errs = [(a.double() - b.double()).abs().max().item() for a, b in zip(ours, theirs)]
    print(name, dtype, tiles, "max |ours − SDPA| (O, dQ, dK, dV):", errs)
    assert max(errs) <= tol
    assert max((a.double() - b).abs().max().item() for a, b in zip(ours, truth)) <= tol
    if name.startswith("padding+"):   # queries 0–4 of sequence 1 see no key: O = 0 and no gradient, as SDPA
        assert torch.equal(ours[0][1, :, :5], torch.zeros_like(ours[0][1, :, :5]))
        assert torch.equal(ours[1][1, :, :5], torch.zeros_like(ours[1][1, :, :5]))


@pytest.mark.parametrize("policy", [PAPER_BF16, FA2_BF16], ids=["PAPER_BF16", "FA2_BF16"])
@pytest.mark.parametrize("tiles", [None, 16], ids=["one tile", "tiles of 16"])
def test_causal_given_as_a_mask_is_causal_bit_for_bit(policy, tiles):
    policy = policy if tiles is None else dataclasses.replace(policy, block_q=tiles, block_k=tiles)
    ins = [t.requires_grad_() for t in _qkv(torch.bfloat16, scale=4.0)]
    causal = _grads(attention(*ins, policy=policy, causal=True), ins)
    as_mask = _grads(attention(*ins, policy=policy, causal=False, attn_mask=_masks()["causal"]), ins)
    assert all(torch.equal(a, b) for a, b in zip(causal, as_mask))
    everything = torch.ones(T, T, dtype=torch.bool)              # a mask that allows every key changes nothing
    plain = _grads(attention(*ins, policy=policy, causal=False), ins)
    assert all(torch.equal(a, b) for a, b in zip(plain, _grads(attention(*ins, policy=policy, causal=False,
                                                                         attn_mask=everything), ins)))


def test_additive_mask_under_paper_bf16_by_hand():
    # one key tile (T < 512): S = round(round(QKᵀ)·α) in BF16, S + M in FP32 rounded to BF16, then chapter 2's
    # PAPER_BF16 steps: BF16 row maximum, S − m rounded to BF16, exp in FP32, ℓ in FP32, P̄ rounded to BF16,
    # P̄V rounded to BF16, O = (0·a + P̄V) in BF16, ℓ stored as BF16, O = Ō / ℓ rounded to BF16
    q, k, v = _qkv(torch.bfloat16, scale=2.0)
    mask = _masks()["additive"].to(torch.bfloat16)
    ours = attention(q, k, v, policy=PAPER_BF16, causal=False, attn_mask=mask)
    alpha = D ** -0.5
    s = ((q @ k.transpose(-1, -2)).float() * alpha).bfloat16()
    s = (s.float() + mask.float()).bfloat16()
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp((s.float() - m.float()).bfloat16().float())
    ell = p.sum(dim=-1, keepdim=True).bfloat16()
    o = p.bfloat16() @ v                                         # BF16 operands, FP32 accumulation, BF16 result
    by_hand = (o.float() / ell.float()).bfloat16()
    assert torch.equal(ours, by_hand)
    assert torch.isfinite(ours).all()


def test_paper_bf16_with_masks_runs_and_its_gradients_are_finite():
    for name, mask in _masks().items():
        mask = mask if mask.dtype == torch.bool else mask.to(torch.bfloat16)
        ins = [t.requires_grad_() for t in _qkv(torch.bfloat16)]
        out = _grads(attention(*ins, policy=PAPER_BF16, causal=False, attn_mask=mask), ins)
        assert all(torch.isfinite(t).all() for t in out), name
        err = (out[0].double() - naive_attention(*ins, causal=False, attn_mask=mask)).abs().max()
        wrong = (out[0].double() - naive_attention(*ins, causal=True)).abs().max()  # another mask's truth
        print(name, f"max |O − O_fp64| {err:.3g} (against the truth without the padding or bias: {wrong:.3g})")
        assert err < 0.05 and (name == "causal" or wrong > 5 * err), name


def test_bad_masks_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="does not broadcast"):
        attention(q, k, v, causal=False, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool .* or floating point"):
        attention(q, k, v, causal=False, attn_mask=torch.ones(T, T, dtype=torch.int64))
    with pytest.raises(ValueError, match="requires grad"):
        attention(q, k, v, causal=False, attn_mask=torch.zeros(T, T, requires_grad=True))
    with pytest.raises(NonFiniteInputError, match="attn_mask"):
        attention(q, k, v, causal=False, attn_mask=torch.full((T, T), math.nan))
    with pytest.raises(TypeError, match="attn_mask"):
        attention(q, k, v, causal=False, attn_mask=[[True]])


# -- substitute -------------------------------------------------------------------------------------------------
class MaskedAttention(nn.Module):
    """One SDPA call on given q, k, v with a given mask (or is_causal): the model `substitute` sees."""

    def forward(self, q, k, v, mask=None, is_causal=False):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)


@pytest.mark.parametrize("name", list(_masks()))
def test_substitute_passes_the_mask_to_the_reference(name):
    model = MaskedAttention()
    mask = _masks()[name]
    q, k, v = _qkv(scale=3.0)
    with torch.no_grad():
        own = model(q, k, v, mask)
        with substitute(model, FP32) as rec:
            fp32 = model(q, k, v, mask)
        with substitute(model, PAPER_BF16):
            bf16 = model(q, k, v, mask)
    assert rec.substituted == 1
    torch.testing.assert_close(fp32, own, rtol=1e-5, atol=1e-5)    # logits up to ≈ 40: FP32 noise of SDPA's order
    assert torch.equal(bf16, attention(q, k, v, policy=PAPER_BF16, causal=False, attn_mask=mask))


def test_substitute_a_causal_call_with_fewer_queries_than_keys():
    # SDPA's is_causal is top-left aligned (query i sees keys j ≤ i), the reference's causal bottom-right: the
    # substitution passes SDPA's mask as a mask
    model = MaskedAttention()
    q, (k, v) = _qkv(t=11)[0], _qkv(t=T)[1:]
    with torch.no_grad():
        own = model(q, k, v, is_causal=True)
        with substitute(model, FP32) as rec:
            ours = model(q, k, v, is_causal=True)
    assert rec.substituted == 1 and (ours - own).abs().max() < 2e-6


def test_substitute_refuses_a_mask_that_requires_grad():
    model = MaskedAttention()
    q, k, v = _qkv()
    bias = torch.zeros(T, T, requires_grad=True)
    with pytest.raises(SubstitutionError, match="requires grad"):
        with substitute(model, FP32):
            model(q, k, v, bias)


def _hf(name, dtype=torch.float32):
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                      attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       attn_implementation="sdpa")
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype)


def _padded_batch(t=12):
    idx = torch.randint(0, 64, (2, t), generator=torch.Generator().manual_seed(3))
    attention_mask = torch.ones(2, t, dtype=torch.long)
    attention_mask[1, :4] = 0                                 # left padding, as for generation
    return idx, attention_mask


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_substitute_on_a_padded_hugging_face_batch(name):
    idx, attention_mask = _padded_batch()
    for dtype, policy, tol in [(torch.float32, FP32, 2e-5), (torch.float64, FP64, 1e-12)]:
        model = _hf(name, dtype)
        with torch.no_grad():
            own = model(idx, attention_mask=attention_mask).logits
            with substitute(model, policy) as rec:
                ours = model(idx, attention_mask=attention_mask).logits
        assert rec.calls == 2 and rec.substituted == 2
        assert (ours - own).abs().max() <= tol, (dtype, (ours - own).abs().max())
    model = _hf(name)
    with substitute(model, PAPER_BF16, layers=[1]):
        loss = model(idx, attention_mask=attention_mask, labels=idx).loss
        loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# -- the monitor ------------------------------------------------------------------------------------------------
def _by_hand(q, k, allowed, nb):
    """Per head: the largest logit α·qkᵀ (FP32) over the allowed keys, and the fraction of rows with an allowed
    key whose BF16-rounded maximum ≥ 2 allowed keys attain, over the first nb sequences."""
    s = (q[:nb].float() @ k[:nb].float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    a = torch.broadcast_to(allowed, s.shape)[:nb]
    s = s.masked_fill(~a, -math.inf)
    sr = s.bfloat16()
    tied = ((sr == sr.amax(dim=-1, keepdim=True)) & a).sum(dim=-1) >= 2
    live = a.any(dim=-1)
    return (s.amax(dim=(0, 2, 3)).double().numpy(),
            ((tied & live).sum(dim=(0, 2)).double() / live[:, 0].sum()).numpy())


@pytest.mark.parametrize("kind", ["bool", "float -inf", "float finfo.min"])
def test_monitor_statistics_see_only_the_allowed_keys(kind):
    # keys 0-4 of sequence 1 are padding with the largest logits (and exact ties among themselves): a statistic
    # that looked at them would see ties and a larger maximum
    q, k, v = _qkv(scale=3.0)
    k[1, :, :5] = k[1, :, 5:6] * 4
    pad = _masks()["padding+causal"]
    mask = {"bool": pad, "float -inf": torch.zeros(pad.shape).masked_fill(~pad, -math.inf),
            "float finfo.min": torch.zeros(pad.shape).masked_fill(~pad, torch.finfo(torch.float32).min)}[kind]
    model = MaskedAttention()
    with Monitor(model, every=1, window=1, sample_batch=2, thresholds=QUIET) as mon, torch.no_grad():
        model(q, k, v, mask)
        rec = mon.step()
    mx, tied = _by_hand(q, k, pad, 2)
    assert np.array_equal(rec["max_logit"][0], mx) and np.allclose(rec["tied_frac"][0], tied, rtol=0, atol=1e-12)
    assert rec["rows"] == [T + T - 5]                          # sequence 1's padding queries see no key
