"""The paper's own dataset files, read as they are and turned into rows of the project's schema.

"Language Models Are Implicitly Continuous" (ICLR 2025) keeps its counting, event and
sum items in files whose rows have fields of their own. ``--data FILE`` takes either
layout; a file is in the paper's shape when its first row has every field of that shape
(:data:`COUNTING_FIELDS`, :data:`EVENTS_FIELDS`, :data:`SUMS_FIELDS`). The functions here
read such rows and return rows of the project's schema (the fields the experiments'
readers ask for), keeping the file and row number, so that every problem is still one
:class:`~contllm.errors.ExperimentError` naming the file, the row and the paper's field.
A file in the project's schema passes through unchanged.

What the paper's fields become:

- counting: ``word``, ``repetitions`` (n, or a list of counts: one item each),
  ``category`` and ``category_with_article`` ("a fruit"), which fills the counting
  templates' ``{article}`` field, the thing the paper's question asks about.
- events: ``sentence`` is a whole prompt: the events, a question (the last sentence
  ending in "?", without a "Question:" label) and, after it, the answer prefix. The
  events are the lines starting with "- " when there are any, else the sentences
  (ending in "." or "!") after an introduction ending in ":"; ``num_sentences`` must
  equal their number.
- sums: ``template`` holds ``{item_1}`` and ``{item_2}`` (and optionally ``{name}``),
  filled from ``fields``; ``shrink_1`` true scales item_1, false item_2.

Words and events are then addressed by character span, the project's rule; the paper
selects tokens by searching decoded tokens, which differs where a word is glued to a
quote or a comma sits between repetitions (see the README).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from typing import Any

from contllm.data.user import Row
from contllm.numerals import as_integer

__all__ = [
    "COUNTING_FIELDS",
    "EVENTS_FIELDS",
    "SUMS_FIELDS",
    "PAPER_COUNTS",
    "counting_rows",
    "refuse_material",
    "events_rows",
    "in_shape",
    "parse_passage",
    "sums_rows",
]

COUNTING_FIELDS = ("word", "category", "category_with_article")
#: The counts the paper's script asks each word of ``words.json`` (which has no ``repetitions``) with.
PAPER_COUNTS = (3, 4, 5)
EVENTS_FIELDS = ("sentence", "num_sentences")
SUMS_FIELDS = ("template", "fields", "shrink_1")

#: Counts and numbers of events are read out as one digit.
MOST = 9


def in_shape(rows: Sequence[Row], fields: Sequence[str]) -> bool:
    """True when the file's first row has every one of ``fields`` (the paper's shape)."""
    return bool(rows) and all(name in rows[0].fields for name in fields)


def _digit_count(row: Row, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MOST:
        raise row.error(f"must be a whole number from 1 to {MOST} (a digit is read out), got {value!r}", name)
    return value


def _converted(rows: Sequence[Row], fields: Sequence[str], convert: Callable[[Row], list[dict[str, Any]]]) -> list[Row]:
    """``rows`` as they are unless they are in the paper's shape (``fields``); then each becomes the rows ``convert`` gives.

    A file of the paper's generation materials is refused first (:func:`refuse_material`).
    """
    refuse_material(rows)
    if not in_shape(rows, fields):
        return list(rows)
    return [Row(row.path, row.number, new) for row in rows for new in convert(row)]


def counting_rows(rows: Sequence[Row]) -> list[Row]:
    """Rows of the project's counting schema (id, word, n, article, category); the paper's converted."""
    return _converted(rows, COUNTING_FIELDS, _counting_fields)


def _counting_fields(row: Row) -> list[dict[str, Any]]:
    word = row.get("word")
    category = row.get("category")
    article = row.get("category_with_article")
    counts = row.get("repetitions", (int, list), default=list(PAPER_COUNTS))
    many = isinstance(counts, list)
    if many and not counts:
        raise row.error("is an empty list", "repetitions")
    out = []
    for n in counts if many else [counts]:
        if row.csv and isinstance(n, str) and as_integer(n) is not None:
            n = as_integer(n)
        n = _digit_count(row, "repetitions", n)
        item_id = f"count-{row.number:03d}" + (f"-{n}" if many else "")
        out.append({"id": item_id, "word": word, "n": n, "article": article, "category": category})
    return out


_LABEL = re.compile(r"[^\n.!?]*:\s*$")  # a trailing "Question:" label before the question
_DASH = re.compile(r"^\s*-\s+(.*\S)\s*$")
_SENTENCE_END = re.compile(r"(?<=[.!])\s+")


def parse_passage(text: str) -> tuple[list[str], str, str]:
    """A whole event prompt split into (events, question, answer prefix); ValueError saying what is missing.

    The question is the last sentence ending in "?" (without a "Question:"-style label);
    the answer prefix is what follows it. The events come from the text before the
    question: its lines starting with "- " if there are any, else its sentences (split
    after "." or "!"), after an introduction ending in ":" if there is one.
    """
    end = text.rfind("?")
    if end < 0:
        raise ValueError("has no question (a sentence ending in '?')")
    prefix = text[end + 1 :].strip()
    if not prefix:
        raise ValueError("must end in an answer prefix after the question (e.g. 'Answer: Tom took')")
    start = max(text.rfind(ch, 0, end) for ch in ".!?:\n") + 1
    question = text[start : end + 1].strip()
    before = _LABEL.sub("", text[:start])
    dashes = [m.group(1) for m in map(_DASH.match, before.splitlines()) if m]
    if dashes:
        return dashes, question, prefix
    block = before[before.rfind(":") + 1 :] if ":" in before else before
    sentences = [s.strip() for s in _SENTENCE_END.split(block.strip()) if s.strip()]
    if not sentences:
        raise ValueError("has no events before its question")
    return sentences, question, prefix


def events_rows(rows: Sequence[Row]) -> list[Row]:
    """Rows of the project's events schema (id, kind, events, question, answer_prefix, n); the paper's converted."""
    return _converted(rows, EVENTS_FIELDS, _events_fields)


def _events_fields(row: Row) -> list[dict[str, Any]]:
    text = row.get("sentence")
    n = _digit_count(row, "num_sentences", row.get("num_sentences", int))
    try:
        events, question, prefix = parse_passage(text)
    except ValueError as err:
        raise row.error(str(err), "sentence") from None
    dashed = any(_DASH.match(line) for line in text.splitlines())
    if not dashed and len(events) == n + 1:
        events = events[1:]  # the story's opening sentence sets the scene; it is not an event
    if len(events) != n:
        how = "lines starting with '- '" if dashed else "sentences, the first one a prelude"
        raise row.error(f"holds {len(events)} events ({how}) but num_sentences is {n}", "sentence")
    return [
        {
            "id": f"passage-{row.number:03d}",
            "kind": "tutorial" if dashed else "story",
            "events": events,
            "question": question,
            "answer_prefix": prefix,
            "n": n,
            "prompt": text,
        }
    ]


def _whole(row: Row, name: str, value: Any) -> int:
    if isinstance(value, str) and as_integer(value) is not None:
        value = as_integer(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise row.error(f"must be a whole number >= 0, got {value!r}", name)
    return value


def _renamed(row: Row, template: str, names: dict[str, str]) -> str:
    """``template`` with its {fields} renamed by ``names`` (literal braces kept); an error for any other field."""
    parts = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise row.error(f"is not a valid template ({err})", "template") from None
    for literal, name, spec, conversion in parsed:
        parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is None:
            continue
        if name not in names or spec or conversion:
            known = ", ".join("{" + k + "}" for k in names)
            raise row.error(f"has the field {{{name}}}; a sums template takes {known}", "template")
        parts.append("{" + names[name] + "}")
    return "".join(parts)


def sums_rows(rows: Sequence[Row]) -> list[Row]:
    """Rows of the project's sums schema (id, problem, name, first, second, scaled); the paper's converted."""
    return _converted(rows, SUMS_FIELDS, _sums_fields)


def _sums_fields(row: Row) -> list[dict[str, Any]]:
    template = row.get("template")
    values = row.get("fields", dict)
    numbers = []
    for key in ("item_1", "item_2"):
        if values.get(key) is None:
            raise row.error("missing", f"fields.{key}")
        numbers.append(_whole(row, f"fields.{key}", values[key]))
    first, second = numbers
    name = values.get("name", "")
    if not isinstance(name, str):
        raise row.error(f"must be a string, got {name!r}", "fields.name")
    problem = _renamed(row, template, {"item_1": "first", "item_2": "second", "name": "name"})
    for field in ("first", "second"):
        if "{" + field + "}" not in problem:
            raise row.error(f"has no {{item_{1 if field == 'first' else 2}}} field", "template")
    shrink = row.get("shrink_1", (bool, int))
    if shrink not in (True, False, 0, 1):
        raise row.error(f"must be true or false, got {shrink!r}", "shrink_1")
    return [
        {
            "id": f"sum-{row.number:03d}",
            "problem": problem,
            "name": name or None,
            "first": first,
            "second": second,
            "scaled": "first" if shrink else "second",
        }
    ]


#: The paper's files that hold the material its datasets were generated from, not an
#: experiment's input: (fields that mark a row of one, what it is, which file to give instead).
MATERIAL = (
    (
        ("prelude", "sentences"),
        "the paper's material for generating stories (counting_events_raw.json)",
        "counting_events.json or counting_events_seq.json",
    ),
    (
        ("formula",),
        "the paper's material for generating sums (sums_raw.json: candidate lists and a formula)",
        "sums.json",
    ),
)


def refuse_material(rows: Sequence[Row]) -> None:
    """ExperimentError of one line when the file is one of the paper's generation materials (:data:`MATERIAL`)."""
    if not rows:
        return
    for fields, what, instead in MATERIAL:
        if all(name in rows[0].fields for name in fields):
            raise rows[0].error(f"this file is {what}, not an experiment's input; give {instead}")
