"""Hook functions under continuous inputs: the one installer of named hooks on a model, and their removal.

:func:`hooks` is a context manager. While it lasts, every forward of the model calls
``fn(activation, hook)`` at each named point (:mod:`contllm.internals.hookpoints`) it was given;
``fn`` may return a replacement (a floating-point tensor of the same shape, converted to
the activation's dtype and device), or None to leave the activation as it is; anything
else raises SignalError naming the point. It may also edit the activation in place (and
return None or the activation itself), as TransformerLens's hook functions often do: the
edit takes effect at every point.
``hook`` is a :class:`Hook`: the point's name and layer, and the padded batch the
forward runs (each column's time and duration, each row's padding). Backward hooks
``fn(grad, hook)`` are attached to the activation's tensor in the autograd graph, so they
fire when a gradient passes through it and vanish with the graph. On exit, also when the
body or a hook raises, every hook is removed and the model has its own attention
implementation back: nothing outlives the context.

Hooks are bound to the signals they were made for. Contexts open on one model at once
(``lm.hooks(signals)`` around ``lm.run_with_cache(signals)``, whose own context records the
values) must be made for the same signals, token for token: the same token ids or
embeddings, durations and times. A context for any other signals raises SignalError on
entering, naming what differs (:func:`signal_difference`), before anything runs; a forward
that no context announces (the model called directly inside the context) must have the
context's batch shape (rows x padded width), or SignalError at the first hooked point.

Hooks added with :func:`add_hook` (``lm.add_hook``) stay until :func:`reset_hooks`: every
context opened for that ``lm`` (every ``run_with_cache``, ``run_with_hooks``, gradients and
patch, and ``lm.logits`` while any are added) applies them first, bound to its own
signals; between calls nothing is registered on the model.

Most points are a module's input or output. The attention points live inside the
attention function: while one is hooked, the layers that carry it run
:func:`contllm.internals.hooked_attention.hooked_attention_forward`. The norm points (``hook_scale``,
``hook_normalized``) and the per-head ``hook_result`` are computed beside their module: a
replacement moves the module's output by the change it makes (so a replacement equal to the
value changes nothing, exactly), and where a gradient must reach one of them the output
is rebuilt from it (the same value to float rounding).

Each kind of point (its ``site``) has one installer function, looked up in :data:`SITES`;
installers register through :mod:`contllm.internals.hooks`, the raw-layer API every other module
that changes a model's computation uses as well.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from contllm.core.engine import check_signals
from contllm.core.families import family_of, model_of
from contllm.core.signal import Signal, SignalBatch, pad_signals
from contllm.errors import SignalError, UnsupportedModelError
from contllm.internals import hooked_attention
from contllm.internals.hookpoints import Point, points, position_module, resolve_names
from contllm.internals.hooks import first_output, hidden_of, input_hook, output_hook, replace_first_output, with_hidden

__all__ = [
    "Hook",
    "HookFn",
    "HookState",
    "LayerIndex",
    "add_hook",
    "added_hooks",
    "hooks",
    "hooks_on",
    "reset_hooks",
    "signal_difference",
]

#: fn(activation, hook) -> a replacement of the same shape, or None to keep the activation.
HookFn = Callable[[torch.Tensor, "Hook"], "torch.Tensor | None"]


class LayerIndex(int):
    """A decoder layer's index: an int (``hook.layer == 3``) that can also be called, ``hook.layer()``, as
    TransformerLens's ``HookPoint.layer()`` is."""

    def __call__(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return str(int(self))


@dataclass(frozen=True)
class Hook:
    """What a hook function gets besides the activation: the point and the batch being run.

    name: the activation name; layer: its decoder layer, a :class:`LayerIndex` (an int,
    also callable as ``hook.layer()``, TransformerLens's spelling), or None for the
    embeddings and the final norm; batch: the left-padded :class:`~contllm.core.signal.SignalBatch`
    of the signals the hooks were made for, which are the signals the forward runs (padding
    tokens have duration 0); signals: those signals.
    """

    name: str
    layer: LayerIndex | None
    batch: SignalBatch = field(repr=False)
    signals: tuple[Signal, ...] = field(repr=False)

    @property
    def times(self) -> torch.Tensor:
        """float64 [batch, pos]: the time of every column of the activation (padding sits at its row's start)."""
        return self.batch.times

    @property
    def durations(self) -> torch.Tensor:
        """float64 [batch, pos]: the duration of every column (0 for padding)."""
        return self.batch.durations

    @property
    def pad_left(self) -> torch.Tensor:
        """long [batch]: padding columns before each signal's first token."""
        return self.batch.pad_left

    @property
    def real(self) -> torch.Tensor:
        """bool [batch, pos]: True at the columns that hold a token of the signal, False at padding."""
        return torch.arange(self.batch.width)[None, :] >= self.batch.pad_left[:, None]

    def columns(self, index: int) -> torch.Tensor:
        """The column of token ``index`` (negative: from each signal's end) in every row: long [batch]."""
        lengths = self.batch.lengths.to(torch.long)
        return self.batch.pad_left.to(torch.long) + (index if index >= 0 else lengths + index)


@dataclass
class HookState:
    """One :func:`hooks` context: the names hooked and those a forward has reached so far."""

    batch: SignalBatch
    names: list[str]
    fired: set[str] = field(default_factory=set)

    def check_reached(self) -> None:
        """UnsupportedModelError naming the hooked points that no forward reached."""
        missing = [n for n in self.names if n not in self.fired]
        if missing:
            raise UnsupportedModelError(f"the forward never reached {', '.join(missing)}")


class _Run:
    """The hook functions of one context, applied at a point: shape checks, replacements, backward hooks."""

    def __init__(
        self,
        known: dict[str, Point],
        fwd: dict[str, list[HookFn]],
        bwd: dict[str, list[HookFn]],
        graph: set[str],
        batch: SignalBatch,
        signals: tuple[Signal, ...],
        net: nn.Module,
        owner: Any = None,
        optional: dict[str, list[HookFn]] | None = None,
    ) -> None:
        self.known, self.fwd, self.bwd, self.graph_names = known, fwd, bwd, graph
        #: Backward hooks attached only where the forward keeps the autograd graph (added with add_hook).
        self.optional = optional or {}
        self.batch, self.signals, self.owner = batch, signals, owner
        self.net, self.family = net, family_of(net)
        self.state = HookState(batch, [n for n in known if n in fwd or n in bwd or n in self.optional])
        self._hooks: dict[str, Hook] = {}

    def hook(self, point: Point) -> Hook:
        if point.name not in self._hooks:
            layer = None if point.layer is None else LayerIndex(point.layer)
            self._hooks[point.name] = Hook(point.name, layer, self.batch, self.signals)
        return self._hooks[point.name]

    def graph(self, point: Point) -> bool:
        """Whether ``point``'s value must sit in the autograd graph (a backward hook or a gradient reads it)."""
        name = point.name
        return torch.is_grad_enabled() and (name in self.bwd or name in self.optional or name in self.graph_names)

    def rebuild(self, point: Point, new: torch.Tensor, old: torch.Tensor) -> bool:
        """Whether the module must go on from ``new``, a view of its value: replaced, or read by a gradient."""
        return _changed(new, old) or self.graph(point)

    def _check(self, point: Point, value: torch.Tensor) -> None:
        rows, width = len(self.batch), self.batch.width
        pos = value.shape[2] if point.axis == "pattern" else (value.shape[1] if value.ndim > 1 else -1)
        if value.shape[0] != rows or pos != width:
            raise SignalError(
                f"{point.name}: the hooks were made for {rows} signals padded to {width} tokens, but this forward "
                f"has values of shape {tuple(value.shape)}; run the forward of the hooks' own signals inside the context "
                "(run_with_hooks, run_with_cache)"
            )

    def apply(self, point: Point, value: torch.Tensor) -> torch.Tensor:
        """``value`` after every forward hook on ``point``; backward hooks attached to the result."""
        self._check(point, value)
        hook = self.hook(point)
        if self.graph(point) and not value.requires_grad:
            # Nothing before the point takes a gradient (a duration bias when durations are not asked for):
            # its value enters the graph here.
            value = value.detach().requires_grad_(True)
        for fn in self.fwd.get(point.name, ()):
            new = fn(value, hook)
            if new is not None:
                value = replacement(point.name, new, value)
        self.state.fired.add(point.name)
        if value.requires_grad:
            for fn in self.optional.get(point.name, ()):
                value.register_hook(_backward(fn, hook))
        for fn in self.bwd.get(point.name, ()):
            if not value.requires_grad:
                raise SignalError(
                    f"{point.name}: backward hooks need a forward that keeps gradients; "
                    "run it with run_with_hooks(..., bwd_hooks=...) or grad=True"
                )
            value.register_hook(_backward(fn, hook))
        return value

    def apply_kept(self, point: Point, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the value after the hooks, the value before them), for a point computed beside its module.

        A hook function may edit the activation in place and return None or it, as
        TransformerLens's do; where one did, the second is a copy taken before the hooks ran,
        so that :func:`_changed` sees the edit (a point the module reads itself sees it anyway).
        """
        if not self.fwd.get(point.name):
            return self.apply(point, value), value
        before = value.detach().clone()
        new = self.apply(point, value)
        return new, (value if torch.equal(before, value.detach()) else before)


def replacement(name: str, new: Any, value: torch.Tensor, what: str = "a hook function") -> torch.Tensor:
    """What a hook function at the point ``name`` returned instead of ``value``, in ``value``'s dtype and device.

    The one check of every hook function's return, forward and backward: a floating-point
    tensor of ``value``'s shape, holding data (not on the meta device) on a device it can be
    moved from; another floating-point dtype or device is converted. SignalError naming the
    point otherwise (None, "keep the value", is the caller's to handle).
    """
    keep = "or None to keep it"
    if not isinstance(new, torch.Tensor) or new.shape != value.shape:
        got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
        raise SignalError(
            f"{name}: {what} returned {got}; return a tensor of the activation's shape {tuple(value.shape)}, {keep}"
        )
    if value.is_floating_point() and not new.is_floating_point():
        raise SignalError(
            f"{name}: {what} returned a {new.dtype} tensor; return floating-point values ({value.dtype}), {keep}"
        )
    if new.device.type == "meta":
        raise SignalError(
            f"{name}: {what} returned a tensor on the meta device, which holds no values; "
            f"return values (on {value.device}), {keep}"
        )
    try:
        return new.to(device=value.device, dtype=value.dtype)
    except (RuntimeError, NotImplementedError) as err:
        raise SignalError(
            f"{name}: {what} returned a tensor on {new.device} that cannot be moved to the activation's device "
            f"{value.device} ({str(err).splitlines()[0] if str(err) else type(err).__name__}); {keep}"
        ) from err


def _backward(fn: HookFn, hook: Hook) -> Callable[[torch.Tensor], torch.Tensor | None]:
    def call(grad: torch.Tensor) -> torch.Tensor | None:
        new = fn(grad, hook)
        return None if new is None else replacement(hook.name, new, grad, "a backward hook function")

    return call


# ---------------------------------------------------------------------- module sites


def _changed(new: torch.Tensor, old: torch.Tensor) -> bool:
    return new is not old


def _only(parts: dict[str, Point]) -> Point:
    """The point of a site that carries one point per module."""
    return next(iter(parts.values()))


def _layer_in(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    point = _only(parts)

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        h = hidden_of(args, kwargs)
        new = run.apply(point, h)
        return with_hidden(args, kwargs, new) if _changed(new, h) else None

    stack.enter_context(input_hook(point.module, before))


def _output(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    point = _only(parts)

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        h = first_output(output)
        new = run.apply(point, h)
        return replace_first_output(output, new) if _changed(new, h) else None

    stack.enter_context(output_hook(point.module, after))


def _input(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """A point that is a module's input, viewed with the point's trailing shape (hook_z, hook_post)."""
    point = _only(parts)

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        h = hidden_of(args, kwargs)
        view = h.view(*h.shape[:2], *point.shape)
        new = run.apply(point, view)
        return with_hidden(args, kwargs, new.reshape(h.shape)) if run.rebuild(point, new, view) else None

    stack.enter_context(input_hook(point.module, before))


def _resid_mid(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """The norm before the MLP reads the residual stream: a replacement moves its input and, by the difference, the layer's output."""
    point = _only(parts)
    assert point.owner is not None
    pending: list[torch.Tensor] = []

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        h = hidden_of(args, kwargs)
        new = run.apply(point, h)
        if not _changed(new, h):
            return None
        pending.append(new - h)
        return with_hidden(args, kwargs, new)

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if not pending:
            return None
        return replace_first_output(output, first_output(output) + pending.pop())

    stack.enter_context(input_hook(point.module, before))
    stack.enter_context(output_hook(point.owner, after))
    stack.callback(pending.clear)


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    value = getattr(module, name, None)
    if not isinstance(value, torch.Tensor):
        raise UnsupportedModelError(f"{type(module).__name__} has no {name} tensor")
    return value


def _matmul_weight(module: nn.Module) -> torch.Tensor:
    """The weight of a matmul module as [in, out] (nn.Linear stores [out, in], transformers' Conv1D [in, out])."""
    weight = _tensor(module, "weight")
    return weight.T if isinstance(module, nn.Linear) else weight


def _result(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    point = _only(parts)
    heads, hidden = point.shape

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        out = first_output(output)
        z = hidden_of(args, kwargs)
        work = torch.promote_types(z.dtype, torch.float32)
        weight = _matmul_weight(module).to(work)
        b, s = z.shape[:2]
        per_head = z.to(work).view(b, s, heads, -1)
        result = torch.einsum("bshd,hdo->bsho", per_head, weight.reshape(heads, -1, hidden))
        new, result = run.apply_kept(point, result)
        if _changed(new, result):
            # The stock output plus the change: exact where a replacement equals the heads' results.
            total = out.to(work) + (new - result).sum(dim=2)
        elif run.graph(point):
            bias = getattr(module, "bias", None)
            total = result.sum(dim=2) + (bias.to(work) if isinstance(bias, torch.Tensor) else 0)
        else:
            return None
        return replace_first_output(output, total.to(out.dtype))

    stack.enter_context(output_hook(point.module, after))


def _norm(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    offset, centred = run.family.norm_offset, run.family.norm_kind == "layer"
    module = next(iter(parts.values())).module
    eps = getattr(module, "variance_epsilon", None)
    eps = getattr(module, "eps", None) if eps is None else eps
    if eps is None:
        raise UnsupportedModelError(f"{type(module).__name__} has no eps (or variance_epsilon) to compute its scale")

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        out = first_output(output)
        new = out
        if "scale" in parts or "normalized" in parts:
            x = hidden_of(args, kwargs)
            xf = x.to(torch.promote_types(x.dtype, torch.float32))
            if centred:
                xf = xf - xf.mean(-1, keepdim=True)
            variance = xf.pow(2).mean(-1, keepdim=True) + eps
            scale = variance.sqrt()
            base = xf * torch.rsqrt(variance)
            hooked_scale, scale = run.apply_kept(parts["scale"], scale) if "scale" in parts else (scale, scale)
            through_scale = _changed(hooked_scale, scale) or ("scale" in parts and run.graph(parts["scale"]))
            normalized = xf / hooked_scale if through_scale else base
            if "normalized" in parts:
                hooked, before = run.apply_kept(parts["normalized"], normalized)
            else:
                hooked, before = normalized, normalized
            # What the change is measured from: ``base``, unless a hook edited ``base`` itself in place.
            reference = before if hooked is base else base
            weight = _tensor(module, "weight").to(hooked.dtype) + offset
            if _changed(hooked, reference):
                # The stock output plus the change: exact where a replacement equals the stock values.
                new = (out.to(hooked.dtype) + (hooked - reference) * weight).to(out.dtype)
            elif any(run.graph(p) for k, p in parts.items() if k != "out"):
                bias = getattr(module, "bias", None)
                new = (hooked * weight + (bias.to(hooked.dtype) if isinstance(bias, torch.Tensor) else 0)).to(out.dtype)
        if "out" in parts:
            new = run.apply(parts["out"], new)
        return replace_first_output(output, new) if _changed(new, out) else None

    stack.enter_context(output_hook(module, after))


def _qkv(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """Queries, keys and values at their projection: one module per part, or one fused module holding all three."""
    layout = run.family.qkv_layout
    module = next(iter(parts.values())).module
    layer = next(iter(parts.values())).layer
    names = [f"blocks.{layer}.attn.hook_{p}" for p in "qkv"]
    shapes = [run.known[n].shape for n in names]
    fused = all(run.known[n].module is module for n in names)

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        b, s = output.shape[:2]
        if not fused:
            ((part, point),) = parts.items()
            view = output.view(b, s, *point.shape)
            new = run.apply(point, view)
            return new.reshape(output.shape) if run.rebuild(point, new, view) else None
        if layout == "per_head":
            grouped = output.view(b, s, shapes[0][0], -1)
            d = shapes[0][1]
            pieces = [grouped[..., k * d : (k + 1) * d] for k in range(3)]
        else:
            widths = [count * d for count, d in shapes]
            pieces = [p.view(b, s, *shape) for p, shape in zip(output.split(widths, dim=-1), shapes)]
        hooked = [run.apply(parts[p], piece) if p in parts else piece for p, piece in zip("qkv", pieces)]
        if not any(run.rebuild(parts[p], a, b) for p, a, b in zip("qkv", hooked, pieces) if p in parts):
            return None
        if layout == "per_head":
            return torch.cat(hooked, dim=-1).reshape(output.shape)
        return torch.cat([h.reshape(b, s, -1) for h in hooked], dim=-1)

    stack.enter_context(output_hook(module, after))


def _mlp_in(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """The MLP's pre-activation (and a gated MLP's linear input): one module each, or one fused [gate | up]."""
    module = next(iter(parts.values())).module
    layer = next(iter(parts.values())).layer
    linear = run.known.get(f"blocks.{layer}.mlp.hook_pre_linear")
    fused = linear is not None and linear.module is run.known[f"blocks.{layer}.mlp.hook_pre"].module

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if not fused:
            (point,) = parts.values()
            new = run.apply(point, output)
            return new if _changed(new, output) else None
        pieces = output.chunk(2, dim=-1)
        names = ("pre", "pre_linear")
        hooked = [run.apply(parts[p], piece) if p in parts else piece for p, piece in zip(names, pieces)]
        rebuilt = any(run.rebuild(parts[p], a, b) for p, a, b in zip(names, hooked, pieces) if p in parts)
        return torch.cat(hooked, dim=-1) if rebuilt else None

    stack.enter_context(output_hook(module, after))


def _embeddings(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """The input embeddings the base model is called with, and (learned positions) the position rows it reads."""
    base = next(iter(parts.values())).module
    # The position module's hook lives for one call of the base model (and goes with the context).
    call = stack.enter_context(ExitStack())

    def positions(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        return run.apply(parts["pos_embed"], output)

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if "pos_embed" in parts:
            # The position module in place now: contllm swaps in an interpolating view for float times.
            call.enter_context(output_hook(position_module(run.net), positions))
        if "embed" not in parts:
            return None
        h = kwargs.get("inputs_embeds")
        if not isinstance(h, torch.Tensor):
            raise UnsupportedModelError(
                f"{type(module).__name__} was called without inputs_embeds; hook_embed reads the input embeddings "
                "contllm passes (run the forward through run_with_hooks or run_with_cache)"
            )
        new = run.apply(parts["embed"], h)
        return (args, {**kwargs, "inputs_embeds": new}) if _changed(new, h) else None

    stack.enter_context(input_hook(base, before))
    stack.enter_context(output_hook(base, lambda module, args, kwargs, output: call.close()))


def _attention(run: _Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """The points inside the attention function (:mod:`contllm.internals.hooked_attention`), of every layer at once."""
    modules: dict[nn.Module, dict[str, Point]] = {}
    for p in parts.values():
        modules.setdefault(p.module, {})[p.part] = p
    hooked_attention.install(run.apply, modules, stack, run.net)


#: The installer of each site: installer(run, parts, stack) hooks the points ``parts`` ({part or site: point})
#: of one module, or of every module for the sites that :func:`_group` installs at once.
SITES: dict[str, Callable[[_Run, dict[str, Point], ExitStack], None]] = {
    "layer_in": _layer_in,
    "output": _output,
    "z": _input,
    "mlp_post": _input,
    "resid_mid": _resid_mid,
    "result": _result,
    "norm": _norm,
    "qkv": _qkv,
    "mlp_in": _mlp_in,
    "embeddings": _embeddings,
    "attention": _attention,
}

#: Sites installed once for all their points, by the installer named here.
_AT_ONCE = {"embed": "embeddings", "pos_embed": "embeddings", "attention": "attention"}
#: Those installers run after every module site's, in this order.
_LATER = {"embeddings": 1, "attention": 2}


def _group(point: Point) -> tuple[str, int, str]:
    """(installer, module, key): points with the same installer and module are installed together, each under its key."""
    if point.site in _AT_ONCE:
        return _AT_ONCE[point.site], 0, point.name if point.site == "attention" else point.site
    return point.site, id(point.module), point.part or point.site


# ---------------------------------------------------------------------- the context


def _pairs(lm: Any, given: Any, what: str) -> dict[str, list[HookFn]]:
    """{name: [fn, ...]} of a list of (name | short form | predicate | list of them, fn) pairs.

    The one check of the hook pairs every entry point takes (run_with_hooks, hooks,
    gradients): SignalError naming ``what`` for anything but a list of pairs (one pair
    alone is taken too), a pair whose fn is not callable, or a target that names no
    activation (:func:`contllm.internals.hookpoints.resolve_names`).
    """
    if given is None:
        return {}
    if isinstance(given, tuple) and len(given) == 2 and callable(given[1]):
        given = [given]
    if callable(given) or isinstance(given, (str, bytes, torch.Tensor)) or not isinstance(given, Iterable):
        shown = getattr(given, "__name__", None) or repr(given)[:60]
        raise SignalError(
            f"{what} must be a list of (name or predicate, fn) pairs with fn(activation, hook), got "
            f"{type(given).__name__} {shown}; e.g. {what}=[('blocks.0.hook_resid_post', fn)]"
        )
    out: dict[str, list[HookFn]] = {}
    for i, item in enumerate(given):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and callable(item[1])):
            raise SignalError(
                f"{what} must be a list of (name or predicate, fn) pairs with fn(activation, hook), got {item!r}"
            )
        for name in resolve_names(lm, item[0], what=f"the target of {what}[{i}]"):
            out.setdefault(name, []).append(item[1])
    return out


# ---------------------------------------------------------------------- binding, added hooks


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    """The first index along dim 0 where ``a`` and ``b`` (same length) differ."""
    differs = (a != b).reshape(a.shape[0], -1).any(dim=1)
    return int(torch.nonzero(differs)[0])


def signal_difference(made: Sequence[Signal], run: Sequence[Signal]) -> str | None:
    """What tells ``run`` apart from ``made`` (None: the same signals), in words: the count, then the first
    signal that differs and how (its token count, token ids, embeddings, durations or times)."""
    if len(made) != len(run):
        return f"{len(made)} signals there, {len(run)} here"
    for b, (x, y) in enumerate(zip(made, run)):
        if x is y:
            continue
        if len(x) != len(y):
            return f"signal {b} has {len(x)} tokens there, {len(y)} here"
        for what, u, v in (("token ids", x.token_ids, y.token_ids), ("embeddings", x.embeds, y.embeds)):
            if (u is None) != (v is None):
                return f"signal {b} is given by {what} in one and not in the other"
            if u is not None and v is not None:
                u, v = u.cpu(), v.cpu()
                if u.dtype != v.dtype:
                    return f"signal {b}'s {what} are {u.dtype} there, {v.dtype} here"
                if not torch.equal(u, v):
                    return f"signal {b}'s {what} differ at token {_first_difference(u, v)}"
        for what, u, v in (("durations", x.durations, y.durations), ("times", x.times, y.times)):
            if not torch.equal(u, v):
                i = _first_difference(u, v)
                return f"signal {b}'s {what} differ at token {i} ({float(u[i]):.6g} there, {float(v[i]):.6g} here)"
    return None


#: The hook contexts open on each model, outermost first (they leave with their context).
_OPEN: weakref.WeakKeyDictionary[nn.Module, list[_Run]] = weakref.WeakKeyDictionary()

#: Hooks added with :func:`add_hook`, per ``lm``: (names, fn, direction), in the order they were added.
_ADDED: weakref.WeakKeyDictionary[Any, list[tuple[tuple[str, ...], HookFn, str]]] = weakref.WeakKeyDictionary()


def add_hook(lm: Any, name: Any, fn: HookFn, dir: Literal["fwd", "bwd"] = "fwd") -> None:
    """Add a hook function that every later hooked forward of ``lm`` applies, until :func:`reset_hooks`.

    name: an activation name, a short form, a predicate ``fn(name) -> bool`` or a list of
    them (TransformerLens's ``add_hook(name, hook, dir)``); fn: ``fn(activation, hook)``
    for "fwd", ``fn(grad, hook)`` for "bwd". Nothing is registered on the model here: each
    call that runs hooks (``run_with_cache``, ``run_with_hooks``, gradients, a patch, and
    ``lm.logits`` while hooks are added) installs them for its forward, bound to its own
    signals, before its own hooks, and removes them after. A backward hook fires only in
    forwards that keep the autograd graph. SignalError for an unknown name, a target of
    another kind, a fn that is not callable, or another ``dir``.
    """
    if dir not in ("fwd", "bwd"):
        raise SignalError(f"add_hook: dir must be 'fwd' or 'bwd', got {dir!r}")
    if not callable(fn):
        raise SignalError(f"add_hook: the hook must be a function fn(activation, hook), got {type(fn).__name__}")
    names = tuple(resolve_names(lm, name, what="add_hook's name"))
    _ADDED.setdefault(lm, []).append((names, fn, dir))


def added_hooks(lm: Any, dir: str | None = None) -> list[tuple[tuple[str, ...], HookFn, str]]:
    """The hooks added to ``lm`` with :func:`add_hook` ((names, fn, direction), oldest first); ``dir`` picks one direction."""
    return [h for h in _ADDED.get(lm, []) if dir is None or h[2] == dir]


def reset_hooks(lm: Any) -> None:
    """Remove every hook added to ``lm`` with :func:`add_hook` (contexts that are open keep theirs until they close)."""
    _ADDED.pop(lm, None)


def hooks_on(lm: Any) -> bool:
    """Whether a forward of ``lm`` now runs named hooks: hooks were added to it, or a hook context is open on its model."""
    return bool(_ADDED.get(lm)) or bool(_OPEN.get(model_of(lm)))


def _merged(
    added: list[tuple[tuple[str, ...], HookFn, str]], dir: str, given: dict[str, list[HookFn]]
) -> dict[str, list[HookFn]]:
    out: dict[str, list[HookFn]] = {}
    for names, fn, d in added:
        if d == dir:
            for name in names:
                out.setdefault(name, []).append(fn)
    for name, fns in given.items():
        out.setdefault(name, []).extend(fns)
    return out


@contextmanager
def _opened(net: nn.Module, run: _Run) -> Iterator[None]:
    _OPEN.setdefault(net, []).append(run)
    try:
        yield
    finally:
        left = [r for r in _OPEN.get(net, []) if r is not run]
        if left:
            _OPEN[net] = left
        else:
            _OPEN.pop(net, None)


@contextmanager
def hooks(
    lm: Any,
    signals: Signal | Sequence[Signal],
    fwd_hooks: Any = (),
    bwd_hooks: Any = (),
    *,
    graph: Sequence[str] = (),
) -> Iterator[HookState]:
    """Call hook functions at named activations of ``lm`` for forwards of ``signals``, while the context lasts.

    lm: a ContinuousLM; signals: the batch the forwards inside run (left-padded by
    :func:`contllm.pad_signals`). The hooks are bound to these signals: a context opened
    inside for other signals (``run_with_cache``, ``run_with_hooks``, gradients or ``patch``
    of other signals) raises SignalError naming what differs (:func:`signal_difference`), and
    a forward of another shape raises SignalError at the first hooked point. fwd_hooks: (target, fn) pairs: target an activation name, a short form
    (``("resid_post", 5)``), a predicate ``fn(name) -> bool`` or a list of them; fn(activation,
    hook) returns a replacement or None. bwd_hooks: (target, fn) pairs with fn(grad, hook),
    attached to the activations' tensors (they need a forward that keeps gradients).
    graph: names whose values must sit in the autograd graph (gradients are read there).
    Yields a :class:`HookState`. Hooks are registered on entering and removed on exit,
    also when the body raises. The outermost context of ``lm`` also applies the hooks
    added with :func:`add_hook`, before its own (backward ones only where the forward keeps
    the autograd graph).

    SignalError on entering for signals :func:`contllm.core.engine.check_signals` refuses, hooks
    that are not a list of (target, fn) pairs (a bare function), a target that is no name,
    short form or predicate (a number, None), or an unknown name; and in the forward, naming
    the point, for a hook function (forward or backward) that returns anything but None or
    a floating-point tensor of the value's shape that holds data (:func:`replacement`).
    """
    items = tuple(check_signals(signals, single_ok=True))
    fwd, bwd = _pairs(lm, fwd_hooks, "fwd_hooks"), _pairs(lm, bwd_hooks, "bwd_hooks")
    net = model_of(lm)
    open_now = list(_OPEN.get(net, []))
    for other in open_now:
        difference = signal_difference(other.signals, items)
        if difference is not None:
            raise SignalError(
                f"the hooks open on this model were made for other signals ({difference}); inside lm.hooks(signals, "
                "...) run the forward of those very signals, or leave the context first"
            )
    optional: dict[str, list[HookFn]] = {}
    if not any(other.owner is lm for other in open_now):
        # The outermost context of this lm applies the hooks added to it, before its own.
        added = added_hooks(lm)
        fwd = _merged(added, "fwd", fwd)
        optional = _merged(added, "bwd", {})
    known = points(lm)
    batch = pad_signals(list(items))
    run = _Run(known, fwd, bwd, set(graph), batch, items, net, lm, optional)
    groups: dict[tuple[str, int], dict[str, Point]] = {}
    for name in run.state.names:
        site, module, key = _group(known[name])
        groups.setdefault((site, module), {})[key] = known[name]
    with ExitStack() as stack:
        for (site, _), parts in sorted(groups.items(), key=lambda group: _LATER.get(group[0][0], 0)):
            SITES[site](run, parts, stack)
        stack.enter_context(_opened(net, run))
        yield run.state
