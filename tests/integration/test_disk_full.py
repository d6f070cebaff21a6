"""A disk that fills up mid-run: one line, exit status 2, and every file already written stays whole."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app
from contllm.rundir import files

pytestmark = pytest.mark.integration

ARGS = ["run", "counting", "--model", "smollm2-135m", "--items", "3", "--samples", "2", "--range", "0.5,1", "--no-item-figures"]


def test_a_full_disk_is_one_line_and_keeps_what_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    writes = {"left": 4}  # config, manifest, then two records fit; the third record does not
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if writes["left"] == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        writes["left"] -= 1
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    result = CliRunner().invoke(app, [*ARGS, "--out", str(out)])
    monkeypatch.undo()

    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "No space left on device" in lines[0] and "Traceback" not in result.output
    records = sorted(p.name for p in (out / "items").iterdir())
    assert records == ["count-001.json", "count-002.json"]  # whole records, no temporary file beside them
    for name in records:
        assert json.loads((out / "items" / name).read_text())["id"] == name.removesuffix(".json")
    assert not list(out.rglob(".*.tmp*")) and not (out / ".lock").exists()
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"

    # With room again, --resume finishes the run from the two records kept.
    resumed = CliRunner().invoke(app, [*ARGS, "--out", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "2 items already finished" in resumed.output
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"
