"""``KafkaLog``: the reader's and projector's view of the log right now (the ``LogView`` port).

"The log at the time of the call" is a partition's end offset, so ``end_offset`` asks the broker on
every call (a ListOffsets request, bounded in time) and never answers from a cache. One long-lived
``KafkaConsumer`` without a group serves those requests: it joins no group, commits nothing and
fetches no records. kafka-python consumers are not thread-safe, so every use goes through a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import kafka.errors as kafka_errors
from kafka import KafkaConsumer, TopicPartition

from throughline.core.partitioning import partition_for
from throughline.log.exceptions import LogError, TopicMissingError
from throughline.log.topic import RECONNECT_BACKOFF_MAX_MS, bootstrap_list, translate_kafka_error

if TYPE_CHECKING:
    from throughline.core.ports import LogView

DEFAULT_LOG_TIMEOUT = 10.0


class KafkaLog:
    """The partitions and end offsets of the topic of completed turns (implements ``LogView``).

    The partition count is read once when the view opens; a topic's partition count must never change
    (see ``throughline.log.topic``).
    """

    def __init__(
        self,
        bootstrap_servers: Sequence[str] | str,
        topic: str,
        *,
        timeout: float = DEFAULT_LOG_TIMEOUT,
        client_id: str = "throughline-log",
    ) -> None:
        """Connect (bounded by ``timeout`` seconds) and read the topic's partition count.

        Raises ``BrokerUnavailableError`` when no broker answers and ``TopicMissingError`` when the topic
        does not exist.
        """
        self._servers = bootstrap_list(bootstrap_servers)
        self._topic = topic
        self._timeout_ms = max(1000, int(timeout * 1000))
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._consumer = KafkaConsumer(
                bootstrap_servers=self._servers,
                client_id=client_id,
                group_id=None,
                enable_auto_commit=False,
                allow_auto_create_topics=False,
                bootstrap_timeout_ms=self._timeout_ms,
                request_timeout_ms=self._timeout_ms,
                reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
            )
        except kafka_errors.KafkaError as exc:
            raise translate_kafka_error(exc, self._servers) from exc
        try:
            with self._lock:
                ids = self._consumer.partitions_for_topic(topic)
        except kafka_errors.KafkaError as exc:
            self._consumer.close()
            raise translate_kafka_error(exc, self._servers) from exc
        if not ids:
            self._consumer.close()
            raise TopicMissingError(f"topic {topic!r} does not exist on {', '.join(self._servers)}")
        self._partitions = len(ids)
        if set(ids) != set(range(self._partitions)):
            self._consumer.close()
            raise LogError(f"topic {topic!r} reports partitions {sorted(ids)}", code="kafka_error")

    @property
    def topic(self) -> str:
        """The topic's name."""
        return self._topic

    @property
    def partitions(self) -> int:
        """The topic's partition count."""
        return self._partitions

    @property
    def bootstrap_servers(self) -> list[str]:
        """The servers this view talks to."""
        return list(self._servers)

    def partition_of(self, project_sha256: bytes) -> int:
        """The partition that holds the project's records."""
        return partition_for(project_sha256, self._partitions)

    def end_offset(self, partition: int) -> int:
        """The partition's end offset (the offset the next record will get), asked of the broker now."""
        return self.end_offsets([partition])[partition]

    def end_offsets(self, partitions: Sequence[int] | None = None) -> dict[int, int]:
        """End offsets of ``partitions`` (all of the topic's by default), asked of the broker in one call."""
        wanted = list(range(self._partitions)) if partitions is None else list(partitions)
        for p in wanted:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self._partitions:
                raise LogError(
                    f"partition {p!r} is not one of topic {self._topic!r}'s {self._partitions} partitions",
                    code="unknown_partition",
                )
        tps = [TopicPartition(self._topic, p) for p in wanted]
        with self._lock:
            if self._closed:
                raise LogError("the log view is closed", code="log_closed")
            try:
                answer = self._consumer.end_offsets(tps, timeout_ms=self._timeout_ms)
            except kafka_errors.KafkaError as exc:
                raise translate_kafka_error(exc, self._servers) from exc
        return {tp.partition: int(offset) for tp, offset in answer.items()}

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._consumer.close()

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


if TYPE_CHECKING:

    def _implements_log_view(log: KafkaLog) -> LogView:  # mypy proves KafkaLog fits the port
        return log
