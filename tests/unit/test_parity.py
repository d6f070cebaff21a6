"""The invariants of continuous time (DESIGN.md section 1) on every supported family."""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal, pad_signals
from tests.unit.tiny import (
    FAMILY_NAMES,
    ROTARY,
    WINDOW,
    WINDOWED,
    backends,
    prompt,
    random_durations,
    tiny_model,
    tiny_model64,
)

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

CASES = [(f, b) for f in FAMILY_NAMES for b in backends(f)]
N = 14  # longer than the tiny window (4), so sliding layers really slide


def lm_for(family: str, impl: str) -> ContinuousLM:
    return ContinuousLM(tiny_model(family, impl))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@pytest.mark.parametrize("family,impl", CASES)
def test_identity_unit_durations_equal_stock(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    ids = prompt(N)
    with torch.no_grad():
        stock = lm.model(ids[None]).logits[0]
    ours = lm.logits(Signal.from_ids(ids), positions="all")
    assert max_diff(ours, stock) <= 1e-5


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if "sdpa" in backends(f)])
def test_eager_equals_sdpa(family: str) -> None:
    signal = Signal.from_ids(prompt(N, 1), random_durations(N, 1))
    eager = lm_for(family, "eager").logits(signal, positions="all")
    sdpa = lm_for(family, "sdpa").logits(signal, positions="all")
    assert max_diff(eager, sdpa) <= 1e-5


