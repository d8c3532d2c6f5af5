"""The δ signature during training (`TrainConfig.delta_every`, `lpfail.train.step.delta_record`,
`lpfail.gradient_error.delta_signature`): the paper's δ error per layer and head, on rows with a tied BF16 maximum
and on all rows, taken every `delta_every` steps — the mechanism's signature on the dial's long runs. It must
change nothing the run computes, draw nothing from torch's generators, and measure what it says."""
import numpy as np
import pytest
import torch

from lpfail.gradient_error import _causal, _heads, delta_signature, delta_terms, synthetic_inputs, tied_rows
from lpfail.precision import FP32, PAPER_BF16, Precision
from lpfail.train import TrainConfig, read_diag, train

SR = str(PAPER_BF16) + ",rounding=sr,sr_stream=1"


def _cap(seed=0, b=2, t=64, c=32, n_head=2):
    s = synthetic_inputs(b=b, t=t, c=c, n_head=n_head, logit_scale=8.0, seed=seed)
    s["qkv"] = tuple(_heads(s["x"], s[w], n_head).to(torch.bfloat16) for w in ("w_q", "w_k", "w_v"))
    return s


def test_the_signature_splits_the_delta_error_by_the_tie():
    cap = _cap()
    sig = delta_signature(cap, PAPER_BF16)
    q, k, _ = cap["qkv"]
    tied = tied_rows(q, k, q.shape[-1] ** -0.5, _causal(q.shape[-2], q.device))
    assert sig["delta_n_tied"] == [int(v) for v in tied.sum(dim=(0, 2))] and sum(sig["delta_n_tied"]) > 0
    # the all-rows sum is Eq. 2's coefficient sum, as chapter 3's delta_terms forms it
    ref = delta_terms(cap["x"], cap["w_q"], cap["w_k"], cap["w_v"], cap["do"], {"A": PAPER_BF16}, n_head=2,
                      qkv=cap["qkv"])["A"]["sum_dd"]
    np.testing.assert_allclose(sig["delta_all"], ref, rtol=0, atol=0)
    assert all(abs(t) <= sum(abs(v) for v in sig["delta_all"]) + 1 for t in sig["delta_tied"])
    # FP32 attention's δ differs from the exact one only in FP32 rounding
    exact = delta_signature(cap, FP32)
    assert max(map(abs, exact["delta_all"])) < 1e-3 * max(map(abs, sig["delta_all"])) + 1e-6


def test_a_stochastic_policy_takes_its_bits_from_the_key_it_is_given():
    from lpfail.sr_stream import RoundingKey

    cap, sr = _cap(1), Precision.parse(SR)
    before = torch.random.get_rng_state()
    a = delta_signature(cap, sr, RoundingKey(3, 7, (1,)))
    assert torch.equal(torch.random.get_rng_state(), before)  # nothing drawn from torch's generator
    assert a == delta_signature(cap, sr, RoundingKey(3, 7, (1,)))
    assert a["delta_all"] != delta_signature(cap, sr, RoundingKey(3, 8, (1,)))["delta_all"]


@pytest.mark.parametrize("attention", ["PAPER_BF16", SR])
def test_the_signature_changes_nothing_the_run_computes(tmp_path, attention):
    kw = dict(attention=attention, max_steps=6, diag_every=2, autocast="none", device="cpu")
    plain = train(TrainConfig.preset("tiny", **kw), progress=False)
    out = tmp_path / "run"
    watched = train(TrainConfig.preset("tiny", delta_every=4, out_dir=str(out), **kw), progress=False)
    np.testing.assert_array_equal(plain.losses, watched.losses)
    d = read_diag(out)
    assert list(d["step"]) == [0, 2, 4]
    assert d["delta_tied"].shape == (3, 2, 2) and d["delta_n_tied"].shape == (3, 2, 2)
    assert np.isnan(d["delta_all"][1]).all() and np.isfinite(d["delta_all"][[0, 2]]).all()
    assert (d["delta_n_tied"][[0, 2]] >= 0).all() and np.isfinite(d["delta_tied"][[0, 2]]).all()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="multiple of diag_every"):
        TrainConfig.preset("tiny", attention="PAPER_BF16", diag_every=10, delta_every=15)
    with pytest.raises(ValueError, match="reference"):
        TrainConfig.preset("tiny", attention="sdpa", diag_every=10, delta_every=10)
    with pytest.raises(ValueError, match="reference"):
        TrainConfig.preset("tiny", attention="PAPER_BF16", overrides=("0:sdpa",), diag_every=10, delta_every=10)
    with pytest.raises(ValueError, match=">= 0"):
        TrainConfig.preset("tiny", delta_every=-1)
