"""Reading a whole topic back in tests (no consumer group; bounded in time)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition

from throughline.core.turn import TurnRecord
from throughline.schemas.codec import decode_turn

READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Stored:
    """One record as the topic holds it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes

    @property
    def turn(self) -> TurnRecord:
        return decode_turn(self.value)


def read_topic(bootstrap: str, topic: str) -> list[Stored]:
    """Every record of ``topic`` from offset 0 to the end offsets of the moment, in (partition, offset) order."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or [])
        assert partitions, f"topic {topic} has no partitions"
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: list[Stored] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read the topic to its end in time"
            for tp, records in consumer.poll(timeout_ms=500).items():
                out.extend(Stored(tp.partition, r.offset, r.key, r.value) for r in records if r.offset < ends[tp])
        return sorted(out, key=lambda s: (s.partition, s.offset))
    finally:
        consumer.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def turn_ids(records: Iterable[Stored]) -> list[str]:
    """The turn ids of records, in the order given."""
    return [r.turn.turn_id for r in records]
