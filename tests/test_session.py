"""The GPU session of grids (`lpfail.sweep.session`, tools/gpu.sh), on the CPU with a tiny grid: the results cache
seeded into the scratch cache, one detached-style driver over a grid's missing runs, the new parts packed and
unpacked here without overwriting a stored part, and the quick profiles' records."""
import json
import tarfile

import pytest

from lpfail import sweep
from lpfail.experiments import lr_sweep as L
from lpfail.sweep import grid as G
from lpfail.sweep import session

TINY = dict(lrs=(1e-3, 1e-2), seeds=(0,), variants=("A", "C"), large_variants=(), small=(1, 2, 32),
            block_size=16, batch_size=4, max_steps=6, warmup=2, val_rows=4, val_every=3, diag_every=3,
            curve_points=3, checkpoint_every=3)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    repo = tmp_path / "repo_results"
    (repo / "lr_sweep_parts").mkdir(parents=True)
    (repo / "lr_sweep.json").write_text("{}")
    (repo / "runs.tgz").write_bytes(b"not copied")
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("LPFAIL_RESULTS_DIR", str(scratch))
    monkeypatch.setattr(session, "BASE", tmp_path / "session")
    monkeypatch.setattr(session.results, "REPO_ROOT", tmp_path / "fake_repo")
    (tmp_path / "fake_repo").mkdir()
    (tmp_path / "fake_repo" / "results").symlink_to(repo)
    monkeypatch.setitem(G.GRIDS, "tiny_lr", lambda config=None: L.LRGrid(L.LRSweepConfig(**TINY)))
    return repo, scratch


def test_drive_collect_unpack_and_quick_records(tiny, tmp_path):
    """One drive of the tiny grid's missing runs, then: its new part packed and unpacked into the results (a stored
    part is never overwritten), and the quick profile rerun beside the stored runs, its record packed and
    unpacked."""
    repo, scratch = tiny
    session.seed_cache(repo, scratch)
    assert (scratch / "lr_sweep.json").is_file() and not (scratch / "runs.tgz").exists()
    session._drive(["tiny_lr"], budget_s=600)
    assert sweep.lookup(G.get("tiny_lr"), scratch).complete
    session.collect(tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "grids.tgz") as tf:
        names = tf.getnames()
    parts = [n for n in names if n.startswith("lr_sweep_parts/part-")]
    assert len(parts) == 1 and "session/drive.log" not in names  # the in-process driver wrote no log
    written = session.unpack(tmp_path / "out" / "grids.tgz", repo)
    assert [p.split("/")[-1] for p in written] == [parts[0].split("/")[-1]]
    assert sweep.lookup(G.get("tiny_lr"), repo).complete
    before = (repo / parts[0]).read_bytes()
    (repo / parts[0]).write_text(json.dumps({"format": "changed here"}))
    assert session.unpack(tmp_path / "out" / "grids.tgz", repo) == []  # a stored part is never overwritten
    assert (repo / parts[0]).read_bytes() != before
    (repo / parts[0]).write_bytes(before)

    session.quick(["tiny_lr"], tmp_path / "quick_out", budget_s=600)
    with tarfile.open(tmp_path / "quick_out" / "quick.tgz") as tf:
        rec = json.loads(tf.extractfile("quick_tiny_lr.json").read())
    assert rec["name"] == "lr_sweep" and rec["complete"] and rec["bit_identical_runs"] == 4 and rec["wall_s"] > 0
    assert rec["config_hash"] and rec["device"]
    assert session.unpack(tmp_path / "quick_out" / "quick.tgz", repo) == [str(repo / "quick_tiny_lr.json")]


