"""benchmarks/main_job.py on a tiny random model: its four lines, and a record that docs/quotes.py reads."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
WORDS = ["<unk>", "<s>", "</s>", '"', ".", "contains", "words", *"0123456789", "cat", "dog", "apple"]


@pytest.fixture(scope="module")
def main_job() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import one another as scripts do
    try:
        return importlib.import_module("main_job")
    finally:
        sys.path.remove(str(BENCHMARKS))


def tiny_directory(path: Path) -> Path:
    """A tiny random Llama whose word-level vocabulary holds the digits and the few-shot prompt's words."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    tf.LlamaForCausalLM(config).eval().save_pretrained(path)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    return path


def test_main_job_prints_its_four_lines_and_records_what_the_pages_quote(
    main_job: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_directory(tmp_path / "tiny")
    record = tmp_path / "main_job.json"
    assert main_job.main(["--model", str(model), "--items", "3", "--record", str(record)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for start in ("end to end ", "evaluation ", "overhead: ", "efficiency: "):
        assert sum(line.startswith(start) for line in lines) == 1, (start, lines)
    data = json.loads(record.read_text())
    assert data["items"] == 3 and data["model"] == str(model) and data["cache"].startswith("warm")
    assert data["seconds"]["evaluation"] > 0 and data["seconds"]["end_to_end"] >= data["seconds"]["evaluation"]
    assert 0 < data["efficiency"] and data["tokens"] > 0 and "accuracy_at_1" in data["summary"]

    spec = importlib.util.spec_from_file_location("contllm_docs_quotes", ROOT / "docs" / "quotes.py")
    assert spec is not None and spec.loader is not None
    quotes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quotes)
    values = quotes.main_job_values(record)
    assert values["main_job.items"] == "3" and values["main_job.model"] == str(model)
    assert values["main_job.accuracy_at_1"] == f"{data['summary']['accuracy_at_1']:.3f}"
    assert values["main_job.end_to_end"] == quotes.duration(data["seconds"]["end_to_end"])
    # every key the pages quote from the repository's record is one this writer produces
    quoted = {key for page in quotes.pages() for key, _ in quotes.quotes(page.read_text()) if key.startswith("main_job.")}
    assert quoted and quoted <= set(values), sorted(quoted - set(values))
