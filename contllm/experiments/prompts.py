"""Rendering prompt templates while keeping track of where each filled-in piece lands.

Spans are computed while the prompt is built, as character offsets in the final text
(chat template included), so edits never depend on searching decoded tokens.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contllm.core.signal import Span
from contllm.errors import ExperimentError

_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt and the character spans of its filled-in fields."""

    text: str
    spans: dict[str, list[Span]]

    def shifted(self, offset: int, text: str) -> Rendered:
        return Rendered(text, {k: [(a + offset, b + offset) for a, b in v] for k, v in self.spans.items()})


def template_fields(template: str) -> list[str]:
    """The field names used in ``template`` ({name} placeholders), in order of appearance."""
    try:
        parsed = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        raise ExperimentError(f"malformed template: {exc}") from None
    names = [name for name, _, _ in parsed]
    formatted = [
        f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
        for name, spec, conversion in parsed
        if spec or conversion
    ]
    if formatted:
        raise ExperimentError(f"template fields take no conversion or format, got {formatted[0]}; write {{name}}")
    bad = [n for n in names if not re.fullmatch(r"\w+", n)]
    if bad:
        raise ExperimentError(f"template fields must be plain names like {{word}}, got {bad}")
    return names


def check_template(template: str, fields: Sequence[str], required: Sequence[str]) -> None:
    """Raise ExperimentError unless ``template`` uses only ``fields`` and every ``required`` one, as UTF-8 text."""
    try:
        template.encode("utf-8")
    except UnicodeEncodeError:  # bytes a shell passed that are not UTF-8: no tokenizer takes them
        raise ExperimentError(
            f"the template is not valid UTF-8 text: {template.encode('utf-8', 'backslashreplace')[:60]!r}"
        ) from None
    render(template, {name: "x" for name in fields}, required=required)


def render(template: str, values: Mapping[str, str | Sequence[str]], *, required: Sequence[str] = ()) -> Rendered:
    """Fill ``template``; a value that is a list of strings is joined by single spaces.

    Returns the text and, for every field, the spans of each occurrence (for a list, the
    span of each element). Unknown or missing required fields raise ExperimentError.
    """
    names = template_fields(template)
    for name in required:
        if name not in names:
            raise ExperimentError(f"the template has no {{{name}}} field; it needs one (template: {template!r})")
    unknown = sorted(set(names) - set(values))
    if unknown:
        raise ExperimentError(
            f"unknown template field(s) {', '.join('{' + u + '}' for u in unknown)}; "
            f"known fields: {', '.join('{' + k + '}' for k in values)}"
        )
    out: list[str] = []
    spans: dict[str, list[Span]] = {name: [] for name in values}
    pos = 0
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(literal)
        pos += len(literal)
        if field is None:
            continue
        value = values[field]
        parts = [value] if isinstance(value, str) else list(value)
        for k, part in enumerate(parts):
            if k:
                out.append(" ")
                pos += 1
            spans[field].append((pos, pos + len(part)))
            out.append(part)
            pos += len(part)
    return Rendered("".join(out), spans)


def apply_chat(tokenizer: Any, rendered: Rendered, reply_prefix: str = "") -> Rendered:
    """Wrap a rendered user message in the tokenizer's chat template; spans follow it."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ExperimentError("--chat needs a model whose tokenizer has a chat template; this one has none")
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": rendered.text}], add_generation_prompt=True, tokenize=False
    )
    offset = chat.find(rendered.text)
    if offset < 0:
        raise ExperimentError("the chat template changed the user message; spans cannot be located")
    return rendered.shifted(offset, chat + reply_prefix)
