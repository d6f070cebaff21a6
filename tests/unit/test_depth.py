"""Depth probes on tiny random models and on toy residual maps with known answers."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from contllm import ContinuousLM
from contllm.cli.commands import app
from contllm.core.families import decoder_layers, final_norm
from contllm.data import select_items
from contllm.depth import (
    PROMPTS,
    DepthConfig,
    DepthPrompt,
    DepthResult,
    LayerStack,
    depth_figure,
    depth_figures,
    finite_difference,
    fractional_depth,
    half_step_defects,
    half_steps,
    injected,
    jacobian_bounds,
    jvp,
    propagate,
    propagate_sizes,
    recording,
    replayed,
    run_depth,
    sampled_lipschitz,
    scaled_updates,
    seed_index,
    step_profile,
)
from contllm.depth.experiment import EXPERIMENT
from contllm.depth.figures import depth_finding
from contllm.errors import ExperimentError, RunDirectoryError
from contllm.rundir import runner
from contllm.rundir.files import csv_text
from contllm.rundir.runner import context_for
from tests.unit.readable import check_readable
from tests.unit.tiny import FAMILY_NAMES, backends, prompt, tiny_model

pytestmark = [
    pytest.mark.unit,
    # torch scripts its forward-mode decompositions the first time a JVP runs.
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
]

C = 0.3


class ToyLayer(torch.nn.Module):
    """A residual block whose update is f(h) = -c h: Φ(h) = h - c h."""

    def __init__(self, c: float) -> None:
        super().__init__()
        self.c = c

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return hidden_states - self.c * hidden_states


def toy_stack(c: float = C) -> LayerStack:
    """A tiny Llama in float64 whose three layers are ToyLayer(c)."""
    model = copy.deepcopy(tiny_model("llama")).double().eval()
    for i in range(len(model.model.layers)):
        model.model.layers[i] = ToyLayer(c)
    return LayerStack(model)


def stock_logits(stack: LayerStack, ids: torch.Tensor) -> torch.Tensor:
    return stack.forward(ids)


def no_hooks_left(stack: LayerStack) -> bool:
    modules = [*stack.layers, stack.norm]
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)


# ---------------------------------------------------------------------------- toy map f(h) = -c h


def test_toy_sampled_lipschitz_recovers_c() -> None:
    stack = toy_stack()
    trace = stack.trace(prompt(9))
    for layer, call in enumerate(trace.calls):
        for kind in ("orthogonal", "along"):
            for eps in (1e-3, 1e-1):
                est = sampled_lipschitz(call.update, trace.h(layer), eps=eps, samples=4, kind=kind, keep=trace.keep)
                assert est["L"] == pytest.approx(C, rel=1e-9)
                assert est["mu"] == pytest.approx(-C, rel=1e-9)


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_toy_jacobian_bounds_recover_c(method: str) -> None:
    stack = toy_stack()
    trace = stack.trace(prompt(9))
    for layer, call in enumerate(trace.calls):
        bounds = jacobian_bounds(call.update, trace.h(layer), iters=5, keep=trace.keep, method=method)
        assert bounds.sigma_max == pytest.approx(C, rel=1e-9)
        assert bounds.lambda_max == pytest.approx(-C, rel=1e-9)


def test_toy_perturbations_decay_as_one_minus_c_to_the_depth() -> None:
    stack = toy_stack()
    trace = stack.trace(prompt(9))
    for layer in range(stack.n_layers):
        out = propagate(stack, trace, layer=layer, position=4, eps=1e-2)
        depth = np.arange(stack.n_layers - layer + 1)
        np.testing.assert_allclose(out["gain"], (1 - C) ** depth, rtol=1e-9)
        np.testing.assert_allclose(out["spread"], (1 - C) ** depth, rtol=1e-9)
        np.testing.assert_allclose(out["relative"], np.ones_like(depth, dtype=float), rtol=1e-9)
        np.testing.assert_allclose(out["growth"], np.full(len(depth) - 1, math.log(1 - C)), rtol=1e-9)
        assert out["earlier"] == 0.0


def test_toy_half_step_defect_is_c_over_4() -> None:
    stack = toy_stack()
    trace = stack.trace(prompt(9))
    half = half_step_defects(stack, trace)
    np.testing.assert_allclose(half["defect"], np.full(stack.n_layers, C / 4), rtol=1e-9)
    np.testing.assert_allclose(half["defect_median"], np.full(stack.n_layers, C / 4), rtol=1e-9)


def test_toy_fractional_depth_scales_the_contraction() -> None:
    stack = toy_stack()
    ids = prompt(9)
    h0 = stack.trace(ids).states[0]
    for alpha in (0.0, 0.5, 1.5, 2.0):
        with scaled_updates(stack, alpha), recording(stack) as states:
            stack.forward(ids)
        torch.testing.assert_close(states[-1][0], (1 - alpha * C) ** stack.n_layers * h0, rtol=1e-12, atol=1e-12)


def test_toy_step_profile() -> None:
    stack = toy_stack()
    profile = step_profile(stack.trace(prompt(9)))
    np.testing.assert_allclose(profile["ratio"], C, rtol=1e-9)
    np.testing.assert_allclose(profile["curvature"], C, rtol=1e-9)  # f_{l+1} = (1 - c) f_l
    np.testing.assert_allclose(profile["cosine"], 1.0, rtol=1e-9)
    assert profile["ratio"].shape == (stack.n_layers, 8)  # the first position is left out


# ---------------------------------------------------------------------------- plain callables


def test_linear_map_against_numpy() -> None:
    """f(h) = h A^T per token: J is block diagonal with A; Lanczos is exact once iters >= dim."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 6, generator=g, dtype=torch.float64)
    h = torch.randn(1, 4, 6, generator=g, dtype=torch.float64)
    bounds = jacobian_bounds(lambda x: x @ a.T, h, iters=30)
    sym = 0.5 * (a + a.T)
    assert bounds.lambda_max == pytest.approx(float(torch.linalg.eigvalsh(sym).max()), rel=1e-9)
    assert bounds.sigma_max == pytest.approx(float(torch.linalg.matrix_norm(a, ord=2)), rel=1e-9)
    power = jacobian_bounds(lambda x: x @ a.T, h, iters=300, method="power")
    assert power.lambda_max == pytest.approx(bounds.lambda_max, rel=1e-3)
    assert power.sigma_max == pytest.approx(bounds.sigma_max, rel=1e-3)
    # Random secants lie between the smallest and largest eigenvalue of the symmetric part.
    est = sampled_lipschitz(lambda x: x @ a.T, h, eps=0.1, samples=16)
    assert est["mu"] <= bounds.lambda_max + 1e-9 and est["L"] <= bounds.sigma_max + 1e-9


