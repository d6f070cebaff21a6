"""Hook plumbing: read and rewrite what a decoder layer gets and returns, for as long as a context lasts.

Decoder layers (and norms) of transformers models take their hidden states as the first
positional argument or by keyword, and return a tensor or a tuple (or list) whose first
element is the hidden states. :func:`hidden_of` / :func:`with_hidden` read and replace
the input, :func:`first_output` / :func:`replace_first_output` the output.

:func:`output_hook` and :func:`input_hook` register a forward hook / forward pre-hook
(both with keyword arguments) on one module inside a ``with`` block and remove it on
exit, also when the body raises; :func:`replaced_forward`, :func:`replaced_module` and
:func:`replaced_parameter` patch a module (its forward, a child, a parameter) the same
way and put back what was there. For several modules, enter one per module on a
:class:`contextlib.ExitStack`.

These five are the raw-layer API: every module of contllm that changes a model's
computation during a call (the named hooks of :mod:`contllm.internals.intervention`, gradients,
the float32 state, continuous positions, depth, pde, attribution) installs through them
and registers or patches nothing itself (tests/unit/test_one_installer.py checks it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from contllm.errors import UnsupportedModelError

#: Keywords under which layers and norms take their hidden states when not positional.
HIDDEN_KEYWORDS = ("hidden_states", "input", "x")

#: fn(module, args, kwargs, output) -> a replacement output, or None to keep it.
OutputFn = Callable[[torch.nn.Module, tuple, dict, Any], Any]
#: fn(module, args, kwargs) -> (args, kwargs) to call the module with instead, or None to keep them.
InputFn = Callable[[torch.nn.Module, tuple, dict], "tuple[tuple, dict] | None"]


def _no_hidden() -> UnsupportedModelError:
    return UnsupportedModelError(
        "a decoder layer was called without hidden states as its first argument "
        f"or as one of the keywords {', '.join(HIDDEN_KEYWORDS)}"
    )


def hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a layer (or norm) was called with: first positional, else by keyword.

    Raises UnsupportedModelError when there are none.
    """
    if args:
        return args[0]
    for key in HIDDEN_KEYWORDS:
        if key in kwargs:
            return kwargs[key]
    raise _no_hidden()


def with_hidden(args: tuple, kwargs: dict, h: torch.Tensor) -> tuple[tuple, dict]:
    """(args, kwargs) with the hidden states replaced by ``h``, where :func:`hidden_of` found them.

    Returns new containers; the given ones are not changed.
    """
    if args:
        return (h, *args[1:]), kwargs
    for key in HIDDEN_KEYWORDS:
        if key in kwargs:
            return args, {**kwargs, key: h}
    raise _no_hidden()


def first_output(output: Any) -> torch.Tensor:
    """The hidden states a layer returned: the output itself, or its first element for a tuple or list."""
    return output[0] if isinstance(output, (tuple, list)) else output


def replace_first_output(output: Any, h: torch.Tensor) -> Any:
    """``output`` with its hidden states replaced by ``h``, keeping its type (tensor, tuple or list)."""
    if isinstance(output, tuple):
        return (h, *output[1:])
    if isinstance(output, list):
        return [h, *output[1:]]
    return h


#: The ids of the hooks registered through this module and held now (:func:`foreign_hooks` leaves them out).
_HELD: set[int] = set()


@contextmanager
def _held(handle: RemovableHandle) -> Iterator[None]:
    """Keep a registered hook while the context lasts; remove it on exit, also when the body raises."""
    _HELD.add(handle.id)
    try:
        yield
    finally:
        handle.remove()
        _HELD.discard(handle.id)


def recorder(hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` is transformers' own output recorder.

    A forward with ``output_hidden_states`` or ``output_attentions`` leaves these on the layers
    for good; they record only while transformers collects outputs, which contllm never
    asks for, so they read nothing and change nothing.
    """
    return str(getattr(hook, "__module__", "")).startswith("transformers.") and "captur" in str(
        getattr(hook, "__qualname__", "")
    )


def foreign_hooks(model: torch.nn.Module) -> bool:
    """Whether a forward hook or pre-hook sits on a module of ``model`` that was registered elsewhere than through
    :func:`output_hook` / :func:`input_hook` (a torch hook of the user's; transformers' :func:`recorder` aside)."""
    return any(
        key not in _HELD and not recorder(fn)
        for module in model.modules()
        for hooks in (module._forward_hooks, module._forward_pre_hooks)
        for key, fn in hooks.items()
    )


@contextmanager
def output_hook(module: torch.nn.Module, fn: OutputFn) -> Iterator[None]:
    """Call ``fn(module, args, kwargs, output)`` after every forward of ``module`` while the context lasts.

    A non-None return value replaces the module's output (see :func:`replace_first_output`).
    The hook is removed on exit, also when the body raises.
    """
    with _held(module.register_forward_hook(fn, with_kwargs=True)):
        yield


@contextmanager
def input_hook(module: torch.nn.Module, fn: InputFn) -> Iterator[None]:
    """Call ``fn(module, args, kwargs)`` before every forward of ``module`` while the context lasts.

    A non-None return value must be a pair (args, kwargs) that the module is called with
    instead (see :func:`with_hidden`). The hook is removed on exit, also when the body raises.
    """
    with _held(module.register_forward_pre_hook(fn, with_kwargs=True)):
        yield


@contextmanager
def replaced_forward(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """Call ``forward`` instead of ``module``'s forward while the context lasts (an attribute of the instance).

    On exit, also when the body raises, the instance's earlier ``forward`` attribute is
    back, or there is none and the class's forward runs again.
    """
    previous = vars(module).get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if previous is None:
            vars(module).pop("forward", None)
        else:
            module.forward = previous


@contextmanager
def replaced_module(parent: torch.nn.Module, name: str, module: torch.nn.Module) -> Iterator[None]:
    """``parent``'s child ``name`` is ``module`` while the context lasts; the original is back on exit, also on an exception."""
    original = getattr(parent, name)
    setattr(parent, name, module)
    try:
        yield
    finally:
        setattr(parent, name, original)


@contextmanager
def replaced_parameter(module: torch.nn.Module, name: str, parameter: torch.nn.Parameter) -> Iterator[None]:
    """``module``'s own parameter ``name`` is ``parameter`` while the context lasts; the original object is back on exit."""
    original = module._parameters[name]
    module._parameters[name] = parameter
    try:
        yield
    finally:
        module._parameters[name] = original


#: The names a KV cache goes by in transformers' forwards and outputs: ``cache`` in later
#: 5.x releases (``past_key_values`` is then a deprecated alias), ``past_key_values`` before.
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes its KV cache by (so no deprecated alias is used)."""
    parameters = inspect.signature(model.forward).parameters
    return next((name for name in CACHE_KEYWORDS if name in parameters), CACHE_KEYWORDS[-1])


def cache_of(output: Any) -> Any:
    """The KV cache a model output (or a layer's keyword arguments, as a dict) carries, or None."""
    if isinstance(output, dict) and not hasattr(output, "to_tuple"):
        return next((output[name] for name in CACHE_KEYWORDS if output.get(name) is not None), None)
    fields = getattr(type(output), "__dataclass_fields__", {})
    return next((getattr(output, name) for name in CACHE_KEYWORDS if name in fields), None)
