"""Hooked runs against plain logits: what hooks, caches and gradients cost, as ratios measured side by side.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/hooked.py --model smollm2-135m --repeats 3

Eight distinct signals share a few-shot counting prefix of about 120 tokens (the shape of
every experiment's items); each ends in its own line of repeated words. On them, in one
process, the runs of each repeat interleaved (a change in load hits all alike), best of
``--repeats``:

  logits             ``lm.logits(signals)``: the engine (chunked, the shared prefix once)
  hooks: no-op       ``lm.run_with_hooks`` with one hook function that returns None
  hooks: head off    ``lm.run_with_hooks`` zeroing one head's output (``attn.hook_z``) at the
                     last position (the prefix left as it is: the shared prefix runs once)
  head off, all      the same head zeroed at every position: the edit reaches the prefix, so
                     the call gives up the shared prefix for one full forward (no target)
  cache: resid_post  ``lm.run_with_cache`` of every layer's ``hook_resid_post`` (last position)
  cache: every name  ``lm.run_with_cache`` of every hook point (last position)
  gradients: line    ``lm.gradients`` of the last position's log-probability of the
                     first digit with respect to the durations of each signal's own line
                     (``tokens``: those after the shared prefix, which runs once without a
                     graph; one forward and one backward of the rest)
  gradients: all     the same with respect to every token's duration, the prefix's included:
                     each signal's gradient by the prefix's durations is its own, so the
                     prefix runs in every row (one full forward and backward; no target)

It prints each run's best time, its ratio to ``logits`` and the target of that ratio,
with the CPU's description and the load average: a time taken beside other busy
processes is not a measurement (ratios suffer less).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import contllm
from contllm.core.prefix import shared_prefix_len
from contllm.hardware import describe

PREFIX = (
    '"cat cat" contains 2 words.\n"dog dog dog" contains 3 words.\n"bird" contains 1 word.\n'
    '"tree tree tree tree tree" contains 5 words.\n"cup cup" contains 2 words.\n'
    '"sun sun sun sun" contains 4 words.\n"key key key" contains 3 words.\n"pen" contains 1 word.\n'
    '"hat hat hat hat hat hat" contains 6 words.\n"box box" contains 2 words.\n'
)
LINES = [
    '"apple apple apple" contains ',
    '"chair chair" contains ',
    '"river river river river" contains ',
    '"stone" contains ',
    '"lamp lamp lamp lamp lamp" contains ',
    '"door door door" contains ',
    '"cloud cloud cloud cloud cloud cloud" contains ',
    '"shoe shoe" contains ',
]

#: Each run's target ratio to ``logits`` (None: measured, no target).
TARGETS: dict[str, float | None] = {
    "logits": None,
    "hooks: no-op": 1.15,
    "hooks: head off": 1.15,
    "head off, all": None,
    "cache: resid_post": 1.5,
    "cache: every name": 4.0,
    "gradients: line": 3.0,
    "gradients: all": None,
}


def runs(lm: Any, signals: Sequence[Any]) -> dict[str, Callable[[], Any]]:
    """The timed runs (see the module docstring), each a function of no arguments."""
    layers = lm.model.config.num_hidden_layers
    digit = lm.tokenizer.encode("1", add_special_tokens=False)[-1]

    def head_off(z: torch.Tensor, hook: Any) -> torch.Tensor:
        z = z.clone()
        z[torch.arange(len(z)), hook.columns(-1), 0] = 0
        return z

    def head_off_everywhere(z: torch.Tensor, hook: Any) -> torch.Tensor:
        z = z.clone()
        z[:, :, 0] = 0
        return z

    def log_p(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float(), dim=-1)[..., digit]

    resid = [f"blocks.{i}.hook_resid_post" for i in range(layers)]
    # The tokens after the prefix every signal shares (the shortest signal's, counted from each one's end).
    line = list(range(-(min(map(len, signals)) - shared_prefix_len(signals, lm)), 0))
    return {
        "logits": lambda: lm.logits(list(signals)),
        "hooks: no-op": lambda: lm.run_with_hooks(list(signals), fwd_hooks=[(resid[0], lambda x, hook: None)]),
        "hooks: head off": lambda: lm.run_with_hooks(
            list(signals), fwd_hooks=[(f"blocks.{layers // 2}.attn.hook_z", head_off)]
        ),
        "head off, all": lambda: lm.run_with_hooks(
            list(signals), fwd_hooks=[(f"blocks.{layers // 2}.attn.hook_z", head_off_everywhere)]
        ),
        "cache: resid_post": lambda: lm.run_with_cache(list(signals), names=resid, positions="last"),
        "cache: every name": lambda: lm.run_with_cache(list(signals), positions="last"),
        "gradients: line": lambda: lm.gradients(list(signals), log_p, wrt="durations", tokens=line),
        "gradients: all": lambda: lm.gradients(list(signals), log_p, wrt="durations"),
    }


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(named: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Best time of each run over ``repeats``, the runs of each repeat interleaved (after one warm-up of each)."""
    for fn in named.values():
        fn()
    best = {name: float("inf") for name in named}
    for _ in range(repeats):
        for name, fn in named.items():
            best[name] = min(best[name], timed(fn))
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    print(describe())
    load = os.getloadavg()[0]
    print(
        f"load average {load:.2f} on {os.cpu_count()} cores; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    )
    lm = contllm.load(args.model)
    signals = [lm.signal(PREFIX + line) for line in LINES]
    print(
        f"{args.model}: {len(signals)} signals of {min(map(len, signals))}-{max(map(len, signals))} tokens", flush=True
    )
    best = measure(runs(lm, signals), args.repeats)
    base = best["logits"]
    print(f"{'run':<20} {'best s':>8} {'x logits':>9} {'target':>7}")
    for name, seconds in best.items():
        target = TARGETS[name]
        verdict = "" if target is None else f"<= {target:g}" + ("" if seconds / base <= target else "  (missed)")
        print(f"{name:<20} {seconds:8.3f} {seconds / base:9.2f} {verdict:>7}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
