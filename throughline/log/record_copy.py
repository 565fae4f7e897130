"""Records as the log stores them, read out whole and written back: the Kafka half of log backups.

``RecordSource`` reads chosen partitions of a topic from chosen offsets and returns every record with
all it carries (offset, timestamp and its type, key, value, headers) as a ``StoredRecord``;
``RecordSink`` writes such records to chosen partitions of another topic, keeping key, value, headers
and timestamp. What a backup does with them (files, manifest, resuming) is ``throughline.backup``'s.

The source reads committed records only (``read_committed``, as the projector does): a record of an
aborted transaction and the transactions' control records are never returned, so the offsets of what
it returns may have gaps; it keeps the original offsets. It uses kafka-python's own record parser,
not throughline's (``throughline.log.fetch``), which skips timestamps and headers.

The sink is an idempotent producer (``acks=all``, at most 5 requests in flight), so that what lands
on a partition is always a prefix, in order, of what was sent to it: a run that fails leaves each
partition holding the first N records sent, never a gap or a record twice. Records go to the partition
the caller names (never a partitioner's choice), and a record's timestamp is sent as its CreateTime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from kafka import TopicPartition

from throughline.core.turn import TOPIC_MAX_MESSAGE_BYTES
from throughline.log import clients
from throughline.log.config import KafkaClientConfig
from throughline.log.consumer import DEFAULT_FETCH, FetchingConsumer, FetchSettings
from throughline.log.translate import KafkaErrors, translate_kafka_error

#: Kafka's timestamp types (a record batch's attribute bit): the producer's time, or the broker's.
CREATE_TIME = 0
LOG_APPEND_TIME = 1


class StoredRecord(NamedTuple):
    """One record as the log stores it."""

    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    timestamp_type: int  # CREATE_TIME or LOG_APPEND_TIME
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _stored(record: Any) -> StoredRecord:
    """A kafka-python ``ConsumerRecord`` as a ``StoredRecord``."""
    headers = tuple((str(k), None if v is None else bytes(v)) for k, v in (record.headers or ()))
    return StoredRecord(
        int(record.partition),
        int(record.offset),
        int(record.timestamp),
        int(record.timestamp_type),
        None if record.key is None else bytes(record.key),
        None if record.value is None else bytes(record.value),
        headers,
    )


class RecordSource(FetchingConsumer):
    """Reads chosen partitions of a topic, committed records only, each from the offset the caller seeks to."""

    def __init__(
        self,
        servers: Sequence[str],
        topic: str,
        partitions: Sequence[int],
        *,
        timeout: float,
        fetch: FetchSettings = DEFAULT_FETCH,
        kafka_config: KafkaClientConfig | None = None,
        client_id: str = "throughline-export",
    ) -> None:
        """Connect (bounded by ``timeout`` seconds, which also bounds each request) and assign
        ``partitions`` of ``topic``; ``seek`` each before polling."""
        super().__init__(
            servers,
            client_id=client_id,
            timeout=timeout,
            fetch=fetch,
            kafka_config=kafka_config,
            record_reader=False,
            group_id=None,
        )
        self._tps = {p: TopicPartition(topic, p) for p in partitions}
        try:
            with self._errors:
                self._consumer.assign(list(self._tps.values()))
        except BaseException:
            self._consumer.close()
            raise

    def seek(self, partition: int, offset: int) -> None:
        """Read ``partition`` from ``offset`` on."""
        with self._errors:
            self._consumer.seek(self._tps[partition], offset)

    def position(self, partition: int) -> int:
        """The next offset to read on ``partition`` (past aborted and control records once they were fetched)."""
        with self._errors:
            return int(self._consumer.position(self._tps[partition]))

    def pause(self, partition: int) -> None:
        """Fetch nothing more of ``partition`` (it reached its bound)."""
        self._consumer.pause(self._tps[partition])

    def read(self, timeout: float, max_records: int) -> dict[int, list[StoredRecord]]:
        """One poll: the records read, by partition, in offset order (``{}`` when none came in time)."""
        return {p: [_stored(r) for r in records] for p, records in self.poll(timeout, max_records).items()}

    def close(self) -> None:
        """Close the connection."""
        self._consumer.close()


#: The sink's batching: a few milliseconds' linger, large zstd batches (a restore is a bulk copy).
SINK_LINGER_MS = 10
SINK_BATCH_BYTES = 512 * 1024


def unwritable(record: StoredRecord) -> str | None:
    """Why ``RecordSink`` cannot write ``record`` as it is (``None``: it can). kafka-python refuses a
    header with a null value and a record with neither key nor value, both of which Kafka allows."""
    if record.key is None and record.value is None:
        return "it has neither key nor value"
    if any(value is None for _, value in record.headers):
        return "it has a header with a null value"
    return None


class RecordSink:
    """Writes records to chosen partitions of one topic (an idempotent producer; a context manager)."""

    def __init__(
        self,
        servers: Sequence[str],
        topic: str,
        *,
        send_timeout: float = 60.0,
        connect_timeout: float = 15.0,
        kafka_config: KafkaClientConfig | None = None,
        client_id: str = "throughline-import",
    ) -> None:
        """Connect an idempotent producer to ``topic`` (which must exist: a send never creates a topic)."""
        self._servers = list(servers)
        self._topic = topic
        self._errors = KafkaErrors(self._servers, kafka_config)
        self._config = kafka_config
        delivery_ms = max(2000, int(send_timeout * 1000))
        self._producer = clients.producer(
            self._servers,
            client_id=client_id,
            connect_timeout=connect_timeout,
            kafka_config=kafka_config,
            acks="all",
            enable_idempotence=True,
            max_in_flight_requests_per_connection=5,
            retries=100,
            delivery_timeout_ms=delivery_ms,
            request_timeout_ms=min(30_000, delivery_ms - SINK_LINGER_MS),
            max_block_ms=delivery_ms,
            max_request_size=TOPIC_MAX_MESSAGE_BYTES,
            linger_ms=SINK_LINGER_MS,
            batch_size=SINK_BATCH_BYTES,
            compression_type="zstd",
            allow_auto_create_topics=False,
        )
        self._futures: list[Any] = []

    def send(self, partition: int, record: StoredRecord) -> None:
        """Queue ``record`` for ``partition`` (its key, value, headers, and its timestamp as CreateTime);
        ``flush`` waits for the acknowledgements and raises the first failure."""
        with self._errors:
            future = self._producer.send(
                self._topic,
                value=record.value,
                key=record.key,
                headers=list(record.headers),
                partition=partition,
                timestamp_ms=record.timestamp,
            )
        self._futures.append(future)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued record is acknowledged; raise a ``LogError`` for the first that failed."""
        with self._errors:
            self._producer.flush(timeout=timeout)
        futures, self._futures = self._futures, []
        for future in futures:
            exc = future.exception if future.failed() else None
            if exc is not None:
                raise translate_kafka_error(exc, self._servers, self._config)

    def close(self, timeout: float = 10.0) -> None:
        """Close the producer (records not yet acknowledged may still be sent within ``timeout``)."""
        self._producer.close(timeout=timeout)

    def __enter__(self) -> RecordSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
