"""scaling and translation on tiny random models: the time axis scaled or shifted, invariance, learned positions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from contllm import ContinuousLM, ExperimentError, registry
from contllm.core.engine import Engine
from contllm.experiments import run_experiment, summarize
from contllm.experiments.timeline import SCALING, TOLERANCE, TRANSLATION, scaled, translated
from tests.unit.test_tokens_experiment import word_tokenizer
from tests.unit.tiny import ROTARY, tiny_model, tiny_model64

pytestmark = pytest.mark.unit

PROMPTS = [
    {"id": "one", "prompt": "the river runs past the old mill and the bridge"},
    {"id": "two", "prompt": "a small red fox jumps over the lazy brown dog"},
]


def tokenizer() -> object:
    return word_tokenizer(" ".join(p["prompt"] for p in PROMPTS).split())


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    return path


def test_both_are_registered_and_read_the_prompts_of_the_tokens_dataset() -> None:
    assert registry.get("scaling") is SCALING and registry.get("translation") is TRANSLATION
    for experiment in (SCALING, TRANSLATION):
        assert [o.cli_flag for o in experiment.options] == ["--range", "--samples", "--threshold", "--data",
                                                            "--protocol"]
        assert [i.prompt for i in experiment.items(experiment.config())] == [
            i.prompt for i in registry.get("tokens").items(registry.get("tokens").config())]
    assert list(SCALING.config().values()[[0, -1]]) == [0.01, 1.5] and 1.0 in SCALING.config().values()
    assert list(TRANSLATION.config().values()) == [0.5 * k for k in range(21)]


def test_the_whole_time_axis_is_scaled_or_shifted() -> None:
    tok = tokenizer()
    from contllm.core.signal import Signal

    base = Signal.from_text(tok, PROMPTS[0]["prompt"])
    stock = base.times
    assert torch.equal(stock, torch.arange(len(base), dtype=torch.float64))
    half = scaled(base, 0.5)
    assert torch.allclose(half.times, 0.5 * stock, atol=0) and torch.allclose(half.durations, 0.5 * base.durations)
    assert half.start == -0.5  # the integration start scales with the times: the first token stays at time 0
    moved = translated(base, 2.5)
    assert torch.equal(moved.times, stock + 2.5) and moved.start == base.start + 2.5
    assert torch.equal(moved.durations, base.durations)


@pytest.mark.parametrize("family", ROTARY)
def test_translation_is_invariant_on_every_rotary_family(family: str, data: Path) -> None:
    lm = ContinuousLM(tiny_model(family), tokenizer())
    result = run_experiment(lm, "translation", TRANSLATION.config({"data": str(data), "range": "0,10", "samples": "6"}))
    summary = summarize(result)
    assert summary["positions"] == "rotary" and summary["tau_max"] == 10.0
    assert summary["max_abs_dp"] <= TOLERANCE and summary["within_tolerance"] is True
    assert summary["max_abs_dp"] == max(summary["max_abs_dp_by_item"].values())
    # ... while the same shift of one token alone does move the output (the measure can see a change)
    base = lm.signal(PROMPTS[0]["prompt"])
    times = base.times.clone()
    times[2] += 0.5
    probs = Engine(lm).probs([base, base.with_times(times)])
    assert float((probs[1] - probs[0]).abs().max()) > 10 * TOLERANCE


def test_translation_moves_a_learned_position_table_and_says_so(data: Path) -> None:
    lm = ContinuousLM(tiny_model64("gpt2"), tokenizer())
    config = TRANSLATION.config({"data": str(data), "range": "0,3", "samples": "7"})
    TRANSLATION.check(lm, config)
    result = run_experiment(lm, "translation", config)
    summary = summarize(result)
    assert summary["positions"] == "learned"
    assert summary["max_abs_dp"] > 100 * TOLERANCE and summary["within_tolerance"] is False
    t = result.tracks[0]
    assert t.max_dp[0] == 0 and t.reference == 0.0
    # at tau = 1 the table is read at whole rows: the same as running the prompt one position later by hand
    moved = Engine(lm).probs([lm.signal(PROMPTS[0]["prompt"]).with_times(torch.arange(1.0, 11.0, dtype=torch.float64))])
    one = list(t.x).index(1.0)
    assert np.allclose(t.probs[one], moved[0].double()[t.token_ids].numpy(), atol=1e-6, rtol=0)


def test_a_learned_table_read_outside_its_rows_is_refused_before_the_run(data: Path) -> None:
    lm = ContinuousLM(tiny_model("gpt2"), tokenizer())  # 64 rows; the prompts end at time 9
    with pytest.raises(ExperimentError, match="beyond the 64 rows of the position table"):
        TRANSLATION.check(lm, TRANSLATION.config({"data": str(data), "range": "0,60"}))
    with pytest.raises(ExperimentError, match="before the position table's first row"):
        TRANSLATION.check(lm, TRANSLATION.config({"data": str(data), "range": "-1,1"}))
    with pytest.raises(ExperimentError, match="beyond the 64 rows"):
        SCALING.check(lm, SCALING.config({"data": str(data), "range": "0.5,8"}))
    SCALING.check(lm, SCALING.config({"data": str(data), "range": "0.5,6"}))


def test_scaling_at_s_1_is_the_stock_model_and_small_s_moves_the_output(data: Path) -> None:
    lm = ContinuousLM(tiny_model64("llama"), tokenizer())
    result = run_experiment(lm, "scaling", SCALING.config({"data": str(data), "range": "0.01,1.5", "samples": "4"}))
    for t, row in zip(result.tracks, PROMPTS):
        assert len(t.x) == 5 and 1.0 in t.x  # four values and the stock s = 1
        ref = list(t.x).index(1.0)
        stock = torch.softmax(lm.model(torch.tensor([lm.signal(row["prompt"]).token_ids.tolist()])).logits[0, -1], -1)
        assert np.allclose(t.probs[ref], stock.double()[t.token_ids].detach().numpy(), atol=1e-6, rtol=0)
        assert t.tv[ref] == 0 and t.tv[0] > 1e-3
    summary = summarize(result)
    assert summary["smallest_s"] == 0.01
    assert summary["mean_tv_at_smallest_s"] == pytest.approx(np.mean([t.tv[0] for t in result.tracks]))
    assert 0.01 <= summary["mean_lowest_s_keeping_argmax"] <= 1.0


def test_a_translation_run_writes_its_files_and_compares(data: Path, tmp_path: Path) -> None:
    from contllm.plotting import plt
    from contllm.rundir.runner import run

    lm = ContinuousLM(tiny_model("llama"), tokenizer())
    out = run("translation", options={"data": str(data), "samples": "3", "range": "0,2"}, lm=lm, model="tiny-llama",
              out=tmp_path / "run", item_figures=False)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 2 and summary["max_abs_dp"] <= TOLERANCE
    assert (out / "figures" / "summary.png").is_file() and (out / "values.csv").is_file()
    result = TRANSLATION.load_result(json.loads((out / "results.json").read_text()))
    fig = TRANSLATION.comparison([("a", result), ("b", result)])
    assert fig.axes[0].get_yscale() == "log" and fig.axes[0].get_xlabel() == "time shift tau"
    plt.close(fig)
