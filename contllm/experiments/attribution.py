"""Duration attribution over the counting, events and sums datasets: which tokens does the count depend on?

Each item's prompt is built exactly as its dataset's experiment builds it (counting, events
or sums, with the same template, chat and --data options); the tokens that experiment
scales (the counted words, the event sentences, the scaled number) are the item's *span*;
for sums the digits read are the answer's first. Every attributed
token is moved from absent (duration 0) to present along the duration path, and its
integrated gradient is its attribution (:func:`contllm.attribution.attribute`); beside it,
occlusion (the token deleted alone) and leave-one-out shrink (its duration halved alone)
go through the batched engine. A record holds one row per attributed token; the summary
reports the worst completeness error over items and how often the top-attributed tokens
lie in the span (precision@k, k = the span's size).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contllm import registry
from contllm.attribution import DEFAULT_STEPS, MAX_STEPS, RULES, Readout, attribute, occlusion
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, Table, option_table
from contllm.experiments.datasets import DatasetPrompts
from contllm.experiments.records import ItemRecords, Record

TOKEN_SETS = ("item", "all")
READOUTS = ("count", "truth", "log-truth")


@dataclass
class AttributionConfig(DatasetPrompts):
    """Options of the attribution experiment.

    dataset: "counting", "events" or "sums"; its experiment builds each prompt and names the span.
    data: a dataset file for that experiment (when it takes --data), or None.
    template, chat: the dataset experiment's prompt options (None: its default).
    tokens: "item" (the tokens from the start of the line that holds the span to the end:
        the item after the few-shot examples) or "all" (every token but the first).
    readout: "count" (implied count E[k] over the digits), "truth" (probability of the
        true count) or "log-truth" (its logarithm).
    steps: gradient evaluations along the path; floor: 0 (deletion baseline) or a
        duration factor in (0, 1) where the path starts.
    rule: the quadrature along the path (:func:`contllm.attribution.attribute`): "placed",
        "adaptive" or "gauss".
    first: how many items of the dataset (its first N, balanced over category/kind and n); 0: all.
    """

    tokens: str = "item"
    readout: str = "count"
    steps: int = DEFAULT_STEPS
    floor: float = 0.0
    rule: str = "placed"
    first: int = 8

    def __post_init__(self) -> None:
        self.check_dataset()
        if self.tokens not in TOKEN_SETS:
            raise ExperimentError(f"--tokens must be one of {', '.join(TOKEN_SETS)}, got {self.tokens!r}")
        if self.readout not in READOUTS:
            raise ExperimentError(f"--readout must be one of {', '.join(READOUTS)}, got {self.readout!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 8 <= self.steps <= MAX_STEPS:
            raise ExperimentError(f"--steps must be an integer from 8 to {MAX_STEPS}, got {self.steps!r}")
        if self.rule not in RULES:
            raise ExperimentError(f"--rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if not (isinstance(self.floor, (int, float)) and 0 <= self.floor < 1):
            raise ExperimentError(
                f"--floor must be 0 (deletion baseline) or a duration factor in (0, 1), got {self.floor!r}"
            )
        if isinstance(self.first, bool) or not isinstance(self.first, int) or self.first < 0:
            raise ExperimentError(f"--first must be an integer >= 0 (0: every item), got {self.first!r}")
        self.dataset_config()


@dataclass
class ItemAttribution(Record, what="attribution record"):
    """One item: its prompt's tokens and, for each attributed token, the three measures.

    text, offsets: the prompt and each token's character span. tokens: the attributed
    indices; attribution, occlusion, shrink: one value each per attributed token. span:
    the indices the dataset's experiment scales. full, baseline, start: f at the prompt,
    at the baseline and at the path's lowest end. meta: item facts and the rule used.
    """

    item_id: str
    readout: str
    text: str
    offsets: list[tuple[int, int]]
    tokens: list[int]
    attribution: np.ndarray
    occlusion: np.ndarray
    shrink: np.ndarray
    span: list[int]
    full: float
    baseline: float
    start: float
    steps: int
    floor: float
    truth: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def completeness_abs(self) -> float:
        return abs(float(np.sum(self.attribution)) - (self.full - self.baseline))

    @property
    def completeness_error(self) -> float:
        """|sum of attributions - (f(full) - f(baseline))| / |f(full) - f(baseline)|."""
        scale = abs(self.full - self.baseline)
        return self.completeness_abs / scale if scale > 0 else (0.0 if self.completeness_abs == 0 else math.inf)

    def piece(self, index: int) -> str:
        """The text of token ``index`` (empty for special tokens)."""
        a, b = self.offsets[index]
        return self.text[a:b]

    def precision(self, values: np.ndarray) -> float:
        """Share of the k tokens of largest |value| that lie in the span (k: span tokens attributed)."""
        inside = np.isin(self.tokens, self.span)
        k = int(inside.sum())
        if k == 0:
            return float("nan")
        top = np.argsort(-np.abs(values), kind="stable")[:k]
        return float(inside[top].mean())

    def chance(self) -> float:
        """precision@k of a random ranking: the span's share of the attributed tokens."""
        return float(np.isin(self.tokens, self.span).mean())

    def check_loaded(self) -> None:
        k = len(self.tokens)
        if not (len(self.attribution) == len(self.occlusion) == len(self.shrink) == k):
            raise ExperimentError(
                f"malformed attribution record {self.item_id}: {k} tokens but values of other lengths"
            )


