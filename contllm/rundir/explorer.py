"""``explorer.html``: one self-contained page to scrub a sweep by hand.

Every experiment that declares a read-out over a swept knob
(:attr:`~contllm.experiments.base.Experiment.explorer`) gets a page in its run directory:
duration sweeps (counting, events), interpolations (boolean, interpolation), tracked
tokens (tokens, scaling, translation) and sums (the first answer digit). Pick an
item, drag the slider along the knob, and see the read-out distribution as bars, every
label's curve with a cursor at the slider, and the prompt's tokens drawn as boxes as
long as their durations (the edited ones highlighted). ``contllm report`` writes one page
across runs: the same item, one curve per run.

The data, script and style are inline; nothing is fetched, so the page opens from the
file system and keeps working offline. The page's part imports neither torch nor numpy:
it reads the result's records through their ``to_dict()``.

In Jupyter, :func:`explore` computes one duration sweep of a signal and scrubs it with an
ipywidgets slider (the ``widgets`` extra).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from importlib import resources
from typing import Any

from contllm.rundir.pages import html_text, json_in_html

__all__ = ["Exploration", "explore", "explorer_data", "item_view", "page"]

#: Knobs that multiply the edited tokens' durations (the token strip draws them scaled).
DURATION_KNOBS = ("factor", "c", "s", "scale", "duration")


def item_view(record: dict[str, Any], knob: str, probs: Any = None) -> dict[str, Any] | None:
    """What the page shows of one record (a record's ``to_dict()``), or None for a record without a read-out.

    probs: the read-out, one row of label probabilities per value of the knob (None: the
    record's ``probs``; an experiment's :meth:`~contllm.experiments.base.Experiment.explorer_probs`).

    Returns id, x [S], labels [K], probs [S][K], truth (the true label where the record has
    one throughout), truths [S] (the true label at each value: the truth of a duration sweep
    everywhere, an interpolation's at its two ends only), expected [S] and expected_name
    (the expectation of numeric labels, or the yes-share of yes/no; None where the labels
    have none), expected_truths [S] (the true answer on that scale), proportional [S] (the
    count that would follow time, n·c, for a count over scaled durations; else None),
    prompt, tokens (the prompt's length in tokens, where the record keeps its edited
    positions), span (the edited text, highlighted in the prompt), edited (token positions),
    edited_tokens (their text), whether the knob scales the edited tokens' durations, and
    the same prompt fields of an interpolation's far end (prompt_end, tokens_end, span_end,
    edited_end, edited_tokens_end; None without one).
    """
    labels, x = record.get("labels"), record.get("x")
    if not isinstance(labels, list) or not isinstance(x, list):
        return None
    probs = record.get("probs") if probs is None else probs
    # One row of label probabilities per value of the knob, or the record is malformed.
    if (
        not isinstance(probs, list)
        or len(probs) != len(x)
        or not all(isinstance(row, list) and len(row) == len(labels) for row in probs)
    ):
        return None
    if any(isinstance(p, list) for row in probs for p in row):
        return None
    meta = record.get("meta") or {}
    truth = record.get("truth")
    xs = [float(v) for v in record["x"]]
    table = [[_finite(p) for p in row] for row in probs]
    names = [str(v) for v in record["labels"]]
    scales = knob in DURATION_KNOBS or str(record.get("knob", "")) in DURATION_KNOBS
    truths = _truths(xs, None if truth is None else str(truth), meta)
    values, expected_name = _label_values(names)
    edited_tokens = [str(t) for t in _listed(meta.get("edited_tokens"))]
    end_tokens = [str(t) for t in _listed(meta.get("edited_tokens_second"))]
    return {
        "id": str(record["item_id"]),
        "x": xs,
        "labels": names,
        "probs": table,
        "truth": None if truth is None else str(truth),
        "truths": truths,
        "expected": None if values is None else [_expected(row, values) for row in table],
        "expected_name": expected_name,
        "expected_truths": None if values is None else [_value_of(t, names, values) for t in truths],
        "proportional": _proportional(xs, meta) if scales else None,
        "prompt": meta.get("prompt"),
        # "tokens" is the prompt's length where the edited positions are kept (duration sweeps);
        # elsewhere it may count the tokens of an edited span, which the strip cannot place.
        "tokens": meta.get("prompt_tokens") or (meta.get("tokens") if "edited" in meta else None),
        "span": meta.get("span") or meta.get("word") or "".join(edited_tokens).strip() or None,
        "edited": _positions(meta.get("edited")),
        "edited_tokens": edited_tokens,
        "scales": scales,
        "prompt_end": meta.get("prompt_second"),
        "tokens_end": meta.get("prompt_tokens_second"),
        "span_end": "".join(end_tokens).strip() or None,
        "edited_end": _positions(meta.get("edited_second")),
        "edited_tokens_end": end_tokens,
    }


def _truths(x: list[float], truth: str | None, meta: dict[str, Any]) -> list[str | None]:
    """The true label at each value of the knob: an interpolation's (meta truth_first and truth_second) at alpha 0
    and 1 only, a duration sweep's ``truth`` everywhere (as :meth:`contllm.experiments.sweeps.Sweep.truth_at`)."""
    first, second = meta.get("truth_first"), meta.get("truth_second")
    if first is None and second is None:
        return [truth] * len(x)
    ends = {0.0: first, 1.0: second}
    return [None if ends.get(v) is None else str(ends[v]) for v in x]


def _label_values(labels: list[str]) -> tuple[list[float | None] | None, str | None]:
    """The value of each label for an expectation, and its name: numbers as themselves (0 and 1 alone give the share
    of 1), yes as 1 and no as 0; (None, None) for labels with no two values."""
    values: list[float | None] = []
    for label in labels:
        number: float | None
        try:
            number = float(label)
        except ValueError:
            number = {"yes": 1.0, "no": 0.0}.get(label.strip().lower())
        values.append(number if number is not None and math.isfinite(number) else None)
    known = {v for v in values if v is not None}
    if len(known) < 2:
        return None, None
    if known == {0.0, 1.0} and any(label.strip().lower() == "yes" for label in labels):
        return values, "P(yes) / (P(yes) + P(no))"
    if known == {0.0, 1.0}:
        return values, "P(1) / (P(0) + P(1))"
    return values, "E[k], the labels weighted by their probabilities"


def _expected(row: list[float | None], values: list[float | None]) -> float | None:
    pairs = [(p, v) for p, v in zip(row, values) if v is not None]
    if any(p is None for p, _ in pairs):
        return None
    mass = sum(p for p, _ in pairs if p is not None)
    return sum(p * v for p, v in pairs if p is not None) / mass if mass > 0 else None


def _value_of(label: str | None, labels: list[str], values: list[float | None]) -> float | None:
    return values[labels.index(label)] if label in labels else None


def _proportional(x: list[float], meta: dict[str, Any]) -> list[float] | None:
    """The count if the model counted time: n·c, or n − 1 + c where a single event is scaled; None without n."""
    n = meta.get("n")
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return None
    return [n - 1 + c if meta.get("event") else n * c for c in x]


def _listed(value: Any) -> list[Any] | tuple[Any, ...]:
    return value if isinstance(value, (list, tuple)) else []


def _positions(value: Any) -> list[int]:
    """Token positions for the strip: a list of whole numbers, else none (an edited results.json may hold anything)."""
    try:
        return [operator.index(i) for i in _listed(value)]
    except TypeError:
        return []


def _finite(value: Any) -> float | None:
    """A probability for the page; None (JSON null, drawn as a gap) for a missing or non-finite one."""
    number = None if value is None else float(value)
    return number if number is not None and math.isfinite(number) else None


def explorer_data(runs: Sequence[tuple[str, Any]]) -> dict[str, Any] | None:
    """The page's data for labelled results [(name, result), ...] of one experiment, or None when no record fits.

    Each result is a :class:`~contllm.experiments.base.Records` (its ``records`` hold
    ``to_dict()``) of a registered experiment that declares a read-out
    (:attr:`~contllm.experiments.base.Experiment.explorer`; None for any other); the knob's
    name is the result's ``x_label``, else the records' ``knob``.
    """
    experiment = getattr(runs[0][1], "experiment", "") or "" if runs else ""
    declared = _declared(experiment)
    if declared is None or not declared.explorer:
        return None
    out = []
    knob = None
    for name, result in runs:
        records = [r.to_dict() for r in getattr(result, "records", []) if hasattr(r, "to_dict")]
        knob = knob or getattr(result, "x_label", None) or next((r.get("knob") for r in records if r.get("knob")), None)
        items = [v for v in (item_view(r, knob or "x", declared.explorer_probs(r)) for r in records) if v is not None]
        if items:
            out.append({"name": name, "items": items})
    if not out:
        return None
    return {"experiment": experiment, "knob": knob or "x", "about": about(experiment), "runs": out}


def _declared(experiment: str) -> Any:
    """The registered :class:`~contllm.experiments.base.Experiment` called ``experiment``, or None."""
    from contllm import registry
    from contllm.errors import ContllmError

    try:
        return registry.get(experiment)
    except ContllmError:
        return None


#: What every page shows, whatever the experiment (after the experiment's own paragraph).
PAGE_PARTS = (
    "Pick an item and drag the slider: the bars give the read-out at the slider (the true answer green, where there "
    "is one), the curves each label's probability along the knob, and the plot below them the expected value of the "
    "read-out. The token strip draws each token of the prompt as wide as it lasts at the slider."
)


def about(experiment: str) -> str:
    """The page's "what you are looking at": the experiment's :attr:`~contllm.experiments.base.Experiment.explorer_text`
    (or its one-line help), then :data:`PAGE_PARTS`; the parts alone for an experiment that is not registered."""
    declared = _declared(experiment)
    if declared is None:
        return PAGE_PARTS
    text = declared.explorer_text or declared.help
    return f"{text} {PAGE_PARTS}" if text else PAGE_PARTS


def _asset(name: str) -> str:
    return (resources.files("contllm") / "assets" / name).read_text(encoding="utf-8")


def page(data: dict[str, Any], title: str | None = None) -> str:
    """The self-contained HTML page of :func:`explorer_data`'s ``data``."""
    # Every string of the data (prompts, ids, labels, run names) may come from a user's file:
    # escaped so that none can end the script element or be read as markup (contllm.rundir.pages).
    payload = json_in_html(data)
    heading = html_text(title or f"{data['experiment'] or 'sweep'} explorer")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{heading}</title>\n<style>\n{_asset('explorer.css')}</style>\n</head>\n<body>\n"
        f"<h1>{heading}</h1>\n{_asset('explorer.html')}\n"
        f'<script type="application/json" id="explorer-data">{payload}</script>\n'
        f"<script>\n{_asset('explorer.js')}</script>\n</body>\n</html>\n"
    )


