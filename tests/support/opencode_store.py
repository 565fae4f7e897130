"""An OpenCode store (``opencode.db``) built from the rows of tests/fixtures/hosts/adapters/opencode/rows.json.

The tables and columns are the ones OpenCode's ``session.sql.ts`` declares that the adapter reads (the
rest are left out); the store is in WAL mode, as OpenCode opens it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE session (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, parent_id TEXT, slug TEXT NOT NULL,
  directory TEXT NOT NULL, title TEXT NOT NULL, version TEXT NOT NULL, revert TEXT,
  time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL);
CREATE TABLE message (id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
  time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX message_session_time_created_id_idx ON message (session_id, time_created, id);
CREATE TABLE part (id TEXT PRIMARY KEY, message_id TEXT NOT NULL REFERENCES message(id) ON DELETE CASCADE,
  session_id TEXT NOT NULL, time_created INTEGER NOT NULL, time_updated INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX part_message_id_id_idx ON part (message_id, id);
CREATE INDEX part_session_idx ON part (session_id);
"""


def open_store(path: Path) -> sqlite3.Connection:
    """A writer's connection (WAL, as OpenCode's), creating the tables when the file is new."""
    new = not path.exists()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    if new:
        conn.executescript(SCHEMA)
    return conn


def add_session(conn: sqlite3.Connection, s: dict[str, Any]) -> None:
    """One ``session`` row."""
    conn.execute(
        "INSERT INTO session VALUES (?, 'prj_1', ?, ?, ?, ?, '1.0.0', NULL, ?, ?)",
        (s["id"], s["parent_id"], s["id"], s["directory"], s["title"], s["created"], s["created"]),
    )


def add_message(conn: sqlite3.Connection, m: dict[str, Any], updated: int | None = None) -> None:
    """One ``message`` row and its ``part`` rows, in one transaction (as OpenCode's writes are)."""
    at = updated or m["created"]
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO message VALUES (?, ?, ?, ?, ?)",
        (m["id"], m["session"], m["created"], at, json.dumps(m["data"])),
    )
    for p in m["parts"]:
        conn.execute(
            "INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)",
            (p["id"], m["id"], m["session"], m["created"], at, json.dumps(p["data"])),
        )
    conn.execute("COMMIT")


def build_store(path: Path, rows_file: Path) -> Path:
    """``path`` (an ``opencode.db``) holding every row of ``rows_file``."""
    rows = json.loads(rows_file.read_text())
    conn = open_store(path)
    try:
        for s in rows["sessions"]:
            add_session(conn, s)
        for m in rows["messages"]:
            add_message(conn, m)
    finally:
        conn.close()
    return path
