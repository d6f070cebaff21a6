"""What makes the main job fast: each lever against its alternative, side by side in one process.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/levers.py [--model NAME] [--items 22] [--repeats 2]
        [--sections conversion,prefix,item-prefix,keep,budget,readout,bf16] [--bf16 auto|on|off]

Every section times the toolkit's way and the alternative alternately, ``--repeats`` times
each, and prints the best of each and their ratio (a ratio is what survives other jobs on
the machine; the absolute times do not):

  conversion    the first conversion's GGUF reading (tokenizer and dense weights), through
                contllm.models.gguf_read (the header parsed once) against transformers' stock
                path (three parses); the weights and tokenizer must come out identical;
  prefix        the engine on the counting items of the default run with the shared few-shot
                prefix against every signal in full (on a third of the items: it is slow);
  item-prefix   chunks of one item each, sharing the item's own prefix up to its first
                edited token, against the engine's plan (the few-shot prefix shared by all);
  keep          two groups of items through one engine that keeps its prefix between calls,
                against one that does not (the runner's engine keeps it);
  budget        the chunk budget (max_batch_tokens) at 2048, 4096, 8192 and 16384;
  readout       the digits' token sets looked up in the vocabulary index against a scan of
                the whole vocabulary per item;
  bf16          the half-precision probe, then the engine on a bfloat16 copy of the model
                (float32 state and projections) against float32, with the distance of the
                read-out probabilities, E[k] and the argmax digit (skipped where the probe
                says bfloat16 does not pay, unless --bf16 on).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sweep import add_bf16_flags, bf16_sections, engine_flops, matmul_rate

import contllm
from contllm.core import chunks as chunk_plans
from contllm.core import engine as engine_module
from contllm.core import readout
from contllm.core.engine import Engine
from contllm.core.prefix import shared_prefix_len
from contllm.experiments import counting
from contllm.experiments.counting import CountingConfig
from contllm.experiments.sweeps import run_plans
from contllm.hardware import describe, half_matmul_speedup
from contllm.models import DEFAULT_MODEL, REGISTRY

SECTIONS = ("conversion", "prefix", "item-prefix", "keep", "budget", "readout", "bf16")


def best_of(repeats: int, *runs: Callable[[], Any]) -> list[float]:
    """The best wall time of each of ``runs``, timed alternately ``repeats`` times."""
    times = [float("inf")] * len(runs)
    for _ in range(repeats):
        for k, fn in enumerate(runs):
            start = time.perf_counter()
            fn()
            times[k] = min(times[k], time.perf_counter() - start)
    return times


def ratio_line(name: str, ours: float, theirs: float, what: str) -> str:
    return f"{name}: {ours:.2f} s against {theirs:.2f} s {what} ({theirs / ours:.2f}x)"


# ---------------------------------------------------------------------- sections
def conversion(model: str, repeats: int) -> None:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from contllm.models import conversion as convert

    entry = REGISTRY[model]
    with tempfile.TemporaryDirectory() as root:
        path, _ = entry.gguf.materialize(Path(root))
        results: dict[str, Any] = {}

        def ours() -> None:
            results["ours"] = convert._load_gguf(path)

        def stock() -> None:
            kwargs = {"gguf_file": path.name, "local_files_only": True}
            tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
            config = transformers.GgufConfig(gguf_file=path.name, dequantize=True)
            model_ = AutoModelForCausalLM.from_pretrained(
                path.parent, dtype=torch.float32, quantization_config=config, **kwargs
            )
            results["stock"] = (model_, tokenizer)

        mine, theirs = best_of(repeats, ours, stock)
        a, b = results["ours"][0].state_dict(), results["stock"][0].state_dict()
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        tok = results["ours"][1].backend_tokenizer.to_str() == results["stock"][1].backend_tokenizer.to_str()
        print(ratio_line("conversion (GGUF to a dense model and tokenizer)", mine, theirs, "stock"))
        print(f"  the same weights: {same}; the same tokenizer: {tok}; {results['ours'][2]}")


def counting_plans(lm: Any, items: int) -> list[Any]:
    config = CountingConfig()
    return [counting.plan_item(lm, item, config) for item in config.counting_items()[:items]]


def prefix(lm: Any, plans: list[Any], repeats: int) -> None:
    part = plans[: max(1, len(plans) // 3)]
    signals = [s for p in part for s in p.signals]
    shared, full = Engine(lm), Engine(lm, prefix_cache=False)
    mine, theirs = best_of(repeats, lambda: shared.probs(signals), lambda: full.probs(signals))
    assert shared.last_stats is not None and full.last_stats is not None
    print(ratio_line(f"shared few-shot prefix ({len(part)} items)", mine, theirs, "every signal in full"))
    print(f"  tokens computed {shared.last_stats.tokens_computed} against {full.last_stats.tokens_computed}")


def item_prefix(lm: Any, plans: list[Any], repeats: int) -> None:
    """Each item's sweep as its own chunk, sharing the item's own prefix, through the engine's own chunk runner."""
    signals = [s for p in plans for s in p.signals]
    bounds = np.cumsum([0] + [len(p.signals) for p in plans])
    per_item = [
        chunk_plans.Chunk(tuple(range(lo, hi)), shared_prefix_len(signals[lo:hi], lm, before=len(signals[lo]) - 1))
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ]
    engine = Engine(lm)
    stock_plan = engine_module.plan

    def by_item() -> None:
        engine_module.plan = lambda *args, **kwargs: per_item  # type: ignore[assignment]
        try:
            engine.probs(signals)
        finally:
            engine_module.plan = stock_plan

    mine, theirs = best_of(repeats, lambda: Engine(lm).probs(signals), by_item)
    own = [c.prefix for c in per_item]
    print(
        ratio_line("the few-shot prefix shared by all", mine, theirs, f"each item's own ({min(own)}-{max(own)} tokens)")
    )


