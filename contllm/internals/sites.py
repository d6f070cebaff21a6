"""One installer per kind of point (its ``site``), looked up in :data:`SITES`.

Each installer registers what a :class:`~contllm.internals.hookrun.Run` needs at its points
of one module (an output, an input, the residual stream between attention and MLP, a norm's
scale, the per-head result, q/k/v, the MLP's input, the embeddings, the attention
function) through :mod:`contllm.internals.hooks`, the raw-layer API, onto the context's
exit stack, so that everything is removed when the context closes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from contllm.errors import UnsupportedModelError
from contllm.internals import hooked_attention
from contllm.internals.hookpoints import Point, position_module
from contllm.internals.hookrun import Run, changed
from contllm.internals.hooks import first_output, hidden_of, input_hook, output_hook, replace_first_output, with_hidden

__all__ = ["LATER", "SITES", "group"]


def _only(parts: dict[str, Point]) -> Point:
    """The point of a site that carries one point per module."""
    return next(iter(parts.values()))


def _layer_in(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
    point = _only(parts)

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        h = hidden_of(args, kwargs)
        new = run.apply(point, h)
        return with_hidden(args, kwargs, new) if changed(new, h) else None

    stack.enter_context(input_hook(point.module, before))


def _output(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
    point = _only(parts)

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        h = first_output(output)
        new = run.apply(point, h)
        return replace_first_output(output, new) if changed(new, h) else None

    stack.enter_context(output_hook(point.module, after))


def _input(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """A point that is a module's input, viewed with the point's trailing shape (hook_z, hook_post)."""
    point = _only(parts)

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        h = hidden_of(args, kwargs)
        view = h.view(*h.shape[:2], *point.shape)
        new = run.apply(point, view)
        return with_hidden(args, kwargs, new.reshape(h.shape)) if run.rebuild(point, new, view) else None

    stack.enter_context(input_hook(point.module, before))


def _resid_mid(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """The norm before the MLP reads the residual stream: a replacement moves its input and, by the difference, the layer's output."""
    point = _only(parts)
    assert point.owner is not None
    pending: list[torch.Tensor] = []

    def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        h = hidden_of(args, kwargs)
        new = run.apply(point, h)
        if not changed(new, h):
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


def _result(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
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
        if changed(new, result):
            # The stock output plus the change: exact where a replacement equals the heads' results.
            total = out.to(work) + (new - result).sum(dim=2)
        elif run.graph(point):
            bias = getattr(module, "bias", None)
            total = result.sum(dim=2) + (bias.to(work) if isinstance(bias, torch.Tensor) else 0)
        else:
            return None
        return replace_first_output(output, total.to(out.dtype))

    stack.enter_context(output_hook(point.module, after))


def _norm(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
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
            through_scale = changed(hooked_scale, scale) or ("scale" in parts and run.graph(parts["scale"]))
            normalized = xf / hooked_scale if through_scale else base
            if "normalized" in parts:
                hooked, before = run.apply_kept(parts["normalized"], normalized)
            else:
                hooked, before = normalized, normalized
            # What the change is measured from: ``base``, unless a hook edited ``base`` itself in place.
            reference = before if hooked is base else base
            weight = _tensor(module, "weight").to(hooked.dtype) + offset
            if changed(hooked, reference):
                # The stock output plus the change: exact where a replacement equals the stock values.
                new = (out.to(hooked.dtype) + (hooked - reference) * weight).to(out.dtype)
            elif any(run.graph(p) for k, p in parts.items() if k != "out"):
                bias = getattr(module, "bias", None)
                new = (hooked * weight + (bias.to(hooked.dtype) if isinstance(bias, torch.Tensor) else 0)).to(out.dtype)
        if "out" in parts:
            new = run.apply(parts["out"], new)
        return replace_first_output(output, new) if changed(new, out) else None

    stack.enter_context(output_hook(module, after))


def _qkv(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
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


def _mlp_in(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """The MLP's pre-activation (and a gated MLP's linear input): one module each, or one fused [gate | up]."""
    module = next(iter(parts.values())).module
    layer = next(iter(parts.values())).layer
    linear = run.known.get(f"blocks.{layer}.mlp.hook_pre_linear")
    fused = linear is not None and linear.module is run.known[f"blocks.{layer}.mlp.hook_pre"].module

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if not fused:
            (point,) = parts.values()
            new = run.apply(point, output)
            return new if changed(new, output) else None
        pieces = output.chunk(2, dim=-1)
        names = ("pre", "pre_linear")
        hooked = [run.apply(parts[p], piece) if p in parts else piece for p, piece in zip(names, pieces)]
        rebuilt = any(run.rebuild(parts[p], a, b) for p, a, b in zip(names, hooked, pieces) if p in parts)
        return torch.cat(hooked, dim=-1) if rebuilt else None

    stack.enter_context(output_hook(module, after))


def _embeddings(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
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
        return (args, {**kwargs, "inputs_embeds": new}) if changed(new, h) else None

    stack.enter_context(input_hook(base, before))
    stack.enter_context(output_hook(base, lambda module, args, kwargs, output: call.close()))


def _attention(run: Run, parts: dict[str, Point], stack: ExitStack) -> None:
    """The points inside the attention function (:mod:`contllm.internals.hooked_attention`), of every layer at once."""
    modules: dict[nn.Module, dict[str, Point]] = {}
    for p in parts.values():
        modules.setdefault(p.module, {})[p.part] = p
    hooked_attention.install(run.apply, modules, stack, run.net)


#: The installer of each site: installer(run, parts, stack) hooks the points ``parts`` ({part or site: point})
#: of one module, or of every module for the sites that :func:`group` installs at once.
SITES: dict[str, Callable[[Run, dict[str, Point], ExitStack], None]] = {
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
LATER = {"embeddings": 1, "attention": 2}


def group(point: Point) -> tuple[str, int, str]:
    """(installer, module, key): points with the same installer and module are installed together, each under its key."""
    if point.site in _AT_ONCE:
        return _AT_ONCE[point.site], 0, point.name if point.site == "attention" else point.site
    return point.site, id(point.module), point.part or point.site
