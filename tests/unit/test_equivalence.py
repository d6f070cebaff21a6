"""The equivalence experiment (m copies of duration d against m·d copies) on a tiny model: grid, KL cells, options, runner."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.core.engine import Engine
from contllm.core.readout import digits
from contllm.core.signal import Signal
from contllm.data import load_counting
from contllm.experiments.counting import DEFAULT_TEMPLATE, SHOTS
from contllm.experiments.equivalence import (
    EXPERIMENT,
    EquivalenceConfig,
    EquivalenceResult,
    Grid,
    integer_cells,
    kl_divergence,
    measures,
    run_grid,
    select_words,
)
from tests.unit.tiny import tiny_model, tiny_model64, word_level_tokenizer

pytestmark = pytest.mark.unit

#: The smallest grid with every part: 2 words, copies 1..3, d in {0.5, 1, 1.5, 2}.
OPTIONS = {"range": "0.5,2", "samples": "4", "max_copies": "3"}


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level: the few-shot words, two counting words per category, the digits and the prompt's punctuation."""
    chosen = select_words(load_counting(), 2)
    words = [w for w, _ in SHOTS] + [item.word for item in chosen] + ["contains", "words", '"', "."]
    vocab = ["<unk>"] + list(dict.fromkeys(words + [str(k) for k in range(10)]))
    return word_level_tokenizer(vocab)


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"), word_tokenizer())


@pytest.fixture(scope="module")
def lm64() -> ContinuousLM:
    return ContinuousLM(tiny_model64("llama"), word_tokenizer())


@pytest.fixture(scope="module")
def full_run(lm: ContinuousLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from contllm.rundir.runner import run

    return run("equivalence", options=OPTIONS, lm=lm, model="tiny-llama", items="2",
               out=tmp_path_factory.mktemp("equivalence") / "run")


def test_the_experiment_is_registered_with_its_options_and_one_word_per_category() -> None:
    assert registry.get("equivalence") is EXPERIMENT and EXPERIMENT.engine and EXPERIMENT.shardable
    assert [o.cli_flag for o in EXPERIMENT.options] == ["--range", "--samples", "--template", "--chat/--no-chat",
                                                        "--max-copies", "--per-category"]
    config = EXPERIMENT.config()
    assert config == EquivalenceConfig()
    assert list(config.copies()) == [1, 2, 3, 4, 5, 6]
    assert np.allclose(config.durations(), np.arange(1, 13) * 0.25)
    items = EXPERIMENT.items(config)
    assert len(items) == 13 and len({i.category for i in items}) == 13 and items[0].id == "count-001"
    assert len(EXPERIMENT.items(EXPERIMENT.config({"per_category": "10"}))) == 130


def test_the_cell_of_m_copies_at_duration_1_is_the_plain_m_copy_prompt(lm64: ContinuousLM) -> None:
    item = load_counting()[0]
    config = EXPERIMENT.config(OPTIONS)
    grid = run_grid(lm64, item, config, Engine(lm64).probs)
    assert grid.probs.shape == (3, 4, 10) and grid.labels == [str(k) for k in range(10)]
    unit = grid.unit_column()
    assert grid.durations[unit] == 1.0
    sets = digits(lm64.tokenizer)
    for i, m in enumerate(grid.copies):
        plain = DEFAULT_TEMPLATE.replace("{words}", " ".join([item.word] * int(m)))
        alone = sets.gather(lm64.probs([Signal.from_text(lm64.tokenizer, plain)]).float()).numpy()[0]
        assert np.abs(grid.probs[i, unit] - alone).max() <= 1e-5
    # a cell off the unit column is that prompt with every copy scaled, run alone
    plain = DEFAULT_TEMPLATE.replace("{words}", " ".join([item.word] * 2))
    signal = Signal.from_text(lm64.tokenizer, plain)
    scaled = signal.scale(signal.find(item.word), 1.5)
    alone = sets.gather(lm64.probs([scaled]).float()).numpy()[0]
    assert np.abs(grid.probs[1, list(grid.durations).index(1.5)] - alone).max() <= 1e-5


def synthetic(copies: list[int], durations: list[float]) -> Grid:
    """A grid that reads m copies of duration d as round(m·d) copies (peaked digit distributions)."""
    probs = np.full((len(copies), len(durations), 10), 0.01)
    for i, m in enumerate(copies):
        for j, d in enumerate(durations):
            probs[i, j, min(9, round(m * d))] = 0.91
    return Grid("w", np.array(copies), np.array(durations), [str(k) for k in range(10)], probs, {"word": "w"})


def test_the_kl_compares_each_integer_cell_with_the_plain_prompt_of_m_d_copies() -> None:
    grid = synthetic([1, 2, 3], [0.5, 1.0, 2.0, 3.0])
    # (row, column, reference row): 1 x 2 -> 2 copies, 1 x 3 -> 3 copies, 2 x 0.5 -> 1 copy;
    # 2 x 2 = 4 and 3 x 0.5 = 1.5 have no plain prompt in the grid; d = 1 is the reference itself.
    assert integer_cells(grid) == [(0, 2, 1), (0, 3, 2), (1, 0, 0)]
    numbers = measures(grid)
    assert numbers["integer_cells"] == 3
    assert numbers["kl_product"] == pytest.approx(0.0, abs=1e-12) and numbers["argmax_agreement"] == 1.0
    p = grid.digits()
    same = np.mean([kl_divergence(p[0, 2], p[0, 1]), kl_divergence(p[0, 3], p[0, 1]), kl_divergence(p[1, 0], p[1, 1])])
    assert numbers["kl_same_copies"] == pytest.approx(same) and same > 1.0
    assert numbers["accuracy_at_1"] == 1.0 and numbers["spearman_product"] > 0.9
    assert kl_divergence(np.array([0.5, 0.5]), np.array([0.9, 0.1])) == pytest.approx(
        0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1))
    with pytest.raises(ExperimentError, match="no d = 1 column"):
        integer_cells(replace(grid, durations=np.array([0.5, 1.5, 2.0, 3.0])))


