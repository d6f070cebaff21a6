"""The toolkit's own exception types.

Every error that a user can cause (bad input, a missing model, a malformed spec) is raised
as a subclass of :class:`ContllmError`; the CLI turns these into one line and exit status 2.
"""

from __future__ import annotations


class ContllmError(Exception):
    """Base class of every error raised deliberately by contllm."""


class SignalError(ContllmError, ValueError):
    """A continuous signal or an edit of one is invalid (durations, spans, lengths)."""


class UnsupportedModelError(ContllmError):
    """The model's family or attention implementation is not supported."""


class ModelLoadError(ContllmError):
    """A model could not be found, installed, converted or loaded."""


class ExperimentError(ContllmError, ValueError):
    """An experiment, its dataset items or its options are invalid."""


class RunDirectoryError(ContllmError):
    """A run directory is missing, not a run, or would be overwritten."""


class MissingDependencyError(ContllmError, ImportError):
    """An optional package a feature needs is not installed (the message says how to install it)."""
