"""The tokens experiment on a tiny random Llama with a word-level tokenizer: tracking, endpoints, options, runs."""

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
from contllm.experiments import run_experiment, summarize
from contllm.experiments.tokens import EXPERIMENT, TokensConfig
from contllm.experiments.tracking import Track, TrackResult, load_items, track
from tests.unit.tiny import VOCAB, tiny_model, tiny_model64, word_level_tokenizer

pytestmark = pytest.mark.unit

#: Interpolations between words of one and two tokens, and a scaled span.
ROWS = [
    {"id": "city", "prompt": "the capital of France is", "span": "France", "to": "New York"},
    {"id": "back", "prompt": "the capital of New York is", "span": "New York", "to": "Spain"},
    {"id": "slow", "prompt": "she was very very tired so she went", "span": "very very"},
]
OPTIONS = {"range": "0,1", "samples": "5", "factors": "0,1.5", "threshold": "0.05"}


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = ["<unk>"] + list(dict.fromkeys(words))
    assert len(vocab) <= VOCAB
    return word_level_tokenizer(vocab)


def tokenizer() -> PreTrainedTokenizerFast:
    text = " ".join(r["prompt"] + " " + r.get("to", "") for r in ROWS)
    return word_tokenizer(text.split() + [f"w{k}" for k in range(40)])


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "items.json"
    path.write_text(json.dumps({"items": ROWS}))
    return path


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"), tokenizer())


@pytest.fixture(scope="module")
def lm64() -> ContinuousLM:
    return ContinuousLM(tiny_model64("llama"), tokenizer())


@pytest.fixture(scope="module")
def full_run(lm: ContinuousLM, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from contllm.rundir.runner import run

    return run("tokens", options={**OPTIONS, "data": str(data)}, lm=lm, model="tiny-llama",
               out=tmp_path_factory.mktemp("tokens") / "run")


def test_the_experiment_is_registered_with_its_options_and_built_in_items() -> None:
    assert registry.get("tokens") is EXPERIMENT and EXPERIMENT.engine and EXPERIMENT.shardable
    assert [o.cli_flag for o in EXPERIMENT.options] == ["--range", "--factors", "--samples", "--threshold", "--method",
                                                        "--data"]
    items = EXPERIMENT.items(EXPERIMENT.config())
    assert 10 <= len(items) <= 20 and len({i.id for i in items}) == len(items)
    assert {i.edit for i in items} == {"interpolate", "scale"}
    for item in items:  # every built-in edit names whole words of its prompt
        a, b = item.span_at()
        assert item.prompt[a:b] == item.span


def test_tracking_keeps_exactly_the_tokens_above_the_threshold_and_the_distances() -> None:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(6, 50, generator=g), dim=-1)
    x = np.linspace(0, 1, 6)
    labels = [f"t{i}" for i in range(50)]
    t = track("a", "alpha", x, probs, labels, threshold=0.1, reference=0.0)
    peak = probs.max(dim=0).values
    assert set(t.token_ids) == set(torch.nonzero(peak > 0.1).flatten().tolist())
    assert list(peak[t.token_ids]) == sorted(peak[t.token_ids].tolist(), reverse=True)
    assert t.labels == [labels[i] for i in t.token_ids]
    assert np.array_equal(t.probs, probs.double()[:, t.token_ids].numpy())
    assert t.top_ids == probs.argmax(dim=1).tolist()
    diff = (probs.double() - probs.double()[0]).abs()
    assert np.allclose(t.tv, 0.5 * diff.sum(dim=1).numpy(), atol=0) and t.tv[0] == 0
    assert np.allclose(t.max_dp, diff.max(dim=1).values.numpy(), atol=0)
    steps = 0.5 * (probs.double()[1:] - probs.double()[:-1]).abs().sum(dim=1)
    assert np.allclose(t.step_tv, steps.numpy(), atol=0)
    again = Track.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again.to_dict() == t.to_dict()
    assert track("a", "alpha", x, probs, labels, threshold=0.1, reference=0.5).tv is None  # not on the sweep


def test_interpolation_ends_are_the_two_plain_prompts_for_unequal_token_counts(lm64: ContinuousLM, data: Path) -> None:
    config = TokensConfig(samples=3, data=str(data))
    items = {i.id: i for i in load_items(str(data), edits=True)}
    for item_id, other in (("city", "the capital of New York is"), ("back", "the capital of Spain is")):
        sweep = EXPERIMENT.sweep(lm64, items[item_id], config)
        assert sweep.knob == "alpha" and list(sweep.x) == [0.0, 0.5, 1.0]
        assert sweep.meta["tokens"] != sweep.meta["tokens_to"]
        engine = Engine(lm64)
        got = engine.probs(sweep.signals)
        plain = engine.probs([lm64.signal(items[item_id].prompt), lm64.signal(other)])
        assert torch.allclose(got[0], plain[0], atol=1e-5, rtol=0)
        assert torch.allclose(got[-1], plain[1], atol=1e-5, rtol=0)
        assert (got[1] - got[0]).abs().max() > 1e-3  # the middle is neither end


