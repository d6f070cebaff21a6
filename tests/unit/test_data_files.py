"""Dataset files for counting, events and sums (``--data``): the project's rows and the paper's shapes, and their errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM, ExperimentError
from contllm.cli.commands import app
from contllm.data import CountingItem, EventItem
from contllm.data.paper import parse_passage
from contllm.data.user import file_sha256
from contllm.errors import RunDirectoryError
from contllm.experiments.counting import CountingConfig, read_counting
from contllm.experiments.events import EXPERIMENT as EVENTS
from contllm.experiments.events import EventsConfig, read_events
from contllm.experiments.sums import SumItem, read_sums
from tests.unit.test_sums import digit_tokenizer
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit

#: The paper's counting shape: a count, or a list of counts (one item each).
PAPER_COUNTING = [
    {"word": "apple", "category": "fruit", "category_with_article": "a fruit", "repetitions": 3},
    {"word": "violin", "category": "instrument", "category_with_article": "an instrument", "repetitions": [2, 4]},
]

#: The paper's event shape: a whole prompt ending in its answer prefix.
PAPER_EVENTS = [
    {"sentence": "Here is a story:\n- Ana woke up.\n- She made tea.\n- She read the news.\n"
                 "Question: How many actions did Ana take?\nAnswer: Ana took", "num_sentences": 3},
    {"sentence": "Boil the water. Add the pasta. Stir it. Drain it. How many steps are there? There are",
     "num_sentences": 4},
]

#: The paper's sums shape.
PAPER_SUMS = [
    {"template": "{name} has {item_1} apples and buys {item_2} more. How many apples does {name} have?",
     "fields": {"name": "Mia", "item_1": 23, "item_2": "45"}, "shrink_1": True},
    {"template": "A jar holds {item_1} red and {item_2} blue marbles. How many marbles are in the jar?",
     "fields": {"name": "", "item_1": 31, "item_2": 17}, "shrink_1": False},
]


def write(path: Path, rows: list[dict]) -> Path:
    """``rows`` as JSON (.json), JSON Lines (.jsonl) or CSV (lists and objects as JSON cells)."""
    if path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        names = list(dict.fromkeys(k for r in rows for k in r))
        with path.open("w", newline="") as handle:
            out = csv.DictWriter(handle, names)
            out.writeheader()
            for r in rows:
                out.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
    return path


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv"])
def test_the_papers_counting_rows_become_counting_items(tmp_path: Path, suffix: str) -> None:
    items = read_counting(write(tmp_path / f"counting{suffix}", PAPER_COUNTING))
    assert items == [
        CountingItem("count-001", "apple", "a fruit", "fruit", 3, False),
        CountingItem("count-002-2", "violin", "an instrument", "instrument", 2, False),
        CountingItem("count-002-4", "violin", "an instrument", "instrument", 4, False),
    ]


def test_the_projects_counting_rows_with_their_defaults(tmp_path: Path) -> None:
    rows = [{"id": "w1", "word": "owl", "n": 2}, {"word": "pear", "n": "5", "article": "one pear", "category": "fruits"}]
    items = read_counting(write(tmp_path / "counting.csv", rows))
    assert items == [CountingItem("w1", "owl", "an owl", "things", 2, False),
                     CountingItem("count-002", "pear", "one pear", "fruits", 5, False)]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_the_papers_event_prompts_are_split_into_events_question_and_answer_prefix(tmp_path: Path, suffix: str) -> None:
    items = read_events(write(tmp_path / f"events{suffix}", PAPER_EVENTS))
    assert items == [
        EventItem("passage-001", "tutorial", ("Ana woke up.", "She made tea.", "She read the news."),
                  "How many actions did Ana take?", "Answer: Ana took", 3, PAPER_EVENTS[0]["sentence"]),
        EventItem("passage-002", "story", ("Boil the water.", "Add the pasta.", "Stir it.", "Drain it."),
                  "How many steps are there?", "There are", 4, PAPER_EVENTS[1]["sentence"]),
    ]


def test_passages_are_parsed_by_dashes_or_sentences_after_an_introduction() -> None:
    assert parse_passage("Read this: Tom ran. Tom sat!\nQ: How many? A: two") == (
        ["Tom ran.", "Tom sat!"], "How many?", "A: two")
    # dashes win over sentences: one event may hold several sentences
    assert parse_passage("- Tom ran. He fell.\n- He sat.\nHow many events? Answer:")[0] == ["Tom ran. He fell.", "He sat."]
    for text, needle in [("Tom ran. Tom sat.", "has no question"), ("Tom ran. How many?", "must end in an answer prefix"),
                         ("How many? Answer:", "has no events")]:
        with pytest.raises(ValueError, match=needle):
            parse_passage(text)


def test_the_projects_event_rows(tmp_path: Path) -> None:
    rows = [{"events": ["A.", "B."], "question": "How many?", "answer_prefix": "There were", "kind": "story"}]
    assert read_events(write(tmp_path / "events.jsonl", rows)) == [
        EventItem("passage-001", "story", ("A.", "B."), "How many?", "There were", 2)]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_the_papers_sums_rows_become_problems(tmp_path: Path, suffix: str) -> None:
    items = read_sums(write(tmp_path / f"sums{suffix}", PAPER_SUMS))
    assert items == [
        SumItem("sum-001", "{name} has {first} apples and buys {second} more. How many apples does {name} have?",
                23, 45, "Mia", "first"),
        SumItem("sum-002", "A jar holds {first} red and {second} blue marbles. How many marbles are in the jar?",
                31, 17, "", "second"),
    ]
    assert items[0].rendered().text == "Mia has 23 apples and buys 45 more. How many apples does Mia have?"
    assert items[1].numbers == (17, 31)


BAD_ROWS = [
    # (experiment, rows, what the one line names)
    ("counting", [{"word": "owl", "n": 2}, {"word": "owl"}], "row 2, field 'n': missing"),
    ("counting", [{"word": "owl", "n": 12}], "row 1, field 'n': must be from 1 to 9"),
    ("counting", [{"word": "owl", "n": 2, "id": "a"}, {"word": "fox", "n": 2, "id": "a"}], "row 2: id 'a' repeats row 1"),
    ("counting", [PAPER_COUNTING[0], {**PAPER_COUNTING[0], "repetitions": 0}], "row 2, field 'repetitions'"),
    ("counting", [PAPER_COUNTING[0], {k: v for k, v in PAPER_COUNTING[0].items() if k != "category"}],
     "row 2, field 'category': missing"),
    ("events", [{"events": ["A."], "question": "How many?"}], "row 1, field 'answer_prefix': missing"),
    ("events", [{"events": ["A.", "B."], "question": "Q?", "answer_prefix": "P", "n": 3}], "row 1, field 'n': is 3"),
    ("events", [{**PAPER_EVENTS[0], "num_sentences": 4}], "row 1, field 'sentence': holds 3 events (lines starting"),
    ("events", [PAPER_EVENTS[0], {"sentence": "Tom ran.", "num_sentences": 1}], "row 2, field 'sentence': has no question"),
    ("sums", [{"problem": "{first} and {second}", "first": 1}], "row 1, field 'second': missing"),
    ("sums", [{"problem": "{first}, {second}, {third}", "first": 1, "second": 2}], "row 1, field 'problem': unknown template"),
    ("sums", [{"problem": "{name}: {first}, {second}", "first": 1, "second": 2}], "row 1, field 'name'"),
    ("sums", [{"problem": "{first}, {second}", "first": -1, "second": 2}], "row 1, field 'first'"),
    ("sums", [{"problem": "{first}, {second}", "first": 1, "second": 2, "scaled": "third"}], "field 'scaled'"),
    ("sums", [PAPER_SUMS[0], {**PAPER_SUMS[0], "fields": {"name": "Al", "item_1": 3}}], "row 2, field 'fields.item_2'"),
    ("sums", [{**PAPER_SUMS[0], "template": "{name} has {item_1}"}], "row 1, field 'template': has no {item_2}"),
    ("sums", [{**PAPER_SUMS[0], "template": "{item_1} {item_2} {item_3}"}], "row 1, field 'template': has the field"),
    ("sums", [{**PAPER_SUMS[0], "shrink_1": "maybe"}], "row 1, field 'shrink_1'"),
]


@pytest.mark.parametrize(("name", "rows", "needle"), BAD_ROWS)
def test_a_malformed_row_is_one_line_naming_file_row_and_field_and_nothing_is_written(
        tmp_path: Path, name: str, rows: list[dict], needle: str) -> None:
    data = write(tmp_path / "bad.json", rows)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", name, "--data", str(data), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {data}: ") and needle in lines[0], result.output
    assert not out.exists()


@pytest.mark.parametrize(("text", "needle"), [("[]", "holds no rows"), ("[1]", "row 1: must be an object"),
                                             ("{", "not valid JSON")])
def test_a_malformed_file_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    data = tmp_path / "bad.json"
    data.write_text(text)
    result = CliRunner().invoke(app, ["run", "events", "--data", str(data), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and needle in result.output and len(result.output.strip().splitlines()) == 1


def test_help_gives_each_schema() -> None:
    for name, words in [("counting", "category_with_article"), ("events", "num_sentences"), ("sums", "shrink_1")]:
        result = CliRunner().invoke(app, ["run", name, "--help"], terminal_width=400)
        assert result.exit_code == 0 and "--data" in result.output and words in result.output


def test_the_config_records_the_file_and_its_hash_and_resume_refuses_a_changed_file(tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    data = write(tmp_path / "events.json", PAPER_EVENTS)
    config = EventsConfig(data=data, samples=2, low=0.5)
    assert config.data == str(data) and config.data_sha256 == file_sha256(data) and len(config.data_sha256) == 64
    assert EVENTS.items(config)[0].id == "passage-001"
    lm = ContinuousLM(tiny_model("llama"), digit_tokenizer())
    out = tmp_path / "run"
    run("events", config=config, lm=lm, model="tiny-llama", items="1", out=out, item_figures=False)
    options = json.loads((out / "config.json").read_text())["options"]
    assert options["data"] == str(data) and options["data_sha256"] == file_sha256(data)
    same = EventsConfig(data=data, samples=2, low=0.5)
    run("events", config=same, lm=lm, model="tiny-llama", items="1", out=out, resume=True, item_figures=False)
    write(data, PAPER_EVENTS[::-1])  # the same path, other contents
    with pytest.raises(RunDirectoryError, match="config differs in options"):
        run("events", config=EventsConfig(data=data, samples=2, low=0.5), lm=lm, model="tiny-llama", items="1",
            out=out, resume=True)


def test_counting_takes_its_items_from_the_file(tmp_path: Path) -> None:
    data = write(tmp_path / "counting.jsonl", PAPER_COUNTING)
    config = CountingConfig(data=str(data))
    assert [i.id for i in config.counting_items()] == ["count-001", "count-002-2", "count-002-4"]
    with pytest.raises(ExperimentError, match="a dataset file must end in .json, .jsonl or .csv"):
        CountingConfig(data=str(tmp_path / "counting.txt"))
