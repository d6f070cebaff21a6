"""What every experiment shares: sweeps, result objects, and the loop that runs them.

An experiment turns a dataset item into a :class:`Plan` (the signals of a sweep, the
knob's values, the token sets to read); :func:`run_plans` evaluates plans and returns
:class:`Sweep` objects; an :class:`ExperimentResult` holds them and can save and plot
itself. Experiments are data in, result out: nothing here writes files unless asked.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from contllm.errors import ExperimentError
from contllm.readout import TokenSets
from contllm.signal import Signal


def sweep_values(low: float, high: float, samples: int, *, include: float | None = 1.0) -> np.ndarray:
    """``samples`` evenly spaced values from low to high, plus ``include`` when it lies inside.

    The plain prompt (factor 1, or alpha 0 and 1) is then always on the sweep.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ExperimentError(f"range must be finite, got {low},{high}")
    if low > high:
        raise ExperimentError(f"range min {low} is larger than max {high}")
    if samples < 1:
        raise ExperimentError(f"samples must be >= 1, got {samples}")
    if samples == 1 and low != high:
        raise ExperimentError("one sample needs a range with min == max")
    values = np.linspace(low, high, samples)
    if include is not None and low <= include <= high and not np.isclose(values, include, atol=1e-12).any():
        values = np.sort(np.append(values, include))
    return values.astype(np.float64)


def parse_floats(text: str | Sequence[float], what: str) -> tuple[float, ...]:
    """Numbers from "a,b,c" (or a sequence of numbers); ExperimentError naming ``what`` if any is not one, or none is given."""
    return _parse_list(text, what, float, "numbers")


def parse_ints(text: str | Sequence[int], what: str) -> tuple[int, ...]:
    """Integers from "a,b,c" (or a sequence of integers); ExperimentError naming ``what`` if any is not one, or none is given."""
    return _parse_list(text, what, int, "integers")


def _parse_list(text: Any, what: str, kind: Callable[[Any], Any], noun: str) -> tuple[Any, ...]:
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    try:
        values = tuple(kind(p) for p in parts if p != "")
    except (TypeError, ValueError):
        raise ExperimentError(f"{what} must be comma-separated {noun}, got {text!r}") from None
    if not values:
        raise ExperimentError(f"{what} is empty")
    return values


def parse_range(text: str) -> tuple[float, float]:
    """'MIN,MAX' -> (min, max); ExperimentError for anything else."""
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 2:
        raise ExperimentError(f"range must be 'MIN,MAX', got {text!r}")
    try:
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise ExperimentError(f"range must be two numbers 'MIN,MAX', got {text!r}") from None
    if low > high:
        raise ExperimentError(f"range min {low} is larger than max {high}")
    return low, high


@dataclass
class DurationSweepConfig:
    """Options shared by the experiments that scale durations (counting, events).

    template: the prompt (None: the experiment's default, or its chat default with chat).
    low, high, samples: the duration factors, evenly spaced (1.0 added when inside).
    chat: wrap the prompt in the model's chat template (instruct models).
    """

    DEFAULT_TEMPLATE: ClassVar[str] = ""
    CHAT_TEMPLATE: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[tuple[str, ...]] = ()

    template: str | None = None
    low: float = 0.1
    high: float = 1.0
    samples: int = 10
    chat: bool = False

    def __post_init__(self) -> None:
        from contllm.experiments.prompts import check_template

        if self.low <= 0:
            raise ExperimentError(f"duration factors must be positive; the range starts at {self.low}")
        check_template(self.resolved_template(), self.FIELDS, required=self.REQUIRED)

    def resolved_template(self) -> str:
        if self.template is not None:
            return self.template
        return self.CHAT_TEMPLATE if self.chat else self.DEFAULT_TEMPLATE


