"""GitHub Copilot CLI session event logs (``~/.copilot/session-state/<id>/events.jsonl``) as completed turns (pure).

Read from the session event schema the Copilot SDK generates from the CLI's own (github/copilot-sdk
``nodejs/src/generated/session-events.ts``; the CLI itself is not open source: docs/hosts.md). Each line
is one event ``{"type", "id", "timestamp", "parentId", "data"}``; events the CLI marks ``ephemeral``
(``session.idle``, ``session.snapshot_rewind``, deltas) are never written. Unknown types and fields are
ignored.

Mapping:

- thread = ``session.start.data.sessionId`` written before the first prompt (else the session's folder name); project = the
  ``context.cwd`` of the latest ``session.start`` / ``session.resume`` / ``session.context_changed``
  when the prompt is sent (else the ``cwd`` of the session's ``workspace.yaml``, which the adapter
  reads). A chain is one (project, host, thread): seq counts the session's turns in the turn's project.
- A human prompt is a ``user.message`` with no ``source`` (guess: a ``source`` marks text the host or a
  skill or another agent injected) that is not an autopilot continuation; turnId = the event's ``id``.
  One prompt starts one turn, however many model calls (``assistant.turn_start`` ... ``turn_end``,
  the CLI's own "turns") it takes.
- The reply is the last ``assistant.message`` ``content`` with text; tool calls are its
  ``toolRequests`` (and any ``tool.execution_start`` not requested so), each waiting for its
  ``tool.execution_complete``. Sub-agent events (``agentId`` or ``parentToolCallId`` set) are left out.
- A turn ends at the first of: an ``assistant.turn_end`` after the model answered with no tool call
  waiting (the agent loop stops there; outcome ``answered``); an ``abort`` (``interrupted``); the next
  human prompt (``answered``, ``aborted`` after a ``session.error``, else ``interrupted``); ``settle()``
  (the ``agentStop`` hook, or a file that stopped growing) once the model answered. completedAt = the
  timestamp of the turn's last ``assistant.message`` (the ``abort``'s for an interrupt), whatever ends it.
- Rewinds: the CLI removes the rewound events from the file (``session.snapshot_rewind`` says how many,
  and is not written), so throughline reads the shortened file again from its start and the next
  prompt's seq continues from what is left. A guess, as Copilot CLI's rewind is not documented on disk.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.builtin import home
from throughline.producers.hosts.lines import SessionParser, nonempty_str, timestamp_micros
from throughline.producers.hosts.render import HostTurn, tool_line
from throughline.producers.hosts.turns import (
    ANSWERED,
    INTERRUPTED,
    Chain,
    OpenTurn,
    OpenTurnSession,
    host_turn,
)

__all__ = ["HOST", "CopilotCliHost", "CopilotCliSession"]

HOST = "copilot-cli"
_CONTEXT_EVENTS = ("session.start", "session.resume")


def _image_count(data: Mapping[str, Any]) -> int:
    attachments = data.get("attachments")
    if not isinstance(attachments, list):
        return 0
    return sum(1 for a in attachments if isinstance(a, Mapping) and a.get("type") in ("image", "blob"))


class CopilotCliSession(OpenTurnSession):
    """The turns of one Copilot CLI ``events.jsonl``, fed line by line in file order (prefix-stable)."""

    host = HOST

    def __init__(self, default_thread: str, workspace_cwd: str | None = None) -> None:
        self.default_thread = default_thread
        self.thread: str | None = None
        self.cwd = workspace_cwd
        self.chains: dict[str, Chain] = {}  # per project: a chain is one (project, host, thread)
        self._open: OpenTurn | None = None
        self._last_number = 0
        self.problems: list[str] = []

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one parsed line completes."""
        self._last_number = number
        kind = entry.get("type")
        data = entry.get("data")
        if not isinstance(kind, str) or not isinstance(data, Mapping) or entry.get("ephemeral") is True:
            return []
        if kind in _CONTEXT_EVENTS or kind == "session.context_changed":
            if kind == "session.start" and self.thread is None:
                self.thread = nonempty_str(data.get("sessionId"))
            context = data if kind == "session.context_changed" else data.get("context")
            cwd = nonempty_str(context.get("cwd")) if isinstance(context, Mapping) else None
            if cwd is not None:
                self.cwd = cwd
                if self._open is not None and self._open.project is None:
                    self._open.project = cwd
                    self._open.seq = self._chain(cwd).next_seq()
            return []
        if entry.get("agentId") or data.get("parentToolCallId"):
            return []  # a sub-agent's work: not the main agent's conversation
        micros = timestamp_micros(entry.get("timestamp"))
        if kind == "user.message":
            if self.thread is None:
                # a session's first prompt names its thread for good: a session.start written after it
                # must not move the turns already sent to another thread (as Gemini CLI's metadata)
                self.thread = self.default_thread
            return self._prompt(number, entry, data, micros)
        open_ = self._open
        if open_ is None:
            return []
        if kind == "assistant.message":
            for request in data.get("toolRequests") or []:
                if isinstance(request, Mapping):
                    line = tool_line(request.get("name"), request.get("arguments"))
                    open_.call(nonempty_str(request.get("toolCallId")), line)
            content = data.get("content")
            open_.said(content if isinstance(content, str) else "", micros)
            if data.get("toolRequests"):
                open_.answered_last = False
        elif kind == "tool.execution_start":
            line = tool_line(data.get("toolName"), data.get("arguments"))
            open_.call(nonempty_str(data.get("toolCallId")), line)
        elif kind == "tool.execution_complete":
            open_.result(nonempty_str(data.get("toolCallId")))
        elif kind == "assistant.turn_end" and open_.answered():
            return self._close(number, ANSWERED)
        elif kind == "abort":
            open_.last_micros = micros if micros is not None else open_.last_micros
            return self._close(number, INTERRUPTED)
        elif kind in ("session.error", "model.call_failure"):
            open_.failed = True
        return []

    def _prompt(
        self, number: int, entry: dict[str, Any], data: Mapping[str, Any], micros: int | None
    ) -> list[HostTurn]:
        content = data.get("content")
        text = content if isinstance(content, str) else ""
        if data.get("source") or data.get("isAutopilotContinuation"):
            return []  # injected by a skill, an agent or autopilot: context, no prompt
        images = _image_count(data)
        prompt = "\n\n".join([text] * bool(text.strip()) + ["[image]"] * images)
        turn_id = nonempty_str(entry.get("id"))
        if not prompt or turn_id is None:
            return []
        out = self._close(number, self._open.outcome()) if self._open is not None else []
        self._open = OpenTurn(turn_id, prompt, self.cwd, self._chain(self.cwd).next_seq(), micros)
        return out

    def _chain(self, project: str | None) -> Chain:
        return self.chains.setdefault(project or "", Chain())

    def _close(self, number: int, outcome: str) -> list[HostTurn]:
        open_ = self._open
        self._open = None
        if open_ is None:
            return []
        completed = open_.last_micros if open_.last_micros is not None else open_.prompt_micros
        if open_.project is None or completed is None:
            self.problems.append(
                f"turn {open_.turn_id} has no {'cwd' if open_.project is None else 'timestamp'}; left out"
            )
            return []
        self._chain(open_.project).add(open_.seq, open_.turn_id)
        return [host_turn(HOST, self.thread or self.default_thread, open_, open_.project, completed, number, outcome)]


