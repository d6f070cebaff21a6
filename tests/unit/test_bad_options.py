"""Every experiment's bad options: one line, exit status 2, and no run directory, whatever the option.

One table of cases and one check (each experiment's own tests keep what is not a usage error).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app

pytestmark = pytest.mark.unit

CASES = [
    ("attribution", ["--dataset", "boolean"], "--dataset must be one of counting, events, sums"),
    ("attribution", ["--steps", "4"], "--steps must be an integer from 8"),
    ("attribution", ["--floor", "1"], "--floor must be 0"),
    ("attribution", ["--tokens", "some"], "--tokens must be one of item, all"),
    ("attribution", ["--readout", "mean"], "--readout must be one of count, truth, log-truth"),
    ("attribution", ["--rule", "simpson"], "--rule must be one of placed, adaptive, gauss"),
    ("attribution", ["--first", "-1"], "--first must be an integer >= 0"),
    ("attribution", ["--template", "no field"], "the template has no {words} field"),
    ("attribution", ["--data", "no-such-file.jsonl"], "no-such-file.jsonl: no such file"),
    ("linearity", ["--samples", "2"], "--samples must be an integer from 3"),
    ("linearity", ["--per-source", "-1"], "--per-source must be an integer >= 0"),
    ("linearity", ["--sources", "words"], "--sources: unknown source(s) words"),
    ("linearity", ["--top", "0"], "--top must be an integer from 1 to 100"),
    ("linearity", ["--method", "cubic"], "method must be 'linear' or 'slerp'"),
    ("linearity", ["--range", "0,1"], "--range do not apply to the linearity experiment"),
    ("sums", ["--range", "0,1"], "duration factors must be positive"),
    ("sums", ["--samples", "0"], "samples must be an integer >= 1"),
    ("sums", ["--template", "{first} + {second} ="], "the template has no {problem} field"),
    ("sums", ["--template", "{problem} {third}"], "unknown template field(s) {third}"),
    ("sums", ["--data", "nowhere.json"], "nowhere.json: no such file"),
    ("sums", ["--event", "1"], "--event do not apply to the sums experiment"),
    ("tokens", ["--threshold", "0"], "--threshold must lie in [0.001, 1)"),
    ("tokens", ["--threshold", "1"], "--threshold must lie in [0.001, 1)"),
    ("tokens", ["--range", "0,2"], "alpha range must lie within 0,1"),
    ("tokens", ["--factors", "2,1"], "--factors must be MIN,MAX with 0 <= MIN <= MAX"),
    ("tokens", ["--factors", "1,2,3"], "--factors must be MIN,MAX"),
    ("tokens", ["--method", "cubic"], "method must be 'linear' or 'slerp'"),
    ("tokens", ["--samples", "0"], "samples must be an integer >= 1"),
    ("tokens", ["--data", "missing.json"], "missing.json: no such file"),
    ("tokens", ["--items", "nope"], "nope"),
    ("equivalence", ["--range", "1.5,3"], "must hold 1"),
    ("equivalence", ["--range", "0,3"], "duration factors must be positive"),
    ("equivalence", ["--max-copies", "10"], "--max-copies must be between 1 and 9"),
    ("equivalence", ["--max-copies", "two"], "--max-copies must be an integer"),
    ("equivalence", ["--per-category", "0"], "--per-category must be between 1 and 10"),
    ("equivalence", ["--samples", "0"], "samples must be an integer >= 1"),
    ("equivalence", ["--template", "no field"], "the template has no {words} field"),
    ("equivalence", ["--times", "1"], "--times do not apply to the equivalence experiment"),
    ("interpolation", ["--range", "0,1.5"], "alpha range must lie within 0,1"),
    ("interpolation", ["--method", "cubic"], "method must be 'linear' or 'slerp'"),
    ("interpolation", ["--template", "no field"], "the template has no {question} field"),
    ("interpolation", ["--pairs", "apples-pears"], "--pairs: unknown pair(s) apples-pears"),
    ("interpolation", ["--data", "missing.json"], "missing.json: no such file"),
    ("interpolation", ["--data", "x.txt"], "must end in .json, .jsonl or .csv"),
    ("scaling", ["--range", "0,1"], "the scale s must be positive"),
    ("scaling", ["--threshold", "2"], "--threshold must lie in"),
    ("translation", ["--range", "1,10"], "must hold 0"),
    ("translation", ["--samples", "1"], "one sample needs a range with min == max"),
    ("translation", ["--data", "prompts.txt"], "must end in .json, .jsonl or .csv"),
]


@pytest.mark.parametrize(("name", "args", "needle"), CASES, ids=[f"{c[0]}:{' '.join(c[1])}" for c in CASES])
def test_bad_options_give_one_line_and_status_2(name: str, args: list[str], needle: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", name, *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output
    assert not out.exists()
