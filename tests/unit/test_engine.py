"""The engine equals evaluating each signal alone, with and without the shared prefix, in any chunking."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from contllm import ContinuousLM, Signal, SignalError
from contllm.core.chunks import plan
from contllm.core.engine import Engine
from contllm.core.prefix import shared_prefix_len
from tests.unit.tiny import WINDOW, prompt, random_durations, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

# A rotary family, three windowed ones (window 4, prompts of 12-15 tokens) and learned positions.
FAMILIES = [("llama", "sdpa"), ("mistral", "sdpa"), ("gemma3", "eager"), ("qwen2", "eager"), ("gpt2", "eager")]
BASE = 12
EDIT = (8, 10)  # tokens whose durations the sweep scales; the shared prefix is the 8 before
assert EDIT[0] > WINDOW


def lm_for(family: str, impl: str = "eager") -> ContinuousLM:
    return ContinuousLM(tiny_model(family, impl))


def sweep(n: int = 9) -> list[Signal]:
    """A duration sweep over tokens 8-9 of one prompt, followed by 0-3 extra tokens (mixed lengths)."""
    ids = torch.cat([prompt(BASE, 1), prompt(3, 2)])
    durations = random_durations(BASE + 3, 3)
    out = []
    for k, c in enumerate(torch.linspace(0.1, 1.5, n).tolist()):
        length = BASE + k % 4
        d = durations[:length].clone()
        d[EDIT[0] : EDIT[1]] *= c
        out.append(Signal.from_ids(ids[:length], d))
    return out


def one_by_one(lm: ContinuousLM, signals: list[Signal]) -> torch.Tensor:
    return torch.stack([lm.logits(s) for s in signals])


@functools.cache
def sweep_alone(family: str, impl: str) -> torch.Tensor:
    return one_by_one(lm_for(family, impl), sweep())


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("family,impl", FAMILIES)
@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("max_batch_tokens", [40, None])
def test_engine_equals_each_signal_alone(family: str, impl: str, prefix_cache: bool, max_batch_tokens: int | None) -> None:
    lm = lm_for(family, impl)
    signals = sweep()
    engine = Engine(lm, max_batch_tokens=max_batch_tokens, prefix_cache=prefix_cache)
    got = engine.logits(signals)
    assert got.dtype == torch.float32 and got.shape == (len(signals), lm.model.config.vocab_size)
    assert max_diff(got, sweep_alone(family, impl)) <= 1e-5
    stats = engine.last_stats
    assert stats is not None and sum(c.rows for c in stats.chunks) == len(signals)
    if max_batch_tokens is not None:
        assert len(stats.chunks) > 1
        # The budget counts the tokens a chunk computes; a shared prefix runs once, not per row.
        assert all(c.rows * c.width <= max_batch_tokens for c in stats.chunks if c.rows > 1)
    used = {p for c, p in zip(stats.chunks, stats.prefix_lens) if c.rows > 1}
    assert used == ({EDIT[0]} if prefix_cache else {0})


def test_sweep_with_only_the_last_tokens_different_uses_a_long_prefix() -> None:
    lm = ContinuousLM(tiny_model64("mistral", "eager"))  # the cached prefix sums in another order: see tiny_model64
    ids = prompt(20, 4)
    signals = [Signal.from_ids(ids).scale_tokens([18, 19], c) for c in (0.25, 0.5, 1.0, 2.0)]
    engine = Engine(lm)
    got = engine.logits(signals)
    assert engine.last_stats is not None
    assert engine.last_stats.prefix_lens == (18,)
    assert engine.last_stats.tokens_computed == 18 + 4 * 2
    assert max_diff(got, one_by_one(lm, signals)) <= 1e-5


def test_prefix_is_computed_once_and_reused_across_chunks() -> None:
    lm = lm_for("llama")
    signals = sweep(12)
    engine = Engine(lm, max_batch_tokens=20)
    got = engine.logits(signals)
    stats = engine.last_stats
    assert stats is not None and len(stats.chunks) >= 3
    assert [c.prefix_computed for c in stats.chunks if c.prefix_len] == [True] + [False] * (
        sum(1 for c in stats.chunks if c.prefix_len) - 1
    )
    assert max_diff(got, one_by_one(lm, signals)) <= 1e-5


def test_a_signal_that_is_all_prefix_keeps_its_last_token() -> None:
    lm = ContinuousLM(tiny_model64("qwen2", "eager"))  # the cached prefix sums in another order: see tiny_model64
    ids = prompt(14, 5)
    short, long = Signal.from_ids(ids[:9]), Signal.from_ids(ids)
    engine = Engine(lm)
    got = engine.logits([short, long, short])
    assert engine.last_stats is not None and engine.last_stats.prefix_lens == (8,)
    assert max_diff(got, one_by_one(lm, [short, long, short])) <= 1e-5


def test_different_times_or_embeddings_end_the_prefix() -> None:
    lm = lm_for("llama")
    ids = prompt(10, 6)
    a = Signal.from_ids(ids)
    shifted = a.with_times(a.times + torch.tensor([0.0] * 3 + [0.5] * 7, dtype=torch.float64))
    assert shared_prefix_len([a, shifted], lm) == 3
    embeds = lm.embed(a)[0]
    nudged = embeds.clone()
    nudged[5] += 1e-3
    as_embeds = [Signal.from_embeds(embeds), Signal.from_embeds(nudged), a]
    assert shared_prefix_len(as_embeds, lm) == 5
    engine = Engine(lm)
    got = engine.logits([a, shifted, *as_embeds])
    assert max_diff(got, one_by_one(lm, [a, shifted, *as_embeds])) <= 1e-5


def test_probs_progress_and_order() -> None:
    lm = lm_for("gpt2")
    signals = sweep(7)
    seen: list[int] = []
    engine = Engine(lm, max_batch_tokens=30)
    wanted = torch.tensor([3, 5, 11])
    probs = engine.probs(signals, token_ids=wanted, progress=seen.append)
    full = torch.softmax(one_by_one(lm, signals), dim=-1)
    assert probs.shape == (7, 3)
    assert max_diff(probs, full[:, wanted]) <= 1e-6
    assert seen == sorted(seen) and seen[-1] == 7 and len(seen) == len(engine.last_stats.chunks)  # type: ignore[union-attr]
    assert max_diff(engine.probs(signals[::-1]), full.flip(0)) <= 1e-6


def test_bfloat16_model_gives_float32_outputs_close_to_float32() -> None:
    fp32 = lm_for("llama")
    bf16 = ContinuousLM(copy.deepcopy(fp32.model).to(torch.bfloat16))
    signals = sweep(5)
    got = Engine(bf16).logits(signals)
    assert got.dtype == torch.float32
    assert bf16.model.get_output_embeddings().weight.dtype == torch.bfloat16  # the float32 read-out is undone
    ref = Engine(fp32).logits(signals)
    assert float((got - ref).norm() / ref.norm()) < 0.05


def test_plan_without_prefix_keeps_order_and_budget() -> None:
    lm = lm_for("llama")
    signals = [Signal.from_ids(prompt(n, k)) for k, n in enumerate([5, 5, 5, 5, 3, 9, 2, 30, 2, 2])]
    reads = [[len(s) - 1] for s in signals]
    chunks = plan(signals, reads, 10, lm, prefix=False)
    assert [c.rows for c in chunks] == [(0, 1), (2, 3), (4,), (5,), (6,), (7,), (8, 9)]  # 30 tokens: alone
    assert all(c.prefix == 0 for c in chunks)


def test_plan_sorts_by_length_under_one_shared_prefix() -> None:
    """Many prompts after one template: the template runs once and rows of one length share a chunk."""
    lm = lm_for("llama")
    template = prompt(20, 7)
    tails = [prompt(n, 10 + k) for k, n in enumerate([2, 6, 2, 6, 2, 6])]
    signals = [Signal.from_ids(torch.cat([template, t])) for t in tails]
    reads = [[len(s) - 1] for s in signals]
    chunks = plan(signals, reads, 6, lm)
    assert [sorted(c.rows) for c in chunks] == [[0, 2, 4], [1], [3], [5]]
    assert {c.prefix for c in chunks} == {20}
    engine = Engine(lm, max_batch_tokens=6)
    got = engine.logits(signals)
    assert engine.last_stats is not None
    assert [c.prefix_computed for c in engine.last_stats.chunks] == [True, False, False, False]
    assert engine.last_stats.tokens_computed == 20 + 3 * 2 + 3 * 6
    assert max_diff(got, one_by_one(lm, signals)) <= 1e-5


def test_plan_keeps_input_order_where_each_sweep_shares_more() -> None:
    """Two sweeps of different prompts after a 2-token opening: each chunk keeps its own sweep's prefix."""
    lm = lm_for("llama")
    opening = prompt(2, 3)
    signals = []
    for seed in (4, 5):
        ids = torch.cat([opening, prompt(12, seed)])
        signals += [Signal.from_ids(ids).scale_tokens([12, 13], c) for c in (0.25, 0.5, 1.0)]
    reads = [[len(s) - 1] for s in signals]
    chunks = plan(signals, reads, 8, lm)
    assert [(c.rows, c.prefix) for c in chunks] == [((0, 1, 2), 12), ((3, 4, 5), 12)]
    assert max_diff(Engine(lm, max_batch_tokens=8).logits(signals), one_by_one(lm, signals)) <= 1e-5


