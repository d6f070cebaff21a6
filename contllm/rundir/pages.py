"""Data inside self-contained HTML pages, escaped so that no value can change the page's markup.

The toolkit's pages (``explorer.html`` of a run and of ``contllm report``, attribution's
per-item pages) carry prompts, item ids, labels and model names read from data files and
results files, which anyone may have written. Text goes into markup through
:func:`html_text`; data for a script goes into a ``<script type="application/json">``
element through :func:`json_in_html`. Light on purpose (the standard library only).
"""

from __future__ import annotations

import html
import json
from typing import Any

__all__ = ["html_text", "json_in_html"]

#: Characters that could end a script element, open a comment or start markup inside it,
#: and their JSON escapes (which JSON.parse reads as the same characters).
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def json_in_html(data: Any) -> str:
    """``data`` as JSON text for a ``<script type="application/json">`` element of a page.

    '<', '>' and '&' are written as ``\\u003c``, ``\\u003e`` and ``\\u0026`` (they occur in
    JSON only inside strings, so every value reads back the same), and every non-ASCII
    character as its ``\\uXXXX`` escape, so that no string (``</script>``, ``<!--``,
    ``<script>``) can end the element or make an HTML parser read markup in it. ValueError
    for a non-finite number, which JSON cannot hold.
    """
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    for char, escape in _SCRIPT_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def html_text(value: Any) -> str:
    """``str(value)`` escaped for a page's text or a quoted attribute ('&', '<', '>', '"' and "'")."""
    return html.escape(str(value), quote=True)
