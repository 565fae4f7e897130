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
- A turn ends when Codex will add nothing more to it: ``task_complete`` (outcome ``answered``);
  ``turn_aborted`` (``interrupted`` when its reason is ``interrupted``, else ``aborted``), the reply as
  far as it got, completed at that line; a ``task_started`` while a turn is open (``aborted``).
  Rollouts of the 0.40 era write neither ``task_started`` nor ``task_complete``: a ``user_message``
  outside a started turn opens a turn, and it ends at the next such ``user_message`` or at
  ``turn_aborted``, or when ``settle()`` says the file is final and its reply is written and no tool
  call waits for its output; such a turn completes at its last agent line, whatever ends it.
  ``producer.attributes["turn.outcome"]`` carries the outcome.
- ``thread_rolled_back {num_turns}`` drops the last ``num_turns`` user turns (answered or not, as
  Codex counts them), so the next turn's seq rewinds the chain to there.
- Images sent with a prompt (``user_message.images`` / ``local_images``, ``input_image`` items) are
  ``[image]`` in the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from throughline.producers.hosts.lines import SessionParser, nonempty_str, timestamp_micros
from throughline.producers.hosts.render import HostTurn, finished_turn, text_of, tool_line

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
#: Response items that call a tool, and the items that carry their results (by ``call_id``).
_CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")

ANSWERED, INTERRUPTED, ABORTED = "answered", "interrupted", "aborted"


@dataclass(slots=True)
class _Turn:
    turn_id: str | None
    cwd: str | None
    legacy: bool = False  # opened by a user_message: a rollout that writes no task_started
    user_events: list[str] = field(default_factory=list)
    user_items: list[str] = field(default_factory=list)
    agent_events: list[str] = field(default_factory=list)
    agent_items: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    waiting: set[str] = field(default_factory=set)  # tool calls without their output yet
    last_micros: int | None = None  # the turn's last agent line (a legacy turn completes there)
    answered_last: bool = False  # the turn's last agent line is a message, not a tool call or output

    def prompt(self) -> str:
        return "\n\n".join(self.user_events or self.user_items)

    def reply(self) -> str:
        if self.agent_events:
            return self.agent_events[-1]
        return self.agent_items[-1] if self.agent_items else ""

    def answered(self) -> bool:
        """Whether the agent has replied and no tool call waits for its output."""
        return self.answered_last and not self.waiting and bool(self.reply())


def _injected(text: str) -> bool:
    return text.lstrip().startswith(INJECTED_PREFIXES)


def _user_message(payload: dict[str, Any]) -> str | None:
    """The human prompt of a ``user_message`` event (``[image]`` for each image sent with it), or ``None``."""
    message = payload.get("message")
    text = message if isinstance(message, str) else ""
    if text.strip() and _injected(text):
        return None
    images = sum(len(v) for key in ("images", "local_images") if isinstance(v := payload.get(key), list))
    parts = [text] if text.strip() else []
    parts.extend("[image]" for _ in range(images))
    return "\n\n".join(parts) if parts else None


