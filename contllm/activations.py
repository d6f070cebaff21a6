"""Named activations under continuous inputs: read them (:func:`run_with_cache`) and patch them (:func:`patch`).

Activation points are named as in TransformerLens, and resolved through the family
table (:mod:`contllm.families`: ``layers``, ``attention``, ``mlp``, ``norm``), so every
supported family speaks the same names:

================================  ===============================================  ==================
name                              what                                             one signal's value
================================  ===============================================  ==================
``blocks.{i}.hook_resid_pre``     the residual stream entering decoder layer i     [k, hidden]
``blocks.{i}.hook_resid_post``    the residual stream leaving decoder layer i      [k, hidden]
``blocks.{i}.hook_attn_out``      the output of layer i's attention module         [k, hidden]
``blocks.{i}.hook_mlp_out``       the output of layer i's MLP module               [k, hidden]
``blocks.{i}.attn.hook_pattern``  layer i's attention probabilities over keys      [heads, k, tokens]
``blocks.{i}.attn.hook_z``        the heads' outputs side by side, before the      [k, heads x head_dim]
                                  output projection (head h: columns h x head_dim
                                  to (h + 1) x head_dim)
``ln_final.hook_normalized``      the final norm's output (before the vocabulary)  [k, hidden]
================================  ===============================================  ==================

k is the number of read positions of the signal, tokens its length. ``hook_attn_out`` and
``hook_mlp_out`` are what the modules return: families that norm them again before the
residual sum (Gemma 2 and 3) add the normed values, and parallel families (Phi, GPT-NeoX)
feed both modules the same input. ``blocks.0.hook_resid_pre`` holds the input embeddings
(plus the interpolated position rows for learned-position families). The pattern is the
continuous attention's: the softmax of the scores plus the log-duration bias and the time
mask, so padding and keys later in time get probability 0 and a key of duration d weighs
as d tokens; keys are in token order (time order for a signal whose times increase).

Every call runs one padded forward of the whole batch (:func:`contllm.pad_signals`, left
padding) through :meth:`ContinuousLM.forward_batch <contllm.lm.ContinuousLM.forward_batch>`
inside the engine's evaluation context, the forward ``lm.logits`` runs; the engine's
shared prefix is not used here, since the hooks must see every position of every
signal. Split very large batches yourself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from contllm.attention import switched_attention
from contllm.engine import Positions, check_inputs, check_signals, evaluation, read_indices
from contllm.errors import SignalError, UnsupportedModelError
from contllm.families import attention_modules, attention_outputs, decoder_layers, final_norm, mlp_modules, model_of
from contllm.hooks import (
    InputFn,
    OutputFn,
    first_output,
    hidden_of,
    input_hook,
    output_hook,
    replace_first_output,
    with_hidden,
)
from contllm.signal import Signal, SignalBatch, pad_signals

if TYPE_CHECKING:  # only in annotations, which are strings at run time
    from typing_extensions import TypeIs

__all__ = [
    "ActivationCache",
    "Patch",
    "activation_names",
    "align_positions",
    "patch",
    "recording",
    "run_with_cache",
]

#: The per-layer points, ``blocks.{i}.`` + one of these.
BLOCK_POINTS = (
    "hook_resid_pre",
    "hook_resid_post",
    "hook_attn_out",
    "hook_mlp_out",
    "attn.hook_pattern",
    "attn.hook_z",
)
#: The point after the last layer.
FINAL_POINT = "ln_final.hook_normalized"
#: The one point that is read but not patched (it lives inside the attention function).
PATTERN = "attn.hook_pattern"

_BLOCK_NAME = re.compile(r"^blocks\.(\d+)\.(.+)$")


def activation_names(lm: Any) -> list[str]:
    """Every activation name of ``lm`` (a ContinuousLM or a transformers model), layer by layer, then the final norm."""
    count = len(decoder_layers(model_of(lm)))
    return [f"blocks.{i}.{point}" for i in range(count) for point in BLOCK_POINTS] + [FINAL_POINT]


@dataclass(frozen=True)
class _Point:
    name: str
    module: nn.Module
    kind: Literal["input", "output", "pattern"]


def _resolve(lm: Any, name: str) -> _Point:
    """The module and hook kind behind ``name``; SignalError naming the valid names for any other."""
    model = model_of(lm)
    layers = decoder_layers(model)
    if name == FINAL_POINT:
        return _Point(name, final_norm(model), "output")
    match = _BLOCK_NAME.match(name) if isinstance(name, str) else None
    if match and int(match.group(1)) < len(layers) and match.group(2) in BLOCK_POINTS:
        index, point = int(match.group(1)), match.group(2)
        if point == "hook_resid_pre":
            return _Point(name, layers[index], "input")
        if point == "hook_resid_post":
            return _Point(name, layers[index], "output")
        if point == "hook_attn_out":
            return _Point(name, attention_modules(model)[index], "output")
        if point == "hook_mlp_out":
            return _Point(name, mlp_modules(model)[index], "output")
        if point == "attn.hook_z":
            return _Point(name, attention_outputs(model)[index], "input")
        return _Point(name, attention_modules(model)[index], "pattern")
    raise SignalError(
        f"no activation named {name!r}; the model has {len(layers)} layers, names are "
        f"blocks.{{i}}.{{{', '.join(BLOCK_POINTS)}}} for i in 0..{len(layers) - 1}, and {FINAL_POINT}"
    )


def _names(lm: Any, names: str | Sequence[str] | None) -> list[str]:
    if names is None:
        return activation_names(lm)
    items = [names] if isinstance(names, str) else list(names)
    if not items:
        raise SignalError("names is an empty list; give activation names (see contllm.activations.activation_names)")
    for name in items:
        _resolve(lm, name)
    return list(dict.fromkeys(items))


def _columns(batch: SignalBatch, reads: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The padded batch's column of each read token index, per row (left padding)."""
    return [int(batch.pad_left[b]) + torch.tensor(list(r), dtype=torch.long) for b, r in enumerate(reads)]


