"""The atlas of ``contllm audit --compare``: which pairs are resolved, what each figure says, who is left out and why.

Cards built here with the real card classes, of embedded models whose sizes the registry
knows (SmolLM2-135M, Gemma 3 270M, Qwen2.5-Coder 0.5B and 1.5B) and of models it does not.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from contllm.audits import atlas
from contllm.audits.atlas import Point, entries, pairs, resolved, trend
from contllm.audits.card import Card, Finding, Number
from contllm.audits.run import compare
from contllm.errors import RunDirectoryError
from contllm.plotting import plt
from tests.unit.readable import check_labels_clear, check_readable

pytestmark = pytest.mark.unit

SMALL, MEDIUM, LARGE = "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
PLAN = {"budget": None, "spent": 0.0, "reserved": 0.0, "available": 0.0, "shares": []}


def number(metric: str, value: float | None, half: float | None, role: str = "headline") -> Number:
    low = None if value is None or half is None else value - half
    high = None if value is None or half is None else value + half
    return Number(metric, role, value, low, high, "higher", f"what {metric} measures", {})


def card(
    model: str,
    value: float | None,
    half: float | None = 0.05,
    *,
    protocol: str = "contllm",
    items: int = 12,
    experiment: str = "counting",
    metric: str = "pure_peak_rate",
) -> Card:
    numbers = [number(metric, value, half), number("pure_improvement_over_chance", 2.0, 0.5, "paper")]
    finding = Finding(experiment, "counting", items, f"{model} counts.", numbers)
    return Card(model, protocol, dict(PLAN), [finding], {"resamples": 100, "level": 0.95})


def point(label: str, value: float, low: float, high: float, parameters: int = 100, protocol: str = "contllm") -> Point:
    return Point(label, protocol, "llama", parameters, value, low, high, 10)


def given(*cards: Card, directory: Path = Path(".")) -> list[tuple[str, Card, Path]]:
    return [
        (f"{c.model} {k}" if [d.model for d in cards].count(c.model) > 1 else c.model, c, directory)
        for k, c in enumerate(cards)
    ]


def only(cards: list[tuple[str, Card, Path]], metric: str = "pure_peak_rate") -> atlas.Entry:
    return next(e for e in entries(cards) if e.metric == metric)


def test_a_difference_is_resolved_only_where_the_intervals_do_not_overlap() -> None:
    a, b = point("a", 0.15, 0.10, 0.20), point("b", 0.25, 0.15, 0.30)  # overlap
    c = point("c", 0.55, 0.50, 0.60)  # apart from both
    touching = point("t", 0.25, 0.20, 0.30)  # a's high is its low
    unknown = Point("u", "contllm", "llama", 100, 0.9, None, None, 10)  # no interval: never resolved
    assert not resolved(a, b) and resolved(a, c) and resolved(c, b) and not resolved(a, touching)
    assert not resolved(unknown, a) and not resolved(a, unknown)
    found = {
        (p.first.label, p.second.label): (p.resolved, p.higher and p.higher.label) for p in pairs([a, b, c, unknown])
    }
    assert found == {
        ("a", "b"): (False, None),
        ("a", "c"): (True, "c"),
        ("a", "u"): (False, None),
        ("b", "c"): (True, "c"),
        ("b", "u"): (False, None),
        ("c", "u"): (False, None),
    }


def test_the_sentence_says_rising_falling_flat_or_unresolved() -> None:
    rising = [point("s", 0.2, 0.15, 0.25, 10**8), point("m", 0.5, 0.45, 0.55, 10**9), point("l", 0.8, 0.7, 0.9, 10**10)]
    assert trend(rising) == (atlas.RISES, "3 of 3 pairs of different sizes under one protocol resolved")
    falling = [point(p.label, 1 - p.value, 1 - p.high, 1 - p.low, p.parameters) for p in rising]  # type: ignore[operator]
    assert trend(falling)[0] == atlas.FALLS
    both = [*rising[:2], point("l", 0.1, 0.05, 0.15, 10**10)]
    assert trend(both)[0] == atlas.MIXED
    flat = [point("s", 0.50, 0.45, 0.55, 10**8), point("l", 0.52, 0.47, 0.57, 10**10)]
    assert trend(flat) == (atlas.FLAT, "0 of 1 pairs of different sizes under one protocol resolved")
    # the intervals overlap, but neither value lies in the other's interval: a difference may be there, unresolved
    wide = [point("s", 0.30, 0.25, 0.50, 10**8), point("l", 0.60, 0.40, 0.65, 10**10)]
    assert trend(wide)[0] == atlas.UNRESOLVED
    # a resolved difference between protocols is no trend with scale
    protocols = [point("s", 0.2, 0.15, 0.25, 10**8), point("l", 0.8, 0.7, 0.9, 10**10, protocol="paper")]
    assert trend(protocols)[0] == atlas.NO_PAIR
    assert trend(rising[:1] + [point("s2", 0.9, 0.85, 0.95, 10**8)])[0] == atlas.ONE_SIZE
    assert trend([]) == (atlas.NOTHING, "")


def test_cards_of_embedded_models_rise_and_the_figures_are_readable() -> None:
    cards = given(card(SMALL, 0.20), card(MEDIUM, 0.50), card(LARGE, 0.80), card(SMALL, 0.22, protocol="paper"))
    entry = only(cards)
    assert entry.sentence == atlas.RISES and not entry.left_out
    assert [(p.parameters, p.family) for p in entry.plotted] == [
        (134_515_008, "llama"),
        (630_167_424, "qwen2"),
        (1_777_088_000, "qwen2"),
        (134_515_008, "llama"),
    ]
    paper = only(cards, "pure_improvement_over_chance")  # the same value on every card: flat
    assert paper.role == "paper" and paper.sentence == atlas.FLAT
    for e in (entry, paper):
        fig = atlas.draw(e)
        try:
            assert check_readable(fig) == e.sentence
            texts = [t.get_text() for t in fig.axes[0].texts]
            assert all(any(f"n={p.items}" in t and p.label in t for t in texts) for p in e.plotted), texts
            legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
            assert legend == ["family: Llama", "family: Qwen2", "protocol: contllm", "protocol: paper"]
            assert fig.axes[0].get_xscale() == "log"
        finally:
            plt.close(fig)


#: The counting atlas of docs/atlas.md as it stood: (model, protocol, value, low, high, items); crowded at both ends.
CROWDED = [
    (SMALL, "contllm", 0.370, 0.355, 0.390, 130),
    (SMALL, "paper", 0.310, 0.240, 0.385, 11),
    ("gemma3-270m", "contllm", 0.405, 0.375, 0.430, 130),
    ("gemma3-270m", "paper", 0.290, 0.220, 0.370, 10),
    (MEDIUM, "contllm", 0.860, 0.825, 0.895, 79),
    (MEDIUM, "paper", 0.967, 0.900, 1.000, 5),
    (LARGE, "contllm", 0.970, 0.935, 1.000, 19),
    (LARGE, "paper", 0.850, 0.550, 1.000, 4),
]


#: A meaning long enough that the line under the title must shorten it to stay on the figure.
MEANING = "largest change of P(1) between neighbouring alphas of the Boolean interpolation, mean over the items"


@pytest.mark.parametrize("spread", [False, True], ids=["as-measured", "one-value"])
def test_point_labels_keep_clear_of_each_other_the_markers_and_the_error_bars(spread: bool) -> None:
    cards = []
    for model, protocol, value, low, high, items in CROWDED:
        if spread:  # every point at one value, no interval: the labels of one size must stack
            value, low, high = 1.0, None, None  # type: ignore[assignment]
        number = Number("pure_peak_rate", "headline", value, low, high, "higher", MEANING, {})
        finding = Finding("counting", "counting", items, f"{model} counts.", [number])
        cards.append(Card(model, protocol, dict(PLAN), [finding], {"resamples": 100, "level": 0.95}))
    entry = only(given(*cards))
    fig = atlas.draw(entry)
    try:
        check_readable(fig)
        assert check_labels_clear(fig.axes[0]) == len(CROWDED)
    finally:
        plt.close(fig)


def test_a_card_of_unknown_size_is_left_out_with_a_note_and_the_page_says_so(tmp_path: Path) -> None:
    paths = []
    for k, c in enumerate((card(SMALL, 0.20), card("./my-finetune", 0.90), card(LARGE, 0.80, half=None))):
        (tmp_path / f"c{k}").mkdir()
        (tmp_path / f"c{k}" / "card.json").write_text(json.dumps(c.to_dict()))
        paths.append(tmp_path / f"c{k}")
    entry = only(given(*(c for c in (card(SMALL, 0.2), card("./my-finetune", 0.9)))))
    assert [p.label for p in entry.plotted] == [SMALL]
    assert entry.left_out == [("./my-finetune", entry.left_out[0][1])]
    assert "parameter count is unknown" in entry.left_out[0][1] and "'./my-finetune'" in entry.left_out[0][1]
    assert entry.sentence == atlas.ONE_SIZE
    page = compare(paths, tmp_path / "out").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert "./my-finetune is left out of this figure: its parameter count is unknown" in text
    # no interval on the large card: plotted without a bar, and its pairs are not resolved
    assert "smollm2-135m vs qwen2.5-coder-1.5b (no interval)" in text
    assert "./my-finetune vs qwen2.5-coder-1.5b (no interval)" in text
    assert "Resolved (intervals apart): ./my-finetune higher than smollm2-135m." in text
    figures = sorted(p.name for p in (tmp_path / "out" / "atlas").iterdir())
    assert figures == ["counting.pure_improvement_over_chance.png", "counting.pure_peak_rate.png"]
    assert page.count("data:image/png;base64,") == 2  # the atlas inline; these cards have no summary figures


def test_no_card_of_known_size_gives_no_figure_and_no_crash(tmp_path: Path) -> None:
    cards = given(card("mine-a", 0.2), card("mine-b", 0.8, half=0.01))
    entry = only(cards)
    assert entry.plotted == [] and entry.sentence == atlas.NOTHING and len(entry.left_out) == 2
    assert [e.figure for e in atlas.write([entry], tmp_path / "atlas")] == [None]
    assert not (tmp_path / "atlas").exists()
    assert pairs(entry.points)[0].resolved  # resolution needs no size


def test_hostile_names_become_neither_paths_nor_markup(tmp_path: Path) -> None:
    hostile = '</script><img src=x onerror=alert(1)>"'
    names = {"experiment": "../../" + hostile, "metric": "<b>x</b>/../../escape"}
    paths = []
    for k, c in enumerate(
        (card(SMALL, 0.2, **names), card(LARGE, 0.8, **names), card(hostile + "/../x", 0.5, **names))
    ):
        (tmp_path / f"c{k}").mkdir()
        (tmp_path / f"c{k}" / "card.json").write_text(json.dumps(c.to_dict()))
        paths.append(tmp_path / f"c{k}")
    out = tmp_path / "deep" / "out"
    page = compare(paths, out).read_text()
    written = sorted(tmp_path.rglob("*.png"))
    assert len(written) == 2 and all(p.parent == out / "atlas" for p in written), written
    assert all(not p.name.startswith(".") and "<" not in p.name for p in written)
    assert "<img src=x" not in page and "<b>x</b>" not in page and page.count("<script") == 1
    assert html.escape(hostile, quote=True) in page  # shown, as text
    assert "http://" not in page and "https://" not in page
    sources = re.findall(r'<img [^>]*src="([^"]*)"', page)
    assert len(sources) == 2 and all(src.startswith("data:image/png;base64,") for src in sources)
    entry = only(given(card(SMALL, 0.2, **names), card(hostile + "/../x", 0.5, **names)), names["metric"])
    assert entry.left_out[0][0] == hostile + "/../x"
    fig = atlas.draw(entry)  # a hostile experiment and metric in the figure's text: drawn, still readable
    try:
        check_readable(fig)
    finally:
        plt.close(fig)


def test_file_names_are_distinct_for_distinct_numbers() -> None:
    taken: set[str] = set()
    first = atlas._file_name("a.b", "c", taken)
    second = atlas._file_name("a", "b.c", taken)
    assert first == "a.b.c" and second != first and "/" not in second


def test_the_family_the_runs_recorded_comes_before_the_registrys(tmp_path: Path) -> None:
    c = card(SMALL, 0.2)
    (tmp_path / "counting").mkdir()
    (tmp_path / "counting" / "manifest.json").write_text(json.dumps({"family": "mistral"}))
    assert atlas.model_size(c, tmp_path) == atlas.Size(134_515_008, "mistral", "")
    (tmp_path / "counting" / "manifest.json").write_text("not json")
    assert atlas.model_size(c, tmp_path).family == "llama"  # an unreadable manifest: the registry's
    assert atlas.model_size(card("somebody/model", 0.2), tmp_path).parameters is None
    # A model outside the registry is placed by the parameter count its runs recorded.
    (tmp_path / "counting" / "manifest.json").write_text(json.dumps({"family": "phi", "parameters": 2_700_000}))
    assert atlas.model_size(card("somebody/model", 0.2), tmp_path) == atlas.Size(2_700_000, "phi", "")


def test_a_figure_in_the_way_is_replaced_only_with_force(tmp_path: Path) -> None:
    paths = []
    for k, c in enumerate((card(SMALL, 0.2), card(LARGE, 0.8))):
        (tmp_path / f"c{k}").mkdir()
        (tmp_path / f"c{k}" / "card.json").write_text(json.dumps(c.to_dict()))
        paths.append(tmp_path / f"c{k}")
    out = tmp_path / "out"
    (out / "atlas").mkdir(parents=True)
    mine = out / "atlas" / "counting.pure_peak_rate.png"
    mine.write_bytes(b"my own picture")
    with pytest.raises(RunDirectoryError, match="counting.pure_peak_rate.png exists; use --force"):
        compare(paths, out)
    assert mine.read_bytes() == b"my own picture" and not (out / "compare.html").exists()
    compare(paths, out, force=True)
    assert mine.read_bytes().startswith(b"\x89PNG")
