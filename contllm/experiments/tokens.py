"""Open-vocabulary tracking of an edit: a word interpolated into another, or a span's duration scaled.

Each item is a prompt and an edit. With ``to``, the span (say "France" in "The capital
of France is") is interpolated in embedding space into ``to`` ("Germany") over alpha,
aligned in time when the two tokenize into different numbers of tokens; without it, the
span's duration is scaled by a factor. Every token whose probability exceeds the
threshold somewhere on the sweep is tracked (:mod:`contllm.experiments.tracking`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from contllm.data.user import DataFileOption, data_option_help
from contllm.errors import ContllmError, ExperimentError
from contllm.experiments.base import option_table
from contllm.experiments.options import METHOD, Option, parse_floats
from contllm.experiments.sweeps import check_alpha_sweep, sweep_values
from contllm.experiments.tracking import (
    DEFAULT_THRESHOLD,
    ROWS,
    PromptItem,
    Track,
    TrackingExperiment,
    TrackPlan,
    TrackResult,
    check_threshold,
    load_items,
)


@dataclass
class TokensConfig(DataFileOption):
    """Options of the tokens experiment.

    low, high, samples: the values of alpha (within [0, 1]) of interpolation items.
    factors: (min, max) duration factor of scaled spans (>= 0); ``samples`` values, 1.0
        added when inside.
    threshold: a token is tracked when its probability exceeds this somewhere on the sweep.
    method: "linear" or "slerp" interpolation. data: a dataset file instead of the built-in items.
    """

    low: float = 0.0
    high: float = 1.0
    factors: tuple[float, ...] = (0.0, 2.0)
    samples: int = 21
    threshold: float = DEFAULT_THRESHOLD
    method: str = "linear"

    def __post_init__(self) -> None:
        check_alpha_sweep(self.low, self.high, self.samples, self.method)
        self.factors = tuple(parse_floats(self.factors, "--factors"))  # type: ignore[arg-type]
        if len(self.factors) != 2 or not 0 <= self.factors[0] <= self.factors[1]:
            raise ExperimentError(
                f"--factors must be MIN,MAX with 0 <= MIN <= MAX, got {','.join(f'{v:g}' for v in self.factors)}"
            )
        sweep_values(self.factors[0], self.factors[1], self.samples)
        check_threshold(self.threshold)
        self.read_data(lambda path: load_items(path, edits=True))

    def alphas(self) -> np.ndarray:
        """The values of alpha [S]."""
        return sweep_values(self.low, self.high, self.samples, include=None)

    def factor_values(self) -> np.ndarray:
        """The duration factors [S] (or S + 1 with 1.0 added)."""
        return sweep_values(self.factors[0], self.factors[1], self.samples)


def tokens_sweep(lm: Any, item: PromptItem, config: TokensConfig) -> TrackPlan:
    """An item's sweep: its span interpolated into ``to`` over alpha, or the span's duration scaled over the factors.

    The reference (the plain prompt) is alpha 0, or factor 1; None when the sweep misses it.
    """
    from contllm.core.interpolate import interpolate_spans

    span = item.span_at()
    meta: dict[str, Any] = {"prompt": item.prompt, "span": item.span, "edit": item.edit}
    base = lm.signal(item.prompt)
    if item.to is None:
        factors = config.factor_values()
        meta["tokens"] = len(base.token_indices(span))
        return TrackPlan("factor", factors, [base.scale(span, float(c)) for c in factors], 1.0, meta)
    other = item.prompt[: span[0]] + item.to + item.prompt[span[1] :]
    span_b = (span[0], span[0] + len(item.to))
    embedding = lm.model.get_input_embeddings()
    a, b = base.embedded(embedding), lm.signal(other).embedded(embedding)
    alphas = config.alphas()
    signals = [
        interpolate_spans(a, span, b, span_b, float(v), method=config.method)  # type: ignore[arg-type]
        for v in alphas
    ]
    meta.update(
        to=item.to, method=config.method, tokens=len(a.token_indices(span)), tokens_to=len(b.token_indices(span_b))
    )
    return TrackPlan("alpha", alphas, signals, 0.0, meta)


class TokensExperiment(TrackingExperiment):
    name = "tokens"
    help = "A word interpolated into another, or a span's duration scaled; every token above a threshold tracked."
    explorer_text = (
        "Each item is a prompt whose span is interpolated into another word (alpha) or whose duration is scaled "
        "(factor). The whole next-token distribution is read at every value; the bars and curves are the tokens "
        "that pass the threshold somewhere on the sweep."
    )
    description = (
        "Each item is a prompt and an edit: a word interpolated into another in embedding space (alpha, aligned "
        "in time for unequal token counts; 'The capital of France is' with France -> Germany) or a span's duration "
        "scaled by a factor. The whole next-token distribution is evaluated at every value; every token whose "
        "probability exceeds --threshold somewhere is tracked and drawn, labelled by its text. Item ids look like "
        "capital-france (16 built-in items: 12 interpolations, 4 scaled spans)."
    )
    Config = TokensConfig
    options = (
        *option_table(
            f"""
            range      range   MIN,MAX of alpha (within 0,1) for interpolated words. [default: 0,1]
            factors    floats  MIN,MAX of the duration factor of scaled spans (1.0 added when inside). [default: 0,2]
            samples    int     Values of alpha (or of the factor) per item. [default: 21]
            threshold  float   Track every token whose probability exceeds this somewhere on the sweep. [default: {DEFAULT_THRESHOLD}]
            """
        ),
        METHOD,
        Option("data", "str", data_option_help(ROWS)),
    )

    def items(self, config: TokensConfig) -> Sequence[PromptItem]:
        return load_items(config.data, edits=True)

    def check(self, lm: Any, config: TokensConfig) -> None:
        """Every item's edit can be built with this tokenizer (an interpolation's two prompts differ only in the span)."""
        one = replace(config, low=config.high, samples=1, factors=(config.factors[1],) * 2)
        for item in self.items(config):
            try:
                tokens_sweep(lm, item, one)
            except ContllmError as err:
                raise ExperimentError(f"item {item.id}: {err}") from None

    def sweep(self, lm: Any, item: PromptItem, config: TokensConfig) -> TrackPlan:
        return tokens_sweep(lm, item, config)

    def describe(self, t: Track) -> str:
        m = t.meta
        edit = (
            f"{m.get('span')!r} -> {m.get('to')!r}" if m.get("edit") == "interpolate" else f"{m.get('span')!r} scaled"
        )
        return f"{m.get('prompt')!r}: {edit}"

    def summary(self, result: TrackResult) -> dict[str, Any]:
        """Tracked tokens per item, share of items whose argmax changes, total variation along and across the sweep."""
        out = self.common_summary(result)
        for edit in ("interpolate", "scale"):
            chosen = [t for t in result.tracks if t.meta.get("edit") == edit]
            out[f"{edit}_items"] = len(chosen)
            if chosen:
                out[f"share_argmax_changes_{edit}"] = float(np.mean([t.argmax_changes for t in chosen]))
        return out


EXPERIMENT = TokensExperiment()
