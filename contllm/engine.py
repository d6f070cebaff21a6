"""Batched evaluation of many signals: chunks, a shared prefix through the KV cache, last-position logits.

A sweep evaluates one prompt under many edits (durations scaled by c, an interpolation
at alpha), so its signals usually agree on every token before the first edited one.
:class:`Engine` splits the signals, in input order, into chunks that fit a memory budget;
in each chunk it finds the longest prefix shared by every signal (same token id or
embedding, same duration, same time), runs it once with batch size 1, repeats its KV
cache along the batch and continues with the rest of each signal as one left-padded
batch, projecting only the last column onto the vocabulary.

The result equals evaluating every signal alone: the cached keys are those the full
forward would compute, the padding between prefix and rest has duration 0 (absent from
attention), and the time mask spans prefix and new keys alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from contllm.errors import SignalError, UnsupportedModelError
from contllm.lm import Context, ContinuousLM
from contllm.precision import float32_state
from contllm.signal import Signal, pad_signals

#: Budget of a chunk on the CPU, in batch rows x padded width (prefix keys included).
#: Measured on a 2-core CPU with SmolLM2-135M (100 signals of 127 tokens): budgets from
#: 2048 to 16384 ran at the same rate within noise (1024 was ~15% slower), and 8192 kept
#: the process under ~2 GB resident, model included. Larger CPUs gain nothing from more.
CPU_BATCH_TOKENS = 8192

#: Share of the free accelerator memory that one chunk may take by the estimate below.
_ACCELERATOR_MEMORY_SHARE = 0.5
#: Key width assumed when estimating the attention scores of one token on an accelerator.
_ASSUMED_KEY_WIDTH = 512
#: Largest float32 block of the vocabulary projection cast at once by the float32 read-out.
_HEAD_BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class ChunkStats:
    """What one chunk computed.

    rows: signals in the chunk; prefix_len: tokens of the shared prefix (0: none used);
    prefix_computed: whether the prefix ran here (False: reused from the chunk before);
    width: padded width of the batch after the prefix; lengths: each signal's tokens
    after the prefix (the real, unpadded ones).
    """

    rows: int
    prefix_len: int
    prefix_computed: bool
    width: int
    lengths: tuple[int, ...]


@dataclass
class EngineStats:
    """Per-chunk record of one :meth:`Engine.logits` call."""

    chunks: list[ChunkStats] = field(default_factory=list)

    @property
    def prefix_lens(self) -> tuple[int, ...]:
        """The shared prefix length used in each chunk (0 where none was)."""
        return tuple(c.prefix_len for c in self.chunks)

    @property
    def tokens_computed(self) -> int:
        """Real tokens that went through the model: each computed prefix once, plus every row's rest."""
        return sum(c.prefix_len * c.prefix_computed + sum(c.lengths) for c in self.chunks)

    @property
    def padded_tokens(self) -> int:
        """Tokens the model ran including padding: computed prefixes plus rows x width."""
        return sum(c.prefix_len * c.prefix_computed + c.rows * c.width for c in self.chunks)


