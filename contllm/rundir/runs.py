"""Run directories: config, manifest, one record per finished item, results and figures.

Layout of a run directory::

    config.json        the resolved configuration (experiment, model, options)
    manifest.json      model, weights sha256, package versions, device, dtype (and dtype_choice), commit, times
    items/<id>.json    one record per finished item ({"id": ..., "record": ...}), each written atomically
    shards/process-<rank>/<id>.json
                       the same, written by one process of a launched run until the main
                       process merges them into items/ (absent once a run has finished)
    results.json       the experiment's result, with the config
    <table>.csv        the experiment's tables (results.csv: tidy rows of every item)
    summary.json       headline numbers
    figures/           the experiment's figures (a summary; one per item in runs of up to 24
                       items or when asked), as PNG (and PDF when asked)

Every file is written to a temporary name and renamed into place, so a run killed at any
moment leaves only whole files; ``--resume`` then skips the items already on disk, in
items/ and in any shard.

A run directory's own entries are never followed out of it: a symbolic link in place of
``.lock``, ``items/``, ``shards/``, ``figures/`` or any entry the toolkit writes is
refused before anything is written. manifest.json lists the output files a run wrote
(``outputs``); ``--force`` removes only those, the config, the manifest and the records,
and leaves whatever else the directory holds.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from contllm.errors import RunDirectoryError
from contllm.rundir import schemas
from contllm.rundir.files import (
    atomic_write_json,
    data_name,
    fsync_dir,
    model_folder,
    read_json,
    recording_writes,
)
from contllm.rundir.locks import LOCK, Reservation, refuse_if_locked

CONFIG = "config.json"
MANIFEST = "manifest.json"
ITEMS = "items"
SHARDS = "shards"
FIGURES = "figures"
#: Entries at the top of a run directory that the toolkit itself writes into or over.
OWN_ENTRIES = (LOCK, CONFIG, MANIFEST, ITEMS, SHARDS, FIGURES, "results.json", "summary.json")
#: Those of them that are files (a folder in place of one would stop a run only as it writes there).
OWN_FILES = (CONFIG, MANIFEST, "results.json", "summary.json")
#: Longest file-name component most file systems take, in bytes.
NAME_MAX = 255
#: Longest path, in bytes (Linux's PATH_MAX, less room for the files inside the run).
PATH_MAX = 3800


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def default_out(experiment: str, model: str) -> Path:
    """runs/<experiment>-<model>-<local time>: where a run goes when no --out is given."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{experiment}-{model_folder(model)}-{stamp}"


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` was written by a run: it holds a manifest.json, or a config.json beside an items/ folder.

    A run writes its config, its items/ folder and its manifest as it opens, so a run killed
    at any moment after that is recognised. A folder that merely holds a config.json (a
    model directory, a cache entry) is not a run.
    """
    path = Path(path)
    return (path / MANIFEST).is_file() or ((path / CONFIG).is_file() and (path / ITEMS).is_dir())


def describe_folder(path: str | Path) -> str:
    """What a folder that is not a run holds, as " (it is ...)" for an error message; "" when it is nothing known."""
    path = Path(path)
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    if "contllm_record.json" in names:
        return " (it is a contllm model cache entry)"
    if "audit.json" in names:
        return " (it is an audit directory: see contllm audit --resume)"
    if "config.json" in names and any(n.endswith((".safetensors", ".bin", ".gguf")) for n in names):
        return " (it is a model directory)"
    if {"summary.md", "summary.csv"} <= names:
        return " (it is a report directory)"
    return ""


def record_name(item_id: str) -> str:
    """The file name of ``item_id``'s record: :func:`contllm.rundir.files.data_name` of it plus ".json" (distinct ids, distinct files)."""
    return f"{data_name(item_id)}.json"


def check_out(out: Any, *, resume: bool = False, force: bool = False) -> Path:
    """``out`` as a run directory's path, checked as far as it can be without the run's config; RunDirectoryError otherwise.

    Refused: --resume with --force, an empty or too long path, a file, a place where no
    directory can be made (under a file or a link to nothing, read-only), a run whose own
    entries are links; with ``resume``, a run whose config.json or manifest.json cannot be
    read. What the run's config decides is :class:`RunDir`'s to check.
    """
    check_modes(resume=resume, force=force)
    if not isinstance(out, (str, os.PathLike)) or not str(out).strip():
        raise RunDirectoryError(f"the run directory must be a path, got {out!r}")
    path = Path(out)
    _check_place(path)
    if resume and is_run_dir(path):
        _check_resumable(path)
    refuse_if_locked(path)
    return path


def check_modes(*, resume: bool, force: bool) -> None:
    """RunDirectoryError for --resume with --force."""
    if resume and force:
        raise RunDirectoryError("--resume and --force contradict each other; give one")


def check_place(path: Path) -> None:
    """RunDirectoryError when no directory can be at ``path`` and be written: too long, a file, not writable (/proc)."""
    too_long = [part for part in path.parts if len(os.fsencode(part)) > NAME_MAX]
    if too_long or len(os.fsencode(path)) > PATH_MAX:
        what = f"the name {too_long[0][:40]}... is" if too_long else "the path is"
        raise RunDirectoryError(
            f"cannot create {str(path)[:80]}...: {what} longer than {NAME_MAX if too_long else PATH_MAX} bytes"
        )
    if path.exists() and not path.is_dir():
        raise RunDirectoryError(f"{path} exists and is not a directory")
    _check_writable(path)


def _check_place(path: Path) -> None:
    """RunDirectoryError when ``path`` cannot hold a run: see :func:`check_place`, and holding links out."""
    check_place(path)
    link = _followed_link(path)
    if link is not None:
        raise RunDirectoryError(
            f"{link} is a symbolic link; a run never follows its own entries out of its directory, remove it"
        )
    for name in OWN_FILES:
        if (path / name).exists() and not (path / name).is_file():
            raise RunDirectoryError(f"{path / name} is not a file, where a run writes one; remove it")


def _check_resumable(path: Path) -> None:
    """RunDirectoryError, saying how to recover, when a run's config.json or manifest.json cannot be read back."""
    keep = f"remove {path / MANIFEST} to resume (the finished items are kept), or use --force to start over"
    for name, remedy in ((CONFIG, "the run's settings are lost, use --force to start over"), (MANIFEST, keep)):
        if name == MANIFEST and not (path / name).exists():
            continue
        try:
            held = read_json(path / name, schema=schemas.CONFIG if name == CONFIG else schemas.MANIFEST)
        except RunDirectoryError as exc:
            raise RunDirectoryError(f"cannot resume: {exc}; {remedy}") from None
        if not isinstance(held, dict):
            raise RunDirectoryError(f"cannot resume: {path / name} holds no JSON object; {remedy}")


def _check_writable(path: Path) -> None:
    """RunDirectoryError when ``path`` cannot be created or written (checked before any work)."""
    if path.is_symlink() and not path.exists():
        raise RunDirectoryError(f"{path} is a symbolic link to nothing; give a directory")
    existing = path
    while not existing.exists():
        if existing.is_symlink():  # a folder on the way is a link to nothing: no directory can be made under it
            raise RunDirectoryError(f"cannot create {path}: {existing} is a symbolic link to nothing")
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirectoryError(f"cannot create {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirectoryError(f"cannot write to {existing}: permission denied")
    if existing != path:
        _probe(existing, path)


def _probe(existing: Path, path: Path) -> None:
    """Create and remove an empty directory in ``existing``: file systems that refuse new entries (/proc, /sys) say so only then."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".contllm-probe-", dir=existing))
    except OSError as exc:
        raise RunDirectoryError(f"cannot create {path} in {existing}: {exc.strerror or exc}") from None


def _followed_link(path: Path) -> Path | None:
    """The first of the run directory's own entries that is a symbolic link (which a run would follow out of it), else None.

    Checked: the entries the toolkit writes (:data:`OWN_ENTRIES`, the outputs the manifest
    lists, CSV tables), any link to a directory at the top, and everything under items/,
    shards/ and figures/.
    """
    if not path.is_dir():
        return None
    for entry in path.iterdir():
        if entry.is_symlink() and (entry.name in OWN_ENTRIES or entry.suffix == ".csv" or entry.is_dir()):
            return entry
    for top in (ITEMS, SHARDS, FIGURES):
        if (path / top).is_dir() and not (path / top).is_symlink():
            for folder, dirs, files in os.walk(path / top):
                for name in [*dirs, *files]:
                    if (Path(folder) / name).is_symlink():
                        return Path(folder) / name
    for relative in _listed_outputs(path):
        for depth in range(1, len(relative.parts) + 1):
            if (path / Path(*relative.parts[:depth])).is_symlink():
                return path / Path(*relative.parts[:depth])
    return None


def _listed_outputs(path: Path) -> list[Path]:
    """The output files manifest.json lists, as relative paths inside the run (anything else listed is ignored)."""
    manifest = path / MANIFEST
    if not manifest.is_file() or manifest.is_symlink():
        return []
    try:
        listed = read_json(manifest).get("outputs", [])
    except (RunDirectoryError, AttributeError):
        return []
    out = []
    for name in listed if isinstance(listed, list) else []:
        relative = Path(name) if isinstance(name, str) and name else None
        if relative is not None and not relative.is_absolute() and ".." not in relative.parts:
            out.append(relative)
    return out


def _differences(previous: Any, current: dict[str, Any]) -> list[str]:
    """The settings and options in which a run's recorded config and ``current`` differ, as "key (was X, now Y)".

    The same dataset file under another path (equal ``data_sha256``) is no difference.
    """
    if not isinstance(previous, dict):
        return ["everything (config.json holds no object)"]
    found = []
    for key in sorted(set(previous) | set(current)):
        was, now_ = previous.get(key), current.get(key)
        if key == "options" and isinstance(was, dict) and isinstance(now_, dict):
            same_file = was.get("data_sha256") is not None and was.get("data_sha256") == now_.get("data_sha256")
            found += [
                f"options.{k} (was {_short(was.get(k))}, now {_short(now_.get(k))})"
                for k in sorted(set(was) | set(now_))
                if was.get(k) != now_.get(k) and not (k == "data" and same_file)
            ]
        elif was != now_:
            found.append(f"{key} (was {_short(was)}, now {_short(now_)})")
    return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _nested_runs(path: Path) -> list[Path]:
    """Run directories inside ``path`` (not ``path`` itself): what --force must never delete."""
    found = {p.parent for name in (CONFIG, MANIFEST) for p in path.rglob(name)}
    return sorted(p for p in found if p != path and is_run_dir(p))


class RunDir:
    """A run directory opened for writing.

    out: the directory. resume: continue a run there (its config must match). force:
    replace a previous run of the same experiment there (never a directory that is not a
    run, nor one that holds other runs). Without either, an existing non-empty directory
    is an error, so nothing already written is lost. While a process writes to it, the
    directory is locked (``.lock``): a second process is refused with a
    RunDirectoryError instead of mixing its files into the first one's.
    """

    def __init__(self, out: str | Path, config: dict[str, Any], *, resume: bool = False, force: bool = False) -> None:
        self.path = check_out(out, resume=resume, force=force)
        self.config = config
        self.resume = resume
        self.force = force
        self.resumed = False
        self._replace = False
        self._lock: Reservation | None = None
        self._item_dir = self.path / ITEMS
        self._check()  # check_out has refused a directory another process holds

    def _check(self) -> None:
        """Decide between a new run, a resumed one and a replaced one; refuse anything else."""
        self.resumed = self._replace = False
        _check_place(self.path)
        occupied = self.path.is_dir() and any(p.name != LOCK for p in self.path.iterdir())
        if not occupied:
            return
        if self.resume:
            if not is_run_dir(self.path):
                raise RunDirectoryError(
                    f"cannot resume: {self.path} is not a run directory{describe_folder(self.path)}; "
                    "give the directory of the run to continue"
                )
            _check_resumable(self.path)
            changed = _differences(read_json(self.path / CONFIG, schema=schemas.CONFIG), self.config)
            if changed:
                raise RunDirectoryError(
                    f"cannot resume {self.path}: its config differs in {'; '.join(changed)}; "
                    "use the same options, or --force to start over"
                )
            self.resumed = True
        elif self.force:
            nested = _nested_runs(self.path)
            if nested:
                raise RunDirectoryError(f"refusing to replace {self.path}: it holds other runs ({nested[0]})")
            if not is_run_dir(self.path):
                raise RunDirectoryError(
                    f"refusing to replace {self.path}: it is not empty and not a run directory"
                    f"{describe_folder(self.path)}; choose another --out"
                )
            previous = read_json(self.path / CONFIG, schema=schemas.CONFIG)
            theirs = previous.get("experiment") if isinstance(previous, dict) else None
            if theirs != self.config.get("experiment"):
                raise RunDirectoryError(
                    f"refusing to replace {self.path}: it is a run of {theirs!r}, not of {self.config.get('experiment')!r}"
                )
            self._replace = True
        else:
            if not is_run_dir(self.path):
                raise RunDirectoryError(
                    f"{self.path} already holds files and is not a run directory{describe_folder(self.path)}; "
                    "choose another --out"
                )
            raise RunDirectoryError(
                f"{self.path} already holds a run; use --resume to continue it or --force to replace it"
            )

    def reserve(self) -> RunDir:
        """Create and lock the directory, and check it again under the lock; nothing else is written.

        A run reserves its directory before its model loads, so that a second process
        given the same directory is refused at once rather than after its own load. A
        run that stops before :meth:`open` (a model that does not load) leaves nothing
        behind: :meth:`close` removes the folders this call created, where they are empty.
        """
        if self._lock is not None:
            return self
        self._lock = Reservation(self.path)
        try:
            self._check()
        except BaseException:
            self.close()
            raise
        return self

    def open(self) -> RunDir:
        """Create and lock the directory (see :meth:`reserve`), replace a previous run with --force, write the config.

        Kept apart from the checks in the constructor so that a run can fail early (a
        model that does not load) without touching anything on disk. The checks are made
        again once the lock is held, since another process may have written meanwhile.
        """
        self.reserve()
        assert self._lock is not None
        self._lock.keep()  # from here on the directory is the run's
        try:
            self._check()
            if self._replace:
                self._remove_previous()
            if self.resumed:
                for stale in self._temporary_files():  # the unfinished writes of a killed run
                    stale.unlink(missing_ok=True)
            (self.path / ITEMS).mkdir(parents=True, exist_ok=True)
            if not self.resumed:
                atomic_write_json(self.path / CONFIG, self.config)
        except BaseException:
            self.close()
            raise
        return self

    def _temporary_files(self) -> Iterator[Path]:
        """The temporary files of the toolkit's writers (``.<name>.<random>.tmp``) among the run's own entries."""
        top: list[tuple[str, list[str], list[str]]] = [(str(self.path), [], [p.name for p in self.path.iterdir()])]
        below = [os.walk(p) for p in (self.path / ITEMS, self.path / SHARDS, self.path / FIGURES) if p.is_dir()]
        for walk in (top, *below):
            for where, _, files in walk:
                for name in files:
                    path = Path(where) / name
                    if re.fullmatch(r"\..+\.tmp(\.png|\.pdf)?", name) and path.is_file() and not path.is_symlink():
                        yield path

    def _remove_previous(self) -> None:
        """--force: remove what the previous run wrote (its listed outputs, records, config, manifest); nothing else."""
        outputs = [self.path / r for r in _listed_outputs(self.path)]
        records = [
            p
            for folder in self._record_dirs()
            for p in folder.glob("*.json")
            if _read_record(p, lambda data: data) is not None
        ]
        for path in [*outputs, *records, *self._temporary_files()]:
            if path.is_file() and not path.is_symlink():
                path.unlink()
        folders = {p.parent for p in [*outputs, *records]} | {self.path / ITEMS, self.path / FIGURES}
        if (self.path / SHARDS).is_dir():
            folders |= {p for p in (self.path / SHARDS).iterdir() if p.is_dir()} | {self.path / SHARDS}
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):  # deepest first
            while folder != self.path and folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
        for name in (CONFIG, MANIFEST):
            (self.path / name).unlink(missing_ok=True)

    def close(self) -> None:
        """Release the directory's lock (idempotent); folders that :meth:`reserve` made and nothing filled go again."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunDir:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ items
    def item_path(self, item_id: str) -> Path:
        """Where :meth:`save_record` writes the record of ``item_id`` (items/, or this process's shard)."""
        return self._item_dir / record_name(item_id)

    def use_shard(self, rank: int) -> Path:
        """Write this process's records into ``shards/process-<rank>/`` from now on; returns that folder."""
        if rank < 0:
            raise RunDirectoryError(f"a shard needs a process rank >= 0, got {rank}")
        self._item_dir = self.path / SHARDS / f"process-{rank}"
        self._item_dir.mkdir(parents=True, exist_ok=True)
        return self._item_dir

    def _record_dirs(self) -> list[Path]:
        shards = self.path / SHARDS
        return [self.path / ITEMS, *(sorted(p for p in shards.iterdir() if p.is_dir()) if shards.is_dir() else [])]

    def finished(self, decode: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        """The records already on disk, by item id, from items/ and every shard, read by ``decode``.

        Unreadable records are ignored (and so redone); a record in items/ wins over a
        copy of the same item in a shard.
        """
        done: dict[str, Any] = {}
        for folder in self._record_dirs():
            for path in sorted(folder.glob("*.json")):
                found = _read_record(path, decode)
                if found is not None and found[0] not in done:
                    done[found[0]] = found[1]
        return done

    def save_record(self, item_id: str, data: dict[str, Any]) -> None:
        """Write one item's record (JSON-able data) atomically."""
        atomic_write_json(self.item_path(item_id), {"id": item_id, "record": data})

    def merge_shards(self) -> int:
        """Move every shard's records into items/ and remove the emptied shards; returns how many moved.

        Run by one process while no other writes. Each move is a rename, so a merge cut
        short leaves every record whole in one place or the other, and merging again
        finishes the job. A record whose item already has a readable record in items/ is
        a second copy of a deterministic sweep (two launches into one directory) and is
        dropped; one that replaces an unreadable record is kept.
        """
        shards = self.path / SHARDS
        if not shards.is_dir():
            return 0
        items = self.path / ITEMS
        items.mkdir(parents=True, exist_ok=True)
        moved = 0
        for folder in sorted(p for p in shards.iterdir() if p.is_dir()):
            for path in sorted(folder.glob("*.json")):
                target = items / path.name
                if target.exists() and _read_record(target, lambda data: data) is not None:
                    path.unlink()
                    continue
                os.replace(path, target)
                moved += 1
            # Temporary files are the unfinished writes of a process that was killed.
            for leftover in folder.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            shards.rmdir()
        if moved:
            fsync_dir(items)
        return moved

    # ------------------------------------------------------------------ outputs and manifest
    def write_outputs(self, write: Callable[[], Any]) -> Any:
        """``write()`` (which writes the result's files into the run), with every file it writes listed in the manifest's ``outputs``.

        The list is what ``--force`` may remove later; outputs of an earlier attempt that
        are still there stay listed.
        """
        with recording_writes() as written:
            try:
                return write()
            finally:
                mine = {str(p.relative_to(self.path)) for p in written if p.is_relative_to(self.path)}
                earlier = {str(p) for p in _listed_outputs(self.path) if (self.path / p).is_file()}
                self.write_manifest({"outputs": sorted(mine | earlier)})

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        previous = read_json(self.path / MANIFEST, schema=schemas.MANIFEST) if (self.path / MANIFEST).is_file() else {}
        if previous.get("started") and "started" in manifest:
            manifest = {**manifest, "started": previous["started"], "resumed": now()}
        atomic_write_json(self.path / MANIFEST, {**previous, **manifest})


def _read_record(path: Path, decode: Callable[[dict[str, Any]], Any]) -> tuple[str, Any] | None:
    """(item id, record) from a record file, or None when it cannot be read (a record to redo)."""
    try:
        data = read_json(path, schema=schemas.RECORD_FILE)
        item_id = data["id"]
        if not isinstance(item_id, str) or record_name(item_id) != path.name:
            return None  # a record under another item's name is not trusted
        return item_id, decode(data["record"])
    except Exception:  # whatever is wrong with a record, it is recomputed
        return None


def package_versions() -> dict[str, str | None]:
    """Versions of the packages a result depends on."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("contllm", "torch", "transformers", "accelerate", "numpy", "gguf", "safetensors"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def project_commit() -> str | None:
    """The git commit of the contllm checkout, when it runs from one."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def base_manifest(lm: Any, model_name: str) -> dict[str, Any]:
    """Where a run's numbers come from: model (its family and parameter count), weights, software, device, dtype and CPU
    (half-precision kernels differ by CPU).

    A model loaded with dtype="auto" adds ``dtype_choice`` (:meth:`contllm.models.autodtype.DtypeChoice.to_dict`):
    the two timings, the probability difference, the device and the reason of its dtype.

    The host name is recorded only when CONTLLM_RECORD_HOST=1 is set (run directories get shared).
    """
    from contllm.hardware import cpu_capability

    info = lm.info
    extra = {"host": platform.node()} if os.environ.get("CONTLLM_RECORD_HOST") == "1" else {}
    choice = getattr(info, "dtype_choice", None)
    if choice is not None:  # dtype="auto": what was timed and why this dtype
        extra["dtype_choice"] = choice.to_dict()
    return extra | {
        "model": model_name,
        "model_type": lm.model.config.model_type,
        "family": lm.family.name,
        "parameters": sum(p.numel() for p in lm.model.parameters()),
        "weights_sha256": getattr(info, "sha256", None) or getattr(info, "weights_sha256", None),
        "source": str(getattr(info, "source", "") or "") or None,
        "device": str(lm.device),
        "dtype": str(lm.dtype).replace("torch.", ""),
        "attn_implementation": lm.attn_implementation,
        "versions": package_versions(),
        "commit": project_commit(),
        "cpu": cpu_capability(),
        "command": " ".join(sys.argv),
        "started": now(),
    }
