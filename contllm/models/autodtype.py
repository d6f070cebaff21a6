"""``dtype="auto"``: bfloat16 where this host runs it faster without moving the probabilities, else float32.

``contllm.load(name, dtype="auto")`` (``--dtype auto``) loads the model in float32 and in
bfloat16, reads the next-token distributions of :data:`CALIBRATION_PROMPTS` from both
through the engine (as a run reads them), and times those reads, the two dtypes
interleaved round by round so that a slow spell of the host falls on both. bfloat16 is
picked only where it takes at most ``1 - MIN_GAIN`` of float32's time and its
probabilities are within :data:`MAX_PROB_DIFF` of float32's; otherwise float32, the
default, is kept exactly as ``dtype="float32"`` loads it. bfloat16's speed is the
host's (CPUs without bfloat16 instructions emulate it, several times slower than float32;
GPUs and CPUs with AMX or avx512_bf16 kernels run it faster), which is why it is measured
rather than assumed.

:func:`decide` is the rule, a pure function of the measurements; :func:`measure` takes
them; :func:`choose` does both. The :class:`DtypeChoice` states the choice and its
reason (both timings, the probability difference, the device) and is kept on the
model's :class:`~contllm.models.catalog.ModelInfo` (``lm.info.dtype_choice``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contllm.errors import ModelLoadError

#: The dtype name that asks for the choice (any case, spaces around it ignored).
AUTO = "auto"

#: The calibration prompts: a handful of short texts of the kinds the experiments read
#: (prose, a count, a list, code, an event), 5-11 tokens each in SmolLM2's tokenizer.
CALIBRATION_PROMPTS = (
    "The capital of France is",
    "one, two, three, four, five,",
    "Monday, Tuesday, Wednesday,",
    "def add(a, b):\n    return",
    "She opened the door and saw",
)

#: bfloat16 is picked only where it is at least this much faster than float32: it must
#: take at most ``1 - MIN_GAIN`` (90%) of float32's time. A smaller gain is within what
#: the same forward varies by from one round to the next on a shared 2-core CPU.
MIN_GAIN = 0.10

#: The most bfloat16's next-token probabilities of the calibration prompts may differ
#: from float32's (max absolute difference over every prompt and token).
MAX_PROB_DIFF = 1e-2

#: Timed reads of the calibration prompts per dtype, after one untimed warm-up read
#: each; each dtype's time is the fastest of its rounds.
ROUNDS = 3

#: The timing stops after a round where one dtype is at least this many times as fast as
#: the other: on a quiet host the rounds of one dtype differ by a few percent, so more of
#: them would not change the choice (bfloat16 emulated on an AVX2 CPU is about 4x as slow).
CLEAR_RATIO = 2.0

#: The dtypes between which the choice is made.
CANDIDATES = ("float32", "bfloat16")


def is_auto(dtype: Any) -> bool:
    """Whether ``dtype`` asks for the choice: the string "auto" (any case, spaces ignored)."""
    return isinstance(dtype, str) and dtype.strip().lower() == AUTO


@dataclass(frozen=True)
class DtypeChoice:
    """What ``dtype="auto"`` picked and why.

    dtype: "float32" or "bfloat16". float32_seconds, bfloat16_seconds: the fastest read of
    the calibration prompts in each dtype (seconds). max_prob_diff: the largest absolute
    difference between their next-token probabilities in bfloat16 and in float32 (NaN
    where bfloat16's were not finite). device: the device they ran on, as
    :func:`contllm.hardware.describe_device` says it. min_gain, max_allowed: the rule's
    margins (:data:`MIN_GAIN`, :data:`MAX_PROB_DIFF`). reason: one sentence with all of
    these. seconds: what the calibration cost (the bfloat16 load included); rounds: the
    timed rounds of each dtype (both None from :func:`decide` alone, which times nothing).
    """

    dtype: str
    float32_seconds: float
    bfloat16_seconds: float
    max_prob_diff: float
    device: str
    min_gain: float
    max_allowed: float
    reason: str
    seconds: float | None = None
    rounds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a NaN difference is None."""
        return {
            "requested": AUTO,
            "dtype": self.dtype,
            "float32_seconds": self.float32_seconds,
            "bfloat16_seconds": self.bfloat16_seconds,
            "max_prob_diff": self.max_prob_diff if math.isfinite(self.max_prob_diff) else None,
            "device": self.device,
            "min_gain": self.min_gain,
            "max_allowed": self.max_allowed,
            "reason": self.reason,
            "seconds": self.seconds,
            "rounds": self.rounds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DtypeChoice:
        """The choice :meth:`to_dict` wrote."""
        diff = data.get("max_prob_diff")
        return cls(
            dtype=str(data["dtype"]),
            float32_seconds=float(data["float32_seconds"]),
            bfloat16_seconds=float(data["bfloat16_seconds"]),
            max_prob_diff=float("nan") if diff is None else float(diff),
            device=str(data["device"]),
            min_gain=float(data["min_gain"]),
            max_allowed=float(data["max_allowed"]),
            reason=str(data["reason"]),
            seconds=None if data.get("seconds") is None else float(data["seconds"]),
            rounds=None if data.get("rounds") is None else int(data["rounds"]),
        )


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ModelLoadError(f"{what} must be a time in seconds > 0, got {value!r}")
    return float(value)


def decide(
    float32_seconds: float,
    bfloat16_seconds: float,
    max_prob_diff: float,
    device: str,
    *,
    min_gain: float = MIN_GAIN,
    max_allowed: float = MAX_PROB_DIFF,
) -> DtypeChoice:
    """The choice from the measurements: bfloat16 where it is both faster and close enough, else float32.

    float32_seconds, bfloat16_seconds: the time of the same work in each dtype (> 0).
    max_prob_diff: max |p_bfloat16 - p_float32| of their next-token probabilities (>= 0;
    NaN, or an infinite value, for outputs that were not finite, which keeps float32).
    device: what they ran on, stated in the reason. bfloat16 is picked when
    ``bfloat16_seconds <= (1 - min_gain) * float32_seconds`` and
    ``max_prob_diff <= max_allowed``. Times nothing; ModelLoadError for a value that is
    not a measurement (a time <= 0, a negative difference, a margin out of range).
    """
    fp32 = _seconds(float32_seconds, "float32_seconds")
    bf16 = _seconds(bfloat16_seconds, "bfloat16_seconds")
    if isinstance(max_prob_diff, bool) or not isinstance(max_prob_diff, (int, float)) or max_prob_diff < 0:
        raise ModelLoadError(
            f"max_prob_diff must be a difference of probabilities >= 0 (or NaN), got {max_prob_diff!r}"
        )
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0 <= min_gain < 1:
        raise ModelLoadError(f"min_gain must be a fraction from 0 to below 1, got {min_gain!r}")
    if isinstance(max_allowed, bool) or not isinstance(max_allowed, (int, float)) or not 0 <= max_allowed <= 1:
        raise ModelLoadError(f"max_allowed must be a probability difference from 0 to 1, got {max_allowed!r}")
    diff = float(max_prob_diff) if math.isfinite(max_prob_diff) else float("nan")
    faster = bf16 <= (1 - min_gain) * fp32
    close = diff <= max_allowed  # False for NaN
    ratio = bf16 / fp32
    pace = f"{(1 - ratio):.0%} faster" if ratio < 1 else "no faster" if ratio == 1 else f"{ratio:.2f}x as slow"
    timing = (
        f"bfloat16 {bf16:.3f} s vs float32 {fp32:.3f} s per read of the calibration prompts "
        f"({pace}; it needs to be at least {min_gain:.0%} faster)"
    )
    if math.isnan(diff):
        probs = "bfloat16's next-token probabilities were not finite"
    else:
        probs = (
            f"next-token probabilities within {diff:.2g} of float32's (at most {max_allowed:g} allowed)"
            if close
            else f"next-token probabilities up to {diff:.2g} from float32's (more than the {max_allowed:g} allowed)"
        )
    dtype = "bfloat16" if faster and close else "float32"
    why = (
        "faster and as close as required"
        if faster and close
        else "bfloat16 is not enough faster"
        if close
        else "bfloat16 moves the probabilities too much"
        if faster
        else "bfloat16 is neither enough faster nor close enough"
    )
    reason = f"{dtype} ({why}): {timing}; {probs}; {device}"
    return DtypeChoice(dtype, fp32, bf16, diff, device, float(min_gain), float(max_allowed), reason)


def measure(
    float32_lm: Any, bfloat16_lm: Any, *, prompts: Sequence[str] = CALIBRATION_PROMPTS, rounds: int = ROUNDS
) -> tuple[float, float, float, int]:
    """(float32 seconds, bfloat16 seconds, max probability difference, timed rounds) of two loads of one model.

    float32_lm, bfloat16_lm: :class:`~contllm.lm.ContinuousLM` of the same weights in each
    dtype. Each reads the next-token distributions of ``prompts`` (``lm.probs``, the
    engine every run goes through) once untimed, then up to ``rounds`` times timed, the
    dtypes taking turns to go first, stopping early once one is :data:`CLEAR_RATIO` times
    as fast as the other; each dtype's time is its fastest round. The difference is that
    of the untimed reads. The models are only evaluated: nothing of theirs changes.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ModelLoadError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ModelLoadError("the calibration needs at least one prompt, each a non-empty string")
    models = {"float32": float32_lm, "bfloat16": bfloat16_lm}
    signals = {name: [lm.signal(p) for p in prompts] for name, lm in models.items()}
    first = {name: lm.probs(signals[name]) for name, lm in models.items()}
    best = {name: math.inf for name in models}
    timed = 0
    for r in range(rounds):
        timed += 1
        for name in CANDIDATES if r % 2 == 0 else CANDIDATES[::-1]:
            started = time.perf_counter()
            models[name].probs(signals[name])
            best[name] = min(best[name], time.perf_counter() - started)
        if max(best.values()) >= CLEAR_RATIO * min(best.values()):
            break
    diff = float((first["bfloat16"].double() - first["float32"].double()).abs().max())
    return best["float32"], best["bfloat16"], diff, timed


def choose(float32_lm: Any, bfloat16_lm: Any, *, rounds: int = ROUNDS) -> DtypeChoice:
    """:func:`measure` then :func:`decide`, on the device of ``float32_lm``; ``seconds`` is the measurement's time."""
    from contllm.hardware import describe_device

    started = time.perf_counter()
    fp32, bf16, diff, timed = measure(float32_lm, bfloat16_lm, rounds=rounds)
    choice = decide(fp32, bf16, diff, describe_device(float32_lm.device))
    return replace(choice, seconds=round(time.perf_counter() - started, 3), rounds=timed)
