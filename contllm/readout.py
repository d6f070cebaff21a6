"""Read-outs: exact token sets and the distribution over them.

A label such as "3" or "true" is read as the total probability of the tokens that decode
to exactly one of its spellings, with or without a leading space marker. Substrings never
count: "no" is not "not", "1" is not "10".
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


#: The paper's read-outs: a label is every token that contains one of these (lower-cased).
PAPER_YES_NO: dict[str, Sequence[str]] = {"yes": ["yes"], "no": ["no"]}
PAPER_TRUTH: dict[str, Sequence[str]] = {"0": ["0", "fa"], "1": ["1", "tr"]}


def containing(tokenizer: Any, pieces: dict[str, Sequence[str]]) -> TokenSets:
    """The paper's way of reading out: a label's tokens are those whose decoded text, lower-cased, contains one of its pieces.

    Broader than :meth:`TokenSets.build` ("no" takes "not" and "know"); kept so that the
    paper's numbers can be reproduced. A token that contains pieces of two labels is left
    out of both, since the sets may not overlap. ExperimentError for a label no token holds.
    """
    found: dict[str, list[int]] = {label: [] for label in pieces}
    for i, text in enumerate(decoded_vocabulary(tokenizer)):
        lower = text.lower()
        labels = [label for label, parts in pieces.items() if any(part in lower for part in parts)]
        if len(labels) == 1:
            found[labels[0]].append(i)
    missing = [label for label, ids in found.items() if not ids]
    if missing:
        raise ExperimentError(f"no token of this tokenizer contains {', '.join(map(repr, missing))}")
    return TokenSets(tuple(found), tuple(tuple(ids) for ids in found.values()))


def digits(tokenizer: Any) -> TokenSets:
    """Token sets of the digits 0-9."""
    return TokenSets.build(tokenizer, DIGIT_SPELLINGS)


def truth_values(tokenizer: Any) -> TokenSets:
    """Token sets of 0, 1, false and true."""
    return TokenSets.build(tokenizer, {**BINARY_SPELLINGS, **TRUTH_WORD_SPELLINGS})
