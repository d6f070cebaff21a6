"""Duration attribution on the embedded SmolLM2: completeness on a counting prompt, and one run of the experiment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contllm import ContinuousLM, registry
from contllm.attribution import attribute

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def counting_item(smollm: ContinuousLM) -> tuple:
    experiment = registry.get("attribution")
    config = experiment.config({"dataset": "counting", "tokens": "item"})
    return experiment.plan(smollm, experiment.items(config)[0], config)


def test_completeness_on_the_item_line_of_a_counting_prompt(smollm: ContinuousLM, counting_item: tuple) -> None:
    signal, span, tokens, readout, _ = counting_item
    assert len(tokens) == 6 and set(span) <= set(tokens)
    # A floor baseline (the line at half its durations): within 1e-3 relative at 64 steps.
    half = attribute(smollm, signal, readout, tokens, steps=64, floor=0.5)
    assert half.completeness_error <= 1e-3, half.completeness_error
    # The deletion baseline: within 1e-3 relative at 64 gradient steps too (README: error against steps).
    deleted = attribute(smollm, signal, readout, tokens, steps=64)
    assert abs(deleted.remainder) <= 1e-4 and deleted.meta["window_crossings"] == 0
    assert deleted.meta["gradients"] <= 64 and deleted.meta["rule"] == "placed"
    assert deleted.completeness_error <= 1e-3, deleted.completeness_error


def test_a_run_scores_the_counted_words(smollm: ContinuousLM, tmp_path: Path) -> None:
    from contllm.runner import run

    out = run("attribution", options={"steps": "32", "floor": "0.5", "first": "1"}, lm=smollm,
              model="smollm2-135m", out=tmp_path / "run")
    (record,) = json.loads((out / "results.json").read_text())["items"]
    pieces = [record["text"][a:b].strip() for a, b in (record["offsets"][j] for j in record["span"])]
    assert pieces == ["apple"] * 2  # count-001 repeats "apple" twice; spans come from character offsets
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 1 and summary["max_completeness_error"] <= 1e-3
    assert (out / "figures" / "items" / "count-001.html").is_file()
