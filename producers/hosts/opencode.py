"""OpenCode sessions (its SQLite store ``opencode.db``, and the JSON tree ``storage/`` OpenCode wrote before it)
as completed turns: the parser (pure) and the adapter.

OpenCode keeps sessions in three tables (``packages/opencode/src/session/session.sql.ts``): ``session``
(``id``, ``parent_id``, ``directory``, ``revert``, ...), ``message`` (``id``, ``session_id``,
``time_created``, ``time_updated``, ``data``: the message as JSON) and ``part`` (``id``, ``message_id``,
``session_id``, ``data``). Rows change while a message streams, so ``opencode_db.OpenCodeSource``
presents each session as a list of immutable records, one JSON object each, appended in message order
only once a message is final (a user message once a later message exists; an assistant message once it
has ``time.completed`` or an ``error``); ``opencode_tree.OpenCodeTreeSource`` presents a session of the older
JSON tree as the very same records::

    {"session": {"id", "directory", "parent_id"}, "message": {"id", "role", ...}, "parts": [{...}, ...]}
    {"session": {...}, "removed": ["<message id>", ...]}   # rows of messages seen before, now deleted

Mapping (docs/hosts.md):

- thread = the session id; project = the session's ``directory``. A session with a ``parent_id`` is a
  subagent's (a task's) own conversation: no turns.
- A human prompt is a ``user`` message with a text part that is neither ``synthetic`` nor ``ignored``
  (file parts are ``[image]`` or ``[file NAME]``); turnId = the message id.
- The turn's ``assistant`` messages carry its tool calls (``tool`` parts: ``tool``, ``callID``,
  ``state.input``) and its reply (the last message's non-synthetic text parts). The turn ends at the
  first assistant message that finished for another reason than calling tools (``finish`` other than
  ``tool-calls``: outcome ``answered``), or that ended in an ``error`` (``MessageAbortedError``:
  ``interrupted``; else ``aborted``), or at the next prompt. completedAt = that message's
  ``time.completed`` (else its ``time.created``), in milliseconds.
- A compaction (a ``user`` message with a ``compaction`` part, then an assistant message with
  ``summary: true``) is OpenCode's own work: neither ends nor answers the open turn.
- Reverting (``/undo``) hides the messages from a point on, and OpenCode deletes them when the next prompt
  is sent: a ``removed`` record then takes the turns of the deleted prompts off the chain, so the next
  prompt's seq rewinds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.lines import SessionParser, nonempty_str
from throughline.producers.hosts.render import HostTurn, tool_line
from throughline.producers.hosts.turns import (
    ABORTED,
    ANSWERED,
    INTERRUPTED,
    Chain,
    OpenTurn,
    OpenTurnSession,
    host_turn,
)

__all__ = ["HOST", "OpenCodeHost", "OpenCodeSession"]

HOST = "opencode"
_DONE = ("completed", "error")
_ABORTED_ERROR = "MessageAbortedError"


def _millis(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return int(value) * 1000


def _texts(parts: list[Any]) -> list[str]:
    out = []
    for part in parts:
        if not isinstance(part, Mapping) or part.get("synthetic") or part.get("ignored"):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str) and part["text"].strip():
            out.append(part["text"])
    return out


def _files(parts: list[Any]) -> list[str]:
    out = []
    for part in parts:
        if isinstance(part, Mapping) and part.get("type") == "file" and not part.get("synthetic"):
            mime = part.get("mime")
            image = isinstance(mime, str) and mime.startswith("image/")
            out.append("[image]" if image else f"[file {part.get('filename') or ''}]".replace(" ]", "]"))
    return out


class OpenCodeSession(OpenTurnSession):
    """The turns of one OpenCode session, fed its records (``OpenCodeSource``) in order (prefix-stable)."""

    host = HOST

    def __init__(self, default_thread: str) -> None:
        self.default_thread = default_thread
        self.chain = Chain()
        self._open: OpenTurn | None = None
        self._thread: str | None = None
        self._last_number = 0
        self.problems: list[str] = []

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one record completes."""
        self._last_number = number
        session = entry.get("session")
        if not isinstance(session, Mapping) or session.get("parent_id"):
            return []
        self._thread = nonempty_str(session.get("id")) or self._thread
        removed = entry.get("removed")
        if isinstance(removed, list):
            self._remove({r for r in removed if isinstance(r, str)})
            return []
        message = entry.get("message")
        parts = entry.get("parts")
        if not isinstance(message, Mapping) or not isinstance(parts, list):
            return []
        message_id = nonempty_str(message.get("id"))
        if message_id is None:
            return []
        if message.get("role") == "user":
            prompt = "\n\n".join(_texts(parts) + _files(parts)) if _texts(parts) else ""
            if not prompt:
                return []  # a compaction request or another message OpenCode writes itself
            out = self._close(number, self._open.outcome()) if self._open is not None else []
            time = message.get("time")
            created = _millis(time.get("created")) if isinstance(time, Mapping) else None
            project = nonempty_str(session.get("directory"))
            self._open = OpenTurn(message_id, prompt, project, self.chain.next_seq(), created)
            return out
        open_ = self._open
        if open_ is None or message.get("role") != "assistant" or message.get("summary"):
            return []  # a compaction's summary is OpenCode's own message, not the model's answer to the prompt
        for part in parts:
            if isinstance(part, Mapping) and part.get("type") == "tool":
                state = part.get("state")
                state = state if isinstance(state, Mapping) else {}
                line = tool_line(part.get("tool"), state.get("input"))
                open_.call(nonempty_str(part.get("callID")), line, done=state.get("status") in _DONE)
        time = message.get("time")
        time = time if isinstance(time, Mapping) else {}
        completed = _millis(time.get("completed")) or _millis(time.get("created"))
        open_.said("\n\n".join(_texts(parts)), completed)
        error = message.get("error")
        if isinstance(error, Mapping):
            return self._close(number, INTERRUPTED if error.get("name") == _ABORTED_ERROR else ABORTED)
        finish = message.get("finish")
        if isinstance(finish, str) and finish not in ("tool-calls", "unknown"):
            return self._close(number, ANSWERED if open_.answered() else INTERRUPTED)
        if finish == "tool-calls":
            open_.answered_last = False
        return []

    def _close(self, number: int, outcome: str) -> list[HostTurn]:
        open_ = self._open
        self._open = None
        if open_ is None:
            return []
        completed = open_.last_micros if open_.last_micros is not None else open_.prompt_micros
        if open_.project is None or completed is None:
            self.problems.append(
                f"turn {open_.turn_id} has no {'directory' if open_.project is None else 'time'}; left out"
            )
            return []
        self.chain.add(open_.seq, open_.turn_id)
        return [host_turn(HOST, self._thread or self.default_thread, open_, open_.project, completed, number, outcome)]

    def _remove(self, removed: set[str]) -> None:
        if self._open is not None and self._open.turn_id in removed:
            self._open = None
        for turn_id in self.chain.turn_ids:
            if turn_id in removed:
                self.chain.rewind_to(turn_id)
                break


