"""Pictures of attributions: a text heatmap (matplotlib), a self-contained HTML page, a summary figure.

Each takes a record of the attribution experiment (anything with ``text``, ``offsets``,
``tokens``, ``attribution``, ``occlusion``, ``shrink`` and ``span``, as
:class:`contllm.experiments.attribution.ItemAttribution` has) and returns a figure or a
string; nothing is written here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from contllm.rundir.pages import html_text
from contllm.wording import ladder

#: Characters per line of the text heatmap before a line is wrapped.
WRAP = 96


def _pieces(record: Any) -> Iterator[tuple[int, str]]:
    """(token index, text) for every token; text between tokens goes with the token after it."""
    previous = 0
    for i, (a, b) in enumerate(record.offsets):
        if b <= a:
            continue
        yield i, record.text[min(previous, a) : b]
        previous = b


def _values(record: Any, measure: str) -> dict[int, float]:
    return {j: float(v) for j, v in zip(record.tokens, getattr(record, measure))}


def _scale(values: dict[int, float]) -> float:
    top = max((abs(v) for v in values.values()), default=0.0)
    return top if top > 0 else 1.0


def text_heatmap(record: Any, *, measure: str = "attribution", title: str = "") -> Any:
    """The prompt as text, each attributed token on a background coloured by its value (red +, blue -).

    Tokens that are not attributed are grey; tokens of the span are bold.
    """
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    from contllm.plotting import plt

    values = _values(record, measure)
    top = _scale(values)
    cmap, norm = colormaps["RdBu_r"], Normalize(-top, top)
    span = set(record.span)
    lines: list[list[tuple[int, str]]] = [[]]
    width = 0
    for i, piece in _pieces(record):
        parts = piece.split("\n")
        for k, part in enumerate(parts):
            if k:
                lines.append([])
                width = 0
            if width + len(part) > WRAP and lines[-1]:
                lines.append([])
                width = 0
            if part:
                lines[-1].append((i, part))
                width += len(part)
    char_w, line_h = 0.0071, 1.0  # a monospace character at 8 pt over the axes width
    fig_h = 1.2 + 0.22 * len(lines)
    fig = plt.figure(figsize=(11, fig_h))
    ax = fig.add_axes((0.02, 0.02, 0.86, 1 - 0.9 / fig_h))
    ax.set_xlim(0, 1)
    ax.set_ylim(len(lines) * line_h, -0.5)
    ax.axis("off")
    for row, line in enumerate(lines):
        x = 0.0
        for i, part in line:
            shown = part.replace("\t", " ")
            # an attributed token sits on its colour; the others are drawn grey
            style = (
                {"bbox": {"facecolor": cmap(norm(values[i])), "edgecolor": "none", "pad": 0.6}}
                if i in values
                else {"color": "0.55"}
            )
            ax.text(
                x,
                row * line_h,
                shown,
                family="monospace",
                fontsize=8,
                va="center",
                ha="left",
                fontweight="bold" if i in span else "normal",
                **style,
            )
            x += char_w * len(shown)
    bar = fig.add_axes((0.9, 0.15, 0.015, 0.7))
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=bar, label=measure)
    fig.suptitle(title or measure, fontsize=10, x=0.02, ha="left")
    return fig


def _colour(value: float, top: float) -> str:
    """A CSS background for ``value`` on a red (+) / blue (-) scale up to |top|."""
    share = min(1.0, abs(value) / top)
    red, blue = (255, 80, 60), (50, 110, 230)
    r, g, b = red if value > 0 else blue
    return f"rgba({r},{g},{b},{0.85 * share:.3f})"


def html_page(record: Any, *, model: str = "") -> str:
    """A self-contained HTML page: the prompt coloured by attribution (hover for all three measures) and a table."""
    values = {m: _values(record, m) for m in ("attribution", "occlusion", "shrink")}
    top = _scale(values["attribution"])
    span = set(record.span)
    out = []
    for i, piece in _pieces(record):
        text = html_text(piece).replace("\n", "<br>\n")
        if i in values["attribution"]:
            tip = " ".join(f"{m} {values[m][i]:+.4g}" for m in values)
            style = f"background:{_colour(values['attribution'][i], top)}"
            cls = ' class="span"' if i in span else ""
            out.append(f'<span{cls} style="{style}" title="token {i}: {html_text(tip)}">{text}</span>')
        else:
            out.append(f'<span class="off" title="token {i}: not attributed">{text}</span>')
    order = sorted(range(len(record.tokens)), key=lambda k: -abs(float(record.attribution[k])))
    rows = "\n".join(
        f"<tr><td>{html_text(record.tokens[k])}</td><td><code>{html_text(repr(record.text[slice(*record.offsets[record.tokens[k]])]))}</code></td>"
        f"<td>{'yes' if record.tokens[k] in span else ''}</td><td>{record.attribution[k]:+.5f}</td>"
        f"<td>{record.occlusion[k]:+.5f}</td><td>{record.shrink[k]:+.5f}</td></tr>"
        for k in order
    )
    total = record.full - record.baseline
    head = html_text(f"{model} · {record.item_id} · {record.readout}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{head}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 70em; }}
.text {{ font-family: monospace; white-space: pre-wrap; line-height: 1.9; border: 1px solid #ccc; padding: 1em; }}
.off {{ color: #999; }} .span {{ font-weight: bold; text-decoration: underline; }}
table {{ border-collapse: collapse; font-size: 90%; }} td, th {{ border: 1px solid #ddd; padding: 2px 8px; text-align: right; }}
</style></head><body>
<h2>{head}</h2>
<p>Background: integrated-gradient attribution of the read-out along the duration path (red raises it, blue
lowers it; grey tokens are not attributed; bold underlined tokens are the span the experiment scales). Hover a
token for its attribution, occlusion (deleted alone) and shrink (halved alone).</p>
<p>f(prompt) = {record.full:.6g}, f(baseline) = {record.baseline:.6g}, sum of attributions =
{float(np.sum(record.attribution)):.6g} (target {total:.6g}; relative completeness error
{record.completeness_error:.3g}; {record.steps} steps).</p>
<div class="text">{"".join(out)}</div>
<h3>Attributed tokens, largest |attribution| first</h3>
<table><tr><th>index</th><th>token</th><th>span</th><th>attribution</th><th>occlusion</th><th>shrink</th></tr>
{rows}
</table></body></html>
"""


