"""The one-step gradient check that decides whether a sweep may run the Triton kernel (issue 11, item 5)."""
import json

import numpy as np
import pytest
import torch

from lpfail.experiments import kernel_trust as K

TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=2, n_batches=3, autocast="none")


def _batches(c, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, c.vocab_size, (c.batch_size, c.block_size), generator=g),
             torch.randint(0, c.vocab_size, (c.batch_size, c.block_size), generator=g)) for _ in range(c.n_batches)]


def test_error_stats_measure_bias_along_the_truth_and_size():
    rng = np.random.default_rng(0)
    truth = rng.standard_normal((5, 1000))
    bias, rms = K.error_stats(1.1 * truth, truth)  # 10 % too large along itself
    assert bias == pytest.approx(np.full(5, 0.1)) and rms == pytest.approx(np.full(5, 0.1))
    noise = 0.01 * rng.standard_normal((5, 1000))
    bias, rms = K.error_stats(truth + noise, truth)
    assert np.abs(bias).max() < 0.002 and rms == pytest.approx(np.full(5, 0.01), rel=0.1)
    with pytest.raises(ValueError, match="one shape"):
        K.error_stats(truth[:, :10], truth)


def test_agree_rule():
    rng = np.random.default_rng(1)
    b = 0.02 + 0.001 * rng.standard_normal(8)
    r = 0.05 + 0.001 * rng.standard_normal(8)
    assert K.agree(b + 0.0005 * rng.standard_normal(8), r, b, r)["ok"]  # same bias, same size
    assert not K.agree(b + 0.02, r, b, r)["bias_ok"]  # twice the bias, far outside 3 SE and 25 %
    assert not K.agree(b, 2 * r, b, r)["rms_ok"]  # twice the error
    zero = np.zeros(8)
    assert K.agree(zero, 1e-8 + zero, zero, zero)["ok"]  # both essentially exact


def test_config_validation():
    with pytest.raises(ValueError, match="n_batches"):
        K.TrustConfig(n_batches=2)
    with pytest.raises(ValueError, match="autocast"):
        K.TrustConfig(autocast="fp16")
    with pytest.raises(ValueError, match="q_scale"):
        K.TrustConfig(q_scale=0)


def test_same_arithmetic_is_trusted_and_bf16_standing_in_for_fp32_is_not():
    c = K.TrustConfig(**TINY, q_scale=4.0)
    batches = _batches(c)
    same = K.trust_report(c, "reference(FP32)", "reference(FP32)", batches=batches)
    assert same["trusted"] and same["disagreeing"] == [] and len(same["tensors"]) >= 4
    worse = K.trust_report(c, "reference(PAPER_BF16)", "reference(FP32)", batches=batches)
    assert not worse["trusted"]
    assert any(not s["rms_ok"] for s in worse["tensors"].values())  # BF16's errors are far larger than FP32's


def test_triton_fp32_path_is_trusted_in_the_interpreter_and_run_writes_json(tmp_path):
    from kernel_env import load_kernels

    load_kernels()  # TRITON_INTERPRET=1 on a machine without CUDA (the kernel's FP32 path)
    c = K.TrustConfig(**TINY)
    out = tmp_path / "trust.json"
    assert K.run(["FP32"], c, "cpu", out, batches=_batches(c), log=lambda *_: None) == 0
    d = json.loads(out.read_text())
    (r,) = d["reports"]
    assert r["candidate"] == "triton(FP32)" and r["trusted"] and {"device", "git", "created"} <= set(d)
    with pytest.raises(ValueError, match="no policy"):
        K.run([], c, "cpu", out)


def test_stored_gpu_report_loads_and_summarises():
    d = K.load_stored()
    assert d["device"] and d["git"] and d["created"]
    rows = K.summary_rows(d)
    assert [r["candidate"] for r in rows] == [r["candidate"] for r in d["reports"]]
    for r, rep in zip(rows, d["reports"]):
        ratios = [t["rms_ratio"] for t in rep["tensors"].values()]
        # the worst ratio is the one farthest from 1 on a log scale, and it is one of the tensors' own
        assert r["worst_rms_ratio"] in ratios
        assert all(abs(np.log(x)) <= abs(np.log(r["worst_rms_ratio"])) for x in ratios)
        assert r["trusted"] == (r["disagree"] == 0) == rep["trusted"]
    md = K.summary_markdown(d)
    assert md.count("\n| `triton(") == len(rows) and d["device"] in md and d["git"][:7] in md


def test_load_stored_refuses_missing_corrupt_and_unprovenanced_files(tmp_path):
    from lpfail import results
    with pytest.raises(results.ResultMissing, match="kernel_trust --out"):
        K.load_stored(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        K.load_stored(bad)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"reports": []}))
    with pytest.raises(ValueError, match="lacks"):
        K.load_stored(bare)
