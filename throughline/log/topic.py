"""The topic of completed turns: creating it with infinite retention, and checking an existing one.

The log is the source of truth (the DuckDB projection can always be rebuilt by replaying it), so the
topic must never drop a record: ``retention.ms=-1``, ``retention.bytes=-1``, ``cleanup.policy=delete``
(compaction would keep only the last record per key, i.e. one turn per project). ``ensure_topic``
creates it that way when it is missing and refuses an existing topic that would lose records, unless
the operator explicitly allows it.

It also creates the topic replicated (a replication factor of ``min(3, brokers)``,
``min.insync.replicas`` of ``min(2, RF)``, unclean leader election off) and refuses an existing topic
whose replication could lose acknowledged turns; the decisions are the pure functions of
``throughline.log.policy``, this module only asks the broker.

The partition count is fixed at creation. Never add partitions to a live topic: the partition of a
project is ``partition_for(project_sha256, partition_count)``, so a new count would move projects to
other partitions and break their total order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from throughline.core.turn import TOPIC_MAX_MESSAGE_BYTES
from throughline.log import clients
from throughline.log.config import KafkaClientConfig
from throughline.log.exceptions import (
    InvalidPartitionsError,
    LogError,
    LossyTopicError,
    LossyTopicReplicationError,
    MissingBootstrapServersError,
    OtherKafkaError,
    TopicMissingError,
)
from throughline.log.policy import (
    MIN_INSYNC,
    UNCLEAN,
    PartitionReplicas,
    check_override,
    config_replication_reasons,
    lossy_reasons,
    min_insync_of,
    replication_document,
    resolve_replication,
)
from throughline.log.translate import TOPIC_EXISTS_CODE, UNKNOWN_TOPIC_CODE, KafkaErrors, response_error

log = logging.getLogger(__name__)

#: Topic configurations throughline reads back and reports (the ones that decide whether records live).
CHECKED_CONFIGS = (
    "retention.ms",
    "retention.bytes",
    "cleanup.policy",
    "max.message.bytes",
    MIN_INSYNC,
    UNCLEAN,
)
DEFAULT_PARTITIONS = 3
DEFAULT_ADMIN_TIMEOUT = 15.0


def bootstrap_list(bootstrap_servers: Sequence[str] | str) -> list[str]:
    """Normalise bootstrap servers (a list, or one comma-separated string) into a non-empty list."""
    items = [bootstrap_servers] if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    servers = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
    if not servers:
        raise MissingBootstrapServersError("no Kafka bootstrap servers given")
    return servers


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """How throughline creates the topic of completed turns."""

    partitions: int = DEFAULT_PARTITIONS
    max_message_bytes: int = TOPIC_MAX_MESSAGE_BYTES
    retention_ms: int = -1
    retention_bytes: int = -1
    cleanup_policy: str = "delete"
    replication_factor: int | None = None  # None: min(3, brokers)
    min_insync_replicas: int | None = None  # None: min(2, replication factor)

    def __post_init__(self) -> None:
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or self.partitions < 1:
            raise InvalidPartitionsError("a topic needs at least one partition")
        check_override(self.replication_factor, self.min_insync_replicas)

    def configs(self) -> dict[str, str]:
        """The topic configurations to create the topic with (``min.insync.replicas`` aside: it depends
        on the cluster, see ``replication``)."""
        return {
            "max.message.bytes": str(self.max_message_bytes),
            "retention.ms": str(self.retention_ms),
            "retention.bytes": str(self.retention_bytes),
            "cleanup.policy": self.cleanup_policy,
            # Set on the topic, so a broker whose default is ``true`` cannot elect an out-of-sync leader.
            UNCLEAN: "false",
        }

    def replication(self, brokers: int) -> tuple[int, int]:
        """The replication factor and ``min.insync.replicas`` to create the topic with on ``brokers``
        brokers; raises ``InvalidReplicationError`` when the overrides do not fit the cluster."""
        return resolve_replication(brokers, self.replication_factor, self.min_insync_replicas)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the broker says about the topic: partition count, id and the configurations that matter."""

    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    topic_id: str | None = None
    created: bool = False  # True when this call created the topic
    brokers: int | None = None  # brokers in the cluster when it was described (None: not asked)
    replicas: tuple[PartitionReplicas, ...] = ()  # per partition, in partition order

    @property
    def lossy_reasons(self) -> tuple[str, ...]:
        """Why the topic would lose records (empty when retention is infinite and there is no compaction)."""
        return lossy_reasons(self.configs)

    @property
    def max_message_bytes(self) -> int | None:
        """The topic's ``max.message.bytes`` (``None`` when the broker did not report it)."""
        value = self.configs.get("max.message.bytes")
        return int(value) if value is not None and value.lstrip("-").isdigit() else None

    @property
    def replication_reasons(self) -> tuple[str, ...]:
        """Why the topic could lose acknowledged turns, by the default bar (``replication_problems``)."""
        return self.replication_problems()

    def replication_problems(
        self, replication_factor: int | None = None, min_insync_replicas: int | None = None
    ) -> tuple[str, ...]:
        """Why the topic could lose acknowledged turns (``throughline.log.policy.replication_reasons``);
        empty when its replication was not described (``brokers`` is ``None``)."""
        if self.brokers is None:
            return ()
        return config_replication_reasons(
            self.brokers,
            [len(p.replicas) for p in self.replicas],
            self.configs,
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
        )

    @property
    def replication_factor(self) -> int | None:
        """The smallest replica count among the partitions (``None`` when not described)."""
        return min((len(p.replicas) for p in self.replicas), default=None)

    @property
    def min_insync_replicas(self) -> int | None:
        """The topic's effective ``min.insync.replicas`` (``None`` when not reported)."""
        return min_insync_of(self.configs)

    def replication_json(self) -> dict[str, Any]:
        """The ``replication`` object of ``status --json`` and ``/readyz`` (the topic's replication)."""
        return replication_document(self.brokers, self.replicas, self.configs, self.replication_reasons)

    def partition_json(self, partition: int) -> dict[str, Any]:
        """A partition's leader, replicas, ISR and ``underReplicated`` (empty when unknown)."""
        for p in self.replicas:
            if p.partition == partition:
                return p.to_json(self.min_insync_replicas)
        return {}


