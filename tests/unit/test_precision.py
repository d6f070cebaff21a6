"""float32_state: half-precision matmuls around a float32 state, on every family; restored on exit."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from contllm import ContinuousLM
from contllm.core.engine import Engine
from contllm.core.precision import IMPLEMENTATION, MATMUL_MODULES, float32_attention_forward, float32_state
from tests.unit.test_engine import sweep
from tests.unit.tiny import FAMILY_NAMES, backends, tiny_model

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

FAMILIES = [(f, impl) for f in FAMILY_NAMES for impl in backends(f)]


@functools.cache
def half_lm(family: str, impl: str, dtype: torch.dtype = torch.bfloat16) -> ContinuousLM:
    return ContinuousLM(copy.deepcopy(tiny_model(family, impl)).to(dtype))


def snapshot(model: nn.Module) -> dict[str, object]:
    """What float32_state may touch: parameter objects and dtypes, hooks, attention implementation."""
    return {
        "params": [(name, id(p), p.dtype) for name, p in model.named_parameters()],
        "hooks": sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()),
        "impl": model.config._attn_implementation,
    }


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("family,impl", FAMILIES)
def test_state_is_float32_between_half_precision_matmuls(family: str, impl: str) -> None:
    lm = half_lm(family, impl)
    seen: dict[str, set[torch.dtype]] = {"layer inputs": set(), "matmul inputs": set(), "matmul weights": set()}
    # Every matmul in bfloat16 here; the float32 query/key projections are checked in
    # tests/unit/test_precision_projections.py.
    with lm.patched(), float32_state(lm, float32_projections=False):
        assert lm.state_dtype == torch.float32 and lm.dtype == torch.bfloat16
        handles = []
        for module in lm.model.modules():
            if isinstance(module, MATMUL_MODULES):
                # Registered after float32_state's own hook: sees the input it passed on.
                handles.append(module.register_forward_pre_hook(lambda m, a: seen["matmul inputs"].add(a[0].dtype)))
                seen["matmul weights"].add(module.weight.dtype)
        layers = next(m for m in lm.model.modules() if isinstance(m, nn.ModuleList))
        for layer in layers:
            handles.append(layer.register_forward_pre_hook(lambda m, a, k: seen["layer inputs"].add(
                (a[0] if a else k["hidden_states"]).dtype), with_kwargs=True))
        try:
            logits = lm.logits(sweep(3), positions="last", batch_size=3)
        finally:
            for h in handles:
                h.remove()
    assert seen == {
        "layer inputs": {torch.float32},  # the residual stream
        "matmul inputs": {torch.bfloat16},
        "matmul weights": {torch.bfloat16},
    }
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("family,impl", FAMILIES)
def test_engine_in_float32_state_is_close_to_float32_and_restores_the_model(family: str, impl: str) -> None:
    fp32 = ContinuousLM(tiny_model(family, impl))
    lm = half_lm(family, impl)
    before = snapshot(lm.model)
    signals = sweep(9)
    engine = Engine(lm)
    got = engine.probs(signals)
    assert snapshot(lm.model) == before and lm.state_dtype == torch.bfloat16
    ref = Engine(fp32).probs(signals)
    # Inputs, weights and outputs of every matmul rounded to bfloat16: ~1e-2 on these
    # models (init 0.2); a residual stream or mask in bfloat16 is not needed to get there.
    assert max_diff(got, ref) <= 3e-2
    pure = Engine(lm, float32_state=False).probs(signals)
    assert max_diff(pure, got) > 0  # the option changes what runs


@pytest.mark.parametrize("family,impl", [("llama", "sdpa"), ("llama", "eager"), ("gemma3", "sdpa"), ("phi", "sdpa")])
def test_attention_is_the_models_own_on_float32_inputs(family: str, impl: str) -> None:
    """Grouped-query sdpa (no repeated heads) and every other path equal the stock function in float32."""
    lm = half_lm(family, impl)
    module = next(m for m in lm.model.modules() if type(m).__name__.endswith("Attention"))
    config = lm.model.config
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, 5, dim, generator=g).bfloat16()
    k = torch.randn(2, kv, 7, dim, generator=g).bfloat16()
    v = torch.randn(2, kv, 7, dim, generator=g).bfloat16()
    mask = torch.zeros(2, 1, 5, 7)
    mask[0, :, :, 5:] = torch.finfo(torch.float32).min
    mask[1, :, :, :2] = -0.7  # a log-duration bias
    stock = tiny_model(family, impl)
    stock_module = next(m for m in stock.modules() if type(m).__name__.endswith("Attention"))
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from contllm.core.attention import stock_eager

    reference_fn = stock_eager(stock_module) if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]
    ref, _ = reference_fn(stock_module, q.float(), k.float(), v.float(), mask, scaling=dim**-0.5, dropout=0.0)
    with float32_state(lm):
        assert config._attn_implementation == IMPLEMENTATION
        out, _ = float32_attention_forward(module, q, k, v, mask, scaling=dim**-0.5, dropout=0.0)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert max_diff(out, ref) <= 1e-6
    assert config._attn_implementation == impl


def test_float16_runs_the_same_way() -> None:
    fp32 = ContinuousLM(tiny_model("llama", "sdpa"))
    lm = half_lm("llama", "sdpa", torch.float16)
    signals = sweep(5)
    got = Engine(lm).probs(signals)
    ref = Engine(fp32).probs(signals)
    # float16 keeps 3 more bits than bfloat16: on every CPU, closer to float32 than the
    # same engine on the same model in bfloat16 (3e-3 against 1e-2 on AVX-512 and AVX2).
    assert max_diff(got, ref) <= 5e-3
    assert max_diff(got, ref) < max_diff(Engine(half_lm("llama", "sdpa")).probs(signals), ref)


def test_float32_model_is_left_alone() -> None:
    lm = ContinuousLM(tiny_model("llama", "sdpa"))
    before = snapshot(lm.model)
    with float32_state(lm):
        assert snapshot(lm.model) == before and lm.state_dtype == torch.float32


def test_nested_state_is_a_no_op_and_exit_restores_after_an_error() -> None:
    lm = half_lm("mistral", "sdpa")
    before = snapshot(lm.model)
    with pytest.raises(RuntimeError, match="boom"):
        with float32_state(lm):
            inside = snapshot(lm.model)
            with float32_state(lm):
                assert snapshot(lm.model) == inside
            assert inside != before
            raise RuntimeError("boom")
    assert snapshot(lm.model) == before and lm.state_dtype == torch.bfloat16


def test_shared_prefix_compares_embeddings_at_the_state_precision() -> None:
    """A nudge below bfloat16's resolution still ends the prefix: the float32 state feeds it."""
    from contllm import Signal
    from contllm.core.prefix import shared_prefix_len
    from tests.unit.tiny import prompt

    lm = half_lm("llama", "sdpa")
    embeds = lm.embed(Signal.from_ids(prompt(8, 3)))[0].float()
    nudged = embeds.clone()
    nudged[4] *= 1 + 2**-12  # bfloat16 keeps 8 significant bits: rounds back to the same values
    signals = [Signal.from_embeds(embeds), Signal.from_embeds(nudged)]
    assert shared_prefix_len(signals, lm) == 7  # rounded to the model's dtype, the nudge is gone
    with lm.patched(), float32_state(lm):
        assert shared_prefix_len(signals, lm) == 4
    engine = Engine(lm)
    got = engine.logits(signals)
    assert engine.last_stats is not None and engine.last_stats.prefix_lens == (4,)
    assert max_diff(got[0], got[1]) > 0  # a prefix of 7 shared from the first signal would make them equal
