"""The monitor's overhead on GPT-2 small (issue 14: ≤ 2 % of step time at the default interval), on a GPU.

Trains lpfail's GPT at GPT-2 small's size (12 × 12 × 768, context 1024, SDPA attention, BF16 autocast, AdamW)
on random tokens for `steps` steps three times in alternation — without the monitor, with
`Monitor(model)` at its defaults (every=10, window=50), without again — and writes the median step times, the
overhead in percent of the monitored run against the mean of the two plain runs, and the losses of the first
plain and the monitored run (equal bit for bit when the monitor does not change the numbers).
Usage: python tools/gpu_monitor_overhead.py OUT.json [steps]
"""
import json
import statistics
import sys
import time
import warnings

import torch

from lpfail.model import GPT, GPTConfig
from lpfail.monitor import Monitor, MonitorWarning


def run(steps: int, monitored: bool, batch: int = 8):
    torch.manual_seed(0)
    model = GPT(GPTConfig()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    mon = Monitor(model) if monitored else None
    if mon is not None:
        mon.attach()
    times, losses = [], []
    try:
        for _ in range(steps):
            idx = torch.randint(0, 50257, (batch, 1025), device="cuda", generator=g)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if mon is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", MonitorWarning)
                    mon.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    finally:
        if mon is not None:
            mon.detach()
    return times, losses, (len(mon.records) if mon is not None else 0)


def main(path: str, steps: int = 60) -> None:
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": steps, "batch": 8,
           "model": "GPT-2 small (lpfail GPT defaults), SDPA, BF16 autocast", "monitor": "Monitor(model) defaults"}
    plain1, loss_plain, _ = run(steps, False)
    mon_t, loss_mon, n_rec = run(steps, True)
    plain2, _, _ = run(steps, False)
    skip = 10  # warm-up steps left out of the medians
    med = lambda t: statistics.median(t[skip:])  # noqa: E731
    base = (med(plain1) + med(plain2)) / 2
    # the monitor's work falls on the sampled steps: compare means over whole intervals too
    mean = lambda t: sum(t[skip:]) / len(t[skip:])  # noqa: E731
    base_mean = (mean(plain1) + mean(plain2)) / 2
    out.update(median_plain_s=[med(plain1), med(plain2)], median_monitored_s=med(mon_t),
               mean_plain_s=[mean(plain1), mean(plain2)], mean_monitored_s=mean(mon_t),
               overhead_pct_mean=100 * (mean(mon_t) / base_mean - 1), overhead_pct_median=100 * (med(mon_t) / base - 1),
               records=n_rec, losses_identical=loss_plain == loss_mon, max_loss_diff=max(abs(a - b) for a, b in zip(loss_plain, loss_mon)))
    out["meets_2pct"] = out["overhead_pct_mean"] <= 2.0
    json.dump(out, open(path, "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