@pytest.mark.parametrize("bad", [0.0, -1e-3, float("nan"), float("inf")])
def test_eps_must_be_positive(bad: float) -> None:
    h = torch.ones(1, 3, 4)
    with pytest.raises(ExperimentError, match="eps must be a positive number"):
        sampled_lipschitz(lambda x: -x, h, eps=bad)
    with pytest.raises(ExperimentError, match="eps must be (positive|a finite number)"):
        DepthConfig(eps=(1e-2, bad))


# ---------------------------------------------------------------------------- tiny real models


def real_stack(family: str, impl: str = "eager") -> LayerStack:
    return LayerStack(tiny_model(family, impl))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_layer_stack_reads_the_residual_stream(family: str) -> None:
    model = tiny_model(family, backends(family)[0])
    stack = LayerStack(model)
    assert stack.layers is decoder_layers(model) and stack.norm is final_norm(model)
    ids = prompt(7)
    trace = stack.trace(ids)
    assert trace.states.shape == (stack.n_layers + 1, 7, trace.states.shape[-1])
    with torch.no_grad():
        stock = model(ids[None], use_cache=False).logits[0]
    assert torch.equal(trace.logits, stock.float())
    for layer, call in enumerate(trace.calls):  # calling a layer again reproduces the forward
        with torch.no_grad():
            torch.testing.assert_close(call(trace.h(layer))[0], trace.states[layer + 1], rtol=1e-5, atol=1e-5)
    assert no_hooks_left(stack)


