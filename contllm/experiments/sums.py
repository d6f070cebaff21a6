"""Sums: a number's duration in arithmetic.

A word problem adds two whole numbers ("Mia has 23 apples and buys 45 more. ..."); the
tokens of one of them have their duration scaled by c wherever the prompt fills it in (its
field in the problem, and the template's {first} or {second}, as in the default answer
"23 + 45 = ").
The first digit of the answer is read out over the digits 0-9, and the whole number
through greedy steps: the most probable digit is appended (duration 1) and the prompt
evaluated again, as long as the most probable next token is a digit. One engine call
per step evaluates every factor of an item that is still writing its number.

The implied sum at c reads each digit of the greedy answer as its expectation (the
digit distribution at that step, along the greedy path), weighted by its place. A model
that read a number lasting c as c times the number would follow the line
a·c + b (a: the scaled number, b: the other), through the true sum at c = 1. The paper's
outcome classes (:func:`success`) read the first digit's probabilities alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from contllm import metrics
from contllm.audits.studies import Study, sums_finding
from contllm.core.signal import Signal
from contllm.data.paper import SUMS_FIELDS, sums_rows
from contllm.data.user import DataFileOption, Row, read_items
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, Table
from contllm.experiments.prompts import Rendered, apply_chat, render
from contllm.experiments.protocol import PAPER_RUNS, PaperSearch, with_paper_coverage
from contllm.experiments.records import Record, Records
from contllm.experiments.sweeps import DurationSweepConfig, SweepPlan, provenance, selected

#: Worked examples: the problem, then its sum written out. Small models write the right sum
#: far more often with this format than when the answer follows the question directly
#: (measured in the README).
SHOTS = (
    ("Tom has 12 pens and gets 31 more. How many pens does Tom have now?", 12, 31),
    ("A bakery sold 25 pies in the morning and 34 pies in the afternoon. How many pies did it sell?", 25, 34),
    ("Rosa has 48 cards and her brother gives her 27 more. How many cards does Rosa have?", 48, 27),
    ("There are 16 ducks on a pond and 53 more arrive. How many ducks are on the pond now?", 16, 53),
)
DEFAULT_TEMPLATE = (
    "".join(f"Question: {p}\nAnswer: {a} + {b} = {a + b}\n\n" for p, a, b in SHOTS)
    + "Question: {problem}\nAnswer: {first} + {second} = "
)
CHAT_TEMPLATE = "{problem} Reply with the number only."
#: The paper's prompt is the problem itself: its rows are whole prompts ending in the answer's
#: start ("...?\nAnswer: Mia delivered "); a built-in problem is written in that form (:data:`PAPER_FORM`).
PAPER_TEMPLATE = "{problem}"
#: The paper's form of a problem that has an answer start (:attr:`SumItem.answer`).
PAPER_FORM = "Question: {problem}\nAnswer: {answer} "
FIELDS = ("problem", "first", "second")

#: Largest number a problem may add (the answer is read digit by digit).
MOST = 999_999

#: What a row of a --data file holds, for --help and the README.
DATA_SCHEMA = (
    "problem (a text with {first}, {second} and optionally {name}), first, second (whole numbers), and "
    "optionally id, name, scaled (first or second; default first), answer (the answer's start in the paper's form, "
    "e.g. '{name} has'); or the paper's " + ", ".join(SUMS_FIELDS)
)


@dataclass(frozen=True)
class SumItem:
    """A word problem adding two whole numbers.

    problem: the text with {first}, {second} (and optionally {name}) fields; scaled:
    "first" or "second", the number whose tokens are scaled; answer: the start of the
    answer the paper's prompts end with ("{name} has", fields allowed), empty when the
    problem holds its own (the paper's rows).
    """

    id: str
    problem: str
    first: int
    second: int
    name: str = ""
    scaled: str = "first"
    answer: str = ""

    @property
    def truth(self) -> int:
        return self.first + self.second

    @property
    def numbers(self) -> tuple[int, int]:
        """(the scaled number a, the other number b)."""
        return (self.first, self.second) if self.scaled == "first" else (self.second, self.first)

    def rendered(self, *, paper: bool = False) -> Rendered:
        """The problem's text and the character spans of its fields; with ``paper``, in the paper's form
        (:data:`PAPER_FORM`) when the problem has an answer start."""
        text = self.problem
        if paper and self.answer:
            text = PAPER_FORM.replace("{problem}", self.problem).replace("{answer}", self.answer)
        return render(
            text,
            {"first": str(self.first), "second": str(self.second), "name": self.name},
            required=("first", "second"),
        )

    def search(self) -> PaperSearch | None:
        """What the paper's script searches for to find the scaled number's tokens; None where its code stops first
        (a one-digit number, which has no second digit to end the search at)."""
        digits = str(self.numbers[0])
        if len(digits) < 2:
            return None
        if self.scaled == "first":
            return PaperSearch(digits[0], digits[1], before="and")
        return PaperSearch(digits[0], digits[1], after="and", before=".")


def read_sums(path: str | Path) -> list[SumItem]:
    """The problems of a dataset file (:data:`DATA_SCHEMA`); ExperimentError naming file, row and field."""
    return read_items(path, _sum_item, sums_rows)


def _sum_item(row: Row) -> SumItem:
    def number(value: int) -> str | None:
        return None if 0 <= value <= MOST else f"must be a whole number from 0 to {MOST}, got {value}"

    item = SumItem(
        id=row.get("id", str, default=f"sum-{row.number:03d}"),
        problem=row.get("problem"),
        first=row.get("first", int, check=number),
        second=row.get("second", int, check=number),
        name=row.get("name", str, default=""),
        scaled=row.get(
            "scaled",
            str,
            default="first",
            check=lambda v: None if v in ("first", "second") else f"must be 'first' or 'second', got {v!r}",
        ),
        answer=row.get("answer", str, default=""),
    )
    try:
        item.rendered(paper=True)
    except ExperimentError as err:
        raise row.error(str(err), "answer" if item.answer else "problem") from None
    if "{name}" in item.problem and not item.name:
        raise row.error("the problem has a {name} field but the row gives no name", "name")
    return item


def load_sums() -> list[SumItem]:
    """The built-in problems (contllm/data/sums.json): two-digit numbers, the first one scaled."""
    from contllm.data import builtin_path

    return read_sums(builtin_path("sums.json"))


#: The templates and their fields (see :class:`~contllm.experiments.sweeps.SweepConfig`).
PROMPTS = (DEFAULT_TEMPLATE, CHAT_TEMPLATE, FIELDS, ("problem",))


@dataclass
class SumsConfig(DurationSweepConfig, DataFileOption, prompts=PROMPTS, paper=PAPER_TEMPLATE):
    """Options of the sums experiment.

    template: the prompt, with a {problem} field and optionally {first} and {second}
        (the numbers written again; the scaled one is scaled there too); None: the default.
    low, high, samples: the duration factors c, evenly spaced (1.0 added when inside);
        high None: 1.5, or 1.0 (the paper's linspace(0.1, 1, 100)) under the paper's protocol.
    chat: wrap the prompt in the model's chat template.
    data: a dataset file (:func:`read_sums`) instead of the built-in problems; its
        contents' sha256 is kept in data_sha256, so that a resumed run refuses a changed file.
    """

    SAMPLES: ClassVar[int] = 8
    BY_PROTOCOL: ClassVar[dict[str, tuple[Any, Any]]] = {**DurationSweepConfig.BY_PROTOCOL, "high": (1.5, 1.0)}

    def __post_init__(self) -> None:
        super().__post_init__()
        self.read_data(read_sums)


def render_item(lm: Any, item: SumItem, config: SumsConfig) -> Rendered:
    """The item's prompt; its spans hold "scaled": every place where the scaled number is written."""
    problem = item.rendered(paper=config.paper and config.template is None)
    outer = render(
        config.resolved_template(),
        {"problem": problem.text, "first": str(item.first), "second": str(item.second)},
        required=("problem",),
    )
    spans = list(outer.spans[item.scaled])
    for start, _ in outer.spans["problem"]:
        spans += [(start + a, start + b) for a, b in problem.spans[item.scaled]]
    rendered = Rendered(outer.text, {"scaled": sorted(spans)})
    return apply_chat(lm.tokenizer, rendered) if config.chat else rendered


@dataclass
class SumRecord(Record, what="sums record"):
    """One problem over the factors x [S]: the digit distributions of each greedy step and the answers.

    steps[k][i]: the probabilities [10] of the digits (labels) at step k for factor x[i],
    None where that factor's number had ended. answers[i]: the greedy digits at x[i].
    truth = first + second; scaled and other: the scaled number a and the other one b.
    """

    item_id: str
    x: np.ndarray
    labels: list[str]
    steps: list[list[list[float] | None]]
    answers: list[str]
    truth: int
    scaled: int
    other: int
    meta: dict[str, Any] = field(default_factory=dict)

    def check_loaded(self) -> None:
        size = len(self.x)
        if (
            not self.steps
            or len(self.answers) != size
            or any(len(step) != size for step in self.steps)
            or not all(isinstance(a, str) and a.isascii() and a.isdigit() for a in self.answers)
        ):
            raise ExperimentError(f"malformed sums record {self.item_id}: steps and answers must cover every factor")

    def first_digit(self) -> np.ndarray:
        """The digit probabilities [S, 10] of the answer's first digit."""
        return np.array(self.steps[0], dtype=np.float64)

    def greedy(self) -> np.ndarray:
        """The greedy answer [S] at each factor, as a number."""
        return np.array([int(a) for a in self.answers], dtype=np.float64)

    def implied(self) -> np.ndarray:
        """The implied sum [S]: each greedy digit's expectation at its step, weighted by its place."""
        values = np.arange(len(self.labels), dtype=np.float64)
        out = np.zeros(len(self.x))
        for i, answer in enumerate(self.answers):
            for k in range(len(answer)):
                p = np.asarray(self.steps[k][i], dtype=np.float64)
                out[i] += 10.0 ** (len(answer) - 1 - k) * float(p @ values / p.sum())
        return out

    def line(self) -> np.ndarray:
        """a·c + b [S]: the sum if the scaled number were read as c times itself."""
        return self.scaled * self.x + self.other


def measures(record: SumRecord) -> dict[str, float]:
    """One problem's numbers.

    correct_at_1 / first_digit_correct_at_1: the greedy answer (its first digit) at c = 1
    is the true sum (nan without c = 1 on the sweep); slope, intercept, r2: the implied
    sum fitted on c; slope_ratio: that slope over the scaled number a (1 on the line
    a·c + b); spearman: rank correlation of the implied sum with c; mae_line: mean
    |implied sum - (a·c + b)|.
    """
    nan = float("nan")
    implied, x = record.implied(), record.x
    ones = np.flatnonzero(np.isclose(x, 1.0, atol=1e-9))
    truth = str(record.truth)
    fit = metrics.linear_fit(x, implied) if len(x) > 1 and np.ptp(x) > 0 else None
    return {
        "correct_at_1": float(record.answers[ones[0]] == truth) if len(ones) else nan,
        "first_digit_correct_at_1": float(record.answers[ones[0]][0] == truth[0]) if len(ones) else nan,
        "slope": fit.slope if fit else nan,
        "intercept": fit.intercept if fit else nan,
        "r2": fit.r2 if fit else nan,
        "slope_ratio": fit.slope / record.scaled if fit and record.scaled else nan,
        "spearman": metrics.spearman(x, implied) if len(x) > 1 else nan,
        "mae_line": float(np.mean(np.abs(implied - record.line()))),
    }


def outputs(scaled: int, other: int) -> tuple[str, list[str], list[str]]:
    """The first digits the paper's analysis compares, for a scaled (shrunk) number a and the other number b.

    Returns (the unshrunk output: the first digit of a + b; the shrunk outputs: the first
    digits of b + the first digit of a and of b + its second digit; the other outputs: the
    first digits of b + x for x in 0..9, less those), all as digit labels "0".."9".
    """
    shrunk = sorted({str(other + int(d))[0] for d in str(scaled)[:2]})
    unshrunk = str(other + scaled)[0]
    others = sorted({str(other + x)[0] for x in range(10)} - set(shrunk) - {unshrunk})
    return unshrunk, shrunk, others


def success(record: SumRecord) -> dict[str, bool]:
    """The paper's outcome classes of one problem (docs/paper.md), from the first digit's probabilities over the factors.

    With the outputs of :func:`outputs` (the shrunk outputs' probabilities summed, the
    others each on its own): valid: at c = 1 the unshrunk output is more probable than the
    shrunk sum and than every other output; successful: valid, and at some factor the
    shrunk sum beats the unshrunk output; strongly: successful, and at some factor the
    shrunk sum beats the unshrunk output and every other; completely: strongly, and at no
    factor where the shrunk sum beats the unshrunk output does another output beat the
    shrunk sum. Only factors up to 1 count (the paper's sweep ends there); without c = 1
    nothing is valid.
    """
    probs = record.first_digit()
    column = {label: probs[:, j] for j, label in enumerate(record.labels)}
    unshrunk_label, shrunk_labels, other_labels = outputs(record.scaled, record.other)
    unshrunk = column[unshrunk_label]
    shrunk = np.sum([column[label] for label in shrunk_labels], axis=0)
    others = np.array([column[label] for label in other_labels]).reshape(len(other_labels), len(record.x))
    ones = np.flatnonzero(np.isclose(record.x, 1.0, atol=1e-9))
    valid = bool(len(ones)) and bool(
        unshrunk[ones[0]] > shrunk[ones[0]] and (unshrunk[ones[0]] > others[:, ones[0]]).all()
    )
    beats = (shrunk > unshrunk) & (record.x <= 1.0 + 1e-9)
    successful = valid and bool(beats.any())
    strongly = successful and bool((beats & (shrunk > others).all(axis=0)).any())
    completely = strongly and not bool((beats & (shrunk < others).any(axis=0)).any())
    return {
        "valid": valid,
        "successful": successful,
        "strongly_successful": strongly,
        "completely_successful": completely,
    }


SUCCESS = ("valid", "successful", "strongly_successful", "completely_successful")


MEASURES = (
    "correct_at_1",
    "first_digit_correct_at_1",
    "slope",
    "intercept",
    "r2",
    "slope_ratio",
    "spearman",
    "mae_line",
)


@dataclass
class SumsResult(Records[SumRecord], record=SumRecord):
    """Every problem's record from one run, with the configuration that made it."""

    def common(self) -> tuple[np.ndarray, list[SumRecord]]:
        """The most common factor grid and the records on it (a run uses one)."""
        grid = Counter(tuple(np.round(r.x, 12)) for r in self.records).most_common(1)[0][0]
        return np.array(grid), [r for r in self.records if tuple(np.round(r.x, 12)) == grid]


def _appended(signal: Signal, token: int) -> Signal:
    """``signal`` followed by ``token`` of duration 1 (one step after its end)."""
    assert signal.token_ids is not None
    return replace(
        signal,
        token_ids=torch.cat([signal.token_ids, torch.tensor([token])]),
        durations=torch.cat([signal.durations, torch.ones(1, dtype=torch.float64)]),
        text=None,
        offsets=None,
    )


def plan_item(lm: Any, item: SumItem, config: SumsConfig) -> SweepPlan:
    """One problem's first digit as a sweep, before it runs: one signal per factor c with the scaled number's tokens
    (``edited``) at duration c, read among the digits with the protocol's sets (:meth:`SumsConfig.digit_sets`);
    truth: the true sum's first digit. :func:`run_item` evaluates these signals first and then one greedy step per
    digit; the experiments that borrow a dataset's prompts (circuit, attribution) take its plain prompt."""
    rendered = render_item(lm, item, config)
    base = Signal.from_text(lm.tokenizer, rendered.text, add_special_tokens=not config.chat)
    search = item.search()
    runs: bool | None = False
    if search is None:
        edited = base.token_indices(rendered.spans["scaled"])
    else:
        edited, runs = selected(lm.tokenizer, base, rendered.spans["scaled"], search, config.selection)
    x = config.factors()
    meta = {
        "problem": item.rendered().text,
        "scaled_field": item.scaled,
        "tokens": len(base),
        PAPER_RUNS: runs,
        **provenance(lm.tokenizer, base, edited),
    }
    signals = [base.scale_tokens(edited, float(c)) for c in x]
    sets = config.digit_sets(lm.tokenizer)
    return SweepPlan(item.id, x, signals, sets, str(item.truth)[0], meta, list(edited))


def run_item(lm: Any, item: SumItem, config: SumsConfig, evaluate: Any) -> SumRecord:
    """Evaluate one problem: the first digit at every factor (:func:`plan_item`), then one greedy step per digit
    (one call per step).

    The digits are read with the protocol's sets (:meth:`SumsConfig.digit_sets`); the greedy
    answer appends the most probable token that is exactly the chosen digit.
    """
    from contllm.core.readout import decoded_vocabulary, digits

    plan = plan_item(lm, item, config)
    x, signals, sets = plan.x, list(plan.signals), plan.token_sets
    exact = digits(lm.tokenizer)
    vocabulary = decoded_vocabulary(lm.tokenizer)
    # A digit continues the number only when it is written without a leading space.
    digit_of = {i: label for label, ids in zip(exact.labels, exact.token_ids) for i in ids if vocabulary[i] == label}
    answers = [""] * len(x)
    live = list(range(len(x)))
    steps: list[list[list[float] | None]] = []
    for step in range(len(str(item.truth)) + 1):
        probs = evaluate([signals[i] for i in live]).float()
        gathered = sets.gather(probs).cpu().numpy().astype(np.float64)
        if not np.isfinite(gathered).all():
            raise ExperimentError(f"item {item.id}: the model produced non-finite probabilities")
        rows: list[list[float] | None] = [None] * len(x)
        going = []
        for j, i in enumerate(live):
            rows[i] = [float(p) for p in gathered[j]]
            if step == 0:  # the first digit is read among the digits, whatever the top token
                label = sets.labels[int(np.argmax(gathered[j]))]
                ids = exact.token_ids[exact.labels.index(label)]
                token = ids[int(probs[j, list(ids)].argmax())]
            else:
                token = int(probs[j].argmax())
                if token not in digit_of:
                    continue
                label = digit_of[token]
            answers[i] += label
            signals[i] = _appended(signals[i], token)
            going.append(i)
        steps.append(rows)
        live = going
        if not live:
            break
    a, b = item.numbers
    return SumRecord(item.id, x, list(sets.labels), steps, answers, item.truth, a, b, plan.meta)


def sums_summary(result: SumsResult) -> dict[str, Any]:
    """The headline numbers of a sums result (:attr:`SumsExperiment.metrics` and the means of :func:`measures`)."""
    if not result.records:
        raise ExperimentError("the result holds no records")
    per_item = [measures(r) for r in result.records]
    out: dict[str, Any] = {"experiment": result.experiment, "model": result.model, "items": len(per_item)}

    def mean(key: str) -> float:
        values = [m[key] for m in per_item if np.isfinite(m[key])]
        return float(np.mean(values)) if values else float("nan")

    out["accuracy_at_1"] = mean("correct_at_1")
    out["first_digit_accuracy_at_1"] = mean("first_digit_correct_at_1")
    for key in ("slope", "slope_ratio", "r2", "spearman", "mae_line"):
        out[f"mean_{key}"] = mean(key)
    # A greedy answer with a digit too many (152 for 83) moves a problem's slope by a hundred.
    ratios = [m["slope_ratio"] for m in per_item if np.isfinite(m["slope_ratio"])]
    out["median_slope_ratio"] = float(np.median(ratios)) if ratios else float("nan")
    outcomes = [success(r) for r in result.records]
    out["valid_rate"] = float(np.mean([o["valid"] for o in outcomes]))
    valid = [o for o in outcomes if o["valid"]]
    for key in SUCCESS[1:]:
        out[f"{key}_rate"] = float(np.mean([o[key] for o in valid])) if valid else float("nan")
    return out


class SumsExperiment(Experiment[SumRecord, SumsResult]):
    name = "sums"
    help = "Word problems adding two numbers, one number's duration scaled by a factor; the answer read digit by digit."
    explorer_text = (
        "Each item is a word problem adding two numbers a and b; the slider is the duration factor c of a's tokens. "
        "The bars are the probabilities of the answer's first digit; below the curves, its expected value."
    )
    description = (
        "Each item is a word problem adding two numbers (32 built-in problems with two-digit numbers, ids sum-001 ...); "
        "the tokens of one number, wherever the prompt fills it in, have their duration scaled by c. The first digit "
        "of the answer is read out over the digits 0-9 and the whole number through one greedy step per digit. "
        "Reports the implied sum against the line a·c + b through the true sum. --data FILE reads the problems "
        "from a JSON, JSONL or CSV file instead."
    )
    Config = SumsConfig
    options = SumsConfig.command_options(schema=DATA_SCHEMA)
    engine = shardable = True
    unit = "problem"
    result_type = SumsResult
    explorer = True
    study = Study("sums", "mean_spearman", ("successful_rate", "valid_rate"), sums_finding, optional=True)
    metrics = Metric.table(
        """
        accuracy_at_1               higher  share of problems whose greedy answer at factor 1 is the true sum
        mean_spearman               higher  Spearman correlation of the implied sum with the factor, mean over problems
        mean_mae_line               lower   mean |implied sum - (a·c + b)| over the factors, mean over problems
        valid_rate                  higher  share of problems whose first digit at factor 1 is the true sum's, beating the shrunk outputs' sum and each other output
        successful_rate             higher  share of valid problems where the shrunk outputs' summed probability beats the true first digit at some factor
        strongly_successful_rate    higher  share of valid problems where the shrunk outputs beat the true first digit and every other output at some factor
        completely_successful_rate  higher  share of valid problems strongly successful where no other output beats the shrunk outputs wherever they beat the true digit
        """
    )

    def items(self, config: SumsConfig) -> Sequence[SumItem]:
        return load_sums() if config.data is None else read_sums(config.data)

    def plan_item(self, lm: Any, item: SumItem, config: SumsConfig) -> SweepPlan:
        """The problem's first digit as a sweep (:func:`plan_item`)."""
        return plan_item(lm, item, config)

    def run_item(self, lm: Any, config: SumsConfig, item: SumItem, context: RunContext) -> SumRecord:
        return run_item(lm, item, config, context.evaluate)

    def explorer_probs(self, record: dict[str, Any]) -> Any:
        """The first answer digit's distribution at each factor (zeros where the model gave no answer)."""
        steps, labels = record.get("steps"), record.get("labels")
        if not steps or not isinstance(labels, list):
            return None
        return [row if row is not None else [0.0] * len(labels) for row in steps[0]]

    def tables(self, result: SumsResult) -> dict[str, Table]:
        def per_factor() -> Iterator[dict[str, Any]]:
            for r in result.records:
                for i, (c, implied, line) in enumerate(zip(r.x, r.implied(), r.line())):
                    yield {
                        "item": r.item_id,
                        "factor": float(c),
                        "answer": r.answers[i],
                        "implied": float(implied),
                        "line": float(line),
                        "truth": r.truth,
                    }

        def per_digit() -> Iterator[dict[str, Any]]:
            for r in result.records:
                for k, c, row in ((k, c, row) for k, step in enumerate(r.steps) for c, row in zip(r.x, step) if row):
                    yield from (
                        {"item": r.item_id, "factor": float(c), "step": k + 1, "label": label, "probability": p}
                        for label, p in zip(r.labels, row)
                    )

        per_item = [{"item": r.item_id, "truth": r.truth, "scaled": r.scaled, **measures(r)} for r in result.records]
        return {
            "results": (["item", "factor", "answer", "implied", "line", "truth"], per_factor()),
            "digits": (["item", "factor", "step", "label", "probability"], per_digit()),
            "items": (["item", "truth", "scaled", *MEASURES], per_item),
        }

    def summary(self, result: SumsResult) -> dict[str, Any]:
        """Accuracy at c = 1, the per-problem :func:`measures` averaged over problems (``mean_``), the median slope ratio,
        the paper's outcome rates (:func:`success`); with the paper's coverage where recorded."""
        return with_paper_coverage(result, sums_summary)

    def report_columns(self, result: SumsResult) -> dict[str, Any]:
        x, _ = result.common() if result.records else (np.array([np.nan]), [])
        return {"factor_min": float(x.min()), "factor_max": float(x.max()), "samples": len(x)}

    def summary_figure(self, result: SumsResult) -> Any:
        from contllm.experiments import sums_figures

        return sums_figures.summary_figure(result, [success(r) for r in result.records], SUCCESS)

    def item_figure(self, result: SumsResult, record: SumRecord) -> Any:
        from contllm.experiments import sums_figures

        return sums_figures.item_figure(result, record)

    def comparison(self, results: Sequence[tuple[str, SumsResult]]) -> Any:
        from contllm.experiments import sums_figures

        return sums_figures.comparison_figure(results)


EXPERIMENT = SumsExperiment()
