"""Inside the model on SmolLM2: a continuous input inside a real nnsight trace, and the patching, lens and
attention-mass experiments end to end (run, resume, report)."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from contllm import ContinuousLM, wrap

pytestmark = pytest.mark.integration

HAS_NNSIGHT = importlib.util.find_spec("nnsight") is not None


@pytest.mark.skipif(not HAS_NNSIGHT, reason="nnsight is not installed (pip install 'contllm[nnsight]')")
def test_a_continuous_input_inside_an_nnsight_trace_gives_contllms_activations_and_logits(smollm: ContinuousLM) -> None:
    import nnsight

    # nnsight replaces the forward of every module of the model it wraps, for good: wrap a copy.
    lm = wrap(copy.deepcopy(smollm.model), smollm.tokenizer)
    base = lm.signal('"apple apple apple apple" contains ')
    words = base.token_indices([(1, 24)])
    signals = [base.scale_tokens(words, 0.4), base]
    inputs = lm.forward_kwargs(signals)
    traced = nnsight.TransformersModel(lm.model, tokenizer=lm.tokenizer)
    with inputs.context(), torch.no_grad(), traced.trace(**inputs):
        attn = traced.model.layers[3].self_attn.output[0].save()
        resid = traced.model.layers[5].output.save()
        logits = traced.output.logits.save()
    names = ["blocks.3.hook_attn_out", "blocks.5.hook_resid_post"]
    cache = smollm.run_with_cache(signals, names=names)
    for b, s in enumerate(signals):
        columns = inputs.columns(0)[b] + torch.arange(len(s))
        assert torch.equal(attn[b, columns], cache.rows(names[0])[b])
        assert torch.equal(resid[b, columns], cache.rows(names[1])[b])
        assert torch.equal(logits[b, columns], cache.logits[b])
    # The scaled words moved the count: the two rows differ where it is read.
    assert float((logits[0, -1] - logits[1, -1]).abs().max()) > 0.1
    assert float((logits[:, -1] - smollm.logits(signals)).abs().max()) <= 1e-4


def test_patching_lens_and_attention_mass_run_resume_and_report(smollm: ContinuousLM, tmp_path) -> None:
    import json

    from contllm.report import write_report
    from contllm.runner import run

    settings = {
        "patching": {"heads": False},
        "lens": {"samples": "3"},
        "attention-mass": {"samples": "3"},
    }
    summaries = {}
    for name, options in settings.items():
        out = tmp_path / name
        run(name, options=options, lm=smollm, model="smollm2-135m", items="2", out=out, item_figures=False)
        first = (out / "results.json").read_text()
        # Resumed with every record there: nothing is recomputed and the results are the same.
        run(name, options=options, lm=smollm, model="smollm2-135m", items="2", out=out, item_figures=False,
            resume=True)
        assert (out / "results.json").read_text() == first
        assert (out / "figures" / "summary.png").stat().st_size > 1000
        summaries[name] = json.loads((out / "summary.json").read_text())
        assert summaries[name]["items"] == 2
        paths = write_report([out], tmp_path / f"report-{name}")
        assert any(p.name == "summary.md" for p in paths)
    patching = summaries["patching"]
    # Acceptance: a run patched with its own activations is unchanged, and the c = 1 run's last-layer
    # residual at every position gives the c = 1 output, both exactly.
    assert patching["self_patch_max_dp"] == 0.0 and patching["last_layer_max_dp"] == 0.0
    assert patching["mean_change"] > 0.1  # shrinking the word lowers the implied count
    assert summaries["lens"]["lens_max_dp"] <= 1e-4  # the last layer's lens is the model's output
    assert summaries["lens"]["output_spearman"] > 0.5
    assert 0.0 <= summaries["attention-mass"]["share_following"] <= 1.0