class OpenCodeHost(HostAdapter):
    """OpenCode's ``opencode.db`` and its older JSON tree ``storage/`` (``$XDG_DATA_HOME/opencode``), read as rows."""

    name = HOST
    summary = "OpenCode sessions (its SQLite store ~/.local/share/opencode/opencode.db, and the older storage/ tree)"
    reads = "rows"
    hook_event = None  # OpenCode's hooks are JavaScript plug-ins, not commands: follow the store instead

    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """``$XDG_DATA_HOME/opencode`` (``~/.local/share/opencode`` by default)."""
        data = environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        return [os.path.join(data, "opencode")]

    def is_session_file(self, path: str) -> bool:
        """``opencode.db`` (and ``opencode-<channel>.db``, guess: a release channel's own store)."""
        name = os.path.basename(path)
        return name.startswith("opencode") and name.endswith(".db")

    def skip_folder(self, name: str) -> bool:
        """Everything below the data folder: the store is the ``*.db`` file at its top."""
        return True

    def default_thread(self, path: str) -> str:
        """The session id after the ``#`` of a source name (``/path/opencode.db#ses_...``)."""
        return path.rpartition("#")[2] or "session"

    def new_parser(self, path: str) -> SessionParser:
        """An ``OpenCodeSession``."""
        return OpenCodeSession(self.default_thread(path))

    def open_source(
        self,
        roots: list[str],
        *,
        follow: bool,
        states: Mapping[str, Any],
        poll_interval: float,
        notice: Callable[[str], None],
    ) -> Any:
        """The stores under ``roots`` (``OpenCodeSource``) and the JSON trees (``OpenCodeTreeSource``), as one
        source; a session both hold is read from the store (OpenCode's migration target)."""
        from throughline.producers.hosts.opencode_db import OpenCodeSource
        from throughline.producers.hosts.opencode_tree import OpenCodeTreeSource, trees_at
        from throughline.producers.hosts.records import CombinedSource

        options: dict[str, Any] = {"follow": follow, "states": states, "poll_interval": poll_interval, "notice": notice}
        in_tree = [r for r in roots if os.path.isfile(r) and trees_at(r)]  # a session's file
        stores = OpenCodeSource(self, [r for r in roots if r not in in_tree], **options)
        tree_roots = [r for r in roots if os.path.isdir(r) or r in in_tree or (follow and not os.path.exists(r))]
        trees = OpenCodeTreeSource(self, tree_roots, exclude=stores.session_ids, **options)
        combined = CombinedSource([stores, trees])
        combined.path = ", ".join(roots)
        return combined
