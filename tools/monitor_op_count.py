"""Count what a sampled step of `lpfail.monitor.Monitor` asks of the device, on the CPU (issue 14's proxy for
the GPU overhead: on a GPU each ATen op is a kernel launch of ≈ 5–10 µs host time and each copy to the host
drains the queue, so launches and copies, not FLOPs, decide a sampled step's cost).

On a GPT-2-small-shaped lpfail GPT (12 layers × 12 heads × 768; a short context, since the counts do not
depend on it) it runs one plain step and one monitored sampled step and counts, with a TorchDispatchMode, the
ATen ops the monitor adds (views excluded: they launch nothing) during the forward and in `step()`, and, with
a TorchFunctionMode, its copies to the host (Tensor.cpu / .to(cpu) / .item / .tolist / int() / float()).
The linear-algebra path is the accelerator one (`mon._host_linalg = False`: what a GPU uses), so the
counts are those a GPU would see. `--window` also counts a step that takes the update entropy.

Usage: python tools/monitor_op_count.py [--layers N] [--window] [--module lpfail.monitor]
"""
import argparse
import collections
import importlib
import json
import warnings

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lpfail.model import GPT, GPTConfig

_VIEWS = {"view", "_unsafe_view", "transpose", "t", "expand", "select", "slice", "unsqueeze", "squeeze",
          "as_strided", "detach", "alias", "permute", "split", "split_with_sizes", "unbind", "lift_fresh",
          "_reshape_alias", "reshape", "view_as", "unflatten", "flatten", "chunk", "narrow", "diagonal"}
_HOST = {"cpu", "item", "tolist", "__int__", "__float__", "__bool__"}  # each a wait for the device


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _VIEWS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


class HostCopies(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.n = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST or (name == "to" and any(str(a) == "cpu" for a in (*args[1:], *(kwargs or {}).values()))):
            self.n[name] += 1
        return func(*args, **(kwargs or {}))


def count(module: str = "lpfail.monitor", layers: int = 12, window: bool = False, block: int = 64) -> dict:
    mod = importlib.import_module(module)
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=block, n_layer=layers)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (1, block + 1))
    mon = mod.Monitor(model, every=1, window=1 if window else 10 ** 6)
    mon._host_linalg = False  # the accelerator path (the monitor before 2026-12-01 12:00: patched by the caller)
    out = {}
    with torch.no_grad():
        with OpCount() as plain:
            model(idx[:, :-1], idx[:, 1:])
        with mon, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if window:  # the first sampled step only takes the snapshot
                model(idx[:, :-1], idx[:, 1:])
                mon.step()
            with OpCount() as fwd, HostCopies() as fwd_h:
                model(idx[:, :-1], idx[:, 1:])
            with OpCount() as stp, HostCopies() as stp_h:
                rec = mon.step()
    assert ("update_entropy" in rec) == window
    fwd_extra = sum(fwd.ops.values()) - sum(plain.ops.values())
    out.update(layers=layers, window_step=window, forward_extra_ops=fwd_extra, step_ops=sum(stp.ops.values()),
               total_ops=fwd_extra + sum(stp.ops.values()), forward_host_copies=sum(fwd_h.n.values()),
               step_host_copies=sum(stp_h.n.values()), step_host_copy_kinds=dict(stp_h.n),
               step_top_ops=dict(stp.ops.most_common(8)),
               forward_extra_top_ops=dict((fwd.ops - plain.ops).most_common(8)))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--window", action="store_true")
    ap.add_argument("--module", default="lpfail.monitor")
    a = ap.parse_args()
    print(json.dumps(count(a.module, a.layers, a.window), indent=1))
