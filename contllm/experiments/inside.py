"""What the experiments that look inside the model share (patching, lens, attention-mass).

Each works on counting prompts built exactly as the counting experiment builds them
(its template, chat and --data options): a word repeated n times, every occurrence's
duration scaled by a factor c. :class:`InsideConfig` holds those options and the item
count; :func:`prompt_of` gives an item's plain signal and the scaled tokens; the count
read out is the implied count E[k] over the digits 0-9 (:func:`implied_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from contllm import registry
from contllm.core.families import decoder_layers
from contllm.core.signal import Signal
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, RecordT, ResultT
from contllm.experiments.options import Option
from contllm.experiments.sweeps import sweep_values
from contllm.internals.activations import run_with_cache

DIGITS = np.arange(10, dtype=np.float64)


@dataclass
class InsideConfig:
    """Options every experiment inside the model takes.

    template, chat, data: the counting experiment's prompt options (None: its defaults).
    first: how many counting items (the dataset's first N, balanced over category and
        n; 0: all). ``--items`` selects among them.
    """

    template: str | None = None
    chat: bool = False
    data: str | None = None
    first: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.first, bool) or not isinstance(self.first, int) or self.first < 0:
            raise ExperimentError(f"--first must be an integer >= 0 (0: every item), got {self.first!r}")
        self.counting_config()

    def counting_config(self) -> Any:
        """The counting experiment's config whose one-value sweep is the plain prompt (factor 1)."""
        options: dict[str, Any] = {
            "template": self.template,
            "chat": self.chat,
            "low": 1.0,
            "high": 1.0,
            "samples": 1,
            "data": self.data,
        }
        return registry.get("counting").Config(**options)

    def counting_items(self) -> list[Any]:
        """The first ``first`` counting items (every item with 0)."""
        items = list(registry.get("counting").items(self.counting_config()))
        return items[: self.first] if self.first else items


def inside_options(first: int) -> tuple[Option, ...]:
    """The options of :class:`InsideConfig`, with the experiment's default item count."""
    return (
        Option(
            "template",
            "str",
            "Counting prompt template ({words} and optionally {word}, {article}, {category}). [default: the counting experiment's]",
        ),
        Option("chat", "bool", "Wrap prompts in the model's chat template.", flag="--chat/--no-chat"),
        Option("data", "str", "Counting dataset file (see contllm run counting --help). [default: built-in]"),
        Option(
            "first",
            "int",
            f"Items: the counting dataset's first N (balanced over category and n); 0 for all. [default: {first}]",
        ),
    )


@dataclass
class SweepInsideConfig(InsideConfig):
    """A duration sweep over the counting items: factors from low to high, ``samples`` of them (1.0 added inside)."""

    low: float = 0.1
    high: float = 1.5
    samples: int = 6

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.low <= 0:
            raise ExperimentError(f"duration factors must be positive; the range starts at {self.low}")
        sweep_values(self.low, self.high, self.samples)

    def factors(self) -> np.ndarray:
        return sweep_values(self.low, self.high, self.samples)


def sweep_inside_options(first: int) -> tuple[Option, ...]:
    return (
        Option("range", "range", "MIN,MAX of the duration factor c. [default: 0.1,1.5]"),
        Option("samples", "int", "Values of c per item (1.0 is added inside the range). [default: 6]"),
        *inside_options(first),
    )


@dataclass(frozen=True)
class Prompt:
    """An item's plain prompt (every duration 1), the tokens whose durations are scaled and the truth."""

    signal: Signal
    scaled: list[int]
    truth: int
    meta: dict[str, Any]

    def at(self, factor: float) -> Signal:
        """The prompt with the scaled tokens' durations multiplied by ``factor``."""
        return self.signal.scale_tokens(self.scaled, float(factor))

    def pieces(self, indices: Sequence[int]) -> list[str]:
        """The text of each token (empty for special tokens)."""
        assert self.signal.text is not None and self.signal.offsets is not None
        return [self.signal.text[a:b] for a, b in (self.signal.offsets[i] for i in indices)]


def prompt_of(lm: Any, item: Any, config: InsideConfig) -> Prompt:
    """The counting prompt of ``item`` on ``lm``; ExperimentError when it scales no token."""
    plan = registry.get("counting").plan_item(lm, item, config.counting_config())
    if not plan.edited:
        raise ExperimentError(f"item {item.id}: the prompt has no token to scale")
    return Prompt(plan.signals[0], list(plan.edited), int(plan.truth), dict(plan.meta))


def layer_cache(lm: Any, prompt: Prompt, factors: np.ndarray, hook: str) -> tuple[list[Signal], list[str], Any]:
    """The prompt at each factor, the names ``blocks.{i}.{hook}`` of every layer and their activations at the read
    position (:func:`contllm.internals.activations.run_with_cache`)."""
    signals = [prompt.at(c) for c in factors]
    names = [f"blocks.{i}.{hook}" for i in range(len(decoder_layers(lm)))]
    return signals, names, run_with_cache(lm, signals, names=names, positions="last")


def digit_sets(lm: Any) -> Any:
    from contllm.core.readout import digits

    return digits(lm.tokenizer)


def implied_counts(logits: torch.Tensor, sets: Any) -> tuple[np.ndarray, np.ndarray]:
    """(E[k] [...], digit probabilities [..., 10]) from logits [..., vocab]; E[k] renormalised over the digits."""
    probs = sets.gather(torch.softmax(logits.float(), dim=-1)).double().cpu().numpy()
    mass = probs.sum(axis=-1)
    return (probs @ DIGITS) / np.where(mass > 0, mass, np.nan), probs


def check_factors(values: Sequence[float], what: str) -> list[float]:
    """``values`` as positive floats; ExperimentError naming ``what`` otherwise."""
    out = [float(v) for v in values]
    if not out or any(not np.isfinite(v) or v <= 0 for v in out):
        raise ExperimentError(f"{what} must be positive duration factors, got {values!r}")
    return out


class InsideExperiment(Experiment[RecordT, ResultT]):
    """What patching, lens and attention-mass share as experiments: counting items and figures by name.

    figure: the name of the function in :mod:`contllm.experiments.inside_figures` that draws
    a result (every record) or one record.
    """

    engine: ClassVar[bool] = True
    shardable: ClassVar[bool] = True
    figure: ClassVar[str] = ""

    def items(self, config: InsideConfig) -> Sequence[Any]:
        return config.counting_items()

    def summary_figure(self, result: Any) -> Any:
        return self._draw(result, None)

    def item_figure(self, result: Any, record: Any) -> Any:
        return self._draw(result, [record])

    def figure_options(self) -> dict[str, Any]:
        """Keyword arguments of this experiment's figure function beyond the result and records (none by default)."""
        return {}

    def _draw(self, result: Any, records: Sequence[Any] | None) -> Any:
        from contllm.experiments import inside_figures

        return getattr(inside_figures, self.figure)(result, records, **self.figure_options())


class SweepInsideExperiment(InsideExperiment[RecordT, ResultT]):
    """An experiment inside the model along a duration sweep (lens, attention-mass)."""

    def report_columns(self, result: Any) -> dict[str, Any]:
        return {
            "factor_min": result.config.get("low"),
            "factor_max": result.config.get("high"),
            "samples": result.config.get("samples"),
        }
