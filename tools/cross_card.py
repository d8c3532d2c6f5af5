"""Do a grid's stored runs reproduce on this card? One stored run per arm of each named grid, its first 300 steps
trained again here and compared bit for bit (`lpfail.sweep.rerun`); rows and the card into OUT/cross_card.json.
Used when a grid's runs of one seed would otherwise come from two kinds of card (notes/gpu_calls.md).
    python tools/cross_card.py OUT GRID... [--budget S]"""
import argparse
import json
from pathlib import Path

from lpfail.sweep import rerun
from lpfail.sweep.session import machine_info

ap = argparse.ArgumentParser()
ap.add_argument("out", type=Path)
ap.add_argument("grids", nargs="+")
ap.add_argument("--budget", type=float, default=240.0)
args = ap.parse_args()
items = rerun.plan(300, grids=tuple(args.grids))
rows = rerun.execute(items, Path("/tmp/lpfail_cross_card"), args.budget, len(items))
args.out.mkdir(parents=True, exist_ok=True)
(args.out / "cross_card.json").write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1) + "\n")
print("\n".join(f"{r['key']}: {rerun.word(r)}" for r in rows))
