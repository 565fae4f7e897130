"""Producers: append completed turns to the log (``TurnProducer``) and ingest JSON Lines (``throughline ingest``)."""

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
