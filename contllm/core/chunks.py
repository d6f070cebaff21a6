"""How the engine splits many signals into forwards: which rows share a chunk, and the prefix they share.

:func:`plan` is pure bookkeeping over lengths and token comparisons; nothing runs the
model here. See :mod:`contllm.core.engine` for how a chunk is evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contllm.core.prefix import shared_prefix_len
from contllm.core.signal import Signal


@dataclass(frozen=True)
class Chunk:
    """One forward of the engine: which signals (indices into the call's list) and the prefix they share."""

    rows: tuple[int, ...]
    prefix: int


def plan(
    signals: Sequence[Signal],
    reads: Sequence[Sequence[int]],
    max_batch_tokens: int,
    lm: Any,
    *,
    prefix: bool = True,
    vocab: int = 0,
) -> list[Chunk]:
    """Split signals into chunks, each sharing a prefix, at the least estimated cost.

    Two orders are planned and the one that computes fewer tokens (each computed prefix
    once, rows x padded width after it, :data:`FORWARD_OVERHEAD` per chunk) is taken:

    - input order, each chunk sharing the longest prefix of its own signals (one sweep's
      signals share a long prefix; consecutive sweeps of different prompts may not);
    - when every signal shares a prefix, by length (shortest first), every chunk sharing
      that prefix: the prefix is computed once for the call, and signals of one length
      share chunks, those of nearby lengths too where padding them costs less than
      another forward (many items with one template: few-shot examples, instructions).

    A chunk holds at most ``max_batch_tokens`` rows x padded width after its prefix,
    attention scores of at most that x :data:`KEYS_PER_TOKEN` keys, and read logits of at
    most :data:`LOGITS_BYTES`; a signal too long for the budget runs alone. Without
    ``prefix`` no prefix is shared and the input order is kept.
    """
    n = len(signals)
    lengths = [len(s) for s in signals]
    first = [min(r) for r in reads]
    reads_per_row = max(len(r) for r in reads)
    limits = _Limits(max_batch_tokens, vocab * reads_per_row * 4)
    in_order = _greedy(list(range(n)), lengths, limits, shared=_pairwise(signals, first, lm) if prefix else None)
    candidates = [in_order]
    if prefix and n > 1:
        common = shared_prefix_len(signals, lm, before=min(first))
        if common > 0:
            candidates.append(_by_length(lengths, limits, common))
    return min(candidates, key=lambda chunks: cost(chunks, lengths))


#: What one more forward costs beyond its tokens, in tokens (dispatch of every layer's
#: operations; on a 2-core CPU about the time of 50-100 tokens of SmolLM2-135M).
FORWARD_OVERHEAD = 64

#: Most consecutive signal lengths that :func:`plan` pads into one run of chunks.
MERGED_LENGTHS = 16

#: Attention scores a chunk may hold, as keys per token of its budget (prefix keys included).
KEYS_PER_TOKEN = 512
#: Read logits a chunk may hold (float32 bytes): rows x read positions x vocabulary.
LOGITS_BYTES = 256 << 20


@dataclass(frozen=True)
class _Limits:
    tokens: int
    logits_per_row: int

    def fit(self, rows: int, width: int, keys: int) -> bool:
        """Whether ``rows`` rows of ``width`` tokens after the prefix, ``keys`` keys each, fit one chunk."""
        return rows <= self.rows(width, keys)

    def rows(self, width: int, keys: int) -> int:
        """The most rows of ``width`` tokens after the prefix, ``keys`` keys each, that fit one chunk (at least 1)."""
        most = min(self.tokens // max(width, 1), self.tokens * KEYS_PER_TOKEN // max(width * keys, 1))
        if self.logits_per_row:
            most = min(most, LOGITS_BYTES // self.logits_per_row)
        return max(1, most)


def _pairwise(signals: Sequence[Signal], first: Sequence[int], lm: Any) -> Callable[[int, int], int]:
    """lcp(i, j): the prefix signals i and j share, ending before either's first read."""

    def lcp(i: int, j: int) -> int:
        return shared_prefix_len([signals[i], signals[j]], lm, before=min(first[i], first[j]))

    return lcp


def _greedy(
    order: list[int],
    lengths: Sequence[int],
    limits: _Limits,
    *,
    shared: Callable[[int, int], int] | None = None,
) -> list[Chunk]:
    """Consecutive chunks of ``order`` within the limits.

    A chunk of several rows shares the longest prefix of its own rows (``shared(i, j)``:
    what rows i and j share; None: no prefix at all); a chunk of one row shares none.
    """
    chunks: list[Chunk] = []
    rows: list[int] = []
    p = longest = 0
    for i in order:
        if rows:
            q = 0
            if shared is not None:
                pair = shared(rows[0], i)
                q = pair if len(rows) == 1 else min(p, pair)
            wider = max(longest, lengths[i])
            if limits.fit(len(rows) + 1, wider - q, wider):
                rows.append(i)
                p, longest = q, wider
                continue
            chunks.append(Chunk(tuple(rows), p))
        rows, longest, p = [i], lengths[i], 0
    if rows:
        chunks.append(Chunk(tuple(rows), p))
    return chunks


def _by_length(lengths: Sequence[int], limits: _Limits, prefix: int) -> list[Chunk]:
    """Chunks of signals sorted by length, all sharing ``prefix``, cut where padding costs more than a forward.

    Signals of one length form a group; a run of up to :data:`MERGED_LENGTHS` consecutive
    groups shares chunks (padded to the run's longest) where that costs fewer tokens than
    separate chunks, with :data:`FORWARD_OVERHEAD` per chunk (dynamic programming over
    the groups).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] == lengths[i]:
            groups[-1].append(i)
        else:
            groups.append([i])
    sizes = [len(g) for g in groups]

    def run_cost(j: int, k: int) -> int:
        """Groups j..k-1 as one run: every row padded to the longest, in as few chunks as fit."""
        longest = lengths[groups[k - 1][0]]
        rows = sum(sizes[j:k])
        return rows * (longest - prefix) + FORWARD_OVERHEAD * math.ceil(rows / limits.rows(longest - prefix, longest))

    # best[k]: (cost, start of the last run) of the cheapest plan for the first k groups.
    best: list[tuple[int, int]] = [(0, 0)]
    for k in range(1, len(groups) + 1):
        best.append(min((best[j][0] + run_cost(j, k), j) for j in range(max(0, k - MERGED_LENGTHS), k)))
    runs: list[tuple[int, int]] = []
    k = len(groups)
    while k > 0:
        j = best[k][1]
        runs.append((j, k))
        k = j
    chunks: list[Chunk] = []
    for j, k in reversed(runs):
        rows = [i for g in groups[j:k] for i in g]
        longest = lengths[rows[-1]]
        step = limits.rows(longest - prefix, longest)
        chunks += [Chunk(tuple(rows[lo : lo + step]), prefix) for lo in range(0, len(rows), step)]
    return chunks


def cost(chunks: Sequence[Chunk], lengths: Sequence[int]) -> int:
    """Tokens a plan computes: each prefix once (again where it changes), rows x padded width after it, and
    :data:`FORWARD_OVERHEAD` per chunk (``lengths``: each signal's tokens, by index)."""
    total, last = 0, None
    for c in chunks:
        total += FORWARD_OVERHEAD
        if c.prefix and c.prefix != last:
            total += c.prefix
        last = c.prefix or last
        total += len(c.rows) * (max(lengths[i] for i in c.rows) - c.prefix)
    return total
