"""Store the run stores' plain part files compressed (`lpfail.sweep.store.compress_parts`).

    python tools/compress_parts.py [DIR]   # every DIR/*_parts/part-*.json → part-*.json.gz (DIR: default results/)

Each part is checked first (its content hash matches its content), compressed byte for byte, and its ``.json``
removed only once the ``.json.gz`` reads back to the same bytes. Exit status 1 when a part was left as it is.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lpfail import results  # noqa: E402
from lpfail.sweep.store import compress_parts  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", nargs="?", default=str(results.REPO_ROOT / "results"))
    args = ap.parse_args(argv)
    done, left = compress_parts(Path(args.directory))
    print(f"{len(done)} parts compressed; {len(left)} left as they are")
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
