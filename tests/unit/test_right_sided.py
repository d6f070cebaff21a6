"""The gradient at duration 0 is the right-sided derivative (contllm.internals.activations.differentiable_batch).

A token of duration 0 enters attention with the weight d exp(s), linear in d, so
d log p / d d has a finite limit as d -> 0+. What lm.gradients gives at d = 0 must be that
limit: the gradient autograd gives at a duration just above 0, and right-sided finite
differences of the stock float64 model, for a deleted token in the middle of a prompt and
at its end (the read position), on three families.

A float64 model of transformers is not float64 throughout: its norms (and eager's
softmax) compute in float32 and position ids are float32, so its log-probabilities carry
relative noise of about 1e-7. Differences at step H therefore keep an error of about
1e-7 / H besides Richardson's O(H^2); at H = 3e-3 the largest measured over these six
cases was 0.4% of the derivative, against a bound of 1%. The part of the key's own
weight that the gradient used to drop at 0 is far larger (llama, middle: 0.211 with it,
-0.140 without).
"""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal
from tests.unit.test_gradients import clear_of_kinks, log_p, stock_values
from tests.unit.tiny import prompt, random_durations, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

N = 8
H = 3e-3
INDICES = pytest.mark.parametrize("index", [3, N - 1], ids=["middle", "end"])
FAMILIES = pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])


def deleted(index: int) -> torch.Tensor:
    """Seeded random durations with token ``index`` at 0, whose times keep clear of window edges over [0, 2H]."""
    seed = 5
    while True:
        d = random_durations(N, seed)
        d[index] = 0.0
        steps = (torch.where(torch.arange(N) == index, torch.full_like(d, h), d) for h in (0.0, H / 2, H, 2 * H))
        if all(clear_of_kinks(s, False) for s in steps):
            return d
        seed += 1


def at(signal: Signal, index: int, duration: float) -> Signal:
    d = signal.durations.clone()
    d[index] = duration
    return signal.with_durations(d)


def right_difference(lm: ContinuousLM, signal: Signal, index: int) -> float:
    """Richardson's 2 D(H/2) - D(H) of one-sided differences D(h) = (f(h) - f(0)) / h: error O(H^2)."""
    f0, fh, fh2 = stock_values(lm, [at(signal, index, h) for h in (0.0, H, H / 2)], log_p).tolist()
    return 2 * (fh2 - f0) / (H / 2) - (fh - f0) / H


@FAMILIES
@INDICES
def test_the_gradient_at_duration_zero_equals_right_sided_differences(family: str, index: int) -> None:
    lm = ContinuousLM(tiny_model64(family, "sdpa"))
    signal = Signal.from_ids(prompt(N, 5), deleted(index))
    grads = lm.gradients(signal, log_p)
    expected = right_difference(lm, signal, index)
    got = float(grads.durations[0][index])
    assert abs(got - expected) <= 1e-2 * max(abs(expected), 0.1), (got, expected)
    # The value read is that of duration 0: the token runs at 1.2e-38 and changes no output.
    assert abs(float(grads.values[0]) - float(stock_values(lm, [signal], log_p)[0])) <= 1e-6


@FAMILIES
@INDICES
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_the_gradient_at_duration_zero_is_the_limit_of_the_gradients_above_it(family: str, index: int, impl: str) -> None:
    lm = ContinuousLM(tiny_model64(family, impl))
    signal = Signal.from_ids(prompt(N, 5), deleted(index))
    at_zero = lm.gradients(signal, log_p).durations[0]
    above = lm.gradients(at(signal, index, 1e-9), log_p).durations[0]  # autograd where the derivative is plain
    assert torch.allclose(at_zero, above, rtol=1e-4, atol=1e-6), (at_zero, above)


def test_explicit_times_stay_put_and_padding_stays_hidden() -> None:
    lm = ContinuousLM(tiny_model64("llama", "sdpa"))
    signal = Signal.from_ids(prompt(N, 5), deleted(3))
    pinned = signal.with_times(signal.times)  # times no longer follow durations: only the weight moves
    at_zero = lm.gradients(pinned, log_p).durations[0]
    above = lm.gradients(at(pinned, 3, 1e-9), log_p).durations[0]
    assert torch.allclose(at_zero, above, rtol=1e-4, atol=1e-6)
    short = Signal.from_ids(prompt(5, 6), torch.tensor([1.0, 0.0, 1.0, 0.5, 1.0], dtype=torch.float64))
    together = lm.gradients([short, signal], log_p)  # short is left-padded by three zero-duration tokens
    alone = lm.gradients(short, log_p)
    assert torch.allclose(together.durations[0], alone.durations[0], rtol=1e-6, atol=1e-9)
    assert torch.allclose(together.values[0], alone.values[0], rtol=1e-6, atol=1e-9)
