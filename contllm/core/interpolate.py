"""Space continuity: two prompts that differ in one span, interpolated in embedding space.

The two spans may tokenize into different numbers of tokens (m and k). They are aligned
in time: the span's total duration T(alpha) = (1 - alpha) D_a + alpha D_b runs from the
first prompt's span duration to the second's; each span is split evenly over its own
tokens; both are cut at the union of their breakpoints, and each piece carries the
interpolation of the two tokens it overlaps, for its share of T(alpha). A piece sits at
the time of its token in the first prompt at alpha = 0 and in the second at alpha = 1
(in between, at the interpolation of the two). Pieces of one token at one time add up to
that token (a token of duration d equals copies at its time whose durations add to d), so
alpha = 0 gives exactly the first prompt's token path and alpha = 1 the second's, and
every duration, time and embedding moves continuously in alpha. No pair is refused for
a length mismatch.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

import torch

from contllm.core.signal import Signal, Span
from contllm.errors import SignalError

Method = Literal["linear", "slerp"]


def mix(a: torch.Tensor, b: torch.Tensor, alpha: float, method: Method = "linear") -> torch.Tensor:
    """Interpolate embeddings a, b [..., hidden] at ``alpha``.

    linear: (1 - alpha) a + alpha b. slerp: spherical interpolation of the directions and
    linear interpolation of the norms (falls back to linear directions when a and b are
    parallel).
    """
    if method == "linear":
        return (1 - alpha) * a + alpha * b
    if method != "slerp":
        raise SignalError(f"interpolation method must be 'linear' or 'slerp', got {method!r}")
    a32, b32 = a.float(), b.float()
    na, nb = a32.norm(dim=-1, keepdim=True), b32.norm(dim=-1, keepdim=True)
    ua, ub = a32 / na.clamp_min(1e-12), b32 / nb.clamp_min(1e-12)
    cos = (ua * ub).sum(dim=-1, keepdim=True).clamp(-1.0, 1.0)
    omega = torch.arccos(cos)
    sin = torch.sin(omega)
    safe = sin.abs() > 1e-6
    wa = torch.where(safe, torch.sin((1 - alpha) * omega) / torch.where(safe, sin, 1.0), 1 - alpha + 0 * sin)
    wb = torch.where(safe, torch.sin(alpha * omega) / torch.where(safe, sin, 1.0), alpha + 0 * sin)
    direction = wa * ua + wb * ub
    if not bool(safe.all()):
        direction = torch.where(safe, direction, direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    out = direction * ((1 - alpha) * na + alpha * nb)
    return out.to(a.dtype)


def _pieces(m: int, k: int) -> list[tuple[int, int, Fraction]]:
    """Cut [0, 1] at multiples of 1/m and 1/k: (token of a, token of b, length) per piece."""
    cuts = sorted({Fraction(i, m) for i in range(m + 1)} | {Fraction(j, k) for j in range(k + 1)})
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        mid = (lo + hi) / 2
        out.append((int(mid * m), int(mid * k), hi - lo))
    return out


def interpolate_spans(
    a: Signal,
    span_a: Span,
    b: Signal,
    span_b: Span,
    alpha: float,
    *,
    method: Method = "linear",
) -> Signal:
    """The signal at ``alpha`` between ``a`` (alpha = 0) and ``b`` (alpha = 1).

    a, b: signals built from text with their embeddings set (:meth:`Signal.embedded`);
    span_a, span_b: the character spans that differ. Outside the spans the two signals
    must hold the same tokens with the same durations. Returns an embedding signal with
    explicit times.
    """
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise SignalError(f"alpha must lie in [0, 1], got {alpha}")
    if a.embeds is None or b.embeds is None:
        raise SignalError("interpolation needs embedded signals; call Signal.embedded(model embedding) first")
    ia, ib = a.token_indices(span_a), b.token_indices(span_b)
    for idx, name in ((ia, "first"), (ib, "second")):
        if idx != list(range(idx[0], idx[-1] + 1)):
            raise SignalError(f"the {name} span does not cover a contiguous run of tokens")
    pre_a, post_a = ia[0], len(a) - ia[-1] - 1
    pre_b, post_b = ib[0], len(b) - ib[-1] - 1
    if pre_a != pre_b or post_a != post_b:
        raise SignalError(
            f"the prompts differ outside the spans: {pre_a} and {pre_b} tokens before, {post_a} and {post_b} after"
        )
    for lo_a, lo_b, count, where in ((0, 0, pre_a, "before"), (ia[-1] + 1, ib[-1] + 1, post_a, "after")):
        sa, sb = slice(lo_a, lo_a + count), slice(lo_b, lo_b + count)
        same = torch.equal(a.durations[sa], b.durations[sb]) and torch.allclose(
            a.embeds[sa].float(), b.embeds[sb].float(), atol=0, rtol=0
        )
        if not same:
            raise SignalError(f"the prompts differ {where} the spans; only the spans may differ")

    m, k = len(ia), len(ib)
    da, db = a.durations[ia], b.durations[ib]
    if not (torch.allclose(da, da[0].expand(m)) and torch.allclose(db, db[0].expand(k))):
        raise SignalError("each span's tokens must share one duration to be aligned in time")
    total_a, total_b = float(da.sum()), float(db.sum())
    total = (1 - alpha) * total_a + alpha * total_b
    times_a, times_b = a.times, b.times
    start_a, start_b = float(times_a[ia[0]] - da[0]), float(times_b[ib[0]] - db[0])
    if abs(start_a - start_b) > 1e-9:
        raise SignalError("the spans start at different times in the two prompts")

    embeds, durations, times = [], [], []
    for i, j, length in _pieces(m, k):
        embeds.append(mix(a.embeds[ia[i]], b.embeds[ib[j]], alpha, method))
        durations.append(float(length) * total)
        # The piece's own token's right end, in each prompt's span rescaled to the current total.
        ta = start_a + total * (i + 1) / m
        tb = start_b + total * (j + 1) / k
        times.append((1 - alpha) * ta + alpha * tb)

    shift = total - total_a  # how far the suffix moves relative to the first prompt
    embeds_t = torch.cat([a.embeds[: ia[0]], torch.stack(embeds), a.embeds[ia[-1] + 1 :]])
    durations_t = torch.cat(
        [a.durations[: ia[0]], torch.tensor(durations, dtype=torch.float64), a.durations[ia[-1] + 1 :]]
    )
    times_t = torch.cat([times_a[: ia[0]], torch.tensor(times, dtype=torch.float64), times_a[ia[-1] + 1 :] + shift])
    return Signal.from_embeds(embeds_t, durations_t, times=times_t)
