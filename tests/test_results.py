"""The results cache: round trip, provenance, and every failure case (missing, stale, corrupt, half-written)."""
import dataclasses
import json
import os

import numpy as np
import pytest

from lpfail import cli, results


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    n: int = 5
    scale: float = 2.0
    label: str = "toy"


CALLS = []


@results.experiment("_toy", config=ToyConfig, description="a toy experiment for the tests")
def _toy(cfg: ToyConfig):
    CALLS.append(cfg)
    return {"x": np.arange(cfg.n) * cfg.scale, "total": float(cfg.n * cfg.scale), "label": cfg.label}


@results.experiment("_toy_gpu", config=ToyConfig, gpu=True)
def _toy_gpu(cfg: ToyConfig):
    return {"x": np.zeros(1)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LPFAIL_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("LPFAIL_RECOMPUTE", raising=False)
    CALLS.clear()
    return tmp_path


def test_round_trip_with_provenance(cache):
    stored = results.run("_toy")
    res = results.load("_toy")
    np.testing.assert_array_equal(res["x"], np.arange(5) * 2.0)
    assert res["total"] == 10.0 and res["label"] == "toy"
    for key in ("name", "config", "config_hash", "git", "device", "versions", "created", "wall_s"):
        assert key in res.meta, key
    assert res.meta["config"]["n"] == 5
    assert res.meta["device"].startswith("cpu")
    assert res.meta["versions"]["torch"]
    assert stored.meta["config_hash"] == results.config_hash(ToyConfig())
    assert "computed on cpu" in res.provenance
    assert sorted(os.listdir(cache)) == ["_toy.json", "_toy.npz"]  # no temporary files left behind


def test_config_hash_depends_on_every_field():
    base = results.config_hash(ToyConfig())
    assert results.config_hash(ToyConfig()) == base
    for change in ({"n": 6}, {"scale": 2.0000001}, {"label": "other"}):
        assert results.config_hash(dataclasses.replace(ToyConfig(), **change)) != base


def test_missing_names_the_command(cache):
    with pytest.raises(results.ResultMissing, match="python -m lpfail run _toy"):
        results.load("_toy")


def test_stale_when_config_changes(cache):
    results.run("_toy", ToyConfig(n=3))
    with pytest.raises(results.ResultStale, match="python -m lpfail run _toy"):
        results.load("_toy")
    assert results.load("_toy", ToyConfig(n=3))["total"] == 6.0
    assert results.status("_toy") == "stale"


def test_corrupt_json(cache):
    results.run("_toy")
    (cache / "_toy.json").write_text("{not json")
    with pytest.raises(results.ResultCorrupt, match="corrupt"):
        results.load("_toy")
    assert results.status("_toy") == "corrupt"


def test_truncated_npz_is_detected(cache):
    results.run("_toy")
    data = (cache / "_toy.npz").read_bytes()
    (cache / "_toy.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(results.ResultCorrupt, match="does not match the hash"):
        results.load("_toy")


def test_npz_without_json_half_pair(cache):
    results.run("_toy")
    (cache / "_toy.npz").unlink()
    with pytest.raises(results.ResultCorrupt, match="no _toy.npz"):
        results.load("_toy")


def test_failed_write_keeps_the_old_result(cache, monkeypatch):
    results.run("_toy")
    before = (cache / "_toy.json").read_bytes()
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith(".json"):
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        results.run("_toy", ToyConfig(n=7))
    monkeypatch.setattr(os, "replace", real_replace)
    assert (cache / "_toy.json").read_bytes() == before
    assert not [p for p in os.listdir(cache) if p.endswith(".tmp")]
    # the npz was replaced but the json was not: the pair no longer matches, and that is caught
    with pytest.raises(results.ResultCorrupt):
        results.load("_toy")


def test_recompute_env(cache, monkeypatch):
    results.run("_toy")
    assert len(CALLS) == 1
    results.load("_toy")
    assert len(CALLS) == 1
    monkeypatch.setenv("LPFAIL_RECOMPUTE", "1")
    results.load("_toy")
    assert len(CALLS) == 2


def test_gpu_experiment_refuses_without_cuda(cache):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(results.ResultError, match="needs a CUDA GPU"):
        results.run("_toy_gpu")
    with pytest.raises(results.ResultMissing, match="on a GPU machine"):
        results.load("_toy_gpu")


def test_unknown_experiment():
    with pytest.raises(results.UnknownExperiment, match="no experiment named 'nope'"):
        results.load("nope")


def test_bad_return_values(cache):
    @dataclasses.dataclass(frozen=True)
    class C:
        a: int = 1

    @results.experiment("_bad", config=C)
    def _bad(cfg):
        return {"obj": object()}

    with pytest.raises(TypeError, match="neither a numpy array nor JSON"):
        results.run("_bad")
    assert not list(cache.iterdir())


def test_config_must_be_frozen_dataclass():
    @dataclasses.dataclass
    class Mutable:
        a: int = 1

    with pytest.raises(TypeError, match="frozen"):
        results.experiment("_m", config=Mutable)


def test_typed_config_from_strings():
    exp = results.get("_toy")
    cfg = results.typed_config(exp, {"n": "7", "scale": "0.5", "label": "x"})
    assert cfg == ToyConfig(n=7, scale=0.5, label="x")
    with pytest.raises(ValueError, match="unknown config field 'm'"):
        results.typed_config(exp, {"m": "1"})
    with pytest.raises(ValueError, match="cannot set n='seven'"):
        results.typed_config(exp, {"n": "seven"})


def test_cli_run_list_show(cache, capsys):
    assert cli.main(["run", "_toy", "--set", "n=4"]) == 0
    assert "computed on cpu" in capsys.readouterr().out
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "_toy" in out and "stale" in out  # stored with n=4, default is n=5
    assert cli.main(["show", "_toy"]) == 0
    assert "array float64 (4,)" in capsys.readouterr().out
    assert cli.main(["run", "nope"]) == 2
    assert "no experiment named" in capsys.readouterr().err


def test_cli_list_says_partial_for_an_incomplete_result(cache, capsys):
    """A result stored from an incomplete grid (``complete`` False, as lr_sweep's --partial collection) is
    listed as partial, not fresh."""
    results.save("_toy", ToyConfig(), {"x": np.zeros(2), "complete": False}, 1.0)
    assert cli.main(["list"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("_toy "))
    assert "partial" in line and "fresh" not in line
    results.save("_toy", ToyConfig(), {"x": np.zeros(2), "complete": True}, 1.0)
    cli.main(["list"])
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("_toy "))
    assert "fresh" in line


def test_every_stored_result_is_fresh_and_has_provenance():
    """The committed results cache: each file pair loads, names its device, and matches its experiment's
    current config (otherwise the book would be showing numbers its code no longer makes)."""
    directory = results.REPO_ROOT / "results"
    names = sorted(p.stem for p in directory.glob("*.json") if not p.name.startswith("quick_"))
    reg = results.registry()
    for name in names:
        assert name in reg, f"results/{name}.json belongs to no registered experiment"
        res = results.load(name, directory=directory) if not os.environ.get("LPFAIL_RECOMPUTE") else None
        if res is not None:
            assert res.meta["device"] and res.meta["created"] and res.meta["git"]
            assert json.loads((directory / f"{name}.json").read_text())["name"] == name


def test_every_stored_quick_profile_names_its_grid_and_its_machine():
    """results/quick_NAME.json: a grid's quick profile as measured once on a GPU (lpfail.sweep.quick)."""
    from lpfail import sweep

    grids = set(sweep.names())
    for path in sorted((results.REPO_ROOT / "results").glob("quick_*.json")):
        rec = json.loads(path.read_text())
        assert path.stem.removeprefix("quick_") in grids and rec["name"] == path.stem.removeprefix("quick_")
        assert rec["device"] and rec["created"] and rec["git"] and rec["wall_s"] > 0 and rec["runs"] >= 1
        assert rec["complete"] and "headline" in rec and np.isfinite(rec["value"])


def test_an_edited_number_is_refused(cache):
    """The JSON's content is hashed too, not only the .npz: a number edited by hand is caught and the result
    refused with the command that regenerates it; the same content written out differently still loads."""
    results.run("_toy")
    path = cache / "_toy.json"
    meta = json.loads(path.read_text())
    assert meta["content_sha256"] == results.content_hash(meta)
    path.write_text(json.dumps(meta, indent=4, sort_keys=True))  # reformatted: the same meaning
    assert results.load("_toy")["total"] == 10.0
    for key, value in (("scalars", {**meta["scalars"], "total": 11.0}), ("device", "NVIDIA H200"),
                       ("config", {**meta["config"], "n": 6})):
        path.write_text(json.dumps({**meta, key: value}, indent=1))
        with pytest.raises(results.ResultCorrupt, match="python -m lpfail run _toy"):
            results.load("_toy")
        assert results.status("_toy") == "corrupt"
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "content_sha256"}, indent=1))
    with pytest.raises(results.ResultCorrupt, match="python -m lpfail run _toy"):
        results.load("_toy")


