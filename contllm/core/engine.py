"""The one evaluation path: many signals, in chunks, a shared prefix computed once, read positions only.

A sweep evaluates one prompt under many edits (durations scaled by c, an interpolation
at alpha), so its signals usually agree on every token before the first edited one; a
run of many items with one template (few-shot examples, an instruction) agrees on the
template's opening. :class:`Engine` plans chunks that fit a memory budget (:func:`plan`:
input order, each chunk sharing its own longest prefix, or - when every signal shares
one - by length, every chunk sharing that prefix, whichever computes fewer tokens). The
shared prefix runs once with batch size 1 and is kept for the chunks after it; each
chunk continues with the rest of each signal as one left-padded batch whose queries
attend to the prefix keys without copying them (:mod:`contllm.core.prefix`), projecting only
the read columns (by default the last) onto the vocabulary.
:meth:`ContinuousLM.logits <contllm.lm.ContinuousLM.logits>` and ``probs`` run through
an :class:`Engine`, so a model gives the same numbers whichever way it is called.

The result equals evaluating every signal alone: the prefix keys are those the full
forward would compute, the padding between prefix and rest has duration 0 (absent from
attention), and the time mask spans prefix and new keys alike. Which signals share a
chunk changes the order of float sums, so results agree with one-by-one evaluation to
float rounding (about 1e-6 in float32), not bitwise.
"""

from __future__ import annotations

import math
import operator
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal, Protocol

import torch

from contllm.core import precision
from contllm.core.chunks import Chunk, cost, plan
from contllm.core.families import decoder_layers, final_norm, sizes
from contllm.core.forward import Context as Context  # re-exported: what forward_batch returns with a cache
from contllm.core.forward import evaluation as evaluation  # re-exported: every evaluation's context
from contllm.core.forward import forward_batch
from contllm.core.prefix import SharedPrefix, model_state, slice_signal
from contllm.core.signal import Signal, SignalBatch, pad_signals
from contllm.errors import SignalError
from contllm.internals.hooks import recorder

#: Which outputs to read: "last", "all", a token index, or a list of them (negative from each signal's end).
Positions = Literal["last", "all"] | int | Sequence[int]

#: Budget of a chunk on the CPU, in batch rows x padded width of the tokens computed (a
#: shared prefix, run once at batch size 1, is not counted per row). Measured on a 2-core
#: CPU with SmolLM2-135M: budgets from 2048 to 16384 ran at the same rate within noise
#: (1024 was ~15% slower), and 8192 kept the process under ~2 GB resident, model included.
CPU_BATCH_TOKENS = 8192

#: The time origin of a chunk is a multiple of this (see :func:`time_origin`): read
#: positions then stay below 16 plus the chunk's spread, where float32 has an ulp of at
#: most 1.9e-6 (up to 32) instead of 1.5e-5 near 180.
ORIGIN_STEP = 16

#: Share of the free accelerator memory that one chunk may take by the estimate below.
_ACCELERATOR_MEMORY_SHARE = 0.5
#: Key width assumed when estimating the attention scores of one token on an accelerator.
_ASSUMED_KEY_WIDTH = 512


class ContextLengthWarning(UserWarning):
    """A signal is longer, or reaches a later time, than the model's max_position_embeddings."""


#: Models already warned about their context length: the warning comes once per model.
_WARNED_LENGTH: weakref.WeakSet[Any] = weakref.WeakSet()


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


class EvaluatedModel(Protocol):
    """What the engine needs of a :class:`~contllm.lm.ContinuousLM` (typed here so that lm -> engine stays one-way)."""

    model: Any

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def state_dtype(self) -> torch.dtype: ...

    def patched(self, *, grad: bool = False) -> Any: ...

    def forward_batch(
        self,
        batch: SignalBatch,
        *,
        logits_to_keep: int | torch.Tensor = ...,
        context: Context | None = ...,
        use_cache: bool = ...,
        prefix: Any = ...,
        origin: float = ...,
    ) -> tuple[torch.Tensor, Context | None]:
        """One forward of a padded batch."""


