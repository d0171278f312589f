"""Durable file writes shared by the parts that persist under the data directory."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a new directory entry durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: Path, payload: bytes, before_replace: Callable[[int], None] | None = None) -> None:
    """Replace `path` with `payload` so that readers see the old file or the new one, never a torn one.

    A temporary file in the same directory is written and fsynced, then renamed
    over `path` (`os.replace` is atomic); concurrent writers each use their own
    temporary file, so the last rename wins whole. `before_replace` gets the
    temporary file's descriptor just before the rename: it may set its mode and
    owner, or raise to leave `path` untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
            if before_replace is not None:
                before_replace(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def read_regular_file(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of `path`, which must be a regular file (through symlinks).

    Opened without blocking, so a FIFO, a socket or a device where a file should be is refused
    at once (`OSError` EINVAL) instead of hanging the reader forever. `FileNotFoundError` passes.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(limit + 1)
    finally:
        os.close(fd)
