"""Findings said in words: ladders, the catalogue of their sentences, card sentences and sweep labels."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from contllm.audits import studies
from contllm.experiments.boolean import BooleanExperiment
from contllm.experiments.counting import CountingExperiment
from contllm.experiments.sweeps import Sweep
from contllm.wording import CardSentence, Ladder, clause, finite, first_holding, ladder, mean_finding, number

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "contllm"
RISING = Ladder(((0.5, "high"), (0.2, "some")), below="low", unknown="unknown")


@pytest.mark.parametrize(
    ("value", "said"),
    [(0.9, "high"), (0.5, "high"), (0.3, "some"), (0.2, "some"), (0.1, "low"), (-3, "low"), (np.float32(0.6), "high")],
)
def test_a_rising_ladder_says_the_first_step_the_value_reaches(value: float, said: str) -> None:
    assert RISING(value) == said


@pytest.mark.parametrize("value", [None, float("nan"), float("inf"), True, "0.9"])
def test_a_missing_or_non_finite_value_is_unknown(value: object) -> None:
    assert RISING(value) == "unknown"


def test_falling_strict_and_shifted_ladders() -> None:
    falling = Ladder(((0.1, "stays"),), below="leaves", unknown="?", rising=False)
    assert [falling(v) for v in (0.0, 0.1, 0.11)] == ["stays", "stays", "leaves"]
    strict = Ladder(((0.5, "above"),), below="not", unknown="?", strict=True)
    assert [strict(v) for v in (0.5, 0.51)] == ["not", "above"]
    assert RISING.shifted(0.25)(0.5) == "some" and RISING.shifted(0.25)(0.75) == "high"


def test_numbers_clauses_and_rules() -> None:
    assert number(0.123) == "0.12" and number(0.5, ".0%") == "50%" and number(None) == "n/a" and number(True) == "n/a"
    assert number(np.float64("nan")) == "n/a" and finite(np.int64(3)) and not finite(float("inf"))
    assert clause(0.25, "; {:.0%} cross") == "; 25% cross" and clause(None, "; {:.0%} cross", "none") == "none"
    assert first_holding((False, "a"), (True, "b"), (True, "c"), otherwise="d") == "b"
    assert first_holding((False, "a"), otherwise="d") == "d"


def test_a_mean_finding_skips_nans_and_counts_the_items() -> None:
    moves = mean_finding("interpolation_moves")
    sentence, detail = moves([0.5, float("nan"), 0.3])
    assert sentence.startswith("The answer moves with the word") and "+0.40" in detail and "over 3 questions" in detail
    assert moves([])[0] == "The answer along the path from one word to the other"


def test_card_sentences_state_the_summary() -> None:
    said = studies.sums_finding({"mean_spearman": 0.8, "valid_rate": 0.75, "successful_rate": 0.5}, {})
    assert said == (
        "A shortened number weighs less in the sum: the implied sum follows the factor with Spearman 0.80; 75% of "
        "problems are valid (the right first digit at factor 1), of those, 50% move toward the shrunk outputs at some "
        "factor (the paper's success rate)."
    )
    said = studies.sums_finding({"mean_spearman": 0.5}, {})  # strict: 0.5 is not above 0.5
    assert said.startswith("No sign") and "n/a of problems" in said and "has no problem to count" in said
    said = studies.interpolation_finding({"variation_share": 0.05, "mean_lipschitz": 1.234}, {})
    assert said == (
        "Along the word's interpolation P(yes) and P(no) stay between their values at the two words: 5% of items "
        "leave it by 0.05 or more, and the paper's Lipschitz estimate is 1.23 (1 for a straight line)."
    )
    assert studies.linearity_finding({}, {}).startswith("The read-outs are flat along the paths: R² of the chord n/a")


def _catalogue() -> dict[str, dict]:
    data = json.loads(resources.files("contllm.data").joinpath("findings.json").read_text(encoding="utf-8"))
    return {name: entry for name, entry in data.items() if isinstance(entry, dict)}


def test_every_catalogue_entry_is_ordered_and_used_and_every_use_is_in_it() -> None:
    entries = _catalogue()
    for name, entry in entries.items():
        steps = [step["at"] for step in entry["steps"]]
        rising = entry.get("rising", True)
        assert steps == sorted(steps, reverse=rising), f"{name}: steps out of order"
        ladder(name)  # loads
        for key in ("about", "below", "unknown"):
            assert entry[key], f"{name}: no {key}"
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    used = set(re.findall(r'(?:ladder|mean_finding|CardSentence)\("([a-z_]+)"\)', source))
    assert used == set(entries), f"used but missing: {used - set(entries)}; unused: {set(entries) - used}"


def test_a_card_sentence_names_only_what_its_entry_holds() -> None:
    with pytest.raises(KeyError):
        CardSentence("no_such_finding")({}, {})


def test_a_sweep_label_fills_in_the_meta_and_says_none_for_what_it_lacks() -> None:
    sweep = Sweep("b1", np.zeros(2), ["0", "1"], np.full((2, 2), 0.5), None, {"first": "AND", "second": "XOR", "a": 1})
    assert BooleanExperiment().describe(sweep) == "AND -> XOR on (1, None), None"
    counting = Sweep("c1", np.zeros(2), ["0"], np.full((2, 1), 0.5), "3", {"word": "apple", "n": 3})
    assert CountingExperiment().describe(counting) == '"apple" x 3'
