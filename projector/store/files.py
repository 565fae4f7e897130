"""Opening a projection file: one writable handle per file in a process, and DuckDB's open errors as
typed ones (another process holds the file, it is no projection) and its storage faults.

A second writable handle on the same file would fold with its own cache against the same tables, so
``claim_writer`` refuses it; another process's lock shows up as a DuckDB error at ``connect``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


#: What DuckDB says when another process holds the file's lock, or this process has it open already.
_BUSY_TEXTS = ("could not set lock", "conflicting lock", "different configuration", "already open", "already attached")


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(t in text for t in _BUSY_TEXTS)


def refuse_second_writer(path: Path) -> None:
    """``ProjectionBusyError`` when this process already has ``path`` open for writing."""
    with _OPEN_LOCK:
        if path.resolve() in _OPEN_WRITABLE:
            raise ProjectionBusyError(
                f"projection {path} is already open for writing in this process: share that handle"
            )


def claim_writer(path: Path) -> None:
    """Record that this process now writes ``path`` (``release_writer`` when the handle closes)."""
    with _OPEN_LOCK:
        _OPEN_WRITABLE.add(path.resolve())


def release_writer(path: Path) -> None:
    """The writable handle on ``path`` closed: another may open."""
    with _OPEN_LOCK:
        _OPEN_WRITABLE.discard(path.resolve())


#: DuckDB's row group in a projection file, in rows (DuckDB's default is 122,880). A transaction that
#: appends at least a row group writes its rows straight into the file at COMMIT and logs only where
#: they are; smaller ones go through the write-ahead log, and a checkpoint writes them again. With the
#: default, the projector's polls (up to 10k turns) all took the second way: a 128 MiB checkpoint
#: every ~100k turns (~350 ms, during which reads of the tables wait) and, for ``replay``, a final one
#: (~300 ms). With 2,048 rows a backlog's polls write once, and only live polls of a few turns use the
#: log (docs/design.md, "Row groups of 2,048 rows"). DuckDB keeps this per attached database, not in
#: the file, so every handle attaches the file with it.
ROW_GROUP_SIZE = 2048
#: The name the projection file is attached under (every connection and cursor ``USE``s it).
ALIAS = "projection"
_USE = f"USE {ALIAS}"


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A new cursor on ``con``'s projection (a DuckDB cursor starts in the in-memory default database,
    not in the one its connection ``USE``s)."""
    cur = con.cursor()
    cur.execute(_USE)
    return cur


class CursorPool:
    """Cursors on one connection's projection kept for the next read: a new one costs a ``USE`` (~55 us,
    a twentieth of a first page), so each read borrows one and gives it back."""

    def __init__(self, con: duckdb.DuckDBPyConnection, keep: int = 16) -> None:
        self._con = con
        self._keep = keep
        self._idle: list[duckdb.DuckDBPyConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def borrowed(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor for one read, back in the pool after it (closed instead when the read raised, so that
        no cursor is reused in a state a failure left it in)."""
        with self._lock:
            cur = self._idle.pop() if self._idle else None
        if cur is None:
            cur = cursor(self._con)
        try:
            yield cur
        except BaseException:
            cur.close()
            raise
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(cur)
                return
        cur.close()

    def close(self) -> None:
        """Close the idle cursors (before their connection); cursors borrowed now close when returned."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for cur in idle:
            cur.close()


_ATTACH = f"ATTACH ? AS {ALIAS} (ROW_GROUP_SIZE {ROW_GROUP_SIZE})"
_ATTACH_READ_ONLY = f"ATTACH ? AS {ALIAS} (ROW_GROUP_SIZE {ROW_GROUP_SIZE}, READ_ONLY)"


def _attach(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    # An in-memory default database would spill to ``./.tmp``: a writable handle spills beside its file,
    # where DuckDB puts it for a file it opens itself.
    con = duckdb.connect(config={} if read_only else {"temp_directory": f"{path}.tmp"})
    try:
        con.execute(_ATTACH_READ_ONLY if read_only else _ATTACH, [str(path)])
        con.execute(_USE)
    except BaseException:
        con.close()
        raise
    return con


def connect(path: Path, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to the projection file, or the typed error of why not."""
    if read_only and not path.exists():
        raise ProjectionMissingError(
            f"no projection at {path}: run `throughline project` or `throughline replay` first"
        )
    try:
        return _attach(path, read_only)
    except duckdb.Error as exc:
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
