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
