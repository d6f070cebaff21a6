"""The atlas of ``contllm audit --compare``: every number of the cards against the model's size, one figure each.

For each headline number and paper metric the compared cards hold, :func:`entries` makes one
:class:`Entry`: each card's value as a :class:`Point` at its model's parameter count, every
pair of cards with whether their difference is *resolved* (:func:`resolved`: only where their
95% bootstrap intervals do not overlap) and the sentence its figure states (:func:`trend`).
:func:`draw` makes the figure in the house style of :mod:`contllm.plotting` (the finding as
the title, the item count beside each point, the legend outside the data), :func:`write`
saves each as ``atlas/<name>.png`` with a name made by :func:`contllm.rundir.files.data_name`.

Where a model's size comes from (:func:`model_size`): the parameter count and the family
that the card's runs recorded in their manifest.json, else the model registry's
(:data:`contllm.models.REGISTRY`, by the card's model name; runs made before manifests
recorded a parameter count). A card whose parameter count stays unknown is left out of the
figures with a note saying why; its numbers still take part in the pairs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from contllm.audits.card import Card, Finding, Number
from contllm.errors import RunDirectoryError

#: The folder of the figures, beside compare.html.
ATLAS = "atlas"

#: The sentences a figure can state (:func:`trend`).
RISES = "Rises with scale: the larger model is higher in every resolved pair"
FALLS = "Falls with scale: the larger model is lower in every resolved pair"
MIXED = "No single trend: resolved pairs go both ways with scale"
FLAT = "Flat with scale: each value lies within the others' intervals"
UNRESOLVED = "No trend resolved at these item counts"
ONE_SIZE = "One model size only: no trend with scale to read"
NO_PAIR = "No two sizes under one protocol: no trend to read"
NOTHING = "No model of known size gives this number"

#: Marker shapes, one per model family in order of appearance (cycled).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: Colour and fill per protocol: the toolkit's filled, the paper's open.
PROTOCOL_STYLE = {"contllm": ("C0", True), "paper": ("C3", False)}
#: Horizontal spread (a factor on the log axis) between points of one parameter count.
DODGE = 1.07


@dataclass(frozen=True)
class Size:
    """What is known of a card's model. parameters, family: None where unknown; note: why the count is unknown."""

    parameters: int | None
    family: str | None
    note: str = ""


@dataclass(frozen=True)
class Point:
    """One card's value of one number: label (the card's), protocol, model size and family, value and its 95%
    interval (None where undefined), items (how many records the run holds)."""

    label: str
    protocol: str
    family: str | None
    parameters: int | None
    value: float | None
    low: float | None
    high: float | None
    items: int

    @property
    def interval(self) -> bool:
        return self.value is not None and self.low is not None and self.high is not None


@dataclass(frozen=True)
class Pair:
    """Two cards' values of one number; resolved: their intervals do not overlap; higher: the point of the higher
    value where resolved (None otherwise)."""

    first: Point
    second: Point
    resolved: bool
    higher: Point | None


@dataclass(frozen=True)
class Entry:
    """One number across the cards: its figure's points, the cards left out of it and why, every pair of cards
    that give it, the sentence and the numbers behind it, the figure's file name (without .png) and, once
    written (:func:`write`), its path."""

    experiment: str
    metric: str
    role: str
    direction: str
    meaning: str
    points: list[Point]
    left_out: list[tuple[str, str]]
    pairs: list[Pair]
    sentence: str
    detail: str
    name: str
    figure: Path | None = field(default=None)

    @property
    def plotted(self) -> list[Point]:
        """The points of the figure: a value and a known parameter count."""
        return [p for p in self.points if p.value is not None and p.parameters is not None]


# ---------------------------------------------------------------------------- sizes


def registry_size(model: str) -> tuple[int | None, str | None]:
    """(parameters, family) of an embedded model of the registry by its alias; (None, None) for any other name."""
    from contllm.core.families import FAMILIES
    from contllm.models.catalog import REGISTRY

    entry = REGISTRY.get(model)
    if entry is None:
        return None, None
    family = next((f.name for f in FAMILIES if entry.family in f.model_types), entry.family)
    return entry.n_parameters, family


