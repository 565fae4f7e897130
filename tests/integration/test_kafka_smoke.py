"""Smoke test: the harness gives us a real Kafka broker that behaves like one."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from throughline.testing import DockerKafka, create_topic

PARTITIONS = 3
RECORDS = [(f"key-{i % 5}", f"value-{i}") for i in range(20)]
TIMEOUT_S = 30.0


def _group_offsets(admin: Any, group_id: str) -> dict[TopicPartition, int]:
    """Committed offsets of ``group_id`` as the broker reports them (kafka-python 2.x and 3.x)."""
    if hasattr(admin, "list_group_offsets"):
        raw = admin.list_group_offsets({group_id: None})[group_id]
    else:
        raw = admin.list_consumer_group_offsets(group_id)
    return {tp: oam.offset for tp, oam in raw.items()}


def test_produce_consume_end_offsets_and_group_commit(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_group_id: str, kafka_admin: Any
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)

    described = kafka_admin.describe_topics([topic])
    assert len(described) == 1
    assert len(described[0]["partitions"]) == PARTITIONS

    # Produce keyed records with acks=all and wait for every acknowledgement.
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0, retries=3)
    try:
        futures = [producer.send(topic, key=k.encode(), value=v.encode()) for k, v in RECORDS]
        metadata = [f.get(timeout=TIMEOUT_S) for f in futures]
        producer.flush(timeout=TIMEOUT_S)
    finally:
        producer.close(timeout=10)

    assert all(m.topic == topic for m in metadata)
    # The default partitioner is deterministic per key: one key, one partition.
    partitions_by_key: dict[str, set[int]] = {}
    for (key, _), m in zip(RECORDS, metadata, strict=True):
        partitions_by_key.setdefault(key, set()).add(m.partition)
    assert all(len(ps) == 1 for ps in partitions_by_key.values()), partitions_by_key
    produced_per_partition = Counter(m.partition for m in metadata)
    assert len(produced_per_partition) > 1, "5 keys over 3 partitions should not all hash to one partition"

    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        group_id=kafka_group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=int(TIMEOUT_S * 1000) + 5000,
    )
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)

        received: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        for _ in range(1000):
            if len(received) >= len(RECORDS) or time.monotonic() > deadline:
                break
            for batch in consumer.poll(timeout_ms=500).values():
                received.extend(batch)

        # Everything came back, exactly once, with keys intact and offsets dense per partition.
        assert sorted((r.key.decode(), r.value.decode()) for r in received) == sorted(RECORDS)
        for p in range(PARTITIONS):
            offsets = [r.offset for r in received if r.partition == p]
            assert offsets == list(range(produced_per_partition[p])), (p, offsets)

        end = consumer.end_offsets(tps)
        assert {tp.partition: off for tp, off in end.items()} == {
            p: produced_per_partition[p] for p in range(PARTITIONS)
        }
        assert sum(end.values()) == len(RECORDS)

        # Nothing committed yet; then commit the end offsets and read them back two ways.
        assert consumer.committed(tps[0]) is None
        consumer.commit({tp: OffsetAndMetadata(end[tp], "", -1) for tp in tps})
        assert {tp: consumer.committed(tp) for tp in tps} == end
    finally:
        consumer.close()

    assert _group_offsets(kafka_admin, kafka_group_id) == end


def test_topics_are_not_auto_created(kafka_bootstrap: str, kafka_topic_name: str, kafka_admin: Any) -> None:
    """The harness broker runs with auto.create.topics.enable=false: tests create what they use."""
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, request_timeout_ms=15000)
    try:
        # A metadata request for an unknown topic must not create it.
        assert not consumer.partitions_for_topic(kafka_topic_name)  # None (2.x) or set() (3.x)
    finally:
        consumer.close()
    assert kafka_topic_name not in kafka_admin.list_topics()


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0, retries=5)
    try:
        for value in values:
            producer.send(topic, value=value).get(timeout=TIMEOUT_S)
    finally:
        producer.close(timeout=10)


def _read_all(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        for _ in range(1000):
            if len(values) >= expected or time.monotonic() > deadline:
                break
            for batch in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in batch)
        return values
    finally:
        consumer.close()


def test_private_broker_survives_restart_and_crash_on_same_data(kafka_broker_factory: Any) -> None:
    """The harness can stop/kill a broker and bring it back on the same data dir and address."""
    broker = kafka_broker_factory()
    assert broker.supports_restart
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, "restart-me", partitions=1)
    _produce(bootstrap, "restart-me", [b"before-restart"])

    broker.restart()  # graceful: SIGTERM, same data dir and ports
    assert broker.bootstrap_servers == bootstrap
    _produce(bootstrap, "restart-me", [b"after-restart"])

    broker.kill()  # SIGKILL: a crash, data kept
    broker.start()
    assert broker.bootstrap_servers == bootstrap
    assert _read_all(bootstrap, "restart-me", 2) == [b"before-restart", b"after-restart"]


def test_docker_provider_environment_is_a_consistent_single_node() -> None:
    """The container's settings on a bridge network (the docker tier runs the host network for real)."""
    env = DockerKafka(host_port=19999, network="bridge").environment()
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert advertised["PLAINTEXT_HOST"] == "127.0.0.1:19999"
    assert listeners["PLAINTEXT_HOST"].endswith(f":{DockerKafka.CONTAINER_PORT}")
    voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voter.startswith(env["KAFKA_NODE_ID"] + "@")
    assert voter.rsplit(":", 1)[1] == listeners[env["KAFKA_CONTROLLER_LISTENER_NAMES"]].rsplit(":", 1)[1]
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners
    for key in ("OFFSETS_TOPIC", "TRANSACTION_STATE_LOG"):
        assert env[f"KAFKA_{key}_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_docker_provider_on_the_host_network_binds_loopback_only() -> None:
    """On the host network every listener of the container binds 127.0.0.1, each on a port of its own."""
    env = DockerKafka(host_port=19998, network="host").environment()
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert all(address.startswith("127.0.0.1:") for address in listeners.values()), listeners
    assert len({address for address in listeners.values()}) == len(listeners)
    assert advertised["PLAINTEXT_HOST"] == listeners["PLAINTEXT_HOST"] == "127.0.0.1:19998"
    controller = listeners[env["KAFKA_CONTROLLER_LISTENER_NAMES"]]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"1@{controller}"
