"""Summary figures that a newcomer can read: a finding first, legends off the data, one y-axis a panel, the paper last.

Counting (and events, which draw the same figure), Boolean, word interpolation and
counting interpolation on results made up here, whose findings are known; the
integration tier checks every experiment's figure on real runs (tests/integration/test_gallery.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from contllm.experiments import answers, figures
from contllm.experiments.counting_interpolation import counting_interpolation_finding
from contllm.experiments.counting_interpolation import summary_figure as counting_interpolation_figure
from contllm.experiments.sweeps import ExperimentResult, Sweep
from tests.unit.readable import check_readable, data_axes, paper_panels

pytestmark = pytest.mark.unit

LABELS = [str(k) for k in range(8)]
X = np.linspace(0.1, 1.0, 10)


def sweep(item_id: str, truth: int, argmax: list[int]) -> Sweep:
    """A sweep whose most probable digit at each factor is ``argmax`` (the rest share what is left)."""
    probs = np.full((len(X), len(LABELS)), 0.02)
    for row, k in enumerate(argmax):
        probs[row, k] = 1.0 - 0.02 * (len(LABELS) - 1)
    return Sweep(item_id, X.copy(), list(LABELS), probs, truth=str(truth), meta={"word": "apple"})


def peaked(item_id: str, n: int, centre: np.ndarray) -> Sweep:
    """A sweep whose digit distribution peaks at ``centre`` [S] (E[k] near it)."""
    digits = np.arange(10)
    logits = -((digits[None, :] - centre[:, None]) ** 2)
    probs = 0.95 * np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return Sweep(item_id, X.copy(), [str(d) for d in digits], probs, str(n), {"word": "apple"})


def counting(sweeps: list[Sweep]) -> ExperimentResult:
    return ExperimentResult("counting", "tiny", {}, sweeps, x_label="factor")


def test_the_shown_item_is_the_median_four_fold_item_by_counts_reached() -> None:
    sweeps = [
        sweep("a", 4, [2] * 10),  # reaches 1 count
        sweep("b", 4, [1, 1, 2, 2, 3, 3, 4, 4, 4, 4]),  # reaches 4
        sweep("c", 4, [1, 1, 2, 2, 2, 2, 4, 4, 4, 4]),  # reaches 3
        sweep("d", 3, [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]),  # another n: never shown while n = 4 exists
    ]
    chosen, why = figures.representative(sweeps)
    assert chosen.item_id == "c"
    assert "n = 4" in why and "3 items" in why and "not the best" in why
    # without four-fold items the largest n is shown
    chosen, why = figures.representative([s for s in sweeps if s.truth != "4"] + [sweep("e", 2, [1] * 10)])
    assert chosen.item_id == "d" and "n = 3" in why


@pytest.mark.parametrize(
    ("centre", "words"),
    [
        (lambda n: n * X, "the predicted count follows n × c"),
        (lambda n: n * (0.5 + 0.5 * X), "falls as the words shrink"),
        (lambda n: n * (0.85 + 0.15 * X), "slightly smaller counts"),
        (lambda n: np.full_like(X, float(n)), "hardly depends on how long the words last"),
        (lambda n: n * (1.5 - 0.5 * X), "larger counts"),
    ],
)
def test_the_counting_finding_says_what_the_curves_do(centre: object, words: str) -> None:
    sweeps = [peaked(f"i{n}", n, centre(n)) for n in (2, 3, 4)]  # type: ignore[operator]
    sentence, detail = figures.count_finding(sweeps)
    assert words in sentence, sentence
    assert "as far as n × c" in detail
    assert "events" in figures.count_finding(sweeps, "events")[0]


def test_the_counting_summary_reads_without_the_paper() -> None:
    sweeps = [peaked(f"i{k}", n, n * X) for k, n in enumerate([2, 3, 4, 4, 4])]
    fig = figures.count_summary_figure(counting(sweeps))
    try:
        sentence = check_readable(fig)
        assert sentence == "Shorter words, smaller counts: the predicted count follows n × c"
        first, one, truth, sensitivity, peaks = data_axes(fig)
        # the finding: E[k] per n beside its n·c, dotted
        dotted = [line for line in first.get_lines() if line.get_linestyle() == ":" and len(line.get_xdata())]
        assert sorted(round(float(line.get_ydata()[-1]), 6) for line in dotted) == [2.0, 3.0, 4.0]
        # one item whole: every digit, and the most probable one marked at each factor
        chosen, _ = figures.representative(sweeps)
        marks = next(line for line in one.get_lines() if line.get_label() == "most probable")
        np.testing.assert_allclose(marks.get_ydata(), chosen.probs.max(axis=1))
        assert len(one.get_lines()) == 10 + 1
        assert paper_panels(fig) == [3, 4]  # the paper's measures last
        assert "peak rates" in peaks.get_title(loc="left") and "chance" in " ".join(t.get_text() for t in peaks.texts)
    finally:
        figures.plt.close(fig)


def test_an_item_figure_has_no_twin_axis() -> None:
    s = peaked("i", 4, 4 * X)
    fig = figures.item_figure(
        SimpleNamespace(model="tiny", experiment="counting", x_label="factor"), s, "apple x 4", counts=True
    )
    try:
        top, below = data_axes(fig)
        assert top.get_position().bounds != below.get_position().bounds
        np.testing.assert_allclose(below.get_lines()[0].get_ydata(), s.implied_value())
    finally:
        figures.plt.close(fig)


def boolean(moves: float) -> ExperimentResult:
    """AND -> XOR on every input; P(1) goes from the AND answer toward the XOR answer by ``moves`` of the way."""
    x = np.linspace(0.0, 1.0, 5)
    sweeps = []
    for a, b in ((0, 0), (0, 1), (1, 0), (1, 1)):
        first, second = a & b, a ^ b
        start = 0.2 + 0.6 * first
        p1 = start + moves * x * ((0.2 + 0.6 * second) - start)
        probs = np.stack([0.9 - p1, p1, np.full_like(x, 0.05), np.full_like(x, 0.05)], axis=1)
        meta = {"first": "AND", "second": "XOR", "a": a, "b": b, "truth_first": first, "truth_second": second}
        sweeps.append(Sweep(f"AND-XOR-{a}{b}", x, ["0", "1", "false", "true"], probs, None, meta))
    return ExperimentResult("boolean", "tiny", {}, sweeps, x_label="alpha")


def test_the_boolean_finding_and_the_correct_answers_ringed() -> None:
    assert figures.boolean_finding(boolean(1.0).sweeps)[0].startswith("The answer follows the operator")
    assert "barely moves" in figures.boolean_finding(boolean(0.0).sweeps)[0]
    result = boolean(1.0)
    fig = figures.boolean_summary_figure(result)
    try:
        check_readable(fig)
        pair = data_axes(fig)[1]
        assert pair.get_title(loc="left") == "AND → XOR"
        rings = {
            (float(line.get_xdata()[0]), float(line.get_ydata()[0]))
            for line in pair.get_lines()
            if line.get_marker() == "o" and line.get_markerfacecolor() == "none"
        }
        assert rings == {(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)}  # AND: 0 0 0 1; XOR: 0 1 1 0
        accuracy = data_axes(fig)[-1]
        assert [t.get_text() for t in accuracy.texts] == ["100%", "100%"]
    finally:
        figures.plt.close(fig)


def interpolation(moves: float) -> ExperimentResult:
    x = np.linspace(0.0, 1.0, 11)
    sweeps = []
    for group, (a, b) in answers.ANSWERS.items():
        start, end = 0.2 + 0.6 * a, 0.2 + 0.6 * b
        y = start + moves * x * (end - start)
        meta = {"group": group, "truth_first": "yes" if a else "no", "truth_second": "yes" if b else "no"}
        sweeps.append(Sweep(group, x, ["yes", "no"], np.stack([y, 0.97 - y], axis=1), None, meta))
    return ExperimentResult("interpolation", "tiny", {}, sweeps, x_label="alpha")


def test_the_word_interpolation_summary_states_the_crossing_and_ends_with_the_paper() -> None:
    assert "cross over" in answers.interpolation_finding(interpolation(1.0).sweeps)[0]
    assert "barely moves" in answers.interpolation_finding(interpolation(0.0).sweeps)[0]
    fig = answers.summary_figure(interpolation(1.0))
    try:
        check_readable(fig)
        panels = data_axes(fig)
        assert paper_panels(fig) == [len(panels) - 2, len(panels) - 1]
    finally:
        figures.plt.close(fig)


def test_the_counting_interpolation_summary() -> None:
    x = np.linspace(0.0, 1.0, 6)
    sweeps = []
    for k, (start, end) in enumerate(((4, 1), (4, 4))):
        s = peaked(f"p{k}", start, start + (end - start) * x)
        s.x = x
        s.meta = {"word": "apple", "other": "cash", "count_first": start, "count_second": end}
        sweeps.append(s)
    result = ExperimentResult("counting-interpolation", "tiny", {}, sweeps, x_label="alpha")
    assert "moves to the words left" in counting_interpolation_finding(sweeps)[0]
    flat = [peaked(f"q{k}", 4, np.full_like(x, 4.0)) for k in range(2)]
    for s in flat:
        s.x, s.meta = x, {"count_first": 4, "count_second": 1}
    assert "hardly moves" in counting_interpolation_finding(flat)[0]
    fig = counting_interpolation_figure(result)
    try:
        check_readable(fig)
        assert len(data_axes(fig)) == 3
    finally:
        figures.plt.close(fig)


def test_the_checks_can_fail() -> None:
    """A legend on the data, a twin axis and a title that is no sentence are each caught."""
    fig, ax = figures.plt.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_title("A line that rises from left to right", loc="left")
    ax.legend(loc="center")
    with pytest.raises(AssertionError, match="covers a panel"):
        check_readable(fig)
    ax.get_legend().remove()
    ax.twinx()
    with pytest.raises(AssertionError, match="twin axis"):
        check_readable(fig)
    figures.plt.close(fig)
    fig, ax = figures.plt.subplots()
    ax.set_title("curves")
    with pytest.raises(AssertionError, match="no finding"):
        check_readable(fig)
    figures.plt.close(fig)
    fig, (left, right) = figures.plt.subplots(1, 2, figsize=(6, 3))
    left.set_title("A finding so long that it runs on into the panel beside it and further", loc="left")
    right.set_title("the other panel", loc="left")
    with pytest.raises(AssertionError, match="titles overlap|runs off the figure"):
        check_readable(fig)
    figures.plt.close(fig)
