"""Sweep experiments: one knob (a duration factor or an alpha) moved over every item.

counting, events and boolean each turn a dataset item into a :class:`SweepPlan` (the signals
of a sweep, the knob's values, the token sets to read); :func:`run_plan` evaluates a plan
into a :class:`Sweep`; an :class:`ExperimentResult` holds the sweeps of a run as data.
:class:`SweepExperiment` is what the three share as registered experiments.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from contllm import metrics
from contllm.core.readout import TokenSets
from contllm.core.signal import Signal
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, Table
from contllm.experiments.options import Option
from contllm.experiments.protocol import (
    PAPER_RUNS,
    PROTOCOL,
    SELECTION,
    PaperSearch,
    check_selection,
    decoded_tokens,
    paper_search,
    resolve_defaults,
    resolved_samples,
    with_paper_coverage,
)
from contllm.experiments.records import Record, RecordList, Records

#: Most values of the knob per item: a sweep's signals are held in memory at once.
MAX_SAMPLES = 10_000


def sweep_values(low: float, high: float, samples: int | None, *, include: float | None = 1.0) -> np.ndarray:
    """``samples`` evenly spaced values from low to high, plus ``include`` when it lies inside.

    The plain prompt (factor 1, or alpha 0 and 1) is then always on the sweep.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ExperimentError(f"range must be finite, got {low},{high}")
    if low > high:
        raise ExperimentError(f"range min {low} is larger than max {high}")
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise ExperimentError(f"samples must be an integer >= 1, got {samples!r}")
    if samples > MAX_SAMPLES:
        raise ExperimentError(
            f"samples must be at most {MAX_SAMPLES} (every value of a sweep is held in memory), got {samples}"
        )
    if samples == 1 and low != high:
        raise ExperimentError("one sample needs a range with min == max")
    if samples > 1 and low == high:
        raise ExperimentError(f"range {low},{high} holds one value; give min < max or --samples 1")
    values = np.linspace(low, high, int(samples))
    if include is not None and low <= include <= high and not np.isclose(values, include, atol=1e-12).any():
        values = np.sort(np.append(values, include))
    return values.astype(np.float64)


def check_method(method: str) -> None:
    """ExperimentError unless ``method`` is an interpolation method ("linear" or "slerp")."""
    if method not in ("linear", "slerp"):
        raise ExperimentError(f"method must be 'linear' or 'slerp', got {method!r}")


def check_alpha_sweep(low: float, high: float, samples: int | None, method: str) -> None:
    """ExperimentError unless alphas from low to high (within 0..1) in ``samples`` values and ``method`` make a sweep."""
    if not (0.0 <= low <= high <= 1.0):
        raise ExperimentError(f"alpha range must lie within 0,1 with min <= max, got {low:g},{high:g}")
    sweep_values(low, high, samples, include=None)
    check_method(method)


