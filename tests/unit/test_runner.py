"""run_experiment's progress: a bar in a notebook by default, none elsewhere, on or off by request, or a callback."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from contllm import ContinuousLM
from contllm.experiments.counting import CountingConfig
from contllm.rundir.runner import in_notebook, run_experiment
from tests.unit.test_hostile_data import counting_rows
from tests.unit.test_sums import digit_tokenizer
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"), digit_tokenizer())


@pytest.fixture
def config(tmp_path: Path) -> CountingConfig:
    return CountingConfig(data=str(counting_rows(tmp_path / "rows.jsonl", ["a", "b", "c"])), samples=2)


def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process look like a Jupyter kernel: IPython.get_ipython() returns a ZMQInteractiveShell."""
    shell = type("ZMQInteractiveShell", (), {})()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))


def test_a_callback_hears_every_item(
    lm: ContinuousLM, config: CountingConfig, capfd: pytest.CaptureFixture[str]
) -> None:
    heard: list[tuple[int, int]] = []
    result = run_experiment(lm, "counting", config, progress=lambda done, total: heard.append((done, total)))
    assert len(result.sweeps) == 3
    assert heard[-1] == (3, 3) and all(total == 3 for _, total in heard)
    assert capfd.readouterr().err == ""


def test_no_bar_outside_a_notebook_unless_asked(
    lm: ContinuousLM, config: CountingConfig, capfd: pytest.CaptureFixture[str]
) -> None:
    assert not in_notebook()
    run_experiment(lm, "counting", config)
    assert capfd.readouterr().err == ""
    run_experiment(lm, "counting", config, progress=True)
    err = capfd.readouterr().err
    assert "counting" in err and "3/3" in err


def test_a_notebook_gets_a_bar_by_default_and_none_with_progress_false(
    lm: ContinuousLM, config: CountingConfig, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_kernel(monkeypatch)
    assert in_notebook()
    first = run_experiment(lm, "counting", config)
    assert "3/3" in capfd.readouterr().err
    second = run_experiment(lm, "counting", config, progress=False)
    assert capfd.readouterr().err == ""
    assert [s.item_id for s in first.sweeps] == [s.item_id for s in second.sweeps] == ["a", "b", "c"]