@dataclass
class ActivationCache:
    """Activations read by :func:`run_with_cache`, per signal, in float32 on the CPU.

    values: {name: one tensor per signal}: [k_i, hidden] for residual, attention and MLP
        outputs and the final norm; [heads, k_i, tokens_i] for ``attn.hook_pattern``
        (queries at the read positions, keys over the whole signal, padding removed).
    positions: the token indices read of each signal (k_i of them, in [0, tokens_i)).
    times: float64 [k_i] per signal, the time of each read position.
    logits: float32 [k_i, vocab] per signal at the read positions.
    """

    values: dict[str, list[torch.Tensor]]
    positions: list[list[int]]
    times: list[torch.Tensor]
    logits: list[torch.Tensor]

    def __contains__(self, name: object) -> bool:
        return name in self.values

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def names(self) -> list[str]:
        return list(self.values)

    def __getitem__(self, name: str) -> torch.Tensor:
        """``name`` for every signal, stacked: [batch, k, ...]; SignalError when the signals' shapes differ."""
        rows = self.rows(name)
        if any(r.shape != rows[0].shape for r in rows):
            raise SignalError(
                f"{name}: the signals' values have different shapes ({', '.join(str(tuple(r.shape)) for r in rows)}); "
                "read them one by one with cache.rows(name)"
            )
        return torch.stack(rows)

    def rows(self, name: str) -> list[torch.Tensor]:
        """``name`` as one tensor per signal; SignalError naming the cached names for any other."""
        if name not in self.values:
            raise SignalError(f"{name!r} was not cached; this cache holds {', '.join(self.values) or 'nothing'}")
        return self.values[name]


