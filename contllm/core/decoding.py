"""How :func:`contllm.generation.generate` decodes and times its tokens, checked without a model.

The step count, the generated tokens' durations, the sampler (greedy, or a draw with
temperature, top-k, top-p and a seed) and the stop strings are read and checked here:
``contllm generate`` checks them before torch is imported or a model loads, and
``generate`` from Python before the model runs. Light on purpose: the standard library
and the toolkit's own light modules only (a tensor given as a number is read by its
``item()``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contllm.errors import SignalError
from contllm.numerals import MAX_TIME
from contllm.settings import MAX_SEED

__all__ = [
    "MAX_NEW_TOKENS",
    "Duration",
    "Sampler",
    "check_max_new_tokens",
    "check_options",
    "check_time",
    "longest_time",
]

#: Most tokens one call may generate per signal: a KV cache of this many steps stays a few
#: hundred MB on the embedded models, and a loop past it is a mistake rather than a wish.
MAX_NEW_TOKENS = 4096

Duration = float | Sequence[float] | Callable[..., float]


def _is_scalar_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and getattr(value, "ndim", None) == 0


def _number(value: Any, name: str, *, low: float | None = None, positive: bool = False) -> float:
    if isinstance(value, (bool, str, bytes)) or not (isinstance(value, (int, float)) or _is_scalar_tensor(value)):
        raise SignalError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number) or (positive and number <= 0) or (low is not None and number < low):
        bound = "> 0" if positive else f">= {low:g}"
        raise SignalError(f"{name} must be finite and {bound}, got {value!r}")
    return number


def check_max_new_tokens(value: Any) -> int:
    """``value`` as a count of new tokens in [0, MAX_NEW_TOKENS]; SignalError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SignalError(f"max_new_tokens must be an integer >= 0, got {value!r}")
    if value > MAX_NEW_TOKENS:
        raise SignalError(
            f"max_new_tokens is {value}, more than contllm.generation.MAX_NEW_TOKENS = {MAX_NEW_TOKENS}; "
            "generate in several calls, continuing from Generation.signal"
        )
    return value


def _is_sequence(duration: Any) -> bool:
    return isinstance(duration, (list, tuple)) or (
        type(duration).__module__.startswith("torch") and getattr(duration, "ndim", None) == 1
    )


def _duration_rule(duration: Duration, steps: int) -> Callable[[int, list[int]], float]:
    """``duration`` as a function (step, token ids so far) -> checked duration."""
    if callable(duration):
        try:
            takes = len(inspect.signature(duration).parameters)
        except (TypeError, ValueError):
            takes = 1
        if takes not in (1, 2):
            raise SignalError(
                f"a duration function takes (step) or (step, token_ids), this one takes {takes} arguments"
            )

        def call(step: int, ids: list[int]) -> float:
            value = duration(step, list(ids)) if takes == 2 else duration(step)
            return _number(value, f"the duration of step {step}", low=0.0)

        return call
    if _is_sequence(duration):
        values = [_number(v, f"duration[{i}]", low=0.0) for i, v in enumerate(duration)]  # type: ignore[arg-type]
        if len(values) < steps:
            raise SignalError(f"duration lists {len(values)} values for max_new_tokens = {steps}; give one per step")
        return lambda step, ids: values[step]
    fixed = _number(duration, "duration", low=0.0)
    return lambda step, ids: fixed


def longest_time(duration: Duration, steps: int) -> float | None:
    """How much time ``steps`` generated tokens of ``duration`` add at most (None for a function, known only as it runs)."""
    if callable(duration) or steps == 0:
        return None if callable(duration) else 0.0
    rule = _duration_rule(duration, steps)
    return math.fsum(rule(k, []) for k in range(steps))


def check_time(duration: Duration, steps: int, end: float = 0.0) -> None:
    """SignalError when ``steps`` tokens of ``duration`` after a prompt ending at ``end`` would pass :data:`MAX_TIME`."""
    added = longest_time(duration, steps)
    if added is not None and abs(end + added) > MAX_TIME:
        raise SignalError(
            f"{steps} generated tokens of duration {_shown(duration)} would end at time {end + added:.6g}, past "
            f"{MAX_TIME:g} (contllm.core.signal.MAX_TIME, the largest time a signal holds); shorten the duration or "
            "generate fewer tokens"
        )


def _shown(duration: Any) -> str:
    text = repr(duration) if not _is_sequence(duration) else f"[{len(duration)} values]"
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class Sampler:
    """How the next token is chosen: the argmax (``sample`` False), or a draw after temperature, top-k and top-p."""

    sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None


def _sampler(sample: Any, temperature: Any, top_k: Any, top_p: Any, seed: Any) -> Sampler:
    if not isinstance(sample, bool):
        raise SignalError(f"sample must be True or False, got {sample!r}")
    given = [
        n
        for n, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("seed", seed))
        if v is not None
    ]
    if given and not sample:
        raise SignalError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only when sampling; "
            "pass sample=True (--sample on the command line); greedy decoding takes none"
        )
    t = 1.0 if temperature is None else _number(temperature, "temperature", positive=True)
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise SignalError(f"top_k must be an integer >= 1, got {top_k!r}")
    p = None if top_p is None else _number(top_p, "top_p", positive=True)
    if p is not None and p > 1:
        raise SignalError(f"top_p must lie in (0, 1], got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        raise SignalError(f"seed must be an integer from 0 to {MAX_SEED} (2**63 - 1), got {seed!r}")
    return Sampler(sample, t, top_k, p)


def _stop_strings(stop: Any) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise SignalError(f"stop must be a non-empty string or a list of them, got {stop!r}")
    return list(items)


def check_options(
    max_new_tokens: Any = 20,
    *,
    duration: Any = 1.0,
    sample: Any = False,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    seed: Any = None,
    stop: Any = None,
    stop_at_eos: Any = True,
) -> tuple[int, Callable[[int, list[int]], float], Sampler, list[str]]:
    """The options of :func:`contllm.generation.generate` that need no model, checked; SignalError naming the first bad one.

    Returns the step count, the duration rule (step, token ids) -> duration, the sampler
    and the stop strings. A fixed duration or a list of them must keep the generated
    tokens within :data:`MAX_TIME` of the prompt's end.
    """
    steps = check_max_new_tokens(max_new_tokens)
    if not isinstance(stop_at_eos, bool):
        raise SignalError(f"stop_at_eos must be True or False, got {stop_at_eos!r}")
    rule = _duration_rule(duration, steps)
    check_time(duration, steps)
    return steps, rule, _sampler(sample, temperature, top_k, top_p, seed), _stop_strings(stop)
