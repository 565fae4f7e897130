"""``PartitionConsumer``: the projector's fetching consumer of one topic, behind a small typed API.

It is assigned every partition of the topic (no group, nothing committed, no automatic offset reset:
an out-of-range position is an error to explain), reads committed records only, and returns the
records of throughline's record reader (``FetchedRecord``: partition, offset, key, value) where the
running kafka-python takes the hook (``throughline.log.fetch``). The kafka-python consumer stays
inside: callers see partition numbers, records and ``LogError``s, and can only ``poll`` it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafka import TopicPartition

from throughline.log import clients
from throughline.log.config import KafkaClientConfig
from throughline.log.fetch import use_record_reader
from throughline.log.translate import KafkaErrors


def fetching_settings(
    *,
    timeout: float,
    max_poll_records: int,
    fetch_max_bytes: int,
    max_partition_fetch_bytes: int,
    fetch_max_wait_ms: int,
) -> dict[str, Any]:
    """The kafka-python settings of every consumer that fetches turns (``PartitionConsumer`` and the
    group's ``GroupConsumer``): nothing committed to Kafka, no automatic offset reset (an out-of-range
    position is an error to explain), committed records only, no topic created by a fetch, and every
    request bounded by ``timeout`` seconds (but longer than the fetch's own wait)."""
    timeout_ms = max(1000, int(timeout * 1000))
    return {
        "enable_auto_commit": False,
        "auto_offset_reset": "none",
        "isolation_level": "read_committed",
        "allow_auto_create_topics": False,
        "max_poll_records": max_poll_records,
        "fetch_max_bytes": fetch_max_bytes,
        "max_partition_fetch_bytes": max_partition_fetch_bytes,
        "fetch_max_wait_ms": fetch_max_wait_ms,
        "request_timeout_ms": max(timeout_ms, fetch_max_wait_ms + 1000),
    }


class PartitionConsumer:
    """Polls the partitions of one topic from positions the caller sets (``seek``)."""

    def __init__(
        self,
        servers: Sequence[str],
        topic: str,
        partitions: int,
        *,
        client_id: str,
        timeout: float,
        max_poll_records: int,
        fetch_max_bytes: int,
        max_partition_fetch_bytes: int,
        fetch_max_wait_ms: int,
        kafka_config: KafkaClientConfig | None = None,
    ) -> None:
        """Connect (bounded by ``timeout`` seconds, which also bounds each request) and assign the
        topic's ``partitions``. Positions start unset: ``seek`` each partition before polling."""
        self._errors = KafkaErrors(servers, kafka_config)
        self._consumer = clients.consumer(
            servers,
            client_id=client_id,
            connect_timeout=timeout,
            kafka_config=kafka_config,
            group_id=None,
            **fetching_settings(
                timeout=timeout,
                max_poll_records=max_poll_records,
                fetch_max_bytes=fetch_max_bytes,
                max_partition_fetch_bytes=max_partition_fetch_bytes,
                fetch_max_wait_ms=fetch_max_wait_ms,
            ),
        )
        #: Whether polls return ``FetchedRecord``s (else kafka-python's ``ConsumerRecord``s, same fields).
        self.record_reader = use_record_reader(self._consumer)
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
        try:
            with self._errors:
                self._consumer.assign(self._tps)
        except BaseException:
            self._consumer.close()
            raise

    @property
    def partitions(self) -> int:
        """How many partitions are assigned (``0 .. partitions - 1``)."""
        return len(self._tps)

    def seek(self, partition: int, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` on."""
        with self._errors:
            self._consumer.seek(self._tps[partition], offset)

    def poll(self, timeout: float, max_records: int) -> dict[int, list[Any]]:
        """One poll: the records fetched, by partition (``{}`` when none came within ``timeout``)."""
        with self._errors:
            polled = self._consumer.poll(timeout_ms=max(1, int(timeout * 1000)), max_records=max_records)
        return {tp.partition: records for tp, records in polled.items()}

    def position(self, partition: int) -> int | None:
        """The next offset the consumer fetches on ``partition``."""
        with self._errors:
            position = self._consumer.position(self._tps[partition])
        return None if position is None else int(position)

    def highwater(self, partition: int) -> int | None:
        """The partition's high watermark as the last fetch response reported it (``None`` before one)."""
        highwater = self._consumer.highwater(self._tps[partition])
        return None if highwater is None else int(highwater)

    def close(self) -> None:
        """Close the connection."""
        self._consumer.close()
