"""Counting, events and boolean on SmolLM2 give results.csv byte-equal to the reference made by the code at 7e6bdfb.

The reference (tests/fixtures/unchanged/) was written on the machine CI runs on (host.json); where torch runs other
kernels (another CPU sums in another order) every number must agree to 1e-4 relative and every other cell exactly.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "unchanged"
RUNS = {"counting": ["--items", "4"], "events": ["--items", "3"], "boolean": ["--items", "4"]}


@pytest.mark.parametrize("experiment", list(RUNS))
def test_results_csv_is_byte_equal_to_the_reference(experiment: str, tmp_path: Path) -> None:
    out = tmp_path / experiment
    command = [sys.executable, "-m", "contllm", "-q", "run", experiment, *RUNS[experiment], "--model", "smollm2-135m",
               "--device", "cpu", "--no-item-figures", "--out", str(out)]
    # the reference's settings: torch's own thread count and the default group budget (both change float sums)
    env = {k: v for k, v in os.environ.items() if k not in ("CONTLLM_GROUP_BYTES", "OMP_NUM_THREADS")}
    done = subprocess.run(command, capture_output=True, text=True, env={**env, "HF_HUB_OFFLINE": "1"}, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    made, reference = (out / "results.csv").read_bytes(), (REFERENCE / f"{experiment}.csv").read_bytes()
    host = json.loads((REFERENCE / "host.json").read_text())
    if torch.backends.cpu.get_cpu_capability() == host["capability"]:
        lines = [(a, b) for a, b in zip(made.decode().splitlines(), reference.decode().splitlines()) if a != b]
        assert made == reference, f"{experiment}: {len(lines)} lines differ from the reference; first: {lines[:1]}"
        return
    rows, expected = (list(csv.reader(io.StringIO(text.decode()))) for text in (made, reference))
    assert len(rows) == len(expected) and rows[0] == expected[0]
    for row, want in zip(rows, expected):
        for cell, ref in zip(row, want, strict=True):
            if _number(cell) is not None and _number(ref) is not None:
                assert math.isclose(_number(cell), _number(ref), rel_tol=1e-4, abs_tol=1e-7), (row[0], cell, ref)
            else:
                assert cell == ref, (row[0], cell, ref)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