class Engine:
    """Logits of many signals, batched, chunked and sharing their common prefix.

    lm: the model to evaluate (a ContinuousLM of any supported family, any dtype;
        outputs are float32, float64 for a float64 model). ``lm.logits`` and ``lm.probs``
        run through an engine with the defaults below, so both give the same numbers.
    max_batch_tokens: budget of one chunk in batch rows x padded width of the tokens it
        computes (a shared prefix counts once, not per row; :func:`contllm.core.chunks.plan`
        names the other limits of a chunk); None picks :data:`CPU_BATCH_TOKENS` on the
        CPU and an estimate from the free memory on an accelerator. A signal longer than
        the budget runs alone.
    prefix_cache: compute the prefix shared by a chunk's signals once (True) or run every
        signal in full, in input order (False); both give the same logits. The prefix is
        not used while a forward hook sits on a decoder layer or the final norm (such a
        hook may read the whole sequence, as contllm.pde's hidden smoothing does, and would
        see only the tokens after the prefix), nor while another attention function than
        the model's own is in place (contllm.pde's row dynamics): the rows after a prefix
        run the shared-prefix attention.
    float32_state: a half-precision (bfloat16, float16) model runs its matmuls in its own
        dtype and everything between them - residual stream, normalisations, rotary
        embedding, masks, attention - in float32 (:func:`contllm.core.precision.float32_state`;
        about half the distance to the float32 model of running it as stock, at nearly
        the same speed). False runs the model wholly in its own dtype. A float32 model is
        unaffected.
    keep_prefix: keep the last shared prefix after a call and reuse it in the next one when
        the next one's chunks start with the same tokens at the same time origin (a run
        evaluates its items in groups, each call sharing the same few-shot opening): the
        numbers are bitwise those of a fresh engine. It is dropped when the
        model's state has changed in between: a parameter or buffer replaced or edited in
        place (its version counter), a hook or forward override added or removed anywhere
        in the model, another attention implementation, dtype or device, or other settings
        of this engine (:func:`model_state`). An edit that bypasses the version counter
        (``weight.data.copy_(...)``) is not seen: keep the default False where the model is
        edited between calls that way. The runner's engine keeps its prefix.
    float32_projections: with ``float32_state``, the query and key projections also run
        in float32, on float32 copies of their weights (the family table's
        ``float32_projections``; measured in docs/speed.md: 0.26x the stock-bf16 distance on
        counting instead of 0.40x); False leaves them in half precision; None reads
        :data:`contllm.core.precision.FLOAT32_PROJECTIONS` (True).
    move_origin: on a model that sees positions only through their differences
        (``lm.relative_positions``: rotary families with fixed frequencies), evaluate each
        chunk with its time origin at its earliest read time, rounded down to a multiple
        of :data:`ORIGIN_STEP` (:func:`time_origin`), instead of at 0: exact in exact arithmetic, and float32
        positions near the read position are finer (a position near 180 has an ulp of
        1.5e-5, which rounds every fractional time by up to 7.6e-6; near 10, 9.5e-7).
        Chunks that reuse a shared prefix take the origin it was computed with. False
        keeps position ids equal to the times. Learned position tables, Phi-3's
        long-context rope and dynamic rope always run at origin 0, as do
        ``positions="all"`` reads.

    A half-precision model's read positions are projected onto the vocabulary in float32
    (see :func:`contllm.core.precision.float32_readout`); a float64 model's in float64, by its
    own head. After each call, ``last_stats``
    records what every chunk computed (:class:`EngineStats`).
    """

    def __init__(
        self,
        lm: EvaluatedModel,
        *,
        max_batch_tokens: int | None = None,
        prefix_cache: bool = True,
        float32_state: bool = True,
        float32_projections: bool | None = None,
        move_origin: bool = True,
        keep_prefix: bool = False,
    ) -> None:
        if not callable(getattr(lm, "forward_batch", None)) or not callable(getattr(lm, "patched", None)):
            raise TypeError(f"Engine needs a ContinuousLM, got {type(lm).__name__}")
        if max_batch_tokens is not None and (not isinstance(max_batch_tokens, int) or max_batch_tokens < 1):
            raise SignalError(f"max_batch_tokens must be a positive integer or None, got {max_batch_tokens!r}")
        self.lm = lm
        self.max_batch_tokens = max_batch_tokens if max_batch_tokens is not None else default_batch_tokens(lm)
        self.prefix_cache = prefix_cache
        self.float32_state = float32_state
        self.float32_projections = float32_projections
        self.move_origin = move_origin
        self.keep_prefix = keep_prefix
        self.last_stats: EngineStats | None = None
        self._kept: tuple[tuple[Any, ...], SharedPrefix] | None = None

    def __repr__(self) -> str:
        return (
            f"Engine({self.lm!r}, max_batch_tokens={self.max_batch_tokens}, prefix_cache={self.prefix_cache}, "
            f"float32_state={self.float32_state}, float32_projections={self.float32_projections}, "
            f"move_origin={self.move_origin}, keep_prefix={self.keep_prefix})"
        )

    # ------------------------------------------------------------------ public
    def logits(
        self,
        signals: Sequence[Signal],
        *,
        positions: Positions = "last",
        progress: Callable[[int], None] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Logits of each signal, float32 (float64 for a float64 model) on the CPU, in input order.

        positions: "last" -> [n, vocab]; an int or a list of k ints (token indices of
            each signal, negative from its end) -> [n, vocab] or [n, k, vocab]; "all" ->
            a list of n tensors [tokens_i, vocab].
        progress: called after each chunk with the number of signals finished so far.
        Inputs are checked before anything runs (:func:`check_inputs`): SignalError for
        a bad id, width or position, or a read position with nothing to attend to.
        """
        items = check_signals(signals)
        positions = normalize_positions(positions)
        reads = read_indices(items, positions)
        check_inputs(self.lm, items, reads)
        stats = EngineStats()
        out: list[Any] = [None] * len(items)
        state = model_state(self.lm, self._settings()) if self.keep_prefix else None
        reusable = self._kept[1] if self._kept is not None and self._kept[0] == state else None
        carried = reusable is not None  # kept from an earlier call: it must also have this call's origin
        self._kept = None
        done = 0
        with evaluation(self.lm, float32=self.float32_state, projections=self.float32_projections):
            for chunk in self._plan(items, reads):
                rows = [items[i] for i in chunk.rows]
                logits, reusable, chunk_stats = self._chunk(
                    rows, [reads[i] for i in chunk.rows], positions, chunk.prefix, reusable, carried
                )
                carried = carried and not chunk.prefix
                for i, row in zip(chunk.rows, logits):
                    out[i] = row
                stats.chunks.append(chunk_stats)
                done += len(rows)
                if progress is not None:
                    progress(done)
        if state is not None and reusable is not None:
            self._kept = (state, reusable)
        self.last_stats = stats
        return out if positions == "all" else torch.stack(out)

    def probs(
        self,
        signals: Sequence[Signal],
        *,
        positions: Positions = "last",
        token_ids: torch.Tensor | Sequence[int] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Next-token distributions (softmax over the full vocabulary), shaped and typed as :meth:`logits`.

        token_ids: long [k] to read the probabilities of only those tokens (the last
        dimension becomes k); None -> the whole distribution.
        """
        wanted = None
        if token_ids is not None:
            wanted = torch.as_tensor(token_ids)
            if wanted.ndim != 1 or wanted.is_floating_point() or wanted.is_complex():
                raise SignalError(f"token_ids must be a 1-D integer sequence, got shape {tuple(wanted.shape)}")
        logits = self.logits(signals, positions=positions, progress=progress)
        if isinstance(logits, list):
            return [_pick(torch.softmax(x, dim=-1), wanted) for x in logits]
        return _pick(torch.softmax(logits, dim=-1), wanted)

    def planned_cost(self, signals: Sequence[Signal], *, positions: Positions = "last") -> int:
        """What :meth:`logits` would compute for ``signals``, in tokens (:func:`contllm.core.chunks.cost`); nothing runs.

        The same chunks as a call would run: each computed prefix once, rows x padded width
        after it, and the planner's per-forward overhead. Inputs are checked as by :meth:`logits`.
        """
        items = check_signals(signals)
        reads = read_indices(items, normalize_positions(positions))
        check_inputs(self.lm, items, reads)
        return cost(self._plan(items, reads), [len(s) for s in items])

    def _settings(self) -> tuple[Any, ...]:
        return (self.prefix_cache, self.float32_state, self.float32_projections, self.move_origin)

    # ------------------------------------------------------------------ chunks
    def _plan(self, items: list[Signal], reads: list[list[int]]) -> list[Chunk]:
        use_prefix = self.prefix_cache and _prefix_safe(self.lm)
        vocab = int(self.lm.model.get_input_embeddings().weight.shape[0])
        return plan(items, reads, self.max_batch_tokens, self.lm, prefix=use_prefix, vocab=vocab)

    def _chunk(
        self,
        chunk: list[Signal],
        reads: list[list[int]],
        positions: Positions,
        p: int,
        reusable: SharedPrefix | None,
        carried: bool = False,
    ) -> tuple[list[torch.Tensor], SharedPrefix | None, ChunkStats]:
        lm = self.lm
        n = len(chunk)
        prefix = None
        computed = False
        moved = self.move_origin and positions != "all" and bool(getattr(lm, "relative_positions", False))
        origin = time_origin(chunk, reads) if moved else 0.0
        if p > 0:
            # A prefix kept from an earlier call serves only at the origin this chunk would take
            # itself, so that a call computes the same numbers whatever ran before it.
            computed = (
                reusable is None or not reusable.serves(chunk[0], p, lm) or (carried and reusable.origin != origin)
            )
            reusable = SharedPrefix.compute(lm, chunk[0], p, origin) if computed else reusable
            assert reusable is not None
            prefix = reusable.keys
            origin = reusable.origin
        rests = [slice_signal(s, p) for s in chunk]
        batch = pad_signals(rests, side="left")
        pad = [int(x) for x in batch.pad_left]
        stats = ChunkStats(n, p, computed, batch.width, tuple(len(s) for s in rests))
        dtype = precision.output_dtype(lm.dtype)
        if positions == "last":
            logits, _ = forward_batch(lm, batch, logits_to_keep=1, prefix=prefix, origin=origin)
            return list(logits[:, -1].to(dtype).cpu()), reusable, stats
        if positions == "all":
            logits, _ = forward_batch(lm, batch, logits_to_keep=0, prefix=prefix, origin=origin)
            return [logits[r, pad[r] :].to(dtype).cpu() for r in range(n)], reusable, stats
        # Columns of the padded batch that hold each signal's read positions.
        columns = torch.tensor([[pad[r] + i - p for i in row] for r, row in enumerate(reads)], dtype=torch.long)
        keep = torch.unique(columns)
        logits, _ = forward_batch(lm, batch, logits_to_keep=keep.to(lm.device), prefix=prefix, origin=origin)
        picked = logits.to(dtype).cpu()[torch.arange(n)[:, None], torch.searchsorted(keep, columns)]
        return list(picked[:, 0] if isinstance(positions, int) else picked), reusable, stats


# ---------------------------------------------------------------------- helpers
def time_origin(signals: Sequence[Signal], reads: Sequence[Sequence[int]]) -> float:
    """The time origin of a chunk: its earliest read time, rounded down to a multiple of :data:`ORIGIN_STEP`.

    Integer times stay integers (exact in float32) after the move, and the read
    positions land in [0, ORIGIN_STEP + the spread of the chunk's read times). The
    coarse step gives signals read at nearby times the same origin whichever chunk they
    fall in, so a batch and its signals run one by one round their positions alike.
    """
    earliest = min(float(s.times[i]) for s, row in zip(signals, reads) for i in row)
    return float(ORIGIN_STEP * math.floor(earliest / ORIGIN_STEP))


def default_batch_tokens(lm: EvaluatedModel) -> int:
    """The chunk budget (rows x padded width) used when none is given.

    CPU (and any device without memory statistics): :data:`CPU_BATCH_TOKENS`. CUDA: half
    of the free memory over a per-token estimate: the KV cache of every layer, one
    layer's activations (hidden x 8 + intermediate x 4 values) and float32 attention
    scores over :data:`_ASSUMED_KEY_WIDTH` keys per head, at the model's element size.
    """
    device = lm.device
    if device.type != "cuda":
        return CPU_BATCH_TOKENS
    size = sizes(lm)
    element = torch.finfo(lm.dtype).bits // 8
    per_token = (
        element * (2 * size.layers * size.kv_heads * size.head_dim + 8 * size.hidden + 4 * size.intermediate)
        + 4 * size.heads * _ASSUMED_KEY_WIDTH
    )
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(max(_ACCELERATOR_MEMORY_SHARE * free / per_token, 1024), 1 << 20))


