"""kafka-python's errors as throughline's log errors: the one place where Kafka error classes are read.

Every client call of the Kafka edge runs inside ``KafkaErrors`` (or calls ``translate_kafka_error``), so
no package outside ``throughline.log`` sees a kafka-python exception. A translated error keeps the Kafka
error's ``retriable`` flag, and its text is scrubbed of the connection's secrets (a broker or a library
could echo a credential back; none leaves throughline).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import kafka.errors as kafka_errors

from throughline.log.config import KafkaClientConfig
from throughline.log.exceptions import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    BrokerUnavailableError,
    ClientClosedError,
    GroupFullError,
    GroupProtocolMismatchError,
    InvalidSessionTimeoutError,
    InvalidTopicError,
    LogError,
    MessageTooLargeError,
    OtherKafkaError,
    PositionOutOfRangeError,
    ProtocolMismatchError,
    SaslMechanismUnsupportedError,
)

#: kafka-python's errors for "nobody answered in time" (the caller may retry later).
UNAVAILABLE = (kafka_errors.KafkaTimeoutError, kafka_errors.KafkaConnectionError, kafka_errors.NodeNotReadyError)
#: Error codes of admin responses that are answers rather than failures (the topic is not there; it
#: already is).
UNKNOWN_TOPIC_CODE: int = kafka_errors.UnknownTopicOrPartitionError.errno
TOPIC_EXISTS_CODE: int = kafka_errors.TopicAlreadyExistsError.errno


def response_error(code: int, message: str) -> Exception:
    """kafka-python's error for the error ``code`` of a response, to raise inside ``KafkaErrors`` (which
    translates it like any error kafka-python raises itself)."""
    error: Exception = kafka_errors.for_code(code)(message)
    return error


def scrub(text: str, kafka_config: KafkaClientConfig | None) -> str:
    """``text`` with every secret of ``kafka_config`` replaced by ``****``."""
    if kafka_config is not None:
        for secret in kafka_config.secrets():
            text = text.replace(secret, "****")
    return text


def translate_kafka_error(
    exc: BaseException, servers: Sequence[str], kafka_config: KafkaClientConfig | None = None
) -> LogError:
    """Map a kafka-python error onto throughline's log errors (keeping its retriable flag).

    A ``LogError`` is returned as it is; anything else that is not a kafka-python error is a programming
    error and is wrapped as ``kafka_error``.
    """
    if isinstance(exc, LogError):
        return exc
    detail = scrub(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, kafka_config)
    where = ", ".join(servers) or "no servers"
    label = kafka_config.label() if kafka_config is not None else "PLAINTEXT"
    source = f" in {kafka_config.source}" if kafka_config is not None and kafka_config.source else ""
    if isinstance(exc, kafka_errors.SaslAuthenticationFailedError):
        return AuthenticationFailedError(
            f"the broker at {where} refused the {label} credentials ({detail}); check sasl.username and "
            f"sasl.password (or sasl.jaas.config){source}"
        )
    if isinstance(exc, kafka_errors.UnsupportedSaslMechanismError):
        return SaslMechanismUnsupportedError(
            f"the listener at {where} does not enable {label} ({detail}); check sasl.mechanism{source}"
        )
    if isinstance(exc, kafka_errors.IllegalSaslStateError):
        return ProtocolMismatchError(
            f"the listener at {where} does not use SASL but security.protocol is {label}{source} ({detail})"
        )
    if isinstance(exc, kafka_errors.AuthorizationError):
        return AuthorizationFailedError(
            f"the broker at {where} authenticated the client but refused the request ({detail}): check its ACLs"
        )
    if isinstance(exc, UNAVAILABLE):
        return BrokerUnavailableError(servers, detail)
    if isinstance(
        exc, kafka_errors.InvalidTopicError | kafka_errors.PolicyViolationError | kafka_errors.InvalidConfigurationError
    ):
        return InvalidTopicError(f"the broker refused the topic: {detail}")
    if isinstance(exc, kafka_errors.OffsetOutOfRangeError | kafka_errors.LogTruncationError):
        return PositionOutOfRangeError(f"the broker refused the consumer's position ({detail})")
    if isinstance(exc, kafka_errors.InconsistentGroupProtocolError):
        return GroupProtocolMismatchError(
            f"the group's members use another assignment protocol ({detail}): another kind of consumer, "
            "or a throughline of another version, uses this group name",
        )
    if isinstance(exc, kafka_errors.InvalidSessionTimeoutError):
        return InvalidSessionTimeoutError(
            f"the broker refused the group session timeout ({detail}): see its group.min.session.timeout.ms "
            "and group.max.session.timeout.ms",
        )
    if isinstance(exc, kafka_errors.GroupMaxSizeReachedError):
        return GroupFullError(f"the group is full ({detail}): see the broker's group.max.size")
    if isinstance(exc, kafka_errors.MessageSizeTooLargeError):
        return MessageTooLargeError(f"the broker refused the record as too large: {detail}")
    if isinstance(exc, kafka_errors.IllegalStateError):
        return ClientClosedError(f"the Kafka client cannot do that now: {detail}")
    retriable = bool(getattr(exc, "retriable", False))
    return OtherKafkaError(f"Kafka error: {detail}", retriable=retriable)


class KafkaErrors:
    """A context manager that turns a kafka-python error raised in its block into a ``LogError``.

    Stateless once built, so one instance per client serves every call (no allocation per call).
    """

    __slots__ = ("config", "servers")

    def __init__(self, servers: Sequence[str], kafka_config: KafkaClientConfig | None = None) -> None:
        self.servers = tuple(servers)
        self.config = kafka_config

    def __enter__(self) -> KafkaErrors:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, kafka_errors.KafkaError):
            raise translate_kafka_error(exc, self.servers, self.config) from exc
