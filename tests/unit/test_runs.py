"""Run directories keep what they do not own: --force limits, the writer's lock, stale temporary files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contllm.errors import RunDirectoryError
from contllm.rundir.runs import LOCK, RunDir

pytestmark = pytest.mark.unit


def config(experiment: str = "counting") -> dict:
    return {"experiment": experiment, "model": "m", "items": None, "seed": 0, "options": {}}


def finished_run(path: Path, experiment: str = "counting") -> Path:
    with RunDir(path, config(experiment)) as run:
        run.save_record("a", {"x": 1})
    return path


def test_force_never_replaces_a_directory_that_holds_other_runs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    finished_run(root / "smollm2-135m" / "counting")
    finished_run(root / "smollm2-135m" / "events", "events")
    # A run directory written at the root itself (what label ".." used to give) ...
    (root / "config.json").write_text(json.dumps(config()))
    (root / "items").mkdir()
    with pytest.raises(RunDirectoryError, match="it holds other runs"):
        RunDir(root, config(), force=True)
    assert (root / "smollm2-135m" / "events" / "items" / "a.json").is_file()


def test_force_replaces_only_a_run_of_the_same_experiment(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "run", "events")
    with pytest.raises(RunDirectoryError, match="it is a run of 'events', not of 'counting'"):
        RunDir(run, config("counting"), force=True)
    with RunDir(run, config("events"), force=True) as again:
        assert not (run / "items" / "a.json").exists()  # replaced: the old record is gone
        again.save_record("b", {"x": 2})
    assert sorted(p.name for p in (run / "items").iterdir()) == ["b.json"]


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = RunDir(out, config()).open()
    assert (out / LOCK).is_file()
    with pytest.raises(RunDirectoryError, match="being written by another contllm process"):
        RunDir(out, config(), resume=True)
    # Another process is refused too, and says whose lock it is.
    probe = (
        "import sys; from contllm.rundir.runs import RunDir; from contllm.errors import RunDirectoryError\n"
        "try:\n    RunDir(sys.argv[1], {'experiment': 'counting', 'model': 'm', 'items': None, 'seed': 0, 'options': {}}, resume=True)\n"
        "except RunDirectoryError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True, text=True, timeout=120)
    assert "being written by another contllm process" in done.stdout, done.stderr
    first.close()
    assert not (out / LOCK).exists()
    with RunDir(out, config(), resume=True) as resumed:
        assert resumed.resumed


def test_resume_removes_the_temporary_files_a_kill_left(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "run")
    stale = [out / ".summary.json.abc123.tmp", out / "items" / ".b.json.x9.tmp", out / "figures" / ".summary.png.q1.tmp.png"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    with RunDir(out, config(), resume=True):
        pass
    assert not any(p.exists() for p in stale)
    assert (out / "items" / "a.json").is_file()


def test_a_resume_with_other_settings_is_refused(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "run")
    with pytest.raises(RunDirectoryError, match="its config differs in max_batch_tokens"):
        RunDir(out, {**config(), "max_batch_tokens": 4096}, resume=True)


def test_the_manifest_names_the_host_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from contllm.rundir.runs import base_manifest
    from tests.unit.tiny import tiny_lm

    lm = tiny_lm("llama")
    monkeypatch.delenv("CONTLLM_RECORD_HOST", raising=False)
    manifest = base_manifest(lm, "m")
    assert "host" not in manifest and manifest["cpu"]["capability"] and manifest["command"]
    assert manifest["family"] == "llama" and manifest["parameters"] == sum(p.numel() for p in lm.model.parameters())
    monkeypatch.setenv("CONTLLM_RECORD_HOST", "1")
    assert base_manifest(lm, "m")["host"]


def test_launch_messages_are_json_never_pickles() -> None:
    from contllm.rundir.distributed import _from_bytes, _to_bytes

    message = {"pending": ["count-001", "count-002"], "rank": 1}
    assert _to_bytes(message) == json.dumps(message).encode() and _from_bytes(_to_bytes(message)) == message
    with pytest.raises(TypeError):  # an object that only a pickle could carry is not sent
        _to_bytes(Path("/tmp"))


# ---------------------------------------------------------------------------- nothing outside the run, nothing lost


def test_a_lock_that_is_a_symbolic_link_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).symlink_to(victim)
    with pytest.raises(RunDirectoryError, match=r"\.lock is a symbolic link"):
        RunDir(out, config()).open()
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("entry", ["figures", "items", "shards"])
def test_a_resume_never_writes_through_a_linked_folder_of_the_run(tmp_path: Path, entry: str) -> None:
    out = finished_run(tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    if (out / entry).exists():
        for path in (out / entry).iterdir():
            path.rename(outside / path.name)
        (out / entry).rmdir()
    (out / entry).symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(RunDirectoryError, match=f"{entry} is a symbolic link"):
        RunDir(out, config(), resume=True)
    assert sorted(p.name for p in outside.iterdir()) == before


def test_ids_that_share_a_safe_name_keep_their_own_records(tmp_path: Path) -> None:
    ids = ["a/b", "a_b", "a b", ".y.tmp", "x" * 300, "count-001"]
    with RunDir(tmp_path / "run", config()) as run:
        for k, item_id in enumerate(ids):
            run.save_record(item_id, {"k": k})
    assert len({RunDir.item_path(run, i).name for i in ids}) == len(ids)
    assert all(not RunDir.item_path(run, i).name.startswith(".") for i in ids)
    assert RunDir.item_path(run, "count-001").name == "count-001.json"  # plain ids keep their own name
    with RunDir(tmp_path / "run", config(), resume=True) as again:  # the resume's clean-up keeps every record
        done = again.finished(lambda record: record["k"])
    assert done == {item_id: k for k, item_id in enumerate(ids)}


def test_a_record_under_another_items_name_is_not_trusted(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with RunDir(out, config()) as run:
        run.save_record("a", {"x": 1})
        run.save_record("b", {"x": 2})
    # a's file now says it holds b: trusted, b would get a's record and a none.
    (out / "items" / "a.json").write_text(json.dumps({"id": "b", "record": {"x": 1}}))
    with RunDir(out, config(), resume=True) as again:
        assert again.finished(lambda record: record) == {"b": {"x": 2}}  # a is redone, b keeps its own record


def test_force_removes_only_what_the_toolkit_wrote(tmp_path: Path) -> None:
    from contllm.rundir.files import atomic_write_json

    out = tmp_path / "run"
    with RunDir(out, config()) as run:
        run.save_record("a", {"x": 1})
        run.write_outputs(lambda: [atomic_write_json(out / "results.json", {}),
                                   atomic_write_json(out / "figures" / "items" / "a.json", {})])
    listed = json.loads((out / "manifest.json").read_text())["outputs"]
    assert listed == ["figures/items/a.json", "results.json"]
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    (out / "analysis" / "table.csv").write_text("1,2")
    (out / "figures" / "sketch.png").write_text("drawn by hand")
    (out / "items" / "README").write_text("what these are")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    manifest = json.loads((out / "manifest.json").read_text())
    listed = [*listed, "../victim.txt", str(victim)]  # a manifest edited to point outside the run
    (out / "manifest.json").write_text(json.dumps({**manifest, "outputs": listed}))
    with RunDir(out, config(), force=True) as again:
        assert not (out / "results.json").exists() and not (out / "items" / "a.json").exists()
        assert not (out / "figures" / "items").exists()
        again.save_record("b", {"x": 2})
    assert (out / "notes.txt").read_text() == "mine" and (out / "analysis" / "table.csv").read_text() == "1,2"
    assert (out / "figures" / "sketch.png").is_file() and (out / "items" / "README").is_file()
    assert victim.read_text() == "keep"


def test_a_resume_names_the_option_that_differs_and_takes_the_same_data_under_another_path(tmp_path: Path) -> None:
    recorded = {**config(), "options": {"samples": 10, "data": "/a/items.json", "data_sha256": "f" * 64}}
    with RunDir(tmp_path / "run", recorded):
        pass
    moved = {**recorded, "options": {**recorded["options"], "data": "../elsewhere/items.json"}}
    with RunDir(tmp_path / "run", moved, resume=True) as again:
        assert again.resumed
    other = {**recorded, "options": {**recorded["options"], "samples": 20}}
    with pytest.raises(RunDirectoryError, match=r"options\.samples \(was 10, now 20\)"):
        RunDir(tmp_path / "run", other, resume=True)


def test_run_files_get_the_mode_of_any_new_file(tmp_path: Path) -> None:
    import os

    from contllm.rundir.files import atomic_write_text, file_mode

    mask = os.umask(0o022)
    os.umask(mask)
    written = atomic_write_text(tmp_path / "x.txt", "x")
    assert file_mode() == 0o666 & ~mask and (written.stat().st_mode & 0o777) == 0o666 & ~mask


@pytest.mark.parametrize("out,needle", [("", "must be a path"), ("dangling", "symbolic link to nothing"),
                                        ("x" * 300, "longer than 255 bytes"), ("/proc/contllm-run", "cannot create")])
def test_an_out_that_cannot_hold_a_run_is_refused_before_anything_is_written(tmp_path: Path, out: str, needle: str) -> None:
    if out == "dangling":
        (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    target = out if out in ("", "/proc/contllm-run") else str(tmp_path / out)
    with pytest.raises(RunDirectoryError, match=needle):
        RunDir(target, config())
    assert not (tmp_path / "nowhere").exists()


def test_a_deeply_nested_config_is_one_error_on_resume(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "run")
    (out / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(RunDirectoryError, match="nested too deeply"):
        RunDir(out, config(), resume=True)
