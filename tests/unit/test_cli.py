"""The command line's handling of bad input: one line, exit status 2, nothing overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm.cli import app
from contllm.spec import load_spec
from contllm.errors import ExperimentError

pytestmark = pytest.mark.unit

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def one_line_error(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "juggling"], "unknown experiment 'juggling'; known experiments: counting, events, boolean"),
        (["run", "counting", "--range", "1.0,0.5"], "range min 1.0 is larger than max 0.5"),
        (["run", "counting", "--range", "0,1"], "duration factors must be positive"),
        (["run", "counting", "--range", "-0.5,1"], "duration factors must be positive"),
        (["run", "counting", "--range", "abc"], "range must be 'MIN,MAX'"),
        (["run", "counting", "--samples", "0"], "samples must be >= 1"),
        (["run", "boolean", "--operators", "AND,FOO"], "unknown Boolean operator 'FOO'"),
        (["run", "boolean", "--range", "0,2"], "alpha range must lie within 0,1"),
        (["run", "boolean", "--method", "cubic"], "method must be 'linear' or 'slerp'"),
        (["run", "counting", "--template", "no field here"], "the template has no {words} field"),
        (["run", "counting", "--template", "{words} {colour}"], "unknown template field(s) {colour}"),
        (["run", "events", "--event", "-1"], "event must be 0"),
        (["run", "counting", "--operators", "AND,OR"], "do not apply to the counting experiment"),
        (["run", "counting", "--batch-size", "0"], "--batch-size must be >= 1"),
    ],
)
def test_bad_options(args: list[str], needle: str, tmp_path: Path) -> None:
    result = invoke(*args, "--out", str(tmp_path / "run"))
    one_line_error(result, needle)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_existing_out_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    one_line_error(invoke("run", "counting", "--out", str(out)), "already holds files; use --resume")
    one_line_error(invoke("run", "counting", "--out", str(out), "--force"), "not empty and not a run directory")
    one_line_error(invoke("run", "counting", "--out", str(out), "--resume"), "is not a run directory")
    assert (out / "notes.txt").read_text() == "keep me"


def test_resume_with_other_options_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"experiment": "counting", "model": "smollm2-135m"}))
    (out / "manifest.json").write_text("{}")
    one_line_error(invoke("run", "counting", "--out", str(out), "--resume"), "its config differs in")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("models = [", "is not valid TOML"),
        ('models = ["smollm2-135m"]\n', "no [[experiment]] tables"),
        ('[[experiment]]\nname = "juggling"\n', "name must be one of counting, events, boolean"),
        ('colour = 3\n[[experiment]]\nname = "counting"\n', "unknown key(s) colour"),
        ('[[experiment]]\nname = "counting"\nrange = [2.0, 1.0]\n', "range min 2.0 is larger than max 1.0"),
        ('[[experiment]]\nname = "boolean"\n[[experiment]]\nname = "boolean"\n', "label 'boolean' is used twice"),
        ('[[experiment]]\nname = "counting"\nwidth = 3\n', "unknown key(s) width"),
    ],
)
def test_malformed_specs(text: str, needle: str, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    with pytest.raises(ExperimentError, match=None) as info:
        load_spec(spec)
    assert needle in str(info.value)
    one_line_error(invoke("run", str(spec)), needle)


def test_shipped_specs_are_valid() -> None:
    root = Path(__file__).resolve().parents[2] / "experiments"
    specs = sorted(root.glob("*.toml"))
    assert specs
    for path in specs:
        spec = load_spec(path)
        assert spec.entries


def test_help_texts_describe_every_option() -> None:
    result = invoke("run", "--help")
    assert result.exit_code == 0
    for option in ("--model", "--device", "--dtype", "--samples", "--range", "--items", "--batch-size",
                   "--out", "--resume", "--force", "--chat", "--seed"):
        assert option in result.output
    assert invoke("models", "--help").exit_code == 0


def test_a_model_that_does_not_load_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "run"
    one_line_error(
        invoke("run", "counting", "--model", "no-such-model", "--out", str(out)),
        "unknown model 'no-such-model'",
    )
    assert not out.exists()
    empty = tmp_path / "empty-model"
    empty.mkdir()
    one_line_error(invoke("run", "counting", "--model", str(empty), "--out", str(out)), "missing config.json")
    assert not out.exists()
