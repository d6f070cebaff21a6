"""What every JSON file the toolkit reads back must hold: one schema per kind of file, checked as it is read.

A run's config.json, manifest.json, results.json and items/<id>.json, an audit's
audit.json and a card (card.json) are written by the toolkit and read back by it (``contllm
report``, ``figures``, ``audit --compare`` and ``--resume``, ``run --resume``,
:func:`contllm.load_run`). Each is checked against its schema here before anything uses
it, so that a file edited by hand or by another program is one error naming the file, the
field (``findings[2].numbers[0].value``) and what was expected, never a traceback from
deep inside a reader, and never a half-written output.

The schemas are small declarations (:class:`Str`, :class:`Int`, :class:`Num`,
:class:`Bool`, :class:`Enum`, :class:`Nullable`, :class:`ListOf`, :class:`MapOf`,
:class:`Obj`, :data:`ANY`), derived from what the writers write: an object that a
dataclass is rebuilt from (a card, a finding, a number, a plan's calibration) holds its
fields and no others; an object kept as a plain dict (a plan, a manifest, a config) holds
its known fields with their types and may hold others. A number is always finite: the
writers store a non-finite one as null (:func:`contllm.rundir.files.jsonable`), and the parser
refuses NaN and infinity (:func:`contllm.rundir.files.parse_json`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

#: The audit protocols a card or an audit.json may name (:data:`contllm.audits.studies.PROTOCOLS`).
PROTOCOLS = ("contllm", "paper")
#: The states a run's manifest records.
STATUSES = ("running", "finished")


class Mismatch(Exception):
    """Where a value differs from its schema: the field's path and what was expected there (see :func:`validate`)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def describe(value: Any) -> str:
    """A value as an error names it: its JSON kind, and the value itself where short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):  # NaN, or infinity (a literal, or 1e400)
        return "NaN" if math.isnan(value) else "-Infinity" if value < 0 else "Infinity"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"the number {text if len(text) <= 24 else text[:20] + '...'}"
    if isinstance(value, str):
        shown = repr(value)
        return f"the string {shown if len(shown) <= 42 else shown[:36] + '...' + shown[0]}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _key(path: str, key: str) -> str:
    """``path`` and one key of an object below it: ``a.b``, or ``a["odd key"]`` where the key is no plain name."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    shown = json.dumps(key if len(key) <= 40 else key[:36] + "...", ensure_ascii=False)
    return f"{path}[{shown}]"


class Schema:
    """A kind of JSON value; :meth:`check` raises :class:`Mismatch` for a value that is not one."""

    #: What the value must be, as an error says it ("a string", "a number or null").
    what: str = "a JSON value"

    def check(self, value: Any, path: str) -> None:
        if not self.accepts(value):
            raise Mismatch(path, f"expected {self.what}, got {describe(value)}")

    def accepts(self, value: Any) -> bool:
        return True


class _Any(Schema):
    what = "any JSON value"


#: Any JSON value (what a parsed file holds: numbers already finite, nesting already bounded).
ANY: Schema = _Any()


@dataclass(frozen=True)
class Str(Schema):
    """A string; ``empty``: whether "" is one. ``path``: a relative path inside a directory (no '..', not absolute)."""

    empty: bool = True
    path: bool = False

    @property
    def what(self) -> str:  # type: ignore[override]
        if self.path:
            return "a relative path inside the directory (no '..', not absolute)"
        return "a string" if self.empty else "a non-empty string"

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, str) or (not self.empty and not value):
            return False
        if self.path:
            parts = PurePosixPath(value).parts
            return bool(value) and "\0" not in value and not value.startswith(("/", "\\")) and ".." not in parts
        return True


@dataclass(frozen=True)
class Int(Schema):
    """An integer (not a boolean, not 1.0) of at least ``minimum``."""

    minimum: int | None = None

    @property
    def what(self) -> str:  # type: ignore[override]
        return "an integer" if self.minimum is None else f"an integer >= {self.minimum}"

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        return self.minimum is None or value >= self.minimum


