"""End-to-end runs of the command line: one on the default model as typed, the others on SmolLM2 (the fast model)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contllm.models import DEFAULT_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONTLLM = [sys.executable, "-m", "contllm.cli.commands"]
#: The runs that need a model but not the counting effect name the fast one.
FAST = ("--model", "smollm2-135m")


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*CONTLLM, *args], capture_output=True, text=True, timeout=timeout, env=env)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_counting_run_writes_a_complete_run_directory(tmp_path: Path) -> None:
    """As typed, without --model: the default model (Qwen2.5-Coder-0.5B; three items, four factors)."""
    out = tmp_path / "run"
    done = run_cli("run", "counting", "--items", "3", "--samples", "4", "--formats", "png,pdf", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    for name in ("config.json", "manifest.json", "results.json", "results.csv", "summary.json"):
        assert (out / name).is_file(), name
    for name in ("summary.png", "summary.pdf", "items/count-001.png", "items/count-003.pdf"):
        assert (out / "figures" / name).stat().st_size > 1000, name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["model"] == DEFAULT_MODEL == "qwen2.5-coder-0.5b"
    assert len(manifest["weights_sha256"]) == 64 and manifest["dtype"] == "float32"
    assert manifest["versions"]["torch"] and manifest["started"] <= manifest["finished"]
    # The loaded model's parameters, as the registry counts them (the audit's atlas places a model by this).
    from contllm.models import REGISTRY

    assert manifest["family"] == "qwen2" and manifest["parameters"] == REGISTRY[DEFAULT_MODEL].n_parameters
    rows = read_rows(out / "results.csv")
    assert len(rows) == 3 * 4 * 10
    assert {r["item"] for r in rows} == {"count-001", "count-002", "count-003"}
    # Running again into the same directory is refused, and nothing is touched.
    before = (out / "results.csv").read_bytes()
    again = run_cli("run", "counting", "--items", "3", "--samples", "4", "--out", str(out))
    assert again.returncode == 2 and again.stderr.strip().startswith("error: ")
    assert (out / "results.csv").read_bytes() == before


def test_a_large_default_run_draws_its_summary_and_figures_draws_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_cli("run", "counting", *FAST, "--items", "30", "--samples", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "item figures not drawn (30 items" in done.stderr and f"contllm figures {out}" in done.stderr
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["summary.png"]
    assert (out / "explorer.html").is_file() and (out / "results.csv").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seconds"]["load"] > 0 and manifest["seconds"]["evaluation"] > 0
    drawn = run_cli("figures", str(out), "--items", "2", "--formats", "png,pdf")
    assert drawn.returncode == 0, drawn.stderr
    names = ["summary.png", "summary.pdf", "items/count-001.png", "items/count-001.pdf", "items/count-002.png",
             "items/count-002.pdf"]
    assert drawn.stdout.split() == [str(out / "figures" / name) for name in names]
    assert not (out / "figures" / "items" / "count-003.png").exists()
    listed = json.loads((out / "manifest.json").read_text())["outputs"]
    assert all(f"figures/{name}" in listed for name in names)


def test_bfloat16_run_records_its_float32_state(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_cli(
        "run", "counting", *FAST, "--dtype", "bfloat16", "--items", "1", "--samples", "3", "--no-item-figures", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "bfloat16" and manifest["state_dtype"] == "float32"
    rows = read_rows(out / "results.csv")
    assert len(rows) == 3 * 10 and all(0.0 <= float(r["probability"]) <= 1.0 for r in rows)


# A killed and resumed run of every experiment: tests/integration/test_kill_resume.py.
