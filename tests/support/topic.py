"""Reading a whole topic back in tests: no consumer group, read_committed, bounded in time."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition

from throughline.core.turn import TurnRecord
from throughline.schemas.codec import decode_turn

READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Stored:
    """One record as the topic holds it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def turn(self) -> TurnRecord:
        """The record decoded as a turn (it must be one)."""
        assert self.value is not None, f"record {self.partition}:{self.offset} has no value"
        return decode_turn(self.value)


def read_topic_and_ends(
    bootstrap: str, topic: str, *, timeout: float = READ_TIMEOUT_S
) -> tuple[list[Stored], dict[int, int]]:
    """Every record of ``topic`` below the end offsets of the moment, in (partition, offset) order, and those ends."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_partition_fetch_bytes=16 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or [])
        assert partitions, f"topic {topic} has no partitions"
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: list[Stored] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read the topic to its end in time"
            for tp, records in consumer.poll(timeout_ms=500).items():
                out.extend(Stored(tp.partition, r.offset, r.key, r.value) for r in records if r.offset < ends[tp])
        return sorted(out, key=lambda s: (s.partition, s.offset)), {tp.partition: int(o) for tp, o in ends.items()}
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, *, timeout: float = READ_TIMEOUT_S) -> list[Stored]:
    """Every record of ``topic`` below the end offsets of the moment, in (partition, offset) order."""
    return read_topic_and_ends(bootstrap, topic, timeout=timeout)[0]


def closed_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def turn_ids(records: Iterable[Stored]) -> list[str]:
    """The turn ids of records, in the order given."""
    return [r.turn.turn_id for r in records]
