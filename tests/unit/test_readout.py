"""Read-outs: the decoded vocabulary is cached per tokenizer object, held weakly."""

from __future__ import annotations

import gc

import pytest
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers

from contllm import readout

pytestmark = pytest.mark.unit


def word_tokenizer(words: list[str]) -> tf.PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0])


def test_vocabulary_is_cached_per_object_and_dropped_with_it() -> None:
    gc.collect()  # tokenizers that earlier tests left for the collector go now, not in the count below
    first = word_tokenizer(["<unk>", "1", "2"])
    vocabulary = readout.decoded_vocabulary(first)
    assert vocabulary == ("<unk>", "1", "2")
    assert readout.decoded_vocabulary(first) is vocabulary  # cached
    assert first in readout._DECODED_VOCAB
    before = len(readout._DECODED_VOCAB)
    del first
    gc.collect()
    assert len(readout._DECODED_VOCAB) == before - 1  # the entry went with its tokenizer


def test_a_new_tokenizer_never_gets_a_freed_ones_vocabulary() -> None:
    """Under an id() key a new object at a recycled address would read the old vocabulary."""
    for k in range(5):
        words = ["<unk>", "true", "false", str(k)]
        tokenizer = word_tokenizer(words)
        assert readout.decoded_vocabulary(tokenizer) == tuple(words)
        assert readout.TokenSets.build(tokenizer, {"k": [str(k)]}).token_ids == ((3,),)
        del tokenizer
        gc.collect()
