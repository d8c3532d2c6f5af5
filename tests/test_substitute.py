"""lpfail.substitute: the reference attention in any SDPA-calling model, per call position and head."""
import pytest
import torch

from lpfail.model import GPT, GPTConfig
from lpfail.precision import FP32, PAPER_BF16
from lpfail.substitute import SubstitutionError, substitute
from tests.test_monitor import PackedSDPA, Toy


def _gpt(n_layer=3, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=n_layer, n_head=4, n_embd=32))


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 64, (2, 32), generator=g)
    return idx, torch.roll(idx, -1, 1)


def _block_outputs(model, idx):
    outs = []
    hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o.detach().clone())) for b in model.transformer.h]
    try:
        logits, _ = model(idx)
    finally:
        for h in hooks:
            h.remove()
    return outs, logits


def test_fp32_policy_reproduces_the_fp32_model():
    model = _gpt()
    idx, _ = _batch()
    with torch.no_grad():
        plain, _ = model(idx)
        with substitute(model, FP32) as rec:
            sub, _ = model(idx)
    assert rec.calls == 3 and rec.substituted == 3 and rec.calls_per_forward == {3}
    torch.testing.assert_close(sub, plain, rtol=1e-5, atol=1e-5)
    # and it is bit for bit what the model's own "reference" override computes
    with torch.no_grad():
        own, _ = model.set_attention("reference", FP32)(idx)
    assert torch.equal(sub, own)


def test_one_layer_changes_only_from_that_layer_on():
    model = _gpt()
    idx, _ = _batch()
    with torch.no_grad():
        plain, _ = _block_outputs(model, idx)
        with substitute(model, PAPER_BF16, layers=[1]):
            sub, _ = _block_outputs(model, idx)
    assert torch.equal(sub[0], plain[0])
    assert not torch.equal(sub[1], plain[1]) and not torch.equal(sub[2], plain[2])
    with torch.no_grad():
        own, _ = _block_outputs(model.set_attention("reference", PAPER_BF16, layers=[1]), idx)
    assert all(torch.equal(a, b) for a, b in zip(sub, own))


def test_heads_and_gradients_match_the_models_override():
    idx, tgt = _batch()
    a = _gpt()
    with substitute(a, PAPER_BF16, layers=2, heads=[1, 3]):
        loss_a = a(idx, tgt)[1]
        loss_a.backward()
    b = _gpt().set_attention("reference", PAPER_BF16, layers=[2], heads=[1, 3])
    loss_b = b(idx, tgt)[1]
    loss_b.backward()
    assert torch.equal(loss_a, loss_b)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad), n
    # outside the block the model is itself again
    c = _gpt()
    assert torch.equal(a(idx, tgt)[1], c(idx, tgt)[1])


def test_a_model_we_did_not_write():
    torch.manual_seed(0)
    model = Toy(PackedSDPA)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(idx, idx)
        with substitute(model, "FP32"):
            fp32 = model(idx, idx)
        with substitute(model, "PAPER_BF16", layers=[0]):
            bf16 = model(idx, idx)
    assert abs(fp32 - plain) < 1e-5
    assert bf16 != plain


def test_errors():
    model = _gpt(2)
    idx, _ = _batch()
    with pytest.raises(SubstitutionError, match="at most 2 SDPA calls"):
        with substitute(model, FP32, layers=[5]), torch.no_grad():
            model(idx)
    with pytest.raises(SubstitutionError, match="head 7 requested"):
        with substitute(model, FP32, heads=[7]), torch.no_grad():
            model(idx)
    with pytest.raises(SubstitutionError, match="no call of"):
        with substitute(model, FP32):
            pass
    with pytest.raises(TypeError, match="nn.Module"):
        with substitute(lambda x: x, FP32):
            pass
    with pytest.raises(ValueError, match="repeated"):
        with substitute(model, FP32, layers=[0, 0]):
            pass

    class Dropout(torch.nn.Module):  # masks are substituted (tests/test_kit_masks.py); dropout is refused
        def forward(self, q):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1)

    dropout = Dropout()
    with pytest.raises(SubstitutionError, match="dropout_p=0.1"):
        with substitute(dropout, FP32):
            dropout(torch.randn(1, 1, 4, 8))