def test_bad_input_is_refused() -> None:
    lm = lm_for("llama")
    engine = Engine(lm)
    with pytest.raises(SignalError, match="no signals"):
        engine.logits([])
    with pytest.raises(SignalError, match="item 1 is a list"):
        engine.logits([Signal.from_ids([1, 2]), [1, 2]])  # type: ignore[list-item]
    with pytest.raises(SignalError, match="wrap a single signal"):
        engine.logits(Signal.from_ids([1, 2]))  # type: ignore[arg-type]
    with pytest.raises(SignalError, match="token_ids must lie"):
        engine.probs([Signal.from_ids([1, 2])], token_ids=[0, 500])
    with pytest.raises(SignalError, match="max_batch_tokens"):
        Engine(lm, max_batch_tokens=0)


def test_lm_probs_go_through_the_engine_on_a_bfloat16_model() -> None:
    """One evaluation path: lm.probs and Engine(lm).probs give the same numbers in half precision too."""
    bf16 = ContinuousLM(copy.deepcopy(tiny_model("llama", "sdpa")).to(torch.bfloat16))
    signals = sweep(6)
    assert max_diff(bf16.probs(signals), Engine(bf16).probs(signals)) <= 1e-6
    assert max_diff(bf16.probs(signals[0]), Engine(bf16).probs(signals[:1])[0]) <= 1e-6


