"""Bring your own model: a transformers model and tokenizer already in hand, wrapped in one call."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as tf

import contllm
from contllm import ContinuousLM, Signal, UnsupportedModelError
from tests.unit.tiny import prompt, save_directory, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama and a word-level tokenizer saved as a model directory."""
    return save_directory(tmp_path_factory.mktemp("llama"), tiny_llama(), tiny_tokenizer())


@pytest.mark.parametrize("how", ["wrap", "constructor"])
def test_a_loaded_model_wrapped_equals_the_stock_model(saved_llama: Path, how: str) -> None:
    model = tf.AutoModelForCausalLM.from_pretrained(saved_llama)
    tokenizer = tf.AutoTokenizer.from_pretrained(saved_llama)
    lm = contllm.wrap(model, tokenizer) if how == "wrap" else ContinuousLM(model.eval(), tokenizer)
    assert not model.training and lm.family.name == "llama"
    ids = prompt(9)
    with torch.inference_mode():
        stock = model(ids[None]).logits[0]
    got = lm.logits(Signal.from_ids(ids), positions="all")
    assert float((got - stock).abs().max()) <= 1e-5
    text = lm.signal("the cat sat on a mat")
    assert len(text) == 6 and lm.probs(text).shape == (model.config.vocab_size,)
    assert len(lm.generate(text, max_new_tokens=3, stop_at_eos=False).token_ids) == 3


def test_wrap_names_what_is_wrong() -> None:
    with pytest.raises(UnsupportedModelError, match="needs a transformers model"):
        contllm.wrap("llama")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedModelError, match="'bert' is not supported"):
        contllm.wrap(tf.BertForMaskedLM(tf.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=32)))
