"""What an audit runs: the :class:`Study` each registered experiment declares, and the sentences the card says.

Each study names its experiment, the headline metric and the paper's metrics among the
experiment's declared ones (:class:`~contllm.experiments.base.Metric`: the card reads
their direction and meaning from there), how its size is counted (items, or paths per
source for linearity), the bounds the budget planner keeps it in, and the sentence that
says what the numbers found. An experiment declares its study as its
:attr:`~contllm.experiments.base.Experiment.study`; the audit runs the registered
experiments that declare one (:data:`STUDIES`, in the registry's order), through the
runner like any other run. The sentences of the built-in studies are here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from contllm.audits.study import Interval, Study
from contllm.wording import CardSentence, finite, first_holding, number

__all__ = ["PROTOCOLS", "STUDIES", "Interval", "Study", "declared_studies", "number", "study"]

#: The audit's protocols: the experiments' own (contllm) or the paper's.
PROTOCOLS = ("contllm", "paper")

# ---------------------------------------------------------------------------- sentences


def counting_finding(what: str) -> Callable[[Mapping[str, Any], Mapping[str, Interval]], str]:
    """The sentence of counting or events (``what``: "words", "events")."""

    def finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
        rho = summary.get("mean_spearman_implied_vs_factor")
        low = intervals.get("pure_improvement_over_chance", (None, None))[0]
        numbers = (
            f"{number(summary.get('pure_peak_rate'), '.0%')} of the counts 1..n are the most probable digit at some "
            f"factor ({number(summary.get('pure_improvement_over_chance'))}x the one count of chance), the implied "
            f"count follows the factor with Spearman {number(rho)}, and the count at factor 1 is right for "
            f"{number(summary.get('accuracy_at_1'), '.0%')} of items"
        )
        peaks = finite(low) and low > 1  # type: ignore[operator]
        follows = finite(rho) and rho > 0.5  # type: ignore[operator]
        verdict = first_holding(
            (
                peaks and follows,
                f"Shortened {what} are counted as fewer: the implied count rises with their duration and the most "
                "probable count takes more than one value of 1..n along the sweep",
            ),
            (follows, f"Shortened {what} lower the implied count, but the most probable count seldom moves"),
            otherwise=f"No sign that shortened {what} are counted as fewer",
        )
        return f"{verdict}: {numbers}."

    return finding


def boolean_finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    tv, jump = summary.get("mean_total_variation_p1"), summary.get("mean_max_jump_p1")
    if not (finite(tv) and finite(jump)) or tv < 0.05:  # type: ignore[operator]
        verdict = "P(1) barely moves as one operator's embedding moves into another's"
    elif jump <= 0.5 * tv:  # type: ignore[operator]
        verdict = "P(1) moves gradually as one operator's embedding moves into another's"
    else:
        verdict = "P(1) moves mostly in one step as one operator's embedding moves into another's"
    return (
        f"{verdict}: its largest step between neighbouring alphas is {number(jump, '.3f')} and its total variation "
        f"{number(tv)} (means over items); the truth table is right for {number(summary.get('accuracy_at_alpha_0'), '.0%')} "
        f"of items at the first operator and {number(summary.get('accuracy_at_alpha_1'), '.0%')} at the second."
    )


#: The sentences of word interpolation, linearity and sums: each a ladder and a template in the catalogue.
interpolation_finding = CardSentence("interpolation_range")
linearity_finding = CardSentence("linearity")
sums_finding = CardSentence("sums")


def circuit_finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    """The sentence of the circuit study: how many heads bring back half of the change in the implied count (three or
    fewer read as "a few"), what the top heads bring back together and how well one backward ranks them."""
    half, top = summary.get("heads_for_half"), summary.get("top_share")
    with_half, items = summary.get("items_with_half"), summary.get("items")
    verdict = "No few heads carry the change in the count: the heads patched together never bring back half of it"
    if finite(half):
        how = "A few heads carry" if half <= 3 else "Heads spread out carry"  # type: ignore[operator]
        reached = "" if with_half == items else f" (on {with_half} of {items} items)"
        verdict = (
            f"{how} the change in the count: {number(half, '.1f')} heads (mean) patched from the plain run bring "
            f"back half of it{reached}"
        )
    together = f"the {summary.get('top', 'top')} heads of largest estimate together bring back {number(top, '.0%')}"
    estimate = (
        f"the one-backward estimate follows exact patching with r = {number(summary.get('estimate_correlation'))}"
    )
    times = f"the plain run's times alone bring back {number(summary.get('times_share'), '.0%')}"
    return f"{verdict}; {together}, {estimate}, and {times}."


def declared_studies() -> tuple[Study, ...]:
    """The studies of the registered experiments that declare one, in registry order (the card's order).

    Imports every registered experiment; ExperimentError for an experiment whose study
    names another experiment.
    """
    from contllm import registry
    from contllm.errors import ExperimentError

    out = []
    for name in registry.names():
        declared = registry.get(name).study
        if declared is None:
            continue
        if declared.experiment != name:
            raise ExperimentError(f"experiment {name!r} declares the study of {declared.experiment!r}")
        out.append(declared)
    return tuple(out)


class Studies(Sequence[Study]):
    """The audit's studies, read from the registry at each use (:func:`declared_studies`), so that an experiment
    registered later (an installed package, a test's) is audited as well."""

    @overload
    def __getitem__(self, index: int) -> Study: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Study]: ...
    def __getitem__(self, index: int | slice) -> Study | Sequence[Study]:
        return declared_studies()[index]

    def __len__(self) -> int:
        return len(declared_studies())

    def __iter__(self) -> Iterator[Study]:
        return iter(declared_studies())

    def __repr__(self) -> str:
        return f"Studies({', '.join(s.experiment for s in self)})"


#: The studies of an audit, in the card's order (the registry's); those marked optional run only where the budget
#: allows (sums).
STUDIES: Sequence[Study] = Studies()


def study(name: str) -> Study:
    """The study of experiment ``name``; ExperimentError naming the audited ones otherwise."""
    from contllm import registry
    from contllm.errors import ExperimentError

    declared = registry.get(name).study if registry.known(name) else None
    if declared is None or declared.experiment != name:
        raise ExperimentError(
            f"an audit has no experiment {name!r}; it runs {', '.join(s.experiment for s in STUDIES)}"
        )
    return declared
