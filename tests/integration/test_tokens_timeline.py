"""tokens, scaling and translation on the embedded models: invariance under translation, endpoints, runs and reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from contllm import ContinuousLM
from contllm.core.engine import Engine
from contllm.experiments import run_experiment, summarize
from contllm.experiments.timeline import TOLERANCE, TRANSLATION
from contllm.experiments.tokens import EXPERIMENT as TOKENS
from contllm.experiments.tokens import TokensConfig
from contllm.experiments.tracking import PromptItem

pytestmark = pytest.mark.integration


def test_translation_is_invariant_on_both_models(real_lm: ContinuousLM) -> None:
    """Every time shifted by tau in 0..10 (steps of 0.5): no probability moves by more than 1e-4 from tau = 0."""
    config = TRANSLATION.config({"range": "0,10", "samples": "21"})
    result = run_experiment(real_lm, "translation", config, items="3")
    summary = summarize(result)
    assert summary["positions"] == "rotary" and summary["tau_max"] == 10.0
    assert all(len(t.x) == 21 and t.max_dp[0] == 0 for t in result.tracks)
    assert summary["max_abs_dp"] <= TOLERANCE, summary["max_abs_dp_by_item"]


def test_interpolation_ends_are_the_plain_prompts_for_words_of_unequal_token_counts(smollm: ContinuousLM) -> None:
    item = PromptItem("nz", "The capital of France is", "France", "New Zealand")
    sweep = TOKENS.sweep(smollm, item, TokensConfig(samples=3))
    assert sweep.meta["tokens"] == 1 and sweep.meta["tokens_to"] == 2
    engine = Engine(smollm)
    got = engine.probs(sweep.signals)
    plain = engine.probs([smollm.signal(item.prompt), smollm.signal("The capital of New Zealand is")])
    assert float((got[0] - plain[0]).abs().max()) <= 1e-5
    assert float((got[-1] - plain[1]).abs().max()) <= 1e-5
    assert float((got[1] - got[0]).abs().max()) > 1e-3


def test_runs_of_each_on_both_models_compare_in_a_report(smollm: ContinuousLM, gemma: ContinuousLM, tmp_path: Path) -> None:
    from contllm.rundir.report import write_report
    from contllm.rundir.runner import run

    settings = {
        "tokens": {"samples": "3", "factors": "0.5,1.5"},
        "scaling": {"samples": "3", "range": "0.1,1"},
        "translation": {"samples": "3", "range": "0,4"},
    }
    for name, options in settings.items():
        runs = [run(name, options=options, lm=lm, model=model, items="capital-france",
                    out=tmp_path / f"{name}-{model}", item_figures=False)
                for lm, model in ((smollm, "smollm2-135m"), (gemma, "gemma3-270m"))]
        paths = write_report(runs, tmp_path / f"report-{name}")
        assert {p.name for p in paths} == {"summary.md", "summary.csv", "comparison.png", "comparison.pdf", "explorer.html"}
        table = (tmp_path / f"report-{name}" / "summary.csv").read_text().splitlines()
        assert len(table) == 3 and "mean_tracked_tokens" in table[0]
        for path in runs:
            result = json.loads((path / "results.json").read_text())
            for t in result["tracks"]:  # every tracked token is above the threshold somewhere, labelled by its text
                probs = np.asarray(t["probs"])
                assert probs.shape == (len(t["x"]), len(t["labels"])) and (probs.max(axis=0) > 0.05).all()
                assert all(isinstance(label, str) for label in t["labels"])
    france = json.loads((tmp_path / "tokens-smollm2-135m" / "results.json").read_text())["tracks"][0]
    plain = smollm.probs(smollm.signal("The capital of France is"))
    assert france["item_id"] == "capital-france" and france["top_ids"][0] == int(torch.argmax(plain))
