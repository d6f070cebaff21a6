"""Tiny random models of every supported family, tokenizers and model directories, built here (nothing downloaded)."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers

from contllm import ContinuousLM
from contllm.core.families import FAMILIES

VOCAB = 97
WINDOW = 4  # shorter than the test prompts, so windows really cut

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    # A wider init than the default 0.02 gives logits that differ visibly between inputs,
    # so that a broken invariant shows up far above the tolerances.
    initializer_range=0.2,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


def _gemma2() -> tf.PretrainedConfig:
    return tf.Gemma2Config(
        **COMMON,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )


def _gemma3() -> tf.PretrainedConfig:
    return tf.Gemma3TextConfig(
        **COMMON,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )


#: One tiny config builder per family of contllm.core.families.FAMILIES (keyed by Family.name);
#: tests/unit/test_families.py fails when a family has none.
CONFIGS: dict[str, Callable[[], tf.PretrainedConfig]] = {
    "llama": lambda: tf.LlamaConfig(**COMMON),
    "mistral": lambda: tf.MistralConfig(**COMMON, sliding_window=WINDOW),
    "gemma": lambda: tf.GemmaConfig(**COMMON, head_dim=16),
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "phi": lambda: tf.PhiConfig(**{**COMMON, "num_key_value_heads": 4}, partial_rotary_factor=0.5),
    "phi3": lambda: tf.Phi3Config(**COMMON, sliding_window=WINDOW, pad_token_id=0),
    "qwen2": lambda: tf.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "qwen3": lambda: tf.Qwen3Config(
        **COMMON, head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    "gpt_neox": lambda: tf.GPTNeoXConfig(**{**COMMON, "num_key_value_heads": 4}, rotary_pct=0.5, use_parallel_residual=True),
    "gpt2": lambda: tf.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64, initializer_range=0.2,
        bos_token_id=1, eos_token_id=2,
    ),
}


def _config(family: str) -> tf.PretrainedConfig:
    if family not in CONFIGS:
        raise KeyError(f"no tiny config for family {family!r}; add one to tests/unit/tiny.py CONFIGS")
    return CONFIGS[family]()


# Derived from the package's own table, so that a new family cannot go untested.
FAMILY_NAMES = [f.name for f in FAMILIES]
ROTARY = [f.name for f in FAMILIES if f.positions == "rotary"]
WINDOWED = [f.name for f in FAMILIES if f.windows != "none"]
EAGER_ONLY = {f.name for f in FAMILIES if "sdpa" not in f.backends}


def backends(family: str) -> list[str]:
    """The attention implementations the family takes a continuous mask with (the table's backends)."""
    return list(next(f for f in FAMILIES if f.name == family).backends)


@functools.cache
def _state(family: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager")
    return {k: v.clone() for k, v in model.state_dict().items()}


@functools.cache
def tiny_model(family: str, impl: str = "eager") -> torch.nn.Module:
    """A seeded random model of ``family`` (fp32, eval); eager and sdpa share weights."""
    model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation=impl)
    model.load_state_dict(_state(family))
    return model.eval()


@functools.cache
def tiny_model64(family: str, impl: str = "eager") -> torch.nn.Module:
    """The same model in float64, for identities whose float32 check would measure one CPU's summation order.

    Two ways of computing the same logits (a cached prefix and a full forward, a batch and
    its rows) round differently in float32, by 1e-6 to 1.1e-5 depending on the CPU's
    kernels; in float64 only the float32 steps inside the stock modules (the eager softmax,
    the rotary tables) are left, while a broken identity still moves logits by far more than
    the tolerances.
    """
    model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation=impl)
    model.load_state_dict(_state(family))
    return model.to(torch.float64).eval()


def tiny_lm(family: str = "llama", tokenizer: Any = None, impl: str = "eager") -> ContinuousLM:
    """``tiny_model(family, impl)`` wrapped, with ``tokenizer`` if given (the model is the cached, shared one)."""
    return ContinuousLM(tiny_model(family, impl), tokenizer)


# ------------------------------------------------------------------ word-level tokenizers, fresh Llamas, directories


def word_level_tokenizer(
    vocab: Sequence[str], *, unk: str = "<unk>", digits: bool = False, **special: str
) -> tf.PreTrainedTokenizerFast:
    """A word-level fast tokenizer whose token id ``i`` is ``vocab[i]``; any other word is ``unk``.

    Text splits at whitespace and between word characters and punctuation (with offsets);
    ``digits`` also splits numbers into single digits. ``special`` names special tokens
    (``bos_token="<s>"``, ...), each a word of ``vocab``.
    """
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=unk))
    if digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, **special)


def tiny_llama(vocab_size: int = VOCAB, *, seed: int = 0, **settings: Any) -> tf.LlamaForCausalLM:
    """A new random Llama (fp32, eval) drawn after ``torch.manual_seed(seed)``: ``COMMON``'s config with
    ``vocab_size`` and ``settings`` (any LlamaConfig field, ``attn_implementation`` too) over it.

    Unlike ``tiny_model`` nothing is cached: every call builds its own copy, with the same
    weights for the same arguments (``tiny_llama()`` has those of ``CONFIGS["llama"]`` built
    from the same seed).
    """
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tf.LlamaConfig(**{**COMMON, "vocab_size": vocab_size, **settings})).eval()


#: The word-level Llama's vocabulary: ids 0, 1, 2 are its unk, bos and eos tokens (COMMON's bos and eos ids).
WORDS = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "a", "mat", "dog"]
#: The word-level Llama's sizes over COMMON: two layers of width 32 at transformers' default init range.
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, initializer_range=0.02)


def tiny_tokenizer(words: Sequence[str] = WORDS) -> tf.PreTrainedTokenizerFast:
    """The word-level tokenizer over ``words`` (``<unk>``, ``<s>``, ``</s>`` first), bos ``<s>``, eos ``</s>``."""
    return word_level_tokenizer(words, bos_token="<s>", eos_token="</s>")


def word_llama(seed: int = 0, words: Sequence[str] = WORDS, max_position_embeddings: int = 64) -> tf.LlamaForCausalLM:
    """A new random ``SMALL`` Llama whose vocabulary is ``words`` (the ids of ``tiny_tokenizer(words)``)."""
    return tiny_llama(len(words), seed=seed, max_position_embeddings=max_position_embeddings, **SMALL)


def save_directory(path: Path, model: torch.nn.Module, tokenizer: Any) -> Path:
    """``model`` and ``tokenizer`` saved at ``path`` as a local model directory; returns ``path``.

    ``tokenizer`` is a tokenizer object, or a model directory whose ``tokenizer.json`` and
    ``tokenizer_config.json`` are copied as they are.
    """
    model.save_pretrained(path)
    if isinstance(tokenizer, Path):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer / name, path / name)
    else:
        tokenizer.save_pretrained(path)
    return path


def word_directory(path: Path, words: Sequence[str] = WORDS, max_position_embeddings: int = 64) -> Path:
    """``word_llama(0, words, max_position_embeddings)`` and ``tiny_tokenizer(words)`` saved at ``path``."""
    return save_directory(path, word_llama(0, words, max_position_embeddings), tiny_tokenizer(words))


# ------------------------------------------------------------------ inputs


def prompt(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (n,), generator=g)


def random_durations(n: int, seed: int = 0, low: float = 0.2, high: float = 1.8) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n, generator=g, dtype=torch.float64)