def run_with_cache(
    lm: Any,
    signals: Signal | Sequence[Signal],
    *,
    names: str | Sequence[str] | None = None,
    positions: Positions = "all",
) -> ActivationCache:
    """Run ``signals`` through ``lm`` (a ContinuousLM) once and keep the named activations at the read positions.

    names: activation names (see the module docstring and :func:`activation_names`), one
        or a list; None keeps every one. Only these are hooked, and each keeps only the
        read positions.
    positions: "all" (every token), "last", a token index or a list of token indices
        (negative from each signal's end), as for ``lm.logits``.
    Returns an :class:`ActivationCache`: one tensor per signal and name, float32 on the
    CPU, with each read position's time and logits.

    The batch runs as one padded forward, the forward ``lm.logits`` uses, but never
    through the engine's shared prefix (the hooks must see every token of every row), so
    patches of :func:`patch` apply. Attention patterns come from the eager attention
    function: a model loaded with sdpa runs this call in eager (same logits to float
    rounding); a forward with no pattern requested keeps the model's own attention.
    Raises SignalError for an unknown name, a bad position, or a signal ``lm.logits``
    would refuse.
    """
    items = check_signals(signals, single_ok=True)
    wanted = _names(lm, names)
    reads = read_indices(items, positions)
    check_inputs(lm, items, reads)
    batch = pad_signals(items)
    columns = _columns(batch, reads)
    with ExitStack() as stack:
        # Eager first: a half-precision model's float32 state then wraps eager, not the loaded backend.
        if any(_resolve(lm, name).kind == "pattern" for name in wanted):
            stack.enter_context(_eager(lm))
        stack.enter_context(evaluation(lm))
        stored = stack.enter_context(recording(lm, items, wanted, reads))
        # Only the read columns go through the vocabulary projection.
        kept = sorted({int(c) for row in columns for c in row})
        logits, _ = lm.forward_batch(batch, logits_to_keep=torch.tensor(kept, dtype=torch.long, device=lm.device))
    at = {c: i for i, c in enumerate(kept)}
    rows = [logits[b, [at[int(c)] for c in columns[b]]].float().cpu() for b in range(len(items))]
    times = [s.times[r] for s, r in zip(items, reads)]
    return ActivationCache(stored, reads, times, rows)


@contextmanager
def recording(
    lm: Any, signals: Sequence[Signal], names: Sequence[str], reads: Sequence[Sequence[int]]
) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Keep the named activations of the forward run inside the context: yields {name: one tensor per signal}.

    The forward must be of ``signals`` left-padded by :func:`contllm.pad_signals` (the
    batch :func:`run_with_cache` runs, or their tails after a shared prefix); ``reads``
    holds the token indices kept of each signal. The dict is filled on exit, in the order of
    ``names``, with the values :class:`ActivationCache` describes (float32, CPU). Patterns
    need the eager attention in place. UnsupportedModelError when the forward never
    reached a name; hooks are removed on exit, also when the body raises.
    """
    batch = pad_signals(list(signals))
    columns = _columns(batch, reads)
    starts = [int(p) for p in batch.pad_left]
    stored: dict[str, list[torch.Tensor]] = {}

    def keep(name: str, h: torch.Tensor) -> None:
        stored[name] = [h[b, columns[b].to(h.device)].detach().float().cpu() for b in range(len(signals))]

    def keep_pattern(name: str, weights: Any, module: nn.Module) -> None:
        if not isinstance(weights, torch.Tensor) or weights.ndim != 4:
            raise UnsupportedModelError(
                f"{name}: {type(module).__name__} returned no attention probabilities; "
                "patterns need the eager attention"
            )
        stored[name] = [
            weights[b][:, columns[b].to(weights.device), starts[b] :].detach().float().cpu()
            for b in range(len(signals))
        ]

    found: dict[str, list[torch.Tensor]] = {}
    with ExitStack() as stack:
        for name in names:
            stack.enter_context(_reader(_resolve(lm, name), keep, keep_pattern))
        yield found
    missing = [name for name in names if name not in stored]
    if missing:
        raise UnsupportedModelError(f"the forward never reached {', '.join(missing)}")
    found.update((name, stored[name]) for name in names)


@contextmanager
def _eager(lm: Any) -> Iterator[None]:
    """Run ``lm`` with the eager attention function (the one that returns probabilities) while the context lasts.

    ``lm.attn_implementation`` follows, so that ``forward_batch`` builds the mask eager adds
    (float32: an sdpa mask in a float64 or half state would overflow to -inf in eager and
    turn fully masked padding rows into NaN).
    """
    model = lm.model
    if getattr(model.config, "_attn_implementation", None) == "eager":
        yield
        return
    saved = lm.attn_implementation
    with switched_attention(model, attention_modules(model), "eager"):
        lm.attn_implementation = "eager"
        try:
            yield
        finally:
            lm.attn_implementation = saved


def _reader(
    point: _Point,
    keep: Callable[[str, torch.Tensor], None],
    keep_pattern: Callable[[str, Any, nn.Module], None],
) -> AbstractContextManager[None]:
    """The hook context that hands ``point``'s value to ``keep`` (or its probabilities to ``keep_pattern``)."""
    if point.kind == "input":
        return input_hook(point.module, lambda module, args, kwargs: keep(point.name, hidden_of(args, kwargs)))
    if point.kind == "pattern":
        return output_hook(
            point.module,
            lambda module, args, kwargs, output: keep_pattern(
                point.name, output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None, module
            ),
        )
    return output_hook(point.module, lambda module, args, kwargs, output: keep(point.name, first_output(output)))


