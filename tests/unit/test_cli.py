"""The command line's handling of bad input: one line, exit status 2, nothing overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app
from contllm.errors import ExperimentError
from contllm.rundir.spec import load_spec

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
        (["run", "counting", "--samples", "0"], "samples must be an integer >= 1"),
        (["run", "boolean", "--operators", "AND,FOO"], "unknown Boolean operator 'FOO'"),
        (["run", "boolean", "--range", "0,2"], "alpha range must lie within 0,1"),
        (["run", "boolean", "--method", "cubic"], "method must be 'linear' or 'slerp'"),
        (["run", "counting", "--template", "no field here"], "the template has no {words} field"),
        (["run", "counting", "--template", "{words} {colour}"], "unknown template field(s) {colour}"),
        (["run", "events", "--event", "-1"], "event must be 0"),
        (["run", "counting", "--operators", "AND,OR"], "option(s) --operators do not apply to the counting experiment"),
        (["run", "counting", "--max-batch-tokens", "0"], "--max-batch-tokens must be an integer >= 1"),
        (["run", "counting", "--samples", "ten"], "--samples must be an integer, got 'ten'"),
        (["run", "counting", "--range", "0.5,0.5"], "range 0.5,0.5 holds one value"),
        (["run", "counting", "--range", "nan,1"], "--range must be finite"),
        (["run", "counting", "--range", "0.1,inf"], "--range must be finite"),
        (["run", "counting", "--samples", "1"], "one sample needs a range with min == max"),
        (["run", "counting", "--samples", "100000000"], "samples must be at most"),
        (["run", "events", "--event", "99"], "event 99 does not exist"),
        (["run", "counting", "--items", "0"], "item count must be positive"),
        (["run", "counting", "--items", "no-such-item"], "unknown item id 'no-such-item'"),
        (["run", "depth", "--max-batch-tokens", "100"], "option(s) --max-batch-tokens do not apply to the depth experiment"),
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
    one_line_error(invoke("run", "counting", "--out", str(out)), "already holds files and is not a run directory")
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
        ('[[experiment]]\nname = "counting"\nlabel = ".."\n', "label '..' must be a plain directory name"),
        ('[[experiment]]\nname = "counting"\nlabel = "a/b"\n', "label 'a/b' must be a plain directory name"),
        ('[[experiment]]\nname = "counting"\nlabel = "' + "a" * 101 + '"\n', "... (101 characters) must be a plain"),
        # A TOML date has no length: its repr is cut without one.
        ('[[experiment]]\nname = "counting"\nlabel = 1979-05-27T00:32:00.999999-07:00\n', "label datetime.datetime("),
        ('[[experiment]]\nname = "counting"\nsamples = "ten"\n', "--samples must be an integer, got 'ten'"),
        ('[[experiment]]\nname = "counting"\nsamples = 3.7\n', "--samples must be an integer, got 3.7"),
        ('seed = "abc"\n[[experiment]]\nname = "counting"\n', "'seed' must be an integer"),
        ('out = 42\n[[experiment]]\nname = "counting"\n', "'out' must be a string"),
        ('item_figures = "no"\n[[experiment]]\nname = "counting"\n', "'item_figures' must be true or false"),
        ('max_batch_tokens = -5\n[[experiment]]\nname = "counting"\n', "'max_batch_tokens' must be >= 1"),
        ('[[experiment]]\nname = "counting"\nrange = [0.5, 0.5]\n', "range 0.5,0.5 holds one value"),
        ('[[experiment]]\nname = "events"\nevent = 99\n', "event 99 does not exist"),
        ('[[experiment]]\nname = "counting"\nitems = 0\n', "item count must be positive"),
        ('max_batch_tokens = 100\n[[experiment]]\nname = "depth"\n', "max_batch_tokens does not apply to depth"),
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
    root = Path(__file__).resolve().parents[2] / "specs"
    specs = sorted(root.glob("*.toml"))
    assert specs
    for path in specs:
        spec = load_spec(path)
        assert spec.entries


def test_each_experiment_of_a_spec_keeps_its_own_items(tmp_path: Path) -> None:
    """The items of one [[experiment]] never carry over to the next (specs/quick.toml once ran events with 10, not 5)."""
    spec = load_spec(Path(__file__).resolve().parents[2] / "specs" / "quick.toml")
    assert {e.experiment: e.settings.items for e in spec.entries} == {"counting": "10", "events": "5", "boolean": None}
    path = tmp_path / "spec.toml"
    path.write_text('[[experiment]]\nname = "counting"\nitems = 3\n[[experiment]]\nname = "events"\n'
                    '[[experiment]]\nname = "boolean"\nitems = "2"\n[[experiment]]\nname = "depth"\n')
    items = {e.experiment: e.settings.items for e in load_spec(path).entries}
    assert items == {"counting": "3", "events": None, "boolean": "2", "depth": None}


def test_the_command_lines_items_override_every_experiments(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text('[[experiment]]\nname = "counting"\nitems = 3\n[[experiment]]\nname = "events"\n')
    spec = load_spec(path, items="2")
    assert [(e.experiment, e.settings.items) for e in spec.entries] == [("counting", "2"), ("events", "2")]
    path.write_text('[[experiment]]\nname = "counting"\nitems = 3\n[[experiment]]\nname = "counting"\n'
                    'label = "again"\nitems = "count-005"\n')
    spec = load_spec(path, items="count-002,count-001")
    assert [e.settings.items for e in spec.entries] == ["count-002,count-001"] * 2


def test_the_config_of_a_spec_run_records_its_own_items(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What config.json would record: the resolved settings of each entry, checked as a run checks them."""
    from contllm.rundir.runner import check_run

    spec = load_spec(Path(__file__).resolve().parents[2] / "specs" / "quick.toml")
    recorded = {e.experiment: check_run(e.experiment, options=dict(e.options), settings=e.settings).resolved["items"]
                for e in spec.entries}
    assert recorded == {"counting": "10", "events": "5", "boolean": None}


def test_help_texts_describe_every_option() -> None:
    from contllm import registry

    listing = invoke("run", "--help")
    assert listing.exit_code == 0, listing.output
    for name in registry.names():
        assert name in listing.output
        assert registry.get(name).help.split(";")[0][:30] in " ".join(listing.output.split())
        page = invoke("run", name, "--help")
        assert page.exit_code == 0, page.output
        for option in ("--model", "--device", "--dtype", "--items", "--out", "--resume", "--force", "--seed"):
            assert option in page.output, (name, option)
        for option in registry.get(name).options:
            assert option.cli_flag.split("/")[0] in page.output, (name, option.name)
    counting = invoke("run", "counting", "--help").output
    for option in ("--samples", "--range", "--chat", "--max-batch-tokens", "--template"):
        assert option in counting
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
