"""Duration attribution on tiny random models: completeness, causality, occlusion, the experiment and its files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, ExperimentError, registry
from contllm.attribution import Readout, attribute, differentiable_rotary, gauss_legendre_log, occlusion
from contllm.attribution.path import _no_grad_wrapped
from contllm.core.readout import TokenSets
from contllm.core.signal import Signal
from contllm.data import load_counting
from contllm.errors import SignalError
from contllm.experiments.attribution import EXPERIMENT, AttributionResult, ItemAttribution, line_start
from contllm.experiments.counting import SHOTS
from contllm.lm import wrap
from tests.unit.tiny import prompt, random_durations, tiny_model, tiny_model64, word_level_tokenizer

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

#: Four labels over a 97-token vocabulary; "expectation" makes them a count 0..3.
SETS = TokenSets(tuple("0123"), ((5, 6), (7,), (8, 9), (10,)))


@pytest.fixture(scope="module")
def lm64() -> ContinuousLM:
    return wrap(tiny_model64("llama"))


def random_signal(n: int = 12) -> Signal:
    return Signal.from_ids(prompt(n, seed=3), random_durations(n, seed=4))


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_attributions_over_all_but_the_first_token_sum_to_the_change_at_256_steps(family: str) -> None:
    lm = wrap(tiny_model64(family))
    found = attribute(lm, random_signal(), Readout.expectation(SETS), steps=256)
    assert found.tokens == list(range(1, 12)) and found.baseline != found.full
    assert abs(found.remainder) <= 1e-5 * abs(found.total) and found.smallest > 1e-12
    assert found.completeness_error <= 1e-4, found.completeness_error


def test_a_token_alone_gets_exactly_its_occlusion(lm64: ContinuousLM) -> None:
    signal = random_signal()
    readout = Readout.label(SETS, "2", log=True)
    full, changes = occlusion(lm64, signal, readout, [4, 9], factors=(0.0, 0.5))
    for k, j in enumerate([4, 9]):
        found = attribute(lm64, signal, readout, [j], steps=256)
        assert found.meta["prefix"] == j and found.full == pytest.approx(full, abs=1e-6)  # the engine reads float32 probabilities
        # one token: completeness says its attribution is f(full) - f(without it), i.e. its occlusion
        assert float(found.attributions[0]) == pytest.approx(float(changes[0, k]), rel=1e-4, abs=1e-7)
    assert np.all(np.abs(changes[1]) < np.abs(changes[0]) * 1.5 + 1e-9)  # halving moves f, like deleting


def test_a_token_the_read_position_cannot_see_gets_exactly_zero(lm64: ContinuousLM) -> None:
    n = 10
    times = torch.arange(n, dtype=torch.float64)
    times[3] = 20.0  # token 3 comes later in time than every other token, the read one included
    signal = Signal.from_ids(prompt(n, seed=5), random_durations(n, seed=6), times=times)
    found = attribute(lm64, signal, Readout.expectation(SETS), steps=32)
    assert found.attributions[found.tokens.index(3)] == 0.0
    assert np.count_nonzero(found.attributions) == n - 2
    # read in the middle: every later token is unseen
    middle = attribute(lm64, random_signal(), Readout.expectation(SETS), position=5, steps=32)
    later = np.array(middle.tokens) > 5
    assert np.all(middle.attributions[later] == 0.0) and np.all(middle.attributions[~later] != 0.0)


def test_the_rotary_patch_lets_gradients_reach_positions_and_is_undone() -> None:
    model = tiny_model("llama")
    rotary = model.model.rotary_emb
    x = torch.zeros(1, 3, 4)
    positions = torch.tensor([[0.0, 1.5, 2.0]], requires_grad=True)
    # Some transformers versions decorate the rotary forward with torch.no_grad(), others do not:
    # where it is decorated, the stock forward cuts the gradient and the patch switches one module.
    decorated = _no_grad_wrapped(type(rotary).forward) is not None
    assert (rotary(x, positions)[0].grad_fn is None) == decorated
    with differentiable_rotary(model) as switched:
        assert switched == int(decorated)
        cos, _ = rotary(x, positions)
        (grad,) = torch.autograd.grad(cos.sum(), positions)
        assert grad.abs().sum() > 0
    assert "forward" not in vars(rotary) and (rotary(x, positions)[0].grad_fn is None) == decorated
    # A no_grad-decorated forward (as other versions have) is switched for its undecorated self, and back.
    stock = type(rotary)
    plain = _no_grad_wrapped(stock.forward) or stock.forward
    rotary.__class__ = type("NoGradRotaryEmbedding", (stock,), {"forward": torch.no_grad()(plain)})
    try:
        assert rotary(x, positions)[0].grad_fn is None
        with differentiable_rotary(model) as switched:
            assert switched == 1 and rotary(x, positions)[0].grad_fn is not None
        assert "forward" not in vars(rotary) and rotary(x, positions)[0].grad_fn is None
    finally:
        rotary.__class__ = stock
    with pytest.raises(RuntimeError, match="boom"), differentiable_rotary(model):
        raise RuntimeError("boom")
    assert "forward" not in vars(rotary)
    attribute(wrap(model), random_signal(), Readout.expectation(SETS), steps=16)
    assert "forward" not in vars(rotary) and all(p.requires_grad for p in model.parameters())


def test_read_outs_agree_from_logits_and_from_probabilities() -> None:
    logits = torch.randn(3, 97, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
    probs = torch.softmax(logits, -1)
    for readout in (Readout.expectation(SETS), Readout.label(SETS, "1"), Readout.label(SETS, "1", log=True),
                    Readout.tokens([5, 7]), Readout.tokens(7, log=True)):
        assert np.allclose(readout.from_logits(logits).numpy(), readout.from_probs(probs), atol=1e-10)
    p = SETS.gather(probs).numpy()
    assert np.allclose(Readout.expectation(SETS).from_probs(probs), p @ np.arange(4) / p.sum(1))
    with pytest.raises(SignalError, match="no label"):
        Readout.label(SETS, "7")


def test_placed_panels_crowd_a_sharp_step_found_without_gradients() -> None:
    from contllm.attribution.quadrature import curve, panel_edges

    calls: list[int] = []

    def step(tau: np.ndarray) -> np.ndarray:  # f(s) = tanh((s + 1) / 0.02): a step at s = -1, flat elsewhere
        calls.append(len(tau))
        return np.tanh((np.log(tau) + 1) / 0.02)

    s, f = curve(step, -12.0, 1e-6, budget=400)
    assert sum(calls) == len(s) <= 400 and np.all(np.diff(s) > 0) and s[0] == -12.0 and s[-1] == 0.0
    assert np.diff(s)[np.abs(s[:-1] + 1) < 0.05].max() < 0.05 < np.diff(s).max()  # samples crowd the step
    edges = panel_edges(s, f, 8)
    assert edges[0] == -12.0 and edges[-1] == 0.0 and np.all(np.diff(edges) > 0)
    widths = np.diff(edges)
    k = int(np.searchsorted(edges, -1.0)) - 1
    assert widths[k] < 0.2 and widths[k] < widths.max() / 20  # the step's panel is narrow, the flat ones wide
    # the placed 8-node panels integrate the step's slope where one Gauss-Legendre rule of 64 nodes does not
    x, w = np.polynomial.legendre.leggauss(8)
    lo, hi = edges[:-1, None], edges[1:, None]
    nodes, weights = (lo + (hi - lo) * (x + 1) / 2).ravel(), (w * (hi - lo) / 2).ravel()
    slope = lambda v: (1 - np.tanh((v + 1) / 0.02) ** 2) / 0.02  # noqa: E731
    exact = np.tanh(1 / 0.02) - np.tanh(-11 / 0.02)
    tau, w64 = gauss_legendre_log(64, float(np.exp(-12.0)))
    placed, single = abs(weights @ slope(nodes) - exact), abs(w64 @ slope(np.log(tau)) - exact)
    assert placed < 1e-2 and placed < single / 100, (placed, single)


def test_the_placed_rule_keeps_completeness_and_counts_its_forwards(lm64: ContinuousLM) -> None:
    found = attribute(lm64, random_signal(), Readout.expectation(SETS), steps=256, rule="placed")
    assert found.meta["panels"] >= 1 and 1 <= found.meta["gradients"] <= 256 and found.meta["forwards"] >= 33
    assert found.completeness_error <= 1e-4, found.completeness_error


def test_a_small_memory_budget_chunks_the_path_and_changes_no_attribution(lm64: ContinuousLM) -> None:
    from contllm.attribution.path import DurationPath, row_bytes

    signal, readout = random_signal(), Readout.expectation(SETS)
    # A differentiated row keeps every layer's activations; without gradients only the KV cache stays.
    assert row_bytes(lm64, 11, 12, gradients=True) > row_bytes(lm64, 11, 12, gradients=False) > 0
    assert row_bytes(lm64, 11, 24, gradients=True) > row_bytes(lm64, 11, 12, gradients=True)
    one_row = 2 * row_bytes(lm64, 11, 12, gradients=True) - 1
    path = DurationPath(lm64, signal, readout, list(range(1, 12)), 11, None, max_batch_bytes=one_row)
    assert path.rows == 1 and path.value_rows >= 2
    assert DurationPath(lm64, signal, readout, list(range(1, 12)), 11, 33, max_batch_bytes=1 << 40).rows == 3

    batches: list[tuple[int, bool]] = []

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        batches.append((int(kwargs["inputs_embeds"].shape[0]), torch.is_grad_enabled()))

    hook = lm64.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        small = attribute(lm64, signal, readout, steps=16, rule="gauss", max_batch_bytes=one_row)
        sizes = {grad: max(b for b, g in batches if g == grad) for grad in (True, False)}
        assert sizes[True] == 1 and 1 < sizes[False] <= path.value_rows  # one tau per differentiated forward
        batches.clear()
        big = attribute(lm64, signal, readout, steps=16, rule="gauss", max_batch_bytes=1 << 40)
        assert max(b for b, g in batches if g) == 16  # every node in one forward
    finally:
        hook.remove()
    # Other chunks sum in another order: the same numbers to float64 rounding.
    assert small.meta == big.meta and small.smallest == big.smallest
    assert small.full == pytest.approx(big.full, rel=1e-13) and small.baseline == pytest.approx(big.baseline, rel=1e-13)
    assert np.allclose(small.attributions, big.attributions, rtol=1e-10, atol=1e-13)
    with pytest.raises(SignalError, match="max_batch_bytes"):
        attribute(lm64, signal, readout, max_batch_bytes=0)


def test_the_path_keeps_no_graph_and_occlusion_builds_none(lm64: ContinuousLM) -> None:
    import gc
    import weakref

    from contllm.attribution.path import DurationPath

    signal, readout = random_signal(), Readout.expectation(SETS)
    path = DurationPath(lm64, signal, readout, list(range(1, 12)), 11, None, max_batch_bytes=1)  # one tau a forward
    gate = lm64.model.model.layers[0].mlp.gate_proj  # its output is saved for the backward (by SiLU)
    outputs: list[weakref.ref] = []
    alive_at_start: list[int] = []

    def keep(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        alive_at_start.append(sum(ref() is not None for ref in outputs))
        outputs.append(weakref.ref(output))

    hook = gate.register_forward_hook(keep)
    try:
        taus = np.exp(np.linspace(-4, 0, 5))
        values = path.values(taus)
        grads = path.gradients(taus)
    finally:
        hook.remove()
    gc.collect()
    # The prefix once, then 5 forwards without and 5 with gradients: each chunk's activations were
    # gone before the next chunk ran, and none outlives the call.
    assert len(outputs) == 11 and alive_at_start == [0] * 11
    assert all(ref() is None for ref in outputs)
    assert isinstance(values, np.ndarray) and isinstance(grads, np.ndarray) and grads.shape == (5, 11)
    assert path._context is not None and all(
        not t.requires_grad for layer_cache in path._context[0].layers for t in (layer_cache.keys, layer_cache.values)
    )
    assert all(p.requires_grad for p in lm64.model.parameters())  # frozen only while the path ran

    def evaluate(batch: list[Signal]) -> torch.Tensor:
        assert not torch.is_grad_enabled()
        return lm64.probs(batch)  # type: ignore[return-value]

    with torch.enable_grad():
        occlusion(lm64, signal, readout, [3, 4], evaluate=evaluate)


def test_the_log_tau_rule_integrates_exactly_where_it_should() -> None:
    tau, w = gauss_legendre_log(16, 1e-6)
    assert np.all((tau > 1e-6) & (tau < 1)) and w.sum() == pytest.approx(-np.log(1e-6))
    assert w @ tau == pytest.approx(1 - 1e-6)  # the integral of d tau = tau d(log tau)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"steps": 0}, "steps must be an integer"),
        ({"floor": 1.0}, "floor must be 0"),
        ({"tokens": [3, 3]}, "repeat"),
        ({"tokens": [40]}, "outside a signal"),
        ({"tokens": list(range(12))}, "baseline is undefined"),
        ({"rule": "simpson"}, "rule must be one of"),
        ({"position": 12}, "position must be"),
    ],
)
def test_bad_arguments_raise_before_anything_runs(lm64: ContinuousLM, kwargs: dict, needle: str) -> None:
    with pytest.raises(SignalError, match=needle):
        attribute(lm64, random_signal(), Readout.expectation(SETS), **kwargs)


def test_a_sliding_window_keeps_completeness_only_where_no_key_crosses_its_edge() -> None:
    """A window in time is a sharp edge: a key that enters it along the path makes f jump, which no gradient sees."""
    lm = wrap(tiny_model64("gemma3"))  # local layers with a window of 4 time units
    short = Signal.from_ids(prompt(8, seed=3), torch.full((8,), 0.5, dtype=torch.float64))
    inside = attribute(lm, short, Readout.expectation(SETS), steps=256)
    assert inside.meta["window_crossings"] == 0 and inside.completeness_error <= 1e-4
    crossed = attribute(lm, random_signal(), Readout.expectation(SETS), steps=256)
    assert crossed.meta["window_crossings"] > 0 and crossed.completeness_error > 1e-2


# ------------------------------------------------------------------------------ the experiment
def word_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level: the few-shot words, the first counting words, the digits and the prompt's punctuation."""
    words = [w for w, _ in SHOTS] + [item.word for item in load_counting()[:4]] + ["contains", "words", '"', "."]
    vocab = ["<unk>"] + list(dict.fromkeys(words + [str(k) for k in range(10)]))
    return word_level_tokenizer(vocab)


