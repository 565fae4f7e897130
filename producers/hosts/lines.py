"""What every host's transcript parser shares: the ``SessionParser`` port, one JSON object a line, its strings
and timestamps."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from throughline.core.exceptions import InvalidTurnError
from throughline.core.turn import parse_rfc3339
from throughline.producers.exceptions import TranscriptJsonError
from throughline.producers.hosts.render import HostTurn

__all__ = ["SessionParser", "nonempty_str", "timestamp_micros", "transcript_entry"]


def transcript_entry(data: bytes) -> dict[str, Any] | None:
    """The JSON object a transcript line holds; ``None`` for a blank line.

    Raises ``TranscriptLineError`` (code ``invalid_json``) for a line that is not a JSON object: the
    caller reports it and reads on, and the line changes nothing.
    """
    text = data.decode("utf-8", "replace")
    if not text.strip():
        return None
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise TranscriptJsonError(f"not JSON: {exc}") from None
    if not isinstance(entry, dict):
        raise TranscriptJsonError("not a JSON object")
    return entry


def nonempty_str(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else ``None`` (hosts write ``""`` and ``null`` alike)."""
    return value if isinstance(value, str) and value else None


def timestamp_micros(value: Any) -> int | None:
    """An RFC 3339 timestamp in microseconds since the epoch, or ``None`` when it is not one."""
    try:
        return parse_rfc3339(value)
    except InvalidTurnError:
        return None


class SessionParser(ABC):
    """One host transcript read line by line in file order: the port every host's parser fills.

    Deterministic and prefix-stable: the turns returned for the lines of any prefix of a file are
    exactly the first turns returned for the whole file (a hook that stops at a line boundary and a
    follower that reads on agree). ``problems`` collects turns left out, said once each; the caller
    reports and clears them.
    """

    host: str
    problems: list[str]
    #: The parser's output version: bump it whenever the turns it returns for the same lines change
    #: (other turns, other seqs, fuller replies, another completedAt). An ingest state records it per
    #: file, and a file saved under another version is sent again from line 1 (``ingest.sessions``).
    #: 0: the parsers before versions (a state without one).
    version: int = 0

    @property
    @abstractmethod
    def open_turn(self) -> bool:
        """Whether a turn is in progress (begun, not completed yet).

        Read by the thread that feeds the parser, between records (a follower keeps the parser of a file
        whose turn is open; a hook waits a little for it to complete).
        """

    @abstractmethod
    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one parsed line (line ``number``, a JSON object) completes.

        Called once per record, in order (``number`` 1, 2, ...), by one thread at a time: a parser belongs
        to one session and is never shared. A parser that is dropped is rebuilt and fed from record 1.
        """

    @property
    def turn_ended(self) -> bool:
        """Whether the host has marked the open turn's end and only lines of its last message may follow.

        Such a turn is settled after a short quiet instead of the whole settle time: a message's lines
        are written together.
        """
        return False

    @property
    def settle_ready(self) -> bool:
        """Whether ``settle()`` now would end the open turn (a question only: nothing changes)."""
        return False

    def settle(self, final: bool = False) -> list[HostTurn]:
        """The turns that end because the file is final: the host will write nothing more to it now.

        Called when a file has not grown for the settle time (a one-shot import or a follower) and by
        a host's stop hook (the host calls it after the turn is written). A host whose open turn has a
        reply and no pending tool call completes it here; otherwise nothing. ``final``: the host itself
        said the turn is over (its Stop hook was called): a host whose stop hook runs after the turn's
        lines ends the open turn however it ends, as the line the host writes next would. Afterwards the
        parser reads on as if the open turn had ended, so a later line never completes it twice.
        """
        return []

    def feed(self, number: int, data: bytes) -> list[HostTurn]:
        """The turns line ``number`` completes (``TranscriptLineError`` for a line that is no JSON object)."""
        entry = transcript_entry(data)
        return [] if entry is None else self.take(number, entry)
