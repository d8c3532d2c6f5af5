"""The monitor (and its precision alarm) inside lpfail's own training loop (`TrainConfig.monitor`,
`lpfail.train.watch`): every attention back end of lpfail's GPT is seen (`lpfail.sdpa_hook.presented`), the run's
arithmetic does not change, the records land in monitor.jsonl, and what it cannot watch is refused."""
import json

import numpy as np
import pytest
import torch

from lpfail.model import GPT, GPTConfig
from lpfail.monitor import Monitor, Thresholds, read_jsonl
from lpfail.precision import PAPER_BF16
from lpfail.sdpa_hook import SDPAInterceptor, presented
from lpfail.train import TrainConfig, train
from lpfail.train.watch import parse

SPEC = "every=2 window=2 sample_batch=1 alarm=4"


def _cfg(tmp_path=None, **kw):
    return TrainConfig.preset("tiny", attention="PAPER_BF16", max_steps=8, val_every=4, val_rows=2,
                              out_dir=str(tmp_path) if tmp_path else "", **kw)


def test_a_run_watched_is_the_run_unwatched(tmp_path):
    plain = train(_cfg())
    watched = train(_cfg(tmp_path / "w", monitor=SPEC))
    assert watched.status == plain.status == "completed"
    assert [r["loss"] for r in watched.log] == [r["loss"] for r in plain.log]      # bit for bit
    assert [r["grad_norm"] for r in watched.log] == [r["grad_norm"] for r in plain.log]
    assert [v["loss"] for v in watched.val] == [v["loss"] for v in plain.val]
    recs = read_jsonl(tmp_path / "w" / "monitor.jsonl")
    header = [r for r in recs if r.get("kind") == "header"]
    records = [r for r in recs if r.get("kind") == "record"]
    assert len(header) == 1 and header[0]["settings"]["alarm"]["window"] == 4
    assert [r["step"] for r in records] == [0, 2, 4, 6]     # validation forwards are not counted as steps
    # the reference back end (PAPER_BF16) is seen in both layers; its dQ errs at BF16 level against FP64
    assert np.shape(records[0]["alarm_dq_rel"]) == (2, 2)
    assert np.min(records[0]["alarm_dq_rel"]) > 1e-4
    assert records[-1]["loss"] == watched.log[6]["loss"]


def test_refusals_and_spec_parsing():
    assert parse("") == {} and parse("every=5 window=10")["alarm"] == 0
    assert parse("alarm=16,reference=FP32") == {"every": 10, "window": 10, "sample_batch": 1, "alarm": 16,
                                                "reference": "FP32"}
    for bad, msg in (("every", "key=value"), ("often=3", "key=value"), ("every=x", "must be an int"),
                     ("every=3 window=4", "multiple of every"), ("every=0", "positive"),
                     ("alarm=-1", "≥ 0"), ("reference=BF16", "FP64 or FP32")):
        with pytest.raises(ValueError, match=msg):
            parse(bad)
    with pytest.raises(ValueError, match="cuda_graph=False"):
        TrainConfig.preset("tiny", monitor=SPEC, cuda_graph=True)
    with pytest.raises(ValueError, match="TrainConfig.monitor"):
        TrainConfig.preset("tiny", monitor="bogus")


def test_resumed_run_is_refused(tmp_path):
    first = train(_cfg(tmp_path / "a", checkpoint_every=4))
    assert first.status == "completed"
    with pytest.raises(ValueError, match="from step 0"):
        train(_cfg(tmp_path / "b", monitor=SPEC), resume_from=tmp_path / "a" / "ckpt_0000004.pt")


def test_presented_calls_reach_the_innermost_interceptor_only():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    seen = []
    assert torch.equal(presented(q, k, v, lambda: q + 1), q + 1)          # none active: the implementation
    with SDPAInterceptor(lambda call, original: seen.append(call.is_causal) or original()):
        assert torch.equal(presented(q, k, v, lambda: q * 2), q * 2)
    assert seen == [True]
    assert torch.equal(presented(q, k, v, lambda: q - 1), q - 1)          # left: not seen again
    assert seen == [True]


def test_monitor_sees_lpfail_backends():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16))
    model.set_attention("reference", PAPER_BF16)
    idx = torch.randint(0, 32, (2, 17))
    with Monitor(model, every=1, window=1, thresholds=Thresholds(max_logit=None, tied_frac=None)) as mon:
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        rec = mon.step()
    assert np.shape(rec["max_logit"]) == (2, 2)