def check_signals(
    signals: Signal | Sequence[Signal], *, single_ok: bool = False, evaluated: bool = True
) -> list[Signal]:
    """``signals`` as a list of Signal objects (also one Signal alone with ``single_ok``), each checked for evaluation.

    The one gate every entry point that runs signals goes through (the engine,
    ``lm.logits``, run_with_cache, run_with_hooks, hooks, gradients, forward_kwargs, trace,
    generate), before anything is batched or run. SignalError, naming the signal, for
    anything but Signal objects, for values a signal's tensors got by an in-place edit
    (:meth:`Signal.check_values <contllm.core.signal.Signal.check_values>`: durations finite and
    >= 0, times finite and within +-MAX_TIME, embeds finite) and, when ``evaluated``, for a
    signal whose every token has duration 0 (nothing to attend to: its output is undefined).
    ``evaluated=False`` (``lm.embed``) keeps such a signal.
    """
    if isinstance(signals, Signal):
        if not single_ok:
            raise SignalError("Engine takes a sequence of signals; wrap a single signal in a list")
        items = [signals]
    elif isinstance(signals, (str, bytes)):
        raise SignalError(
            f"signals must be a Signal or a list of them, got the string {signals[:40]!r}; "
            "build a signal from text with lm.signal(text)"
        )
    elif not isinstance(signals, Iterable):
        raise SignalError(f"signals must be a Signal or a list of them, got {type(signals).__name__}")
    else:
        items = list(signals)
    if not items:
        raise SignalError("no signals given; the engine needs at least one")
    for i, s in enumerate(items):
        if not isinstance(s, Signal):
            raise SignalError(f"signals: item {i} is a {type(s).__name__}, not a Signal")
    for k, s in enumerate(items):
        name = "signal" if len(items) == 1 else f"signals[{k}]"
        s.check_values(name)
        if evaluated and not bool((s.durations > 0).any()):
            raise SignalError(f"{name}: every token has duration 0: nothing to attend to, the output is undefined")
    return items


