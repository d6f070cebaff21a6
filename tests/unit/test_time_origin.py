"""The engine's moved time origin: exact where positions are relative, finer float32 positions, no effect elsewhere."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers as tf

from contllm import ContinuousLM, Signal, SignalError
from contllm.core.engine import ORIGIN_STEP, Engine, time_origin
from contllm.core.families import family_of, relative_positions
from tests.unit.tiny import prompt, random_durations, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

LATE = 200.0  # a start where float32 positions have an ulp of 1.5e-5 (the tiny models hold 256 positions)


def flat_sweep(start: float, n: int = 12, steps: int = 41) -> list[Signal]:
    """One prompt at unit durations, every time moved by s in [0, 1]: the same logits in exact arithmetic."""
    ids = prompt(n, 1)
    return [
        Signal(durations=torch.ones(n, dtype=torch.float64), token_ids=ids, start=start + s)
        for s in torch.linspace(0, 1, steps).tolist()
    ]


def spread(logits: torch.Tensor) -> float:
    """The largest distance of any row from the rows' mean: the sweep's noise floor where it should be flat."""
    return float((logits - logits.mean(0)).abs().max())


@pytest.mark.parametrize("family,impl", [("llama", "sdpa"), ("qwen2", "eager"), ("mistral", "sdpa")])
def test_the_noise_floor_of_a_flat_sweep_falls(family: str, impl: str) -> None:
    # float64 weights: what is left is the rounding of the float32 positions themselves.
    lm = ContinuousLM(tiny_model64(family, impl))
    signals = flat_sweep(LATE)
    stock = spread(Engine(lm, move_origin=False).logits(signals))
    moved = spread(Engine(lm).logits(signals))
    # Positions near 200 are rounded by up to 7.6e-6: the flat sweep wobbles by ~2e-5 to 4e-5
    # at origin 0; near the origin the same sweep is flat to ~2e-6.
    assert stock > 8e-6
    assert moved <= stock / 5


@pytest.mark.parametrize("family,impl", [("llama", "sdpa"), ("gemma3", "eager"), ("phi", "eager"), ("qwen2", "eager")])
def test_a_late_prompt_at_unit_durations_equals_the_stock_model_at_its_first_positions(family: str, impl: str) -> None:
    # Identity and shift together: times LATE .. LATE + 19 read as positions 0 .. 19 do. The
    # stock model fed positions near 200 misses that by float32 rounding (2e-5 on llama and
    # qwen2); with the origin moved next to the read, integer times stay integers and the
    # identity keeps its 1e-5.
    model = tiny_model64(family, impl)
    lm = ContinuousLM(model)
    ids = prompt(20, 3)
    signal = Signal(durations=torch.ones(20, dtype=torch.float64), token_ids=ids, start=LATE - 1)
    assert float(signal.times[0]) == LATE
    with torch.no_grad():
        stock = model(input_ids=ids[None], position_ids=torch.arange(20)[None]).logits[0, -1].float()
    assert time_origin([signal], [[19]]) == ORIGIN_STEP * ((LATE + 19) // ORIGIN_STEP) > 0
    assert float((Engine(lm).logits([signal])[0] - stock).abs().max()) <= 1e-5


def late_sweep() -> list[Signal]:
    """A duration sweep whose read times straddle a multiple of 16: chunks want different origins."""
    ids = torch.cat([prompt(14, 4), prompt(4, 5)])
    base = random_durations(18, 6)
    out = []
    for k, c in enumerate(torch.linspace(0.1, 3.0, 12).tolist()):
        d = base[: 14 + k % 5].clone()
        d[10:13] *= c
        out.append(Signal.from_ids(ids[: len(d)], d, start=LATE - 24))
    return out


@functools.lru_cache(maxsize=1)
def late_alone() -> torch.Tensor:
    lm = ContinuousLM(tiny_model64("llama", "sdpa"))
    return torch.stack([Engine(lm).logits([s])[0] for s in late_sweep()])


@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("max_batch_tokens", [24, None])
def test_chunks_at_different_origins_equal_each_signal_alone(prefix_cache: bool, max_batch_tokens: int | None) -> None:
    lm = ContinuousLM(tiny_model64("llama", "sdpa"))
    signals = late_sweep()
    # Read times 189.7 .. 200.2: with a budget of 24 the four chunks share one prefix and
    # two of them would pick origin 176, two 192.
    reads = [float(s.times[-1]) for s in signals]
    assert len({ORIGIN_STEP * (t // ORIGIN_STEP) for t in reads}) > 1
    engine = Engine(lm, max_batch_tokens=max_batch_tokens, prefix_cache=prefix_cache)
    got = engine.logits(signals)
    alone = late_alone()
    # A chunk that reuses a prefix computed at another origin must take that origin: with
    # its own, queries and prefix keys would sit 16 steps apart and logits move by ~1.
    assert float((got - alone).abs().max()) <= 1e-5
    stock = Engine(lm, move_origin=False, max_batch_tokens=max_batch_tokens, prefix_cache=prefix_cache).logits(signals)
    assert float((got - stock).abs().max()) <= 1e-4  # the same model; positions rounded differently


def test_origin_is_a_multiple_of_the_step_below_the_earliest_read() -> None:
    a = Signal.from_ids(prompt(5, 1), [1.0] * 5, start=40.3)  # times 41.3 .. 45.3
    b = Signal.from_ids(prompt(3, 1), [0.5] * 3, start=30.0)  # times 30.5 .. 31.5
    assert time_origin([a], [[4]]) == 32.0
    assert time_origin([a, b], [[4], [2]]) == 16.0
    assert time_origin([a], [[0, 4]]) == 32.0
    assert time_origin([b], [[0]]) == 16.0


def test_absolute_and_frequency_choosing_positions_keep_the_origin_at_zero() -> None:
    assert relative_positions(family_of(tiny_model("llama").config), tiny_model("llama").config)
    gemma = tiny_model("gemma3").config
    assert relative_positions(family_of(gemma), gemma)  # one static rope kind per layer type
    gpt2 = tiny_model("gpt2").config
    assert not relative_positions(family_of(gpt2), gpt2)  # a learned table reads absolute positions
    dynamic = tf.LlamaConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert not relative_positions(family_of(dynamic), dynamic)
    longrope = tf.Phi3Config(
        max_position_embeddings=256,
        original_max_position_embeddings=64,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
    )
    assert not relative_positions(family_of(longrope), longrope)
    linear = tf.LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert relative_positions(family_of(linear), linear)


def test_a_model_with_absolute_positions_refuses_a_moved_origin() -> None:
    lm = ContinuousLM(tiny_model("gpt2"))
    assert not lm.relative_positions
    signals = flat_sweep(40.0, steps=3)  # within the tiny GPT-2's 64 positions
    # The engine leaves the origin at 0 on it: moving or not gives the same logits exactly.
    assert torch.equal(Engine(lm).logits(signals), Engine(lm, move_origin=False).logits(signals))
    from contllm.core.signal import pad_signals

    with lm.patched(), pytest.raises(SignalError, match="absolute positions"):
        lm.forward_batch(pad_signals(signals), origin=16.0)
