"""``contllm generate PROMPT``: continue a prompt whose tokens last as long as you say.

Edits use the span language of :class:`contllm.core.signal.Signal`: ``--scale WORD=FACTOR``
multiplies the durations of every whole-word occurrence of WORD (what ``Signal.find``
returns) by FACTOR, ``--delete WORD`` gives them duration 0, and a ``START:END`` pair of
character offsets stands for a span instead of a word (``--scale 4:9=0.5``).
``--duration D`` sets each generated token's duration. The continuation is printed as
text, or with ``--json`` as one JSON object per generated token (its time, duration,
probability and the ``--top`` most likely tokens).

Every argument is checked before the model loads; a bad one prints one line and exits
with status 2. Only ``click`` and the command line's own light module are imported here
at the top: torch and transformers load when a command runs, so that ``--help`` answers
at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from contllm.cli.errors import OneLineCommand
from contllm.cli.index import check_cache, models
from contllm.core.decoding import MAX_NEW_TOKENS, check_options
from contllm.errors import ContllmError, SignalError
from contllm.experiments.options import read_value
from contllm.numerals import MAX_TIME, MIN_MAGNITUDE, as_number
from contllm.settings import AUTO_DTYPE_HELP, DTYPE_METAVAR, check_seed, is_dtype_setting

_SPAN = re.compile(r"^([0-9]{1,30}):([0-9]{1,30})$")


@dataclass(frozen=True)
class Edit:
    """One duration edit of the prompt: a word (every whole-word occurrence) or a character span, and its factor."""

    target: str
    factor: float

    def spans(self, signal: Any) -> list[tuple[int, int]]:
        match = _SPAN.match(self.target)
        if match:
            return [(int(match.group(1)), int(match.group(2)))]
        return signal.find(self.target)


def _factor(text: str, where: str) -> float:
    value = as_number(text)
    if value is None:
        raise SignalError(f"{where}: the factor {text!r} is not a number; write WORD=FACTOR, e.g. apple=0.5")
    if not 0 <= value <= MAX_TIME:
        raise SignalError(
            f"{where}: the factor must lie in 0..{MAX_TIME:g} (contllm.core.signal.MAX_TIME: a token scaled by more "
            f"ends past the largest time a signal holds), got {text}"
        )
    if 0 < value < MIN_MAGNITUDE:
        raise SignalError(
            f"{where}: the factor {text} is too close to 0 to compute with (the smallest is {MIN_MAGNITUDE:.3g})"
        )
    return value


def _check_target(target: str, prompt: str, where: str) -> None:
    """SignalError unless ``target`` is a word of ``prompt`` (whole word, as Signal.find) or a span inside it."""
    if not target:
        raise SignalError(f"{where}: no word given; write WORD=FACTOR for --scale, WORD for --delete")
    match = _SPAN.match(target)
    if match:
        start, end = int(match.group(1)), int(match.group(2))
        if not 0 <= start < end <= len(prompt):
            raise SignalError(
                f"{where}: the span {start}:{end} is not a non-empty span inside the prompt of {len(prompt)} characters"
            )
        return
    if not re.search(rf"(?<!\w){re.escape(target)}(?!\w)", prompt):
        words = sorted(set(re.findall(r"\w+", prompt)))
        raise SignalError(f"{where}: {target!r} is not a word of the prompt; its words are: {', '.join(words[:20])}")


def parse_edits(prompt: str, scales: tuple[str, ...], deletes: tuple[str, ...]) -> list[Edit]:
    """The ``--scale WORD=FACTOR`` and ``--delete WORD`` options as edits, checked against the prompt's text."""
    edits = []
    for given in scales:
        word, sep, factor = given.rpartition("=")
        where = f"--scale {given}"
        if not sep:
            raise SignalError(f"{where}: write WORD=FACTOR (or START:END=FACTOR), e.g. --scale apple=0.5")
        _check_target(word, prompt, where)
        edits.append(Edit(word, _factor(factor, where)))
    for word in deletes:
        _check_target(word, prompt, f"--delete {word}")
        edits.append(Edit(word, 0.0))
    return edits