def workspace_cwd(folder: str) -> str | None:
    """The ``cwd:`` of a session folder's ``workspace.yaml`` (a plain scalar; guess at the key's name)."""
    try:
        with open(os.path.join(folder, "workspace.yaml"), encoding="utf-8") as f:
            for line in f.read(64 * 1024).splitlines():
                key, sep, value = line.partition(":")
                if sep and key.strip() == "cwd" and not line.startswith((" ", "\t")):
                    value = value.strip().strip("'\"")
                    return value or None
    except OSError:
        pass
    return None


class CopilotCliHost(HostAdapter):
    """GitHub Copilot CLI's ``~/.copilot/session-state/<id>/events.jsonl`` event logs."""

    name = HOST
    summary = "GitHub Copilot CLI session event logs (~/.copilot/session-state)"
    hook_event = "agentStop"

    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """``$COPILOT_HOME/session-state`` (guess: ``~/.copilot`` unless ``COPILOT_HOME`` says otherwise)."""
        return [os.path.join(home(environ, "COPILOT_HOME", ".copilot"), "session-state")]

    def is_session_file(self, path: str) -> bool:
        """``<id>/events.jsonl``, and the single-file ``<id>.jsonl`` logs of earlier versions."""
        name = os.path.basename(path)
        if name == "events.jsonl":
            return True
        return name.endswith(".jsonl") and os.path.basename(os.path.dirname(path)) == "session-state"

    def skip_folder(self, name: str) -> bool:
        """A session's ``checkpoints`` and ``files`` folders."""
        return name in ("checkpoints", "files")

    def default_thread(self, path: str) -> str:
        """The session folder's name for ``events.jsonl``, else the file name."""
        if os.path.basename(path) == "events.jsonl":
            return os.path.basename(os.path.dirname(os.path.abspath(path))) or "session"
        return super().default_thread(path)

    def new_parser(self, path: str) -> SessionParser:
        """A ``CopilotCliSession`` with the session folder's ``workspace.yaml`` cwd as its first project."""
        folder = os.path.dirname(os.path.abspath(path))
        cwd = workspace_cwd(folder) if os.path.basename(path) == "events.jsonl" else None
        return CopilotCliSession(self.default_thread(path), cwd)