@contextmanager
def admin_client(
    servers: list[str], timeout: float, kafka_config: KafkaClientConfig | None = None
) -> Iterator[KafkaAdminClient]:
    """A ``KafkaAdminClient`` whose bootstrap and requests are bounded by ``timeout`` seconds; a Kafka
    error in the block comes out as a ``LogError``."""
    timeout_ms = max(1000, int(timeout * 1000))
    admin = clients.admin(
        servers,
        client_id="throughline-admin",
        connect_timeout=timeout,
        kafka_config=kafka_config,
        request_timeout_ms=timeout_ms,
    )
    try:
        with KafkaErrors(servers, kafka_config):
            yield admin
    finally:
        admin.close()


def _topic_metadata(admin: KafkaAdminClient, topic: str) -> dict[str, Any] | None:
    for entry in admin.describe_topics([topic]):
        if entry.get("name") != topic:
            continue
        code = entry.get("error_code", 0)
        if code == UNKNOWN_TOPIC_CODE:
            return None
        if code:
            raise response_error(code, f"describing topic {topic!r}")
        return dict(entry)
    return None


def _topic_configs(admin: KafkaAdminClient, topic: str) -> dict[str, str]:
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, dict.fromkeys(CHECKED_CONFIGS))
    described = admin.describe_configs([resource], config_filter="all")
    entries = described.get("topic", {}).get(topic, {})
    return {name: str(entry.get("value")) for name, entry in entries.items() if entry.get("value") is not None}


def _broker_count(admin: KafkaAdminClient) -> int:
    # Every registered broker counts, fenced or not: the replication wanted is the cluster's, not the
    # part of it that happens to be up.
    return max(1, len(admin.describe_cluster().get("brokers") or []))