def recorded(card: Card, directory: Path) -> tuple[int | None, str | None]:
    """(parameter count, family) of the model as the card's runs recorded them (their manifest.json, under
    ``directory``); None for what none recorded."""
    from contllm.rundir import schemas
    from contllm.rundir.files import inside, read_json
    from contllm.rundir.runs import MANIFEST

    for f in card.findings:
        try:
            manifest = read_json(inside(directory, Path(f.run) / MANIFEST), schema=schemas.MANIFEST)
        except RunDirectoryError:  # no run beside the card (a card.json alone), or one that cannot be read
            continue
        parameters, family = manifest.get("parameters"), manifest.get("family")
        if parameters or family:
            return (parameters if isinstance(parameters, int) else None), (family or None)
    return None, None


def model_size(card: Card, directory: Path) -> Size:
    """The size and family of the card's model (``directory``: the card's audit directory)."""
    parameters, family = recorded(card, directory)
    if parameters is None or family is None:  # runs made before manifests recorded both: the registry's
        listed, listed_family = registry_size(card.model)
        parameters, family = parameters or listed, family or listed_family
    note = (
        ""
        if parameters is not None
        else f"its parameter count is unknown: its runs recorded none and {card.model!r} is not an embedded "
        "model of the registry (contllm models)"
    )
    return Size(parameters, family, note)


def parameters_text(n: float) -> str:
    """A parameter count as people write it: 135M, 1.78B."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def family_text(family: str | None) -> str:
    """A family's name for a legend: Llama, Gemma3, Qwen2 (``family``: the family table's name)."""
    return "unknown family" if not family else family[:1].upper() + family[1:]


# ---------------------------------------------------------------------------- pairs and trends


def resolved(a: Point, b: Point) -> bool:
    """Whether the difference of ``a`` and ``b`` is resolved: both have an interval and the two do not overlap
    (intervals that touch overlap)."""
    if not (a.interval and b.interval):
        return False
    return a.high < b.low or b.high < a.low  # type: ignore[operator]


def pairs(points: Sequence[Point]) -> list[Pair]:
    """Every pair of the points that have a value, in the cards' order."""
    valued = [p for p in points if p.value is not None]
    out = []
    for a, b in combinations(valued, 2):
        apart = resolved(a, b)
        higher = (a if a.value > b.value else b) if apart else None  # type: ignore[operator]
        out.append(Pair(a, b, apart, higher))
    return out


def _within(a: Point, b: Point) -> bool:
    """Each value lies inside the other's interval."""
    return (
        a.interval
        and b.interval
        and b.low <= a.value <= b.high  # type: ignore[operator]
        and a.low <= b.value <= a.high  # type: ignore[operator]
    )


def trend(points: Sequence[Point]) -> tuple[str, str]:
    """The sentence a figure of ``points`` (each with a value and a parameter count) states, and the count behind it.

    Only pairs of different sizes under one protocol speak of scale. Where some of them are
    resolved: :data:`RISES` if the larger model is the higher in each, :data:`FALLS` if the
    lower in each, :data:`MIXED` otherwise. Where none is: :data:`FLAT` if in every pair each
    value lies inside the other's interval, else :data:`UNRESOLVED`. One size only:
    :data:`ONE_SIZE`; sizes that differ only between protocols: :data:`NO_PAIR`.
    """
    if not points:
        return NOTHING, ""
    sizes = {p.parameters for p in points}
    if len(sizes) < 2:
        size = parameters_text(float(next(iter(sizes)) or 0))
        return ONE_SIZE, f"{len(points)} card{'s' if len(points) > 1 else ''}, every model of {size} parameters"
    across = [(a, b) for a, b in combinations(points, 2) if a.protocol == b.protocol and a.parameters != b.parameters]
    apart = [(a, b) for a, b in across if resolved(a, b)]
    detail = f"{len(apart)} of {len(across)} pairs of different sizes under one protocol resolved"
    if not across:
        return NO_PAIR, "the sizes differ only between cards of different protocols"
    if apart:
        rising = [(a.value > b.value) == (a.parameters > b.parameters) for a, b in apart]  # type: ignore[operator]
        return (RISES if all(rising) else FALLS if not any(rising) else MIXED), detail
    if all(_within(a, b) for a, b in across):
        return FLAT, detail
    return UNRESOLVED, detail