# ---------------------------------------------------------------------- in Jupyter
class Exploration:
    """One sweep computed by :func:`explore`, scrubbed with ipywidgets.

    x: the duration factors [S]; labels: the tracked tokens [K] (decoded); probs: their
    probabilities [S][K] (lists of floats); signals: the swept signals [S]. ``widget()``
    builds the sliders; displaying the object in Jupyter shows it.
    """

    def __init__(self, x: list[float], labels: list[str], probs: list[list[float]], signals: list[Any]) -> None:
        self.x, self.labels, self.probs, self.signals = x, labels, probs, signals

    def at(self, value: float) -> dict[str, float]:
        """label -> probability at the factor nearest ``value``."""
        k = min(range(len(self.x)), key=lambda i: abs(self.x[i] - value))
        return dict(zip(self.labels, self.probs[k]))

    def bars(self, k: int) -> str:
        """HTML bars of the tracked tokens at the k-th factor, with each token's duration drawn below."""
        rows = "".join(
            f'<div style="display:flex;gap:6px;align-items:center;font:12px monospace">'
            f'<span style="width:8em;text-align:right;white-space:pre">{html_text(label)}</span>'
            f'<span style="width:{240 * p:.1f}px;height:12px;background:#4a7bd0;display:inline-block"></span>'
            f'<span data-label="{html_text(label)}">{p:.4f}</span></div>'
            for label, p in zip(self.labels, self.probs[k])
        )
        signal = self.signals[k]
        durations = [float(d) for d in signal.durations]
        # Each box exactly as wide as its token lasts (14 px a step); the line between boxes takes no room.
        boxes = "".join(
            f'<span title="token {i}, duration {d:g}" style="display:inline-block;height:14px;'
            f"box-shadow:inset -1px 0 0 #fff;{'outline:1px solid #d04a4a;' if d == 0 else ''}"
            f'width:{14 * d:.1f}px;background:{"#ffd27a" if abs(d - 1) > 1e-12 else "#dde4f0"}"></span>'
            for i, d in enumerate(durations)
        )
        return f"<div>{rows}</div><div style='margin-top:6px;white-space:nowrap;overflow-x:auto'>{boxes}</div>"

    def widget(self) -> Any:
        """An ipywidgets box: a slider over the factors and the bars at its value."""
        try:
            import ipywidgets as widgets  # type: ignore[import-untyped]
        except ImportError:
            from contllm.errors import MissingDependencyError

            raise MissingDependencyError(
                "contllm.explore needs ipywidgets: pip install 'contllm[widgets]' (or pip install ipywidgets)"
            ) from None
        slider = widgets.SelectionSlider(options=[(f"{v:g}", k) for k, v in enumerate(self.x)], description="factor")
        view = widgets.HTML(self.bars(slider.value))
        slider.observe(lambda change: setattr(view, "value", self.bars(change["new"])), names="value")
        return widgets.VBox([slider, view])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())