def normalize_positions(positions: Any) -> Literal["last", "all"] | int | list[int]:
    """``positions`` as "last", "all", an int or a list of ints; SignalError naming anything else.

    Python, NumPy and 0-d torch integers are taken; floats (2.5), booleans and other
    strings than "last" and "all" are not.
    """
    bad = SignalError(
        f"positions must be 'last', 'all', a token index or a list of token indices (integers), got {positions!r}"
    )
    if isinstance(positions, str):
        if positions == "last":
            return "last"
        if positions == "all":
            return "all"
        raise bad
    if isinstance(positions, bool):
        raise bad
    try:
        return operator.index(positions)
    except TypeError:
        pass
    if not isinstance(positions, Iterable) or isinstance(positions, bytes):
        raise bad
    out = []
    for p in positions:
        if isinstance(p, bool):
            raise bad
        try:
            out.append(operator.index(p))
        except TypeError:
            raise bad from None
    return out


def check_inputs(lm: EvaluatedModel, signals: Sequence[Signal], reads: Sequence[Sequence[int]]) -> None:
    """Check ``signals`` (as :func:`check_signals` returned them) against the model before anything runs.

    SignalError for a token id outside the vocabulary, embeds of the wrong width, or a
    read position that sees no token of positive duration (every token at or before its
    time has duration 0: the attention integral is 0/0, so its output is undefined; a
    signal whose every token has duration 0 is refused by :func:`check_signals` already).
    A signal longer than the model's ``max_position_embeddings``, or reaching a later
    time, gets a :class:`ContextLengthWarning`, once per model.
    """
    weight = lm.model.get_input_embeddings().weight
    vocab, hidden = int(weight.shape[0]), int(weight.shape[-1])
    for k, (s, read) in enumerate(zip(signals, reads)):
        name = "signal" if len(signals) == 1 else f"signals[{k}]"
        s.check_for_model(vocab_size=vocab, hidden_size=hidden, name=name)
        blind = s.blind_positions(read)
        if blind:
            i = blind[0]
            raise SignalError(
                f"{name}: position {i} (time {float(s.times[i]):g}) sees no token of positive duration (every "
                "token at or before its time has duration 0): nothing to attend to, its output is undefined; "
                "read another position or give an earlier token a positive duration"
            )
    _warn_length(lm.model, signals)


