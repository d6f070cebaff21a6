"""Read-outs: exact token sets and the distribution over them.

A label such as "3" or "true" is read as the total probability of the tokens that decode
to exactly one of its spellings, with or without a leading space marker. Substrings never
count: "no" is not "not", "1" is not "10". The paper's protocol reads the paper's broader
sets instead (:func:`containing`, :func:`paper_digits`), every token that contains a piece.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from contllm.errors import ExperimentError

# Keyed by the tokenizer object itself, held weakly: an id() would be recycled by a new
# tokenizer once the old one is freed, and would hand it the old vocabulary.
_DECODED_VOCAB: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()


def decoded_vocabulary(tokenizer: Any) -> tuple[str, ...]:
    """Each token id decoded on its own (cached per tokenizer object while it lives)."""
    try:
        return _DECODED_VOCAB[tokenizer]
    except KeyError:
        pass
    except TypeError:  # a tokenizer that takes no weak reference (or no hash): decode, do not cache
        return _decode_each(tokenizer)
    vocabulary = _decode_each(tokenizer)
    _DECODED_VOCAB[tokenizer] = vocabulary
    return vocabulary


#: {decoded text: token ids that decode to it, ascending} per tokenizer, held weakly like the vocabulary.
_VOCAB_INDEX: weakref.WeakKeyDictionary[Any, dict[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()


def vocabulary_index(tokenizer: Any) -> dict[str, tuple[int, ...]]:
    """Each decoded text of :func:`decoded_vocabulary` and the ids that decode to it, ascending (cached likewise).

    An experiment builds its token sets once per item; looking the spellings up here
    instead of scanning the vocabulary (151,936 tokens on the Qwen2.5 models) takes that
    off every item.
    """
    try:
        return _VOCAB_INDEX[tokenizer]
    except KeyError:
        pass
    except TypeError:
        return _index(decoded_vocabulary(tokenizer))
    index = _index(decoded_vocabulary(tokenizer))
    _VOCAB_INDEX[tokenizer] = index
    return index


def _index(vocabulary: Sequence[str]) -> dict[str, tuple[int, ...]]:
    found: dict[str, list[int]] = {}
    for i, text in enumerate(vocabulary):
        found.setdefault(text, []).append(i)
    return {text: tuple(ids) for text, ids in found.items()}


def _decode_each(tokenizer: Any) -> tuple[str, ...]:
    return tuple(tokenizer.batch_decode([[i] for i in range(len(tokenizer))], clean_up_tokenization_spaces=False))


@dataclass(frozen=True)
class TokenSets:
    """Labels and, for each, the token ids that decode to exactly one of its spellings."""

    labels: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        seen: dict[int, str] = {}
        for label, ids in zip(self.labels, self.token_ids):
            for i in ids:
                if i in seen and seen[i] != label:
                    raise ExperimentError(f"token {i} is in the sets of both {seen[i]!r} and {label!r}")
                seen[i] = label

    @classmethod
    def build(cls, tokenizer: Any, spellings: dict[str, Sequence[str]]) -> TokenSets:
        """Token sets from {label: spellings}; each spelling also matches with a leading space.

        Raises ExperimentError for a label that no single token spells.
        """
        wanted: dict[str, str] = {}
        for label, words in spellings.items():
            for w in words:
                for form in (w, " " + w):
                    wanted[form] = label
        index = vocabulary_index(tokenizer)
        found: dict[str, list[int]] = {label: [] for label in spellings}
        for form, label in wanted.items():
            found[label].extend(index.get(form, ()))
        for ids in found.values():
            ids.sort()  # vocabulary order, as a scan finds them: the order gather() sums in
        missing = [label for label, ids in found.items() if not ids]
        if missing:
            raise ExperimentError(f"no single token of this tokenizer spells {', '.join(map(repr, missing))}")
        return cls(tuple(found), tuple(tuple(ids) for ids in found.values()))

    def gather(self, probs: torch.Tensor) -> torch.Tensor:
        """Label probabilities [..., labels] from full next-token distributions [..., vocab]."""
        columns = [probs[..., list(ids)].sum(dim=-1) for ids in self.token_ids]
        return torch.stack(columns, dim=-1)


DIGIT_SPELLINGS: dict[str, Sequence[str]] = {str(k): [str(k)] for k in range(10)}
BINARY_SPELLINGS: dict[str, Sequence[str]] = {"0": ["0"], "1": ["1"]}
TRUTH_WORD_SPELLINGS: dict[str, Sequence[str]] = {"false": ["false", "False"], "true": ["true", "True"]}


#: The paper's read-outs: a label is every token that contains one of its pieces (lower-cased);
#: a token that contains pieces of several labels goes to the first of them, in this order.
PAPER_YES_NO: dict[str, Sequence[str]] = {"yes": ["yes"], "no": ["no"]}
PAPER_TRUTH: dict[str, Sequence[str]] = {"1": ["1", "tr"], "0": ["0", "fa"]}
PAPER_DIGITS: dict[str, Sequence[str]] = {str(k): [str(k)] for k in range(10)}

_CONTAINING: weakref.WeakKeyDictionary[Any, dict[tuple[tuple[str, tuple[str, ...]], ...], TokenSets]] = (
    weakref.WeakKeyDictionary()
)


def containing(tokenizer: Any, pieces: dict[str, Sequence[str]]) -> TokenSets:
    """The paper's read-out sets: a label's tokens are those of the vocabulary whose text contains one of its pieces.

    As the paper's scripts build them: every entry of ``tokenizer.get_vocab()`` (the raw
    vocabulary, "Ġ" or "▁" space markers kept) except byte tokens (those containing "0x"),
    compared lower-cased with each piece; a token that contains pieces of several labels
    goes to the first such label in ``pieces``' order. Broader than :meth:`TokenSets.build`
    ("no" takes "not" and "know", "1" takes "10" and "2021"); kept so that the paper's
    numbers can be reproduced. ExperimentError for a label no token holds.
    """
    key = tuple((label, tuple(parts)) for label, parts in pieces.items())
    try:
        cached = _CONTAINING.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference: build, do not cache
        cached = {}
    if key in cached:
        return cached[key]
    found: dict[str, list[int]] = {label: [] for label in pieces}
    lowered = [(label, [part.lower() for part in parts]) for label, parts in pieces.items()]
    for text, index in tokenizer.get_vocab().items():
        if "0x" in text:
            continue
        text = text.lower()
        label = next((label for label, parts in lowered if any(part in text for part in parts)), None)
        if label is not None:
            found[label].append(int(index))
    missing = [label for label, ids in found.items() if not ids]
    if missing:
        raise ExperimentError(f"no token of this tokenizer contains {', '.join(map(repr, missing))}")
    sets = TokenSets(tuple(found), tuple(tuple(sorted(ids)) for ids in found.values()))
    cached[key] = sets
    return sets


def paper_digits(tokenizer: Any, labels: dict[str, Sequence[str]] | None = None) -> TokenSets:
    """The paper's read-out of digits: each digit 0-9 is every token containing it (:func:`containing`), a token with
    several digits going to the first of them in 0-9 order ("12" to 1, "20" to 0). ``labels``: other sets in that
    form, e.g. the digits 0-4 and "other digits"."""
    return containing(tokenizer, PAPER_DIGITS if labels is None else labels)


def digits(tokenizer: Any) -> TokenSets:
    """Token sets of the digits 0-9."""
    return TokenSets.build(tokenizer, DIGIT_SPELLINGS)


def truth_values(tokenizer: Any) -> TokenSets:
    """Token sets of 0, 1, false and true."""
    return TokenSets.build(tokenizer, {**BINARY_SPELLINGS, **TRUTH_WORD_SPELLINGS})