@dataclass
class Plan:
    """The sweep of one dataset item, before it runs.

    item_id: the item's id; x: the knob's values [S]; signals: one signal per value;
    token_sets: what to read; truth: the expected label (or None); meta: item facts
    worth saving (word, n, operators, ...).
    """

    item_id: str
    x: np.ndarray
    signals: list[Signal]
    token_sets: TokenSets
    truth: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sweep:
    """One item's curves: probabilities [S, K] of the labels over the knob's values x [S]."""

    item_id: str
    x: np.ndarray
    labels: list[str]
    probs: np.ndarray
    truth: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "x": [float(v) for v in self.x],
            "labels": list(self.labels),
            "probs": [[float(p) for p in row] for row in self.probs],
            "truth": self.truth,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sweep:
        try:
            return cls(
                item_id=str(data["item_id"]),
                x=np.asarray(data["x"], dtype=np.float64),
                labels=[str(v) for v in data["labels"]],
                probs=np.asarray(data["probs"], dtype=np.float64),
                truth=data.get("truth"),
                meta=dict(data.get("meta") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExperimentError(f"malformed sweep record: {exc}") from None

    def column(self, label: str) -> np.ndarray:
        """The probability curve [S] of one label."""
        return self.probs[:, self.labels.index(label)]

    def argmax_labels(self) -> list[str]:
        """The most probable label at each value of x."""
        return [self.labels[int(i)] for i in self.probs.argmax(axis=1)]

    def implied_value(self) -> np.ndarray:
        """E[label] over numeric labels, renormalised over the label set: [S]."""
        numeric = [(i, float(lab)) for i, lab in enumerate(self.labels) if _is_number(lab)]
        if not numeric:
            raise ExperimentError("no numeric labels to take an expectation over")
        cols = [i for i, _ in numeric]
        values = np.array([v for _, v in numeric])
        p = self.probs[:, cols]
        mass = p.sum(axis=1)
        return (p @ values) / np.where(mass > 0, mass, np.nan)

    def at(self, value: float) -> np.ndarray:
        """The label probabilities [K] at the sample closest to ``value``."""
        return self.probs[int(np.argmin(np.abs(self.x - value)))]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass
class ExperimentResult:
    """Every sweep of one experiment on one model, with the configuration that made it."""

    experiment: str
    model: str
    config: dict[str, Any]
    sweeps: list[Sweep]
    x_label: str = "factor"

    def rows(self) -> Iterable[dict[str, Any]]:
        """Tidy rows: one per item, value of x and label."""
        for s in self.sweeps:
            for k, x in enumerate(s.x):
                for j, label in enumerate(s.labels):
                    yield {
                        "item": s.item_id,
                        self.x_label: float(x),
                        "label": label,
                        "probability": float(s.probs[k, j]),
                        "truth": "" if s.truth is None else s.truth,
                    }

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "model": self.model,
            "x_label": self.x_label,
            "config": self.config,
            "sweeps": [s.to_dict() for s in self.sweeps],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentResult:
        try:
            return cls(
                experiment=str(data["experiment"]),
                model=str(data["model"]),
                config=dict(data["config"]),
                sweeps=[Sweep.from_dict(s) for s in data["sweeps"]],
                x_label=str(data.get("x_label", "factor")),
            )
        except (KeyError, TypeError) as exc:
            raise ExperimentError(f"malformed results file: missing {exc}") from None

    def save(self, directory: str | Path) -> list[Path]:
        """Write results.json and results.csv into ``directory`` (atomically); returns the paths."""
        from contllm.runs import atomic_write_text

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        json_path = atomic_write_text(directory / "results.json", json.dumps(self.to_dict(), indent=1))
        csv_path = directory / "results.csv"
        rows = list(self.rows())
        lines = _csv_text(rows, ["item", self.x_label, "label", "probability", "truth"])
        atomic_write_text(csv_path, lines)
        return [json_path, csv_path]

    def plot(self, item_id: str | None = None) -> Any:
        """A matplotlib figure: the summary across items, or one item's curves."""
        from contllm import plotting

        if item_id is None:
            return plotting.summary_figure(self)
        matches = [s for s in self.sweeps if s.item_id == item_id]
        if not matches:
            raise ExperimentError(f"no item {item_id!r} in this result")
        return plotting.item_figure(self, matches[0])

    def summary(self) -> dict[str, Any]:
        """Headline numbers of this result (see :func:`contllm.experiments.summarize`)."""
        from contllm.experiments import summarize

        return summarize(self)


def _csv_text(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


Evaluator = Callable[[list[Signal]], torch.Tensor]


def run_plan(plan: Plan, evaluate: Evaluator) -> Sweep:
    """Evaluate one plan: next-token distributions [S, vocab] -> label probabilities [S, K]."""
    probs = evaluate(plan.signals)
    gathered = plan.token_sets.gather(probs.float()).cpu().numpy().astype(np.float64)
    if not np.isfinite(gathered).all():
        raise ExperimentError(f"item {plan.item_id}: the model produced non-finite probabilities")
    return Sweep(plan.item_id, plan.x, list(plan.token_sets.labels), gathered, plan.truth, dict(plan.meta))


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as plain JSON-able data."""
    data = asdict(config)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in data.items()}
