"""Quadrature along the duration path: where the gradient steps go, decided from f alone.

The attributions sum to the integral of df/ds over s = log tau, and f itself costs only a
forward pass without gradients. So the placed rule first samples f along the path
(:func:`curve`, denser where f is hard to interpolate, never denser than f's own float
rounding noise can tell apart), fits a cubic spline through the samples
(:func:`cubic_spline`), and then chooses the panels *and* how many Gauss-Legendre nodes
each gets (:func:`layout`) so that the rule integrates the spline's slope best for the
number of gradient steps it may spend. Only then are gradients taken, at the chosen nodes,
and each panel is checked against f itself; the steps kept back go to the panels that
measure worst (:func:`integrate`).

The spline is a model of f, not f: its predicted error is a guide to where nodes are
needed, never a correction of the result (the completeness error every attribution reports
is measured with the real gradients against the real f, and no panel's integral is ever
rescaled to meet it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from contllm.errors import SignalError

#: Most integration steps (each is one row of a differentiated forward).
MAX_STEPS = 4096

#: Nodes a panel of :func:`layout` may have.
ORDERS = (2, 3, 4, 6, 8, 12, 16)

#: How far :func:`layout` moves a panel's ends inward to check its error, as a share of its width.
SHRINK = 0.02

#: Candidate panel edges :func:`layout` chooses from (placed like the sqrt|f''| rule's edges).
CANDIDATE_EDGES = 120

#: Share of the steps :func:`integrate` keeps back to refine the panels that measure worst.
RESERVE = 0.25

#: Forward samples of f added across a panel before it is laid out again.
REFINE_SAMPLES = 24


def gauss_legendre_log(steps: int, low: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes tau [steps] in (low, 1) and weights of a Gauss-Legendre rule in s = log tau over [log low, 0]."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise SignalError(f"steps must be an integer from 1 to {MAX_STEPS}, got {steps!r}")
    if not 0 < low < 1:
        raise SignalError(f"the lower end of the duration path must lie in (0, 1), got {low!r}")
    s, w = panel_rule([(math.log(low), 0.0, steps)])
    return np.exp(s), w


def panel_rule(panels: list[tuple[float, float, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights in s of Gauss-Legendre panels given as (lo, hi, nodes)."""
    nodes, weights = [], []
    for lo, hi, order in panels:
        x, w = np.polynomial.legendre.leggauss(order)
        nodes.append(lo + (hi - lo) * (x + 1) / 2)
        weights.append(w * (hi - lo) / 2)
    return np.concatenate(nodes), np.concatenate(weights)


