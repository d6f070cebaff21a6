"""Experiments that borrow a dataset's prompts (circuit, attribution) on the embedded SmolLM2: every dataset's plain
prompt names the tokens its own experiment scales, and a circuit run on the sums problems locates the change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contllm import ContinuousLM, registry
from contllm.experiments.datasets import DATASETS
from contllm.rundir.runner import run

pytestmark = [pytest.mark.integration]


@pytest.mark.parametrize("dataset", DATASETS)
def test_the_plain_prompt_is_the_datasets_own_sweep_at_factor_one(smollm: ContinuousLM, dataset: str) -> None:
    config = registry.get("circuit").config({"dataset": dataset, "first": 1})
    item = config.first_items(1)[0]
    own = registry.get(dataset)
    plain = own.plan_item(smollm, item, config.dataset_config())
    swept = own.plan_item(smollm, item, own.config({}))
    assert len(plain.signals) == 1 and plain.edited and plain.edited == swept.edited
    assert plain.signals[0].token_ids.tolist() == swept.signals[0].token_ids.tolist()
    assert plain.signals[0].durations.tolist() == [1.0] * len(plain.signals[0])
    assert 1.0 in swept.x  # the plain prompt is a point of the dataset's own sweep
    if dataset == "sums":
        scaled = "".join(smollm.tokenizer.decode([int(plain.signals[0].token_ids[k])]) for k in plain.edited)
        assert str(item.numbers[0]) in scaled and plain.truth == str(item.truth)[0]


def test_a_circuit_run_on_the_sums_problems(smollm: ContinuousLM, tmp_path: Path) -> None:
    out = run(
        "circuit",
        options={"dataset": "sums", "first": "1", "top": "2"},
        lm=smollm,
        model="smollm2-135m",
        out=tmp_path / "run",
    )
    (record,) = json.loads((out / "results.json").read_text(encoding="utf-8"))["items"]
    assert record["item_id"].startswith("sum-") and len(record["top"]) == 2
    assert record["plain"] != record["short"]  # shortening the first number moves the expected first digit
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["items"] == 1 and summary["mean_change"] == pytest.approx(record["plain"] - record["short"])