# ---------------------------------------------------------------------------- entries


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _find(card: Card, experiment: str, metric: str) -> tuple[Finding, Number] | None:
    for f in card.findings:
        if f.experiment == experiment:
            number = next((n for n in f.numbers if n.metric == metric), None)
            return None if number is None else (f, number)
    return None


def _file_name(experiment: str, metric: str, taken: set[str]) -> str:
    """A file name (without .png) of one number's figure, distinct from those ``taken``."""
    from contllm.rundir.files import data_name

    name = data_name(f"{experiment}.{metric}")
    if name in taken:  # "a.b" + "c" and "a" + "b.c": the pair itself, hashed, is distinct
        name = data_name(json.dumps([experiment, metric]))
    taken.add(name)
    return name


def entries(cards: Sequence[tuple[str, Card, Path]], sizes: Sequence[Size] | None = None) -> list[Entry]:
    """One :class:`Entry` per (experiment, metric) any card holds, in the order the cards give them.

    cards: (label, card, its audit directory) each. sizes: each card's :class:`Size`
    (None: :func:`model_size` of each). Reads, never writes.
    """
    sizes = [model_size(card, directory) for _, card, directory in cards] if sizes is None else list(sizes)
    rows: dict[tuple[str, str], None] = {}
    for _, card, _ in cards:
        for f in card.findings:
            for n in f.numbers:
                rows[(f.experiment, n.metric)] = None
    taken: set[str] = set()
    out = []
    for experiment, metric in rows:
        points: list[Point] = []
        left_out: list[tuple[str, str]] = []
        first: Number | None = None
        for (label, card, _), size in zip(cards, sizes):
            found = _find(card, experiment, metric)
            if found is None:
                continue
            finding, number = found
            first = first or number
            point = Point(
                label,
                card.protocol,
                size.family,
                size.parameters,
                _finite(number.value),
                _finite(number.low),
                _finite(number.high),
                finding.items,
            )
            points.append(point)
            if point.value is None:
                left_out.append((label, "its value is undefined (n/a on its card)"))
            elif point.parameters is None:
                left_out.append((label, size.note))
        assert first is not None  # the row came from some card
        entry = Entry(
            experiment,
            metric,
            first.role,
            first.direction,
            first.meaning,
            points,
            left_out,
            pairs(points),
            "",
            "",
            _file_name(experiment, metric, taken),
        )
        sentence, detail = trend(entry.plotted)
        out.append(dataclasses.replace(entry, sentence=sentence, detail=detail))
    return out


# ---------------------------------------------------------------------------- figures


def _offsets(points: Sequence[Point]) -> list[float]:
    """The x of each point: its parameter count, spread by :data:`DODGE` among points of the same count."""
    groups: dict[int, list[int]] = {}
    for k, p in enumerate(points):
        groups.setdefault(int(p.parameters or 0), []).append(k)
    xs = [0.0] * len(points)
    for parameters, members in groups.items():
        for rank, k in enumerate(members):
            xs[k] = parameters * DODGE ** (rank - (len(members) - 1) / 2)
    return xs


#: Marker size and error-bar cap of a point (points); the labels keep clear of both.
MARKER_SIZE = 7
CAP = 3
#: The most characters of a number's meaning in the line under a figure's title.
MEANING = 72
#: The gap (points) between a group of points and its labels.
LABEL_GAP = 8


def _obstacles(ax: Any, points: Sequence[Point], xs: Sequence[float]) -> list[Any]:
    """The display boxes of every point's marker and error bar, as drawn on ``ax`` (its layout done)."""
    from matplotlib.transforms import Bbox

    scale = ax.figure.dpi / 72
    half = (MARKER_SIZE / 2 + 1) * scale
    cap = (CAP + 1) * scale
    boxes = []
    for p, x in zip(points, xs):
        value = float(p.value)  # type: ignore[arg-type]
        X, Y = ax.transData.transform((x, value))
        boxes.append(Bbox([[X - half, Y - half], [X + half, Y + half]]))
        if p.interval:
            _, low = ax.transData.transform((x, float(p.low)))  # type: ignore[arg-type]
            _, high = ax.transData.transform((x, float(p.high)))  # type: ignore[arg-type]
            boxes.append(Bbox([[X - cap, min(low, Y)], [X + cap, max(high, Y)]]))
    return boxes


