"""Hooks are bound to the signals they were made for (contllm.internals.intervention): a run of any other signals
inside ``lm.hooks`` is refused, naming what differs, and ``lm.logits`` inside runs the hooks' own signals through them."""

from __future__ import annotations

import copy

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.core.signal import pad_signals
from contllm.errors import SignalError
from contllm.internals.activations import Patch, patch
from tests.unit.tiny import prompt, random_durations, tiny_model

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

N = 7
RESID = "blocks.0.hook_resid_pre"


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def unit_signals() -> list[Signal]:
    return [Signal.from_ids(prompt(N, 3)), Signal.from_ids(prompt(N - 2, 4))]


def halved(signals: list[Signal]) -> list[Signal]:
    return [s.with_durations(s.durations * 0.5) for s in signals]


def log_p(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1)[..., 5]


def test_hooks_made_for_unit_durations_refuse_every_run_of_the_halved_ones() -> None:
    # The issue: inside lm.hooks(unit), a run of the halved signals (same shape) ran silently, its hooks
    # reporting the unit durations. Every way of running them now raises before anything runs.
    lm = ContinuousLM(tiny_model("llama"))
    unit, half = unit_signals(), halved(unit_signals())
    seen: list[torch.Tensor] = []

    def record(x: torch.Tensor, hook) -> None:
        seen.append(hook.durations.clone())

    why = r"made for other signals \(signal 0's durations differ at token 0 \(1 there, 0.5 here\)\)"
    with lm.hooks(unit, [(RESID, record)]):
        with pytest.raises(SignalError, match=why):
            lm.run_with_cache(half, names="blocks.0.hook_resid_post")
        with pytest.raises(SignalError, match=why):
            lm.run_with_hooks(half)
        with pytest.raises(SignalError, match=why):
            lm.logits(half)
        with pytest.raises(SignalError, match=why):
            lm.probs(half, positions="all")
        with pytest.raises(SignalError, match=why):
            lm.gradients(half, log_p)
        with pytest.raises(SignalError, match="generate runs no named hooks"):
            lm.generate(unit, 2)
        assert seen == []  # nothing ran with the other signals
        lm.run_with_cache(unit, names="blocks.0.hook_resid_post")  # the hooks' own signals run
    assert len(seen) == 1 and torch.equal(seen[0], pad_signals(unit).durations)
    # A patch is a hook context too: bound to its signals.
    with patch(lm, unit, Patch(RESID, [0], torch.zeros(2, 1, 64))):
        with pytest.raises(SignalError, match=why):
            lm.run_with_cache(half, names=RESID)


def other_times(s: Signal) -> Signal:
    return s.with_times(s.times + 0.25)


def other_ids(s: Signal) -> Signal:
    assert s.token_ids is not None
    ids = s.token_ids.clone()
    ids[2] = (ids[2] + 1) % 97
    return Signal.from_ids(ids, s.durations)


def given_embeds(s: Signal) -> Signal:
    lm = ContinuousLM(tiny_model("llama"))
    return Signal.from_embeds(lm.embed(s)[0], s.durations)


@pytest.mark.parametrize(
    "edit,why",
    [
        (other_times, r"signal 1's times differ at token 0 \(0 there, 0.25 here\)"),
        (other_ids, r"signal 1's token ids differ at token 2"),
        (given_embeds, r"signal 1 is given by token ids in one and not in the other"),
        (lambda s: Signal.from_ids(prompt(N, 4)), r"signal 1 has 5 tokens there, 7 here"),
    ],
)
def test_the_refusal_names_what_differs(edit, why: str) -> None:
    lm = ContinuousLM(tiny_model("llama"))
    unit = unit_signals()
    other = [unit[0], edit(unit[1])]
    with lm.hooks(unit, [(RESID, lambda x, h: None)]):
        with pytest.raises(SignalError, match=why):
            lm.run_with_cache(other, names=RESID)


def test_logits_inside_the_context_run_the_hooks_signals_through_the_hooks() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    items = [Signal.from_ids(prompt(N, 5), random_durations(N, 5)), Signal.from_ids(prompt(4, 6), random_durations(4, 6))]

    def ablate(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        z[:, :, 1] = 0
        return z

    hooked = [(("z", 1), ablate)]
    plain = lm.logits(items)
    by_call = lm.run_with_hooks(items, fwd_hooks=hooked, positions="all")
    by_last = lm.run_with_hooks(items, fwd_hooks=hooked)
    by_one = lm.run_with_hooks(items, fwd_hooks=hooked, positions=-2)
    with lm.hooks(items, hooked):
        inside = lm.logits(items, positions="all")
        last = lm.probs(items)
        one = lm.logits(items, positions=-2, batch_size=1)  # batch_size does not apply: one forward
    assert isinstance(inside, list) and isinstance(by_call, list)
    for b in range(2):
        assert torch.equal(inside[b], by_call[b])
    assert isinstance(by_last, torch.Tensor) and isinstance(plain, torch.Tensor)
    assert torch.equal(last, torch.softmax(by_last, dim=-1)) and torch.equal(one, by_one)
    assert max_diff(by_last, torch.stack([r[-1] for r in by_call])) <= 1e-5
    assert max_diff(last.log(), plain.log_softmax(-1)) > 1e-3  # the ablation moved them
    # With hooks that change nothing, the one padded forward gives the engine's logits (to float rounding).
    with lm.hooks(items, [(RESID, lambda x, h: None)]):
        same = lm.logits(items)
    assert max_diff(same, plain) <= 1e-5
    # Parity with plain torch hooks on the stock model, at unit durations: head 1 of layer 1 zeroed.
    ids = prompt(N, 5)
    stock = copy.deepcopy(lm.model)
    attn = stock.model.layers[1].self_attn
    d = attn.head_dim

    def zero_head(module: torch.nn.Module, args: tuple) -> tuple:
        x = args[0].clone()
        x[..., d : 2 * d] = 0
        return (x, *args[1:])

    handle = attn.o_proj.register_forward_pre_hook(zero_head)
    with torch.no_grad():
        want = stock(ids[None]).logits[0, -1]
    handle.remove()
    with lm.hooks(Signal.from_ids(ids), hooked):
        got = lm.logits(Signal.from_ids(ids))
    assert got.shape == want.shape and max_diff(got, want) <= 1e-5
