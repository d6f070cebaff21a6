"""Writing and reading the files of a run: atomic JSON and text, CSV tables, JSON-able values.

Every writer goes through a temporary file with a unique name in the target's directory
and a rename, so a process killed at any moment leaves either the old file or the new
one, never half of one, and two processes never share a temporary name.
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import hashlib
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contllm.errors import RunDirectoryError

_MODE: list[int] = []
_WRITTEN: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("contllm_written", default=None)


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache of converted models: ``cache_dir``, else $CONTLLM_CACHE, else $XDG_CACHE_HOME/contllm, else ~/.cache/contllm.

    Nothing is created.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if env := os.environ.get("CONTLLM_CACHE"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "contllm"


@contextlib.contextmanager
def recording_writes() -> Iterator[list[Path]]:
    """A list that collects the path of every file the toolkit's writers finish while the context lasts."""
    written: list[Path] = []
    token = _WRITTEN.set(written)
    try:
        yield written
    finally:
        _WRITTEN.reset(token)


def note_written(path: Path) -> None:
    """Add ``path`` to the list of :func:`recording_writes`, when one is open."""
    written = _WRITTEN.get()
    if written is not None:
        written.append(Path(path))


def file_mode() -> int:
    """The mode a new file gets by the process's umask (0644 under the usual 022), for files made through a temporary name.

    A temporary file is created private (0600); a run's files get the mode any other new
    file would, so a run directory shared with others reads as the user's umask says.
    """
    if not _MODE:
        mask = os.umask(0o022)
        os.umask(mask)
        _MODE.append(0o666 & ~mask)
    return _MODE[0]


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise
    note_written(path)
    return path


def write_error(path: Path, exc: OSError) -> OSError:
    """``exc`` of a write of ``path`` as an error that names the file and its folder (the place a user can act on),
    never the hidden temporary name the write went through."""
    reason = exc.strerror or str(exc)
    return type(exc)(exc.errno, f"cannot write {path.name} in {path.parent}: {reason}")


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


#: Deepest nesting of lists and objects a JSON file may hold. The toolkit's own files nest
#: a few levels; a deeper one is refused, so that nothing downstream recurses without bound.
MAX_JSON_DEPTH = 100
#: A JSON escape of a UTF-16 surrogate, the only way a JSON text can hold a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(
    text: str | bytes,
    what: str,
    error: type[Exception] = RunDirectoryError,
    *,
    schema: Any = None,
    non_finite: bool = False,
) -> Any:
    """The JSON value in ``text``; ``error`` (a toolkit error type) naming ``what`` when it is not valid JSON.

    Nesting deeper than :data:`MAX_JSON_DEPTH`, numbers past Python's digit limit, a
    string holding a lone surrogate (which no tokenizer or file can take) and anything the
    parser cannot take are one error, never a RecursionError or a traceback. NaN, Infinity
    and -Infinity (which Python's json reads but JSON has not) and a number past float's
    range are refused too, naming the field where one is, unless ``non_finite``: the
    toolkit's writers store a non-finite number as null (:func:`jsonable`). ``schema``: a
    :class:`contllm.rundir.schemas.Schema` the value must hold to (checked first, so that a
    non-finite number where the schema expects something says what it expects), one error
    "<what>: <field>: expected ..., got ..." otherwise (:func:`contllm.rundir.schemas.validate`).
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{what}: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    except ValueError as exc:  # JSONDecodeError, an integer past the digit limit, bad UTF-8 in bytes
        message = getattr(exc, "msg", None) or str(exc)
        raise error(f"{what}: not valid JSON ({message[:200]})") from None
    if _too_deep(value):
        raise error(f"{what}: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    if _SURROGATE_ESCAPE.search(text if isinstance(text, str) else text.decode("utf-8", "replace")):
        try:  # paired escapes decode to one character; a lone one is no character, and no file can hold it
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise error(
                f"{what}: a string holds a lone surrogate escape (\\ud800-\\udfff), which is no character"
            ) from None
    if schema is not None:
        from contllm.rundir.schemas import validate

        validate(value, schema, what, error)
    if not non_finite:
        from contllm.rundir.schemas import describe
        from contllm.rundir.schemas import non_finite as non_finite_values

        for field, number in non_finite_values(value):
            raise error(
                f"{what}: {field + ': ' if field else ''}expected a finite number, got {describe(number)}; JSON has "
                "no NaN or infinity (the toolkit writes a non-finite number as null)"
            )
    return value


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests lists and objects deeper than :data:`MAX_JSON_DEPTH` (without recursing)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def read_json(path: str | Path, error: type[Exception] = RunDirectoryError, *, schema: Any = None) -> Any:
    """The JSON value in the file ``path``; ``error`` naming the file when it cannot be read or parsed (see :func:`parse_json`),
    or when it does not hold to ``schema`` (a :class:`contllm.rundir.schemas.Schema`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise error(f"cannot read {path}: {reason}") from None
    return parse_json(text, f"cannot read {path}", error, schema=schema)


def csv_text(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """Rows (dicts keyed by column) as CSV text with a header; missing cells are empty."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buffer.getvalue()


def write_csv(path: str | Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> Path:
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


def model_folder(model: str) -> str:
    """The folder-name part a model name gives (a run's default directory, a spec's per-model folder).

    The last part of a path or hub id ("HuggingFaceTB/SmolLM2-135M" gives "SmolLM2-135M"),
    with every run of characters but ASCII letters, digits, '_', '.' and '-' made one '_';
    a name of dots alone ("." or "..") has them made '_', so it never names a folder above.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).name or model)
    return name if name.strip(".") else name.replace(".", "_") or "_"


