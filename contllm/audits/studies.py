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

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from contllm.audits.study import Interval, Study

__all__ = ["PROTOCOLS", "STUDIES", "Interval", "Study", "declared_studies", "number", "study"]

#: The audit's protocols: the experiments' own (contllm) or the paper's.
PROTOCOLS = ("contllm", "paper")

# ---------------------------------------------------------------------------- sentences


def number(value: Any, form: str = ".2f") -> str:
    """A summary value as the card writes it ("n/a" for a missing or NaN one)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "n/a"
    return format(value, form)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
        peaks = _finite(low) and low > 1  # type: ignore[operator]
        follows = _finite(rho) and rho > 0.5  # type: ignore[operator]
        if peaks and follows:
            verdict = (
                f"Shortened {what} are counted as fewer: the implied count rises with their duration and the most "
                "probable count takes more than one value of 1..n along the sweep"
            )
        elif follows:
            verdict = f"Shortened {what} lower the implied count, but the most probable count seldom moves"
        else:
            verdict = f"No sign that shortened {what} are counted as fewer"
        return f"{verdict}: {numbers}."

    return finding


def boolean_finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    tv, jump = summary.get("mean_total_variation_p1"), summary.get("mean_max_jump_p1")
    if not (_finite(tv) and _finite(jump)) or tv < 0.05:  # type: ignore[operator]
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


def interpolation_finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    share = summary.get("variation_share")
    if not _finite(share):
        verdict = "Along the word's interpolation"
    elif share <= 0.1:  # type: ignore[operator]
        verdict = "Along the word's interpolation P(yes) and P(no) stay between their values at the two words"
    else:
        verdict = (
            "Along the word's interpolation P(yes) and P(no) often leave the range of their values at the two words"
        )
    crossing = summary.get("crossover_share")
    crossed = (
        f"; {number(crossing, '.0%')} of the questions whose answer differs between the words cross over"
        if _finite(crossing)
        else ""
    )
    return (
        f"{verdict}: {number(share, '.0%')} of items leave it by 0.05 or more, and the paper's Lipschitz estimate "
        f"is {number(summary.get('mean_lipschitz'))} (1 for a straight line){crossed}."
    )


def linearity_finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    r2, base = summary.get("all_mean_r2"), summary.get("all_mean_r2_baseline")
    if not _finite(r2):
        verdict = "The read-outs are flat along the paths"
    elif r2 >= 0.9:  # type: ignore[operator]
        verdict = "The read-out along a path between two inputs' embeddings stays close to the chord between its ends"
    elif r2 >= 0.5:  # type: ignore[operator]
        verdict = "The read-out along a path between two inputs' embeddings follows the chord between its ends in part"
    else:
        verdict = "The read-out along a path between two inputs' embeddings departs from the chord between its ends"
    return (
        f"{verdict}: R² of the chord {number(r2)} (along a random direction of the same length {number(base)}), "
        f"largest distance {number(summary.get('all_mean_max_deviation'))} in probability (means over paths)."
    )


def sums_finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    rho, valid, success = summary.get("mean_spearman"), summary.get("valid_rate"), summary.get("successful_rate")
    if _finite(rho) and rho > 0.5:  # type: ignore[operator]
        verdict = "A shortened number weighs less in the sum"
    else:
        verdict = "No sign that a shortened number weighs less in the sum"
    paper = (
        f"of those, {number(success, '.0%')} move toward the shrunk outputs at some factor (the paper's success rate)"
        if _finite(success)
        else "so the paper's success rate has no problem to count"
    )
    return (
        f"{verdict}: the implied sum follows the factor with Spearman {number(rho)}; "
        f"{number(valid, '.0%')} of problems are valid (the right first digit at factor 1), {paper}."
    )


def circuit_finding(summary: Mapping[str, Any], intervals: Mapping[str, Interval]) -> str:
    """The sentence of the circuit study: how many heads bring back half of the change in the implied count (three or
    fewer read as "a few"), what the top heads bring back together and how well one backward ranks them."""
    half, top = summary.get("heads_for_half"), summary.get("top_share")
    with_half, items = summary.get("items_with_half"), summary.get("items")
    verdict = "No few heads carry the change in the count: the heads patched together never bring back half of it"
    if _finite(half):
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
