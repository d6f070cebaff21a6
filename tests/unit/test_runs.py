"""Run directories keep what they do not own: --force limits, the writer's lock, stale temporary files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contllm.errors import RunDirectoryError
from contllm.runs import LOCK, RunDir

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
        "import sys; from contllm.runs import RunDir; from contllm.errors import RunDirectoryError\n"
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
    from types import SimpleNamespace

    import torch

    from contllm.runs import base_manifest

    lm = SimpleNamespace(
        info=SimpleNamespace(sha256="0" * 64, source=""), model=SimpleNamespace(config=SimpleNamespace(model_type="llama")),
        family=SimpleNamespace(name="llama"), device=torch.device("cpu"), dtype=torch.float32, attn_implementation="sdpa",
    )
    monkeypatch.delenv("CONTLLM_RECORD_HOST", raising=False)
    manifest = base_manifest(lm, "m")
    assert "host" not in manifest and manifest["cpu"]["capability"] and manifest["command"]
    monkeypatch.setenv("CONTLLM_RECORD_HOST", "1")
    assert base_manifest(lm, "m")["host"]


def test_launch_messages_are_json_never_pickles() -> None:
    from contllm.distributed import _from_bytes, _to_bytes

    message = {"pending": ["count-001", "count-002"], "rank": 1}
    assert _to_bytes(message) == json.dumps(message).encode() and _from_bytes(_to_bytes(message)) == message
    with pytest.raises(TypeError):  # an object that only a pickle could carry is not sent
        _to_bytes(Path("/tmp"))
