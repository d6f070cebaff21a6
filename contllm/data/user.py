"""A user's own dataset file (``--data FILE``): JSON, JSON Lines or CSV, read into rows.

Every experiment that takes ``--data`` reads the file with :func:`read_rows` and turns
each :class:`Row` into its items, asking for fields with :meth:`Row.get`; any problem is
an :class:`~contllm.errors.ExperimentError` of one line that names the file, the row
(1-based, as a user counts them; for CSV the header is line 1, so row 1 is line 2) and
the field. Nothing here loads a model or writes a file, so a malformed dataset is
refused before a run starts.

Accepted layouts:

- ``.json``: a list of objects, or an object holding that list under ``"items"`` (or
  under another single key whose value is a list of objects).
- ``.jsonl`` / ``.ndjson``: one object per non-empty line.
- ``.csv``: a header row, then one row per item; cells are strings, and
  :meth:`Row.get` converts them to the type asked for (lists are written as JSON,
  ``["a", "b"]``, or separated by ``|``).
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from contllm.errors import ExperimentError
from contllm.numerals import as_integer, as_number
from contllm.rundir.files import parse_json

__all__ = ["Row", "read_rows", "data_option_help", "file_sha256", "read_data_file", "unique_ids"]

if TYPE_CHECKING:  # only in annotations: the data files do not import the experiments at run time
    from contllm.experiments.base import Item

#: An item of a dataset: anything with a string ``id``.
ItemT = TypeVar("ItemT", bound="Item")

_MISSING = object()

#: Largest dataset file read (bytes): items are held in memory, and a mistaken path to a
#: model file should be one line, not a long wait.
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Row:
    """One row of a dataset file: its fields, where it came from, and typed access to them."""

    path: str
    number: int  # 1-based
    fields: dict[str, Any]
    csv: bool = False

    @property
    def where(self) -> str:
        return f"{self.path}: row {self.number}"

    def error(self, message: str, field: str | None = None) -> ExperimentError:
        """An error naming the file, this row and (when given) the field."""
        at = f", field {field!r}" if field is not None else ""
        return ExperimentError(f"{self.where}{at}: {message}")

    def has(self, name: str) -> bool:
        value = self.fields.get(name)
        return value is not None and not (self.csv and value == "")

    def get(
        self,
        name: str,
        kind: type | tuple[type, ...] = str,
        default: Any = _MISSING,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        """Field ``name`` as ``kind`` (str, int, float, bool, list or dict); ``default`` when absent.

        ``check(value)`` may return a message saying what is wrong with the value. Raises
        ExperimentError naming the file, row and field.
        """
        if not self.has(name):
            if default is not _MISSING:
                return default
            raise self.error("missing", name)
        value = self.fields[name]
        if self.csv and isinstance(value, str):
            value = _from_cell(value, kind, lambda message: self.error(message, name))
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if int in kinds and float not in kinds and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(f"must be {_names(kinds)}, got a boolean", name)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            raise self.error(f"must be {_names(kinds)}, got {type(value).__name__} {_short(value)}", name)
        if isinstance(value, str) and not value.strip():
            raise self.error("is empty", name)
        if check is not None:
            problem = check(value)
            if problem:
                raise self.error(problem, name)
        return value

    def strings(self, name: str, default: Any = _MISSING, *, min_length: int = 1) -> list[str]:
        """Field ``name`` as a non-empty list of non-empty strings."""
        value = self.get(name, list, default)
        if value is default and default is not _MISSING:
            return value
        if len(value) < min_length or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.error(f"must be a list of at least {min_length} non-empty string(s)", name)
        return [str(v) for v in value]


def _names(kinds: tuple[type, ...]) -> str:
    words = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(words.get(k, k.__name__) for k in kinds)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _from_cell(text: str, kind: type | tuple[type, ...], error: Callable[[str], ExperimentError]) -> Any:
    """A CSV cell converted to the first of ``kind`` it reads as."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    stripped = text.strip()
    for k in kinds:
        if k is str:
            return text
        if k is bool and stripped.lower() in ("true", "false", "1", "0", "yes", "no"):
            return stripped.lower() in ("true", "1", "yes")
        if k is int and as_integer(stripped) is not None:
            return as_integer(stripped)
        if k is float and as_number(stripped) is not None:
            return as_number(stripped)
        if k in (list, dict):
            if stripped.startswith(("[", "{")):
                try:
                    value = parse_json(stripped, "cell", ExperimentError)
                except ExperimentError:
                    raise error("is not valid JSON") from None
                if isinstance(value, k):
                    return value
            elif k is list:
                return [part.strip() for part in text.split("|") if part.strip()]
    raise error(f"must be {_names(kinds)}, got {_short(text)}")


def read_rows(path: str | Path) -> list[Row]:
    """Every row of a dataset file (JSON, JSON Lines or CSV, by its suffix); ExperimentError if unreadable or empty."""
    p = Path(path)
    name = str(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".jsonl", ".ndjson", ".csv"):
        raise ExperimentError(f"{name}: a dataset file must end in .json, .jsonl or .csv")
    try:
        if not p.is_file():
            raise ExperimentError(f"{name}: no such file" if not p.exists() else f"{name}: not a file")
        if p.stat().st_size > MAX_BYTES:
            raise ExperimentError(f"{name}: larger than {MAX_BYTES // (1024 * 1024)} MiB; is this a dataset file?")
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ExperimentError(f"{name}: not UTF-8 text") from None
    except OSError as err:
        raise ExperimentError(f"{name}: cannot read: {err.strerror or err}") from None
    if suffix == ".csv":
        rows = _csv_rows(name, text)
    elif suffix == ".json":
        rows = _json_rows(name, text)
    else:
        rows = _jsonl_rows(name, text)
    if not rows:
        raise ExperimentError(f"{name}: holds no rows")
    return rows