def _check_text(text: str, what: str) -> None:
    """SignalError when ``text`` (as the shell passed it) holds bytes that are not UTF-8: no tokenizer takes them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SignalError(
            f"{what} is not valid UTF-8 text: {text.encode('utf-8', 'backslashreplace')[:60]!r}"
        ) from None


def _number(text: str | None, name: str, kind: type) -> Any:
    """``text`` read as every command reads a count or a number (:func:`contllm.experiments.options.read_value`)."""
    if text is None:
        return None
    try:
        return read_value(text, "int" if kind is int else "float", name)
    except ContllmError as exc:
        raise SignalError(str(exc)) from None


def _steps(generation: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """One JSON-ready object per generated token."""
    rows = []
    for k, step in enumerate(generation.steps):
        top = [{"token_id": i, "token": tokenizer.decode([i]), "probability": p} for i, p in step.top or []]
        rows.append(
            {
                "step": k,
                "token_id": step.token_id,
                "token": step.text,
                "time": step.time,
                "duration": step.duration,
                "probability": step.probability,
                "top": top,
            }
        )
    return rows


@dataclass
class Request:
    """Everything a ``contllm generate`` call asks for, checked."""

    prompt: str
    edits: list[Edit]
    model: str | None
    device: str
    dtype: str | None
    options: dict[str, Any]


def request(prompt: str, values: dict[str, Any]) -> Request:
    """The command's values checked (SignalError or ContllmError naming the bad one); nothing is loaded.

    Imports neither torch nor a model: a bad value is refused at once.
    """
    if not prompt.strip():
        raise SignalError(
            'the prompt is empty; give the text to continue, e.g. contllm generate "The capital of France is"'
        )
    for what, texts in (
        ("the prompt", [prompt]),
        ("--scale", values["scale"]),
        ("--delete", values["delete"]),
        ("--stop", values["stop"]),
    ):
        for text in texts:
            _check_text(text, what)
    edits = parse_edits(prompt, values["scale"], values["delete"])
    steps = _number(values["max_new_tokens"], "--max-new-tokens", int)
    if not 0 <= steps <= MAX_NEW_TOKENS:
        raise SignalError(
            f"--max-new-tokens must lie in 0..{MAX_NEW_TOKENS} (contllm.generation.MAX_NEW_TOKENS), got {steps}"
        )
    top = _number(values["top"], "--top", int)
    if top < 1:
        raise SignalError(f"--top must be >= 1, got {top}")
    options = {
        "max_new_tokens": steps,
        "duration": _number(values["duration"], "--duration", float),
        "sample": values["sample"],
        "temperature": _number(values["temperature"], "--temperature", float),
        "top_k": _number(values["top_k"], "--top-k", int),
        "top_p": _number(values["top_p"], "--top-p", float),
        "seed": None if values["seed"] is None else check_seed(values["seed"], "--seed"),
        "stop": list(values["stop"]) or None,
        "stop_at_eos": values["eos"],
        "probs": top,
    }
    if values["dtype"] is not None and not is_dtype_setting(values["dtype"]):  # the names `contllm run` takes
        raise ContllmError(
            f"--dtype must be float32, bfloat16, float16 or auto (or fp32, bf16, fp16), got {values['dtype']!r}"
        )
    _check_generation_options(options)
    check_cache(values["model"])
    return Request(prompt, edits, values["model"], values["device"], values["dtype"], options)


def _check_generation_options(options: dict[str, Any]) -> None:
    """The generation options checked as :func:`contllm.generation.generate` checks them, before any model loads."""
    check_options(**{k: v for k, v in options.items() if k != "probs"})


def run(req: Request) -> tuple[Any, Any]:
    """Load the model, apply the edits and generate; returns (generation, tokenizer)."""
    import contllm
    from contllm.models import DEFAULT_MODEL

    lm = contllm.load(req.model or DEFAULT_MODEL, device=req.device, dtype=req.dtype)
    signal = lm.signal(req.prompt)
    for edit in req.edits:
        signal = signal.scale(edit.spans(signal), edit.factor)
    options = dict(req.options)
    return lm.generate(signal, options.pop("max_new_tokens"), **options), lm.tokenizer


class _Command(OneLineCommand):
    """``contllm generate``: its usage errors (unknown option, missing value) are toolkit errors, printed on one line.

    Raised rather than printed: the command runs inside ``contllm``'s own command, whose
    guard prints toolkit errors and sets the exit status.
    """

    def usage_error(self, exc: click.UsageError) -> NoReturn:
        message = exc.format_message().replace("\n", " ").rstrip(". ")
        raise ContllmError(f"{message}; see 'contllm generate --help'") from None


def _callback(prompt: str, as_json: bool, **values: Any) -> None:
    generation, tokenizer = run(request(prompt, values))
    if as_json:
        for row in _steps(generation, tokenizer):
            click.echo(json.dumps(row, ensure_ascii=False))
    else:
        click.echo(generation.text)


HELP = """Continue PROMPT, its words lasting as long as you say, each new token lasting --duration.

