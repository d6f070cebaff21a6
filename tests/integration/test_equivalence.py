"""The equivalence experiment from the command line on SmolLM2: a small grid, resume, and a report of two runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM
from contllm.cli.commands import app
from contllm.rundir.report import REPORT_FILES

pytestmark = pytest.mark.integration

#: 2 words x copies 1..4 x d in {0.5, 1, 1.5, 2}: 32 prompts per run.
ARGS = ["run", "equivalence", "--model", "smollm2-135m", "--items", "2", "--range", "0.5,2", "--samples", "4", "--max-copies", "4",
        "--no-item-figures"]


def test_a_small_run_resumes_and_two_runs_compare(smollm: ContinuousLM, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    done = CliRunner().invoke(app, [*ARGS, "--out", str(first)])
    assert done.exit_code == 0, done.output
    assert json.loads((first / "manifest.json").read_text())["status"] == "finished"
    summary = json.loads((first / "summary.json").read_text())
    assert summary["items"] == 2 and summary["model"] == "smollm2-135m"
    # SmolLM2 reads m copies of duration d closer to m·d plain copies than to m plain copies.
    assert summary["mean_kl_product"] < summary["mean_kl_same_copies"]
    assert summary["mean_spearman_product"] > summary["mean_spearman_copies"]

    stamps = {p.name: p.stat().st_mtime_ns for p in (first / "items").glob("*.json")}
    resumed = CliRunner().invoke(app, [*ARGS, "--out", str(first), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert {p.name: p.stat().st_mtime_ns for p in (first / "items").glob("*.json")} == stamps
    assert json.loads((first / "summary.json").read_text()) == summary

    other = CliRunner().invoke(app, [*ARGS[:-2], "3", "--no-item-figures", "--out", str(second)])
    assert other.exit_code == 0, other.output
    report = tmp_path / "report"
    compared = CliRunner().invoke(app, ["report", str(first), str(second), "--out", str(report)])
    assert compared.exit_code == 0, compared.output
    # equivalence records hold no read-out along one knob, so its report has no explorer page
    assert sorted(p.name for p in report.iterdir()) == sorted(set(REPORT_FILES) - {"explorer.html"})
    rows = list(csv.DictReader((report / "summary.csv").open()))
    assert [(r["experiment"], r["items"], r["max_copies"]) for r in rows] == [("equivalence", "2", "4"),
                                                                              ("equivalence", "2", "3")]
    assert (report / "comparison.pdf").read_bytes()[:5] == b"%PDF-"