def test_a_grid_round_trips_through_its_dict() -> None:
    grid = synthetic([1, 2], [0.5, 1.0])
    again = Grid.from_dict(json.loads(json.dumps(grid.to_dict())))
    assert np.array_equal(again.probs, grid.probs) and list(again.copies) == [1, 2] and again.meta == grid.meta
    with pytest.raises(ExperimentError, match="malformed equivalence record"):
        Grid.from_dict({**grid.to_dict(), "durations": [1.0]})


def test_a_run_writes_its_grids_tables_summary_and_figures(full_run: Path) -> None:
    result = EquivalenceResult.from_dict(json.loads((full_run / "results.json").read_text()))
    assert [g.item_id for g in result.grids] == ["count-001", "count-002"]
    assert result.grids[0].probs.shape == (3, 4, 10)
    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["items"] == 2 and np.isfinite(summary["mean_kl_product"]) and np.isfinite(summary["mean_slope"])
    assert (full_run / "results.csv").read_text().startswith("item,word,copies,duration,copies_x_duration,label,probability")
    assert len((full_run / "items.csv").read_text().splitlines()) == 3
    for name in ("summary", "items/count-001", "items/count-002"):
        assert (full_run / "figures" / f"{name}.png").is_file()


def test_resume_recomputes_only_the_lost_word_exactly(lm: ContinuousLM, full_run: Path, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    kept = (out / "items" / "count-001.json").stat().st_mtime_ns
    (out / "items" / "count-002.json").unlink()
    run("equivalence", options=OPTIONS, lm=lm, model="tiny-llama", items="2", out=out, resume=True)
    assert (out / "items" / "count-001.json").stat().st_mtime_ns == kept
    before = json.loads((full_run / "results.json").read_text())
    after = json.loads((out / "results.json").read_text())
    assert np.allclose(np.array(after["grids"][1]["probs"]), np.array(before["grids"][1]["probs"]), atol=1e-6)
    assert json.loads((out / "summary.json").read_text())["mean_kl_product"] == pytest.approx(
        json.loads((full_run / "summary.json").read_text())["mean_kl_product"], abs=1e-5)


def test_the_comparison_draws_runs_side_by_side(full_run: Path) -> None:
    from contllm.plotting import plt

    result = EXPERIMENT.load_result(json.loads((full_run / "results.json").read_text()))
    fig = EXPERIMENT.comparison([("a", result), ("b", result)])
    assert len([ax for ax in fig.axes if ax.get_xlabel() == "duration per copy d"]) == 2
    plt.close(fig)
    assert EXPERIMENT.report_columns(result) == {"d_min": 0.5, "d_max": 2.0, "samples": 4, "max_copies": 3}
