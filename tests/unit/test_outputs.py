"""Results that load anywhere: results.csv rows name their run's experiment and model; load_run and to_pandas."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

import contllm
from contllm import ContinuousLM
from contllm.errors import ExperimentError, MissingDependencyError, RunDirectoryError
from contllm.experiments.counting import CountingConfig
from contllm.rundir.outputs import RUN_COLUMNS, to_pandas
from tests.unit.test_sums import digit_tokenizer
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two real counting runs of two tiny models (different weights), two items, three factors each."""
    from contllm.rundir.runner import run

    root = tmp_path_factory.mktemp("runs")
    config = CountingConfig(samples=3, low=0.5, high=1.5)
    return [
        run("counting", config=config, lm=ContinuousLM(tiny_model(family), digit_tokenizer()), model=f"tiny-{family}",
            items="2", out=root / family, item_figures=False)
        for family in ("llama", "qwen2")
    ]


def test_results_csv_rows_carry_the_runs_experiment_and_model(two_runs: list[Path]) -> None:
    for path, model in zip(two_runs, ("tiny-llama", "tiny-qwen2")):
        with (path / "results.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        header = list(rows[0])
        assert header[-2:] == list(RUN_COLUMNS) and header[:4] == ["item", "factor", "label", "probability"]
        assert rows and {(r["experiment"], r["model"]) for r in rows} == {("counting", model)}


def test_load_run_is_exported_and_gives_the_result_and_a_tidy_table(two_runs: list[Path]) -> None:
    run = contllm.load_run(two_runs[0])
    assert run.experiment == "counting" and run.model == "tiny-llama"
    assert [s.item_id for s in run.result.sweeps] == ["count-001", "count-002"]
    table = run.to_pandas()
    with (two_runs[0] / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(table.columns) == list(rows[0]) and len(table) == len(rows)
    assert table["probability"].dtype == np.float64
    np.testing.assert_allclose(table["probability"].to_numpy(), [float(r["probability"]) for r in rows], rtol=1e-12)
    # The table is the result's own numbers: one sweep's probabilities, label by label.
    sweep = run.result.sweeps[0]
    first = table[table["item"] == sweep.item_id]
    for j, label in enumerate(sweep.labels):
        got = first[first["label"] == label].sort_values("factor")["probability"].to_numpy()
        np.testing.assert_allclose(got, np.asarray(sweep.probs)[np.argsort(sweep.x), j], rtol=1e-6)


def test_tables_of_several_runs_stack_and_stay_apart(two_runs: list[Path]) -> None:
    import pandas as pd

    table = pd.concat([contllm.load_run(p).to_pandas() for p in two_runs], ignore_index=True)
    per_model = table.groupby("model")["probability"].sum()
    assert list(per_model.index) == ["tiny-llama", "tiny-qwen2"]
    # different weights: the two models' numbers differ, and each model's rows sum per (item, factor) to its own mass
    assert not np.isclose(per_model["tiny-llama"], per_model["tiny-qwen2"])
    assert set(table["experiment"]) == {"counting"}


def test_to_pandas_on_a_result_in_memory_and_its_errors(two_runs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    result = contllm.load_run(two_runs[1]).result
    assert set(to_pandas(result)["model"]) == {"tiny-qwen2"}
    with pytest.raises(ExperimentError, match="has no table 'layers'; its tables: results"):
        to_pandas(result, "layers")
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    with pytest.raises(MissingDependencyError, match="pip install pandas"):
        contllm.load_run(two_runs[1]).to_pandas()


def test_load_run_of_what_is_not_a_run_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="is not a run directory"):
        contllm.load_run(tmp_path / "nowhere")
