"""Tests of the reference attention (`lpfail.attention`) against float64 truth and against hand arithmetic.

* FP64 policy = naive float64 attention to ~1e-12 (output and all three gradients), over odd lengths, tile
  sizes (one tile included), head dims, causal or not, and all three δ sources.
* The fix (Algorithm 3) leaves the FP64 result unchanged on inputs built to have tied maxima, and both of its
  branches are seen to fire (ForwardResult.fix_pos / fix_neg, and the final m).
* BF16 policies stay within BF16 tolerance of the truth, FP32 within ~1e-5.
* A three-key row whose PAPER_BF16 result is worked out by hand (the paper's §4 addition), and the fix
  turning it into the correctly rounded value; the official l_clamp shrinking a row with a tied maximum ≈ 30.
* δ sources in BF16: dO.O_hp and dP.P give a smaller dQ error than dO.O on rows with ties.
* forward_from_scores runs the same code path as attention (bit-identical), and bad inputs raise.
* ℓ summed from P̄ (l_from="pbar", flash-attention PR #2721): the normaliser matches the numerator (V ≡ c gives c
  to FP32 rounding, ℓ from P does not), against float64 with every other cast FP64, and within BF16 tolerance.

Run `pytest -s tests/test_attention_ref.py` to see the measured errors.
"""
from __future__ import annotations

import math

import pytest
import torch

from lpfail.attention import (
    FA2_BF16,
    FP32,
    FP64,
    PAPER_BF16,
    PAPER_BF16_OFFICIAL_FIX,
    attention,
    flash_backward,
    flash_forward,
    forward_from_scores,
    naive_attention,
)


