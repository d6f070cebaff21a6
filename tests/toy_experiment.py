"""A toy experiment declared in this one file: a word counted three times over, its duration swept.

It is what CONTRIBUTING.md's "Adding an experiment" asks of a new experiment, and nothing
more: its items, how a model turns an item into a sweep (the counting experiment's own
helpers), its explorer page (:attr:`~contllm.experiments.base.Experiment.explorer`, from
:class:`~contllm.experiments.sweeps.SweepExperiment`) and its audit study
(:attr:`~contllm.experiments.base.Experiment.study`). Registering it
(``contllm.registry.register(NAME, "tests.toy_experiment")``) gives it ``contllm run``,
--resume, ``explorer.html``, ``contllm report`` and a finding on an audit's card;
tests/integration/test_declared_experiment.py checks each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contllm.audits.studies import Interval, Study, number
from contllm.data import CountingItem
from contllm.experiments import counting
from contllm.experiments.base import option_table
from contllm.experiments.counting import CountingConfig
from contllm.experiments.sweeps import CountingSweepExperiment, SweepPlan

NAME = "toy-count"

ITEMS = (
    CountingItem("toy-apple", "apple", "an apple", "fruits", 2, False),
    CountingItem("toy-chair", "chair", "a chair", "pieces of furniture", 3, False),
    CountingItem("toy-dog", "dog", "a dog", "animals", 4, False),
)


def finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    """The card's sentence of the toy."""
    return f"The toy's counts peak at {number(summary.get('pure_peak_rate'), '.0%')} of 1..n."


class ToyCountExperiment(CountingSweepExperiment):
    name = NAME
    help = "Three words, each repeated n times, their durations scaled by a factor; digits read out (a test's toy)."
    explorer_text = "The toy: a word repeated n times; the slider scales every repetition's duration."
    Config = CountingConfig
    options = option_table(
        """
        samples  int  Values of the duration factor c per item. [default: 10]
        """
    )
    study = Study(
        NAME, "pure_peak_rate", ("accuracy_at_1",), finding, minimum=1, comfortable=3, optional=True, protocol=False
    )

    def items(self, config: CountingConfig) -> Sequence[CountingItem]:
        return ITEMS

    def plan_item(self, lm: Any, item: CountingItem, config: CountingConfig) -> SweepPlan:
        return counting.plan_item(lm, item, config)


EXPERIMENT = ToyCountExperiment()
