"""The project's own datasets, shipped as JSON next to this module and loaded into typed items.

- ``counting.json``: concrete nouns to repeat n times (n in 2..6) in a counting question.
- ``events.json``: short stories and step-by-step tutorials of n events (n in 3..7).
- ``boolean.json``: binary Boolean operators and their truth tables over (0,0), (0,1), (1,0), (1,1).

Items are interleaved over category, kind and n, so the first N items of a dataset are a
balanced sample; :func:`select_items` picks the first N or a list of ids. Every loader
validates its file and raises :class:`~contllm.errors.ExperimentError` when it is malformed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Protocol, TypeVar

from contllm.errors import ExperimentError

__all__ = [
    "COUNT_RANGE",
    "EVENT_KINDS",
    "EVENT_RANGE",
    "BooleanTable",
    "CountingItem",
    "EventItem",
    "load_boolean",
    "load_counting",
    "load_events",
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
    """

    id: str
    word: str
    article: str
    category: str
    n: int
    multi_token: bool


@dataclass(frozen=True)
class EventItem:
    """A passage of ``n`` events, one sentence each, and a question about how many there were.

    ``kind`` is "story" (one person's actions) or "tutorial" (imperative steps). Each event
    occurs exactly once in :attr:`passage`, so its character span there is unambiguous.
    ``answer_prefix`` is the text the model continues with the count ("Answer: Mara took").
    """

    id: str
    kind: str
    events: tuple[str, ...]
    question: str
    answer_prefix: str
    n: int

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
            raise ExperimentError(
                f"unknown Boolean operator {op!r}; known operators: {', '.join(self.operators)}"
            )
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
        text = resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as err:
        raise ExperimentError(f"cannot read dataset {filename}: {err}") from err
    if not isinstance(data, dict):
        raise ExperimentError(
            f"dataset {filename} must hold a JSON object, got {type(data).__name__}"
        )
    return data


def _field(raw: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(raw, dict) or key not in raw:
        raise ExperimentError(f"{where}: missing field {key!r}")
    value = raw[key]
    # bool is a subclass of int; a count of True is a malformed file, not 1.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ExperimentError(
            f"{where}: field {key!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _items(filename: str) -> list[Any]:
    items = _read(filename).get("items")
    if not isinstance(items, list) or not items:
        raise ExperimentError(f"dataset {filename} must hold a non-empty list 'items'")
    return items


def _check_unique_ids(ids: Sequence[str], filename: str) -> None:
    seen: set[str] = set()
    for item_id in ids:
        if item_id in seen:
            raise ExperimentError(f"dataset {filename}: item id {item_id!r} occurs more than once")
        seen.add(item_id)


def _check_n(n: int, bounds: tuple[int, int], where: str) -> None:
    if not bounds[0] <= n <= bounds[1]:
        raise ExperimentError(f"{where}: n = {n} is outside {bounds[0]}..{bounds[1]}")


@lru_cache(maxsize=1)
def _counting() -> tuple[CountingItem, ...]:
    filename = "counting.json"
    items = []
    for position, raw in enumerate(_items(filename)):
        where = f"{filename} item {raw.get('id', position) if isinstance(raw, dict) else position}"
        item = CountingItem(
            id=_field(raw, "id", str, where),
            word=_field(raw, "word", str, where),
            article=_field(raw, "article", str, where),
            category=_field(raw, "category", str, where),
            n=_field(raw, "n", int, where),
            multi_token=_field(raw, "multi_token", bool, where),
        )
        _check_n(item.n, COUNT_RANGE, where)
        if not item.article.endswith(" " + item.word):
            raise ExperimentError(f"{where}: article {item.article!r} does not end with the word")
        items.append(item)
    _check_unique_ids([item.id for item in items], filename)
    return tuple(items)


@lru_cache(maxsize=1)
def _events() -> tuple[EventItem, ...]:
    filename = "events.json"
    items = []
    for position, raw in enumerate(_items(filename)):
        where = f"{filename} item {raw.get('id', position) if isinstance(raw, dict) else position}"
        events = _field(raw, "events", list, where)
        if not all(isinstance(event, str) and event.strip() for event in events):
            raise ExperimentError(f"{where}: every event must be a non-empty string")
        item = EventItem(
            id=_field(raw, "id", str, where),
            kind=_field(raw, "kind", str, where),
            events=tuple(events),
            question=_field(raw, "question", str, where),
            answer_prefix=_field(raw, "answer_prefix", str, where),
            n=_field(raw, "n", int, where),
        )
        if item.kind not in EVENT_KINDS:
            raise ExperimentError(
                f"{where}: kind {item.kind!r} is not one of {', '.join(EVENT_KINDS)}"
            )
        if item.n != len(item.events):
            raise ExperimentError(f"{where}: n = {item.n} but it lists {len(item.events)} events")
        _check_n(item.n, EVENT_RANGE, where)
        for event in item.events:
            if item.passage.count(event) != 1:
                raise ExperimentError(f"{where}: event {event!r} does not occur exactly once")
        items.append(item)
    _check_unique_ids([item.id for item in items], filename)
    return tuple(items)


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
            raise ExperimentError(
                f"{filename} operator {name}: 'truth' must hold 4 values, each 0 or 1"
            )
        if name != name.upper() or name in names:
            raise ExperimentError(
                f"{filename} operator {name}: names must be upper case and unique"
            )
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
