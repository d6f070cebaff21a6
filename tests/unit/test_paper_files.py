"""The paper's data files, in the shape of each one's first rows (tests/fixtures/paper): each loads into its experiment or is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import registry
from contllm.cli.commands import app

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "paper"

#: file -> (experiment, item ids the file must give).
LOADED = {
    "words.json": ("counting", ["count-001-3", "count-001-4", "count-001-5", "count-002-3", "count-002-4", "count-002-5"]),
    "words_with_repetitions.json": ("counting", ["count-001", "count-002"]),
    "counting_events.json": ("events", ["passage-001", "passage-002"]),
    "counting_events_seq.json": ("events", ["passage-001", "passage-002"]),
    "embedding_filtered.json": ("interpolation", ["apples-bananas-eaten-raw", "apples-bananas-animals",
                                                  "apples-bananas-red", "apples-bananas-peel"]),
    "embedding_split.json": ("interpolation", ["apples-bananas-eaten-raw", "apples-bananas-fruit",
                                               "apples-bananas-animals", "apples-bananas-red", "apples-bananas-peel"]),
    "embedding_updated.json": ("interpolation", ["apples-bananas-eaten-raw", "apples-bananas-fruit",
                                                 "apples-bananas-animals", "apples-bananas-red", "apples-bananas-peel"]),
    "embedding.json": ("interpolation", ["apples-bananas-fruit", "apples-bananas-red", "apples-bananas-animals"]),
    "embedding_raw_split.json": ("interpolation", ["apples-bananas-fruit", "apples-bananas-animals",
                                                   "apples-bananas-red", "apples-bananas-yellow"]),
    "sums.json": ("sums", ["sum-001", "sum-002"]),
}

#: file -> (experiment it would be given to, words the one-line refusal must hold).
REFUSED = {
    "counting_events_raw.json": ("events", "material for generating stories"),
    "embedding_raw.json": ("interpolation", "unsplit groups both/one/neither"),
    "sums_raw.json": ("sums", "material for generating sums"),
}


def test_every_file_of_the_papers_data_folder_has_a_fixture() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted([*LOADED, *REFUSED])


@pytest.mark.parametrize("name", sorted(LOADED))
def test_the_files_the_papers_scripts_use_load_as_they_are(name: str) -> None:
    experiment_name, ids = LOADED[name]
    experiment = registry.get(experiment_name)
    config = experiment.config({"data": str(FIXTURES / name)})
    assert config.data_sha256 is not None
    assert [item.id for item in experiment.items(config)] == ids


def test_what_the_paper_shapes_become() -> None:
    counting = registry.get("counting")
    words = counting.items(counting.config({"data": str(FIXTURES / "words.json")}))
    assert [(i.word, i.n, i.article) for i in words[:3]] == [("mall", 3, "a place"), ("mall", 4, "a place"),
                                                              ("mall", 5, "a place")]
    events = registry.get("events")
    story, short = events.items(events.config({"data": str(FIXTURES / "counting_events.json")}))
    assert story.kind == "story" and story.n == 3 and story.events[0] == "He fills up the tank at a gas station."
    assert short.events == ("She looks at old maps.", "She buys a postcard.")
    tutorial = events.items(events.config({"data": str(FIXTURES / "counting_events_seq.json")}))[0]
    assert tutorial.kind == "tutorial" and tutorial.prompt.startswith("Tutorial: How to Clean Chicken Livers\n\n- Lay")
    assert tutorial.events == ("Lay out the livers.", "Look for connective tissue.",
                               "Trim the meat away from the connective tissue.")
    interpolation = registry.get("interpolation")
    split = interpolation.items(interpolation.config({"data": str(FIXTURES / "embedding_raw_split.json")}))
    assert [(i.question, i.group) for i in split] == [("Are {} fruit?", "both"), ("Are {} animals?", "neither"),
                                                      ("Are {} red?", "first"), ("Are {} yellow?", "second")]
    filtered = interpolation.items(interpolation.config({"data": str(FIXTURES / "embedding_filtered.json")}))
    assert {i.group for i in filtered} == {"both", "neither", "first", "second"}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_papers_generation_materials_are_refused_in_one_line_before_anything_is_written(name: str, tmp_path: Path) -> None:
    experiment, words = REFUSED[name]
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", experiment, "--data", str(FIXTURES / name), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and name in lines[0], result.output
    assert not out.exists()
