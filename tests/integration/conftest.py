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


@pytest.fixture(params=["smollm", "gemma"], scope="session")
def real_lm(request: pytest.FixtureRequest) -> ContinuousLM:
    return request.getfixturevalue(request.param)