class AttributionResult(ItemRecords[ItemAttribution], record=ItemAttribution):
    """Every item's attributions from one run (``items``), with the configuration that made it."""


TOKEN_COLUMNS = ["item", "index", "token", "in_span", "attribution", "occlusion", "shrink"]
ITEM_COLUMNS = [
    "item",
    "readout",
    "full",
    "baseline",
    "sum_attribution",
    "completeness_error",
    "completeness_abs",
    "tokens",
    "span_tokens",
    "precision_attribution",
    "precision_occlusion",
    "precision_shrink",
    "chance",
]


def token_rows(result: AttributionResult) -> Iterator[dict[str, Any]]:
    """One row per item and attributed token."""
    for r in result.items:
        span = set(r.span)
        for k, j in enumerate(r.tokens):
            yield {
                "item": r.item_id,
                "index": j,
                "token": r.piece(j),
                "in_span": j in span,
                "attribution": float(r.attribution[k]),
                "occlusion": float(r.occlusion[k]),
                "shrink": float(r.shrink[k]),
            }


def item_row(r: ItemAttribution) -> dict[str, Any]:
    """One item's numbers (items.csv)."""
    return {
        "item": r.item_id,
        "readout": r.readout,
        "full": r.full,
        "baseline": r.baseline,
        "sum_attribution": float(np.sum(r.attribution)),
        "completeness_error": r.completeness_error,
        "completeness_abs": r.completeness_abs,
        "tokens": len(r.tokens),
        "span_tokens": int(np.isin(r.tokens, r.span).sum()),
        "precision_attribution": r.precision(r.attribution),
        "precision_occlusion": r.precision(r.occlusion),
        "precision_shrink": r.precision(r.shrink),
        "chance": r.chance(),
    }


def line_start(text: str, offsets: Sequence[tuple[int, int]], position: int) -> int:
    """The first token (index >= 1) that starts at or after the beginning of the line holding ``position``."""
    begin = text.rfind("\n", 0, position) + 1
    for i, (a, b) in enumerate(offsets):
        if i >= 1 and b > a and a >= begin:
            return i
    return 1


