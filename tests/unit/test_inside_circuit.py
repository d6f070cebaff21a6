"""scripts/inside_circuit.py (the worked circuit example of docs/inside.md): it runs on a tiny model, its gradient
estimate follows the patched forwards, and the page quotes the numbers it wrote."""

from __future__ import annotations

import json
from types import ModuleType

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM
from tests.unit.scripts import ROOT, load_script
from tests.unit.tiny import VOCAB, tiny_model, word_level_tokenizer

pytestmark = pytest.mark.unit


def script() -> ModuleType:
    return load_script(ROOT / "scripts" / "inside_circuit.py", "inside_circuit")


def word_tokenizer() -> PreTrainedTokenizerFast:
    words = ['"', ".", "cat", "dog", "apple", "contains", "words", *map(str, range(10))]
    return word_level_tokenizer(["<unk>", *words, *(f"w{i}" for i in range(VOCAB - len(words) - 1))])


def test_the_script_computes_every_heads_shares_on_a_tiny_model() -> None:
    circuit = script()
    lm = ContinuousLM(tiny_model("llama"), word_tokenizer())
    result = circuit.head_shares(lm, circuit.TEXT, "apple", 0.5)
    assert result["words"] == ["apple"] * 4
    for key in ("z_patched", "bias_restored", "bias_gradient"):
        assert result[key].shape == (3, 4) and np.isfinite(result[key]).all()
    assert abs(result["plain"] - result["short"]) > 1e-3
    # First order against the real thing: the estimate ranks and sizes the heads as the patched forwards do.
    x, y = result["bias_gradient"].ravel(), result["bias_restored"].ravel()
    assert np.corrcoef(x, y)[0, 1] > 0.9


def test_the_page_quotes_the_numbers_the_script_wrote() -> None:
    data = json.loads((ROOT / "docs" / "images" / "inside-circuit.json").read_text())
    page = (ROOT / "docs" / "inside.md").read_text()
    z, bias = dict(data["strongest_z_patched"]), dict(data["strongest_bias_restored"])
    quoted = [
        f"E[k] = {data['plain']:.2f}",
        f"{data['short']:.2f} with every apple",
        f"restore {data['times_restored']:.0%} of the change",
        f"restores {data['every_bias_restored']:.0%}",
        f"L14H5 restores {z['L14H5']:.0%} and\n  L14H13 {z['L14H13']:.0%}",
        f"at most {sorted(z.values())[-3]:.0%} each",
        f"more than\n  {bias['L6H6']:.1%} (L6H6)",
        f"add up to {data['bias_restored_sum']:.0%}",
        f"correlation {data['gradient_restored_correlation']:.3f}",
        f"({data['seconds']} s from loading",
        "images/inside-circuit.png",
    ]
    for text in quoted:
        assert text in page, text
    assert data["model"] == "qwen2.5-coder-0.5b" and data["factor"] == 0.5
    assert (ROOT / "docs" / "images" / "inside-circuit.png").stat().st_size > 10_000
