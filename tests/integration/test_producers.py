"""TurnProducer, ensure_topic and KafkaLog against a real Kafka broker."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from support.topic import closed_port, read_topic, turn_ids

from throughline.core.exceptions import BodyTooLargeError, InvalidTurnError
from throughline.core.identity import project_sha256
from throughline.core.partitioning import partition_for
from throughline.core.turn import MAX_BODY_BYTES, TOPIC_MAX_MESSAGE_BYTES, TurnRecord, parse_rfc3339
from throughline.log import (
    BrokerUnavailableError,
    KafkaLog,
    LossyTopicError,
    TopicMissingError,
    describe_topic,
    ensure_topic,
)
from throughline.producers import LogPosition, TurnProducer

PROJECTS = ["/srv/alpha", "/srv/beta/", "/home/ünïcode/gamma"]


def make_turns(producer: TurnProducer, count: int) -> list[TurnRecord]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        producer.build(
            project=PROJECTS[i % 3],
            host=f"host-{i % 2}",
            thread="main",
            turn_id=f"turn-{i:03d}",
            completed_at=start + timedelta(seconds=i),
            body=f"body {i}\nsecond line ✓",
        )
        for i in range(count)
    ]


def test_turns_of_three_projects_land_on_their_partition_in_order(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=3) as producer:
        assert producer.partitions == 3
        turns = make_turns(producer, 60)
        positions = [producer.send(t) for t in turns[:10]] + producer.send_many(turns[10:])
    assert all(isinstance(p, LogPosition) for p in positions)

    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert len(records) == 60
    by_position = {(r.partition, r.offset): r for r in records}
    sent_order: dict[bytes, list[str]] = defaultdict(list)
    for turn, position in zip(turns, positions, strict=True):
        record = by_position[(position.partition, position.offset)]
        assert record.key == turn.project_sha256
        assert position.partition == partition_for(turn.project_sha256, 3)
        assert record.turn == turn  # the whole turn, exactly as sent
        sent_order[turn.project_sha256].append(turn.turn_id)
    # Per project: one partition, and the log order is the send order.
    for project in PROJECTS:
        key = project_sha256(project)
        mine = [r for r in records if r.key == key]
        assert {r.partition for r in mine} == {partition_for(key, 3)}
        assert turn_ids(mine) == sent_order[key]


def test_append_accepts_datetime_rfc3339_and_micros(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    tokyo = timezone(timedelta(hours=9))
    expected = parse_rfc3339("2026-01-01T00:00:00Z")
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=1) as producer:
        common = {"project": "/p", "host": "h", "thread": "t", "body": "b"}
        producer.append(**common, turn_id="a", completed_at=datetime(2026, 1, 1, 9, tzinfo=tokyo))
        producer.append(**common, turn_id="b", completed_at="2026-01-01T00:00:00Z", seq=2)
        last = producer.append(**common, turn_id="c", completed_at=expected)
        with pytest.raises(InvalidTurnError):
            producer.append(**common, turn_id="d", completed_at=datetime(2026, 1, 1))  # naive
    assert last == LogPosition(0, 2)
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert [(r.turn.turn_id, r.turn.completed_at_micros, r.turn.seq) for r in records] == [
        ("a", expected, None),
        ("b", expected, 2),
        ("c", expected, None),
    ]
    assert all(r.turn.producer.name == "throughline" and r.turn.producer.produced_at_micros > 0 for r in records)


def test_invalid_and_oversized_turns_are_refused_before_sending(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=1) as producer:
        with pytest.raises(BodyTooLargeError) as info:
            producer.append(
                project="/p", host="h", thread="t", turn_id="big", completed_at=0, body="x" * (MAX_BODY_BYTES + 1)
            )
        assert f"the limit is {MAX_BODY_BYTES} bytes" in info.value.message
        good = producer.build(project="/p", host="h", thread="t", turn_id="ok", completed_at=0, body="fine")
        with pytest.raises(InvalidTurnError, match="contentDigest"):
            producer.send(dataclasses.replace(good, body="tampered"))
        with pytest.raises(InvalidTurnError, match="canonical"):
            producer.send(dataclasses.replace(good, project="/p/"))
        # send_many validates every turn before sending any
        with pytest.raises(InvalidTurnError):
            producer.send_many([good, dataclasses.replace(good, turn_id="")])
        with KafkaLog(kafka_bootstrap, kafka_topic_name) as log:
            assert log.end_offsets() == {0: 0}
        # a body at the limit fits in one record
        position = producer.append(
            project="/p", host="h", thread="t", turn_id="max", completed_at=0, body="y" * MAX_BODY_BYTES
        )
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert [(r.partition, r.offset) for r in records] == [(position.partition, position.offset)]
    assert records[0].turn.body_bytes == MAX_BODY_BYTES


def test_unreachable_broker_is_broker_unavailable_naming_the_servers(kafka_topic_name: str) -> None:
    servers = [f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"]
    with pytest.raises(BrokerUnavailableError) as info:
        TurnProducer(servers, kafka_topic_name, connect_timeout=2)
    assert info.value.retriable and info.value.code == "broker_unavailable"
    for server in servers:
        assert server in info.value.message
    with pytest.raises(BrokerUnavailableError, match=servers[0]):
        KafkaLog(servers[0], kafka_topic_name, timeout=1)
    with pytest.raises(BrokerUnavailableError, match=servers[0]):
        ensure_topic(servers[0], kafka_topic_name, timeout=1)


# ---------------------------------------------------------------------------------------------- topics


def test_ensure_topic_creates_an_infinite_retention_topic(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    info = ensure_topic(kafka_bootstrap, kafka_topic_name, partitions=4)
    assert info.created and info.partitions == 4 and info.topic_id
    assert dict(info.configs) == {
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "cleanup.policy": "delete",
        "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES),
        "min.insync.replicas": "1",  # min(2, RF) with RF min(3, brokers) on the one-broker session cluster
        "unclean.leader.election.enable": "false",
    }
    assert info.lossy_reasons == ()
    again = ensure_topic(kafka_bootstrap, kafka_topic_name, partitions=7)  # an existing topic keeps its count
    assert not again.created and again.partitions == 4 and again.topic_id == info.topic_id
    assert describe_topic(kafka_bootstrap, kafka_topic_name) == again


@pytest.mark.parametrize(
    ("configs", "reason"),
    [
        ({"retention.ms": "86400000"}, "retention.ms=86400000"),
        ({}, "retention.ms=604800000"),  # the broker's default retention is finite
        ({"retention.ms": "-1", "retention.bytes": "1073741824"}, "retention.bytes=1073741824"),
        ({"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "compact"}, "cleanup.policy=compact"),
        ({"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "compact,delete"}, "compaction"),
    ],
)
def test_ensure_topic_refuses_a_lossy_topic_unless_allowed(
    kafka_bootstrap: str,
    kafka_topic_name: str,
    kafka_create_topic: Callable[..., str],
    configs: dict[str, str],
    reason: str,
) -> None:
    kafka_create_topic(kafka_topic_name, partitions=2, configs=configs)
    with pytest.raises(LossyTopicError) as info:
        ensure_topic(kafka_bootstrap, kafka_topic_name)
    assert info.value.code == "lossy_topic" and info.value.exit_code == 2
    assert reason in info.value.message
    allowed = ensure_topic(kafka_bootstrap, kafka_topic_name, allow_lossy=True)
    assert allowed.partitions == 2 and not allowed.created
    assert any(reason in r for r in allowed.lossy_reasons)
    with pytest.raises(LossyTopicError):
        TurnProducer(kafka_bootstrap, kafka_topic_name, ensure=False)
    with TurnProducer(kafka_bootstrap, kafka_topic_name, ensure=False, allow_lossy=True) as producer:
        assert producer.partitions == 2


def test_ensure_topic_tolerates_a_concurrent_creation(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    barrier = threading.Barrier(3)
    results: list[object] = []

    def create() -> None:
        barrier.wait(timeout=30)
        try:
            results.append(ensure_topic(kafka_bootstrap, kafka_topic_name, partitions=3))
        except Exception as exc:  # reported by the assertion below
            results.append(exc)

    threads = [threading.Thread(target=create) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 3 and all(not isinstance(r, Exception) for r in results), results
    infos = [r for r in results if not isinstance(r, Exception)]
    assert sum(1 for i in infos if getattr(i, "created", False)) == 1
    assert {getattr(i, "partitions", None) for i in infos} == {3}
    assert len({getattr(i, "topic_id", None) for i in infos}) == 1


def test_a_missing_topic(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    with pytest.raises(TopicMissingError) as info:
        describe_topic(kafka_bootstrap, kafka_topic_name)
    assert info.value.code == "topic_missing" and info.value.retriable
    with pytest.raises(TopicMissingError):
        TurnProducer(kafka_bootstrap, kafka_topic_name, ensure=False)
    with pytest.raises(TopicMissingError):
        KafkaLog(kafka_bootstrap, kafka_topic_name, timeout=5)


# ---------------------------------------------------------------------------------------------- the log view


def test_kafka_log_end_offsets_follow_the_producer(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    with (
        TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=3) as producer,
        KafkaLog(kafka_bootstrap, kafka_topic_name) as log,
    ):
        assert log.partitions == 3 and log.topic == kafka_topic_name
        assert log.end_offsets() == {0: 0, 1: 0, 2: 0}
        turns = make_turns(producer, 9)
        for turn in turns:
            assert log.partition_of(turn.project_sha256) == producer.partition_of(turn.project_sha256)
        positions = producer.send_many(turns)
        for turn, position in zip(turns, positions, strict=True):
            assert position.partition == log.partition_of(turn.project_sha256)
        expected = {p: 0 for p in range(3)}
        for position in positions:
            expected[position.partition] = max(expected[position.partition], position.offset + 1)
        assert log.end_offsets() == expected
        for partition, end in expected.items():
            assert log.end_offset(partition) == end
        # asked of the broker on every call, never cached
        extra = producer.send(turns[0])
        assert log.end_offset(extra.partition) == expected[extra.partition] + 1
        with pytest.raises(Exception, match="not one of"):
            log.end_offset(3)


def test_an_acknowledgement_carries_the_log_append_time(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    """On a ``LogAppendTime`` topic a position's ``timestamp_ms`` is the broker's append instant (the
    freshness bench counts from it): the timestamp the record is read back with, of that type."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    ensure_topic(kafka_bootstrap, kafka_topic_name, partitions=1)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=30_000)
    try:
        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, kafka_topic_name, {"message.timestamp.type": "LogAppendTime"})]
        )
    finally:
        admin.close()
    positions: list[LogPosition] = []
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=1) as producer:
        for i in range(20):  # the topic's new config reaches its log within moments, not at once
            before = int(datetime.now(UTC).timestamp() * 1000)
            turn = producer.build(project="/p", host="h", thread="t", turn_id=f"t{i}", completed_at=0, body="b")
            positions.append(producer.send(turn))
            assert positions[-1].timestamp_ms is not None and positions[-1].timestamp_ms >= before - 1
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    stamps: dict[int, tuple[int, int]] = {}
    try:
        tp = TopicPartition(kafka_topic_name, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 30
        while len(stamps) < len(positions) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                stamps.update((r.offset, (r.timestamp_type, r.timestamp)) for r in records)
    finally:
        consumer.close()
    appended = [p for p in positions if stamps[p.offset][0] == 1]  # 1: LogAppendTime
    assert appended, stamps  # the config took effect within the 20 sends
    assert all(stamps[p.offset][1] == p.timestamp_ms for p in appended)
    assert appended[-1] == positions[-1]  # once in effect, it stays
