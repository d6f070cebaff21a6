"""Items and prompts borrowed from another experiment's dataset (counting, events or sums), built as that experiment
builds them.

Experiments that study what a model does with the counting, events or sums prompts (attribution,
circuit) take their items from the dataset experiment (``--dataset``) with its prompt options
(``--data``, ``--template``, ``--chat``): :class:`DatasetPrompts` holds those options and
gives the dataset experiment's config and its first N items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contllm import registry
from contllm.errors import ExperimentError

#: The datasets whose items and prompts these experiments take (each is also an experiment).
DATASETS = ("counting", "events", "sums")


@dataclass
class DatasetPrompts:
    """The options of a dataset's prompts: dataset ("counting", "events" or "sums"), its ``data`` file (None: built in),
    ``template`` (None: its own) and ``chat``. A config that subclasses it calls :meth:`check_dataset` from its
    ``__post_init__``."""

    dataset: str = "counting"
    data: str | None = None
    template: str | None = None
    chat: bool = False

    def check_dataset(self) -> None:
        """ExperimentError for a dataset not in :data:`DATASETS`."""
        if self.dataset not in DATASETS:
            raise ExperimentError(f"--dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")

    def dataset_config(self) -> Any:
        """The dataset experiment's config whose one-value sweep is the plain prompt (factor 1)."""
        options: dict[str, Any] = {"template": self.template, "chat": self.chat, "low": 1.0, "high": 1.0, "samples": 1}
        if self.data is not None:
            options["data"] = self.data
        try:
            return registry.get(self.dataset).Config(**options)
        except TypeError:
            raise ExperimentError(f"--data is not available for the {self.dataset} dataset in this version") from None

    def first_items(self, first: int) -> Sequence[Any]:
        """The dataset's first ``first`` items (0: all); ExperimentError for more than it has."""
        items = list(registry.get(self.dataset).items(self.dataset_config()))
        if first > len(items):  # as --items 999 is refused, not silently cut to what there is
            raise ExperimentError(f"--first {first}: the {self.dataset} dataset has {len(items)} items")
        return items[:first] if first else items