@dataclass
class SweepConfig:
    """Options every sweep of a prompt takes; a subclass checks its knob (:meth:`check_knob`).

    template: the prompt (None: the experiment's default, its chat default with chat, or
        the paper's with protocol "paper" where the experiment has one).
    low, high, samples: the knob's values, evenly spaced; samples None: the protocol's
        number (:attr:`SAMPLES`, or :attr:`PAPER_SAMPLES` for the paper's); high None: the
        protocol's (:attr:`BY_PROTOCOL`).
    chat: wrap the prompt in the model's chat template (instruct models).
    protocol: "contllm" or "paper" (:data:`~contllm.experiments.protocol.PROTOCOLS`).
    """

    DEFAULT_TEMPLATE: ClassVar[str] = ""
    CHAT_TEMPLATE: ClassVar[str] = ""
    PAPER_TEMPLATE: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    SAMPLES: ClassVar[int] = 10
    PAPER_SAMPLES: ClassVar[int] = 100
    #: Fields left None that take their protocol's default: name -> (the toolkit's, the paper's).
    BY_PROTOCOL: ClassVar[dict[str, tuple[Any, Any]]] = {"high": (1.0, 1.0)}

    def __init_subclass__(
        cls,
        prompts: tuple[str, str, tuple[str, ...], tuple[str, ...]] | None = None,
        paper: str | None = None,
        **rest: Any,
    ) -> None:
        """``prompts``: (default template, chat template, the template's fields, the fields it must hold);
        ``paper``: the template of the paper's protocol."""
        super().__init_subclass__(**rest)
        if prompts is not None:
            cls.DEFAULT_TEMPLATE, cls.CHAT_TEMPLATE, cls.FIELDS, cls.REQUIRED = prompts
        if paper is not None:
            cls.PAPER_TEMPLATE = paper

    template: str | None = None
    low: float = 0.1
    high: float | None = None
    samples: int | None = None
    chat: bool = False
    protocol: str = "contllm"

    def __post_init__(self) -> None:
        from contllm.experiments.prompts import check_template

        self.samples = resolved_samples(self.samples, self.protocol, self.SAMPLES, self.PAPER_SAMPLES)
        resolve_defaults(self, self.BY_PROTOCOL)
        self.check_knob()
        check_template(self.resolved_template(), self.FIELDS, required=self.REQUIRED)

    @property
    def paper(self) -> bool:
        """Whether the config follows the paper's protocol."""
        return self.protocol == "paper"

    def bounds(self) -> tuple[float, float]:
        """(low, high) of the knob (high resolved by the protocol)."""
        if self.high is None:
            raise ExperimentError("the sweep's range has no end; the config was not initialised")
        return self.low, self.high

    def check_knob(self) -> None:
        """ExperimentError unless low, high and samples make a sweep of the knob."""

    def resolved_template(self) -> str:
        if self.template is not None:
            return self.template
        if self.paper and self.PAPER_TEMPLATE:
            return self.PAPER_TEMPLATE
        return self.CHAT_TEMPLATE if self.chat else self.DEFAULT_TEMPLATE


@dataclass
class DurationSweepConfig(SweepConfig):
    """Options shared by the experiments that scale durations (counting, events, sums, ...): a
    :class:`SweepConfig` whose knob is the duration factor (positive; 1.0 added when inside the range).

    selection: how the tokens to scale are found, "contllm" (by the characters of the
    filled-in text) or "paper" (the paper's search of decoded tokens,
    :func:`~contllm.experiments.protocol.paper_search`); None: "paper" under the paper's protocol.
    """

    BY_PROTOCOL: ClassVar[dict[str, tuple[Any, Any]]] = {**SweepConfig.BY_PROTOCOL, "selection": ("contllm", "paper")}

    selection: str | None = None

    def check_knob(self) -> None:
        low, high = self.bounds()
        if low <= 0:
            raise ExperimentError(f"duration factors must be positive; the range starts at {low}")
        sweep_values(low, high, self.samples)
        check_selection(str(self.selection))

    def factors(self) -> np.ndarray:
        """The duration factors [S], evenly spaced from low to high, 1.0 added when inside."""
        low, high = self.bounds()
        return sweep_values(low, high, self.samples)

    def digit_sets(self, tokenizer: Any) -> TokenSets:
        """The read-out of the digits 0-9: exact tokens, or under the paper's protocol every token containing the
        digit (:func:`~contllm.core.readout.paper_digits`)."""
        from contllm.core.readout import digits, paper_digits

        return paper_digits(tokenizer) if self.paper else digits(tokenizer)

    @classmethod
    def command_options(cls, *own: Option, schema: str | None = None) -> tuple[Option, ...]:
        """The options of an experiment over a dataset that takes this config: --range and --samples of the duration
        factor (the config's defaults), --template, --chat, ``own``, --data (rows as ``schema`` says; without a
        schema, no --data), --protocol and --selection."""
        from contllm.data.user import data_option_help

        data = () if schema is None else (Option("data", "str", data_option_help(schema)),)
        default_range = f"{cls.low},{cls.BY_PROTOCOL['high'][0]}"
        return (
            *sweep_options("the duration factor c", default_range, cls.SAMPLES),
            *own,
            *data,
            PROTOCOL,
            SELECTION,
        )


