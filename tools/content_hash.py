"""Add the content hash (`lpfail.results.CONTENT_KEY`) to the stored JSON files that were written without one.

    python tools/content_hash.py [DIR]          # add it where it is missing (DIR: default results/)
    python tools/content_hash.py --check [DIR]  # list the files without it or with one that does not match

The files are a result's ``NAME.json`` (beside its ``NAME.npz``), a quick profile's ``quick_NAME.json`` and a run
store's ``*_parts/part-*.json`` or ``part-*.json.gz``. Each is rewritten in the layout and the form it was written
in (``NAME.json`` and quick records indented by one space, parts on one line, a compressed part compressed) with
`CONTENT_KEY` added last, and only where reading it back and writing it out again gives its (decompressed) bytes
unchanged: then the added key is the only difference, and no value is recomputed. A file whose hash is present but
does not match is never rewritten: it was edited by hand, and the command that regenerates it is the remedy. Exit
status 1 when such a file (or one that cannot be rewritten faithfully) is found.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lpfail import results  # noqa: E402
from lpfail.sweep.store import decode_part, encode_part, part_files  # noqa: E402


def stored_files(directory: Path) -> list[tuple[Path, int | None]]:
    """(path, the ``indent`` it is written with) of every stored JSON that carries a content hash."""
    out = []
    for p in sorted(directory.glob("*.json")):
        if p.name.startswith("quick_") or p.with_suffix(".npz").is_file():
            out.append((p, 1))
    out += [(p, None) for folder in sorted(directory.glob("*_parts")) for p in part_files(folder)]
    return out


def read(path: Path) -> str:
    """A stored JSON's text (a compressed part decompressed)."""
    return decode_part(path.read_bytes(), path.name).decode()


def dump(record: dict, indent: int | None) -> str:
    """A stored JSON's text, as `lpfail.results.save`, `lpfail.sweep.quick.save` and `Part.write` write it."""
    return json.dumps(record, indent=indent, allow_nan=True) + "\n"


def state(path: Path, indent: int | None) -> str:
    """"ok" (the hash matches), "missing" (none, and the file can be rewritten with one faithfully), "edited"
    (a hash that does not match) or "unfaithful" (none, and writing it out again would change more than the key)."""
    text = read(path)
    record = json.loads(text)
    if results.CONTENT_KEY in record:
        return "ok" if results.content_ok(record) else "edited"
    return "missing" if dump(record, indent) == text else "unfaithful"


def migrate(directory: Path, log=print) -> tuple[list[Path], list[Path]]:
    """Add the hash to every stored file under ``directory`` that lacks it; returns (the files rewritten, the
    files left as they are because they are edited or cannot be rewritten faithfully)."""
    done, refused = [], []
    for path, indent in stored_files(directory):
        st = state(path, indent)
        if st == "missing":
            record = results.with_content_hash(json.loads(read(path)))
            results.atomic_write(path, encode_part(dump(record, indent).encode(), path.name))
            done.append(path)
        elif st != "ok":
            refused.append(path)
            log(f"{path}: {st}; left as it is")
    return done, refused


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", nargs="?", default=str(results.REPO_ROOT / "results"))
    ap.add_argument("--check", action="store_true", help="only list the files that lack a matching hash")
    args = ap.parse_args(argv)
    directory = Path(args.directory)
    if args.check:
        bad = [(p, st) for p, indent in stored_files(directory) for st in [state(p, indent)] if st != "ok"]
        for p, st in bad:
            print(f"{p}: {st}")
        return 1 if bad else 0
    done, refused = migrate(directory)
    print(f"content hash added to {len(done)} files; {len(refused)} left as they are")
    return 1 if refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
