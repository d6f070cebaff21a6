"""An audit's :class:`Study` of one experiment: the numbers its card shows, how its size is counted, the sentence it says.

An experiment declares its study itself (:attr:`~contllm.experiments.base.Experiment.study`);
:mod:`contllm.audits.studies` gathers the registered experiments' studies and writes the
sentences. This module holds the type alone, so that the experiments' base class can name
it without importing the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from contllm.audits.budget import Bounds

Interval = tuple[float | None, float | None]


@dataclass(frozen=True)
class Study:
    """One experiment of an audit.

    experiment: its registered name. headline: the metric the card leads with; paper: the
    paper's metrics (docs/paper.md), empty where the paper gives this result no number.
    minimum, comfortable, maximum: the counts the planner may choose (count: items, or
    paths per source where ``per_source``; maximum None: the dataset's size), see
    :class:`~contllm.audits.budget.Bounds`; optional: runs only where the budget allows. spread: pick the items spread evenly over the dataset (its first N
    otherwise, for datasets interleaved so that the first N are a balanced sample).
    protocol: the experiment takes --protocol. finding: (summary, intervals by metric) ->
    the sentence of what was found. given: options the audit always gives the experiment,
    (name, value as typed on the command line) pairs. probes: the two counts at which the
    planner dry-runs the study to price it (None: 2 and 6, or 2 and 2 paths per source);
    give small ones for an experiment that computes outside the engine (its dry run does
    the real work, see :func:`contllm.audits.run.dry_run`).
    """

    experiment: str
    headline: str
    paper: tuple[str, ...]
    finding: Callable[[Mapping[str, Any], Mapping[str, Interval]], str]
    minimum: int = 4
    comfortable: int = 8
    maximum: int | None = None
    optional: bool = False
    spread: bool = False
    per_source: bool = False
    protocol: bool = True
    given: tuple[tuple[str, str], ...] = ()
    probes: tuple[int, int] | None = None

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics the card shows, headline first."""
        return (self.headline, *self.paper)

    @property
    def unit(self) -> str:
        return "paths per source" if self.per_source else "items"

    def probe_counts(self, bound: Bounds) -> tuple[int, int]:
        """The two counts the planner's dry runs measure, within ``bound``."""
        low, high = self.probes or ((2, 2) if self.per_source else (2, 6))
        return min(bound.minimum, low), min(bound.maximum, high)

    def bounds(self, size: int) -> Bounds:
        """The planner's bounds for a dataset of ``size`` units."""
        top = size if self.maximum is None else min(size, self.maximum)
        return Bounds(min(self.minimum, top), top, min(self.comfortable, top), self.optional)

    def options(self, protocol: str, count: int) -> dict[str, str]:
        """The experiment's options (as typed on the command line) for an audit under ``protocol`` of ``count`` units."""
        options = {**dict(self.given), **({"protocol": protocol} if self.protocol else {})}
        if self.per_source:
            options["per_source"] = str(count)
        return options

    def items(self, ids: list[str], count: int) -> str | None:
        """The run's ``items`` setting for ``count`` units, given every item id of the experiment's config."""
        if self.per_source:
            return None
        if count >= len(ids):
            return str(len(ids))
        if not self.spread:
            return str(count)
        return ",".join(ids[k * len(ids) // count] for k in range(count))
