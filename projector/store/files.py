"""Opening a projection file: one writable handle per file in a process, and DuckDB's open errors as
typed ones (another process holds the file, it is no projection) and its storage faults.

A second writable handle on the same file would fold with its own cache against the same tables, so
``claim_writer`` refuses it; another process's lock shows up as a DuckDB error at ``connect``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb

from throughline.projector.exceptions import (
    ProjectionBusyError,
    ProjectionIncompatibleError,
    ProjectionMissingError,
)

_OPEN_LOCK = threading.Lock()
_OPEN_WRITABLE: set[Path] = set()

#: DuckDB errors that mean the file cannot be written (disk full, read-only, permissions), as opposed to
#: a bug in a statement: they become ``ProjectionStorageError``.
STORAGE_FAULTS = (duckdb.IOException, duckdb.TransactionException, duckdb.PermissionException, duckdb.FatalException)


def wal_path(path: Path) -> Path:
    """The write-ahead log DuckDB keeps beside the projection file ``path``."""
    return path.with_name(path.name + ".wal")


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "lock" in text or "different configuration" in text or "already open" in text


def refuse_second_writer(path: Path) -> None:
    """``ProjectionBusyError`` when this process already has ``path`` open for writing."""
    with _OPEN_LOCK:
        if path.resolve() in _OPEN_WRITABLE:
            raise ProjectionBusyError(f"projection {path} is already open for writing in this process: share that handle")


def claim_writer(path: Path) -> None:
    """Record that this process now writes ``path`` (``release_writer`` when the handle closes)."""
    with _OPEN_LOCK:
        _OPEN_WRITABLE.add(path.resolve())


def release_writer(path: Path) -> None:
    """The writable handle on ``path`` closed: another may open."""
    with _OPEN_LOCK:
        _OPEN_WRITABLE.discard(path.resolve())


def connect(path: Path, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to the projection file, or the typed error of why not."""
    if read_only and not path.exists():
        raise ProjectionMissingError(f"no projection at {path}: run `throughline project` or `throughline replay` first")
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except (duckdb.IOException, duckdb.ConnectionException) as exc:
        if _is_lock_error(exc):
            if read_only:
                message = (
                    f"projection {path} is held by a running projector: read it through the "
                    f"`throughline serve` HTTP API, or stop the projector first ({exc})"
                )
            else:
                message = f"projection {path} is held by another process (is a projector already running?) ({exc})"
            raise ProjectionBusyError(message) from None
        raise ProjectionIncompatibleError(f"cannot open {path} as a DuckDB projection: {exc}") from None
    except duckdb.Error as exc:
        raise ProjectionIncompatibleError(f"cannot open {path} as a DuckDB projection: {exc}") from None