def _overlap(box: Any, others: Sequence[Any]) -> float:
    """The area ``box`` shares with ``others`` (display units squared)."""
    total = 0.0
    for other in others:
        w = min(box.x1, other.x1) - max(box.x0, other.x0)
        h = min(box.y1, other.y1) - max(box.y0, other.y0)
        if w > 0 and h > 0:
            total += w * h
    return total


def _label_points(ax: Any, points: Sequence[Point], xs: Sequence[float]) -> None:
    """Write "label · n=items" beside each point, clear of every marker, error bar and label already written.

    Points of one size are labelled top to bottom in the order of their values. Each label
    takes the first place that is clear and inside the panel among: right of its group at its
    value, left of it, then the same higher or lower by steps of 0.6 of a label's height, up to
    about five heights away; where none is clear, the place that covers least. A label moved
    off its value has a thin line to its point. A label's " (protocol)" is left out: the
    marker's colour and fill say it. Needs the figure laid out (positions in display units).
    """
    from matplotlib.transforms import Bbox

    from contllm.plotting import shortened

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72
    area = ax.get_window_extent(renderer)
    taken = _obstacles(ax, points, xs)
    groups: dict[int, list[int]] = {}
    for k, p in enumerate(points):
        groups.setdefault(int(p.parameters or 0), []).append(k)
    for members in groups.values():
        right, left = max(xs[k] for k in members), min(xs[k] for k in members)
        for k in sorted(members, key=lambda k: -float(points[k].value)):  # type: ignore[arg-type]
            name = points[k].label.removesuffix(f" ({points[k].protocol})")  # the marker's colour says the protocol
            value = float(points[k].value)  # type: ignore[arg-type]
            words = f"{shortened(name, 28)} · n={points[k].items}"
            # measured first, then written where there is room
            text = ax.text(0, 0, words, fontsize=7, transform=ax.transAxes)
            size = text.get_window_extent(renderer)
            w, h = size.width, size.height
            best: tuple[float, float, float, str, Any] | None = None
            for step in (0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -8):
                dy = step * h * 0.6
                for align, x in (("left", right), ("right", left)):  # right of the group, then left of it
                    X, Y = ax.transData.transform((x, value))
                    x0 = X + LABEL_GAP * scale if align == "left" else X - LABEL_GAP * scale - w
                    box = Bbox([[x0, Y + dy - h / 2], [x0 + w, Y + dy + h / 2]])
                    inside = area.x0 <= box.x0 and box.x1 <= area.x1 and area.y0 <= box.y0 and box.y1 <= area.y1
                    cost = _overlap(box, taken) + (0.0 if inside else w * h)
                    if best is None or cost < best[0]:
                        best = (cost, x, dy / scale, align, box)
                    if cost == 0:
                        break
                if best is not None and best[0] == 0:
                    break
            assert best is not None
            _, x, dy, align, box = best
            # Anchored at the point itself, so that a label moved off its value draws a thin line to it.
            (start, _), (own, _) = ax.transData.transform([(x, value), (xs[k], value)])
            text.remove()
            line = {"arrowstyle": "-", "color": "0.6", "lw": 0.6, "shrinkA": 1, "shrinkB": MARKER_SIZE / 2 + 1}
            ax.annotate(
                words,
                (xs[k], value),
                xytext=((start - own) / scale + (LABEL_GAP if align == "left" else -LABEL_GAP), dy),
                textcoords="offset points",
                fontsize=7,
                color="0.3",
                va="center",
                ha=align,
                arrowprops={**line, "relpos": (0.0 if align == "left" else 1.0, 0.5)} if dy else None,
            )
            taken.append(box)


def _fit_detail(line: Any, entry: Entry) -> None:
    """Shorten the meaning in ``line``, the line under the title, until it ends inside the figure (the pairs stay
    whole)."""
    from contllm.plotting import shortened

    figure = line.get_figure(root=True)
    renderer = figure.canvas.get_renderer()
    limit = min(len(entry.meaning), MEANING)
    while line.get_window_extent(renderer).x1 > figure.bbox.x1 and limit > 12:
        limit -= 3
        line.set_text("; ".join(d for d in (shortened(entry.meaning, limit), entry.detail) if d))