def _replicas(meta: Mapping[str, Any]) -> tuple[PartitionReplicas, ...]:
    rows = []
    for entry in meta.get("partitions") or []:
        leader = entry.get("leader_id", entry.get("leader"))
        rows.append(
            PartitionReplicas(
                partition=int(entry.get("partition_index", entry.get("partition", 0))),
                leader=None if leader is None or int(leader) < 0 else int(leader),
                replicas=tuple(int(b) for b in entry.get("replica_nodes", entry.get("replicas")) or ()),
                isr=tuple(int(b) for b in entry.get("isr_nodes", entry.get("isr")) or ()),
            )
        )
    return tuple(sorted(rows, key=lambda p: p.partition))


def _describe(
    admin: KafkaAdminClient, topic: str, *, created: bool = False, brokers: int | None = None
) -> TopicInfo | None:
    meta = _topic_metadata(admin, topic)
    if meta is None:
        return None
    partitions = len(meta.get("partitions") or [])
    topic_id = meta.get("topic_id")
    return TopicInfo(
        name=topic,
        partitions=partitions,
        configs=MappingProxyType(_topic_configs(admin, topic)),
        topic_id=str(topic_id) if topic_id else None,
        created=created,
        brokers=_broker_count(admin) if brokers is None else brokers,
        replicas=_replicas(meta),
    )


def describe_topic(
    bootstrap_servers: Sequence[str] | str,
    topic: str,
    *,
    timeout: float = DEFAULT_ADMIN_TIMEOUT,
    kafka_config: KafkaClientConfig | None = None,
) -> TopicInfo:
    """Describe an existing topic; raise ``TopicMissingError`` when it does not exist."""
    servers = bootstrap_list(bootstrap_servers)
    with admin_client(servers, timeout, kafka_config) as admin:
        info = _describe(admin, topic)
    if info is None:
        raise TopicMissingError(f"topic {topic!r} does not exist on {', '.join(servers)}")
    return info


def ensure_topic(
    bootstrap_servers: Sequence[str] | str,
    topic: str,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    allow_lossy: bool = False,
    timeout: float = DEFAULT_ADMIN_TIMEOUT,
    kafka_config: KafkaClientConfig | None = None,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
) -> TopicInfo:
    """Make sure the topic exists and keeps every record; return what the broker says about it.

    A missing topic is created with ``partitions`` and ``TopicSettings`` (infinite retention, no
    compaction, ``max.message.bytes`` large enough for any valid turn, unclean leader election off), a
    replication factor of ``replication_factor`` (default ``min(3, brokers)``) and
    ``min.insync.replicas`` of ``min_insync_replicas`` (default ``min(2, RF)``); overrides the cluster
    cannot take raise ``InvalidReplicationError``. An existing topic keeps its own partition count and
    replication (the settings only apply at creation) and is refused when it would lose records
    (``LossyTopicError``) or acknowledged turns (``LossyTopicReplicationError``, by the overrides'
    bar when given), unless ``allow_lossy``. Another process creating the topic at the same moment is
    fine: whoever loses the race describes the topic the winner created. ``kafka_config``: how to
    connect (``None``: ``THROUGHLINE_KAFKA_CONFIG``, else PLAINTEXT).
    """
    servers = bootstrap_list(bootstrap_servers)
    settings = TopicSettings(
        partitions=partitions, replication_factor=replication_factor, min_insync_replicas=min_insync_replicas
    )
    deadline = time.monotonic() + timeout
    with admin_client(servers, timeout, kafka_config) as admin:
        brokers = _broker_count(admin)
        # Checked against the cluster even when the topic exists: an override it cannot take is a mistake
        # in the command, whichever run first meets a missing topic.
        settings.replication(brokers)
        info = _describe(admin, topic, brokers=brokers)
        if info is None:
            created = _create(admin, topic, settings, brokers, timeout)
            info = _wait_visible(admin, topic, created, deadline, brokers)
    check_topic(
        info,
        allow_lossy=allow_lossy,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
    )
    return info


