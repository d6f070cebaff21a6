"""The linearity experiment (read-outs against the chord between a path's ends) on a tiny model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.core.engine import Engine
from contllm.experiments.linearity import (
    EXPERIMENT,
    PROMPT_PAIRS,
    LinearityConfig,
    LinearityResult,
    baseline_seed,
    baseline_signals,
    centred_logits,
    chord_measures,
    linearity_items,
    real_path,
    run_path,
)
from tests.unit.tiny import tiny_model, word_level_tokenizer

pytestmark = pytest.mark.unit

#: The Boolean prompt, yes/no, the words of the first built-in word pairs and of the prompt pairs; the rest is <unk>.
WORDS = ["What", "is", "the", "truth", "value", "of", "?", "Answer", ":", "0", "1", "false", "true", "AND", "OR",
         "XOR", "NAND", "NOR", "XNOR", "IMPLIES", "Yes", "No", "Question", "Are", "Do", "apples", "bananas", "birds",
         "dogs", "cows", "chickens", "fruit", "plants", "give", "milk"]
WORDS += [w for _, a, b in PROMPT_PAIRS for w in (a + " " + b).split()]


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = ["<unk>", *dict.fromkeys(WORDS)]
    assert len(vocab) <= 97
    return word_level_tokenizer(vocab)


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"), word_tokenizer())


def test_registered_with_its_options_and_items_from_three_sources() -> None:
    assert registry.get("linearity") is EXPERIMENT and EXPERIMENT.engine and EXPERIMENT.shardable
    assert [o.cli_flag for o in EXPERIMENT.options] == ["--samples", "--method", "--per-source", "--sources", "--top"]
    items = linearity_items(LinearityConfig())
    assert [i.source for i in items] == ["interpolation"] * 6 + ["boolean"] * 6 + ["prompt"] * 6
    assert [i.place for i in items] == list(range(18)) and len({i.id for i in items}) == 18
    assert items[0].id == "word-apples-bananas-fruit" and items[6].id == "bool-AND-OR-00" and items[12].id == "prompt-capital"
    # the default word items cycle through the four question groups over different pairs
    assert len({i.ref.group for i in items[:6]}) == 4 and len({i.ref.pair for i in items[:6]}) == 6
    everything = linearity_items(LinearityConfig(per_source=0))
    assert len(everything) == 176 + 84 + len(PROMPT_PAIRS)
    assert [i.source for i in linearity_items(LinearityConfig(sources=("prompt",), per_source=2))] == ["prompt"] * 2


def test_a_straight_read_out_lies_on_its_chord_and_a_bent_one_does_not() -> None:
    x = np.linspace(0, 1, 5)
    straight = np.stack([0.2 + 0.6 * x, 0.7 - 0.6 * x], axis=1)
    m = chord_measures(x, straight)
    assert m["max_deviation"] == pytest.approx(0, abs=1e-12) and m["r2"] == pytest.approx(1.0)
    bent = straight.copy()
    bent[2] += [0.1, -0.1]
    m = chord_measures(x, bent)
    assert m["max_deviation"] == pytest.approx(0.1) and m["mean_deviation"] == pytest.approx(0.1 / 3)
    assert m["r2"] < 1
    # centred logits ignore a common factor per row (the softmax's normaliser)
    assert np.allclose(centred_logits(bent * np.array([[1.0], [2.0], [0.5], [3.0], [1.0]])), centred_logits(bent))
    assert np.isnan(chord_measures(x, np.full((5, 2), 0.5))["r2"])  # a flat read-out has no R²


def test_the_baseline_leaves_the_start_along_a_seeded_random_direction_of_the_same_length(lm: ContinuousLM) -> None:
    config = LinearityConfig(samples=5)
    item = next(i for i in linearity_items(config) if i.source == "prompt")
    real, sets, meta = real_path(lm, item, config)
    assert sets is None and meta["tokens_first"] == len(PROMPT_PAIRS[0][1].split())
    alphas = config.alphas()
    base, norm = baseline_signals(real, alphas, "linear", torch.Generator().manual_seed(baseline_seed(0, item.place)))
    assert torch.equal(base[0].embeds, real[0].embeds)
    diff_real = real[-1].embeds - real[0].embeds
    diff_base = base[-1].embeds - base[0].embeds
    assert torch.allclose(diff_base.norm(dim=-1), diff_real.norm(dim=-1), rtol=1e-5)
    assert norm == pytest.approx(float(diff_real.norm()), rel=1e-6)
    cos = torch.nn.functional.cosine_similarity(diff_base, diff_real, dim=-1)
    assert cos.abs().max() < 0.9  # not the real direction
    for b, r in zip(base, real):
        assert torch.equal(b.durations, r.durations) and torch.equal(b.times, r.times)
    again, _ = baseline_signals(real, alphas, "linear", torch.Generator().manual_seed(baseline_seed(0, item.place)))
    assert torch.equal(again[-1].embeds, base[-1].embeds)
    other, _ = baseline_signals(real, alphas, "linear", torch.Generator().manual_seed(baseline_seed(0, item.place + 1)))
    assert not torch.equal(other[-1].embeds, base[-1].embeds)
    assert baseline_seed(1, item.place) != baseline_seed(0, item.place)


def test_each_item_is_one_engine_call_holding_both_paths(lm: ContinuousLM) -> None:
    config = LinearityConfig(samples=3)
    engine = Engine(lm)
    calls: list[int] = []

    def evaluate(signals: list) -> torch.Tensor:
        calls.append(len(signals))
        return engine.probs(signals)

    items = [next(i for i in linearity_items(config) if i.source == s) for s in ("interpolation", "boolean", "prompt")]
    paths = [run_path(lm, item, config, evaluate, seed=0) for item in items]
    assert calls == [6, 6, 6]
    assert paths[0].labels == ["yes", "no"] and paths[1].labels == ["0", "1", "false", "true"]
    assert 5 <= len(paths[2].labels) <= 10 and paths[2].meta["token_ids"]
    for p in paths:
        assert np.allclose(p.real[0], p.baseline[0])  # both paths start at A
        assert not np.allclose(p.real[-1], p.baseline[-1])
        # the real path's ends are the plain prompts' read-outs
        assert p.real.shape == p.baseline.shape == (3, len(p.labels))


OPTIONS = {"samples": "3", "per_source": "1"}


@pytest.fixture(scope="module")
def full_run(lm: ContinuousLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from contllm.rundir.runner import run

    return run("linearity", options=OPTIONS, lm=lm, model="tiny-llama", out=tmp_path_factory.mktemp("lin") / "run")


def test_a_run_writes_paths_tables_summary_and_figures(full_run: Path) -> None:
    result = LinearityResult.from_dict(json.loads((full_run / "results.json").read_text()))
    assert [p.source for p in result.paths] == ["interpolation", "boolean", "prompt"]
    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["items"] == 3 and summary["all_items"] == 3 and summary["prompt_items"] == 1
    for key in ("all_mean_max_deviation", "all_mean_max_deviation_baseline", "boolean_mean_mean_logit_deviation"):
        assert np.isfinite(summary[key])
    declared = registry.get("linearity").metrics
    assert set(summary["metrics"]) == {m.name for m in declared} and all(np.isfinite(summary[m.name]) for m in declared)
    assert (full_run / "results.csv").read_text().startswith("item,source,path,alpha,label,probability")
    assert len((full_run / "items.csv").read_text().splitlines()) == 4
    for p in result.paths:
        assert (full_run / "figures" / "items" / f"{p.item_id}.png").is_file()
    assert (full_run / "figures" / "summary.png").is_file()


def test_resume_recomputes_the_lost_path_bit_for_bit_and_another_seed_moves_only_the_baseline(
        lm: ContinuousLM, full_run: Path, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    lost = out / "items" / "prompt-capital.json"
    before = json.loads(lost.read_text())["record"]
    lost.unlink()
    run("linearity", options=OPTIONS, lm=lm, model="tiny-llama", out=out, resume=True)
    after = json.loads(lost.read_text())["record"]
    assert after["baseline"] == before["baseline"] and after["real"] == before["real"]
    seeded = run("linearity", options=OPTIONS, lm=lm, model="tiny-llama", out=tmp_path / "seed1", seed=1, item_figures=False)
    other = json.loads((seeded / "items" / "prompt-capital.json").read_text())["record"]
    assert np.allclose(other["real"], before["real"], atol=1e-6)
    assert not np.allclose(other["baseline"][-1], before["baseline"][-1], atol=1e-4)


def test_the_comparison_draws_runs_side_by_side(full_run: Path) -> None:
    from contllm.plotting import plt

    result = EXPERIMENT.load_result(json.loads((full_run / "results.json").read_text()))
    fig = EXPERIMENT.comparison([("a", result), ("b", result)])
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["mean of max |p(alpha) - chord|", "mean R² of the chord fit"]
    assert len(fig.axes[0].patches) == 4 * 2 * 2  # all + three sources, real and baseline, two runs
    plt.close(fig)
    with pytest.raises(ExperimentError, match="malformed linearity record"):
        EXPERIMENT.decode({**json.loads((full_run / "items" / "prompt-capital.json").read_text())["record"], "alphas": [0.0]})
