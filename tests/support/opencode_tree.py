"""OpenCode's JSON tree (``storage/``) written from the rows of tests/fixtures/hosts/adapters/opencode/rows.json.

The files are those OpenCode's ``Storage.write`` made before its SQLite store (pretty JSON, indent 2):
the later layout ``session/<project id>/<session id>.json``, ``message/<session id>/<message id>.json``,
``part/<message id>/<part id>.json``, or the first one (``legacy``) ``session/info/<session id>.json``,
``session/message/<session id>/<message id>.json``, ``session/part/<session id>/<message id>/<part id>.json``.
A message and a part carry their own ``id``, ``sessionID`` (and ``messageID``), which OpenCode's migration
into the store drops (the ids come from the file names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROJECT = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"  # a git root commit, as OpenCode names a project


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def session_file(storage: Path, s: dict[str, Any], *, legacy: bool = False) -> Path:
    """A session's file (``Session.Info``: ``id``, ``projectID``, ``directory``, ``parentID``, ``title``, ...)."""
    info: dict[str, Any] = {
        "id": s["id"],
        "version": "0.15.0",
        "projectID": PROJECT,
        "directory": s["directory"],
        "title": s["title"],
        "time": {"created": s["created"], "updated": s["created"]},
    }
    if s.get("parent_id"):
        info["parentID"] = s["parent_id"]
    if legacy:
        del info["directory"], info["projectID"]  # the first layout's sessions knew no directory (guess)
        path = storage / "session" / "info" / f"{s['id']}.json"
    else:
        path = storage / "session" / PROJECT / f"{s['id']}.json"
    _write(path, info)
    return path


def message_file(storage: Path, m: dict[str, Any], *, legacy: bool = False, parts: bool = True) -> Path:
    """A message's file and (``parts``) its parts' files, as OpenCode wrote them."""
    sid, mid = m["session"], m["id"]
    folder = storage / "session" / "message" / sid if legacy else storage / "message" / sid
    if parts:
        for p in m["parts"]:
            part_folder = storage / "session" / "part" / sid / mid if legacy else storage / "part" / mid
            _write(part_folder / f"{p['id']}.json", {"id": p["id"], "sessionID": sid, "messageID": mid, **p["data"]})
    path = folder / f"{mid}.json"
    _write(path, {"id": mid, "sessionID": sid, **m["data"]})
    return path


def write_tree(storage: Path, rows_file: Path, *, legacy: bool = False) -> Path:
    """``storage`` holding every session and message of ``rows_file``."""
    rows = json.loads(rows_file.read_text())
    for s in rows["sessions"]:
        session_file(storage, s, legacy=legacy)
    for m in rows["messages"]:
        message_file(storage, m, legacy=legacy)
    return storage
