"""Running signals with hooks: read activations (:func:`run_with_cache`), edit them (:func:`run_with_hooks`, :func:`patch`).

The activation names are TransformerLens's, resolved through the family table
(:mod:`contllm.internals.hookpoints` lists them with their shapes); hooks are installed and removed
by :func:`contllm.internals.intervention.hooks`, the one place that does it. Every call runs one
padded forward of the whole batch (:func:`contllm.pad_signals`, left padding) through
:func:`contllm.core.forward.forward_batch` inside the
engine's evaluation context, the forward ``lm.logits`` runs. Where the signals share a
prefix of :data:`MIN_SHARED_PREFIX` tokens or more before the first read position and no
gradient is kept, that prefix runs once and the rest as one batch after it, while the
hooks still see every position of every signal (:mod:`contllm.internals.prefixed`, which
also says when a hook's edit sends the call back to the full forward). Split very large
batches yourself.

A cache keeps, per signal and name, the values at the read positions (k of them, out of
the signal's ``tokens``): [k, *shape] for the per-position points ([k, hidden] for the
residual stream, [k, heads, head_dim] for ``attn.hook_z``, ...), and [heads, k, tokens] for
``attn.hook_pattern``, ``hook_attn_scores`` and ``hook_duration_bias`` (queries at the read
positions, keys over the whole signal, padding removed), in float64 for a float64 model and
float32 otherwise (:func:`cache_dtype`), on the CPU. The pattern is the continuous
attention's: the softmax of the scores plus the log-duration bias and the time mask, so
padding and keys later in time get probability 0 and a key of duration d weighs as d
tokens; keys are in token order (time order for a signal whose times increase).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import torch

from contllm.core.engine import Positions, check_inputs, check_signals, evaluation, normalize_positions, read_indices
from contllm.core.families import model_of
from contllm.core.forward import forward_batch, mask_dtype
from contllm.core.precision import IMPLEMENTATION
from contllm.core.prefix import SharedKeys, SharedPrefix, shared_prefix_len, slice_signal
from contllm.core.signal import Signal, SignalBatch, pad_signals
from contllm.errors import SignalError
from contllm.internals import hooked_attention
from contllm.internals.activation_cache import ActivationCache
from contllm.internals.binding import OPEN
from contllm.internals.hookpoints import Point, hook_names, point, points, resolve_names
from contllm.internals.hooks import foreign_hooks
from contllm.internals.intervention import Hook, HookFn, added_hooks, hooks
from contllm.internals.prefixed import SHARED, Layout, PrefixChanged, reads_rest, suspended

if TYPE_CHECKING:  # only in annotations, which are strings at run time
    from typing_extensions import TypeIs

__all__ = [
    "ActivationCache",
    "Patch",
    "activation_names",
    "align_positions",
    "cache_dtype",
    "hooked_logits",
    "next_token_loss",
    "patch",
    "recording",
    "run_with_cache",
    "run_with_hooks",
]

#: What ``run_with_hooks`` returns: the logits, the next-token loss, or nothing (the hooks' side effects only).
ReturnType = Literal["logits", "loss"] | None
RETURN_TYPES = ("logits", "loss", None)


def cache_dtype(lm: Any) -> torch.dtype:
    """The dtype a cache keeps ``lm``'s activations in: float64 for a float64 model, float32 for any other."""
    return torch.float64 if lm.dtype == torch.float64 else torch.float32


def activation_names(lm: Any) -> list[str]:
    """Every activation name of ``lm`` (a ContinuousLM or a transformers model), in forward order (:mod:`contllm.internals.hookpoints`)."""
    return hook_names(lm)