def keep(lm: Any, plans: list[Any], repeats: int) -> None:
    half = len(plans) // 2
    groups = [[s for p in plans[:half] for s in p.signals], [s for p in plans[half:] for s in p.signals]]

    def calls(engine: Engine) -> Callable[[], None]:
        return lambda: [engine.probs(g) for g in groups] and None

    kept, fresh = Engine(lm, keep_prefix=True), Engine(lm)
    mine, theirs = best_of(repeats, calls(kept), calls(fresh))
    print(ratio_line("two groups, the prefix kept between them", mine, theirs, "computed per group"))


def budget(lm: Any, plans: list[Any], repeats: int) -> None:
    signals = [s for p in plans for s in p.signals]
    budgets = (2048, 4096, 8192, 16384)
    engines = [Engine(lm, max_batch_tokens=b) for b in budgets]
    layouts = []
    for e in engines:
        e.probs(signals[:2])
        e.probs(signals)
        assert e.last_stats is not None
        layouts.append([(c.rows, c.width) for c in e.last_stats.chunks])
    if all(layout == layouts[0] for layout in layouts):
        print(f"chunk budget: {', '.join(map(str, budgets))} plan the same {len(layouts[0])} chunks here; not timed")
        return
    times = best_of(repeats, *[lambda e=e: e.probs(signals) for e in engines])
    print("chunk budget: " + ", ".join(f"{b}: {t:.2f} s" for b, t in zip(budgets, times)))


def readouts(lm: Any, items: int, repeats: int) -> None:
    tokenizer = lm.tokenizer
    readout.decoded_vocabulary(tokenizer)  # decoded once per tokenizer either way

    def scan() -> None:
        wanted = {
            form: label for label, words in readout.DIGIT_SPELLINGS.items() for w in words for form in (w, " " + w)
        }
        for _ in range(items):
            [i for i, text in enumerate(readout.decoded_vocabulary(tokenizer)) if text in wanted]

    def indexed() -> None:
        for _ in range(items):
            readout.digits(tokenizer)

    mine, theirs = best_of(repeats, indexed, scan)
    print(ratio_line(f"digit token sets for {items} items, from the index", mine, theirs, "scanning the vocabulary"))


def bf16(lm: Any, model: str, plans: list[Any], repeats: int, choice: str) -> None:
    print(f"half-precision probe: bfloat16 matmuls at {half_matmul_speedup():.2f}x float32 here")
    run, why = bf16_sections(choice)
    if not run:
        print(f"  {why}")
        return
    half = contllm.load(model, device="cpu", dtype=torch.bfloat16)
    float32, bfloat = Engine(lm), Engine(half)
    out: dict[str, list[Any]] = {}

    def evaluate(name: str, engine: Engine) -> Callable[[], None]:
        return lambda: out.__setitem__(name, list(run_plans(plans, engine.probs)))

    mine, theirs = best_of(repeats, evaluate("float32", float32), evaluate("bfloat16", bfloat))
    print(ratio_line(f"float32 ({len(plans)} items)", mine, theirs, "bfloat16 with the float32 state and projections"))
    pairs = list(zip(out["bfloat16"], out["float32"]))
    dp = max(float(np.abs(a.probs - b.probs).max()) for a, b in pairs)
    dk = max(float(np.nanmax(np.abs(a.implied_value() - b.implied_value()))) for a, b in pairs)
    same = np.mean([np.mean(np.array(a.argmax_labels()) == np.array(b.argmax_labels())) for a, b in pairs])
    print(
        f"  bfloat16 against float32: max |dp| {dp:.2e}, max |dE[k]| {dk:.2e}, the same argmax at {same:.1%} of the factors"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--items", type=int, default=22, help="counting items (22: one group of the default run)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    add_bf16_flags(parser, "the bf16 section")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose among {', '.join(SECTIONS)}")
    print(describe())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "conversion" in sections:
        conversion(args.model, args.repeats)
    if set(sections) <= {"conversion"}:
        return 0
    lm = contllm.load(args.model, device="cpu")
    plans = counting_plans(lm, args.items)
    config = lm.model.config.get_text_config()
    print(
        f"dense float32 matmul rate {matmul_rate(4096, config.hidden_size, config.intermediate_size) / 1e9:.0f} GFLOP/s"
    )
    engine = Engine(lm)
    engine.probs([s for p in plans for s in p.signals])
    assert engine.last_stats is not None
    print(
        f"{args.items} counting items: {engine.last_stats.tokens_computed} tokens, "
        f"{engine_flops(lm, engine.last_stats) / 1e12:.2f} TFLOP"
    )
    for name, fn in (
        ("prefix", lambda: prefix(lm, plans, args.repeats)),
        ("item-prefix", lambda: item_prefix(lm, plans, args.repeats)),
        ("keep", lambda: keep(lm, plans, args.repeats)),
        ("budget", lambda: budget(lm, plans, args.repeats)),
        ("readout", lambda: readouts(lm, args.items, args.repeats)),
        ("bf16", lambda: bf16(lm, args.model, plans, args.repeats, args.bf16)),
    ):
        if name in sections:
            fn()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
