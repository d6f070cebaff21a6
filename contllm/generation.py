"""Generation in continuous time: continue a batch of signals, each new token held for a chosen duration.

:func:`generate` continues every signal of a batch through the KV cache: the prompts go
through the model once (left-padded with zero-duration tokens, which no other token
sees), then each step feeds one token per row. Token k of a continuation gets a
duration d_k and sits at time t_k = t_{k-1} + d_k (t_{-1}: the prompt's last time), the
same rule a signal's durations and times follow; with every d_k = 1 this is the stock
model's decoding. The next token is the argmax of the logits (greedy) or a draw from
them after temperature, top-k and top-p (``sample=True``), from a generator seeded per
row, so that a seed reproduces a continuation.

``duration`` says how long each generated token lasts:

- a number (1.0: the stock model's tempo; 0.5: tokens at half length, twice as fast);
- a list of at least ``max_new_tokens`` numbers, one per step;
- a function of the step, ``f(step) -> float``, or of the step and the tokens generated
  so far in that row (the one being timed included), ``f(step, token_ids) -> float``:
  ``lambda k, ids: 2.0 if "," in tokenizer.decode(ids[:-1]) else 1.0`` slows down after
  a comma.

A row ends after an EOS token (with ``stop_at_eos``), after the token that completes one
of ``stop`` strings (the token and the string stay in the output), or after
``max_new_tokens`` tokens, at most :data:`MAX_NEW_TOKENS`.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from contllm.core.decoding import MAX_NEW_TOKENS, Duration, Sampler, check_options, check_time
from contllm.core.engine import check_inputs, check_signals, evaluation
from contllm.core.forward import forward_batch
from contllm.core.signal import Signal, pad_signals
from contllm.errors import SignalError
from contllm.internals.activations import ActivationCache, activation_names, run_with_cache

__all__ = ["GENERATE_OPTIONS", "MAX_NEW_TOKENS", "Generation", "Step", "check_options", "generate"]


@dataclass
class Step:
    """One generated token.

    token_id: the token; text: its decoded piece (None without a tokenizer).
    time, duration: where the token sits in the continued signal.
    probability: the model's probability of this token (softmax of the raw logits, before
        temperature, top-k or top-p).
    top: the ``probs`` most likely tokens as (token id, probability), when asked for an int.
    distribution: float32 [vocab], the whole distribution, when asked for "full".
    """

    token_id: int
    text: str | None
    time: float
    duration: float
    probability: float
    top: list[tuple[int, float]] | None = None
    distribution: torch.Tensor | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (the full distribution as a list when there is one)."""
        out: dict[str, Any] = {
            "token_id": self.token_id,
            "text": self.text,
            "time": self.time,
            "duration": self.duration,
            "probability": self.probability,
        }
        if self.top is not None:
            out["top"] = [[i, p] for i, p in self.top]
        if self.distribution is not None:
            out["distribution"] = self.distribution.tolist()
        return out


@dataclass
class Generation:
    """The continuation of one signal.

    token_ids: the generated tokens; text: their decoded text (None without a tokenizer).
    signal: the prompt followed by the generated tokens at their durations and times.
    steps: one :class:`Step` per generated token.
    stopped: "eos", "stop" (a stop string), "length" (max_new_tokens) or "none" (no token asked for).
    activations: with ``activations=``, the named activations at the position each step
        was read from (the prompt's last token for step 0, generated token k-1 for step k).
    """

    token_ids: list[int]
    text: str | None
    signal: Signal
    steps: list[Step] = field(default_factory=list)
    stopped: str = "length"
    activations: ActivationCache | None = None


def eos_ids(model: Any) -> set[int]:
    """The model's end-of-sequence token ids (generation config first, then the model config)."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


# ---------------------------------------------------------------------- argument checks
def _pick(sampler: Sampler, logits: torch.Tensor, generator: torch.Generator | None) -> int:
    """The next token from one row's logits [vocab]."""
    if not sampler.sample:
        return int(logits.argmax())
    scores = logits.float().cpu() / sampler.temperature
    if sampler.top_k is not None and sampler.top_k < scores.numel():
        kth = torch.topk(scores, sampler.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if sampler.top_p is not None and sampler.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        before = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) - torch.softmax(ordered, dim=-1)
        drop = torch.zeros_like(scores, dtype=torch.bool)
        drop[order] = before >= sampler.top_p  # the most likely token is always kept (before = 0)
        scores = scores.masked_fill(drop, -math.inf)
    return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))


