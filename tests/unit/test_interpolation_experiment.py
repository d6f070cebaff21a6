"""The interpolation experiment (a word moved into another inside a yes/no question) on a tiny model: data, endpoints, summary, runner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.core.engine import Engine
from contllm.core.signal import Signal
from contllm.errors import ContllmError
from contllm.experiments.sweeps import ExperimentResult, Sweep
from contllm.experiments.word_interpolation import (
    EXPERIMENT,
    GROUPS,
    InterpolationConfig,
    WordItem,
    check_item,
    crossing,
    ends,
    load_items,
    plan_item,
    summarize_sweeps,
    yes_no,
)
from tests.unit.tiny import tiny_model, tiny_model64, word_level_tokenizer

pytestmark = pytest.mark.unit

TEMPLATE = "Q: Are cows animals?\nA: Yes\nQ: {question}\nA:"
WORDS = ["Q", "A", ":", "?", "Are", "Do", "cows", "animals", "Yes", "No", "yes", "no", "cats", "sea", "lions",
         "dogs", "bark", "swim", "have", "fur", "fly", "can", "Can", "red", "yellow"]

#: A file of the paper's shape (both groups as an object, and a bare list) and one of the own schema.
PAPER_ROWS = [
    {"options": ["cats", "sea lions"], "questions": {"both": ["Are {} animals?"], "neither": ["Can {} fly?"],
                                                    "first": ["Do {} have fur?"], "second": ["Can {} swim?"]}},
    {"options": ["dogs", "cats"], "questions": ["Do {} bark?", "Are {} red?"]},
]
OWN_CSV = (
    "first,second,question,group,answer_first,answer_second,id\n"
    "cats,dogs,Do {} bark?,second,,,\n"
    "dogs,cats,Do {} bark?,,true,false,bark-back\n"
    "cats,sea lions,Are {} yellow?,,,,\n"
)


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level: one token per word ("sea lions" is two), anything else <unk>."""
    vocab = ["<unk>", *dict.fromkeys(WORDS)]
    return word_level_tokenizer(vocab)


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"), word_tokenizer())


@pytest.fixture(scope="module")
def lm64() -> ContinuousLM:
    return ContinuousLM(tiny_model64("llama"), word_tokenizer())


@pytest.fixture(scope="module")
def paper_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "questions.json"
    path.write_text(json.dumps(PAPER_ROWS))
    return path


def test_registered_with_its_options_and_a_built_in_dataset_of_22_pairs_by_8_questions() -> None:
    assert registry.get("interpolation") is EXPERIMENT and EXPERIMENT.engine and EXPERIMENT.shardable
    assert [o.cli_flag for o in EXPERIMENT.options] == ["--range", "--samples", "--template", "--chat/--no-chat",
                                                        "--method", "--pairs", "--data", "--protocol"]
    items = EXPERIMENT.items(EXPERIMENT.config())
    pairs: dict[str, list[WordItem]] = {}
    for item in items:
        pairs.setdefault(item.pair, []).append(item)
    assert len(pairs) >= 20 and all(len(qs) >= 8 for qs in pairs.values())
    assert all({q.group for q in qs} == set(GROUPS) for qs in pairs.values())
    ids = [item.id for item in items]
    assert len(set(ids)) == len(ids) and "apples-bananas-yellow" in ids
    yellow = items[ids.index("apples-bananas-yellow")]
    assert (yellow.group, yellow.answers) == ("second", (False, True))
    chosen = EXPERIMENT.items(EXPERIMENT.config({"pairs": "cats-goldfish,apples-bananas"}))
    assert {i.pair for i in chosen} == {"apples-bananas", "cats-goldfish"} and len(chosen) == 16


