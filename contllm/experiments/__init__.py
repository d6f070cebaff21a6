"""The experiments: counting, event duration and Boolean interpolation.

Each is a dataset, a config dataclass and a ``plan_item`` function; :func:`run_experiment`
evaluates the plans on a model and returns an :class:`ExperimentResult`::

    lm = contllm.load("smollm2-135m")
    result = run_experiment(lm, "counting", CountingConfig(samples=10), items="5")
    result.plot().savefig("counting.png"); result.save("out/")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from contllm import metrics
from contllm.data import load_counting, load_events, select_items
from contllm.errors import ExperimentError
from contllm.experiments import boolean, counting, events
from contllm.experiments.base import ExperimentResult, Plan, Sweep, config_dict, run_plan
from contllm.experiments.boolean import BooleanConfig
from contllm.experiments.counting import CountingConfig
from contllm.experiments.events import EventsConfig
from contllm.lm import ContinuousLM
from contllm.signal import Signal

__all__ = [
    "EXPERIMENTS",
    "BooleanConfig",
    "CountingConfig",
    "EventsConfig",
    "Experiment",
    "ExperimentResult",
    "Sweep",
    "run_experiment",
    "summarize",
]


@dataclass(frozen=True)
class Experiment:
    """An experiment's parts: its config type, its items, and how an item becomes a sweep."""

    name: str
    config_type: type
    items: Callable[[Any], list[Any]]
    plan_item: Callable[[ContinuousLM, Any, Any], Plan]
    x_label: str
    description: str


EXPERIMENTS: dict[str, Experiment] = {
    "counting": Experiment(
        "counting",
        CountingConfig,
        lambda config: load_counting(),
        counting.plan_item,
        "factor",
        "a word repeated n times, its occurrences' durations scaled by a factor; digits read out",
    ),
    "events": Experiment(
        "events",
        EventsConfig,
        lambda config: load_events(),
        events.plan_item,
        "factor",
        "a passage of n events, their durations scaled by a factor; digits read out",
    ),
    "boolean": Experiment(
        "boolean",
        BooleanConfig,
        boolean.boolean_items,
        boolean.plan_item,
        "alpha",
        "a Boolean operator interpolated into another in embedding space; 0/1 and false/true read out",
    ),
}


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name``; ExperimentError naming the known ones otherwise."""
    if name not in EXPERIMENTS:
        raise ExperimentError(f"unknown experiment {name!r}; known experiments: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def run_experiment(
    lm: ContinuousLM,
    name: str,
    config: Any = None,
    *,
    items: str | int | None = None,
    evaluate: Callable[[list[Signal]], Any] | None = None,
    skip: dict[str, Sweep] | None = None,
    on_sweep: Callable[[Sweep], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    model_name: str | None = None,
) -> ExperimentResult:
    """Run experiment ``name`` on ``lm``.

    config: the experiment's config dataclass (None: defaults). items: the first N items
    or a comma-separated list of ids (None: all). evaluate: signals -> next-token
    distributions [S, vocab] (default: the batched engine). skip: sweeps already done
    (resumed runs), kept as they are. on_sweep: called after each new sweep (to save it).
    progress: called with (items done, items total).
    """
    experiment = get_experiment(name)
    config = config if config is not None else experiment.config_type()
    if not isinstance(config, experiment.config_type):
        raise ExperimentError(f"{name} takes a {experiment.config_type.__name__}, got {type(config).__name__}")
    chosen = select_items(experiment.items(config), items)
    if evaluate is None:
        from contllm.engine import Engine

        engine = Engine(lm)
        evaluate = lambda signals: engine.probs(signals)  # noqa: E731
    skip = skip or {}
    sweeps: list[Sweep] = []
    for done, item in enumerate(chosen, start=1):
        if item.id in skip:
            sweeps.append(skip[item.id])
        else:
            sweep = run_plan(experiment.plan_item(lm, item, config), evaluate)
            sweeps.append(sweep)
            if on_sweep is not None:
                on_sweep(sweep)
        if progress is not None:
            progress(done, len(chosen))
    model = model_name or getattr(lm.info, "name", None) or str(getattr(lm.model.config, "_name_or_path", "model"))
    return ExperimentResult(name, model, config_dict(config), sweeps, x_label=experiment.x_label)


def _count_curve(sweep: Sweep) -> metrics.CountCurve:
    numeric = [i for i, lab in enumerate(sweep.labels) if lab.isdigit()]
    return metrics.CountCurve(
        sweep.x, sweep.probs[:, numeric], np.array([int(sweep.labels[i]) for i in numeric]), int(sweep.truth or 0)
    )


def summarize(result: ExperimentResult) -> dict[str, Any]:
    """Headline numbers of a result.

    counting / events: accuracy of the argmax digit at factor 1, mean Spearman correlation
    of the implied count E[k] with the factor, and the areas under the observed and
    counterfactual time-sensitivity curves. boolean: truth-table accuracy at alpha 0 and 1
    (argmax of 0 vs 1) and the mean total variation and largest step of P(1).
    """
    sweeps = result.sweeps
    if not sweeps:
        raise ExperimentError("the result holds no sweeps")
    out: dict[str, Any] = {"experiment": result.experiment, "model": result.model, "items": len(sweeps)}
    if result.experiment in ("counting", "events"):
        has_one = all(np.isclose(s.x, 1.0).any() for s in sweeps)
        if has_one:
            out["accuracy_at_1"] = float(np.mean([s.labels[int(np.argmax(s.at(1.0)))] == s.truth for s in sweeps]))
        rhos = [metrics.spearman(s.x, s.implied_value()) for s in sweeps if len(s.x) > 1]
        out["mean_spearman_implied_vs_factor"] = float(np.nanmean(rhos)) if rhos else float("nan")
        curves = [_count_curve(s) for s in sweeps]
        h = metrics.default_thresholds()
        out["auc_observed_time_sensitivity"] = metrics.area_under_curve(
            h, metrics.observed_time_sensitivity(curves, h)
        )
        if has_one:
            out["auc_counterfactual_time_sensitivity"] = metrics.area_under_curve(
                h, metrics.counterfactual_time_sensitivity(curves, h)
            )
        out["argmax_coverage"] = metrics.argmax_coverage(curves)
    elif result.experiment == "boolean":
        def correct(s: Sweep, at: float, key: str) -> bool | None:
            if not np.isclose(s.x, at).any():
                return None
            p = s.at(at)
            return int(p[s.labels.index("1")] > p[s.labels.index("0")]) == int(s.meta[key])

        for at, key, name in ((0.0, "truth_first", "accuracy_at_alpha_0"), (1.0, "truth_second", "accuracy_at_alpha_1")):
            marks = [correct(s, at, key) for s in sweeps]
            if all(m is not None for m in marks):
                out[name] = float(np.mean(marks))
        shapes = [metrics.smoothness(s.x, s.column("1")) for s in sweeps if len(s.x) > 1]
        if shapes:
            out["mean_total_variation_p1"] = float(np.mean([m.total_variation for m in shapes]))
            out["mean_max_jump_p1"] = float(np.mean([m.max_jump for m in shapes]))
    return out

