"""Continuous signals: token embeddings held over intervals of time.

A prompt is a piecewise-constant signal. Token i holds its embedding on (t_{i-1}, t_i];
its duration is d_i = t_i - t_{i-1} >= 0 and its time is the right end t_i. By default
the times are derived from the durations, t_i = start + d_1 + ... + d_i, with
``start = -1`` so that a prompt of unit durations sits at times 0, 1, 2, ... exactly
like the position ids of the stock model. Times can also be given explicitly (several
tokens may share one time).

Signals are immutable: every edit returns a new signal, and no two signals share a tensor
(each holds its own copy of what it was made from). Edits are addressed by character
spans ``(start, end)`` of the text the signal was tokenized from, never by searching
decoded tokens. A tensor edited in place (``signal.durations[1] = nan``) is checked again
wherever the signal is evaluated (:meth:`Signal.check_values`).

Limits (a :class:`~contllm.errors.SignalError` names the argument that breaks one):
every time lies within +-:data:`MAX_TIME` (the model reads times as float32 positions);
durations are finite and >= 0, of any size when the times are given explicitly (only
their logarithm reaches the model). A position whose time sees no token of positive
duration - every token deleted, or all durations 0 - has nothing to attend to: its
output is undefined (0/0 in the attention integral), and evaluating it raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from contllm.core import signal_values as checks
from contllm.core.signal_values import Span
from contllm.errors import SignalError
from contllm.numerals import MAX_TIME

__all__ = ["DEFAULT_START", "MAX_TIME", "Signal", "SignalBatch", "Span", "pad_signals"]

#: Time of the integration start; with it, unit durations give times 0, 1, 2, ...
DEFAULT_START = -1.0

#: Rows ``repr(signal)`` shows in full; a longer signal shows its first and last tokens.
REPR_ROWS = 48


@dataclass(frozen=True)
class Signal:
    """A continuous-time input: token ids and/or embeddings, with durations and times.

    token_ids: long tensor [tokens] or None (then ``embeds`` must be given).
    embeds: float tensor [tokens, hidden] or None; when given it replaces the embedding
        of ``token_ids`` (interpolated inputs use this).
    durations: float64 tensor [tokens], every value finite and >= 0.
    explicit_times: float64 tensor [tokens] or None (then times follow the durations).
    start: the integration start t_0 used when times follow the durations.
    text / offsets: the text the tokens came from and each token's character span in it
        ((0, 0) for special tokens); used to address edits.
    """

    durations: torch.Tensor
    token_ids: torch.Tensor | None = None
    embeds: torch.Tensor | None = None
    explicit_times: torch.Tensor | None = None
    start: float = DEFAULT_START
    text: str | None = None
    offsets: tuple[Span, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Every tensor is the signal's own copy: a signal shares none with its source or its edits.
        durations = checks.as_float_vector(self.durations, "durations").clone()
        object.__setattr__(self, "durations", durations)
        n = durations.shape[0]
        if n == 0:
            raise SignalError("a signal needs at least one token; this one is empty")
        checks.check_durations(durations)
        if self.token_ids is None and self.embeds is None:
            raise SignalError("a signal needs token_ids or embeds; both are missing")
        if self.token_ids is not None:
            ids = torch.as_tensor(self.token_ids).detach().cpu()
            if ids.ndim != 1 or ids.dtype not in (torch.int32, torch.int64):
                raise SignalError(
                    f"token_ids must be a 1-D integer sequence, got {ids.dtype} of shape {tuple(ids.shape)}"
                )
            if ids.shape[0] != n:
                raise SignalError(f"{ids.shape[0]} token ids but {n} durations; the lengths must match")
            object.__setattr__(self, "token_ids", ids.long().clone())
        if self.embeds is not None:
            if not isinstance(self.embeds, torch.Tensor):
                raise SignalError(f"embeds must be a torch.Tensor [tokens, hidden], got {checks.describe(self.embeds)}")
            embeds = self.embeds.detach()
            if not embeds.is_floating_point():
                raise SignalError(f"embeds must be a floating-point tensor, got {embeds.dtype}")
            if embeds.ndim != 2 or embeds.shape[0] != n:
                raise SignalError(f"embeds must have shape [tokens, hidden] with {n} tokens, got {tuple(embeds.shape)}")
            checks.check_embeds_finite(embeds)
            object.__setattr__(self, "embeds", embeds.clone())
        if self.explicit_times is not None:
            times = checks.as_float_vector(self.explicit_times, "times")
            if times.shape[0] != n:
                raise SignalError(f"{times.shape[0]} times but {n} durations; the lengths must match")
            checks.check_times_finite(times)
            object.__setattr__(self, "explicit_times", times.clone())
        start = checks.as_number(self.start, "start")
        if not math.isfinite(start):
            raise SignalError(f"start must be finite, got {self.start}")
        object.__setattr__(self, "start", start)
        checks.check_times(self.times)
        if self.offsets is not None and len(self.offsets) != n:
            raise SignalError(f"{len(self.offsets)} character offsets but {n} tokens")

    def check_values(self, name: str = "signal") -> None:
        """SignalError, its message starting with ``name``, unless the signal's tensors still hold valid values.

        A signal is checked when it is made, but its tensors can be edited in place
        afterwards (``signal.durations[1] = float("nan")``). Every evaluation checks again
        (:func:`contllm.core.engine.check_signals`): durations finite and >= 0, explicit times
        finite, every time within +-:data:`MAX_TIME`, embeds finite.
        """
        try:
            checks.check_durations(self.durations)
            if self.explicit_times is not None:
                checks.check_times_finite(self.explicit_times)
            checks.check_times(self.times)
            if self.embeds is not None:
                checks.check_embeds_finite(self.embeds)
        except SignalError as err:
            raise SignalError(f"{name}: {err}") from None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_ids(
        cls,
        token_ids: Sequence[int] | torch.Tensor,
        durations: Sequence[float] | torch.Tensor | None = None,
        *,
        times: Sequence[float] | torch.Tensor | None = None,
        start: float = DEFAULT_START,
    ) -> Signal:
        """A signal from token ids [tokens]; durations default to 1.

        The ids are checked against the vocabulary when the signal meets a model
        (evaluated or embedded): SignalError for an id outside [0, vocab_size).
        """
        if isinstance(token_ids, (str, bytes)):
            raise SignalError(f"token_ids must be a 1-D sequence of integers, got the string {token_ids!r}")
        try:
            ids = torch.as_tensor(token_ids)
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            raise SignalError(
                f"token_ids must be a 1-D sequence of integers, got {checks.describe(token_ids)}"
            ) from err
        if ids.ndim != 1:
            raise SignalError(f"token_ids must be 1-D, got shape {tuple(ids.shape)}")
        return cls(
            durations=checks.unit_if_none(durations, len(ids)),
            token_ids=ids,
            explicit_times=checks.times_or_none(times),
            start=start,
        )

    @classmethod
    def from_embeds(
        cls,
        embeds: torch.Tensor,
        durations: Sequence[float] | torch.Tensor | None = None,
        *,
        times: Sequence[float] | torch.Tensor | None = None,
        start: float = DEFAULT_START,
    ) -> Signal:
        """A signal from input embeddings [tokens, hidden] given directly (hidden: the model's width)."""
        if not isinstance(embeds, torch.Tensor):
            raise SignalError(f"embeds must be a torch.Tensor [tokens, hidden], got {checks.describe(embeds)}")
        if embeds.ndim != 2:
            raise SignalError(f"embeds must have shape [tokens, hidden], got {tuple(embeds.shape)}")
        return cls(
            durations=checks.unit_if_none(durations, embeds.shape[0]),
            embeds=embeds,
            explicit_times=checks.times_or_none(times),
            start=start,
        )

    @classmethod
    def from_text(cls, tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> Signal:
        """Tokenize ``text`` (a fast tokenizer is needed for character offsets); durations 1."""
        if not isinstance(text, str) or not text:
            raise SignalError("the text of a signal must be a non-empty string")
        if not getattr(tokenizer, "is_fast", False):
            raise SignalError("character spans need a fast tokenizer (one that returns offset mappings)")
        enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        ids = enc["input_ids"]
        if not ids:
            raise SignalError(f"the tokenizer produced no tokens for {text!r}")
        offsets = tuple((int(a), int(b)) for a, b in enc["offset_mapping"])
        return cls(
            durations=torch.ones(len(ids), dtype=torch.float64),
            token_ids=torch.tensor(ids, dtype=torch.long),
            text=text,
            offsets=offsets,
        )

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return int(self.durations.shape[0])

    def pieces(self) -> list[str]:
        """A label per token: its text (for a signal made from text), ``#id`` for a token id with no text (special
        tokens), ``[embed]`` for a token given only as an embedding."""
        out = []
        for i in range(len(self)):
            if self._has_text(i):
                assert self.text is not None and self.offsets is not None
                a, b = self.offsets[i]
                out.append(self.text[a:b])
            elif self.embeds is not None and self.token_ids is None:
                out.append("[embed]")
            else:
                assert self.token_ids is not None
                out.append(f"#{int(self.token_ids[i])}")
        return out

    def _has_text(self, i: int) -> bool:
        return self.text is not None and self.offsets is not None and self.offsets[i][1] > self.offsets[i][0]

    def __repr__(self) -> str:
        """One row per token: its label (:meth:`pieces`), the start of its interval, its duration and its time."""
        n = len(self)
        times, durations = self.times.tolist(), self.durations.tolist()
        half = REPR_ROWS // 2
        shown = list(range(n)) if n <= REPR_ROWS else [*range(half), -1, *range(n - half + 1, n)]
        labels = [repr(p) if self._has_text(i) else p for i, p in enumerate(self.pieces())]
        width = min(24, max(len(labels[i]) for i in shown if i >= 0))
        source = "from text" if self.text is not None else "of embeddings" if self.token_ids is None else "of token ids"
        lines = [f"Signal({n} tokens {source}, times {min(times):g} to {max(times):g})"]
        lines.append(f"  {'#':>4}  {'token':<{width}}  {'start':>9}  {'duration':>9}  {'time':>9}")
        for i in shown:
            if i < 0:
                lines.append(f"  {'...':>4}")
                continue
            label = labels[i] if len(labels[i]) <= width else labels[i][: width - 3] + "..."
            start = times[i] - durations[i]
            lines.append(f"  {i:>4}  {label:<{width}}  {start:>9.4g}  {durations[i]:>9.4g}  {times[i]:>9.4g}")
        return "\n".join(lines)

    @property
    def times(self) -> torch.Tensor:
        """float64 tensor [tokens]: the right end of each token's interval."""
        if self.explicit_times is not None:
            return self.explicit_times
        return self.start + torch.cumsum(self.durations, dim=0)

    @property
    def end(self) -> float:
        """The largest time in the signal."""
        return float(self.times.max())

    def find(self, needle: str, *, whole_word: bool = True) -> list[Span]:
        """Character spans of every occurrence of ``needle`` in the text (left to right)."""
        text = self._require_text()
        if not isinstance(needle, str):
            raise SignalError(f"needle must be a string, got {checks.describe(needle)}")
        if not needle:
            raise SignalError("cannot search for an empty string")
        pattern = re.escape(needle)
        if whole_word:
            pattern = rf"(?<!\w){pattern}(?!\w)"
        spans = [(m.start(), m.end()) for m in re.finditer(pattern, text)]
        if not spans:
            words = sorted(set(re.findall(r"\w+", text)))
            shown = ", ".join(words[:20]) + (", ..." if len(words) > 20 else "")
            raise SignalError(f"{needle!r} not found in the text; its words are: {shown}")
        return spans

    def token_indices(self, spans: Span | Iterable[Span]) -> list[int]:
        """Indices of the tokens whose characters overlap any of ``spans`` (sorted)."""
        text = self._require_text()
        assert self.offsets is not None
        span_list = checks.span_list(spans)
        chosen: set[int] = set()
        for a, b in span_list:
            if not (0 <= a < b <= len(text)):
                raise SignalError(
                    f"character span ({a}, {b}) is not a non-empty span inside the text of length {len(text)}"
                )
            hit = [i for i, (s, e) in enumerate(self.offsets) if e > s and s < b and a < e]
            if not hit:
                raise SignalError(f"character span ({a}, {b}) = {text[a:b]!r} covers no token")
            chosen.update(hit)
        return sorted(chosen)

    # ------------------------------------------------------------------ edits
    def scale(self, spans: Span | Iterable[Span], factor: float) -> Signal:
        """Multiply the durations of the tokens overlapping ``spans`` by ``factor`` >= 0.

        spans: a pair of integer character offsets ``(start, end)`` or a list of them (as
        :meth:`find` returns). The scaled times must stay within +-:data:`MAX_TIME`.
        """
        factor = checks.check_factor(factor)
        return self.scale_tokens(self.token_indices(spans), factor)

    def delete(self, spans: Span | Iterable[Span]) -> Signal:
        """Give the tokens overlapping ``spans`` duration 0: present, but absent from attention.

        A position that then sees no token of positive duration (every token deleted)
        has nothing to attend to; evaluating it raises SignalError.
        """
        return self.scale(spans, 0.0)

    def scale_tokens(self, indices: Iterable[int], factor: float) -> Signal:
        """Multiply the durations of the tokens at ``indices`` by ``factor`` >= 0."""
        factor = checks.check_factor(factor)
        idx = self._check_indices(indices)
        durations = self.durations.clone()
        durations[idx] = durations[idx] * factor
        try:
            return replace(self, durations=durations)
        except SignalError as err:
            raise SignalError(f"scaling durations by factor {factor:g}: {err}") from err

    def with_durations(self, durations: Sequence[float] | torch.Tensor) -> Signal:
        """The same tokens with new durations [tokens] (finite, >= 0; times within +-:data:`MAX_TIME`)."""
        return replace(self, durations=checks.as_float_vector(durations, "durations"))

    def with_times(self, times: Sequence[float] | torch.Tensor | None) -> Signal:
        """The same tokens at explicit times [tokens] (None: times follow the durations again).

        Every time must lie within +-:data:`MAX_TIME`.
        """
        return replace(self, explicit_times=checks.times_or_none(times))

    def repeat(self, span: Span, count: int) -> Signal:
        """Repeat the tokens overlapping ``span`` so that they occur ``count`` times in a row."""
        if not isinstance(count, int) or count < 1:
            raise SignalError(f"a repeat count must be an integer >= 1, got {count!r}")
        idx = self.token_indices(span)
        if idx != list(range(idx[0], idx[-1] + 1)):
            raise SignalError(f"span {span} does not cover a contiguous run of tokens")
        order = list(range(idx[-1] + 1)) + idx * (count - 1) + list(range(idx[-1] + 1, len(self)))
        return self._take(order)

    def split_token(self, index: int, parts: int = 2) -> Signal:
        """Replace token ``index`` by ``parts`` copies at its time, each with an equal share of its duration."""
        (index,) = self._check_indices([index])
        if not isinstance(parts, int) or parts < 1:
            raise SignalError(f"parts must be an integer >= 1, got {parts!r}")
        times = self.times
        order = list(range(index + 1)) + [index] * (parts - 1) + list(range(index + 1, len(self)))
        out = self._take(order)
        durations = out.durations.clone()
        durations[index : index + parts] = self.durations[index] / parts
        return replace(out, durations=durations, explicit_times=times[order])

    def embedded(self, embedding: torch.nn.Module) -> Signal:
        """This signal with its embeddings made by ``embedding`` (the model's input-embedding module)."""
        if self.embeds is not None:
            return self
        assert self.token_ids is not None
        weight = next(embedding.parameters())
        self.check_for_model(vocab_size=int(weight.shape[0]), hidden_size=int(weight.shape[-1]))
        with torch.no_grad():
            embeds = embedding(self.token_ids.to(weight.device)[None])[0]
        return replace(self, embeds=embeds)

    def check_for_model(self, *, vocab_size: int, hidden_size: int, name: str = "signal") -> None:
        """SignalError unless every token id lies in [0, vocab_size) and embeds are ``hidden_size`` wide."""
        if self.token_ids is not None and len(self.token_ids):
            ids = self.token_ids
            bad = (ids < 0) | (ids >= vocab_size)
            if bad.any():
                i = int(torch.nonzero(bad)[0])
                raise SignalError(
                    f"{name}: token id {int(ids[i])} (token {i}) is outside the model's vocabulary of "
                    f"{vocab_size} tokens; token_ids must lie in [0, {vocab_size})"
                )
        if self.embeds is not None and self.embeds.shape[1] != hidden_size:
            raise SignalError(
                f"{name}: embeds are {self.embeds.shape[1]} wide, but the model's hidden size is {hidden_size}; "
                f"embeds must have shape [tokens, {hidden_size}]"
            )

    def blind_positions(self, indices: Iterable[int]) -> list[int]:
        """The token ``indices`` whose time sees no token of positive duration (nothing to attend to)."""
        positive = self.durations > 0
        idx = list(indices)
        if not positive.any():
            return idx
        times = self.times
        blind = times[torch.tensor(idx, dtype=torch.long)] < times[positive].min()
        return [i for i, b in zip(idx, blind.tolist()) if b]

    # ------------------------------------------------------------------ helpers
    def _require_text(self) -> str:
        if self.text is None or self.offsets is None:
            raise SignalError("this signal was not built from text; character spans need Signal.from_text")
        return self.text

    def _check_indices(self, indices: Iterable[int]) -> list[int]:
        if isinstance(indices, (str, bytes)) or not isinstance(indices, Iterable):
            raise SignalError(f"token indices must be a sequence of integers, got {checks.describe(indices)}")
        idx = [checks.as_index(i, "a token index") for i in indices]
        n = len(self)
        for i in idx:
            if not -n <= i < n:
                raise SignalError(f"token index {i} is outside a signal of {n} tokens")
        return [i % n for i in idx]

    def _take(self, order: list[int]) -> Signal:
        index = torch.tensor(order, dtype=torch.long)
        return replace(
            self,
            durations=self.durations[index],
            token_ids=None if self.token_ids is None else self.token_ids[index],
            embeds=None if self.embeds is None else self.embeds[index.to(self.embeds.device)],
            explicit_times=None if self.explicit_times is None else self.explicit_times[index],
            offsets=None if self.offsets is None else tuple(self.offsets[i] for i in order),
        )


@dataclass(frozen=True)
class SignalBatch:
    """Signals of different lengths padded to one length with zero-duration tokens.

    token_ids: long [batch, tokens] (padding and embedding-only rows hold 0).
    embeds: float [batch, tokens, hidden] or None (None: every row is made from ids).
    has_embeds: bool [batch], rows whose embeddings are given.
    durations, times: float64 [batch, tokens]; padding has duration 0.
    lengths: long [batch]; pad_left: long [batch], padding tokens before each signal.
    """

    token_ids: torch.Tensor
    embeds: torch.Tensor | None
    has_embeds: torch.Tensor
    durations: torch.Tensor
    times: torch.Tensor
    lengths: torch.Tensor
    pad_left: torch.Tensor

    def __len__(self) -> int:
        return int(self.durations.shape[0])

    @property
    def width(self) -> int:
        return int(self.durations.shape[1])


def pad_signals(signals: Sequence[Signal], *, side: str = "left", width: int | None = None) -> SignalBatch:
    """Pad ``signals`` to a common length with zero-duration tokens.

    Left padding (the default) puts every signal's last token at the last column, so
    the last position can be read with one vocabulary projection for the whole batch.
    Left padding sits at the signal's start time, right padding at its end time; with
    duration 0 neither is seen by any other token.
    """
    if not signals:
        raise SignalError("cannot pad an empty list of signals")
    if side not in ("left", "right"):
        raise SignalError(f"padding side must be 'left' or 'right', got {side!r}")
    for s in signals:
        if not isinstance(s, Signal):
            raise SignalError(f"expected Signal objects, got {type(s).__name__}")
    longest = max(len(s) for s in signals)
    width = longest if width is None else width
    if width < longest:
        raise SignalError(f"padding width {width} is shorter than the longest signal ({longest})")
    b = len(signals)
    token_ids = torch.zeros(b, width, dtype=torch.long)
    durations = torch.zeros(b, width, dtype=torch.float64)
    times = torch.zeros(b, width, dtype=torch.float64)
    has_embeds = torch.tensor([s.embeds is not None for s in signals])
    embeds = None
    if has_embeds.any():
        ref = next(s.embeds for s in signals if s.embeds is not None)
        assert ref is not None
        hidden = ref.shape[1]
        if any(s.embeds is not None and s.embeds.shape[1] != hidden for s in signals):
            raise SignalError("signals with given embeddings must share one hidden size")
        embeds = torch.zeros(b, width, hidden, dtype=ref.dtype, device=ref.device)
    lengths = torch.tensor([len(s) for s in signals], dtype=torch.long)
    pad_left = torch.zeros(b, dtype=torch.long)
    for row, s in enumerate(signals):
        n = len(s)
        lo = width - n if side == "left" else 0
        pad_left[row] = lo
        cols = slice(lo, lo + n)
        if s.token_ids is not None:
            token_ids[row, cols] = s.token_ids
        if s.embeds is not None and embeds is not None:
            embeds[row, cols] = s.embeds.to(device=embeds.device, dtype=embeds.dtype)
        durations[row, cols] = s.durations
        t = s.times
        times[row, cols] = t
        if side == "left":
            times[row, :lo] = t[0] - s.durations[0]
        else:
            times[row, lo + n :] = t[-1]
    return SignalBatch(token_ids, embeds, has_embeds, durations, times, lengths, pad_left)
