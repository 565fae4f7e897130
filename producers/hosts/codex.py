"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) as completed turns (pure).

Each line is ``{"timestamp", "type", "payload"}`` with ``type`` one of ``session_meta``,
``turn_context``, ``response_item``, ``event_msg``, ``compacted`` (codex-rs ``RolloutLine`` /
``RolloutItem``). Unknown types, unknown ``payload.type`` values and unknown fields are ignored.

Mapping (docs/hosts.md):

- thread = the *first* ``session_meta.payload.id`` of the file (a forked rollout repeats its parent's
  meta after its own); project = the ``cwd`` of the turn's ``turn_context`` (else the session meta's).
- A turn runs from ``event_msg`` ``task_started`` (alias ``turn_started``) to ``task_complete`` (alias
  ``turn_complete``): turnId = ``turn_id``, completedAt = the completing line's timestamp. The prompt is
  the turn's ``user_message`` events (else its ``response_item`` user messages that are not injected
  context: ``<environment_context>``, ``<user_instructions>``, AGENTS.md, ...; developer and system
  messages never); a turn without a human prompt (a compaction, a review) is no turn. The reply is
  ``task_complete.last_agent_message``, else the last ``agent_message``, else the last assistant
  ``response_item``. Tool calls are ``function_call``, ``custom_tool_call``, ``local_shell_call`` and
  ``web_search_call`` items.
- ``turn_aborted`` ends the turn without completing it. ``thread_rolled_back {num_turns}`` drops the
  last ``num_turns`` user turns (completed or aborted, as Codex counts them), so the next completed
  turn's seq rewinds the chain to there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from throughline.producers.hosts.lines import SessionParser, nonempty_str, timestamp_micros
from throughline.producers.hosts.render import HostTurn, render_body, text_of, tool_line

HOST = "codex"
#: Text Codex records as a user message that is context it injected, not a human prompt.
INJECTED_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<permissions instructions>",
    "<INSTRUCTIONS>",
    "# AGENTS.md instructions",
    "<user_shell_command>",
    "<turn_aborted>",
    "<skill>",
    "<collaboration_mode>",
)
_STARTED = ("task_started", "turn_started")
_COMPLETE = ("task_complete", "turn_complete")


@dataclass(slots=True)
class _Turn:
    turn_id: str | None
    cwd: str | None
    user_events: list[str] = field(default_factory=list)
    user_items: list[str] = field(default_factory=list)
    agent_events: list[str] = field(default_factory=list)
    agent_items: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)

    def prompt(self) -> str:
        return "\n\n".join(self.user_events or self.user_items)



def _injected(text: str) -> bool:
    return text.lstrip().startswith(INJECTED_PREFIXES)


