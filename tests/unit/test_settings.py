"""Run settings: one typed declaration, checked once, recorded whole in config.json and compared on resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contllm import ContinuousLM
from contllm.errors import ContllmError, ExperimentError, RunDirectoryError
from contllm.experiments.counting import CountingConfig
from contllm.settings import GROUP_BYTES, GROUP_BYTES_VARIABLE, RunSettings
from tests.unit.test_sums import digit_tokenizer
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"max_batch_tokens": 0}, "--max-batch-tokens must be an integer >= 1"),
        ({"max_batch_tokens": True}, "--max-batch-tokens must be an integer >= 1"),
        ({"seed": "abc"}, "seed must be an integer"),
        ({"items": 2.5}, "items must be a count or a string of ids"),
        ({"group_bytes": 0}, f"{GROUP_BYTES_VARIABLE} must be an integer >= 1"),
        ({"device_map": "everywhere"}, "unknown device_map"),
    ],
)
def test_bad_settings_are_refused_when_made(values: dict, needle: str) -> None:
    with pytest.raises(ContllmError) as err:
        RunSettings(**values)
    assert needle in str(err.value)


def test_the_group_budget_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GROUP_BYTES_VARIABLE, raising=False)
    assert RunSettings().group_bytes == GROUP_BYTES
    monkeypatch.setenv(GROUP_BYTES_VARIABLE, "2000000")
    assert RunSettings().group_bytes == 2_000_000 and RunSettings(items=3).items == "3"
    monkeypatch.setenv(GROUP_BYTES_VARIABLE, "lots")
    with pytest.raises(ExperimentError, match=f"{GROUP_BYTES_VARIABLE} must be a whole number of bytes"):
        RunSettings()


def test_settings_that_do_not_apply_to_the_experiment_are_refused() -> None:
    from contllm import registry

    with pytest.raises(ExperimentError, match="--max-batch-tokens do not apply to the depth experiment"):
        RunSettings(max_batch_tokens=64).check_for(registry.get("depth"))
    RunSettings(max_batch_tokens=64).check_for(registry.get("attribution"))


def test_the_group_budget_is_recorded_and_a_resume_under_another_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contllm.rundir.runner import run

    lm = ContinuousLM(tiny_model("llama"), digit_tokenizer())
    config = CountingConfig(samples=2, low=0.5)
    out = tmp_path / "run"
    monkeypatch.setenv(GROUP_BYTES_VARIABLE, "2000000")
    run("counting", config=config, lm=lm, model="tiny-llama", items="3", out=out, item_figures=False)
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["group_bytes"] == 2_000_000 and recorded["max_batch_tokens"] is None
    (out / "items" / "count-002.json").unlink()  # as a killed run leaves it
    monkeypatch.setenv(GROUP_BYTES_VARIABLE, "4000000")
    with pytest.raises(RunDirectoryError, match="config differs in group_bytes"):
        run("counting", config=config, lm=lm, model="tiny-llama", items="3", out=out, resume=True)
    monkeypatch.setenv(GROUP_BYTES_VARIABLE, "2000000")
    run("counting", config=config, lm=lm, model="tiny-llama", items="3", out=out, resume=True, item_figures=False)
    assert (out / "items" / "count-002.json").is_file()


def test_python_cli_and_specs_build_the_same_settings(tmp_path: Path) -> None:
    from contllm.rundir.runner import check_run
    from contllm.rundir.spec import load_spec

    spec = tmp_path / "spec.toml"
    spec.write_text('models = ["m"]\nseed = 3\n[[experiment]]\nname = "counting"\nitems = 2\nsamples = 2\n')
    entry = load_spec(spec).entries[0]
    assert entry.settings == RunSettings(model="m", items="2", seed=3)
    checked = check_run("counting", options={"samples": 2}, model="m", items=2, seed=3)
    assert checked.settings == entry.settings
    assert checked.resolved == {"experiment": "counting", **entry.settings.recorded(),
                                "options": checked.experiment.config_dict(checked.config)}
    with pytest.raises(ExperimentError, match="unknown setting"):
        check_run("counting", modle="m")


@pytest.mark.parametrize(("values", "needle"), [
    ({"seed": 99999999999999999999999}, "seed must be an integer from 0 to"),
    ({"seed": -1}, "seed must be an integer from 0 to"),
    ({"items": "9" * 5000}, "is larger than any dataset"),
    ({"items": 10**5000}, "is larger than any dataset"),
])
def test_seeds_and_counts_past_what_a_run_can_use_are_refused(values: dict, needle: str) -> None:
    with pytest.raises(ExperimentError, match=needle) as err:
        RunSettings(**values)
    assert len(str(err.value)) < 200


def test_a_count_is_recorded_in_its_plain_spelling_so_a_resume_accepts_either(tmp_path: Path) -> None:
    from contllm.rundir.runs import RunDir

    assert RunSettings(items="02").recorded() == RunSettings(items=2).recorded() == RunSettings(items=" 2").recorded()
    config = {"experiment": "counting", **RunSettings(items="2").recorded(), "options": {}}
    with RunDir(tmp_path / "run", config):
        pass
    again = {"experiment": "counting", **RunSettings(items="02").recorded(), "options": {}}
    with RunDir(tmp_path / "run", again, resume=True) as run:
        assert run.resumed


def test_an_id_that_holds_a_comma_can_be_selected(tmp_path: Path) -> None:
    from contllm.rundir.runner import check_run

    data = tmp_path / "items.json"
    data.write_text(json.dumps([{"word": "apple", "n": 3, "id": "a,b"}, {"word": "pear", "n": 2, "id": "c"}]))
    assert check_run("counting", options={"data": str(data)}, items="a,b").chosen == ["a,b"]
    assert check_run("counting", options={"data": str(data)}, items="c").chosen == ["c"]
