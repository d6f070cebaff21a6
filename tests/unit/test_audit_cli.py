"""``contllm audit``: usage errors answer at once in one line, and ``--compare`` sets cards side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm.audits.card import Card, Finding, Number
from contllm.cli.commands import app
from tests.unit.test_cli_startup import probe

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "args,says",
    [
        (["audit", "smollm2-135m", "--budget", "2x"], "--budget takes a time"),
        (["audit", "smollm2-135m", "--budget", "10s"], "at least 30s"),
        (["audit"], "give one model"),
        (["audit", "a", "b"], "give one model"),
        (["audit", "smollm2-135m", "--protocol", "default"], "--protocol must be contllm or paper"),
        (["audit", "--compare", "one.json", "--out", "o"], "two or more cards"),
        (["audit", "--compare", "a.json", "b.json"], "--compare needs --out"),
        (["audit", "--compare", "a.json", "b.json", "--out", "o", "--budget", "3m"], "--budget do not apply"),
        (["audit", "--compare", "/nonexistent/a.json", "/nonexistent/b.json", "--out", "o"], "holds no card"),
    ],
)
def test_usage_errors_are_one_line_before_torch(args: list[str], says: str) -> None:
    result, output = probe(*args)
    assert result["code"] == 2, output
    assert says in output and output.count("error:") == 1, output
    assert result["heavy"] == [], f"contllm {' '.join(args)} imported {result['heavy']}"


def test_an_audit_directory_in_use_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    plan = {"budget": None, "spent": 0.0, "reserved": 0.0, "available": 0.0, "shares": []}
    (tmp_path / "audit.json").write_text(json.dumps({"model": "m", "protocol": "contllm", "plan": plan}))
    result, output = probe("audit", "m", "--out", str(tmp_path))
    assert result["code"] == 2 and "--resume" in output and result["heavy"] == [], output
    result, output = probe("audit", "m", "--out", str(tmp_path), "--resume", "--protocol", "paper")
    assert result["code"] == 2 and "protocol (was 'contllm'" in output and result["heavy"] == [], output
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("not an audit")
    result, output = probe("audit", "m", "--out", str(tmp_path / "other"), "--force")
    assert result["code"] == 2 and "not an audit directory" in output and result["heavy"] == [], output


def card(model: str, value: float) -> Card:
    number = Number("pure_peak_rate", "headline", value, value - 0.1, value + 0.1, "higher", "counts that peak", {})
    finding = Finding("counting", "counting", 12, f"{model} counts.", [number])
    plan = {"budget": 180.0, "spent": 20.0, "reserved": 8.0, "available": 136.0, "shares": []}
    return Card(model, "contllm", plan, [finding], {"resamples": 10, "level": 0.95})


def test_compare_writes_one_page_with_every_card_and_the_best_marked(tmp_path: Path) -> None:
    paths = []
    for model, value in (("small", 0.37), ("large", 0.84)):
        (tmp_path / model).mkdir()
        (tmp_path / model / "card.json").write_text(json.dumps(card(model, value).to_dict()))
        paths.append(str(tmp_path / model))
    (tmp_path / "small" / "card.html").write_text("<p>the small card</p>")
    result = CliRunner().invoke(app, ["audit", "--compare", *paths, "--out", str(tmp_path / "both")])
    assert result.exit_code == 0, result.output
    page = Path(result.output.strip()).read_text()
    assert page.index(">small<") < page.index(">large<")
    assert '<td class="num best"><span class="value">0.840</span>' in page
    assert '<td class="num"><span class="value">0.370</span>' in page
    assert 'href="../small/card.html"' in page and "large/card.html" not in page  # a link only where the page is
    again = CliRunner().invoke(app, ["audit", "--compare", *paths, "--out", str(tmp_path / "both")])
    assert again.exit_code == 2 and "--force" in again.output
