"""An audit's time budget: read it, measure this machine, and choose how many items each experiment gets.

A plan is made once, before the first run, and kept in the audit directory, so that a
resumed audit computes exactly the items an uninterrupted one would have.

How long an experiment takes is estimated in two parts:

- the tokens its forwards compute: each experiment is dry-run through the runner's own
  :func:`~contllm.rundir.runner.compute_records` on a few of its items, with an evaluator that
  asks the engine what each call would compute (:meth:`~contllm.core.engine.Engine.planned_cost`:
  the engine's own chunks, prefixes shared as they would be) and answers with a
  placeholder distribution instead of running the model;
- the work besides the forwards (prompts, signals, read-outs): the dry run's own wall time.

Both are measured at two item counts and taken as linear in the count. One timed
calibration forward (a counting sweep through the engine, after a short warm-up) converts
tokens into seconds on this machine as it is loaded now. The plan then gives each
experiment an equal share of what is left of the budget after the time already spent,
the outputs and a safety margin (:data:`MARGIN`); sums joins where every other experiment
still gets a comfortable number of items.

:func:`parse_budget` and :func:`budget_text` import nothing heavy (the command line reads
a budget before torch loads).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from contllm.errors import ExperimentError
from contllm.numerals import as_number

#: The budget when none is given.
DEFAULT_BUDGET = "10m"
#: The smallest budget taken (the model's load alone can take longer).
MIN_BUDGET_S = 30.0
#: Share of the budget left for the runs that the plan fills; the rest absorbs estimation
#: error and a machine whose load changes while the audit runs.
MARGIN = 0.85
#: Seconds kept for each run's outputs (results, tables, summary figure, explorer page) and,
#: once, for the card (bootstrap, figures read back, pages): measured on a 2-core CPU under load.
OUTPUT_S = 4.0
CARD_S = 8.0

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([hms])")


def parse_budget(text: str | float | int) -> float:
    """A budget as seconds: "10m", "90s", "1h", "1m30s", "2.5m", or a number of seconds; ExperimentError otherwise.

    The budget must be at least :data:`MIN_BUDGET_S` seconds.
    """
    if isinstance(text, bool):
        raise ExperimentError(f"--budget takes a time such as 10m, 90s or 1h30m, got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        if not isinstance(text, str):
            raise ExperimentError(f"--budget takes a time such as 10m, 90s or 1h30m, got {text!r}")
        compact = text.strip().lower().replace(" ", "")
        parts = _PART.findall(compact)
        units = [unit for _, unit in parts]
        if not parts or "".join(n + u for n, u in parts) != compact or len(set(units)) != len(units):
            raise ExperimentError(
                f"--budget takes a time such as 10m, 90s or 1h30m (a number and a unit h, m or s), got {text!r}"
            )
        seconds = sum(_number(number) * _UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds < MIN_BUDGET_S:
        raise ExperimentError(
            f"--budget must be at least {budget_text(MIN_BUDGET_S)} (loading the model alone takes seconds), "
            f"got {text!r}"
        )
    return seconds


def _number(text: str) -> float:
    """One part's number, read by :func:`contllm.numerals.as_number` (ASCII digits only)."""
    value = as_number(text)
    if value is None:  # the pattern above admits only what as_number reads
        raise ExperimentError(f"--budget takes ASCII digits, got {text!r}")
    return value


def budget_text(seconds: float) -> str:
    """``seconds`` as the command line writes a budget: "3m", "1m30s", "45s", "1h5m"."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v)
    return text or "0s"


# ---------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class Probe:
    """A dry run of ``count`` items: the tokens its forwards would compute and the seconds of its other work."""

    count: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class Estimate:
    """An experiment's cost, linear in its count: from two probes (:class:`Probe`) at different counts."""

    experiment: str
    probes: tuple[Probe, Probe]

    def tokens(self, count: int) -> float:
        return self._line(count, lambda p: p.tokens)

    def other_seconds(self, count: int) -> float:
        return self._line(count, lambda p: p.seconds)

    def seconds(self, count: int, rate: float) -> float:
        """Seconds for ``count`` items at ``rate`` seconds per token."""
        return self.tokens(count) * rate + self.other_seconds(count)

    def _line(self, count: int, value: Callable[[Probe], float]) -> float:
        (a, b) = self.probes
        slope = max(0.0, (value(b) - value(a)) / (b.count - a.count))
        fixed = max(0.0, value(a) - slope * a.count)
        return fixed + slope * count