class Engine:
    """Next-token logits of many signals, batched, chunked and sharing their common prefix.

    lm: the model to evaluate (any supported family, any dtype; outputs are float32).
    max_batch_tokens: budget of one chunk in batch rows x padded width, prefix keys
        included; None picks :data:`CPU_BATCH_TOKENS` on the CPU and an estimate from the
        free memory on an accelerator. A signal longer than the budget runs alone.
    prefix_cache: compute the prefix shared by a chunk's signals once (True) or run every
        signal in full (False); both give the same logits.
    float32_state: a half-precision (bfloat16, float16) model runs its matmuls in its own
        dtype and everything between them - residual stream, normalisations, rotary
        embedding, masks, attention - in float32 (:func:`contllm.precision.float32_state`;
        about half the distance to the float32 model of running it as stock, at nearly
        the same speed). False runs the model wholly in its own dtype. A float32 model is
        unaffected.

    A half-precision model's read positions are projected onto the vocabulary in float32
    (see :func:`_float32_readout`). After each call, ``last_stats`` records what every
    chunk computed (:class:`EngineStats`).
    """

    def __init__(
        self,
        lm: ContinuousLM,
        *,
        max_batch_tokens: int | None = None,
        prefix_cache: bool = True,
        float32_state: bool = True,
    ) -> None:
        if not isinstance(lm, ContinuousLM):
            raise TypeError(f"Engine needs a ContinuousLM, got {type(lm).__name__}")
        if max_batch_tokens is not None and (not isinstance(max_batch_tokens, int) or max_batch_tokens < 1):
            raise SignalError(f"max_batch_tokens must be a positive integer or None, got {max_batch_tokens!r}")
        self.lm = lm
        self.max_batch_tokens = max_batch_tokens if max_batch_tokens is not None else default_batch_tokens(lm)
        self.prefix_cache = prefix_cache
        self.float32_state = float32_state
        self.last_stats: EngineStats | None = None

    def __repr__(self) -> str:
        return (
            f"Engine({self.lm!r}, max_batch_tokens={self.max_batch_tokens}, prefix_cache={self.prefix_cache}, "
            f"float32_state={self.float32_state})"
        )

    # ------------------------------------------------------------------ public
    def logits(self, signals: Sequence[Signal], *, progress: Callable[[int], None] | None = None) -> torch.Tensor:
        """Logits at the last token of each signal: float32 [len(signals), vocab] on the CPU, in input order.

        progress: called after each chunk with the number of signals finished so far.
        """
        items = _check_signals(signals)
        stats = EngineStats()
        out: list[torch.Tensor] = []
        reusable: _Prefix | None = None
        state = float32_state(self.lm) if self.float32_state else nullcontext()
        with self.lm.patched(), _float32_readout(self.lm.model), state:
            for lo, hi in plan_chunks([len(s) for s in items], self.max_batch_tokens):
                chunk = items[lo:hi]
                logits, reusable, chunk_stats = self._chunk(chunk, reusable)
                out.append(logits)
                stats.chunks.append(chunk_stats)
                if progress is not None:
                    progress(hi)
        self.last_stats = stats
        return torch.cat(out)

    def probs(
        self,
        signals: Sequence[Signal],
        *,
        token_ids: torch.Tensor | Sequence[int] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """Next-token distributions (softmax over the full vocabulary, float32) at each signal's last token.

        token_ids: long [k] to read the probabilities of only those tokens -> [n, k];
        None -> the whole distribution [n, vocab].
        """
        wanted = None
        if token_ids is not None:
            wanted = torch.as_tensor(token_ids)
            if wanted.ndim != 1 or wanted.is_floating_point() or wanted.is_complex():
                raise SignalError(f"token_ids must be a 1-D integer sequence, got shape {tuple(wanted.shape)}")
        logits = self.logits(signals, progress=progress)
        probs = torch.softmax(logits, dim=-1)
        if wanted is None:
            return probs
        vocab = probs.shape[-1]
        if wanted.numel() and (int(wanted.min()) < 0 or int(wanted.max()) >= vocab):
            raise SignalError(f"token_ids must lie in [0, {vocab}); got values from {int(wanted.min())} to {int(wanted.max())}")
        return probs[:, wanted.long()]

    # ------------------------------------------------------------------ chunks
    def _chunk(
        self, chunk: list[Signal], reusable: _Prefix | None
    ) -> tuple[torch.Tensor, _Prefix | None, ChunkStats]:
        lm = self.lm
        n = len(chunk)
        p = shared_prefix_len(chunk, lm) if self.prefix_cache and n > 1 else 0
        if p == 0:
            batch = pad_signals(chunk, side="left")
            logits, _ = lm.forward_batch(batch, logits_to_keep=1)
            stats = ChunkStats(n, 0, False, batch.width, tuple(len(s) for s in chunk))
            return logits[:, -1].float().cpu(), reusable, stats

        computed = reusable is None or not reusable.serves(chunk[0], p, lm)
        prefix = _Prefix.compute(lm, chunk[0], p) if computed else reusable
        assert prefix is not None
        rests = [_tail(s, p) for s in chunk]
        batch = pad_signals(rests, side="left")
        logits, _ = lm.forward_batch(batch, logits_to_keep=1, context=prefix.repeated(n))
        stats = ChunkStats(n, p, computed, batch.width, tuple(len(s) for s in rests))
        return logits[:, -1].float().cpu(), prefix, stats


@dataclass
class _Prefix:
    """A shared prefix run once with batch size 1: its source signal, length and context."""

    source: Signal
    length: int
    context: Context

    @classmethod
    def compute(cls, lm: ContinuousLM, source: Signal, length: int) -> _Prefix:
        head = _slice(source, 0, length)
        # No position of the prefix is read: project none of them onto the vocabulary.
        no_columns = torch.empty(0, dtype=torch.long, device=lm.device)
        _, context = lm.forward_batch(pad_signals([head]), logits_to_keep=no_columns, use_cache=True)
        assert context is not None
        for index, layer in enumerate(context.cache.layers):
            kept = layer.get_seq_length()
            if type(layer) is not DynamicLayer or kept != length:
                raise UnsupportedModelError(
                    f"layer {index} of the KV cache ({type(layer).__name__}) keeps {kept} of the {length} prefix keys; "
                    "a shared prefix needs every key kept - use Engine(lm, prefix_cache=False)"
                )
        return cls(source, length, context)

    def serves(self, signal: Signal, length: int, lm: ContinuousLM) -> bool:
        """Whether this prefix is the first ``length`` tokens of ``signal``."""
        return length == self.length and _same_tokens([self.source, signal], length, lm).all().item()

    def repeated(self, rows: int) -> Context:
        """A fresh context holding this prefix ``rows`` times; the original stays untouched for reuse.

        Each layer of the new cache starts from a broadcast view of the prefix keys: the
        first update concatenates the new keys to it, which is the only copy needed (a
        repeated cache would be copied twice).
        """
        cache = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in self.context.cache.layers])
        for layer in cache.layers:
            layer.keys = layer.keys.expand(rows, -1, -1, -1)
            layer.values = layer.values.expand(rows, -1, -1, -1)
        times = self.context.times.expand(rows, -1)
        durations = self.context.durations.expand(rows, -1)
        return Context(cache, times, durations)


