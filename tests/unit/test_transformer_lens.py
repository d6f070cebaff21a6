"""Parity with TransformerLens (the ``tl`` extra): the same random weights in its TransformerBridge and in contllm
give every shared hook name the same activation at unit durations.

TransformerLens 4 wraps the Hugging Face module itself (``TransformerBridge.boot_transformers(hf_model=...)``),
so both sides read one set of weights, built here from a tiny config; nothing is downloaded.
Its hook names are the vocabulary contllm follows: every name both expose is compared, and
the test fails if fewer than the expected ones are shared. Masked attention scores are
compared as masked (both hold about the dtype's minimum there, plus the score).
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import transformers as tf

from contllm import ContinuousLM, Signal
from contllm.internals.hookpoints import hook_names
from tests.unit.tiny import COMMON, VOCAB, prompt, tiny_model, word_level_tokenizer

bridge_module = pytest.importorskip("transformer_lens.model_bridge", reason="pip install 'contllm[tl]'")

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

N = 10

#: Names TransformerLens 4.3 exposes that contllm must share on a Llama-like model (all but its own hook_in/hook_out
#: aliases, the rotary tables and the unembedding; contllm's hook_duration_bias is its own).
SHARED = {
    "hook_embed",
    "blocks.0.hook_resid_pre",
    "blocks.0.ln1.hook_scale",
    "blocks.0.ln1.hook_normalized",
    "blocks.0.attn.hook_q",
    "blocks.0.attn.hook_k",
    "blocks.0.attn.hook_v",
    "blocks.0.attn.hook_rot_q",
    "blocks.0.attn.hook_rot_k",
    "blocks.0.attn.hook_attn_scores",
    "blocks.0.attn.hook_pattern",
    "blocks.0.attn.hook_z",
    "blocks.0.attn.hook_result",
    "blocks.0.hook_attn_out",
    "blocks.0.hook_resid_mid",
    "blocks.0.ln2.hook_scale",
    "blocks.0.ln2.hook_normalized",
    "blocks.0.mlp.hook_pre",
    "blocks.0.mlp.hook_pre_linear",
    "blocks.0.mlp.hook_post",
    "blocks.0.hook_mlp_out",
    "blocks.0.hook_resid_post",
    "ln_final.hook_scale",
    "ln_final.hook_normalized",
    "ln_final.hook_out",
}


def word_tokenizer() -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny vocabulary (TransformerLens wants one; these tests feed ids)."""
    tokenizer = word_level_tokenizer([f"t{i}" for i in range(VOCAB)], unk="t0", bos_token="t1", eos_token="t2")
    # TransformerLens reloads a tokenizer by name unless it already adds a BOS token.
    tokenizer.init_kwargs.update(name_or_path="tiny", add_bos_token=True)
    return tokenizer


def qwen2_without_windows() -> torch.nn.Module:
    torch.manual_seed(4321)
    model = tf.AutoModelForCausalLM.from_config(tf.Qwen2Config(**COMMON), attn_implementation="eager")
    return model.eval()


MODELS = {"llama": lambda: tiny_model("llama"), "qwen2": qwen2_without_windows}


@pytest.mark.parametrize("family", list(MODELS))
def test_every_shared_hook_name_agrees_with_transformer_lens(family: str) -> None:
    model = MODELS[family]()
    lm = ContinuousLM(model)
    logging.getLogger("transformer_lens").setLevel(logging.ERROR)
    bridge = bridge_module.TransformerBridge.boot_transformers(
        f"tiny-{family}", hf_model=copy.deepcopy(model), tokenizer=word_tokenizer()
    )
    ids = prompt(N, 21)
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids[None])
        # Per-head results are off by default in TransformerLens; with them on it rebuilds each attention
        # output from them (rounding differently from then on), so only the results are read from that run.
        bridge.set_use_attn_result(True)
        _, results = bridge.run_with_cache(ids[None])
    theirs = {**dict(theirs.items()), **{n: v for n, v in results.items() if n.endswith("attn.hook_result")}}
    ours = lm.run_with_cache(Signal.from_ids(ids))
    assert float((logits[0] - ours.logits[0]).abs().max()) <= 1e-5
    shared = [n for n in hook_names(lm) if n in theirs]
    layer0 = {n for n in shared if not n.startswith("blocks.") or n.startswith("blocks.0.")}
    assert SHARED <= layer0, sorted(SHARED - layer0)
    worst: dict[str, float] = {}
    for name in shared:
        a, b = ours[name].double(), theirs[name].double()
        assert a.shape == b.shape, name
        if name.endswith("hook_attn_scores"):
            hidden = b < -1e30
            assert torch.equal(hidden, a < -1e30), name
            a, b = a[~hidden], b[~hidden]
        diff = float((a - b).abs().max())
        tail = name.split(".", 2)[-1] if name.startswith("blocks.") else name
        worst[tail] = max(worst.get(tail, 0.0), diff)
    print(f"\n{family}: largest difference per name over {len(shared)} shared names (all layers):")
    for tail, diff in worst.items():
        print(f"  {tail:24s} {diff:.2e}")
    assert max(worst.values()) <= 1e-5, {k: v for k, v in worst.items() if v > 1e-5}