def _warn_length(model: Any, signals: Sequence[Signal]) -> None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or model in _WARNED_LENGTH:
        return
    length = max(len(s) for s in signals)
    latest = max(s.end for s in signals)
    if length <= limit and latest <= limit - 1:
        return
    _WARNED_LENGTH.add(model)
    warnings.warn(
        f"signals of up to {length} tokens reaching time {latest:g} go beyond the model's "
        f"max_position_embeddings of {limit} (positions 0 to {limit - 1}): the model was never trained there "
        "and its outputs may mean nothing (this warning is shown once per model)",
        ContextLengthWarning,
        stacklevel=_user_stacklevel(),
    )


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised by the caller at the first frame outside contllm."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def read_indices(signals: Sequence[Signal], positions: Positions) -> list[list[int]]:
    """The token indices read of each signal, each in [0, len): SignalError for one outside a signal.

    positions: "last", "all", an index or a list of indices (negative ones count from each
    signal's end), as :func:`contllm.core.signal.normalize_positions` takes them.
    """
    positions = normalize_positions(positions)
    if positions == "last":
        return [[len(s) - 1] for s in signals]
    if positions == "all":
        return [list(range(len(s))) for s in signals]
    wanted = [positions] if isinstance(positions, int) else list(positions)
    if not wanted:
        raise SignalError("positions is an empty list")
    out = []
    for s in signals:
        n = len(s)
        bad = [p for p in wanted if not -n <= p < n]
        if bad:
            raise SignalError(f"position {bad[0]} is outside a signal of {n} tokens (valid: {-n} to {n - 1})")
        out.append([p % n for p in wanted])
    return out