def rand(*shape, seed, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def run(fn, q, k, v, do):
    """Output and (dq, dk, dv) of fn(q, k, v) for the upstream gradient do."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(do.to(o.dtype))
    return o, q.grad, k.grad, v.grad


def max_err(x, ref):
    """max |x − ref| / max |ref| (one number per tensor)."""
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def rel_err(x, ref):
    """‖x − ref‖ / ‖ref‖ (Frobenius)."""
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


# ---------------------------------------------------------------------------------------------------
# FP64 = truth
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocks", [(32, 48), (None, None), (64, 16)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seqs", [(113, 203), (97, 97), (64, 64)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("causal", [False, True])
def test_fp64_equals_naive(causal, seqs, d, blocks):
    tq, tk = seqs
    policy = FP64.replace(block_q=blocks[0], block_k=blocks[1])
    q, k, v = rand(1, 2, tq, d, seed=1), rand(1, 2, tk, d, seed=2), rand(1, 2, tk, d, seed=3)
    do = rand(1, 2, tq, d, seed=4)
    truth = run(lambda *a: naive_attention(*a, causal=causal), q, k, v, do)
    ours = run(lambda *a: attention(*a, policy=policy, causal=causal), q, k, v, do)
    errs = [max_err(x, t) for x, t in zip(ours, truth)]
    print(f"FP64 {policy.block_q}x{policy.block_k} causal={causal} {tq}x{tk} d={d}: O, dQ, dK, dV", errs)
    assert ours[0].dtype == torch.float64
    assert max(errs) < 1e-12


@pytest.mark.parametrize("delta", ["dO.O", "dO.O_hp", "dP.P"])
@pytest.mark.parametrize("causal", [False, True])
def test_fp64_delta_sources_agree(delta, causal):
    """All three δ sources are the same number in exact arithmetic; in FP64 they agree to ~1e-12."""
    policy = FP64.replace(block_q=32, block_k=48, delta=delta)
    q, k, v = rand(2, 2, 97, 64, seed=5), rand(2, 2, 131, 64, seed=6), rand(2, 2, 131, 64, seed=7)
    do = rand(2, 2, 97, 64, seed=8)
    truth = run(lambda *a: naive_attention(*a, causal=causal), q, k, v, do)
    ours = run(lambda *a: attention(*a, policy=policy, causal=causal), q, k, v, do)
    errs = [max_err(x, t) for x, t in zip(ours[1:], truth[1:])]
    print(delta, errs)
    assert max(errs) < 1e-12


def test_lse_is_logsumexp():
    q, k, v = rand(1, 3, 70, 64, seed=9), rand(1, 3, 90, 64, seed=10), rand(1, 3, 90, 64, seed=11)
    res = flash_forward(q, k, v, FP64.replace(block_k=32), causal=True)
    s = (q @ k.transpose(-1, -2)) / 8.0
    s = s.masked_fill(torch.ones(70, 90, dtype=torch.bool).triu(90 - 70 + 1), -math.inf)
    assert torch.allclose(res.lse, torch.logsumexp(s, dim=-1, keepdim=True), rtol=0, atol=1e-12)
    assert torch.allclose(res.o_unnorm / res.l, res.o, rtol=0, atol=1e-15)
    assert res.fix_pos.sum() == 0 and res.fix_neg.sum() == 0


# ---------------------------------------------------------------------------------------------------
# the fix: exact arithmetic unchanged, both branches taken
# ---------------------------------------------------------------------------------------------------
def tied_inputs(sign: int, t=97, d=64, seed=0, dtype=torch.float64):
    """q, k, v whose rows (all but row 0 under causal masking) have their maximum score at two identical
    keys 0 and 1. sign=+1: the tied maximum is ≈ +5; sign=−1: every score is negative, the tied maximum ≈ −2."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(1, 2, 1, d, generator=g, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    q = 0.05 * torch.randn(1, 2, t, d, generator=g, dtype=torch.float64) + 4.0 * u
    if sign > 0:
        k = torch.randn(1, 2, t, d, generator=g, dtype=torch.float64)
        k[:, :, :2] = 10.0 * u                 # q·k·α ≈ 4·10/8 = 5 for keys 0 and 1
    else:
        k = 0.05 * torch.randn(1, 2, t, d, generator=g, dtype=torch.float64) - 8.0 * u   # scores ≈ −4
        k[:, :, :2] = -4.0 * u                 # the least negative, tied: ≈ −2
    v = torch.randn(1, 2, t, d, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sign", [+1, -1], ids=["positive", "negative"])
def test_fix_leaves_fp64_unchanged(sign, causal):
    q, k, v = tied_inputs(sign)
    do = rand(1, 2, 97, 64, seed=12)
    for block_k in (None, 48):
        policy = FP64.replace(block_q=32, block_k=block_k)
        fixed = policy.with_fix()
        plain_res, fixed_res = flash_forward(q, k, v, policy, causal), flash_forward(q, k, v, fixed, causal)
        # the branch was taken in every row that sees both tied keys (row 0 sees only key 0 under causal)
        rows = slice(1, None) if causal else slice(None)
        counter, other = (fixed_res.fix_pos, fixed_res.fix_neg) if sign > 0 else (fixed_res.fix_neg, fixed_res.fix_pos)
        assert (counter[..., rows] >= 1).all() and other.sum() == 0
        scores = (q @ k.transpose(-1, -2)) / 8.0
        tied = scores[..., rows, 0:1]
        if sign > 0 and block_k is None:      # one tile: m = β·r_m exactly
            assert torch.equal(fixed_res.m[..., rows, :], 2.0 * tied)
        if sign < 0:                          # m' = 0 beats every (negative) later block maximum
            assert (fixed_res.m[..., rows, :] == 0).all() and (tied < 0).all()
        assert (plain_res.m[..., rows, :] == tied).all()
        # …and the result is the same number
        truth = run(lambda *a: naive_attention(*a, causal=causal), q, k, v, do)
        ours = run(lambda *a: attention(*a, policy=fixed, causal=causal), q, k, v, do)
        errs = [max_err(x, t) for x, t in zip(ours, truth)]
        print(f"fix sign={sign} causal={causal} block_k={block_k}:", errs)
        assert max(errs) < 1e-12


def test_fix_ignores_masked_entries_unless_official():
    """Our fix never counts masked entries as ties; the official masking (masked_ties=True) counts a fully
    masked key tile's masked scores as tied with r_m < 0, which sets m' = 0 in rows whose maximum is < 0."""
    q, k, v = tied_inputs(-1, t=64)
    policy = FP64.replace(block_q=16, block_k=16).with_fix(eps=0.0)   # ε = 0: only the duplicated keys tie
    ours = flash_forward(q, k, v, policy, causal=True)
    official = flash_forward(q, k, v, policy.replace(masked_ties=True), causal=True)
    # row 0 sees key 0 only (no tie): ours never fires there; the official masking fires in tiles 1, 2, 3
    assert ours.fix_neg[..., 0].tolist() == [[0, 0]]
    assert official.fix_neg[..., 0].tolist() == [[3, 3]]
    assert (ours.m[..., 0, 0] < 0).all() and (official.m[..., 0, 0] == 0).all()
    # rows 16..: the tied tile fires in both; the official masking adds one per fully masked later tile
    assert (ours.fix_neg[..., 1:] == 1).all()
    assert official.fix_neg[..., 17].tolist() == [[3, 3]] and official.fix_neg[..., 63].tolist() == [[1, 1]]
    assert torch.allclose(ours.o, official.o, rtol=0, atol=1e-12)   # exact arithmetic: same output


# ---------------------------------------------------------------------------------------------------
# BF16 and FP32 policies against the truth
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [(False, 113, 203, 64), (True, 128, 128, 64), (True, 96, 160, 128)],
                         ids=lambda c: f"causal={c[0]}-{c[1]}x{c[2]}-d{c[3]}")
@pytest.mark.parametrize("policy", [PAPER_BF16, PAPER_BF16.with_fix(), PAPER_BF16_OFFICIAL_FIX, FA2_BF16,
                                    FA2_BF16.with_fix(), FA2_BF16.replace(sub="fma"), FP32,
                                    FA2_BF16.replace(l_from="pbar"), PAPER_BF16.with_fix().replace(l_from="pbar")],
                         ids=["PAPER_BF16", "PAPER_BF16+fix", "OFFICIAL_FIX", "FA2_BF16", "FA2_BF16+fix",
                              "FA2_BF16-fma", "FP32", "FA2_BF16-l_from_pbar", "PAPER_BF16+fix-l_from_pbar"])
def test_low_precision_within_tolerance(policy, case):
    causal, tq, tk, d = case
    dtype = torch.float32 if policy == FP32 else torch.bfloat16
    policy = policy.replace(block_q=64, block_k=48)   # several tiles, partial ones at the end
    q, k, v = rand(2, 2, tq, d, seed=13, dtype=dtype), rand(2, 2, tk, d, seed=14, dtype=dtype), \
        rand(2, 2, tk, d, seed=15, dtype=dtype)
    do = rand(2, 2, tq, d, seed=16, dtype=dtype)
    truth = run(lambda *a: naive_attention(*a, causal=causal), q, k, v, do)
    ours = run(lambda *a: attention(*a, policy=policy, causal=causal), q, k, v, do)
    errs = [rel_err(x, t) for x, t in zip(ours, truth)]
    print(f"{policy.name[:40]} {case}: relative error O, dQ, dK, dV", ["%.1e" % e for e in errs])
    assert ours[0].dtype == policy.dtype("out")
    assert all(g.dtype == dtype for g in ours[1:])
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    assert max(errs) < bound
    if dtype == torch.bfloat16:
        assert max(errs) > 1e-4        # it really ran in BF16


# ---------------------------------------------------------------------------------------------------
# a row worked out by hand (chapter 4, Rounding; the paper's §4 addition)
# ---------------------------------------------------------------------------------------------------
HAND_S = torch.tensor([[6.0, 6.0, -1.0]], dtype=torch.float64)                  # two tied maxima
HAND_V = torch.tensor([[-2.40625], [-2.296875], [-1.0]], dtype=torch.float64)   # the paper's two terms


def test_hand_row_paper_bf16():
    """PAPER_BF16, one tile. m = 6, so P̄ = (1, 1, exp(−7)) and BF16(exp(−7)) = 0.000911712646484375.
    P̄V in FP32: −2.40625 − 2.296875 = −4.703125, exactly halfway between the BF16 neighbours −4.6875 and
    −4.71875 (ulp 2⁻⁵); the small term −0.000911… (the sticky bits) makes it −4.704036…, which rounds away
    from zero to −4.71875. ℓ = 2.000911… rounds to BF16 2.0. O = −4.71875 / 2 = −2.359375.
    The truth is −4.704037 / 2.000912 = −2.350947…, whose BF16 rounding is −2.34375."""
    res = forward_from_scores(HAND_S, HAND_V, PAPER_BF16)
    assert res.o_unnorm.item() == -4.71875
    assert res.l.item() == 2.0 and res.m.item() == 6.0
    assert res.o.dtype == torch.bfloat16 and res.o.item() == -2.359375
    truth = (torch.softmax(HAND_S, -1) @ HAND_V).item()
    assert abs(truth - -2.350947) < 1e-6
    assert torch.tensor(truth).bfloat16().item() == -2.34375
    # without the sticky residual the sum is an exact tie, which ties-to-even rounds toward zero
    tie = forward_from_scores(HAND_S, torch.tensor([[-2.40625], [-2.296875], [0.0]]), PAPER_BF16)
    assert tie.o_unnorm.item() == -4.6875


def test_hand_row_fix_gives_correct_rounding():
    """With the fix, r_m = 6 > 0 and r_s = 2, so m = 12: no P̄ is 1, and the row comes out correctly rounded."""
    res = forward_from_scores(HAND_S, HAND_V, PAPER_BF16.with_fix())
    assert res.m.item() == 12.0 and res.fix_pos.item() == 1
    truth = (torch.softmax(HAND_S, -1) @ HAND_V).bfloat16().item()
    assert res.o.item() == truth == -2.34375


# ---------------------------------------------------------------------------------------------------
# the official l_clamp
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("top", [20.0, 30.0, 50.0])
def test_official_clamp_shrinks_large_tied_rows(top):
    """Tied maximum `top`: with the official fix m = 2·top, the row sum ≈ 2·exp(−top) < 1e-10 once top ≳ 23,
    and the clamp replaces it, shrinking the output toward zero. Our fix (no clamp) keeps the row."""
    g = torch.Generator().manual_seed(17)
    s = torch.randn(4, 1, 512, generator=g, dtype=torch.float64)    # 4 independent rows, 512 keys
    s[..., 3] = s[..., 200] = top
    v = torch.randn(4, 512, 64, generator=g, dtype=torch.float64)
    exact = torch.softmax(s, -1) @ v
    official = forward_from_scores(s, v, PAPER_BF16_OFFICIAL_FIX).o.double()
    ours = forward_from_scores(s, v, PAPER_BF16.with_fix()).o.double()
    ratio = lambda o: (o.norm(dim=-1) / exact.norm(dim=-1))   # noqa: E731
    print(f"top={top}: norm ratio official {ratio(official).tolist()}, ours {ratio(ours).tolist()}")
    assert ((ratio(ours) - 1).abs() < 1e-2).all()
    if top >= 30:
        assert (ratio(official) < 0.01).all()
    else:
        assert ((ratio(official) - 1).abs() < 1e-2).all()


# ---------------------------------------------------------------------------------------------------
# δ sources in BF16
# ---------------------------------------------------------------------------------------------------
def tied_bf16(seed, t=128, d=64):
    """Rows whose maximum sits on two identical keys (scores ≈ 2 above the rest), V mostly negative."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(1, 2, 1, d, generator=g)
    u = u / u.norm(dim=-1, keepdim=True)
    q = 0.3 * torch.randn(1, 2, t, d, generator=g) + 4.0 * u
    k = torch.randn(1, 2, t, d, generator=g)
    k[:, :, 0] = k[:, :, 1] = 4.0 * u[:, :, 0]
    v = -(torch.randn(1, 2, t, d, generator=g).abs() + 0.5)
    do = torch.randn(1, 2, t, d, generator=g)
    return [x.bfloat16() for x in (q, k, v, do)]


@pytest.mark.parametrize("base", [PAPER_BF16, FA2_BF16], ids=["PAPER_BF16", "FA2_BF16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_delta_sources_bf16(base, seed):
    """Measured (seeds 0–2, both policies): dQ error of dO.O_hp and dP.P is 0.4–0.7 × that of dO.O."""
    q, k, v, do = tied_bf16(seed)
    truth = run(lambda *a: naive_attention(*a, causal=True), q, k, v, do)
    err = {}
    for delta in ("dO.O", "dO.O_hp", "dP.P"):
        policy = base.replace(delta=delta, block_q=64, block_k=64)
        err[delta] = rel_err(run(lambda *a: attention(*a, policy=policy, causal=True), q, k, v, do)[1], truth[1])
    print(base.name, seed, "dQ relative error by δ source", err)
    assert err["dO.O_hp"] < 0.8 * err["dO.O"]
    assert err["dP.P"] < 0.8 * err["dO.O"]


# ---------------------------------------------------------------------------------------------------
# one code path; the fused subtraction; API details
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", [PAPER_BF16.replace(block_k=48), FA2_BF16.replace(block_k=32).with_fix()],
                         ids=["PAPER_BF16", "FA2_BF16+fix"])
def test_forward_from_scores_is_the_same_code_path(policy):
    """Given the scores the main forward computes, forward_from_scores reproduces it bit for bit.

    Both run the same tiles from the scores on (the forward skips the causally masked rows above a tile, which
    changes how many rows a P̄V matmul has, not any row's sum). The scores themselves the test forms in one
    FP32 matmul, the forward tile by tile in the policy's matmul (BF16 in oneDNN, whose kernels and so
    summation order depend on the CPU): q and k on a grid of 1/2 with |·| ≤ 4 make every product and partial
    sum of QKᵀ exact in FP32, so the scores are the same bits whatever the order."""
    q, k = ((torch.randint(-8, 9, (1, 2, n, 64), generator=torch.Generator().manual_seed(s)) / 2).to(torch.bfloat16)
            for n, s in ((80, 18), (112, 19)))
    v = rand(1, 2, 112, 64, seed=20, dtype=torch.bfloat16, scale=2.0)
    res = flash_forward(q, k, v, policy, causal=True)
    qk = (q.float() @ k.float().transpose(-1, -2)).to(policy.dtype("qk_out"))
    s = (qk.float() * 0.125).to(policy.dtype("scores"))
    mask = torch.ones(80, 112, dtype=torch.bool).tril(112 - 80)
    row = forward_from_scores(s, v, policy, mask=mask)
    for name in ("o", "o_unnorm", "m", "l", "lse", "fix_pos", "fix_neg"):
        assert torch.equal(getattr(res, name), getattr(row, name)), name


def test_fma_forms_the_difference_from_the_raw_product():
    """One query, one key: with sub="sub" the only score is the maximum and P̄ = exp(0) = 1; with sub="fma"
    P̄ = exp(QKᵀ·α − fp32(QKᵀ·α)), the rounding residual of the FP32 product, so ℓ ≠ 1."""
    q = torch.full((1, 1, 1, 2), 1.0 / 3.0)
    k = torch.full((1, 1, 1, 2), 0.7)
    v = torch.ones(1, 1, 1, 2)
    alpha = 2 ** -0.5
    sub = flash_forward(q, k, v, FA2_BF16, causal=False, scale=alpha)
    fma = flash_forward(q, k, v, FA2_BF16.replace(sub="fma"), causal=False, scale=alpha)
    qk = (q.to(torch.bfloat16).float() @ k.to(torch.bfloat16).float().transpose(-1, -2)).item()
    a32 = float(torch.tensor(alpha, dtype=torch.float32))
    residual = qk * a32 - float(torch.tensor(qk * a32, dtype=torch.float32))
    assert residual != 0
    assert sub.l.item() == 1.0
    assert fma.l.item() == float(torch.exp(torch.tensor(residual, dtype=torch.float32)))


def test_backward_is_algorithm_2():
    q, k, v = (rand(1, 1, 20, 64, seed=s).requires_grad_() for s in (21, 22, 23))
    o = attention(q, k, v, FP64)
    assert "FlashAttentionFn" in type(o.grad_fn).__name__
    do = rand(1, 1, 20, 64, seed=24)
    o.backward(do)
    res = flash_forward(q.detach(), k.detach(), v.detach(), FP64)
    dq, dk, dv = flash_backward(q.detach(), k.detach(), v.detach(), res.o, res.lse, do, FP64)
    assert torch.equal(dq, q.grad) and torch.equal(dk, k.grad) and torch.equal(dv, v.grad)


def test_dtypes_in_and_out():
    q, k, v = (rand(1, 2, 33, 64, seed=s, dtype=torch.float32).requires_grad_() for s in (25, 26, 27))
    o = attention(q, k, v, PAPER_BF16)
    assert o.dtype == torch.bfloat16
    o.float().sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.float32
    assert attention(q, k, v, FP32).dtype == torch.float32


# ---------------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------------
def good():
    return rand(1, 2, 8, 16, seed=0), rand(1, 2, 8, 16, seed=1), rand(1, 2, 8, 16, seed=2)


@pytest.mark.parametrize("mutate, match", [
    (lambda q, k, v: (q[0], k, v), "4-D"),
    (lambda q, k, v: (q, k[:, :1], v[:, :1]), "batch and heads"),
    (lambda q, k, v: (q, k[:1].expand(2, -1, -1, -1), v), "batch and heads"),
    (lambda q, k, v: (q[..., :8], k, v), "head_dim"),
    (lambda q, k, v: (q, k, v[..., :8]), "same shape"),
    (lambda q, k, v: (q.float(), k, v), "torch.float32.*torch.float64"),
    (lambda q, k, v: (q.long(), k.long(), v.long()), "floating point"),
    (lambda q, k, v: (q, k.index_fill(2, torch.tensor([3]), math.nan), v), "non-finite"),
    (lambda q, k, v: (q, k, v.index_fill(2, torch.tensor([3]), math.inf)), "non-finite"),
    (lambda q, k, v: (torch.cat([q, q], 2), k, v), "seq_q <= seq_k"),
])
def test_bad_inputs_raise_value_error(mutate, match):
    with pytest.raises(ValueError, match=match):
        attention(*mutate(*good()), policy=FP64)


def test_bad_policy_raises_type_error():
    with pytest.raises(TypeError, match="Precision"):
        attention(*good(), policy="PAPER_BF16")
    with pytest.raises(TypeError, match="Precision"):
        forward_from_scores(torch.zeros(2, 3), torch.zeros(3, 4), policy=None)


def test_noncausal_longer_queries_are_fine():
    q, k, v = rand(1, 1, 30, 16, seed=3), rand(1, 1, 7, 16, seed=4), rand(1, 1, 7, 16, seed=5)
    assert torch.allclose(attention(q, k, v, FP64, causal=False), naive_attention(q, k, v, causal=False),
                          rtol=0, atol=1e-13)


def test_forward_from_scores_rejects_empty_rows():
    with pytest.raises(ValueError, match="at least one allowed key"):
        forward_from_scores(torch.zeros(2, 3), torch.zeros(3, 4), FP64,
                            mask=torch.tensor([[True, False, False], [False, False, False]]))


# ---------------------------------------------------------------------------------------------------
# the normaliser's source (l_from, issue 25)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sub", ["sub", "fma"])
def test_l_from_pbar_makes_the_normaliser_match_the_numerator(sub):
    """V ≡ c: O = ΣP̄·c / ℓ. With ℓ = ΣP (FP32, before P̄'s rounding) O − c = c·(ΣP̄/ΣP − 1), the weighted mean
    of P̄'s relative rounding errors (up to 2⁻⁹ each): far from 0 in most rows. With ℓ = ΣP̄ it is c to FP32
    rounding. FP32 output so that the quotient is seen before any BF16 rounding of O."""
    policy = FA2_BF16.replace(out="fp32", sub=sub, block_k=32)
    q, k = rand(1, 2, 96, 64, seed=41, dtype=torch.bfloat16, scale=2.0), rand(1, 2, 96, 64, seed=42,
                                                                              dtype=torch.bfloat16)
    v = torch.full((1, 2, 96, 64), 1.5, dtype=torch.bfloat16)
    o_p = flash_forward(q, k, v, policy, causal=True).o.double()
    o_pbar = flash_forward(q, k, v, policy.replace(l_from="pbar"), causal=True).o.double()
    dev_p, dev_pbar = (o_p - 1.5).abs().amax(-1), (o_pbar - 1.5).abs().amax(-1)   # per row
    print(f"{sub}: |O − c| per row, ℓ from P: median {dev_p.median():.2e}, max {dev_p.max():.2e}; "
          f"from P̄: max {dev_pbar.max():.2e}")
    assert dev_pbar.max() < 4 * 2.0 ** -24 * 1.5 * 8            # a few FP32 ulps of c
    assert (dev_p > 1e-5).float().mean() > 0.5 and dev_p.max() > 1e-4


@pytest.mark.parametrize("causal", [True, False])
def test_l_from_pbar_against_float64(causal):
    """Every cast FP64 but P̄ in FP32: both sources of ℓ are within FP32 rounding of the truth (O and the three
    gradients), and they differ (the knob reaches the arithmetic)."""
    base = FP64.replace(pbar="fp32", block_q=32, block_k=48)
    q, k, v, do = (rand(1, 2, 113, 64, seed=s) for s in (51, 52, 53, 54))
    truth = run(lambda *a: naive_attention(*a, causal=causal), q, k, v, do)
    for l_from in ("p", "pbar"):
        got = run(lambda *a: attention(*a, policy=base.replace(l_from=l_from), causal=causal), q, k, v, do)
        errs = [rel_err(x, t) for x, t in zip(got, truth)]
        print(f"l_from={l_from} causal={causal}: relative error O, dQ, dK, dV", ["%.1e" % e for e in errs])
        assert max(errs) < 1e-6
    o_p = flash_forward(q, k, v, base, causal=causal).o
    o_pbar = flash_forward(q, k, v, base.replace(l_from="pbar"), causal=causal).o
    assert not torch.equal(o_p, o_pbar)


@pytest.mark.parametrize("scale", ["a", 0, -1.0, float("nan"), float("inf"), None])
def test_a_scale_that_is_not_a_positive_number_is_named(scale):
    """A bad scale is a ValueError that names the argument (once: "could not convert string to float: 'a'", and a
    zero or negative scale ran); None is the default 1/√D."""
    q = torch.randn(1, 1, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if scale is None:
        torch.testing.assert_close(attention(q, q, q, FP64, scale=scale), attention(q, q, q, FP64, scale=8 ** -0.5))
        return
    with pytest.raises(ValueError, match=r"scale must be a positive number, got "):
        attention(q, q, q, FP64, scale=scale)
