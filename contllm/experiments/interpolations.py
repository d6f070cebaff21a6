"""What the interpolation experiments share (boolean, interpolation, counting-interpolation).

Each moves a span of one prompt into the matching span of another in embedding space,
from alpha 0 (the first prompt) to alpha 1 (the second), and reads a label set at every
alpha. :class:`AlphaSweepConfig` and :func:`alpha_options` are their common options,
:func:`interpolation_plan` turns the two ends into a :class:`~contllm.experiments.sweeps.SweepPlan`
and :func:`end_accuracy` scores the read-out at both ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from contllm.core.interpolate import interpolate_spans
from contllm.core.readout import TokenSets
from contllm.core.signal import Signal
from contllm.errors import ExperimentError, SignalError
from contllm.experiments.options import METHOD, Option
from contllm.experiments.protocol import PAPER_RUNS
from contllm.experiments.sweeps import (
    Sweep,
    SweepConfig,
    SweepExperiment,
    SweepPlan,
    check_alpha_sweep,
    ends_provenance,
    sweep_options,
    sweep_values,
)

#: The two ends of an interpolation: the first prompt and its span, the second prompt and its span.
Ends = tuple[Signal, Any, Signal, Any]


@dataclass
class AlphaSweepConfig(SweepConfig):
    """A :class:`~contllm.experiments.sweeps.SweepConfig` whose knob is alpha (within [0, 1]; samples None: 21, or
    the paper's :attr:`PAPER_SAMPLES`), with the way the embeddings move: method "linear" or "slerp"."""

    SAMPLES: ClassVar[int] = 21

    low: float = 0.0
    method: str = "linear"

    def check_knob(self) -> None:
        check_alpha_sweep(*self.bounds(), self.samples, self.method)

    def alphas(self) -> np.ndarray:
        """The values of alpha [S], from low to high."""
        return sweep_values(*self.bounds(), self.samples, include=None)


class AlphaSweepExperiment(SweepExperiment):
    """An interpolation experiment: its knob is alpha."""

    x_label: ClassVar[str] = "alpha"


def alpha_options(samples: int, *, chat: bool = True) -> tuple[Option, ...]:
    """--range and --samples of alpha (``samples`` by default), --template, --chat (unless ``chat`` is false), --method."""
    return (*sweep_options("alpha (within 0,1)", "0,1", samples)[: 4 if chat else 3], METHOD)


def interpolation_plan(
    lm: Any,
    item_id: str,
    ends: Ends,
    alphas: np.ndarray,
    method: str,
    token_sets: TokenSets,
    meta: dict[str, Any],
    truth: str | None = None,
) -> SweepPlan:
    """The sweep of one item: the first end's span moved into the second's at each alpha (``method``: linear or
    slerp); ``meta`` gets both prompts' provenance and whether the paper's code could have run the item (it
    interpolates the two prompts position by position, so they must have as many tokens). ExperimentError naming
    the item where the spans cannot be interpolated."""
    sa, span_a, sb, span_b = ends
    try:
        signals = [interpolate_spans(sa, span_a, sb, span_b, float(x), method=method) for x in alphas]  # type: ignore[arg-type]
    except SignalError as err:
        raise ExperimentError(f"item {item_id}: {err}") from None
    meta = {**meta, PAPER_RUNS: len(sa) == len(sb), **ends_provenance(lm.tokenizer, sa, span_a, sb, span_b)}
    return SweepPlan(item_id, alphas, signals, token_sets, truth=truth, meta=meta)


def end_accuracy(
    sweeps: Sequence[Sweep], keys: tuple[str, str], correct: Callable[[Sweep, np.ndarray, Any], bool]
) -> dict[str, float]:
    """accuracy_at_alpha_0 and accuracy_at_alpha_1: the share of ``sweeps`` whose label probabilities p at that end
    are right, ``correct(sweep, p, sweep.meta[key])`` with the end's key of ``keys``. An end that some sweep does
    not reach is left out."""
    out = {}
    for name, at, key in (("accuracy_at_alpha_0", 0.0, keys[0]), ("accuracy_at_alpha_1", 1.0, keys[1])):
        if sweeps and all(np.isclose(s.x, at).any() for s in sweeps):
            out[name] = float(np.mean([correct(s, s.at(at), s.meta[key]) for s in sweeps]))
    return out
