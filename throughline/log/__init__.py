"""The Kafka edge shared by producers, projector and reader: the topic and a live view of the log.

Nothing outside this package (and the test harness) imports kafka-python: every client is built by
``throughline.log.clients`` with the connection's ``KafkaClientConfig`` (``throughline.log.config``),
and every Kafka error is translated by ``throughline.log.translate``.

Its modules, one concern each:

- ``clients``: every kafka-python client throughline uses (producers, consumers, admin clients);
- ``config``: the client settings read from a standard client properties file;
- ``registry_config``: the schema registry's settings in that file; ``registry_keys``: their keys;
- ``probe``: one connection to a bootstrap server: does the listener accept these settings?
- ``translate``: kafka-python's errors as throughline's log errors;
- ``topic``: the topic of completed turns, created with infinite retention or checked;
- ``policy``: whether the topic keeps every turn (retention and replication), as pure functions;
- ``placement``: ``TopicClient``, what a client knows of the topic and where a project's records go;
- ``view``: ``KafkaLog``, the log right now (the ``LogView`` port);
- ``next_answer``: ``NextAnswer``, callers sharing one broker request asked after they called;
- ``consumer``: ``PartitionConsumer``, the projector's fetching consumer;
- ``fetch``: kafka-python's consumer with throughline's record reader in its fetcher;
- ``record_batch``: Kafka record batches (format v2) read straight into plain tuples;
- ``record_copy``: records read out whole (timestamps, headers) and written back, for log backups;
- ``group``: a member of a ``serve --group`` (the classic group protocol, throughline's assignor);
- ``exceptions``: the errors of the Kafka edge.
"""

from __future__ import annotations

from throughline.log.clients import RECONNECT_BACKOFF_MAX_MS
from throughline.log.config import (
    ENV_KAFKA_CONFIG,
    PLAINTEXT,
    KafkaClientConfig,
    load_kafka_config,
    resolve_kafka_config,
)
from throughline.log.consumer import FetchSettings, PartitionConsumer
from throughline.log.exceptions import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    BrokerUnavailableError,
    CertificateRefusedError,
    CertificateUntrustedError,
    GroupRefusedError,
    HostnameMismatchError,
    InvalidReplicationError,
    InvalidTopicError,
    KafkaSecurityError,
    LogError,
    LossyTopicError,
    LossyTopicReplicationError,
    PositionOutOfRangeError,
    ProtocolMismatchError,
    SaslMechanismUnsupportedError,
    TlsFailedError,
    TopicMissingError,
)
from throughline.log.group import GroupConsumer, GroupView
from throughline.log.placement import TopicClient
from throughline.log.policy import PartitionReplicas, TopicProblems, topic_problems
from throughline.log.topic import (
    CHECKED_CONFIGS,
    DEFAULT_PARTITIONS,
    TopicInfo,
    TopicSettings,
    TopicWatch,
    bootstrap_list,
    check_topic,
    describe_topic,
    ensure_topic,
    lossy_reasons,
)
from throughline.log.translate import KafkaErrors, translate_kafka_error
from throughline.log.view import KafkaLog

__all__ = [
    "CHECKED_CONFIGS",
    "DEFAULT_PARTITIONS",
    "ENV_KAFKA_CONFIG",
    "PLAINTEXT",
    "RECONNECT_BACKOFF_MAX_MS",
    "AuthenticationFailedError",
    "AuthorizationFailedError",
    "BrokerUnavailableError",
    "FetchSettings",
    "GroupConsumer",
    "GroupRefusedError",
    "GroupView",
    "CertificateRefusedError",
    "CertificateUntrustedError",
    "HostnameMismatchError",
    "InvalidTopicError",
    "KafkaClientConfig",
    "KafkaErrors",
    "KafkaLog",
    "KafkaSecurityError",
    "LogError",
    "InvalidReplicationError",
    "LossyTopicError",
    "LossyTopicReplicationError",
    "PartitionReplicas",
    "PartitionConsumer",
    "PositionOutOfRangeError",
    "ProtocolMismatchError",
    "SaslMechanismUnsupportedError",
    "TlsFailedError",
    "TopicClient",
    "TopicInfo",
    "TopicMissingError",
    "TopicProblems",
    "TopicSettings",
    "TopicWatch",
    "bootstrap_list",
    "check_topic",
    "describe_topic",
    "ensure_topic",
    "load_kafka_config",
    "lossy_reasons",
    "resolve_kafka_config",
    "topic_problems",
    "translate_kafka_error",
]