def test_mps_daemon_left_running_is_kept(monkeypatch, tmp_path):
    """`quick` then `start` in two device calls: the second `-d` fails with "already running"; the daemon answers
    on its pipe and must be kept (2026-12-02 00:43 it was stopped, and the driver's runs time-sliced the GPU)."""
    calls, said = [], []

    class Done:
        def __init__(self, rc):
            self.returncode, self.stdout, self.stderr = rc, "", ""

    def fake_run(args, input=None, **kw):
        calls.append((tuple(args), input))
        if args[-1] == "-d":
            return Done(1)  # "An instance of this daemon is already running"
        return Done(0)  # get_server_list answers; the CUDA probe works

    monkeypatch.setattr(session.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(session.subprocess, "run", fake_run)
    monkeypatch.setattr(session, "MPS", {k: str(tmp_path / k) for k in session.MPS})
    monkeypatch.setattr(session.os, "environ", dict(session.os.environ))
    monkeypatch.setattr(session, "log", said.append)
    session.start_mps()
    assert said == ["MPS control daemon already running: kept"]
    assert ("quit\n" not in [inp for _, inp in calls])
    # no daemon at all (both `-d` and the pipe fail): stopped and said so
    calls.clear(), said.clear()
    monkeypatch.setattr(session.subprocess, "run", lambda args, input=None, **kw: Done(
        0 if "-c" in args else 1))
    session.start_mps()
    assert said[0].startswith("MPS did not work")


def _tgz(path, name, obj):
    import io
    data = json.dumps(obj).encode()
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return path


def test_unpack_takes_a_later_state_of_a_growing_part(tmp_path):
    """A driver running across calls writes one part that grows: the later call's archive replaces the earlier
    state (2026-12-02: the first state was kept and 102 runs of the later ones were dropped); anything else that
    differs never overwrites a stored part."""
    repo = tmp_path / "results"
    name = "lr_sweep_parts/part-20261202T122554-487.json"
    head = {"format": "lpfail-sweep-part", "git": "abc", "created": "2026-12-02T12:25"}
    first = {**head, "wall_s": 10.0, "runs": {"a": {"val_loss": 1.0}}}
    later = {**head, "wall_s": 20.0, "runs": {"a": {"val_loss": 1.0}, "b": {"val_loss": 2.0}}}
    changed = {**head, "wall_s": 30.0, "runs": {"a": {"val_loss": 9.0}, "b": {"val_loss": 2.0}, "c": {}}}
    other = {**head, "git": "def", "wall_s": 30.0, "runs": {**later["runs"], "c": {}}}
    assert session.unpack(_tgz(tmp_path / "1.tgz", name, first), repo) == [str(repo / name)]
    assert session.unpack(_tgz(tmp_path / "2.tgz", name, later), repo) == [str(repo / name)]
    assert json.loads((repo / name).read_text())["runs"].keys() == {"a", "b"}
    assert session.unpack(_tgz(tmp_path / "3.tgz", name, first), repo) == []  # an earlier state: kept
    assert session.unpack(_tgz(tmp_path / "4.tgz", name, changed), repo) == []  # a run changed: kept
    assert session.unpack(_tgz(tmp_path / "5.tgz", name, other), repo) == []  # another header: kept
    assert json.loads((repo / name).read_text()) == later


def test_unpack_takes_either_form_of_a_part_and_keeps_one_file(tmp_path):
    """An archive may hold a part as plain JSON (a tree that wrote ``.json``) or compressed (``.json.gz``): each is
    written in its own form; the same content already stored in the other form is not written again, and a later
    state replaces the stored one, whatever its form, leaving one file."""
    import gzip

    repo = tmp_path / "results"
    plain = "lr_sweep_parts/part-20261202T122554-487.json"
    head = {"format": "lpfail-sweep-part", "git": "abc", "created": "2026-12-02T12:25"}
    first = {**head, "wall_s": 10.0, "runs": {"a": {"val_loss": 1.0}}}
    later = {**head, "wall_s": 20.0, "runs": {"a": {"val_loss": 1.0}, "b": {"val_loss": 2.0}}}
    changed = {**head, "wall_s": 30.0, "runs": {"a": {"val_loss": 9.0}, "b": {"val_loss": 2.0}, "c": {}}}

    def gz_tgz(path, obj):
        import io
        data = gzip.compress(json.dumps(obj).encode(), mtime=0)
        with tarfile.open(path, "w:gz") as tf:
            info = tarfile.TarInfo(plain + ".gz")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        return path

    assert session.unpack(gz_tgz(tmp_path / "1.tgz", first), repo) == [str(repo / plain) + ".gz"]
    assert sweep.read_part(repo / (plain + ".gz")) == first
    assert session.unpack(_tgz(tmp_path / "2.tgz", plain, first), repo) == []  # the same content, plain
    assert not (repo / plain).exists()
    assert session.unpack(_tgz(tmp_path / "3.tgz", plain, later), repo) == [str(repo / plain)]
    assert json.loads((repo / plain).read_text()) == later and not (repo / (plain + ".gz")).exists()
    assert session.unpack(gz_tgz(tmp_path / "4.tgz", changed), repo) == []  # a run changed: kept
    assert session.unpack(gz_tgz(tmp_path / "5.tgz", first), repo) == []  # an earlier state: kept
    assert sorted(p.name for p in (repo / "lr_sweep_parts").iterdir()) == [plain.split("/")[-1]]


def test_collect_packs_only_parts_whose_content_is_not_stored(tiny, tmp_path):
    """The scratch cache holds the repository's parts as seeded (either form) and the parts written on the
    machine: a part whose content the repository holds, in either form, is not packed again."""
    import gzip

    repo, scratch = tiny
    one = {"format": L.STORE.fmt, "runs": {"a": {"v": 1.0}}}
    two = {"format": L.STORE.fmt, "runs": {"b": {"v": 2.0}}}
    (repo / "lr_sweep_parts" / "part-1.json.gz").write_bytes(gzip.compress(json.dumps(one).encode(), mtime=0))
    (repo / "lr_sweep_parts" / "part-2.json").write_text(json.dumps(two))
    session.seed_cache(repo, scratch)
    assert (scratch / "lr_sweep_parts" / "part-1.json.gz").is_file()
    (scratch / "lr_sweep_parts" / "part-2.json").rename(scratch / "lr_sweep_parts" / "part-2.json.gz")
    (scratch / "lr_sweep_parts" / "part-2.json.gz").write_bytes(gzip.compress(json.dumps(two).encode()))
    part = L.STORE.part(scratch)
    part.add({"key": "c", "run_hash": "h"})
    session.collect(tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "grids.tgz") as tf:
        assert [n for n in tf.getnames() if n.startswith("lr_sweep_parts/")] == [f"lr_sweep_parts/{part.path.name}"]
    assert part.path.name.endswith(".json.gz")
    assert session.unpack(tmp_path / "out" / "grids.tgz", repo) == [str(repo / "lr_sweep_parts" / part.path.name)]
    assert set(L.STORE.load(repo)[0]) == {"a", "b", "c"}


def test_drive_leaves_the_skipped_groups(tiny):
    """`--skip PATTERN` leaves every run whose group matches (the dial's long runs must not start late in a call)."""
    repo, scratch = tiny
    session.seed_cache(repo, scratch)
    assert session.skipped("long_A_3", ("long_*",)) and not session.skipped("A_3", ("long_*",))
    groups = {r.group for r in sweep.lookup(G.get("tiny_lr"), scratch).missing}
    session._drive(["tiny_lr"], budget_s=600, skip=tuple(groups))
    assert len(sweep.lookup(G.get("tiny_lr"), scratch).missing) == len(sweep.lookup(G.get("tiny_lr"), scratch).runs)


def test_collect_brings_back_the_end_of_crashed_runs(tmp_path, monkeypatch):
    """A run whose stdout holds a traceback comes back as its last lines in the archive; a run stopped at the budget
    (no traceback) does not."""
    base = tmp_path / "session"
    (base / "runs" / "crashed_run").mkdir(parents=True)
    (base / "runs" / "crashed_run" / "stdout.txt").write_text("step 10\n" * 2000 + "Traceback (most recent call "
                                                              "last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory\n")
    (base / "runs" / "stopped_run").mkdir(parents=True)
    (base / "runs" / "stopped_run" / "stdout.txt").write_text("step 10\n")
    monkeypatch.setattr(session, "BASE", base)
    monkeypatch.setattr(session, "_scratch", lambda: tmp_path / "scratch")
    session.collect(tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "grids.tgz") as tf:
        names = tf.getnames()
        tail = tf.extractfile("session/crashed/crashed_run.txt").read().decode()
    assert "session/crashed/stopped_run.txt" not in names
    assert tail.endswith("CUDA out of memory\n") and len(tail) == 4000