def sweep_options(knob: str, default_range: str, default_samples: int) -> tuple[Option, ...]:
    """The options every sweep experiment takes (each adds its own): range, samples, template, chat."""
    return (
        Option("range", "range", f"MIN,MAX of {knob}. [default: {default_range}]"),
        Option(
            "samples",
            "int",
            f"Values of {knob} per item (1.0 is added to duration factors inside the range). [default: {default_samples}]",
        ),
        Option(
            "template",
            "str",
            "Prompt template; see the experiment's docs for its fields. [default: the experiment's own]",
        ),
        Option("chat", "bool", "Wrap prompts in the model's chat template.", flag="--chat/--no-chat"),
    )


def provenance(tokenizer: Any, signal: Signal, edited: Sequence[int], suffix: str = "") -> dict[str, Any]:
    """What a record keeps of what was measured: the rendered prompt, the edited token positions and their text.

    prompt: the signal's text (chat template included); prompt_tokens: its length in
    tokens; edited: 0-based token positions (special tokens counted); edited_tokens: each
    edited token decoded on its own. With ``suffix`` (e.g. "_second") the keys name the
    other end of an interpolation.
    """
    ids = [] if signal.token_ids is None else signal.token_ids.tolist()
    return {
        f"prompt{suffix}": signal.text,
        f"prompt_tokens{suffix}": len(signal),
        f"edited{suffix}": [int(i) for i in edited],
        f"edited_tokens{suffix}": [tokenizer.decode([ids[i]], clean_up_tokenization_spaces=False) for i in edited],
    }


def ends_provenance(tokenizer: Any, first: Signal, span_first: Any, second: Signal, span_second: Any) -> dict[str, Any]:
    """:func:`provenance` of both ends of an interpolation: the first prompt's keys plain, the second's with "_second"."""
    return {
        **provenance(tokenizer, first, first.token_indices(span_first)),
        **provenance(tokenizer, second, second.token_indices(span_second), "_second"),
    }


def scaled_plan(
    lm: Any,
    item_id: str,
    text: str,
    spans: Sequence[Any],
    config: DurationSweepConfig,
    truth: str,
    meta: dict[str, Any],
    search: PaperSearch | None = None,
) -> SweepPlan:
    """A duration sweep: the prompt ``text`` with ``spans`` scaled by each factor of ``config``; digits read out.

    search: what the paper's token search looks for in this prompt (:func:`selected`); None
    where the paper has no script for the item.
    """
    base = Signal.from_text(lm.tokenizer, text, add_special_tokens=not config.chat)
    factors = config.factors()
    edited, runs = selected(lm.tokenizer, base, spans, search, config.selection)
    signals = [base.scale_tokens(edited, float(c)) for c in factors]
    return SweepPlan(
        item_id,
        factors,
        signals,
        config.digit_sets(lm.tokenizer),
        truth=truth,
        meta={**meta, "tokens": len(base), PAPER_RUNS: runs, **provenance(lm.tokenizer, base, edited)},
        edited=edited,
    )


def selected(
    tokenizer: Any, base: Signal, spans: Sequence[Any], search: PaperSearch | None, selection: str | None
) -> tuple[list[int], bool | None]:
    """The tokens to scale, and whether the paper's code could have run the item (None without a ``search``).

    The paper's code runs an item where its search (:func:`~contllm.experiments.protocol.paper_search`)
    finds the tokens. With ``selection`` "paper" those tokens are scaled; where the search
    finds none, and with "contllm", the tokens that overlap ``spans`` (character spans of
    the text) are.
    """
    if search is None or base.token_ids is None:
        return base.token_indices(list(spans)), None
    found = paper_search(decoded_tokens(tokenizer, base.token_ids.tolist()), search)
    if selection == "paper" and found is not None:
        return found, True
    return base.token_indices(list(spans)), found is not None


@dataclass
class SweepPlan:
    """The sweep of one dataset item, before it runs.

    item_id: the item's id; x: the knob's values [S]; signals: one signal per value;
    token_sets: what to read; truth: the expected label (or None); meta: item facts
    worth saving (word, n, operators, ...); edited: the indices of the tokens a duration
    sweep scales (empty for an interpolation, whose pieces are aligned in time anew).
    """

    item_id: str
    x: np.ndarray
    signals: list[Signal]
    token_sets: TokenSets
    truth: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    edited: list[int] = field(default_factory=list)


