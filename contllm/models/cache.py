"""The local model cache: where entries live, their records, what is wrong with one, and writing one.

An entry is a directory of safetensors, tokenizer files and a record
(:data:`RECORD_NAME`) listing, for every file, its size, sha256, the ``stat`` it had when
written (mtime_ns, ctime_ns, inode) and, for large files, a sampled fingerprint. Entries
are written into a staging sibling and renamed into place, so a reader never sees a
half-written one; an entry without a record was interrupted.

Content is verified on every check (:func:`cache_entry_problems`):

* files under :data:`_HASH_ALWAYS_BELOW` are hashed in full;
* a large file whose size, mtime_ns, ctime_ns or inode differs from the record (any write
  through the file system changes mtime and ctime; ``os.utime`` restores mtime but sets
  ctime; a copy gets a new inode) is hashed in full, and on a match the record is updated
  so that the next check is fast again;
* a large file whose stat is unchanged is checked by its fingerprint: the sha256 of its
  safetensors header and of :data:`_SAMPLE_BLOCKS` blocks of :data:`_SAMPLE_BLOCK` bytes
  at evenly spaced offsets, the first and last blocks included. This path is reached only
  by a change that bypassed the file system (bit rot, a raw-device write, a clock reset);
  it catches such a change only where it touches the header or a sampled block (about
  0.8% of SmolLM2's weights). ``deep=True`` hashes every file in full.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import secrets
import shutil
import stat as _stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import transformers

from contllm.errors import ModelLoadError
from contllm.rundir.files import cache_root as cache_root  # re-exported: contllm.models.cache_root
from contllm.rundir.files import file_mode

RECORD_NAME = "contllm_record.json"
RECORD_FORMAT = 1
# Files below this size are hashed in full on every check; larger ones by their sampled
# fingerprint while their stat is unchanged (see the module docstring). A deep check
# hashes them all.
_HASH_ALWAYS_BELOW = 4 << 20
# The fingerprint of a large file: this many blocks of this many bytes (the record keeps
# both, so changing them does not invalidate existing entries).
_SAMPLE_BLOCKS = 64
_SAMPLE_BLOCK = 64 << 10
# The stat fields a record keeps, and the names under which it keeps them.
_STAT_FIELDS = {"mtime_ns": "st_mtime_ns", "ctime_ns": "st_ctime_ns", "inode": "st_ino"}
# What a file written by save_pretrained (model or tokenizer) may be called; a directory
# holding anything else is not treated as a cache entry and is never replaced.
_ENTRY_SUFFIXES = (".json", ".safetensors", ".jinja", ".txt", ".model")


class ModelCacheWarning(UserWarning):
    """A cache entry was partial, corrupt or stale and is being rebuilt."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def read_record(entry_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((entry_dir / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _safetensors_header_end(path: Path) -> int:
    """Offset where the data of a safetensors file begins (8 + header length), 0 if unreadable."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
    except OSError:
        return 0
    if len(raw) < 8:
        return 0
    return 8 + struct.unpack("<Q", raw)[0]


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is unreadable or truncated (header only), or None."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return f"{path.name} is too short for a safetensors header"
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > size - 8:
                return f"{path.name} has a header longer than the file"
            header = json.loads(fh.read(header_len))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        return f"{path.name} has an unreadable safetensors header ({err})"
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        return f"{path.name} is {size} bytes, its header describes {expected}"
    return None


def sample_fingerprint(path: Path, *, blocks: int = _SAMPLE_BLOCKS, block: int = _SAMPLE_BLOCK) -> str:
    """sha256 of a file's safetensors header (if it is one) and of ``blocks`` sampled blocks.

    The blocks lie at evenly spaced, deterministic offsets from the first block to the
    last; a file no larger than the blocks together is hashed whole.
    """
    size = path.stat().st_size
    digest = hashlib.sha256()
    digest.update(f"{size}:{blocks}:{block}".encode())
    with path.open("rb") as fh:
        if size <= blocks * block:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
            return digest.hexdigest()
        header_end = min(_safetensors_header_end(path), size) if path.suffix == ".safetensors" else 0
        fh.seek(0)
        digest.update(fh.read(header_end))
        last = size - block
        for offset in sorted({i * last // max(blocks - 1, 1) for i in range(blocks)}):
            fh.seek(offset)
            digest.update(fh.read(block))
    return digest.hexdigest()


def _stat_record(st: os.stat_result) -> dict[str, int]:
    return {key: int(getattr(st, attr)) for key, attr in _STAT_FIELDS.items()}


def _file_record(path: Path, *, before: os.stat_result | None = None, sha256: str | None = None) -> dict[str, Any]:
    """What a record keeps of one file: name, size, sha256, stat and (large files) fingerprint.

    ``before`` and ``sha256`` are the stat and hash already taken, if any; the stat is kept
    only if it did not change while the file was read.
    """
    before = before if before is not None else path.stat()
    sha256 = sha256 if sha256 is not None else sha256_file(path)
    item: dict[str, Any] = {"name": path.name, "size": before.st_size, "sha256": sha256}
    if before.st_size >= _HASH_ALWAYS_BELOW:
        item["sample"] = {
            "blocks": _SAMPLE_BLOCKS,
            "block": _SAMPLE_BLOCK,
            "sha256": sample_fingerprint(path, blocks=_SAMPLE_BLOCKS, block=_SAMPLE_BLOCK),
        }
    after = path.stat()
    if _stat_record(before) == _stat_record(after) and before.st_size == after.st_size:
        item.update(_stat_record(after))
    return item


def safe_entry_name(name: Any) -> str | None:
    """Why a file name read from a record cannot be used (a path, not a name), or None."""
    if not isinstance(name, str) or not name:
        return f"the record names a file {name!r}, which is not a file name"
    separators = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if name in {".", ".."} or ".." in name.split("/") or any(s in name for s in separators) or "\0" in name:
        return f"the record names a file {name!r} with a path separator or '..'; refused"
    return None


def _sample_settings(item: Mapping[str, Any]) -> tuple[int, int, str] | None:
    sample = item.get("sample")
    if not isinstance(sample, Mapping):
        return None
    blocks, block, digest = sample.get("blocks"), sample.get("block"), sample.get("sha256")
    if not (isinstance(blocks, int) and isinstance(block, int) and isinstance(digest, str)):
        return None
    if not (1 <= blocks <= 1 << 16 and 1 <= block <= 1 << 26):
        return None
    return blocks, block, digest


def _file_problem(entry: Path, item: Any, deep: bool, refresh: dict[str, dict[str, Any]]) -> str | None:
    """What is wrong with one recorded file, or None; a file whose full hash was checked
    and matched under a new stat is noted in ``refresh`` (name -> updated record item)."""
    if not isinstance(item, Mapping):
        return f"the record lists {item!r}, which is not a file entry"
    name = item.get("name")
    if problem := safe_entry_name(name):
        return problem
    assert isinstance(name, str)  # safe_entry_name refused anything else
    path = entry / name
    try:
        st = path.lstat()
    except OSError:
        return f"{name} is missing"
    if not _stat.S_ISREG(st.st_mode):
        return f"{name} is not a regular file (a link or a directory)"
    if st.st_size != item.get("size"):
        return f"{name} is {st.st_size} bytes, recorded {item.get('size')}"
    if path.suffix == ".safetensors" and (problem := _safetensors_problem(path)):
        return problem
    sample = _sample_settings(item)
    unchanged = all(item.get(key) == value for key, value in _stat_record(st).items())
    if not deep and st.st_size >= _HASH_ALWAYS_BELOW and unchanged and sample is not None:
        blocks, block, digest = sample
        if sample_fingerprint(path, blocks=blocks, block=block) != digest:
            return f"{name} does not match its recorded fingerprint (header and sampled blocks)"
        return None
    digest = sha256_file(path)
    if digest != item.get("sha256"):
        return f"{name} does not match its recorded sha256"
    if not unchanged or (st.st_size >= _HASH_ALWAYS_BELOW and sample is None):
        fresh = _file_record(path, before=st, sha256=digest)
        if all(k in fresh for k in _STAT_FIELDS):
            refresh[name] = {**item, **fresh}
    return None


def _write_record(entry: Path, record: Mapping[str, Any]) -> None:
    """Replace an entry's record atomically."""
    tmp = entry / f".{RECORD_NAME}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, entry / RECORD_NAME)
    finally:
        tmp.unlink(missing_ok=True)