@dataclass
class Calibration:
    """The timed calibration forward: ``signals`` signals whose forwards compute ``tokens`` tokens took ``seconds``.

    warmup: seconds of a one-signal forward before it (first calls pay one-time costs).
    rate: seconds per token, the number the plan works with.
    """

    signals: int
    tokens: int
    seconds: float
    warmup: float

    @property
    def rate(self) -> float:
        return self.seconds / max(1, self.tokens)


@dataclass(frozen=True)
class Share:
    """One experiment's part of a plan: its count (items, or paths per source) and the seconds it is expected to take."""

    experiment: str
    count: int
    seconds: float


@dataclass
class Plan:
    """What an audit runs: each experiment's count, how it was chosen, and the time that was left for it.

    budget: seconds in all; spent: seconds gone before the plan (loading, calibrating);
    reserved: seconds kept for the outputs and the card; available: what the runs may take
    (the rest, times :data:`MARGIN`). counts: experiment -> count. left_out: experiments of
    the audit that did not fit, with why. calibration: the timed forward (None for a plan
    given by its counts).
    """

    budget: float | None
    spent: float
    reserved: float
    available: float
    shares: list[Share]
    left_out: dict[str, str] = field(default_factory=dict)
    calibration: Calibration | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {s.experiment: s.count for s in self.shares}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["calibration"] = (
            None if self.calibration is None else {**asdict(self.calibration), "rate": self.calibration.rate}
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        calibration = data.get("calibration")
        return cls(
            budget=data.get("budget"),
            spent=float(data["spent"]),
            reserved=float(data["reserved"]),
            available=float(data["available"]),
            shares=[Share(str(s["experiment"]), int(s["count"]), float(s["seconds"])) for s in data["shares"]],
            left_out=dict(data.get("left_out") or {}),
            calibration=None
            if calibration is None
            else Calibration(**{k: v for k, v in calibration.items() if k != "rate"}),
        )


@dataclass(frozen=True)
class Bounds:
    """How many of an experiment's units an audit may give it: at least ``minimum``, at most ``maximum``.

    comfortable: the count every other experiment must still get for an optional one to join.
    """

    minimum: int
    maximum: int
    comfortable: int
    optional: bool = False


def least_budget(spent: float, reserved: float, needed: float) -> float:
    """The smallest budget, in whole minutes, whose share for the runs (:data:`MARGIN` of what is left after the
    ``spent`` and ``reserved`` seconds) covers ``needed`` seconds of them."""
    return math.ceil((spent + reserved + needed / MARGIN) / 60.0) * 60.0


def allocate(
    available: float,
    bounds: Mapping[str, Bounds],
    seconds: Callable[[str, int], float],
    *,
    least: Callable[[float], float] | None = None,
) -> tuple[dict[str, int], dict[str, str]]:
    """Counts that share ``available`` seconds equally among the experiments of ``bounds`` (in their order).

    seconds(name, count): the estimated seconds of ``count`` units of experiment ``name``.
    Each experiment gets an equal share, as many units as fit in it (within its bounds: one
    whose minimum costs more takes its minimum, one whose maximum costs less its maximum,
    and the others share the rest), and what the shares leave unused goes to the
    experiments one unit at a time, in turn. An optional
    experiment joins only where every other one still gets its comfortable count and it
    gets its minimum. Returns (counts, left out: name -> why). ExperimentError when the
    experiments that must run do not fit at their minimum counts; with ``least`` (the
    smallest budget whose share covers given seconds of runs) it names the budget to give.
    """
    required = [name for name, b in bounds.items() if not b.optional]
    optional = [name for name, b in bounds.items() if b.optional]
    counts = _fill(available, required, bounds, seconds)
    if counts is None:
        needed = sum(seconds(name, bounds[name].minimum) for name in required)
        larger = "a larger --budget" if least is None else f"--budget {budget_text(least(needed))} or more"
        raise ExperimentError(
            f"the budget leaves {available:.0f} s for the experiments, and the smallest audit "
            f"({', '.join(f'{n} {bounds[n].minimum}' for n in required)}) needs about {needed:.0f} s on this "
            f"machine now; give {larger}"
        )
    left_out: dict[str, str] = {}
    for name in optional:
        trial = _fill(available, [*counts, name], bounds, seconds)
        comfortable = trial is not None and all(trial[n] >= bounds[n].comfortable for n in counts)
        if trial is not None and comfortable:
            counts = trial
        else:
            left_out[name] = (
                f"left out: with it the budget would not give every other experiment its comfortable count "
                f"({', '.join(f'{n} {bounds[n].comfortable}' for n in required)})"
            )
    return counts, left_out


def _fill(
    available: float, names: Sequence[str], bounds: Mapping[str, Bounds], seconds: Callable[[str, int], float]
) -> dict[str, int] | None:
    """Equal shares of ``available`` within the bounds; None where the minimums alone do not fit.

    An experiment whose minimum costs more than an equal share gets its minimum and the
    others share the rest; then one whose maximum costs less gets its maximum, and the
    others share the rest again (minimums first, so that no maximum takes what a minimum needs).
    """
    if sum(seconds(n, bounds[n].minimum) for n in names) > available:
        return None
    open_ = list(names)
    counts: dict[str, int] = {}
    left = available
    while open_:
        share = left / len(open_)
        fixed = {n: bounds[n].minimum for n in open_ if seconds(n, bounds[n].minimum) >= share}
        if not fixed:
            fixed = {n: bounds[n].maximum for n in open_ if seconds(n, bounds[n].maximum) <= share}
        if not fixed:
            counts.update({n: _most(n, share, bounds[n], seconds) for n in open_})
            break
        for name, count in fixed.items():
            counts[name] = count
            left -= seconds(name, count)
            open_.remove(name)
    # What the shares leave unused (each count is a whole number of units) goes one unit at a time, in turn.
    spare = available - sum(seconds(n, counts[n]) for n in names)
    grown = True
    while grown:
        grown = False
        for name in names:
            step = seconds(name, counts[name] + 1) - seconds(name, counts[name])
            if counts[name] < bounds[name].maximum and step <= spare:
                counts[name] += 1
                spare -= step
                grown = True
    return {n: counts[n] for n in names}


def _most(name: str, share: float, bound: Bounds, seconds: Callable[[str, int], float]) -> int:
    """The largest count within the bounds whose seconds fit ``share`` (bound.minimum - 1 where none does)."""
    lo, hi = bound.minimum - 1, bound.maximum
    while lo < hi:  # seconds grow with the count: bisect
        mid = (lo + hi + 1) // 2
        if seconds(name, mid) <= share:
            lo = mid
        else:
            hi = mid - 1
    return lo


# ---------------------------------------------------------------------------- measuring


class DryEvaluator:
    """An evaluator that runs nothing: it adds up what the engine would compute and answers with a placeholder.

    The placeholder puts all probability on a token that reads as the digit "1" (or spreads
    it evenly where the tokenizer has none), so that a greedy answer keeps going digit after
    digit: sums' longest case.
    """

    def __init__(self, lm: Any, engine: Any) -> None:
        import torch

        from contllm.core.readout import decoded_vocabulary, digits

        self.engine = engine
        self.tokens = 0
        self.first: list[Any] = []  # the signals of the first call
        vocab = int(lm.model.get_input_embeddings().weight.shape[0])
        row = torch.full((vocab,), 1.0 / vocab)
        try:
            sets = digits(lm.tokenizer)
            decoded = decoded_vocabulary(lm.tokenizer)
            one = next(i for i in sets.token_ids[sets.labels.index("1")] if decoded[i] == "1")
        except (StopIteration, ValueError, ExperimentError):
            one = None
        if one is not None:
            row = torch.zeros(vocab)
            row[one] = 1.0
        self.row = row

    def __call__(self, signals: list[Any]) -> Any:
        self.first = self.first or list(signals)
        self.tokens += self.engine.planned_cost(signals)
        return self.row.expand(len(signals), -1)


def calibrate(lm: Any, engine: Any, signals: Sequence[Any]) -> Calibration:
    """Time one forward of ``signals`` through ``engine`` (after a one-signal warm-up): the plan's seconds per token."""
    started = time.perf_counter()
    engine.probs([signals[0]])
    warmup = time.perf_counter() - started
    tokens = engine.planned_cost(list(signals))
    started = time.perf_counter()
    engine.probs(list(signals))
    return Calibration(len(signals), tokens, time.perf_counter() - started, warmup)
