"""`lpfail.attention.paper_forward_tile_loop`, the thirty-line forward the primer shows, computes what the
reference `attention` computes, bit for bit, and the primer's code is taken from it (`lpfail.book.code`)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lpfail import attention as A
from lpfail.book import code
from lpfail.precision import FA2_BF16, FP32, PAPER_BF16

SHAPES = [(1, 1, 7, 16), (2, 3, 64, 32), (1, 2, 600, 32)]  # (B, H, T, D): one tile, one tile, two tiles of 512


def _qkv(shape, dtype, seed, q_scale=3.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    return (q * q_scale).to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("policy", [PAPER_BF16, FP32], ids=["PAPER_BF16", "FP32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16-in", "fp32-in"])
def test_bit_identical_to_attention(policy, shape, causal, dtype):
    q, k, v = _qkv(shape, dtype, seed=sum(shape) + causal)
    ref = A.attention(q, k, v, policy, causal=causal)
    got = A.paper_forward_tile_loop(q, k, v, policy, causal=causal)
    assert got.dtype == ref.dtype == policy.dtype("out")
    assert torch.equal(got, ref)


@pytest.mark.parametrize("policy", [PAPER_BF16, FP32], ids=["PAPER_BF16", "FP32"])
def test_bit_identical_many_tiles_and_ties(policy):
    """Small key tiles (several rescalings per row), and rows with tied maxima (P̄ = 1 twice), causal."""
    small = dataclasses.replace(policy, block_q=16, block_k=16)
    q, k, v = _qkv((2, 2, 80, 16), torch.bfloat16, seed=5)
    k[..., 40, :] = k[..., 41, :] = q[..., 60, :]  # row 60 (and its neighbours) sees two equal keys
    for pol in (policy, small):
        assert torch.equal(A.paper_forward_tile_loop(q, k, v, pol), A.attention(q, k, v, pol))


def test_non_causal_cross_lengths():
    q, k, v = _qkv((1, 2, 40, 16), torch.float32, seed=3)
    k2, v2 = _qkv((1, 2, 70, 16), torch.float32, seed=4)[1:]
    for pol in (PAPER_BF16, FP32):
        assert torch.equal(A.paper_forward_tile_loop(q, k2, v2, pol, causal=False),
                           A.attention(q, k2, v2, pol, causal=False))


@pytest.mark.parametrize("policy", [FA2_BF16, PAPER_BF16.with_fix(), dataclasses.replace(PAPER_BF16, sub="fma",
                                    qk_out="fp32", scores="fp32", exp_in="fp32")])
def test_other_policies_refused(policy):
    q, k, v = _qkv((1, 1, 8, 16), torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="paper_forward_tile_loop covers"):
        A.paper_forward_tile_loop(q, k, v, policy)


def test_primer_region_is_short_and_marks_every_cast():
    src = code.marked_source(A, "forward")
    lines = src.splitlines()
    assert 20 <= len(lines) <= 32
    assert max(map(len, lines)) <= 92  # fits the text column without scrolling
    assert not lines[0].startswith(" ")
    for n in range(1, 10):
        assert f"[{n}]" in src, n
    assert "book:" not in src
    block = code.code_block(src)
    assert block.startswith("```python\n") and block.endswith("\n```")


def test_marked_source_refuses_missing_region():
    with pytest.raises(ValueError, match="exactly one"):
        code.marked_source(A, "no-such-region")
    assert code.code_block("x = '```'").startswith("````python")