def finite(value: Any) -> bool:
    """Whether ``value`` is a number (not a boolean) that a float holds finitely."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer past float's range
        return False


@dataclass(frozen=True)
class Num(Schema):
    """A finite number (an integer or a float, not a boolean), between ``minimum`` and ``maximum`` where given."""

    minimum: float | None = None
    maximum: float | None = None

    @property
    def what(self) -> str:  # type: ignore[override]
        bounds = [f">= {self.minimum:g}"] if self.minimum is not None else []
        bounds += [f"<= {self.maximum:g}"] if self.maximum is not None else []
        return "a finite number" + (f" {' and '.join(bounds)}" if bounds else "")

    def accepts(self, value: Any) -> bool:
        if not finite(value):
            return False
        number = float(value)
        return (self.minimum is None or number >= self.minimum) and (self.maximum is None or number <= self.maximum)


@dataclass(frozen=True)
class Bool(Schema):
    what = "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Enum(Schema):
    """One of the given strings."""

    values: tuple[str, ...]

    @property
    def what(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(repr(v) for v in self.values)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.values


@dataclass(frozen=True)
class Nullable(Schema):
    """null, or a value of ``schema``."""

    schema: Schema

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"{self.schema.what} or null"

    def check(self, value: Any, path: str) -> None:
        if value is None:
            return
        try:
            self.schema.check(value, path)
        except Mismatch as exc:
            if exc.path == path:  # the value itself is wrong, not a part of it: say that null would do too
                raise Mismatch(path, f"expected {self.what}, got {describe(value)}") from None
            raise


@dataclass(frozen=True)
class Either(Schema):
    """A value of the first of ``schemas`` that holds it (each checked as a whole)."""

    schemas: tuple[Schema, ...]

    @property
    def what(self) -> str:  # type: ignore[override]
        return " or ".join(s.what for s in self.schemas)

    def check(self, value: Any, path: str) -> None:
        for schema in self.schemas:
            try:
                schema.check(value, path)
                return
            except Mismatch:
                continue
        raise Mismatch(path, f"expected {self.what}, got {describe(value)}")


@dataclass(frozen=True)
class ListOf(Schema):
    """A list of values of ``item``, at least ``min_items`` of them."""

    item: Schema
    min_items: int = 0

    @property
    def what(self) -> str:  # type: ignore[override]
        least = f" of at least {self.min_items}" if self.min_items else ""
        return f"a list{least}, each item {self.item.what}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or len(value) < self.min_items:
            raise Mismatch(path, f"expected {self.what}, got {describe(value)}")
        for k, v in enumerate(value):
            self.item.check(v, f"{path}[{k}]")


@dataclass(frozen=True)
class MapOf(Schema):
    """An object whose every value is one of ``item`` (its keys are any strings)."""

    item: Schema

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"an object, each value {self.item.what}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise Mismatch(path, f"expected {self.what}, got {describe(value)}")
        for k, v in value.items():
            self.item.check(v, _key(path, str(k)))


@dataclass(frozen=True)
class Field:
    """A key of an :class:`Obj`: its schema, and whether the key must be there."""

    schema: Schema
    required: bool = True


def optional(schema: Schema) -> Field:
    """A key that may be missing (when there, it holds a value of ``schema``)."""
    return Field(schema, required=False)


class Obj(Schema):
    """A JSON object: ``name`` (what it is, for errors), its keys (a :class:`Schema`: required; a :class:`Field`),
    and ``extra``: the schema of any other key (None: no other key is allowed)."""

    def __init__(self, name: str, fields: Mapping[str, Schema | Field], *, extra: Schema | None = None) -> None:
        self.name = name
        self.fields = {k: f if isinstance(f, Field) else Field(f) for k, f in fields.items()}
        self.extra = extra

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"{self.name} (a JSON object)"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise Mismatch(path, f"expected {self.what}, got {describe(value)}")
        for key, field in self.fields.items():
            if key in value:
                field.schema.check(value[key], _key(path, key))
            elif field.required:
                raise Mismatch(_key(path, key), f"expected {field.schema.what}, got nothing (the key is missing)")
        if self.extra is None:
            unknown = [k for k in value if k not in self.fields]
            if unknown:
                raise Mismatch(
                    _key(path, str(unknown[0])),
                    f"expected no such key ({self.name} holds only {', '.join(self.fields)})",
                )
        else:
            for k, v in value.items():
                if k not in self.fields:
                    self.extra.check(v, _key(path, str(k)))


def validate(value: Any, schema: Schema, where: str, error: type[Exception]) -> Any:
    """``value`` itself when it holds to ``schema``; otherwise ``error`` of one line, "<where>: <field>: expected ...".

    where: the file and what it should be ("runs/a/results.json", "card.json is not a card").
    A value that is not even the object the file must hold says "holds no JSON object".
    """
    try:
        schema.check(value, "")
    except Mismatch as exc:
        if not exc.path and isinstance(schema, Obj) and not isinstance(value, Mapping):
            raise error(f"{where}: holds no JSON object ({schema.name} is one; it holds {describe(value)})") from None
        raise error(f"{where}: {exc}") from None
    return value


def non_finite(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """(path, value) of each non-finite float (NaN, infinity) inside ``value``, in order (lists and dicts, as TOML or
    JSON hold them)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            yield at, node
        elif isinstance(node, Mapping):
            stack.extend((v, _key(at, str(k))) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((v, f"{at}[{k}]") for k, v in reversed(list(enumerate(node))))


# ---------------------------------------------------------------------------- the files

_SECONDS = Nullable(Num(minimum=0))

#: A plan's timed calibration (:class:`contllm.audits.budget.Calibration`, with its rate).
CALIBRATION = Obj(
    "a calibration",
    {"signals": Int(1), "tokens": Int(0), "seconds": Num(0), "warmup": Num(0), "rate": Num(0)},
)

#: What dtype="auto" measured and picked (:meth:`contllm.models.autodtype.DtypeChoice.to_dict`), in a run's
#: manifest and in a card.
DTYPE_CHOICE = Obj(
    "a dtype choice",
    {
        "requested": optional(Str()),
        "dtype": Enum(("float32", "bfloat16")),
        "float32_seconds": Num(0),
        "bfloat16_seconds": Num(0),
        "max_prob_diff": Nullable(Num(0)),
        "device": Str(),
        "min_gain": Num(0),
        "max_allowed": Num(0),
        "reason": Str(),
        "seconds": optional(_SECONDS),
        "rounds": optional(Nullable(Int(1))),
    },
)

#: One experiment's share of a plan (:class:`contllm.audits.budget.Share`).
SHARE = Obj("a share of the plan", {"experiment": Str(empty=False), "count": Int(1), "seconds": Num(0)})

#: An audit's plan (:meth:`contllm.audits.budget.Plan.to_dict`), in audit.json and in a card.
PLAN = Obj(
    "a plan",
    {
        "budget": optional(Nullable(Num(minimum=0))),
        "spent": Num(0),
        "reserved": Num(0),
        "available": Num(0),
        "shares": ListOf(SHARE),
        "left_out": optional(Nullable(MapOf(Str()))),
        "calibration": optional(Nullable(CALIBRATION)),
    },
)

#: audit.json: the audit's settings and its plan (:func:`contllm.audits.run.audit`).
AUDIT = Obj(
    "an audit's settings",
    {
        "model": Str(empty=False),
        "protocol": Enum(PROTOCOLS),
        "budget": optional(Nullable(Num(minimum=0))),
        "seed": optional(Int()),
        "dtype": optional(Nullable(Str(empty=False))),
        "plan": PLAN,
        "seconds": optional(
            Obj("the audit's times", {"runs": optional(MapOf(_SECONDS)), "spent": optional(_SECONDS)}, extra=ANY)
        ),
    },
    extra=ANY,
)

#: A reference model's value of a number on a card (:func:`contllm.audits.reference.values`).
REFERENCE_VALUE = Obj(
    "a reference value",
    {
        "value": optional(Nullable(Num())),
        "low": optional(Nullable(Num())),
        "high": optional(Nullable(Num())),
        "items": optional(Nullable(Int(0))),
    },
    extra=ANY,
)

#: One number of a finding (:class:`contllm.audits.card.Number`).
NUMBER = Obj(
    "a number of a finding",
    {
        "metric": Str(empty=False),
        "role": Enum(("headline", "paper")),
        "value": Nullable(Num()),
        "low": Nullable(Num()),
        "high": Nullable(Num()),
        "direction": Enum(("higher", "lower")),
        "meaning": Str(),
        "reference": optional(MapOf(REFERENCE_VALUE)),
    },
)

#: One experiment of a card (:class:`contllm.audits.card.Finding`); its paths are relative to the audit directory.
FINDING = Obj(
    "a finding",
    {
        "experiment": Str(empty=False),
        "run": Str(path=True),
        "items": Int(0),
        "sentence": Str(),
        "numbers": ListOf(NUMBER, min_items=1),
        "figure": optional(Nullable(Str(path=True))),
        "explorer": optional(Nullable(Str(path=True))),
        "seconds": optional(_SECONDS),
    },
)

#: Where a card's reference numbers come from (:func:`contllm.audits.reference.about`).
REFERENCE_ABOUT = Obj(
    "the reference numbers' origin",
    {
        "file": optional(Nullable(Str())),
        "audits": optional(
            ListOf(
                Obj(
                    "a reference audit",
                    {
                        "model": optional(Nullable(Str())),
                        "protocol": optional(Nullable(Str())),
                        "measured": optional(Nullable(Str())),
                        "command": optional(Nullable(Str())),
                        "counts": optional(Nullable(MapOf(Int(0)))),
                    },
                    extra=ANY,
                )
            )
        ),
    },
    extra=ANY,
)

#: A card's bootstrap settings.
BOOTSTRAP = Obj(
    "the bootstrap's settings",
    {
        "resamples": Int(1),
        "level": Num(minimum=0, maximum=1),
        "seed": optional(Int()),
        "over": optional(Str()),
    },
    extra=ANY,
)

#: card.json: what an audit found (:meth:`contllm.audits.card.Card.to_dict`).
CARD = Obj(
    "a card",
    {
        "model": Str(empty=False),
        "protocol": Enum(PROTOCOLS),
        "plan": PLAN,
        "findings": ListOf(FINDING),
        "bootstrap": BOOTSTRAP,
        "reference": optional(Nullable(REFERENCE_ABOUT)),
        "dtype_choice": optional(Nullable(DTYPE_CHOICE)),
        "versions": optional(MapOf(Nullable(Str()))),
        "seconds": optional(
            Obj(
                "the card's times",
                {"runs": optional(MapOf(_SECONDS)), "total": optional(_SECONDS), "resumed": optional(Bool())},
                extra=ANY,
            )
        ),
        "created": optional(Str()),
    },
)

#: config.json: the run's resolved configuration (:func:`contllm.rundir.runner.check_run`; settings, then options).
CONFIG = Obj(
    "a run's config",
    {
        "experiment": Str(empty=False),
        "model": optional(Str(empty=False)),
        "dtype": optional(Nullable(Str(empty=False))),
        "items": optional(Nullable(Either((Str(), Int(0))))),
        "seed": optional(Int()),
        "max_batch_tokens": optional(Nullable(Int(1))),
        "group_bytes": optional(Nullable(Int(1))),
        "options": optional(MapOf(ANY)),
    },
    extra=ANY,
)

_TEXT = Nullable(Str())

#: manifest.json: where a run's numbers come from and how far it got (:func:`contllm.rundir.runs.base_manifest` and the
#: runner's updates). Every key may be missing: a run writes them as it goes.
MANIFEST = Obj(
    "a run's manifest",
    {
        "status": optional(Enum(STATUSES)),
        "model": optional(Str(empty=False)),
        "model_type": optional(_TEXT),
        "family": optional(_TEXT),
        "parameters": optional(Nullable(Int(1))),
        "weights_sha256": optional(_TEXT),
        "source": optional(_TEXT),
        "device": optional(_TEXT),
        "dtype": optional(_TEXT),
        "dtype_choice": optional(Nullable(DTYPE_CHOICE)),
        "state_dtype": optional(_TEXT),
        "device_map": optional(_TEXT),
        "attn_implementation": optional(_TEXT),
        "versions": optional(MapOf(_TEXT)),
        "commit": optional(_TEXT),
        "cpu": optional(Nullable(MapOf(ANY))),
        "host": optional(_TEXT),
        "command": optional(_TEXT),
        "started": optional(_TEXT),
        "resumed": optional(_TEXT),
        "finished": optional(_TEXT),
        "items": optional(Int(0)),
        "seconds": optional(MapOf(_SECONDS)),
        "outputs": optional(ListOf(Str())),
        "processes": optional(MapOf(ANY)),
    },
    extra=ANY,
)

#: items/<id>.json: one finished item's record (:meth:`contllm.rundir.runs.RunDir.save_record`).
RECORD_FILE = Obj("an item's record", {"id": Str(), "record": ANY})


def results_schema(experiment: Any, name: str) -> Obj:
    """results.json of a run of ``experiment`` (named ``name`` in its config.json): the result's envelope.

    experiment, model, config, the records (a list of objects, under the result type's key)
    and the fields the result type adds; each record's own fields are the result type's
    to read (:meth:`contllm.experiments.records.Record.from_dict`, by its type hints). An
    experiment that declares no ``result_type`` (one defined outside the toolkit) reads its
    own results: any JSON object is taken, and what its ``load_result`` cannot read is one
    error naming the file.
    """
    from dataclasses import fields, is_dataclass

    result_type = getattr(experiment, "result_type", None)
    if result_type is None:  # an experiment of its own making (a plug-in): its result's layout is its own to read
        return Obj(f"a {name} result", {}, extra=ANY)
    key = getattr(result_type, "key", "records")
    envelope: dict[str, Schema | Field] = {
        "experiment": Enum((name,)),
        "model": Str(),
        "config": MapOf(ANY),
        key: ListOf(Obj("a record", {}, extra=ANY)),
    }
    if not (isinstance(result_type, type) and is_dataclass(result_type)):  # its fields are not known here
        return Obj(f"a {name} result", envelope, extra=ANY)
    for added in fields(result_type):
        if added.name not in ("experiment", "model", "config", "records"):
            envelope[added.name] = optional(ANY)
    return Obj(f"a {name} result", envelope)
