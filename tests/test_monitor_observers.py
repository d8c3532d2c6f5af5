"""The monitor's observer protocol (`lpfail.monitor.Observer`): a user's observer is called at the same points as
the precision alarm (`lpfail.alarm.AlarmObserver`, which `alarm=` makes), through the same hooks."""
import json
import warnings

import numpy as np
import pytest
import torch

from lpfail.alarm import AlarmObserver
from lpfail.monitor import Alarm, Monitor, MonitorWarning, Observer, Thresholds, read_jsonl
from lpfail.precision import PAPER_BF16
from lpfail.substitute import substitute
from tests.test_kit_alarm import _gpt

QUIET = Thresholds(max_logit=None, tied_frac=None)


class Counter(Observer):
    """Counts what the monitor hands it: calls per forward, the steps it ends, and one device tensor per step
    (the calls' summed outputs) that goes through the monitor's copy to the host."""

    record_keys = frozenset({"calls_seen", "out_sum"})

    def __init__(self, every=1):
        self.every, self.bound, self.calls, self.ended = every, [], [], []
        self._sum = None

    def bind(self, monitor):
        self.bound.append(monitor)

    def wants_step(self, step):
        return step % self.every == 0

    def on_call(self, call, out, forward):
        self.calls.append((forward, call.index))
        s = out.detach().double().sum()
        self._sum = s if self._sum is None else self._sum + s

    def on_step_end(self, step, host):
        self.ended.append(step)
        handle = host.add(self._sum) if self._sum is not None else None
        n, self._sum = len(self.calls), None
        return n, handle

    def on_record(self, record, state, host):
        n, handle = state
        record["calls_seen"] = n
        if handle is not None:
            record["out_sum"] = float(host.get(handle))


def _run(model, steps, forwards=1, every=1, **kw):
    g = torch.Generator().manual_seed(1)
    with Monitor(model, every=every, window=every, sample_batch=2, thresholds=QUIET, **kw) as mon, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorWarning)
        for _ in range(steps):
            idx = torch.randint(0, 64, (2, 33), generator=g)
            with substitute(model, PAPER_BF16):
                for _ in range(forwards):
                    loss = model(idx[:, :-1], idx[:, 1:])[1]
                    loss.backward()
            model.zero_grad()
            mon.step(loss=loss.item())
    return mon


def test_a_user_observer_is_called_through_the_protocol(tmp_path):
    obs = Counter()
    mon = _run(_gpt(), 4, forwards=2, every=2, observers=[obs], path=tmp_path / "m.jsonl")
    assert obs.bound == [mon] and mon.observers == [obs]
    assert obs.ended == [0, 2]                                   # sampled steps only (every = 2)
    # two layers, two forwards per step: each call once per forward, numbered from 1 within the step
    assert obs.calls == [(1, 0), (1, 1), (2, 0), (2, 1)] * 2
    assert [r["calls_seen"] for r in mon.records] == [4, 8]
    assert all(np.isfinite(r["out_sum"]) for r in mon.records)
    rec = [r for r in read_jsonl(tmp_path / "m.jsonl") if r["kind"] == "record"]
    assert [r["calls_seen"] for r in rec] == [4, 8] and list(rec[0])[-2:] == ["calls_seen", "out_sum"]
    assert mon.scalars()["calls_seen"] == 8.0                    # a number in the record: a scalar
    with pytest.raises(ValueError, match="calls_seen"):         # its keys are the record's own
        mon.attach()
        try:
            mon.step(calls_seen=1)
        finally:
            mon.detach()


def test_wants_step_chooses_the_sampled_steps_an_observer_sees():
    obs = Counter(every=2)
    mon = _run(_gpt(), 3, observers=[obs])
    assert obs.ended == [0, 2] and len(obs.calls) == 4
    assert ["calls_seen" in r for r in mon.records] == [True, False, True]


def test_the_alarm_is_an_observer_like_any_other():
    with_alarm = _run(_gpt(), 3, alarm=Alarm(window=2))
    assert isinstance(with_alarm.observers[0], AlarmObserver) and with_alarm.observers == [with_alarm._alarm]
    obs = Counter()
    both = _run(_gpt(), 3, alarm=Alarm(window=2), observers=[obs])
    assert both.observers[1:] == [obs] and obs.ended == [0, 1, 2]
    # passed by hand through observers=, the alarm's observer writes the same records as alarm= does
    by_hand = _run(_gpt(), 3, observers=[AlarmObserver(Alarm(window=2), 1)])
    same = lambda a, b: json.dumps(a) == json.dumps(b)  # noqa: E731  (NaN = NaN: no update, no entropy)
    assert same(by_hand.records, with_alarm.records)
    assert same([{k: v for k, v in r.items() if k not in obs.record_keys} for r in both.records], with_alarm.records)
    assert by_hand.header()["settings"]["alarm"] is None          # the header echoes the alarm= argument only


def test_an_observer_without_the_hooks_is_refused():
    class Half:
        def on_call(self, call, out, forward):
            pass

    with pytest.raises(TypeError, match="bind, wants_step, on_step_end, on_record"):
        Monitor(_gpt(), every=1, window=1, observers=[Half()])
