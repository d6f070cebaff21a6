"""Session-wide embedded models, loaded once (converted into the cache on first use)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

import contllm
from contllm import ContinuousLM


@pytest.fixture(scope="session")
def smollm() -> ContinuousLM:
    return contllm.load("smollm2-135m")


@pytest.fixture(scope="session")
def gemma() -> ContinuousLM:
    return contllm.load("gemma3-270m")


@pytest.fixture(scope="session")
def qwen() -> ContinuousLM:
    """Qwen2.5-Coder-0.5B, the qwen2 family; about 4-5x SmolLM2's FLOPs, so few and short tests use it."""
    return contllm.load("qwen2.5-coder-0.5b")


@pytest.fixture(params=["smollm", "gemma"], scope="session")
def real_lm(request: pytest.FixtureRequest) -> ContinuousLM:
    return request.getfixturevalue(request.param)