@dataclass
class Sweep(Record, what="sweep record"):
    """One item's curves: probabilities [S, K] of the labels over the knob's values x [S]."""

    item_id: str
    x: np.ndarray
    labels: list[str]
    probs: np.ndarray
    truth: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

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

    def end_truths(self) -> tuple[str | None, str | None] | None:
        """The true labels at the two ends of an interpolation (alpha 0 and 1), from ``meta``'s :data:`END_TRUTHS`;
        None for a sweep that records none (a duration sweep, whose truth is :attr:`truth` throughout)."""
        first, second = (self.meta.get(key) for key in END_TRUTHS)
        if first is None and second is None:
            return None
        return (None if first is None else str(first), None if second is None else str(second))

    def truth_at(self, value: float) -> str | None:
        """The true label at ``value`` of the knob: :attr:`truth` for a duration sweep; for an interpolation the first
        end's truth at alpha 0, the second's at alpha 1 and None between them (a blend of two prompts has none)."""
        ends = self.end_truths()
        if ends is None:
            return self.truth
        if np.isclose(value, 0.0, atol=1e-12):
            return ends[0]
        if np.isclose(value, 1.0, atol=1e-12):
            return ends[1]
        return None


#: The keys of an interpolation sweep's ``meta`` that hold the true label at alpha 0 and at alpha 1.
END_TRUTHS = ("truth_first", "truth_second")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass
class ExperimentResult(Records[Sweep], record=Sweep):
    """Every sweep of one sweep experiment on one model (``sweeps``), with the configuration that made it."""

    sweeps = RecordList()
    sweep = Records.record

    x_label: str = "factor"

    def rows(self) -> Iterable[dict[str, Any]]:
        """Tidy rows: one per item, value of x and label; "truth" is the true label there (:meth:`Sweep.truth_at`),
        empty where there is none."""
        for s in self.sweeps:
            for k, x in enumerate(s.x):
                truth = s.truth_at(float(x))
                for j, label in enumerate(s.labels):
                    yield {
                        "item": s.item_id,
                        self.x_label: float(x),
                        "label": label,
                        "probability": float(s.probs[k, j]),
                        "truth": "" if truth is None else truth,
                    }

    def columns(self) -> list[str]:
        """The columns of :meth:`rows`."""
        return ["item", self.x_label, "label", "probability", "truth"]


Evaluator = Callable[[list[Signal]], torch.Tensor]