def attribution_finding(precision: float, chance: float) -> tuple[str, str]:
    """The sentence an attribution summary opens with: the mean share of the top-|attribution| tokens that lie in the
    scaled span (precision@k) against chance; 0.2 above chance reads as "points at", 0.05 as "more often than chance"."""
    detail = (
        f"{precision:.0%} of the k most attributed tokens lie in the scaled span (chance {chance:.0%}; k: its tokens)"
    )
    return ladder("attribution").shifted(chance)(precision), detail


def summary_figure(result: Any) -> Any:
    """First, the finding: the mean precision@k of the three measures against chance; then each item's completeness
    error (how exactly the attributions add up to the change of the read-out)."""
    from contllm.plotting import finding, heading, legend_outside, plt

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(14, 4.8), constrained_layout=True, gridspec_kw={"width_ratios": [1.5, 1]}
    )
    measures = ("attribution", "occlusion", "shrink")
    means = [np.nanmean([r.precision(getattr(r, m)) for r in result.items]) for m in measures]
    chance = float(np.mean([r.chance() for r in result.items]))
    names = ["integrated gradients\n(attribution)", "leaving a token out\n(occlusion)", "shrinking a token\n(shrink)"]
    left.bar(names, means, color=["tab:red", "tab:gray", "tab:blue"])
    left.axhline(chance, ls="--", color="k", lw=1, label=f"chance: {chance:.2f}")
    left.set_ylim(0, 1)
    left.set_ylabel("share of the top-|value| tokens\nin the scaled span (mean precision@k)")
    finding(left, *attribution_finding(float(means[0]), chance))
    legend_outside(left)
    errors = [max(r.completeness_error, 1e-16) for r in result.items]
    right.semilogy(range(len(errors)), errors, "o", color="tab:red")
    right.set_xticks(range(len(errors)), [r.item_id for r in result.items], rotation=60, fontsize=7)
    right.set_ylabel("relative completeness error")
    right.set_title(
        "How exactly the attributions add up to the change\n(relative error, lower is better)", loc="left", fontsize=9
    )
    right.grid(alpha=0.3)
    heading(fig, result.model, "attribution", len(result.items))
    return fig
