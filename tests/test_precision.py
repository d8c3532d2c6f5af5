"""Tests of the precision policy (`lpfail.precision`): validation, the string form, presets."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from lpfail.precision import (
    DTYPES,
    FA2_BF16,
    FP32,
    FP64,
    PAPER_BF16,
    PAPER_BF16_OFFICIAL_FIX,
    PRESETS,
    DynamicMax,
    Precision,
)

DTYPE_KNOBS = ("matmul", "scores", "exp", "pbar", "pv_out", "acc", "out",
               "qk_out", "exp_in", "dp", "delta_prod", "ds", "grad_acc")


# ---------------------------------------------------------------------------------------------------
# validation: each bad value raises ValueError naming its field
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("beta", [1.0, 0.5, -2.0, float("inf"), float("nan")])
def test_beta_must_exceed_one(beta):
    with pytest.raises(ValueError, match="beta"):
        DynamicMax(beta=beta)


@pytest.mark.parametrize("eps", [-1e-3, float("nan")])
def test_eps_must_be_nonnegative(eps):
    with pytest.raises(ValueError, match="eps"):
        DynamicMax(eps=eps)


@pytest.mark.parametrize("knob", DTYPE_KNOBS)
def test_unknown_dtype(knob):
    with pytest.raises(ValueError, match=rf"Precision\.{knob} must be one of"):
        Precision(**{knob: "fp8"})


@pytest.mark.parametrize("field, value", [
    ("delta", "dO*O"), ("sub", "fused"), ("block_q", 0), ("block_k", -64), ("block_q", 1.5),
    ("block_k", True), ("block_q", "512"), ("fix", (2.0, 1e-3)), ("l_clamp", 0.0), ("l_clamp", -1e-10),
    ("masked_ties", 1), ("masked_ties", "true"),
])
def test_bad_knob_values(field, value):
    with pytest.raises(ValueError, match=rf"Precision\.{field}"):
        Precision(**{field: value})


@pytest.mark.parametrize("knob", ["qk_out", "scores", "exp_in"])
def test_fma_needs_wide_scores(knob):
    with pytest.raises(ValueError, match=rf"sub='fma'.*{knob}=bf16"):
        FA2_BF16.replace(sub="fma", **{knob: "bf16"})
    assert FA2_BF16.replace(sub="fma").sub == "fma"     # FP32 scores are fine


def test_replace_rejects_unknown_knobs_and_validates():
    with pytest.raises(ValueError, match="unknown Precision knob.*valid"):
        FA2_BF16.replace(accumulator="fp32")
    with pytest.raises(ValueError, match="Precision.acc"):
        FA2_BF16.replace(acc="fp128")


# ---------------------------------------------------------------------------------------------------
# the string form
# ---------------------------------------------------------------------------------------------------
ALL_PRESETS = [*PRESETS.values(), *(p.with_fix() for p in PRESETS.values()), PAPER_BF16.with_fix(8.0, 0.0)]


@pytest.mark.parametrize("policy", ALL_PRESETS, ids=lambda p: p.name)
def test_presets_round_trip(policy):
    text = str(policy)
    assert Precision.parse(text) == policy
    assert str(Precision.parse(text)) == text


@pytest.mark.parametrize("name", [*PRESETS, *(f"{n}+fix" for n in PRESETS)])
def test_parse_preset_names(name):
    base = PRESETS[name.removesuffix("+fix")]
    expected = base.with_fix() if name.endswith("+fix") else base
    assert Precision.parse(name) == expected


def test_round_trip_over_a_product_of_knobs():
    n = 0
    for scores, acc, pbar, delta, sub, block, fix, clamp, ties in itertools.product(
            ["bf16", "fp32", "fp64"], ["bf16", "fp32"], ["bf16", "fp16", "fp32"], ["dO.O", "dO.O_hp", "dP.P"],
            ["sub", "fma"], [(None, None), (512, 512), (128, 64), (None, 7)],
            [None, DynamicMax(), DynamicMax(4.5, 0.0), DynamicMax(1.25, 2.5e-4)], [None, 1e-10],
            [False, True]):
        try:
            policy = FA2_BF16.replace(scores=scores, acc=acc, pbar=pbar, delta=delta, sub=sub, block_q=block[0],
                                      block_k=block[1], fix=fix, l_clamp=clamp, masked_ties=ties)
        except ValueError:
            assert sub == "fma" and scores == "bf16"
            continue
        assert Precision.parse(str(policy)) == policy
        n += 1
    assert n == 2 * 2 * 3 * 3 * 2 * 4 * 4 * 2 * 2 + 2 * 3 * 3 * 4 * 4 * 2 * 2


def test_parse_overrides_on_a_preset():
    assert Precision.parse("FA2_BF16,acc=bf16,block=one x 32".replace(" ", "")) == \
        FA2_BF16.replace(acc="bf16", block_q=None, block_k=32)
    assert Precision.parse("PAPER_BF16+fix,l_clamp=1e-10,masked_ties=true") == PAPER_BF16_OFFICIAL_FIX
    assert Precision.parse("FP32,fix=dynmax(8,0)").fix == DynamicMax(8.0, 0.0)


@pytest.mark.parametrize("text, match", [
    ("bogus=1", r"unknown Precision key 'bogus'.*valid keys: \[.*'matmul'.*'masked_ties'"),
    ("FA2_BF16,accumulator=fp32", r"valid keys: \[.*'acc'"),
    ("NOPE", r"unknown preset 'NOPE'; presets: \[.*'PAPER_BF16'"),
    ("acc", r"unknown preset"),
    ("FA2_BF16,acc", r"expected key=value"),
    ("block=512", r"block must look like"),
    ("block=ax512", r"block size must be an integer"),
    ("fix=dynmax(2)", r"fix must be"),
    ("fix=dynmax(x,1)", r"fix.beta must be a number"),
    ("fix=dynmax(1,0.001)", r"fix.beta must be a finite number > 1"),
    ("l_clamp=tiny", r"l_clamp must be a number"),
    ("masked_ties=yes", r"masked_ties must be 'true' or 'false'"),
    ("acc=fp8", r"Precision.acc must be one of"),
    ("delta=dO", r"Precision.delta must be one of"),
])
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        Precision.parse(text)


# ---------------------------------------------------------------------------------------------------
# presets and helpers
# ---------------------------------------------------------------------------------------------------
def test_preset_names_and_dtypes():
    assert PAPER_BF16.name == "PAPER_BF16" and FA2_BF16.with_fix().name == "FA2_BF16+fix"
    assert PAPER_BF16_OFFICIAL_FIX.name == "PAPER_BF16_OFFICIAL_FIX"
    assert FP32.replace(block_k=7).name == str(FP32.replace(block_k=7))
    assert PAPER_BF16.dtype("acc") is torch.bfloat16 and FA2_BF16.dtype("acc") is torch.float32
    assert all(FP64.dtype(k) is torch.float64 for k in DTYPE_KNOBS)
    assert all(FP32.dtype(k) is torch.float32 for k in DTYPE_KNOBS)
    with pytest.raises(ValueError, match="not a dtype knob"):
        FP32.dtype("delta")


def test_paper_preset_is_the_official_code_s_casts():
    """PAPER_BF16 holds in BF16 exactly what the official code holds in BF16 under autocast."""
    bf16 = {k for k in DTYPE_KNOBS if getattr(PAPER_BF16, k) == "bf16"}
    assert bf16 == {"matmul", "scores", "pbar", "pv_out", "acc", "out", "qk_out", "exp_in", "dp", "delta_prod",
                    "ds", "grad_acc"}
    assert PAPER_BF16.exp == "fp32" and (PAPER_BF16.block_q, PAPER_BF16.block_k) == (512, 512)
    assert PAPER_BF16.fix is None and PAPER_BF16.l_clamp is None and not PAPER_BF16.masked_ties
    official = PAPER_BF16_OFFICIAL_FIX
    assert dataclasses.replace(official, fix=None, l_clamp=None, masked_ties=False) == PAPER_BF16
    assert official.fix == DynamicMax(2.0, 1e-3) and official.l_clamp == 1e-10 and official.masked_ties
    # our fix never carries the official clamp or masking
    assert PAPER_BF16.with_fix().l_clamp is None and not PAPER_BF16.with_fix().masked_ties


def test_policies_are_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FA2_BF16.acc = "bf16"  # type: ignore[misc]
    assert len({FA2_BF16, FA2_BF16.replace(), PAPER_BF16}) == 2
    assert set(DTYPES) == {"bf16", "fp16", "fp32", "fp64"}


# ---------------------------------------------------------------------------------------------------
# rounding: "rne" (default) or "sr" (stochastic rounding of the output path)
# ---------------------------------------------------------------------------------------------------
#: The strings of the presets from before the `rounding` knob existed: every stored result's config hash is
#: built from them, so they must never change.
LEGACY_STRINGS = {
    "PAPER_BF16": "matmul=bf16,scores=bf16,exp=fp32,pbar=bf16,pv_out=bf16,acc=bf16,out=bf16,qk_out=bf16,"
                  "exp_in=bf16,dp=bf16,delta_prod=bf16,ds=bf16,grad_acc=bf16,delta=dO.O,block=512x512,sub=sub,"
                  "fix=none,l_clamp=none,masked_ties=false",
    "FA2_BF16": "matmul=bf16,scores=fp32,exp=fp32,pbar=bf16,pv_out=fp32,acc=fp32,out=bf16,qk_out=fp32,"
                "exp_in=fp32,dp=fp32,delta_prod=fp32,ds=bf16,grad_acc=fp32,delta=dO.O,block=128x64,sub=sub,"
                "fix=none,l_clamp=none,masked_ties=false",
    "FP32": "matmul=fp32,scores=fp32,exp=fp32,pbar=fp32,pv_out=fp32,acc=fp32,out=fp32,qk_out=fp32,exp_in=fp32,"
            "dp=fp32,delta_prod=fp32,ds=fp32,grad_acc=fp32,delta=dO.O,block=512x512,sub=sub,fix=none,"
            "l_clamp=none,masked_ties=false",
    "FP64": "matmul=fp64,scores=fp64,exp=fp64,pbar=fp64,pv_out=fp64,acc=fp64,out=fp64,qk_out=fp64,exp_in=fp64,"
            "dp=fp64,delta_prod=fp64,ds=fp64,grad_acc=fp64,delta=dO.O,block=512x512,sub=sub,fix=none,"
            "l_clamp=none,masked_ties=false",
    "PAPER_BF16_OFFICIAL_FIX": "matmul=bf16,scores=bf16,exp=fp32,pbar=bf16,pv_out=bf16,acc=bf16,out=bf16,"
                               "qk_out=bf16,exp_in=bf16,dp=bf16,delta_prod=bf16,ds=bf16,grad_acc=bf16,delta=dO.O,"
                               "block=512x512,sub=sub,fix=dynmax(2,0.001),l_clamp=1e-10,masked_ties=true",
}


@pytest.mark.parametrize("name", list(LEGACY_STRINGS))
def test_rne_strings_are_unchanged(name):
    assert PRESETS[name].rounding == "rne"
    assert str(PRESETS[name]) == LEGACY_STRINGS[name]
    assert str(PRESETS[name].replace(rounding="rne")) == LEGACY_STRINGS[name]
    assert Precision.parse(LEGACY_STRINGS[name]) == PRESETS[name]


def test_default_policy_string_is_unchanged():
    assert str(Precision()) == LEGACY_STRINGS["FA2_BF16"]


@pytest.mark.parametrize("policy", [PAPER_BF16, FA2_BF16, PAPER_BF16.with_fix(), PAPER_BF16_OFFICIAL_FIX,
                                    FA2_BF16.replace(out="fp32", acc="fp16"), PAPER_BF16.with_fix(8.0, 0.0)],
                         ids=lambda p: p.name)
def test_sr_round_trips(policy):
    """An "sr" policy's string is the "rne" one plus the rounding and its random stream's version."""
    sr = policy.replace(rounding="sr")
    assert str(sr) == str(policy) + ",rounding=sr,sr_stream=1"
    assert Precision.parse(str(sr)) == sr
    assert sr.name == (f"{policy.name},rounding=sr,sr_stream=1" if policy.name != str(policy) else str(sr))
    if not policy.name.startswith("PAPER_BF16+dynmax"):     # names with a non-default fix never parsed
        assert Precision.parse(sr.name) == sr
    assert Precision.parse(str(sr).replace(",rounding=sr,sr_stream=1", "")) == policy


def test_sr_names():
    assert PAPER_BF16.replace(rounding="sr").name == "PAPER_BF16,rounding=sr,sr_stream=1"
    assert PAPER_BF16.with_fix().replace(rounding="sr").name == "PAPER_BF16+fix,rounding=sr,sr_stream=1"
    assert Precision.parse("PAPER_BF16,rounding=sr,sr_stream=1") == PAPER_BF16.replace(rounding="sr")
    assert Precision.parse("FA2_BF16+fix,rounding=sr,sr_stream=1") == FA2_BF16.with_fix().replace(rounding="sr")
    odd = FA2_BF16.replace(block_k=32, rounding="sr")
    assert odd.name == str(odd)


def test_sr_strings_name_their_stream():
    """",rounding=sr" alone was the first stream (torch's generators), whose stored runs are not runs of the
    counter-based one: it no longer parses, so their cache keys match nothing; other versions are refused too."""
    for text in ("PAPER_BF16,rounding=sr", str(PAPER_BF16) + ",rounding=sr"):
        with pytest.raises(ValueError, match="must name its random stream.*sr_stream=1"):
            Precision.parse(text)
    with pytest.raises(ValueError, match="sr_stream=0 is not this code's stream"):
        Precision.parse("PAPER_BF16,rounding=sr,sr_stream=0")
    with pytest.raises(ValueError, match="belongs to rounding=sr"):
        Precision.parse("PAPER_BF16,sr_stream=1")


def test_rounding_validation():
    with pytest.raises(ValueError, match=r"Precision.rounding must be one of \['rne', 'sr'\].*'stochastic'"):
        PAPER_BF16.replace(rounding="stochastic")
    with pytest.raises(ValueError, match=r"rounding='sr' would do nothing.*pv_out=fp32, acc=fp32, out=fp32"):
        FP32.replace(rounding="sr")
    with pytest.raises(ValueError, match="would do nothing"):
        Precision.parse("FP64,rounding=sr")
    with pytest.raises(ValueError, match="Precision.rounding must be one of"):
        Precision.parse("PAPER_BF16,rounding=up")
    # one 16-bit cast point of the output path is enough
    for knob in ("pv_out", "acc", "out"):
        assert FP32.replace(**{knob: "bf16"}, rounding="sr").rounding == "sr"
    assert FP32.replace(out="fp16", rounding="sr").rounding == "sr"


# ---------------------------------------------------------------------------------------------------
# l_from: the normaliser's source (issue 25)
# ---------------------------------------------------------------------------------------------------
def test_l_from_is_shown_only_when_set_and_round_trips():
    p = FA2_BF16.replace(l_from="pbar")
    assert str(FA2_BF16) == LEGACY_STRINGS["FA2_BF16"]                 # default "p": no cache key changes
    assert str(p) == LEGACY_STRINGS["FA2_BF16"] + ",l_from=pbar"
    assert Precision.parse(str(p)) == p and p.name == "FA2_BF16,l_from=pbar"
    assert Precision.parse("FA2_BF16,l_from=pbar") == p
    assert Precision.parse("PAPER_BF16+fix,l_from=pbar") == PAPER_BF16.with_fix().replace(l_from="pbar")
    assert Precision.parse(str(p).replace("l_from=pbar", "l_from=p")) == FA2_BF16


def test_l_from_validation():
    with pytest.raises(ValueError, match=r"Precision.l_from must be one of \['p', 'pbar'\].*'pv'"):
        FA2_BF16.replace(l_from="pv")
    with pytest.raises(ValueError, match=r"l_from='pbar' would do nothing.*pbar=fp32"):
        FP32.replace(l_from="pbar")
    assert FP64.replace(pbar="fp32", l_from="pbar").l_from == "pbar"   # P̄ narrower than exp: it does something


def test_policy_hash_is_cached_and_not_pickled():
    import pickle

    p = PAPER_BF16.with_bounded_fix()
    assert hash(p) == hash(PAPER_BF16.with_bounded_fix()) and {p: 1}[PAPER_BF16.with_bounded_fix()] == 1
    assert "_hash" in p.__dict__ and "_hash" not in pickle.loads(pickle.dumps(p)).__dict__
    assert pickle.loads(pickle.dumps(p)) == p and dataclasses.replace(p, l_from="pbar") != p