def cache_entry_problems(
    entry_dir: str | os.PathLike[str],
    *,
    source_sha256: str | None = None,
    deep: bool = False,
    update_record: bool = True,
) -> list[str]:
    """What is wrong with a cache entry; an empty list means it can be loaded.

    Checks the record (file names in it must be plain names, no path separator or '..'),
    that every recorded file is a regular file of its recorded size and that no other
    file lies in the entry, the safetensors headers against the file sizes, the content
    of every file (see the module docstring: a full sha256 for small files and for large
    ones whose stat changed since the record, the sampled fingerprint otherwise; a full
    sha256 of all files when ``deep``), and that the entry was built from the GGUF whose
    sha256 is ``source_sha256``. When a large file's stat changed but its full hash
    matches, the record is updated with the new stat (if ``update_record``; best effort,
    a read-only cache only stays slower).
    """
    entry = Path(entry_dir)
    if not entry.is_dir():
        return [f"{entry} does not exist"]
    record = read_record(entry)
    if record is None:
        return [f"{RECORD_NAME} is missing or unreadable (an interrupted or foreign entry)"]
    if record.get("format") != RECORD_FORMAT:
        return [f"record format {record.get('format')!r} is not {RECORD_FORMAT}"]
    problems = []
    recorded_sha = (record.get("source") or {}).get("sha256")
    if source_sha256 is not None and recorded_sha != source_sha256:
        problems.append(f"built from a GGUF with sha256 {recorded_sha}, the installed one has {source_sha256}")
    files = record.get("files")
    if not isinstance(files, list):
        return [*problems, "the record lists no files"]
    names = {f.get("name") for f in files if isinstance(f, Mapping)}
    if "config.json" not in names or not any(str(n).endswith(".safetensors") for n in names):
        problems.append("the record lists no config.json or no safetensors file")
    refresh: dict[str, dict[str, Any]] = {}
    for item in files:
        if problem := _file_problem(entry, item, deep, refresh):
            problems.append(problem)
    try:
        present = {p.name for p in entry.iterdir() if not p.name.startswith(".")}
    except OSError as err:
        present = set()
        problems.append(f"the entry cannot be listed ({err})")
    if unrecorded := sorted(present - names - {RECORD_NAME}):
        problems.append(f"{', '.join(unrecorded)} not in the record")
    if refresh and not problems and update_record:
        updated = dict(record)
        updated["files"] = [refresh.get(f.get("name"), f) for f in files]
        try:
            _write_record(entry, updated)
        except OSError:
            pass
    return problems


