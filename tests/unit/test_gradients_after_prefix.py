"""Gradients by the tokens after a shared prefix (lm.gradients(..., tokens=...)): the prefix runs once without a
graph, and the gradients are those of the full forward's, picked at the chosen tokens."""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.errors import SignalError
from contllm.internals import gradients as gradients_module
from tests.unit.test_gradients import log_p
from tests.unit.test_hooked_prefix import P, RESTS, shared
from tests.unit.tiny import tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

#: float64 models. The times after the prefix are its end plus their own durations' sum, the full forward's the
#: start plus every duration's: one float64 rounding apart, which the stock rotary modules' float32 positions widen
#: to their ulp (1.9e-6 at t = 20; measured up to 1.0e-6 of the largest gradient here). GPT-2's learned table reads
#: the times in float64: there the two agree to float64 rounding.
TOLERANCE = {"rotary": 1e-5, "learned": 1e-12}


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The prefix lengths lm.gradients ran once (a spy on SharedPrefix.compute)."""
    calls: list[int] = []
    real = gradients_module.SharedPrefix.compute

    def spy(lm: ContinuousLM, source: Signal, length: int, origin: float = 0.0) -> object:
        calls.append(length)
        return real(lm, source, length, origin)

    monkeypatch.setattr(gradients_module.SharedPrefix, "compute", spy)
    return calls


def picked(full: list[torch.Tensor], tokens: list[int]) -> list[torch.Tensor]:
    return [g[[t % len(g) for t in tokens]] for g in full]


def relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "gpt2"])
@pytest.mark.parametrize("zero", [False, True], ids=["positive", "zero-duration"])
def test_gradients_by_the_tokens_after_a_shared_prefix_are_the_full_forwards(
    family: str, zero: bool, computed: list[int]
) -> None:
    """Each signal's durations and embeddings at its last three tokens, with a token of duration 0 among them (the
    right-sided derivative) or not: the prefix ran once, and the values and gradients are the full forward's."""
    lm = ContinuousLM(tiny_model64(family))
    tolerance = TOLERANCE[lm.family.positions]
    items = shared()
    if zero:
        items = [s.with_durations(torch.cat([s.durations[:-2], torch.zeros(1), s.durations[-1:]])) for s in items]
    tokens = [-3, -2, -1]
    fast = lm.gradients(items, log_p, tokens=tokens)
    assert computed == [P]
    full = lm.gradients(items, log_p)
    assert computed == [P]  # every token asked for: the full forward
    assert relative([fast.values], [full.values]) <= tolerance
    assert [tuple(g.shape) for g in fast.durations] == [(3,)] * len(items)
    assert [tuple(g.shape) for g in fast.embeds] == [(3, 64)] * len(items)
    assert fast.durations[0].dtype == torch.float64
    assert relative(fast.durations, picked(full.durations, tokens)) <= tolerance
    assert relative(fast.embeds, picked(full.embeds, tokens)) <= tolerance
    # The chosen tokens' durations move the answer, and a later duration moves the times of the tokens after it.
    assert all(float(g.abs().min()) > 0 for g in fast.durations)


def test_which_gradients_keep_the_full_forward(computed: list[int]) -> None:
    """Tokens inside the prefix, an activation among wrt, hooks on the model: the full forward, with the same answer."""
    lm = ContinuousLM(tiny_model64("qwen2"))
    items = shared()
    full = lm.gradients(items, log_p)
    # The full forward's own gradients, picked: equal to float64 rounding (the same computation).
    inside = lm.gradients(items, log_p, tokens=[3, -1], wrt="durations")
    assert relative(inside.durations, picked(full.durations, [3, -1])) <= 1e-12
    with_activation = lm.gradients(items, log_p, tokens=-1, wrt=["durations", "blocks.0.hook_resid_post"])
    assert relative(with_activation.durations, picked(full.durations, [-1])) <= 1e-12
    with lm.hooks(items, [("blocks.0.hook_resid_post", lambda x, hook: None)]):
        hooked = lm.gradients(items, log_p, tokens=-1)
    assert relative(hooked.durations, picked(full.durations, [-1])) <= 1e-12
    assert computed == []
    # A read position early in the prefix keeps it whole too.
    lm.gradients(items, lambda logits: log_p(logits).sum(-1), positions=[3, -1], tokens=-1)
    assert computed == []
    lm.gradients(items, log_p, tokens=-1)
    assert computed == [P]


@pytest.mark.parametrize("tokens", [max(RESTS) + P + 5, [0, -100], "every", 1.5, []])
def test_tokens_outside_a_signal_or_of_no_kind_are_signal_errors(tokens: object) -> None:
    lm = ContinuousLM(tiny_model64("llama"))
    with pytest.raises(SignalError, match="tokens"):
        lm.gradients(shared(), log_p, tokens=tokens)  # type: ignore[arg-type]
