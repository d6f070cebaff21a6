"""Time as a whole: every duration of a prompt scaled by s, or every time shifted by tau.

``scaling`` multiplies the whole time axis by s: every duration, and the integration
start with them, so the first token stays at time 0 and token i sits at s*i (s = 1 is
the stock model). ``translation`` adds tau to every time, the integration start
included (t_0 = -1 + tau). Both read the whole next-token distribution and track the
tokens above the threshold (:mod:`contllm.experiments.tracking`).

Rotary families see only differences of times, so a translated prompt must give the
same distribution up to float rounding; the translation summary reports the largest
change of any token's probability from tau = 0. A learned position table (GPT-2) is
read at fractional times by linear interpolation between its rows, and translation
moves its outputs; the same numbers say by how much.

``--protocol paper`` runs the paper's scripts: its three prompts (:data:`PAPER_PROMPTS`),
positions 1..n (the integration starting at 0, so that scaling multiplies every position
and translation starts the integration at tau), its 100 values of the knob and no
other, and tokens of the tokenizer's base vocabulary tracked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from contllm.data.user import DataFileOption, data_option_help
from contllm.errors import ExperimentError
from contllm.experiments.base import option_table
from contllm.experiments.options import Option
from contllm.experiments.protocol import PROTOCOL, resolved_samples
from contllm.experiments.sweeps import sweep_values
from contllm.experiments.tracking import (
    DEFAULT_THRESHOLD,
    PromptItem,
    TrackingExperiment,
    TrackPlan,
    TrackResult,
    check_threshold,
    load_items,
)
from contllm.experiments.tracking import UNCHANGED as TOLERANCE  # the invariance a rotary family must show

PROMPT_ROWS = "id, prompt (other fields, such as those of tokens, are ignored)"

#: The prompts of the paper's scaling and translation scripts.
PAPER_PROMPTS = (
    PromptItem("france", "The capital of France is"),
    PromptItem("gatsby", "The Great Gatsby is my favourite"),
    PromptItem("romeo", "O Romeo, Romeo, wherefore art thou"),
)


@dataclass
class TimelineConfig(DataFileOption):
    """What the scaling and translation options share: the knob from ``low`` to ``high`` in
    ``samples`` values (``REFERENCE``, the plain prompt's value, added when inside), the
    tracking threshold, --data and --protocol (samples None: :attr:`SAMPLES`, or 100 under
    the paper's protocol, which adds no reference value: the paper's values alone)."""

    REFERENCE: ClassVar[float] = 0.0
    SAMPLES: ClassVar[int] = 21
    PAPER_SAMPLES: ClassVar[int] = 100

    low: float = 0.0
    high: float = 1.0
    samples: int | None = None
    threshold: float = DEFAULT_THRESHOLD
    protocol: str = "contllm"

    def __post_init__(self) -> None:
        self.samples = resolved_samples(self.samples, self.protocol, self.SAMPLES, self.PAPER_SAMPLES)
        self.check_range()
        self.values()
        check_threshold(self.threshold)
        self.read_data(lambda path: load_items(path, edits=False))

    @property
    def paper(self) -> bool:
        return self.protocol == "paper"

    def check_range(self) -> None:
        """ExperimentError for a range the knob cannot take."""

    def values(self) -> np.ndarray:
        """The knob's values [S]."""
        return sweep_values(self.low, self.high, self.samples, include=None if self.paper else self.REFERENCE)


@dataclass
class ScalingConfig(TimelineConfig):
    """Options of the scaling experiment: s from ``low`` to ``high`` (> 0), ``samples`` values, 1.0 added when inside."""

    REFERENCE: ClassVar[float] = 1.0
    SAMPLES: ClassVar[int] = 30

    low: float = 0.01
    high: float = 1.5

    def check_range(self) -> None:
        if self.low <= 0:
            raise ExperimentError(
                f"the scale s must be positive (s = 0 puts every token at one time); the range starts at {self.low:g}"
            )


@dataclass
class TranslationConfig(TimelineConfig):
    """Options of the translation experiment: tau from ``low`` to ``high`` (holding 0, the reference), ``samples`` values."""

    high: float = 10.0

    def check_range(self) -> None:
        if not self.low <= 0.0 <= self.high:
            raise ExperimentError(
                f"the tau range {self.low:g},{self.high:g} must hold 0 (the reference every shift is compared with)"
            )


def scaled(signal: Any, s: float) -> Any:
    """``signal`` with its whole time axis multiplied by s: every duration and the start (times s * t)."""
    return replace(signal, durations=signal.durations * s, start=signal.start * s)


def translated(signal: Any, tau: float) -> Any:
    """``signal`` with every time and the integration start shifted by tau."""
    return replace(signal, start=signal.start + tau)


def _meta(lm: Any, item: PromptItem, base: Any) -> dict[str, Any]:
    return {"prompt": item.prompt, "tokens": len(base), "family": lm.family.name, "positions": lm.family.positions}


def base_signal(lm: Any, item: PromptItem, config: TimelineConfig) -> Any:
    """The item's plain prompt: times 0..n-1, or the paper's positions 1..n under its protocol."""
    base = lm.signal(item.prompt)
    return replace(base, start=0.0) if config.paper else base


def _check_table(
    lm: Any, items: Sequence[PromptItem], config: TimelineConfig, latest: float, earliest: float, what: str
) -> None:
    """ExperimentError when a learned position table would be read outside its rows (it would be clamped)."""
    if lm.family.positions != "learned":
        return
    rows = int(getattr(lm.model.config, "n_positions", 0) or getattr(lm.model.config, "max_position_embeddings", 0))
    if earliest < 0:
        raise ExperimentError(
            f"{what}: the first token would sit at time {earliest:g}, before the position table's first row"
        )
    for item in items:
        end = base_signal(lm, item, config).end
        last = end * latest if what == "scaling" else end + latest  # the latest time the sweep reaches
        if last > rows - 1:
            raise ExperimentError(f"{what}: item {item.id} reaches beyond the {rows} rows of the position table")


def timeline_options(knob: str, what: str, default_range: str, reference: str, samples: int) -> tuple[Option, ...]:
    """The options of scaling and translation: the range of ``knob`` (``what``, e.g. "the scale s (> 0)") and its
    values per prompt (``reference``, the plain prompt's value, added inside the range), the threshold, --data and
    --protocol."""
    table = option_table(
        f"""
        range      range  MIN,MAX of {what}. [default: {default_range}]
        samples    int    Values of {knob} per prompt ({reference} is added when inside the range, except under --protocol paper). [default: {samples}; 100 under --protocol paper]
        threshold  float  Track every token whose probability exceeds this somewhere on the sweep. [default: {DEFAULT_THRESHOLD}]
        """
    )
    return (*table, Option("data", "str", data_option_help(PROMPT_ROWS)), PROTOCOL)


class TimelineExperiment(TrackingExperiment):
    """What scaling and translation share: the prompts of the tokens dataset (or --data), a check of the position table."""

    unit = "prompt"
    #: The knob's name, its value at which a prompt is unchanged (the reference), and
    #: ``move(signal, value)``: the signal at one value of the knob.
    knob: ClassVar[str] = ""
    reference: ClassVar[float] = 0.0
    move: ClassVar[Any] = None

    def sweep(self, lm: Any, item: PromptItem, config: Any) -> TrackPlan:
        base = base_signal(lm, item, config)
        values = config.values()
        # The paper's scripts track among the tokenizer's base vocabulary (ids below its vocab_size).
        candidates = int(lm.tokenizer.vocab_size) if config.paper else None
        signals = [self.move(base, float(v)) for v in values]
        return TrackPlan(self.knob, values, signals, self.reference, _meta(lm, item, base), candidates)

    def items(self, config: Any) -> Sequence[PromptItem]:
        if config.paper and config.data is None:
            return list(PAPER_PROMPTS)
        return load_items(config.data, edits=False)

    def check(self, lm: Any, config: Any) -> None:
        _check_table(lm, self.items(config), config, config.high, min(config.low, 0.0), self.name)


class ScalingExperiment(TimelineExperiment):
    name = "scaling"
    help = "Every duration of a prompt scaled by s (the whole time axis); every token above a threshold tracked."
    explorer_text = (
        "Each item is a prompt whose whole time axis is scaled by s: every token lasts s steps (s = 1 is the prompt "
        "as written). The bars and curves are the tokens that pass the threshold somewhere on the sweep."
    )
    description = (
        "Each prompt's whole time axis is multiplied by s: every token lasts s steps and token i sits at time s*i "
        "(s = 1: the stock model; s -> 0: every token at nearly one time). The whole next-token distribution is read "
        "at each s, and every token whose probability exceeds --threshold somewhere is tracked. Items are the prompts "
        "of the tokens dataset (ids such as capital-france), or --data; the paper's three (france, gatsby, romeo) "
        "under --protocol paper."
    )
    Config = ScalingConfig
    options = timeline_options("s", "the scale s (> 0)", "0.01,1.5", "1.0", 30)

    knob, reference, move = "s", 1.0, staticmethod(scaled)

    def summary(self, result: TrackResult) -> dict[str, Any]:
        """Tracked tokens and distances; at the smallest s, TV from s = 1 and whether the argmax holds; how far down it does."""
        out = self.common_summary(result)
        with_one = [t for t in result.tracks if t.reference is not None and t.tv is not None]
        if with_one:
            at_min = [(t, int(np.argmin(t.x)), int(np.flatnonzero(t.x == t.reference)[0])) for t in with_one]
            out["smallest_s"] = float(min(t.x.min() for t in with_one))
            out["mean_tv_at_smallest_s"] = float(np.mean([t.tv[k] for t, k, _ in at_min]))  # type: ignore[index]
            out["share_argmax_kept_at_smallest_s"] = float(
                np.mean([t.top_ids[k] == t.top_ids[r] for t, k, r in at_min])
            )
            out["mean_lowest_s_keeping_argmax"] = float(
                np.mean([_lowest_kept(t.x, t.top_ids, r) for t, _, r in at_min])
            )
        return out


def _lowest_kept(x: np.ndarray, top_ids: list[int], ref: int) -> float:
    """The smallest s from which up to s = 1 the most probable token is the one at s = 1."""
    order = np.argsort(x)
    position = int(np.flatnonzero(order == ref)[0])
    lowest = float(x[ref])
    for k in order[:position][::-1]:
        if top_ids[int(k)] != top_ids[ref]:
            break
        lowest = float(x[int(k)])
    return lowest


class TranslationExperiment(TimelineExperiment):
    name = "translation"
    help = "Every time of a prompt shifted by tau; max |dp| from tau = 0 (rotary models: float noise only)."
    explorer_text = (
        "Each item is a prompt whose every time is shifted by tau (the durations stay 1). A model that reads only "
        "time differences gives the same distribution at every tau: the curves should be flat."
    )
    description = (
        "Each prompt is shifted in time: every token's time and the integration start move by tau. Rotary models "
        "see only time differences, so the distribution must not move beyond float rounding; the summary reports "
        f"the largest change of any token's probability from tau = 0 (within {TOLERANCE:g} is invariant). A learned "
        "position table (GPT-2) is interpolated at fractional times and moves. Items are the prompts of the tokens "
        "dataset (ids such as capital-france), or --data; the paper's three (france, gatsby, romeo) under "
        "--protocol paper."
    )
    Config = TranslationConfig
    distance = "max_dp"
    options = timeline_options("tau", "the shift tau (must hold 0)", "0,10", "0", 21)

    knob, reference, move = "tau", 0.0, staticmethod(translated)

    def summary(self, result: TrackResult) -> dict[str, Any]:
        """max |dp| from tau = 0 over every token and shift: overall, per prompt, at the largest tau; within TOLERANCE?"""
        out = self.common_summary(result)
        tracks = [t for t in result.tracks if t.max_dp is not None]
        positions = sorted({str(t.meta.get("positions")) for t in result.tracks})
        out["positions"] = ",".join(positions)
        if tracks:
            per_item = {t.item_id: float(t.max_dp.max()) for t in tracks}  # type: ignore[union-attr]
            tau_max = float(max(t.x.max() for t in tracks))
            at_max = [
                float(t.max_dp[int(np.argmax(t.x))])  # type: ignore[index]
                for t in tracks
                if np.isclose(t.x.max(), tau_max)
            ]
            out["max_abs_dp"] = max(per_item.values())
            out["mean_max_abs_dp"] = float(np.mean(list(per_item.values())))
            out["tau_max"] = tau_max
            out["max_abs_dp_at_tau_max"] = max(at_max)
            out["max_tv"] = float(max(t.tv.max() for t in tracks))  # type: ignore[union-attr]
            out["tolerance"] = TOLERANCE
            out["within_tolerance"] = bool(out["max_abs_dp"] <= TOLERANCE)
            out["max_abs_dp_by_item"] = per_item
        return out


SCALING = ScalingExperiment()
TRANSLATION = TranslationExperiment()
