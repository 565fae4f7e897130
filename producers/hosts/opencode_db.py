"""OpenCode's SQLite store read as a line source: each session a list of immutable records (``opencode``).

The store is opened read-only through SQLite's URI (``file:...?mode=ro``), so the running OpenCode is
never locked out: SQLite readers take no write lock, and in WAL mode (OpenCode's) a reader sees the last
committed transaction without blocking the writer. Each session is presented as a ``Line`` stream, named
``<store>#<session id>``: record N is the session's N-th final message (with its parts), as JSON, so the
ingest loop, the resume state and the parser treat it as they treat a line file (``Line.end`` is the
record's number: the state records how many records of each session the broker acknowledged, and the
SHA-256 of the last, checked before anything is skipped on resume).

Following polls the store, never reads it whole again: every ``poll_interval`` it asks which sessions
have ``message`` or ``part`` rows updated at or after the last ``time_updated`` it saw (the
watermark; both tables are indexed by session), and reads only their messages after the last one it
presented (by ``(time_created, id)``, the order of OpenCode's own index). A message is presented once
final (``opencode`` says when); rows deleted after they were presented (OpenCode deletes reverted
messages when the next prompt is sent) become a ``removed`` record.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.records import RecordSource, encode_record
from throughline.producers.ingest.state import FileId
from throughline.producers.ingest.tail import Line

__all__ = ["OpenCodeSource", "connect_read_only", "is_final"]

_BUSY_TIMEOUT_S = 1.0
#: A session whose newest row is older than this when it is read is not read again for that row.
SAME_TIME_WINDOW_MS = 2000


def is_final(message: Mapping[str, Any], *, later: bool) -> bool:
    """Whether OpenCode is done writing a message: an assistant message once it has ``time.completed`` or an
    ``error``, a user message (and its parts) once OpenCode has written a later message (``later``)."""
    if message.get("role") == "assistant":
        time = message.get("time")
        return bool(message.get("error")) or (isinstance(time, Mapping) and bool(time.get("completed")))
    return later


def connect_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection to an SQLite file that never takes a write lock (``mode=ro`` URI)."""
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_S, check_same_thread=False)
    conn.execute("PRAGMA query_only = 1")
    return conn


@dataclass(slots=True)
class _Cursor:
    """Where a session's presented messages end."""

    last: tuple[int, str] | None = None  # (time_created, id) of the last message presented
    presented: list[str] = field(default_factory=list)  # the ids of the messages presented, in order


@dataclass(slots=True)
class _Store:
    path: str
    conn: sqlite3.Connection
    file: FileId
    watermark: int | None = None  # the latest time_updated seen (None: nothing read yet)
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)  # session -> (newest time_updated, read at)


