"""Sweep benchmark: the per-sample loop against :class:`contllm.core.engine.Engine`, in one run.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/sweep.py --model smollm2-135m --samples 100 --repeats 3

Workloads, on one model and one set of prompts:
  counting  a few-shot counting prompt (~30 tokens); the four "apple" occurrences of its
            last line scaled by c in [0.1, 1.0] (``--samples`` factors).
  events    a passage of >= 120 tokens; every event sentence (the first starts >= 30
            tokens in) scaled by c in [0.1, 1.0].
  events-last  the same passage with only its last event scaled: a long shared prefix.
  bf16      the engine on a bfloat16 copy of the model (bf16 matmuls around a float32
            state, the engine's default for a half-precision model) against the float32
            engine on every selected sweep. ``--bf16 auto`` (the default) runs it only where
            a matmul probe finds bf16 matmuls at least 1.5x float32 on this CPU (where they
            are emulated they are ~60x slower, and this section alone would take hours),
            and a line at the top of the output says which and why; ``--bf16 on`` forces it,
            ``--bf16 off`` (``--no-bf16``) skips it. ``--dtype bfloat16`` obeys the same
            decision.

For each sweep it times (a) the per-sample loop the research code runs - one full
forward per sample, logits at every position, a mask built per sample - and (b) the
engine (batched, chunked, shared prefix computed once, last-position logits),
and prints samples/s, the ratio, agreement (max abs difference of the next-token
probabilities at the last token), peak memory and FLOP efficiency.

FLOP efficiency = useful FLOPs of the engine / engine time / dense matmul rate.
  useful FLOPs: 2 x (weights of every Linear in the decoder layers) per real token the
    engine computed (each computed prefix once plus every signal's tokens after it;
    padding is not counted), + 2 x vocab x hidden per read position (one per signal),
    + attention 4 x heads x head_dim per (query, visible key) pair in every layer, a
    query at index i of its signal seeing i + 1 keys.
  dense matmul rate: float32 ``torch.mm`` [T, hidden] x [hidden, intermediate], the
    better of T = the engine's largest chunk in tokens and T = 4096, timed in this run
    with the same thread count between the loop and engine runs (best over repeats).
Peak memory is the process's peak resident set size, model weights included (VmHWM,
reset per phase through /proc/self/clear_refs after returning freed heap with
malloc_trim, where the kernel allows it; otherwise getrusage's lifetime peak). Timings
are the best of ``--repeats`` runs (the median is printed next to it), the runs of one
comparison interleaved; ratios and FLOP efficiency use the best times.

On a machine shared with other busy processes, OpenMP's spinning workers make every
small parallel op wait for a descheduled thread (a 400k-element multiply goes from
0.2 ms to 8 ms); run with ``OMP_WAIT_POLICY=PASSIVE`` there. The script prints the
load average and the setting next to its figures.

Its first line is the CPU's capabilities (``contllm.hardware.cpu_capability``: torch's
kernel instruction set, AMX, avx512_bf16, cores, threads). bf16 figures depend on them:
bf16 matmuls run on AMX tiles, on avx512_bf16 dot products or converted to float32, each
with its own speed and rounding, so the bf16 section's "error ratio" (bf16 engine error /
error of the model wholly in bf16) is 0.35x on AVX-512 + AMX and 0.59x on AVX-512 +
avx512_bf16 without AMX on the counting sweep. Compare figures only between runs whose
capability lines agree.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from contllm import ContinuousLM, Signal, pad_signals
from contllm.core import precision
from contllm.core.engine import Engine, EngineStats
from contllm.hardware import HALF_WORTH_IT, cpu_capability, cpu_name, describe, half_precision_pays

COUNTING_PROMPT = '"cat cat" contains 2 words.\n"dog dog dog" contains 3 words.\n"apple apple apple apple" contains '

EVENTS_INTRO = (
    "On a grey Saturday morning in early spring, long before the neighbours were awake, "
    "Mara decided, over a cup of tea, that the day would be spent putting her small flat back in order, "
    "one small task after another. "
)
EVENTS = (
    "She opened every window in the kitchen.",
    "She watered the tall plants on the sill.",
    "She fed the old cat its breakfast.",
    "She swept the dusty floor of the hallway.",
    "She folded the laundry from the night before.",
    "She wrote a letter to her brother in Lisbon.",
    "She carried the empty bottles down to the street.",
)
EVENTS_QUESTION = " Question: How many actions did Mara take?\nAnswer: Mara took"


@dataclass
class Workload:
    name: str
    signals: list[Signal]
    edit_start: int  # index of the first edited token


@dataclass
class Timing:
    seconds: float  # the best of the repeats
    median: float
    peak_rss_mb: float


# ---------------------------------------------------------------------- bf16 or not
BF16_CHOICES = ("auto", "on", "off")


def bf16_sections(choice: str) -> tuple[bool, str]:
    """Whether a benchmark's bf16 sections run, and the line of output that says so and why.

    choice: "on" (always, not probed), "off" (never) or "auto": run them where bfloat16
    matmuls are at least ``contllm.hardware.HALF_WORTH_IT`` times as fast as float32 on this
    CPU, as ``contllm.hardware.half_matmul_speedup`` measures (a 50 ms matmul probe where
    bf16 is native; a few seconds where it is emulated, as on AVX2 without avx512_bf16, whose
    bf16 matmuls ran at 1 GFLOP/s against 69 in float32 and kept ``runs.py`` from finishing
    in 25 minutes).
    """
    if choice not in BF16_CHOICES:
        raise ValueError(f"choice must be one of {', '.join(BF16_CHOICES)}, got {choice!r}")
    if choice == "on":
        return True, "bf16 sections run: --bf16 on (not probed)"
    if choice == "off":
        return False, "bf16 sections skipped: --bf16 off"
    pays, speedup = half_precision_pays(torch.bfloat16)
    pace = f"{1 / speedup:.1f}x slower than" if speedup < 1 else f"{speedup:.2f}x as fast as"
    measured = f"bfloat16 matmul {pace} float32 on this CPU (probe)"
    if pays:
        return True, f"bf16 sections run: {measured}"
    return False, f"bf16 sections skipped: {measured}, below the {HALF_WORTH_IT}x they need; --bf16 on forces them"


def add_bf16_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--bf16 auto|on|off`` (default auto) and ``--no-bf16``, for ``what`` (the benchmark's bf16 sections)."""
    parser.add_argument(
        "--bf16",
        choices=BF16_CHOICES,
        default="auto",
        help=f"{what}: auto runs them where bf16 matmuls are at least {HALF_WORTH_IT}x float32 on this CPU "
        "(a matmul probe), on forces them, off skips them",
    )
    parser.add_argument("--no-bf16", dest="bf16", action="store_const", const="off", help="the same as --bf16 off")


