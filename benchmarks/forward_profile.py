"""Where one forward of the main job spends its time: matmuls, attention, norms, rotary, mask, read-out, Python.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/forward_profile.py [--model NAME] [--dtypes float32,bfloat16]
        [--items 66] [--repeats 3] [--bf16 auto|on|off] [--rates]

It runs ``contllm run counting`` on the first ``--items`` items (66: the first group of the
default model's main job, one engine call) and keeps that engine call: the signals, read
positions and token sets the run handed to :meth:`contllm.core.engine.Engine.probs`. Then, for
each dtype, on a model loaded in it:

  wall       the call's best wall time over ``--repeats`` plain repeats (after one warm-up);
  regions    the same call once more with every region timed (exclusive wall time: a region's
             time less the regions inside it), by wrapping, for the length of the call, the
             classes' ``forward`` and the functions that do the work (no hook is placed on a
             module, so the engine still shares the few-shot prefix):

               projections  q/k/v/o (and fused qkv) linears      MLP matmuls  gate/up/down (fc1/fc2) linears
               MLP other    the activation and product           attention    the attention function (sdpa,
               norms        RMSNorm / LayerNorm modules                        the shared-prefix one, eager)
               rotary       the rotary tables and their use       attention glue  reshapes, transposes in the
               mask         contllm's continuous-time mask                     attention module
               read-out     the vocabulary projection             embeddings   the token embeddings
               layer glue   residual adds in the decoder layers   model glue   the rest of the model's forward
               engine       the rest of the call: planning, inputs, the softmax over the read rows, Python;

  ops        one more call under torch.profiler: the summed self CPU time of every aten op,
             against the call's wall time under the profiler; the difference is the time spent
             outside any op (Python, dispatch, the framework's glue);
  rate       the matmuls' achieved rate (their FLOPs over their time) against the dense matmul
             rate of the same dtype at the model's hidden and MLP widths, measured here.

Half-precision dtypes run where the matmul probe says they pay, or with ``--bf16 on`` (on a CPU
without bfloat16 instructions a bfloat16 call of 66 items takes minutes). ``--rates`` prints only
the linear layers' rate per dtype at the model's widths, 16 to 512 rows.

The region timers add a few microseconds per region; their total is printed against the plain
wall time, so that what they add can be read off. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from sweep import add_bf16_flags, bf16_sections

import contllm
from contllm.core.engine import Engine
from contllm.hardware import describe
from contllm.models import DEFAULT_MODEL
from contllm.rundir.runner import run

#: Linear layers by attribute name (the Llama, Qwen, Gemma, Mistral and Phi names); others count as their parent's glue.
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"}
MLP_LINEARS = {"gate_proj", "up_proj", "down_proj", "gate_up_proj", "fc1", "fc2"}
REGIONS = (
    "projections",
    "MLP matmuls",
    "MLP other",
    "attention",
    "attention glue",
    "norms",
    "rotary",
    "mask",
    "read-out",
    "embeddings",
    "layer glue",
    "model glue",
    "engine",
)


class Timer:
    """Exclusive wall time per region: a region's time less the regions timed inside it."""

    def __init__(self) -> None:
        self.exclusive: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list[float]] = []  # [start, time of the regions inside]

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        self.stack.append([time.perf_counter(), 0.0])
        try:
            yield
        finally:
            start, inner = self.stack.pop()
            elapsed = time.perf_counter() - start
            self.exclusive[name] += elapsed - inner
            self.calls[name] += 1
            if self.stack:
                self.stack[-1][1] += elapsed


