"""Command line: ``python -m lpfail list | run NAME [--set key=value ...] | show NAME | bench kernels``."""
from __future__ import annotations

import argparse
import sys

from lpfail import results


def _cmd_list(args) -> int:
    reg = results.registry()
    if not reg:
        print("no experiments registered")
        return 0
    width = max(len(n) for n in reg)
    print(f"{'name':<{width}}  {'needs':<5}  {'stored':<8}  computed on / when     description")
    for name, exp in sorted(reg.items()):
        state = results.status(name)
        where = ""
        if state in ("fresh", "stale"):
            meta = results._read(name, results.results_dir()).meta
            where = f"{meta['device'][:14]:<14} {meta['created'][:10]}"
        print(f"{name:<{width}}  {'GPU' if exp.gpu else 'CPU':<5}  {state:<8}  {where:<22} {exp.description}")
    return 0


def _parse_sets(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ValueError(f"--set expects key=value (got {p!r})")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _cmd_run(args) -> int:
    exp = results.get(args.name)
    cfg = results.typed_config(exp, _parse_sets(args.set or []))
    res = results.run(args.name, cfg, store=not args.no_store)
    if args.no_store:
        print(f"{args.name}: done (not stored); keys {sorted(res)}")
    else:
        print(res.provenance)
        print(f"stored in {results.results_dir() / (args.name + '.json')} and .npz")
    return 0


def _cmd_show(args) -> int:
    res = results._read(args.name, results.results_dir())
    print(res.provenance)
    for key in sorted(res):
        v = res[key]
        desc = f"array {v.dtype} {tuple(v.shape)}" if hasattr(v, "shape") else repr(v)
        print(f"  {key}: {desc[:100]}")
    print(f"  status: {results.status(args.name)}")
    return 0


def _cmd_bench(args) -> int:
    args.name, args.no_store = f"bench_{args.what}", False
    return _cmd_run(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lpfail", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the registered experiments and the state of their stored results")
    p_run = sub.add_parser("run", help="run an experiment and store its result in results/")
    p_run.add_argument("name")
    p_run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field")
    p_run.add_argument("--no-store", action="store_true", help="run without writing the result")
    p_show = sub.add_parser("show", help="show a stored result's provenance and contents")
    p_show.add_argument("name")
    p_bench = sub.add_parser("bench", help="run a benchmark (GPU): `bench kernels`")
    p_bench.add_argument("what", choices=["kernels"])
    p_bench.add_argument("--set", action="append", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    handler = {"list": _cmd_list, "run": _cmd_run, "show": _cmd_show, "bench": _cmd_bench}[args.cmd]
    try:
        return handler(args)
    except (results.ResultError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
