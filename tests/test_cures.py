"""The cures added as knobs for experiment `cures`: output-residual compensation, the dS row-sum correction,
z-loss and the output-logit soft-cap. Each is off by default and leaves every existing cache key alone."""
import math

import pytest
import torch

from lpfail.attention import (attention, flash_backward, flash_forward, naive_attention, output_residual)
from lpfail.model import GPT, GPTConfig
from lpfail.precision import FA2_BF16, FP32, PAPER_BF16, PRESETS, Precision
from lpfail.train import TrainConfig, z_loss_term
from lpfail.train.step import _loss


def _qkv(seed, shift=0.0, T=128, D=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(D, generator=g)
    u = u / u.norm()
    q = torch.randn(1, 2, T, D, generator=g)
    k = torch.randn(1, 2, T, D, generator=g) * (0.5 if shift else 1.0) + shift * u
    v = torch.randn(1, 2, T, D, generator=g)
    do = torch.randn(1, 2, T, D, generator=g)
    return [t.bfloat16().to(dtype) for t in (q, k, v, do)] + [u.double()]


def _grads(policy, q, k, v, do):
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    attention(qq, kk, vv, policy).backward(do)
    return [t.grad.double() for t in (qq, kk, vv)]


def _truth(q, k, v, do):
    qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
    naive_attention(qq, kk, vv).backward(do.double())
    return [t.grad for t in (qq, kk, vv)]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# -- the policy knobs ------------------------------------------------------------------------------------------
def test_knobs_round_trip_and_leave_presets_alone():
    for preset in PRESETS.values():
        assert "ds_rowsum" not in str(preset) and "dO.O_res" not in str(preset)
    p = PAPER_BF16.replace(delta="dO.O_res", ds_rowsum=True)
    assert str(p).endswith(",ds_rowsum=true") and "delta=dO.O_res" in str(p)
    assert Precision.parse(str(p)) == p
    assert Precision.parse("FA2_BF16,ds_rowsum=true") == FA2_BF16.replace(ds_rowsum=True)
    with pytest.raises(ValueError, match="ds_rowsum must be 'true' or 'false'"):
        Precision.parse("FA2_BF16,ds_rowsum=yes")
    with pytest.raises(ValueError, match="ds_rowsum must be True or False"):
        FA2_BF16.replace(ds_rowsum=1)


def test_kernels_refuse_the_reference_only_cures():
    kernels = pytest.importorskip("lpfail.kernels")
    for p in (FA2_BF16.replace(delta="dO.O_res"), FA2_BF16.replace(ds_rowsum=True)):
        with pytest.raises(ValueError, match="not implemented in the Triton kernels"):
            kernels.kernel_policy(p)


# -- output-residual compensation -----------------------------------------------------------------------------
def test_residual_is_zero_when_the_output_is_not_rounded():
    q, k, v, do, _ = _qkv(0)
    assert all(torch.equal(a, b) for a, b in zip(_grads(FP32.replace(delta="dO.O_res"), q, k, v, do),
                                                 _grads(FP32, q, k, v, do)))
    res = flash_forward(q, k, v, FP32)
    assert not output_residual(res, FP32).any()


def test_residual_recovers_the_high_precision_output():
    q, k, v, _, _ = _qkv(1)
    res = flash_forward(q, k, v, PAPER_BF16)
    r = output_residual(res, PAPER_BF16)
    assert r.dtype == torch.bfloat16 and r.any()
    o_hp = res.o_unnorm.float() / res.l.float()
    assert ((res.o.float() + r.float() - o_hp).abs().max() < (res.o.float() - o_hp).abs().max() / 50)


@pytest.mark.parametrize("base", [PAPER_BF16, FA2_BF16], ids=["PAPER_BF16", "FA2_BF16"])
def test_residual_compensation_shrinks_the_q_and_k_gradient_error(base):
    for seed in range(3):
        q, k, v, do, _ = _qkv(seed, dtype=torch.bfloat16)
        truth = _truth(q, k, v, do)
        plain = _grads(base, q, k, v, do)
        comp = _grads(base.replace(delta="dO.O_res"), q, k, v, do)
        assert _rel(comp[0], truth[0]) < _rel(plain[0], truth[0])
        assert _rel(comp[1], truth[1]) < _rel(plain[1], truth[1])
        assert torch.equal(comp[2], plain[2])  # dV does not read δ


def test_backward_without_the_residual_is_an_error():
    q, k, v, do, _ = _qkv(0)
    p = FA2_BF16.replace(delta="dO.O_res")
    res = flash_forward(q, k, v, p)
    with pytest.raises(ValueError, match="output residual"):
        flash_backward(q, k, v, res.o, res.lse, do, p)
    dq, _, _ = flash_backward(q, k, v, res.o, res.lse, do, p, o_residual=output_residual(res, p))
    assert torch.equal(dq.double(), _grads(p, q, k, v, do)[0])


# -- the dS row-sum correction ----------------------------------------------------------------------------------
def test_rowsum_correction_is_exact_noop_without_a_16_bit_ds():
    q, k, v, do, _ = _qkv(2, shift=4.0)
    a = _grads(FA2_BF16.replace(ds="fp32", ds_rowsum=True), q, k, v, do)
    b = _grads(FA2_BF16.replace(ds="fp32"), q, k, v, do)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_rowsum_correction_removes_the_mean_key_leak():
    """Keys with a large common component u: the BF16 cast of dS has a nonzero row sum, which dQ turns into
    a multiple of the mean key. The correction brings the error along u down to what an FP32 dS leaves."""
    for seed in range(3):
        q, k, v, do, u = _qkv(seed, shift=8.0)
        truth = _truth(q, k, v, do)[0]
        along = lambda p: ((_grads(p, q, k, v, do)[0] - truth) @ u).abs().mean().item()  # noqa: E731
        plain, fixed, fp32 = along(FA2_BF16), along(FA2_BF16.replace(ds_rowsum=True)), along(FA2_BF16.replace(ds="fp32"))
        assert fixed < 0.9 * plain
        assert abs(fixed - fp32) < 0.1 * fp32


def test_rowsum_correction_under_causal_masking_keeps_masked_gradients_zero():
    q, k, v, do, _ = _qkv(3, shift=4.0, T=70)
    g = _grads(FA2_BF16.replace(ds_rowsum=True), q, k, v, do)
    assert all(torch.isfinite(x).all() for x in g)
    # the last key is seen only by the last query: its dK is that one row's dS times q, corrected or not
    assert _rel(g[1], _truth(q, k, v, do)[1]) < 0.02


# -- z-loss and the output soft-cap -----------------------------------------------------------------------------
def test_z_loss_term_and_training_loss():
    logits = torch.randn(2, 5, 11) * 3
    y = torch.randint(0, 11, (2, 5))
    want = 1e-3 * (torch.logsumexp(logits, -1) ** 2).mean()
    assert torch.allclose(z_loss_term(logits, 1e-3), want)
    base = _loss(TrainConfig(), logits, y)
    assert torch.equal(_loss(TrainConfig(z_loss=1e-3), logits, y), base + z_loss_term(logits, 1e-3))
    with pytest.raises(ValueError, match="z_loss"):
        TrainConfig(z_loss=-1.0)


def test_softcap_bounds_the_logits_and_is_off_by_default():
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=16)
    plain = GPT(cfg)
    with torch.no_grad():
        plain.lm_head.weight.mul_(200)
    capped = GPT(GPTConfig(**{**cfg.__dict__, "logit_softcap": 5.0}))
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 32, (2, 8))
    a, _ = plain(idx)
    b, _ = capped(idx)
    assert a.abs().max() > 5 and b.abs().max() <= 5  # tanh saturates to 1.0 in FP32
    assert torch.allclose(b, 5 * torch.tanh(a / 5))
    assert TrainConfig(logit_softcap=5.0).gpt_config(32).logit_softcap == 5.0
    with pytest.raises(ValueError, match="logit_softcap"):
        GPTConfig(logit_softcap=-1.0)


def test_new_fields_leave_stored_lr_sweep_runs_found():
    """run_hash drops fields at their defaults: every stored lr_sweep run is still found for the grid. A_sr's,
    first run under the first stream of stochastic rounding (torch's generators), were trained again under the
    counter-based one (its attention string names the stream: rounding=sr,sr_stream=1): both versions are stored,
    and the grid reads the current one."""
    from lpfail import sweep
    from lpfail.experiments import lr_sweep as ls

    runs, _ = ls.STORE.load()
    if not runs:
        pytest.skip("no stored lr_sweep parts in this checkout")
    lk = sweep.lookup(ls.lr_sweep_grid())
    stored = {r.id for r in lk.runs} & set(runs)
    old_sr = {r for r in stored if "/A_sr/" in r}
    assert stored - old_sr and set(lk.have) == stored  # every stored run is recognised
    assert not lk.retired and lk.superseded == old_sr  # A_sr: both streams stored, the current one read
