"""What a :class:`~contllm.core.signal.Signal` accepts: the checks and conversions of its values.

Durations, times, embeddings, numbers, token indices, factors and character spans, each
turned into the form a signal keeps or refused with a :class:`~contllm.errors.SignalError`
that names the value and what would be right.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from contllm.errors import SignalError
from contllm.numerals import MAX_TIME

#: A character span (start, end) of a signal's text.
Span = tuple[int, int]


def as_float_vector(values: Any, name: str) -> torch.Tensor:
    if isinstance(values, (str, bytes)):
        raise SignalError(f"{name} must be a 1-D sequence of numbers, got the string {values!r}")
    try:
        tensor = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as err:
        raise SignalError(f"{name} must be a 1-D sequence of numbers, got {describe(values)} ({err})") from err
    if tensor.ndim != 1:
        raise SignalError(f"{name} must be a 1-D sequence, got shape {tuple(tensor.shape)}")
    return tensor


def check_durations(durations: torch.Tensor) -> None:
    if not torch.isfinite(durations).all():
        bad = torch.nonzero(~torch.isfinite(durations)).flatten().tolist()
        raise SignalError(f"durations must be finite; non-finite values at token indices {bad}")
    if (durations < 0).any():
        bad = torch.nonzero(durations < 0).flatten().tolist()
        raise SignalError(f"durations must be >= 0; negative values at token indices {bad}")


def describe(value: Any) -> str:
    """``value`` for an error message: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def as_number(value: Any, name: str) -> float:
    """``value`` as a float; SignalError naming ``name`` for strings, booleans and non-numbers."""
    if isinstance(value, (str, bytes, bool)):
        raise SignalError(f"{name} must be a number, got {describe(value)}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise SignalError(f"{name} must be a number, got {describe(value)}") from err


def as_index(value: Any, name: str) -> int:
    """``value`` as an int (a Python, NumPy or 0-d torch integer); SignalError naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise SignalError(f"{name} must be an integer, got {describe(value)}")
    try:
        return operator.index(value)
    except TypeError as err:
        raise SignalError(f"{name} must be an integer, got {describe(value)}") from err


def check_embeds_finite(embeds: torch.Tensor) -> None:
    if not torch.isfinite(embeds).all():
        raise SignalError("embeds contain NaN or infinite values")


def check_times_finite(times: torch.Tensor) -> None:
    if not torch.isfinite(times).all():
        raise SignalError("times must be finite")


def check_times(times: torch.Tensor) -> None:
    """SignalError unless every time is finite and within +-MAX_TIME (names the first bad token)."""
    bad = ~(times.abs() <= MAX_TIME)  # also true for NaN
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        raise SignalError(
            f"token {i} would sit at time {float(times[i]):.6g}: times must lie within +-{MAX_TIME:g} "
            "(contllm.core.signal.MAX_TIME; the model reads them as float32 positions, which cannot resolve "
            "a time step beyond it); check the durations, times and start"
        )


def unit_if_none(durations: Sequence[float] | torch.Tensor | None, n: int) -> torch.Tensor:
    """``durations`` as a float vector, or n unit durations when none are given."""
    return torch.ones(n, dtype=torch.float64) if durations is None else as_float_vector(durations, "durations")


def times_or_none(times: Sequence[float] | torch.Tensor | None) -> torch.Tensor | None:
    """``times`` as a float vector, or None (times follow the durations)."""
    return None if times is None else as_float_vector(times, "times")


def check_factor(factor: Any) -> float:
    value = as_number(factor, "a duration factor")
    if not math.isfinite(value) or value < 0:
        raise SignalError(f"a duration factor must be finite and >= 0, got {factor}")
    return value


def is_pair(value: Any) -> bool:
    """Whether ``value`` looks like one span: a 2-sequence of scalars (not of pairs)."""
    return (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, (numbers.Number, str)) or (isinstance(v, torch.Tensor) and v.ndim == 0) for v in value)
    )


def span(value: Any) -> Span:
    bad = SignalError(
        f"a character span is a pair of integer offsets (start, end), got {describe(value)}; "
        "spans come from Signal.find or are written as (start, end)"
    )
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise bad
    try:
        return (as_index(value[0], "start"), as_index(value[1], "end"))
    except SignalError:
        raise bad from None


def span_list(spans: Span | Iterable[Span]) -> list[Span]:
    if isinstance(spans, (str, bytes)):
        raise SignalError(f"spans must be (start, end) character offsets, got the string {spans!r}; use Signal.find")
    if is_pair(spans):
        return [span(spans)]
    if not isinstance(spans, Iterable):
        raise SignalError(f"spans must be a (start, end) pair or a list of them, got {describe(spans)}")
    out = [span(s) for s in spans]
    if not out:
        raise SignalError("no character span given")
    return out