def test_engine_reads_any_positions_like_each_signal_alone() -> None:
    lm = lm_for("qwen2", "eager")
    signals = sweep(5)
    alone = [lm.logits(s, positions="all") for s in signals]
    engine = Engine(lm)
    every = engine.logits(signals, positions="all")
    assert all(max_diff(a, b) <= 1e-5 for a, b in zip(every, alone))
    picked = engine.logits(signals, positions=[-1, 9, 3])
    assert picked.shape == (5, 3, lm.model.config.vocab_size)
    assert max_diff(picked, torch.stack([a[[-1, 9, 3]] for a in alone])) <= 1e-5
    assert engine.last_stats is not None and engine.last_stats.prefix_lens == (3,)  # ends before the first read
    late = engine.logits(signals, positions=10)
    assert max_diff(late, torch.stack([a[10] for a in alone])) <= 1e-5
    assert engine.last_stats.prefix_lens == (EDIT[0],)
    with pytest.raises(SignalError, match="position 20 is outside a signal of 12 tokens"):
        engine.logits(signals, positions=20)


def test_a_hook_on_a_layer_turns_the_prefix_off() -> None:
    """A forward hook may read the whole sequence: with one in place every signal runs in full."""
    lm = lm_for("llama")
    seen: list[int] = []
    layer = lm.model.model.layers[1]
    handle = layer.register_forward_hook(lambda m, a, o: seen.append(a[0].shape[1]))
    try:
        engine = Engine(lm)
        engine.logits(sweep(4))
    finally:
        handle.remove()
    assert engine.last_stats is not None and engine.last_stats.prefix_lens == (0,)
    assert min(seen) >= BASE
    engine.logits(sweep(4))
    assert engine.last_stats.prefix_lens == (EDIT[0],)


