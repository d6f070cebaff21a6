"""benchmarks/main_job.py on a tiny random model: its four lines, and a record that docs/quotes.py reads."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.scripts import ROOT, import_benchmark, load_script
from tests.unit.tiny import word_directory

pytestmark = pytest.mark.unit

#: A tiny random Llama's word-level vocabulary: the digits and the few-shot prompt's words.
WORDS = ["<unk>", "<s>", "</s>", '"', ".", "contains", "words", *"0123456789", "cat", "dog", "apple"]


@pytest.fixture(scope="module")
def main_job() -> ModuleType:
    return import_benchmark("main_job")


def test_main_job_prints_its_four_lines_and_records_what_the_pages_quote(
    main_job: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = word_directory(tmp_path / "tiny", WORDS, max_position_embeddings=512)
    record = tmp_path / "main_job.json"
    assert main_job.main(["--model", str(model), "--items", "3", "--record", str(record)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for start in ("end to end ", "evaluation ", "overhead: ", "efficiency: "):
        assert sum(line.startswith(start) for line in lines) == 1, (start, lines)
    data = json.loads(record.read_text())
    assert data["items"] == 3 and data["model"] == str(model) and data["cache"].startswith("warm")
    assert data["seconds"]["evaluation"] > 0 and data["seconds"]["end_to_end"] >= data["seconds"]["evaluation"]
    assert 0 < data["efficiency"] and data["tokens"] > 0 and "accuracy_at_1" in data["summary"]

    quotes = load_script(ROOT / "docs" / "quotes.py", "contllm_docs_quotes")
    values = quotes.main_job_values(record)
    assert values["main_job.items"] == "3" and values["main_job.model"] == str(model)
    assert values["main_job.accuracy_at_1"] == f"{data['summary']['accuracy_at_1']:.3f}"
    assert values["main_job.end_to_end"] == quotes.duration(data["seconds"]["end_to_end"])
    # every key the pages quote from the repository's record is one this writer produces
    quoted = {
        key for page in quotes.pages() for key, _ in quotes.quotes(page.read_text()) if key.startswith("main_job.")
    }
    assert quoted and quoted <= set(values), sorted(quoted - set(values))


def test_against_runs_both_models_in_turn_and_ends_with_their_ratios(
    main_job: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = word_directory(tmp_path / "first", WORDS, max_position_embeddings=512)
    second = word_directory(tmp_path / "second", WORDS, max_position_embeddings=512)
    record = tmp_path / "pair.json"
    args = ["--model", str(first), "--against", str(second), "--items", "2", "--rounds", "2", "--record", str(record)]
    assert main_job.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    rounds = [line for line in lines if line.startswith("--- round ")]
    assert rounds == [
        f"--- round 1 of 2: {first}",
        f"--- round 1 of 2: {second}",
        f"--- round 2 of 2: {first}",
        f"--- round 2 of 2: {second}",
    ]
    assert sum(line.startswith("evaluation ") for line in lines) == 4
    data = json.loads(record.read_text())
    runs = data["pair"]
    assert [len(runs[str(m)]) for m in (first, second)] == [2, 2]
    best = [min(r["seconds"]["evaluation"] for r in runs[str(m)]) for m in (first, second)]
    ratio = data["ratio"]
    assert ratio["evaluation"] == round(best[1] / best[0], 3)
    assert ratio["flops"] == 1.0  # the same model twice computes the same FLOPs
    assert lines[-2].startswith(f"{second} / {first}: evaluation {ratio['evaluation']:.2f}x (best of 2: ")
    assert lines[-2].endswith(f"useful FLOPs 1.00x, time per FLOP {ratio['per_flop']:.2f}x")


def test_against_refuses_a_cold_cache_one_output_directory_the_same_model_or_no_rounds(main_job: ModuleType) -> None:
    for args in (
        ["--against", "b", "--cold"],
        ["--against", "b", "--out", "x"],
        ["--against", "a"],
        ["--against", "b", "--rounds", "0"],
    ):
        with pytest.raises(SystemExit) as stop:
            main_job.main(["--model", "a", *args])
        assert stop.value.code == 2
