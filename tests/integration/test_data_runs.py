"""``--data`` on SmolLM2: counting and events run from files in the paper's shapes (sums: tests/integration/test_sums.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app
from contllm.data.user import file_sha256

pytestmark = pytest.mark.integration

COUNTING = [
    {"word": "apple", "category": "fruit", "category_with_article": "a fruit", "repetitions": 3},
    {"word": "\"quilt", "category": "blanket", "category_with_article": "a blanket", "repetitions": [2, 4]},
]
EVENTS = [
    {"sentence": "Here is a story:\n- Ana woke up.\n- She made tea.\n- She read the news.\n"
                 "Question: How many actions did Ana take?\nAnswer: Ana took", "num_sentences": 3},
    {"sentence": "Boil the water. Add the pasta. Stir it. Drain it. Serve it.\n"
                 "Question: How many steps are in this tutorial?\nAnswer: There are", "num_sentences": 5},
]
def run(tmp_path: Path, name: str, rows: list[dict]) -> tuple[Path, dict]:
    data = tmp_path / f"{name}.json"
    data.write_text(json.dumps(rows))
    out = tmp_path / "run"
    done = CliRunner().invoke(app, ["run", name, "--model", "smollm2-135m", "--data", str(data), "--samples", "3", "--no-item-figures",
                                    "--out", str(out)])
    assert done.exit_code == 0, done.output
    options = json.loads((out / "config.json").read_text())["options"]
    assert options["data"] == str(data) and options["data_sha256"] == file_sha256(data)
    return out, json.loads((out / "summary.json").read_text())


def test_counting_runs_on_the_papers_counting_shape(tmp_path: Path) -> None:
    out, summary = run(tmp_path, "counting", COUNTING)
    assert summary["items"] == 3 and 0.0 <= summary["accuracy_at_1"] <= 1.0
    records = [json.loads((out / "items" / f"{i}.json").read_text())["record"] for i in ("count-001", "count-002-2", "count-002-4")]
    assert [(r["meta"]["word"], r["truth"]) for r in records] == [("apple", "3"), ("\"quilt", "2"), ("\"quilt", "4")]


def test_events_runs_on_the_papers_events_shape(tmp_path: Path) -> None:
    out, summary = run(tmp_path, "events", EVENTS)
    assert summary["items"] == 2
    records = [json.loads((out / "items" / f"passage-00{k}.json").read_text())["record"] for k in (1, 2)]
    assert [(r["meta"]["n"], r["truth"]) for r in records] == [(3, "3"), (5, "5")]

