"""What the CPU offers torch: recorded beside every run and benchmark figure.

Half-precision results depend on the CPU: bfloat16 matmuls run on AMX tiles, on
AVX-512 ``avx512_bf16`` dot products or converted to float32, and each sums in its own
order, so the same bfloat16 model gives different roundings (and speeds) on different
machines. A figure measured on one CPU is only comparable with figures taken on a CPU
with the same capabilities; :func:`cpu_capability` says which. The module imports torch
only where a function needs it: :func:`cpu_name` is read without it (a startup benchmark).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo() -> tuple[str | None, frozenset[str] | None]:
    """The model name and the feature flags of the first CPU in /proc/cpuinfo (None where absent)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return None, None
    name: str | None = None
    flags: frozenset[str] | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if name is None and key == "model name":
            name = value.strip()
        elif flags is None and key in ("flags", "Features"):
            flags = frozenset(value.split())
        if name is not None and flags is not None:
            break
    return name, flags


def cpu_name() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) ..."), from /proc/cpuinfo where it exists, else the platform's word."""
    name, _ = _cpuinfo()
    return name or platform.processor() or platform.machine()


def _torch_says(probe: str) -> bool:
    """A feature as torch's cpuinfo sees it (``torch.cpu._is_*_supported``), False if torch lacks the probe."""
    import torch

    fn = getattr(torch.cpu, probe, None)
    try:
        return bool(fn()) if callable(fn) else False
    except Exception:  # a private probe: never let it break a run
        return False


def cpu_capability() -> dict[str, Any]:
    """The CPU's half-precision capabilities and the threads torch uses, as JSON-ready values.

    ``capability`` is the vector instruction set torch dispatches its kernels to
    (``torch.backends.cpu.get_cpu_capability()``: "AVX512", "AVX2", "DEFAULT", ...);
    ``amx`` whether the CPU has AMX tiles (bfloat16 matmuls on them); ``avx512_bf16``
    whether it has AVX-512 bfloat16 dot products; ``cores`` ``os.cpu_count()``;
    ``threads`` ``torch.get_num_threads()``. The flags come from /proc/cpuinfo where it
    exists (``flags_source``), otherwise from torch's own CPU probe.
    """
    import torch

    _, flags = _cpuinfo()
    if flags is not None:
        source = str(CPUINFO)
        amx = any(f.startswith("amx") for f in flags)
        avx512_bf16 = "avx512_bf16" in flags
    else:
        source = "torch.cpu"
        amx = _torch_says("_is_amx_tile_supported")
        avx512_bf16 = _torch_says("_is_avx512_bf16_supported")
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "amx": amx,
        "avx512_bf16": avx512_bf16,
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "name": cpu_name(),
        "flags_source": source,
    }


def describe(cap: dict[str, Any] | None = None) -> str:
    """One line for a log or a benchmark header, e.g. ``cpu: AMD EPYC, AVX512, avx512_bf16, no AMX, 2 cores, 2 torch threads``."""
    cap = cpu_capability() if cap is None else cap
    return (
        f"cpu: {cap['name']}, {cap['capability']}, {'avx512_bf16' if cap['avx512_bf16'] else 'no avx512_bf16'}, "
        f"{'AMX' if cap['amx'] else 'no AMX'}, {cap['cores']} cores, {cap['threads']} torch threads"
    )


def describe_device(device: Any) -> str:
    """One line for the device a model runs on: :func:`describe` for the CPU, the GPU's name otherwise.

    device: a torch device or its name ("cpu", "cuda:0", "mps"), e.g. ``gpu: NVIDIA H200 (cuda:0)``.
    """
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return describe()
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"gpu: {torch.cuda.get_device_name(index)} (cuda:{index})"
    return f"{device.type}: {platform.machine()}"


#: The matmul :func:`half_matmul_speedup` times: [rows, width] x [width, 3 x width], the
#: shape of a small model's MLP over one chunk of a sweep.
PROBE_ROWS = 512
PROBE_WIDTH = 576

#: Below this many times the float32 speed of its matmuls, a half-precision run on a CPU
#: is no faster than float32: the engine keeps the state between the matmuls in float32
#: (measured: with matmuls 4x faster, a SmolLM2 sweep ran 1.8x faster in bfloat16).
HALF_WORTH_IT = 1.5


def half_matmul_speedup(dtype: torch.dtype | None = None, *, repeats: int = 3) -> float:
    """How many times faster a matmul runs in ``dtype`` than in float32 on this CPU (about 50 ms to measure).

    The best of ``repeats`` timings of the :data:`PROBE_ROWS` x :data:`PROBE_WIDTH` matmul in
    each dtype (None: bfloat16), with torch's current threads. Above 1, ``dtype`` is faster.
    """
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    times = {}
    with torch.inference_mode():
        for kind in (torch.float32, dtype):
            a = torch.randn(PROBE_ROWS, PROBE_WIDTH).to(kind)
            w = torch.randn(3 * PROBE_WIDTH, PROBE_WIDTH).to(kind)
            torch.nn.functional.linear(a, w)
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                torch.nn.functional.linear(a, w)
                best = min(best, time.perf_counter() - start)
            times[kind] = best
    return times[torch.float32] / times[dtype]


def half_precision_pays(dtype: torch.dtype | None = None) -> tuple[bool, float]:
    """Whether ``dtype`` matmuls (None: bfloat16) run at least :data:`HALF_WORTH_IT` times faster than float32 here,
    and the speed-up."""
    speedup = half_matmul_speedup(dtype)
    return speedup >= HALF_WORTH_IT, speedup


def half_sections(choice: str, dtype: torch.dtype | None = None) -> tuple[bool, str | None]:
    """Whether a benchmark's half-precision sections run, and a line saying why not when the probe decided.

    choice: "on", "off" or "auto" (run them where ``dtype`` matmuls pay on this CPU: where they
    are emulated, as on AVX2 without avx512_bf16, those sections alone would take hours).
    """
    if choice not in ("auto", "on", "off"):
        raise ValueError(f"choice must be auto, on or off, got {choice!r}")
    if choice != "auto":
        return choice == "on", None
    pays, speedup = half_precision_pays(dtype)
    if pays:
        return True, None
    name = "bfloat16" if dtype is None else str(dtype).removeprefix("torch.")
    return False, (
        f"{name} sections skipped: {name} matmuls run at {speedup:.2f}x the float32 speed on this CPU "
        f"(below {HALF_WORTH_IT}x); --bf16 on runs them anyway"
    )


def half_precision_note(dtype: torch.dtype) -> str | None:
    """A one-line note for a half-precision run on this CPU when it would be no faster than float32, else None."""
    pays, speedup = half_precision_pays(dtype)
    if pays:
        return None
    name = str(dtype).removeprefix("torch.")
    pace = f"{1 / speedup:.2f}x slower" if speedup < 1 else f"only {speedup:.2f}x faster"
    return (
        f"note: {name} matmuls run {pace} than float32 on this CPU ({describe().removeprefix('cpu: ')}); "
        f"a {name} run is likely no faster than --dtype float32 here"
    )
