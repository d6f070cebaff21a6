"""``contllm report`` on two real runs of one experiment: SmolLM2 and Gemma 3 compared."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from contllm import ContinuousLM
from contllm.cli.commands import app
from contllm.rundir.report import REPORT_FILES
from contllm.rundir.runner import run

pytestmark = pytest.mark.integration


def tiny_counting_run(lm: ContinuousLM, model: str, out: Path) -> Path:
    return run("counting", options={"samples": 4}, model=model, lm=lm, items="3", out=out, device="cpu", item_figures=False)


def test_report_compares_two_models(smollm: ContinuousLM, gemma: ContinuousLM, tmp_path: Path) -> None:
    runs = [
        tiny_counting_run(smollm, "smollm2-135m", tmp_path / "smollm"),
        tiny_counting_run(gemma, "gemma3-270m", tmp_path / "gemma"),
    ]
    for path in runs:
        assert json.loads((path / "manifest.json").read_text())["status"] == "finished"

    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)

    md = (out / "summary.md").read_text()
    assert "smollm2-135m" in md and "gemma3-270m" in md
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["model"], r["experiment"], r["items"], r["samples"]) for r in rows] == [
        ("smollm2-135m", "counting", "3", "4"),
        ("gemma3-270m", "counting", "3", "4"),
    ]
    for row in rows:
        assert 0.0 <= float(row["accuracy_at_1"]) <= 1.0
        assert 0.0 <= float(row["auc_observed_time_sensitivity"]) <= 1.0
        # Reading the whole sweep finds at least what reading only c = 1 finds.
        assert float(row["auc_observed_time_sensitivity"]) >= float(row["auc_counterfactual_time_sensitivity"])

    with Image.open(out / "comparison.png") as image:
        image.verify()
    with Image.open(out / "comparison.png") as image:
        width, height = image.size
    assert 1000 <= width <= 4000 and 300 <= height <= 2000 and width > height
    assert (out / "comparison.pdf").read_bytes()[:5] == b"%PDF-"

    again = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
