"""A Griffe extension that lets contllm's docstrings read as Markdown in the API reference.

The docstrings write shapes in brackets (``probs [batch, vocab]``, ``steps[k][i]``),
cross-references in reST roles (``:func:`load```, ``:meth:`title <target>```), literal
blocks after ``::`` and tables as reST simple tables (columns ruled by ``===``). In
Markdown two bracket groups in a row are a reference link, a role is noise, ``::`` stays
as written and a simple table is a jumble of words, so before rendering: a bracket that
directly follows another group is escaped, a role keeps only its title as code, ``::``
becomes ``:`` over an indented block, and a simple table becomes a Markdown table.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj):`~?([^`<]+?)(?:\s*<[^`>]+>)?`")
_ADJACENT = re.compile(r"\]([ ]?)\[")
_RULE = re.compile(r"^(\s*)(=+)((?:\s+=+)+)\s*$")


def _columns(rule: str) -> list[tuple[int, int]]:
    """(start, end) of each column of a simple table, from its rule line of ``=`` runs."""
    return [(m.start(), m.end()) for m in re.finditer(r"=+", rule)]


def _cells(line: str, columns: list[tuple[int, int]]) -> list[str]:
    """A row's text per column; the last column takes the rest of the line."""
    out = []
    for k, (start, _) in enumerate(columns):
        stop = columns[k + 1][0] if k + 1 < len(columns) else len(line)
        out.append(line[start:stop].strip())
    return out


def _markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def simple_tables(text: str) -> str:
    """Every reST simple table in ``text`` (rule, header, rule, rows, rule) as a Markdown table; a row whose first
    cell is empty continues the row above it. Text that is no such table is left as it is."""
    lines = text.split("\n")
    out: list[str] = []
    k = 0
    while k < len(lines):
        match = _RULE.match(lines[k])
        rules = [j for j in range(k, len(lines)) if _RULE.match(lines[j]) and lines[j] == lines[k]]
        if not match or len(rules) < 3 or rules[1] != k + 2:
            out.append(lines[k])
            k += 1
            continue
        indent = match.group(1)
        columns = _columns(lines[k])
        header = _cells(lines[k + 1], columns)
        rows: list[list[str]] = []
        for line in lines[rules[1] + 1 : rules[2]]:
            cells = _cells(line, columns)
            if rows and not cells[0]:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
            elif any(cells):
                rows.append(cells)
        out += [indent + _markdown_row(header), indent + "|" + "---|" * len(columns)]
        out += [indent + _markdown_row(row) for row in rows]
        k = rules[2] + 1
    return "\n".join(out)


def literal_blocks(text: str) -> str:
    """A paragraph ending in ``::`` ends in ``:``, and its indented block becomes a fenced code block."""
    lines = text.split("\n")
    out: list[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if not line.rstrip().endswith("::") or line.strip().startswith((">>>", "|")):
            out.append(line)
            k += 1
            continue
        head = line.rstrip()[:-1]
        out.append(head if head.strip() else "")
        base = len(line) - len(line.lstrip())
        j = k + 1
        block: list[str] = []
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > base):
            block.append(lines[j])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        body = [b for b in block if b.strip()]
        if not body:
            k += 1
            continue
        inner = min(len(b) - len(b.lstrip()) for b in body)
        pad = " " * base
        out += ["", pad + "```", *[pad + b[inner:] if b.strip() else "" for b in block], pad + "```"]
        out += [""] if j < len(lines) and lines[j].strip() else []
        k = j
    return "\n".join(out)


def markdown_docstring(text: str) -> str:
    """The docstring with roles as inline code, adjacent bracket groups kept apart, literal blocks fenced and simple
    tables as Markdown tables."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).strip()}`", text)
    out, fenced = [], False
    for line in simple_tables(literal_blocks(text)).split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        keep = fenced or line.lstrip().startswith(("|", "```"))
        out.append(line if keep else _ADJACENT.sub(lambda m: "]" + m.group(1) + "\\[", line))
    return "\n".join(out)


class MarkdownDocstrings(Extension):
    """Every docstring as Markdown, once: each object as it is loaded, and the package itself (griffe reports the
    top-level package through ``on_package`` only, so its module docstring would keep its roles)."""

    def __init__(self) -> None:
        super().__init__()
        self._done: set[int] = set()

    def _convert(self, obj: Object) -> None:
        if obj.docstring is not None and id(obj.docstring) not in self._done:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
            self._done.add(id(obj.docstring))

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        self._convert(obj)

    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        self._convert(pkg)