@pytest.mark.parametrize("family,impl", CASES)
def test_split_token_equals_two_halves_at_same_time(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    signal = Signal.from_ids(prompt(N, 2), random_durations(N, 2))
    whole = lm.logits(signal, positions="all")
    k = 6
    split = lm.logits(signal.split_token(k, 2), positions="all")
    keep = list(range(k + 1)) + list(range(k + 2, N + 1))
    assert max_diff(split[keep], whole) <= 1e-5
    assert max_diff(split[k + 1], whole[k]) <= 1e-5


@pytest.mark.parametrize("family,impl", CASES)
def test_zero_duration_token_changes_nothing_else(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    ids, durations = prompt(N, 3), random_durations(N, 3)
    base = lm.logits(Signal.from_ids(ids, durations), positions="all")
    k = 5
    ids2 = torch.cat([ids[:k], torch.tensor([7]), ids[k:]])
    durations2 = torch.cat([durations[:k], torch.zeros(1, dtype=torch.float64), durations[k:]])
    with_ghost = lm.logits(Signal.from_ids(ids2, durations2), positions="all")
    keep = list(range(k)) + list(range(k + 1, N + 1))
    assert max_diff(with_ghost[keep], base) <= 1e-5


@pytest.mark.parametrize("family,impl", CASES)
def test_left_and_middle_padding_are_absent(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    short = Signal.from_ids(prompt(8, 4), random_durations(8, 4))
    long = Signal.from_ids(prompt(N, 5), random_durations(N, 5))
    alone = lm.logits(short, positions="all")
    # Left padding: the short signal is padded to the long one's length in one batch.
    batch = pad_signals([short, long], side="left")
    with lm.patched():
        padded, _ = lm.forward_batch(batch)
    lo = int(batch.pad_left[0])
    assert lo == N - 8
    assert max_diff(padded[0, lo:], alone) <= 1e-5
    # Middle padding: zero-duration tokens between a cached prefix and the rest, in float64
    # (a cached prefix sums in another order than the full forward; see tiny_model64).
    lm = ContinuousLM(tiny_model64(family, impl))
    alone = lm.logits(short, positions="all")
    prefix = Signal.from_ids(short.token_ids[:3], short.durations[:3])
    rest_times = short.times[3:]
    rest = Signal.from_ids(
        torch.cat([torch.tensor([5, 6, 7]), short.token_ids[3:]]),
        torch.cat([torch.zeros(3, dtype=torch.float64), short.durations[3:]]),
        times=torch.cat([torch.full((3,), float(short.times[2])), rest_times]),
    )
    with lm.patched():
        head, context = lm.forward_batch(pad_signals([prefix]), use_cache=True)
        tail, _ = lm.forward_batch(pad_signals([rest]), context=context)
    assert max_diff(head[0], alone[:3]) <= 1e-5
    assert max_diff(tail[0, 3:], alone[3:]) <= 1e-5


@pytest.mark.parametrize("family,impl", [(f, b) for f, b in CASES if f in ROTARY])
def test_shifting_every_time_changes_nothing(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    signal = Signal.from_ids(prompt(N, 6), random_durations(N, 6))
    base = lm.logits(signal, positions="all")
    shifted = lm.logits(signal.with_times(signal.times + 7.3), positions="all")
    assert max_diff(shifted, base) <= 1e-4


@pytest.mark.parametrize("family,impl", CASES)
def test_batch_equals_each_alone(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    signals = [Signal.from_ids(prompt(n, 10 + n), random_durations(n, 10 + n)) for n in (5, N, 9)]
    batched = lm.logits(signals, positions="all")
    for s, got in zip(signals, batched):
        alone = lm.logits(s, positions="all")
        assert max_diff(got, alone) <= 1e-5
    last = lm.logits(signals, positions="last")
    assert max_diff(last, torch.stack([b[-1] for b in batched])) <= 1e-5
    picked = lm.logits(signals, positions=[0, -2])
    assert max_diff(picked, torch.stack([b[[0, -2]] for b in batched])) <= 1e-5


@pytest.mark.parametrize("family,impl", CASES)
def test_changing_a_token_leaves_earlier_times_exactly_unchanged(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    ids, durations = prompt(N, 7), random_durations(N, 7)
    base = lm.logits(Signal.from_ids(ids, durations), positions="all")
    p = 8
    ids2, durations2 = ids.clone(), durations.clone()
    ids2[p] = (ids[p] + 1) % 97
    durations2[p] = 0.37
    changed = lm.logits(Signal.from_ids(ids2, durations2), positions="all")
    assert torch.equal(changed[:p], base[:p])
    assert max_diff(changed[p:], base[p:]) > 1e-4  # the change is visible after p


@pytest.mark.parametrize("family", WINDOWED)
def test_windows_follow_time(family: str) -> None:
    """A key leaves a sliding layer's window when the time between it and the query reaches the window."""
    lm = lm_for(family, "eager")
    from contllm.core.attention import model_masks

    times = torch.tensor([[0.0, 1.0, 2.5, 3.9, 4.0, 6.5]], dtype=torch.float64)
    durations = torch.ones_like(times)
    masks = model_masks(lm.family, lm.model.config, times, times, durations, dtype=torch.float32, device="cpu")
    sliding = masks["sliding_attention"] if isinstance(masks, dict) else masks
    visible = sliding[0, 0] > torch.finfo(torch.float32).min / 2
    # Query at time 4.0 (column 4 is itself): keys at 0.0 (distance 4) hidden, 1.0 (distance 3) seen.
    assert visible[4].tolist() == [False, True, True, True, True, False]
    # Query at 3.9: the key at 0.0 is 3.9 away, inside a window of 4.
    assert visible[3].tolist() == [True, True, True, True, False, False]
    if isinstance(masks, dict) and "full_attention" in masks:
        full = masks["full_attention"][0, 0] > torch.finfo(torch.float32).min / 2
        assert full[5].all()


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_greedy_generation_matches_stock_generate(family: str) -> None:
    lm = lm_for(family, backends(family)[-1])
    ids = prompt(9, 9)
    ours = lm.generate(Signal.from_ids(ids), max_new_tokens=12)
    with torch.no_grad():
        stock = lm.model.generate(
            ids[None], attention_mask=torch.ones(1, 9, dtype=torch.long), max_new_tokens=12, do_sample=False,
            pad_token_id=0,
        )[0, 9:]
    assert ours.token_ids == stock.tolist()


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_logits_are_continuous_in_a_duration(family: str) -> None:
    # A sliding window is a hard edge in time, as in the stock model: a key that crosses it
    # enters at once. Windowed families are therefore probed on a prompt that fits the window.
    n = WINDOW if family in WINDOWED else N
    lm = lm_for(family, "eager")
    signal = Signal.from_ids(prompt(n, 11))
    base = lm.logits(signal, positions="all")
    diffs = []
    for h in (1e-2, 1e-3, 1e-4):
        moved = lm.logits(signal.scale_tokens([1], 1.0 - h), positions="all")
        diffs.append(max_diff(moved, base))
    assert diffs[0] > 1e-4
    # A continuous (here differentiable) map: ten times smaller step, about ten times smaller change.
    assert diffs[1] < diffs[0] / 5 and diffs[2] < diffs[1] / 5


@pytest.mark.parametrize("family,impl", CASES)
def test_stock_forward_is_restored_after_the_scope(family: str, impl: str) -> None:
    lm = lm_for(family, impl)
    ids = prompt(N, 12)[None]
    with torch.no_grad():
        before = lm.model(ids).logits
    lm.logits(Signal.from_ids(ids[0], random_durations(N, 12)), positions="all")
    with torch.no_grad():
        after = lm.model(ids).logits
    assert torch.equal(before, after)
    with pytest.raises(RuntimeError, match="boom"):
        with lm.patched():
            raise RuntimeError("boom")
    with torch.no_grad():
        after_error = lm.model(ids).logits
    assert torch.equal(before, after_error)
