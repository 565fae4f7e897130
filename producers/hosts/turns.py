"""What the parsers of the hosts that write a flat list of messages share (Gemini CLI, Copilot CLI, OpenCode).

``OpenTurn`` collects one turn as its records arrive (prompt, tool calls, replies, tool calls still
waiting for their result) and says whether the model has answered it; ``Chain`` numbers a thread's turns
and takes rewinds (a prompt sent again from an earlier point: the next turn's seq is that point's + 1);
``host_turn`` builds the ``HostTurn`` with the attributes every host turn carries; ``OpenTurnSession`` is
the parser port's turn-in-progress half for a parser that keeps its turn in an ``OpenTurn``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

from throughline.producers.hosts.lines import SessionParser
from throughline.producers.hosts.render import HostTurn, finished_turn

__all__ = [
    "ABORTED",
    "ANSWERED",
    "INTERRUPTED",
    "OUTCOMES",
    "Chain",
    "OpenTurn",
    "OpenTurnSession",
    "host_turn",
]

ANSWERED, INTERRUPTED, ABORTED = "answered", "interrupted", "aborted"
#: Every value ``turn.outcome`` may take.
OUTCOMES = (ANSWERED, INTERRUPTED, ABORTED)


@dataclass(slots=True)
class OpenTurn:
    """A turn in progress: its prompt, and what the model has done so far."""

    turn_id: str
    prompt: str
    project: str | None
    seq: int
    prompt_micros: int | None = None
    tools: list[str] = field(default_factory=list)
    tool_ids: set[str] = field(default_factory=set)  # every call seen (a call is listed once)
    waiting: set[str] = field(default_factory=set)  # calls without their result yet
    reply: str = ""
    last_micros: int | None = None  # the turn's last content record (completedAt, whatever ends it)
    answered_last: bool = False  # the last content record is a reply with no call after it
    failed: bool = False  # the host recorded an error after the last reply

    def call(self, call_id: str | None, line: str, *, done: bool = False) -> None:
        """A tool call (listed once per ``call_id``); it waits for its result unless ``done``."""
        if call_id is not None and call_id in self.tool_ids:
            if done:
                self.waiting.discard(call_id)
            return
        self.tools.append(line)
        if call_id is not None:
            self.tool_ids.add(call_id)
            if not done:
                self.waiting.add(call_id)
        self.answered_last = False

    def result(self, call_id: str | None) -> None:
        """A tool call's result arrived."""
        if call_id is not None:
            self.waiting.discard(call_id)

    def said(self, text: str, micros: int | None) -> None:
        """A model message: its text (when any) is the reply so far."""
        if text.strip():
            self.reply = text
            self.answered_last = True
        self.failed = False
        if micros is not None:
            self.last_micros = micros

    def answered(self) -> bool:
        """Whether the model has answered: its last message has text and no tool call waits."""
        return self.answered_last and not self.waiting and bool(self.reply.strip())

    def outcome(self) -> str:
        """How the turn ended, if it ends now."""
        if self.answered():
            return ANSWERED
        return ABORTED if self.failed else INTERRUPTED


@dataclass(slots=True)
class Chain:
    """The turn ids of one thread's chain, oldest first (a rewind cuts it back)."""

    turn_ids: list[str] = field(default_factory=list)

    def next_seq(self) -> int:
        """The seq of a turn that follows the chain's last turn."""
        return len(self.turn_ids) + 1

    def add(self, seq: int, turn_id: str) -> None:
        """Turn ``turn_id`` took place ``seq`` (the turns from there on are no longer on the chain)."""
        del self.turn_ids[seq - 1 :]
        self.turn_ids.append(turn_id)

    def rewind_to(self, turn_id: str) -> bool:
        """Cut the chain back to before ``turn_id`` (``False``: not on the chain; nothing changes)."""
        if turn_id not in self.turn_ids:
            return False
        del self.turn_ids[self.turn_ids.index(turn_id) :]
        return True

    def clear(self) -> None:
        """Every turn is taken back."""
        self.turn_ids.clear()


def host_turn(
    host: str, thread: str, turn: OpenTurn, project: str, completed: int, number: int, outcome: str
) -> HostTurn:
    """The ``HostTurn`` of a finished ``OpenTurn`` (its body rendered, its outcome in the attributes)."""
    return finished_turn(
        host,
        thread=thread,
        project=project,
        turn_id=turn.turn_id,
        seq=turn.seq,
        completed_at_micros=completed,
        line=number,
        outcome=outcome,
        prompt=turn.prompt,
        tools=turn.tools,
        reply=turn.reply,
    )


class OpenTurnSession(SessionParser):
    """A parser whose turn in progress is an ``OpenTurn`` (``_open``) that ``_close`` ends.

    Same threading and lifecycle as ``SessionParser``: one thread feeds it, in file order.
    """

    _open: OpenTurn | None
    _last_number: int

    @property
    def open_turn(self) -> bool:
        """Whether a prompt's turn is in progress."""
        return self._open is not None

    @property
    def settle_ready(self) -> bool:
        """Whether the model has answered the open turn (a reply, no tool call waiting)."""
        return self._open is not None and self._open.answered()

    def settle(self, final: bool = False) -> list[HostTurn]:
        """The open turn, when the file is final and the model answered it (``final`` asks no more: these
        hosts write the answer before their stop hook runs)."""
        if not self.settle_ready:
            return []
        return self._close(self._last_number, ANSWERED)

    @abstractmethod
    def _close(self, number: int, outcome: str) -> list[HostTurn]:
        """End the open turn with ``outcome`` at line ``number``: the turns that sends (none when none is open)."""