# ---------------------------------------------------------------------- patching


@dataclass(frozen=True)
class Patch:
    """New values for one named activation at chosen positions of each signal.

    name: an activation name other than ``attn.hook_pattern``.
    positions: token indices, one list per signal (or one list for every signal);
        negative counts from a signal's end.
    values: one tensor per signal, [k_i, hidden] (k_i = len(positions_i)), or a tensor
        [batch, k, hidden] (or [k, hidden] for every signal); e.g. ``cache.rows(name)``
        of another run, picked with :func:`align_positions` when token counts differ.
    mode: "replace" the activation there, or "add" to it.
    """

    name: str
    positions: Sequence[int] | Sequence[Sequence[int]]
    values: torch.Tensor | Sequence[torch.Tensor]
    mode: Literal["replace", "add"] = "replace"


def _width(point: _Point, hidden: int) -> int:
    """The last dimension of ``point``'s values: the hidden size, or the output projection's input width for hook_z."""
    if not point.name.endswith("attn.hook_z"):
        return hidden
    # nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out].
    if isinstance(point.module, nn.Linear):
        return int(point.module.in_features)
    weight = point.module.weight
    if not isinstance(weight, torch.Tensor):
        raise UnsupportedModelError(f"{point.name}: the output projection has no weight tensor to read its width from")
    return int(weight.shape[0])


def _one_list_per_signal(positions: Sequence[int] | Sequence[Sequence[int]]) -> TypeIs[Sequence[Sequence[int]]]:
    """Whether ``positions`` is a list of position lists (one per signal) rather than one list for every signal."""
    given = list(positions)
    return bool(given) and all(isinstance(p, Sequence) and not isinstance(p, str) for p in given)


def _patch_rows(item: Patch, signals: Sequence[Signal], hidden: int) -> list[tuple[list[int], torch.Tensor]]:
    """(token indices, values [k, hidden]) per signal of ``item``; SignalError naming what does not fit."""
    count = len(signals)
    positions = item.positions
    if _one_list_per_signal(positions):
        if len(positions) != count:
            raise SignalError(f"{item.name}: {len(positions)} position lists for {count} signals")
        per_signal = [list(p) for p in positions]
    else:
        per_signal = [list(positions)] * count
    values = item.values
    if isinstance(values, torch.Tensor):
        if values.ndim == 2:
            values = [values] * count
        elif values.ndim == 3 and values.shape[0] == count:
            values = list(values)
        else:
            raise SignalError(
                f"{item.name}: values of shape {tuple(values.shape)}; give [k, {hidden}], [{count}, k, {hidden}] "
                "or one [k, hidden] tensor per signal"
            )
    values = list(values)
    if len(values) != count:
        raise SignalError(f"{item.name}: {len(values)} value tensors for {count} signals")
    out = []
    for b, (s, wanted, v) in enumerate(zip(signals, per_signal, values)):
        indices = read_indices([s], wanted)[0] if len(wanted) else []
        if not isinstance(v, torch.Tensor) or v.ndim != 2 or v.shape != (len(indices), hidden):
            shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise SignalError(
                f"{item.name}: signal {b} has {len(indices)} patched positions and hidden size {hidden}, "
                f"so its values must be [{len(indices)}, {hidden}], got {shape}"
            )
        out.append((indices, v))
    return out