# ---------------------------------------------------------------------- helpers
class _Float32Head(nn.Module):
    """A vocabulary projection computed in float32 from a half-precision hidden state.

    The weight is cast block by block (at most :data:`_HEAD_BLOCK_BYTES` in float32 at
    a time), so no float32 copy of a large vocabulary is ever held.
    """

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight, bias = self.head.weight, self.head.bias
        vocab, width = weight.shape
        block = max(1, _HEAD_BLOCK_BYTES // (4 * width))
        # One contiguous 2-D matrix of rows: a strided 3-D slice (the last column of a
        # batch) would make the product broadcast the weight over the batch.
        h = hidden.reshape(-1, width).float().contiguous()
        out = torch.empty(h.shape[0], vocab, dtype=torch.float32, device=h.device)
        if out.numel() > 0:
            for lo in range(0, vocab, block):
                hi = min(lo + block, vocab)
                b = None if bias is None else bias[lo:hi].float()
                out[:, lo:hi] = nn.functional.linear(h, weight[lo:hi].float(), b)
        return out.view(*hidden.shape[:-1], vocab)


@contextmanager
def _float32_readout(model: nn.Module) -> Iterator[None]:
    """Project the read positions onto the vocabulary in float32 while the context lasts.

    In bfloat16 a logit near 20 is rounded to a multiple of 0.125, which moves a
    probability of 0.4 by up to 0.03; the hidden state holds more than that. Only the
    read positions are projected, so the float32 head costs little more than one cast
    of its weight per forward. A float32 model, or a head that is not a plain Linear, is
    left as it is.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.weight.dtype == torch.float32:
        yield
        return
    parent_name, _, attr = next(name for name, m in model.named_modules() if m is head).rpartition(".")
    parent = model.get_submodule(parent_name)
    setattr(parent, attr, _Float32Head(head))
    try:
        yield
    finally:
        setattr(parent, attr, head)


def default_batch_tokens(lm: ContinuousLM) -> int:
    """The chunk budget (rows x padded width) used when none is given.

    CPU (and any device without memory statistics): :data:`CPU_BATCH_TOKENS`. CUDA: half
    of the free memory over a per-token estimate: the KV cache of every layer, one
    layer's activations (hidden x 8 + intermediate x 4 values) and float32 attention
    scores over :data:`_ASSUMED_KEY_WIDTH` keys per head, at the model's element size.
    """
    device = lm.device
    if device.type != "cuda":
        return CPU_BATCH_TOKENS
    config = lm.model.config.get_text_config()
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    layers = int(config.num_hidden_layers)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    element = torch.finfo(lm.dtype).bits // 8
    per_token = element * (2 * layers * kv_heads * head_dim + 8 * hidden + 4 * intermediate) + 4 * heads * _ASSUMED_KEY_WIDTH
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(max(_ACCELERATOR_MEMORY_SHARE * free / per_token, 1024), 1 << 20))


def plan_chunks(lengths: Sequence[int], max_batch_tokens: int) -> list[tuple[int, int]]:
    """Split signals of ``lengths`` into consecutive chunks [lo, hi) of rows x longest <= budget.

    Input order is kept; a signal longer than the budget gets a chunk of its own.
    """
    chunks: list[tuple[int, int]] = []
    lo, longest = 0, 0
    for i, n in enumerate(lengths):
        wider = max(longest, n)
        if i > lo and (i - lo + 1) * wider > max_batch_tokens:
            chunks.append((lo, i))
            lo, wider = i, n
        longest = wider
    if lengths:
        chunks.append((lo, len(lengths)))
    return chunks


def shared_prefix_len(signals: Sequence[Signal], lm: ContinuousLM) -> int:
    """Tokens at the start that every signal shares (token, duration and time), leaving each at least one more."""
    limit = min(len(s) for s in signals) - 1
    if limit <= 0:
        return 0
    same = _same_tokens(signals, limit, lm)
    return int(same.long().cumprod(0).sum())


def _same_tokens(signals: Sequence[Signal], limit: int, lm: ContinuousLM) -> torch.Tensor:
    """bool [limit]: token i (i < limit) is the same input in every signal."""
    durations = torch.stack([s.durations[:limit] for s in signals])
    times = torch.stack([s.times[:limit] for s in signals])
    same = (durations == durations[:1]).all(0) & (times == times[:1]).all(0)
    if all(s.embeds is None for s in signals):
        ids = torch.stack([s.token_ids[:limit] for s in signals])  # type: ignore[index]
        return same & (ids == ids[:1]).all(0)
    # Compare what the model will see: embeddings in its state dtype, given or looked up.
    embedding = lm.model.get_input_embeddings()
    rows = []
    for s in signals:
        if s.embeds is not None:
            rows.append(s.embeds[:limit].to(device=lm.device, dtype=lm.state_dtype))
        else:
            assert s.token_ids is not None
            rows.append(embedding(s.token_ids[:limit].to(lm.device)).to(lm.state_dtype))
    stacked = torch.stack(rows)
    return same & (stacked == stacked[:1]).all(0).all(-1).cpu()


def _slice(signal: Signal, lo: int, hi: int) -> Signal:
    """Tokens [lo, hi) of ``signal`` at their own times."""
    return Signal(
        durations=signal.durations[lo:hi],
        token_ids=None if signal.token_ids is None else signal.token_ids[lo:hi],
        embeds=None if signal.embeds is None else signal.embeds[lo:hi],
        explicit_times=signal.times[lo:hi],
    )


def _tail(signal: Signal, start: int) -> Signal:
    return _slice(signal, start, len(signal))


def _check_signals(signals: Sequence[Signal]) -> list[Signal]:
    if isinstance(signals, Signal):
        raise SignalError("Engine takes a sequence of signals; wrap a single signal in a list")
    items = list(signals)
    if not items:
        raise SignalError("no signals given; the engine needs at least one")
    for i, s in enumerate(items):
        if not isinstance(s, Signal):
            raise SignalError(f"item {i} is a {type(s).__name__}, not a Signal")
    return items