@pytest.mark.parametrize(
    "family,impl", [(f, "eager") for f in FAMILY_NAMES] + [("llama", "sdpa"), ("gemma3", "sdpa"), ("gpt2", "sdpa")]
)
def test_finite_differences_agree_with_jvps(family: str, impl: str) -> None:
    stack = real_stack(family, impl)
    trace = stack.trace(prompt(8))
    g = torch.Generator().manual_seed(0)
    for layer in (0, stack.n_layers - 1):
        call, h = trace.calls[layer], trace.h(layer)
        v = torch.randn(h.shape, generator=g) * trace.keep[None, :, None]
        v = v / v.norm() * h.norm()
        exact = jvp(call.update, h, v)
        approx = finite_difference(call.update, h, v, step=1e-3)
        assert float((approx - exact).norm() / exact.norm()) < 1e-2
        torch.testing.assert_close(approx, exact, rtol=1e-2, atol=1e-2 * float(exact.abs().max()))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_perturbation_leaves_earlier_positions_unchanged(family: str) -> None:
    stack = real_stack(family, backends(family)[-1])
    ids = prompt(9)
    trace = stack.trace(ids)
    for layer in (0, stack.n_layers - 1):
        out = propagate(stack, trace, layer=layer, position=5, eps=0.1)
        assert out["earlier"] == 0.0
        assert out["gain"][0] == pytest.approx(1.0, rel=1e-5)
        delta = torch.zeros_like(trace.states[0])
        delta[5] = 0.1 * trace.states[layer, 5]
        with injected(stack, layer, delta):
            logits = stack.forward(ids)
        assert torch.equal(logits[:5], trace.logits[:5])
        assert not torch.equal(logits[5:], trace.logits[5:])
    assert no_hooks_left(stack)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_alpha_one_is_bitwise_stock(family: str) -> None:
    stack = real_stack(family, backends(family)[-1])
    ids = prompt(8)
    stock = stock_logits(stack, ids)
    with scaled_updates(stack, 1.0):
        assert torch.equal(stack.forward(ids), stock)
    with scaled_updates(stack, {0: 1.0, -1: 1.0}):
        assert torch.equal(stack.forward(ids), stock)
    with scaled_updates(stack, 0.5):
        assert not torch.equal(stack.forward(ids), stock)
    assert torch.equal(stack.forward(ids), stock)
    assert no_hooks_left(stack)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_replaying_early_layers_changes_nothing(family: str) -> None:
    stack = real_stack(family, backends(family)[-1])
    ids = prompt(8)
    trace = stack.trace(ids)
    for upto in (1, stack.n_layers):
        with replayed(stack, trace, upto):
            assert torch.equal(stack.forward(ids), trace.logits)
    last = stack.n_layers - 1
    with scaled_updates(stack, {last: 0.5}):
        full = stack.forward(ids)
    with replayed(stack, trace, last), scaled_updates(stack, {last: 0.5}):
        assert torch.equal(stack.forward(ids), full)
    assert all("forward" not in vars(layer) for layer in stack.layers)
    assert torch.equal(stack.forward(ids), trace.logits)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_batched_rows_match_single_forwards(family: str) -> None:
    stack = real_stack(family, "sdpa")
    trace = stack.trace(prompt(8))
    batched = fractional_depth(stack, trace, [0.0, 0.5, 1.5, 2.0], layers=[1], rows=8)
    single = fractional_depth(stack, trace, [0.0, 0.5, 1.5, 2.0], layers=[1], rows=1)
    for target in ("all", "1"):
        for key in ("kl_last", "kl_mean", "entropy"):
            np.testing.assert_allclose(batched["curves"][target][key], single["curves"][target][key], rtol=1e-4, atol=1e-6)
    direction = torch.randn(trace.states.shape[-1], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for record in propagate_sizes(stack, trace, layer=1, position=4, eps=[1e-2, 1e-1], direction=direction):
        alone = propagate(stack, trace, layer=1, position=4, eps=record["eps"], direction=direction)
        np.testing.assert_allclose(record["gain"], alone["gain"], rtol=1e-3)
        assert record["earlier"] == 0.0
    with scaled_updates(stack, {1: [1.0, 1.0]}):  # all ones: nothing is patched
        assert no_hooks_left(stack)


def test_alpha_zero_everywhere_is_the_head_on_the_normed_embeddings() -> None:
    model = tiny_model("llama", "sdpa")
    stack = LayerStack(model)
    ids = prompt(8)
    with scaled_updates(stack, 0.0):
        logits = stack.forward(ids)
    with torch.no_grad():
        expected = model.lm_head(model.model.norm(model.model.embed_tokens(ids[None])))[0]
    assert torch.equal(logits, expected.float())


def test_half_steps_change_the_output_and_restore_the_model() -> None:
    stack = real_stack("llama")
    ids = prompt(8)
    stock = stock_logits(stack, ids)
    with half_steps(stack):
        split = stack.forward(ids)
    assert not torch.equal(split, stock)
    assert torch.equal(stack.forward(ids), stock)
    half = half_step_defects(stack, stack.trace(ids))
    assert half["defect"].shape == (stack.n_layers,) and np.all(half["defect"] > 0)
    assert half["kl_all_last"] > 0 and half["kl_layer_last"].shape == (stack.n_layers,)


def test_patches_are_removed_when_the_body_raises() -> None:
    stack = real_stack("llama")
    ids = prompt(8)
    stock = stock_logits(stack, ids)
    for context in (
        lambda: scaled_updates(stack, 0.3),
        lambda: half_steps(stack, [1]),
        lambda: injected(stack, 1, torch.ones(8, 64)),
        lambda: recording(stack),
        lambda: replayed(stack, stack.trace(ids), 2),
    ):
        with pytest.raises(RuntimeError, match="boom"):
            with context():
                stack.forward(ids)
                raise RuntimeError("boom")
        assert no_hooks_left(stack)
        assert all("forward" not in vars(layer) for layer in stack.layers)
        assert torch.equal(stack.forward(ids), stock)


def test_probes_leave_the_model_stock() -> None:
    stack = real_stack("gemma3")
    ids = prompt(8)
    stock = stock_logits(stack, ids)
    config = DepthConfig(layer=(0, -1), eps=(1e-2,), alphas=(0.0, 2.0), samples=2, iters=3)
    run_depth(stack.model, config, prompts=[DepthPrompt("p", token_ids=tuple(ids.tolist()))])
    assert no_hooks_left(stack)
    assert torch.equal(stack.forward(ids), stock)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("alpha", [-0.1, 2.5, float("nan")])
def test_alpha_out_of_range(alpha: float) -> None:
    stack = real_stack("llama")
    with pytest.raises(ExperimentError, match="alpha must lie in"):
        with scaled_updates(stack, alpha):
            pass
    with pytest.raises(ExperimentError, match="alpha must lie in|alphas must be a finite number"):
        DepthConfig(alphas=(0.0, alpha))
    assert no_hooks_left(stack)


def test_layer_outside_the_model() -> None:
    stack = real_stack("llama")
    with pytest.raises(ExperimentError, match="layer 3 is outside the model; it has 3 layers"):
        with scaled_updates(stack, {3: 0.5}):
            pass
    with pytest.raises(ExperimentError, match="layer -4 is outside the model"):
        DepthConfig(layer=(0, -4)).resolved_layers(3)
    with pytest.raises(ExperimentError, match="outside the model"):
        propagate(stack, stack.trace(prompt(5)), layer=7, position=2, eps=0.1)
    assert DepthConfig(layer=(0, -1, 2)).resolved_layers(3) == [0, 2]
    assert DepthConfig().resolved_layers(30) == [0, 7, 15, 22, 29]


def test_option_parsing() -> None:
    assert DepthConfig(alphas="0,0.5,2").alphas == (0.0, 0.5, 1.0, 2.0)
    with pytest.raises(ExperimentError, match="eps must be a number, got 'small'"):
        DepthConfig(eps="small")
    config = EXPERIMENT.config({"layer": "0,-1", "eps": "1e-2", "alphas": "0,2"})
    assert config == DepthConfig(layer=(0, -1), eps=(1e-2,), alphas=(0.0, 2.0))
    assert EXPERIMENT.config() == DepthConfig()
    assert [o.cli_flag for o in EXPERIMENT.options] == ["--layer", "--eps", "--alphas"]
    with pytest.raises(ExperimentError, match="--samples do not apply to the depth experiment"):
        EXPERIMENT.config({"samples": "3"})
    items = EXPERIMENT.items(config)
    assert [p.id for p in items] == ["story", "physics", "code"] and list(items) == list(PROMPTS)
    with pytest.raises(ExperimentError, match="unknown item id 'nope'"):
        select_items(items, "story,nope")
    assert [p.id for p in select_items(items, "2")] == ["story", "physics"]
    data = EXPERIMENT.config_dict(DepthConfig(layer=(0, -1)))
    assert data["layer"] == [0, -1] and "seed" not in data and json.loads(json.dumps(data)) == data


# ---------------------------------------------------------------------------- results and the command

SMALL = DepthConfig(layer=(0, -1), eps=(1e-2, 1e-1), alphas=(0.0, 0.5, 2.0), samples=2, iters=3)
TINY_PROMPTS = [DepthPrompt("a", token_ids=tuple(prompt(9).tolist())), DepthPrompt("b", token_ids=tuple(prompt(7, 1).tolist()))]


def test_result_round_trips_tabulates_and_draws() -> None:
    import matplotlib.pyplot as plt

    result = run_depth(ContinuousLM(tiny_model("qwen2", "sdpa")), SMALL, prompts=TINY_PROMPTS, model_name="tiny")
    assert isinstance(result, DepthResult) and [r.id for r in result.records] == ["a", "b"]
    summary = result.summary()
    assert summary["n_layers"] == 3 and all(p["earlier_max_abs"] == 0.0 for p in summary["propagation"])
    assert EXPERIMENT.summary(result) == summary
    again = EXPERIMENT.load_result(json.loads(json.dumps(result.to_dict())))
    assert again.summary() == summary and again.to_dict() == result.to_dict()
    tables = EXPERIMENT.tables(result)
    assert set(tables) == {"results", "layers"}
    assert csv_text(*tables["results"]).splitlines()[0] == "prompt,probe,quantity,target,layer,x,value"
    layers = csv_text(*tables["layers"]).splitlines()
    assert layers[0].startswith("layer,ratio_median,") and len(layers) == 1 + result.n_layers
    assert ",," in layers[-1]  # the last layer has no curvature: an empty cell, not "nan"
    for name in ("summary", "profile", "lipschitz", "propagation", "alpha", "half_steps", "readout"):
        fig = depth_figure(result, name, prompt="b")
        assert fig.axes
        plt.close(fig)
    names = []
    for name, fig in EXPERIMENT.figures(result, per_item=True):
        names.append(name)
        plt.close(fig)
    assert names == ["summary", "profile", "lipschitz", "propagation", "alpha", "half_steps", "items/a", "items/b"]
    fig = depth_figure(result)  # the summary: what a newcomer sees first
    try:
        assert check_readable(fig) == depth_finding(result)[0]
    finally:
        plt.close(fig)
    assert [name for name, fig in depth_figures(result, per_item=False) if plt.close(fig) is None][-1] == "half_steps"
    with pytest.raises(ExperimentError, match="unknown depth figure"):
        depth_figure(result, "nope")
    with pytest.raises(ExperimentError, match="no prompt 'c'"):
        depth_figure(result, "readout", prompt="c")


def test_seeds_do_not_depend_on_which_prompts_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EXPERIMENT, "items", lambda config: TINY_PROMPTS)
    lm = ContinuousLM(tiny_model("llama", "sdpa"))

    def numbers(record: object) -> dict:
        data = EXPERIMENT.encode(record)
        data.pop("seconds")
        return data

    full = dict(EXPERIMENT.run(lm, SMALL, TINY_PROMPTS, context_for(lm, seed=0)))
    alone = dict(EXPERIMENT.run(lm, SMALL, TINY_PROMPTS[1:], context_for(lm, seed=0)))
    assert list(full) == ["a", "b"] and list(alone) == ["b"]
    assert numbers(alone["b"]) == numbers(full["b"])
    reseeded = dict(EXPERIMENT.run(lm, SMALL, TINY_PROMPTS[1:], context_for(lm, seed=1)))
    assert numbers(reseeded["b"])["lipschitz"] != numbers(full["b"])["lipschitz"]
    # The Python API gives the numbers a default run gives.
    api = run_depth(lm, SMALL, prompts=TINY_PROMPTS, seed=0)
    assert [numbers(r) for r in api.records] == [numbers(full["a"]), numbers(full["b"])]
    assert numbers(EXPERIMENT.decode(json.loads(json.dumps(EXPERIMENT.encode(full["a"]))))) == numbers(full["a"])
    assert seed_index(PROMPTS[2], 0) == 2 and seed_index(TINY_PROMPTS[1], 1) == 1