def test_a_run_tracks_what_the_full_distributions_say(lm: ContinuousLM, data: Path) -> None:
    config = EXPERIMENT.config({**OPTIONS, "data": str(data)})
    result = run_experiment(lm, "tokens", config)
    assert [t.item_id for t in result.tracks] == ["city", "back", "slow"]
    engine = Engine(lm)
    for item in load_items(str(data), edits=True):
        t = result.track(item.id)
        full = engine.probs(EXPERIMENT.sweep(lm, item, config).signals).double()
        expected = torch.nonzero(full.max(dim=0).values > 0.05).flatten().tolist()
        assert sorted(t.token_ids) == expected and len(expected) > 0
        # the model's vocabulary is larger than this tokenizer's: the ids beyond it are named by number
        assert t.labels == [lm.tokenizer.decode([i]) if i < len(lm.tokenizer) else f"<id {i}>" for i in t.token_ids]
        assert np.array_equal(t.probs, full[:, t.token_ids].numpy())
    slow = result.track("slow")
    assert slow.knob == "factor" and 1.0 in slow.x and slow.reference == 1.0 and len(slow.x) == 6
    plain = engine.probs([lm.signal(ROWS[2]["prompt"])])[0].double()
    assert np.allclose(slow.probs[list(slow.x).index(1.0)], plain[slow.token_ids].numpy(), atol=1e-5, rtol=0)
    summary = summarize(result)
    assert summary["interpolate_items"] == 2 and summary["scale_items"] == 1
    assert summary["mean_tracked_tokens"] == pytest.approx(np.mean([len(t.token_ids) for t in result.tracks]))
    assert summary["share_argmax_changes"] == pytest.approx(np.mean([len(set(t.top_ids)) > 1 for t in result.tracks]))


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"id": "a", "prompt": "the capital of France is", "span": "Paris"}, "row 1, field 'span': does not occur"),
        ({"id": "a", "prompt": "the capital of France is", "span": "Fran"}, "row 1, field 'span': does not occur"),
        ({"id": "a", "prompt": "the capital of France is"}, "row 1, field 'span': missing"),
        ({"id": "a", "prompt": "the capital of France is", "span": "France", "to": "France"}, "field 'to': equals the span"),
        ({"id": "a", "span": "France"}, "row 1, field 'prompt': missing"),
    ],
)
def test_a_malformed_data_row_names_file_row_and_field(row: dict[str, str], needle: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([row]))
    with pytest.raises(ExperimentError, match=None) as err:
        EXPERIMENT.items(EXPERIMENT.config({"data": str(path)}))
    assert str(path) in str(err.value) and needle in str(err.value)


def test_an_edit_the_tokenizer_cannot_build_is_refused_before_anything_is_written(lm: ContinuousLM, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    # "-Spain" glues its dash to the one before the span: the two prompts then differ outside the span.
    path = tmp_path / "glued.csv"
    path.write_text("id,prompt,span,to\nglued,the capital of-France is,France,-Spain\n")
    out = tmp_path / "run"
    with pytest.raises(ExperimentError, match="item glued: "):
        run("tokens", options={"data": str(path), "samples": "3"}, lm=lm, model="tiny-llama", out=out)
    assert not (out / "items").exists() or not any((out / "items").iterdir())


def test_a_run_writes_tracks_tables_summary_and_figures(full_run: Path) -> None:
    result = TrackResult.from_dict(json.loads((full_run / "results.json").read_text()))
    assert [t.item_id for t in result.tracks] == ["city", "back", "slow"]
    assert (full_run / "results.csv").read_text().startswith("item,knob,x,token_id,token,probability")
    values = (full_run / "values.csv").read_text().splitlines()
    assert values[0] == "item,knob,x,top_id,top_token,top_probability,tv_from_reference,max_abs_dp"
    assert len(values) == 1 + 5 + 5 + 6
    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["items"] == 3 and summary["threshold"] == 0.05
    for name in ("summary", "items/city", "items/back", "items/slow"):
        assert (full_run / "figures" / f"{name}.png").is_file()


def test_resume_recomputes_only_the_lost_item_bitwise(lm: ContinuousLM, data: Path, full_run: Path, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    kept = (out / "items" / "city.json").stat().st_mtime_ns
    (out / "items" / "back.json").unlink()
    run("tokens", options={**OPTIONS, "data": str(data)}, lm=lm, model="tiny-llama", out=out, resume=True,
        item_figures=False)
    assert (out / "items" / "city.json").stat().st_mtime_ns == kept
    assert (out / "items" / "back.json").read_bytes() == (full_run / "items" / "back.json").read_bytes()
    assert (out / "results.json").read_bytes() == (full_run / "results.json").read_bytes()


def test_the_comparison_and_report_columns(full_run: Path) -> None:
    from contllm.plotting import plt

    result = EXPERIMENT.load_result(json.loads((full_run / "results.json").read_text()))
    fig = EXPERIMENT.comparison([("a", result), ("b", result)])
    assert [ax.get_xlabel() for ax in fig.axes] == ["interpolation alpha", "duration factor of the span"]
    assert all(len(ax.get_lines()) == 2 for ax in fig.axes)
    plt.close(fig)
    assert EXPERIMENT.report_columns(result) == {"alpha_min": 0.0, "alpha_max": 1.0, "alpha_samples": 5,
                                                 "factor_min": 0.0, "factor_max": 1.5, "factor_samples": 6}


def test_resume_with_a_changed_data_file_is_refused_in_one_line(lm: ContinuousLM, data: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from contllm.cli.commands import app
    from contllm.data.user import file_sha256
    from contllm.rundir.runner import run

    path = tmp_path / "items.json"
    shutil.copy(data, path)
    out = tmp_path / "run"
    run("tokens", options={**OPTIONS, "data": str(path)}, lm=lm, model="tiny-llama", out=out, items="1",
        item_figures=False)
    options = json.loads((out / "config.json").read_text())["options"]
    assert options["data"] == str(path) and options["data_sha256"] == file_sha256(path)
    path.write_text(json.dumps({"items": ROWS[::-1]}))  # the same path, other contents
    flags = [f"--{k}={v}" for k, v in OPTIONS.items()]
    result = CliRunner().invoke(app, ["run", "tokens", *flags, "--data", str(path), "--model", "tiny-llama",
                                      "--items", "1", "--out", str(out), "--resume"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot resume") and "options" in lines[0], result.output