class CodexSession(SessionParser):
    """The turns of one Codex rollout, fed line by line (``feed``) in file order (prefix-stable)."""

    host = HOST

    def __init__(self, default_thread: str) -> None:
        self.default_thread = default_thread
        self.thread: str | None = None
        self._meta_cwd: str | None = None
        self._cwd: str | None = None
        self._open: _Turn | None = None
        # the thread's user turns, oldest first: the project of a completed turn, None for one aborted
        self._user_turns: list[str | None] = []
        self._started = 0
        self.problems: list[str] = []

    @property
    def open_turn(self) -> bool:
        """Whether a turn is in progress (not completed yet)."""
        return self._open is not None

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one parsed line completes."""
        kind = entry.get("type")
        payload = entry.get("payload")
        if not isinstance(payload, dict):
            return []
        if kind == "session_meta":
            if self.thread is None and nonempty_str(payload.get("id")):
                self.thread = payload["id"]
                self._meta_cwd = nonempty_str(payload.get("cwd"))
        elif kind == "turn_context":
            cwd = nonempty_str(payload.get("cwd"))
            if cwd is not None:
                self._cwd = cwd
                if self._open is not None:
                    self._open.cwd = cwd
        elif kind == "event_msg":
            return self._event(number, entry, payload)
        elif kind == "response_item" and self._open is not None:
            self._item(self._open, payload)
        return []

    def _event(self, number: int, entry: dict[str, Any], payload: dict[str, Any]) -> list[HostTurn]:
        event = payload.get("type")
        if event in _STARTED:
            self._abandon()
            self._started += 1
            self._open = _Turn(turn_id=nonempty_str(payload.get("turn_id")), cwd=self._cwd)
        elif event == "user_message":
            if self._open is None:  # rollouts written before task_started existed
                self._started += 1
                self._open = _Turn(turn_id=None, cwd=self._cwd)
            message = payload.get("message")
            if isinstance(message, str) and message.strip() and not _injected(message):
                self._open.user_events.append(message)
        elif event == "agent_message" and self._open is not None:
            message = payload.get("message")
            if isinstance(message, str):
                self._open.agent_events.append(message)
        elif event in _COMPLETE:
            return self._complete(number, entry, payload)
        elif event == "turn_aborted":
            self._abandon()
        elif event == "thread_rolled_back":
            count = payload.get("num_turns")
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                self._abandon()
                del self._user_turns[max(0, len(self._user_turns) - count) :]
        return []

    def _item(self, turn: _Turn, payload: dict[str, Any]) -> None:
        item = payload.get("type")
        if item == "message":
            role = payload.get("role")
            text = text_of(payload.get("content"))
            if role == "user" and text.strip() and not _injected(text):
                turn.user_items.append(text)
            elif role == "assistant" and text:
                turn.agent_items.append(text)
        elif item == "function_call":
            turn.tools.append(tool_line(payload.get("name"), payload.get("arguments")))
        elif item == "custom_tool_call":
            raw = payload.get("input")
            first = raw.strip().splitlines()[0] if isinstance(raw, str) and raw.strip() else ""
            turn.tools.append(tool_line(payload.get("name"), first))
        elif item == "local_shell_call":
            action = payload.get("action")
            command = action.get("command") if isinstance(action, dict) else None
            turn.tools.append(tool_line("shell", {"command": command}))
        elif item == "web_search_call":
            action = payload.get("action")
            turn.tools.append(tool_line("web_search", action if isinstance(action, dict) else None))

    def _abandon(self) -> None:
        """The open turn ends without completing (aborted, superseded): a user turn Codex counts."""
        if self._open is not None and self._open.prompt():
            self._user_turns.append(None)
        self._open = None

    def _complete(self, number: int, entry: dict[str, Any], payload: dict[str, Any]) -> list[HostTurn]:
        turn = self._open
        self._open = None
        if turn is None:
            return []
        prompt = turn.prompt()
        if not prompt:
            return []  # no human prompt: compaction, review or another turn Codex runs itself
        thread = self.thread or self.default_thread
        turn_id = nonempty_str(payload.get("turn_id")) or turn.turn_id or f"{thread}:turn-{self._started}"
        project = turn.cwd or self._meta_cwd
        completed = timestamp_micros(entry.get("timestamp"))
        if project is None or completed is None:
            self.problems.append(f"turn {turn_id} has no {'cwd' if project is None else 'timestamp'}; left out")
            self._user_turns.append(None)
            return []
        last = payload.get("last_agent_message")
        if isinstance(last, str) and last:
            reply = last
        elif turn.agent_events:
            reply = turn.agent_events[-1]
        else:
            reply = turn.agent_items[-1] if turn.agent_items else ""
        # a chain is one (project, host, thread): seq counts the thread's live turns in this project
        seq = self._user_turns.count(project) + 1
        self._user_turns.append(project)
        body, attributes = render_body(prompt, turn.tools, reply)
        return [
            HostTurn(
                host=HOST,
                thread=thread,
                project=project,
                turn_id=turn_id,
                completed_at_micros=completed,
                body=body,
                seq=seq,
                line=number,
                attributes={"ingest.format": HOST, "ingest.line": str(number), **attributes},
            )
        ]
