"""Errors of the Kafka edge (topic administration and the log view shared by every component)."""

from __future__ import annotations

from collections.abc import Sequence

from throughline.errors import ConfigurationError, ThroughlineError


class LogError(ThroughlineError):
    """Root of the errors raised while talking to the Kafka log."""

    code = "log_error"


class OtherKafkaError(LogError):
    """A Kafka error that no other class names; ``retriable`` is the Kafka error's own."""

    code = "kafka_error"


class MessageTooLargeError(LogError):
    """The broker refused a record as too large."""

    code = "message_too_large"


class ClientClosedError(LogError):
    """The Kafka client cannot do that now (closed, or in the wrong state)."""

    code = "client_closed"


class UnknownPartitionError(LogError):
    """A partition that is not one of the topic's."""

    code = "unknown_partition"


class LogClosedError(LogError):
    """A call on a log view that was closed."""

    code = "log_closed"


class MissingBootstrapServersError(ConfigurationError):
    """No Kafka bootstrap servers were given (``--bootstrap-servers`` or its variable)."""

    code = "missing_bootstrap_servers"


class InvalidPartitionsError(ConfigurationError):
    """A topic partition count below 1."""

    code = "invalid_partitions"


class BrokerUnavailableError(LogError):
    """No broker answered within the bounded time; the message names the servers that were tried."""

    code = "broker_unavailable"
    retriable = True

    def __init__(self, servers: Sequence[str], detail: str) -> None:
        self.servers = tuple(servers)
        self.detail = detail
        super().__init__(f"Kafka broker unavailable (tried {', '.join(self.servers) or 'no servers'}): {detail}")


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


class LossyTopicReplicationError(LossyTopicError):
    """The topic exists but could lose acknowledged turns: too few replicas for the cluster, a
    ``min.insync.replicas`` that lets ``acks=all`` acknowledge a turn held by one broker, or unclean leader
    election on (see ``throughline.log.policy``).

    A ``LossyTopicError`` with its own code: ``--allow-lossy-topic`` / ``allow_lossy=True`` accepts it
    too (with a warning). A setting to fix, so the CLI exits 2.
    """

    code = "lossy_topic_replication"

    def __init__(self, topic: str, reasons: Sequence[str]) -> None:
        self.topic = topic
        self.reasons = tuple(reasons)
        LogError.__init__(
            self,
            f"topic {topic!r} could lose acknowledged turns ({'; '.join(self.reasons)}); the log is the source of "
            "truth, so it needs a replication factor of min(3, brokers), min.insync.replicas of min(2, RF) and "
            "unclean.leader.election.enable=false (or pass --allow-lossy-topic / allow_lossy=True)",
        )


class InvalidReplicationError(LogError):
    """``--replication-factor`` / ``--min-insync-replicas`` that the cluster cannot take: below 1, a
    replication factor above the broker count, or a ``min.insync.replicas`` above the replication factor."""

    code = "invalid_replication"
    exit_code = 2


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


class PositionOutOfRangeError(LogError):
    """The broker refused a consumer's position (out of range, or truncated under it).

    The projector decides what that means (a recreated topic, deleted records) after checking the log.
    """

    code = "log_position_out_of_range"


class KafkaSecurityError(LogError):
    """The connection's security settings do not fit the cluster; the settings must change.

    Not retriable (the same settings fail the same way), and a setting to fix, so the CLI exits 2 as for
    a configuration error. Messages name the setting to look at, never a credential.
    """

    code = "kafka_security_error"
    exit_code = 2


class AuthenticationFailedError(KafkaSecurityError):
    """The broker refused the SASL credentials (a wrong user name or password)."""

    code = "kafka_authentication_failed"


class SaslMechanismUnsupportedError(KafkaSecurityError):
    """The listener does not enable the configured SASL mechanism."""

    code = "kafka_sasl_mechanism_unsupported"


class AuthorizationFailedError(KafkaSecurityError):
    """The broker authenticated the client but its ACLs refuse the operation."""

    code = "kafka_authorization_failed"


class CertificateUntrustedError(KafkaSecurityError):
    """The broker's TLS certificate is not signed by a trusted CA (or is expired, or malformed)."""

    code = "kafka_certificate_untrusted"


class HostnameMismatchError(KafkaSecurityError):
    """The broker's TLS certificate is trusted but names another host than the one connected to."""

    code = "kafka_hostname_mismatch"


class CertificateRefusedError(KafkaSecurityError):
    """The broker refused the TLS handshake on its side (mostly: no or an untrusted client certificate)."""

    code = "kafka_certificate_refused"


class ProtocolMismatchError(KafkaSecurityError):
    """The listener speaks another security protocol than ``security.protocol`` (TLS vs. plain text,
    SASL vs. none): the wrong port or the wrong setting."""

    code = "kafka_protocol_mismatch"


class TlsFailedError(KafkaSecurityError):
    """The TLS handshake failed for another reason (no shared protocol version or cipher, a bad record)."""

    code = "kafka_tls_failed"


class GroupRefusedError(LogError):
    """The group coordinator refused this member: another kind of consumer (or an incompatible
    throughline) uses the group name (``group_protocol_mismatch``), the session timeout is outside the
    broker's bounds (``invalid_session_timeout``), or the group is full (``group_full``).

    A setting to fix (the group name, the broker's ``group.*`` settings), so the CLI exits 2.
    """

    code = "group_refused"
    exit_code = 2


class GroupProtocolMismatchError(GroupRefusedError):
    """Another kind of consumer, or a throughline of another version, uses the group name."""

    code = "group_protocol_mismatch"


class InvalidSessionTimeoutError(GroupRefusedError):
    """The group session timeout is outside the broker's bounds."""

    code = "invalid_session_timeout"


class GroupFullError(GroupRefusedError):
    """The group has the broker's ``group.max.size`` members already."""

    code = "group_full"