def _json_rows(name: str, text: str) -> list[Row]:
    data = parse_json(text, name, ExperimentError)  # deep nesting and huge numbers are one error too
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if "items" in lists:
            data = lists["items"]
        elif len(lists) == 1:
            data = next(iter(lists.values()))
        else:
            raise ExperimentError(f'{name}: a JSON object must hold the rows as a list under "items"')
    if not isinstance(data, list):
        raise ExperimentError(f"{name}: must hold a list of objects, got {type(data).__name__}")
    rows = []
    for number, value in enumerate(data, 1):
        if not isinstance(value, dict):
            raise ExperimentError(f"{name}: row {number}: must be an object, got {type(value).__name__}")
        rows.append(Row(name, number, value))
    return rows


def _jsonl_rows(name: str, text: str) -> list[Row]:
    rows: list[Row] = []
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value = parse_json(line, f"{name}: row {len(rows) + 1} (line {line_number})", ExperimentError)
        if not isinstance(value, dict):
            raise ExperimentError(f"{name}: row {len(rows) + 1} (line {line_number}): must be an object")
        rows.append(Row(name, len(rows) + 1, value))
    return rows


def _csv_rows(name: str, text: str) -> list[Row]:
    try:
        reader = csv.reader(io.StringIO(text, newline=""))  # a quoted cell may hold line breaks
        lines = [line for line in reader]
    except csv.Error as err:
        raise ExperimentError(f"{name}: not valid CSV ({err})") from None
    lines = [line for line in lines if any(cell.strip() for cell in line)]
    if not lines:
        return []
    header = [cell.strip() for cell in lines[0]]
    if len(set(header)) != len(header) or not all(header):
        raise ExperimentError(f"{name}: the header row must name every column once")
    rows = []
    for number, cells in enumerate(lines[1:], 1):
        if len(cells) != len(header):
            raise ExperimentError(f"{name}: row {number}: has {len(cells)} cells, the header names {len(header)}")
        rows.append(Row(name, number, dict(zip(header, cells)), csv=True))
    return rows


def _item_id(item: Item) -> str:
    return item.id


def unique_ids(items: Sequence[ItemT], path: str, id_of: Callable[[ItemT], str] = _item_id) -> list[ItemT]:
    """``items`` when their ids are unique; ExperimentError naming the first repeated id otherwise."""
    seen: dict[str, int] = {}
    for number, item in enumerate(items, 1):
        key = id_of(item)
        if key in seen:
            raise ExperimentError(f"{path}: row {number}: id {key!r} repeats row {seen[key]}")
        seen[key] = number
    return list(items)


def read_items(
    path: str | Path, build: Callable[[Row], ItemT], shape: Callable[[list[Row]], list[Row]] | None = None
) -> list[ItemT]:
    """The items of a dataset file: ``build`` makes one item of each row; ids must be unique.

    shape: reads another layout of the rows (the paper's, :mod:`contllm.data.paper`) into
    this one first. Every problem is an ExperimentError naming the file, the row and the field.
    """
    rows = read_rows(path)
    return unique_ids([build(row) for row in (shape(rows) if shape is not None else rows)], str(path))


def data_option_help(schema: str) -> str:
    """The ``--data`` option's help text for an experiment whose rows look like ``schema``."""
    return f"Dataset file (.json, .jsonl or .csv) instead of the built-in items; rows: {schema}. [default: built-in]"


def file_sha256(path: str | Path) -> str:
    """The sha256 of a dataset file's bytes (hex); ExperimentError naming the file when it cannot be read.

    Experiments record it beside the path in their config, so that ``--resume`` refuses a
    file whose contents changed since the run started.
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        raise ExperimentError(f"{path}: cannot read: {err.strerror or err}") from None
    return digest.hexdigest()


def read_data_file(path: str | Path, read: Callable[[str], Any]) -> tuple[str, str]:
    """(the path as a string, the sha256 of its bytes) once ``read(path)`` has read the file without error.

    What an experiment's config does with its ``data`` field, so that a malformed file is
    refused when the config is made (before a model loads) and config.json records what
    ``--resume`` must find again.
    """
    name = str(path)
    read(name)
    return name, file_sha256(name)


@dataclass
class DataFileOption:
    """What a config that takes ``--data`` inherits: the file's path and the sha256 of its contents.

    data: a dataset file (None: the experiment's built-in items). data_sha256: set by
    :meth:`read_data` and kept in config.json, so that ``--resume`` refuses a file whose
    contents changed since the run started.
    """

    data: str | None = None
    data_sha256: str | None = field(default=None, init=False)

    def read_data(self, read: Callable[[str], Any]) -> None:
        """Read the --data file once with ``read`` (ExperimentError naming file, row and field) and record its sha256."""
        if self.data is not None:
            self.data, self.data_sha256 = read_data_file(self.data, read)
