"""The paper's protocol (--protocol paper): its prompts character for character, its token selection, read-outs and density; records keep what was measured."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.core.readout import PAPER_YES_NO, containing
from contllm.data import EventItem
from contllm.experiments import counting, events, sums, word_interpolation
from contllm.models import DEFAULT_MODEL
from tests.unit.tiny import tiny_model, word_level_tokenizer

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
    return word_level_tokenizer(vocab)


def test_the_papers_read_out_takes_every_token_containing_the_word() -> None:
    tok = word_tokenizer(["yes", "Yes", "YES", "no", "No", "not", "know", "yesno", "maybe"])
    sets = containing(tok, PAPER_YES_NO)
    decoded = {label: sorted(tok.decode([i]) for i in ids) for label, ids in zip(sets.labels, sets.token_ids)}
    # "yesno" holds both: it goes to the first label, as in the paper's scripts
    assert decoded == {"yes": ["YES", "Yes", "yes", "yesno"], "no": ["No", "know", "no", "not"]}
    with pytest.raises(ExperimentError, match="no token of this tokenizer contains 'fa'"):
        containing(tok, {"fa": ["fa"], "yes": ["yes"]})


def sets_by_definition(vocab: dict[str, int], pieces: dict[str, list[str]]) -> dict[str, list[int]]:
    """The paper's tracked tokens, written out: every vocabulary entry without "0x", to the first label (in order)
    one of whose pieces it contains, lower-cased."""
    out: dict[str, list[int]] = {label: [] for label in pieces}
    for text, index in vocab.items():
        if "0x" in text:
            continue
        for label, parts in pieces.items():
            if any(part.lower() in text.lower() for part in parts):
                out[label].append(index)
                break
    return {label: sorted(ids) for label, ids in out.items()}


#: A vocabulary with multi-digit tokens, a byte token and a hex literal.
MULTI_DIGIT = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "12", "20", "2021", "x9y", "<0x31>", "0x1f", "apple",
               "True", "tree", "false", "10"]


def test_the_papers_digit_sets_take_every_token_containing_the_digit_on_a_multi_digit_vocabulary() -> None:
    from contllm.core.readout import PAPER_DIGITS, PAPER_TRUTH, digits, paper_digits

    tok = word_tokenizer(MULTI_DIGIT)
    vocab = tok.get_vocab()
    expected = sets_by_definition(vocab, {k: list(v) for k, v in PAPER_DIGITS.items()})
    sets = paper_digits(tok)
    assert dict(zip(sets.labels, map(list, sets.token_ids))) == expected
    by_text = {label: sorted(tok.convert_ids_to_tokens(list(ids))) for label, ids in zip(sets.labels, sets.token_ids)}
    # "12" goes to 1; "10", "20" and "2021" to 0 (the first digit in 0-9 order); the byte token and "0x1f" to none
    assert by_text["1"] == ["1", "12"] and by_text["0"] == ["0", "10", "20", "2021"] and by_text["9"] == ["9", "x9y"]
    assert by_text["2"] == ["2"]
    exact = digits(tok)
    assert [list(ids) for ids in exact.token_ids] == [[vocab[str(k)]] for k in range(10)]  # the toolkit's: one each
    truth = containing(tok, PAPER_TRUTH)
    assert dict(zip(truth.labels, map(list, truth.token_ids))) == sets_by_definition(vocab, {"1": ["1", "tr"],
                                                                                          "0": ["0", "fa"]})
    assert vocab["10"] in truth.token_ids[truth.labels.index("1")]  # a token holding 1 and 0 is read as 1 (true)


def test_the_papers_densities_and_the_explicit_options_that_win_over_them() -> None:
    import numpy as np

    assert np.allclose(config("counting").factors(), np.linspace(0.1, 1, 100))
    assert np.allclose(config("events").factors(), np.linspace(0.1, 1, 40))
    assert np.allclose(config("sums").factors(), np.linspace(0.1, 1, 100))
    assert np.allclose(config("sums", range="0.1,1.5", samples="3").factors(), [0.1, 0.8, 1.0, 1.5])
    assert np.allclose(registry.get("sums").config().factors(), [0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.3, 1.5])
    assert registry.get("events").config().samples == 10
    assert config("counting").selection == "paper" and registry.get("counting").config().selection == "contllm"
    assert config("counting", selection="contllm").selection == "contllm"
    with pytest.raises(ExperimentError, match="selection must be 'contllm' or 'paper'"):
        registry.get("counting").config({"selection": "search"})


def test_built_in_sums_are_written_in_the_papers_form() -> None:
    cfg = config("sums")
    items = registry.get("sums").items(cfg)
    assert sums.render_item(NO_MODEL, items[0], cfg).text == (
        "Question: Mia has 23 apples and buys 45 more. How many apples does Mia have now?\nAnswer: Mia has ")
    for item in items:
        rendered = sums.render_item(NO_MODEL, item, cfg)
        problem = item.rendered().text
        answer = item.answer.replace("{name}", item.name)
        assert rendered.text == f"Question: {problem}\nAnswer: {answer} "
        assert [rendered.text[a:b] for a, b in rendered.spans["scaled"]] == [str(item.numbers[0])]


def test_boolean_under_the_papers_protocol_takes_its_prompt_operators_order_and_read_out() -> None:
    import itertools

    from contllm.experiments import boolean

    cfg = config("boolean")
    items = registry.get("boolean").items(cfg)
    expected = [f"{a}-{b}-{x}{y}" for pair in itertools.combinations(["AND", "OR", "NAND", "NOR", "XOR"], 2)
                for a, b in [sorted(pair)] for x, y in ((0, 0), (0, 1), (1, 0), (1, 1))]
    assert [i.id for i in items] == expected and len(items) == 40
    assert all(i.first < i.second for i in items)
    text = boolean._render(NO_MODEL, cfg, "NAND", 1, 0).text
    assert text == "Question: What is the truth value of the following statement?\n1 NAND 0\nAnswer (0 or 1): "
    plain = registry.get("boolean").items(registry.get("boolean").config())
    assert len(plain) == 84 and ("XOR", "NAND") in {(i.first, i.second) for i in plain}  # the toolkit's own order


def test_counting_interpolation_under_the_papers_protocol_is_its_active_setting() -> None:
    from contllm.experiments import counting_interpolation as ci

    cfg = config("counting-interpolation")
    assert (cfg.method, cfg.samples, cfg.n, cfg.moved) == ("slerp", 100, 4, 4)
    (item,) = registry.get("counting-interpolation").items(cfg)
    assert (item.word, item.other, item.counts) == ("apple", "pear", (4, 0))
    question = ('Question: How many apples appear in the sentence "{}"? Reply with a single-digit number, including 0 '
                "if there are none.\nAnswer: ")
    tok = word_tokenizer(["Question", ":", "How", "many", "apples", "appear", "in", "the", "sentence", '"', "apple",
                          "pear", "?", "Reply", "with", "a", "single", "-", "digit", "number", ",", "including",
                          "if", "there", "are", "none", ".", "Answer", *MULTI_DIGIT])
    lm = ContinuousLM(tiny_model("llama"), tok)
    plan = ci.plan_item(lm, item, cfg)
    assert plan.meta["prompt"] == question.format("apple apple apple apple")
    assert plan.meta["prompt_second"] == question.format("pear pear pear pear")
    assert len(plan.signals) == 100 and plan.meta["method"] == "slerp" and plan.meta["paper_runs"] is True
    pieces = {**{str(k): [str(k)] for k in range(5)}, "other digits": [str(k) for k in range(5, 10)]}
    assert plan.token_sets.labels == tuple(pieces)
    assert dict(zip(plan.token_sets.labels, map(list, plan.token_sets.token_ids))) == sets_by_definition(
        tok.get_vocab(), pieces)
    plain = registry.get("counting-interpolation").config()
    assert (plain.method, plain.samples, plain.moved) == ("linear", 21, 3)


def test_scaling_and_translation_under_the_papers_protocol() -> None:
    import numpy as np

    from contllm.experiments.timeline import base_signal, scaled, translated

    for name, grid in (("scaling", np.linspace(0.01, 1.5, 100)), ("translation", np.linspace(0, 10, 100))):
        cfg = config(name)
        assert np.array_equal(cfg.values(), grid)  # the paper's values alone: no reference added
        assert [(i.id, i.prompt) for i in registry.get(name).items(cfg)] == [
            ("france", "The capital of France is"), ("gatsby", "The Great Gatsby is my favourite"),
            ("romeo", "O Romeo, Romeo, wherefore art thou")]
    tok = word_tokenizer(["The", "capital", "of", "France", "is"])
    lm = SimpleNamespace(signal=lambda text: ContinuousLM(tiny_model("llama"), tok).signal(text))
    item = registry.get("scaling").items(config("scaling"))[0]
    base = base_signal(lm, item, config("scaling"))
    n = len(base)
    # the paper's positions: (1, ..., n) * s, the integration from 0; and (1, ..., n) + tau, the integration from tau
    assert base.times.tolist() == [float(k) for k in range(1, n + 1)] and base.start == 0.0
    assert scaled(base, 0.5).times.tolist() == [0.5 * k for k in range(1, n + 1)] and scaled(base, 0.5).start == 0.0
    moved = translated(base, 2.5)
    assert moved.times.tolist() == [2.5 + k for k in range(1, n + 1)] and moved.start == 2.5
    assert base_signal(lm, item, registry.get("scaling").config()).times.tolist() == [float(k) for k in range(n)]


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
    from contllm.rundir.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "specs" / "paper.toml", model="gemma3-270m", items="1",
                     samples="5")
    assert spec.models == ["gemma3-270m"]
    assert {e.experiment for e in spec.entries} == {"counting", "events", "sums", "interpolation", "boolean",
                                                    "counting-interpolation", "scaling", "translation"}
    for entry in spec.entries:
        assert entry.settings.items == "1" and entry.options["samples"] == "5"
        assert entry.options.get("protocol") == "paper"
    plain = load_spec(Path(__file__).resolve().parents[2] / "specs" / "paper.toml")
    assert plain.models == [DEFAULT_MODEL] and all("samples" not in e.options for e in plain.entries)


def test_the_papers_token_search() -> None:
    from contllm.experiments.protocol import PaperSearch, paper_search

    tokens = ["Question", ":", " In", " the", " sentence", ' "', "m", "all", " mall", " mall", " mall", '",', " how"]
    # the first occurrence is split inside the word ("m", "all"): no token there holds "mall", so the search skips it
    assert paper_search(tokens, PaperSearch("mall", "mall")) == [8, 9, 10]
    assert paper_search(tokens, PaperSearch("apple", "apple")) is None
    # sums: the first digit's first token to the second digit's last, within the paper's window
    text = ["Mia", " has", " ", "2", "3", " apples", " and", " buys", " ", "4", "5", " more", "."]
    assert paper_search(text, PaperSearch("2", "3", before="and")) == [3, 4]  # window: up to the first "and"
    assert paper_search(text, PaperSearch("4", "5", after="and", before=".")) == [9, 10]  # from "and" to "."
    assert paper_search(text, PaperSearch("4", "5", before="and")) is None  # neither digit inside the window
    assert paper_search(["x", ".", "and", "4", "5"], PaperSearch("4", "5", after="and", before=".")) is None


def test_the_papers_selection_is_an_option_and_every_record_says_whether_the_paper_could_run_it() -> None:
    from contllm.data import CountingItem

    tok = word_tokenizer(["apple", "pear", "count", ":", '"', "contains", *MULTI_DIGIT])
    lm = ContinuousLM(tiny_model("llama"), tok)
    template = 'apple count: "{words}" contains '
    item = CountingItem("c", "apple", "an apple", "fruits", 3, False)
    ours = counting.plan_item(lm, item, registry.get("counting").config({"template": template, "samples": "2"}))
    papers = counting.plan_item(lm, item, config("counting", template=template, samples="2"))
    # the toolkit scales the three words (tokens 4-6); the paper's search runs from the first token holding
    # "apple" (the one before "count") to the last, taking "count", ":" and '"' with them
    assert ours.edited == [4, 5, 6] and papers.edited == [0, 1, 2, 3, 4, 5, 6]
    assert ours.meta["paper_runs"] is True and papers.meta["paper_runs"] is True
    assert papers.meta["edited"] == papers.edited
    unknown = CountingItem("u", "plum", "a plum", "fruits", 2, False)  # not in the vocabulary: its tokens decode to nothing
    plan = counting.plan_item(lm, unknown, config("counting", template=template, samples="2"))
    assert plan.meta["paper_runs"] is False and plan.edited == [4, 5]  # the toolkit's selection stands in


def test_built_in_counting_items_ask_the_papers_question_about_their_category() -> None:
    cfg = config("counting")
    items = registry.get("counting").items(cfg)
    assert {i.asked for i in items} >= {"a fruit", "an animal", "a piece of furniture"}
    for item in items:
        words = " ".join([item.word] * item.n)
        text = counting.render_item(NO_MODEL, item, cfg).text
        assert text == (f'Question: In the sentence "{words}", how many times is {item.asked} mentioned? '
                        "Reply with a single-digit number\nAnswer: ")
        assert text.count(item.word) == item.n  # so the paper's search stops at the last repetition


def test_the_papers_tracking_reads_the_tokenizers_base_vocabulary_alone() -> None:
    import numpy as np
    import torch

    from contllm.experiments.tracking import track

    probs = torch.tensor([[0.5, 0.04, 0.06, 0.4], [0.3, 0.06, 0.04, 0.6]])  # ids 1, 2 and 3 pass 0.05 somewhere
    labels = ["a", "b", "c", "<added>"]
    every = track("i", "s", np.array([0.5, 1.0]), probs, labels, threshold=0.05, reference=1.0)
    base = track("i", "s", np.array([0.5, 1.0]), probs, labels, threshold=0.05, reference=1.0, candidates=3)
    assert every.token_ids == [3, 0, 1, 2] and base.token_ids == [0, 1, 2]  # id 3 lies beyond a vocab_size of 3
