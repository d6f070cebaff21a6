"""The experiments, run from Python: data in, result out, nothing written.

Each experiment is declared in its own module (counting, events, boolean here; depth
and pde in their packages) and named in :mod:`contllm.registry`. :func:`run_experiment`
runs one on a loaded model and returns its result; ``contllm run`` does the same through
:mod:`contllm.runner`, which adds the run directory::

    lm = contllm.load("smollm2-135m")
    result = run_experiment(lm, "counting", CountingConfig(samples=10), items="5")
    print(summarize(result))
    figure(result).savefig("counting.png")
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from contllm import registry
from contllm.data import select_items
from contllm.experiments.base import Context, Experiment
from contllm.experiments.boolean import BooleanConfig
from contllm.experiments.counting import CountingConfig
from contllm.experiments.events import EventsConfig
from contllm.experiments.sweeps import ExperimentResult, Sweep

__all__ = [
    "BooleanConfig",
    "CountingConfig",
    "EventsConfig",
    "Experiment",
    "ExperimentResult",
    "Sweep",
    "compute_records",
    "figure",
    "run_experiment",
    "save",
    "summarize",
]


def run_experiment(
    lm: Any,
    name: str,
    config: Any = None,
    *,
    items: str | int | None = None,
    evaluate: Callable[[list[Any]], Any] | None = None,
    skip: Mapping[str, Any] | None = None,
    on_record: Callable[[str, Any], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    model_name: str | None = None,
    seed: int = 0,
    say: Callable[[str], None] | None = None,
) -> Any:
    """Run experiment ``name`` on ``lm`` and return its result (nothing is written).

    config: the experiment's config dataclass (None: defaults). items: the first N items
    or comma-separated ids (None: all). evaluate: signals -> next-token distributions
    [S, vocab] for the experiments that use the engine (default: a batched
    :class:`~contllm.engine.Engine`). skip: records already computed, by item id (reused).
    on_record: called with (item id, record) after each new record (the runner saves it).
    progress: called with (items done, items total).
    """
    experiment = registry.get(name)
    config = experiment.check_config(config if config is not None else experiment.config())
    chosen = select_items(experiment.items(config), items)
    skip = dict(skip or {})
    if evaluate is None and experiment.engine and any(item.id not in skip for item in chosen):
        from contllm.engine import Engine

        evaluate = Engine(lm).probs
    model = model_name or getattr(getattr(lm, "info", None), "name", None) or "model"
    context = Context(evaluate=evaluate, seed=seed, say=say or (lambda message: None), model_name=str(model))
    fresh = compute_records(lm, experiment, config, chosen, context, skip=skip, on_record=on_record, progress=progress)
    records = [skip[item.id] if item.id in skip else fresh[item.id] for item in chosen]
    return experiment.result(str(model), config, records)


def compute_records(
    lm: Any,
    experiment: Experiment,
    config: Any,
    chosen: Sequence[Any],
    context: Context,
    *,
    skip: Collection[str] = (),
    on_record: Callable[[str, Any], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    share: Callable[[list[Any]], list[Any]] | None = None,
) -> dict[str, Any]:
    """The records of the ``chosen`` items whose ids are not in ``skip``, by item id.

    Items are computed in the experiment's groups (:meth:`Experiment.groups`): a group
    with any record missing is computed whole, and the records it yields for items in
    ``skip`` are dropped. share: under a launch, takes the unfinished items and returns
    this process's part of them, which is then grouped on its own (every process gets
    work; the records agree with a single process's to float summation order).
    """
    if share is not None:
        mine = share([item for item in chosen if item.id not in skip])
        groups = experiment.groups(lm, config, mine) if mine else []
        calls = [mine] if groups is None else groups
    else:
        groups = experiment.groups(lm, config, chosen)
        if groups is None:
            calls = [[item for item in chosen if item.id not in skip]]
        else:
            calls = [group for group in groups if any(item.id not in skip for item in group)]
    wanted = {item.id for call in calls for item in call if item.id not in skip}
    total = len(wanted) if share is not None else len(chosen)
    done = total - len(wanted)
    if progress is not None:
        progress(done, total)
    fresh: dict[str, Any] = {}
    for call in calls:
        for item_id, record in experiment.run(lm, config, call, context) if call else ():
            if item_id not in wanted:
                continue
            fresh[item_id] = record
            if on_record is not None:
                on_record(item_id, record)
            done += 1
            if progress is not None:
                progress(done, total)
    return fresh


def summarize(result: Any, name: str | None = None) -> dict[str, Any]:
    """Headline numbers of a result (``name``: its experiment, when the result does not say)."""
    return registry.get(name or result.experiment).summary(result)


def figure(result: Any, item: str | None = None, *, name: str | None = None) -> Any:
    """A matplotlib figure of a result: its summary figure, or the figure of one item."""
    from contllm.errors import ExperimentError
    from contllm.plotting import plt

    wanted = "summary" if item is None else f"items/{item}"
    experiment = registry.get(name or result.experiment)
    for key, fig in experiment.figures(result, per_item=item is not None):
        if key == wanted:
            return fig
        plt.close(fig)
    raise ExperimentError(f"no figure {wanted!r} for this result")


def save(result: Any, directory: str | Path, *, figures: bool = True, item_figures: bool = True,
         name: str | None = None) -> dict[str, Any]:
    """Write a result into ``directory``: results.json, its CSV tables, summary.json and (with ``figures``) figures/.

    With ``figures`` the experiment's documents (self-contained HTML, ...) are written too.

    This is what a run directory holds besides its config, manifest and item records.
    Returns the summary.
    """
    from contllm.files import atomic_write_json, write_csv

    directory = Path(directory)
    experiment = registry.get(name or result.experiment)
    atomic_write_json(directory / "results.json", result.to_dict())
    for stem, (columns, rows) in experiment.tables(result).items():
        write_csv(directory / f"{stem}.csv", columns, rows)
    summary = experiment.summary(result)
    atomic_write_json(directory / "summary.json", summary)
    if figures:
        from contllm.plotting import save_figure

        for figure_name, fig in experiment.figures(result, per_item=item_figures):
            save_figure(fig, directory / "figures" / figure_name)
        from contllm.files import atomic_write_text

        for relative, text in experiment.documents(result, per_item=item_figures):
            atomic_write_text(directory / relative, text)
    return summary