OPTIONS = {"steps": "16", "first": "2"}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from contllm.rundir.runner import run

    lm = ContinuousLM(tiny_model("llama"), word_tokenizer())
    return run("attribution", options=OPTIONS, lm=lm, model="tiny-llama", out=tmp_path_factory.mktemp("attr") / "run",
               formats="png,pdf")


def test_a_run_writes_tables_summary_figures_and_html(full_run: Path) -> None:
    result = AttributionResult.from_dict(json.loads((full_run / "results.json").read_text()))
    assert [r.item_id for r in result.items] == ["count-001", "count-002"]
    record = result.items[0]
    # the item line: '"', the words, '"', 'contains' (the word-level tokenizer drops spaces)
    assert [record.piece(j) for j in record.tokens] == ['"', "apple", "apple", '"', "contains"]
    assert [record.piece(j) for j in record.span] == ["apple", "apple"]
    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["items"] == 2 and summary["max_completeness_error"] == max(r.completeness_error for r in result.items)
    assert 0 <= summary["mean_precision_attribution"] <= 1 and record.chance() == pytest.approx(2 / 5)
    assert summary["mean_chance"] == pytest.approx(np.mean([r.chance() for r in result.items]))
    assert (full_run / "results.csv").read_text().startswith("item,index,token,in_span,attribution,occlusion,shrink")
    assert len((full_run / "items.csv").read_text().splitlines()) == 3
    for name in ("summary.png", "items/count-001.png", "items/count-001.pdf", "items/count-002.html"):
        assert (full_run / "figures" / name).is_file()
    page = (full_run / "figures" / "items" / "count-001.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "&quot;" in page and "<script" not in page


def test_records_round_trip_and_rank_the_span() -> None:
    record = ItemAttribution(
        "x", "E[k]", "a b c d", [(0, 1), (2, 3), (4, 5), (6, 7)], [1, 2, 3], np.array([0.5, -0.1, 2.0]),
        np.array([0.1, 0.2, 0.3]), np.array([0.0, 0.1, 0.0]), [1, 3], 2.0, 0.0, 0.0, 16, 0.0,
    )
    assert record.precision(record.attribution) == 1.0 and record.precision(record.occlusion) == 0.5
    assert record.chance() == pytest.approx(2 / 3) and record.completeness_abs == pytest.approx(0.4)
    again = ItemAttribution.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again.tokens == record.tokens and np.array_equal(again.attribution, record.attribution)
    with pytest.raises(ExperimentError, match="malformed attribution record"):
        ItemAttribution.from_dict({**record.to_dict(), "shrink": [0.0]})
    assert line_start("ab\ncd", [(0, 1), (1, 2), (3, 4), (4, 5)], 4) == 2


def test_the_experiment_is_registered_and_selects_items() -> None:
    assert registry.get("attribution") is EXPERIMENT and EXPERIMENT.engine
    assert [i.id for i in EXPERIMENT.items(EXPERIMENT.config())] == [f"count-00{k}" for k in range(1, 9)]
    assert len(EXPERIMENT.items(EXPERIMENT.config({"first": "0"}))) == 130
    assert EXPERIMENT.items(EXPERIMENT.config({"dataset": "events", "first": "1"}))[0].id == "story-001"


def test_resume_recomputes_only_the_lost_item(full_run: Path, tmp_path: Path) -> None:
    import shutil

    from contllm.rundir.runner import run

    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    kept = (out / "items" / "count-001.json").stat().st_mtime_ns
    (out / "items" / "count-002.json").unlink()
    lm = ContinuousLM(tiny_model("llama"), word_tokenizer())
    run("attribution", options=OPTIONS, lm=lm, model="tiny-llama", out=out, resume=True)
    assert (out / "items" / "count-001.json").stat().st_mtime_ns == kept
    before = json.loads((full_run / "results.json").read_text())["items"][1]
    after = json.loads((out / "results.json").read_text())["items"][1]
    assert np.allclose(after["attribution"], before["attribution"], atol=1e-6) and after["tokens"] == before["tokens"]
