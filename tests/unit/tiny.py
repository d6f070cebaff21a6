"""Tiny random models of every supported family, built in the tests (nothing downloaded)."""

from __future__ import annotations

import functools

import torch
import transformers as tf

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


def _config(family: str) -> tf.PretrainedConfig:
    if family == "llama":
        return tf.LlamaConfig(**COMMON)
    if family == "mistral":
        return tf.MistralConfig(**COMMON, sliding_window=WINDOW)
    if family == "gemma":
        return tf.GemmaConfig(**COMMON, head_dim=16)
    if family == "gemma2":
        return tf.Gemma2Config(
            **COMMON,
            head_dim=16,
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    if family == "gemma3":
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
    if family == "phi":
        return tf.PhiConfig(**{**COMMON, "num_key_value_heads": 4}, partial_rotary_factor=0.5)
    if family == "phi3":
        return tf.Phi3Config(**COMMON, sliding_window=WINDOW, pad_token_id=0)
    if family == "qwen2":
        return tf.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if family == "qwen3":
        return tf.Qwen3Config(**COMMON, head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(**{**COMMON, "num_key_value_heads": 4}, rotary_pct=0.5, use_parallel_residual=True)
    if family == "gpt2":
        return tf.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64, initializer_range=0.2,
            bos_token_id=1, eos_token_id=2,
        )
    raise KeyError(family)


FAMILY_NAMES = ["llama", "mistral", "gemma", "gemma2", "gemma3", "phi", "phi3", "qwen2", "qwen3", "gpt_neox", "gpt2"]
ROTARY = [f for f in FAMILY_NAMES if f != "gpt2"]
WINDOWED = ["mistral", "gemma2", "gemma3", "phi3", "qwen2", "qwen3"]
EAGER_ONLY = {"gemma2"}


def backends(family: str) -> list[str]:
    return ["eager"] if family in EAGER_ONLY else ["eager", "sdpa"]


@functools.lru_cache(maxsize=None)
def _state(family: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager")
    return {k: v.clone() for k, v in model.state_dict().items()}


@functools.lru_cache(maxsize=None)
def tiny_model(family: str, impl: str = "eager") -> torch.nn.Module:
    """A seeded random model of ``family`` (fp32, eval); eager and sdpa share weights."""
    model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation=impl)
    model.load_state_dict(_state(family))
    return model.eval()


def prompt(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (n,), generator=g)


def random_durations(n: int, seed: int = 0, low: float = 0.2, high: float = 1.8) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n, generator=g, dtype=torch.float64)