def _prefix_safe(lm: EvaluatedModel) -> bool:
    """Whether a shared prefix gives the same logits as full forwards on ``lm`` as it is now patched.

    Not while a forward hook sits on a decoder layer or the final norm (it may read the
    whole sequence; transformers' own output recorders excepted, see :func:`~contllm.internals.hooks.recorder`), nor while an attention function other than the model's own (or the
    float32 state's) is in place: the rows after a shared prefix run the shared-prefix
    attention instead (contllm.pde's row dynamics would be skipped).
    """
    model = lm.model
    modules = [*decoder_layers(model), final_norm(model)]
    if any(
        not recorder(hook) for m in modules for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
    ):
        return False
    own = {getattr(lm, "attn_implementation", None), precision.IMPLEMENTATION}
    return getattr(model.config, "_attn_implementation", None) in own


def _pick(probs: torch.Tensor, wanted: torch.Tensor | None) -> torch.Tensor:
    """The columns ``wanted`` of the last dimension (all of them for None), checked against the vocabulary."""
    if wanted is None:
        return probs
    vocab = probs.shape[-1]
    if wanted.numel() and (int(wanted.min()) < 0 or int(wanted.max()) >= vocab):
        raise SignalError(
            f"token_ids must lie in [0, {vocab}); got values from {int(wanted.min())} to {int(wanted.max())}"
        )
    return probs[..., wanted.long()]
