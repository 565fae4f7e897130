"""Errors of the producers (the library ``TurnProducer`` and ``throughline ingest``).

A producer refuses an invalid turn before anything is sent, with the core's errors
(``InvalidTurnError``, ``BodyTooLargeError``, ``InvalidProjectError``); it reports a broker that does
not answer with the log's ``BrokerUnavailableError``. Both are re-exported here so that a caller of
the producers finds every error it can get in one module.
"""

from __future__ import annotations

from throughline.core.exceptions import BodyTooLargeError, InvalidProjectError, InvalidTurnError
from throughline.errors import InputError, ThroughlineError
from throughline.log.exceptions import BrokerUnavailableError, LossyTopicError, TopicMissingError

__all__ = [
    "BodyTooLargeError",
    "BrokerUnavailableError",
    "HookError",
    "HookFailedError",
    "HookTimeoutError",
    "IngestStateError",
    "InputFileMissingError",
    "InputFileUnreadableError",
    "InvalidAttributesError",
    "InvalidJsonError",
    "InvalidLineError",
    "InvalidProjectError",
    "InvalidTurnError",
    "InvalidUtf8Error",
    "LineJsonError",
    "LineTooLongError",
    "LinesRejectedError",
    "LossyTopicError",
    "ProducerClosedError",
    "ProducerError",
    "RecordTooLargeError",
    "SendFailedError",
    "StateNeedsFileError",
    "StateWriteFailedError",
    "TopicMissingError",
    "TranscriptJsonError",
    "TranscriptLineError",
    "TurnLeftOutError",
    "UnknownHostError",
]


class ProducerError(ThroughlineError):
    """Root of the producers' own errors."""

    code = "producer_error"


class SendFailedError(ProducerError):
    """The broker refused a turn (or the producer failed it); ``retriable`` comes from the Kafka error."""

    code = "send_failed"


class ProducerClosedError(ProducerError):
    """A send on a producer that was closed, or whose Kafka client cannot send any more."""

    code = "producer_closed"


class StateWriteFailedError(ProducerError):
    """The ingest state file could not be written (the turns were sent; the next run re-sends them)."""

    code = "state_write_failed"


class RecordTooLargeError(InvalidTurnError):
    """A turn whose encoded record would not fit in one topic record (huge producer attributes)."""

    code = "record_too_large"


class InvalidAttributesError(InvalidTurnError):
    """A line's ``attributes`` are not a small map of strings to strings, or give a reserved key a value
    it cannot have (``turn.outcome`` other than answered, interrupted or aborted, ...)."""

    code = "invalid_attributes"


class InvalidLineError(InputError):
    """One line of an ingest file is not a turn: not UTF-8, not JSON, not an object, too long."""

    code = "invalid_line"


class LineTooLongError(InvalidLineError):
    """A line longer than the bound."""

    code = "line_too_long"


class InvalidUtf8Error(InvalidLineError):
    """A line that is not UTF-8."""

    code = "invalid_utf8"


class InvalidJsonError(InputError):
    """A line that is not a JSON object (not JSON, a duplicate key, another JSON value): of an ingest
    file (``LineJsonError``) or of a host transcript (``TranscriptJsonError``)."""

    code = "invalid_json"


class LineJsonError(InvalidJsonError, InvalidLineError):
    """A line of an ingest file that is not a JSON object (``invalid_json``, an ``InvalidLineError`` too)."""


class LinesRejectedError(InputError):
    """``throughline ingest`` finished, but some lines were rejected (reported one by one on stderr)."""

    code = "lines_rejected"


class IngestStateError(InputError):
    """The ingest state file cannot be used (unreadable, not ours, or a state for stdin)."""

    code = "invalid_ingest_state"


class StateNeedsFileError(IngestStateError):
    """``--state`` given for standard input, which has no resume state."""

    code = "state_needs_file"


class InputFileMissingError(InputError):
    """An input file or folder that does not exist (and is not followed, so not waited for)."""

    code = "file_not_found"


class InputFileUnreadableError(InputError):
    """An input file that exists but cannot be opened."""

    code = "file_unreadable"


class TranscriptLineError(InputError):
    """One line of a host transcript cannot be read (not JSON, not an object, a turn without a project).

    Ingest reports it with the file and line number and goes on: hosts add line types in every release,
    and a transcript being written can end in a partial line.
    """

    code = "invalid_transcript_line"


class TranscriptJsonError(InvalidJsonError, TranscriptLineError):
    """A transcript line that is not a JSON object (``invalid_json``, a ``TranscriptLineError`` too)."""


class TurnLeftOutError(TranscriptLineError):
    """A turn a host parser read but left out (the parser says why); ingest reports it and goes on."""

    code = "turn_left_out"


class UnknownHostError(InputError):
    """No adapter of that name is installed (or it failed to load)."""

    code = "unknown_host"


class HookError(InputError):
    """The hook cannot work on this call (no payload, no transcript); nothing was sent."""

    code = "hook_input"


class HookTimeoutError(ThroughlineError):
    """The hook ran out of its time; what is left is sent by a later call."""

    code = "hook_timeout"


class HookFailedError(ThroughlineError):
    """The hook failed unexpectedly; it reports the failure rather than crash the host's turn."""

    code = "hook_failed"