# ---------------------------------------------------------------------- loading
def load_lm(name: str, dtype: torch.dtype) -> ContinuousLM:
    """The model through ``contllm.load`` (embedded alias, local directory or hub id)."""
    import contllm

    return contllm.load(name, dtype=dtype, device="cpu")


# ---------------------------------------------------------------------- workloads
def counting_workload(lm: ContinuousLM, factors: Sequence[float]) -> Workload:
    base = lm.signal(COUNTING_PROMPT)
    last_line = COUNTING_PROMPT.rindex('"apple')
    spans = [s for s in base.find("apple") if s[0] >= last_line]
    start = min(base.token_indices(spans))
    return Workload("counting", [base.scale(spans, c) for c in factors], start)


def events_workload(lm: ContinuousLM, factors: Sequence[float], *, last_only: bool = False) -> Workload:
    """Every event scaled by c ("events"), or the last event alone ("events-last")."""
    text = EVENTS_INTRO + " ".join(EVENTS) + EVENTS_QUESTION
    base = lm.signal(text)
    spans = []
    for event in EVENTS[-1:] if last_only else EVENTS:
        at = text.index(event)
        spans.append((at, at + len(event)))
    start = min(base.token_indices(spans))
    return Workload("events-last" if last_only else "events", [base.scale(spans, c) for c in factors], start)


