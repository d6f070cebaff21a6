"""The Python API around a loaded model: families, errors, positions."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from contllm import ContinuousLM, Signal, SignalError, UnsupportedModelError, family_of
from tests.unit.tiny import prompt, tiny_model

pytestmark = pytest.mark.unit


def test_unknown_family_names_the_supported_ones() -> None:
    config = tf.BertConfig()
    with pytest.raises(UnsupportedModelError, match="'bert' is not supported; supported model types: gemma, gemma2"):
        family_of(config)


def test_attention_implementation_without_a_float_mask_is_refused() -> None:
    model = tiny_model("llama", "eager")
    impl = model.config._attn_implementation
    try:
        model.config._attn_implementation = "flash_attention_2"
        with pytest.raises(UnsupportedModelError, match="flash_attention_2"):
            ContinuousLM(model)
    finally:
        model.config._attn_implementation = impl


def test_positions_arguments() -> None:
    lm = ContinuousLM(tiny_model("llama", "sdpa"))
    s = Signal.from_ids(prompt(6))
    all_logits = lm.logits(s, positions="all")
    assert all_logits.shape == (6, 97)
    assert torch.allclose(lm.logits(s, positions=2), all_logits[2], atol=1e-6)
    # A batch of two is the batching invariant (DESIGN.md: 1e-5), not a bitwise identity.
    assert torch.allclose(lm.logits([s, s], positions=[-1, 0]), all_logits[[5, 0]].expand(2, 2, 97), atol=1e-5)
    p = lm.probs(s)
    assert p.shape == (97,) and abs(float(p.sum()) - 1) < 1e-5
    with pytest.raises(SignalError, match="position 9 is outside a signal of 6 tokens"):
        lm.logits(s, positions=9)
    with pytest.raises(SignalError, match="no signals"):
        lm.logits([])
    with pytest.raises(SignalError, match="batch_size"):
        lm.logits(s, batch_size=0)


def test_chunking_does_not_change_results() -> None:
    lm = ContinuousLM(tiny_model("qwen2", "sdpa"))
    signals = [Signal.from_ids(prompt(4 + i, i), torch.linspace(0.3, 1.5, 4 + i)) for i in range(7)]
    whole = lm.logits(signals, batch_size=7)
    chunked = lm.logits(signals, batch_size=2)
    assert float((whole - chunked).abs().max()) <= 1e-5


def test_signal_embeddings_given_directly_equal_ids() -> None:
    lm = ContinuousLM(tiny_model("gemma", "eager"))
    ids = prompt(7)
    (embeds,) = lm.embed([Signal.from_ids(ids)])
    by_ids = lm.logits(Signal.from_ids(ids, torch.linspace(0.5, 1.5, 7)))
    by_embeds = lm.logits(Signal.from_embeds(embeds, torch.linspace(0.5, 1.5, 7)))
    mixed = lm.logits([Signal.from_embeds(embeds), Signal.from_ids(ids)])
    assert float((by_ids - by_embeds).abs().max()) <= 1e-6
    assert float((mixed[0] - mixed[1]).abs().max()) <= 1e-6
