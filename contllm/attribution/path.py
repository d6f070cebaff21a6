"""The duration path of an attribution: a signal whose attributed tokens last tau x d, with gradients.

:class:`DurationPath` evaluates a read-out along the path, batched over tau, with or without
gradients of the log-durations; the tokens before the first attributed one (and before the
read position) run once without gradients and their keys are reused. Its forwards are
chunked by memory (:func:`row_bytes` against :func:`path_bytes`): a differentiated row keeps
every layer's activations for the backward, and every row its own copy of the prefix keys.
Each forward is contllm's one forward (:func:`contllm.core.forward.forward`, with its float64
rule: a float64 model keeps a float64 mask and read-out here) inside
:func:`contllm.core.forward.differentiable`, whose :func:`contllm.core.forward.rotary_gradients` lets
gradients reach float position ids where transformers computes the rotary table under
``torch.no_grad()`` (earlier 5.x releases). :func:`differentiable_rotary`, which calls the
undecorated forward of a rotary module decorated with ``torch.no_grad()``, is kept for
callers of its own; contllm's runs no longer use it.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from contllm.core.families import sizes
from contllm.core.forward import Context, differentiable, embeddings, forward
from contllm.core.signal import Signal
from contllm.internals.hooks import replaced_forward

#: Rows x tokens after the prefix of one forward of the path on the CPU (8 x that on an
#: accelerator) unless ``max_batch_tokens`` says otherwise; the memory budget below caps it too.
CPU_GRAD_TOKENS = 1024

#: Bytes one forward of the duration path may hold on the CPU, as :func:`row_bytes` estimates
#: them. A differentiated row of a counting item (6 tokens after a 180-token prefix) holds
#: about 45 MB on SmolLM2-135M, mostly its copy of the prefix keys, so this is 15 rows with
#: gradients (the token cap alone allowed 170: 4 GB) and 74 without.
CPU_PATH_BYTES = 768 << 20

#: On a CUDA device the budget is this share of its free memory (at least :data:`CPU_PATH_BYTES`).
ACCELERATOR_PATH_SHARE = 0.5


def _no_grad_wrapped(function: Any) -> Any:
    """The function inside a ``@torch.no_grad()`` decoration, or None when ``function`` is not one."""
    code = getattr(function, "__code__", None)
    inner = getattr(function, "__wrapped__", None)
    if code is None or inner is None or code.co_name != "decorate_context":
        return None
    return inner


@contextmanager
def differentiable_rotary(model: torch.nn.Module) -> Iterator[int]:
    """Let gradients reach float position ids through transformers' rotary embeddings.

    Every ``*RotaryEmbedding`` module whose forward is decorated with ``torch.no_grad()``
    gets the undecorated forward as an attribute of its own instance for as long as the
    context lasts; on exit (also on an exception) the attribute is removed, so the class's
    decorated forward is used again. Yields how many modules were switched.
    """
    with ExitStack() as stack:
        switched = 0
        for module in model.modules():
            if not type(module).__name__.endswith("RotaryEmbedding") or "forward" in vars(module):
                continue
            inner = _no_grad_wrapped(type(module).forward)
            if inner is not None:
                stack.enter_context(replaced_forward(module, types.MethodType(inner, module)))
                switched += 1
        yield switched


def path_bytes(lm: Any) -> int:
    """The default memory budget of one forward of the duration path on ``lm``'s device.

    :data:`CPU_PATH_BYTES` on the CPU (and any device without memory statistics); on a CUDA
    device :data:`ACCELERATOR_PATH_SHARE` of its free memory, at least :data:`CPU_PATH_BYTES`.
    """
    if lm.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(lm.device)
        return max(CPU_PATH_BYTES, int(ACCELERATOR_PATH_SHARE * free))
    return CPU_PATH_BYTES


def row_bytes(lm: Any, width: int, keys: int, *, gradients: bool) -> int:
    """Estimated bytes one row of a path forward holds at its peak: ``width`` tokens attending ``keys`` keys.

    Per layer a row holds its keys and values (the prefix's copied into the row by the KV
    cache), again once per query head where grouped-query attention repeats them, the
    attention scores, mask and probabilities (3 x heads x width x keys) and about
    12 x hidden + 5 x intermediate values per token, plus the read position's logits. With
    ``gradients`` every layer's share stays until the backward; without, only the KV cache
    of every layer does, the rest lives one layer at a time. Values are at least 4 bytes
    (a half-precision model keeps its state in float32 here). Calibrated on SmolLM2-135M
    (6 tokens over 186 keys: 50 MB estimated with gradients, 40-48 MB measured; 10 MB
    without, 8 MB measured).
    """
    size = sizes(lm)
    element = max(4, torch.finfo(lm.dtype).bits // 8)
    kv = 2 * size.kv_heads * keys * size.head_dim
    repeated = 2 * size.heads * keys * size.head_dim if size.heads != size.kv_heads else 0
    scores = 3 * size.heads * width * keys
    tokens = width * (12 * size.hidden + 5 * size.intermediate + 2 * (size.heads + 2 * size.kv_heads) * size.head_dim)
    logits = 3 * 8 * size.vocab  # float64 log-probabilities and their gradient
    if gradients:
        return element * size.layers * (kv + repeated + scores + tokens) + logits
    return element * (size.layers * kv + repeated + scores + 2 * tokens) + logits


class DurationPath:
    """The signal with its attributed tokens at duration tau x d, batched over tau, with a cached prefix.

    Forwards are chunked so that each holds at most ``max_batch_bytes`` (None:
    :func:`path_bytes`) by :func:`row_bytes` and at most ``max_batch_tokens`` rows x tokens
    after the prefix (None: :data:`CPU_GRAD_TOKENS`, 8 x that on an accelerator): ``rows``
    taus per differentiated forward, ``value_rows`` per forward without gradients.
    """

    def __init__(
        self,
        lm: Any,
        signal: Signal,
        readout: Any,
        active: list[int],
        position: int,
        max_batch_tokens: int | None,
        max_batch_bytes: int | None = None,
    ) -> None:
        self.lm, self.signal, self.readout, self.active, self.position = lm, signal, readout, active, position
        n = len(signal)
        self.prefix = min([position, *active])
        self.width = n - self.prefix
        budget = path_bytes(lm) if max_batch_bytes is None else int(max_batch_bytes)
        if max_batch_tokens is None:
            max_batch_tokens = CPU_GRAD_TOKENS if lm.device.type == "cpu" else 8 * CPU_GRAD_TOKENS
        cap = int(max_batch_tokens) // self.width
        self.rows, self.value_rows = (
            max(1, min(cap, budget // row_bytes(lm, self.width, n, gradients=g))) for g in (True, False)
        )
        self.explicit = signal.explicit_times is not None
        self._context: tuple[Any, torch.Tensor, torch.Tensor] | None = None

    # ------------------------------------------------------------ inputs
    def _durations(self, tau: torch.Tensor, log_active: torch.Tensor | None) -> torch.Tensor:
        """Durations [B, n] at each tau (the active ones from ``log_active`` when given, for gradients)."""
        d = self.signal.durations.to(torch.float64)
        rows = d[None].repeat(len(tau), 1)
        if self.active:
            idx = torch.tensor(self.active, dtype=torch.long)
            scaled = torch.exp(log_active) if log_active is not None else tau[:, None] * d[idx][None]
            rows = _scatter(rows, idx, scaled)
        return rows

    def _times(self, durations: torch.Tensor) -> torch.Tensor:
        if self.explicit:
            return self.signal.times.to(torch.float64)[None].expand(durations.shape[0], -1)
        return self.signal.start + torch.cumsum(durations, dim=1)

    def _prefix_context(self) -> tuple[Any, torch.Tensor, torch.Tensor] | None:
        """The KV cache, times and durations [1, p] of the tokens before the path's first changing one."""
        if self.prefix == 0:
            return None
        if self._context is None:
            d = self.signal.durations.to(torch.float64)[None, : self.prefix]
            times = self._times(self.signal.durations.to(torch.float64)[None])[:, : self.prefix]
            with torch.no_grad():
                _, made = self._run(d, times, keep=torch.empty(0, dtype=torch.long), start=True)
            assert made is not None
            self._context = (made.cache, times, d)
        return self._context

    def _run(
        self,
        durations: torch.Tensor,
        times: torch.Tensor,
        *,
        keep: torch.Tensor,
        context: tuple[Any, torch.Tensor, torch.Tensor] | None = None,
        start: bool = False,
    ) -> tuple[torch.Tensor, Context | None]:
        """One forward of the tokens [prefix, n) at ``durations``/``times`` [B, width] (with ``start``: of [0, prefix),
        keeping every key in a new cache); the logits of the columns ``keep`` and the cache's context.

        The forward is :func:`contllm.core.forward.forward`, with the float64 rule of attribution (``keep_float64``).
        """
        lm = self.lm
        lo = 0 if start else self.prefix
        hi = lo + durations.shape[1]
        rows = durations.shape[0]
        ids, given = self.signal.token_ids, self.signal.embeds
        embeds = embeddings(
            lm, None if ids is None else ids[lo:hi][None], None if given is None else given[lo:hi][None]
        ).expand(rows, -1, -1)
        kept = None
        if context is not None:
            prefix_cache, prefix_times, prefix_durations = context
            cache: Any = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in prefix_cache.layers])
            for layer in cache.layers:
                layer.keys = layer.keys.expand(rows, -1, -1, -1)
                layer.values = layer.values.expand(rows, -1, -1, -1)
            kept = Context(cache, prefix_times.expand(rows, -1), prefix_durations.expand(rows, -1))
        return forward(
            lm, embeds, times, durations, logits_to_keep=keep, context=kept, use_cache=start, keep_float64=True
        )

    def _read(self, durations: torch.Tensor) -> torch.Tensor:
        """f [B] at full durations [B, n] (differentiable in them)."""
        times = self._times(durations)
        context = self._prefix_context()
        column = torch.tensor([self.position - self.prefix], dtype=torch.long)
        logits, _ = self._run(durations[:, self.prefix :], times[:, self.prefix :], keep=column, context=context)
        return self.readout.from_logits(logits[:, 0])

    # ------------------------------------------------------------ public
    def values(self, taus: np.ndarray) -> np.ndarray:
        """f at each tau [T] (no gradients: no activation is kept), :attr:`value_rows` taus per forward."""
        out = []
        with differentiable(self.lm), torch.no_grad():
            for lo in range(0, len(taus), self.value_rows):
                tau = torch.as_tensor(taus[lo : lo + self.value_rows], dtype=torch.float64)
                out.append(self._read(self._durations(tau, None)).cpu().numpy())
        return np.concatenate(out)

    def gradients(self, taus: np.ndarray) -> np.ndarray:
        """df/dlog d_j [T, active] at each tau, :attr:`rows` taus per differentiated forward.

        Only the log-durations of the active tokens require a gradient (the weights are
        frozen, the prefix ran without gradients); each chunk's graph is freed by its
        backward and its tensors are dropped before the next chunk runs, so at most one
        chunk's activations are alive. Returns numpy: nothing of a graph leaves.
        """
        d = self.signal.durations.to(torch.float64)[torch.tensor(self.active, dtype=torch.long)]
        out = []
        with differentiable(self.lm):
            for lo in range(0, len(taus), self.rows):
                tau = torch.as_tensor(taus[lo : lo + self.rows], dtype=torch.float64)
                log_active = (torch.log(tau)[:, None] + torch.log(d)[None]).requires_grad_(True)
                f = self._read(self._durations(tau, log_active))
                (grad,) = torch.autograd.grad(f.sum(), log_active)
                out.append(grad.cpu().numpy())
                del f, grad, log_active
        return np.concatenate(out)


