"""Run directories: config, manifest, one record per finished item, results and figures.

Layout of a run directory::

    config.json        the resolved configuration (experiment, model, options)
    manifest.json      model, weights sha256, package versions, device, dtype, commit, times
    items/<id>.json    one sweep per finished item, each written atomically
    shards/process-<rank>/<id>.json
                       the same, written by one process of a launched run until the main
                       process merges them into items/ (absent once a run has finished)
    results.json       every sweep, with the config
    results.csv        tidy rows: item, factor (or alpha), label, probability, truth
    summary.json       headline numbers
    figures/           one figure per item and a summary, as PNG and PDF

Every file is written to a temporary name and renamed into place, so a run killed at any
moment leaves only whole files; ``--resume`` then skips the items already on disk, in
items/ and in any shard.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from contllm.errors import ContllmError, RunDirectoryError
from contllm.experiments.base import Sweep

CONFIG = "config.json"
MANIFEST = "manifest.json"
ITEMS = "items"
SHARDS = "shards"


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


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def default_out(experiment: str, model: str) -> Path:
    """runs/<experiment>-<model>-<local time>: where a run goes when no --out is given."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe_model = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).name or model)
    return Path("runs") / f"{experiment}-{safe_model}-{stamp}"


def refuse_unused(unused: Any, experiment: str) -> None:
    """ExperimentError naming every option in ``unused`` (a mapping) that was given (is not None)."""
    from contllm.errors import ExperimentError

    given = sorted(k for k, v in (unused or {}).items() if v is not None)
    if given:
        options = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ExperimentError(f"option(s) {options} do not apply to the {experiment} experiment")


def load_for_run(model: str, *, device: str, dtype: str | None, say: Any, **options: Any) -> Any:
    """Load ``model`` for a run without transformers' own progress bars; ``say`` gets the load time."""
    import time

    from transformers.utils import logging as hf_logging

    from contllm import load

    hf_logging.disable_progress_bar()  # the run's own progress is the one to watch
    started = time.perf_counter()
    lm = load(model, device=device, dtype=dtype, **options)
    say(f"loaded {lm!r} in {time.perf_counter() - started:.1f} s")
    return lm


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` was written by a run (it holds a config.json)."""
    return (Path(path) / CONFIG).is_file()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirectoryError(f"cannot read {path}: {exc}") from None


class RunDir:
    """A run directory opened for writing.

    out: the directory. resume: continue a run there (its config must match). force:
    replace a previous run there. Without either, an existing non-empty directory is an
    error, so nothing already written is lost.
    """

    def __init__(self, out: str | Path, config: dict[str, Any], *, resume: bool = False, force: bool = False) -> None:
        if resume and force:
            raise RunDirectoryError("--resume and --force contradict each other; give one")
        self.path = Path(out)
        self.config = config
        self.resumed = False
        self._replace = False
        self._item_dir = self.path / ITEMS
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"{self.path} exists and is not a directory")
        occupied = self.path.is_dir() and any(self.path.iterdir())
        if not occupied:
            return
        if resume:
            if not is_run_dir(self.path):
                raise RunDirectoryError(f"cannot resume: {self.path} is not a run directory (no {CONFIG})")
            previous = _read_json(self.path / CONFIG)
            if previous != config:
                changed = sorted(k for k in set(previous) | set(config) if previous.get(k) != config.get(k))
                raise RunDirectoryError(
                    f"cannot resume {self.path}: its config differs in {', '.join(changed)}; "
                    "use the same options, or --force to start over"
                )
            self.resumed = True
        elif force:
            if not is_run_dir(self.path):
                raise RunDirectoryError(f"refusing to replace {self.path}: it is not empty and not a run directory")
            self._replace = True
        else:
            raise RunDirectoryError(
                f"{self.path} already holds files; use --resume to continue it or --force to replace it"
            )

    def open(self) -> RunDir:
        """Create the directory (replacing a previous run with --force) and write the config.

        Kept apart from the checks in the constructor so that a run can fail early (a
        model that does not load) without touching anything on disk.
        """
        if self._replace:
            shutil.rmtree(self.path)
        (self.path / ITEMS).mkdir(parents=True, exist_ok=True)
        if not self.resumed:
            atomic_write_json(self.path / CONFIG, self.config)
        return self

    # ------------------------------------------------------------------ items
    def item_path(self, item_id: str) -> Path:
        """Where :meth:`save_sweep` writes the record of ``item_id`` (items/, or this process's shard)."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in item_id)
        return self._item_dir / f"{safe}.json"

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

    def finished(self) -> dict[str, Sweep]:
        """The sweeps already on disk, by item id, from items/ and every shard.

        Unreadable records are ignored (and so redone); a record in items/ wins over a
        copy of the same item in a shard.
        """
        done: dict[str, Sweep] = {}
        for folder in self._record_dirs():
            for path in sorted(folder.glob("*.json")):
                sweep = _read_sweep(path)
                if sweep is not None and sweep.item_id not in done:
                    done[sweep.item_id] = sweep
        return done

    def save_sweep(self, sweep: Sweep) -> None:
        atomic_write_json(self.item_path(sweep.item_id), sweep.to_dict())

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
                if target.exists() and _read_sweep(target) is not None:
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
            _fsync_dir(items)
        return moved

    # ------------------------------------------------------------------ manifest
    def write_manifest(self, manifest: dict[str, Any]) -> None:
        previous = _read_json(self.path / MANIFEST) if (self.path / MANIFEST).is_file() else {}
        if previous.get("started") and "started" in manifest:
            manifest = {**manifest, "started": previous["started"], "resumed": now()}
        atomic_write_json(self.path / MANIFEST, {**previous, **manifest})


def _read_sweep(path: Path) -> Sweep | None:
    """The sweep in a record file, or None when it cannot be read (a record to redo)."""
    try:
        return Sweep.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError, ContllmError):
        return None


def _fsync_dir(path: Path) -> None:
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
    """Where a run's numbers come from: model, weights, software, device and dtype."""
    info = lm.info
    return {
        "model": model_name,
        "model_type": lm.model.config.model_type,
        "family": lm.family.name,
        "weights_sha256": getattr(info, "sha256", None) or getattr(info, "weights_sha256", None),
        "source": str(getattr(info, "source", "") or "") or None,
        "device": str(lm.device),
        "dtype": str(lm.dtype).replace("torch.", ""),
        "attn_implementation": lm.attn_implementation,
        "versions": package_versions(),
        "commit": project_commit(),
        "command": " ".join(sys.argv),
        "host": platform.node(),
        "started": now(),
    }
