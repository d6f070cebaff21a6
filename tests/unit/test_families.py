"""The family table: every family has a tiny test model, and its paths find the right modules."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from torch import nn

from contllm import ContinuousLM, UnsupportedModelError
from contllm.core.attention import attention_modules as reexported_attention_modules
from contllm.core.families import FAMILIES, attention_modules, decoder_layers, final_norm, head_counts
from tests.unit.tiny import CONFIGS, FAMILY_NAMES, prompt, tiny_model

pytestmark = pytest.mark.unit


def test_every_family_has_a_tiny_config_of_its_model_type() -> None:
    missing = [f.name for f in FAMILIES if f.name not in CONFIGS]
    assert not missing, f"families without a tiny config in tests/unit/tiny.py: {missing}"
    for family in FAMILIES:
        assert CONFIGS[family.name]().model_type in family.model_types


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_decoder_layers_run_once_each_in_order(family: str) -> None:
    model = tiny_model(family)
    layers = decoder_layers(model)
    assert isinstance(layers, nn.ModuleList) and len(layers) == model.config.num_hidden_layers
    assert decoder_layers(ContinuousLM(model)) is layers
    calls: list[int] = []
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i)) for i, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            model(prompt(5)[None])
    finally:
        for h in handles:
            h.remove()
    assert calls == list(range(len(layers)))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_final_norm_is_applied_just_before_the_head(family: str) -> None:
    model = tiny_model(family)
    norm = final_norm(model)
    assert final_norm(ContinuousLM(model)) is norm
    seen: dict[str, torch.Tensor] = {}
    handles = [
        norm.register_forward_hook(lambda m, a, o: seen.__setitem__("norm", o)),
        model.get_output_embeddings().register_forward_pre_hook(lambda m, a: seen.__setitem__("head", a[0])),
    ]
    try:
        with torch.inference_mode():
            model(prompt(5)[None])
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(seen["norm"], seen["head"])


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_attention_modules_one_per_layer_inside_it(family: str) -> None:
    model = tiny_model(family)
    modules = attention_modules(model)
    layers = decoder_layers(model)
    assert len(modules) == len(layers)
    for module, layer in zip(modules, layers):
        assert type(module).__name__.endswith("Attention")
        assert any(m is module for m in layer.modules())
    assert [id(m) for m in attention_modules(ContinuousLM(model))] == [id(m) for m in modules]
    assert reexported_attention_modules is attention_modules  # contllm.pde imports it from contllm.core.attention


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_head_counts_match_the_attention(family: str) -> None:
    model = tiny_model(family)
    heads, kv_heads = head_counts(model.config)
    assert head_counts(model) == head_counts(ContinuousLM(model)) == (heads, kv_heads)
    assert heads == 4
    module = attention_modules(model)[0]
    groups = getattr(module, "num_key_value_groups", 1)
    assert heads // kv_heads == groups


def test_missing_path_is_named() -> None:
    model = copy.deepcopy(tiny_model("llama"))
    del model.model.layers
    with pytest.raises(UnsupportedModelError, match=r"llama: no decoder layers at LlamaForCausalLM\.model\.layers"):
        decoder_layers(model)
    with pytest.raises(UnsupportedModelError, match="expected a ContinuousLM or a transformers model"):
        final_norm("not a model")
    with pytest.raises(UnsupportedModelError, match="'bert' is not supported"):
        head_counts(tf.BertConfig())


def test_a_bare_base_model_is_accepted() -> None:
    model = tiny_model("gpt2")
    assert decoder_layers(model.transformer) is model.transformer.h
    assert final_norm(model.transformer) is model.transformer.ln_f


def test_sizes_read_the_text_config_with_its_defaults() -> None:
    from types import SimpleNamespace

    from transformers import GPT2Config, LlamaConfig

    from contllm.core.families import sizes

    llama = LlamaConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=3,
        intermediate_size=96,
        vocab_size=300,
        head_dim=16,
    )
    got = sizes(SimpleNamespace(model=SimpleNamespace(config=llama)))
    assert (got.hidden, got.heads, got.kv_heads, got.layers, got.head_dim, got.intermediate, got.vocab) == (
        64,
        8,
        2,
        3,
        16,
        96,
        300,
    )
    gpt2 = GPT2Config(n_embd=48, n_head=4, n_layer=2, vocab_size=100)  # no kv heads, head width or MLP width given
    got = sizes(SimpleNamespace(model=SimpleNamespace(config=gpt2)))
    assert (got.kv_heads, got.head_dim, got.intermediate) == (4, 12, 4 * 48)
