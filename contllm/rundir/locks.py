"""The lock of a directory the toolkit writes into (a run, an audit): ``.lock``, holding the writer's pid.

A process that writes into a directory first reserves it (:class:`Reservation`): the
directory is made where missing and locked with ``flock``, so a second process given the
same directory is refused at once (:func:`refuse_if_locked` says so before anything is
loaded) instead of mixing its files into the first one's. The lock file is never followed
through a symbolic link.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from contllm.errors import RunDirectoryError

#: The lock file's name inside a locked directory.
LOCK = ".lock"


def _held(directory: Path, holder: str) -> RunDirectoryError:
    return RunDirectoryError(
        f"{directory} is being written by another contllm process (pid {holder}); "
        "wait for it to finish or choose another --out"
    )


def refuse_if_locked(directory: Path) -> None:
    """RunDirectoryError naming the holder's pid when another live process holds directory/.lock."""
    holder = lock_holder(directory)
    if holder is not None:
        raise _held(directory, holder)


class Reservation:
    """A directory made where missing and locked (``.lock``, :func:`acquire_lock`) by this process until :meth:`release`.

    What the toolkit writes into a directory it reserves first (a run, an audit), so that a
    second process is refused before it loads a model or writes a file. A context manager
    releases it on exit. Released before
    :meth:`keep` was called, the folders it made go again where they are still empty: a
    refused or failed start leaves nothing behind.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        made = self.path
        while not made.parent.exists() and made.parent != made:
            made = made.parent
        self._made: Path | None = None if self.path.exists() else made
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._fd: int | None = acquire_lock(self.path)
        except BaseException:
            self._fd = None
            self.release()
            raise

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def keep(self) -> None:
        """The directory now holds work: :meth:`release` leaves it."""
        self._made = None

    def release(self) -> None:
        """Release the lock (idempotent); remove the folders made here where nothing filled them (unless kept)."""
        if self._fd is not None:
            release_lock(self.path, self._fd)
            self._fd = None
        if self._made is not None:
            folder = self.path
            with contextlib.suppress(OSError):
                while folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                    folder.rmdir()
                    if folder == self._made:
                        break
                    folder = folder.parent
            self._made = None


def acquire_lock(directory: Path) -> int:
    """An exclusive lock on directory/.lock, holding our pid; RunDirectoryError when another process has it."""
    import fcntl

    path = directory / LOCK
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RunDirectoryError(f"{path} is a symbolic link; a run never follows it, remove it") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise _held(directory, lock_holder(directory) or "unknown") from None
        # The holder before us may have removed the file between our open and our lock.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)


def release_lock(directory: Path, fd: int) -> None:
    """Remove directory/.lock and release it (in that order, so nobody locks a removed file unseen)."""
    with contextlib.suppress(OSError):
        os.unlink(directory / LOCK)
    os.close(fd)


def lock_holder(directory: Path) -> str | None:
    """The pid written in directory/.lock while a live process holds it, else None."""
    import fcntl

    path = directory / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        try:
            return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return None