def check_topic(
    info: TopicInfo,
    *,
    allow_lossy: bool = False,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
) -> None:
    """Refuse a described topic that could lose turns: ``LossyTopicError`` (retention, compaction), then
    ``LossyTopicReplicationError`` (replication); with ``allow_lossy`` log a warning instead."""
    retention = info.lossy_reasons
    replication = info.replication_problems(replication_factor, min_insync_replicas)
    if not allow_lossy:
        if retention:
            raise LossyTopicError(info.name, retention)
        if replication:
            raise LossyTopicReplicationError(info.name, replication)
    if retention:
        log.warning("topic %r would lose records (%s); allowed", info.name, "; ".join(retention))
    if replication:
        log.warning("topic %r could lose acknowledged turns (%s); allowed", info.name, "; ".join(replication))


def _create(admin: KafkaAdminClient, topic: str, settings: TopicSettings, brokers: int, timeout: float) -> bool:
    rf, min_insync = settings.replication(brokers)
    configs = {**settings.configs(), MIN_INSYNC: str(min_insync)}
    request = {topic: {"num_partitions": settings.partitions, "replication_factor": rf, "configs": configs}}
    response = admin.create_topics(request, timeout_ms=max(1000, int(timeout * 1000)), raise_errors=False)
    for result in response.get("topics", []):
        if result.get("name") != topic:
            continue
        code = result.get("error_code", 0)
        if code == 0:
            log.info(
                "created topic %r with %d partitions, replication factor %d, %s=%d",
                topic,
                settings.partitions,
                rf,
                MIN_INSYNC,
                min_insync,
            )
            return True
        if code == TOPIC_EXISTS_CODE:  # another process won the race; describe what it created
            return False
        raise response_error(code, result.get("error_message") or f"creating topic {topic!r}")
    raise OtherKafkaError(f"the broker did not answer the creation of topic {topic!r}", retriable=True)


_VISIBLE_TRIES = 50
_VISIBLE_PAUSE_S = 0.2


def _wait_visible(admin: KafkaAdminClient, topic: str, created: bool, deadline: float, brokers: int) -> TopicInfo:
    # A freshly created topic takes a moment to show up (with a leader per partition) in metadata.
    remaining_ms = max(1000, int((deadline - time.monotonic()) * 1000))
    admin.wait_for_topics([topic], timeout_ms=remaining_ms)
    # The broker that answers the description may be another than the one that answered the wait, and
    # on a cluster just back from a failover its metadata can lag by a moment: ask again until the
    # deadline before concluding that the topic was deleted between its creation and its description.
    for _ in range(_VISIBLE_TRIES):
        info = _describe(admin, topic, created=created, brokers=brokers)
        if info is not None or time.monotonic() >= deadline:
            break
        time.sleep(_VISIBLE_PAUSE_S)
    if info is None:
        raise TopicMissingError(f"topic {topic!r} vanished right after it was created")
    return info


class TopicWatch:
    """The topic's description (replication included), asked of the broker at most every ``max_age``
    seconds: ``/readyz`` is polled often, and a description costs an admin connection and two requests.

    A failure is remembered as long as an answer would be, so a broker that does not answer costs one
    bounded wait per ``max_age``, not one per probe. Thread-safe.
    """

    def __init__(
        self,
        bootstrap_servers: Sequence[str] | str,
        topic: str,
        *,
        kafka_config: KafkaClientConfig | None = None,
        max_age: float = 10.0,
        timeout: float = 5.0,
    ) -> None:
        self._servers = bootstrap_list(bootstrap_servers)
        self._topic = topic
        self._kafka_config = kafka_config
        self._max_age = max_age
        self._timeout = timeout
        self._lock = threading.Lock()
        self._answer: tuple[float, TopicInfo | LogError] | None = None

    def describe(self) -> TopicInfo:
        """The topic as described at most ``max_age`` seconds ago; raises the ``LogError`` it failed with."""
        with self._lock:
            now = time.monotonic()
            if self._answer is None or now - self._answer[0] >= self._max_age:
                answer: TopicInfo | LogError
                try:
                    answer = describe_topic(
                        self._servers, self._topic, timeout=self._timeout, kafka_config=self._kafka_config
                    )
                except LogError as exc:
                    answer = exc
                self._answer = (time.monotonic(), answer)
            result = self._answer[1]
        if isinstance(result, LogError):
            raise result
        return result