\b
Examples:
  contllm generate "The capital of France is"
  contllm generate "I ate an apple and a pear" --scale apple=0.5 --max-new-tokens 5 --json
  contllm generate "Once upon a time" --duration 0.5 --sample --seed 1 --top-p 0.9
"""

COMMAND = _Command(
    "generate",
    help=HELP,
    short_help="Continue a prompt whose words last as long as you say (--scale apple=0.5, --duration 0.5).",
    params=[
        click.Argument(["prompt"]),
        click.Option(
            ["--model", "-m"],
            default=None,
            metavar="NAME",
            help=f"Embedded alias, Hugging Face id or local directory. [default: {models()[0]}]",
        ),
        click.Option(["--device"], default="auto", show_default=True, help="auto, cpu, cuda, cuda:1, ..."),
        click.Option(["--dtype"], default=None, metavar=DTYPE_METAVAR, help=f"{AUTO_DTYPE_HELP}. [default: float32]"),
        click.Option(
            ["--scale"],
            multiple=True,
            metavar="WORD=FACTOR",
            help="Multiply the durations of WORD's tokens (every whole-word occurrence, or START:END) by FACTOR.",
        ),
        click.Option(
            ["--delete"], multiple=True, metavar="WORD", help="Give WORD's tokens duration 0 (absent from attention)."
        ),
        click.Option(
            ["--duration"],
            default="1.0",
            show_default=True,
            metavar="D",
            help="Duration of each generated token (0.5: twice as fast).",
        ),
        click.Option(["--max-new-tokens", "-n", "max_new_tokens"], default="20", show_default=True, metavar="N"),
        click.Option(
            ["--sample/--greedy"], default=False, show_default=True, help="Draw tokens instead of taking the argmax."
        ),
        click.Option(["--temperature"], default=None, metavar="T", help="With --sample: divide the logits by T > 0."),
        click.Option(
            ["--top-k", "top_k"], default=None, metavar="K", help="With --sample: draw among the K most likely tokens."
        ),
        click.Option(
            ["--top-p", "top_p"],
            default=None,
            metavar="P",
            help="With --sample: draw from the smallest set holding P of the mass.",
        ),
        click.Option(["--seed"], default=None, metavar="S", help="With --sample: the seed that reproduces a draw."),
        click.Option(
            ["--stop"], multiple=True, metavar="TEXT", help="End once the continuation contains TEXT (repeatable)."
        ),
        click.Option(
            ["--eos/--no-eos"], default=True, show_default=True, help="End at the model's end-of-sequence token."
        ),
        click.Option(
            ["--top"], default="5", show_default=True, metavar="N", help="Most likely tokens per step in --json."
        ),
        click.Option(
            ["--json", "as_json"], is_flag=True, help="One JSON object per generated token instead of the text."
        ),
    ],
    callback=_callback,
)
