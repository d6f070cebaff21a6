"""The experiments: one module (or package) each, named in :mod:`contllm.registry`.

This package only re-exports, and lazily, so that importing it loads no experiment.
Running from Python::

    from contllm.experiments import CountingConfig, figure, run_experiment, summarize

    lm = contllm.load()  # the default model
    result = run_experiment(lm, "counting", CountingConfig(samples=10), items="5")
    print(summarize(result))
    figure(result).savefig("counting.png")

How an experiment is laid out is in CONTRIBUTING.md; what it declares is
:class:`contllm.experiments.base.Experiment`.
"""

from __future__ import annotations

from contllm.exports import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "contllm.rundir.runner": ("run_experiment", "compute_records"),
        "contllm.rundir.outputs": ("save", "summarize", "figure"),
        "contllm.experiments.base": ("Experiment", "Metric", "Records", "RunContext"),
        "contllm.experiments.boolean": ("BooleanConfig",),
        "contllm.experiments.counting": ("CountingConfig",),
        "contllm.experiments.events": ("EventsConfig",),
        "contllm.experiments.sweeps": ("ExperimentResult", "Sweep"),
    },
)
