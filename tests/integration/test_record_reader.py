"""throughline's record reader in a real consumer against the real broker: the same records, at the
same positions, as kafka-python's own parser, over what a topic may hold besides plain batches
(committed and aborted transactions, compressed batches, headers, tombstones)."""

from __future__ import annotations

import os
import random
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from throughline.log.fetch import use_record_reader
from throughline.log.record_batch import FetchedRecord
from throughline.projector.feed import FeedSpec, ProjectorOptions, open_consumer
from throughline.testing import create_topic

PARTITIONS = 2


def _produce(bootstrap: str, topic: str) -> int:
    """Plain, gzip-compressed, transactional (committed and aborted) records; return the count sent."""
    sent = 0
    plain = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    gz = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, compression_type="gzip")
    for i in range(300):
        p = i % PARTITIONS
        plain.send(topic, key=b"k%d" % i, value=os.urandom(random.randrange(0, 400)), partition=p)
        gz.send(topic, key=None, value=b"z" * (i % 50) + b"%d" % i, partition=p, headers=[("h", b"v"), ("empty", b"")])
        sent += 2
    plain.send(topic, key=b"tombstone", value=None, partition=0)
    sent += 1
    plain.flush()
    gz.flush()
    txn = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"rr-{topic}", linger_ms=5)
    txn.init_transactions()
    for round_ in range(6):
        txn.begin_transaction()
        for i in range(40):
            txn.send(topic, key=b"t", value=b"txn %d %d" % (round_, i), partition=i % PARTITIONS)
            sent += 1
        if round_ % 2:
            txn.abort_transaction()
        else:
            txn.commit_transaction()
        plain.send(topic, key=b"between", value=b"%d" % round_, partition=round_ % PARTITIONS)
        plain.flush()
        sent += 1
    for producer in (plain, gz, txn):
        producer.close()
    return sent


def _read_all(consumer: KafkaConsumer, topic: str, max_records: int) -> tuple[list[tuple], dict[int, int]]:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    ends = consumer.end_offsets(tps)
    got: list[tuple] = []
    deadline = time.monotonic() + 60
    while any(consumer.position(tp) < ends[tp] for tp in tps):
        assert time.monotonic() < deadline, "the topic was not read to its end within 60 s"
        for tp, records in consumer.poll(timeout_ms=500, max_records=max_records).items():
            got.extend((tp.partition, r.offset, r.key, r.value) for r in records)
    positions = {tp.partition: consumer.position(tp) for tp in tps}
    consumer.close()
    return got, positions


@pytest.fixture(scope="module")
def mixed_topic(kafka_bootstrap: str) -> tuple[str, int]:
    topic = f"record-reader-{os.getpid()}-{random.randrange(1 << 30)}"
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    return topic, _produce(kafka_bootstrap, topic)


@pytest.mark.parametrize("max_records", [7, 500])
def test_the_reader_returns_what_kafka_python_returns(
    kafka_bootstrap: str, mixed_topic: tuple[str, int], max_records: int
):
    topic, sent = mixed_topic
    settings = {"bootstrap_servers": kafka_bootstrap, "isolation_level": "read_committed", "enable_auto_commit": False}
    stock, stock_positions = _read_all(KafkaConsumer(**settings), topic, max_records)
    reading = KafkaConsumer(**settings)
    assert use_record_reader(reading) is True
    ours, our_positions = _read_all(reading, topic, max_records)

    assert ours == stock
    assert our_positions == stock_positions  # past the markers and the aborted batches alike
    aborted = 3 * 40
    assert len(ours) == sent - aborted
    assert not any(v is not None and v.startswith(b"txn 1 ") for _, _, _, v in ours)
    assert any(v is not None and v.startswith(b"txn 2 ") for _, _, _, v in ours)
    assert (0, b"tombstone", None) in {(p, k, v) for p, _, k, v in ours}


def test_the_projector_consumer_reads_with_it(kafka_bootstrap: str, mixed_topic: tuple[str, int]):
    topic, _ = mixed_topic
    consumer = open_consumer(FeedSpec((kafka_bootstrap,), topic, PARTITIONS, (), ProjectorOptions()))
    assert consumer.record_reader is True
    consumer.seek(0, 0)
    consumer.seek(1, 0)
    records: list = []
    deadline = time.monotonic() + 30
    while not records and time.monotonic() < deadline:
        records = consumer.poll(0.5, 100).get(0, [])
    consumer.close()
    assert records and all(type(r) is FetchedRecord for r in records)


@pytest.mark.filterwarnings("ignore:value_deserializer does not implement")
def test_a_consumer_with_deserializers_keeps_kafka_pythons_parser(kafka_bootstrap: str):
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, value_deserializer=bytes.upper)
    try:
        assert use_record_reader(consumer) is False
    finally:
        consumer.close()
