"""Writing and reading the files of a run: atomic JSON and text, CSV tables, JSON-able values.

Every writer goes through a temporary file with a unique name in the target's directory
and a rename, so a process killed at any moment leaves either the old file or the new
one, never half of one, and two processes never share a temporary name.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contllm.errors import RunDirectoryError


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def jsonable(value: Any) -> Any:
    """Numbers, arrays and tensors as JSON values; non-finite floats become null."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """``data`` (made JSON-able by :func:`jsonable`) as indented JSON, written atomically."""
    return atomic_write_text(path, json.dumps(jsonable(data), indent=1) + "\n")


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; RunDirectoryError naming the file when it cannot be read."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDirectoryError(f"cannot read {path}: {exc}") from None


def csv_text(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    """Rows (dicts keyed by column) as CSV text with a header; missing cells are empty."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buffer.getvalue()


def write_csv(path: str | Path, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> Path:
    """A CSV table written atomically (see :func:`csv_text`)."""
    return atomic_write_text(path, csv_text(columns, rows))


def as_array(values: Any) -> np.ndarray:
    """A float array from (nested) JSON lists; null, how a non-finite number is stored, reads as NaN."""

    def clean(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return np.nan if v is None else v

    return np.asarray(clean(values), dtype=np.float64)


def fsync_dir(path: Path) -> None:
    """Make the renames into ``path`` durable (where the platform can open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def safe_name(text: str) -> str:
    """``text`` as one file-name component: letters, digits, '-', '_' and '.' kept, the rest '_'."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
    return name if name.strip(".") else name.replace(".", "_")
