"""Depth probes on the embedded pretrained models: stock parity, JVPs, causality and a small run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from contllm import ContinuousLM
from contllm.depth import (
    PROMPTS,
    DepthConfig,
    LayerStack,
    finite_difference,
    half_steps,
    jvp,
    propagate,
    scaled_updates,
)
from contllm.rundir import runner

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
]

#: A run small enough for the test tier: one prompt, two probe layers, one eps, three alphas.
SMALL = DepthConfig(layer=(0, -1), eps=(1e-2,), alphas=(0.0, 0.5, 2.0), samples=2, iters=3, sigma_iters=2)


def test_alpha_one_and_removed_hooks_are_bitwise_stock(smollm: ContinuousLM) -> None:
    stack = LayerStack(smollm.model)
    ids = PROMPTS[0].ids(smollm.tokenizer)
    with torch.no_grad():
        stock = smollm.model(ids[None], use_cache=False).logits[0].float()
    assert torch.equal(stack.forward(ids), stock)
    with scaled_updates(stack, 1.0):
        assert torch.equal(stack.forward(ids), stock)
    with scaled_updates(stack, 0.5), half_steps(stack, [3]):
        assert not torch.equal(stack.forward(ids), stock)
    assert torch.equal(stack.forward(ids), stock)
    with scaled_updates(stack, 0.0):
        zero = stack.forward(ids)
    model = smollm.model
    with torch.no_grad():
        head = model.lm_head(model.model.norm(model.get_input_embeddings()(ids[None])))[0].float()
    assert torch.equal(zero, head)


def test_jvps_agree_with_finite_differences(smollm: ContinuousLM) -> None:
    stack = LayerStack(smollm.model)
    trace = stack.trace(PROMPTS[1].ids(smollm.tokenizer))
    g = torch.Generator().manual_seed(0)
    for layer in (3, 15, 29):
        call, h = trace.calls[layer], trace.h(layer)
        v = torch.randn(h.shape, generator=g) * trace.keep[None, :, None]
        v = v / v.norm() * h[0, trace.keep].norm()  # a direction of the size of the (kept) state
        exact = jvp(call.update, h, v)
        approx = finite_difference(call.update, h, v, step=1e-3)
        assert float((approx - exact).norm() / exact.norm()) < 1e-2


def test_perturbations_never_reach_earlier_positions(real_lm: ContinuousLM) -> None:
    stack = LayerStack(real_lm.model)
    trace = stack.trace(PROMPTS[2].ids(real_lm.tokenizer))
    for layer in (0, stack.n_layers // 2):
        out = propagate(stack, trace, layer=layer, position=10, eps=0.1)
        assert out["earlier"] == 0.0
        assert out["gain"][0] == pytest.approx(1.0, rel=1e-3)
        assert out["kl_last"] > 0


def test_small_depth_run_writes_its_run_directory(real_lm: ContinuousLM, tmp_path: Path) -> None:
    name = "smollm2-135m" if real_lm.family.name == "llama" else "gemma3-270m"
    out = tmp_path / name
    path = runner.run("depth", config=SMALL, model=name, lm=real_lm, items="physics", out=out, formats="png,pdf")
    assert path == out
    for file in ("config.json", "manifest.json", "results.json", "results.csv", "layers.csv", "summary.json", "items/physics.json"):
        assert (out / file).is_file(), file
    for stem in ("profile", "lipschitz", "propagation", "alpha", "half_steps", "items/physics"):
        for ext in (".png", ".pdf"):
            assert (out / "figures" / f"{stem}{ext}").stat().st_size > 1000, stem + ext
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_layers"] == LayerStack(real_lm.model).n_layers
    assert all(p["earlier_max_abs"] == 0.0 for p in summary["propagation"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["model"] == name
    # contllm report reads a depth run like any other: its headline numbers, no comparison figure.
    from contllm.rundir.report import write_report

    written = write_report([out], tmp_path / "report")
    assert sorted(p.name for p in written) == ["summary.csv", "summary.md"]
    md = (tmp_path / "report" / "summary.md").read_text()
    assert f"# depth: {name}" in md and "| run | model | experiment | items |" in md
    numbers = [k for k, v in summary.items() if isinstance(v, float)]
    assert numbers and all(k in md for k in numbers)
