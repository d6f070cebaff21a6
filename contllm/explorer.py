"""``explorer.html``: one self-contained page to scrub a sweep by hand.

Every experiment whose records hold a read-out over a swept knob gets a page in its run
directory: duration sweeps (counting, events), interpolations (boolean, interpolation),
tracked tokens (tokens, scaling, translation) and sums (the first answer digit). Pick an
item, drag the slider along the knob, and see the read-out distribution as bars, every
label's curve with a cursor at the slider, and the prompt's tokens drawn as boxes as
long as their durations (the edited ones highlighted). ``contllm report`` writes one page
across runs: the same item, one curve per run.

The data, script and style are inline; nothing is fetched, so the page opens from the
file system and keeps working offline. This module imports neither torch nor numpy: it
reads the result's records through their ``to_dict()``.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

__all__ = ["explorer_data", "item_view", "page"]

#: Knobs that multiply the edited tokens' durations (the token strip draws them scaled).
DURATION_KNOBS = ("factor", "c", "s", "scale", "duration")


def item_view(record: dict[str, Any], knob: str) -> dict[str, Any] | None:
    """What the page shows of one record (a record's ``to_dict()``), or None for a record without a read-out.

    Returns id, x [S], labels [K], probs [S][K], truth, prompt, tokens (the prompt's
    length in tokens), edited (token positions), edited_tokens (their text) and whether
    the knob scales the edited tokens' durations.
    """
    labels, x = record.get("labels"), record.get("x")
    if not isinstance(labels, list) or not isinstance(x, list):
        return None
    if "probs" in record:
        probs = record["probs"]
    elif record.get("steps"):  # sums: the first answer digit's distribution at each factor
        probs = [row if row is not None else [0.0] * len(labels) for row in record["steps"][0]]
    else:
        return None
    # One row of label probabilities per value of the knob, or this is another shape of record.
    if len(probs) != len(x) or not all(isinstance(row, list) and len(row) == len(labels) for row in probs):
        return None
    if any(isinstance(p, list) for row in probs for p in row):
        return None
    meta = record.get("meta") or {}
    truth = record.get("truth")
    return {
        "id": str(record["item_id"]),
        "x": [float(v) for v in record["x"]],
        "labels": [str(v) for v in record["labels"]],
        "probs": [[_finite(p) for p in row] for row in probs],
        "truth": None if truth is None else str(truth),
        "prompt": meta.get("prompt"),
        "tokens": meta.get("tokens"),
        "edited": [int(i) for i in meta.get("edited", [])],
        "edited_tokens": [str(t) for t in meta.get("edited_tokens", [])],
        "scales": knob in DURATION_KNOBS or str(record.get("knob", "")) in DURATION_KNOBS,
    }


def _finite(value: Any) -> float | None:
    """A probability for the page; None (JSON null, drawn as a gap) for a missing or non-finite one."""
    number = None if value is None else float(value)
    return number if number is not None and math.isfinite(number) else None


def explorer_data(runs: Sequence[tuple[str, Any]]) -> dict[str, Any] | None:
    """The page's data for labelled results [(name, result), ...] of one experiment, or None when no record fits.

    Each result is a :class:`~contllm.experiments.base.Records` (its ``records`` hold
    ``to_dict()``); the knob's name is the result's ``x_label``, else the records' ``knob``.
    """
    out = []
    knob = None
    for name, result in runs:
        records = [r.to_dict() for r in getattr(result, "records", [])]
        knob = knob or getattr(result, "x_label", None) or next((r.get("knob") for r in records if r.get("knob")), None)
        items = [v for v in (item_view(r, knob or "x") for r in records) if v is not None]
        if items:
            out.append({"name": name, "items": items})
    if not out:
        return None
    experiment = getattr(runs[0][1], "experiment", "") or ""
    return {"experiment": experiment, "knob": knob or "x", "runs": out}


def _asset(name: str) -> str:
    return (resources.files("contllm") / "assets" / name).read_text(encoding="utf-8")


def page(data: dict[str, Any], title: str | None = None) -> str:
    """The self-contained HTML page of :func:`explorer_data`'s ``data``."""
    # "</" inside the JSON would end the script element early; "<\/" reads the same to JSON.parse.
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    heading = title or f"{data['experiment'] or 'sweep'} explorer"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(heading)}</title>\n<style>\n{_asset('explorer.css')}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(heading)}</h1>\n{_asset('explorer.html')}\n"
        f'<script type="application/json" id="explorer-data">{payload}</script>\n'
        f"<script>\n{_asset('explorer.js')}</script>\n</body>\n</html>\n"
    )
