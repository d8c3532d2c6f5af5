"""The diagnosis kit's monitor inside the training loop (`TrainConfig.monitor`). Part of `lpfail.train`.

``TrainConfig(monitor="every=10 window=10 sample_batch=1 alarm=16 reference=FP64")`` watches a run with
`lpfail.monitor.Monitor` (and its precision alarm when ``alarm`` > 0, the window of `lpfail.monitor.Alarm`):
its records go to ``monitor.jsonl`` in the run's folder (in memory only without one: `TrainResult` does not
carry them). Every attention back end of lpfail's GPT is seen (`lpfail.sdpa_hook.presented`). The monitor never
changes the run's arithmetic: its statistics are computed beside the model's own forward and backward. It needs
the steps uncaptured (its hooks cannot live in a CUDA graph), one process, and a run from step 0 (its windows
and step count start there). The validation forwards are not seen (`Monitor.paused`).
"""
from __future__ import annotations

from pathlib import Path

#: the settings a spec may give, with their types and defaults ("" = the Monitor's own default)
FIELDS = {"every": (int, 10), "window": (int, 10), "sample_batch": (int, 1), "alarm": (int, 0),
          "reference": (str, "FP64")}


def parse(spec: str) -> dict:
    """``"every=10 window=10 alarm=16"`` → {"every": 10, "window": 10, "sample_batch": 1, "alarm": 16,
    "reference": "FP64"}; "" → {} (no monitor). Raises ValueError naming the bad part."""
    spec = spec.strip()
    if not spec:
        return {}
    out = {k: default for k, (_, default) in FIELDS.items()}
    for part in spec.replace(",", " ").split():
        key, sep, value = part.partition("=")
        if not sep or key not in FIELDS:
            raise ValueError(f"TrainConfig.monitor: {part!r} is not key=value with a key among {sorted(FIELDS)}")
        kind = FIELDS[key][0]
        try:
            out[key] = kind(value)
        except ValueError:
            raise ValueError(f"TrainConfig.monitor: {key} must be an {kind.__name__} (got {value!r})") from None
    for key in ("every", "window", "sample_batch"):
        if out[key] <= 0:
            raise ValueError(f"TrainConfig.monitor: {key} must be positive (got {out[key]})")
    if out["alarm"] < 0:
        raise ValueError(f"TrainConfig.monitor: alarm must be ≥ 0, 0 = off (got {out['alarm']})")
    if out["window"] % out["every"]:
        raise ValueError(f"TrainConfig.monitor: window ({out['window']}) must be a multiple of every ({out['every']})")
    if out["reference"] not in ("FP64", "FP32"):
        raise ValueError(f"TrainConfig.monitor: reference must be FP64 or FP32 (got {out['reference']!r})")
    return out


def open_monitor(cfg, model, out_dir: Path | None, start: int, world: int, captured: bool):
    """The attached Monitor a run's config asks for, or None. Raises ValueError where it cannot watch."""
    settings = parse(cfg.monitor)
    if not settings:
        return None
    if captured:
        raise ValueError("TrainConfig.monitor needs uncaptured steps: set cuda_graph=False (or LPFAIL_NO_CAPTURE=1)")
    if world > 1:
        raise ValueError("TrainConfig.monitor watches one process (under torchrun each rank would write its own)")
    if start:
        raise ValueError(f"TrainConfig.monitor watches a run from step 0 (this one resumes at step {start}): "
                         "its windows and step count start there")
    from lpfail.monitor import Alarm, Monitor

    alarm = Alarm(window=settings["alarm"], reference=settings["reference"]) if settings["alarm"] else None
    path = Path(out_dir) / "monitor.jsonl" if out_dir else None
    return Monitor(model, every=settings["every"], window=settings["window"], sample_batch=settings["sample_batch"],
                   path=path, n_head=cfg.n_head, alarm=alarm).attach()
