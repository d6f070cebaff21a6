"""Session-wide embedded models, loaded once (converted into the cache on first use)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
from pathlib import Path

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


@pytest.fixture(scope="session")
def tiny_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer, saved as a local model directory.

    For tests of a run's machinery (a launch, a device map, every default option of an
    experiment through the command line) that need a real tokenizer but not a real model.
    """
    from contllm.models import ensure_cached
    from tests.unit.tiny import save_directory, tiny_llama

    tokenizer_dir = ensure_cached("smollm2-135m")
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    model = tiny_llama(vocab, max_position_embeddings=512)
    return save_directory(tmp_path_factory.mktemp("models") / "tiny-llama", model, tokenizer_dir)
