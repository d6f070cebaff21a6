"""Numbers as a user types them, read one way everywhere, and the bounds every number keeps.

An integer is ASCII digits with an optional sign, at most 30 digits; a number may add a
decimal point and an exponent. Other scripts' digits ('٢'), superscripts ('²'),
underscores ('1_0') and signs inside are refused, though Python's ``int()`` and
``float()`` take some of them; spaces around the text are allowed. Every command and
reader that takes a count, a seed, a duration or a factor as text goes through
:func:`as_integer` and :func:`as_number`. Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_TIME", "MIN_MAGNITUDE", "as_integer", "as_number"]

#: Largest |time| a signal may hold. The model reads times as float32 positions, whose
#: spacing is 1 from 2**23 (8.4e6) on and 2 past 2**24: beyond this bound the rotary angles
#: (or learned-table rows) of neighbouring tokens can no longer be told apart, and at
#: about 3.4e38 they overflow to inf and every output turns NaN. No real context comes
#: near it (a model's max_position_embeddings is about 1e5 at most).
MAX_TIME = 1e7
#: Smallest non-zero magnitude of a number a user gives: float32's smallest normal number.
#: Models compute in float32 at best; a smaller number becomes 0 or loses its precision there.
MIN_MAGNITUDE = 1.1754943508222875e-38

#: An integer as typed: ASCII digits with an optional sign, at most 30 of them.
INTEGER = re.compile(r"[+-]?[0-9]{1,30}")
#: A number as typed: ASCII digits, an optional sign, point and exponent.
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,6})?")
#: The spellings of a non-finite number (read, so that a caller can say it is not finite).
NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)


def as_integer(value: Any) -> int | None:
    """``value`` as an integer (a Python int of at most 100 bits, or text of :data:`INTEGER`), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value.bit_length() <= 100 else None
    if isinstance(value, str) and INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    return None


def as_number(value: Any) -> float | None:
    """``value`` as a float (a Python int or float, or text of :data:`NUMBER` or :data:`NON_FINITE`), else None.

    The result may be infinite or NaN (a spelled "inf", an exponent past float's range):
    whether that is allowed is the caller's to say.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return float("inf") if value > 0 else float("-inf")
    if isinstance(value, str) and (NUMBER.fullmatch(value.strip()) or NON_FINITE.fullmatch(value.strip())):
        return float(value.strip())
    return None
