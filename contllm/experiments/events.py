"""Event duration: a passage of n events, and a question about how many happened.

The events' durations are scaled by c, all together or a single one ("a third of an
action"); the digits 0-9 after the answer prefix are read out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from contllm.audits.studies import Study, counting_finding
from contllm.data import EVENTS_SCHEMA, EventItem, load_events, read_events
from contllm.data.user import DataFileOption
from contllm.errors import ExperimentError
from contllm.experiments.options import Option
from contllm.experiments.prompts import Rendered, apply_chat, render
from contllm.experiments.protocol import PaperSearch
from contllm.experiments.sweeps import CountingSweepExperiment, DurationSweepConfig, Sweep, SweepPlan, scaled_plan
from contllm.lm import ContinuousLM

#: Worked examples (two stories, two tutorials; 2, 5, 3 and 6 events) in the item's own
#: format, then the passage, its question and its answer prefix, so that a digit comes next.
SHOTS = (
    ("Tom woke up. He opened the curtains.", "How many actions did Tom take?", "Answer: Tom took", 2, "actions"),
    (
        "Fill the kettle. Boil the water. Put a tea bag in a cup. Pour the water. Wait a few minutes.",
        "How many steps are in this tutorial?",
        "Answer: There are",
        5,
        "steps",
    ),
    (
        "Ines found her keys. She locked the door. She walked to the station.",
        "How many actions did Ines take?",
        "Answer: Ines took",
        3,
        "actions",
    ),
    (
        "Sand the board. Wipe off the dust. Open the paint. Stir it well. Paint the board. Let it dry.",
        "How many steps are in this tutorial?",
        "Answer: There are",
        6,
        "steps",
    ),
)
DEFAULT_TEMPLATE = (
    "".join(f"{p}\nQuestion: {q}\n{a} {n} {unit}.\n\n" for p, q, a, n, unit in SHOTS)
    + "{events}\nQuestion: {question}\n{answer_prefix} "
)
CHAT_TEMPLATE = "{events}\n{question} Reply with a single digit."

FIELDS = ("events", "question", "answer_prefix")

#: What a row of a --data file holds, for --help and the README.
DATA_SCHEMA = EVENTS_SCHEMA


#: The templates and their fields (see :class:`~contllm.experiments.sweeps.SweepConfig`).
PROMPTS = (DEFAULT_TEMPLATE, CHAT_TEMPLATE, FIELDS, ("events",))


@dataclass
class EventsConfig(DurationSweepConfig, DataFileOption, prompts=PROMPTS):
    """Options of the event-duration experiment.

    template: prompt with an {events} field (the passage, one span per event) and
        optionally {question} and {answer_prefix}; None picks the default.
    low, high, samples: the duration factors; chat: use the model's chat template.
    event: 0 scales every event together; k in 1..n scales only the k-th event.
    data: a dataset file (:func:`read_events`) instead of the built-in passages; its
        contents' sha256 is kept in data_sha256, so that a resumed run refuses a changed file.
    protocol: "paper" writes each passage as the paper does (:func:`paper_prompt`) and samples
        40 factors, as the paper's events script.
    """

    PAPER_SAMPLES: ClassVar[int] = 40

    event: int = 0

    def __post_init__(self) -> None:
        if self.event < 0:
            raise ExperimentError(f"event must be 0 (all events) or a 1-based event number, got {self.event}")
        super().__post_init__()
        self.read_data(read_events)


#: The paper's question after a passage: its instruction, then the answer's start (stories
#: follow the passage on the next line; tutorials after an empty line).
PAPER_QUESTION = "Question: {question} Reply with a single-digit number\n{answer_prefix} "


def paper_prompt(item: EventItem) -> Rendered:
    """The paper's prompt of a passage, with the span of each event ("events") and the paper's scaled block ("block").

    A row of the paper's files keeps its own prompt (:attr:`EventItem.prompt`, title and
    bullets included). Otherwise a tutorial is written as "- " bullets and a story as
    sentences, then :data:`PAPER_QUESTION`. An event's span starts at its bullet; the
    block runs from the first event's bullet to the last event's full stop, newlines
    and bullets between included, as the paper scales it.
    """
    if item.prompt is None:
        tutorial = item.kind == "tutorial"
        passage = ("- " + "\n- ".join(item.events)) if tutorial else " ".join(item.events)
        question = PAPER_QUESTION.format(question=item.question, answer_prefix=item.answer_prefix)
        item = replace(item, prompt=passage + ("\n\n" if tutorial else "\n") + question)
    text, spans = str(item.prompt), item.event_spans()
    spans = [(a - 2 if text[max(0, a - 2) : a] == "- " else a, b) for a, b in spans]
    return Rendered(text, {"events": spans, "block": [(spans[0][0], spans[-1][1])]})


def render_item(lm: ContinuousLM, item: EventItem, config: EventsConfig) -> Rendered:
    if config.protocol == "paper" and config.template is None:
        rendered = paper_prompt(item)
        return apply_chat(lm.tokenizer, rendered, reply_prefix=item.answer_prefix) if config.chat else rendered
    values = dict(zip(FIELDS, (list(item.events), item.question, item.answer_prefix)))
    rendered = render(config.resolved_template(), values, required=("events",))
    if config.chat:
        rendered = apply_chat(lm.tokenizer, rendered, reply_prefix=item.answer_prefix)
    return rendered


def plan_item(lm: ContinuousLM, item: EventItem, config: EventsConfig) -> SweepPlan:
    """The sweep of one passage: all events, or the chosen one, scaled by each factor."""
    rendered = render_item(lm, item, config)
    spans = rendered.spans["events"]
    if config.event > len(spans):
        raise ExperimentError(f"item {item.id} has {len(spans)} events; event {config.event} does not exist")
    chosen = rendered.spans.get("block", spans) if config.event == 0 else [spans[config.event - 1]]
    meta = {"kind": item.kind, "n": item.n, "event": config.event}
    # The paper's script scales all events together: from the first token holding "-" to the last holding ".".
    search = PaperSearch("-", ".") if config.event == 0 else None
    return scaled_plan(lm, item.id, rendered.text, chosen, config, str(item.n), meta, search)


class EventsExperiment(CountingSweepExperiment):
    name = "events"
    counted = "events"
    help = "A passage of n events, their durations scaled by a factor; digits read out."
    explorer_text = (
        "Each item is a short story or tutorial of n events (sentences or steps) and a question about how many "
        "happened. The slider is the duration factor c: the events' tokens last c steps each (with --event, one "
        "event only). The bars are the model's probability of each digit as the answer; below the curves, the "
        "predicted count E[k] beside n × c (n − 1 + c when one event is scaled), the count if it followed time."
    )
    description = (
        "Each item is a short story or tutorial of n events (3-7) and a question about how many happened; "
        "every event (or only --event K) has its duration scaled by c and the digits 0-9 are read out. "
        "--data FILE reads the passages from a JSON, JSONL or CSV file instead."
    )
    Config = EventsConfig
    options = EventsConfig.command_options(
        Option(
            "event",
            "int",
            "Scale only this event (1-based; passages with fewer events are left out); 0 scales all. [default: 0]",
        ),
        schema=DATA_SCHEMA,
    )
    study = Study(
        "events",
        "pure_peak_rate",
        ("pure_improvement_over_chance", "auc_observed_time_sensitivity"),
        counting_finding("events"),
    )

    def items(self, config: EventsConfig) -> Sequence[EventItem]:
        items = load_events() if config.data is None else read_events(config.data)
        longest = max(item.n for item in items)
        if config.event > longest:
            raise ExperimentError(f"event {config.event} does not exist; the passages have at most {longest} events")
        return [item for item in items if item.n >= config.event]

    make_plan = staticmethod(plan_item)

    def describe(self, sweep: Sweep) -> str:
        meta = sweep.meta
        which = "all events" if not meta.get("event") else f"event {meta.get('event')}"
        return f"{meta.get('kind')}, {meta.get('n')} events, {which} scaled"


EXPERIMENT = EventsExperiment()