def _tool(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, results.REPO_ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_migration_adds_the_content_hash_and_changes_nothing_else(cache):
    """tools/content_hash.py: a result, a quick record and a part (plain or compressed) written without a content
    hash get one, added last, every other byte kept; a file whose hash does not match is left as it is and named."""
    from lpfail.sweep.store import encode_part

    tool = _tool("content_hash")
    results.run("_toy")
    old = {k: v for k, v in json.loads((cache / "_toy.json").read_text()).items() if k != results.CONTENT_KEY}
    texts = {"_toy.json": json.dumps(old, indent=1) + "\n",
             "quick_lr_sweep.json": json.dumps({"name": "lr_sweep", "value": 0.5}, indent=1) + "\n",
             "lr_sweep_parts/part-1.json": json.dumps({"format": "f", "runs": {"a": {"v": float("nan")}}}) + "\n",
             "lr_sweep_parts/part-2.json.gz": json.dumps({"format": "f", "runs": {"b": {"v": 1.0}}}) + "\n"}
    (cache / "lr_sweep_parts").mkdir()
    for name, text in texts.items():
        (cache / name).write_bytes(encode_part(text.encode(), name))
    with pytest.raises(results.ResultCorrupt, match="missing key 'content_sha256'"):
        results.load("_toy")
    assert tool.main(["--check", str(cache)]) == 1
    done, refused = tool.migrate(cache)
    assert sorted(p.relative_to(cache).as_posix() for p in done) == sorted(texts) and refused == []
    for name, text in texts.items():
        new = tool.read(cache / name)
        record = json.loads(new)
        assert list(record)[-1] == results.CONTENT_KEY and results.content_ok(record)
        added = f'"{results.CONTENT_KEY}": "{record[results.CONTENT_KEY]}"'
        assert new.replace(f",\n {added}", "").replace(f", {added}", "") == text, name
    assert (cache / "lr_sweep_parts/part-2.json.gz").read_bytes()[:2] == b"\x1f\x8b"  # still compressed
    assert results.load("_toy")["total"] == 10.0
    assert tool.main(["--check", str(cache)]) == 0
    edited = (cache / "_toy.json").read_text().replace('"total": 10.0', '"total": 11.0')
    (cache / "_toy.json").write_text(edited)
    assert tool.migrate(cache) == ([], [cache / "_toy.json"]) and (cache / "_toy.json").read_text() == edited


def test_every_stored_part_and_quick_record_matches_its_content_hash():
    """The committed parts and quick records (the book reads some of them directly, not through a loader that
    checks): each holds its content hash, and it matches."""
    tool = _tool("content_hash")
    directory = results.REPO_ROOT / "results"
    for path, indent in tool.stored_files(directory):
        assert tool.state(path, indent) == "ok", path


def test_a_result_records_the_cpu_numerics_it_was_computed_under(cache):
    from lpfail import numerics

    res = results.run("_toy")
    assert res.meta["numerics"] == numerics.provenance()
    stored = json.loads((cache / "_toy.json").read_text())["numerics"]
    assert stored["ATEN_CPU_CAPABILITY"] == numerics.CAPABILITY and stored["threads"] == numerics.THREADS
    assert stored["model"] and stored["isa"]


def test_a_cpu_result_is_stored_only_under_the_pinned_numerics(cache, capsys):
    """Another thread count than the pinned one: a CPU experiment's result is refused (and not computed), naming
    why, also on the command line (an error line, exit status 2); a GPU experiment's result (its numbers come
    from the GPU) is stored, with the CPU state it met."""
    import torch

    from lpfail import numerics

    threads = torch.get_num_threads()
    torch.set_num_threads(numerics.THREADS + 1)
    try:
        with pytest.raises(numerics.NumericsError, match=r"result '_toy'.*torch uses 3 threads"):
            results.run("_toy")
        assert CALLS == [] and not list(cache.iterdir())
        assert cli.main(["run", "_toy"]) == 2
        assert capsys.readouterr().err.startswith("error: result '_toy': not stored")
        with pytest.raises(numerics.NumericsError, match="result '_toy'"):
            results.save("_toy", ToyConfig(), {"x": np.zeros(1)}, 1.0)
        results.save("_toy_gpu", ToyConfig(), {"x": np.zeros(1)}, 1.0)
        assert results.load("_toy_gpu").meta["numerics"]["threads"] == numerics.THREADS + 1
    finally:
        torch.set_num_threads(threads)


def test_run_from_the_command_line_pins_the_numerics_itself(tmp_path):
    """`python -m lpfail run NAME` with none of the pins in the environment: lpfail sets them before torch
    starts, so a CPU result is stored, and records the pinned state."""
    import subprocess
    import sys

    from lpfail import numerics

    env = {k: v for k, v in os.environ.items() if k not in numerics.PINS and k != numerics.NUDGE_VAR}
    env.update(LPFAIL_RESULTS_DIR=str(tmp_path), PYTHONPATH=str(results.REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "lpfail", "run", "fix_rows", "--set", "n_rows=2", "--set",
                           "m_stop=2", "--set", "m_extra="], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stored = json.loads((tmp_path / "fix_rows.json").read_text())["numerics"]
    assert not numerics.deviations(stored), stored


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_stored_files_get_the_mode_of_any_new_file(cache, umask, mode):
    """Files written atomically (a temporary file renamed into place) get the mode open() would give them, 0o666
    less the umask: readable by all under the usual umask 022, not the temporary file's 0o600."""
    import stat

    old = os.umask(umask)
    try:
        results.run("_toy")
        from lpfail.sweep import quick

        quick.save({"name": "x"}, cache / "quick_x.json")
    finally:
        os.umask(old)
    for name in ("_toy.json", "_toy.npz", "quick_x.json"):
        assert stat.S_IMODE((cache / name).stat().st_mode) == mode, name


def test_an_unwritable_results_folder_is_an_error_before_the_computation(cache, monkeypatch, capsys):
    """`run` checks that the results folder can be written (creating it where missing) before computing: once
    `LPFAIL_RESULTS_DIR=/proc/nope python -m lpfail run fix_rows` computed everything, then failed writing."""
    blocker = cache / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LPFAIL_RESULTS_DIR", str(blocker / "results"))
    assert cli.main(["run", "_toy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot store results in {blocker / 'results'} (") and "LPFAIL_RESULTS_DIR" in err
    assert CALLS == []                                    # nothing was computed
    with pytest.raises(results.ResultError, match="cannot store results in"):
        results.run("_toy", directory=blocker / "elsewhere")
    assert CALLS == []
    assert cli.main(["run", "_toy", "--no-store"]) == 0 and len(CALLS) == 1   # --no-store writes nothing
    fresh = cache / "new" / "deeper"
    monkeypatch.setenv("LPFAIL_RESULTS_DIR", str(fresh))
    assert cli.main(["run", "_toy"]) == 0 and (fresh / "_toy.json").is_file()


def test_the_help_says_where_run_stores_its_result():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "lpfail", "--help"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(results.REPO_ROOT), "COLUMNS": "400"})
    run_line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("run "))
    assert "$LPFAIL_RESULTS_DIR" in run_line and "source checkout" in run_line and \
        "~/.local/share/lpfail" in run_line, run_line
