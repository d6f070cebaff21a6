"""Signals: construction, edits by character span, padding, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from contllm import Signal, SignalError, pad_signals
from tests.unit.tiny import word_level_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer built in the test: one token per word, with offsets."""
    words = ["<unk>", "how", "many", "apple", "apples", "pear", "are", "there", "?", ":", "the", "red"]
    return word_level_tokenizer(words)


def test_times_follow_durations_from_start() -> None:
    s = Signal.from_ids([4, 5, 6])
    assert s.times.tolist() == [0.0, 1.0, 2.0]
    s2 = s.with_durations([0.5, 2.0, 0.0])
    assert s2.times.tolist() == [-0.5, 1.5, 1.5]
    assert s2.end == 1.5


def test_from_text_offsets_and_span_edits(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "apple apple pear apple how many apple are there ?"
    s = Signal.from_text(tokenizer, text)
    spans = s.find("apple")
    assert spans == [(0, 5), (6, 11), (17, 22), (32, 37)]
    assert s.find("apple", whole_word=False) == spans
    idx = s.token_indices(spans)
    assert idx == [0, 1, 3, 6]
    shrunk = s.scale(spans, 0.25)
    assert shrunk.durations[idx].tolist() == [0.25] * 4
    assert shrunk.durations[[2, 4, 5]].tolist() == [1.0] * 3
    deleted = s.delete((12, 16))
    assert deleted.durations[2] == 0.0
    # The original is untouched: signals are immutable values.
    assert s.durations.tolist() == [1.0] * len(s)


def test_repeat_and_split(tokenizer: PreTrainedTokenizerFast) -> None:
    s = Signal.from_text(tokenizer, "the red apple are there")
    r = s.repeat((8, 13), 3)
    assert r.token_ids.tolist() == [10, 11, 3, 3, 3, 6, 7]
    assert r.times.tolist() == [0, 1, 2, 3, 4, 5, 6]
    # Later edits by span reach every copy.
    assert r.token_indices((8, 13)) == [2, 3, 4]
    sp = s.with_durations([1, 1, 0.6, 1, 1]).split_token(2, 3)
    assert sp.token_ids.tolist() == [10, 11, 3, 3, 3, 6, 7]
    assert torch.allclose(sp.durations[2:5], torch.full((3,), 0.2, dtype=torch.float64))
    assert sp.times[2:5].tolist() == [pytest.approx(1.6)] * 3


def test_padding_is_zero_duration_on_either_side() -> None:
    a = Signal.from_ids([1, 2], [0.5, 1.0])
    b = Signal.from_ids([3, 4, 5, 6])
    left = pad_signals([a, b])
    assert left.pad_left.tolist() == [2, 0]
    assert left.durations[0].tolist() == [0, 0, 0.5, 1.0]
    assert left.times[0, 2:].tolist() == [-0.5, 0.5]
    right = pad_signals([a, b], side="right")
    assert right.durations[0].tolist() == [0.5, 1.0, 0, 0]
    assert right.times[0].tolist() == [-0.5, 0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    "durations,match",
    [
        ([1.0, -0.5, 1.0], "negative values at token indices \\[1\\]"),
        ([1.0, math.nan, 1.0], "non-finite values at token indices \\[1\\]"),
        ([1.0, math.inf, 1.0], "non-finite"),
        ([1.0, 1.0], "3 token ids but 2 durations"),
    ],
)
def test_bad_durations_are_named(durations: list[float], match: str) -> None:
    with pytest.raises(SignalError, match=match):
        Signal.from_ids([1, 2, 3], durations)


def test_bad_signals_are_named(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(SignalError, match="empty"):
        Signal.from_ids([])
    with pytest.raises(SignalError, match="non-empty string"):
        Signal.from_text(tokenizer, "")
    with pytest.raises(SignalError, match="3 times but 2 durations"):
        Signal.from_ids([1, 2], times=[0.0, 1.0, 2.0])
    s = Signal.from_text(tokenizer, "how many apple are there ?")
    with pytest.raises(SignalError, match="not a non-empty span inside the text of length 26"):
        s.scale((20, 40), 0.5)
    with pytest.raises(SignalError, match="not a non-empty span"):
        s.scale((5, 5), 0.5)
    with pytest.raises(SignalError, match="covers no token"):
        s.scale((3, 4), 0.5)  # the space between "how" and "many"
    with pytest.raises(SignalError, match="'banana' not found in the text; its words are: apple, are, how"):
        s.find("banana")
    with pytest.raises(SignalError, match="factor must be finite and >= 0"):
        s.scale((0, 3), -1.0)
    with pytest.raises(SignalError, match="factor must be finite"):
        s.scale((0, 3), math.nan)
    with pytest.raises(SignalError, match="not built from text"):
        Signal.from_ids([1, 2]).scale((0, 1), 0.5)
    with pytest.raises(SignalError, match="outside a signal of 2 tokens"):
        Signal.from_ids([1, 2]).scale_tokens([5], 0.5)
    with pytest.raises(SignalError, match="repeat count"):
        s.repeat((0, 3), 0)


def test_errors_are_the_toolkits_own() -> None:
    from contllm import ContllmError

    with pytest.raises(ContllmError):
        Signal.from_ids([1], [-1.0])


def test_repr_is_a_table_of_tokens_starts_durations_and_times(tokenizer: PreTrainedTokenizerFast) -> None:
    s = Signal.from_text(tokenizer, "how many red apples")
    half = s.scale(s.find("red"), 0.5)
    lines = repr(half).splitlines()
    assert lines[0] == "Signal(4 tokens from text, times 0 to 2.5)"
    assert lines[1].split() == ["#", "token", "start", "duration", "time"]
    assert lines[3].split() == ["1", "'many'", "0", "1", "1"]
    assert lines[4].split() == ["2", "'red'", "1", "0.5", "1.5"]
    assert lines[5].split() == ["3", "'apples'", "1.5", "1", "2.5"]
    assert half.pieces() == ["how", "many", "red", "apples"]
    assert repr(Signal.from_ids([7, 8])).splitlines()[2].split() == ["0", "#7", "-1", "1", "0"]
    assert repr(Signal.from_embeds(torch.zeros(2, 3))).splitlines()[3].split()[1] == "[embed]"
    long = repr(Signal.from_ids(list(range(100)))).splitlines()
    assert len(long) == 2 + 48 and long[2 + 24].split() == ["..."] and long[-1].split()[0] == "99"
    assert long[2 + 23].split()[0] == "23" and long[2 + 25].split()[0] == "77"
