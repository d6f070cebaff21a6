"""Duration attribution: which tokens a read-out depends on, and how much.

With continuous durations a token need not be either present or deleted: it can be moved
smoothly from absent (duration 0) to present (its own duration). :func:`attribute` does
that for a set S of tokens at once, along the path

    d_j(tau) = tau * d_j  for j in S (the other tokens unchanged),   tau from 0 to 1,

and gives token j the integrated gradient

    A_j = integral over tau of  d_j * df/dd_j (d(tau)) dtau
        = integral over s = log tau of  df/dlog d_j (d(e^s)) ds,

so that the attributions sum to f(full) - f(baseline) (completeness). f is a
:class:`Readout` of the next-token distribution at one position: a token's probability
or log-probability, a sum over a token set (the digits), or the implied count E[k].

The durations reach the model twice: as the log-duration bias of attention and through
the times (t_i is the start plus every duration up to token i), which rotary models take as
position ids. Both carry gradients here. Earlier transformers 5.x releases compute the
rotary embedding under ``torch.no_grad()`` (later ones no longer do); there the path's
forwards, which run in contllm's one differentiable context
(:func:`contllm.core.forward.differentiable`), take the gradient through
:func:`contllm.core.forward.rotary_gradients`, as :func:`contllm.internals.gradients.gradients` does.
:func:`differentiable_rotary` (the undecorated forward of a rotary module decorated with
``torch.no_grad()``, while a context lasts) is kept for callers of its own.

Quadrature. Gauss-Legendre panels in s = log tau over [log lower end, 0] for the deletion
baseline (``floor`` = 0) or over [log ``floor``, 0] for a floor baseline: laid out from f
alone and then checked against f (the default, ``rule="placed"``, below), halved where they
integrate worst (``"adaptive"``, :func:`_adaptive`) or one rule over the whole range
(``"gauss"``). In log tau because the read-out changes over many decades of tau: with only
the first token left at full duration, a key j enters the attention of a query once
tau * exp(s_j) catches up with the first token's exp(s_0), which for some heads happens
below tau = 1e-10. Below the lower end nothing is integrated: f(lower end) - f(0) is
reported (``remainder``) and counted in the completeness error, never spread over the
tokens. The lower end is the largest of 1e-1 ... 1e-12 below which f is still f(0) within
1e-5 of the total change (found without gradients; plus the float rounding noise of f), so
no node is spent where nothing moves.

``rule="placed"`` (:func:`contllm.attribution.quadrature.integrate`) decides where the
gradients go from forward passes without gradients. f is sampled along the path, denser
where it is hard to interpolate but never finer than its float rounding noise (about 1e-5
on a float32 model: the positions of the moving tokens are rounded to float32), a cubic
spline goes through the samples, and a dynamic programme picks the panels and each one's
number of nodes (2 to 16) so that the rule integrates the spline's slope best with
three quarters of the steps. The gradients are taken there, and every panel is checked
against f itself (the sum of its integrals against f(hi) - f(lo), from forwards at its
edges); the rest of the steps go, one panel at a time, to laying out again (on more
samples, with twice the nodes) the panel that measures worst, which the new panels replace
if together they measure better. The reported completeness error is measured the same way
over the whole path, so it is also what steered the last quarter of the steps; the split of
each panel's integral among the tokens is never adjusted. On SmolLM2's counting items f(tau)
is flat below tau ~ 1e-3 and swings through a few sharp transitions between tau = 0.05 and
1 (count-001: f falls by 0.45 between tau = 0.06 and 0.16 and rises by 0.28 between 0.25
and 0.4, slopes up to 6 per unit of log tau, while the whole change is -0.15); those are
what the quadrature must resolve.
Measured: the README's completeness table.

A sliding window applied in time has a sharp edge: where a key crosses it along the path,
f jumps and no gradient sees the jump. ``meta["window_crossings"]`` counts the crossing
(query, key) pairs; completeness can only hold where there are none.

Beside the attributions, :func:`occlusion` deletes each token alone (duration 0) or
shrinks it alone (duration x 0.5) and reads the change through the batched engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from contllm.attribution import quadrature
from contllm.attribution.path import (
    CPU_GRAD_TOKENS,
    CPU_PATH_BYTES,
    DurationPath,
    differentiable_rotary,
    window_crossings,
)
from contllm.attribution.quadrature import MAX_STEPS, gauss_legendre_log
from contllm.core.readout import TokenSets
from contllm.core.signal import Signal
from contllm.errors import SignalError

__all__ = [
    "CPU_GRAD_TOKENS",
    "CPU_PATH_BYTES",
    "Attribution",
    "Readout",
    "attribute",
    "differentiable_rotary",
    "gauss_legendre_log",
    "occlusion",
]

#: Gradient evaluations along the path by default (the README's completeness table has the
#: error against steps; the placed rule keeps SmolLM2's 8 default counting items within 1e-3
#: from 64 steps on, and 128 leaves a margin on prompts that swing harder).
DEFAULT_STEPS = 128

#: The candidate lower ends of the log-tau integral for the deletion baseline, probed
#: without gradients: 1e-1, 1e-2, ..., 1e-12.
PROBES = 10.0 ** -np.arange(1, 13)

#: Largest |f(lower end) - f(0)|, relative to |f(1) - f(0)|, for a probe to serve as the lower end
#: (plus the rounding noise of the model's dtype, NOISE x eps x max(1, |f(1)|)).
REMAINDER = 1e-5
NOISE = 100

#: Gauss-Legendre nodes per panel of the adaptive rule, and its panels before any is halved.
PANEL_ORDER = 8
FIRST_PANELS = 4

#: The quadrature rules :func:`attribute` knows.
RULES = ("placed", "adaptive", "gauss")

#: The "placed" rule: at most this many forward evaluations (no gradients) of f along the path
#: to lay out its panels, refined until the local interpolation of f changes by less than
#: CURVE_TOL x max(1, |f(1) - f(0)|) over every interval ...
CURVE_FORWARDS = 600
CURVE_TOL = 1e-6
#: ... but never below this share of f's rounding noise (NOISE x eps x max(1, |f(1)|)): finer
#: sampling would follow the float rounding of the positions, not f.
CURVE_NOISE = 0.3


# ---------------------------------------------------------------------------- read-outs
@dataclass(frozen=True)
class Readout:
    """A number read from the next-token distribution at one position.

    kind: "probability" (total probability of every token in ``token_sets``),
        "log_probability" (its logarithm) or "expectation" (sum of value x probability
        over the labels, renormalised over them: the implied count E[k] over the digits).
    token_sets: the labels and their token ids.
    values: the number of each label (expectation only).
    name: how tables and figures call it.
    """

    kind: str
    token_sets: TokenSets
    values: tuple[float, ...] | None = None
    name: str = "f"

    def __post_init__(self) -> None:
        if self.kind not in ("probability", "log_probability", "expectation"):
            raise SignalError(f"a read-out is a probability, log_probability or expectation, got {self.kind!r}")
        if not self.token_sets.labels or not all(self.token_sets.token_ids):
            raise SignalError("a read-out needs at least one token in every label")
        if self.kind == "expectation":
            if self.values is None or len(self.values) != len(self.token_sets.labels):
                raise SignalError("an expectation needs one value per label")

    @classmethod
    def tokens(cls, token_ids: Sequence[int] | int, *, log: bool = False, name: str | None = None) -> Readout:
        """The probability (or, with ``log``, log-probability) of a token, or the total of several."""
        ids = (token_ids,) if isinstance(token_ids, int) else tuple(int(i) for i in token_ids)
        if not ids:
            raise SignalError("a read-out needs at least one token id")
        label = name or ("log p" if log else "p") + f"({','.join(map(str, ids))})"
        return cls("log_probability" if log else "probability", TokenSets((label,), (ids,)), name=label)

    @classmethod
    def label(cls, token_sets: TokenSets, label: str, *, log: bool = False) -> Readout:
        """The probability (or log-probability) of one label of ``token_sets`` (e.g. the digit "3")."""
        if label not in token_sets.labels:
            raise SignalError(f"no label {label!r}; the labels are {', '.join(token_sets.labels)}")
        k = token_sets.labels.index(label)
        name = f"log p({label})" if log else f"p({label})"
        return cls(
            "log_probability" if log else "probability", TokenSets((label,), (token_sets.token_ids[k],)), name=name
        )

    @classmethod
    def expectation(cls, token_sets: TokenSets, *, name: str = "E[k]") -> Readout:
        """E[label] over numeric labels (the implied count over the digits), renormalised over the labels."""
        try:
            values = tuple(float(label) for label in token_sets.labels)
        except ValueError:
            raise SignalError(f"an expectation needs numeric labels, got {', '.join(token_sets.labels)}") from None
        return cls("expectation", token_sets, values, name)

    def _combine(self, label_logp: Any, lib: Any) -> Any:
        """f from the log-probability of each label [B, K] (torch or numpy)."""
        if self.kind == "expectation":
            weights = lib.exp(
                label_logp - label_logp.max(-1, keepdims=True)
                if lib is np
                else label_logp - label_logp.max(-1, keepdim=True).values
            )
            values: Any = np.asarray(self.values, dtype=np.float64)
            if lib is not np:
                values = torch.as_tensor(values, dtype=label_logp.dtype, device=label_logp.device)
            return (weights * values).sum(-1) / weights.sum(-1)
        total = np.logaddexp.reduce(label_logp, axis=-1) if lib is np else torch.logsumexp(label_logp, -1)
        return total if self.kind == "log_probability" else lib.exp(total)

    def from_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """f [B] (float64, differentiable) from next-token logits [B, vocab]."""
        logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        columns = [torch.logsumexp(logp[:, list(ids)], dim=-1) for ids in self.token_sets.token_ids]
        return self._combine(torch.stack(columns, dim=-1), torch)

    def from_probs(self, probs: torch.Tensor) -> np.ndarray:
        """f [B] (float64) from next-token distributions [B, vocab] (what the engine returns)."""
        label_p = self.token_sets.gather(probs.to(torch.float64)).cpu().numpy()
        with np.errstate(divide="ignore"):
            return np.asarray(self._combine(np.log(label_p), np), dtype=np.float64)


@dataclass
class Attribution:
    """Integrated-gradient attributions of one signal's read-out along the duration path.

    tokens: the attributed token indices [k]; attributions: A_j [k] (tokens that start
    with duration 0 get exactly 0). full: f at the signal; baseline: f with the tokens at
    duration floor x d (0: deleted); start: f at the lower end of the integral
    (``smallest`` x d when floor is 0, else the baseline itself). steps, floor: the path;
    smallest: the lower end used for the deletion baseline (nan for a floor baseline).
    position: the read token index.
    """

    tokens: list[int]
    attributions: np.ndarray
    full: float
    baseline: float
    start: float
    steps: int
    floor: float
    smallest: float
    position: int
    readout: str = "f"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """f(full) - f(baseline): what the attributions should sum to."""
        return self.full - self.baseline

    @property
    def remainder(self) -> float:
        """f(start) - f(baseline): the part of the path below the lower end, never integrated."""
        return self.start - self.baseline

    @property
    def completeness_abs(self) -> float:
        """|sum of attributions - (f(full) - f(baseline))|."""
        return abs(float(np.sum(self.attributions)) - self.total)

    @property
    def completeness_error(self) -> float:
        """:attr:`completeness_abs` relative to |f(full) - f(baseline)| (inf when that is 0 and the sum is not)."""
        scale = abs(self.total)
        if scale == 0:
            return 0.0 if self.completeness_abs == 0 else math.inf
        return self.completeness_abs / scale


def _check_tokens(signal: Signal, tokens: Sequence[int] | None, position: int) -> tuple[list[int], int]:
    n = len(signal)
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not -n <= position < n:
        raise SignalError(f"position must be a token index of a signal of {n} tokens, got {position!r}")
    position = int(position) % n
    if tokens is None:
        chosen = list(range(1, n))
    else:
        chosen = signal._check_indices(tokens)
        if len(set(chosen)) != len(chosen):
            raise SignalError("the attributed token indices repeat one")
    if not chosen:
        raise SignalError("no token to attribute (a signal of one token has none but the first)")
    return sorted(chosen), position


def attribute(
    lm: Any,
    signal: Signal,
    readout: Readout,
    tokens: Sequence[int] | None = None,
    *,
    position: int = -1,
    steps: int = DEFAULT_STEPS,
    floor: float = 0.0,
    smallest: float | None = None,
    rule: str = "placed",
    max_batch_tokens: int | None = None,
    max_batch_bytes: int | None = None,
) -> Attribution:
    """Integrated gradients of ``readout`` at ``position`` along the duration path of ``tokens``.

    lm: a ContinuousLM; signal: the input; tokens: indices to attribute (default: all but
    the first); position: the read token (default the last). steps: gradient evaluations
    (Gauss-Legendre nodes in log tau; the placed rule stops early when every panel checks
    within f's rounding noise, ``meta["gradients"]`` says how many it took). floor: 0 for
    the deletion baseline, or a duration factor in (0, 1): the path then starts at floor x d
    and the baseline is that signal. smallest: lowest tau
    integrated for the deletion baseline, or None to pick it (see :func:`_lowest`). rule: "placed"
    (panels laid out from forward-only samples of f, then checked against f, see :func:`_placed`),
    "adaptive" (panels refined where the sum of the gradients integrates worst, see
    :func:`_adaptive`) or "gauss" (one Gauss-Legendre rule over the whole range).
    max_batch_bytes: memory one forward along the path may hold (default :data:`CPU_PATH_BYTES`
    on the CPU, half the free memory of a CUDA device), as
    :func:`~contllm.attribution.path.row_bytes` estimates it: a differentiated row keeps every
    layer's activations and its own copy of the prefix keys until its backward, so it sets how
    many taus share a forward; only one forward's activations are alive at a time.
    max_batch_tokens: also cap a forward at this many rows x tokens after the prefix (default
    :data:`CPU_GRAD_TOKENS` on the CPU, 8 x that on an accelerator). How the taus are chunked
    changes the numbers only by float rounding (a matmul's sums may run in another order).

    Tokens before the first attributed token (and before the read position) keep their
    durations and times all along the path: they run once, without gradients, and their
    keys are reused. Raises SignalError for a ``readout`` that is not a :class:`Readout`
    (a function of the logits goes to ``lm.gradients``), bad indices, steps or floor, or a
    baseline whose read position sees no token of positive duration.
    """
    if not isinstance(readout, Readout):
        shown = getattr(readout, "__qualname__", None) or repr(readout)
        raise SignalError(
            "readout must be a contllm.attribution.Readout (e.g. Readout.tokens([token_id])); got "
            f"{type(readout).__name__} {shown[:60] + '...' if len(shown) > 60 else shown}; "
            "for a function of the logits, take lm.gradients"
        )
    from contllm.core.engine import check_signals

    (signal,) = check_signals(signal, single_ok=True)  # the gate of every entry point (in-place edits included)
    chosen, position = _check_tokens(signal, tokens, position)
    if not (isinstance(floor, (int, float)) and 0 <= floor < 1):
        raise SignalError(f"floor must be 0 (deletion) or a duration factor in (0, 1), got {floor!r}")
    if rule not in RULES:
        raise SignalError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    if smallest is not None and not (isinstance(smallest, float) and 0 < smallest < 1):
        raise SignalError(f"smallest must be None or a number in (0, 1), got {smallest!r}")
    for name, budget in (("max_batch_tokens", max_batch_tokens), ("max_batch_bytes", max_batch_bytes)):
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1):
            raise SignalError(f"{name} must be a positive integer or None, got {budget!r}")
    gauss_legendre_log(steps, 0.5)  # checks steps
    base_durations = signal.durations.clone()
    active = [j for j in chosen if base_durations[j] > 0]
    baseline_signal = signal.scale_tokens(chosen, float(floor))
    if baseline_signal.blind_positions([position]):
        raise SignalError(
            f"with the attributed tokens at duration {floor:g} x d, the read position {position} sees no token of "
            "positive duration: the baseline is undefined; leave an earlier token out of the set"
        )
    path = DurationPath(lm, signal, readout, active, position, max_batch_tokens, max_batch_bytes)
    # f at the ends and, for the deletion baseline, at the probes of the lowest tau: one batch without gradients.
    probes = PROBES if smallest is None else np.array([smallest])
    ends = path.values(np.concatenate([[1.0, float(floor)], probes if floor == 0 else []]))
    low, start = float(floor), float(ends[1])
    noise = NOISE * torch.finfo(lm.dtype).eps * max(1.0, abs(float(ends[0])))
    if floor == 0:
        low, start = _lowest(probes, ends[2:], float(ends[1]), REMAINDER * abs(float(ends[0] - ends[1])) + noise)
    attributions = np.zeros(len(chosen))
    panels, forwards, gradients = 1, 0, steps
    if active:
        if rule == "adaptive" and steps >= 2 * PANEL_ORDER:
            per_token, panels = _adaptive(path, steps, low)
        elif rule == "placed" and steps >= PANEL_ORDER:
            tolerance = max(CURVE_TOL * max(1.0, abs(float(ends[0] - ends[1]))), CURVE_NOISE * noise)
            per_token, panels, counts = _placed(path, steps, low, tolerance, noise)
            forwards, gradients = counts["forwards"], counts["gradients"]
        else:
            nodes, weights = gauss_legendre_log(steps, low)
            per_token = weights @ path.gradients(nodes)  # [steps] @ [steps, active]
        where = {j: k for k, j in enumerate(chosen)}
        for k, j in enumerate(active):
            attributions[where[j]] = per_token[k]
    return Attribution(
        tokens=chosen,
        attributions=attributions,
        full=float(ends[0]),
        baseline=float(ends[1]),
        start=start,
        steps=steps,
        floor=float(floor),
        smallest=low if floor == 0 else float("nan"),
        position=position,
        readout=readout.name,
        meta={
            "prefix": path.prefix,
            "rule": rule,
            "panels": panels,
            "forwards": forwards,
            "gradients": gradients,
            "window_crossings": window_crossings(lm, signal, active, low),
        },
    )


def _lowest(probes: np.ndarray, values: np.ndarray, baseline: float, tolerance: float) -> tuple[float, float]:
    """The lower end of the integral and f there: the largest probe below which f stays at f(0).

    A probe qualifies when it and every smaller probe read within ``tolerance`` of f(0);
    with none, the smallest probe. What lies below it (``remainder``) is not integrated and
    counts in the completeness error.
    """
    order = np.argsort(probes)
    chosen = int(order[0])
    for k in order:
        if abs(values[k] - baseline) > tolerance:
            break
        chosen = int(k)
    return float(probes[chosen]), float(values[chosen])


def _adaptive(path: DurationPath, steps: int, low: float) -> tuple[np.ndarray, int]:
    """Per-token integrals [active] by panels of :data:`PANEL_ORDER` Gauss-Legendre nodes in log tau.

    The range [log low, 0] starts as :data:`FIRST_PANELS` panels, narrower toward 0 (fewer
    when ``steps`` is small). Each panel's error is measured by completeness on the panel itself: the
    integral of the summed gradients against f(end) - f(start), both ends evaluated without
    gradients. The worst panel is then halved, one at a time, until ``steps`` gradient
    evaluations are spent (the halved panel's own nodes count as spent). Returns the
    integrals and the number of panels of the final rule.
    """
    a = math.log(low)
    checks = quadrature.Checks(path.values, path.gradients)

    def evaluate(bounds: list[tuple[float, float]]) -> list[tuple[float, float, np.ndarray, float]]:
        measured = checks.measure([(lo, hi, PANEL_ORDER) for lo, hi in bounds])
        return [(lo, hi, part, abs(error)) for lo, hi, _, part, error in measured]

    first = max(1, min(FIRST_PANELS, steps // (2 * PANEL_ORDER)))
    # Narrower toward tau = 1, where positions move fastest: edges at a (1 - u)^2, u evenly spaced.
    edges = a * (1 - np.linspace(0.0, 1.0, first + 1)) ** 2
    panels = evaluate(list(zip(edges[:-1].tolist(), edges[1:].tolist())))
    spent = first * PANEL_ORDER
    while steps - spent >= 2 * PANEL_ORDER:
        worst = max(range(len(panels)), key=lambda k: panels[k][3])
        lo, hi, _, _ = panels.pop(worst)
        panels += evaluate([(lo, (lo + hi) / 2), ((lo + hi) / 2, hi)])
        spent += 2 * PANEL_ORDER
    return np.sum([panel[2] for panel in panels], axis=0), len(panels)


def _placed(
    path: DurationPath, steps: int, low: float, tolerance: float, noise: float
) -> tuple[np.ndarray, int, dict[str, int]]:
    """Per-token integrals [active] on panels laid out from f alone, then checked against f (:func:`quadrature.integrate`)."""
    total, panels, counts = quadrature.integrate(
        path.values, path.gradients, math.log(low), steps, tolerance, noise, budget=CURVE_FORWARDS
    )
    return total, len(panels), counts


# ---------------------------------------------------------------------------- occlusion
def occlusion(
    lm: Any,
    signal: Signal,
    readout: Readout,
    tokens: Sequence[int] | None = None,
    *,
    factors: Sequence[float] = (0.0,),
    evaluate: Callable[[list[Signal]], torch.Tensor] | None = None,
) -> tuple[float, np.ndarray]:
    """f(signal) - f(signal with token j alone at duration factor x d_j), for each factor and token j.

    factor 0 deletes each token alone (occlusion); 0.5 halves it (leave-one-out shrink).
    The read position is the last. evaluate: signals -> next-token distributions [S,
    vocab] (default: the batched engine); every signal goes into one call. Returns
    f(signal) and the differences [factors, k] (positive: the token raises f).
    """
    chosen, _ = _check_tokens(signal, tokens, -1)
    factors = [float(c) for c in factors]
    if not factors or not all(math.isfinite(c) and c >= 0 for c in factors):
        raise SignalError(f"occlusion factors must be finite and >= 0, got {factors}")
    if evaluate is None:
        from contllm.core.engine import Engine

        engine = Engine(lm)

        def evaluate(batch: list[Signal]) -> torch.Tensor:
            return engine.probs(batch)  # type: ignore[return-value]  # last positions: one tensor [S, vocab]

    signals = [signal] + [signal.scale_tokens([j], c) for c in factors for j in chosen]
    with torch.no_grad():  # forwards only, whatever ``evaluate`` is: no graph is built
        f = readout.from_probs(evaluate(signals))
    return float(f[0]), (f[0] - f[1:]).reshape(len(factors), len(chosen))
