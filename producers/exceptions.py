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
    "IngestStateError",
    "InvalidAttributesError",
    "InvalidLineError",
    "InvalidProjectError",
    "InvalidTurnError",
    "LinesRejectedError",
    "LossyTopicError",
    "ProducerError",
    "RecordTooLargeError",
    "SendFailedError",
    "TopicMissingError",
    "TranscriptLineError",
]


class ProducerError(ThroughlineError):
    """Root of the producers' own errors."""

    code = "producer_error"


class SendFailedError(ProducerError):
    """The broker refused a turn (or the producer failed it); ``retriable`` comes from the Kafka error."""

    code = "send_failed"


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


class LinesRejectedError(InputError):
    """``throughline ingest`` finished, but some lines were rejected (reported one by one on stderr)."""

    code = "lines_rejected"


class IngestStateError(InputError):
    """The ingest state file cannot be used (unreadable, not ours, or a state for stdin)."""

    code = "invalid_ingest_state"


class TranscriptLineError(InputError):
    """One line of a host transcript cannot be read (not JSON, not an object, a turn without a project).

    Ingest reports it with the file and line number and goes on: hosts add line types in every release,
    and a transcript being written can end in a partial line.
    """

    code = "invalid_transcript_line"
