"""The local model cache: where entries live, their records, what is wrong with one, and writing one.

An entry is a directory of safetensors, tokenizer files and a record
(:data:`RECORD_NAME`) listing the size and sha256 of every file. Entries are written into
a staging sibling and renamed into place, so a reader never sees a half-written one; an
entry without a record was interrupted.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import secrets
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import transformers

RECORD_NAME = "contllm_record.json"
RECORD_FORMAT = 1
# Files below this size are hashed on every check; larger ones are checked by size (and
# safetensors by header) so that a cached load stays fast. A deep check hashes them all.
_HASH_ALWAYS_BELOW = 1 << 20


class ModelCacheWarning(UserWarning):
    """A cache entry was partial, corrupt or stale and is being rebuilt."""



def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()



def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache_dir``, else $CONTLLM_CACHE, else $XDG_CACHE_HOME/contllm, else ~/.cache/contllm.

    Nothing is created.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if env := os.environ.get("CONTLLM_CACHE"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "contllm"


def read_record(entry_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((entry_dir / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


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
    except (OSError, ValueError) as err:
        return f"{path.name} has an unreadable safetensors header ({err})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        return f"{path.name} is {size} bytes, its header describes {expected}"
    return None


def cache_entry_problems(
    entry_dir: str | os.PathLike[str],
    *,
    source_sha256: str | None = None,
    deep: bool = False,
) -> list[str]:
    """What is wrong with a cache entry; an empty list means it can be loaded.

    Checks the record, that every recorded file exists with its recorded size, the hashes
    of small files (of all files when ``deep``), the safetensors headers against the file
    sizes, and that the entry was built from the GGUF whose sha256 is ``source_sha256``.
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
    files = record.get("files") or []
    names = {f.get("name") for f in files}
    if "config.json" not in names or not any(str(n).endswith(".safetensors") for n in names):
        problems.append("the record lists no config.json or no safetensors file")
    for item in files:
        path = entry / str(item.get("name"))
        if not path.is_file():
            problems.append(f"{item.get('name')} is missing")
            continue
        if path.stat().st_size != item.get("size"):
            problems.append(f"{path.name} is {path.stat().st_size} bytes, recorded {item.get('size')}")
            continue
        if path.suffix == ".safetensors" and (problem := _safetensors_problem(path)):
            problems.append(problem)
            continue
        if (deep or item["size"] < _HASH_ALWAYS_BELOW) and sha256_file(path) != item.get("sha256"):
            problems.append(f"{path.name} does not match its recorded sha256")
    return problems


def _clear_stale(root: Path, name: str) -> None:
    """Remove staging directories of dead processes and leftovers of replaced entries."""
    if not root.is_dir():
        return
    for path in root.glob(f".{name}.*"):
        match = re.fullmatch(rf"\.{re.escape(name)}\.tmp-(\d+)-\w+", path.name)
        if match and _pid_alive(int(match.group(1))):
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
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(target.parent, target.name)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    staging.mkdir()
    return staging


def _install(staging: Path, target: Path) -> None:
    """Move a finished staging directory into place, replacing any old entry."""
    if target.exists():
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
    be one) with a record (``metadata`` plus format, versions, creation time and the size
    and sha256 of every file), then renamed into place; an existing entry is replaced.
    """
    target = Path(target)
    staging = staging if staging is not None else staging_dir(target)
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        files = [
            {"name": p.name, "size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(staging.iterdir())
            if p.is_file() and p.name != RECORD_NAME
        ]
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

