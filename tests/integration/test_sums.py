"""The sums experiment on SmolLM2: its greedy answer is what generation writes; a run resumes, a run reads the paper's shape, and the two compare."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM
from contllm.cli.commands import app
from contllm.core.engine import Engine
from contllm.experiments.sums import SumsConfig, load_sums, render_item, run_item
from contllm.rundir.report import REPORT_FILES

pytestmark = pytest.mark.integration

#: 2 problems x factors 0.5, 1, 1.5.
ARGS = ["run", "sums", "--model", "smollm2-135m", "--range", "0.5,1.5", "--samples", "3", "--no-item-figures"]


def test_at_factor_1_the_answer_is_what_greedy_generation_writes(smollm: ContinuousLM) -> None:
    config = SumsConfig(low=1.0, high=1.0, samples=1)
    digits = set("0123456789")
    for item in load_sums()[:2]:
        record = run_item(smollm, item, config, Engine(smollm).probs)
        rendered = render_item(smollm, item, config)
        written = smollm.generate(smollm.signal(rendered.text), max_new_tokens=len(str(item.truth)) + 2)
        pieces = [smollm.tokenizer.decode([t]) for t in written.token_ids]
        if pieces[0] not in digits:  # the engine reads the first digit among the digits only
            continue
        number = ""
        for piece in pieces[: len(str(item.truth)) + 1]:
            if piece not in digits:
                break
            number += piece
        assert record.answers == [number], (item.id, pieces)


def test_a_small_run_resumes_and_two_runs_compare(smollm: ContinuousLM, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    done = CliRunner().invoke(app, [*ARGS, "--items", "2", "--out", str(first)])
    assert done.exit_code == 0, done.output
    summary = json.loads((first / "summary.json").read_text())
    assert summary["items"] == 2 and summary["model"] == "smollm2-135m"
    assert 0.0 <= summary["accuracy_at_1"] <= summary["first_digit_accuracy_at_1"] <= 1.0
    rows = list(csv.DictReader((first / "results.csv").open()))
    assert [(r["item"], float(r["factor"])) for r in rows] == [(i, c) for i in ("sum-001", "sum-002") for c in (0.5, 1, 1.5)]

    stamps = {p.name: p.stat().st_mtime_ns for p in (first / "items").glob("*.json")}
    resumed = CliRunner().invoke(app, [*ARGS, "--items", "2", "--out", str(first), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert {p.name: p.stat().st_mtime_ns for p in (first / "items").glob("*.json")} == stamps
    assert json.loads((first / "summary.json").read_text()) == summary

    data = tmp_path / "sums.json"  # one problem in the paper's shape, its second number scaled
    data.write_text(json.dumps([{"template": "A jar holds {item_1} red and {item_2} blue marbles. How many marbles are in it?",
                                 "fields": {"name": "", "item_1": 31, "item_2": 17}, "shrink_1": False}]))
    other = CliRunner().invoke(app, [*ARGS, "--data", str(data), "--out", str(second)])
    assert other.exit_code == 0, other.output
    record = json.loads((second / "items" / "sum-001.json").read_text())["record"]
    assert (record["truth"], record["scaled"], record["other"]) == (48, 17, 31)
    assert record["meta"]["problem"] == "A jar holds 31 red and 17 blue marbles. How many marbles are in it?"
    report = tmp_path / "report"
    compared = CliRunner().invoke(app, ["report", str(first), str(second), "--out", str(report)])
    assert compared.exit_code == 0, compared.output
    assert sorted(p.name for p in report.iterdir()) == sorted(REPORT_FILES)
    table = list(csv.DictReader((report / "summary.csv").open()))
    # the runs hold different items (sum-001, sum-002 against sum-001): compared on the one they share
    assert "the runs hold different items" in compared.output
    assert [(r["experiment"], r["items"], r["samples"]) for r in table] == [("sums", "1", "3"), ("sums", "1", "3")]
