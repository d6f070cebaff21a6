"""The sums experiment (a number's duration in a word problem) on a tiny model: prompt, greedy digits, measures, runner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.core.engine import Engine
from contllm.core.readout import digits
from contllm.core.signal import Signal
from contllm.experiments.sums import (
    EXPERIMENT,
    SHOTS,
    SumItem,
    SumRecord,
    SumsConfig,
    load_sums,
    measures,
    render_item,
    run_item,
)
from tests.unit.tiny import tiny_model64, word_level_tokenizer

pytestmark = pytest.mark.unit

#: Two factors and the plain prompt: 0.5, 1.
OPTIONS = {"range": "0.5,1", "samples": "2"}


def digit_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level with every digit its own token; a few words of the prompt, everything else <unk>."""
    words = ["Question", "Answer", ":", "+", "=", "?", ".", "has", "and", "more", "How", "many"]
    vocab = ["<unk>"] + [str(k) for k in range(10)] + words
    return word_level_tokenizer(vocab, digits=True)


@pytest.fixture(scope="module")
def lm64() -> ContinuousLM:
    return ContinuousLM(tiny_model64("llama"), digit_tokenizer())


@pytest.fixture(scope="module")
def full_run(lm64: ContinuousLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from contllm.rundir.runner import run

    return run("sums", options=OPTIONS, lm=lm64, model="tiny-llama", items="2",
               out=tmp_path_factory.mktemp("sums") / "run")


def test_registered_with_its_options_and_32_two_digit_problems() -> None:
    assert registry.get("sums") is EXPERIMENT and EXPERIMENT.engine and EXPERIMENT.shardable
    assert [o.cli_flag for o in EXPERIMENT.options] == ["--range", "--samples", "--template", "--chat/--no-chat", "--data",
                                                        "--protocol", "--selection"]
    config = EXPERIMENT.config()
    assert config == SumsConfig() and config.data is None and config.data_sha256 is None
    assert np.allclose(config.factors(), [0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.3, 1.5])
    items = EXPERIMENT.items(config)
    assert len(items) == 32 and len({i.id for i in items}) == 32 and items[0].id == "sum-001"
    assert all(10 <= i.first <= 99 and 10 <= i.second <= 99 and i.scaled == "first" for i in items)
    assert not {i.rendered().text for i in items} & {p for p, _, _ in SHOTS}  # no problem is also a worked example


def test_every_place_that_writes_the_scaled_number_is_scaled() -> None:
    item = SumItem("s", "{name} has {first} pens and gets {second} more.", 23, 45, name="Ana", scaled="second")
    config = SumsConfig()
    rendered = render_item(None, item, config)
    spans = rendered.spans["scaled"]
    # once in the problem, once in the template's "Answer: 23 + 45 = "
    assert [rendered.text[a:b] for a, b in spans] == ["45", "45"]
    assert rendered.text.endswith("Question: Ana has 23 pens and gets 45 more.\nAnswer: 23 + 45 = ")
    assert item.numbers == (45, 23) and item.truth == 68
    only_problem = render_item(None, item, SumsConfig(template="Q: {problem}\nA: "))
    assert [only_problem.text[a:b] for a, b in only_problem.spans["scaled"]] == ["45"]
    with pytest.raises(ExperimentError, match="no {problem} field"):
        SumsConfig(template="{first} + {second} = ")


def tilted(evaluate: Any, weight: float) -> Any:
    """``evaluate`` with the digits' probabilities multiplied by ``weight`` and renormalised (a model keener on digits)."""
    ids = [i for group in digits(digit_tokenizer()).token_ids for i in group]

    def tilt(probs: torch.Tensor) -> torch.Tensor:
        probs = probs.clone()
        probs[..., ids] *= weight
        return probs / probs.sum(dim=-1, keepdim=True)

    return lambda signals: tilt(evaluate(signals))


@pytest.mark.parametrize("weight", [1.0, 1e4])
def test_the_greedy_digits_are_the_models_own_steps_run_alone(lm64: ContinuousLM, weight: float) -> None:
    item = load_sums()[0]
    config = EXPERIMENT.config(OPTIONS)
    record = run_item(lm64, item, config, tilted(Engine(lm64).probs, weight))
    assert list(record.x) == [0.5, 1.0] and record.labels == [str(k) for k in range(10)]
    assert (record.truth, record.scaled, record.other) == (68, 23, 45)
    rendered = render_item(lm64, item, config)
    sets = digits(lm64.tokenizer)
    tok = lm64.tokenizer
    alone = tilted(lm64.probs, weight)
    for i, c in enumerate(record.x):
        signal = Signal.from_text(tok, rendered.text).scale(rendered.spans["scaled"], float(c))
        answer = record.answers[i]
        assert 1 <= len(answer) <= 3 and len(record.steps) >= len(answer)
        for k in range(len(record.steps)):
            row = record.steps[k][i]
            if k > len(answer):
                assert row is None  # the number had ended before this step
                continue
            ids = torch.tensor(tok.convert_tokens_to_ids(list(answer[:k])), dtype=torch.long)
            written = Signal.from_ids(torch.cat([signal.token_ids, ids]),
                                      torch.cat([signal.durations, torch.ones(k, dtype=torch.float64)]))
            probs = alone([written])[0]
            assert np.abs(np.array(row) - sets.gather(probs).numpy()).max() <= 1e-6
            top = tok.convert_ids_to_tokens(int(probs.argmax()))
            if k == 0:
                assert answer[0] == str(int(np.argmax(row)))  # the first digit: the most probable digit
            elif k < len(answer):
                assert top == answer[k]  # a digit was the top token: the number goes on
            else:
                assert top not in sets.labels  # the top token is no digit: the number ends
    if weight > 1:  # digits always on top: the number is cut at one digit more than the true sum has
        assert all(len(a) == 3 for a in record.answers) and len(record.steps) == 3
    again = run_item(lm64, item, config, tilted(Engine(lm64).probs, weight))
    assert again.to_dict() == record.to_dict()  # deterministic


def synthetic(answers: list[str], scaled: int = 20, other: int = 30) -> SumRecord:
    """A record whose every digit step puts 0.9 on the answer's digit and 0.1 on 0."""
    x = np.linspace(0.5, 1.5, len(answers))
    depth = max(len(a) for a in answers)
    steps: list[list[list[float] | None]] = [[None] * len(answers) for _ in range(depth)]
    for i, answer in enumerate(answers):
        for k, d in enumerate(answer):
            row = [0.0] * 10
            row[0] += 0.1
            row[int(d)] += 0.9
            steps[k][i] = row
    return SumRecord("r", x, [str(k) for k in range(10)], steps, answers, scaled + other, scaled, other, {})


def test_under_the_papers_protocol_a_record_says_whether_the_papers_search_finds_the_number(lm64: ContinuousLM) -> None:
    config = SumsConfig(protocol="paper", low=0.5, samples=2)
    assert config.selection == "paper" and list(config.factors()) == [0.5, 1.0]
    item = SumItem("s", "{name} has {first} pens and {second} more.", 23, 45, name="Ana", answer="{name} has")
    record = run_item(lm64, item, config, Engine(lm64).probs)
    # the paper's search: the first token holding "2" to the last holding "3", before the first "and"
    assert record.meta["paper_runs"] is True and record.meta["edited_tokens"] == ["2", "3"]
    second = SumItem("t", "{name} has {first} pens and {second} more.", 23, 45, name="Ana", scaled="second")
    record = run_item(lm64, second, config, Engine(lm64).probs)
    assert record.meta["paper_runs"] is True and record.meta["edited_tokens"] == ["4", "5"]  # from "and" to "."
    one_digit = SumItem("u", "{name} has {first} pens and {second} more.", 7, 45, name="Ana")
    record = run_item(lm64, one_digit, config, Engine(lm64).probs)
    assert record.meta["paper_runs"] is False and record.meta["edited_tokens"] == ["7"]  # no second digit to find


def test_the_implied_sum_weights_each_digits_expectation_by_its_place() -> None:
    record = synthetic(["40", "50", "6"])
    # 0.9 * digit + 0.1 * 0 at each step, tens and units
    assert np.allclose(record.implied(), [0.9 * 40, 0.9 * 50, 0.9 * 6])
    assert np.allclose(record.greedy(), [40, 50, 6])
    assert np.allclose(record.line(), 20 * record.x + 30)
    record.steps[1][0] = [p * 2 for p in record.steps[1][0]]  # unnormalised: renormalised over the digits
    assert record.implied()[0] == pytest.approx(0.9 * 40)


def test_measures_are_one_on_the_line_and_name_what_is_wrong() -> None:
    x = np.linspace(0.5, 1.5, 11)
    answers = [str(int(round(20 * c + 30))) for c in x]  # exactly a·c + b, with 1.0 -> 50 = the true sum
    steps = [[[float(k == int(a[j])) for k in range(10)] for a in answers] for j in range(2)]
    record = SumRecord("r", x, [str(k) for k in range(10)], steps, answers, 50, 20, 30, {})
    numbers = measures(record)
    assert numbers["correct_at_1"] == 1.0 and numbers["first_digit_correct_at_1"] == 1.0
    assert numbers["slope_ratio"] == pytest.approx(1.0) and numbers["r2"] == pytest.approx(1.0)
    assert numbers["spearman"] == pytest.approx(1.0) and numbers["mae_line"] == pytest.approx(0.0, abs=1e-9)
    flat = synthetic(["55"] * 4)  # factors 0.5 .. 1.5 without 1
    numbers = measures(flat)
    assert numbers["slope"] == 0.0 and np.isnan(numbers["spearman"]) and np.isnan(numbers["correct_at_1"])
    assert numbers["mae_line"] == pytest.approx(np.mean(np.abs(0.9 * 55 - flat.line())))


def test_a_record_round_trips_and_a_malformed_one_is_refused() -> None:
    record = synthetic(["40", "5"])
    again = SumRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again.to_dict() == record.to_dict()
    with pytest.raises(ExperimentError, match="malformed sums record"):
        SumRecord.from_dict({**record.to_dict(), "answers": ["40"]})
    with pytest.raises(ExperimentError, match="malformed sums record"):
        SumRecord.from_dict({**record.to_dict(), "answers": ["40", "x"]})
    with pytest.raises(ExperimentError, match="malformed sums record"):
        SumRecord.from_dict({k: v for k, v in record.to_dict().items() if k != "steps"})


def test_a_run_writes_records_tables_summary_and_figures(full_run: Path) -> None:
    result = EXPERIMENT.load_result(json.loads((full_run / "results.json").read_text()))
    assert [r.item_id for r in result.records] == ["sum-001", "sum-002"]
    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["items"] == 2 and summary["accuracy_at_1"] in (0.0, 0.5, 1.0)
    assert set(summary) == {"experiment", "model", "items", "accuracy_at_1", "first_digit_accuracy_at_1", "mean_slope",
                            "mean_slope_ratio", "median_slope_ratio", "mean_r2", "mean_spearman", "mean_mae_line",
                            "valid_rate", "successful_rate", "strongly_successful_rate", "completely_successful_rate",
                            "paper_coverage", "metrics"}
    # the paper's search stops at the first "and", inside the first worked example, before the problem's numbers
    assert summary["paper_coverage"] == 0.0
    assert set(summary["metrics"]) == {"accuracy_at_1", "mean_spearman", "mean_mae_line", "valid_rate", "successful_rate",
                                       "strongly_successful_rate", "completely_successful_rate"}
    assert summary["metrics"]["mean_mae_line"]["direction"] == "lower is better"
    assert (full_run / "results.csv").read_text().startswith("item,factor,answer,implied,line,truth")
    assert len((full_run / "results.csv").read_text().splitlines()) == 1 + 2 * 2
    assert (full_run / "digits.csv").read_text().startswith("item,factor,step,label,probability")
    assert len((full_run / "items.csv").read_text().splitlines()) == 3
    for name in ("summary", "items/sum-001", "items/sum-002"):
        assert (full_run / "figures" / f"{name}.png").is_file()
    options = json.loads((full_run / "config.json").read_text())["options"]
    assert options["data"] is None and options["data_sha256"] is None and options["samples"] == 2


def test_resume_recomputes_only_the_lost_problem_exactly(lm64: ContinuousLM, full_run: Path, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    kept = (out / "items" / "sum-001.json").stat().st_mtime_ns
    (out / "items" / "sum-002.json").unlink()
    run("sums", options=OPTIONS, lm=lm64, model="tiny-llama", items="2", out=out, resume=True)
    assert (out / "items" / "sum-001.json").stat().st_mtime_ns == kept
    assert json.loads((out / "items" / "sum-002.json").read_text()) == json.loads(
        (full_run / "items" / "sum-002.json").read_text())


def test_the_comparison_and_report_columns(full_run: Path) -> None:
    from contllm.plotting import plt

    result = EXPERIMENT.load_result(json.loads((full_run / "results.json").read_text()))
    fig = EXPERIMENT.comparison([("a", result), ("b", result)])
    assert [ax.get_xlabel() for ax in fig.axes] == ["duration factor c", "duration factor c"]
    plt.close(fig)
    assert EXPERIMENT.report_columns(result) == {"factor_min": 0.5, "factor_max": 1.0, "samples": 2}