def explore(lm: Any, signal: Any, spans: Any, *, factors: Sequence[float] | None = None, top: int = 10) -> Exploration:
    """Sweep the durations of ``spans`` of ``signal`` once and scrub the read-out with a slider in Jupyter.

    lm: a ContinuousLM; signal: a Signal made from text; spans: character spans (from
    ``signal.find``) whose tokens are scaled. factors: the duration factors (default 0.1
    to 2 in 20 steps, 1 included); top: how many tokens to track (those most likely at
    some factor). Returns an :class:`Exploration`; displaying it shows the slider and
    the bars (ipywidgets, the ``widgets`` extra). Raises SignalError for bad spans or
    factors, before the model runs.
    """
    from contllm.core.signal import Signal
    from contllm.errors import SignalError

    if not isinstance(signal, Signal):
        raise SignalError(f"explore takes a Signal, got {type(signal).__name__}; build one with lm.signal(text)")
    values = [i / 10 for i in range(1, 21)] if factors is None else [float(f) for f in factors]
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise SignalError(f"factors must be finite numbers >= 0, at least one, got {factors!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise SignalError(f"top must be an integer >= 1, got {top!r}")
    edited = signal.token_indices(spans)
    signals = [signal.scale_tokens(edited, v) for v in values]
    probs = lm.probs(signals)  # [S, vocab]
    peak = probs.max(dim=0).values
    tracked = peak.argsort(descending=True)[:top].tolist()
    labels = [lm.tokenizer.decode([i]) if lm.tokenizer is not None else f"<id {i}>" for i in tracked]
    table = [[float(p) for p in row] for row in probs[:, tracked]]
    return Exploration(values, labels, table, signals)