WORKLOADS: dict[str, Callable[[ContinuousLM, Sequence[float]], Workload]] = {
    "counting": counting_workload,
    "events": events_workload,
    "events-last": lambda lm, factors: events_workload(lm, factors, last_only=True),
}


# ---------------------------------------------------------------------- measuring
def _reset_peak_rss() -> bool:
    """Return freed heap to the system, then restart the peak RSS count from the current RSS."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[Any, Timing]]:
    """Time each of ``runs`` ``repeats`` times, interleaved so that a change in the load of a
    shared machine hits all of them alike; per run its last result, best and median time and
    peak RSS. Other processes only ever add time, so the best of the repeats is the figure
    least disturbed by them; the median shows how much they added.
    """
    times: dict[str, list[float]] = {name: [] for name in runs}
    peaks: dict[str, float] = {name: 0.0 for name in runs}
    results: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            _reset_peak_rss()
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
            peaks[name] = max(peaks[name], _peak_rss_mb())
    return {
        name: (results[name], Timing(min(times[name]), statistics.median(times[name]), peaks[name])) for name in runs
    }


def per_sample_loop(lm: ContinuousLM, signals: Sequence[Signal]) -> torch.Tensor:
    """The research code's loop: one full forward per sample, logits at every position."""
    out = []
    with lm.patched():
        for s in signals:
            logits, _ = lm.forward_batch(pad_signals([s]), logits_to_keep=0)
            out.append(torch.softmax(logits[0, -1].float(), dim=-1))
    return torch.stack(out)


def matmul_rate(tokens: int, hidden: int, intermediate: int, repeats: int = 5) -> float:
    """FLOP/s of a float32 [tokens, hidden] x [hidden, intermediate] ``torch.mm``, best of ``repeats``."""
    a = torch.randn(tokens, hidden)
    b = torch.randn(hidden, intermediate)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - start) / 10)
    return 2 * tokens * hidden * intermediate / best


def linear_weights(model: torch.nn.Module) -> int:
    """Weights of every Linear (or GPT-2 Conv1D) in the decoder, the output projection excluded."""
    output = model.get_output_embeddings()
    total = 0
    for module in model.modules():
        if module is output:
            continue
        weight = getattr(module, "weight", None)
        if weight is not None and weight.ndim == 2 and not isinstance(module, torch.nn.Embedding):
            total += weight.numel()
    return total


def engine_flops(lm: ContinuousLM, stats: EngineStats) -> float:
    config = lm.model.config.get_text_config()
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    layers = int(config.num_hidden_layers)
    weights = linear_weights(lm.model)
    vocab_proj = int(config.vocab_size) * int(config.hidden_size)
    flops = 0.0
    for chunk in stats.chunks:
        p = chunk.prefix_len
        if chunk.prefix_computed:
            flops += 2 * weights * p + 4 * heads * head_dim * layers * (p * (p + 1) / 2)
        for rest in chunk.lengths:
            n = p + rest
            visible_keys = n * (n + 1) / 2 - p * (p + 1) / 2  # queries at indices p..n-1 see i + 1 keys
            flops += 2 * weights * rest + 4 * heads * head_dim * layers * visible_keys + 2 * vocab_proj
    return flops


