"""Producers: append completed turns to the log (``TurnProducer``) and ingest JSON Lines (``throughline ingest``).

Its modules and subpackages, one concern each:

- ``producer``: ``TurnProducer``, one Avro record per completed turn appended to the log;
- ``ingest``: streaming ingestion of JSON Lines and of hosts' session files (``throughline ingest``);
- ``hosts``: agent hosts' own transcripts as completed turns (pure parsers, one adapter a host);
- ``hook``: a host's ``Stop`` hook: its payload, the transcript it names, the wait for the last turn;
- ``exceptions``: the producers' errors.
"""

from __future__ import annotations

from throughline.producers.exceptions import (
    BodyTooLargeError,
    BrokerUnavailableError,
    InvalidTurnError,
    ProducerError,
    RecordTooLargeError,
    SendFailedError,
)
from throughline.producers.producer import LogPosition, PendingSend, TurnProducer

__all__ = [
    "BodyTooLargeError",
    "BrokerUnavailableError",
    "InvalidTurnError",
    "LogPosition",
    "PendingSend",
    "ProducerError",
    "RecordTooLargeError",
    "SendFailedError",
    "TurnProducer",
]
