"""The paper's protocol (--protocol paper): its prompts character for character, its token selection, read-outs and density; records keep what was measured."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.data import EventItem
from contllm.experiments import counting, events, sums, word_interpolation
from contllm.models import DEFAULT_MODEL
from contllm.readout import PAPER_YES_NO, containing
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "paper"
NO_MODEL = SimpleNamespace(tokenizer=None)  # rendering without --chat reads nothing of the model


def rows(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())


def config(name: str, **options: object) -> object:
    return registry.get(name).config({"protocol": "paper", **options})


def test_counting_prompts_are_the_papers_question() -> None:
    cfg = config("counting", data=str(FIXTURES / "words_with_repetitions.json"))
    for row, item in zip(rows("words_with_repetitions.json"), registry.get("counting").items(cfg)):
        words = " ".join([row["word"]] * row["repetitions"])
        expected = (f'Question: In the sentence "{words}", how many times is {row["category_with_article"]} mentioned? '
                    "Reply with a single-digit number\nAnswer: ")
        assert counting.render_item(NO_MODEL, item, cfg).text == expected


def test_sums_prompts_are_the_papers_template_filled_in() -> None:
    cfg = config("sums", data=str(FIXTURES / "sums.json"))
    for row, item in zip(rows("sums.json"), registry.get("sums").items(cfg)):
        rendered = sums.render_item(NO_MODEL, item, cfg)
        assert rendered.text == row["template"].format(**row["fields"])
        scaled = str(row["fields"]["item_1" if row["shrink_1"] else "item_2"])
        assert [rendered.text[a:b] for a, b in rendered.spans["scaled"]] == [scaled]


def test_interpolation_prompts_are_the_papers_yes_no_question() -> None:
    cfg = config("interpolation", data=str(FIXTURES / "embedding_filtered.json"))
    assert cfg.samples == 40
    row = rows("embedding_filtered.json")[0]
    items = registry.get("interpolation").items(cfg)
    assert len(items) == 4
    for item in items:
        for word, end in zip(row["options"], (item.first, item.second)):
            rendered = word_interpolation.render_word(NO_MODEL, item, end, cfg)
            assert rendered.text == "Question: " + item.question.replace("{}", word) + " (yes/no)\nAnswer:"
            assert [rendered.text[a:b] for a, b in rendered.spans["word"]] == [word]


@pytest.mark.parametrize("name", ["counting_events_seq.json", "counting_events.json"])
def test_event_prompts_are_the_rows_own_and_the_block_runs_from_the_first_bullet_to_the_last_full_stop(name: str) -> None:
    cfg = config("events", data=str(FIXTURES / name))
    row, item = rows(name)[0], registry.get("events").items(cfg)[0]
    rendered = events.render_item(NO_MODEL, item, cfg)
    assert rendered.text == row["sentence"]
    (start, end), = rendered.spans["block"]
    first, last = item.events[0], item.events[-1]
    expected_start = row["sentence"].index("- " + first) if name.endswith("seq.json") else row["sentence"].index(first)
    assert (start, end) == (expected_start, row["sentence"].index(last) + len(last))
    assert rendered.text[end - 1] == "."


def test_built_in_passages_are_written_as_the_paper_writes_them() -> None:
    tutorial = EventItem("t", "tutorial", ("Boil water.", "Add tea."), "How many steps are there?", "Answer: There are", 2)
    story = EventItem("s", "story", ("Ana sat.", "She ate."), "How many actions did Ana take?", "Answer: Ana took", 2)
    cfg = config("events")
    text = events.render_item(NO_MODEL, tutorial, cfg).text
    assert text == ("- Boil water.\n- Add tea.\n\nQuestion: How many steps are there? Reply with a single-digit number\n"
                    "Answer: There are ")
    rendered = events.render_item(NO_MODEL, story, cfg)
    assert rendered.text == ("Ana sat. She ate.\nQuestion: How many actions did Ana take? Reply with a single-digit "
                             "number\nAnswer: Ana took ")
    assert rendered.spans["block"] == [(0, len("Ana sat. She ate."))]


def test_the_paper_samples_100_factors_unless_told_and_the_defaults_stay() -> None:
    assert config("counting").samples == 100 and config("counting", samples="5").samples == 5
    assert registry.get("counting").config().samples == 10 and registry.get("sums").config().samples == 8
    assert config("boolean").samples == 100 and registry.get("boolean").config().samples == 21
    assert registry.get("counting").config().resolved_template() == counting.DEFAULT_TEMPLATE
    with pytest.raises(ExperimentError, match="protocol must be 'contllm' or 'paper', got 'papers'"):
        registry.get("counting").config({"protocol": "papers"})


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = ["<unk>", *dict.fromkeys(words)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_the_papers_read_out_takes_every_token_containing_the_word() -> None:
    tok = word_tokenizer(["yes", "Yes", "YES", "no", "No", "not", "know", "yesno", "maybe"])
    sets = containing(tok, PAPER_YES_NO)
    decoded = {label: sorted(tok.decode([i]) for i in ids) for label, ids in zip(sets.labels, sets.token_ids)}
    assert decoded == {"yes": ["YES", "Yes", "yes"], "no": ["No", "know", "no", "not"]}
    with pytest.raises(ExperimentError, match="no token of this tokenizer contains 'fa'"):
        containing(tok, {"fa": ["fa"], "yes": ["yes"]})


def test_records_keep_the_prompt_and_the_edited_positions_with_their_text() -> None:
    tok = word_tokenizer(['"', "apple", "contains", "Q", ":", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"])
    lm = ContinuousLM(tiny_model("llama"), tok)
    cfg = registry.get("counting").config({"template": 'Q: "{words}" contains ', "samples": "2"})
    item = registry.get("counting").items(cfg)[0]
    plan = counting.plan_item(lm, item, cfg)
    assert plan.meta["prompt"] == f'Q: "{" ".join(["apple"] * item.n)}" contains '
    assert plan.meta["edited"] == plan.edited == list(range(3, 3 + item.n))
    assert plan.meta["edited_tokens"] == ["apple"] * item.n


def test_the_paper_spec_runs_every_experiment_of_the_paper_and_takes_model_items_and_samples() -> None:
    from contllm.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "specs" / "paper.toml", model="gemma3-270m", items="2",
                     samples="5")
    assert spec.models == ["gemma3-270m"]
    assert {e.experiment for e in spec.entries} == {"counting", "events", "sums", "interpolation", "boolean",
                                                    "counting-interpolation"}
    for entry in spec.entries:
        assert entry.settings.items == "2" and entry.options["samples"] == "5"
        assert entry.options.get("protocol") == ("paper" if entry.experiment != "counting-interpolation" else None)
    plain = load_spec(Path(__file__).resolve().parents[2] / "specs" / "paper.toml")
    assert plain.models == [DEFAULT_MODEL] and all("samples" not in e.options for e in plain.entries)
