"""Run benchmark: the default counting, events and boolean runs, batched across items against item by item.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/runs.py [--runs counting,events,boolean] [--repeats 1]

For each run (every item of its dataset, the experiment's default options, the model from
the cache) it times, side by side in one process:

  per item   one engine call per item (the item's sweep alone: its own prefix computed
             once, its signals in one batch) - the way runs went before items were
             batched, reconstructed with CONTLLM_GROUP_BYTES=1 (every group one item);
  batched    the run's own path: the items of a group in one engine call, the prefix
             every signal shares computed once per group, rows of one length batched;
  bf16       the batched path on a bfloat16 copy of the model (bf16 matmuls around a
             float32 state, the engine's default for a half-precision model), and the
             same model run wholly in bf16 (``Engine(lm, float32_state=False)``), whose
             distance from float32 is the yardstick for the engine's. Only where a matmul
             probe finds bf16 matmuls at least 1.5x float32 on this CPU (``--bf16 auto``,
             the default; ``--bf16 on`` forces them, ``--bf16 off``/``--no-bf16`` skips
             them); a line at the top of the output says which and why.

Each line gives the time of the item loop (every record computed, nothing written),
the ratio as ``N.NNx``, the tokens each path computed (prefixes once, rows after them,
padding excluded; the FLOP floor of the ratio is their quotient), the FLOP efficiency of
the batched path (useful FLOPs / time / dense float32 matmul rate, as in sweep.py),
agreement (max |dp| over every label probability of every record) and whether the
summary numbers are the same to 1e-4. With ``--end-to-end`` it also times the whole run
through :func:`contllm.rundir.runner.run` (run directory, records, results, summary and every
figure), per item against batched. Peak memory is the process's peak resident set
size during the batched float32 loop, model included.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sweep import _peak_rss_mb, _reset_peak_rss, add_bf16_flags, bf16_sections, engine_flops, matmul_rate

import contllm
from contllm.core.engine import Engine, EngineStats
from contllm.experiments import run_experiment, summarize
from contllm.hardware import describe
from contllm.registry import get as get_experiment

RUNS = ("counting", "events", "boolean")


@dataclass
class Loop:
    """One timed item loop: its result, seconds and what the engine computed."""

    result: Any
    seconds: float
    stats: list[EngineStats] = field(default_factory=list)
    peak_mb: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(s.tokens_computed for s in self.stats)

    @property
    def chunks(self) -> int:
        return sum(len(s.chunks) for s in self.stats)


@contextlib.contextmanager
def groups_of_one(enabled: bool) -> Iterator[None]:
    """Every group one item (the per-item path) while the context lasts."""
    saved = os.environ.get("CONTLLM_GROUP_BYTES")
    if enabled:
        os.environ["CONTLLM_GROUP_BYTES"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CONTLLM_GROUP_BYTES", None)
        else:
            os.environ["CONTLLM_GROUP_BYTES"] = saved


def item_loop(lm: Any, name: str, *, per_item: bool = False, float32_state: bool = True) -> Loop:
    """Every record of run ``name`` with its defaults, timed; the engine's stats kept per call."""
    engine = Engine(lm, float32_state=float32_state)
    stats: list[EngineStats] = []

    def evaluate(signals: list[Any]) -> torch.Tensor:
        out = engine.probs(signals)
        assert engine.last_stats is not None
        stats.append(engine.last_stats)
        return out

    _reset_peak_rss()
    with groups_of_one(per_item):
        start = time.perf_counter()
        result = run_experiment(lm, name, evaluate=evaluate)
        seconds = time.perf_counter() - start
    return Loop(result, seconds, stats, _peak_rss_mb())


def end_to_end(lm: Any, name: str, *, per_item: bool) -> float:
    """Seconds of the whole run through the runner (directory, records, outputs, figures)."""
    from contllm.rundir.runner import run

    with tempfile.TemporaryDirectory() as root, groups_of_one(per_item):
        start = time.perf_counter()
        run(name, lm=lm, out=os.path.join(root, "run"), progress=False)
        return time.perf_counter() - start


def label_probs(result: Any) -> np.ndarray:
    return np.concatenate([np.asarray(s.probs).ravel() for s in result.sweeps])


def max_dp(a: Any, b: Any) -> float:
    return float(np.abs(label_probs(a) - label_probs(b)).max())


