"""interpolation and linearity on SmolLM2: exact endpoints for words of unequal token counts, runs, resume, reports."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM
from contllm.cli.commands import app
from contllm.core.engine import Engine
from contllm.experiments.word_interpolation import InterpolationConfig, ends, plan_item, word_items
from contllm.rundir.report import REPORT_FILES

pytestmark = pytest.mark.integration


def test_the_endpoints_are_the_plain_prompts_for_a_word_pair_of_unequal_token_counts(smollm: ContinuousLM) -> None:
    config = InterpolationConfig(samples=3)
    item = next(i for i in word_items(config) if i.id == "candles-flashlights-use-batteries")
    plan = plan_item(smollm, item, config)
    assert (plan.meta["tokens_first"], plan.meta["tokens_second"]) == (1, 2)  # " candles" against " flash" "lights"
    probs = Engine(smollm).probs(plan.signals)
    sa, _, sb, _ = ends(smollm, item, config, embed=False)
    plain = smollm.probs([sa, sb])
    assert (probs[0] - plain[0]).abs().max() <= 1e-5
    assert (probs[-1] - plain[1]).abs().max() <= 1e-5
    assert (probs[1] - plain[0]).abs().max() > 1e-3  # the middle is neither prompt


def run_cli(*args: str) -> None:
    done = CliRunner().invoke(app, ["run", *args, "--model", "smollm2-135m", "--no-item-figures"])
    assert done.exit_code == 0, done.output


def test_small_runs_resume_and_two_runs_of_each_compare(smollm: ContinuousLM, tmp_path: Path) -> None:
    interp = ["interpolation", "--pairs", "candles-flashlights", "--items", "2", "--samples", "3"]
    first = tmp_path / "interp-linear"
    run_cli(*interp, "--out", str(first))
    summary = json.loads((first / "summary.json").read_text())
    assert summary["items"] == 2 and summary["model"] == "smollm2-135m" and 0 <= summary["accuracy_at_alpha_0"] <= 1
    stamps = {p.name: p.stat().st_mtime_ns for p in (first / "items").glob("*.json")}
    run_cli(*interp, "--out", str(first), "--resume")
    assert {p.name: p.stat().st_mtime_ns for p in (first / "items").glob("*.json")} == stamps
    assert json.loads((first / "summary.json").read_text()) == summary
    second = tmp_path / "interp-slerp"
    run_cli(*interp, "--method", "slerp", "--out", str(second))

    lin = ["linearity", "--per-source", "1", "--samples", "3"]
    lin_a, lin_b = tmp_path / "lin-seed0", tmp_path / "lin-seed1"
    run_cli(*lin, "--out", str(lin_a))
    run_cli(*lin, "--seed", "1", "--out", str(lin_b))
    numbers = json.loads((lin_a / "summary.json").read_text())
    assert numbers["items"] == 3 and {"interpolation_items", "boolean_items", "prompt_items"} <= set(numbers)

    # linearity's records are paths with a chord, not a read-out per value to scrub: no explorer page
    for runs, files in (((first, second), set(REPORT_FILES)), ((lin_a, lin_b), set(REPORT_FILES) - {"explorer.html"})):
        report = tmp_path / f"report-{runs[0].name}"
        compared = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(report)])
        assert compared.exit_code == 0, compared.output
        assert sorted(p.name for p in report.iterdir()) == sorted(files)
        rows = list(csv.DictReader((report / "summary.csv").open()))
        assert len(rows) == 2
        assert (report / "comparison.pdf").read_bytes()[:5] == b"%PDF-"
    # the real paths agree across seeds; only the random directions differ
    a = json.loads((lin_a / "results.json").read_text())["paths"]
    b = json.loads((lin_b / "results.json").read_text())["paths"]
    assert [p["real"] for p in a] == [p["real"] for p in b] and [p["baseline"] for p in a] != [p["baseline"] for p in b]