def timed(timer: Timer, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with timer.region(name):
            return function(*args, **kwargs)

    return wrapper


def region_of(qualified: str, module: torch.nn.Module, model: torch.nn.Module) -> str | None:
    """The region a module's forward belongs to, by its attribute name and class."""
    leaf = qualified.rsplit(".", 1)[-1]
    kind = type(module).__name__
    if module is model.get_output_embeddings():
        return "read-out"
    if module is model.get_input_embeddings():
        return "embeddings"
    if isinstance(module, torch.nn.Linear):
        if leaf in MLP_LINEARS:
            return "MLP matmuls"
        if leaf in PROJECTIONS:
            return "projections"
        return None
    if kind.endswith(("RMSNorm", "LayerNorm")) or isinstance(module, torch.nn.LayerNorm):
        return "norms"
    if kind.endswith("RotaryEmbedding"):
        return "rotary"
    if kind.endswith("MLP"):
        return "MLP other"
    if kind.endswith("Attention"):
        return "attention glue"
    if kind.endswith("DecoderLayer"):
        return "layer glue"
    return None


@contextlib.contextmanager
def regions(lm: Any, timer: Timer) -> Iterator[None]:
    """Every region of ``REGIONS`` timed for the length of the block (restored after)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import contllm.core.forward as forward_module

    model = lm.model
    undo: list[Callable[[], None]] = []

    def patch(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        setattr(owner, name, timed(timer, label, original))
        undo.append(lambda: setattr(owner, name, original))

    seen: set[tuple[type, str]] = set()
    for qualified, module in model.named_modules():
        label = region_of(qualified, module, model)
        if label is None:
            continue
        if label in {"read-out", "embeddings"} or isinstance(module, torch.nn.Linear):
            # Per instance: a Linear's region depends on where it sits.
            module.forward = timed(timer, label, module.forward)  # type: ignore[method-assign]
            undo.append(lambda m=module: m.__dict__.pop("forward", None))
        elif (type(module), label) not in seen:
            seen.add((type(module), label))
            patch(type(module), "forward", label)
    base = type(model.base_model) if hasattr(model, "base_model") else None
    if base is not None:
        patch(base, "forward", "model glue")
    for name in list(ALL_ATTENTION_FUNCTIONS):
        original = ALL_ATTENTION_FUNCTIONS[name]
        local = name in ALL_ATTENTION_FUNCTIONS._local_mapping
        ALL_ATTENTION_FUNCTIONS[name] = timed(timer, "attention", original)
        undo.append(
            (lambda n=name, o=original: ALL_ATTENTION_FUNCTIONS.__setitem__(n, o))
            if local
            else (lambda n=name: ALL_ATTENTION_FUNCTIONS._local_mapping.pop(n, None))
        )
    family_module = sys.modules.get(type(model).__module__)
    if family_module is not None and hasattr(family_module, "apply_rotary_pos_emb"):
        patch(family_module, "apply_rotary_pos_emb", "rotary")
    patch(forward_module, "model_masks", "mask")
    try:
        yield
    finally:
        for step in reversed(undo):
            step()


class Capture:
    """The first engine call of a run: the engine, its arguments."""

    def __init__(self) -> None:
        self.call: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def __enter__(self) -> Capture:
        original = self.original = Engine.probs

        def probs(engine: Engine, *args: Any, **kwargs: Any) -> Any:
            if self.call is None:
                self.call = (args, kwargs)
            return original(engine, *args, **kwargs)

        Engine.probs = probs  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Engine.probs = self.original  # type: ignore[method-assign]


def matmul_rate(rows: int, hidden: int, intermediate: int, dtype: torch.dtype, seconds: float = 0.3) -> float:
    """FLOP/s of a linear layer from ``hidden`` to ``intermediate`` on ``rows`` rows in ``dtype`` (the weight stored
    [intermediate, hidden], as ``nn.Linear`` keeps it: a half-precision product with the other layout can take another,
    far slower kernel): best of three rounds of at least ``seconds`` each (a slow dtype takes fewer products)."""
    a = torch.randn(rows, hidden).to(dtype)
    b = torch.randn(intermediate, hidden).to(dtype)
    torch.nn.functional.linear(a, b)
    best = float("inf")
    for _ in range(3):
        start, count = time.perf_counter(), 0
        while count == 0 or time.perf_counter() - start < seconds:
            torch.nn.functional.linear(a, b)
            count += 1
        best = min(best, (time.perf_counter() - start) / count)
    return 2 * rows * hidden * intermediate / best


#: Rows of the products that give the dense rate: the main job's 4096 in float32, fewer in half precision, whose
#: products can be slow enough on a CPU without its instructions that 4096 rows would take minutes.
RATE_ROWS = {torch.float32: 4096, torch.float64: 4096}
HALF_RATE_ROWS = 512


def matmul_flops(lm: Any, tokens: int, reads: int) -> float:
    """FLOPs of the call's linear layers: every projection and MLP matmul per token run (padding included), the head per read row."""
    total = 0.0
    for module in lm.model.modules():
        if isinstance(module, torch.nn.Linear):
            rows = reads if module is lm.model.get_output_embeddings() else tokens
            total += 2.0 * rows * module.in_features * module.out_features
    return total


def profile(model: str, dtype: str, call: tuple[tuple[Any, ...], dict[str, Any]], repeats: int) -> None:
    lm = contllm.load(model, dtype=dtype, device="cpu")
    config = lm.model.config.get_text_config()
    torch_dtype = getattr(torch, dtype)
    shape = (
        RATE_ROWS.get(torch_dtype, HALF_RATE_ROWS),
        int(config.hidden_size),
        int(config.intermediate_size),
        torch_dtype,
    )
    rate_before = matmul_rate(*shape)
    engine = Engine(lm)
    args, kwargs = call
    with torch.inference_mode():
        start = time.perf_counter()
        engine.probs(*args, **kwargs)  # warm-up
        print(f"  ({model}, {dtype}: warm-up call {time.perf_counter() - start:.1f} s)", flush=True)
        walls = []
        for _ in range(repeats):
            start = time.perf_counter()
            engine.probs(*args, **kwargs)
            walls.append(time.perf_counter() - start)
        stats = engine.last_stats
        timer = Timer()
        with regions(lm, timer):
            start = time.perf_counter()
            with timer.region("engine"):
                engine.probs(*args, **kwargs)
            timed_wall = time.perf_counter() - start
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            engine.probs(*args, **kwargs)
            profiled_wall = time.perf_counter() - start
    ops = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    wall = min(walls)
    tokens = stats.padded_tokens if stats is not None else 0
    reads = len(args[0])  # the main job reads one position per signal
    flops = matmul_flops(lm, tokens, reads)
    matmul_time = timer.exclusive["projections"] + timer.exclusive["MLP matmuls"] + timer.exclusive["read-out"]
    rate = max(rate_before, matmul_rate(*shape))  # before and after the calls: load arriving can only lower a ratio
    print(
        f"\n{model}, {dtype}: {len(args[0])} signals, {tokens} tokens run (padding included), "
        f"wall {wall:.3f} s (best of {repeats}: {', '.join(f'{w:.3f}' for w in walls)})"
    )
    print(f"  with every region timed {timed_wall:.3f} s ({timed_wall / wall:.3f}x the plain wall)")
    print(f"  {'region':<16}{'seconds':>9}{'share':>8}{'calls':>8}")
    for name in REGIONS:
        seconds = timer.exclusive.get(name, 0.0)
        print(f"  {name:<16}{seconds:9.3f}{seconds / timed_wall:8.1%}{timer.calls.get(name, 0):8d}")
    print(
        f"  matmuls (projections, MLP, read-out): {flops / 1e12:.3f} TFLOP in {matmul_time:.3f} s, "
        f"{flops / matmul_time / 1e9:.0f} GFLOP/s against a dense {dtype} rate of {rate / 1e9:.0f} GFLOP/s "
        f"at {shape[0]} x {shape[1]} x {shape[2]} "
        f"({flops / matmul_time / rate:.2f})"
    )
    print(
        f"  under torch.profiler: wall {profiled_wall:.3f} s, aten ops' self CPU time {ops:.3f} s; "
        f"outside any op {profiled_wall - ops:.3f} s ({(profiled_wall - ops) / profiled_wall:.1%})"
    )
    del engine, lm


def rates(model: str, half: bool) -> int:
    """The dense rate of each dtype at the model's widths, for 16 to 512 rows: where half precision's time goes
    (float32 alone unless ``half``)."""
    from transformers import AutoConfig

    from contllm.models import ensure_cached, resolve

    source = resolve(model)
    location = ensure_cached(source.name) if source.kind == "alias" else (source.path or source.name)
    config = AutoConfig.from_pretrained(location, local_files_only=source.kind != "hub").get_text_config()
    hidden, intermediate = int(config.hidden_size), int(config.intermediate_size)
    print(f"oneDNN bfloat16 kernels available: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    for rows in (16, 128, 512):
        for k, n in ((hidden, intermediate), (intermediate, hidden), (hidden, hidden)):
            base = matmul_rate(rows, k, n, torch.float32)
            others = {d: matmul_rate(rows, k, n, getattr(torch, d)) for d in ("bfloat16", "float16") if half}
            print(
                f"  {rows} x {k} x {n}: float32 {base / 1e9:.0f} GFLOP/s"
                + "".join(f", {d} {r / 1e9:.1f} ({r / base:.3f}x)" for d, r in others.items())
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtypes", default="float32", help="comma-separated dtypes to profile (float32, bfloat16)")
    parser.add_argument("--items", type=int, default=66, help="counting items of the profiled call (default 66)")
    parser.add_argument("--repeats", type=int, default=3)
    add_bf16_flags(parser, "the half-precision profiles and rates")
    parser.add_argument(
        "--rates",
        action="store_true",
        help="only the products' rates: float32, bfloat16 and float16 at the model's widths and 16-512 rows",
    )
    args = parser.parse_args(argv)
    print(describe())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; threads {torch.get_num_threads()}")
    half, line = bf16_sections(args.bf16)
    print(line)
    if args.rates:
        return rates(args.model, half)
    dtypes = [d for d in args.dtypes.split(",") if half or d not in ("bfloat16", "float16")]
    with tempfile.TemporaryDirectory() as root, Capture() as capture:
        run(
            "counting",
            out=Path(root) / "run",
            device="cpu",
            progress=False,
            say=lambda line: None,
            model=args.model,
            items=str(args.items),
        )
    if capture.call is None:
        raise SystemExit("the run made no engine call")
    for dtype in dtypes:
        profile(args.model, dtype, capture.call, args.repeats)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
