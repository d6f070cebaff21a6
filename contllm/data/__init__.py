"""The project's datasets: the built-in files next to this package, a user's ``--data`` files and the paper's shapes.

The item types, the one reader per dataset schema and the built-in loaders live in
:mod:`contllm.data.items`; rows of a file in :mod:`contllm.data.user`; the paper's row
shapes in :mod:`contllm.data.paper`. This module only re-exports.
"""

from __future__ import annotations

from contllm.data.items import (
    COUNT_RANGE,
    COUNTING_SCHEMA,
    EVENT_KINDS,
    EVENT_RANGE,
    EVENTS_SCHEMA,
    BooleanTable,
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

__all__ = [
    "COUNT_RANGE",
    "COUNTING_SCHEMA",
    "EVENT_KINDS",
    "EVENT_RANGE",
    "EVENTS_SCHEMA",
    "BooleanTable",
    "CountingItem",
    "EventItem",
    "builtin_path",
    "load_boolean",
    "load_counting",
    "load_events",
    "read_counting",
    "read_events",
    "select_items",
]