def foreign_content(target: Path) -> str | None:
    """Why ``target`` is not a cache entry that may be replaced, or None (absent or an entry).

    A cache entry is a real directory (not a link) holding only regular files whose names
    save_pretrained or contllm write; anything else is left alone.
    """
    if not os.path.lexists(target):
        return None
    if target.is_symlink() or not target.is_dir():
        return f"{target} is not a directory"
    for child in target.iterdir():
        if child.is_symlink() or not child.is_file():
            return f"{target} holds {child.name}, which is not a regular file"
        name = child.name
        if name == RECORD_NAME or name.startswith(f".{RECORD_NAME}.tmp-"):
            continue
        if name.startswith(".") or not name.endswith(_ENTRY_SUFFIXES):
            return f"{target} holds {name}, which no cache entry holds"
    return None


def refuse_foreign(target: Path) -> None:
    """Raise ModelLoadError when ``target`` exists and is not a cache entry."""
    if reason := foreign_content(target):
        raise ModelLoadError(
            f"{reason}, so it is not a contllm cache entry and will not be replaced; move it away or choose "
            "another cache with cache_dir= or $CONTLLM_CACHE"
        )


def _clear_stale(root: Path, name: str) -> None:
    """Remove staging directories of dead processes and leftovers of replaced entries."""
    if not root.is_dir():
        return
    for path in root.glob(f".{name}.*"):
        stale = re.fullmatch(rf"\.{re.escape(name)}\.(?:tmp-([0-9]+)|old)-[0-9a-f]+", path.name)
        if stale is None or path.is_symlink() or not path.is_dir():
            continue  # not something contllm made: leave it
        if stale.group(1) and _pid_alive(int(stale.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_dir(target: Path) -> Path:
    """A fresh staging sibling of ``target``; ModelLoadError if ``target`` is not a cache entry."""
    refuse_foreign(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(target.parent, target.name)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    staging.mkdir()
    return staging


def _install(staging: Path, target: Path) -> None:
    """Move a finished staging directory into place, replacing any old entry (only an entry)."""
    refuse_foreign(target)
    if os.path.lexists(target):
        old = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
        os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, target)


def write_cache_entry(
    model: Any,
    tokenizer: Any,
    target: str | os.PathLike[str],
    metadata: Mapping[str, Any],
    *,
    staging: Path | None = None,
) -> Path:
    """Save a model and tokenizer as a cache entry at ``target``, atomically.

    Everything is written into a temporary sibling directory (or ``staging``, which must
    be one) with a record (``metadata`` plus format, versions, creation time and, per
    file, size, sha256, stat and fingerprint), then renamed into place; an existing entry
    is replaced (ModelLoadError if ``target`` exists and is not a cache entry).
    """
    target = Path(target)
    staging = staging if staging is not None else staging_dir(target)
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        for path in staging.iterdir():  # the weights come private (0600): one mode, the umask's, for every file
            if path.is_file() and not path.is_symlink():
                os.chmod(path, file_mode())
        files = [_file_record(p) for p in sorted(staging.iterdir()) if p.is_file() and p.name != RECORD_NAME]
        record = {
            "format": RECORD_FORMAT,
            **dict(metadata),
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "files": files,
        }
        # The record is written last: an entry without one was interrupted.
        (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
        _install(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
