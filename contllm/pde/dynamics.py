"""Dynamics of one attention row over a pseudo-time T, along the key axis.

A row a of attention weights is a distribution over the keys a query may see (its
*support*: causal, windowed, not padding). Each key is a cell of width w_j (its duration
for continuous-time inputs, 1 for tokens); a_j is the mass in the cell and a_j / w_j its
density. Neighbours are consecutive keys of the support, whose centres lie
h = (w_j + w_{j+1}) / 2 apart, so that a support with gaps (zero-duration keys, padding)
is one chain. The dynamics, all in flux form with zero flux through both ends:

* ``diffusion``: da/ds = div F, F_{j+1/2} = (a_{j+1}/w_{j+1} - a_j/w_j) / h_{j+1/2};
  k = ceil(T / 0.25) explicit steps of τ = T / k (more where narrow cells need a shorter
  step to stay positive). With unit cells one step is
  a_j += τ (a_{j+1} - 2 a_j + a_{j-1}) and the ends lose nothing.
* ``wave``: d²a/ds² = c² div F by leapfrog from rest (c τ <= 1); it keeps the mass but not
  the sign, so rows can go negative.
* ``reaction``: diffusion plus ρ a_j (a_j - Σ_k a_k²), a reaction that keeps Σ a = 1
  (ρ > 0 sharpens the row, ρ < 0 flattens it).
* ``temperature``: a_j ∝ w_j (a_j / w_j)^(1/θ): the softmax at temperature θ.
* ``matched``: the temperature, row by row, that gives the row the entropy that
  diffusion over T would give it (a control that flattens without moving mass along
  the keys).

Diffusion and wave are linear: k steps on a chain of L unit cells are the matrix P_L^k,
which the ``spectral`` method builds from the chain's cosine eigenvectors (the same k
steps, evaluated at once); ``steps`` runs them one by one. Everything runs in float64.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import torch

from contllm.errors import ExperimentError

#: The explicit step of diffusion and wave on unit cells.
STEP = 0.25
KINDS = ("diffusion", "wave", "reaction", "temperature", "matched")
SPACINGS = ("time", "index")
METHODS = ("auto", "steps", "spectral")
#: Most safeguarded Newton steps of the matched temperature, and the step in v = 1/θ²
#: (in [0, 1]) below which a row counts as matched.
MATCH_ITERATIONS = 100
MATCH_TOLERANCE = 1e-13
#: An entropy gap (nats) at the round-off of a sum of a few hundred terms: a row this close
#: is matched (its weights then sit within about 1e-12 of the exact ones).
ENTROPY_TOLERANCE = 1e-13
#: "auto" evaluates linear dynamics spectrally from this many steps on.
SPECTRAL_FROM = 8
_TINY = torch.finfo(torch.float64).tiny


class DynamicsError(ExperimentError):
    """Row dynamics were asked for with invalid parameters or inputs."""


@dataclass(frozen=True)
class Dynamics:
    """What happens to each attention row.

    kind: one of :data:`KINDS`. T: pseudo-time, >= 0 (diffusion, wave, reaction, matched).
    rho: reaction strength. c: wave speed, > 0. temperature: θ > 0 of ``temperature``.
    spacing: "time" (cells as wide as the keys' durations, read from the mask) or "index"
        (unit cells). method: "steps", "spectral" (unit cells only) or "auto".
    """

    kind: str = "diffusion"
    T: float = 0.0
    rho: float = 1.0
    c: float = 1.0
    temperature: float = 1.0
    spacing: str = "time"
    method: str = "auto"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DynamicsError(f"unknown dynamics {self.kind!r}; the dynamics are {', '.join(KINDS)}")
        for name in ("T", "rho", "c", "temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DynamicsError(f"{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.T < 0:
            raise DynamicsError(f"pseudo-time T must be >= 0, got {self.T:g}")
        if self.c <= 0:
            raise DynamicsError(f"wave speed c must be > 0, got {self.c:g}")
        if self.temperature <= 0:
            raise DynamicsError(f"temperature must be > 0, got {self.temperature:g}")
        if self.spacing not in SPACINGS:
            raise DynamicsError(f"spacing must be one of {', '.join(SPACINGS)}, got {self.spacing!r}")
        if self.method not in METHODS:
            raise DynamicsError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.method == "spectral" and self.kind not in ("diffusion", "wave", "matched"):
            raise DynamicsError(f"the spectral method evaluates linear dynamics only, not {self.kind}")

    @property
    def identity(self) -> bool:
        """Whether the dynamics leave every row as it is (T = 0, or θ = 1)."""
        if self.kind == "temperature":
            return self.temperature == 1.0
        return self.T == 0.0

    def label(self) -> str:
        if self.kind == "temperature":
            return f"temperature θ={self.temperature:g}"
        extra = {"wave": f", c={self.c:g}", "reaction": f", ρ={self.rho:g}"}.get(self.kind, "")
        return f"{self.kind} T={self.T:g}{extra}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def apply(self, weights: torch.Tensor, support: torch.Tensor, widths: torch.Tensor | None = None) -> torch.Tensor:
        """The rows after the dynamics.

        weights: [..., keys], each row a distribution over its support.
        support: bool, broadcastable to weights: the keys each row may see.
        widths: the cells' widths, broadcastable to weights (None, or spacing "index": 1).
        Returns float64 [..., keys]: exactly zero outside the support; a row with an empty
        support (a padding query) comes back unchanged.
        """
        return apply_dynamics(self, weights, support, widths)


# ---------------------------------------------------------------------------- chains


@dataclass
class Chain:
    """Rows gathered so that each row's support comes first, in key order: [rows, keys].

    a: masses; w: widths (1 past the support); length: L per row; inside: m < L;
    face: 1 / h_{m+1/2} on the faces between cells m and m + 1 inside the support, else 0;
    order: the permutation that gathered each row (scatter back with it).
    """

    a: torch.Tensor
    w: torch.Tensor
    length: torch.Tensor
    inside: torch.Tensor
    face: torch.Tensor
    order: torch.Tensor

    @property
    def unit(self) -> bool:
        return bool(torch.all(self.w == 1.0))

    def divergence(self, a: torch.Tensor) -> torch.Tensor:
        """div F of the densities a / w, zero flux through the ends: [rows, keys]."""
        rho = a / self.w
        flux = (rho[:, 1:] - rho[:, :-1]) * self.face
        div = torch.zeros_like(a)
        div[:, :-1] += flux
        div[:, 1:] -= flux
        return div

    def step_limit(self) -> torch.Tensor:
        """Per row, the largest τ for which an explicit diffusion step keeps every mass >= 0."""
        coupling = torch.zeros_like(self.a)
        coupling[:, :-1] += self.face
        coupling[:, 1:] += self.face
        limit = torch.where(coupling > 0, self.w / coupling.clamp_min(_TINY), torch.inf)
        return limit.min(dim=-1).values

    def part(self, rows: torch.Tensor, width: int) -> Chain:
        """The chain of some rows, cut to their first ``width`` cells (at least their supports)."""
        return Chain(
            a=self.a[rows, :width],
            w=self.w[rows, :width],
            length=self.length[rows],
            inside=self.inside[rows, :width],
            face=self.face[rows, : max(width - 1, 0)],
            order=self.order[rows, :width],
        )

    def scatter(self, compact: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
        """Rows in key order again; zero outside the support (rows with none keep ``original``)."""
        out = torch.empty_like(compact).scatter_(-1, self.order, compact)
        outside = torch.zeros_like(self.inside).scatter_(-1, self.order, ~self.inside)
        zeroed = outside & (self.length > 0)[:, None]
        out = torch.where(zeroed, torch.zeros((), dtype=out.dtype), out)
        return torch.where((self.length == 0)[:, None], original, out)


def gather_chain(weights: torch.Tensor, support: torch.Tensor, widths: torch.Tensor | None) -> Chain:
    """A :class:`Chain` of 2D float64 rows [rows, keys] with bool support and widths of the same shape."""
    keys = weights.shape[-1]
    order = torch.argsort((~support).to(torch.int8), dim=-1, stable=True)
    length = support.sum(dim=-1)
    inside = torch.arange(keys, device=weights.device)[None, :] < length[:, None]
    a = weights.gather(-1, order)
    if widths is None:
        w = torch.ones_like(a)
    else:
        w = torch.where(inside, widths.gather(-1, order), torch.ones((), dtype=a.dtype))
    if torch.any(w <= 0) or not torch.all(torch.isfinite(w)):
        raise DynamicsError("cell widths must be finite and > 0 on the support")
    face_inside = inside[:, 1:]
    face = torch.where(face_inside, 2.0 / (w[:, 1:] + w[:, :-1]), torch.zeros((), dtype=a.dtype))
    return Chain(a=a, w=w, length=length, inside=inside, face=face, order=order)


def _steps_for(T: float, limit: torch.Tensor) -> torch.Tensor:
    """Steps per row: k = ceil(T / 0.25), more where ``limit`` (the largest stable τ) is smaller."""
    base = math.ceil(T / STEP)
    finer = torch.ceil(T / limit.clamp_min(_TINY)).to(torch.long)
    return torch.where(limit < STEP, torch.maximum(finer, torch.full_like(finer, base)), torch.full_like(finer, base))


def diffusion_steps(chain: Chain, T: float) -> torch.Tensor:
    """Explicit steps per row: τ at most 0.25 and half the positivity limit of the row's cells."""
    return _steps_for(T, 0.5 * chain.step_limit())


def wave_steps(chain: Chain, T: float, c: float) -> torch.Tensor:
    """Leapfrog steps per row: c τ within the chain's stability bound (c τ <= 1 on unit cells), τ <= 0.25."""
    return _steps_for(T, torch.sqrt(2.0 * chain.step_limit()) / c)


def reaction_steps(chain: Chain, T: float, rho: float) -> torch.Tensor:
    limit = 0.5 * chain.step_limit()
    if rho != 0:
        limit = torch.minimum(limit, torch.full_like(limit, STEP / abs(rho)))
    return _steps_for(T, limit)


# ---------------------------------------------------------------------------- explicit schemes


def _diffuse_steps(chain: Chain, T: float, steps: torch.Tensor) -> torch.Tensor:
    a = chain.a.clone()
    tau = (T / steps.clamp_min(1).to(a.dtype))[:, None]
    for s in range(int(steps.max())):
        active = (s < steps)[:, None]
        a = torch.where(active, a + tau * chain.divergence(a), a)
    return a


def _wave_steps(chain: Chain, T: float, c: float, steps: torch.Tensor) -> torch.Tensor:
    a0 = chain.a.clone()
    gain = ((c * T / steps.clamp_min(1).to(a0.dtype)) ** 2)[:, None]
    previous, current = a0, a0 + 0.5 * gain * chain.divergence(a0)  # from rest: a(-τ) = a(τ)
    for s in range(1, int(steps.max())):
        active = (s < steps)[:, None]
        following = 2.0 * current - previous + gain * chain.divergence(current)
        previous, current = torch.where(active, current, previous), torch.where(active, following, current)
    return current


def _reaction_steps(chain: Chain, T: float, rho: float, steps: torch.Tensor) -> torch.Tensor:
    a = chain.a.clone()
    tau = (T / steps.clamp_min(1).to(a.dtype))[:, None]
    for s in range(int(steps.max())):
        active = (s < steps)[:, None]
        mean_square = torch.where(chain.inside, a * a, 0.0).sum(dim=-1, keepdim=True)
        reaction = torch.where(chain.inside, rho * a * (a - mean_square), 0.0)
        a = torch.where(active, a + tau * (chain.divergence(a) + reaction), a)
    return a


# ---------------------------------------------------------------------------- spectral evaluation


def chain_operator(kind: str, length: int, steps: int, tau: float, c: float = 1.0) -> torch.Tensor:
    """k explicit steps of diffusion (or leapfrog wave) on L unit cells, as one L x L float64 matrix.

    The zero-flux Laplacian of the chain has eigenvectors cos(π m (j + 1/2) / L) and
    eigenvalues λ_m = -4 sin²(π m / (2L)); a diffusion step multiplies mode m by
    1 + τ λ_m, and leapfrog from rest turns it into cos(k φ_m) with cos φ_m = 1 + c²τ²λ_m / 2.
    The diffusion matrix is doubly stochastic: tiny negative round-off is cut and its
    columns renormalised, so that it keeps every row non-negative and of the same sum.
    """
    m = torch.arange(length, dtype=torch.float64)
    basis = torch.cos(math.pi * torch.outer(m + 0.5, m) / length)
    lam = -4.0 * torch.sin(math.pi * m / (2 * length)) ** 2
    norm = torch.where(m == 0, float(length), length / 2.0)
    if kind == "diffusion":
        gain = (1.0 + tau * lam) ** steps
    else:
        phi = torch.arccos((1.0 + 0.5 * (c * tau) ** 2 * lam).clamp(-1.0, 1.0))
        gain = torch.cos(steps * phi)
    matrix = (basis * (gain / norm)) @ basis.T
    if kind == "diffusion":
        matrix = matrix.clamp_min(0.0)
        matrix = matrix / matrix.sum(dim=0, keepdim=True)
    return matrix


#: Bytes of one stack of chain operators (groups of rows are batched up to this size).
STACK_BYTES = 16 * 2**20


@lru_cache(maxsize=48)
def _operator_stack(kind: str, groups: tuple[tuple[int, int], ...], T: float, c: float) -> torch.Tensor:
    """The operators of (length, steps) groups, zero-padded to the longest: [groups, L, L] float64."""
    size = max(length for length, _ in groups)
    stack = torch.zeros(len(groups), size, size, dtype=torch.float64)
    for g, (length, k) in enumerate(groups):
        stack[g, :length, :length] = chain_operator(kind, length, k, T / k, c)
    return stack


def _spectral(chain: Chain, kind: str, T: float, steps: torch.Tensor, c: float) -> torch.Tensor:
    """Every row times its chain's operator, rows with the same (length, steps) batched together.

    Rows are sorted by length and packed into [groups, rows per group, L] blocks, so
    that a whole layer takes a few batched products (not one small product per length).
    """
    out = chain.a.clone()
    todo = torch.nonzero((chain.length >= 2) & (steps >= 1), as_tuple=True)[0]
    if todo.numel() == 0:
        return out
    span = int(steps.max()) + 1
    keys = chain.length[todo] * span + steps[todo]
    order = torch.argsort(keys, stable=True)
    rows, keys = todo[order], keys[order]
    unique, counts = torch.unique_consecutive(keys, return_counts=True)
    group = torch.repeat_interleave(torch.arange(len(unique), device=keys.device), counts)
    start = torch.cumsum(counts, 0) - counts
    position = torch.arange(len(rows), device=keys.device) - start[group]
    pairs = [(int(key) // span, int(key) % span) for key in unique.tolist()]
    first = 0
    while first < len(pairs):
        last = first + 1
        while last < len(pairs) and (last + 1 - first) * pairs[last][0] ** 2 * 8 <= STACK_BYTES:
            last += 1
        size = pairs[last - 1][0]
        operators = _operator_stack(kind, tuple(pairs[first:last]), T, c).to(out.device)
        lo, hi = int(start[first]), int(start[last - 1] + counts[last - 1])
        block = torch.zeros(last - first, int(counts[first:last].max()), size, dtype=out.dtype, device=out.device)
        block[group[lo:hi] - first, position[lo:hi]] = chain.a[rows[lo:hi], :size]
        product = torch.bmm(block, operators.transpose(1, 2))
        out[rows[lo:hi], :size] = product[group[lo:hi] - first, position[lo:hi]]
        first = last
    return out


# ---------------------------------------------------------------------------- temperature


def row_entropy(a: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row's masses on its support (negative masses count as 0)."""
    p = torch.where(inside, a.clamp_min(0.0), 0.0)
    return -torch.where(p > 0, p * torch.log(p.clamp_min(_TINY)), 0.0).sum(dim=-1)


def _tempered(chain: Chain, u: torch.Tensor) -> torch.Tensor:
    """a_j ∝ w_j (a_j / w_j)^u on the support, u = 1/θ per row [rows, 1] (u = 0: uniform density).

    Each row keeps its mass (rows of float32 weights sum to 1 only within round-off).
    """
    return torch.where(chain.inside, _Tempering(chain).log_p(u).exp() * _mass(chain, chain.a), chain.a)


def _mass(chain: Chain, a: torch.Tensor) -> torch.Tensor:
    return torch.where(chain.inside, a, 0.0).sum(dim=-1, keepdim=True)


class _Tempering:
    """log p(u) = log_softmax(u ℓ + log w) with ℓ = log(a / w), and the entropy of p and its slope in u."""

    def __init__(self, chain: Chain) -> None:
        self.inside = chain.inside
        self.log_w = torch.log(chain.w)
        self.ell = torch.where(chain.inside, torch.log(chain.a.clamp_min(_TINY) / chain.w), 0.0)

    def log_p(self, u: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(torch.where(self.inside, u * self.ell + self.log_w, -torch.inf), dim=-1)

    def entropy_and_slope(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """H(u) and dH/du = -u Var_p(ℓ) - Cov_p(ℓ, log w), per row."""
        log_p = self.log_p(u)
        p = torch.where(self.inside, log_p.exp(), 0.0)
        entropy = -(p * torch.where(self.inside, log_p, 0.0)).sum(dim=-1)
        mean = (p * self.ell).sum(dim=-1, keepdim=True)
        centred = torch.where(self.inside, self.ell - mean, 0.0)
        variance = (p * centred * centred).sum(dim=-1)
        covariance = (p * centred * torch.where(self.inside, self.log_w, 0.0)).sum(dim=-1)
        return entropy, -u[:, 0] * variance - covariance


def _matched(chain: Chain, target: torch.Tensor) -> torch.Tensor:
    """Temper each row (u = 1/θ in [0, 1]) until its entropy equals ``target``.

    Newton's method on H as a function of v = u², kept inside a bracket [low, high] that
    it shrinks each step (H falls as v grows: v = 0 is the uniform density, v = 1 the row
    itself); a step that would leave the bracket is replaced by the bracket's midpoint.
    In v, H(v) ≈ H(0) - v Var(ℓ) / 2 near the uniform row, so Newton converges fast
    there too, where H(u) is flat. Rows whose target lies outside [H(1), H(0)] end at
    the nearer end. A row stops once its step in v is below :data:`MATCH_TOLERANCE` or
    its entropy is within :data:`ENTROPY_TOLERANCE` of the target.
    """
    tempering = _Tempering(chain)
    low = torch.zeros_like(target)
    high = torch.ones_like(target)
    v = torch.ones_like(target)
    rows = torch.arange(len(target), device=target.device)
    for _ in range(MATCH_ITERATIONS):
        part = _Tempering.__new__(_Tempering)
        part.inside, part.log_w, part.ell = tempering.inside[rows], tempering.log_w[rows], tempering.ell[rows]
        u = v[rows].sqrt()
        entropy, slope_u = part.entropy_and_slope(u[:, None])
        slope = slope_u / (2 * u)  # dH/dv
        gap = entropy - target[rows]
        low[rows] = torch.where(gap > 0, v[rows], low[rows])
        high[rows] = torch.where(gap <= 0, v[rows], high[rows])
        newton = v[rows] - gap / torch.where((slope < 0) & torch.isfinite(slope), slope, -torch.inf)
        inside = (newton >= low[rows]) & (newton <= high[rows]) & (newton != v[rows])
        matched = gap.abs() <= ENTROPY_TOLERANCE
        following = torch.where(matched, v[rows], torch.where(inside, newton, 0.5 * (low[rows] + high[rows])))
        moving = ((following - v[rows]).abs() > MATCH_TOLERANCE) & ~matched
        v[rows] = following
        rows = rows[moving]
        if rows.numel() == 0:
            break
    return torch.where(chain.inside, tempering.log_p(v.sqrt()[:, None]).exp() * _mass(chain, chain.a), chain.a)


# ---------------------------------------------------------------------------- entry point


def _linear(dynamics: Dynamics, chain: Chain, kind: str) -> torch.Tensor:
    if kind == "diffusion":
        steps = diffusion_steps(chain, dynamics.T)
    else:
        steps = wave_steps(chain, dynamics.T, dynamics.c)
    spectral = dynamics.method == "spectral" or (dynamics.method == "auto" and int(steps.max()) >= SPECTRAL_FROM)
    if spectral:
        if not chain.unit:
            if dynamics.method == "spectral":
                raise DynamicsError("the spectral method needs unit cells; use spacing='index' or method='steps'")
        else:
            return _spectral(chain, kind, dynamics.T, steps, dynamics.c)
    if kind == "diffusion":
        return _diffuse_steps(chain, dynamics.T, steps)
    return _wave_steps(chain, dynamics.T, dynamics.c, steps)


def apply_dynamics(
    dynamics: Dynamics, weights: torch.Tensor, support: torch.Tensor, widths: torch.Tensor | None = None
) -> torch.Tensor:
    """See :meth:`Dynamics.apply`."""
    shape = weights.shape
    keys = shape[-1]
    a = weights.to(torch.float64).reshape(-1, keys)
    s = torch.broadcast_to(support.to(torch.bool), shape).reshape(-1, keys)
    w = None
    if widths is not None and dynamics.spacing == "time":
        w = torch.broadcast_to(widths.to(torch.float64), shape).reshape(-1, keys)
    if dynamics.identity:
        return _restricted(a, s).reshape(shape)
    chain = gather_chain(a, s, w)
    out = chain.a.clone()
    for rows, width in _buckets(chain.length):
        out[rows, :width] = _evolve(dynamics, chain.part(rows, width))
    return chain.scatter(out, a).reshape(shape)


#: Rows are evolved in this many groups of similar support length, each only as wide as
#: its longest support (causal rows range from 1 key to all of them).
BUCKETS = 4


def _buckets(length: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Groups of rows with a non-empty support, by length, and the width each group needs."""
    rows = torch.nonzero(length > 0, as_tuple=True)[0]
    if rows.numel() == 0:
        return []
    rows = rows[torch.argsort(length[rows], stable=True)]
    out = []
    for part in torch.tensor_split(rows, min(BUCKETS, rows.numel())):
        if part.numel():
            out.append((part, int(length[part].max())))
    return out


def _evolve(dynamics: Dynamics, chain: Chain) -> torch.Tensor:
    """The dynamics on the rows of a chain: [rows, keys] float64."""
    if dynamics.kind in ("diffusion", "wave"):
        return _linear(dynamics, chain, dynamics.kind)
    if dynamics.kind == "reaction":
        return _reaction_steps(chain, dynamics.T, dynamics.rho, reaction_steps(chain, dynamics.T, dynamics.rho))
    if dynamics.kind == "temperature":
        return _tempered(chain, torch.full_like(chain.length, 1.0 / dynamics.temperature, dtype=chain.a.dtype)[:, None])
    diffused = _linear(dynamics, chain, "diffusion")
    # Entropy of the normalised row: tempering matches shapes, each row keeps its mass.
    target = row_entropy(diffused / _mass(chain, diffused).clamp_min(_TINY), chain.inside)
    return _matched(chain, target)


def _restricted(a: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Rows unchanged on their support and zero outside it (rows with no support unchanged)."""
    has = support.any(dim=-1, keepdim=True)
    return torch.where(support | ~has, a, torch.zeros((), dtype=a.dtype))
