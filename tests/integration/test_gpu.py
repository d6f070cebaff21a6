"""The continuous path and the engine on CUDA, float32 and bfloat16, also placed by device_map="auto".

Selected with ``pytest -m gpu``; skipped where torch sees no CUDA device. Each model is
compared with its own stock forward on the same device, and with the CPU float32 model.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import contllm
from contllm import ContinuousLM
from contllm.core.engine import Engine
from tests.integration.test_engine_real import counting_sweep, one_by_one

pytestmark = [
    pytest.mark.integration,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

DEVICE = "cuda"
ALIASES = ["smollm2-135m", "qwen2.5-coder-0.5b"]
PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, lit the great lamp, "
    "and watched the ships pass safely through the narrow channel below. One night the"
)
@pytest.fixture(scope="module", params=ALIASES)
def alias(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def cuda32(alias: str) -> Iterator[ContinuousLM]:
    lm = contllm.load(alias, device=DEVICE)
    yield lm
    del lm
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def cuda16(alias: str) -> Iterator[ContinuousLM]:
    lm = contllm.load(alias, device=DEVICE, dtype="bfloat16")
    yield lm
    del lm
    torch.cuda.empty_cache()


def test_models_are_on_the_gpu(cuda32: ContinuousLM, cuda16: ContinuousLM) -> None:
    assert cuda32.device.type == "cuda" and cuda32.model.dtype == torch.float32
    assert cuda16.device.type == "cuda" and cuda16.model.dtype == torch.bfloat16


def test_unit_durations_equal_the_stock_forward_float32(cuda32: ContinuousLM) -> None:
    signal = cuda32.signal(PROMPT)
    with torch.no_grad():
        stock = cuda32.model(signal.token_ids[None].to(cuda32.device), logits_to_keep=0).logits[0].float().cpu()
    ours = cuda32.logits(signal, positions="all")
    # The stock path may take another CUDA attention kernel than the masked one: not bit-equal.
    assert float((ours - stock).abs().max()) <= 1e-3


def test_float32_on_cuda_equals_the_cpu(cuda32: ContinuousLM, alias: str) -> None:
    signals = counting_sweep(cuda32, 8)
    cpu = contllm.load(alias, device="cpu")
    assert float((Engine(cuda32).probs(signals) - Engine(cpu).probs(signals)).abs().max()) <= 1e-4


def test_engine_with_shared_prefix_equals_one_forward_per_signal_float32(cuda32: ContinuousLM) -> None:
    signals = counting_sweep(cuda32, 12)
    engine = Engine(cuda32, max_batch_tokens=40)
    got = engine.probs(signals)
    assert len(engine.last_stats.chunks) > 1 and min(engine.last_stats.prefix_lens) > 20  # type: ignore[union-attr]
    assert float((got - one_by_one(cuda32, signals)).abs().max()) <= 1e-4


def test_bfloat16_top5_equal_the_stock_bfloat16_forward(cuda16: ContinuousLM) -> None:
    signal = cuda16.signal(PROMPT)
    with torch.no_grad():
        stock = cuda16.model(signal.token_ids[None].to(cuda16.device)).logits[0, -1].float().cpu()
    ours = cuda16.logits(signal)
    assert torch.topk(ours, 5).indices.tolist() == torch.topk(stock, 5).indices.tolist()


def test_bfloat16_engine_agrees_with_float32_within_2e2(cuda32: ContinuousLM, cuda16: ContinuousLM) -> None:
    signals = counting_sweep(cuda32, 30)
    ref = Engine(cuda32).probs(signals)
    got = Engine(cuda16).probs(signals)
    assert torch.isfinite(got).all()
    assert float((got - ref).abs().max()) <= 2e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_device_map_auto_places_the_model_on_the_gpu_and_agrees(
    alias: str, dtype: str, cuda32: ContinuousLM, cuda16: ContinuousLM
) -> None:
    placed = contllm.load(alias, device_map="auto", dtype=dtype)
    try:
        assert {p.device.type for p in placed.model.parameters()} == {"cuda"}
        reference = cuda32 if dtype == "float32" else cuda16
        signals = counting_sweep(placed, 6)
        got, ref = Engine(placed).probs(signals), Engine(reference).probs(signals)
        assert float((got - ref).abs().max()) <= (1e-5 if dtype == "float32" else 1e-3)
    finally:
        del placed
        torch.cuda.empty_cache()