def test_both_data_shapes_are_read_with_groups_answers_and_readable_ids(paper_file: Path, tmp_path: Path) -> None:
    paper = load_items(str(paper_file))
    assert [(i.id, i.group) for i in paper] == [
        ("cats-sea-lions-animals", "both"), ("cats-sea-lions-fly", "neither"), ("cats-sea-lions-fur", "first"),
        ("cats-sea-lions-swim", "second"), ("dogs-cats-bark", None), ("dogs-cats-red", None)]
    assert paper[2].answers == (True, False) and paper[4].answers is None
    own = tmp_path / "own.csv"
    own.write_text(OWN_CSV)
    items = load_items(str(own))
    assert [(i.id, i.first, i.second, i.group) for i in items] == [
        ("cats-dogs-bark", "cats", "dogs", "second"), ("bark-back", "dogs", "cats", "first"),
        ("cats-sea-lions-yellow", "cats", "sea lions", None)]


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([{"options": ["cats"], "questions": ["Are {} red?"]}], "row 1, field 'options': must list exactly two words"),
        ([{"options": ["cats", "dogs"], "questions": {"both": ["Are {} red?"], "maybe": []}}],
         "row 1, field 'questions': unknown group(s) maybe"),
        ([{"options": ["cats", "dogs"], "questions": ["Are {} red?"]}, {"options": ["a", "b"], "questions": ["Are red?"]}],
         "row 2, field 'questions': question 'Are red?' must hold exactly one {}"),
        ([{"first": "cats", "second": "dogs", "question": "Are {} {red}?"}], "field 'question': may hold no braces"),
        ([{"first": "cats", "second": "dogs", "question": "Are {} red?", "group": "all"}], "field 'group': must be one of"),
        ([{"first": "cats", "question": "Are {} red?"}], "row 1, field 'second': missing"),
        ([{"first": "cats", "second": "cats", "question": "Are {} red?"}], "field 'second': the two words must differ"),
    ],
)
def test_a_malformed_row_is_one_error_naming_file_row_and_field(rows: list, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(ExperimentError) as caught:
        load_items(str(path))
    message = str(caught.value)
    assert message.startswith(str(path)) and needle in message and "\n" not in message


def test_a_malformed_file_on_the_command_line_is_exit_2_with_nothing_written(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from contllm.cli.commands import app

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"options": ["cats", "dogs"], "questions": ["Are {} red?"]}\n{"options": "cats"}\n')
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "interpolation", "--data", str(bad), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "bad.jsonl: row 2, field 'options'" in lines[0], result.output
    assert not out.exists()


def test_the_endpoints_are_the_plain_prompts_also_for_words_of_unequal_token_counts(lm64: ContinuousLM, paper_file: Path) -> None:
    config = InterpolationConfig(template=TEMPLATE, data=str(paper_file), samples=5)
    item = load_items(str(paper_file))[3]  # cats -> sea lions: one token against two
    plan = plan_item(lm64, item, config)
    assert (plan.meta["tokens_first"], plan.meta["tokens_second"]) == (1, 2)
    probs = Engine(lm64).probs(plan.signals)
    sa, _, sb, _ = ends(lm64, item, config, embed=False)
    plain = lm64.probs([sa, sb])
    assert (probs[0] - plain[0]).abs().max() <= 1e-5
    assert (probs[-1] - plain[1]).abs().max() <= 1e-5
    assert (probs[2] - plain[0]).abs().max() > 1e-3 and (probs[2] - plain[1]).abs().max() > 1e-3
    assert plan.token_sets.labels == ("yes", "no")
    # every casing, with and without the leading-space form the tokenizer has
    assert sorted(lm64.tokenizer.decode([i]) for i in yes_no(lm64.tokenizer).token_ids[0]) == ["Yes", "yes"]


def test_prompts_that_tokenize_differently_around_the_word_are_refused_before_anything_runs(lm: ContinuousLM) -> None:
    config = InterpolationConfig(template=TEMPLATE)
    check_item(lm, WordItem("x", "cats", "dogs", "Are {}?", "first"), config)
    # "dogs!" glues its "!" to the question mark: "!?" is one token that straddles the word's end
    with pytest.raises(ExperimentError, match="splits the text around 'cats' and 'dogs!' differently"):
        check_item(lm, WordItem("x", "cats", "dogs!", "Are {}?", "first"), config)


def sweep(group: str | None, share: list[float]) -> Sweep:
    x = np.linspace(0, 1, len(share))
    yes = np.array(share) * 0.8
    answers = {"both": (True, True), "neither": (False, False), "first": (True, False), "second": (False, True)}
    a = answers.get(group, (None, None))
    meta = {"group": group, "answer_first": a[0], "answer_second": a[1]}
    return Sweep(f"i-{group}-{share[0]}", x, ["yes", "no"], np.stack([yes, 0.8 - yes], axis=1), None, meta)


def test_the_summary_counts_accuracy_crossovers_and_the_crossing_alpha() -> None:
    sweeps = [
        sweep("first", [0.9, 0.7, 0.3, 0.1, 0.1]),   # yes -> no at alpha 0.375: crosses over
        sweep("second", [0.2, 0.3, 0.4, 0.45, 0.6]),  # no -> yes between 0.75 and 1: crosses over at 0.75 + 0.25 * 0.05 / 0.15
        sweep("second", [0.6, 0.7, 0.8, 0.9, 0.9]),   # yes all along: wrong at alpha 0, no crossover
        sweep("both", [0.8, 0.8, 0.8, 0.8, 0.8]),     # right at both ends
    ]
    out = summarize_sweeps(sweeps)
    assert out["accuracy_at_alpha_0"] == 0.75 and out["accuracy_at_alpha_1"] == 1.0
    assert out["first_second_items"] == 3 and out["crossover_share"] == pytest.approx(2 / 3)
    assert out["mean_crossing_alpha"] == pytest.approx((0.375 + 0.75 + 0.25 / 3) / 2)
    assert out["flip_share"] == 0.5
    assert crossing(np.array([0.0, 1.0]), np.array([0.6, 0.7])) is None
    # answers unknown: no accuracy, no crossover share; flips are still counted
    unknown = summarize_sweeps([sweep(None, [0.9, 0.1]), sweep(None, [0.9, 0.8])])
    assert "accuracy_at_alpha_0" not in unknown and "crossover_share" not in unknown
    assert unknown["flip_share"] == 0.5 and unknown["first_second_items"] == 0


@pytest.fixture(scope="module")
def full_run(lm: ContinuousLM, paper_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from contllm.rundir.runner import run

    options = {"template": TEMPLATE, "data": str(paper_file), "samples": "3"}
    return run("interpolation", options=options, lm=lm, model="tiny-llama", out=tmp_path_factory.mktemp("interp") / "run")


def test_a_run_writes_sweeps_summary_and_figures_and_resumes_exactly(lm: ContinuousLM, paper_file: Path,
                                                                    full_run: Path, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    result = ExperimentResult.from_dict(json.loads((full_run / "results.json").read_text()))
    assert len(result.sweeps) == 6 and result.sweeps[0].labels == ["yes", "no"]
    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["items"] == 6 and summary["first_second_items"] == 2 and 0 <= summary["accuracy_at_alpha_0"] <= 1
    for name in ("summary", "items/cats-sea-lions-swim", "items/dogs-cats-red"):
        assert (full_run / "figures" / f"{name}.png").is_file()
    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    (out / "items" / "cats-sea-lions-swim.json").unlink()
    kept = (out / "items" / "cats-sea-lions-fur.json").stat().st_mtime_ns
    options = {"template": TEMPLATE, "data": str(paper_file), "samples": "3"}
    run("interpolation", options=options, lm=lm, model="tiny-llama", out=out, resume=True)
    assert (out / "items" / "cats-sea-lions-fur.json").stat().st_mtime_ns == kept
    before = json.loads((full_run / "results.json").read_text())["sweeps"][3]["probs"]
    after = json.loads((out / "results.json").read_text())["sweeps"][3]["probs"]
    assert np.allclose(after, before, atol=1e-6)
    # a data file whose contents changed since the run started is refused on resume
    data = tmp_path / "mine.json"
    data.write_text(json.dumps(PAPER_ROWS))
    mine = {**options, "data": str(data)}
    again = run("interpolation", options=mine, lm=lm, model="tiny-llama", items="1", out=tmp_path / "mine",
                item_figures=False)
    data.write_text(json.dumps(PAPER_ROWS[::-1]))
    with pytest.raises(ContllmError, match="its config differs in options"):
        run("interpolation", options=mine, lm=lm, model="tiny-llama", items="1", out=again, resume=True)


def test_the_comparison_draws_runs_side_by_side(full_run: Path) -> None:
    from contllm.plotting import plt

    result = EXPERIMENT.load_result(json.loads((full_run / "results.json").read_text()))
    fig = EXPERIMENT.comparison([("a", result), ("b", result)])
    curves = fig.axes[0]
    assert len(curves.lines) == 2 * 5  # four groups and the unknown ones, per run
    plt.close(fig)


def test_a_plain_signal_differs_from_the_interpolated_start_only_in_its_pieces(lm: ContinuousLM, paper_file: Path) -> None:
    config = InterpolationConfig(template=TEMPLATE, data=str(paper_file), samples=3)
    item = load_items(str(paper_file))[3]
    plan = plan_item(lm, item, config)
    plain = Signal.from_text(lm.tokenizer, TEMPLATE.replace("{question}", "Can cats swim?"))
    # cats (1 token) against sea lions (2): the word is cut into two pieces of half a step each
    assert len(plan.signals[0]) == len(plain) + 1
    assert float(plan.signals[0].durations.sum()) == pytest.approx(float(plain.durations.sum()))
