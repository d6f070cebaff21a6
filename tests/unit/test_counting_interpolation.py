"""The counting interpolation (words moved into another word inside a counting question) on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.core.engine import Engine
from contllm.core.signal import Signal
from contllm.experiments.counting_interpolation import EXPERIMENT, CountingInterpolationConfig, plan_item
from tests.unit.tiny import tiny_model, word_level_tokenizer

pytestmark = pytest.mark.unit

WORDS = ["Question", ":", "In", "the", "sentence", '"', ",", "how", "many", "times", "is", "a", "an", "fruit", "animal",
         "flower", "mentioned", "?", "Reply", "with", "single", "-", "digit", "number", "Answer", "apple", "cash",
         "pear", "cat", "rock", "rose", "plane", *[str(k) for k in range(10)]]


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = ["<unk>", *dict.fromkeys(WORDS)]
    return word_level_tokenizer(vocab)


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"), word_tokenizer())


def test_registered_with_the_papers_pairs_and_question() -> None:
    assert registry.get("counting-interpolation") is EXPERIMENT
    items = EXPERIMENT.items(EXPERIMENT.config())
    assert [i.id for i in items] == ["apple-cash", "cat-rock", "rose-plane", "apple-pear"]
    assert [i.counts for i in items] == [(4, 1), (4, 1), (4, 1), (4, 4)]
    assert [i.counts for i in EXPERIMENT.items(EXPERIMENT.config({"n": "5", "moved": "2"}))][:1] == [(5, 3)]
    for bad, message in (({"n": "1"}, "n must be from 2 to 9"), ({"moved": "5"}, "moved must be from 1 to n = 4"),
                         ({"template": "{word}"}, "the template has no {words} field")):
        with pytest.raises(ExperimentError, match=message):
            EXPERIMENT.config(bad)


def test_the_ends_are_the_papers_two_sentences_and_alpha_0_is_the_first(lm: ContinuousLM) -> None:
    config = CountingInterpolationConfig(samples=3)
    plan = plan_item(lm, EXPERIMENT.items(config)[0], config)
    question = ('Question: In the sentence "{}", how many times is a fruit mentioned? Reply with a single-digit number'
                "\nAnswer: ")
    assert plan.meta["prompt"] == question.format("apple apple apple apple")
    assert plan.meta["prompt_second"] == question.format("apple cash cash cash")
    assert plan.meta["edited_tokens"] == ["apple"] * 3 and plan.meta["edited_tokens_second"] == ["cash"] * 3
    engine = Engine(lm)
    direct = engine.probs([Signal.from_text(lm.tokenizer, plan.meta["prompt"])])
    ends = engine.probs([plan.signals[0], plan.signals[-1]])
    assert torch_close(ends[0], direct[0])
    assert not torch_close(ends[1], direct[0])


def torch_close(a: object, b: object) -> bool:
    return bool(np.allclose(np.asarray(a), np.asarray(b), atol=1e-5))


def test_a_run_writes_summary_with_its_metrics_and_the_figure(lm: ContinuousLM, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = run("counting-interpolation", options={"samples": "3"}, lm=lm, model="tiny-llama", items="2",
              out=tmp_path / "run")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 2 and set(summary["metrics"]) == {m.name for m in EXPERIMENT.metrics}
    assert 0 <= summary["accuracy_at_alpha_0"] <= 1 and -1 <= summary["mean_spearman_implied_vs_alpha"] <= 1
    assert 0 < summary["mean_other_tokens"] <= 1
    assert (out / "figures" / "summary.png").is_file() and (out / "figures" / "items" / "apple-cash.png").is_file()
