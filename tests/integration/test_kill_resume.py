"""Every experiment, killed with SIGKILL midway and resumed, ends bitwise equal to an uninterrupted run.

The one runner owns resume for all of them, so this is one test over the registry's
experiments, each on a small selection of SmolLM2 (the fast model).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONTLLM = [sys.executable, "-m", "contllm"]
#: Small runs whose records each take a moment, so that a kill lands between two of them.
RUNS = {
    "counting": ["--items", "6", "--samples", "4"],
    "events": ["--items", "4", "--samples", "3"],
    "boolean": ["--items", "8", "--samples", "3", "--operators", "AND,OR,XOR"],
    "depth": ["--items", "3", "--layer", "0,-1", "--eps", "0.01", "--alphas", "0,1"],
    "pde": ["--times", "0,1", "--variants", "attention,matched", "--prompts", "2"],
    "linearity": ["--sources", "boolean,prompt", "--per-source", "2", "--samples", "3"],
    "sums": ["--items", "4", "--samples", "3"],
    "translation": ["--items", "5", "--samples", "5"],
    "attribution": ["--first", "6", "--steps", "16", "--floor", "0.5"],
}
#: Fields that say when or how a run went, not what it computed.
CLOCK_FIELDS = {"started", "finished", "resumed", "processes", "command", "seconds"}


def environment() -> dict[str, str]:
    # Sweep experiments batch items in groups and save a group's records together: small
    # groups (two or three items here) leave records missing when the kill lands.
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CONTLLM_GROUP_BYTES": "2000000"}


def without_clock(value: object) -> object:
    """JSON data with the wall-clock fields (a record's "seconds") taken out, at any depth."""
    if isinstance(value, dict):
        return {k: without_clock(v) for k, v in value.items() if k not in CLOCK_FIELDS}
    if isinstance(value, list):
        return [without_clock(v) for v in value]
    return value


def contents(run: Path) -> dict[str, object]:
    """Every file of a run directory but the manifest (compared apart) and figures (matplotlib stamps dates).

    JSON files are compared as data without their wall-clock fields; every other file byte for byte.
    """
    out: dict[str, object] = {}
    for p in sorted(run.rglob("*")):
        if not p.is_file() or p.name == "manifest.json" or "figures" in p.parts:
            continue
        out[str(p.relative_to(run))] = without_clock(json.loads(p.read_text())) if p.suffix == ".json" else p.read_bytes()
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_a_killed_run_resumes_to_the_uninterrupted_result(name: str, tmp_path: Path) -> None:
    args = ["run", name, "--model", "smollm2-135m", *RUNS[name], "--no-item-figures"]
    whole = tmp_path / "whole"
    # The uninterrupted run goes on beside the killed one: each process has one torch thread,
    # so on two cores they take about the time of one, and their numbers are those of one thread.
    log = tmp_path / "whole.log"
    with log.open("w") as sink:
        uninterrupted = subprocess.Popen([*CONTLLM, *args, "--out", str(whole)], stdout=sink, stderr=sink,
                                         env=environment())
        try:
            out = tmp_path / "killed"
            kept = killed_and_resumed(args, out)
        finally:
            uninterrupted.wait(timeout=900)
    assert uninterrupted.returncode == 0, log.read_text()[-2000:]
    total = len(list((whole / "items").glob("*.json")))
    assert total >= 3 and kept < total, f"{kept} of {total} records before the kill"
    assert contents(out) == contents(whole)
    ours, theirs = (json.loads((run / "manifest.json").read_text()) for run in (out, whole))
    assert ours["status"] == theirs["status"] == "finished"
    assert {k: v for k, v in ours.items() if k not in CLOCK_FIELDS} == {k: v for k, v in theirs.items() if k not in CLOCK_FIELDS}


def killed_and_resumed(args: list[str], out: Path) -> int:
    """Run ``args`` into ``out``, SIGKILL it once its first record is written, resume it (finished records are
    kept as they were); returns how many records the kill left."""
    proc = subprocess.Popen([*CONTLLM, *args, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=environment())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if any((out / "items").glob("*.json")):
            break
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {proc.stderr.read().decode()[-1000:]}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "items").glob("*.json")}
    assert len(kept) >= 1
    assert not (out / "summary.json").exists()

    resumed = subprocess.run([*CONTLLM, *args, "--out", str(out), "--resume"], capture_output=True, text=True,
                             env=environment(), timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{len(kept)} " in resumed.stderr and "already finished" in resumed.stderr
    for record, (mtime, data) in kept.items():  # finished work is read back, not recomputed
        path = out / "items" / record
        assert (path.stat().st_mtime_ns, path.read_bytes()) == (mtime, data), record
    assert not list(out.rglob(".*.tmp*")) and not (out / ".lock").exists()
    return len(kept)
