"""The counting summary figure: one whole item beside the across-item panels, chosen without looking for the best."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from contllm.experiments import figures
from contllm.experiments.sweeps import Sweep

LABELS = [str(k) for k in range(8)]
X = np.linspace(0.1, 1.0, 10)


def sweep(item_id: str, truth: int, argmax: list[int]) -> Sweep:
    """A sweep whose most probable digit at each factor is ``argmax`` (the rest share what is left)."""
    probs = np.full((len(X), len(LABELS)), 0.02)
    for row, k in enumerate(argmax):
        probs[row, k] = 1.0 - 0.02 * (len(LABELS) - 1)
    return Sweep(item_id, X.copy(), list(LABELS), probs, truth=str(truth))


def test_the_shown_item_is_the_median_four_fold_item_by_counts_reached() -> None:
    sweeps = [
        sweep("a", 4, [2] * 10),  # reaches 1 count
        sweep("b", 4, [1, 1, 2, 2, 3, 3, 4, 4, 4, 4]),  # reaches 4
        sweep("c", 4, [1, 1, 2, 2, 2, 2, 4, 4, 4, 4]),  # reaches 3
        sweep("d", 3, [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]),  # another n: never shown while n = 4 exists
    ]
    chosen, why = figures.representative(sweeps)
    assert chosen.item_id == "c"
    assert "n = 4" in why and "3 items" in why
    # without four-fold items the largest n is shown
    chosen, why = figures.representative([s for s in sweeps if s.truth != "4"] + [sweep("e", 2, [1] * 10)])
    assert chosen.item_id == "d" and "n = 3" in why


def test_the_summary_figure_draws_the_item_with_its_argmax_and_n_times_c() -> None:
    sweeps = [sweep(f"i{k}", n, [min(n, 1 + j // 3) for j in range(10)]) for k, n in enumerate([2, 3, 4, 4, 4])]
    result = SimpleNamespace(experiment="counting", model="tiny", x_label="factor", sweeps=sweeps)
    fig = figures.count_summary_figure(result)
    try:
        assert len(fig.axes) == 5  # four panels and the item's count axis
        one = fig.axes[0]
        assert one.get_title().startswith("one item (i")
        twin = next(ax for ax in fig.axes if ax.get_ylabel() == "count")
        lines = {line.get_label(): line for line in twin.get_lines()}
        chosen, _ = figures.representative(sweeps)
        np.testing.assert_allclose(lines["count proportional to time (n·c)"].get_ydata(), 4 * X)
        np.testing.assert_allclose(lines["argmax count"].get_ydata(), [float(v) for v in chosen.argmax_labels()])
        assert len(one.get_lines()) == len(LABELS)
    finally:
        figures.plt.close(fig)
