"""Numbers said in words: the sentences that open a summary figure and an audit card's findings.

A finding is a table, not a chain of ``if``: a :class:`Ladder` names the sentence each
threshold of one number earns; :func:`first_holding` picks the first sentence whose
condition holds where a finding weighs two numbers; :class:`MeanFinding` is the common
case of a summary figure, the mean of one number per item said by a ladder with the
detail sentence that states it. :func:`number` and :func:`clause` write the numbers
themselves ("n/a" for a missing one, a clause left out when its number is missing).

The ladders live in one catalogue, ``contllm/data/findings.json`` (:func:`ladder`,
:func:`mean_finding`), so that the wording of the findings that read one number is read
and edited in one place; each entry says which number it reads (a finding that weighs
several numbers keeps its rules beside its figure). An audit card's finding that is one ladder
and one sentence over the summary's values is declared there whole (:class:`CardSentence`).
"""

from __future__ import annotations

import math
import numbers
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

__all__ = [
    "CardSentence",
    "Ladder",
    "MeanFinding",
    "clause",
    "finite",
    "first_holding",
    "ladder",
    "mean_finding",
    "number",
]


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    """Whether ``value`` is a finite real number, numpy's included (not a bool, not None, not NaN or inf)."""
    return _real(value) and math.isfinite(value)


def number(value: Any, form: str = ".2f") -> str:
    """A summary value as a sentence writes it: ``format(value, form)``, "n/a" for a missing or NaN one."""
    if not _real(value) or math.isnan(value):
        return "n/a"
    return format(value, form)


def clause(value: Any, text: str, missing: str = "") -> str:
    """``text`` with ``value`` formatted into it (``text.format(value)``) where ``value`` is finite, ``missing``
    otherwise: the part of a sentence that only a known number can say."""
    return text.format(value) if finite(value) else missing


def first_holding(*rules: tuple[bool, str], otherwise: str) -> str:
    """The sentence of the first (condition, sentence) rule whose condition holds; ``otherwise`` where none does.

    The conditions are evaluated before the call, so each must be safe on its own (a
    comparison with NaN is False; guard a None with :func:`finite`)."""
    return next((sentence for holds, sentence in rules if holds), otherwise)


@dataclass(frozen=True)
class Ladder:
    """The sentence a number earns: the first step (threshold, sentence) that it reaches, ``below`` past every step,
    ``unknown`` for a missing or non-finite value.

    ``rising`` (the default): a value reaches a step at or above its threshold, steps
    highest first; ``rising=False``: at or below it, steps lowest first. ``strict``:
    above (below) the threshold, not at it.
    """

    steps: tuple[tuple[float, str], ...]
    below: str
    unknown: str
    rising: bool = True
    strict: bool = False

    def __call__(self, value: Any) -> str:
        if not finite(value):
            return self.unknown
        return next((sentence for threshold, sentence in self.steps if self.reaches(value, threshold)), self.below)

    def shifted(self, by: float) -> Ladder:
        """This ladder with every threshold moved by ``by`` (steps relative to a baseline, such as chance)."""
        return replace(self, steps=tuple((threshold + by, sentence) for threshold, sentence in self.steps))

    def reaches(self, value: float, threshold: float) -> bool:
        """Whether ``value`` reaches a step at ``threshold``."""
        if self.strict:
            return value > threshold if self.rising else value < threshold
        return value >= threshold if self.rising else value <= threshold


@dataclass(frozen=True)
class MeanFinding:
    """A summary figure's finding over items: the mean of one number per item (NaNs left out) said by ``ladder``,
    and ``detail``, the sentence that states it (formatted with ``value``, the mean, and ``count``, how many items
    gave a number)."""

    ladder: Ladder
    detail: str

    def __call__(self, values: Sequence[float]) -> tuple[str, str]:
        """(the sentence, the detail) for the items' ``values``; the ladder's unknown sentence where there are none."""
        value = float(np.nanmean(values)) if len(values) else float("nan")
        return self.ladder(value), self.detail.format(value=value, count=len(values))


@cache
def _catalogue() -> dict[str, Any]:
    import json

    text = resources.files("contllm.data").joinpath("findings.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def ladder(name: str) -> Ladder:
    """The ladder ``name`` of the catalogue (contllm/data/findings.json); KeyError for a name it does not hold."""
    entry = _catalogue()[name]
    return Ladder(
        tuple((float(step["at"]), str(step["say"])) for step in entry["steps"]),
        below=entry["below"],
        unknown=entry["unknown"],
        rising=bool(entry.get("rising", True)),
        strict=bool(entry.get("strict", False)),
    )


def mean_finding(name: str) -> MeanFinding:
    """The catalogue's ladder ``name`` with its detail sentence, as a :class:`MeanFinding`."""
    return MeanFinding(ladder(name), _catalogue()[name]["detail"])


class _SummaryFormatter(string.Formatter):
    """Formats a template with a summary's values: a missing or non-numeric value as "n/a" (:func:`number`; ".2f"
    where the template gives no format), a string (a verdict, a clause) as itself."""

    def get_value(self, key: int | str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return kwargs.get(str(key))

    def format_field(self, value: Any, format_spec: str) -> str:
        return value if isinstance(value, str) else number(value, format_spec or ".2f")


@dataclass(frozen=True)
class CardSentence:
    """An audit card's finding declared in the catalogue as entry ``name``: its ladder says the verdict on the
    summary's value ``reads``; its ``sentence`` template states the summary's values, its clauses each a part said
    only where their value is known (:func:`clause`). Called as a study's finding: (summary, intervals) -> str."""

    name: str

    def __call__(self, summary: Mapping[str, Any], intervals: Mapping[str, Any] | None = None) -> str:
        entry = _catalogue()[self.name]
        words = {
            key: clause(summary.get(part["reads"]), part["say"], part.get("missing", ""))
            for key, part in entry.get("clauses", {}).items()
        }
        verdict = ladder(self.name)(summary.get(entry["reads"]))
        return _SummaryFormatter().vformat(entry["sentence"], (), {**summary, **words, "verdict": verdict})