def local_polynomial(
    s: np.ndarray, f: np.ndarray, q: np.ndarray, m: int = 6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """f, f' and f'' at each q from the degree m - 1 polynomial through the m samples (s sorted) nearest it."""
    q = np.asarray(q, dtype=np.float64)
    lo = np.clip(np.searchsorted(s, q) - m // 2, 0, len(s) - m)
    idx = lo[:, None] + np.arange(m)[None]
    x = s[idx] - q[:, None]
    scale = np.maximum(np.abs(x).max(1), 1e-300)
    vander = (x / scale[:, None])[:, :, None] ** np.arange(m)[None, None]
    c = np.linalg.solve(vander, f[idx][:, :, None])[:, :, 0]
    return c[:, 0], c[:, 1] / scale, 2 * c[:, 2] / scale**2


def curve(
    values: Callable[[np.ndarray], np.ndarray],
    a: float,
    tolerance: float,
    budget: int = 600,
    first: int = 33,
    batch: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """Samples (s, f(e^s)) over [a, 0], without gradients, denser where f is hard to interpolate.

    Starts from ``first`` even samples; each round adds the midpoints (up to ``batch``, worst
    first) of the intervals where the 6-point and the 4-point local interpolants' slopes,
    times the interval's width, differ by more than ``tolerance``; stops when none does or
    ``budget`` evaluations are spent. A tolerance below f's rounding noise spends the budget
    on the noise.
    """
    s = np.linspace(a, 0.0, first)
    f = np.asarray(values(np.exp(s)), dtype=np.float64)
    while len(s) < budget:
        mid = (s[:-1] + s[1:]) / 2
        indicator = np.abs(local_polynomial(s, f, mid, 6)[1] - local_polynomial(s, f, mid, 4)[1]) * np.diff(s)
        bad = np.where(indicator > tolerance)[0]
        if not len(bad):
            break
        new = mid[bad[np.argsort(-indicator[bad])][: min(batch, budget - len(s))]]
        s = np.concatenate([s, new])
        f = np.concatenate([f, np.asarray(values(np.exp(new)), dtype=np.float64)])
        order = np.argsort(s)
        s, f = s[order], f[order]
    return s, f


def panel_edges(
    s: np.ndarray, f: np.ndarray, panels: int, fine: int = 4000, widen: int = 10, floor: float = 0.05
) -> np.ndarray:
    """Edges [panels + 1] over [s[0], s[-1]] that give every panel an equal share of sqrt|f''|.

    f'' comes from the local interpolants of the samples on ``fine`` even points; each value is
    raised to the largest within ``widen`` points on either side (so a sharp feature's flanks
    count as sharp), plus ``floor`` x its mean (so no stretch of the path is left without panels).
    """
    grid = np.linspace(s[0], s[-1], fine)
    monitor = np.sqrt(np.abs(local_polynomial(s, f, grid)[2]))
    padded = np.pad(monitor, widen, mode="edge")
    monitor = np.max(np.lib.stride_tricks.sliding_window_view(padded, 2 * widen + 1), axis=1)
    monitor = monitor + floor * monitor.mean() + 1e-300
    mass = np.concatenate([[0.0], np.cumsum((monitor[1:] + monitor[:-1]) / 2 * np.diff(grid))])
    edges = np.interp(np.linspace(0.0, mass[-1], panels + 1), mass, grid)
    edges[0], edges[-1] = s[0], s[-1]
    return edges


def cubic_spline(s: np.ndarray, f: np.ndarray) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The natural cubic spline through (s, f) (s strictly increasing): q -> (value, slope) at q.

    Its slope integrates exactly to its own differences, so a quadrature rule's error on the
    spline is the rule's error alone.
    """
    s = np.asarray(s, dtype=np.float64)
    f = np.asarray(f, dtype=np.float64)
    n = len(s)
    h = np.diff(s)
    # Second-derivative coefficients c (c_0 = c_{n-1} = 0): a tridiagonal system, solved by elimination.
    c = np.zeros(n)
    if n > 2:
        diag = 2 * (h[:-1] + h[1:])
        rhs = 3 * ((f[2:] - f[1:-1]) / h[1:] - (f[1:-1] - f[:-2]) / h[:-1])
        for i in range(1, n - 2):
            ratio = h[i] / diag[i - 1]
            diag[i] -= ratio * h[i]
            rhs[i] -= ratio * rhs[i - 1]
        inner = np.zeros(n - 2)
        inner[-1] = rhs[-1] / diag[-1]
        for i in range(n - 4, -1, -1):
            inner[i] = (rhs[i] - h[i + 1] * inner[i + 1]) / diag[i]
        c[1:-1] = inner
    b = (f[1:] - f[:-1]) / h - h * (2 * c[:-1] + c[1:]) / 3
    d = (c[1:] - c[:-1]) / (3 * h)

    def evaluate(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(q, dtype=np.float64)
        k = np.clip(np.searchsorted(s, q) - 1, 0, n - 2)
        x = q - s[k]
        return f[k] + x * (b[k] + x * (c[k] + x * d[k])), b[k] + x * (2 * c[k] + 3 * x * d[k])

    return evaluate


def _rule_error(
    model: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    rule: tuple[np.ndarray, np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
) -> np.ndarray:
    """|Gauss-Legendre integral of the model's slope - the model's difference| over each panel [lo, hi]."""
    x, w = rule
    nodes = lo[:, None] + (hi - lo)[:, None] * (x[None] + 1) / 2
    integral = (w[None] * (hi - lo)[:, None] / 2 * model(nodes.ravel())[1].reshape(nodes.shape)).sum(1)
    return np.abs(integral - (model(hi)[0] - model(lo)[0]))


def layout(
    s: np.ndarray, f: np.ndarray, steps: int, candidates: int = CANDIDATE_EDGES, orders: tuple[int, ...] = ORDERS
) -> list[tuple[float, float, int]]:
    """Gauss-Legendre panels (lo, hi, nodes) over [s[0], s[-1]] with at most ``steps`` nodes in all.

    The panels' edges are chosen among ``candidates`` + 1 points placed by :func:`panel_edges`
    (crowded where f bends) and each panel's node count among ``orders``, by dynamic
    programming over (edge, nodes spent): the layout minimises the sum over panels of
    |rule's integral of the spline's slope - the spline's difference over the panel|,
    the spline being :func:`cubic_spline` through the samples. A panel's error is the largest of
    its own and those of the panel shrunk by :data:`SHRINK` of its width at either end: a rule's
    error changes sign as a panel's edge moves, and an edge that happens to sit on a zero of it
    says nothing about how well the rule resolves f there.
    """
    model = cubic_spline(s, f)
    edges = panel_edges(s, f, candidates)
    m = len(edges) - 1
    orders = tuple(o for o in orders if o <= steps) or (steps,)
    best = np.full((m + 1, steps + 1), np.inf)
    best[0, 0] = 0.0
    came_from = np.zeros((m + 1, steps + 1), dtype=np.int64)
    order_of = np.zeros((m + 1, steps + 1), dtype=np.int64)
    rules = {o: np.polynomial.legendre.leggauss(o) for o in orders}
    for j in range(1, m + 1):
        for o in orders:
            error = np.zeros(
                j
            )  # a panel from each earlier edge to edge j: its worst over the panel and two shrunk by SHRINK
            for left, right in ((0.0, 0.0), (SHRINK, 0.0), (0.0, SHRINK)):
                width = edges[j] - edges[:j]
                lo, hi = edges[:j] + left * width, edges[j] - right * width
                error = np.maximum(error, _rule_error(model, rules[o], lo, hi))
            total = best[:j, : steps + 1 - o] + error[:, None]  # [from, spent before]
            start = np.argmin(total, axis=0)
            cost = total[start, np.arange(steps + 1 - o)]
            better = np.where(cost < best[j, o:])[0]
            best[j, o + better] = cost[better]
            came_from[j, o + better] = start[better]
            order_of[j, o + better] = o
    spent = int(np.argmin(best[m]))
    panels: list[tuple[float, float, int]] = []
    j = m
    while j > 0:
        i, o = int(came_from[j, spent]), int(order_of[j, spent])
        panels.append((float(edges[i]), float(edges[j]), o))
        j, spent = i, spent - o
    return panels[::-1]


class Checks:
    """f along the path, each value computed once, and Gauss-Legendre panels measured against it.

    values: tau [T] -> f [T] (no gradients); gradients: tau [T] -> df/dlog d_j [T, active].
    ``known`` maps s to f(e^s); ``forwards`` counts the values computed (samples given at the
    start included).
    """

    def __init__(
        self,
        values: Callable[[np.ndarray], np.ndarray],
        gradients: Callable[[np.ndarray], np.ndarray],
        s: np.ndarray | None = None,
        f: np.ndarray | None = None,
    ) -> None:
        self.values, self.gradients = values, gradients
        self.known: dict[float, float] = {} if s is None else dict(zip(np.asarray(s).tolist(), np.asarray(f).tolist()))
        self.forwards = len(self.known)

    def f_at(self, points: list[float]) -> list[float]:
        """f at each s in ``points``; the new ones in one batch of forwards."""
        new = sorted({p for p in points if p not in self.known})
        if new:
            self.forwards += len(new)
            self.known.update(zip(new, np.asarray(self.values(np.exp(np.array(new))), dtype=np.float64).tolist()))
        return [self.known[p] for p in points]

    def measure(self, panels: list[tuple[float, float, int]]) -> list[tuple[float, float, int, np.ndarray, float]]:
        """Per panel (lo, hi, nodes, per-token integral [active], its sum - (f(hi) - f(lo))), gradients in one batch."""
        nodes, weights = panel_rule(panels)
        grads = self.gradients(np.exp(nodes))
        self.f_at([edge for lo, hi, _ in panels for edge in (lo, hi)])
        out, k = [], 0
        for lo, hi, o in panels:
            part = weights[k : k + o] @ grads[k : k + o]
            f_lo, f_hi = self.f_at([lo, hi])
            out.append((lo, hi, o, part, float(part.sum()) - (f_hi - f_lo)))
            k += o
        return out


def integrate(
    values: Callable[[np.ndarray], np.ndarray],
    gradients: Callable[[np.ndarray], np.ndarray],
    a: float,
    steps: int,
    tolerance: float,
    noise: float,
    budget: int = 600,
) -> tuple[np.ndarray, list[tuple[float, float, int]], dict[str, int]]:
    """Per-token integrals over s in [a, 0] of the gradients, on panels laid out from f alone and then checked.

    values: tau [T] -> f [T] (no gradients); gradients: tau [T] -> df/dlog d_j [T, active].
    1. f is sampled (:func:`curve`, at most ``budget`` forwards, to ``tolerance``) and
       :func:`layout` spends ``steps`` less a reserve of :data:`RESERVE` x steps (none below 32
       steps) on Gauss-Legendre panels; the gradients are taken at their nodes.
    2. Each panel is checked against f itself: its integral of the summed gradients against
       f(hi) - f(lo) (forwards at the edges). While steps are left, the panel that measures worst
       (if above ``noise``, f's rounding noise) gets :data:`REFINE_SAMPLES` more samples of f
       across it and is laid out again with twice its nodes (at least 8, at most what is left;
       never fewer than it has); the new panels replace it if together they measure better, and
       either way their gradients count as spent.
    Returns the integrals [active], the final panels and counts: "forwards" and "gradients" spent.
    """
    s, f = curve(values, a, tolerance, budget=budget)
    reserve = int(RESERVE * steps) if steps >= 32 else 0
    panels = layout(s, f, steps - reserve)
    checks = Checks(values, gradients, s, f)
    measured = checks.measure(panels)
    spent = sum(o for _, _, o in panels)
    settled: set[tuple[float, float]] = set()  # panels whose new layout measured no better
    while spent < steps:
        candidates = [k for k, m in enumerate(measured) if abs(m[4]) > noise and m[:2] not in settled]
        if not candidates:
            break
        worst = max(candidates, key=lambda k: abs(measured[k][4]))
        lo, hi, o, _, error = measured[worst]
        nodes = min(max(2 * o, 8), steps - spent)
        if nodes <= o:  # no more nodes than it has: nothing to gain
            settled.add((lo, hi))
            continue
        checks.f_at(np.linspace(lo, hi, REFINE_SAMPLES + 2)[1:-1].tolist())
        points = np.array(sorted(p for p in checks.known if lo <= p <= hi))
        trial = checks.measure(layout(points, np.array(checks.f_at(points.tolist())), nodes))
        spent += sum(m[2] for m in trial)
        if abs(sum(m[4] for m in trial)) < abs(error):
            measured[worst : worst + 1] = trial
        else:
            settled.add((lo, hi))
    total = np.sum([m[3] for m in measured], axis=0)
    return total, [(lo, hi, o) for lo, hi, o, _, _ in measured], {"forwards": checks.forwards, "gradients": spent}
