"""Durable file writes: the one way throughline replaces a small file so that a crash keeps old or new.

Every state file (an ingest's resume state, the hook's sessions state, the Observer's saved cursor) and
the page-token key go through here. The order is what makes a crash at any instant safe:

1. write the whole content to a temporary file in the target's own directory (same file system, so the
   rename below is atomic) and ``fsync`` it: the new bytes are on disk before any name points at them;
2. ``os.replace`` it over the target: a reader sees the old file or the new one, never a mix;
3. ``fsync`` the directory: the rename itself survives a power loss (without it the directory entry may
   still name the old inode after a crash, and a resumed ingest would send turns again).

Errors are ``OSError`` as the operating system raised them; each caller wraps them in its own typed error
(it knows what the file is for and what the user should do).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["replace_file", "sync_directory", "write_fully"]


def write_fully(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write less than asked) and ``fsync`` it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """``fsync`` a directory so that the names created, renamed or removed in it survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp file, fsync, rename, fsync directory).

    The directory is created if missing. Whatever stops the write (a full disk, an interrupt), the old
    file stays as it was and the temporary file is removed.
    """
    target = Path(path)
    directory = target.absolute().parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        try:
            os.fchmod(fd, mode)
            write_fully(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    sync_directory(directory)