def test_check_names_layers_outside_the_model() -> None:
    lm = ContinuousLM(tiny_model("llama", "sdpa"))
    EXPERIMENT.check(lm, SMALL)
    with pytest.raises(ExperimentError, match="layer 5 is outside the model; it has 3 layers"):
        EXPERIMENT.check(lm, DepthConfig(layer=(0, 5)))


def run_tiny(out: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> Path:
    monkeypatch.setattr(EXPERIMENT, "items", lambda config: TINY_PROMPTS)
    lm = ContinuousLM(tiny_model("llama", "sdpa"))
    return runner.run("depth", config=SMALL, model="tiny-llama", lm=lm, out=out, **options)


def test_runner_writes_a_depth_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert run_tiny(out, monkeypatch, formats="png,pdf") == out
    for name in ("config.json", "manifest.json", "results.json", "results.csv", "layers.csv", "summary.json",
                 "items/a.json", "items/b.json"):
        assert (out / name).is_file(), name
    for stem in ("profile", "lipschitz", "propagation", "alpha", "half_steps", "items/a", "items/b"):
        for ext in (".png", ".pdf"):
            assert (out / "figures" / f"{stem}{ext}").stat().st_size > 1000, stem + ext
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"
    config = json.loads((out / "config.json").read_text())
    assert config["experiment"] == "depth" and config["seed"] == 0
    assert config["options"]["layer"] == [0, -1] and "seed" not in config["options"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == ["a", "b"] and summary["n_layers"] == 3
    assert set(summary["metrics"]) == {m.name for m in EXPERIMENT.metrics}
    assert all(np.isfinite(summary[m.name]) for m in EXPERIMENT.metrics)
    assert (out / "results.csv").read_text().splitlines()[0] == "prompt,probe,quantity,target,layer,x,value,experiment,model"
    with pytest.raises(RunDirectoryError, match="already holds a run; use --resume"):
        run_tiny(out, monkeypatch)


@pytest.mark.slow
def test_runner_resumes_a_depth_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    run_tiny(out, monkeypatch, item_figures=False)
    first = json.loads((out / "results.json").read_text())
    # A resumed run reuses the records on disk.
    saved = json.loads((out / "items/a.json").read_text())
    saved["record"]["seconds"] = 12345.0
    (out / "items/a.json").write_text(json.dumps(saved))
    (out / "items/b.json").write_text("{ truncated")
    run_tiny(out, monkeypatch, item_figures=False, resume=True)
    again = json.loads((out / "results.json").read_text())
    assert again["records"][0]["seconds"] == 12345.0  # reused
    assert again["records"][1]["seconds"] != 12345.0 and json.loads((out / "items/b.json").read_text())["id"] == "b"
    # The recomputed prompt has the numbers it had in the first run.
    for record in (first["records"][1], again["records"][1]):
        record.pop("seconds")
    assert again["records"][1] == first["records"][1]


def test_runner_checks_depth_layers_before_writing(tmp_path: Path) -> None:
    lm = ContinuousLM(tiny_model("llama", "sdpa"))
    with pytest.raises(ExperimentError, match="layer 5 is outside the model"):
        runner.run("depth", options={"layer": "0,5"}, model="tiny", lm=lm, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--alphas", "0,2.5"], "alpha must lie in [0, 2], got 2.5"),
        (["--alphas", "x"], "--alphas must be a number, got 'x'"),
        (["--eps", "0"], "eps must be positive, got 0"),
        (["--eps", "1e-2,-1"], "eps must be positive, got -1"),
        (["--layer", "a"], "--layer must be an integer, got 'a'"),
        (["--samples", "3"], "option(s) --samples do not apply to the depth experiment"),
        (["--items", "nope"], "unknown item id 'nope'"),
    ],
)
def test_cli_bad_depth_options(args: list[str], needle: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "depth", *args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output
    assert not (tmp_path / "run").exists()


def test_cli_depth_options_belong_to_depth(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "counting", "--eps", "0.1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "option(s) --eps do not apply to the counting experiment" in result.output
    assert not (tmp_path / "run").exists()