def test_transformers_output_recorders_leave_the_prefix_on() -> None:
    """A stock forward with output_hidden_states leaves transformers' recorder hooks on the layers for good.

    They record only while transformers collects outputs (never in the engine): the prefix
    stays shared and the logits equal those of a model that never recorded.
    """
    lm = lm_for("llama")
    fresh = Engine(lm).logits(sweep(4))
    recorded = ContinuousLM(copy.deepcopy(lm.model))
    recorded.model(torch.tensor([[1, 2, 3]]), output_hidden_states=True, output_attentions=True)
    assert any(layer._forward_hooks for layer in recorded.model.model.layers)
    engine = Engine(recorded)
    got = engine.logits(sweep(4))
    assert engine.last_stats is not None and engine.last_stats.prefix_lens == (EDIT[0],)
    assert float((got - fresh).abs().max()) <= 1e-5


def computed_prefixes(engine: Engine) -> list[bool]:
    assert engine.last_stats is not None
    return [c.prefix_computed for c in engine.last_stats.chunks if c.prefix_len]


def test_a_kept_prefix_serves_the_next_call_with_the_numbers_of_a_fresh_engine() -> None:
    """keep_prefix: the second call on the same opening reuses the prefix and its logits are bitwise a fresh engine's."""
    lm = lm_for("llama")
    first, second = sweep(12)[:6], sweep(12)[6:]
    kept = Engine(lm, max_batch_tokens=20, keep_prefix=True)
    kept.logits(first)
    got = kept.logits(second)
    assert computed_prefixes(kept)[0] is False
    fresh = Engine(lm, max_batch_tokens=20)
    assert torch.equal(got, fresh.logits(second)) and computed_prefixes(fresh)[0] is True
    plain = Engine(lm, max_batch_tokens=20)  # the default keeps nothing between calls
    plain.logits(first)
    plain.logits(second)
    assert computed_prefixes(plain)[0] is True


@pytest.mark.parametrize("change", ["hook on a projection", "weight edited in place", "weight replaced", "settings"])
def test_a_kept_prefix_is_dropped_when_the_model_changes(change: str) -> None:
    lm = ContinuousLM(tiny_model.__wrapped__("llama"))  # its own copy: the test edits weights (the cached one is shared)
    signals = sweep(6)
    engine = Engine(lm, keep_prefix=True)
    engine.logits(signals)
    engine.logits(signals)
    assert computed_prefixes(engine) == [False]
    attention = lm.model.model.layers[0].self_attn
    handle = None
    if change == "hook on a projection":
        handle = attention.v_proj.register_forward_hook(lambda m, a, o: o * 2)
    elif change == "weight edited in place":
        with torch.no_grad():
            attention.v_proj.weight.mul_(2)
    elif change == "weight replaced":
        attention.v_proj.weight = torch.nn.Parameter(attention.v_proj.weight.detach() * 2)
    else:
        engine.float32_projections = False
    try:
        got = engine.logits(signals)
        assert computed_prefixes(engine) == [True]
        assert torch.equal(got, Engine(lm).logits(signals))
    finally:
        if handle is not None:
            handle.remove()


def test_a_kept_prefix_at_another_time_origin_is_recomputed() -> None:
    """The same opening read at a later time takes another origin: the kept keys do not serve it."""
    lm = lm_for("llama")
    assert lm.relative_positions
    engine = Engine(lm, keep_prefix=True)
    early = sweep(4)
    engine.logits(early)
    late = [Signal.from_ids(torch.cat([s.token_ids, prompt(20, 3)]), torch.cat([s.durations, torch.ones(20)])) for s in early]
    got = engine.logits(late)
    assert computed_prefixes(engine) == [True]
    assert torch.equal(got, Engine(lm).logits(late))