#: A text kept as its own file name: ASCII letters, digits, '_', '-', '.' (not first), at most 100 characters.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")
#: Endings a plain name may not have: the marks of the toolkit's temporary files and of records.
_RESERVED_ENDINGS = (".tmp", ".json")
#: Longest readable part of a hashed name, in characters and in UTF-8 bytes: with the hash,
#: an extension and a temporary file's additions the name stays under 255 bytes.
_READABLE_CHARS = 80
_READABLE_BYTES = 200


def data_name(text: str) -> str:
    """``text`` (an item id, a label: anything read from data or a results file) as one safe file-name component.

    A plain text (see :data:`_PLAIN_NAME`, not ending in .tmp or .json) is its own name;
    any other text becomes its letters and digits (at most 80 characters and 200 bytes)
    then '~' and 20 hex digits of its sha256, where '~' never occurs in a plain name, so
    distinct texts never share a name. The result never holds a separator, is never "."
    or "..", never starts with '.' (the mark of a temporary file) and is at most 221
    bytes long. Every path the toolkit derives from data goes through it.
    """
    if _PLAIN_NAME.fullmatch(text) and not text.endswith(_RESERVED_ENDINGS):
        return text
    readable = safe_name(text)[:_READABLE_CHARS].lstrip(".")
    while len(readable.encode("utf-8")) > _READABLE_BYTES:
        readable = readable[:-1]
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return f"{readable}~{digest}"


def inside(directory: str | Path, relative: str | Path) -> Path:
    """``directory / relative``, checked to stay inside ``directory``; RunDirectoryError otherwise.

    Refused: an absolute path, a '..' part, a NUL byte, and a path that resolves (through
    a symbolic link on the way) to a place outside the directory. Every writer of a run's
    outputs calls it before it writes, whatever the name was made from.
    """
    directory, relative = Path(directory), Path(relative)
    try:
        path = directory / relative
        escapes = relative.is_absolute() or ".." in relative.parts or not relative.parts
        escapes = escapes or not path.resolve().is_relative_to(directory.resolve())
    except (ValueError, OSError):  # a NUL byte, a loop of links
        escapes = True
    if escapes:
        shown = repr(str(relative))
        shown = shown if len(shown) <= 80 else f"{shown[:60]}... ({len(str(relative))} characters)"
        raise RunDirectoryError(f"refusing to write {shown}: it is not inside {directory}")
    return path
