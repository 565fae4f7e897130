"""Errors of the Kafka edge (topic administration and the log view shared by every component)."""

from __future__ import annotations

from collections.abc import Sequence

from throughline.errors import ThroughlineError


class LogError(ThroughlineError):
    """Root of the errors raised while talking to the Kafka log."""

    code = "log_error"


class BrokerUnavailableError(LogError):
    """No broker answered within the bounded time; the message names the servers that were tried."""

    code = "broker_unavailable"
    retriable = True

    def __init__(self, servers: Sequence[str], detail: str, *, code: str | None = None) -> None:
        self.servers = tuple(servers)
        super().__init__(f"Kafka broker unavailable (tried {', '.join(self.servers) or 'no servers'}): {detail}", code=code)


class LossyTopicError(LogError):
    """The topic exists but would lose records (finite retention or compaction).

    The log is the source of truth, so throughline refuses such a topic unless the operator says
    otherwise (``allow_lossy=True``, ``--allow-lossy-topic``). It is a setting to fix, so the CLI
    treats it like a configuration error (exit code 2).
    """

    code = "lossy_topic"
    exit_code = 2

    def __init__(self, topic: str, reasons: Sequence[str]) -> None:
        self.topic = topic
        self.reasons = tuple(reasons)
        super().__init__(
            f"topic {topic!r} would lose records ({'; '.join(self.reasons)}); the log is the source of truth, "
            "so it needs retention.ms=-1, retention.bytes=-1 and cleanup.policy=delete "
            "(or pass --allow-lossy-topic / allow_lossy=True)"
        )


class TopicMissingError(LogError):
    """The topic does not exist (and this call was not allowed to create it).

    Retriable: a producer may create it later without the caller changing anything.
    """

    code = "topic_missing"
    retriable = True


class InvalidTopicError(LogError):
    """The broker refuses the topic itself (an invalid name, a refused configuration)."""

    code = "invalid_topic"
    exit_code = 2
