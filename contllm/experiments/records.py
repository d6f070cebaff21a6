"""Records as data: one to_dict/from_dict for every experiment's records and results, by their type hints.

An experiment's record is a dataclass subclassing :class:`Record`; its result subclasses
:class:`Records` (every item's record, in item order, with the config that made it).
:meth:`Record.to_dict` writes JSON-able data field by field and :meth:`Record.from_dict`
reads it back by the fields' type hints, so that a record class holds no conversion code
of its own (only :meth:`Record.check_loaded` for what the hints cannot say); a malformed
file is one :class:`~contllm.errors.ExperimentError` "malformed <what>: ...".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Generic,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

from contllm.errors import ExperimentError

if TYPE_CHECKING:
    import numpy as np

R = TypeVar("R")

#: The hint of an array of integers (a plain ``np.ndarray`` hint reads and writes float64).
IntArray = Annotated["np.ndarray", "int64"]

RecordSelf = TypeVar("RecordSelf", bound="Record")


@dataclass
class Record:
    """A dataclass that goes to and from JSON-able data by its fields and their type hints.

    :meth:`to_dict` writes every field under its name: numpy arrays as nested lists
    (floats, or ints for an :data:`IntArray` field), numpy scalars as numbers, tuples as
    lists, nested records as their own dicts. :meth:`from_dict` reads them back by the
    hints (str, int, float, bool, ``X | None``, ``list[...]``, ``tuple[...]``,
    ``dict[str, ...]``, ``np.ndarray``, classes with a ``from_dict``; anything else as it is). A
    field with a default may be missing, or null; null in a float is NaN (how a
    non-finite number is stored). Anything else is the one ExperimentError "malformed
    <what>: ...", ``what`` given in the class line::

        @dataclass
        class Track(Record, what="tracking record"): ...

    A subclass may override :meth:`check_loaded` for what its hints cannot say (shapes
    that must agree, arrays inside plain dicts).
    """

    what: ClassVar[str] = "record"

    def __init_subclass__(cls, what: str | None = None, **rest: Any) -> None:
        super().__init_subclass__(**rest)
        if what is not None:
            cls.what = what

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, as JSON-able data."""
        hints = self._types()
        return {f.name: _dump(hints[f.name], getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls: type[RecordSelf], data: Any) -> RecordSelf:
        """The record from :meth:`to_dict`'s data; ExperimentError naming what is missing or malformed."""
        try:
            if not isinstance(data, Mapping):
                raise TypeError(f"expected a JSON object, got {type(data).__name__}")
            record = cls(**cls._values(data))
            record.check_loaded()
        except ExperimentError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            problem = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ExperimentError(f"malformed {cls.what}: {problem}") from None
        return record

    def check_loaded(self) -> None:
        """Complete or check a record :meth:`from_dict` just made (raise ExperimentError, or ValueError: malformed)."""

    @classmethod
    def _types(cls) -> dict[str, Any]:
        """The type hint of each field."""
        return _hints(cls)

    @classmethod
    def _values(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor's arguments from ``data``, converted by the hints."""
        hints = cls._types()
        out = {}
        for f in fields(cls):  # type: ignore[arg-type]  # every subclass is a dataclass
            defaults = f.default is not MISSING or f.default_factory is not MISSING
            if f.name not in data and defaults:
                continue
            value, hint = data[f.name], hints[f.name]
            if value is None and defaults and not _nullable(hint):
                continue
            out[f.name] = _load(hint, value, f.name)
        return out


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def _nullable(hint: Any) -> bool:
    """Whether null is a value of ``hint`` (None itself, or NaN in a float) rather than "the default"."""
    return hint is Any or hint is float or (get_origin(hint) in (Union, UnionType) and type(None) in get_args(hint))


def _dtype(hint: Any) -> str | None:
    """The dtype of an array hint (``np.ndarray``, :data:`IntArray`, either or None), None for any other hint."""
    import numpy as np

    if get_origin(hint) in (Union, UnionType):
        inner = [h for h in get_args(hint) if h is not type(None)]
        return _dtype(inner[0]) if len(inner) == 1 else None
    if get_origin(hint) is Annotated:
        return str(get_args(hint)[1])
    return "float64" if hint is np.ndarray else None


def _dump(hint: Any, value: Any) -> Any:
    dtype = _dtype(hint)
    if dtype is not None and value is not None:
        import numpy as np

        return np.asarray(value, dtype=dtype).tolist()
    return plain(value)


def plain(value: Any) -> Any:
    """``value`` as JSON-able data: records as their dicts, arrays and tensors as lists, numpy numbers as numbers."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return value.tolist() if hasattr(value, "tolist") else value


def _load(hint: Any, value: Any, where: str) -> Any:
    """``value`` read as ``hint`` (see :class:`Record`); TypeError or ValueError naming ``where`` otherwise."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        inner = [h for h in args if h is not type(None)]
        if value is None and len(inner) < len(args):
            return None
        return _load(inner[0], value, where) if len(inner) == 1 else value
    if hint is float and value is None:
        return math.nan
    dtype = _dtype(hint)
    if dtype is not None:
        import numpy as np

        if not isinstance(value, (list, tuple, int, float)) or isinstance(value, bool):
            raise TypeError(f"{where} must be a list of numbers, got {type(value).__name__}")
        return np.asarray(value, dtype=dtype)
    read = getattr(hint, "from_dict", None) if isinstance(hint, type) else None
    if callable(read):  # a Record, or a class with a from_dict of its own
        return read(value)
    if hint in (str, int, float, bool):
        if value is None or isinstance(value, (list, dict)) or (hint is bool and not isinstance(value, bool)):
            raise TypeError(f"{where} must be a {hint.__name__}, got {type(value).__name__}")
        return hint(value)
    if hint in (list, tuple, dict):
        origin, args = hint, ()
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where} must be a list, got {type(value).__name__}")
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return origin(_load(args[0] if args else Any, v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ValueError(f"{where} must hold {len(args)} values, got {len(value)}")
        return tuple(_load(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where} must be an object, got {type(value).__name__}")
        key, item = args or (Any, Any)
        return {(str(k) if key is str else k): _load(item, v, f"{where}[{k!r}]") for k, v in value.items()}
    return value


class RecordList:
    """A :class:`Records` subclass's name for its ``records``, which is also their key in results.json (see
    :class:`Records`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        owner.key = name  # type: ignore[attr-defined]

    @overload
    def __get__(self, obj: None, owner: Any = None) -> RecordList: ...

    @overload
    def __get__(self, obj: Records[R], owner: Any = None) -> list[R]: ...

    def __get__(self, obj: Records[Any] | None, owner: Any = None) -> Any:
        return self if obj is None else obj.records


@dataclass
class Records(Record, Generic[R]):
    """A result that is every item's record of one run, in item order, with the config that made it.

    A subclass names its record type (a :class:`Record`, or ``dict`` for plain data) in
    its class line; a :class:`RecordList` attribute names the records (also their key in
    results.json, "records" without one), and ``Records.record`` under another name
    finds one::

        class TrackResult(Records[Track], record=Track):
            tracks = RecordList()
            track = Records.record

    It adds views of the records (rows, a common grid, ...) and may add fields after
    ``records`` (kept in results.json beside them).
    """

    experiment: str
    model: str
    config: dict[str, Any]
    records: list[R]

    what: ClassVar[str] = "results file"
    record_type: ClassVar[Any] = dict
    key: ClassVar[str] = "records"

    def __init_subclass__(cls, record: type | None = None, **rest: Any) -> None:
        super().__init_subclass__(**rest)
        if record is not None:
            cls.record_type = record

    def record(self, item_id: str) -> R:
        """The record of one item; ExperimentError when the result has none."""
        for record in self.records:
            if getattr(record, "item_id", None) == item_id:
                return record
        raise ExperimentError(f"no item {item_id!r} in this result")

    def to_dict(self) -> dict[str, Any]:
        """experiment, model, config, the fields a subclass adds and the records under ``key``, as JSON-able data."""
        data = super().to_dict()
        data[self.key] = data.pop("records")
        return data

    @classmethod
    def _types(cls) -> dict[str, Any]:
        return {**super()._types(), "records": list[cls.record_type]}  # type: ignore[name-defined]

    @classmethod
    def _values(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return super()._values({**data, "records": data[cls.key]})


class ItemRecords(Records[R]):
    """A result whose records are called items (``items``, also their key in results.json; ``item(id)`` finds one)."""

    items = RecordList()
    item = Records.record
