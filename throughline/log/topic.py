"""The topic of completed turns: creating it with infinite retention, and checking an existing one.

The log is the source of truth (the DuckDB projection can always be rebuilt by replaying it), so the
topic must never drop a record: ``retention.ms=-1``, ``retention.bytes=-1``, ``cleanup.policy=delete``
(compaction would keep only the last record per key, i.e. one turn per project). ``ensure_topic``
creates it that way when it is missing and refuses an existing topic that would lose records, unless
the operator explicitly allows it.

The partition count is fixed at creation. Never add partitions to a live topic: the partition of a
project is ``partition_for(project_sha256, partition_count)``, so a new count would move projects to
other partitions and break their total order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from throughline.core.turn import TOPIC_MAX_MESSAGE_BYTES
from throughline.errors import ConfigurationError
from throughline.log import clients
from throughline.log.config import KafkaClientConfig
from throughline.log.exceptions import LogError, LossyTopicError, TopicMissingError
from throughline.log.translate import TOPIC_EXISTS_CODE, UNKNOWN_TOPIC_CODE, KafkaErrors, response_error

log = logging.getLogger(__name__)

#: Topic configurations throughline reads back and reports (the ones that decide whether records live).
CHECKED_CONFIGS = ("retention.ms", "retention.bytes", "cleanup.policy", "max.message.bytes")
DEFAULT_PARTITIONS = 3
DEFAULT_ADMIN_TIMEOUT = 15.0


def bootstrap_list(bootstrap_servers: Sequence[str] | str) -> list[str]:
    """Normalise bootstrap servers (a list, or one comma-separated string) into a non-empty list."""
    items = [bootstrap_servers] if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    servers = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
    if not servers:
        raise ConfigurationError("no Kafka bootstrap servers given", code="missing_bootstrap_servers")
    return servers


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """How throughline creates the topic of completed turns."""

    partitions: int = DEFAULT_PARTITIONS
    max_message_bytes: int = TOPIC_MAX_MESSAGE_BYTES
    retention_ms: int = -1
    retention_bytes: int = -1
    cleanup_policy: str = "delete"

    def __post_init__(self) -> None:
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or self.partitions < 1:
            raise ConfigurationError("a topic needs at least one partition", code="invalid_partitions")

    def configs(self) -> dict[str, str]:
        """The topic configurations to create the topic with."""
        return {
            "max.message.bytes": str(self.max_message_bytes),
            "retention.ms": str(self.retention_ms),
            "retention.bytes": str(self.retention_bytes),
            "cleanup.policy": self.cleanup_policy,
        }


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the broker says about the topic: partition count, id and the configurations that matter."""

    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    topic_id: str | None = None
    created: bool = False  # True when this call created the topic

    @property
    def lossy_reasons(self) -> tuple[str, ...]:
        """Why the topic would lose records (empty when retention is infinite and there is no compaction)."""
        return lossy_reasons(self.configs)

    @property
    def max_message_bytes(self) -> int | None:
        """The topic's ``max.message.bytes`` (``None`` when the broker did not report it)."""
        value = self.configs.get("max.message.bytes")
        return int(value) if value is not None and value.lstrip("-").isdigit() else None


def lossy_reasons(configs: Mapping[str, str]) -> tuple[str, ...]:
    """Why a topic with these configurations would lose records (empty when it keeps them all).

    A configuration the broker did not report counts as a reason: what cannot be checked is not trusted.
    """
    reasons: list[str] = []
    for key in ("retention.ms", "retention.bytes"):
        value = configs.get(key)
        if value is None:
            reasons.append(f"{key} was not reported")
        elif value.strip() != "-1":
            reasons.append(f"{key}={value} (finite)")
    policy = configs.get("cleanup.policy")
    if policy is None:
        reasons.append("cleanup.policy was not reported")
    elif "compact" in {p.strip().lower() for p in policy.split(",")}:
        reasons.append(f"cleanup.policy={policy} (compaction keeps one record per key)")
    return tuple(reasons)


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


def _describe(admin: KafkaAdminClient, topic: str, *, created: bool = False) -> TopicInfo | None:
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
) -> TopicInfo:
    """Make sure the topic exists and keeps every record; return what the broker says about it.

    A missing topic is created with ``partitions`` and ``TopicSettings`` (infinite retention, no
    compaction, ``max.message.bytes`` large enough for any valid turn). An existing topic keeps its own
    partition count (``partitions`` only applies at creation) and is refused with ``LossyTopicError``
    when it would lose records, unless ``allow_lossy``. Another process creating the topic at the same
    moment is fine: whoever loses the race describes the topic the winner created. ``kafka_config``:
    how to connect (``None``: ``THROUGHLINE_KAFKA_CONFIG``, else PLAINTEXT).
    """
    servers = bootstrap_list(bootstrap_servers)
    settings = TopicSettings(partitions=partitions)
    deadline = time.monotonic() + timeout
    with admin_client(servers, timeout, kafka_config) as admin:
        info = _describe(admin, topic)
        if info is None:
            created = _create(admin, topic, settings, timeout)
            info = _wait_visible(admin, topic, created, deadline)
    if info.lossy_reasons:
        if not allow_lossy:
            raise LossyTopicError(topic, info.lossy_reasons)
        log.warning("topic %r would lose records (%s); allowed", topic, "; ".join(info.lossy_reasons))
    return info


def _create(admin: KafkaAdminClient, topic: str, settings: TopicSettings, timeout: float) -> bool:
    request = {topic: {"num_partitions": settings.partitions, "configs": settings.configs()}}
    response = admin.create_topics(request, timeout_ms=max(1000, int(timeout * 1000)), raise_errors=False)
    for result in response.get("topics", []):
        if result.get("name") != topic:
            continue
        code = result.get("error_code", 0)
        if code == 0:
            log.info("created topic %r with %d partitions", topic, settings.partitions)
            return True
        if code == TOPIC_EXISTS_CODE:  # another process won the race; describe what it created
            return False
        raise response_error(code, result.get("error_message") or f"creating topic {topic!r}")
    raise LogError(f"the broker did not answer the creation of topic {topic!r}", code="kafka_error", retriable=True)


def _wait_visible(admin: KafkaAdminClient, topic: str, created: bool, deadline: float) -> TopicInfo:
    # A freshly created topic takes a moment to show up (with a leader per partition) in metadata.
    remaining_ms = max(1000, int((deadline - time.monotonic()) * 1000))
    admin.wait_for_topics([topic], timeout_ms=remaining_ms)
    info = _describe(admin, topic, created=created)
    if info is None:  # deleted between creation and description
        raise TopicMissingError(f"topic {topic!r} vanished right after it was created")
    return info
