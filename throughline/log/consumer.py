"""``PartitionConsumer``: the projector's fetching consumer of one topic, behind a small typed API.

It is assigned every partition of the topic (no group, nothing committed, no automatic offset reset:
an out-of-range position is an error to explain), reads committed records only, and returns the
records of throughline's record reader (``FetchedRecord``: partition, offset, key, value) where the
running kafka-python takes the hook (``throughline.log.fetch``). The kafka-python consumer stays
inside: callers see partition numbers, records and ``LogError``s, and can only ``poll`` it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka import TopicPartition

from throughline.log import clients
from throughline.log.config import KafkaClientConfig
from throughline.log.fetch import use_record_reader
from throughline.log.translate import KafkaErrors

#: kafka-python's wait before it retries a request or refreshes metadata again, and its sleep in a poll
#: with nothing to fetch (its default: 100 ms). A new consumer's bootstrap asks for no topic's metadata,
#: so its assigned partitions have no known leader until a refresh that waited out this backoff after
#: the bootstrap's, and its first poll slept it once more: ~200 ms from assignment to the first fetch
#: request at every projector start (a fifth of a 200k-record catch-up on a fast machine). Connection
#: attempts keep their own backoff (``reconnect_backoff_ms``, growing to 30 s), and a failed metadata
#: request backs off by the connection's delay (kafka-python follows KIP-580 there).
RETRY_BACKOFF_MS = 20


def prompt_metadata(consumer: Any) -> bool:
    """Give ``consumer``'s cluster metadata the consumer's ``RETRY_BACKOFF_MS``; ``False`` when it does
    not have the shape this was written against (the backoff stays kafka-python's 100 ms).

    kafka-python 3.0 builds its ``ClusterMetadata`` without the consumer's ``retry_backoff_ms`` (its
    ``KafkaNetManager`` passes only the servers, the metadata age and the DNS mode), so no setting
    reaches it: this sets the private ``config`` of the consumer's ``_cluster``, which the pinned
    kafka-python range has (tests/integration/test_consumer_startup.py pins it).
    """
    cluster = getattr(consumer, "_cluster", None)
    config = getattr(cluster, "config", None)
    if not isinstance(config, dict) or "retry_backoff_ms" not in config:
        return False
    config["retry_backoff_ms"] = RETRY_BACKOFF_MS
    return True


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """How a consumer that fetches turns fetches (``PartitionConsumer`` and the group's ``GroupConsumer``):
    records a poll returns at most, and kafka-python's fetch sizes and wait."""

    max_poll_records: int = 500
    fetch_max_bytes: int = 50 * 1024 * 1024
    max_partition_fetch_bytes: int = 2 * 1024 * 1024
    fetch_max_wait_ms: int = 500

    def kafka_settings(self, timeout: float) -> dict[str, Any]:
        """The kafka-python settings of a fetching consumer: nothing committed to Kafka, no automatic
        offset reset (an out-of-range position is an error to explain), committed records only, no topic
        created by a fetch, these fetch sizes, and every request bounded by ``timeout`` seconds (but
        longer than the fetch's own wait)."""
        timeout_ms = max(1000, int(timeout * 1000))
        return {
            "enable_auto_commit": False,
            "auto_offset_reset": "none",
            "isolation_level": "read_committed",
            "allow_auto_create_topics": False,
            "max_poll_records": self.max_poll_records,
            "fetch_max_bytes": self.fetch_max_bytes,
            "max_partition_fetch_bytes": self.max_partition_fetch_bytes,
            "fetch_max_wait_ms": self.fetch_max_wait_ms,
            "request_timeout_ms": max(timeout_ms, self.fetch_max_wait_ms + 1000),
            "retry_backoff_ms": RETRY_BACKOFF_MS,
        }


#: kafka-python's fetch sizes, but 2 MiB partition fetches (the settings of a consumer given none).
DEFAULT_FETCH = FetchSettings()


class FetchingConsumer:
    """What every consumer that fetches turns shares (``PartitionConsumer``, the group's ``GroupConsumer``):
    a kafka-python consumer with ``FetchSettings``, its errors translated, and ``poll``."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        client_id: str,
        timeout: float,
        fetch: FetchSettings,
        kafka_config: KafkaClientConfig | None,
        record_reader: bool = True,
        **tuning: Any,
    ) -> None:
        """Connect (bounded by ``timeout`` seconds, which also bounds each request); ``tuning``: the
        subclass's own kafka-python settings (its group). ``record_reader=False`` keeps kafka-python's
        own ``ConsumerRecord``s (with timestamps and headers, which throughline's reader skips)."""
        self._errors = KafkaErrors(servers, kafka_config)
        self._consumer = clients.consumer(
            servers,
            client_id=client_id,
            connect_timeout=timeout,
            kafka_config=kafka_config,
            **tuning,
            **fetch.kafka_settings(timeout),
        )
        #: Whether polls return ``FetchedRecord``s (else kafka-python's ``ConsumerRecord``s, same fields).
        self.record_reader = record_reader and use_record_reader(self._consumer)
        #: Whether the metadata refreshes follow ``RETRY_BACKOFF_MS`` (else kafka-python's 100 ms).
        self.prompt_metadata = prompt_metadata(self._consumer)

    def poll(self, timeout: float, max_records: int) -> dict[int, list[Any]]:
        """One poll: the records fetched, by partition (``{}`` when none came within ``timeout``); a group
        member's poll also advances its joins and rebalances."""
        with self._errors:
            polled = self._consumer.poll(timeout_ms=max(1, int(timeout * 1000)), max_records=max_records)
        return {tp.partition: records for tp, records in polled.items()}


class PartitionConsumer(FetchingConsumer):
    """Polls the partitions of one topic from positions the caller sets (``seek``)."""

    def __init__(
        self,
        servers: Sequence[str],
        topic: str,
        partitions: int,
        *,
        client_id: str,
        timeout: float,
        fetch: FetchSettings = DEFAULT_FETCH,
        kafka_config: KafkaClientConfig | None = None,
    ) -> None:
        """Connect (bounded by ``timeout`` seconds, which also bounds each request) and assign the
        topic's ``partitions``, to fetch as ``fetch`` says. Positions start unset: ``seek`` each
        partition before polling."""
        super().__init__(
            servers, client_id=client_id, timeout=timeout, fetch=fetch, kafka_config=kafka_config, group_id=None
        )
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
