"""contllm.models.gguf_read: the conversion's GGUF reader equals gguf's own, value for value, on a GGUF written here."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from contllm.models import gguf_read

pytestmark = pytest.mark.unit

TOKENS = ["<unk>", "a", "b", "ab", "\u00e9t\u00e9", "\u2581cat", "", "x" * 300]


def write_gguf(path: Path) -> Path:
    """A small GGUF holding every kind of metadata value the Qwen and Llama headers use, and three tensors."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 3)
    writer.add_float32("llama.rope.freq_base", 10000.5)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_string("general.name", "tiny \u00e9")
    writer.add_array("tokenizer.ggml.tokens", TOKENS)
    writer.add_array("tokenizer.ggml.merges", ["a b", "\u00e9 t"])
    writer.add_array("tokenizer.ggml.token_type", [1, 2, 3, 1, 1, 1, 1, 1])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.25, 0.0, 1.0, 1.0, 1.0, 1.0])
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((8, 32)).astype(np.float32))
    writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((32, 32)).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.arange(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def same_reading(a: object, b: object) -> None:
    fields_a, fields_b = a.fields, b.fields  # type: ignore[attr-defined]
    assert list(fields_a) == list(fields_b)
    for name in fields_a:
        fa, fb = fields_a[name], fields_b[name]
        assert (fa.offset, fa.data, fa.types) == (fb.offset, fb.data, fb.types), name
        assert len(fa.parts) == len(fb.parts), name
        for pa, pb in zip(fa.parts, fb.parts):
            assert pa.dtype == pb.dtype and np.array_equal(pa, pb), name
    tensors_a, tensors_b = a.tensors, b.tensors  # type: ignore[attr-defined]
    assert [t.name for t in tensors_a] == [t.name for t in tensors_b]
    for ta, tb in zip(tensors_a, tensors_b):
        assert (ta.tensor_type, list(ta.shape), ta.data_offset) == (tb.tensor_type, list(tb.shape), tb.data_offset)
        assert ta.data.dtype == tb.data.dtype and np.array_equal(ta.data, tb.data)
    assert a.data_offset == b.data_offset  # type: ignore[attr-defined]


def test_plain_reader_reads_what_the_stock_reader_reads(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf")
    plain, stock = gguf_read.plain_reader(path), gguf.GGUFReader(path)
    assert type(plain) is not gguf.GGUFReader and isinstance(plain, gguf.GGUFReader)
    same_reading(plain, stock)
    tokens = plain.fields["tokenizer.ggml.tokens"]
    assert [bytes(tokens.parts[i]).decode() for i in tokens.data] == TOKENS


def test_fast_reading_shares_one_reader_per_file_and_restores_gguf(tmp_path: Path) -> None:
    first, second = write_gguf(tmp_path / "one.gguf"), write_gguf(tmp_path / "two.gguf")
    stock_reader, stock_names = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_read.fast_reading():
        reader = gguf.GGUFReader(first)
        assert gguf.GGUFReader(str(tmp_path / "." / "one.gguf")) is reader
        assert gguf.GGUFReader(second) is not reader
        same_reading(reader, stock_reader(first))
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is names
        assert names.get_name("blk.0.attn_q") == stock_names(gguf.MODEL_ARCH.LLAMA, 3).get_name("blk.0.attn_q")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (stock_reader, stock_names)


def test_fast_reading_restores_gguf_when_the_body_raises(tmp_path: Path) -> None:
    stock_reader, stock_names = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="boom"), gguf_read.fast_reading():
        gguf.GGUFReader(write_gguf(tmp_path / "x.gguf"))
        raise RuntimeError("boom")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (stock_reader, stock_names)
