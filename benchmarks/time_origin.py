"""Time-origin benchmark: the rounding noise of a duration sweep with the origin at 0 and moved.

Usage:
    python benchmarks/time_origin.py [--model smollm2-135m] [--starts 0,1000,4000] [--steps 201]

One few-shot counting prompt; the durations of its last repeated word's copies go over
``--steps`` values in [0.9, 1.1]. The true curve of every logit is smooth in c, so its
second differences on a step of 1e-3 are about 1e-6 times the curvature; what they show
beyond that is rounding. The prompt is placed so its first token sits at each of
``--starts``; the engine evaluates the sweep with ``move_origin=False`` (position ids
equal to the times) and with the default (the origin moved next to the read positions,
see ``contllm.core.engine.time_origin``), side by side in one process, and prints the largest
and the mean |second difference| of the logits of each, and their ratio.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

import contllm
from contllm.core.engine import Engine

PROMPT = (
    '"cat cat" contains 2 words. "dog dog dog" contains 3 words. "sun" contains 1 word. '
    '"tree tree tree tree tree" contains 5 words. "bird bird bird bird" contains 4 words. '
    '"lamp lamp" contains 2 words. "rock rock rock rock rock rock" contains 6 words. '
    '"fish" contains 1 word. "apple apple apple apple" contains'
)


def sweep(lm: contllm.ContinuousLM, start: float, steps: int) -> list[contllm.Signal]:
    """The prompt with its "apple" tokens lasting c in [0.9, 1.1], its first token at time ``start``."""
    base = lm.signal(PROMPT)
    assert base.token_ids is not None and base.offsets is not None
    last = PROMPT.rindex('"apple')
    edited = [i for i, (a, b) in enumerate(base.offsets) if a > last and "apple" in PROMPT[a:b]]
    out = []
    for c in torch.linspace(0.9, 1.1, steps, dtype=torch.float64).tolist():
        d = torch.ones(len(base), dtype=torch.float64)
        d[edited] = c
        out.append(contllm.Signal(durations=d, token_ids=base.token_ids, start=start - 1))
    return out


def roughness(logits: torch.Tensor) -> tuple[float, float]:
    """Largest and mean |second difference| of every logit along the sweep."""
    x = logits.double()
    second = (x[2:] - 2 * x[1:-1] + x[:-2]).abs()
    return float(second.max()), float(second.mean())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--starts", default="0,1000,4000", help="times of the prompt's first token, comma-separated")
    parser.add_argument("--steps", type=int, default=201, help="durations in [0.9, 1.1]")
    args = parser.parse_args(argv)
    lm = contllm.load(args.model)
    print(f"model {args.model}, relative positions: {lm.relative_positions}; {args.steps} durations in [0.9, 1.1]")
    for start in (float(s) for s in args.starts.split(",")):
        signals = sweep(lm, start, args.steps)
        stock = roughness(Engine(lm, move_origin=False).logits(signals))
        moved = roughness(Engine(lm).logits(signals))
        read = float(signals[-1].times[-1])
        print(
            f"first token at {start:g} (read near {read:.0f}): |2nd difference| max {stock[0]:.2e} -> {moved[0]:.2e}, "
            f"mean {stock[1]:.2e} -> {moved[1]:.2e} ({stock[1] / moved[1]:.2f}x less with the origin moved)"
        )


if __name__ == "__main__":
    main()
