"""Counting interpolation: inside a counting question, some occurrences of a word move in embedding space to another word.

The question asks how many times a thing of one category is mentioned in a sentence of n
words ("apple apple apple apple", a fruit). At alpha = 0 every word is the first word;
at alpha = 1 the last ``moved`` occurrences have become the other word ("apple cash cash
cash"), so the right count falls from n to n - moved when the other word is not of the
category (and stays n when it is: apple to pear). The moved occurrences are interpolated
as one span, aligned in time when the two words tokenize differently; the digits 0-9 are
read out. This follows the settings of the paper's ``embedding_interpolation_counting``
that its code comments out; ``--protocol paper`` runs its active one: "apple apple apple
apple" moved whole into "pear pear pear pear" under the question "How many apples appear
...", by slerp over 100 alphas, the digits 0-4 and "other digits" read out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from contllm import metrics
from contllm.core.readout import TokenSets, digits, paper_digits
from contllm.core.signal import Signal
from contllm.errors import ExperimentError
from contllm.experiments.base import Metric, option_table
from contllm.experiments.counting import QUESTION_TEMPLATE
from contllm.experiments.interpolations import AlphaSweepExperiment, alpha_options, end_accuracy, interpolation_plan
from contllm.experiments.prompts import check_template, render
from contllm.experiments.protocol import PROTOCOL, resolve_defaults, resolved_samples
from contllm.experiments.sweeps import (
    ExperimentResult,
    Sweep,
    SweepPlan,
    check_alpha_sweep,
    summary_start,
    sweep_values,
)
from contllm.wording import mean_finding

#: (word, other word, the category asked about with its article, whether the other word is of it too).
#: The first three are the paper's; apple to pear keeps the count.
PAIRS = (
    ("apple", "cash", "a fruit", False),
    ("cat", "rock", "an animal", False),
    ("rose", "plane", "a flower", False),
    ("apple", "pear", "a fruit", True),
)


@dataclass(frozen=True)
class PairItem:
    """One sweep: ``n`` words, the last ``moved`` going from ``word`` to ``other``; ``same``: other is of the category too."""

    id: str
    word: str
    other: str
    article: str
    same: bool
    n: int
    moved: int

    @property
    def counts(self) -> tuple[int, int]:
        """The right count at alpha 0 and at alpha 1."""
        return self.n, self.n if self.same else self.n - self.moved


#: The paper's active setting: its question asks for apples, which pear is not, so the count falls from 4 to 0.
PAPER_PAIRS = (("apple", "pear", "a fruit", False),)

#: The paper's question ({word} is the first word, asked for in the plural).
PAPER_TEMPLATE = (
    'Question: How many {word}s appear in the sentence "{words}"? Reply with a single-digit number, '
    "including 0 if there are none.\nAnswer: "
)

#: The paper's read-out: the digits 0-4, and the other digits together.
PAPER_LABELS: dict[str, tuple[str, ...]] = {
    **{str(k): (str(k),) for k in range(5)},
    "other digits": tuple(str(k) for k in range(5, 10)),
}

#: Values of alpha per item: the toolkit's default and the paper's.
SAMPLES, PAPER_SAMPLES = 21, 100


@dataclass
class CountingInterpolationConfig:
    """Options of the counting interpolation.

    n: words in the sentence (2-9); moved: how many of the last occurrences move (1..n;
        None: n - 1, or all n under the paper's protocol). template: the question, with
        {words} and optionally {article} and {word}; None: the paper's counting question, or
        under its protocol the question of its active setting (:data:`PAPER_TEMPLATE`).
    method: linear or slerp; None: linear, or slerp under the paper's protocol.
    low, high, samples: the values of alpha (within [0, 1]; samples None: 21, or 100 under
        the paper's protocol).
    protocol: "paper" runs the paper's active setting (:data:`PAPER_PAIRS`, its question,
        slerp, 100 alphas, the read-out :data:`PAPER_LABELS` as the paper's sets).
    """

    BY_PROTOCOL: ClassVar[dict[str, tuple[Any, Any]]] = {"method": ("linear", "slerp")}

    n: int = 4
    moved: int | None = None
    template: str | None = None
    method: str | None = None
    low: float = 0.0
    high: float = 1.0
    samples: int | None = None
    protocol: str = "contllm"

    def __post_init__(self) -> None:
        self.samples = resolved_samples(self.samples, self.protocol, SAMPLES, PAPER_SAMPLES)
        resolve_defaults(self, self.BY_PROTOCOL)
        if isinstance(self.n, bool) or not 2 <= self.n <= 9:
            raise ExperimentError(f"n must be from 2 to 9 (a digit is read out), got {self.n!r}")
        if self.moved is None:
            self.moved = self.n if self.paper else self.n - 1
        if not 1 <= self.moved <= self.n:
            raise ExperimentError(f"moved must be from 1 to n = {self.n}, got {self.moved}")
        check_alpha_sweep(self.low, self.high, self.samples, str(self.method))
        check_template(self.resolved_template(), ("words", "article", "word"), required=("words",))

    @property
    def paper(self) -> bool:
        return self.protocol == "paper"

    def resolved_template(self) -> str:
        if self.template is not None:
            return self.template
        return PAPER_TEMPLATE if self.paper else QUESTION_TEMPLATE

    def readout(self, tokenizer: Any) -> TokenSets:
        """The digits 0-9 (exact tokens), or the paper's sets of :data:`PAPER_LABELS` under its protocol."""
        return paper_digits(tokenizer, dict(PAPER_LABELS)) if self.paper else digits(tokenizer)


def pair_items(config: CountingInterpolationConfig) -> list[PairItem]:
    """One item per pair of :data:`PAIRS` (or :data:`PAPER_PAIRS` under the paper's protocol), with ``config``'s n
    and moved."""
    assert config.moved is not None
    return [
        PairItem(f"{word}-{other}", word, other, article, same, config.n, config.moved)
        for word, other, article, same in (PAPER_PAIRS if config.paper else PAIRS)
    ]


def plan_item(lm: Any, item: PairItem, config: CountingInterpolationConfig) -> SweepPlan:
    """The sweep of one pair: the moved occurrences interpolated as one span over alpha; digits read out."""
    ends = []
    kept = item.n - item.moved
    for last in (item.word, item.other):
        rendered = render(
            config.resolved_template(),
            {"words": [item.word] * kept + [last] * item.moved, "article": item.article, "word": item.word},
            required=("words",),
        )
        spans = rendered.spans["words"][kept:]
        signal = Signal.from_text(lm.tokenizer, rendered.text).embedded(lm.model.get_input_embeddings())
        ends.append((signal, (spans[0][0], spans[-1][1])))
    alphas = sweep_values(config.low, config.high, config.samples, include=None)
    first, second = item.counts
    meta = {
        "word": item.word,
        "other": item.other,
        "article": item.article,
        "n": item.n,
        "moved": item.moved,
        "count_first": first,
        "count_second": second,
        # the true count at each end (the results table's truth column there)
        "truth_first": str(first),
        "truth_second": str(second),
        "method": config.method,
    }
    pair = (*ends[0], *ends[1])
    sets = config.readout(lm.tokenizer)
    return interpolation_plan(lm, item.id, pair, alphas, str(config.method), sets, meta)


def other_tokens(sweep: Sweep) -> np.ndarray:
    """The probability [S] of every token outside the read-out (1 - the labels' total)."""
    return np.clip(1.0 - sweep.probs.sum(axis=1), 0.0, 1.0)


def summarize(result: ExperimentResult) -> dict[str, Any]:
    """The headline numbers of a counting-interpolation result (:attr:`CountingInterpolationExperiment.metrics`):
    accuracy at both ends, the implied count's rank correlation with alpha, the variation of the digit curves."""
    sweeps, out = summary_start(result)
    out.update(
        end_accuracy(sweeps, ("count_first", "count_second"), lambda s, p, n: s.labels[int(np.argmax(p))] == str(n))
    )
    falling = [s for s in sweeps if s.meta["count_second"] != s.meta["count_first"] and len(s.x) > 1]
    rhos = [metrics.spearman(s.x, s.implied_value()) for s in falling]
    out["mean_spearman_implied_vs_alpha"] = float(np.nanmean(rhos)) if rhos else float("nan")
    out["mean_variation"] = float(np.mean([metrics.range_excursion(s.probs) for s in sweeps]))
    out["mean_other_tokens"] = float(np.mean([other_tokens(s).mean() for s in sweeps]))
    return out


class CountingInterpolationExperiment(AlphaSweepExperiment):
    name = "counting-interpolation"
    help = "Inside a counting question, words moved in embedding space into another word; digits read out."
    explorer_text = (
        "Each item is a counting question over n words, the last of which move in embedding space into another word "
        "as the slider's alpha goes from 0 to 1 (at the far end the prompt shown is the second one). The bars are "
        "each digit's probability, the true count green at each end; below the curves, the predicted count E[k] "
        "with the true counts ringed."
    )
    description = (
        'The paper\'s counting question over n words ("apple apple apple apple", how many times is a fruit '
        "mentioned?) with the last --moved occurrences interpolated into another word (cash, or pear, which is "
        "a fruit too); the digits 0-9 are read out along alpha. Item ids look like apple-cash."
    )
    Config = CountingInterpolationConfig
    options = (
        *alpha_options(21, chat=False),
        *option_table(
            """
            n      int  Words in the sentence (2-9). [default: 4]
            moved  int  How many of the last occurrences move into the other word. [default: n - 1; n under --protocol paper]
            """
        ),
        PROTOCOL,
    )
    metrics = Metric.table(
        """
        accuracy_at_alpha_0             higher  share of pairs whose most probable digit at alpha 0 is n
        accuracy_at_alpha_1             higher  share of pairs whose most probable digit at alpha 1 is the count left
        mean_spearman_implied_vs_alpha  lower   Spearman correlation of the implied count with alpha over the pairs whose count falls (-1: falls steadily)
        mean_variation                  lower   largest excursion of a digit's probability beyond its ends' range, mean
        """
    )
    counts = True

    make_items = staticmethod(pair_items)
    make_plan = staticmethod(plan_item)
    summarize = staticmethod(summarize)

    label = "{word} -> {other} ({moved} of {n} moved; count {count_first} -> {count_second})"

    def summary_figure(self, result: ExperimentResult) -> Any:
        return summary_figure(result)


def counting_interpolation_finding(sweeps: Sequence[Sweep]) -> tuple[str, str]:
    """The sentence a counting-interpolation summary opens with, and the number behind it: over the pairs whose true
    count changes, how far the predicted count moves from alpha 0 to 1 as a share of that change (mean); 0.5 or more
    reads as "moves toward the new count", 0.2 or more as "a little", less as "hardly moves"."""
    shares = []
    for s in sweeps:
        start, end = s.meta.get("count_first"), s.meta.get("count_second")
        if isinstance(start, int) and isinstance(end, int) and start != end and len(s.x) > 1:
            implied = s.implied_value()
            shares.append((implied[int(np.argmax(s.x))] - implied[int(np.argmin(s.x))]) / (end - start))
    return mean_finding("count_moves")(shares)


def summary_figure(result: ExperimentResult) -> Any:
    """First, the finding: the predicted count E[k] against alpha per pair, beside the straight line between the true
    counts at the ends (ringed); then one panel per pair in the paper's style: each digit's probability against alpha,
    and the tokens outside the digits."""
    from contllm.experiments.figures import finding_layout
    from contllm.plotting import finding, heading, legend_outside, plt

    sweeps = result.sweeps
    fig, first, rest = finding_layout(len(sweeps))
    colors = plt.get_cmap("tab10")
    for k, s in enumerate(sweeps):
        start, end = s.meta.get("count_first"), s.meta.get("count_second")
        color = colors(k % 10)
        first.plot(
            s.x,
            s.implied_value(),
            "-",
            color=color,
            lw=2,
            label=f"{s.meta.get('word')} → {s.meta.get('other')}: {start} → {end}",
        )
        if isinstance(start, int) and isinstance(end, int):
            first.plot([0, 1], [start, end], ":", color=color, lw=1.2)
            first.plot([0, 1], [start, end], "o", ms=9, mfc="none", mec=color, mew=1.8, clip_on=False)
    first.plot([], [], "o", ms=9, mfc="none", mec="0.3", mew=1.8, label="ringed: the true count at each end")
    finding(first, *counting_interpolation_finding(sweeps))
    first.set(xlabel="alpha: the words as written (0) → turned into the other word (1)", ylabel="predicted count E[k]")
    first.set_ylim(bottom=0)
    first.grid(alpha=0.3)
    legend_outside(first, title="pair: true count at the ends")
    for ax, s in zip(rest, sweeps):
        wanted = {str(s.meta.get("count_first")), str(s.meta.get("count_second"))}
        for j, label in enumerate(s.labels):
            ax.plot(s.x, s.probs[:, j], "-", lw=2.6 if label in wanted else 1.0, color=colors(j % 10))
        ax.plot(s.x, other_tokens(s), "--", color="0.3", lw=1.6)
        ax.set(xlabel=f"alpha ({s.meta.get('word')} → {s.meta.get('other')})", ylabel="probability", ylim=(-0.02, 1.02))
        ax.set_title(
            f"{s.item_id}: true count {s.meta.get('count_first')} → {s.meta.get('count_second')} (bold)",
            loc="left",
            fontsize=9,
        )
        ax.grid(alpha=0.3)
    labels = list(dict.fromkeys(label for s in sweeps for label in s.labels))
    handles = [plt.Line2D([], [], color=colors(j % 10), lw=1.6) for j in range(len(labels))]
    handles.append(plt.Line2D([], [], color="0.3", ls="--", lw=1.6))
    rest[0].get_figure(root=False).legend(
        handles, [*labels, "other tokens"], loc="outside right upper", title="digit", fontsize=8, frameon=False
    )
    heading(fig, result.model, "counting interpolation", len(sweeps), "pairs")
    return fig


EXPERIMENT = CountingInterpolationExperiment()