class CodexSession(SessionParser):
    """The turns of one Codex rollout, fed line by line (``feed``) in file order (prefix-stable)."""

    host = HOST
    #: 1: interrupted and aborted turns count, replies whole (the fixes that read real transcripts).
    version = 1

    def __init__(self, default_thread: str) -> None:
        self.default_thread = default_thread
        self.thread: str | None = None
        self._meta_cwd: str | None = None
        self._cwd: str | None = None
        self._open: _Turn | None = None
        # the thread's user turns, oldest first: the project of a turn sent, None for one left out
        self._user_turns: list[str | None] = []
        self._started = 0
        self._last_number = 0
        self.problems: list[str] = []

    @property
    def open_turn(self) -> bool:
        """Whether a turn is in progress (not completed yet)."""
        return self._open is not None

    @property
    def settle_ready(self) -> bool:
        """Whether the open turn was opened by a ``user_message`` and its reply is written, no call waiting."""
        turn = self._open
        return turn is not None and turn.legacy and turn.answered()

    def settle(self, final: bool = False) -> list[HostTurn]:
        """The open turn of a rollout that writes no ``task_complete``, once its reply is written.

        A started turn (``task_started``) always ends with a line of its own (``task_complete`` or
        ``turn_aborted``), so the file being final says nothing about it, even from a hook (``final``).
        """
        turn = self._open
        if turn is None or not self.settle_ready:
            return []
        self._open = None
        return self._end(self._last_number, turn, ANSWERED, turn.last_micros)

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one parsed line completes."""
        self._last_number = number
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
            self._item(self._open, payload, timestamp_micros(entry.get("timestamp")))
        return []

    def _event(self, number: int, entry: dict[str, Any], payload: dict[str, Any]) -> list[HostTurn]:
        event = payload.get("type")
        micros = timestamp_micros(entry.get("timestamp"))
        out: list[HostTurn] = []
        if event in _STARTED:
            out = self._close(number, ABORTED, micros)  # the host began another: the open one gets nothing more
            self._started += 1
            self._open = _Turn(turn_id=nonempty_str(payload.get("turn_id")), cwd=self._cwd)
        elif event == "user_message":
            prompt = _user_message(payload)
            open_ = self._open
            if prompt is not None and (open_ is None or (open_.legacy and open_.prompt())):
                # a rollout without task_started: each prompt begins a turn, and ends the one before it
                if open_ is not None:
                    out = self._close(number, ANSWERED if open_.answered() else INTERRUPTED, open_.last_micros)
                self._started += 1
                self._open = open_ = _Turn(turn_id=None, cwd=self._cwd, legacy=True, last_micros=micros)
            if prompt is not None and open_ is not None:
                open_.user_events.append(prompt)
        elif event == "agent_message" and self._open is not None:
            message = payload.get("message")
            if isinstance(message, str):
                self._open.agent_events.append(message)
                self._open.answered_last = True
                self._open.last_micros = micros if micros is not None else self._open.last_micros
        elif event in _COMPLETE:
            turn = self._open
            self._open = None
            if turn is not None:
                last = payload.get("last_agent_message")
                if isinstance(last, str) and last:
                    turn.agent_events.append(last)
                out = self._end(number, turn, ANSWERED, micros, nonempty_str(payload.get("turn_id")))
        elif event == "turn_aborted":
            outcome = INTERRUPTED if payload.get("reason") in (None, "interrupted") else ABORTED
            out = self._close(number, outcome, micros, nonempty_str(payload.get("turn_id")))
        elif event == "thread_rolled_back":
            count = payload.get("num_turns")
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                if self._open is not None and self._open.prompt():
                    self._user_turns.append(None)  # a turn open at the rollback is counted, and dropped
                self._open = None
                del self._user_turns[max(0, len(self._user_turns) - count) :]
        return out

    def _item(self, turn: _Turn, payload: dict[str, Any], micros: int | None) -> None:
        item = payload.get("type")
        agent_line = True
        if item == "message":
            role = payload.get("role")
            text = text_of(payload.get("content"))
            if role == "user":
                agent_line = False
                if text.strip() and not _injected(text) and not (turn.legacy and turn.reply()):
                    turn.user_items.append(text)
            elif role == "assistant" and text:
                turn.agent_items.append(text)
                turn.answered_last = True
            else:
                agent_line = False
        elif item in _CALLS:
            if item == "function_call":
                turn.tools.append(tool_line(payload.get("name"), payload.get("arguments")))
            elif item == "custom_tool_call":
                raw = payload.get("input")
                first = raw.strip().splitlines()[0] if isinstance(raw, str) and raw.strip() else ""
                turn.tools.append(tool_line(payload.get("name"), first))
            else:
                action = payload.get("action")
                command = action.get("command") if isinstance(action, dict) else None
                turn.tools.append(tool_line("shell", {"command": command}))
            call = nonempty_str(payload.get("call_id"))
            if call is not None and not (item == "local_shell_call" and payload.get("status") == "completed"):
                turn.waiting.add(call)
            turn.answered_last = False
        elif item in _OUTPUTS:
            call = nonempty_str(payload.get("call_id"))
            if call is not None:
                turn.waiting.discard(call)
            turn.answered_last = False
        elif item == "web_search_call":
            action = payload.get("action")
            turn.tools.append(tool_line("web_search", action if isinstance(action, dict) else None))
        else:
            agent_line = False
        if agent_line and micros is not None:
            turn.last_micros = micros

    def _close(self, number: int, outcome: str, micros: int | None, turn_id: str | None = None) -> list[HostTurn]:
        """End the open turn with ``outcome`` (nothing when none is open)."""
        turn = self._open
        self._open = None
        if turn is None:
            return []
        return self._end(number, turn, outcome, micros, turn_id)

    def _end(
        self, number: int, turn: _Turn, outcome: str, micros: int | None, turn_id: str | None = None
    ) -> list[HostTurn]:
        prompt = turn.prompt()
        if not prompt:
            return []  # no human prompt: compaction, review or another turn Codex runs itself
        thread = self.thread or self.default_thread
        turn_id = turn_id or turn.turn_id or f"{thread}:turn-{self._started}"
        project = turn.cwd or self._meta_cwd
        if project is None or micros is None:
            self.problems.append(f"turn {turn_id} has no {'cwd' if project is None else 'timestamp'}; left out")
            self._user_turns.append(None)
            return []
        # a chain is one (project, host, thread): seq counts the thread's live turns in this project
        seq = self._user_turns.count(project) + 1
        self._user_turns.append(project)
        return [
            finished_turn(
                HOST,
                thread=thread,
                project=project,
                turn_id=turn_id,
                seq=seq,
                completed_at_micros=micros,
                line=number,
                outcome=outcome,
                prompt=prompt,
                tools=turn.tools,
                reply=turn.reply(),
            )
        ]