def same_summary(a: Any, b: Any, tol: float = 1e-4) -> str:
    sa, sb = summarize(a), summarize(b)
    worst = max((abs(sa[k] - sb[k]) for k in sa if isinstance(sa[k], float) and isinstance(sb.get(k), float)), default=0.0)
    return f"summary {'same' if worst <= tol else 'DIFFERS'} (max diff {worst:.1e})"


def flop_efficiency(lm: Any, loop: Loop, rate: float) -> float:
    return sum(engine_flops(lm, s) for s in loop.stats) / loop.seconds / rate


def best(loops: Sequence[Loop]) -> Loop:
    return min(loops, key=lambda loop: loop.seconds)


def interleaved(runs: dict[str, Callable[[], Loop]], repeats: int) -> dict[str, Loop]:
    """Each run ``repeats`` times, interleaved (a change in load hits all alike); the best of each."""
    out: dict[str, list[Loop]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            out[name].append(fn())
    return {name: best(loops) for name, loops in out.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated: counting, events, boolean")
    parser.add_argument("--repeats", type=int, default=1)
    add_bf16_flags(parser, "the bf16 sections (the bf16 engine and stock bf16 item loops)")
    parser.add_argument("--end-to-end", action="store_true", help="also time whole runs through the runner")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    for name in names:
        if name not in RUNS:
            parser.error(f"unknown run {name!r}; choose from {', '.join(RUNS)}")

    print(describe())
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    with_bf16, decision = bf16_sections(args.bf16)
    print(decision, flush=True)
    fp32 = contllm.load(args.model, dtype=torch.float32, device="cpu")
    bf16 = contllm.load(args.model, dtype=torch.bfloat16, device="cpu") if with_bf16 else None
    config = fp32.model.config.get_text_config()
    rate = matmul_rate(4096, int(config.hidden_size), int(config.intermediate_size))
    print(f"model {args.model}; dense float32 matmul rate {rate / 1e9:.0f} GFLOP/s")
    print()
    for name in names:
        items = len(get_experiment(name).items(get_experiment(name).config()))
        # Each run binds this experiment's name now (the loop's variable moves on).
        runs: dict[str, Callable[[], Loop]] = {
            "per item": lambda name=name: item_loop(fp32, name, per_item=True),
            "batched": lambda name=name: item_loop(fp32, name),
        }
        if bf16 is not None:
            runs["bf16"] = lambda name=name, bf16=bf16: item_loop(bf16, name)
            runs["bf16 stock"] = lambda name=name, bf16=bf16: item_loop(bf16, name, float32_state=False)
        got = interleaved(runs, args.repeats)
        one, batched = got["per item"], got["batched"]
        print(
            f"{name:<9} {items} items, float32: per item {one.seconds:.1f} s, batched {batched.seconds:.1f} s: "
            f"{one.seconds / batched.seconds:.2f}x; tokens {one.tokens} -> {batched.tokens} "
            f"(FLOP floor {one.tokens / batched.tokens:.2f}x); forwards {one.chunks} -> {batched.chunks}; "
            f"FLOP efficiency {flop_efficiency(fp32, one, rate):.2f} -> {flop_efficiency(fp32, batched, rate):.2f}; "
            f"max|dp| {max_dp(one.result, batched.result):.1e}; {same_summary(one.result, batched.result)}; "
            f"peak RSS {batched.peak_mb / 1024:.2f} GB"
        )
        if bf16 is not None:
            half, stock = got["bf16"], got["bf16 stock"]
            engine_gap, stock_gap = max_dp(half.result, batched.result), max_dp(stock.result, batched.result)
            print(
                f"{name:<9} bf16 engine {half.seconds:.1f} s against float32 {batched.seconds:.1f} s: "
                f"{batched.seconds / half.seconds:.2f}x; max|dp| from float32: engine {engine_gap:.1e}, "
                f"stock bf16 {stock_gap:.1e} ({stock.seconds:.1f} s): {engine_gap / stock_gap:.2f}x the stock distance"
            )
        if args.end_to_end:
            slow = end_to_end(fp32, name, per_item=True)
            fast = end_to_end(fp32, name, per_item=False)
            print(f"{name:<9} end to end (run directory and figures): per item {slow:.1f} s, batched {fast:.1f} s: {slow / fast:.2f}x")
        print(flush=True)


if __name__ == "__main__":
    main()
