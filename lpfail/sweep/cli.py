"""``python -m lpfail sweep NAME status | plan | checks | drive [--budget S] [--quick] | collect [--partial]``.

status   what is stored: runs per group, the next missing run, the parts that hold them
plan     every run of the grid, one a line: key, group, seed, stored or missing, attention (what the GPU
         scripts read instead of hand-typed lists)
checks   captured == uncaptured and continued == uninterrupted for the grid's check groups, written to
         <root>/checks.json; exit status 1 when one fails (the driver then runs those groups uncaptured)
drive    train the missing runs (each stored in a part as it finishes) within --budget seconds; with --quick,
         the grid's quick profile instead: its subset trained afresh, the headline beside the stored grid's
         (exit status 1 and no headline, but the runs that did not finish, where the budget ran out first)
collect  store the result from the parts (on any machine); refuses while runs are missing (--partial: store an
         incomplete grid, where the grid allows it)

checks and drive train GPU-size runs: without a CUDA GPU they refuse, starting nothing (exit status 1), as
`python -m lpfail run` does for a GPU experiment; drive --quick is left to its budget.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lpfail import results
from lpfail.sweep import grid as G
from lpfail.sweep import quick as Q
from lpfail.sweep import run as R

COMMANDS = ("status", "plan", "checks", "drive", "collect")


def _positive_seconds(text: str) -> float:
    """--budget: a number of seconds above 0 (argparse reports anything else as a usage error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:   # also NaN
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _no_gpu(grid, command: str) -> str:
    """Why `command` may not train `grid` here ("" where it may): a grid registered as GPU work on a machine
    without CUDA (its runs are GPU-size training runs; on the CPU they would only run out the budget)."""
    if not results.lacks_gpu(grid.name):
        return ""
    return (f"grid {grid.name!r} needs a CUDA GPU and none is available here; run `python -m lpfail sweep "
            f"{grid.name} {command}` on a GPU machine (`status`, `plan` and `collect` run anywhere)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lpfail sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help="the grid experiment (`python -m lpfail sweep list` names them)")
    ap.add_argument("command", choices=COMMANDS, nargs="?", default="status")
    ap.add_argument("--budget", type=_positive_seconds, default=None, help="drive: seconds before running runs are stopped")
    ap.add_argument("--quick", action="store_true", help="drive: the quick profile (a chapter's headline)")
    ap.add_argument("--record", default=None, help="drive --quick: also write the outcome here (JSON)")
    ap.add_argument("--partial", action="store_true", help="collect: store an incomplete grid too")
    ap.add_argument("--root", default=None, help="where the runs write (default $LPFAIL_SWEEP_ROOT or "
                                                 "/tmp/lpfail_sweep/NAME)")
    ap.add_argument("--json", action="store_true", help="status: as JSON")
    return ap


def _plan(grid) -> str:
    lk = G.lookup(grid)
    todo = {r.id for r in lk.missing}
    lines = []
    for r in lk.runs:
        over = ";".join(getattr(r.config, "overrides", ()) or ())
        state = ("retired" if r.id in todo and r.id in lk.have else "missing" if r.id in todo else
                 "stored, read retired" if r.id in lk.retired else "stored")
        lines.append(f"{r.key}\t{r.group}\t{r.seed}\t{state}\t"
                     f"{r.config.attention}{(' ' + over) if over else ''}")
    return "\n".join(lines)


def _drive(grid, args) -> int:
    root = Path(args.root) if args.root else R.default_root(grid)
    if args.quick:
        rec = Q.run_quick(grid, root, budget_s=args.budget or 600.0, log=lambda m: print(m, flush=True))
        print(Q.text(rec), flush=True)
        if not Q.has_headline(rec):
            return 1  # and no record: a record holds a headline
        if args.record:
            Q.save(rec, Path(args.record))
        return 0
    why = grid.ready() if hasattr(grid, "ready") else ""
    if why:
        print(f"{grid.name} drive: not started: {why}", flush=True)
        return 1
    why = _no_gpu(grid, "drive")
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    missing = G.lookup(grid).missing
    print(f"{grid.name} drive: {len(missing)} runs missing", flush=True)
    R.drive(grid, missing, root=root / "runs", budget_s=args.budget, log=lambda m: print(m, flush=True))
    print(R.status_text(grid), flush=True)
    return 0


def _checks(grid, args) -> int:
    why = _no_gpu(grid, "checks") if getattr(grid, "check_groups", True) else ""   # none: nothing is trained
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    root = Path(args.root) if args.root else R.default_root(grid)
    out = grid.checks(root / "checks", log=lambda m: print(m, flush=True))
    root.mkdir(parents=True, exist_ok=True)
    (root / "checks.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"uncaptured: {R.uncaptured_from_checks(out) or 'none'}")
    return 0 if out.get("ok") else 1


def _collect(grid, args) -> int:
    res = R.collect(grid, partial=args.partial)
    if res is None:
        print(f"{grid.name}: the stored result is fresh and built from the same parts; left as it is")
    else:
        print(res.provenance)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["list"]:
        for name in G.names():
            print(name)
        return 0
    args = parser().parse_args(argv)
    try:
        grid = G.get(args.name)
        if args.command == "status":
            print(json.dumps(R.status(grid), indent=1, default=str) if args.json else R.status_text(grid))
            return 0
        if args.command == "plan":
            print(_plan(grid))
            return 0
        return {"drive": _drive, "checks": _checks, "collect": _collect}[args.command](grid, args)
    except (results.ResultError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
