"""The precision alarm's measurement (issue 26, item 4; `lpfail.monitor.Alarm`): on a sampled step the attention
of the first sequences is recomputed by the FP64 (or FP32) reference from the same inputs, the model's dQ and dK
are compared with it, and the errors pushed back to W_Q and W_K are summed over sampled steps, whose coherence
says whether the error keeps one direction (the paper's signature) or cancels."""
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lpfail.model import GPT, GPTConfig
from lpfail.monitor import Alarm, Monitor, MonitorWarning, Thresholds, coherence, reference_grads, rho
from lpfail.precision import PAPER_BF16
from lpfail.substitute import substitute
from tests.test_kit_failures import GQAttention
from tests.test_monitor import MaskedSDPA, Toy

QUIET = Thresholds(max_logit=None, tied_frac=None)


def _gpt(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=32)).to(dtype)
    with torch.no_grad():   # larger logits, so that BF16 attention errs visibly
        for b in model.transformer.h:
            b.attn.c_attn.weight[:64] *= 4
    return model


def _steps(model, n, policy=None, lr=0.0, same_batch=False, alarm=Alarm(), every=1):
    """n steps of SGD, watched with the alarm on every step; `policy`: the attention substituted by it."""
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    fixed = torch.randint(0, 64, (2, 33), generator=g)
    losses = []
    with Monitor(model, every=every, window=every, sample_batch=2, thresholds=QUIET, alarm=alarm) as mon, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        for _ in range(n):
            idx = fixed if same_batch else torch.randint(0, 64, (2, 33), generator=g)
            if policy is None:
                loss = model(idx[:, :-1], idx[:, 1:])[1]
                loss.backward()
            else:
                with substitute(model, policy):
                    loss = model(idx[:, :-1], idx[:, 1:])[1]
                    loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            mon.step()
    return mon, losses


@pytest.mark.slow
def test_the_error_is_zero_when_the_attention_is_already_exact():
    mon64, _ = _steps(_gpt(torch.float64), 1)
    mon32, _ = _steps(_gpt(torch.float32), 1)
    r64, r32 = mon64.records[0], mon32.records[0]
    assert np.shape(r64["alarm_dq_rel"]) == (2, 4) and "alarm_skipped" not in r64
    assert np.max(r64["alarm_dq_rel"]) < 1e-12 and np.max(r64["alarm_dk_rel"]) < 1e-12
    assert np.max(r32["alarm_dq_rel"]) < 1e-5 and np.max(r32["alarm_dk_rel"]) < 1e-5
    assert np.min(r32["alarm_dq_rel"]) > 0       # FP32's own rounding is seen, not zero by construction
    by_fp32, _ = _steps(_gpt(torch.float32), 1, alarm=Alarm(reference="FP32"))   # the tiled FP32 reference
    assert np.max(by_fp32.records[0]["alarm_dq_rel"]) < 1e-5


def test_the_error_is_clear_under_paper_bf16():
    mon, _ = _steps(_gpt(), 1, policy=PAPER_BF16)
    rec = mon.records[0]
    assert np.min(rec["alarm_dq_rel"]) > 1e-3 and np.min(rec["alarm_dk_rel"]) > 1e-3
    print("PAPER_BF16 dQ relative errors:", np.round(rec["alarm_dq_rel"], 4))


def test_coherence_of_known_sequences():
    g = torch.Generator().manual_seed(0)
    d = torch.randn(3, 50, generator=g)                           # 3 heads, one direction each
    size = torch.rand(400, 1, 1, generator=g) + 0.5
    same = size * d                                               # (K, H, n): one sign throughout
    signs = torch.randint(0, 2, (400, 1, 1), generator=g) * 2.0 - 1
    random_sign = signs * same
    random_dir = torch.randn(400, 3, 50, generator=g)
    assert torch.allclose(coherence(same), torch.ones(3, dtype=torch.float64), atol=1e-12)
    assert (coherence(random_sign) < 0.12).all() and (coherence(random_dir) < 0.12).all()
    k = torch.ones(100, 1, 4)
    assert torch.allclose(rho(k), torch.tensor([10.0], dtype=torch.float64))   # √K for equal parallel terms
    draws = torch.randint(0, 2, (400, 300, 1), generator=g) * 2.0 - 1              # 300 sign draws, one head
    r = rho(draws * same[:, :1])                                                   # (300,)
    assert abs(float((r ** 2).mean()) - 1) < 0.2   # E ρ² = 1 for random signs (chapter 3's null)
    assert torch.isnan(coherence(torch.zeros(5, 2, 3))).all()


