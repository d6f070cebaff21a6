"""Depth continuity: the layer stack of a stock model read as a discretised ODE.

A residual block maps its input h_l to Φ_l(h_l) = h_l + f_l(h_l): one forward Euler step
of size 1 of dh/dt = f(h, t). If a pretrained model behaves like a discretised flow, its
updates are small and vary smoothly with depth, nearby trajectories contract where the
flow does, and splitting a step in two barely changes the output. The probes here
measure that at inference, on an unmodified model:

* :func:`step_profile`: ||f_l|| / ||h_l||, the curvature ||f_{l+1} - f_l|| / ||f_l||
  and cos(f_l, f_{l+1}) per layer and token;
* :func:`sampled_lipschitz` and :func:`jacobian_bounds`: Lipschitz and one-sided
  Lipschitz constants of f_l from random perturbations, and their infinitesimal versions
  (largest singular value of J, largest eigenvalue of (J + J^T) / 2) from Jacobian-vector
  products, by Lanczos (a Krylov refinement of power iteration) or power iteration;
* :func:`propagate`: a perturbation injected at one layer and position, followed
  through depth to the output distribution;
* :func:`scaled_updates` and :func:`fractional_depth`: every (or one) update scaled,
  h + alpha f_l(h), alpha in [0, 2];
* :func:`half_steps` and :func:`half_step_defects`: each step replaced by two half
  steps, and the local defect ||h'' - Φ_l(h)|| / ||f_l(h)||.

h_l is read by hooks on the decoder layers (the model's own final hidden state comes
after the final norm). Every change to the model is a context manager whose hooks are
removed on exit, also when the body raises; with none active the model is the stock one.
:func:`run_depth` runs all probes on a few prompts and returns a :class:`DepthResult`
that saves itself (JSON, CSV) and draws its figures; :func:`run_depth_command` is
``contllm run depth``.

Forwards here never use a KV cache (``use_cache=False``): the probes call a layer again
with the arguments it got in a normal forward, which would append to a cache twice.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from contllm.errors import ExperimentError, UnsupportedModelError
from contllm.experiments.base import parse_floats, parse_ints

# ---------------------------------------------------------------------------- the layer stack

#: Where each family keeps its decoder layers and its final norm (attribute paths from the
#: causal-LM model); families not listed use ``DEFAULT_STACK``.
LAYER_STACKS: dict[str, tuple[str, str]] = {
    "gpt2": ("transformer.h", "transformer.ln_f"),
    "gpt_neox": ("gpt_neox.layers", "gpt_neox.final_layer_norm"),
    "phi": ("model.layers", "model.final_layernorm"),
}
DEFAULT_STACK = ("model.layers", "model.norm")

ALPHA_RANGE = (0.0, 2.0)


def _attribute(root: Any, path: str) -> Any:
    obj = root
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _model_type(model: Any) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", ""))


def _family_name(model: Any) -> str:
    from contllm.families import family_of

    try:
        return family_of(model.config).name
    except UnsupportedModelError:
        return _model_type(model)


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The ModuleList of decoder layers of a causal LM, in order."""
    layers_path, _ = LAYER_STACKS.get(_family_name(model), DEFAULT_STACK)
    layers = _attribute(model, layers_path)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise UnsupportedModelError(
            f"no decoder layers at {type(model).__name__}.{layers_path}; "
            f"known layer stacks: {', '.join(f'{k}: {v[0]}' for k, v in LAYER_STACKS.items())}, otherwise {DEFAULT_STACK[0]}"
        )
    return layers


def final_norm(model: Any) -> torch.nn.Module:
    """The norm between the last decoder layer and the read-out head."""
    _, norm_path = LAYER_STACKS.get(_family_name(model), DEFAULT_STACK)
    norm = _attribute(model, norm_path)
    if not isinstance(norm, torch.nn.Module):
        raise UnsupportedModelError(f"no final norm at {type(model).__name__}.{norm_path}")
    return norm


def layer_index(layer: int, n_layers: int) -> int:
    """``layer`` (negative from the end) as an index 0 .. n_layers - 1; ExperimentError outside the model."""
    n = n_layers
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -n <= int(layer) < n:
        raise ExperimentError(f"layer {layer} is outside the model; it has {n} layers (0 to {n - 1}, or -{n} to -1)")
    return int(layer) % n


def _hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a layer (or norm) was called with: first positional, else by keyword."""
    if args:
        return args[0]
    for key in ("hidden_states", "input", "x"):
        if key in kwargs:
            return kwargs[key]
    raise UnsupportedModelError("a decoder layer was called without hidden states as its first argument")


def _with_hidden(args: tuple, kwargs: dict, h: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (h, *args[1:]), kwargs
    for key in ("hidden_states", "input", "x"):
        if key in kwargs:
            return args, {**kwargs, key: h}
    raise UnsupportedModelError("a decoder layer was called without hidden states as its first argument")


def _first(output: Any) -> torch.Tensor:
    """Layers return a tensor or a tuple whose first element is the hidden states."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _replace_first(output: Any, h: torch.Tensor) -> Any:
    if isinstance(output, tuple):
        return (h, *output[1:])
    if isinstance(output, list):
        return [h, *output[1:]]
    return h


def _check_no_cache(args: tuple, kwargs: dict) -> None:
    if kwargs.get("use_cache"):
        raise ExperimentError("depth probes call layers twice and cannot run with a KV cache; pass use_cache=False")


@dataclass
class LayerCall:
    """One decoder layer with the arguments it received in a forward: Φ_l as a function of h.

    Calling it runs the layer's ``forward`` directly (no hooks fire) on new hidden states
    [batch, tokens, hidden] with the same attention mask, position embeddings and other
    arguments, and returns the layer's hidden-state output.
    """

    layer: torch.nn.Module
    args: tuple
    kwargs: dict

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        args, kwargs = _with_hidden(self.args, self.kwargs, h)
        return _first(self.layer.forward(*args, **kwargs))

    def update(self, h: torch.Tensor) -> torch.Tensor:
        """f_l(h) = Φ_l(h) - h."""
        return self(h) - h


@dataclass
class Trace:
    """A stock forward of one prompt, read along depth.

    input_ids: [tokens]. states: [layers + 1, tokens, hidden], h_0 (the first layer's
    input) to h_L (the final norm's input), in the model's dtype. calls: one
    :class:`LayerCall` per layer. logits: [tokens, vocab], float32. keep: [tokens] bool,
    the positions that enter statistics (all but the first, by default). outputs: what
    each layer returned (a tensor or a tuple), for :func:`replayed`.
    """

    input_ids: torch.Tensor
    states: torch.Tensor
    calls: list[LayerCall]
    logits: torch.Tensor
    keep: torch.Tensor
    outputs: list[Any] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return len(self.calls)

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[-1])

    def h(self, layer: int) -> torch.Tensor:
        """h_layer with a batch dimension: [1, tokens, hidden]."""
        return self.states[layer][None]

    def updates(self) -> torch.Tensor:
        """f_l(h_l) = h_{l+1} - h_l for every layer: [layers, tokens, hidden]."""
        return self.states[1:] - self.states[:-1]


class LayerStack:
    """The decoder layers of a stock causal LM, with hooks to read and rewrite the residual stream.

    model: a transformers causal LM of a supported family (tiny random ones included).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layers = decoder_layers(model)
        self.norm = final_norm(model)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def layer_index(self, layer: int) -> int:
        """A layer index (negative from the end) checked against the model; ExperimentError outside."""
        return layer_index(layer, self.n_layers)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [tokens, vocab] (float32) of one prompt, input_ids [tokens], without a KV cache."""
        return self.forward_rows(input_ids, 1)[0]

    def forward_rows(self, input_ids: torch.Tensor, rows: int) -> torch.Tensor:
        """Logits [rows, tokens, vocab] (float32) of one prompt repeated in ``rows`` batch rows.

        Patches that act per row (several alphas, several perturbations) then cost one
        batched forward instead of one forward each.
        """
        ids = input_ids.reshape(1, -1).expand(rows, -1).to(self.device)
        with torch.no_grad():
            return self.model(input_ids=ids, use_cache=False).logits.float()

    def trace(self, input_ids: torch.Tensor, *, skip_first: bool = True) -> Trace:
        """Run one prompt and record every layer's input, its call arguments and the logits."""
        inputs: dict[int, torch.Tensor] = {}
        calls: dict[int, LayerCall] = {}
        outputs: dict[int, Any] = {}
        final: list[torch.Tensor] = []

        def recorder(index: int) -> Callable:
            def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
                inputs[index] = _hidden_of(args, kwargs).detach()
                calls[index] = LayerCall(module, args, kwargs)

            return hook

        def output_recorder(index: int) -> Callable:
            def hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
                outputs[index] = output

            return hook

        def norm_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            final.append(_hidden_of(args, kwargs).detach())

        with ExitStack() as stack:
            for i, layer in enumerate(self.layers):
                stack.callback(layer.register_forward_pre_hook(recorder(i), with_kwargs=True).remove)
                stack.callback(layer.register_forward_hook(output_recorder(i)).remove)
            stack.callback(self.norm.register_forward_pre_hook(norm_hook, with_kwargs=True).remove)
            logits = self.forward(input_ids)
        if len(inputs) != self.n_layers or len(final) != 1:
            raise UnsupportedModelError(
                f"expected each of {self.n_layers} layers and the final norm to run once; "
                f"saw {len(inputs)} layers and {len(final)} norm calls"
            )
        for call in calls.values():
            _check_no_cache(call.args, call.kwargs)
        states = torch.stack([inputs[i][0] for i in range(self.n_layers)] + [final[0][0]])
        keep = torch.ones(states.shape[1], dtype=torch.bool)
        if skip_first and len(keep) > 1:
            keep[0] = False
        ordered = range(self.n_layers)
        return Trace(
            input_ids.reshape(-1).cpu(), states, [calls[i] for i in ordered], logits, keep, [outputs[i] for i in ordered]
        )


