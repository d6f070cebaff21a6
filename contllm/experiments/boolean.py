"""Boolean interpolation: the operator of "1 AND 0" moved through embedding space to another.

For every pair of operators and every input pair, the operator's span is interpolated
from the first operator (alpha = 0) to the second (alpha = 1), aligned in time when the
two tokenize into different numbers of tokens; 0/1 and false/true are read out.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from contllm import metrics
from contllm.audits.studies import Study, boolean_finding
from contllm.core.readout import PAPER_TRUTH, containing, truth_values
from contllm.core.signal import Signal
from contllm.data import BooleanTable, load_boolean
from contllm.errors import ExperimentError
from contllm.experiments.base import Metric
from contllm.experiments.interpolations import (
    AlphaSweepConfig,
    AlphaSweepExperiment,
    alpha_options,
    end_accuracy,
    interpolation_plan,
)
from contllm.experiments.options import Option
from contllm.experiments.prompts import Rendered, apply_chat, render
from contllm.experiments.protocol import PROTOCOL
from contllm.experiments.sweeps import ExperimentResult, Sweep, SweepPlan, summary_start
from contllm.lm import ContinuousLM

DEFAULT_TEMPLATE = "What is the truth value of {a} {op} {b}?\nAnswer: "
CHAT_TEMPLATE = "What is the truth value of {a} {op} {b}? Reply with 0 or 1."
#: The paper's prompt (its protocol).
PAPER_TEMPLATE = "Question: What is the truth value of the following statement?\n{a} {op} {b}\nAnswer (0 or 1): "
#: The paper's operators, in its order; it runs each pair in alphabetical order (AND -> NAND, NOR -> OR, ...).
PAPER_OPERATORS = ("AND", "OR", "NAND", "NOR", "XOR")


@dataclass(frozen=True)
class BooleanItem:
    """One sweep: operator ``first`` to ``second`` on inputs (a, b)."""

    id: str
    first: str
    second: str
    a: int
    b: int


@dataclass
class BooleanConfig(
    AlphaSweepConfig, prompts=(DEFAULT_TEMPLATE, CHAT_TEMPLATE, ("a", "op", "b"), ("op",)), paper=PAPER_TEMPLATE
):
    """Options of the Boolean interpolation experiment (and :class:`AlphaSweepConfig`'s).

    template: prompt with {a}, {op} and {b} fields; None picks the default (the paper's
        under its protocol).
    operators: the operators to pair (every unordered pair); None: all in the dataset, or
        the paper's five (:data:`PAPER_OPERATORS`) under its protocol.
    method: "linear" or "slerp" interpolation of the embeddings.
    low, high, samples: the values of alpha (within [0, 1]; samples None: 21, or 100 for the
        paper's protocol); chat: use the chat template.
    protocol: "paper" takes the paper's prompt and operators, runs each pair in
        alphabetical order and reads 0 and 1 as the paper does (every token containing "1"
        or "tr" is 1, every other one containing "0" or "fa" is 0).
    """

    BY_PROTOCOL: ClassVar[dict[str, tuple[Any, Any]]] = {
        **AlphaSweepConfig.BY_PROTOCOL,
        "operators": (None, PAPER_OPERATORS),
    }

    operators: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.operators is not None:
            self.operators = tuple(self.operators)
            table = load_boolean()
            for op in self.operators:
                table.word(op)  # raises for an unknown operator, naming the known ones
            if len(set(o.upper() for o in self.operators)) < 2:
                raise ExperimentError("give at least two different operators to interpolate between")


def boolean_items(config: BooleanConfig, table: BooleanTable | None = None) -> list[BooleanItem]:
    """Every unordered operator pair (in the operators' order) times every input pair; under the paper's protocol each
    pair runs from the alphabetically first operator to the other, as the paper's script does."""
    table = table or load_boolean()
    ops = [
        table.operators[table.operators.index(o.upper())] if o.upper() in table.operators else o
        for o in (config.operators or table.operators)
    ]
    items = []
    for pair in itertools.combinations(ops, 2):
        first, second = sorted(pair) if config.paper else pair
        for a, b in table.pairs:
            items.append(BooleanItem(f"{first}-{second}-{a}{b}", first, second, a, b))
    return items


def _render(lm: ContinuousLM, config: BooleanConfig, word: str, a: int, b: int) -> Rendered:
    rendered = render(config.resolved_template(), {"a": str(a), "op": word, "b": str(b)}, required=("op",))
    if config.chat:
        rendered = apply_chat(lm.tokenizer, rendered)
    return rendered


def plan_item(lm: ContinuousLM, item: BooleanItem, config: BooleanConfig) -> SweepPlan:
    """The sweep of one item: the operator's span interpolated over alpha."""
    table = load_boolean()
    embedding = lm.model.get_input_embeddings()
    ends = []
    for op in (item.first, item.second):
        rendered = _render(lm, config, table.word(op), item.a, item.b)
        signal = Signal.from_text(lm.tokenizer, rendered.text, add_special_tokens=not config.chat)
        ends.append((signal.embedded(embedding), rendered.spans["op"][0]))
    (sa, span_a), (sb, span_b) = ends
    alphas = config.alphas()
    meta = {
        "first": item.first,
        "second": item.second,
        "a": item.a,
        "b": item.b,
        "truth_first": table.truth(item.first, item.a, item.b),
        "truth_second": table.truth(item.second, item.a, item.b),
        "method": config.method,
        "tokens_first": len(sa),
        "tokens_second": len(sb),
    }
    sets = containing(lm.tokenizer, PAPER_TRUTH) if config.paper else truth_values(lm.tokenizer)
    return interpolation_plan(lm, item.id, (sa, span_a, sb, span_b), alphas, config.method, sets, meta)


def boolean_summary(result: ExperimentResult) -> dict[str, Any]:
    """The headline numbers of a Boolean result (:attr:`BooleanExperiment.metrics`): truth-table accuracy at alpha 0
    and 1 (argmax of 0 vs 1); mean total variation and largest step of P(1)."""
    sweeps, out = summary_start(result)

    def correct(s: Sweep, p: np.ndarray, truth: Any) -> bool:
        return int(p[s.labels.index("1")] > p[s.labels.index("0")]) == int(truth)

    out.update(end_accuracy(sweeps, ("truth_first", "truth_second"), correct))
    shapes = [metrics.smoothness(s.x, s.column("1")) for s in sweeps if len(s.x) > 1]
    if shapes:
        out["mean_total_variation_p1"] = float(np.mean([m.total_variation for m in shapes]))
        out["mean_max_jump_p1"] = float(np.mean([m.max_jump for m in shapes]))
    return out


class BooleanExperiment(AlphaSweepExperiment):
    name = "boolean"
    metrics = Metric.table(
        """
        accuracy_at_alpha_0      higher  truth-table accuracy (P(1) vs P(0)) of the first operator, at alpha 0
        accuracy_at_alpha_1      higher  truth-table accuracy of the second operator, at alpha 1
        mean_total_variation_p1  lower   total variation of P(1) over the alpha sweep, mean over items
        mean_max_jump_p1         lower   largest change of P(1) between neighbouring alphas, mean over items
        """
    )
    help = "A Boolean operator interpolated into another in embedding space; 0/1 and false/true read out."
    explorer_text = (
        "Each item asks for the truth value of a statement such as 1 AND 0. The slider is alpha: the operator's "
        "embedding moves from the first operator (alpha = 0) into the second (alpha = 1), and at the far end the "
        "prompt shown is the second operator's. The bars are the probabilities of 0, 1, false and true, the correct "
        "answer green at each end (between them a blend of two operators has no truth value); below the curves, "
        "P(1) / (P(0) + P(1)) with the correct answers ringed."
    )
    description = (
        'The operator of "What is the truth value of 1 AND 0?" is interpolated into another operator '
        "(every unordered pair of AND, OR, XOR, NAND, NOR, XNOR, IMPLIES, or --operators) for every input "
        "pair, linearly or by slerp; 0/1 and false/true are read out. Item ids look like AND-XOR-10."
    )
    Config = BooleanConfig
    options = (
        *alpha_options(21),
        Option("operators", "words", "Comma-separated operators to pair, e.g. AND,XOR. [default: all]"),
        PROTOCOL,
    )
    study = Study("boolean", "mean_max_jump_p1", (), boolean_finding, spread=True)

    make_items = staticmethod(boolean_items)
    make_plan = staticmethod(plan_item)
    summarize = staticmethod(boolean_summary)

    label = "{first} -> {second} on ({a}, {b}), {method}"

    def summary_figure(self, result: ExperimentResult) -> Any:
        from contllm.experiments import figures

        return figures.boolean_summary_figure(result)

    def comparison(self, results: Sequence[tuple[str, ExperimentResult]]) -> Any:
        from contllm.experiments import figures

        return figures.boolean_comparison([figures.Compared(label, r, self.summary(r)) for label, r in results])


EXPERIMENT = BooleanExperiment()
