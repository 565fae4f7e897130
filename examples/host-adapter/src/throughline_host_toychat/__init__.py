"""ToyChat, a made-up agent host, as a throughline host adapter (the worked example of docs/hosts.md).

ToyChat appends one JSON object a line to ``$TOYCHAT_HOME/sessions/<session>.jsonl``
(``~/.toychat`` by default)::

    {"event": "prompt", "id": "p-1", "at": "2026-05-01T10:00:00Z", "cwd": "/work/app", "text": "Fix it."}
    {"event": "tool", "at": "2026-05-01T10:00:01Z", "name": "bash", "input": {"command": "pytest"}}
    {"event": "reply", "at": "2026-05-01T10:00:02Z", "text": "Fixed."}
    {"event": "done", "at": "2026-05-01T10:00:02Z"}
    {"event": "note", "at": "...", "text": "context ToyChat injected"}     # never a prompt
    {"event": "cancelled", "at": "2026-05-01T10:00:09Z"}                   # the user stopped it
    {"event": "rewind", "to": "p-1"}                                       # p-1 and later taken back

Mapping: thread = the file name; project = the prompt's ``cwd``; turnId = the prompt's ``id``; the turn
ends at ``done`` (answered) or ``cancelled`` (interrupted), or at ``settle()`` once it has a reply.
completedAt = the turn's last ``reply`` (the ``cancelled`` line's time for an interrupt).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.lines import SessionParser, nonempty_str, timestamp_micros
from throughline.producers.hosts.render import OUTCOME_ATTRIBUTE, HostTurn, render_body, tool_line

__all__ = ["ToyChatHost", "ToyChatSession"]

HOST = "toychat"


@dataclass
class _Turn:
    turn_id: str
    project: str
    prompt: str
    seq: int
    tools: list[str] = field(default_factory=list)
    reply: str = ""
    last: int | None = None


class ToyChatSession(SessionParser):
    """One ToyChat session, fed line by line: deterministic and prefix-stable (a turn is sent only
    once a later line, or ``settle``, says ToyChat will add nothing to it)."""

    host = HOST

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.chain: list[str] = []  # the thread's turn ids, oldest first
        self.open: _Turn | None = None
        self.problems: list[str] = []

    @property
    def open_turn(self) -> bool:
        """Whether a prompt's turn is in progress."""
        return self.open is not None

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one line completes."""
        event, at = entry.get("event"), timestamp_micros(entry.get("at"))
        if event == "prompt":
            turn_id, cwd, text = (
                nonempty_str(entry.get("id")),
                nonempty_str(entry.get("cwd")),
                entry.get("text"),
            )
            if turn_id is None or cwd is None or not isinstance(text, str):
                self.problems.append(f"line {number}: a prompt without id, cwd or text; left out")
                return []
            out = self._end(number, "interrupted", None) if self.open else []
            self.open = _Turn(turn_id, cwd, text, len(self.chain) + 1, last=at)
            return out
        if event == "rewind" and isinstance(entry.get("to"), str):
            self.open = None
            if entry["to"] in self.chain:
                del self.chain[self.chain.index(entry["to"]) :]
            return []
        if self.open is None:
            return []
        if event == "tool":
            self.open.tools.append(tool_line(entry.get("name"), entry.get("input")))
        elif event == "reply" and isinstance(entry.get("text"), str):
            self.open.reply, self.open.last = entry["text"], at or self.open.last
        elif event == "done":
            return self._end(number, "answered", None)
        elif event == "cancelled":
            return self._end(number, "interrupted", at)
        return []

    def settle(self, final: bool = False) -> list[HostTurn]:
        """The open turn once the file is final, if it has its reply."""
        return self._end(0, "answered", None) if self.open is not None and self.open.reply else []

    def _end(self, number: int, outcome: str, at: int | None) -> list[HostTurn]:
        turn, self.open = self.open, None
        completed = at if at is not None else turn.last if turn else None
        if turn is None or completed is None:
            return []
        del self.chain[turn.seq - 1 :]
        self.chain.append(turn.turn_id)
        body, attributes = render_body(turn.prompt, turn.tools, turn.reply)
        return [
            HostTurn(
                host=HOST,
                thread=self.thread,
                project=turn.project,
                turn_id=turn.turn_id,
                completed_at_micros=completed,
                body=body,
                seq=turn.seq,
                line=number,
                attributes={
                    "ingest.format": HOST,
                    "ingest.line": str(number),
                    OUTCOME_ATTRIBUTE: outcome,
                    **attributes,
                },
            )
        ]


class ToyChatHost(HostAdapter):
    """Where ToyChat keeps its sessions and how to read them."""

    name = HOST
    summary = "ToyChat session files (~/.toychat/sessions)"
    hook_event = "stop"  # ToyChat runs `throughline hook toychat` with {"transcript_path": ...} on stdin

    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """``$TOYCHAT_HOME/sessions``."""
        home = environ.get("TOYCHAT_HOME") or os.path.join(os.path.expanduser("~"), ".toychat")
        return [os.path.join(home, "sessions")]

    def is_session_file(self, path: str) -> bool:
        """``*.jsonl``."""
        return path.endswith(".jsonl")

    def new_parser(self, path: str) -> SessionParser:
        """A ``ToyChatSession`` named after its file."""
        return ToyChatSession(self.default_thread(path))