# ---------------------------------------------------------------------------- scoped patches


Rule = Callable[[LayerCall, torch.Tensor, torch.Tensor], torch.Tensor]


@contextmanager
def _layer_rules(stack: LayerStack, rules: Mapping[int, Rule]) -> Iterator[None]:
    """Replace layer l's output by rules[l](call, h, Φ_l(h)) for as long as the context lasts."""

    def hook_for(rule: Callable) -> Callable:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            h = _hidden_of(args, kwargs)
            return _replace_first(output, rule(LayerCall(module, args, kwargs), h, _first(output)))

        return hook

    with ExitStack() as hooks:
        for index, rule in rules.items():
            handle = stack.layers[index].register_forward_hook(hook_for(rule), with_kwargs=True)
            hooks.callback(handle.remove)
        yield


def check_alpha(alpha: float) -> float:
    """alpha as a float in [0, 2]; ExperimentError otherwise."""
    low, high = ALPHA_RANGE
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ExperimentError(f"alpha must be a number in [{low:g}, {high:g}], got {alpha!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise ExperimentError(f"alpha must lie in [{low:g}, {high:g}], got {alpha!r}")
    return value


Alpha = float | Sequence[float]


@contextmanager
def scaled_updates(stack: LayerStack, alpha: Alpha | Mapping[int, Alpha]) -> Iterator[None]:
    """Layers compute h + alpha f_l(h) instead of h + f_l(h) while the context lasts.

    alpha: one value for every layer, or {layer: alpha} for some (others unchanged);
    each in [0, 2]. A value may also be a sequence of one alpha per batch row (for
    :meth:`LayerStack.forward_rows`). Layers with alpha = 1 are left untouched, so their
    output is bitwise the stock one; alpha = 0 returns the layer's input exactly.
    """
    alphas = {i: alpha for i in range(stack.n_layers)} if not isinstance(alpha, Mapping) else dict(alpha)
    rules: dict[int, Callable] = {}
    for layer, value in alphas.items():
        index = stack.layer_index(layer)
        if isinstance(value, (int, float, np.integer, np.floating)):
            a: Any = check_alpha(value)
            if a == 1.0:
                continue
        else:
            per_row = [check_alpha(v) for v in value]
            if all(v == 1.0 for v in per_row):
                continue
            a = torch.tensor(per_row, dtype=torch.float64)[:, None, None]

        def rule(call: LayerCall, h: torch.Tensor, out: torch.Tensor, a: Any = a) -> torch.Tensor:
            weight = a.to(device=h.device, dtype=h.dtype) if isinstance(a, torch.Tensor) else a
            # lerp is exact at both ends: h at 0, Φ(h) at 1.
            return torch.lerp(h, out, weight)

        rules[index] = rule
    with _layer_rules(stack, rules):
        yield


def half_step(
    call: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Two Euler half steps of the update of ``call`` (Φ): h' = h + f(h)/2, h'' = h' + f(h')/2.

    out: Φ(h) when already known. Returns h''.
    """
    out = call(h) if out is None else out
    middle = torch.lerp(h, out, 0.5)
    return torch.lerp(middle, call(middle), 0.5)


@contextmanager
def half_steps(stack: LayerStack, layers: Iterable[int] | None = None) -> Iterator[None]:
    """Each chosen layer (None: all) takes two half steps instead of one step while the context lasts."""
    chosen = range(stack.n_layers) if layers is None else [stack.layer_index(i) for i in layers]

    def rule(call: LayerCall, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        _check_no_cache(call.args, call.kwargs)
        return half_step(call, h, out)

    with _layer_rules(stack, {i: rule for i in chosen}):
        yield


@contextmanager
def injected(stack: LayerStack, layer: int, delta: torch.Tensor) -> Iterator[None]:
    """Add delta to the input of ``layer`` while the context lasts.

    delta: [tokens, hidden] for every batch row, or [rows, tokens, hidden], one per row.
    """
    index = stack.layer_index(layer)

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        h = _hidden_of(args, kwargs)
        return _with_hidden(args, kwargs, h + delta.to(device=h.device, dtype=h.dtype))

    handle = stack.layers[index].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def recording(stack: LayerStack) -> Iterator[list[torch.Tensor]]:
    """Yield a list that fills with h_0 .. h_L ([batch, tokens, hidden] each) during forwards in the context."""
    states: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        states.append(_hidden_of(args, kwargs).detach())

    with ExitStack() as hooks:
        for layer in stack.layers:
            hooks.callback(layer.register_forward_pre_hook(hook, with_kwargs=True).remove)
        hooks.callback(stack.norm.register_forward_pre_hook(hook, with_kwargs=True).remove)
        yield states


@contextmanager
def replayed(stack: LayerStack, trace: Trace, upto: int) -> Iterator[None]:
    """Layers 0 .. upto - 1 return what they returned in ``trace`` instead of computing it.

    For forwards of the same prompt whose changes all lie at layer ``upto`` or later:
    the earlier layers would compute exactly the recorded values, so the result is the
    same and the forward costs only the layers from ``upto`` on. Hooks on the replayed
    layers still fire. The layers' own ``forward`` is restored on exit.
    """
    if not 0 <= upto <= stack.n_layers or len(trace.outputs) != stack.n_layers:
        raise ExperimentError(f"cannot replay {upto} of {stack.n_layers} layers from this trace")
    patched: list[tuple[torch.nn.Module, Any]] = []

    def copy(output: Any, rows: int) -> Any:
        # A fresh tensor per call, repeated over the batch rows of the forward.
        if isinstance(output, torch.Tensor):
            return output.expand(rows, *output.shape[1:]).clone()
        if isinstance(output, (tuple, list)):
            return type(output)(copy(o, rows) for o in output)
        return output

    def replay(output: Any) -> Callable:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return copy(output, _hidden_of(args, kwargs).shape[0])

        return forward

    try:
        for index in range(upto):
            layer = stack.layers[index]
            patched.append((layer, vars(layer).get("forward")))
            layer.forward = replay(trace.outputs[index])
        yield
    finally:
        for layer, previous in reversed(patched):
            if previous is None:
                del layer.forward
            else:
                layer.forward = previous


# ---------------------------------------------------------------------------- measurements


def _norms(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x.double(), dim=-1)


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats over the last dimension, from logits (float64 inside)."""
    log_p = torch.log_softmax(p_logits.double(), dim=-1)
    log_q = torch.log_softmax(q_logits.double(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0)


def step_profile(trace: Trace) -> dict[str, np.ndarray]:
    """Per layer and kept token: ratio ||f_l|| / ||h_l|| [L, n], curvature
    ||f_{l+1} - f_l|| / ||f_l|| [L-1, n], cosine cos(f_l, f_{l+1}) [L-1, n], and ||h_l|| [L+1, n]."""
    states = trace.states.cpu()[:, trace.keep.cpu()].double()
    f = states[1:] - states[:-1]
    f_norm = _norms(f)
    tiny = torch.finfo(torch.float64).tiny
    ratio = f_norm / _norms(states[:-1]).clamp_min(tiny)
    curvature = _norms(f[1:] - f[:-1]) / f_norm[:-1].clamp_min(tiny)
    cosine = torch.nn.functional.cosine_similarity(f[1:], f[:-1], dim=-1)
    return {
        "ratio": ratio.numpy(),
        "curvature": curvature.numpy(),
        "cosine": cosine.numpy(),
        "h_norm": _norms(states).numpy(),
    }


def _direction(h: torch.Tensor, kind: str, eps: float, keep: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A perturbation [.., tokens, hidden] with ||δ_t|| = eps ||h_t|| on kept tokens, 0 elsewhere.

    kind "orthogonal": random and orthogonal to h_t; "along": ±eps h_t (random sign per token).
    """
    hd = h.double()
    if kind == "along":
        sign = torch.where(torch.rand(hd.shape[:-1], generator=generator, dtype=torch.float64) < 0.5, -1.0, 1.0)
        delta = sign[..., None] * hd
    elif kind == "orthogonal":
        noise = torch.randn(hd.shape, generator=generator, dtype=torch.float64)
        unit = hd / _norms(hd).clamp_min(1e-300)[..., None]
        noise = noise - (noise * unit).sum(-1, keepdim=True) * unit
        delta = noise * (_norms(hd) / _norms(noise).clamp_min(1e-300))[..., None]
    else:
        raise ExperimentError(f"perturbation kind must be 'orthogonal' or 'along', got {kind!r}")
    delta = eps * delta * keep.to(torch.float64)[:, None]
    return delta.to(dtype=h.dtype)


def sampled_lipschitz(
    f: Callable[[torch.Tensor], torch.Tensor],
    h: torch.Tensor,
    *,
    eps: float,
    samples: int = 8,
    kind: str = "orthogonal",
    keep: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Secant estimates of the Lipschitz constant L and one-sided Lipschitz constant μ of f at h.

    f: a map of [batch, tokens, hidden] (an update f_l, or any callable); h: [1, tokens, hidden].
    Each of ``samples`` perturbations δ has ||δ_t|| = eps ||h_t|| on the kept tokens
    (keep: [tokens] bool; None keeps all) and is orthogonal to h or along it (``kind``).
    The sequence is one vector: L = max ||f(h+δ) - f(h)|| / ||δ|| and
    μ = max <f(h+δ) - f(h), δ> / ||δ||^2 over the samples (Frobenius norms).
    Returns {"L", "mu"} and the means {"L_mean", "mu_mean"}.
    """
    if not (math.isfinite(eps) and eps > 0):
        raise ExperimentError(f"eps must be a positive number, got {eps!r}")
    if samples < 1:
        raise ExperimentError(f"samples must be >= 1, got {samples}")
    keep = torch.ones(h.shape[-2], dtype=torch.bool) if keep is None else keep.cpu()
    generator = generator or torch.Generator().manual_seed(0)
    with torch.no_grad():
        base = f(h).double()
        lips, mus = [], []
        for _ in range(samples):
            delta = _direction(h[0].cpu(), kind, eps, keep, generator)[None].to(h.device)
            diff = f(h + delta).double() - base
            d = (h + delta).double() - h.double()  # the perturbation as actually represented
            d2 = float((d * d).sum())
            if d2 == 0.0:
                continue
            lips.append(float(torch.linalg.vector_norm(diff)) / math.sqrt(d2))
            mus.append(float((diff * d).sum()) / d2)
    if not lips:
        raise ExperimentError(f"eps {eps} is too small to perturb these hidden states in {h.dtype}")
    return {"L": max(lips), "mu": max(mus), "L_mean": float(np.mean(lips)), "mu_mean": float(np.mean(mus))}


@dataclass
class JacobianBounds:
    """Krylov estimates for the Jacobian J of a map at a point.

    sigma_max: largest singular value of J (the infinitesimal Lipschitz constant).
    lambda_max: largest eigenvalue of S = (J + J^T) / 2 (the infinitesimal one-sided
    Lipschitz constant; negative: nearby trajectories of dh/dt = f(h) contract).
    Both are Rayleigh quotients, so they approach the true values from below;
    sigma_residual and lambda_residual are ||A y - θ y|| / |θ| of the returned pair
    (A = J^T J or S), a measure of how far from converged they are.
    """

    sigma_max: float
    lambda_max: float
    sigma_residual: float
    lambda_residual: float


def _extreme_eigenvalue(
    apply: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, iters: int, method: str
) -> tuple[float, float]:
    """Largest eigenvalue of a symmetric operator and its relative residual, from ``iters`` products.

    "lanczos": the largest Ritz value of the Krylov space (fully reorthogonalised);
    "power": power iteration on A + s I with s = 1.1 max|Rayleigh quotient| of a first
    power-iteration pass (iters products each), so that the largest eigenvalue dominates.
    """

    def dot(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() * b.double()).sum())

    def norm(v: torch.Tensor) -> float:
        return math.sqrt(max(dot(v, v), 0.0))

    tiny = 1e-300
    if method == "lanczos":
        basis = [start / max(norm(start), tiny)]
        diagonal: list[float] = []
        offdiagonal: list[float] = []
        for j in range(iters):
            w = apply(basis[j])
            diagonal.append(dot(basis[j], w))
            for _ in range(2):  # twice is enough to keep the basis orthogonal in floating point
                for q in basis:
                    w = w - dot(q, w) * q
            beta = norm(w)
            if j == iters - 1 or beta <= 1e-7 * max(abs(diagonal[-1]), max(map(abs, offdiagonal), default=0.0), tiny):
                break
            offdiagonal.append(beta)
            basis.append(w / beta)
        k = len(diagonal)
        t = np.diag(diagonal) + np.diag(offdiagonal[: k - 1], 1) + np.diag(offdiagonal[: k - 1], -1)
        values, vectors = np.linalg.eigh(t)
        theta = float(values[-1])
        residual = abs(beta * float(vectors[-1, -1])) / max(abs(theta), tiny)
        return theta, residual
    if method != "power":
        raise ExperimentError(f"method must be 'lanczos' or 'power', got {method!r}")
    v = start / max(norm(start), tiny)
    rho = 0.0
    for _ in range(iters):
        w = apply(v)
        rho = max(rho, abs(dot(v, w)), norm(w))
        v = w / max(norm(w), tiny)
    shift = 1.1 * rho
    v = start / max(norm(start), tiny)
    theta, best = -math.inf, v
    for _ in range(iters):
        w = apply(v)
        q = dot(v, w)
        if q > theta:
            theta, best = q, v
        shifted = w + shift * v
        if norm(shifted) == 0.0:
            break
        v = shifted / norm(shifted)
    residual = norm(apply(best) - theta * best) / max(abs(theta), tiny)
    return theta, residual


def jacobian_bounds(
    f: Callable[[torch.Tensor], torch.Tensor],
    h: torch.Tensor,
    *,
    iters: int = 10,
    sigma_iters: int | None = None,
    keep: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    method: str = "lanczos",
) -> JacobianBounds:
    """σ_max(J) and λ_max((J + J^T)/2) of f at h from Jacobian-vector products.

    f: a map of [batch, tokens, hidden]; h: [1, tokens, hidden]. J is restricted to the
    kept tokens (inputs and outputs; keep: [tokens] bool). λ_max uses ``iters`` products
    with J (forward mode) and as many with J^T (reverse mode), (J v + J^T v) / 2; σ_max
    uses ``sigma_iters`` (None: iters) of each, J^T J v (it converges faster).
    method "lanczos" (default) keeps the whole Krylov space of the iteration and returns
    its best Rayleigh quotient, which converges much faster than the last iterate of
    "power" iteration (also available, with a shift that makes the largest eigenvalue the
    dominant one). Attention runs with the math SDPA kernel here, the one with
    forward-mode derivatives.
    """
    sigma_iters = iters if sigma_iters is None else sigma_iters
    if iters < 1 or sigma_iters < 1:
        raise ExperimentError(f"iters must be >= 1, got {min(iters, sigma_iters)}")
    generator = generator or torch.Generator().manual_seed(0)
    keep = torch.ones(h.shape[-2], dtype=torch.bool) if keep is None else keep.cpu()
    mask = keep.to(device=h.device, dtype=h.dtype)[None, :, None]
    h = h.detach()

    def start() -> torch.Tensor:
        return torch.randn(h.shape, generator=generator, dtype=torch.float32).to(device=h.device, dtype=h.dtype) * mask

    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        _, vjp_fn = torch.func.vjp(f, h)

        def jv(v: torch.Tensor) -> torch.Tensor:
            return torch.func.jvp(f, (h,), (v * mask,))[1] * mask

        def jtv(u: torch.Tensor) -> torch.Tensor:
            return vjp_fn(u * mask)[0] * mask

        sigma2, sigma_residual = _extreme_eigenvalue(lambda v: jtv(jv(v)), start(), sigma_iters, method)
        lam, lambda_residual = _extreme_eigenvalue(lambda v: 0.5 * (jv(v) + jtv(v)), start(), iters, method)
    return JacobianBounds(math.sqrt(max(sigma2, 0.0)), lam, sigma_residual, lambda_residual)


def finite_difference(
    f: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, v: torch.Tensor, step: float = 1e-3
) -> torch.Tensor:
    """Central difference (f(h + step v) - f(h - step v)) / (2 step): J v up to O(step^2)."""
    with torch.no_grad():
        return (f(h + step * v) - f(h - step * v)) / (2 * step)


def jvp(f: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The Jacobian-vector product J v of f at h (forward mode; math SDPA kernel)."""
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        return torch.func.jvp(f, (h.detach(),), (v,))[1]


def propagate(
    stack: LayerStack,
    trace: Trace,
    *,
    layer: int,
    position: int,
    eps: float,
    direction: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Any]:
    """Inject δ at the input of ``layer`` and ``position`` and follow it to the output.

    ||δ|| = eps ||h_layer[position]||; direction: [hidden] (None: random Gaussian).
    Returns, for l = layer .. L (curves of L - layer + 1 values):
      gain: ||h'_l[p] - h_l[p]|| / ||δ||  (at the perturbed position);
      spread: ||h'_l[p:] - h_l[p:]||_F / ||δ||  (the position and every later one);
      relative: (||h'_l[p] - h_l[p]|| / ||h_l[p]||) / eps;
      growth: log(gain_{l+1} / gain_l), per layer (L - layer values);
    and earlier: max |h'_l[:p] - h_l[:p]| over all layers (0 for a causal model),
    kl_last / kl_max: KL(p' || p) at the last position / the largest over positions >= p.
    """
    return propagate_sizes(
        stack, trace, layer=layer, position=position, eps=[eps], direction=direction, generator=generator
    )[0]


def propagate_sizes(
    stack: LayerStack,
    trace: Trace,
    *,
    layer: int,
    position: int,
    eps: Sequence[float],
    direction: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[dict[str, Any]]:
    """:func:`propagate` for several sizes of the same direction, in one batched forward; one record per eps."""
    index = stack.layer_index(layer)
    for e in eps:
        if not (math.isfinite(e) and e > 0):
            raise ExperimentError(f"eps must be a positive number, got {e!r}")
    n = trace.n_tokens
    if not 0 <= position < n:
        raise ExperimentError(f"position {position} is outside a prompt of {n} tokens")
    h_p = trace.states[index, position]
    if direction is None:
        generator = generator or torch.Generator().manual_seed(0)
        direction = torch.randn(h_p.shape, generator=generator, dtype=torch.float64)
    direction = direction.double().cpu()
    unit = direction * float(_norms(h_p)) / float(torch.linalg.vector_norm(direction))
    delta = torch.zeros((len(eps), *trace.states.shape[1:]), dtype=torch.float64)
    for row, e in enumerate(eps):
        delta[row, position] = e * unit
    delta = delta.to(dtype=trace.states.dtype)
    with replayed(stack, trace, index), injected(stack, index, delta), recording(stack) as states:
        logits = stack.forward_rows(trace.input_ids, len(eps))
    clean = trace.states.double().cpu()
    records = []
    for row, e in enumerate(eps):
        diff = torch.stack([s[row] for s in states]).double().cpu() - clean
        delta_norm = float(torch.linalg.vector_norm(delta[row].double()))
        at_p = _norms(diff[index:, position])
        gain = (at_p / delta_norm).numpy()
        spread = (torch.linalg.vector_norm(diff[index:, position:], dim=(-2, -1)) / delta_norm).numpy()
        relative = (at_p / _norms(clean[index:, position]).clamp_min(1e-300) / e).numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            growth = np.diff(np.log(gain))
        kl = kl_divergence(logits[row, position:], trace.logits[position:])
        records.append(
            {
                "layer": index,
                "position": position,
                "eps": float(e),
                "gain": gain,
                "spread": spread,
                "relative": relative,
                "growth": growth,
                "earlier": float(diff[:, :position].abs().max()) if position > 0 else 0.0,
                "kl_last": float(kl[-1]),
                "kl_max": float(kl.max()),
            }
        )
    return records


def _readout(logits: torch.Tensor, token_ids: Sequence[int]) -> np.ndarray:
    probs = torch.softmax(logits.double(), dim=-1)
    return probs[list(token_ids)].cpu().numpy()


def _entropy(logits: torch.Tensor) -> float:
    log_p = torch.log_softmax(logits.double(), dim=-1)
    return float(-(log_p.exp() * log_p).sum())


def fractional_depth(
    stack: LayerStack,
    trace: Trace,
    alphas: Sequence[float],
    *,
    layers: Sequence[int] = (),
    top_k: int = 5,
    rows: int = 8,
) -> dict[str, Any]:
    """Updates scaled by alpha, for every layer at once ("all") and for each of ``layers`` alone.

    Up to ``rows`` alphas share one batched forward.

    Returns {"alphas": [A], "top_ids": the k most probable next tokens of the stock model
    at the last position, "curves": {target: {"kl_last" [A], "kl_mean" [A] (over kept
    positions), "readout" [A, k] (probabilities of top_ids), "entropy" [A]}}} where
    target is "all" or a layer index as a string.
    """
    values = [check_alpha(a) for a in alphas]
    top_ids = [int(i) for i in torch.topk(trace.logits[-1], min(top_k, trace.logits.shape[-1])).indices]
    targets: list[tuple[str, Any]] = [("all", None)] + [(str(stack.layer_index(i)), stack.layer_index(i)) for i in layers]
    curves: dict[str, dict[str, list]] = {}
    keep = trace.keep
    moved = [a for a in values if a != 1.0]
    for name, index in targets:
        curve: dict[str, list] = {"kl_last": [], "kl_mean": [], "readout": [], "entropy": []}
        by_alpha: dict[float, torch.Tensor] = {1.0: trace.logits}
        for lo in range(0, len(moved), max(1, rows)):
            chunk = moved[lo : lo + max(1, rows)]
            with replayed(stack, trace, index or 0), scaled_updates(stack, chunk if index is None else {index: chunk}):
                batch = stack.forward_rows(trace.input_ids, len(chunk))
            by_alpha.update(zip(chunk, batch))
        for a in values:
            logits = by_alpha[a]
            kl = kl_divergence(logits, trace.logits).cpu()
            curve["kl_last"].append(float(kl[-1]))
            curve["kl_mean"].append(float(kl[keep].mean()) if bool(keep.any()) else float(kl.mean()))
            curve["readout"].append(_readout(logits[-1], top_ids).tolist())
            curve["entropy"].append(_entropy(logits[-1]))
        curves[name] = curve
    return {"alphas": values, "top_ids": top_ids, "curves": curves}


def half_step_defects(stack: LayerStack, trace: Trace, *, model_kl: bool = True) -> dict[str, Any]:
    """Two half steps against one full step, layer by layer.

    Local, on the stock trajectory: defect[l] = ||h'' - Φ_l(h_l)||_F / ||f_l(h_l)||_F over
    the kept tokens, and defect_median[l], the median of the same ratio per token.
    Model level (model_kl): KL(p_half || p) at the last position and its mean over kept
    positions, with every layer split ("kl_all_last", "kl_all_mean") and with layer l
    alone split ("kl_layer_last" [L], "kl_layer_mean" [L]).
    """
    keep = trace.keep
    defect, defect_median = [], []
    with torch.no_grad():
        for index, call in enumerate(trace.calls):
            h = trace.h(index)
            full = trace.h(index + 1)
            two = half_step(call, h, full)
            err = (two.double() - full.double())[0].cpu()[keep]
            f = (full.double() - h.double())[0].cpu()[keep]
            defect.append(float(torch.linalg.vector_norm(err) / torch.linalg.vector_norm(f).clamp_min(1e-300)))
            defect_median.append(float((_norms(err) / _norms(f).clamp_min(1e-300)).median()))
    out: dict[str, Any] = {"defect": np.asarray(defect), "defect_median": np.asarray(defect_median)}
    if model_kl:
        def kls(logits: torch.Tensor) -> tuple[float, float]:
            kl = kl_divergence(logits, trace.logits).cpu()
            return float(kl[-1]), float(kl[keep].mean()) if bool(keep.any()) else float(kl.mean())

        with half_steps(stack):
            out["kl_all_last"], out["kl_all_mean"] = kls(stack.forward(trace.input_ids))
        last, mean = [], []
        for index in range(stack.n_layers):
            with replayed(stack, trace, index), half_steps(stack, [index]):
                a, b = kls(stack.forward(trace.input_ids))
            last.append(a)
            mean.append(b)
        out["kl_layer_last"], out["kl_layer_mean"] = np.asarray(last), np.asarray(mean)
    return out


def layer_lipschitz(
    stack: LayerStack,
    trace: Trace,
    *,
    eps: Sequence[float],
    samples: int = 8,
    iters: int = 10,
    sigma_iters: int | None = 6,
    method: str = "lanczos",
    seed: int = 0,
) -> dict[str, Any]:
    """Per layer: sampled L and μ of f_l at h_l for each eps and kind, and the JVP bounds.

    Returns {"eps": [E], "L": {kind: [E, layers]}, "mu": {kind: [E, layers]},
    "sigma_max": [layers], "lambda_max": [layers], "sigma_residual", "lambda_residual"}
    (see :class:`JacobianBounds`).
    """
    kinds = ("orthogonal", "along")
    lips = {k: np.zeros((len(eps), stack.n_layers)) for k in kinds}
    mus = {k: np.zeros((len(eps), stack.n_layers)) for k in kinds}
    sigma, lam, sigma_residual, lambda_residual = [], [], [], []
    for index, call in enumerate(trace.calls):
        h = trace.h(index)
        for e, value in enumerate(eps):
            for k, kind in enumerate(kinds):
                generator = torch.Generator().manual_seed(seed * 1_000_003 + index * 101 + e * 7 + k)
                est = sampled_lipschitz(
                    call.update, h, eps=value, samples=samples, kind=kind, keep=trace.keep, generator=generator
                )
                lips[kind][e, index], mus[kind][e, index] = est["L"], est["mu"]
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
        bounds = jacobian_bounds(
            call.update, h, iters=iters, sigma_iters=sigma_iters, keep=trace.keep, generator=generator, method=method
        )
        sigma.append(bounds.sigma_max)
        lam.append(bounds.lambda_max)
        sigma_residual.append(bounds.sigma_residual)
        lambda_residual.append(bounds.lambda_residual)
    return {
        "eps": [float(v) for v in eps],
        "L": lips,
        "mu": mus,
        "sigma_max": np.asarray(sigma),
        "lambda_max": np.asarray(lam),
        "sigma_residual": np.asarray(sigma_residual),
        "lambda_residual": np.asarray(lambda_residual),
    }


# ---------------------------------------------------------------------------- the experiment


@dataclass(frozen=True)
class DepthPrompt:
    """A prompt of the depth probes: text (tokenized by the model's tokenizer) or token ids."""

    id: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None

    def ids(self, tokenizer: Any) -> torch.Tensor:
        """Token ids [tokens]."""
        if self.token_ids is not None:
            return torch.tensor(self.token_ids, dtype=torch.long)
        if tokenizer is None or self.text is None:
            raise ExperimentError(f"prompt {self.id!r} has no token ids and the model has no tokenizer")
        return torch.tensor(tokenizer(self.text, add_special_tokens=True)["input_ids"], dtype=torch.long)


#: The fixed prompts of ``contllm run depth``: prose, a fact whose next word is predictable,
#: and code. Each is 20-30 tokens for the embedded tokenizers.
PROMPTS: tuple[DepthPrompt, ...] = (
    DepthPrompt(
        "story",
        "Every evening the old lighthouse keeper climbed the narrow stairs, lit the great lamp, "
        "and watched the fishing boats return to the",
    ),
    DepthPrompt(
        "physics",
        "Water boils at one hundred degrees Celsius at sea level, but on a high mountain the air "
        "pressure is lower, so water boils at a",
    ),
    DepthPrompt("code", "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total /"),
)


def select_prompts(items: str | Sequence[str] | None, prompts: Sequence[DepthPrompt] = PROMPTS) -> list[DepthPrompt]:
    """All prompts (None), the first N ("2"), or those named ("story,code")."""
    if items is None:
        return list(prompts)
    if isinstance(items, str):
        text = items.strip()
        if text.isdigit():
            n = int(text)
            if n < 1:
                raise ExperimentError(f"--items must be >= 1, got {n}")
            return list(prompts)[:n]
        items = [p.strip() for p in text.split(",") if p.strip()]
    by_id = {p.id: p for p in prompts}
    unknown = [i for i in items if i not in by_id]
    if unknown:
        raise ExperimentError(f"unknown depth prompt(s) {', '.join(unknown)}; the prompts are {', '.join(by_id)}")
    return [by_id[i] for i in items]


DEFAULT_ALPHAS = tuple(float(a) for a in np.round(np.linspace(0.0, 2.0, 9), 6))


@dataclass
class DepthConfig:
    """Options of the depth probes.

    layers: the layers of the single-layer probes (alpha sweeps of one layer, injection
        sites of perturbations); negative from the end; None: the first, the quarter,
        the middle, three quarters and the last.
    eps: perturbation sizes relative to ||h|| (Lipschitz samples and propagation), > 0.
    alphas: update scales in [0, 2]; 1 is always added.
    samples: random perturbations per layer, eps and kind (orthogonal, along).
    iters, sigma_iters: Jacobian-vector products (and as many transposed ones) for λ_max
        and for σ_max.
    method: "lanczos" or "power" iteration for them (see :func:`jacobian_bounds`).
    position: where perturbations are injected, as a fraction of the prompt's kept
        positions (0: the second token, 1: the last).
    skip_first: leave the first position (the BOS token, or the attention sink that plays
        its part) out of every statistic and perturbation.
    top_k: tokens whose probabilities are followed along alpha.
    seed: random directions.
    """

    layers: tuple[int, ...] | None = None
    eps: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    samples: int = 4
    iters: int = 10
    sigma_iters: int = 6
    method: str = "lanczos"
    position: float = 0.5
    skip_first: bool = True
    top_k: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.layers is not None:
            self.layers = parse_ints(self.layers, "layers")
        self.eps = parse_floats(self.eps, "eps")
        for e in self.eps:
            if not (math.isfinite(e) and e > 0):
                raise ExperimentError(f"eps must be positive, got {e:g}")
        alphas = sorted({check_alpha(a) for a in parse_floats(self.alphas, "alphas")} | {1.0})
        self.alphas = tuple(alphas)
        if self.samples < 1:
            raise ExperimentError(f"samples must be >= 1, got {self.samples}")
        if self.iters < 1 or self.sigma_iters < 1:
            raise ExperimentError(f"iters and sigma_iters must be >= 1, got {self.iters}, {self.sigma_iters}")
        if self.method not in ("lanczos", "power"):
            raise ExperimentError(f"method must be 'lanczos' or 'power', got {self.method!r}")
        if not 0.0 <= self.position <= 1.0:
            raise ExperimentError(f"position must be a fraction in [0, 1], got {self.position}")
        if self.top_k < 1:
            raise ExperimentError(f"top_k must be >= 1, got {self.top_k}")

    def resolved_layers(self, n_layers: int) -> list[int]:
        """The single-layer probe layers as indices 0 .. n_layers - 1 (checked, in order, no repeats)."""
        if self.layers is None:
            picks = [0, n_layers // 4, n_layers // 2, (3 * n_layers) // 4, n_layers - 1]
        else:
            picks = [layer_index(layer, n_layers) for layer in self.layers]
        return list(dict.fromkeys(picks))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["layers"] = None if self.layers is None else list(self.layers)
        data["eps"], data["alphas"] = list(self.eps), list(self.alphas)
        return data


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _array(value: Any) -> np.ndarray:
    """A float array from (nested) JSON lists; null, how a non-finite number is stored, reads as NaN."""

    def clean(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return np.nan if v is None else v

    return np.asarray(clean(value), dtype=np.float64)


@dataclass
class PromptDepth:
    """Every probe on one prompt. Arrays are over layers (see each probe's function).

    profile: :func:`step_profile`; lipschitz: :func:`layer_lipschitz`; propagation: one
    :func:`propagate` record per (layer, eps); fractional: :func:`fractional_depth`;
    half: :func:`half_step_defects`. tokens: the decoded tokens (or None).
    """

    id: str
    text: str | None
    token_ids: list[int]
    tokens: list[str] | None
    profile: dict[str, Any]
    lipschitz: dict[str, Any]
    propagation: list[dict[str, Any]]
    fractional: dict[str, Any]
    half: dict[str, Any]
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptDepth:
        try:
            profile = {k: _array(v) for k, v in data["profile"].items()}
            lip = dict(data["lipschitz"])
            lipschitz = {
                "eps": list(lip["eps"]),
                "L": {k: _array(v) for k, v in lip["L"].items()},
                "mu": {k: _array(v) for k, v in lip["mu"].items()},
                **{k: _array(lip[k]) for k in ("sigma_max", "lambda_max", "sigma_residual", "lambda_residual")},
            }
            propagation = [
                {**r, **{k: _array(r[k]) for k in ("gain", "spread", "relative", "growth")}} for r in data["propagation"]
            ]
            half = {k: (_array(v) if isinstance(v, list) else v) for k, v in data["half"].items()}
            return cls(
                id=str(data["id"]),
                text=data.get("text"),
                token_ids=[int(t) for t in data["token_ids"]],
                tokens=data.get("tokens"),
                profile=profile,
                lipschitz=lipschitz,
                propagation=propagation,
                fractional=dict(data["fractional"]),
                half=half,
                seconds=float(data.get("seconds", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExperimentError(f"malformed depth record: {exc}") from None


def probe_prompt(
    stack: LayerStack, prompt: DepthPrompt, config: DepthConfig, *, tokenizer: Any = None, index: int = 0
) -> PromptDepth:
    """Every depth probe on one prompt (index: its place in the run, which seeds its random directions)."""
    started = time.perf_counter()
    ids = prompt.ids(tokenizer)
    if len(ids) < 3:
        raise ExperimentError(f"prompt {prompt.id!r} has {len(ids)} tokens; the depth probes need at least 3")
    layers = config.resolved_layers(stack.n_layers)
    trace = stack.trace(ids, skip_first=config.skip_first)
    first = 1 if config.skip_first else 0
    position = first + int(round(config.position * (trace.n_tokens - 1 - first)))
    propagation = []
    for layer in layers:
        generator = torch.Generator().manual_seed(config.seed * 7919 + index * 131 + layer)
        direction = torch.randn(trace.states.shape[-1], generator=generator, dtype=torch.float64)
        propagation += propagate_sizes(stack, trace, layer=layer, position=position, eps=config.eps, direction=direction)
    tokens = None
    if tokenizer is not None:
        tokens = [tokenizer.decode([int(t)]) for t in ids]
    return PromptDepth(
        id=prompt.id,
        text=prompt.text,
        token_ids=[int(t) for t in ids],
        tokens=tokens,
        profile=step_profile(trace),
        lipschitz=layer_lipschitz(
            stack, trace, eps=config.eps, samples=config.samples, iters=config.iters,
            sigma_iters=config.sigma_iters, method=config.method, seed=config.seed + 1000 * index,
        ),
        propagation=propagation,
        fractional=fractional_depth(stack, trace, config.alphas, layers=layers, top_k=config.top_k),
        half=half_step_defects(stack, trace),
        seconds=time.perf_counter() - started,
    )


def run_depth(
    lm: Any,
    config: DepthConfig | None = None,
    *,
    prompts: Sequence[DepthPrompt] | None = None,
    skip: Mapping[str, PromptDepth] | None = None,
    on_prompt: Callable[[PromptDepth], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    model_name: str | None = None,
) -> DepthResult:
    """Every depth probe on each prompt of a model; returns a :class:`DepthResult`.

    lm: a :class:`~contllm.lm.ContinuousLM` (or a bare causal LM, then prompts need token
    ids). prompts: None for :data:`PROMPTS`. skip: records already done, by prompt id
    (reused, not recomputed). on_prompt: called with each new record (to save it).
    """
    config = config or DepthConfig()
    bare = isinstance(lm, torch.nn.Module)
    model = lm if bare else lm.model
    tokenizer = None if bare else lm.tokenizer
    stack = LayerStack(model)
    layers = config.resolved_layers(stack.n_layers)
    prompts = list(PROMPTS if prompts is None else prompts)
    if not prompts:
        raise ExperimentError("no prompts given")
    skip = skip or {}
    records: list[PromptDepth] = []
    was_training = model.training
    model.eval()
    try:
        for k, prompt in enumerate(prompts):
            if progress is not None:
                progress(k, len(prompts))
            record = skip.get(prompt.id)
            if record is None:
                record = probe_prompt(stack, prompt, config, tokenizer=tokenizer, index=k)
                if on_prompt is not None:
                    on_prompt(record)
            records.append(record)
    finally:
        model.train(was_training)
    if progress is not None:
        progress(len(prompts), len(prompts))
    info_name = getattr(getattr(lm, "info", None), "name", None)
    name = model_name or info_name or getattr(model.config, "_name_or_path", "") or "model"
    return DepthResult(
        model=str(name),
        config=config.to_dict(),
        n_layers=stack.n_layers,
        layers=layers,
        records=records,
        token_strings=_token_strings(tokenizer, records),
    )


def _token_strings(tokenizer: Any, records: Sequence[PromptDepth]) -> dict[str, str]:
    if tokenizer is None:
        return {}
    ids = {int(i) for r in records for i in r.fractional.get("top_ids", [])}
    return {str(i): tokenizer.decode([i]) for i in sorted(ids)}


# ---------------------------------------------------------------------------- the result

QUANTILES = (5, 25, 50, 75, 95)
CSV_COLUMNS = ("prompt", "probe", "quantity", "target", "layer", "x", "value")
FIGURES = ("profile", "lipschitz", "propagation", "alpha", "half_steps")


def _geomean(curves: Sequence[np.ndarray]) -> np.ndarray:
    stacked = np.vstack([np.asarray(c, dtype=np.float64) for c in curves])
    with np.errstate(divide="ignore"):
        return np.exp(np.mean(np.log(stacked), axis=0))


@dataclass
class DepthResult:
    """The depth probes of one model on a few prompts.

    model: its name; config: the :class:`DepthConfig` as a dict; n_layers; layers: the
    single-layer probe layers; records: one :class:`PromptDepth` per prompt;
    token_strings: decoded read-out tokens by id (for legends).
    """

    model: str
    config: dict[str, Any]
    n_layers: int
    layers: list[int]
    records: list[PromptDepth]
    token_strings: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ aggregates
    def profile_quantiles(self) -> dict[str, np.ndarray]:
        """Quantiles (5, 25, 50, 75, 95 %) over every kept token of every prompt:
        {"ratio": [L, 5], "curvature": [L-1, 5], "cosine": [L-1, 5]}."""
        out = {}
        for key in ("ratio", "curvature", "cosine"):
            pooled = np.concatenate([np.asarray(r.profile[key]) for r in self.records], axis=1)
            out[key] = np.percentile(pooled, QUANTILES, axis=1).T
        return out

    def lipschitz_table(self) -> dict[str, np.ndarray]:
        """Per layer, the largest value over prompts: sigma_max, lambda_max [L]; and
        L_<kind>, mu_<kind> [E, L] for kind in orthogonal, along."""
        recs = [r.lipschitz for r in self.records]
        out = {k: np.max(np.vstack([r[k] for r in recs]), axis=0) for k in ("sigma_max", "lambda_max")}
        for kind in ("orthogonal", "along"):
            out[f"L_{kind}"] = np.max(np.stack([r["L"][kind] for r in recs]), axis=0)
            out[f"mu_{kind}"] = np.max(np.stack([r["mu"][kind] for r in recs]), axis=0)
        return out

    def contractive(self, verdict: str = "jacobian") -> np.ndarray:
        """Per layer, whether f_l contracts: a [L] bool array.

        verdict "jacobian": λ_max((J + J^T)/2) < 0 on every prompt, so every pair of
        nearby trajectories of dh/dt = f_l(h) approaches (the worst direction contracts).
        "sampled": the secant μ < 0 for every sampled perturbation (both kinds, every eps,
        every prompt): typical directions contract, the worst one may not.
        """
        table = self.lipschitz_table()
        if verdict == "jacobian":
            return table["lambda_max"] < 0
        if verdict == "sampled":
            return np.all(np.vstack([table["mu_orthogonal"], table["mu_along"]]) < 0, axis=0)
        raise ExperimentError(f"verdict must be 'jacobian' or 'sampled', got {verdict!r}")

    def propagation_curves(self) -> dict[tuple[int, float], dict[str, Any]]:
        """{(layer, eps): {"gain", "spread", "relative" (geometric means over prompts, from that
        layer to L), "kl_last" (mean over prompts), "earlier" (max over prompts)}}."""
        groups: dict[tuple[int, float], list[dict[str, Any]]] = {}
        for r in self.records:
            for p in r.propagation:
                groups.setdefault((int(p["layer"]), float(p["eps"])), []).append(p)
        return {
            key: {
                "gain": _geomean([p["gain"] for p in group]),
                "spread": _geomean([p["spread"] for p in group]),
                "relative": _geomean([p["relative"] for p in group]),
                "kl_last": float(np.mean([p["kl_last"] for p in group])),
                "earlier": float(np.max([p["earlier"] for p in group])),
            }
            for key, group in sorted(groups.items())
        }

    def alpha_curves(self) -> dict[str, dict[str, np.ndarray]]:
        """{target: {"kl_last", "kl_mean", "entropy"}} averaged over prompts, along config["alphas"]."""
        targets = list(self.records[0].fractional["curves"])
        return {
            t: {
                k: np.mean([_array(r.fractional["curves"][t][k]) for r in self.records], axis=0)
                for k in ("kl_last", "kl_mean", "entropy")
            }
            for t in targets
        }

    def half_table(self) -> dict[str, np.ndarray | float]:
        """Means over prompts: defect, defect_median, kl_layer_last, kl_layer_mean [L]; kl_all_last, kl_all_mean."""
        out: dict[str, np.ndarray | float] = {}
        for key in ("defect", "defect_median", "kl_layer_last", "kl_layer_mean"):
            out[key] = np.mean([np.asarray(r.half[key], dtype=np.float64) for r in self.records], axis=0)
        for key in ("kl_all_last", "kl_all_mean"):
            out[key] = float(np.mean([r.half[key] for r in self.records]))
        return out

    def summary(self) -> dict[str, Any]:
        """Headline numbers (JSON-ready)."""
        q = self.profile_quantiles()
        lip = self.lipschitz_table()
        contractive = self.contractive()
        half = self.half_table()
        alpha = self.alpha_curves()
        alphas = np.asarray(self.config["alphas"], dtype=np.float64)
        pooled_ratio = np.concatenate([np.asarray(r.profile["ratio"]).ravel() for r in self.records])
        prop = self.propagation_curves()
        out: dict[str, Any] = {
            "model": self.model,
            "n_layers": self.n_layers,
            "prompts": [r.id for r in self.records],
            "step_ratio_median": float(np.median(pooled_ratio)),
            "step_ratio_median_by_layer_min": float(q["ratio"][:, 2].min()),
            "step_ratio_median_by_layer_max": float(q["ratio"][:, 2].max()),
            "step_ratio_largest_layer": int(q["ratio"][:, 2].argmax()),
            "curvature_median": float(np.median(q["curvature"][:, 2])),
            "cosine_median": float(np.median(q["cosine"][:, 2])),
            "contractive_layers": [int(i) for i in np.flatnonzero(contractive)],
            "contractive_fraction": float(contractive.mean()),
            "contractive_on_samples_layers": [int(i) for i in np.flatnonzero(self.contractive("sampled"))],
            "contractive_on_samples_fraction": float(self.contractive("sampled").mean()),
            "sigma_max_median": float(np.median(lip["sigma_max"])),
            "lambda_max_median": float(np.median(lip["lambda_max"])),
            "half_step_defect_median": float(np.median(half["defect"])),
            "half_step_defect_max": float(np.max(half["defect"])),
            "half_step_defect_max_layer": int(np.argmax(half["defect"])),
            "half_step_kl_all_last": float(half["kl_all_last"]),
            "half_step_kl_all_mean": float(half["kl_all_mean"]),
        }
        for a in (0.0, 0.5, 1.5, 2.0):
            hit = np.flatnonzero(np.isclose(alphas, a))
            if hit.size:
                out[f"alpha_all_{a:g}_kl_last"] = float(alpha["all"]["kl_last"][hit[0]])
        out["propagation"] = [
            {
                "layer": layer,
                "eps": eps,
                "gain_final": float(c["gain"][-1]),
                "growth_per_layer": float(np.log(c["gain"][-1]) / max(1, len(c["gain"]) - 1)),
                "kl_last": c["kl_last"],
                "earlier_max_abs": c["earlier"],
            }
            for (layer, eps), c in prop.items()
        ]
        return out

    # ------------------------------------------------------------------ saving
    def rows(self) -> Iterator[dict[str, Any]]:
        """Tidy rows (CSV_COLUMNS): prompt, probe, quantity, target (injection layer or alpha
        target), layer, x (token position, eps or alpha), value."""

        def row(
            prompt: str, probe: str, quantity: str, value: Any, target: Any = "", layer: Any = "", x: Any = ""
        ) -> dict[str, Any]:
            v = math.nan if value is None else float(value)
            return {
                "prompt": prompt, "probe": probe, "quantity": quantity, "target": target, "layer": layer, "x": x,
                "value": v if math.isfinite(v) else "",
            }

        for r in self.records:
            first = len(r.token_ids) - np.asarray(r.profile["ratio"]).shape[1]
            positions = range(first, len(r.token_ids))
            for key in ("ratio", "curvature", "cosine"):
                values = np.asarray(r.profile[key])
                for layer in range(values.shape[0]):
                    for k, pos in enumerate(positions):
                        yield row(r.id, "profile", key, values[layer, k], layer=layer, x=pos)
            lip = r.lipschitz
            for kind in ("orthogonal", "along"):
                for e, eps in enumerate(lip["eps"]):
                    for layer in range(self.n_layers):
                        yield row(r.id, "lipschitz", f"L_{kind}", lip["L"][kind][e][layer], layer=layer, x=eps)
                        yield row(r.id, "lipschitz", f"mu_{kind}", lip["mu"][kind][e][layer], layer=layer, x=eps)
            for key in ("sigma_max", "lambda_max"):
                for layer in range(self.n_layers):
                    yield row(r.id, "lipschitz", key, lip[key][layer], layer=layer)
            for p in r.propagation:
                for key in ("gain", "spread", "relative"):
                    for k, value in enumerate(p[key]):
                        yield row(r.id, "propagation", key, value, target=p["layer"], layer=p["layer"] + k, x=p["eps"])
                for key in ("kl_last", "kl_max", "earlier"):
                    yield row(r.id, "propagation", key, p[key], target=p["layer"], x=p["eps"])
            frac = r.fractional
            for target, curve in frac["curves"].items():
                for k, a in enumerate(frac["alphas"]):
                    for key in ("kl_last", "kl_mean", "entropy"):
                        yield row(r.id, "alpha", key, curve[key][k], target=target, x=a)
                    for j, token in enumerate(frac["top_ids"]):
                        yield row(r.id, "alpha", f"p[{token}]", curve["readout"][k][j], target=target, x=a)
            for key in ("defect", "defect_median", "kl_layer_last", "kl_layer_mean"):
                for layer, value in enumerate(r.half[key]):
                    yield row(r.id, "half_step", key, value, layer=layer)
            for key in ("kl_all_last", "kl_all_mean"):
                yield row(r.id, "half_step", key, r.half[key], target="all")

    def layer_rows(self) -> list[dict[str, Any]]:
        """One row per layer: profile quantiles, Lipschitz estimates (each eps and kind, largest over
        prompts), both contraction verdicts, half-step defect and KL (means over prompts)."""
        q = self.profile_quantiles()
        lip = self.lipschitz_table()
        sampled = self.contractive("sampled")
        half = self.half_table()
        rows = []
        for layer in range(self.n_layers):
            row: dict[str, Any] = {
                "layer": layer,
                "ratio_median": q["ratio"][layer, 2],
                "ratio_q25": q["ratio"][layer, 1],
                "ratio_q75": q["ratio"][layer, 3],
                "curvature_median": q["curvature"][layer, 2] if layer < self.n_layers - 1 else float("nan"),
                "cosine_median": q["cosine"][layer, 2] if layer < self.n_layers - 1 else float("nan"),
                "sigma_max": lip["sigma_max"][layer],
                "lambda_max": lip["lambda_max"][layer],
                "contractive": bool(lip["lambda_max"][layer] < 0),
                "contractive_on_samples": bool(sampled[layer]),
            }
            for e, eps in enumerate(self.config["eps"]):
                for kind in ("orthogonal", "along"):
                    row[f"L_{kind}@{eps:g}"] = lip[f"L_{kind}"][e, layer]
                    row[f"mu_{kind}@{eps:g}"] = lip[f"mu_{kind}"][e, layer]
            row["half_defect"] = half["defect"][layer]
            row["half_kl_last"] = half["kl_layer_last"][layer]
            rows.append({k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in row.items()})
        return rows

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(
            {
                "experiment": "depth",
                "model": self.model,
                "config": self.config,
                "n_layers": self.n_layers,
                "layers": self.layers,
                "token_strings": self.token_strings,
                "records": [r.to_dict() for r in self.records],
            }
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DepthResult:
        try:
            return cls(
                model=str(data["model"]),
                config=dict(data["config"]),
                n_layers=int(data["n_layers"]),
                layers=[int(i) for i in data["layers"]],
                records=[PromptDepth.from_dict(r) for r in data["records"]],
                token_strings={str(k): str(v) for k, v in (data.get("token_strings") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExperimentError(f"malformed depth result: {exc}") from None

    @classmethod
    def load(cls, directory: str | Path) -> DepthResult:
        """Read results.json from a run directory (or the file itself)."""
        path = Path(directory)
        path = path / "results.json" if path.is_dir() else path
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise ExperimentError(f"cannot read {path}: {exc}") from None

    def save(self, directory: str | Path) -> list[Path]:
        """results.json (everything), results.csv (tidy rows) and layers.csv (one row per layer)."""
        from contllm.runs import atomic_write_json, atomic_write_text

        directory = Path(directory)
        paths = [atomic_write_json(directory / "results.json", self.to_dict())]
        paths.append(atomic_write_text(directory / "results.csv", _csv(list(self.rows()), CSV_COLUMNS)))
        layer_rows = self.layer_rows()
        paths.append(atomic_write_text(directory / "layers.csv", _csv(layer_rows, tuple(layer_rows[0]))))
        return paths

    # ------------------------------------------------------------------ figures
    def plot(self, name: str = "profile", prompt: str | None = None) -> Any:
        """One figure: "profile", "lipschitz", "propagation", "alpha", "half_steps", or
        "readout" (the read-out distribution along alpha of one prompt; prompt: its id)."""
        if name == "readout":
            return _readout_figure(self, prompt or self.records[0].id)
        if name not in FIGURES:
            raise ExperimentError(f"unknown depth figure {name!r}; the figures are {', '.join(FIGURES)}, readout")
        return _FIGURES[name](self)

    def save_figures(self, directory: str | Path, *, per_prompt: bool = True) -> list[Path]:
        """Every figure as PNG and PDF under ``directory`` (read-outs per prompt under items/)."""
        from contllm.plotting import save_figure

        directory = Path(directory)
        paths: list[Path] = []
        for name in FIGURES:
            paths += save_figure(self.plot(name), directory / name)
        if per_prompt:
            for r in self.records:
                safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in r.id)
                paths += save_figure(self.plot("readout", prompt=r.id), directory / "items" / safe)
        return paths


def _csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()})
    return buffer.getvalue()


def _pyplot() -> Any:
    from contllm.plotting import plt  # selects a headless backend when there is no display

    return plt


def _title(result: DepthResult, what: str) -> str:
    prompts = ", ".join(r.id for r in result.records)
    return f"{result.model} · depth · {what}\n{result.n_layers} layers, prompts: {prompts}"


def _band(ax: Any, x: np.ndarray, q: np.ndarray, color: str, label: str) -> None:
    ax.fill_between(x, q[:, 0], q[:, 4], color=color, alpha=0.12, lw=0)
    ax.fill_between(x, q[:, 1], q[:, 3], color=color, alpha=0.3, lw=0)
    ax.plot(x, q[:, 2], "-o", ms=3, color=color, label=label)


def _profile_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    q = result.profile_quantiles()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), constrained_layout=True)
    layers = np.arange(result.n_layers)
    _band(axes[0], layers, q["ratio"], "C0", "median (bands: 25-75 %, 5-95 %)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("||f_l(h_l)|| / ||h_l||")
    axes[0].set_title("step size relative to the state", fontsize=10)
    _band(axes[1], layers[:-1], q["curvature"], "C1", "median")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("||f_{l+1} - f_l|| / ||f_l||")
    axes[1].set_title("change of the update between layers", fontsize=10)
    _band(axes[2], layers[:-1], q["cosine"], "C2", "median")
    axes[2].axhline(0, color="k", lw=0.8)
    axes[2].set_ylim(-1.02, 1.02)
    axes[2].set_ylabel("cos(f_l, f_{l+1})")
    axes[2].set_title("direction of consecutive updates", fontsize=10)
    for ax in axes:
        ax.set_xlabel("layer l")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(_title(result, "step profile over tokens (first position excluded)"), fontsize=11)
    return fig


def _lipschitz_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    lip = result.lipschitz_table()
    eps = result.config["eps"]
    layers = np.arange(result.n_layers)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.4), constrained_layout=True)
    shades = np.linspace(0.35, 0.95, len(eps))
    method = {"lanczos": "Lanczos", "power": "power iteration"}.get(str(result.config.get("method")), "JVPs")
    left.plot(layers, lip["sigma_max"], "k-o", ms=4, lw=2, label=f"σ_max(J), JVPs ({method})")
    right.plot(layers, lip["lambda_max"], "k-o", ms=4, lw=2, label=f"λ_max((J+Jᵀ)/2), JVPs ({method})")
    for e, value in enumerate(eps):
        blue, red = plt.get_cmap("Blues")(shades[e]), plt.get_cmap("Oranges")(shades[e])
        left.plot(layers, lip["L_orthogonal"][e], "-", color=blue, label=f"L, δ ⊥ h, ε = {value:g}")
        left.plot(layers, lip["L_along"][e], "--", color=red, label=f"L, δ ∥ h, ε = {value:g}")
        right.plot(layers, lip["mu_orthogonal"][e], "-", color=blue, label=f"μ, δ ⊥ h, ε = {value:g}")
        right.plot(layers, lip["mu_along"][e], "--", color=red, label=f"μ, δ ∥ h, ε = {value:g}")
    for layer in np.flatnonzero(result.contractive("sampled")):
        right.axvspan(layer - 0.5, layer + 0.5, color="C2", alpha=0.12, lw=0)
    for layer in np.flatnonzero(result.contractive()):
        right.axvspan(layer - 0.5, layer + 0.5, color="C2", alpha=0.35, lw=0)
    right.axhline(0, color="k", lw=0.8)
    left.set_yscale("log")
    right.set_yscale("symlog", linthresh=1e-2)
    left.set_ylabel("Lipschitz estimate of f_l")
    right.set_ylabel("one-sided Lipschitz estimate of f_l")
    left.set_title("L = max ||Δf|| / ||δ||  (max over prompts)\n", fontsize=9)
    n, n_sampled = int(result.contractive().sum()), int(result.contractive("sampled").sum())
    right.set_title(
        f"μ = max <Δf, δ> / ||δ||²  (max over prompts)\ncontractive, shaded: λ_max < 0 (dark) {n}, "
        f"sampled μ < 0 (light) {n_sampled} of {result.n_layers} layers",
        fontsize=9,
    )
    for ax in (left, right):
        ax.set_xlabel("layer l")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.suptitle(_title(result, "Lipschitz and one-sided Lipschitz constants per layer"), fontsize=11)
    return fig


def _propagation_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    curves = result.propagation_curves()
    sites = sorted({layer for layer, _ in curves})
    eps = sorted({e for _, e in curves})
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    colors = plt.get_cmap("viridis")
    for i, site in enumerate(sites):
        color = colors(i / max(1, len(sites) - 1))
        for j, e in enumerate(eps):
            c = curves.get((site, e))
            if c is None:
                continue
            depth = site + np.arange(len(c["gain"]))
            label = f"l0 = {site}, ε = {e:g}"
            axes[0].plot(depth, c["gain"], styles[j % 4], color=color, marker="o", ms=2, label=label)
            axes[1].plot(depth, c["relative"], styles[j % 4], color=color, marker="o", ms=2, label=label)
        axes[2].plot(eps, [curves[(site, e)]["kl_last"] for e in eps], "-o", color=color, label=f"l0 = {site}")
    axes[0].set_ylabel("e_l = ||h'_l - h_l|| / ||δ||  (at the position)")
    axes[0].set_title("absolute: growth or decay of a perturbation", fontsize=10)
    axes[1].set_ylabel("(||Δh_l|| / ||h_l||) / ε")
    axes[1].set_title("relative to the state's norm", fontsize=10)
    for ax in axes[:2]:
        ax.set_yscale("log")
        ax.set_xlabel("layer l (perturbation enters layer l0)")
        ax.axhline(1, color="k", lw=0.8)
    axes[0].legend(fontsize=6, ncol=2)
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("ε = ||δ|| / ||h_{l0}||")
    axes[2].set_ylabel("KL(p' || p), last position")
    axes[2].set_title("effect on the output distribution", fontsize=10)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(_title(result, "perturbation propagation (geometric mean over prompts)"), fontsize=11)
    return fig


def _positive(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return np.where(values > 0, values, np.nan)


def _alpha_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    curves = result.alpha_curves()
    alphas = np.asarray(result.config["alphas"], dtype=np.float64)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    colors = plt.get_cmap("viridis")
    singles = [t for t in curves if t != "all"]
    for target, curve in curves.items():
        if target == "all":
            style: dict[str, Any] = {"color": "k", "lw": 2.4, "label": "all layers"}
        else:
            color = colors(singles.index(target) / max(1, len(singles) - 1))
            style = {"color": color, "lw": 1.4, "label": f"layer {target} only"}
        axes[0].plot(alphas, _positive(curve["kl_last"]), "-o", ms=3, **style)
        axes[1].plot(alphas, _positive(curve["kl_mean"]), "-o", ms=3, **style)
        axes[2].plot(alphas, curve["entropy"], "-o", ms=3, **style)
    for ax, what in zip(axes[:2], ("last position", "mean over positions")):
        ax.set_yscale("log")
        ax.set_ylabel(f"KL(p_α || p_1), {what}")
    axes[2].set_ylabel("entropy of p_α at the last position (nats)")
    for ax in axes:
        ax.axvline(1, color="k", lw=0.8, ls=":")
        ax.set_xlabel("α  (h_{l+1} = h_l + α f_l(h_l))")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(_title(result, "fractional depth (mean over prompts; α = 1 is the stock model)"), fontsize=11)
    return fig


def _half_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    half = result.half_table()
    layers = np.arange(result.n_layers)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4), constrained_layout=True)
    for r in result.records:
        left.plot(layers, r.half["defect"], ".", alpha=0.5, label=f"{r.id}")
    left.plot(layers, half["defect"], "k-o", ms=3, lw=2, label="mean over prompts")
    left.plot(layers, half["defect_median"], "k--", lw=1, label="median over tokens (mean over prompts)")
    left.set_yscale("log")
    left.set_ylabel("||h'' - Φ_l(h)|| / ||f_l(h)||")
    left.set_title("local defect of two half steps against one step", fontsize=10)
    right.bar(layers, _positive(half["kl_layer_last"]), color="C0", alpha=0.7, label="layer l split alone")
    right.axhline(float(half["kl_all_last"]), color="k", lw=2, label=f"every layer split: {float(half['kl_all_last']):.3g}")
    right.set_yscale("log")
    right.set_ylabel("KL(p_half || p), last position (mean over prompts)")
    right.set_title("effect on the output distribution", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("layer l")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(result, "half-step refinement"), fontsize=11)
    return fig


def _readout_figure(result: DepthResult, prompt: str) -> Any:
    plt = _pyplot()
    record = next((r for r in result.records if r.id == prompt), None)
    if record is None:
        known = ", ".join(r.id for r in result.records)
        raise ExperimentError(f"no prompt {prompt!r} in this result; its prompts are {known}")
    frac = record.fractional
    alphas = np.asarray(frac["alphas"], dtype=np.float64)
    targets = list(frac["curves"])
    cols = min(3, len(targets))
    rows = int(np.ceil(len(targets) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, constrained_layout=True)
    names = [result.token_strings.get(str(t), str(t)) for t in frac["top_ids"]]
    for ax, target in zip(axes.flat, targets):
        readout = np.asarray(frac["curves"][target]["readout"], dtype=np.float64)
        for j, name in enumerate(names):
            ax.plot(alphas, readout[:, j], "-o", ms=2.5, color=f"C{j}", label=repr(name))
        ax.plot(alphas, 1 - readout.sum(axis=1), "k:", lw=1, label="all other tokens")
        ax.axvline(1, color="k", lw=0.8, ls=":")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title("all layers" if target == "all" else f"layer {target} only", fontsize=9)
        ax.set_xlabel("α")
        ax.set_ylabel("probability at the last position")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7, title="stock top tokens", title_fontsize=7)
    for ax in list(axes.flat)[len(targets) :]:
        ax.axis("off")
    text = (record.text or "").replace("\n", "⏎")
    fig.suptitle(f"{result.model} · depth · read-out along α · {record.id}\n…{text[-70:]!s}", fontsize=10)
    return fig


_FIGURES: dict[str, Callable[[DepthResult], Any]] = {
    "profile": _profile_figure,
    "lipschitz": _lipschitz_figure,
    "propagation": _propagation_figure,
    "alpha": _alpha_figure,
    "half_steps": _half_figure,
}


# ---------------------------------------------------------------------------- the command


def depth_config_from_options(
    *, layer: str | Sequence[int] | None = None, eps: str | Sequence[float] | None = None,
    alphas: str | Sequence[float] | None = None, seed: int = 0,
) -> DepthConfig:
    """A :class:`DepthConfig` from command-line strings ("0,15,-1", "1e-3,1e-2", "0,0.5,1,2"); None: the default."""
    kwargs: dict[str, Any] = {"seed": int(seed)}
    if layer is not None:
        kwargs["layers"] = parse_ints(layer, "--layer")
    if eps is not None:
        kwargs["eps"] = parse_floats(eps, "--eps")
    if alphas is not None:
        kwargs["alphas"] = parse_floats(alphas, "--alphas")
    return DepthConfig(**kwargs)


def run_depth_command(
    *,
    model: str = "smollm2-135m",
    device: str = "auto",
    dtype: str | None = None,
    items: str | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    seed: int = 0,
    item_figures: bool = True,
    layer: str | None = None,
    eps: str | None = None,
    alphas: str | None = None,
    unused: Mapping[str, Any] | None = None,
    echo: Callable[[str], None] | None = None,
    lm: Any = None,
    config: DepthConfig | None = None,
    prompts: Sequence[DepthPrompt] | None = None,
) -> Path:
    """``contllm run depth``: every depth probe on the fixed prompts, into a run directory.

    Writes config.json, manifest.json, items/<prompt>.json (one record per finished prompt,
    what --resume skips), results.json, results.csv, layers.csv, summary.json and
    figures/ (PNG and PDF). unused: other ``run`` options, which must all be None (they
    belong to other experiments). echo: where progress lines go (None: nowhere).
    lm: an already loaded model (then ``model`` only names it). config: every probe
    option at once (instead of layer, eps, alphas and seed). prompts: instead of
    :data:`PROMPTS` (``items`` selects among them).
    Returns the run directory. Bad options raise ExperimentError before anything is written.
    """
    from contllm.runs import RunDir, atomic_write_json, base_manifest, default_out, load_for_run, now, refuse_unused

    say = echo or (lambda message: None)
    refuse_unused(unused, "depth")
    if config is None:
        config = depth_config_from_options(layer=layer, eps=eps, alphas=alphas, seed=seed)
    prompts = select_prompts(items, PROMPTS if prompts is None else prompts)
    resolved = {
        "experiment": "depth",
        "model": model,
        "dtype": dtype,
        "items": items,
        "seed": config.seed,
        "options": config.to_dict(),
    }
    if out is None:
        out = default_out("depth", model)
    run = RunDir(out, resolved, resume=resume, force=force)
    torch.manual_seed(config.seed)
    if lm is None:
        lm = load_for_run(model, device=device, dtype=dtype, say=say)
    # Layer indices can only be checked against the loaded model; still before anything is written.
    config.resolved_layers(LayerStack(lm.model).n_layers)
    run.open()
    say(f"{'resuming' if run.resumed else 'writing'} depth on {model} -> {run.path}")
    run.write_manifest({**base_manifest(lm, model), "status": "running"})
    done: dict[str, PromptDepth] = {}
    if run.resumed:
        for prompt in prompts:
            path = run.item_path(prompt.id)
            if path.is_file():
                try:
                    done[prompt.id] = PromptDepth.from_dict(json.loads(path.read_text(encoding="utf-8")))
                except (OSError, ValueError, ExperimentError):  # an unreadable record is recomputed
                    continue
        if done:
            say(f"{len(done)} prompts already finished; skipping them")
    started = time.perf_counter()

    def save(record: PromptDepth) -> None:
        atomic_write_json(run.item_path(record.id), record.to_dict())
        say(f"  {record.id}: {len(record.token_ids)} tokens, {record.seconds:.1f} s")

    result = run_depth(lm, config, prompts=prompts, skip=done, on_prompt=save, model_name=model)
    result.save(run.path)
    summary = result.summary()
    atomic_write_json(run.path / "summary.json", _jsonable(summary))
    result.save_figures(run.path / "figures", per_prompt=item_figures)
    run.write_manifest({"status": "finished", "finished": now(), "items": len(result.records),
                        "seconds": round(time.perf_counter() - started, 2)})
    for key, value in summary.items():
        if isinstance(value, float):
            say(f"  {key}: {value:.4g}")
    say(f"  contractive layers: {summary['contractive_layers']}")
    return run.path
