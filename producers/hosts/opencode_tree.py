"""OpenCode's JSON tree (``storage/``, its sessions before the SQLite store) read as a line source (``opencode``).

OpenCode wrote every session as JSON files until its SQLite store (which migrates them in on its first
start). Two layouts, both read (docs/hosts.md, "OpenCode's JSON tree"):

- ``<data>/storage``: ``session/<project id>/<session id>.json`` (``directory``, ``parentID``),
  ``message/<session id>/<message id>.json`` and ``part/<message id>/<part id>.json``;
- the first one, ``<data>/project/<folder>/storage``: ``session/info/<session id>.json``,
  ``session/message/<session id>/<message id>.json`` and ``session/part/<session id>/<message id>/<part
  id>.json`` (OpenCode copied it into the other on upgrade and left it in place).

Each session is presented exactly as ``opencode_db`` presents the same session once OpenCode migrated it
(``<storage>#<session id>``: record N is the N-th final message, with its parts, the fields the migration
drops left out), so ``opencode.OpenCodeSession``, the prefix property and the resume state apply
unchanged. Messages come in OpenCode's order of the tree (their ids, which OpenCode makes ascending in
time; parts by id), a message once final (``opencode_db.is_final``); a file that is not (yet) valid JSON
(being written) holds back its session's later messages until it is. A message file deleted after it was
presented becomes a ``removed`` record.

Following polls modification times: per session one ``stat`` of its message folder (it changes when a
message file is added, replaced or deleted) and of the files of its messages not presented yet; a folder or
file is listed or read again only when its time, size or inode changed, or when it had changed within
``FRESH_S`` of the read (a write in the same clock tick would otherwise be missed).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.opencode_db import is_final
from throughline.producers.hosts.records import RecordSource, encode_record
from throughline.producers.ingest.state import FileId
from throughline.producers.ingest.tail import Line

__all__ = ["OpenCodeTreeSource", "Tree", "trees_at"]

#: A folder or file modified this recently (seconds) when read is read again at the next poll.
FRESH_S = 2.0
#: The largest message or part file read (a bigger one is skipped and said).
MAX_FILE_BYTES = 64 * 1024 * 1024
_MESSAGE_DROPPED = ("sessionID",)  # the fields OpenCode's migration into the store drops (ids come from names)
_PART_DROPPED = ("id", "messageID", "sessionID")

Stamp = tuple[int, int, int]  # (inode, size, mtime_ns)


@dataclass(frozen=True, slots=True)
class Tree:
    """One storage folder: ``legacy`` for the first layout (``project/<folder>/storage``)."""

    storage: str
    legacy: bool

    def message_dir(self, session: str) -> str:
        """The folder of a session's message files."""
        if self.legacy:
            return os.path.join(self.storage, "session", "message", session)
        return os.path.join(self.storage, "message", session)

    def part_dir(self, session: str, message: str) -> str:
        """The folder of a message's part files."""
        if self.legacy:
            return os.path.join(self.storage, "session", "part", session, message)
        return os.path.join(self.storage, "part", message)

    def messages_root(self) -> str:
        """The folder holding one folder per session."""
        return os.path.dirname(self.message_dir("x"))

    def info_dirs(self) -> list[str]:
        """The folders of the session files (one per project in the later layout)."""
        if self.legacy:
            return [os.path.join(self.storage, "session", "info")]
        root = os.path.join(self.storage, "session")
        return [os.path.join(root, d) for d in _names(root) if os.path.isdir(os.path.join(root, d))]