def loop_flops(lm: ContinuousLM, signals: Sequence[Signal]) -> float:
    """FLOPs of the per-sample loop by the same count: every token, logits at every position."""
    config = lm.model.config.get_text_config()
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    per_token = 2 * linear_weights(lm.model) + 2 * int(config.vocab_size) * int(config.hidden_size)
    attention = 4 * heads * head_dim * int(config.num_hidden_layers)
    return sum(per_token * len(s) + attention * len(s) * (len(s) + 1) / 2 for s in signals)


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# ---------------------------------------------------------------------- report
def compare(lm: ContinuousLM, work: Workload, repeats: int) -> dict[str, Any]:
    """Per-sample loop, engine and dense matmul, timed interleaved on ``work``."""
    engine = Engine(lm)
    engine.logits(work.signals[:2])  # warm-up: first-call allocations and kernel choices
    engine.probs(work.signals)
    stats = engine.last_stats
    assert stats is not None
    config = lm.model.config.get_text_config()
    biggest = max(c.prefix_len * c.prefix_computed + sum(c.lengths) for c in stats.chunks)
    rates: list[float] = []

    def dense() -> None:
        rates.append(
            max(
                matmul_rate(max(biggest, 256), config.hidden_size, config.intermediate_size),
                matmul_rate(4096, config.hidden_size, config.intermediate_size),
            )
        )

    runs = measure(
        {
            "loop": lambda: per_sample_loop(lm, work.signals),
            "engine": lambda: engine.probs(work.signals),
            "dense": dense,
        },
        repeats,
    )
    (loop_probs, loop_t), (engine_probs, engine_t) = runs["loop"], runs["engine"]
    rate = max(rates)
    flops = engine_flops(lm, stats)
    return {
        "name": work.name,
        "n": len(work.signals),
        "tokens": len(work.signals[0]),
        "edit_start": work.edit_start,
        "stats": stats,
        "loop": loop_t,
        "engine": engine_t,
        "ratio": loop_t.seconds / engine_t.seconds,
        "agreement": agreement(loop_probs, engine_probs),
        "efficiency": flops / engine_t.seconds / rate,
        "flop_ratio": loop_flops(lm, work.signals) / flops,
        "loop_gflops": loop_flops(lm, work.signals) / loop_t.seconds / 1e9,
        "engine_gflops": flops / engine_t.seconds / 1e9,
        "rate_gflops": rate / 1e9,
    }


def compare_dtypes(fp32: ContinuousLM, bf16: ContinuousLM, works: Sequence[Workload], repeats: int) -> list[str]:
    """The engine in bfloat16 against the engine in float32 on the same signals, timed interleaved.

    "bf16" is the engine's default for a bfloat16 model: bf16 matmuls around a float32
    state (``contllm.core.precision.float32_state``). For scale, the same engine with the model
    wholly in bf16 (``float32_state=False``) and the bf16 model run the plain way
    (``lm.probs``, one signal at a time, logits in bf16) are given too, and the engine's
    error ratio and time without its float32 query/key projections
    (``contllm.core.precision.FLOAT32_PROJECTIONS`` off: every matmul in bf16).
    """
    lines = []
    engines = {"fp32": Engine(fp32), "bf16": Engine(bf16), "bf16 whole": Engine(bf16, float32_state=False)}
    for work in works:
        for engine in engines.values():
            engine.logits(work.signals[:2])
        runs = measure(
            {
                **{name: (lambda e=e, s=work.signals: e.probs(s)) for name, e in engines.items()},
                "bf16 q/k": lambda s=work.signals: bf16_projections(engines["bf16"], s),
            },
            repeats,
        )
        (p32, t32), (p16, t16), (pw, tw) = runs["fp32"], runs["bf16"], runs["bf16 whole"]
        pq, tq = runs["bf16 q/k"]
        plain = bf16.probs(work.signals, batch_size=1)
        n = len(work.signals)
        lines += [
            f"  {work.name}:",
            f"    fp32 engine          : {n / t32.seconds:6.1f} samples/s (best {t32.seconds:.2f} s, median {t32.median:.2f} s), "
            f"peak RSS {t32.peak_rss_mb:.0f} MB",
            f"    bf16 engine          : {n / t16.seconds:6.1f} samples/s (best {t16.seconds:.2f} s, median {t16.median:.2f} s), "
            f"peak RSS {t16.peak_rss_mb:.0f} MB",
            f"      bf16 speed-up {t32.seconds / t16.seconds:.2f}x, agreement (max |dp|) {agreement(p16, p32):.2e}",
            f"    bf16 whole (scale)   : speed-up {t32.seconds / tw.seconds:.2f}x, agreement {agreement(pw, p32):.2e}; "
            f"bf16 model run plainly: agreement {agreement(plain, p32):.2e}",  # type: ignore[arg-type]
            f"      error ratio bf16 engine / bf16 whole {agreement(p16, p32) / max(agreement(pw, p32), 1e-30):.2f}"
            " (this CPU's; see the capability line)",
            f"      without float32 q/k projections: error ratio {agreement(pq, p32) / max(agreement(pw, p32), 1e-30):.2f}, "
            f"time {tq.seconds / t16.seconds:.2f}x the engine's",
        ]
    return lines


