"""Replay and branch: the paper's own method on a recorded run (its Sec. 3, chapter 2).

`replay_branch` replays a recorded run from one of its checkpoints on the batches it consumed, checks that the
replay reproduces the recorded losses bit for bit, then trains one branch per change from the same checkpoint,
and says at which step each branch's loss first departs from the run's.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from lpfail.train.config import load_config, window_config
from lpfail.train.log import checkpoint_path, read_log
from lpfail.train.loop import train


def replay_branch(run_dir, step: int, branches: dict[str, dict], out_root=None, max_steps: int | None = None
                  ) -> dict:
    """Replay a recorded run from its checkpoint at `step`, then branch from the same checkpoint.

    run_dir   a finished run's directory: config.json, batches_rank*.i64 (its batch order), log.jsonl and
              ckpt_{step}.pt (train with ``checkpoint_every`` dividing `step` and ``keep_checkpoints=0``)
    branches  name → TrainConfig field changes, e.g. {"m": {"attention": "reference(PAPER_BF16,m_acc=fp32)"}}
    Returns {"replay": {"losses", "equal"}, name: {"losses", "first_diff"}} where `equal` says whether the replay
    reproduced the recorded losses from `step` on bit for bit (it must: a ValueError otherwise, since a branch
    compared with a replay that is not the run means nothing), and `first_diff` is the first step at which a
    branch's loss differs from the recorded one (None if never)."""
    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.json")
    ck = checkpoint_path(run_dir, step)
    if not ck.is_file():
        have = sorted(p.name for p in run_dir.glob("ckpt_*.pt"))
        raise FileNotFoundError(f"replay_branch: no checkpoint {ck.name} in {run_dir} (have {have})")
    recorded = read_log(run_dir)
    rec_steps, rec_loss = np.asarray(recorded["step"]), np.asarray(recorded["loss"])
    last = cfg.max_steps if max_steps is None else int(max_steps)
    if not step < last <= cfg.max_steps:
        raise ValueError(f"replay_branch: need step < max_steps <= the run's {cfg.max_steps} (got {step}, {last})")
    want = rec_loss[(rec_steps >= step) & (rec_steps < last)]

    def go(name: str, changes: dict):
        d = "" if out_root is None else str(Path(out_root) / name)
        tc = window_config(cfg, last, out_dir=d, **changes)
        res = train(tc, replay=run_dir, resume_from=ck)
        a = res.arrays()
        return np.asarray(a["loss"])[np.asarray(a["step"]) >= step]

    rep = go("replay", {})
    equal = bool(rep.shape == want.shape and np.array_equal(rep, want))
    if not equal:
        raise ValueError(f"replay_branch: the replay of {run_dir} from step {step} did not reproduce its recorded "
                         "losses bit for bit; branches from it would not be comparable")
    out = {"replay": {"losses": rep.tolist(), "equal": equal}, "step": step}
    for name, changes in branches.items():
        if name == "replay":
            raise ValueError("replay_branch: 'replay' is reserved for the replay itself")
        loss = go(name, dict(changes))
        n = min(len(loss), len(want))
        diff = np.nonzero(~((loss[:n] == want[:n]) | (np.isnan(loss[:n]) & np.isnan(want[:n]))))[0]
        out[name] = {"losses": loss.tolist(), "first_diff": int(step + diff[0]) if diff.size else None}
    return out


def main(argv=None) -> int:
    """``python -m lpfail.train.replay --run DIR --out FILE [--step N] [--until N] --branch NAME=ATTENTION ...``."""
    ap = argparse.ArgumentParser(prog="python -m lpfail.train.replay", description=__doc__)
    ap.add_argument("--run", required=True, help="the recorded run (its checkpoints kept)")
    ap.add_argument("--step", type=int, default=600, help="the checkpoint to replay and branch from")
    ap.add_argument("--until", type=int, default=None, help="the window's end (default: the run's end)")
    ap.add_argument("--branch", action="append", default=[], metavar="NAME=ATTENTION",
                    help="a branch with another attention spec, e.g. fp32=reference(FP32)")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(argv)
    branches = {}
    for b in args.branch:
        name, sep, spec = b.partition("=")
        if not sep or not name or not spec:
            ap.error(f"--branch expects NAME=ATTENTION (got {b!r})")
        branches[name] = {"attention": spec}
    t0 = time.time()
    res = replay_branch(args.run, args.step, branches, max_steps=args.until)
    res["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res) + "\n")
    print(f"replay from step {args.step}: bit-exact {res['replay']['equal']}; first differing step per branch: "
          + ", ".join(f"{n} {res[n]['first_diff']}" for n in branches) + f" ({res['wall_s']} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
