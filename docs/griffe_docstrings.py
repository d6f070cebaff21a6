"""A Griffe extension that lets contllm's docstrings read as Markdown in the API reference.

The docstrings write shapes in brackets (``probs [batch, vocab]``, ``steps[k][i]``) and
cross-references in reST roles (``:func:`load```). In Markdown two bracket groups in a row
are a reference link, and a role is noise, so before rendering: a bracket that directly
follows another group is escaped, and a role keeps only its name as code.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj):`~?([^`]+)`")
_ADJACENT = re.compile(r"\]([ ]?)\[")


def markdown_docstring(text: str) -> str:
    """The docstring with roles as inline code and adjacent bracket groups kept apart."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return _ADJACENT.sub(lambda m: "]" + m.group(1) + "\\[", text)


class MarkdownDocstrings(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
