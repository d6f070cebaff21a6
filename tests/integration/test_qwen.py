"""Qwen2.5-Coder-0.5B, the embedded qwen2 model: parity with its stock forward, the shared
prefix, the paper's counting effect, and one experiment end to end.

The model costs about 4-5x SmolLM2's FLOPs per token, so these tests are few and short.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from contllm import ContinuousLM, Signal, pad_signals
from contllm.core.engine import Engine
from contllm.core.readout import digits
from contllm.models import REGISTRY

pytestmark = pytest.mark.integration

ALIAS = "qwen2.5-coder-0.5b"
PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, lit the great lamp, "
    "and watched the ships pass safely through the narrow channel below. One night the"
)
COUNTING = '"cat cat" contains 2 words.\n"dog dog dog" contains 3 words.\n"apple apple apple apple" contains '


def apples_scaled(lm: ContinuousLM, factors: list[float]) -> list[Signal]:
    """The last line's four apples, every one lasting c steps, for each c in factors."""
    base = lm.signal(COUNTING)
    last_line = COUNTING.rindex('"apple')
    spans = [s for s in base.find("apple") if s[0] >= last_line]
    assert len(spans) == 4
    return [base.scale(spans, c) for c in factors]


def test_the_model_is_the_qwen2_family_from_its_chunk_packages(qwen: ContinuousLM) -> None:
    assert qwen.model.config.model_type == "qwen2"
    assert qwen.info.alias == ALIAS and qwen.info.weights_sha256 == REGISTRY[ALIAS].gguf.sha256


def test_unit_durations_equal_the_stock_forward(qwen: ContinuousLM) -> None:
    signal = qwen.signal(PROMPT)
    assert len(signal) >= 30
    with torch.no_grad():
        stock = qwen.model(signal.token_ids[None], logits_to_keep=0).logits[0].float()
    ours = qwen.logits(signal, positions="all")
    assert float((ours - stock).abs().max()) <= 1e-4


def test_shared_prefix_equals_the_full_forward(qwen: ContinuousLM) -> None:
    signals = apples_scaled(qwen, [0.3, 0.6, 1.0])
    engine = Engine(qwen)
    got = engine.probs(signals)
    assert min(engine.last_stats.prefix_lens) >= 15  # type: ignore[union-attr]  # the two example lines
    with qwen.patched():
        rows = [qwen.forward_batch(pad_signals([s]), logits_to_keep=0)[0][0, -1].float() for s in signals]
    assert float((got - torch.softmax(torch.stack(rows), dim=-1)).abs().max()) <= 1e-5


def test_four_shrinking_apples_are_read_as_one_then_two_then_four(qwen: ContinuousLM) -> None:
    """The paper's headline on this model: the argmax count falls with the apples' duration."""
    factors = [0.25, 0.5, 1.0]
    probs = digits(qwen.tokenizer).gather(qwen.probs(apples_scaled(qwen, factors)))
    assert probs.argmax(-1).tolist() == [1, 2, 4], probs
    expected = (probs / probs.sum(-1, keepdim=True) * torch.arange(10)).sum(-1)
    assert (expected.diff() > 0.5).all(), expected


@pytest.mark.slow
def test_counting_run_end_to_end(qwen: ContinuousLM, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = run("counting", options={"samples": "3"}, model=ALIAS, lm=qwen, items="2", out=tmp_path / "run",
              device="cpu", item_figures=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["family"] == "qwen2" and manifest["weights_sha256"] == REGISTRY[ALIAS].gguf.sha256
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == ALIAS and summary["items"] == 2
    assert 0.0 <= summary["pure_peak_rate"] <= 1.0
    assert (out / "figures" / "summary.png").is_file()


def test_tokenizer_keeps_the_chat_template_adds_no_bos_and_gives_offsets(qwen: ContinuousLM) -> None:
    tokenizer = qwen.tokenizer
    assert tokenizer.is_fast and "<|im_start|>" in tokenizer.chat_template
    encoded = tokenizer("apple apple", return_offsets_mapping=True)
    assert encoded.input_ids[0] != tokenizer.bos_token_id
    assert [tuple(o) for o in encoded.offset_mapping] == [(0, 5), (5, 11)]