def bf16_projections(engine: Engine, signals: Sequence[Signal]) -> torch.Tensor:
    """The bf16 engine's probabilities with its query/key projections in bf16 too (every matmul in bf16)."""
    saved, precision.FLOAT32_PROJECTIONS = precision.FLOAT32_PROJECTIONS, False
    try:
        return engine.probs(signals)
    finally:
        precision.FLOAT32_PROJECTIONS = saved


def print_comparison(r: dict[str, Any]) -> None:
    stats: EngineStats = r["stats"]
    n = r["n"]
    print(f"\n[{r['name']}] {n} samples x {r['tokens']} tokens, first edited token at {r['edit_start']}")
    print(
        f"  engine chunks: {len(stats.chunks)}, rows {[c.rows for c in stats.chunks]}, prefix {list(stats.prefix_lens)}"
    )
    for label, key in (("per-sample loop", "loop"), ("engine", "engine")):
        t: Timing = r[key]
        print(
            f"  {label:16s}: {n / t.seconds:8.1f} samples/s  "
            f"(best {t.seconds:.2f} s, median {t.median:.2f} s, peak RSS {t.peak_rss_mb:.0f} MB)"
        )
    print(f"  speed-up        : {r['ratio']:.2f}x   agreement (max |dp|): {r['agreement']:.2e}")
    print(
        f"  (speed-up = FLOP ratio {r['flop_ratio']:.2f} x rate ratio {r['ratio'] / r['flop_ratio']:.2f}; "
        f"the loop runs at {r['loop_gflops']:.1f} GFLOP/s)"
    )
    print(
        f"  FLOP efficiency : {100 * r['efficiency']:.0f}%  "
        f"({r['engine_gflops']:.1f} useful GFLOP/s over dense fp32 mm {r['rate_gflops']:.1f} GFLOP/s)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="alias, local directory or hub id")
    parser.add_argument("--samples", type=int, default=100, help="factors per sweep")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of the loop-vs-engine comparison"
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per measurement (best and median)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--workloads", default="counting,events,events-last", help=f"comma-separated, from {', '.join(WORKLOADS)}"
    )
    add_bf16_flags(parser, "the bf16 sections (the bf16-vs-fp32 engine comparison, and --dtype bfloat16)")
    args = parser.parse_args(argv)
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    factors = torch.linspace(0.1, 1.0, args.samples).tolist()

    print(describe(cpu_capability()))
    with_bf16, decision = bf16_sections(args.bf16)
    print(decision, flush=True)
    if dtype == torch.bfloat16 and not with_bf16:
        parser.error(f"--dtype bfloat16 is a bf16 section: {decision}")
    cpu = cpu_name()
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    )
    if os.getloadavg()[0] >= (os.cpu_count() or 1) and "OMP_WAIT_POLICY" not in os.environ:
        print("note: the machine is busy with other processes; OMP_WAIT_POLICY=PASSIVE gives steadier figures")
    start = time.perf_counter()
    lm = load_lm(args.model, dtype)
    print(
        f"model: {lm!r} loaded in {time.perf_counter() - start:.1f} s; {linear_weights(lm.model) / 1e6:.1f}M decoder weights"
    )

    workloads = [WORKLOADS[name](lm, factors) for name in args.workloads.split(",")]
    for work in workloads:
        print_comparison(compare(lm, work, args.repeats))

    if with_bf16:
        other = load_lm(args.model, torch.bfloat16 if dtype == torch.float32 else torch.float32)
        fp32, bf16 = (lm, other) if dtype == torch.float32 else (other, lm)
        print("\n[bf16 vs fp32 engine]")
        for line in compare_dtypes(fp32, bf16, workloads, args.repeats):
            print(line)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