def _probs_request(probs: Any, vocab: int) -> int | str | None:
    if probs is None or probs == "full":
        return probs
    if isinstance(probs, bool) or not isinstance(probs, int) or probs < 1:
        raise SignalError(f"probs must be None, 'full' or a number of top tokens >= 1, got {probs!r}")
    return min(probs, vocab)


def _check_names(lm: Any, names: Any) -> None:
    items = [names] if isinstance(names, str) else names
    known = activation_names(lm)
    if not isinstance(items, (list, tuple)) or not items or any(n not in known for n in items):
        raise SignalError(
            f"activations must be activation names or a list of them, got {names!r}; "
            f"this model's names run from {known[0]} to {known[-1]} (contllm.internals.activations.activation_names)"
        )


# ---------------------------------------------------------------------- generation
def generate(
    lm: Any,
    signals: Signal | Sequence[Signal],
    max_new_tokens: int = 20,
    *,
    duration: Duration = 1.0,
    sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_at_eos: bool = True,
    probs: int | str | None = None,
    activations: str | Sequence[str] | None = None,
) -> Generation | list[Generation]:
    """Continue each signal by up to ``max_new_tokens`` tokens; a single Signal gives one Generation, a list a list.

    lm: a ContinuousLM. max_new_tokens: 0 to :data:`MAX_NEW_TOKENS`.
    duration: each generated token's duration (see the module docstring).
    sample: False for greedy; True draws with ``temperature`` (> 0), ``top_k`` (>= 1),
        ``top_p`` (in (0, 1]) and ``seed``: row i of the batch draws from a generator
        seeded with seed + i (None: a fresh seed), so row i of a batch equals the same
        signal generated alone with seed + i.
    stop: strings that end a row once its text contains one. stop_at_eos: end a row at
        the model's EOS token.
    probs: None, k (each step's k most likely tokens) or "full" (each step's whole
        distribution), on :class:`Step`.
    activations: activation names of :mod:`contllm.internals.activations`, read at each step's
        position in one extra forward of the continued signal.
    Raises SignalError for a bad argument (before the model runs) or a prompt ``lm.logits`` would refuse.
    """
    single = isinstance(signals, Signal)
    if not single and not isinstance(signals, (list, tuple)):
        raise SignalError(
            f"signal must be a Signal or a list of them, got {type(signals).__name__}; build one with lm.signal(text)"
        )
    items = check_signals(signals, single_ok=True)
    steps, rule, sampler, stops = check_options(
        max_new_tokens,
        duration=duration,
        sample=sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=stop,
        stop_at_eos=stop_at_eos,
    )
    for s in items:  # the prompt's end plus what the tokens add must stay a time a signal can hold
        check_time(duration, steps, float(s.end))
    if stops and lm.tokenizer is None:
        raise SignalError("stop strings need a tokenizer to decode the continuation; this model has none")
    vocab = int(lm.model.get_input_embeddings().weight.shape[0])
    wanted = _probs_request(probs, vocab)
    if activations is not None:
        _check_names(lm, activations)
    check_inputs(lm, items, [[len(s) - 1] for s in items])

    rows = len(items)
    if sampler.sample:
        base = int(torch.randint(0, 2**31 - 1, ())) if seed is None else seed
        generators: list[torch.Generator | None] = [torch.Generator().manual_seed(base + i) for i in range(rows)]
    else:
        generators = [None] * rows
    eos = eos_ids(lm.model) if stop_at_eos else set()
    new_ids: list[list[int]] = [[] for _ in items]
    records: list[list[Step]] = [[] for _ in items]
    stopped = ["length" if steps else "none"] * rows
    live = [steps > 0] * rows
    times = [s.end for s in items]
    with evaluation(lm):
        logits, context = forward_batch(lm, pad_signals(items), logits_to_keep=1, use_cache=True)
        for k in range(steps):
            ids_in, times_in, durations_in = [], [], []
            last = logits[:, -1]
            for r in range(rows):
                if not live[r]:  # a finished row rides along as an invisible (duration 0) token
                    ids_in.append(new_ids[r][-1] if new_ids[r] else 0)
                    times_in.append(times[r])
                    durations_in.append(0.0)
                    continue
                token = _pick(sampler, last[r], generators[r])
                new_ids[r].append(token)
                d = rule(k, new_ids[r])
                times[r] += d
                records[r].append(_step(lm, last[r], token, times[r], d, wanted))
                ids_in.append(token)
                times_in.append(times[r])
                durations_in.append(d)
                why = _ended(lm, new_ids[r], eos, stops)
                if why:
                    live[r], stopped[r] = False, why
            if not any(live) or k == steps - 1:
                break
            step = pad_signals(
                [Signal.from_ids([i], [d], times=[t]) for i, d, t in zip(ids_in, durations_in, times_in)]
            )
            logits, context = forward_batch(lm, step, logits_to_keep=1, context=context)
    out = []
    for r, s in enumerate(items):
        extended = continued(lm, s, records[r])
        cache = None
        if activations is not None and records[r]:
            reads = list(range(len(s) - 1, len(s) - 1 + len(records[r])))
            cache = run_with_cache(lm, extended, names=activations, positions=reads)
        text = lm.tokenizer.decode(new_ids[r]) if lm.tokenizer is not None else None
        out.append(Generation(new_ids[r], text, extended, records[r], stopped[r], cache))
    return out[0] if single else out


