"""The project's own datasets and their items: one reader per schema, for the built-in files and ``--data`` alike.

- ``counting.json``: concrete nouns to repeat n times (n in 2..6) in a counting question.
- ``events.json``: short stories and step-by-step tutorials of n events (n in 3..7).
- ``boolean.json``: binary Boolean operators and their truth tables over (0,0), (0,1), (1,0), (1,1).

Items are interleaved over category, kind and n, so the first N items of a dataset are a
balanced sample; :func:`select_items` picks the first N or a list of ids. Every loader
validates its file and raises :class:`~contllm.errors.ExperimentError` when it is malformed.
The counting and events files are read by :func:`read_counting` and :func:`read_events`,
the same readers that read a user's ``--data`` file (and the paper's shapes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, TypeVar

from contllm.data.paper import COUNTING_FIELDS, EVENTS_FIELDS, counting_rows, events_rows
from contllm.data.user import Row, read_items
from contllm.errors import ExperimentError

__all__ = [
    "COUNT_RANGE",
    "EVENT_KINDS",
    "EVENT_RANGE",
    "BooleanTable",
    "CountingItem",
    "EventItem",
    "COUNTING_SCHEMA",
    "EVENTS_SCHEMA",
    "builtin_path",
    "load_boolean",
    "load_counting",
    "load_events",
    "read_counting",
    "read_events",
    "select_items",
]

COUNT_RANGE: tuple[int, int] = (2, 6)
"""Smallest and largest repetition count n of a counting item (inclusive)."""

EVENT_RANGE: tuple[int, int] = (3, 7)
"""Smallest and largest number of events n of an event passage (inclusive)."""

EVENT_KINDS: tuple[str, ...] = ("story", "tutorial")


@dataclass(frozen=True)
class CountingItem:
    """A word to repeat ``n`` times in a counting prompt.

    ``category`` is the plural phrase for the kind of thing ("fruits", "pieces of furniture");
    ``article`` is the word with its indefinite article ("an apple"); ``multi_token`` is true
    when the word with a leading space is split into several tokens by the SmolLM2 tokenizer
    (GPT-2 style BPE), so duration scaling acts on more than one token per occurrence.
    ``asked`` is what the paper's question asks about, the category with its article ("a
    fruit"); empty where ``article`` is that already (the paper's rows).
    """

    id: str
    word: str
    article: str
    category: str
    n: int
    multi_token: bool
    asked: str = ""


@dataclass(frozen=True)
class EventItem:
    """A passage of ``n`` events, one sentence each, and a question about how many there were.

    ``kind`` is "story" (one person's actions) or "tutorial" (imperative steps). Each event
    occurs exactly once in :attr:`passage`, so its character span there is unambiguous.
    ``answer_prefix`` is the text the model continues with the count ("Answer: Mara took").
    ``prompt``: a whole prompt as a dataset file gives it (the paper's ``sentence``), holding
    the events in order; None when the prompt is built from a template.
    """

    id: str
    kind: str
    events: tuple[str, ...]
    question: str
    answer_prefix: str
    n: int
    prompt: str | None = None

    def event_spans(self) -> list[tuple[int, int]]:
        """The character span of each event in :attr:`prompt`, found in order; ValueError naming one that is missing."""
        if self.prompt is None:
            raise ValueError("the item has no prompt of its own")
        spans, start = [], 0
        for event in self.events:
            at = self.prompt.find(event, start)
            if at < 0:
                raise ValueError(f"event {event!r} is not in the prompt after the events before it")
            spans.append((at, at + len(event)))
            start = at + len(event)
        return spans

    @property
    def passage(self) -> str:
        """The events joined by single spaces, in order."""
        return " ".join(self.events)


@dataclass(frozen=True)
class BooleanTable:
    """Binary Boolean operators and their truth tables.

    ``operators``: operator names in file order ("AND", "OR", ...); ``pairs``: the input pairs
    (a, b) in the order of every truth table; ``words``: each operator as written in prompts,
    aligned with ``operators``; ``tables``: each operator's results over ``pairs``.
    Operator names are matched case-insensitively.
    """

    operators: tuple[str, ...]
    pairs: tuple[tuple[int, int], ...]
    words: tuple[str, ...]
    tables: tuple[tuple[int, ...], ...]

    def _index(self, op: str) -> int:
        name = op.upper() if isinstance(op, str) else op
        if name not in self.operators:
            raise ExperimentError(f"unknown Boolean operator {op!r}; known operators: {', '.join(self.operators)}")
        return self.operators.index(name)

    def truth(self, op: str, a: int, b: int) -> int:
        """The value (0 or 1) of ``a op b`` for inputs a, b in {0, 1}."""
        if (a, b) not in self.pairs:
            raise ExperimentError(f"Boolean inputs must be 0 or 1, got a={a!r}, b={b!r}")
        return self.tables[self._index(op)][self.pairs.index((a, b))]

    def table(self, op: str) -> tuple[int, ...]:
        """The operator's results over :attr:`pairs`, in that order."""
        return self.tables[self._index(op)]

    def word(self, op: str) -> str:
        """The operator as written in prompts ("AND", "IMPLIES")."""
        return self.words[self._index(op)]


def _read(filename: str) -> dict[str, Any]:
    try:
        text = resources.files("contllm.data").joinpath(filename).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as err:
        raise ExperimentError(f"cannot read dataset {filename}: {err}") from None
    if not isinstance(data, dict):
        raise ExperimentError(f"dataset {filename} must hold a JSON object, got {type(data).__name__}")
    return data


def _field(raw: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(raw, dict) or key not in raw:
        raise ExperimentError(f"{where}: missing field {key!r}")
    value = raw[key]
    # bool is a subclass of int; a count of True is a malformed file, not 1.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ExperimentError(f"{where}: field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


#: What a row of a counting dataset holds (the built-in file and --data alike).
COUNTING_SCHEMA = (
    "word, n (1-9) and optionally id, article ('an apple'), category ('fruits'), multi_token, asked (what the "
    "paper's question asks about, 'a fruit'); or the paper's "
    + ", ".join(COUNTING_FIELDS)
    + " (repetitions: a count or a list of counts; without it each word is asked 3, 4 and 5 times)"
)

#: What a row of an events dataset holds (the built-in file and --data alike).
EVENTS_SCHEMA = (
    "events (a list of sentences, 1-9), question, answer_prefix and optionally id, kind, prompt (a whole prompt "
    "holding the events); or the paper's "
    + ", ".join(EVENTS_FIELDS)
    + " (the whole prompt, ending in its answer prefix)"
)


def _digit(value: int) -> str | None:
    return None if 1 <= value <= 9 else f"must be from 1 to 9 (a digit is read out), got {value}"


def _counting_item(row: Row) -> CountingItem:
    word = row.get("word")
    article = row.get("article", str, default=f"{'an' if word[0].lower() in 'aeiou' else 'a'} {word}")
    return CountingItem(
        id=row.get("id", str, default=f"count-{row.number:03d}"),
        word=word,
        article=article,
        category=row.get("category", str, default="things"),
        n=row.get("n", int, check=_digit),
        multi_token=row.get("multi_token", bool, default=False),
        asked=row.get("asked", str, default=""),
    )


def _event_item(row: Row) -> EventItem:
    events = row.strings("events")
    if len(events) > 9:
        raise row.error(f"holds {len(events)} events; at most 9 (a digit is read out)", "events")
    n = row.get("n", int, default=len(events))
    if n != len(events):
        raise row.error(f"is {n} but the row lists {len(events)} events", "n")
    item = EventItem(
        id=row.get("id", str, default=f"passage-{row.number:03d}"),
        kind=row.get("kind", str, default="passage"),
        events=tuple(events),
        question=row.get("question"),
        answer_prefix=row.get("answer_prefix"),
        n=n,
        prompt=row.get("prompt", str, default=None),
    )
    if item.prompt is not None:
        try:
            item.event_spans()
        except ValueError as err:
            raise row.error(str(err), "prompt") from None
    return item


def read_counting(path: str | Path) -> list[CountingItem]:
    """The counting items of a dataset file (:data:`COUNTING_SCHEMA`); ExperimentError naming file, row and field."""
    return read_items(path, _counting_item, counting_rows)


def read_events(path: str | Path) -> list[EventItem]:
    """The event passages of a dataset file (:data:`EVENTS_SCHEMA`); ExperimentError naming file, row and field."""
    return read_items(path, _event_item, events_rows)


def builtin_path(filename: str) -> Path:
    """Where a built-in dataset file lies (inside the installed package)."""
    return Path(__file__).with_name(filename)


@lru_cache(maxsize=1)
def _counting() -> tuple[CountingItem, ...]:
    return tuple(read_counting(builtin_path("counting.json")))


@lru_cache(maxsize=1)
def _events() -> tuple[EventItem, ...]:
    return tuple(read_events(builtin_path("events.json")))


@lru_cache(maxsize=1)
def _boolean() -> BooleanTable:
    filename = "boolean.json"
    data = _read(filename)
    raw_pairs = _field(data, "pairs", list, filename)
    pairs = tuple(tuple(pair) for pair in raw_pairs if isinstance(pair, list))
    if sorted(pairs) != [(0, 0), (0, 1), (1, 0), (1, 1)] or len(pairs) != len(raw_pairs):
        raise ExperimentError(f"{filename}: 'pairs' must list (0,0), (0,1), (1,0), (1,1) once each")
    names, words, tables = [], [], []
    for position, raw in enumerate(_field(data, "operators", list, filename)):
        where = f"{filename} operator {position}"
        name = _field(raw, "name", str, where)
        truth = _field(raw, "truth", list, f"{filename} operator {name}")
        bits = all(value in (0, 1) and not isinstance(value, bool) for value in truth)
        if len(truth) != len(pairs) or not bits:
            raise ExperimentError(f"{filename} operator {name}: 'truth' must hold 4 values, each 0 or 1")
        if name != name.upper() or name in names:
            raise ExperimentError(f"{filename} operator {name}: names must be upper case and unique")
        names.append(name)
        words.append(_field(raw, "word", str, f"{filename} operator {name}"))
        tables.append(tuple(truth))
    return BooleanTable(
        operators=tuple(names),
        pairs=pairs,  # type: ignore[arg-type]  # checked above to be pairs of ints
        words=tuple(words),
        tables=tuple(tables),
    )


def load_counting() -> list[CountingItem]:
    """All counting items, in file order (balanced over category and n)."""
    return list(_counting())


def load_events() -> list[EventItem]:
    """All event passages, in file order (balanced over kind and n)."""
    return list(_events())


def load_boolean() -> BooleanTable:
    """The Boolean operators and their truth tables."""
    return _boolean()


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


ItemT = TypeVar("ItemT", bound=_HasId)


def select_items(items: Sequence[ItemT], spec: str | int | None) -> list[ItemT]:
    """Pick items by a spec: None for all, N or "N" for the first N, or "id1,id2" for those ids.

    Ids keep the order given in the spec (repeats are dropped). Raises ExperimentError for a
    non-positive N, an N larger than the dataset, an empty spec or an unknown id.
    """
    if spec is None:
        return list(items)
    if isinstance(spec, bool) or not isinstance(spec, (int, str)):
        raise ExperimentError(f"item spec must be a count or comma-separated ids, got {spec!r}")
    if isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ExperimentError("item spec is empty; give a count N or comma-separated item ids")
        if re.fullmatch(r"[+-]?\d+", text):
            spec = int(text)
    if isinstance(spec, int):
        if spec <= 0:
            raise ExperimentError(f"item count must be positive, got {spec}")
        if spec > len(items):
            raise ExperimentError(f"asked for {spec} items but the dataset has {len(items)}")
        return list(items[:spec])

    by_id = {item.id: item for item in items}
    if spec in by_id:  # an id that itself holds a comma is selected whole
        return [by_id[spec]]
    wanted = list(dict.fromkeys(part.strip() for part in spec.split(",") if part.strip()))
    unknown = [item_id for item_id in wanted if item_id not in by_id]
    if unknown:
        examples = ", ".join(repr(item.id) for item in items[:2])
        raise ExperimentError(
            f"unknown item id{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"ids look like {examples}, ... ({len(items)} items)"
        )
    if not wanted:
        raise ExperimentError("item spec lists no ids; give a count N or comma-separated item ids")
    return [by_id[item_id] for item_id in wanted]
