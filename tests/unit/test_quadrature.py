"""The placed rule's quadrature, on functions whose integrals are known: no model needed."""

from __future__ import annotations

import numpy as np
import pytest

from contllm.attribution import quadrature
from contllm.attribution.quadrature import cubic_spline, curve, integrate, layout, panel_edges, panel_rule

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

A = -9.0  # the path runs over s = log tau in [A, 0]


def f_true(s: np.ndarray) -> np.ndarray:
    """A step of width 0.03 at s = -1 and a bump of width 0.05 at s = -0.4 on a slow slope: the shapes f takes."""
    return np.tanh((s + 1) / 0.03) + 0.5 * np.exp(-(((s + 0.4) / 0.05) ** 2)) + 0.1 * s


def slope(s: np.ndarray) -> np.ndarray:
    return (1 - np.tanh((s + 1) / 0.03) ** 2) / 0.03 - 2 * (s + 0.4) / 0.05**2 * 0.5 * np.exp(-(((s + 0.4) / 0.05) ** 2)) + 0.1


EXACT = float(f_true(np.array(0.0)) - f_true(np.array(A)))


def test_the_spline_goes_through_its_samples_and_its_slope_integrates_to_its_differences() -> None:
    rng = np.random.default_rng(0)
    s = np.sort(np.concatenate([[-3.0, 0.0], rng.uniform(-3, 0, 60)]))
    model = cubic_spline(s, np.sin(s))
    value, _ = model(s)
    assert np.allclose(value, np.sin(s), atol=1e-14)
    x, w = np.polynomial.legendre.leggauss(4)  # exact for the piecewise quadratic slope on each interval
    lo, hi = s[:-1, None], s[1:, None]
    integral = (w * (hi - lo) / 2 * model((lo + (hi - lo) * (x + 1) / 2).ravel())[1].reshape(-1, 4)).sum(1)
    assert np.allclose(integral, np.diff(value), atol=1e-14)
    q = np.linspace(-2.5, -0.5, 101)  # away from the natural ends, it converges like a cubic
    assert np.abs(model(q)[0] - np.sin(q)).max() < 1e-5


def test_the_layout_covers_the_path_within_the_steps_and_beats_equal_panels() -> None:
    s, f = curve(lambda tau: f_true(np.log(tau)), A, 1e-6)
    for steps in (32, 64):
        panels = layout(s, f, steps)
        assert panels[0][0] == A and panels[-1][1] == 0.0
        assert all(a[1] == b[0] for a, b in zip(panels, panels[1:])) and all(lo < hi for lo, hi, _ in panels)
        assert sum(o for _, _, o in panels) <= steps and {o for _, _, o in panels} <= set(quadrature.ORDERS)
        nodes, weights = panel_rule(panels)
        chosen = abs(weights @ slope(nodes) - EXACT)
        edges = panel_edges(s, f, steps // 8)  # the same samples, steps/8 panels of 8 nodes sharing sqrt|f''|
        nodes, weights = panel_rule([(lo, hi, 8) for lo, hi in zip(edges[:-1], edges[1:])])
        equal = abs(weights @ slope(nodes) - EXACT)
        assert chosen < equal / 10, (steps, chosen, equal)
    assert chosen < 1e-4 * abs(EXACT)


def test_a_panel_edge_on_a_zero_of_the_rule_error_does_not_pass_for_resolved() -> None:
    # One 2-node panel over the bump: for some right edge its error crosses zero; shrunk, it does not.
    s = np.linspace(-0.8, 0.0, 801)
    model = cubic_spline(s, f_true(s))
    his = np.linspace(-0.2, 0.0, 2001)
    rule = np.polynomial.legendre.leggauss(2)
    plain = quadrature._rule_error(model, rule, np.full_like(his, -0.6), his)
    k = int(np.argmin(plain))
    assert plain[k] < 1e-4 < plain.max()  # an edge where the 2-node rule looks exact by coincidence
    shrunk = quadrature._rule_error(model, rule, np.array([-0.6]), np.array([his[k] - quadrature.SHRINK * (his[k] + 0.6)]))
    assert shrunk[0] > 10 * plain[k]


@pytest.mark.parametrize("steps", [32, 64, 128])
def test_integrate_with_noisy_f_stays_within_its_steps_and_converges(steps: int) -> None:
    rng = np.random.default_rng(steps)
    spent: list[int] = []
    noise = 2e-5  # f's rounding noise, as on a float32 model

    def values(tau: np.ndarray) -> np.ndarray:
        return f_true(np.log(tau)) + noise * rng.standard_normal(len(tau))

    def gradients(tau: np.ndarray) -> np.ndarray:  # two tokens that share the slope 1:3
        spent.append(len(tau))
        return slope(np.log(tau))[:, None] * np.array([0.25, 0.75])[None]

    total, panels, counts = integrate(values, gradients, A, steps, 0.3 * 2 * noise, 2 * noise)
    assert counts["gradients"] == sum(spent) <= steps and counts["forwards"] >= 33
    assert panels[0][0] == A and panels[-1][1] == 0.0 and sum(o for _, _, o in panels) <= steps
    assert total[1] == pytest.approx(3 * total[0], rel=1e-12)
    error = abs(total.sum() - EXACT) / abs(EXACT)
    assert error < {32: 1e-2, 64: 1e-3, 128: 1e-4}[steps], error


def test_sampling_stops_at_the_noise_instead_of_following_it() -> None:
    rng = np.random.default_rng(1)

    def noisy(tau: np.ndarray) -> np.ndarray:
        return f_true(np.log(tau)) + 2e-5 * rng.standard_normal(len(tau))

    fine, _ = curve(noisy, A, 1e-6, budget=600)
    aware, _ = curve(noisy, A, 0.3 * 4e-5, budget=600)
    assert len(fine) == 600 and len(aware) < 300