class AttributionExperiment(Experiment[ItemAttribution, AttributionResult]):
    name = "attribution"
    help = "Which tokens the count depends on: integrated gradients along the duration path, occlusion and shrink."
    description = (
        "Each counting, events or sums item (--dataset) is built as its experiment builds it; every attributed token "
        "(--tokens item: the item after the few-shot examples; all: every token but the first) moves from "
        "duration 0 to its own duration, and its integrated gradient of the read-out (--readout) is its "
        "attribution, with completeness checked; occlusion (token deleted alone) and shrink (halved alone) run "
        "beside it. Item ids are the dataset's (count-001, story-001, ...); --first N takes its first N items."
    )
    Config = AttributionConfig
    options = option_table(
        f"""
        dataset   str                      Items and prompts of this experiment: counting, events or sums. [default: counting]
        data      str                      Dataset file for the --dataset experiment (where it takes --data). [default: built-in]
        template  str                      Prompt template of the --dataset experiment. [default: its own]
        chat      bool   --chat/--no-chat  Wrap prompts in the model's chat template.
        tokens    str                      Tokens to attribute: item (from the line holding the span on) or all (all but the first). [default: item]
        readout   str                      What is attributed: count (E[k] over the digits), truth (P(true count)) or log-truth. [default: count]
        steps     int                      Gradient evaluations along the duration path (8-{MAX_STEPS}). [default: {DEFAULT_STEPS}]
        rule      str                      Quadrature along the path: placed (panels laid out from forward-only samples of f, then checked against f), adaptive or gauss. [default: placed]
        floor     float                    Start of the path as a duration factor: 0 deletes the tokens (baseline), else in (0, 1). [default: 0]
        first     int                      Items: the dataset's first N (balanced over category/kind and n); 0 for all. [default: 8]
        """
    )
    engine = shardable = True
    result_type = AttributionResult
    metrics = Metric.table(
        """
        max_completeness_error      lower   largest |sum of attributions - (f(prompt) - f(baseline))| relative to |f(prompt) - f(baseline)|
        mean_completeness_error     lower   the same, mean over items
        mean_precision_attribution  higher  share of the k tokens of largest |attribution| inside the scaled span (k: its tokens), mean over items
        """
    )

    def items(self, config: AttributionConfig) -> Sequence[Any]:
        return config.first_items(config.first)

    def plan(self, lm: Any, item: Any, config: AttributionConfig) -> tuple[Any, list[int], list[int], Readout, Any]:
        """The item's prompt signal, its span tokens, the attributed tokens, the read-out and the plan."""
        from contllm.core.readout import digits

        plan = registry.get(config.dataset).plan_item(lm, item, config.dataset_config())
        signal, span = plan.signals[0], list(plan.edited)
        if not span:
            raise ExperimentError(f"item {item.id}: the prompt has no span to attribute")
        n = len(signal)
        if config.tokens == "all":
            tokens = list(range(1, n))
        else:
            assert signal.text is not None and signal.offsets is not None
            tokens = list(range(line_start(signal.text, signal.offsets, signal.offsets[span[0]][0]), n))
        sets = digits(lm.tokenizer)
        if config.readout == "count":
            readout = Readout.expectation(sets)
        else:
            readout = Readout.label(sets, str(plan.truth), log=config.readout == "log-truth")
        return signal, span, tokens, readout, plan

    def run(
        self, lm: Any, config: AttributionConfig, items: Sequence[Any], context: RunContext
    ) -> Iterator[tuple[str, ItemAttribution]]:
        for item in items:
            signal, span, tokens, readout, plan = self.plan(lm, item, config)
            found = attribute(
                lm,
                signal,
                readout,
                tokens,
                steps=config.steps,
                floor=config.floor,
                rule=config.rule,
                max_batch_tokens=context.max_batch_tokens,
            )
            _, changes = occlusion(lm, signal, readout, tokens, factors=(0.0, 0.5), evaluate=context.evaluate)
            assert signal.text is not None and signal.offsets is not None
            yield (
                item.id,
                ItemAttribution(
                    item_id=item.id,
                    readout=readout.name,
                    text=signal.text,
                    offsets=list(signal.offsets),
                    tokens=tokens,
                    attribution=found.attributions,
                    occlusion=changes[0],
                    shrink=changes[1],
                    span=span,
                    full=found.full,
                    baseline=found.baseline,
                    start=found.start,
                    steps=config.steps,
                    floor=config.floor,
                    truth=plan.truth,
                    meta={**plan.meta, "rule": found.meta["rule"], "panels": found.meta["panels"]},
                ),
            )

    def tables(self, result: AttributionResult) -> dict[str, Table]:
        return {
            "results": (TOKEN_COLUMNS, token_rows(result)),
            "items": (ITEM_COLUMNS, [item_row(r) for r in result.items]),
        }

    def summary(self, result: AttributionResult) -> dict[str, Any]:
        """Worst and mean completeness error, mean precision@k of each measure, and their agreement."""
        from contllm import metrics

        if not result.items:
            raise ExperimentError("the result holds no items")
        rows = [item_row(r) for r in result.items]
        out: dict[str, Any] = {"experiment": result.experiment, "model": result.model, "items": len(rows)}
        errors = [row["completeness_error"] for row in rows]
        out["max_completeness_error"] = float(np.max(errors))
        out["mean_completeness_error"] = float(np.mean(errors))
        out["max_completeness_abs"] = float(np.max([row["completeness_abs"] for row in rows]))
        for key in ("precision_attribution", "precision_occlusion", "precision_shrink", "chance"):
            values = [row[key] for row in rows if np.isfinite(row[key])]
            out[f"mean_{key}"] = float(np.mean(values)) if values else float("nan")
        for other in ("occlusion", "shrink"):
            rhos = [metrics.spearman(r.attribution, getattr(r, other)) for r in result.items if len(r.tokens) > 2]
            rhos = [v for v in rhos if np.isfinite(v)]
            out[f"mean_spearman_attribution_{other}"] = float(np.mean(rhos)) if rhos else float("nan")
        return out

    def report_columns(self, result: AttributionResult) -> dict[str, Any]:
        config = result.config
        return {
            "dataset": config.get("dataset"),
            "tokens": config.get("tokens"),
            "readout": config.get("readout"),
            "steps": config.get("steps"),
        }

    def summary_figure(self, result: AttributionResult) -> Any:
        from contllm.attribution import render

        return render.summary_figure(result)

    def item_figure(self, result: AttributionResult, record: ItemAttribution) -> Any:
        from contllm.attribution import render

        return render.text_heatmap(record, title=f"{result.model} · {record.item_id} · {record.readout}")

    def documents(self, result: AttributionResult, *, per_item: bool = True) -> Iterator[tuple[str, str]]:
        from contllm.attribution import render as figures
        from contllm.rundir.files import data_name

        if per_item:
            for r in result.items:
                yield f"figures/items/{data_name(r.item_id)}.html", figures.html_page(r, model=result.model)


EXPERIMENT = AttributionExperiment()