def _style(protocol: str, order: Sequence[str]) -> tuple[str, bool]:
    if protocol in PROTOCOL_STYLE:
        return PROTOCOL_STYLE[protocol]
    return f"C{2 + order.index(protocol) % 6}", True


def draw(entry: Entry, title: str = "audits compared") -> Any:
    """The figure of ``entry``: each plotted point's value against its parameter count (log x) with its 95% interval
    as an error bar and its item count beside it; the marker is the family, the colour and fill the protocol.
    Titled with the entry's sentence; ``title`` heads the figure. Nothing is saved."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from contllm.plotting import finding, heading, legend_outside, plt, shortened

    points = entry.plotted
    fig, ax = plt.subplots(figsize=(8.5, 4.6), constrained_layout=True)
    families = list(dict.fromkeys(p.family for p in points))
    protocols = list(dict.fromkeys(p.protocol for p in points))
    marker = {f: MARKERS[k % len(MARKERS)] for k, f in enumerate(families)}
    xs = _offsets(points)
    for p, x in zip(points, xs):
        colour, filled = _style(p.protocol, protocols)
        value = float(p.value)  # type: ignore[arg-type]
        error = None
        if p.interval:
            error = [[max(0.0, value - p.low)], [max(0.0, p.high - value)]]  # type: ignore[operator]
        ax.errorbar(
            [x],
            [value],
            yerr=error,
            fmt=marker[p.family],
            color=colour,
            mfc=colour if filled else "white",
            mec=colour,
            ms=MARKER_SIZE,
            capsize=CAP,
            lw=1.2,
        )
    counts = [int(p.parameters or 0) for p in points]
    low, high = min(counts) / 3.2, max(counts) * 4.0  # room for labels left of the smallest and right of the largest
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    decades = math.log10(high / low)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: parameters_text(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("parameters (log scale); bars: 95% bootstrap intervals over items; n: items")
    ax.set_ylabel(f"{shortened(entry.metric, 36)}\n({entry.direction} is better)")
    ax.grid(alpha=0.25)
    handles = [
        Line2D(
            [], [], marker=marker[f], linestyle="none", color="0.35", label=f"family: {shortened(family_text(f), 18)}"
        )
        for f in families
    ]
    for protocol in protocols:
        colour, filled = _style(protocol, protocols)
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                linestyle="none",
                color=colour,
                mfc=colour if filled else "white",
                label=f"protocol: {shortened(protocol, 18)}",
            )
        )
    legend_outside(ax, handles=handles)
    detail = "; ".join(d for d in (shortened(entry.meaning, MEANING), entry.detail) if d)
    finding(ax, entry.sentence, detail)
    role = " (the paper's)" if entry.role == "paper" else ""
    heading(
        fig, title, f"{shortened(entry.experiment, 24)} · {shortened(entry.metric, 40)}{role}", len(points), "cards"
    )
    # The line under the title is shortened to the room the layout leaves (it takes no room from the panel); the labels
    # go where the laid-out figure has room; the layout then stays as it is (a later one would move them).
    lines = [t for t in ax.texts if detail and t.get_text() == detail]
    for line in lines:
        line.set_in_layout(False)
    fig.draw_without_rendering()
    for line in lines:
        _fit_detail(line, entry)
    _label_points(ax, points, xs)
    fig.set_layout_engine("none")
    return fig


def write(atlas: Sequence[Entry], folder: Path) -> list[Entry]:
    """Draw and save the figure of every entry with a point as folder/<name>.png (replacing one of that name); the
    entries with their figure's path (None: no figure)."""
    from contllm.plotting import save_figure
    from contllm.rundir.files import inside

    out = []
    for entry in atlas:
        if not entry.plotted:
            out.append(entry)
            continue
        stem = inside(folder, entry.name)
        [path] = save_figure(draw(entry), stem, formats=("png",))
        out.append(dataclasses.replace(entry, figure=path))
    return out
