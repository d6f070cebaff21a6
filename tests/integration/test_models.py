"""The embedded models: GGUF conversion, the cache, tokenizers and sane predictions.

Each model is converted once per session into a temporary cache (about 20 s for SmolLM2
and 95 s for Gemma 3 on a 2-core CPU); the GGUF-loaded model from that conversion is the
reference the cached model must reproduce exactly.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gc
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from contllm import models as M

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"
# About 590 Gemma tokens: longer than its local window (512), so that sliding layers really slide.
LONG_PROMPT = " ".join(f"Item {i} is a {['red', 'green', 'blue'][i % 3]} box." for i in range(66))
PROMPTS = {"smollm2-135m": (PROMPT,), "gemma3-270m": (PROMPT, LONG_PROMPT)}
KEEP = 8  # positions whose logits are compared (the vocabulary projection of Gemma is large)
# Config keys that legitimately differ between the GGUF-loaded and the cached model.
VOLATILE_KEYS = {"_name_or_path", "architectures", "transformers_version", "quantization_config"}


@dataclass
class Reference:
    """What the GGUF-loaded model produced, kept after the model itself is freed."""

    logits: dict[str, torch.Tensor]
    config: dict[str, Any]
    cached: M.LoadedModel


def _logits(loaded: M.LoadedModel, text: str) -> torch.Tensor:
    enc = loaded.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        return loaded.model(**enc, logits_to_keep=KEEP).logits[0].float()


def _convert_and_load(alias: str, cache_dir: Path) -> Reference:
    reference = M.convert_embedded(alias, cache_dir=cache_dir)
    logits = {text: _logits(reference, text) for text in PROMPTS[alias]}
    config = reference.model.config.to_dict()
    del reference
    gc.collect()
    return Reference(logits=logits, config=config, cached=M.load_model(alias, cache_dir=cache_dir))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("contllm-cache")


@pytest.fixture(scope="session")
def smollm2(cache_dir: Path) -> Reference:
    return _convert_and_load("smollm2-135m", cache_dir)


@pytest.fixture(scope="session")
def gemma3(cache_dir: Path) -> Reference:
    return _convert_and_load("gemma3-270m", cache_dir)


@pytest.fixture(params=["smollm2", "gemma3"])
def model(request: pytest.FixtureRequest) -> Reference:
    return request.getfixturevalue(request.param)


def test_cached_logits_equal_gguf_logits(model: Reference) -> None:
    for text, expected in model.logits.items():
        torch.testing.assert_close(_logits(model.cached, text), expected, rtol=0, atol=1e-5)


def test_cached_config_keeps_the_gguf_config(model: Reference) -> None:
    cached = model.cached.model.config.to_dict()
    for key in set(model.config) | set(cached):
        if key not in VOLATILE_KEYS:
            assert cached.get(key) == model.config.get(key), key


def test_loaded_model_info(model: Reference) -> None:
    info = model.cached.info
    entry = M.REGISTRY[info.alias]
    assert info.family == entry.family == model.cached.model.config.model_type
    assert info.n_parameters == entry.n_parameters
    assert info.device == "cpu" and info.dtype == torch.float32
    assert info.attn_implementation == "sdpa"
    assert info.weights_sha256 and len(info.weights_sha256) == 64
    assert not model.cached.model.training
    assert M.cache_entry_problems(info.source, deep=True) == []


def test_tokenizer_is_fast_with_offsets(model: Reference) -> None:
    tok = model.cached.tokenizer
    assert tok.is_fast
    enc = tok(PROMPT, return_offsets_mapping=True)
    pieces = [PROMPT[a:b] for a, b in enc["offset_mapping"] if b > a]
    assert "".join(pieces) == PROMPT


def test_top5_next_tokens_are_sane(model: Reference) -> None:
    top = _logits(model.cached, PROMPT)[-1].topk(5).indices
    assert " Paris" in [model.cached.tokenizer.decode(int(i)) for i in top]


def test_smollm2_tokenizer_keeps_the_chat_template_and_adds_no_bos(smollm2: Reference) -> None:
    tok = smollm2.cached.tokenizer
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.bos_token == "<|im_start|>"
    assert tok(PROMPT).input_ids[0] != tok.bos_token_id


def test_gemma3_tokenizer_adds_bos(gemma3: Reference) -> None:
    tok = gemma3.cached.tokenizer
    enc = tok(PROMPT, return_offsets_mapping=True)
    assert tok.bos_token == "<bos>" and enc["input_ids"][0] == tok.bos_token_id
    assert enc["offset_mapping"][0] == (0, 0)
    assert not tok.chat_template


def test_gemma3_config_facts(gemma3: Reference) -> None:
    config = gemma3.cached.model.config
    assert config.num_hidden_layers == 18
    assert config.sliding_window == 512
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert config.tie_word_embeddings
    model = gemma3.cached.model
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_list_models_sees_both_entries(smollm2: Reference, gemma3: Reference, cache_dir: Path) -> None:
    listings = {m.alias: m for m in M.list_models(cache_dir=cache_dir)}
    assert list(listings) == list(M.REGISTRY)
    for alias in ("smollm2-135m", "gemma3-270m"):
        assert listings[alias].installed and listings[alias].cached
        files = [p for p in (cache_dir / alias).iterdir() if p.name != M.RECORD_NAME]
        assert listings[alias].cache_bytes == sum(p.stat().st_size for p in files)
    assert not any(m.cached for m in listings.values() if m.alias.startswith("qwen"))  # not converted in this cache


def test_bfloat16_load_from_cache(smollm2: Reference, cache_dir: Path) -> None:
    loaded = M.load_model("smollm2-135m", cache_dir=cache_dir, dtype="bf16")
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.tokenizer.decode(int(_logits(loaded, PROMPT)[-1].argmax())) == " Paris"


def test_truncated_cache_entry_is_rebuilt(smollm2: Reference, cache_dir: Path, tmp_path: Path) -> None:
    # Work on a copy: the session's cached model may be memory-mapped from its own files.
    shutil.copytree(cache_dir / "smollm2-135m", tmp_path / "smollm2-135m")
    weights = tmp_path / "smollm2-135m" / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(weights.stat().st_size // 3)
    with pytest.warns(M.ModelCacheWarning, match="model.safetensors"):
        rebuilt = M.load_model("smollm2-135m", cache_dir=tmp_path)
    assert M.cache_entry_problems(tmp_path / "smollm2-135m") == []
    torch.testing.assert_close(_logits(rebuilt, PROMPT), smollm2.logits[PROMPT], rtol=0, atol=1e-5)


def test_4k_flip_in_cached_weights_is_detected_and_rebuilt(
    smollm2: Reference, cache_dir: Path, tmp_path: Path
) -> None:
    # The case: 4 KiB overwritten inside model.safetensors, same size (as dd conv=notrunc does).
    shutil.copytree(cache_dir / "smollm2-135m", tmp_path / "smollm2-135m")
    entry = tmp_path / "smollm2-135m"
    assert M.cache_entry_problems(entry) == []  # a copy: hashed in full once, record updated
    weights = entry / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.seek(weights.stat().st_size // 2 + 12345)
        fh.write(os.urandom(4096))
    with pytest.warns(M.ModelCacheWarning, match="model.safetensors"):
        rebuilt = M.load_model("smollm2-135m", cache_dir=tmp_path)
    assert M.cache_entry_problems(entry, deep=True) == []
    torch.testing.assert_close(_logits(rebuilt, PROMPT), smollm2.logits[PROMPT], rtol=0, atol=1e-5)


def test_untouched_cached_weights_are_not_hashed_in_full(
    smollm2: Reference, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contllm.models import cache

    entry = cache_dir / "smollm2-135m"
    assert M.cache_entry_problems(entry) == []
    hashed: list[str] = []
    full_hash = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda path: hashed.append(path.name) or full_hash(path))
    assert M.cache_entry_problems(entry) == []
    assert "model.safetensors" not in hashed
