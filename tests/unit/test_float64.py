"""A float64 model: loaded by name, read through its own float64 head, float64 logits, probabilities and gradients.

The engine's float32 read-out (contllm.core.precision.float32_readout) is for half precision
only; a float64 model's outputs are as exact as the model, so that finite differences
through ``lm.logits`` check anything. At unit durations they equal the stock float64
model's: the same modules run on the same numbers (the stock eager softmax and the rotary
tables are float32 in both), so the tolerances are float64 rounding, not float32's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers

import contllm
from contllm import ContinuousLM, Signal
from contllm.core.engine import Engine
from contllm.core.precision import float32_readout, output_dtype
from contllm.errors import ExperimentError, ModelLoadError
from contllm.settings import RunSettings
from tests.unit.tiny import FAMILY_NAMES, backends, prompt, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

CASES = [(f, b) for f in FAMILY_NAMES for b in backends(f)]
N = 10
TARGET = 7


def log_p(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1)[..., TARGET]


def stock_embed_gradient(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log_p of the last position and its gradient by the input embeddings: plain autograd of the stock model."""
    embeds = model.get_input_embeddings()(ids[None]).detach().requires_grad_(True)
    value = log_p(model(inputs_embeds=embeds).logits[:, -1])
    (grad,) = torch.autograd.grad(value.sum(), embeds)
    return value.detach()[0], grad[0]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_float32_readout_leaves_a_float64_head_alone(family: str) -> None:
    model = tiny_model64(family)
    head = model.get_output_embeddings()
    with float32_readout(model):
        assert model.get_output_embeddings() is head
    lm = ContinuousLM(model)
    ids = prompt(N, 3)
    grads = lm.gradients(Signal.from_ids(ids), log_p, wrt="embeds")
    value, expected = stock_embed_gradient(model, ids)
    assert grads.embeds[0].dtype == torch.float64 and grads.values.dtype == torch.float64
    # Read through a float32 head (as every float64 model was), 1.6e-7 to 3.8e-7 of the largest entry apart.
    assert float((grads.embeds[0] - expected).abs().max()) <= 1e-10 * float(expected.abs().max())
    assert abs(float(grads.values[0] - value)) <= 1e-12


def test_a_half_precision_head_is_still_read_in_float32() -> None:
    model = tf.AutoModelForCausalLM.from_config(tiny_model("llama").config)
    model.load_state_dict(tiny_model("llama").state_dict())
    model = model.to(torch.bfloat16).eval()
    head = model.get_output_embeddings()
    with float32_readout(model):
        assert model.get_output_embeddings() is not head
        out = model.get_output_embeddings()(torch.zeros(1, 64, dtype=torch.bfloat16))
        assert out.dtype == torch.float32
    assert model.get_output_embeddings() is head
    assert ContinuousLM(model).logits(Signal.from_ids(prompt(N))).dtype == torch.float32


def test_output_dtype_is_float64_for_float64_only() -> None:
    assert output_dtype(torch.float64) == torch.float64
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert output_dtype(dtype) == torch.float32
    assert ContinuousLM(tiny_model("llama")).logits(Signal.from_ids(prompt(N))).dtype == torch.float32


@pytest.mark.parametrize("family,impl", CASES)
def test_float64_logits_probs_and_gradients_are_float64_and_equal_the_stock_model(family: str, impl: str) -> None:
    model = tiny_model64(family, impl)
    lm = ContinuousLM(model)
    ids = prompt(N, 4)
    with torch.no_grad():
        stock = model(ids[None]).logits[0]
    assert stock.dtype == torch.float64
    signal = Signal.from_ids(ids)
    logits = lm.logits(signal, positions="all")
    probs = lm.probs(signal, positions="all")
    assert logits.dtype == probs.dtype == torch.float64
    assert float((logits - stock).abs().max()) <= 1e-12
    assert float((probs - stock.softmax(-1)).abs().max()) <= 1e-12
    # A padded batch of a prompt and its shortened copy: the pads take no weight at all.
    pair = [signal, Signal.from_ids(ids[:6])]
    rows = Engine(lm, prefix_cache=False).probs(pair)
    assert rows.dtype == torch.float64
    assert float((rows - stock[[-1, 5]].softmax(-1)).abs().max()) <= 1e-12
    # With their shared prefix: its attention runs in float64 where the stock eager softmax is
    # float32, so under eager the two differ by float32 rounding (up to 1.2e-7), not float64's.
    engine = Engine(lm)
    shared = engine.probs(pair)
    assert engine.last_stats is not None and engine.last_stats.prefix_lens == (5,)
    assert shared.dtype == torch.float64
    assert float((shared - rows).abs().max()) <= (1e-6 if impl == "eager" else 1e-12)
    grads = lm.gradients(signal, log_p, wrt=["durations", "embeds", "blocks.1.hook_resid_post"])
    assert grads.values.dtype == grads.embeds[0].dtype == torch.float64
    assert grads.activations["blocks.1.hook_resid_post"][0].dtype == torch.float64
    assert abs(float(grads.values[0] - log_p(stock[-1]))) <= 1e-12


# ---------------------------------------------------------------------- loading

WORDS = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "a", "mat", "dog"]


def tiny_directory(path: Path) -> Path:
    """The float32 tiny Llama (``tiny_model("llama")``) and a word-level tokenizer, saved as a local model directory."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tiny_model("llama").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("dtype", ["float64", "FP64", "torch.float64", torch.float64])
def test_load_in_float64(tmp_path: Path, dtype: Any) -> None:
    lm = contllm.load(str(tiny_directory(tmp_path / "tiny")), dtype=dtype, device="cpu")
    assert lm.dtype == torch.float64 and lm.info.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in lm.model.parameters())
    ids = prompt(N, 5)
    with torch.no_grad():
        stock = tiny_model64("llama", lm.attn_implementation)(ids[None]).logits[0, -1]
    logits = lm.logits(Signal.from_ids(ids))
    assert logits.dtype == torch.float64
    assert float((logits - stock).abs().max()) <= 1e-12
    assert lm.probs(lm.signal("the cat sat on a mat")).dtype == torch.float64


@pytest.mark.parametrize("dtype", ["float8", "double", "int8", "", torch.int64, torch.complex128, 64])
def test_a_bad_dtype_is_refused_naming_float64_among_the_allowed(tmp_path: Path, dtype: Any) -> None:
    with pytest.raises(ModelLoadError, match="unsupported dtype") as info:
        contllm.load(str(tmp_path / "not-read"), dtype=dtype, device="cpu")
    assert "float64" in str(info.value) and "\n" not in str(info.value)


def test_float64_on_mps_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(ModelLoadError, match="MPS has no float64"):
        contllm.load(str(tmp_path / "not-read"), dtype="float64", device="mps")


def test_runs_keep_to_their_precisions() -> None:
    # float64 is the Python API's: a run (and the command line's --dtype) takes float32, bfloat16 and float16.
    with pytest.raises(ExperimentError, match="dtype must be a name"):
        RunSettings(model="tiny", dtype="float64")
