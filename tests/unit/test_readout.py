"""Read-outs: the decoded vocabulary is cached per tokenizer object, held weakly."""

from __future__ import annotations

import gc

import pytest
import transformers as tf
from tokenizers import Tokenizer, models

from contllm.core import readout
from tests.unit.tiny import word_level_tokenizer

pytestmark = pytest.mark.unit


def word_tokenizer(words: list[str]) -> tf.PreTrainedTokenizerFast:
    return word_level_tokenizer(words, unk=words[0])


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


def scanned(tokenizer: tf.PreTrainedTokenizerFast, spellings: dict[str, list[str]]) -> tuple[tuple[int, ...], ...]:
    """Token sets by a scan of the whole vocabulary, the way they were built before the index."""
    wanted = {form: label for label, words in spellings.items() for w in words for form in (w, " " + w)}
    found: dict[str, list[int]] = {label: [] for label in spellings}
    for i, text in enumerate(readout.decoded_vocabulary(tokenizer)):
        if text in wanted:
            found[wanted[text]].append(i)
    return tuple(tuple(ids) for ids in found.values())


def test_token_sets_from_the_index_equal_a_scan_in_vocabulary_order() -> None:
    """Several tokens decode to one text (a vocabulary with duplicates), spellings with and without a space."""
    words = ["<unk>", "True", "1", "true", "0", " 1", "False", "x", "true", "false", "0", " true"]
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE({f"t{i}": i for i in range(len(words))}, [])), unk_token="t0"
    )
    readout._DECODED_VOCAB[tokenizer] = tuple(words)  # the decoded texts, duplicates included
    spellings = {**readout.BINARY_SPELLINGS, **readout.TRUTH_WORD_SPELLINGS}
    sets = readout.TokenSets.build(tokenizer, spellings)
    assert sets.token_ids == scanned(tokenizer, spellings) == ((4, 10), (2, 5), (6, 9), (1, 3, 8, 11))
    assert readout.vocabulary_index(tokenizer) is readout.vocabulary_index(tokenizer)
