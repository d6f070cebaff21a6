"""Options of experiments: one declaration serves the command line, spec files and Python.

An experiment lists its options as :class:`Option` entries; :func:`build_config` turns
the values given (strings from the command line, typed values from a TOML spec, or
Python values) into the experiment's config dataclass, whose ``__post_init__`` checks
what the values mean. Every problem is an :class:`~contllm.errors.ExperimentError` that
names the option, raised before a model loads or a file is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal

from contllm.errors import ExperimentError
from contllm.numerals import MAX_TIME, MIN_MAGNITUDE, as_integer, as_number

Kind = Literal["int", "float", "str", "bool", "ints", "floats", "words", "range"]


@dataclass(frozen=True)
class Option:
    """One option of an experiment.

    name: the config field it sets (``--name-with-dashes`` on the command line, ``name``
        in a spec table). kind: how a value is read: int, float, str, bool, ints/floats
        (comma-separated on the command line, a list in a spec), words (comma-separated
        names), range ("MIN,MAX" or [MIN, MAX], setting the fields ``low`` and ``high``).
    help: one sentence for ``--help``, with the default.
    flag: the command-line spelling when it is not ``--name`` (e.g. "--chat/--no-chat").
    choices: the values a str or words option takes, for ``--help`` (the config checks them).
    """

    name: str
    kind: Kind
    help: str
    flag: str | None = None
    choices: tuple[str, ...] = ()

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def read(self, value: Any) -> dict[str, Any]:
        """The config fields this option sets from ``value``; ExperimentError naming the option."""
        where = self.cli_flag.split("/")[0]
        if self.kind == "range":
            low, high = parse_range(value, where)
            return {"low": low, "high": high}
        return {self.name: read_value(value, self.kind, where)}


#: Largest magnitude of a range's ends: no signal time past :data:`contllm.numerals.MAX_TIME`
#: can be represented, and every range scales, shifts or mixes times.
MAX_RANGE = MAX_TIME


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as an error message quotes it: its repr, cut to ``limit`` characters."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit
        return "an integer of more than 4000 digits"
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


#: The interpolation method, as every experiment that interpolates takes it.
METHOD = Option("method", "str", "linear or slerp interpolation. [default: linear]", choices=("linear", "slerp"))


def read_value(value: Any, kind: Kind, where: str) -> Any:
    """``value`` read as ``kind``; ExperimentError naming ``where`` when it is not one."""
    if kind in ("ints", "floats", "words"):
        elements: dict[str, Kind] = {"ints": "int", "floats": "float", "words": "str"}
        item = elements[kind]
        parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else value
        if not isinstance(parts, (list, tuple)):
            raise ExperimentError(f"{where} must be a comma-separated list or a list, got {shown(value)}")
        values = tuple(read_value(p, item, where) for p in parts if p != "")
        if not values:
            raise ExperimentError(f"{where} is empty")
        return values
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ExperimentError(f"{where} must be true or false, got {shown(value)}")
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ExperimentError(f"{where} must be a string, got {shown(value)}")
    if kind == "int":
        whole = as_integer(value)
        if whole is None:
            raise ExperimentError(f"{where} must be an integer, got {shown(value)}")
        return whole
    if kind == "float":
        number = as_number(value)
        if number is None:
            raise ExperimentError(f"{where} must be a number, got {shown(value)}")
        if not math.isfinite(number):
            raise ExperimentError(f"{where} must be a finite number, got {shown(value)}")
        _not_tiny(number, value, where)
        return number
    raise ExperimentError(f"{where}: unknown option kind {kind!r}")


def _not_tiny(number: float, value: Any, where: str) -> None:
    if number != 0 and abs(number) < MIN_MAGNITUDE:
        raise ExperimentError(
            f"{where}: {shown(value)} is too close to 0 to compute with (the smallest is {MIN_MAGNITUDE:.3g}, float32's)"
        )


def parse_floats(text: str | Sequence[float], what: str) -> tuple[float, ...]:
    """Finite numbers from "a,b,c" (or a sequence); ExperimentError naming ``what`` if any is not one, or none is given."""
    return read_value(text, "floats", what)


def parse_ints(text: str | Sequence[int], what: str) -> tuple[int, ...]:
    """Integers from "a,b,c" (or a sequence); ExperimentError naming ``what`` if any is not one, or none is given."""
    return read_value(text, "ints", what)


def parse_range(value: Any, where: str = "range") -> tuple[float, float]:
    """'MIN,MAX' or [MIN, MAX] -> (min, max), both finite and min <= max; ExperimentError otherwise."""
    parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)) or len(parts) != 2:
        raise ExperimentError(f"{where} must be 'MIN,MAX', got {shown(value)}")
    low, high = as_number(parts[0]), as_number(parts[1])
    if low is None or high is None:
        raise ExperimentError(f"{where} must be two numbers 'MIN,MAX', got {shown(value)}")
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ExperimentError(f"{where} must be finite, got {low},{high}")
    if max(abs(low), abs(high)) > MAX_RANGE:
        raise ExperimentError(
            f"{where} must lie within -{MAX_RANGE:g},{MAX_RANGE:g} (the largest time a signal holds), got {low:g},{high:g}"
        )
    _not_tiny(low, parts[0], where)
    _not_tiny(high, parts[1], where)
    if low > high:
        raise ExperimentError(f"range min {low} is larger than max {high}")
    return low, high


def build_config(config_type: type, options: Sequence[Option], given: Mapping[str, Any], *, what: str) -> Any:
    """The config dataclass from option values (None: the default), read and checked.

    given: option name -> value, as typed on the command line or in a spec. what: the
    experiment's name, for errors about options it does not take.
    """
    by_name = {o.name: o for o in options}
    values = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(k for k in values if k not in by_name)
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise ExperimentError(f"option(s) {flags} do not apply to the {what} experiment")
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        kwargs.update(by_name[name].read(value))
    try:
        return config_type(**kwargs)
    except TypeError as exc:  # a field the dataclass lacks: a wrong declaration, said plainly
        raise ExperimentError(f"{what}: {exc}") from None


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as plain JSON-able data (tuples as lists)."""
    if not is_dataclass(config):
        raise ExperimentError(f"a config must be a dataclass, got {type(config).__name__}")
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out