def group_size(lm: Any, signals_per_item: int, group_bytes: int) -> int:
    """How many items of ``signals_per_item`` signals each one batch of ``group_bytes`` takes (at least one).

    The budget counts float32 next-token distributions over the model's vocabulary. Fixed
    by the model, the sweep and the run's recorded budget, so that a resumed run batches
    its items exactly as an uninterrupted one did.
    """
    vocab = int(lm.model.config.get_text_config().vocab_size)
    signals = max(1, group_bytes // (4 * vocab))
    return max(1, signals // max(1, signals_per_item))


def run_plan(plan: SweepPlan, evaluate: Evaluator) -> Sweep:
    """Evaluate one plan: next-token distributions [S, vocab] -> label probabilities [S, K]."""
    return next(run_plans([plan], evaluate))


def run_plans(plans: Sequence[SweepPlan], evaluate: Evaluator) -> Iterator[Sweep]:
    """Evaluate plans in one call of ``evaluate`` (their signals in order) and split the result into sweeps."""
    probs = evaluate([s for plan in plans for s in plan.signals]) if plans else None
    start = 0
    for plan in plans:
        assert probs is not None
        part = probs[start : start + len(plan.signals)]
        start += len(plan.signals)
        gathered = plan.token_sets.gather(part.float()).cpu().numpy().astype(np.float64)
        if not np.isfinite(gathered).all():
            raise ExperimentError(f"item {plan.item_id}: the model produced non-finite probabilities")
        yield Sweep(plan.item_id, plan.x, list(plan.token_sets.labels), gathered, plan.truth, dict(plan.meta))


class SweepExperiment(Experiment[Sweep, ExperimentResult]):
    """An experiment whose items each become one sweep of the knob (counting, events, boolean).

    Subclasses set the :class:`Experiment` attributes and ``x_label``, and name their module's
    functions (each as a ``staticmethod``): ``make_items(config)``, every item of a config;
    ``make_plan(lm, item, config)``, the sweep of one item before it runs; ``summarize(result)``,
    the headline numbers. :meth:`items`, :meth:`plan_item` and :meth:`summary` call them (a
    subclass may override those methods instead). ``label`` titles an item's figure: a
    template of its sweep's meta values (:meth:`describe`).
    """

    engine: ClassVar[bool] = True
    shardable: ClassVar[bool] = True
    x_label: ClassVar[str] = "factor"
    explorer = True
    counts: ClassVar[bool] = False
    result_type = ExperimentResult
    make_items: ClassVar[staticmethod[[Any], Sequence[Any]] | None] = None
    make_plan: ClassVar[staticmethod[[Any, Any, Any], SweepPlan] | None] = None
    summarize: ClassVar[staticmethod[[ExperimentResult], dict[str, Any]] | None] = None
    #: An item's title as a template of its sweep's meta values, e.g. "{first} -> {second}" (a value the meta lacks
    #: reads None); None: the item's id.
    label: ClassVar[str | None] = None

    def items(self, config: Any) -> Sequence[Any]:
        """Every item of ``config``, in order: the experiment's ``make_items``."""
        return self._declared("make_items")(config)

    def plan_item(self, lm: Any, item: Any, config: Any) -> SweepPlan:
        """The sweep of one item, before it runs: the experiment's ``make_plan``."""
        return self._declared("make_plan")(lm, item, config)

    def summary(self, result: ExperimentResult) -> dict[str, Any]:
        """The headline numbers (the experiment's ``summarize``, its :attr:`metrics`), with the paper's coverage where
        recorded (:func:`~contllm.experiments.protocol.with_paper_coverage`)."""
        return with_paper_coverage(result, self._declared("summarize"))

    def _declared(self, name: str) -> Callable[..., Any]:
        found = getattr(self, name)
        if found is None:
            raise NotImplementedError(f"{type(self).__name__} names no {name}")
        return found  # type: ignore[no-any-return]

    def groups(self, lm: Any, config: Any, items: Sequence[Any], context: RunContext) -> list[list[Any]]:
        """Consecutive items whose sweeps run as one batch: :func:`group_size` items each."""
        if not items:
            return []
        size = group_size(lm, len(self.plan_item(lm, items[0], config).signals), context.group_bytes)
        return [list(items[k : k + size]) for k in range(0, len(items), size)]

    def run(self, lm: Any, config: Any, items: Sequence[Any], context: RunContext) -> Iterator[tuple[str, Sweep]]:
        """The sweeps of ``items``, evaluated in one batch (a prompt prefix they share is computed once)."""
        plans = [self.plan_item(lm, item, config) for item in items]
        for item, sweep in zip(items, run_plans(plans, context.evaluate)):
            yield item.id, sweep

    def result(self, model: str, config: Any, records: Sequence[Sweep]) -> ExperimentResult:
        return ExperimentResult(self.name, model, self.config_dict(config), list(records), x_label=self.x_label)

    def tables(self, result: ExperimentResult) -> dict[str, Table]:
        return {"results": (result.columns(), result.rows())}

    def report_columns(self, result: ExperimentResult) -> dict[str, Any]:
        """The knob's range and the number of samples per item (the most common grid)."""
        grids = Counter((float(s.x.min()), float(s.x.max()), len(s.x)) for s in result.sweeps)
        low, high, samples = grids.most_common(1)[0][0] if grids else (None, None, None)
        return {f"{result.x_label}_min": low, f"{result.x_label}_max": high, "samples": samples}

    def describe(self, sweep: Sweep) -> str:
        """One line saying what an item is, for its figure's title: :attr:`label` filled in from the sweep's meta."""
        if self.label is None:
            return sweep.item_id
        return self.label.format_map(defaultdict(lambda: None, sweep.meta))  # a key the meta lacks reads None

    def item_figure(self, result: ExperimentResult, record: Sweep) -> Any:
        from contllm.experiments import figures

        return figures.item_figure(result, record, self.describe(record), counts=self.counts)


def count_summary(result: ExperimentResult) -> dict[str, Any]:
    """The headline numbers of a counting or events result (:attr:`CountingSweepExperiment.metrics`): accuracy of the
    argmax digit at factor 1, mean Spearman of E[k] with the factor, time-sensitivity AUCs and the paper's peak rates
    (:func:`~contllm.metrics.peak_rates`)."""
    sweeps, out = summary_start(result)
    has_one = all(np.isclose(s.x, 1.0).any() for s in sweeps)
    if has_one:
        out["accuracy_at_1"] = float(np.mean([s.labels[int(np.argmax(s.at(1.0)))] == s.truth for s in sweeps]))
    rhos = [metrics.spearman(s.x, s.implied_value()) for s in sweeps if len(s.x) > 1]
    out["mean_spearman_implied_vs_factor"] = float(np.nanmean(rhos)) if rhos else float("nan")
    curves = [metrics.count_curve(s) for s in sweeps]
    h = metrics.default_thresholds()
    out["auc_observed_time_sensitivity"] = metrics.area_under_curve(h, metrics.observed_time_sensitivity(curves, h))
    if has_one:
        out["auc_counterfactual_time_sensitivity"] = metrics.area_under_curve(
            h, metrics.counterfactual_time_sensitivity(curves, h)
        )
    out["auc_iou"] = metrics.area_under_curve(h, metrics.iou_curve(curves, h))
    rates = metrics.peak_rates(curves)
    out.update(
        pure_peak_rate=rates.pure,
        unpure_peak_rate=rates.unpure,
        chance_peak_rate=rates.chance,
        pure_improvement_over_chance=rates.pure_improvement,
        unpure_improvement_over_chance=rates.unpure_improvement,
        pure_peak_gain=rates.pure - rates.chance,
        unpure_peak_gain=rates.unpure - rates.chance,
    )
    return out


def summary_start(result: ExperimentResult) -> tuple[list[Sweep], dict[str, Any]]:
    """The sweeps of a result and the head every sweep summary starts with; ExperimentError when it holds none."""
    if not result.sweeps:
        raise ExperimentError("the result holds no sweeps")
    return result.sweeps, {"experiment": result.experiment, "model": result.model, "items": len(result.sweeps)}


class CountingSweepExperiment(SweepExperiment):
    """A sweep experiment that reads out a count over the digits 0-9 (counting, events)."""

    counts: ClassVar[bool] = True
    #: What the sweep shortens, in the summary figure's words ("words", "events").
    counted: ClassVar[str] = "words"
    metrics = Metric.table(
        """
        accuracy_at_1                        higher  share of items whose most probable digit at factor 1 is the true count
        mean_spearman_implied_vs_factor      higher  Spearman correlation of the implied count E[k] with the factor, mean over items
        auc_observed_time_sensitivity        higher  area over h of the share of counts 1..n reaching probability h somewhere on the sweep
        auc_counterfactual_time_sensitivity  higher  the same, read only at factor 1
        pure_peak_rate                       higher  counts 1..n that are at least as probable as every other digit at some factor, over n; mean over items
        auc_iou                              higher  area over h of the IoU of the digits reaching h on the sweep with {1..n}
        unpure_peak_rate                     higher  digits 0-9 that are at least as probable as every other digit at some factor, over n; mean over items
        pure_improvement_over_chance         higher  the pure peak rate over the chance rate 1/n (1: one count peaks), mean over items
        unpure_improvement_over_chance       higher  the unpure peak rate over the chance rate 1/n, mean over items
        pure_peak_gain                       higher  pure_peak_rate minus chance_peak_rate, the mean of 1/n (a difference, not the paper's ratio)
        unpure_peak_gain                     higher  unpure_peak_rate minus chance_peak_rate (a difference, not the paper's ratio)
        """
    )

    summarize = staticmethod(count_summary)

    def summary_figure(self, result: ExperimentResult) -> Any:
        from contllm.experiments import figures

        return figures.count_summary_figure(result, self.counted)

    def comparison(self, results: Sequence[tuple[str, ExperimentResult]]) -> Any:
        from contllm.experiments import figures

        return figures.count_comparison([figures.Compared(label, r, self.summary(r)) for label, r in results])