def test_repeated_identical_steps_give_a_coherent_error():
    # lr 0 and one batch: every measurement's error term is the same matrix, so the window's sum is K times
    # it: coherence 1, ρ = √K (the sketch is linear, so this holds exactly for the sketched terms too)
    mon, _ = _steps(_gpt(), 3, policy=PAPER_BF16, same_batch=True, alarm=Alarm(window=2))
    first, last = mon.records[0], mon.records[-1]
    assert first["alarm_coherence_q"] == [None, None] and first["alarm_terms"] == [1, 1]
    assert last["alarm_terms"] == [2, 2]
    np.testing.assert_allclose(last["alarm_coherence_q"], 1.0, atol=1e-9)
    np.testing.assert_allclose(last["alarm_coherence_k"], 1.0, atol=1e-9)
    np.testing.assert_allclose(last["alarm_rho_q"], math.sqrt(2), rtol=1e-9)
    assert mon.scalars()["attn/layer0/alarm_coherence_q"] == pytest.approx(1.0)
    # different batches: the error terms differ, the coherence is below 1
    mon2, _ = _steps(_gpt(), 2, policy=PAPER_BF16, alarm=Alarm(window=2))
    assert np.max(mon2.records[-1]["alarm_coherence_q"]) < 1 - 1e-6


def test_the_error_reaching_w_q_is_the_chain_rule_by_hand():
    # lpfail's GPT: q = X W_Qᵀ (fused c_attn, no RoPE), so the error that reaches W_Q^h is ΔdQ^hᵀ X summed
    # over the sampled sequences; the alarm gets it by autograd through the model's own graph
    model = _gpt()
    seen = {}
    attn = model.transformer.h[1].attn
    attn.c_attn.register_forward_hook(lambda m, i, o: seen.update(x=i[0].detach()))
    orig = attn.attend

    def attend(q, k, v):
        seen["qkv"] = (q.detach(), k.detach(), v.detach())
        q.register_hook(lambda g: None if "dq" in seen else seen.update(dq=g.detach()))  # the first: the model's
        out = orig(q, k, v)
        out.register_hook(lambda g: seen.update(do=g.detach()))
        return out
    attn.attend = attend
    mon, _ = _steps(model, 1, policy=PAPER_BF16, alarm=Alarm(reference="FP64"))
    q, k, v = seen["qkv"]
    dq_ref, _ = reference_grads(q, k, v, seen["do"], True, None, "FP64")
    delta = seen["dq"].double() - dq_ref                                   # (B, H, T, hs)
    e = torch.einsum("bhtd,btc->hdc", delta.float().double(), seen["x"].double())  # (H, hs, C)
    (sq, _), = mon._alarm.windows[1]
    np.testing.assert_allclose(sq.numpy(), mon._alarm.sketch(e).numpy(), rtol=1e-6, atol=1e-12)
    assert np.abs(mon._alarm.sketch(e).numpy()).max() > 0


def test_the_alarm_does_not_change_training():
    def run(alarm):
        model = _gpt()
        mon, losses = _steps(model, 3, policy=PAPER_BF16, lr=0.05, alarm=alarm)
        return losses, [p.detach().clone() for p in model.parameters()]
    (la, pa), (lb, pb) = run(Alarm()), run(None)
    assert la == lb and all(torch.equal(a, b) for a, b in zip(pa, pb))


def test_what_the_alarm_cannot_recompute_is_said():
    torch.manual_seed(0)
    model = Toy(MaskedSDPA)
    idx = torch.randint(0, 32, (2, 12))
    with Monitor(model, every=1, window=1, thresholds=QUIET, alarm=Alarm()) as mon:
        model(idx, idx).backward()
        rec = mon.step()
        with torch.no_grad():
            model(idx, idx)
        rec2 = mon.step()
    assert any("attn_mask" in s for s in rec["alarm_skipped"])
    assert any("no gradient" in s for s in rec2["alarm_skipped"])


def test_bad_alarm_settings():
    with pytest.raises(ValueError, match="reference"):
        Alarm(reference="BF16")
    with pytest.raises(ValueError, match="window"):
        Alarm(window=1)
    with pytest.raises(ValueError, match="multiple of every"):
        Monitor(_gpt(), every=10, window=10, alarm=Alarm(every=15))


