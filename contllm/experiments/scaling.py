"""The scaling experiment, as the registry finds it (one EXPERIMENT per module); declared in :mod:`contllm.experiments.timeline`."""

from contllm.experiments.timeline import SCALING

EXPERIMENT = SCALING
