"""Word interpolation on yes/no questions: "Are {} yellow?" with the word moved from apples to bananas.

Each item is a pair of words (plural nouns) and a question with one ``{}`` for the word.
The word's embedding goes from the first word (alpha = 0) to the second (alpha = 1),
linearly or by slerp, over the word's tokens (aligned in time when the two words
tokenize into different numbers of tokens, as in :mod:`contllm.core.interpolate`); P(yes)
and P(no) are read out over every casing, with and without a leading space.

Questions are grouped by the words they are true for: *both*, *neither*, *first* only
or *second* only. A model whose answer follows the embedding should keep its answer on
*both*/*neither* questions and cross over from yes to no (*first*) or no to yes
(*second*) somewhere between the two words.

Datasets (``--data FILE``, or the built-in ``contllm/data/interpolation.json``) hold
either rows of this module's own schema (``first``, ``second``, ``question`` and
``group`` or ``answer_first``/``answer_second``) or rows of the paper's embedding-question
shape (``options`` [A, B] and ``questions``: a list, answers unknown, or an object of
``both``/``neither``/``first``/``second`` lists). Words are located by character span.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

import numpy as np

from contllm.audits.studies import Study, interpolation_finding
from contllm.core.readout import PAPER_YES_NO, TokenSets, containing
from contllm.core.signal import Signal
from contllm.data.user import DataFileOption, Row, data_option_help, read_rows, unique_ids
from contllm.errors import ExperimentError
from contllm.experiments import answers
from contllm.experiments.answers import ANSWERS, GROUPS, VARIATION_LEVEL, lipschitz_breakdown, variation, yes_share
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

#: Eight answered questions about other things (four yes, four no), then the item's
#: question. How well small models tell yes from no with this and other formats is
#: measured in the README ("A word moved into another").
SHOTS = (
    ("Are tigers animals?", "Yes"),
    ("Can rocks swim?", "No"),
    ("Do ducks have feathers?", "Yes"),
    ("Are clouds made of stone?", "No"),
    ("Are grapes fruit?", "Yes"),
    ("Do lions lay eggs?", "No"),
    ("Can turtles fly?", "No"),
    ("Can horses run?", "Yes"),
)
DEFAULT_TEMPLATE = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in SHOTS) + "Question: {question}\nAnswer:"
CHAT_TEMPLATE = "{question} Answer with Yes or No."
#: The paper's prompt (its protocol): the question alone, with a "(yes/no)" hint.
PAPER_TEMPLATE = "Question: {question} (yes/no)\nAnswer:"
#: Values of alpha per item: the toolkit's default and the paper's script's.
SAMPLES, PAPER_SAMPLES = 11, 40
#: The templates and their fields (see :class:`~contllm.experiments.sweeps.SweepConfig`).
PROMPTS = (DEFAULT_TEMPLATE, CHAT_TEMPLATE, ("question",), ("question",))

#: The read-out: every casing of yes and no (each also with a leading space).
YES_NO_SPELLINGS: dict[str, Sequence[str]] = {"yes": ["yes", "Yes", "YES"], "no": ["no", "No", "NO"]}

DATA_SCHEMA = (
    "first, second (the words), question (with {} for the word), group (both|neither|first|second) "
    "or answer_first/answer_second (true|false), optional id; or the paper's shape: options [A, B] and "
    "questions (a list, answers unknown, or an object of both/neither/first/second lists)"
)


def yes_no(tokenizer: Any) -> TokenSets:
    """Token sets of yes and no (every casing, with or without a leading space)."""
    return TokenSets.build(tokenizer, YES_NO_SPELLINGS)


@dataclass(frozen=True)
class WordItem:
    """One sweep: ``question`` (with ``{}``) asked of ``first`` (alpha 0) moved into ``second`` (alpha 1).

    group: both/neither/first/second, or None when the answers are unknown.
    """

    id: str
    first: str
    second: str
    question: str
    group: str | None = None

    @property
    def pair(self) -> str:
        return f"{slug(self.first)}-{slug(self.second)}"

    @property
    def answers(self) -> tuple[bool, bool] | None:
        """(answer for the first word, answer for the second), or None when unknown."""
        return None if self.group is None else ANSWERS[self.group]


STOP_WORDS = frozenset(
    "a an the are is do does did can could will would be have has of on in at to with and or for by "
    "as from their your you they people it its".split()
)


def slug(text: str, *, keep_stop_words: bool = True) -> str:
    """Lower-case words of ``text`` joined by '-' (``{}`` and punctuation dropped)."""
    words = re.findall(r"[a-z0-9]+", text.replace("{}", " ").lower())
    if not keep_stop_words:
        words = [w for w in words if w not in STOP_WORDS] or words
    return "-".join(words) or "w"  # a word of no Latin letters or digits still gets an id


def question_slug(question: str) -> str:
    """A short readable name for a question: its content words, at most three ("Are {} yellow?" -> "yellow")."""
    words = slug(question, keep_stop_words=False).split("-")
    return "-".join(words[:3]) or "q"


def _check_question(text: str) -> str | None:
    if text.count("{}") != 1:
        return "must hold exactly one {} (where the word goes)"
    if "{" in text.replace("{}", "") or "}" in text.replace("{}", ""):
        return "may hold no braces besides the one {}"
    return None


def _word(row: Row, value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise row.error("must be a non-empty word", field)
    if "{" in value or "}" in value:
        raise row.error("may not hold braces", field)
    if value != value.strip():
        raise row.error("may not start or end with a space", field)
    return value


def _item(row: Row, first: str, second: str, question: str, group: str | None, id_: str | None = None) -> WordItem:
    name = id_ or f"{slug(first)}-{slug(second)}-{question_slug(question)}"
    return WordItem(name, first, second, question, group)


def items_from_rows(rows: Sequence[Row]) -> list[WordItem]:
    """Items from dataset rows of either shape (see the module docstring); ExperimentError naming file, row and field."""
    from contllm.data.paper import refuse_material

    refuse_material(rows)
    items: list[WordItem] = []
    for row in rows:
        row = _top_level_groups(row)
        if row.has("options"):
            options = row.strings("options")
            if len(options) != 2:
                raise row.error(f"must list exactly two words [A, B], got {len(options)}", "options")
            first, second = (_word(row, w, "options") for w in options)
            if first == second:
                raise row.error("the two words must differ", "options")
            questions = row.get("questions", (list, dict))
            if isinstance(questions, list):
                if not questions or not all(isinstance(q, str) for q in questions):
                    raise row.error("must be a non-empty list of strings or an object of lists", "questions")
                grouped: list[tuple[str | None, list[str]]] = [(None, questions)]
            else:
                if "one" in questions:
                    raise row.error(
                        "holds the paper's unsplit groups both/one/neither (embedding_raw.json): 'one' does "
                        "not say which word the answer is yes for; give embedding_split.json or "
                        "embedding_filtered.json",
                        "questions",
                    )
                unknown = sorted(set(questions) - set(GROUPS))
                if unknown:
                    raise row.error(
                        f"unknown group(s) {', '.join(unknown)}; groups are {', '.join(GROUPS)}", "questions"
                    )
                grouped = []
                for group in GROUPS:
                    qs = questions.get(group, [])
                    if isinstance(qs, str):  # embedding_filtered.json: one question per group
                        qs = [qs]
                    if not isinstance(qs, list) or not all(isinstance(q, str) for q in qs):
                        raise row.error(f"group {group!r} must be a list of strings", "questions")
                    grouped.append((group, qs))
                if not any(qs for _, qs in grouped):
                    raise row.error("holds no questions", "questions")
            for answered, qs in grouped:
                for q in qs:
                    problem = _check_question(q)
                    if problem:
                        raise row.error(f"question {q!r} {problem}", "questions")
                    items.append(_item(row, first, second, q, answered))
        else:
            first = _word(row, row.get("first"), "first")
            second = _word(row, row.get("second"), "second")
            if first == second:
                raise row.error("the two words must differ", "second")
            question = row.get("question", check=_check_question)
            if row.has("group"):
                group = row.get("group", check=lambda g: None if g in GROUPS else f"must be one of {', '.join(GROUPS)}")
            elif row.has("answer_first") or row.has("answer_second"):
                group = {v: k for k, v in ANSWERS.items()}[
                    (row.get("answer_first", bool), row.get("answer_second", bool))
                ]
            else:
                group = None
            items.append(_item(row, first, second, question, group, row.get("id", str, None)))
    return _numbered(items, rows[0].path if rows else "dataset")


#: embedding_raw_split.json spells one group "fist".
_GROUP_SPELLINGS = {**{g: g for g in GROUPS}, "fist": "first"}


def _top_level_groups(row: Row) -> Row:
    """A row whose question groups stand at its top level (embedding_raw_split.json) as one with a "questions" object."""
    groups = [name for name in _GROUP_SPELLINGS if name in row.fields]
    if row.has("questions") or not row.has("options") or not groups:
        return row
    fields = {k: v for k, v in row.fields.items() if k not in groups}
    fields["questions"] = {_GROUP_SPELLINGS[name]: row.fields[name] for name in groups}
    return Row(row.path, row.number, fields, row.csv)


def _numbered(items: list[WordItem], path: str) -> list[WordItem]:
    """Derived ids made unique by a suffix (-2, -3, ...); ids given in the file must be unique already."""
    seen: dict[str, int] = {}
    out = []
    for item in items:
        count = seen.get(item.id, 0) + 1
        seen[item.id] = count
        out.append(
            item if count == 1 else WordItem(f"{item.id}-{count}", item.first, item.second, item.question, item.group)
        )
    return unique_ids(out, path)


def load_items(path: str | None = None) -> list[WordItem]:
    """The items of a dataset file (``path``), or of the built-in dataset (None)."""
    if path is not None:
        return items_from_rows(read_rows(path))
    with resources.as_file(resources.files("contllm.data").joinpath("interpolation.json")) as builtin:
        return items_from_rows(read_rows(builtin))


@dataclass
class InterpolationConfig(AlphaSweepConfig, DataFileOption, prompts=PROMPTS, paper=PAPER_TEMPLATE):
    """Options of the word-interpolation experiment.

    template: prompt with a {question} field (the item's question with the word filled in);
        None picks the default (or the chat default with chat).
    method: "linear" or "slerp" interpolation of the word's embeddings.
    low, high, samples: the values of alpha (within [0, 1]).
    pairs: word pairs to keep (names like apples-bananas; None: all).
    data: a dataset file instead of the built-in one (its sha256 is kept in data_sha256).
    chat: use the chat template.
    """

    SAMPLES: ClassVar[int] = SAMPLES
    PAPER_SAMPLES: ClassVar[int] = PAPER_SAMPLES

    pairs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pairs is not None:
            self.pairs = tuple(self.pairs)
        self.read_data(load_items)  # a malformed file is refused here, before a model loads

    def readout(self, tokenizer: Any) -> TokenSets:
        """yes and no: exact spellings, or the paper's every token containing them (``protocol`` "paper")."""
        return containing(tokenizer, PAPER_YES_NO) if self.protocol == "paper" else yes_no(tokenizer)


def word_items(config: InterpolationConfig) -> list[WordItem]:
    """The items of ``config``'s dataset, narrowed to ``config.pairs``; ExperimentError for an unknown pair."""
    items = load_items(config.data)
    if config.pairs is None:
        return items
    known = list(dict.fromkeys(item.pair for item in items))
    wanted = [slug(p) for p in config.pairs]
    unknown = [p for p in wanted if p not in known]
    if unknown:
        raise ExperimentError(
            f"--pairs: unknown pair(s) {', '.join(unknown)}; pairs look like {', '.join(known[:3])}, ... ({len(known)} pairs)"
        )
    return [item for item in items if item.pair in wanted]


def render_word(lm: Any, item: WordItem, word: str, config: InterpolationConfig) -> Rendered:
    """The prompt asking ``item.question`` of ``word``, with the word's span under "word"."""
    if config.chat:
        rendered = render(item.question.replace("{}", "{word}"), {"word": word}, required=("word",))
        outer = render(config.resolved_template(), {"question": rendered.text}, required=("question",))
        offset = outer.spans["question"][0][0]
        rendered = Rendered(outer.text, {"word": [(a + offset, b + offset) for a, b in rendered.spans["word"]]})
        return apply_chat(lm.tokenizer, rendered)
    full = config.resolved_template().replace("{question}", item.question.replace("{}", "{word}"))
    return render(full, {"word": word}, required=("word",))


def ends(
    lm: Any, item: WordItem, config: InterpolationConfig, *, embed: bool = True
) -> tuple[Signal, Any, Signal, Any]:
    """The two plain prompts (embedded unless ``embed`` is false) and the word's span in each."""
    out: list[Any] = []
    for word in (item.first, item.second):
        rendered = render_word(lm, item, word, config)
        signal = Signal.from_text(lm.tokenizer, rendered.text, add_special_tokens=not config.chat)
        if embed:
            signal = signal.embedded(lm.model.get_input_embeddings())
        out += [signal, rendered.spans["word"][0]]
    return tuple(out)  # type: ignore[return-value]


def check_item(lm: Any, item: WordItem, config: InterpolationConfig) -> None:
    """ExperimentError unless the two prompts hold the same tokens outside the word (as interpolation needs)."""
    sa, span_a, sb, span_b = ends(lm, item, config, embed=False)
    ia, ib = sa.token_indices(span_a), sb.token_indices(span_b)
    assert sa.token_ids is not None and sb.token_ids is not None
    before = sa.token_ids[: ia[0]].tolist() == sb.token_ids[: ib[0]].tolist()
    after = sa.token_ids[ia[-1] + 1 :].tolist() == sb.token_ids[ib[-1] + 1 :].tolist()
    if not (before and after):
        raise ExperimentError(
            f"item {item.id}: the tokenizer splits the text around {item.first!r} and {item.second!r} differently, "
            "so the word cannot be interpolated alone; reword the question"
        )


def plan_item(lm: Any, item: WordItem, config: InterpolationConfig) -> SweepPlan:
    """The sweep of one item: the word's span interpolated over alpha; yes/no read out."""
    pair = ends(lm, item, config)
    sa, span_a, sb, span_b = pair
    answers = item.answers
    meta = {
        "first": item.first,
        "second": item.second,
        "question": item.question,
        "group": item.group,
        "answer_first": None if answers is None else answers[0],
        "answer_second": None if answers is None else answers[1],
        # the true label at each end (the results table's truth column there)
        "truth_first": None if answers is None else ("yes" if answers[0] else "no"),
        "truth_second": None if answers is None else ("yes" if answers[1] else "no"),
        "method": config.method,
        "tokens_first": len(sa.token_indices(span_a)),
        "tokens_second": len(sb.token_indices(span_b)),
    }
    return interpolation_plan(lm, item.id, pair, config.alphas(), config.method, config.readout(lm.tokenizer), meta)


# ------------------------------------------------------------------------------ numbers


def crossing(x: np.ndarray, share: np.ndarray) -> float | None:
    """The first alpha where ``share`` crosses 0.5 (linear between samples), or None when it stays on one side."""
    side = share > 0.5
    for k in range(1, len(x)):
        if side[k] != side[k - 1]:
            lo, hi = share[k - 1] - 0.5, share[k] - 0.5
            return float(x[k - 1] + (x[k] - x[k - 1]) * lo / (lo - hi))
    return None


def crossed_over(sweep: Sweep) -> bool | None:
    """For a first/second question: whether the answer moves from the first word's to the second's.

    "first": yes (share > 0.5) at the sweep's start and no at its end; "second": the
    reverse. None for other groups.
    """
    group = sweep.meta.get("group")
    if group not in ("first", "second"):
        return None
    share = yes_share(sweep)
    start, end = share[0] > 0.5, share[-1] > 0.5
    return (start and not end) if group == "first" else (end and not start)


def summarize_sweeps(sweeps: Sequence[Sweep]) -> dict[str, Any]:
    """Accuracy at both ends, crossover share and mean crossing alpha, flips and smoothness."""
    from contllm import metrics

    out: dict[str, Any] = {}
    known = [s for s in sweeps if s.meta.get("group") is not None]

    def correct(s: Sweep, p: np.ndarray, answer: Any) -> bool:
        return bool(p[s.labels.index("yes")] > p[s.labels.index("no")]) == bool(answer)

    out.update(end_accuracy(known, ("answer_first", "answer_second"), correct))
    if known:
        yes_answers = [yes_share(s)[0] for s in known if s.meta["answer_first"]] + [
            yes_share(s)[-1] for s in known if s.meta["answer_second"]
        ]
        no_answers = [yes_share(s)[0] for s in known if not s.meta["answer_first"]] + [
            yes_share(s)[-1] for s in known if not s.meta["answer_second"]
        ]
        if yes_answers and no_answers:
            out["mean_yes_share_when_yes"] = float(np.nanmean(yes_answers))
            out["mean_yes_share_when_no"] = float(np.nanmean(no_answers))
    switching = [s for s in sweeps if s.meta.get("group") in ("first", "second")]
    out["first_second_items"] = len(switching)
    if switching:
        crossed = [s for s in switching if crossed_over(s)]
        out["crossover_share"] = len(crossed) / len(switching)
        points = [p for p in (crossing(s.x, yes_share(s)) for s in crossed) if p is not None]
        out["mean_crossing_alpha"] = float(np.mean(points)) if points else float("nan")
    flips = [s for s in sweeps if (yes_share(s)[0] > 0.5) != (yes_share(s)[-1] > 0.5)]
    out["flip_share"] = len(flips) / len(sweeps)
    shapes = [metrics.smoothness(s.x, yes_share(s)) for s in sweeps if len(s.x) > 1 and np.isfinite(yes_share(s)).all()]
    if shapes:
        out["mean_total_variation_yes_share"] = float(np.mean([m.total_variation for m in shapes]))
        out["mean_max_jump_yes_share"] = float(np.mean([m.max_jump for m in shapes]))
    variations = [variation(s) for s in sweeps]
    out["mean_variation"] = float(np.mean(variations))
    out["variation_share"] = float(np.mean([v >= VARIATION_LEVEL for v in variations]))
    out.update(lipschitz_breakdown(sweeps))
    return out


def interpolation_summary(result: ExperimentResult) -> dict[str, Any]:
    """The headline numbers of a word-interpolation result (:attr:`InterpolationExperiment.metrics`):
    :func:`summarize_sweeps` over its sweeps."""
    sweeps, out = summary_start(result)
    return {**out, **summarize_sweeps(sweeps)}


class InterpolationExperiment(AlphaSweepExperiment):
    name = "interpolation"
    help = "A word's embedding moved into another's inside a yes/no question; P(yes) and P(no) read out."
    explorer_text = (
        'Each item is a yes/no question about a word ("Are apples yellow?"). The slider is alpha: the word\'s '
        "embedding moves from the first word (alpha = 0) into the second (alpha = 1), so the prompt at the slider's "
        "far end is the second word's. The bars are P(yes) and P(no), the true answer green at each end (between "
        "them a blend of two words has none); below the curves, P(yes) / (P(yes) + P(no)) with the true answers "
        "ringed."
    )
    description = (
        'Each item asks a yes/no question of a word ("Are {} yellow?") whose embedding moves from the first '
        "word of a pair (alpha 0, e.g. apples) to the second (alpha 1, bananas), linearly or by slerp, aligned "
        "in time when the words have different token counts; yes and no (every casing) are read out. Questions "
        "are grouped both/neither/first/second by the words they are true for. --template takes a {question} "
        "field (the question with the word in it). Item ids look like "
        "apples-bananas-yellow (22 pairs x 8 questions built in)."
    )
    Config = InterpolationConfig
    options = (
        *alpha_options(11),
        Option(
            "pairs", "words", "Comma-separated word pairs to keep, e.g. apples-bananas,cats-goldfish. [default: all]"
        ),
        Option("data", "str", data_option_help(DATA_SCHEMA)),
        PROTOCOL,
    )
    study = Study(
        "interpolation",
        "mean_max_jump_yes_share",
        ("mean_lipschitz", "variation_share"),
        interpolation_finding,
        spread=True,
    )
    metrics = Metric.table(
        """
        accuracy_at_alpha_0      higher  yes/no accuracy (argmax of yes vs no) against the first word's answer
        accuracy_at_alpha_1      higher  the same against the second word's answer, at alpha 1
        mean_max_jump_yes_share  lower   largest change of the yes-share between neighbouring alphas, mean
        variation_share          lower   share of items whose P(yes) or P(no) leaves its ends' range by 0.05 or more
        mean_variation           lower   largest excursion of P(yes) or P(no) beyond its ends' range, mean over items
        mean_lipschitz           lower   the paper's Lipschitz estimate: largest |dP/dalpha| (finite differences) over the curve's range, per item and answer, mean
        mean_lipschitz_neither   lower   mean_lipschitz over the questions true for neither word
        mean_lipschitz_one       lower   mean_lipschitz over the questions true for one word (first and second)
        mean_lipschitz_both      lower   mean_lipschitz over the questions true for both words
        mean_lipschitz_yes       lower   mean_lipschitz of the P(yes) curves
        mean_lipschitz_no        lower   mean_lipschitz of the P(no) curves
        """
    )

    make_items = staticmethod(word_items)
    make_plan = staticmethod(plan_item)
    summarize = staticmethod(interpolation_summary)

    def check(self, lm: Any, config: InterpolationConfig) -> None:
        for item in word_items(config):
            check_item(lm, item, config)

    def describe(self, sweep: Sweep) -> str:
        m = sweep.meta
        answers = "" if m.get("group") is None else f" (yes for: {m.get('group')})"
        return f"{m.get('first')} -> {m.get('second')}: {m.get('question')}{answers}, {m.get('method')}"

    def summary_figure(self, result: ExperimentResult) -> Any:
        return answers.summary_figure(result)

    def comparison(self, results: Sequence[tuple[str, ExperimentResult]]) -> Any:
        return answers.comparison_figure([(label, r, self.summary(r)) for label, r in results])


EXPERIMENT = InterpolationExperiment()