def test_grouped_query_attention_dk_has_the_key_heads():
    torch.manual_seed(0)
    model = nn.Sequential(GQAttention(), GQAttention())
    x = torch.randn(2, 6, 32)
    with Monitor(model, every=1, window=1, sample_batch=2, thresholds=QUIET, alarm=Alarm()) as mon:
        model(x).square().mean().backward()
        rec = mon.step()
        model(x).square().mean().backward()
        rec = mon.step()
    assert np.shape(rec["alarm_dq_rel"]) == (2, 4) and np.shape(rec["alarm_dk_rel"]) == (2, 2)
    assert np.max(rec["alarm_dq_rel"]) < 1e-5 and len(rec["alarm_coherence_k"][0]) == 2


def test_the_tested_rule_applies_to_a_monitors_records():
    """Chapter 7's rule (`ScaledRule`, pre-registered in the experiment, which re-exports the library's) on the records
    of a user's own monitor: it fires where the paper's arithmetic makes the error per unit of logit large, and not
    where the attention is exact."""
    from lpfail.experiments import precision_alarm as P
    from lpfail.monitor import ScaledRule, scaled_fires, scaled_statistic

    assert P.scaled_fires is scaled_fires and P.SCALED_RULE == ScaledRule()
    # the values registered on 2026-12-06 (a library default must not drift from the tested rule)
    assert (P.SCALED_RULE.threshold, P.SCALED_RULE.consecutive, P.SCALED_RULE.logit_floor) == (5e-4, 8, 1.0)
    bf16, _ = _steps(_gpt(), 4, policy=PAPER_BF16)
    fp32, _ = _steps(_gpt(), 4)
    lo = ScaledRule(threshold=1e-5, consecutive=3)
    assert [r["step"] for r in bf16.records] == [0, 1, 2, 3]
    assert min(scaled_statistic(r) for r in bf16.records) > 1e-5 > max(scaled_statistic(r) for r in fp32.records)
    assert scaled_fires(bf16.records, lo) == 2 and scaled_fires(fp32.records, lo) is None
    assert scaled_fires(bf16.records, ScaledRule(threshold=1e-5, consecutive=5)) is None   # only 4 measurements


def test_relative_error_against_a_zero_reference_is_not_infinite():
    """‖a − ref‖/‖ref‖ with ref = 0 means nothing: NaN (or `na`) whatever a is, never ±∞; other heads as before."""
    from lpfail.alarm import relative_error

    ref = torch.zeros(1, 3, 2, 4, dtype=torch.float64)
    ref[:, 2] = 2.0
    a = torch.zeros_like(ref)
    a[:, 1] = 1e-9
    a[:, 2] = 2.5
    got = relative_error(a, ref)
    assert math.isnan(got[0]) and math.isnan(got[1]) and got[2].item() == 0.25
    assert relative_error(a, ref, na=-1.0).tolist() == [-1.0, -1.0, 0.25]
    a[:, 2] = math.nan                                   # the model's own NaN stays NaN
    assert math.isnan(relative_error(a, ref, na=-1.0)[2])


@pytest.mark.parametrize("policy", [None, PAPER_BF16], ids=["sdpa", "paper_bf16"])
def test_at_sequence_length_one_the_relative_errors_are_not_applicable(policy, tmp_path):
    """One key per query: the reference dQ and dK are exactly 0, so the record holds None for them (once NaN or
    inf, whichever the model's own rounding gave), the JSONL line is strict JSON, and the rule sees no value."""
    from lpfail.alarm import scaled_fires

    model = _gpt()
    idx = torch.randint(0, 64, (2, 2), generator=torch.Generator().manual_seed(1))
    with Monitor(model, every=1, window=1, sample_batch=2, thresholds=QUIET, alarm=Alarm(),
                 path=tmp_path / "m.jsonl") as mon, warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        with substitute(model, policy) if policy is not None else torch.enable_grad():
            model(idx[:, :1], idx[:, 1:])[1].backward()
        rec = mon.step()
    assert rec["alarm_dq_rel"] == [[None] * 4] * 2 and rec["alarm_dk_rel"] == [[None] * 4] * 2
    assert '"alarm_dq_rel": [[null, null, null, null], [null, null, null, null]]' in (tmp_path / "m.jsonl").read_text()
    assert scaled_fires([rec]) is None
