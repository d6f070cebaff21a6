"""Measurements along depth on a stock forward (a :class:`~contllm.depth.stack.Trace`).

* :func:`step_profile`: ||f_l|| / ||h_l||, the curvature ||f_{l+1} - f_l|| / ||f_l||
  and cos(f_l, f_{l+1}) per layer and token;
* :func:`sampled_lipschitz` and :func:`jacobian_bounds`: Lipschitz and one-sided
  Lipschitz constants of f_l from random perturbations, and their infinitesimal versions
  (largest singular value of J, largest eigenvalue of (J + J^T) / 2) from Jacobian-vector
  products, by Lanczos (a Krylov refinement of power iteration) or power iteration;
  :func:`layer_lipschitz` runs both on every layer;
* :func:`propagate`: a perturbation injected at one layer and position, followed
  through depth to the output distribution;
* :func:`fractional_depth`: every (or one) update scaled, h + alpha f_l(h);
* :func:`half_step_defects`: each step replaced by two half steps, and the local defect
  ||h'' - Φ_l(h)|| / ||f_l(h)||.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from contllm.depth.patches import check_alpha, half_step, half_steps, injected, recording, replayed, scaled_updates
from contllm.depth.stack import LayerStack, Trace
from contllm.errors import ExperimentError


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
        quotient = dot(v, w)
        if quotient > theta:
            theta, best = quotient, v
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
        vjp_fn = torch.func.vjp(f, h)[1]

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
    targets: list[tuple[str, Any]] = [("all", None)] + [
        (str(stack.layer_index(i)), stack.layer_index(i)) for i in layers
    ]
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
