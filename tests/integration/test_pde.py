"""Attention dynamics on the embedded pretrained models: stock parity, causality, caching and run directories."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from contllm import ContinuousLM, Signal
from contllm.internals.hooks import cache_keyword
from contllm.pde import (
    Dynamics,
    PDEConfig,
    PDEResult,
    causal_smoothing,
    pde_attention,
)
from contllm.pde.figures import FIGURES
from contllm.rundir.runner import run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
]

PROMPT = "The old lighthouse keeper climbed the narrow stairs every evening and lit the"
#: A run small enough for the test tier: one pseudo-time besides 0, two prompts.
SMALL = PDEConfig(times=(0.0, 4.0), prompts="2")


def eager_logits(lm: ContinuousLM, ids: torch.Tensor) -> torch.Tensor:
    """The stock model's logits with eager attention (the session's model may be loaded with sdpa)."""
    config = lm.model.config
    saved = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            return lm.model(ids[None], use_cache=False).logits[0]
    finally:
        config._attn_implementation = saved


def test_t0_is_bitwise_the_stock_eager_model(real_lm: ContinuousLM) -> None:
    ids = real_lm.signal(PROMPT).token_ids
    stock = eager_logits(real_lm, ids)
    with pde_attention(real_lm, Dynamics("diffusion", 0.0)), torch.no_grad():
        assert torch.equal(real_lm.model(ids[None], use_cache=False).logits[0], stock)
    with pde_attention(real_lm, Dynamics("diffusion", 0.0)):
        via_signal = real_lm.logits(real_lm.signal(PROMPT), positions="all")
    assert torch.equal(via_signal, stock)


@pytest.mark.parametrize("dynamics", [Dynamics("diffusion", 4.0), Dynamics("matched", 4.0)], ids=lambda d: d.kind)
def test_causality_and_cached_decoding_on_a_real_model(real_lm: ContinuousLM, dynamics: Dynamics) -> None:
    # In float64: a prefill and one-token steps multiply matrices of other shapes, whose float32
    # sums round differently by CPU (1.65e-4 in a logit on one AVX-512 CPU); a broken cache or a
    # leak from later keys moves logits by far more than the tolerance in any precision.
    real_lm = ContinuousLM(copy.deepcopy(real_lm.model).to(torch.float64), real_lm.tokenizer)
    signal = real_lm.signal(PROMPT)
    ids = signal.token_ids
    p = len(ids) - 4
    edited = ids.clone()
    edited[p] = int(real_lm.signal(" river", add_special_tokens=False).token_ids[0])
    with pde_attention(real_lm, dynamics), torch.no_grad():
        full = real_lm.model(ids[None], use_cache=False).logits[0]
        changed = real_lm.model(edited[None], use_cache=False).logits[0]
        cache = DynamicCache()
        stepped = []
        for i in range(len(ids)):
            out = real_lm.model(ids[None, i : i + 1], **{cache_keyword(real_lm.model): cache}, use_cache=True,
                                position_ids=torch.tensor([[i]]), attention_mask=torch.ones(1, i + 1, dtype=torch.long))
            stepped.append(out.logits[0, -1])
    assert torch.equal(full[:p], changed[:p])
    assert not torch.allclose(full[p:], changed[p:], atol=1e-3)
    assert torch.allclose(full, torch.stack(stepped), atol=1e-4, rtol=0)


def test_continuous_durations_and_hidden_smoothing_on_a_real_model(smollm: ContinuousLM) -> None:
    signal = smollm.signal(PROMPT)
    n = len(signal)
    with pde_attention(smollm, Dynamics("diffusion", 2.0)):
        unit = smollm.logits(signal, positions="all")
        with torch.no_grad():
            tokens = smollm.model(signal.token_ids[None], use_cache=False).logits[0]
        stretched = smollm.logits(signal.with_durations(torch.full((n,), 2.0, dtype=torch.float64)), positions="last")
    assert torch.allclose(unit, tokens, atol=1e-4, rtol=0)
    assert torch.isfinite(stretched).all()
    with causal_smoothing(smollm, 1.0):
        smooth = smollm.logits(signal, positions="all")
        ids = signal.token_ids.clone()
        ids[n - 2] += 1
        edited = smollm.logits(Signal.from_ids(ids), positions="all")
    assert torch.equal(smooth[: n - 2], edited[: n - 2])
    assert not torch.allclose(smooth, unit, atol=1e-3)


@pytest.mark.parametrize("name", ["smollm", "gemma"])
def test_a_small_run_writes_its_directory_and_figures(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    lm = request.getfixturevalue(name)
    out = tmp_path / "run"
    path = run("pde", model=name, out=out, config=SMALL, lm=lm, formats="png,pdf")
    assert path == out
    for file in ("config.json", "manifest.json", "results.json", "results.csv", "profiles.csv", "summary.json"):
        assert (out / file).is_file(), file
    for figure in FIGURES:
        for ext in ("png", "pdf"):
            assert (out / "figures" / f"{figure}.{ext}").stat().st_size > 1000, figure
    assert len(list((out / "items").glob("*.json"))) == 1 + (len(SMALL.times) - 1) * len(SMALL.variants)
    result = PDEResult.load(out)
    assert result.prompts == ["capital", "days"]
    stock = result.stock
    assert stock["T"] == 0 and stock["text"]["kl"] == 0 and stock["text"]["top1"] == 1
    assert 1 < stock["text"]["perplexity"] < 200
    table = result.table("attention")
    assert [r["T"] for r in table] == [0.0, 4.0]
    assert table[1]["kl_text"] > 0 and table[1]["attention_entropy"] > table[0]["attention_entropy"]
    matched = result.table("matched")
    assert all(m["attention_entropy"] > matched[0]["attention_entropy"] for m in matched[1:])
    summary = json.loads((out / "summary.json").read_text())
    assert "power-law decay" in summary["verdict"]
    for row in table:
        assert row["r2_exponential"] is not None and row["r2_power"] is not None
    # --resume skips every finished point: no record is written again.
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "items").glob("*.json")}
    run("pde", model=name, out=out, config=SMALL, lm=lm, resume=True)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "items").glob("*.json")} == stamps
    assert PDEResult.load(out).records == result.records


@pytest.mark.slow
def test_default_options_run_through_the_command_line(tiny_directory: Path, tmp_path: Path) -> None:
    """`contllm run pde --model DIR --out DIR`: every option of the experiment at its default, as a user runs it.

    On a tiny random model with SmolLM2's tokenizer: the run's machinery, its defaults and its
    files are the subject here (the pretrained models' dynamics are the small runs' above); on
    SmolLM2 itself the default run takes minutes (docs/experiments/pde.md)."""
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "contllm", "run", "pde", "--model", str(tiny_directory), "--out", str(out)],
                          capture_output=True, text=True, timeout=1500, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    result = PDEResult.load(out)
    assert 300 < result.text_tokens < 400
    assert [r["T"] for r in result.table("attention")] == [0.0, 0.1, 0.4, 1.0, 4.0, 16.0, 64.0, 256.0]
    assert len(result.records) == 1 + 7 * 3
    for figure in FIGURES:
        assert (out / "figures" / f"{figure}.png").is_file()