def _scatter(rows: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``rows`` with columns ``idx`` replaced by ``values`` (out of place, differentiable in ``values``)."""
    keep = torch.ones(rows.shape[1], dtype=torch.bool)
    keep[idx] = False
    out = rows * keep.to(rows.dtype)[None]
    return out.index_add(1, idx, values)


def window_crossings(lm: Any, signal: Signal, tokens: list[int], low: float) -> int:
    """How many (query, key) pairs cross a sliding window's edge between tau = low and tau = 1.

    Along the path the times move linearly in tau, so the gap t_i - t_j of a key j before
    query i crosses a window W at most once; a crossing makes the read-out jump (the window
    edge is sharp), and integrated gradients cannot see a jump. 0 for a model without windows
    and for a signal with explicit times (its times do not move).
    """
    from contllm.core.families import layer_windows

    windows = layer_windows(lm.family, lm.model.config)
    sizes = {w for w in (windows.values() if isinstance(windows, dict) else [windows]) if w is not None}
    if not sizes or signal.explicit_times is not None or not tokens:
        return 0
    d = signal.durations.to(torch.float64)
    scaled = d.clone()
    scaled[tokens] = d[tokens] * low
    ends = [signal.start + torch.cumsum(x, 0) for x in (d, scaled)]
    gaps = [(t[:, None] - t[None, :]) for t in ends]  # [query, key]
    before = torch.tril(torch.ones(len(d), len(d), dtype=torch.bool))
    crossing = 0
    for w in sizes:
        crossing += int((((gaps[0] < w) != (gaps[1] < w)) & before).sum())
    return crossing
