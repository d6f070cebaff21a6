"""The shared-prefix attention equals attention over the prefix repeated for every row, on every family."""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.core.engine import Engine
from contllm.core.prefix import IMPLEMENTATION, SharedKeys, shared_prefix_attention
from tests.unit.tiny import FAMILY_NAMES, WINDOW, backends, prompt, random_durations, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

PREFIX = 7
assert PREFIX > WINDOW  # windowed families hide part of the prefix from the rows


def reference(query, prefix_keys, prefix_values, key, value, mask, scale, softcap):
    """Plain attention over the prefix repeated along the batch, key heads repeated per query group."""
    batch, heads = query.shape[:2]
    group = heads // key.shape[1]
    keys = torch.cat([prefix_keys.expand(batch, -1, -1, -1), key], dim=2).repeat_interleave(group, dim=1)
    values = torch.cat([prefix_values.expand(batch, -1, -1, -1), value], dim=2).repeat_interleave(group, dim=1)
    scores = query @ keys.transpose(-1, -2) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    weights = torch.softmax(scores + mask, dim=-1)
    return (weights @ values).transpose(1, 2)


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_split_softmax_equals_one_softmax(kv_heads: int, softcap: float | None) -> None:
    g = torch.Generator().manual_seed(kv_heads)
    batch, heads, width, length, dim = 3, 4, 5, 6, 8
    query = torch.randn(batch, heads, width, dim, generator=g, dtype=torch.float64)
    key, value = (torch.randn(batch, kv_heads, width, dim, generator=g, dtype=torch.float64) for _ in range(2))
    prefix_keys, prefix_values = (torch.randn(1, kv_heads, length, dim, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.randn(batch, 1, width, length + width, generator=g, dtype=torch.float64)
    hidden = torch.rand(batch, 1, width, length + width, generator=g) < 0.3
    hidden[1, :, 2] = True  # a row that sees nothing (padding) stays finite
    mask = mask.masked_fill(hidden, torch.finfo(torch.float64).min)
    module = torch.nn.Module()
    shared = SharedKeys({module: (prefix_keys, prefix_values)}, torch.zeros(1, length), torch.ones(1, length))
    got, weights = shared_prefix_attention(module, query, key, value, mask, contllm_prefix=shared, scaling=0.3,
                                           softcap=softcap)
    assert weights is None and got.shape == (batch, width, heads, dim) and got.dtype == torch.float64
    want = reference(query, prefix_keys, prefix_values, key, value, mask, 0.3, softcap)
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max()) < 1e-12


def sweep() -> list[Signal]:
    """Eight signals after a shared prefix of PREFIX tokens, edited after it, of three lengths."""
    ids = prompt(PREFIX + 6, 3)
    durations = random_durations(PREFIX + 6, 4)
    out = []
    for k, c in enumerate((0.1, 0.4, 0.7, 1.0, 1.3, 1.6, 2.0, 3.0)):
        length = PREFIX + 3 + k % 3
        d = durations[:length].clone()
        d[PREFIX : PREFIX + 2] *= c
        out.append(Signal.from_ids(ids[:length], d))
    return out


@pytest.mark.parametrize(
    "family,impl", [(family, impl) for family in FAMILY_NAMES for impl in backends(family)]
)
def test_engine_with_a_shared_prefix_equals_each_signal_alone(family: str, impl: str) -> None:
    # float64: only the shared prefix's identity is measured, not one CPU's float32 summation order.
    lm = ContinuousLM(tiny_model64(family, impl))
    signals = sweep()
    engine = Engine(lm)
    got = engine.logits(signals)
    stats = engine.last_stats
    assert stats is not None and set(stats.prefix_lens) == {PREFIX}
    alone = torch.stack([lm.logits(s) for s in signals])
    assert float((got - alone).abs().max()) <= 1e-5
    assert lm.model.config._attn_implementation == impl  # switched back after every forward


def test_a_hooked_model_runs_without_the_prefix() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    layer = lm.model.model.layers[0]
    seen: list[int] = []
    handle = layer.register_forward_hook(lambda module, args, output: seen.append(args[0].shape[1]))
    try:
        engine = Engine(lm)
        engine.logits(sweep())
    finally:
        handle.remove()
    assert engine.last_stats is not None and set(engine.last_stats.prefix_lens) == {0}
    assert min(seen) >= PREFIX + 3  # the hook saw whole signals
    assert IMPLEMENTATION != lm.model.config._attn_implementation


def test_another_attention_function_runs_without_the_prefix() -> None:
    """Under contllm.pde's row dynamics every row must run the patched attention: no shared prefix."""
    from contllm.pde.attention import pde_attention
    from contllm.pde.dynamics import Dynamics

    lm = ContinuousLM(tiny_model("llama"))
    signals = sweep()
    with pde_attention(lm, Dynamics("diffusion", 3.0)):
        engine = Engine(lm)
        got = engine.logits(signals)
        alone = torch.stack([lm.logits(s) for s in signals])
    assert engine.last_stats is not None and set(engine.last_stats.prefix_lens) == {0}
    assert float((got - alone).abs().max()) <= 1e-5
    assert float((got - Engine(lm).logits(signals)).abs().max()) > 1e-3  # the dynamics did change the logits