class OpenCodeSource(RecordSource):
    """The sessions of OpenCode stores as one line source (``SessionFiles``'s shape; one thread uses it)."""

    def __init__(self, adapter: HostAdapter, roots: list[str], **options: Any) -> None:
        super().__init__(adapter, roots, **options)
        self._stores: dict[str, _Store] = {}
        self._cursors: dict[str, _Cursor] = {}
        self._scan()

    def _scan(self) -> None:
        for root in self.roots:
            for path in self.adapter.session_files(root):
                if path in self._stores:
                    continue
                try:
                    conn = connect_read_only(path)
                    conn.execute("SELECT 1 FROM message LIMIT 1").fetchall()
                    self._stores[path] = _Store(path, conn, FileId.of(os.stat(path)))
                except (sqlite3.Error, OSError) as exc:
                    self._notice(f"{path}: not an OpenCode store ({exc}); skipped")

    # ------------------------------------------------------------------------------------------ reading

    def _changed(self, store: _Store) -> list[str]:
        """The sessions with rows updated since the watermark (every session on the first read)."""
        mark = store.watermark or 0  # the first read: every session
        rows = store.conn.execute(
            "SELECT session_id, max(time_updated) FROM message WHERE time_updated >= ? GROUP BY session_id "
            "UNION ALL SELECT session_id, max(time_updated) FROM part WHERE time_updated >= ? GROUP BY session_id "
            "UNION ALL SELECT id, time_updated FROM session WHERE time_updated >= ?",
            (mark, mark, mark),
        ).fetchall()
        newest: dict[str, int] = {}
        for session_id, updated in rows:
            newest[session_id] = max(newest.get(session_id, 0), updated or 0)
        store.watermark = max([mark, *newest.values()])
        now = int(time.time() * 1000)
        changed = []
        for session_id, updated in sorted(newest.items()):
            seen = store.seen.get(session_id)
            # ``>=`` finds again the rows at the watermark: a session read well after its newest row's time
            # is not read again for them (a write in that same millisecond would have come before the read)
            if seen is not None and seen[0] == updated and seen[1] > updated + SAME_TIME_WINDOW_MS:
                continue
            store.seen[session_id] = (updated, now)
            changed.append(session_id)
        return changed

    def _records(self, store: _Store, session_id: str, s: _Cursor) -> list[dict[str, Any]]:
        """The session's records not presented yet (its final messages after the last one, and removals)."""
        row = store.conn.execute("SELECT id, directory, parent_id FROM session WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            return []
        session = {"id": row[0], "directory": row[1], "parent_id": row[2]}
        out: list[dict[str, Any]] = []
        if s.presented:
            present = {r[0] for r in store.conn.execute("SELECT id FROM message WHERE session_id = ?", (session_id,))}
            removed = [m for m in s.presented if m not in present]
            if removed:
                out.append({"session": session, "removed": removed})
                s.presented = [m for m in s.presented if m in present]
        after = s.last or (-1, "")
        rows = store.conn.execute(
            "SELECT id, time_created, data FROM message WHERE session_id = ? "
            "AND (time_created > ? OR (time_created = ? AND id > ?)) ORDER BY time_created, id",
            (session_id, after[0], after[0], after[1]),
        ).fetchall()
        for i, (message_id, created, data) in enumerate(rows):
            try:
                message = json.loads(data)
            except ValueError:
                message = {}
            if not isinstance(message, dict):
                message = {}
            if not is_final(message, later=i + 1 < len(rows)):
                break  # presented in order: nothing after a message still being written
            message["id"] = message_id
            parts = []
            for part_id, part_data in store.conn.execute(
                "SELECT id, data FROM part WHERE message_id = ? ORDER BY id", (message_id,)
            ):
                try:
                    part = json.loads(part_data)
                except ValueError:
                    continue
                if isinstance(part, dict):
                    part["id"] = part_id
                    parts.append(part)
            out.append({"session": session, "message": message, "parts": parts})
            s.last = (created, message_id)
            s.presented.append(message_id)
        return out

    def lines(self) -> Iterator[Line]:
        """The records presented now, session by session."""
        if self.follow:
            self._scan()
        for store in list(self._stores.values()):
            try:
                for session_id in self._changed(store):
                    path = f"{store.path}#{session_id}"
                    cursor = self._cursors.setdefault(path, _Cursor())
                    records = [encode_record(r) for r in self._records(store, session_id, cursor)]
                    yield from self._present(self._tracked(path), store.file, records)
            except sqlite3.Error as exc:  # busy or mid-migration: the next poll tries again
                self._notice(f"{store.path}: {exc}; read again at the next poll")
        if not self.follow:
            self.eof = True

    def session_ids(self) -> set[str]:
        """The ids of the sessions the stores hold now (a JSON tree's copy of one of them is not read)."""
        ids: set[str] = set()
        for store in self._stores.values():
            try:
                ids.update(row[0] for row in store.conn.execute("SELECT id FROM session"))
            except sqlite3.Error:
                continue  # busy or mid-migration: the tree's copy is read meanwhile (duplicates apply once)
        return ids

    def close(self) -> None:
        """Close every store."""
        for store in self._stores.values():
            store.conn.close()
