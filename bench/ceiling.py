"""Item 1's ceiling: a bare kafka-python consumer reading a topic from offset 0 to its end and decoding
every record with fastavro, writing nothing. Every projector figure is a ratio of this one."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any

import fastavro
from kafka import KafkaConsumer, TopicPartition

from bench.common import end_offsets
from throughline.log.fetch import use_record_reader
from throughline.schemas.codec import CURRENT_VERSION, HEADER_BYTES, SCHEMAS

#: kafka-python's defaults, stated so the report can name them (the projector's consumer is compared
#: against the same settings unless it chooses larger fetches, which the report then says).
CONSUMER_SETTINGS: dict[str, Any] = {
    "fetch_max_bytes": 52_428_800,
    "max_partition_fetch_bytes": 1_048_576,
    "max_poll_records": 500,
}


@dataclass(frozen=True)
class ConsumeResult:
    """What one pass over the topic saw."""

    records: int
    value_bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        """Records per second."""
        return self.records / self.seconds if self.seconds > 0 else float("nan")


def consume_and_decode(
    bootstrap: str,
    topic: str,
    *,
    timeout_s: float = 600.0,
    settings: dict[str, Any] | None = None,
    record_reader: bool = False,
) -> ConsumeResult:
    """Read every partition of ``topic`` from offset 0 to the end offsets seen at the start, decoding
    each value with fastavro (schemaless, after the 10-byte single-object header); return the timing.

    The clock starts before the consumer is created, like a projector process that starts cold.
    ``record_reader`` parses the fetched batches with throughline's record reader (what the
    projector's consumer does) instead of kafka-python's own parser (the ceiling item 1 defines).
    """
    ends = end_offsets(bootstrap, topic)
    schema = SCHEMAS[CURRENT_VERSION].parsed
    reader = fastavro.schemaless_reader
    start = time.perf_counter()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **(settings or CONSUMER_SETTINGS),
    )
    if record_reader and not use_record_reader(consumer):
        raise RuntimeError("throughline's record reader does not fit this kafka-python")
    records = 0
    size = 0
    try:
        tps = [TopicPartition(topic, p) for p in sorted(ends)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        remaining = {tp.partition: ends[tp.partition] for tp in tps if ends[tp.partition] > 0}
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ceiling consumer did not reach the end of {topic} in {timeout_s}s")
            batches = consumer.poll(timeout_ms=500)
            for tp, msgs in batches.items():
                for m in msgs:
                    value = m.value
                    buf = io.BytesIO(value)
                    buf.seek(HEADER_BYTES)
                    reader(buf, schema, None)
                    size += len(value)
                records += len(msgs)
                end = ends.get(tp.partition, 0)
                if msgs and msgs[-1].offset + 1 >= end:
                    remaining.pop(tp.partition, None)
    finally:
        consumer.close()
    return ConsumeResult(records, size, time.perf_counter() - start)
