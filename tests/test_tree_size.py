"""The tracked tree stays small enough to clone quickly: every file `git ls-files` names, summed, under
`MAX_TRACKED_MIB`. Skipped where the tree is not a git checkout of its own (a copy without ``.git``)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: The most the tracked files may weigh together, in MiB.
MAX_TRACKED_MIB = 48


def tracked_sizes() -> dict[str, int]:
    """{path: bytes} of every tracked file present in the working tree (a symbolic link counts as itself)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=REPO, capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != REPO:
        pytest.skip(f"{REPO} is not a git checkout of its own: the tracked files cannot be listed")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return {p: os.lstat(REPO / p).st_size for p in names.decode().split("\0") if p and os.path.lexists(REPO / p)}


def test_the_tracked_tree_stays_under_the_limit():
    sizes = tracked_sizes()
    total = sum(sizes.values())
    largest = ", ".join(f"{p} {n / 2 ** 20:.1f} MiB" for p, n in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert total <= MAX_TRACKED_MIB * 2 ** 20, (f"the tracked files weigh {total / 2 ** 20:.1f} MiB, more than "
                                                f"{MAX_TRACKED_MIB} MiB; the largest: {largest}")
