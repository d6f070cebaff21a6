"""Attribution benchmark: completeness error against gradient steps, per item and quadrature rule.

Usage:
    python benchmarks/completeness.py [--model smollm2-135m] [--steps 32,64,128]
                                      [--rules placed] [--first 8] [--skip 0] [--reference 0]
                                      [--tokens item] [--floor 0]

For each counting item (the attribution experiment's defaults unless ``--tokens`` or
``--floor`` say otherwise: the item's line, E[k] over the digits, the deletion baseline),
each rule and each step count, it runs :func:`contllm.attribution.attribute` and prints
the relative completeness error
|sum of attributions - (f(prompt) - f(baseline))| / |f(prompt) - f(baseline)|, the remainder
below the path's lower end (part of that error), the gradients and forward evaluations
spent and the seconds taken; then per rule and step count the max and mean error and how
many items are within 1e-3. ``--skip`` leaves out the first items of the selection, so
items that were not looked at while tuning a rule can be checked apart.

The completeness error checks the sum of the attributions; the placed rule also uses checks
against f to decide where its last steps go. ``--reference N`` adds a check of each token's
attribution that does not rest on f: the largest |A_j - A_j(reference)| / |f(prompt) - f(baseline)|
against the same rule at N gradient steps.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import contllm
from contllm import registry
from contllm.attribution import RULES, attribute
from contllm.hardware import describe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", default="32,64,128", help="comma-separated step counts")
    parser.add_argument("--rules", default="placed", help=f"comma-separated rules among {', '.join(RULES)}")
    parser.add_argument("--first", type=int, default=8, help="the counting dataset's first N items (balanced)")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first K of those")
    parser.add_argument("--tokens", default="item", help="the experiment's --tokens: item (the item's line) or all")
    parser.add_argument("--floor", default="0", help="the experiment's --floor: 0 (deletion baseline) or a factor in (0, 1)")
    parser.add_argument("--reference", type=int, default=0,
                        help="also compare every token's attribution with the same rule at this many steps (0: no)")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    rules = args.rules.split(",")
    # The error at a given step count depends on the CPU: the panels are laid out from samples of f,
    # whose float32 rounding differs by instruction set (see tests/integration/test_attribution.py).
    print(describe())
    lm = contllm.load(args.model)
    experiment = registry.get("attribution")
    config = experiment.config({"first": str(args.first), "tokens": args.tokens, "floor": args.floor})
    items = experiment.items(config)[args.skip :]
    print(f"{args.model}: {len(items)} counting items, tokens {args.tokens}, E[k], floor {config.floor}, float32")
    errors: dict[tuple[str, int], list[float]] = {}
    deviations: dict[tuple[str, int], list[float]] = {}
    for item in items:
        signal, _, tokens, readout, _ = experiment.plan(lm, item, config)
        for rule in rules:
            reference = None
            if args.reference:
                reference = attribute(lm, signal, readout, tokens, steps=args.reference, rule=rule, floor=config.floor)
            if reference is not None:
                print(f"{item.id}  {rule:8s} {args.reference:4d} steps  error {reference.completeness_error:.2e}  (reference)")
            for n in steps:
                start = time.perf_counter()
                found = attribute(lm, signal, readout, tokens, steps=n, rule=rule, floor=config.floor)
                seconds = time.perf_counter() - start
                errors.setdefault((rule, n), []).append(found.completeness_error)
                deviation = ""
                if reference is not None:
                    worst = float(np.max(np.abs(found.attributions - reference.attributions)) / abs(found.total))
                    deviations.setdefault((rule, n), []).append(worst)
                    deviation = f"  token dev {worst:.1e}"
                print(f"{item.id}  {rule:8s} {n:4d} steps  error {found.completeness_error:.2e}  "
                      f"remainder {abs(found.remainder / found.total):.1e}  gradients {found.meta['gradients']:4d}  "
                      f"forwards {found.meta['forwards']:4d}  panels {found.meta['panels']:3d}  {seconds:5.1f} s{deviation}", flush=True)
    for (rule, n), values in errors.items():
        within = sum(e <= 1e-3 for e in values)
        line = f"{rule:8s} {n:4d} steps: max {max(values):.2e}  mean {np.mean(values):.2e}  within 1e-3: {within} of {len(values)}"
        if (rule, n) in deviations:
            line += f"  token dev vs {args.reference} steps: max {max(deviations[rule, n]):.1e}"
        print(line)


if __name__ == "__main__":
    main()
