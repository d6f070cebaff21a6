"""card.html and the comparison page: self-contained pages of one card or several side by side.

The pages follow the explorer's conventions: style and figures inline (figures as PNG data
URIs), nothing fetched, so they open from the file system and work offline. Every text
read from data (model names, sentences, metric meanings, paths) is escaped for the markup
(:func:`contllm.rundir.pages.html_text`); the card's data rides along in a
``<script type="application/json" id="card-data">`` element (:func:`contllm.rundir.pages.json_in_html`).
Links to runs and explorer pages are relative, so a moved audit directory keeps them.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from contllm.audits.atlas import ATLAS, Entry, Pair, Point, family_text, parameters_text
from contllm.audits.card import Card, Finding, Number
from contllm.rundir.pages import html_text, json_in_html


def _css() -> str:
    return (resources.files("contllm") / "assets" / "card.css").read_text(encoding="utf-8")


def _figure(path: Path) -> str | None:
    """A PNG as a data URI, or None where it cannot be read."""
    try:
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError:
        return None


def fmt(value: float | None) -> str:
    """A number as the pages write it: three significant decimals, "n/a" for None."""
    return "n/a" if value is None else f"{value:.3f}"


def interval(number: Any) -> str:
    """A number's interval, "[low, high]" (a :class:`Number` or a reference's dict; "" without one)."""
    if isinstance(number, dict):
        low, high = number.get("low"), number.get("high")
    else:
        low, high = number.low, number.high
    return "" if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]"


def _value_cell(number: Number) -> str:
    return (
        f'<td class="num"><span class="value">{fmt(number.value)}</span> '
        f'<span class="ci">{html_text(interval(number))}</span></td>'
    )


def _reference_models(card: Card) -> list[str]:
    models: list[str] = []
    for f in card.findings:
        for n in f.numbers:
            models += [m for m in n.reference if m not in models]
    return models


def _reference_head(models: Sequence[str]) -> str:
    return "".join(f'<th>{html_text(m)}<div class="role">reference</div></th>' for m in models)


def _reference_cell(number: Number, model: str) -> str:
    ref = number.reference.get(model)
    if ref is None:
        return '<td class="num ref">-</td>'
    return (
        f'<td class="num ref">{fmt(ref.get("value"))} <span class="ci">{html_text(interval(ref))}</span>'
        f'<span class="items"> ({html_text(ref.get("items"))} items)</span></td>'
    )


def _numbers_table(finding: Finding, models: Sequence[str]) -> str:
    head = _reference_head(models)
    rows = []
    for n in finding.numbers:
        role = "headline" if n.role == "headline" else "the paper's"
        rows.append(
            f'<tr class="{html_text(n.role)}"><td><code>{html_text(n.metric)}</code><div class="role">{role}, '
            f"{html_text(n.direction)} is better</div></td>{_value_cell(n)}"
            + "".join(_reference_cell(n, m) for m in models)
            + f'<td class="meaning">{html_text(n.meaning)}</td></tr>'
        )
    if not any(n.role == "paper" for n in finding.numbers):
        rows.append(
            f'<tr><td colspan="{3 + len(models)}" class="note">The paper gives this result no number of its own; '
            "it shows it in figures.</td></tr>"
        )
    return (
        f'<table class="numbers"><tr><th>metric</th><th>this model, 95% CI</th>{head}<th>meaning</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _links(finding: Finding, base: str) -> str:
    parts = [f'<a href="{html_text(_join(base, finding.run))}/">run directory</a>']
    if finding.explorer:
        parts.insert(0, f'<a href="{html_text(_join(base, finding.explorer))}">explorer</a>')
    return " · ".join(parts)


def _join(base: str, relative: str) -> str:
    return relative if base in ("", ".") else f"{base}/{relative}"


def _about(card: Card) -> str:
    """How the card was made, as a list: protocol, budget, counts, calibration, what was left out, time, intervals."""
    plan = card.plan
    rows = [("protocol", card.protocol)]
    budget = plan.get("budget")
    if budget:
        from contllm.audits.budget import budget_text

        rows.append(("budget", budget_text(budget)))
    rows.append(("items", ", ".join(f"{f.experiment} {f.items}" for f in card.findings)))
    choice = card.dtype_choice
    if choice:
        rows.append(("dtype", f"{choice.get('dtype')} (--dtype auto): {choice.get('reason')}"))
    calibration = plan.get("calibration")
    if calibration:
        rows.append(
            (
                "calibration",
                f"one forward of {calibration['signals']} signals ({calibration['tokens']} tokens) took "
                f"{calibration['seconds']:.2f} s, {1000 * calibration['rate']:.2f} ms per token; {plan['spent']:.0f} s "
                f"went before the plan (loading, calibrating), {plan['available']:.0f} s were planned for the runs",
            )
        )
    rows += [(name, why) for name, why in (plan.get("left_out") or {}).items()]
    total = card.seconds.get("total")
    if total is not None:
        since = " since it resumed" if card.seconds.get("resumed") else ""
        rows.append(("time", f"{total:.0f} s{since}"))
    rows.append(
        (
            "intervals",
            f"{round(100 * card.bootstrap.get('level', 0.95))}% percentile bootstrap over items, "
            f"{card.bootstrap.get('resamples')} resamples",
        )
    )
    return '<ul class="meta">' + "".join(f"<li><b>{html_text(k)}</b>: {html_text(v)}</li>" for k, v in rows) + "</ul>"


def card_page(card: Card, out: Path) -> str:
    """The self-contained page of ``card``, whose audit directory is ``out`` (figures are read from it)."""
    models = _reference_models(card)
    rows = []
    sections = []
    for f in card.findings:
        head = f.headline
        rows.append(
            f'<tr><td><a href="#{html_text(f.experiment)}">{html_text(f.experiment)}</a></td>'
            f'<td class="sentence">{html_text(f.sentence)}</td>'
            f"<td><code>{html_text(head.metric)}</code></td>{_value_cell(head)}"
            + "".join(_reference_cell(head, m) for m in models)
            + f"<td>{_links(f, '.')}</td></tr>"
        )
        image = _figure(out / f.figure) if f.figure else None
        figure = f'<img alt="{html_text(f.experiment)} summary figure" src="{image}">' if image else ""
        sections.append(
            f'<section id="{html_text(f.experiment)}"><h2>{html_text(f.experiment)} '
            f'<span class="items">{f.items} items</span></h2><p class="sentence">{html_text(f.sentence)}</p>'
            f"{_numbers_table(f, models)}<p>{_links(f, '.')}</p>{figure}</section>"
        )
    ref_head = _reference_head(models)
    reference = _reference_note(card)
    title = f"How continuous is {card.model}?"
    return _page(
        title,
        _about(card) + f'<table class="overview"><tr><th>result</th><th>what was found</th><th>headline</th>'
        f"<th>this model, 95% CI</th>{ref_head}<th></th></tr>{''.join(rows)}</table>{reference}" + "".join(sections),
        card.to_dict(),
    )


def _reference_note(card: Card) -> str:
    about = card.reference
    if not about or not about.get("audits"):
        return '<p class="note">No reference numbers ship with this package.</p>'
    lines = "; ".join(
        f"{a.get('model')} ({a.get('protocol')}) measured {a.get('measured')} on {_machine(a.get('machine'))}"
        for a in about["audits"]
    )
    return f'<p class="note">Reference columns: {html_text(lines)} ({html_text(about.get("file"))}).</p>'


def _machine(machine: Any) -> str:
    if not isinstance(machine, dict):
        return "an unrecorded machine"
    return ", ".join(f"{k} {v}" for k, v in machine.items())


def _page(title: str, body: str, data: Any) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html_text(title)}</title>\n<style>\n{_css()}</style>\n</head>\n<body>\n"
        f"<h1>{html_text(title)}</h1>\n{body}\n"
        f'<script type="application/json" id="card-data">{json_in_html(data)}</script>\n</body>\n</html>\n'
    )


# ---------------------------------------------------------------------------- several cards


def compare_page(cards: Sequence[tuple[str, Card, Path]], out: Path, atlas: Sequence[Entry] = ()) -> str:
    """One page of several cards side by side: (label, card, its audit directory) each; the page goes into ``out``.

    One row per (experiment, metric) that any card holds, one column per card; the best
    value of a row (by the metric's declared direction) is marked. Under the table, the
    atlas (:mod:`contllm.audits.atlas`): each entry's figure against model size with its
    sentence, the points' values and item counts, which pairs of cards are resolved and
    which cards its figure leaves out. Below, each experiment's summary figures side by
    side, with links to each card's runs and explorer pages.
    """
    head = "".join(
        f'<th>{_link_if(d / "card.html", out, label)}<div class="role">{html_text(c.protocol)}</div></th>'
        for label, c, d in cards
    )
    rows = []
    for experiment, metric in _rows(cards):
        numbers = [_find(c, experiment, metric) for _, c, _ in cards]
        best = _best(numbers)
        meaning = next((n.meaning for n in numbers if n is not None), "")
        direction = next((n.direction for n in numbers if n is not None), "")
        cells = []
        for k, n in enumerate(numbers):
            if n is None:
                cells.append('<td class="num">-</td>')
                continue
            mark = ' class="num best"' if k in best else ' class="num"'
            items = next(f.items for f in cards[k][1].findings if f.experiment == experiment)
            cells.append(
                f'<td{mark}><span class="value">{fmt(n.value)}</span> <span class="ci">{html_text(interval(n))}</span>'
                f'<span class="items"> ({items} items)</span></td>'
            )
        rows.append(
            f"<tr><td>{html_text(experiment)}</td><td><code>{html_text(metric)}</code>"
            f'<div class="role">{html_text(direction)} is better</div></td>{"".join(cells)}'
            f'<td class="meaning">{html_text(meaning)}</td></tr>'
        )
    figures = []
    for experiment in dict.fromkeys(e for e, _ in _rows(cards)):
        cells = []
        for label, c, d in cards:
            f = next((f for f in c.findings if f.experiment == experiment), None)
            if f is None:
                cells.append('<div class="cell"></div>')
                continue
            image = _figure(d / f.figure) if f.figure else None
            base = _relative(d, out)
            picture = f'<img alt="{html_text(label)} {html_text(experiment)}" src="{image}">' if image else ""
            where = _links(f, base) if (d / f.run).is_dir() else ""
            cells.append(
                f'<div class="cell"><div class="label">{html_text(label)}</div>'
                f'<p class="sentence">{html_text(f.sentence)}</p>{picture}<p>{where}</p></div>'
            )
        figures.append(f'<section><h2>{html_text(experiment)}</h2><div class="side">{"".join(cells)}</div></section>')
    title = "Audits compared: " + ", ".join(label for label, _, _ in cards)
    data = {"cards": [{"label": label, "card": c.to_dict()} for label, c, _ in cards]}
    return _page(
        title,
        f'<table class="overview"><tr><th>result</th><th>metric</th>{head}<th>meaning</th></tr>{"".join(rows)}</table>'
        '<p class="note">Bold: the best value of a row by the metric\'s direction. Intervals: 95% bootstrap over '
        "items.</p>" + _atlas(atlas, len({c.protocol for _, c, _ in cards}) > 1) + "".join(figures),
        data,
    )


def _link_if(path: Path, out: Path, text: str) -> str:
    """``text`` as a link to ``path`` (relative to ``out``) where it exists, else as plain text."""
    if not path.is_file():
        return html_text(text)
    return f'<a href="{html_text(_relative(path, out))}">{html_text(text)}</a>'


def _relative(path: Path, out: Path) -> str:
    return Path(os.path.relpath(path.resolve(), out.resolve())).as_posix()


def _rows(cards: Sequence[tuple[str, Card, Path]]) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for _, card, _ in cards:
        for f in card.findings:
            for n in f.numbers:
                seen[(f.experiment, n.metric)] = None
    return list(seen)


def _find(card: Card, experiment: str, metric: str) -> Number | None:
    for f in card.findings:
        if f.experiment == experiment:
            return next((n for n in f.numbers if n.metric == metric), None)
    return None


def _best(numbers: Sequence[Number | None]) -> set[int]:
    """The columns holding the best value (by direction) where two or more cards have one."""
    have = [(k, n) for k, n in enumerate(numbers) if n is not None and n.value is not None]
    if len(have) < 2:
        return set()
    sign = -1.0 if have[0][1].direction == "higher" else 1.0
    top = min(sign * n.value for _, n in have)  # type: ignore[operator]
    return {k for k, n in have if sign * n.value == top}  # type: ignore[operator]


# ---------------------------------------------------------------------------- the atlas


def _atlas(atlas: Sequence[Entry], protocols: bool) -> str:
    """The atlas section: how to read its figures, then one part per entry (``protocols``: the cards differ in
    protocol, so each card is named with its own)."""
    if not atlas:
        return ""
    parts = [
        '<section id="atlas"><h2>Against model size</h2><p class="note">One figure per number: each card\'s value '
        "against its model's parameter count (log scale), the bar its 95% bootstrap interval over items, n the items "
        "behind it; the marker is the model's family, the colour and fill the protocol. A difference between two "
        "cards is resolved only where their intervals do not overlap. Each figure is also saved beside this page, in "
        f"{ATLAS}/.</p>"
    ]
    for entry in atlas:
        parts.append(_atlas_entry(entry, protocols))
    return "".join(parts) + "</section>"


def _atlas_entry(entry: Entry, protocols: bool) -> str:
    role = "headline" if entry.role == "headline" else "the paper's"
    image = _figure(entry.figure) if entry.figure is not None else None
    picture = (
        f'<img class="atlas" alt="{html_text(entry.experiment)} {html_text(entry.metric)} against model size" '
        f'src="{image}">'
        if image
        else '<p class="note">No figure: no card gives this number for a model of known size.</p>'
    )
    points = "".join(f"<li>{_point(p, protocols)}</li>" for p in entry.points)
    left = "".join(
        f"<li><b>{html_text(label)}</b> is left out of this figure: {html_text(why)}.</li>"
        for label, why in entry.left_out
    )
    detail = f' <span class="items">({html_text(entry.detail)})</span>' if entry.detail else ""
    return (
        f'<section class="atlas-entry"><h3>{html_text(entry.experiment)} · <code>{html_text(entry.metric)}</code> '
        f'<span class="role">{role}, {html_text(entry.direction)} is better</span></h3>'
        f'<p class="sentence">{html_text(entry.sentence)}{detail}</p>{picture}'
        f'<ul class="meta">{points}</ul>{_pairs(entry.pairs, protocols)}'
        + (f'<ul class="note">{left}</ul>' if left else "")
        + "</section>"
    )


def _who(point: Point, protocols: bool) -> str:
    return f"{point.label} [{point.protocol}]" if protocols else point.label


def _point(point: Point, protocols: bool) -> str:
    size = "size unknown" if point.parameters is None else f"{parameters_text(point.parameters)} parameters"
    about = f"{family_text(point.family)}, {size}" + (f", {point.protocol}" if protocols else "")
    return (
        f"<b>{html_text(point.label)}</b> ({html_text(about)}): {fmt(point.value)} "
        f'<span class="ci">{html_text(interval(point))}</span> <span class="items">n={point.items} items</span>'
    )


def _pairs(pairs: Sequence[Pair], protocols: bool) -> str:
    """Which pairs of cards are resolved (the higher named first) and which are not, each pair once."""
    if not pairs:
        return '<p class="note">Fewer than two cards give this number: no pair to resolve.</p>'
    apart = [
        f"{_who(p.higher, protocols)} higher than {_who(p.second if p.higher is p.first else p.first, protocols)}"
        for p in pairs
        if p.higher is not None
    ]
    overlap = [
        f"{_who(p.first, protocols)} vs {_who(p.second, protocols)}"
        + ("" if p.first.interval and p.second.interval else " (no interval)")
        for p in pairs
        if not p.resolved
    ]
    lines = [f"<b>Resolved</b> (intervals apart): {html_text('; '.join(apart))}" if apart else "<b>Resolved</b>: none"]
    if overlap:
        lines.append(f"<b>Not resolved</b>: {html_text('; '.join(overlap))}")
    return "".join(f'<p class="pairs">{line}.</p>' for line in lines)