@contextmanager
def patch(lm: Any, signals: Signal | Sequence[Signal], patches: Patch | Sequence[Patch]) -> Iterator[None]:
    """Replace or add to named activations of ``lm`` for a forward of ``signals``, while the context lasts.

    lm: a ContinuousLM; signals: the batch the patched forward runs, in the order
    :func:`run_with_cache` gets it (run ``run_with_cache(lm, signals, ...)`` inside the
    context); patches: one :class:`Patch` or a list. Hooks are registered on entering
    and removed on exit, also when the body raises. Positions map to the columns of these
    signals left-padded as :func:`run_with_cache` pads them; a forward inside the context
    of another shape (rows x padded width) raises SignalError rather than patching the
    wrong tokens. ``lm.logits`` goes through the engine, which may chunk, reorder or share
    a prefix: run the patched forward with :func:`run_with_cache`.
    Raises SignalError for an unknown or pattern name, positions outside a signal, or
    values of the wrong shape.
    """
    items = check_signals(signals, single_ok=True)
    edits = [patches] if isinstance(patches, Patch) else list(patches)
    hidden = int(lm.model.get_input_embeddings().weight.shape[-1])
    batch = pad_signals(items)
    planned = []
    for item in edits:
        if not isinstance(item, Patch):
            raise SignalError(f"patches must be Patch objects, got {type(item).__name__}")
        point = _resolve(lm, item.name)
        if point.kind == "pattern":
            raise SignalError(f"{item.name}: attention patterns are read, not patched; patch hook_attn_out instead")
        if item.mode not in ("replace", "add"):
            raise SignalError(f"{item.name}: mode must be 'replace' or 'add', got {item.mode!r}")
        rows = _patch_rows(item, items, _width(point, hidden))
        columns = _columns(batch, [r for r, _ in rows])
        planned.append((point, item.mode, columns, [v for _, v in rows]))
    with ExitStack() as stack:
        for point, mode, columns, values in planned:
            edit = _editor(point.name, mode, columns, values, (len(batch), batch.width))
            if point.kind == "input":
                hook = input_hook(point.module, _input_edit(edit))
            else:
                hook = output_hook(point.module, _output_edit(edit))
            stack.enter_context(hook)
        yield


def _input_edit(edit: Callable[[torch.Tensor], torch.Tensor]) -> InputFn:
    """A forward pre-hook that calls the module with ``edit`` of its hidden states."""
    return lambda module, args, kwargs: with_hidden(args, kwargs, edit(hidden_of(args, kwargs)))


def _output_edit(edit: Callable[[torch.Tensor], torch.Tensor]) -> OutputFn:
    """A forward hook that replaces the module's hidden states by ``edit`` of them."""
    return lambda module, args, kwargs, output: replace_first_output(output, edit(first_output(output)))


def _editor(
    name: str, mode: str, columns: list[torch.Tensor], values: list[torch.Tensor], shape: tuple[int, int]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function of the hidden states [batch, width, ...] that writes ``values`` at ``columns`` of each row."""

    def edit(h: torch.Tensor) -> torch.Tensor:
        if tuple(h.shape[:2]) != shape:
            raise SignalError(
                f"{name}: the patch was made for {shape[0]} signals padded to {shape[1]} tokens, but this forward has "
                f"{tuple(h.shape[:2])}; run run_with_cache(lm, signals) with the patch's signals inside the context"
            )
        h = h.clone()
        for b, (cols, v) in enumerate(zip(columns, values)):
            if not len(cols):
                continue
            cols = cols.to(h.device)
            v = v.to(device=h.device, dtype=h.dtype)
            h[b, cols] = v if mode == "replace" else h[b, cols] + v
        return h

    return edit


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