def _names(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _json_ids(folder: str) -> list[str]:
    """The ids of the ``<id>.json`` files of a folder, sorted (OpenCode's temporary files left out)."""
    return [n[:-5] for n in _names(folder) if n.endswith(".json") and not n.startswith(".") and len(n) > 5]


def _stamp(path: str) -> tuple[Stamp, bool] | None:
    """(inode, size, mtime) of a path and whether it changed within ``FRESH_S``; None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns), time.time() - st.st_mtime_ns / 1e9 < FRESH_S


def _is_storage(folder: str) -> bool:
    return os.path.isdir(os.path.join(folder, "message")) or os.path.isdir(os.path.join(folder, "session"))


def _tree_of(folder: str) -> Tree:
    return Tree(folder, os.path.isdir(os.path.join(folder, "session", "message")))


def trees_at(root: str) -> list[tuple[Tree, str | None]]:
    """The trees a PATH names, each with the one session it names (``None``: every session of the tree).

    A storage folder; an OpenCode data folder (its ``storage`` and every ``project/*/storage``); or a path
    inside a tree: a session's file or its message folder (or a file in it) names that session.
    """
    root = os.path.abspath(root)
    if os.path.isdir(root) and _inside(root) is None:
        if _is_storage(root):
            return [(_tree_of(root), None)]
        found: list[tuple[Tree, str | None]] = []
        if _is_storage(os.path.join(root, "storage")):
            found.append((_tree_of(os.path.join(root, "storage")), None))
        project = os.path.join(root, "project")
        for name in _names(project):
            storage = os.path.join(project, name, "storage")
            if _is_storage(storage):
                found.append((_tree_of(storage), None))
        return found
    inside = _inside(root)
    if inside is None:
        return []
    storage, rel = inside
    tree = _tree_of(storage)
    parts = rel.split(os.sep)
    if tree.legacy and parts[0] == "session" and len(parts) > 1:
        parts = parts[1:]  # session/info, session/message, session/part
    if len(parts) == 1:
        return [(tree, None)] if parts[0] in ("message", "part", "session", "info") else []
    if parts[0] == "message" or (tree.legacy and parts[0] == "part"):
        return [(tree, parts[1])]  # <folder>/<session id>[/...]
    if (tree.legacy and parts[0] == "info") or (parts[0] == "session" and len(parts) == 3):
        return [(tree, parts[-1][:-5])] if parts[-1].endswith(".json") else []
    return []  # a part's file names its message, not its session; a project's folder many sessions


def _inside(path: str) -> tuple[str, str] | None:
    """(storage folder, path relative to it) when ``path`` lies within a storage folder."""
    head, rel = path, ""
    while True:
        parent, name = os.path.split(head)
        if name == "storage" and _is_storage(head):
            return (head, rel) if rel else None
        if not name or parent == head:
            return None
        rel = os.path.join(name, rel) if rel else name
        head = parent


def _read_json(path: str) -> Any:
    """A file's JSON value; ``None`` when it is missing, too big or not (yet) valid JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_FILE_BYTES:
        return None
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None


@dataclass(slots=True)
class _Session:
    """One session of a tree and how far it was presented."""

    tree: Tree
    id: str
    path: str  # the source's name for the session: <storage>#<session id>
    info: dict[str, Any] | None = None
    listed: Stamp | None = None  # the message folder when it was last listed (None: list it again)
    ids: list[str] = field(default_factory=list)  # the message ids listed, in order
    presented: list[str] = field(default_factory=list)
    last: str = ""  # the id of the last message presented or passed over
    read: dict[str, tuple[Stamp, Any]] = field(default_factory=dict)  # message id -> file stamp, content
    said: set[str] = field(default_factory=set)  # what was said about it (once each)


class OpenCodeTreeSource(RecordSource):
    """The sessions of OpenCode's JSON trees as one line source (``SessionFiles``'s shape; one thread).

    ``exclude`` gives the session ids read elsewhere (the SQLite stores of the same run): a tree's session
    with one of those ids is left out.
    """

    def __init__(
        self,
        adapter: HostAdapter,
        roots: list[str],
        *,
        exclude: Callable[[], set[str]] = set,
        **options: Any,
    ) -> None:
        super().__init__(adapter, [], **options)  # a missing PATH is the store source's to report
        self.roots = [os.path.abspath(r) for r in roots]
        self._exclude = exclude
        self._sessions: dict[str, _Session] = {}  # session id -> session (one tree each)
        self._left_out: set[str] = set()
        self._roots_seen: dict[str, Stamp] = {}  # a tree's session folders when last listed

    # ------------------------------------------------------------------------------------------ finding

    def _find(self) -> None:
        """New sessions of every tree (a folder is listed again only when it changed)."""
        found: list[tuple[Tree, str]] = []
        for root in self.roots:
            for tree, only in trees_at(root):
                if only is not None:
                    found.append((tree, only))
                    continue
                folder = tree.messages_root()
                stamp = _stamp(folder)
                if stamp is None or self._roots_seen.get(folder) == stamp[0]:
                    continue
                if not stamp[1]:
                    self._roots_seen[folder] = stamp[0]
                found.extend((tree, sid) for sid in _names(folder) if os.path.isdir(os.path.join(folder, sid)))
        # the later layout first: the first one's sessions were copied into it (same ids)
        new = [(t, s) for t, s in sorted(found, key=lambda f: f[0].legacy) if s not in self._sessions]
        new = [(t, s) for t, s in new if s not in self._left_out]
        if not new:
            return
        elsewhere = self._exclude()
        in_store: dict[str, int] = {}
        for tree, sid in new:
            if sid in self._sessions:
                continue  # the same session in two trees (OpenCode's upgrade copied it): the first one found
            if sid in elsewhere:
                self._left_out.add(sid)
                in_store[tree.storage] = in_store.get(tree.storage, 0) + 1
                continue
            self._sessions[sid] = _Session(tree, sid, f"{tree.storage}#{sid}")
        for storage, count in sorted(in_store.items()):
            self._notice(f"{storage}: {count} sessions are in the SQLite store too; read from the store")

    def _info(self, s: _Session) -> dict[str, Any] | None:
        """The session's ``{"id", "directory", "parent_id"}`` as the store holds it, once its file is readable."""
        if s.info is not None:
            return s.info
        data = None
        for folder in s.tree.info_dirs():
            data = _read_json(os.path.join(folder, f"{s.id}.json"))
            if data is not None:
                break
        if not isinstance(data, dict):
            self._say(s, "info", f"{s.path}: no readable session file yet; read at the next poll")
            return None
        directory = data.get("directory")
        if directory is None and s.tree.legacy:
            directory = self._legacy_directory(s)  # the first layout's sessions name no directory
            if directory is None and self.follow:
                self._say(s, "cwd", f"{s.path}: no message names the session's folder yet; read at the next poll")
                return None
        s.info = {"id": s.id, "directory": "" if directory is None else directory, "parent_id": data.get("parentID")}
        return s.info

    @staticmethod
    def _legacy_directory(s: _Session) -> str | None:
        # OpenCode's own upgrade took a first-layout project's folder from an assistant message's path
        folder = s.tree.message_dir(s.id)
        for mid in _json_ids(folder):
            message = _read_json(os.path.join(folder, f"{mid}.json"))
            path = message.get("path") if isinstance(message, dict) else None
            if isinstance(path, dict) and isinstance(path.get("cwd") or path.get("root"), str):
                return str(path.get("cwd") or path.get("root"))
        return None

    def _say(self, s: _Session, key: str, message: str) -> None:
        if key not in s.said:
            s.said.add(key)
            self._notice(message)

    # ------------------------------------------------------------------------------------------ reading

    def _message(self, s: _Session, mid: str) -> Any:
        """A message file's JSON (read again only when the file changed or was fresh); ``None``: unreadable."""
        path = os.path.join(s.tree.message_dir(s.id), f"{mid}.json")
        stamp = _stamp(path)
        if stamp is None:
            return None
        cached = s.read.get(mid)
        if cached is not None and cached[0] == stamp[0]:
            return cached[1]
        data = _read_json(path)
        if not stamp[1] and data is not None:
            s.read[mid] = (stamp[0], data)
        return data

    def _parts(self, s: _Session, mid: str, message: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The message's parts in id order (``None`` while one of them is not valid JSON yet)."""
        folder = s.tree.part_dir(s.id, mid)
        ids = _json_ids(folder)
        inline = message.pop("parts", None)
        if not ids and isinstance(inline, list):
            raw: list[tuple[str, Any]] = [(str(p.get("id", i)), p) for i, p in enumerate(inline) if isinstance(p, dict)]
        else:
            raw = []
            for pid in ids:
                part = _read_json(os.path.join(folder, f"{pid}.json"))
                if part is None and os.path.exists(os.path.join(folder, f"{pid}.json")):
                    return None
                raw.append((pid, part))
        parts = []
        for pid, part in raw:
            if isinstance(part, dict):
                part = {k: v for k, v in part.items() if k not in _PART_DROPPED}
                part["id"] = pid
                parts.append(part)
        return parts

    def _records(self, s: _Session, session: dict[str, Any]) -> list[dict[str, Any]]:
        """The session's records not presented yet (its final messages after the last one, and removals)."""
        folder = s.tree.message_dir(s.id)
        stamp = _stamp(folder)
        if stamp is None:
            return []
        out: list[dict[str, Any]] = []
        if s.listed != stamp[0]:
            s.ids = _json_ids(folder)
            s.listed = None if stamp[1] else stamp[0]
            present = set(s.ids)
            removed = [m for m in s.presented if m not in present]
            if removed:
                out.append({"session": session, "removed": removed})
                s.presented = [m for m in s.presented if m in present]
        todo = [m for m in s.ids if m > s.last]
        for i, mid in enumerate(todo):
            data = self._message(s, mid)
            if not isinstance(data, dict):
                self._say(s, f"json {mid}", f"{s.path}: message {mid} is not valid JSON (yet); later ones wait for it")
                break
            if "metadata" in data and "role" in data and "time" not in data:
                self._say(s, "v1", f"{s.path}: messages of OpenCode's first message format are not read")
                s.last = mid  # passed over, never blocking (OpenCode converted them itself)
                continue
            if not is_final(data, later=i + 1 < len(todo)):
                break  # presented in order: nothing after a message still being written
            message = {k: v for k, v in data.items() if k not in _MESSAGE_DROPPED}
            parts = self._parts(s, mid, message)
            if parts is None:
                self._say(s, f"part {mid}", f"{s.path}: a part of message {mid} is not valid JSON (yet); waiting")
                break
            message["id"] = mid
            out.append({"session": session, "message": message, "parts": parts})
            s.presented.append(mid)
            s.last = mid
            s.read.pop(mid, None)
        return out

    def lines(self) -> Iterator[Line]:
        """The records presented now, session by session."""
        if self.follow or not self._sessions:
            self._find()
        for sid in sorted(self._sessions, key=lambda k: self._sessions[k].path):
            s = self._sessions[sid]
            session = self._info(s)
            if session is None:
                continue
            records = [encode_record(r) for r in self._records(s, session)]
            if not records:
                continue
            try:
                file = FileId.of(os.stat(s.tree.message_dir(s.id)))
            except OSError:
                file = FileId(0, 0)
            yield from self._present(self._tracked(s.path), file, records)
        if not self.follow:
            self.eof = True