def _step(lm: Any, logits: torch.Tensor, token: int, time: float, duration: float, wanted: int | str | None) -> Step:
    dist = torch.softmax(logits.float().cpu(), dim=-1)
    piece = lm.tokenizer.decode([token]) if lm.tokenizer is not None else None
    top = None
    if isinstance(wanted, int):
        values, indices = torch.topk(dist, wanted)
        top = [(int(i), float(v)) for i, v in zip(indices, values)]
    full = dist if wanted == "full" else None
    return Step(token, piece, time, duration, float(dist[token]), top, full)


def _ended(lm: Any, ids: list[int], eos: set[int], stops: list[str]) -> str | None:
    if ids[-1] in eos:
        return "eos"
    if stops:
        text = lm.tokenizer.decode(ids)
        if any(s in text for s in stops):
            return "stop"
    return None


def continued(lm: Any, signal: Signal, steps: Sequence[Step]) -> Signal:
    """``signal`` followed by the tokens of ``steps`` at their durations and times (explicit times).

    Given embeddings are extended with the model's embeddings of the new tokens; the text
    and character offsets grow by the decoded continuation, so edits by character span
    still address the new tokens.
    """
    if not steps:
        return signal
    new = torch.tensor([s.token_id for s in steps], dtype=torch.long)
    ids = None if signal.token_ids is None else torch.cat([signal.token_ids, new])
    embeds = None
    if signal.embeds is not None:
        with torch.inference_mode():
            extra = lm.model.get_input_embeddings()(new.to(lm.device))
        embeds = torch.cat([signal.embeds, extra.to(device=signal.embeds.device, dtype=signal.embeds.dtype)])
    durations = torch.cat([signal.durations, torch.tensor([s.duration for s in steps], dtype=torch.float64)])
    times = torch.cat([signal.times, torch.tensor([s.time for s in steps], dtype=torch.float64)])
    text, offsets = None, None
    if signal.text is not None and signal.offsets is not None and lm.tokenizer is not None:
        base, pieces = len(signal.text), [0]
        for k in range(1, len(steps) + 1):
            pieces.append(max(pieces[-1], len(lm.tokenizer.decode(new[:k].tolist()))))
        text = signal.text + lm.tokenizer.decode(new.tolist())
        offsets = signal.offsets + tuple((base + a, base + b) for a, b in itertools.pairwise(pieces))
    return Signal(durations=durations, token_ids=ids, embeds=embeds, explicit_times=times, text=text, offsets=offsets)


#: The keyword options of :func:`generate` (``lm.generate`` refuses any other by name).
GENERATE_OPTIONS = tuple(
    name for name, p in inspect.signature(generate).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
)
