"""Counting: a word repeated n times, every occurrence's duration scaled by c.

Read out the digits 0-9 after a prompt that asks for the count. If the model integrates
over time, shrinking the word should move the predicted count smoothly toward smaller
numbers ("four 0.75-apples are about three apples").
"""

from __future__ import annotations

from dataclasses import dataclass

from contllm.audits.studies import Study, counting_finding
from contllm.data import COUNTING_SCHEMA, CountingItem, load_counting, read_counting
from contllm.data.user import DataFileOption
from contllm.experiments.prompts import Rendered, apply_chat, render
from contllm.experiments.protocol import PaperSearch
from contllm.experiments.sweeps import CountingSweepExperiment, DurationSweepConfig, SweepPlan, scaled_plan
from contllm.lm import ContinuousLM

#: Few-shot completions: fifteen short words, each repeated 2 to 6 times (every count three
#: times, in a shuffled order), then the item. Small models do not count with a zero-shot
#: question; how their counts track the repetition with this format is measured in the README.
SHOTS = (
    ("cat", 4),
    ("dog", 3),
    ("sun", 3),
    ("box", 5),
    ("pen", 6),
    ("cup", 3),
    ("hat", 5),
    ("key", 5),
    ("map", 2),
    ("bag", 6),
    ("car", 4),
    ("egg", 6),
    ("fan", 2),
    ("jar", 4),
    ("log", 2),
)
DEFAULT_TEMPLATE = "".join(f'"{" ".join([w] * n)}" contains {n} words.\n' for w, n in SHOTS) + '"{words}" contains '

#: The paper's zero-shot question (its protocol's prompt; {article} is its category_with_article).
QUESTION_TEMPLATE = (
    'Question: In the sentence "{words}", how many times is {article} mentioned? '
    "Reply with a single-digit number\nAnswer: "
)

#: The user message when --chat wraps the prompt in the model's chat template.
CHAT_TEMPLATE = 'How many times does the word "{word}" occur in "{words}"? Reply with a single digit.'

FIELDS = ("words", "word", "article", "category")

#: What a row of a --data file holds, for --help and the README.
DATA_SCHEMA = COUNTING_SCHEMA


#: The templates and their fields (see :class:`~contllm.experiments.sweeps.SweepConfig`).
PROMPTS = (DEFAULT_TEMPLATE, CHAT_TEMPLATE, FIELDS, ("words",))


@dataclass
class CountingConfig(DurationSweepConfig, DataFileOption, prompts=PROMPTS, paper=QUESTION_TEMPLATE):
    """Options of the counting experiment.

    template: prompt with a {words} field (the repeated word) and optionally {word},
        {article}, {category}; None picks the default (or the chat default with chat).
    low, high, samples: the duration factors c, evenly spaced (1.0 added when inside).
    chat: wrap the prompt in the model's chat template (instruct models).
    data: a dataset file (:func:`read_counting`) instead of the built-in items; its
        contents' sha256 is kept in data_sha256, so that a resumed run refuses a changed file.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self.read_data(read_counting)

    def counting_items(self) -> list[CountingItem]:
        """The items of the --data file, or the built-in dataset."""
        return load_counting() if self.data is None else read_counting(self.data)


def render_item(lm: ContinuousLM, item: CountingItem, config: CountingConfig) -> Rendered:
    """The item's prompt, with the span of every occurrence of the word under "words".

    The paper's question asks about the category ("how many times is a fruit mentioned"):
    under its protocol {article} is the item's :attr:`~contllm.data.CountingItem.asked` where it has one.
    """
    paper_question = config.paper and config.template is None
    values = {
        "words": [item.word] * item.n,
        "word": item.word,
        "article": (item.asked or item.article) if paper_question else item.article,
        "category": item.category,
    }
    rendered = render(config.resolved_template(), values, required=("words",))
    if config.chat:
        rendered = apply_chat(lm.tokenizer, rendered)
    return rendered


def plan_item(lm: ContinuousLM, item: CountingItem, config: CountingConfig) -> SweepPlan:
    """The sweep of one counting item: the word's occurrences scaled by each factor."""
    rendered = render_item(lm, item, config)
    meta = {"word": item.word, "n": item.n, "category": item.category}
    search = PaperSearch(item.word, item.word)  # the paper's script: from the first token holding the word to the last
    return scaled_plan(lm, item.id, rendered.text, rendered.spans["words"], config, str(item.n), meta, search)


class CountingExperiment(CountingSweepExperiment):
    name = "counting"
    help = "A word repeated n times, its occurrences' durations scaled by a factor; digits read out."
    explorer_text = (
        "Each item asks how many times a word is repeated (n times, the true count). The slider is the duration "
        "factor c: every repetition of the word lasts c steps (c = 1 is the prompt as written, 0.5 half a step). "
        "The bars are the model's probability of each digit as the answer; below the curves, the predicted count "
        "E[k] (each digit weighted by its probability) beside n × c, the count the model would give if it counted "
        "time rather than words."
    )
    description = (
        "Each item repeats a word n times (2-6) inside a few-shot prompt; every occurrence's duration is "
        "scaled by the factor c and the digits 0-9 are read out. Item ids look like count-003 (130 items). "
        "--data FILE reads the items from a JSON, JSONL or CSV file instead."
    )
    Config = CountingConfig
    options = CountingConfig.command_options(schema=DATA_SCHEMA)
    study = Study(
        "counting",
        "pure_peak_rate",
        ("pure_improvement_over_chance", "auc_observed_time_sensitivity"),
        counting_finding("words"),
        comfortable=10,
    )

    make_items = staticmethod(CountingConfig.counting_items)
    make_plan = staticmethod(plan_item)

    label = '"{word}" x {n}'


EXPERIMENT = CountingExperiment()
