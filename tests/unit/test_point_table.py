"""The hook-point table of a model is built once and reused, and built again when the model changes."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

from contllm import ContinuousLM
from contllm.internals import hookpoints as module
from contllm.internals.hookpoints import hook_names, point, points
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit


def _own(family: str) -> torch.nn.Module:
    """A model of this test's own (tiny_model's are shared by every test, and cached)."""
    return copy.deepcopy(tiny_model(family))


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the layer index of every decoder layer's points being built."""
    built: list[int] = []
    block = module._block

    def counted(family, net, i, layer, attention):  # type: ignore[no-untyped-def]
        built.append(i)
        return block(family, net, i, layer, attention)

    monkeypatch.setattr(module, "_block", counted)
    return built


def test_the_table_is_reused_while_the_model_stays_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = ContinuousLM(_own("llama"))
    built = _counting(monkeypatch)
    first = points(lm)
    layers = len(lm.model.model.layers)
    assert built == list(range(layers))
    for _ in range(3):
        again = points(lm)
        assert list(again) == list(first) and all(again[n] is first[n] for n in first if n.startswith("blocks."))
    point(lm, "blocks.0.hook_resid_post")
    hook_names(lm)
    assert points(lm.model)["ln_final.hook_scale"] is first["ln_final.hook_scale"]  # the model itself, or its lm
    assert built == list(range(layers))  # no layer's points were built again


def test_the_table_is_built_again_when_a_module_or_the_config_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = ContinuousLM(_own("llama"))
    built = _counting(monkeypatch)
    before = points(lm)
    layers = len(lm.model.model.layers)
    layer = lm.model.model.layers[0]
    layer.mlp = copy.deepcopy(layer.mlp)  # a module replaced
    after = points(lm)
    assert after["blocks.0.mlp.hook_post"].module is layer.mlp.down_proj
    assert after["blocks.0.mlp.hook_post"] is not before["blocks.0.mlp.hook_post"]
    assert built == [*range(layers), *range(layers)]
    # A config value the table reads (the head count sets hook_z's shape).
    heads = lm.model.config.num_attention_heads
    lm.model.config.num_attention_heads = heads // 2
    try:
        assert points(lm)["blocks.0.attn.hook_z"].shape[0] == heads // 2
    finally:
        lm.model.config.num_attention_heads = heads
    assert points(lm)["blocks.0.attn.hook_z"].shape[0] == heads
    # Another model has its own table.
    other = ContinuousLM(_own("llama"))
    assert points(other)["blocks.0.hook_resid_post"].module is other.model.model.layers[0]


def test_the_table_does_not_keep_its_model_alive() -> None:
    model = _own("llama")
    points(model)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


def test_the_table_follows_a_position_table_swapped_for_float_times() -> None:
    from contllm.core.attention import continuous_positions
    from contllm.core.families import family_of

    model = _own("gpt2")
    want = points(model)
    with continuous_positions(model, family_of(model)), torch.no_grad():
        inside = points(model)
    assert list(inside) == list(want)
    assert points(model)["hook_pos_embed"].module is want["hook_pos_embed"].module
