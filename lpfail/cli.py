"""Command line: ``python -m lpfail list | run NAME [--set key=value ...] | show NAME | bench kernels|step | train |
sweep NAME status|plan|checks|drive|collect`` (the last: `lpfail.sweep.cli`).

``python -m lpfail train [--preset tiny|probe|gpt2-small|gpt2-medium] [--set key=value ...]`` trains (see
`lpfail.train`); under ``torchrun --nproc_per_node=N`` it runs data-parallel on N GPUs."""
from __future__ import annotations

import argparse
import json
import sys

from lpfail import numerics, results


def _cmd_list(args) -> int:
    reg = results.registry()
    if not reg:
        print("no experiments registered")
        return 0
    width = max(len(n) for n in reg)
    print(f"{'name':<{width}}  {'needs':<5}  {'stored':<8}  computed on / when     description")
    for name, exp in sorted(reg.items()):
        state, res = results.inspect(name)
        if state == "fresh" and res.get("complete") is False:  # e.g. lr_sweep stored from an incomplete grid
            state = "partial"
        where = f"{res.meta['device'][:14]:<14} {res.meta['created'][:10]}" if res is not None else ""
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
    state, res = results.inspect(args.name)
    if res is None:  # missing or corrupt: reading it again raises the error that says why and what to run
        results.read_result(args.name, results.results_dir())
    print(res.provenance)
    for key in sorted(res):
        v = res[key]
        desc = f"array {v.dtype} {tuple(v.shape)}" if hasattr(v, "shape") else repr(v)
        print(f"  {key}: {desc[:100]}")
    print(f"  status: {state}")
    return 0


def _cmd_bench(args) -> int:
    args.name, args.no_store = f"bench_{args.what}", False
    return _cmd_run(args)


def _cmd_train(args) -> int:
    import os

    from lpfail import train as T

    sets = _parse_sets(args.set or [])
    for flag, key in ((args.attention, "attention"), (args.out, "out_dir"), (args.max_steps, "max_steps")):
        if flag is not None:
            sets[key] = str(flag)
    if args.override:
        sets["overrides"] = ";".join(args.override)
    given = T.load_config(args.config) if args.config else None
    cfg = T.config_from_sets(args.preset, sets, given)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        base = given or (T.TrainConfig.preset(args.preset) if args.preset else T.TrainConfig())
        changed = {k: v for k, v in cfg.to_dict().items() if v != base.to_dict()[k]}
        print(f"train: {'config ' + args.config if args.config else 'preset ' + (args.preset or '(defaults)')}, world size {os.environ.get('WORLD_SIZE', '1')}; "
              f"overrides: {changed or 'none'}")
        print(f"  {cfg.n_layer} layers x {cfg.n_embd}, T {cfg.block_size}, {cfg.tokens_per_step:,} tokens/step, "
              f"{cfg.optimizer} lr {cfg.lr:g}, attention {cfg.attention}"
              + (f" + {list(cfg.overrides)}" if cfg.overrides else ""))
    if args.prepare_data:
        if cfg.data != "openwebtext":
            raise ValueError("--prepare-data prepares OpenWebText: add --set data=openwebtext")
        if rank == 0:
            from lpfail.data import DatasetUnavailableError, openwebtext_bins
            try:
                print(f"prepared: {openwebtext_bins(cfg.data_dir)}")
            except (DatasetUnavailableError, ImportError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
    if args.print_config:
        if rank == 0:
            print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    res = T.train(cfg, resume_from=args.resume, replay=args.replay, replay_from=args.replay_from,
                  progress=False if args.no_progress else None, force=args.force)
    if rank == 0:
        print(res)
        if cfg.out_dir:
            print(f"logs in {cfg.out_dir}/ (log.jsonl, diag.jsonl, run.json)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sweep"]:  # grids of training runs: their own command line
        from lpfail.sweep.cli import main as sweep_main

        return sweep_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m lpfail", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the registered experiments and the state of their stored results")
    p_run = sub.add_parser("run", help="run an experiment and store its result in the results folder: "
                                       "$LPFAIL_RESULTS_DIR if set, else results/ of a source checkout, else "
                                       "results/ in the user's lpfail folder ($LPFAIL_HOME, else $XDG_DATA_HOME/lpfail, else "
                                       "~/.local/share/lpfail)")
    p_run.add_argument("name")
    p_run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field")
    p_run.add_argument("--no-store", action="store_true", help="run without writing the result")
    p_show = sub.add_parser("show", help="show a stored result's provenance and contents")
    p_show.add_argument("name")
    p_bench = sub.add_parser("bench", help="run a benchmark (GPU): `bench kernels` (the attention table), `bench step` "
                                           "(GPT-2 small's training step, SDPA against the drop-in)")
    p_bench.add_argument("what", choices=["kernels", "step"])
    p_bench.add_argument("--set", action="append", metavar="KEY=VALUE")
    p_train = sub.add_parser("train", help="train a GPT (single process, or under torchrun: data-parallel)")
    p_train.add_argument("--preset", help="tiny | probe | gpt2-small | gpt2-medium (default: TrainConfig's)")
    p_train.add_argument("--config", metavar="JSON", help="start from a config file (or a run's config.json)")
    p_train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a TrainConfig field")
    p_train.add_argument("--attention", help="attention of every head, e.g. sdpa, PAPER_BF16, triton(FA2_BF16)")
    p_train.add_argument("--override", action="append", metavar="LAYERS[/HEADS]:SPEC",
                         help="per-layer / per-head attention, e.g. 1:sdpa or 1/0,6,7:reference(FP32)")
    p_train.add_argument("--out", help="output directory (logs, batch record, checkpoints)")
    p_train.add_argument("--max-steps", type=int)
    p_train.add_argument("--resume", metavar="CKPT", help="continue (or branch) from a checkpoint")
    p_train.add_argument("--replay", metavar="PATH", help="train on a recorded batch order (a run directory)")
    p_train.add_argument("--replay-from", type=int, metavar="STEP",
                         help="with --replay: start at STEP from that run's checkpoint at STEP")
    p_train.add_argument("--prepare-data", action="store_true", help="download and tokenize OpenWebText first")
    p_train.add_argument("--print-config", action="store_true", help="print the config and exit")
    p_train.add_argument("--no-progress", action="store_true", help="no progress bar")
    p_train.add_argument("--force", action="store_true",
                         help="train into --out even where it holds a finished run of another config (overwriting it)")
    sub.add_parser("sweep", help="a grid of training runs: `sweep NAME status|plan|checks|drive|collect` "
                                 "(`sweep list` names the grids)")
    args = parser.parse_args(argv)
    handler = {"list": _cmd_list, "run": _cmd_run, "show": _cmd_show, "bench": _cmd_bench,
               "train": _cmd_train}[args.cmd]
    try:
        return handler(args)
    except (results.ResultError, numerics.NumericsError, ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
