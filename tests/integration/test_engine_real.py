"""The engine on the embedded SmolLM2: equal to one forward per signal in float32, and what bfloat16 costs."""

from __future__ import annotations

import pytest
import torch

import contllm
from contllm import ContinuousLM, Signal, pad_signals
from contllm.core.engine import Engine
from contllm.hardware import cpu_capability

pytestmark = [pytest.mark.integration, pytest.mark.numerics]

PROMPT = '"cat cat" contains 2 words.\n"dog dog dog" contains 3 words.\n"apple apple apple apple" contains '


def counting_sweep(lm: ContinuousLM, n: int) -> list[Signal]:
    base = lm.signal(PROMPT)
    last_line = PROMPT.rindex('"apple')
    spans = [s for s in base.find("apple") if s[0] >= last_line]
    return [base.scale(spans, c) for c in torch.linspace(0.1, 1.0, n).tolist()]


def one_by_one(lm: ContinuousLM, signals: list[Signal]) -> torch.Tensor:
    with lm.patched():
        rows = [lm.forward_batch(pad_signals([s]), logits_to_keep=0)[0][0, -1].float().cpu() for s in signals]
    return torch.softmax(torch.stack(rows), dim=-1)


@pytest.fixture(scope="module")
def smollm_bf16() -> ContinuousLM:
    return contllm.load("smollm2-135m", dtype=torch.bfloat16)


def test_engine_equals_one_forward_per_signal(smollm: ContinuousLM) -> None:
    signals = counting_sweep(smollm, 12)
    engine = Engine(smollm, max_batch_tokens=40)  # several chunks (7 tokens after the prefix each row), one prefix
    got = engine.probs(signals)
    assert len(engine.last_stats.chunks) > 1 and min(engine.last_stats.prefix_lens) > 20  # type: ignore[union-attr]
    assert float((got - one_by_one(smollm, signals)).abs().max()) <= 1e-5


def test_bfloat16_engine_agrees_with_float32_within_2e2(smollm: ContinuousLM, smollm_bf16: ContinuousLM) -> None:
    """Within 2e-2 of float32, and strictly closer than the stock bf16 model measured here on the same CPU.

    bf16 kernels differ by CPU (AMX tiles, avx512_bf16 dot products, conversion to
    float32), and so do both errors; what holds on every CPU is the bound and that
    keeping the state in float32 removes error rather than adds it. The engine with
    ``float32_state=False`` is the stock model and fails the second assertion.
    How much closer is the CPU's own (max |dp|; engine / stock): AVX-512 + AMX (Xeon,
    Sapphire Rapids) 8.5e-3 / 2.4e-2 = 0.35x (100 factors); AVX-512 + avx512_bf16
    without AMX (AMD EPYC) 1.08e-2 / 1.83e-2 = 0.59x (30 factors, as here); that CPU
    with torch's kernels held back (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) 0.39x-0.77x.
    benchmarks/sweep.py prints the ratio beside the CPU's capabilities.
    """
    signals = counting_sweep(smollm, 30)
    ref = Engine(smollm).probs(signals)
    got = Engine(smollm_bf16).probs(signals)
    stock = Engine(smollm_bf16, float32_state=False).probs(signals)
    got_err, stock_err = float((got - ref).abs().max()), float((stock - ref).abs().max())
    assert got_err <= 2e-2, cpu_capability()
    assert got_err < stock_err, (got_err, stock_err, cpu_capability())
    assert smollm_bf16.model.get_output_embeddings().weight.dtype == torch.bfloat16