def _columns(batch: SignalBatch, reads: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The padded batch's column of each read token index, per row (left padding)."""
    return [int(batch.pad_left[b]) + torch.tensor(list(r), dtype=torch.long) for b, r in enumerate(reads)]


def forward_reads(
    lm: Any,
    batch: SignalBatch,
    reads: Sequence[Sequence[int]],
    signals: Sequence[Signal] | None = None,
    *,
    prefix: SharedKeys | None = None,
) -> list[torch.Tensor]:
    """One forward of a padded batch (inside an evaluation context): logits [k_i, vocab] per row at its read positions.

    Only the read columns go through the vocabulary projection. On the CPU, in the dtype the
    evaluation context's read-out gives, float32 at least (the dtype ``lm.logits`` returns);
    with gradients enabled the result stays in the autograd graph. signals: those ``batch``
    pads; where given, a forward without gradients inside hook contexts runs a prefix they
    share once (:func:`prefixed_reads`). prefix: the keys of a prefix every row continues
    (``batch`` holds the tokens after it, ``reads`` count from its end)."""
    if signals is not None and prefix is None and not torch.is_grad_enabled():
        rows = prefixed_reads(lm, signals, reads)
        if rows is not None:
            return rows
    columns = _columns(batch, reads)
    kept = torch.tensor(sorted({int(c) for row in columns for c in row}), dtype=torch.long)
    with suspended(model_of(lm)) if prefix is None else nullcontext():
        logits, _ = forward_batch(lm, batch, logits_to_keep=kept.to(lm.device), prefix=prefix)
    at = {int(c): i for i, c in enumerate(kept)}
    dtype = torch.promote_types(logits.dtype, torch.float32)
    return [logits[b, [at[int(c)] for c in columns[b]]].to(device="cpu", dtype=dtype) for b in range(len(batch))]


#: The shortest shared prefix a hooked forward runs once (tokens); a shorter one runs in the full batch.
MIN_SHARED_PREFIX = 16


def shareable_prefix(lm: Any, signals: Sequence[Signal], before: int | None) -> int:
    """The prefix of ``signals`` a forward may run once (tokens; 0: none): the one they share before token ``before``,
    where it has :data:`MIN_SHARED_PREFIX` tokens or more, the model runs its own attention (hooked or not) and no
    torch hook registered outside contllm would see the rows after it alone."""
    net = model_of(lm)
    if hooked_attention.underlying(net) not in {lm.attn_implementation, IMPLEMENTATION} or foreign_hooks(net):
        return 0
    p = shared_prefix_len(signals, lm, before=before)
    return p if p >= MIN_SHARED_PREFIX else 0


def prefixed_reads(lm: Any, signals: Sequence[Signal], reads: Sequence[Sequence[int]]) -> list[torch.Tensor] | None:
    """:func:`forward_reads` of ``signals`` with the prefix they share run once (:mod:`contllm.internals.prefixed`);
    None where that does not serve: fewer than two signals, no hook context open, backward hooks, no prefix
    :func:`shareable_prefix` takes before the first read, or a hook function that changed a value of the prefix."""
    net = model_of(lm)
    runs = OPEN.get(net, [])
    if len(signals) < 2 or not runs or net in SHARED or any(r.bwd for r in runs):
        return None
    first = min(min(row) for row in reads if len(row)) if any(len(row) for row in reads) else None
    p = shareable_prefix(lm, signals, first)
    if not p:
        return None
    rests = pad_signals([slice_signal(s, p) for s in signals])
    layout = Layout(p, rests.pad_left.clone(), rests.width, hidden=torch.finfo(mask_dtype(lm)).min)
    SHARED[net] = layout
    try:
        keys = SharedPrefix.compute(lm, signals[0], p).keys
        layout.recording = False
        return forward_reads(lm, rests, [[i - p for i in row] for row in reads], prefix=keys)
    except PrefixChanged:
        return None
    finally:
        SHARED.pop(net, None)


#: The duration a real token of duration 0 runs at in a forward that differentiates in durations.
RIGHT_SIDED = torch.finfo(torch.float32).tiny


def _real_zeros(batch: SignalBatch) -> torch.Tensor:
    """bool [batch, tokens]: the tokens of duration 0 that are not padding."""
    columns = torch.arange(batch.width)[None, :]
    return (columns >= batch.pad_left[:, None]) & (batch.durations == 0)


def _after(signal: Signal, steps: torch.Tensor) -> float:
    """A step of time past float64's rounding of the signal's largest time: what "a hair after" adds."""
    return (abs(signal.start) + float(steps.detach().abs().sum()) + 1.0) * 2.0**-44


def differentiable_batch(lm: Any, signals: Sequence[Signal], *, durations: bool = False) -> SignalBatch:
    """``signals`` left-padded, with input embeddings (and, with ``durations``, durations) that are autograd leaves.

    The embeddings are the model's own ([batch, width, hidden], zero padding, float32 at
    least) and require gradients, so that a forward records its graph; the times follow the
    durations (t = start + cumulative sum) for signals whose times are not explicit, so that
    a duration's gradient includes the times it moves.

    With ``durations``, a gradient at duration 0 is the right-sided derivative, which is
    finite: key j enters attention with the weight d_j exp(s_ij), linear in d_j, so
    d (log p) / d d_j tends, as d_j -> 0+, to the sum over the queries that see j of
    exp(s_ij) / Z_i times the derivative of the loss by the weight. At d_j = 0 exactly the
    bias log(d_j) is -inf, the mask hides the key and autograd would keep only the part
    that moves later tokens' times. So each real token of duration 0 runs at
    :data:`RIGHT_SIDED` (float32's smallest normal number, 1.2e-38: the bias log(d) =
    -87.3, whose gradient 1 / d turns the vanishing weight into the limit), and where
    times follow durations it starts a hair (:func:`_after`) after the tokens before it,
    as it does for any d > 0: queries at the earlier time do not see it, itself and later
    tokens do. The values read are those at duration 0, unless such a key's score exceeds
    every other score of its query by more than about 70 (a weight 1.2e-38 * exp(70) =
    3e-8 of the row's largest). Padding keeps duration 0; the gradient reaches the
    durations unchanged (both shifts are constants where d = 0).
    """
    batch = pad_signals(list(signals))
    rows = lm.embed(list(signals))
    dtype = torch.promote_types(lm.dtype, torch.float32)
    embeds = torch.zeros(len(batch), batch.width, rows[0].shape[-1], dtype=dtype)
    for b, e in enumerate(rows):
        embeds[b, int(batch.pad_left[b]) :] = e.detach().to(device="cpu", dtype=dtype)
    lengths = batch.durations.clone().requires_grad_(durations)
    zero = _real_zeros(batch) if durations else torch.zeros_like(batch.durations, dtype=torch.bool)
    lengths = lengths + RIGHT_SIDED * zero.to(lengths.dtype)
    times = []
    for b, s in enumerate(signals):
        pad = int(batch.pad_left[b])
        if s.explicit_times is not None:
            times.append(batch.times[b])
        else:
            start = torch.full((pad,), s.start, dtype=lengths.dtype)
            # each token of duration 0 starts a hair after the tokens before it, as for d -> 0+
            steps = lengths[b, pad:] + _after(s, lengths[b, pad:]) * zero[b, pad:].to(lengths.dtype)
            times.append(torch.cat([start, s.start + torch.cumsum(steps, dim=0)]))
    return replace(
        batch,
        durations=lengths,
        times=torch.stack(times),
        embeds=embeds.requires_grad_(True),
        has_embeds=torch.ones(len(batch), dtype=torch.bool),
    )


def shaped(rows: list[torch.Tensor], positions: Positions) -> torch.Tensor | list[torch.Tensor]:
    """Per-signal logits [k, vocab] shaped as ``lm.logits`` returns them for ``positions``."""
    wanted = normalize_positions(positions)
    if wanted == "all":
        return rows
    stacked = torch.stack(rows)
    return stacked[:, 0] if wanted == "last" or isinstance(wanted, int) else stacked


def run_with_cache(
    lm: Any,
    signals: Signal | Sequence[Signal],
    *,
    names: Any = None,
    positions: Positions = "all",
    names_filter: Any = None,
    remove_batch_dim: bool = False,
) -> ActivationCache:
    """Run ``signals`` through ``lm`` (a ContinuousLM) once and keep the named activations at the read positions.

    names: activation names (:mod:`contllm.internals.hookpoints`), short forms (``("resid_post", 5)``)
        or predicates ``fn(name) -> bool``, one or a list; None keeps every one. Only these
        are hooked, and each keeps only the read positions.
    names_filter: the same, under TransformerLens's name (a name, a list of names or a
        predicate); give ``names`` or ``names_filter``, not both.
    positions: "all" (every token), "last", a token index or a list of token indices
        (negative from each signal's end), as for ``lm.logits``.
    remove_batch_dim: for one signal, a cache whose ``cache[name]`` drops the batch
        dimension (:meth:`~contllm.internals.activation_cache.ActivationCache.remove_batch_dim`).
    Returns an :class:`~contllm.internals.activation_cache.ActivationCache`: one tensor per signal and
    name, on the CPU, in float64 for a float64 model and float32 otherwise
    (:func:`cache_dtype`), with each read position's time and logits (in the dtype ``lm.logits`` gives).

    Hooks of an enclosing :func:`contllm.internals.intervention.hooks` (or :func:`patch`) context
    apply, and the values cached are those after them; that context must be made for these
    very signals (SignalError naming what differs otherwise). Hooks added with
    ``lm.add_hook`` apply too. Attention points run the hooked eager attention function
    on the layers they read (same logits to float rounding); a forward without them keeps
    the model's own attention. Raises SignalError for an unknown name, both ``names`` and
    ``names_filter``, a bad position, ``remove_batch_dim`` with several signals, or a
    signal ``lm.logits`` would refuse.
    """
    if names is not None and names_filter is not None:
        raise SignalError("give names or names_filter (its TransformerLens name), not both")
    names = names_filter if names is None else names
    items = check_signals(signals, single_ok=True)
    if remove_batch_dim and len(items) != 1:
        raise SignalError(f"remove_batch_dim needs one signal; {len(items)} were given")
    wanted = hook_names(lm) if names is None else _names(lm, names)
    reads = read_indices(items, positions)
    check_inputs(lm, items, reads)
    batch = pad_signals(items)
    with recording(lm, items, wanted, reads) as stored, evaluation(lm):
        rows = forward_reads(lm, batch, reads, items)
    times = [s.times[r] for s, r in zip(items, reads)]
    cache = ActivationCache(stored, reads, times, rows, lm)
    return cache.remove_batch_dim() if remove_batch_dim else cache


def _names(lm: Any, names: Any) -> list[str]:
    if isinstance(names, (list, tuple)) and not names:
        raise SignalError(
            "names is an empty list; give activation names (see contllm.internals.activations.activation_names)"
        )
    return resolve_names(lm, names)


def run_with_hooks(
    lm: Any,
    signals: Signal | Sequence[Signal],
    *,
    fwd_hooks: Any = (),
    bwd_hooks: Any = (),
    positions: Positions | None = None,
    grad: bool = False,
    return_type: ReturnType = "logits",
) -> torch.Tensor | list[torch.Tensor] | None:
    """Logits (or the loss) of ``signals`` with hook functions at named activations, for this one forward.

    fwd_hooks: (target, fn) pairs; target an activation name, a short form
        (``("resid_post", 5)``), a predicate ``fn(name) -> bool`` or a list of them; fn
        ``(activation, hook) -> replacement or None`` gets the whole padded batch's values
        (:mod:`contllm.internals.hookpoints` lists their shapes) and a :class:`~contllm.internals.hookrun.Hook`
        (its name, layer, and the batch's times and durations per column).
    bwd_hooks: (target, fn) pairs with fn(grad, hook) -> replacement or None, run when a
        gradient passes through the activation (call ``.backward()`` on the returned logits).
    positions: as for ``lm.logits`` (None: "last"); the result has its shapes and dtype (CPU).
    grad: keep the autograd graph (implied by bwd_hooks, and by backward hooks added with
        ``lm.add_hook``); off by default, so evaluation runs in inference mode as
        ``lm.logits`` does. The model's parameters take no gradients.
    return_type: "logits" (the default); "loss", TransformerLens's: the mean next-token
        cross-entropy (a scalar) over every real position of every signal that has a
        next token, pooled over the batch (:func:`next_token_loss`; padding is never read;
        every position is read, so leave ``positions`` out); None: run for the hooks' side
        effects and return None.

    Every hook is removed when the call returns or raises. Hooks of an enclosing
    ``lm.hooks`` context (made for these very signals) and hooks added with ``lm.add_hook``
    apply first. UnsupportedModelError when the forward never reached a hooked name;
    SignalError for an unknown name, a bad position, hooks that are not a list of (target,
    fn) pairs, a target that is no name or predicate, a hook function returning anything
    but None or a float tensor of the value's shape
    (:func:`contllm.internals.hookrun.replacement`), a return_type of another kind, a
    loss of signals without token ids or without two tokens, or a signal ``lm.logits``
    would refuse.
    """
    if return_type is not None and (not isinstance(return_type, str) or return_type not in RETURN_TYPES):
        raise SignalError(f"return_type must be 'logits', 'loss' or None, got {return_type!r}")
    single = isinstance(signals, Signal)
    items = check_signals(signals, single_ok=True)
    if return_type == "loss":
        if positions is not None:
            raise SignalError("return_type='loss' reads every position; leave positions out")
        _check_loss(items)
    wanted: Positions = ("all" if return_type == "loss" else "last") if positions is None else positions
    reads = read_indices(items, wanted)
    check_inputs(lm, items, reads)
    keep = bool(grad) or bool(bwd_hooks) or bool(added_hooks(lm, "bwd"))
    rows = _hooked_rows(lm, items, reads, fwd_hooks, bwd_hooks, keep)
    if return_type is None:
        return None
    if return_type == "loss":
        return next_token_loss(items, rows)
    out = shaped(rows, wanted)
    return out[0] if single else out


def hooked_logits(lm: Any, signals: Signal | Sequence[Signal], positions: Positions = "last") -> Any:
    """``lm.logits`` while hooks are on (:func:`contllm.internals.binding.hooks_on`): one padded forward of
    ``signals`` through the hooks (no engine: no chunks, no reordering; a shared prefix as :func:`forward_reads` runs
    it), shaped as ``lm.logits``
    gives them, without the autograd graph."""
    single = isinstance(signals, Signal)
    items = check_signals(signals, single_ok=True)
    reads = read_indices(items, positions)
    check_inputs(lm, items, reads)
    out = shaped(_hooked_rows(lm, items, reads, (), (), False), positions)
    return out[0] if single else out


def _hooked_rows(
    lm: Any, items: list[Signal], reads: list[list[int]], fwd_hooks: Any, bwd_hooks: Any, keep: bool
) -> list[torch.Tensor]:
    """The logits at ``reads`` of one padded forward of ``items`` with hooks (in the autograd graph with ``keep``)."""
    batch = differentiable_batch(lm, items) if keep else pad_signals(items)
    with hooks(lm, items, fwd_hooks, bwd_hooks) as state, evaluation(lm, grad=keep):
        rows = forward_reads(lm, batch, reads, items)
    state.check_reached()
    return rows


def _check_loss(signals: Sequence[Signal]) -> None:
    """SignalError unless every signal has token ids (the targets) and one of them has a next token to predict."""
    given = [b for b, s in enumerate(signals) if s.token_ids is None]
    if given:
        raise SignalError(
            f"return_type='loss' needs token ids to predict; signal {given[0]} is given only as embeddings"
        )
    if all(len(s) < 2 for s in signals):
        raise SignalError("return_type='loss' needs a signal of at least two tokens (a next token to predict)")


def next_token_loss(signals: Sequence[Signal], logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """TransformerLens's loss: the mean over every (position, next token) pair of the batch of -log p(next token).

    signals: each with token ids; logits: [tokens_i, vocab] per signal (every position, no
    padding). Position j of a signal predicts its token j + 1, so a signal of n tokens gives
    n - 1 terms; the mean pools them over the batch (sum / count, as TransformerLens's
    ``lm_cross_entropy_loss`` with an attention mask). A float32 scalar, in the logits'
    autograd graph when they have one.
    """
    _check_loss(signals)
    total: torch.Tensor | float = 0.0
    count = 0
    for s, rows in zip(signals, logits):
        if len(s) < 2:
            continue
        assert s.token_ids is not None
        log_probs = torch.log_softmax(rows[:-1].to(torch.promote_types(rows.dtype, torch.float32)), dim=-1)
        total = total + log_probs.gather(-1, s.token_ids[1:, None].to(log_probs.device)).sum()
        count += len(s) - 1
    assert isinstance(total, torch.Tensor)
    return -total / count


@contextmanager
def recording(
    lm: Any, signals: Sequence[Signal], names: Sequence[str], reads: Sequence[Sequence[int]]
) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Keep the named activations of the forward run inside the context: yields {name: one tensor per signal}.

    The forward must be of ``signals`` left-padded by :func:`contllm.pad_signals` (the
    batch :func:`run_with_cache` runs, or their tails after a shared prefix); ``reads``
    holds the token indices kept of each signal. The dict is filled on exit, in the order of
    ``names``, with the values the module docstring describes (:func:`cache_dtype`, CPU).
    UnsupportedModelError when the forward never reached a name; hooks are removed on exit,
    also when the body raises.
    """
    batch = pad_signals(list(signals))
    columns = _columns(batch, reads)
    starts = [int(p) for p in batch.pad_left]
    stored: dict[str, list[torch.Tensor]] = {}
    dtype = cache_dtype(lm)

    def keep(p: Point) -> HookFn:
        def read(h: torch.Tensor, shift: int) -> None:
            """The read columns of ``h``, whose query positions start ``shift`` columns into the padded batch."""
            at = [(columns[b] - shift).to(h.device) for b in range(len(h))]
            rows = [h[b][:, at[b], starts[b] :] if p.axis == "pattern" else h[b, at[b]] for b in range(len(h))]
            stored[p.name] = [r.detach().to(device="cpu", dtype=dtype) for r in rows]

        def fn(h: torch.Tensor, hook: Hook) -> None:
            read(h, 0)

        # After a shared prefix every read column lies in the rest, its prefix's columns removed.
        return reads_rest(fn, lambda h, layout: read(h, layout.length))

    found: dict[str, list[torch.Tensor]] = {}
    known = points(lm)
    with hooks(lm, list(signals), [(name, keep(known.get(name) or point(lm, name))) for name in names]) as state:
        yield found
    state.check_reached()
    found.update((name, stored[name]) for name in names)


# ---------------------------------------------------------------------- patching


@dataclass(frozen=True)
class Patch:
    """New values for one named activation at chosen positions of each signal.

    name: a per-position activation name (not a pattern, score or duration bias: edit those
        with a hook function, :func:`run_with_hooks`).
    positions: token indices, one list per signal (or one list for every signal);
        negative counts from a signal's end.
    values: one tensor per signal, [k_i, *shape] (k_i = len(positions_i), shape the
        point's own: [hidden] for the residual stream, [heads, head_dim] for
        ``attn.hook_z``), or a tensor [batch, k, *shape] (or [k, *shape] for every signal);
        e.g. ``cache.rows(name)`` of another run, picked with :func:`align_positions` when
        token counts differ.
    mode: "replace" the activation there, or "add" to it.
    """

    name: str
    positions: Sequence[int] | Sequence[Sequence[int]]
    values: torch.Tensor | Sequence[torch.Tensor]
    mode: Literal["replace", "add"] = "replace"


def _one_list_per_signal(positions: Sequence[int] | Sequence[Sequence[int]]) -> TypeIs[Sequence[Sequence[int]]]:
    """Whether ``positions`` is a list of position lists (one per signal) rather than one list for every signal."""
    given = list(positions)
    return bool(given) and all(isinstance(p, Sequence) and not isinstance(p, str) for p in given)


def _patch_rows(item: Patch, signals: Sequence[Signal], shape: tuple[int, ...]) -> list[tuple[list[int], torch.Tensor]]:
    """(token indices, values [k, *shape]) per signal of ``item``; SignalError naming what does not fit."""
    count = len(signals)
    positions = item.positions
    if _one_list_per_signal(positions):
        if len(positions) != count:
            raise SignalError(f"{item.name}: {len(positions)} position lists for {count} signals")
        per_signal = [list(p) for p in positions]
    else:
        per_signal = [list(positions)] * count
    values = item.values
    trailing = ", ".join(str(s) for s in shape)
    if isinstance(values, torch.Tensor):
        if values.ndim == len(shape) + 1:
            values = [values] * count
        elif values.ndim == len(shape) + 2 and values.shape[0] == count:
            values = list(values)
        else:
            raise SignalError(
                f"{item.name}: values of shape {tuple(values.shape)}; give [k, {trailing}], [{count}, k, {trailing}] "
                f"or one [k, {trailing}] tensor per signal"
            )
    values = list(values)
    if len(values) != count:
        raise SignalError(f"{item.name}: {len(values)} value tensors for {count} signals")
    out = []
    for b, (s, wanted, v) in enumerate(zip(signals, per_signal, values)):
        indices = read_indices([s], wanted)[0] if len(wanted) else []
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != (len(indices), *shape):
            got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise SignalError(
                f"{item.name}: signal {b} has {len(indices)} patched positions and values of shape [{trailing}] "
                f"per position, so its values must be [{len(indices)}, {trailing}], got {got}"
            )
        out.append((indices, v))
    return out


def _patcher(mode: str, columns: list[torch.Tensor], values: list[torch.Tensor]) -> HookFn:
    """A hook function that writes ``values`` at ``columns`` of each row (or adds them there)."""

    def edit(h: torch.Tensor, hook: Hook) -> torch.Tensor:
        h = h.clone()
        for b, (cols, v) in enumerate(zip(columns, values)):
            if not len(cols):
                continue
            cols = cols.to(h.device)
            v = v.to(device=h.device, dtype=h.dtype)
            h[b, cols] = v if mode == "replace" else h[b, cols] + v
        return h

    return edit


def patch_hooks(lm: Any, signals: Sequence[Signal], patches: Patch | Sequence[Patch]) -> list[tuple[str, HookFn]]:
    """The (name, hook function) pairs that apply ``patches`` to a forward of ``signals``; SignalError for a bad patch."""
    edits = [patches] if isinstance(patches, Patch) else list(patches)
    batch = pad_signals(list(signals))
    out: list[tuple[str, Callable[..., Any]]] = []
    for item in edits:
        if not isinstance(item, Patch):
            raise SignalError(f"patches must be Patch objects, got {type(item).__name__}")
        target = point(lm, item.name)
        if target.axis == "pattern":
            raise SignalError(
                f"{item.name}: a Patch writes per-position values; edit patterns, scores and duration biases "
                "with a hook function (run_with_hooks), or patch hook_z or hook_attn_out instead"
            )
        if item.mode not in ("replace", "add"):
            raise SignalError(f"{item.name}: mode must be 'replace' or 'add', got {item.mode!r}")
        rows = _patch_rows(item, signals, target.shape)
        out.append((item.name, _patcher(item.mode, _columns(batch, [r for r, _ in rows]), [v for _, v in rows])))
    return out


@contextmanager
def patch(lm: Any, signals: Signal | Sequence[Signal], patches: Patch | Sequence[Patch]) -> Iterator[None]:
    """Replace or add to named activations of ``lm`` for a forward of ``signals``, while the context lasts.

    lm: a ContinuousLM; signals: the batch the patched forward runs, in the order
    :func:`run_with_cache` gets it (run ``run_with_cache(lm, signals, ...)`` inside the
    context); patches: one :class:`Patch` or a list. A thin case of hook functions
    (:func:`contllm.internals.intervention.hooks`): hooks are registered on entering and removed on
    exit, also when the body raises. Positions map to the columns of these signals
    left-padded as :func:`run_with_cache` pads them. The patch is bound to these signals:
    ``run_with_cache``, ``run_with_hooks`` or ``lm.gradients`` of other signals inside the
    context raise SignalError naming what differs, rather than patching the wrong tokens;
    ``lm.logits(signals)`` inside runs one padded forward of them through the patch (not the
    engine), as :func:`run_with_hooks` does.
    Raises SignalError for an unknown or pattern name, positions outside a signal, or
    values of the wrong shape.
    """
    items = check_signals(signals, single_ok=True)
    with hooks(lm, items, patch_hooks(lm, items, patches)):
        yield


def align_positions(source: Signal, target: Signal, positions: Sequence[int] | None = None) -> list[int]:
    """For each token index of ``target``, the token of ``source`` at the nearest earlier (or equal) time.

    Index j of the result is the token of ``source`` with the latest time at or before the
    time of ``target``'s position positions[j] (all of its tokens when None; the last such
    token where several share that time); a target position
    earlier than every source time maps to source token 0. Use it to patch between signals
    of different token counts: ``cache.rows(name)[0][align_positions(source, target)]``.
    Returns a list of source token indices, one per target position.
    """
    if not isinstance(source, Signal) or not isinstance(target, Signal):
        raise SignalError("align_positions takes two Signal objects")
    wanted = list(range(len(target))) if positions is None else read_indices([target], list(positions))[0]
    if not wanted:
        return []
    times = source.times.to(torch.float64)
    out = []
    for i in wanted:
        earlier = torch.nonzero(times <= float(target.times[i])).flatten()
        if not len(earlier):
            out.append(0)
            continue
        # The latest such time; among tokens sharing it, the last one (it has seen the others).
        latest = times[earlier].max()
        out.append(int(earlier[times[earlier] == latest][-1]))
    return out
