"""A topic readable by the Kafka ecosystem: producers with a schema registry write the Confluent wire
format, every reader reads both framings, a mixed topic projects exactly, schemas evolve through the
registry's compatibility check, and a reader that is not throughline (confluent-kafka's
``AvroDeserializer`` with its ``SchemaRegistryClient``, in a pinned environment) decodes every turn.

The broker is the session's real one, and so is the registry: the pytest plugin's ``schema_registry_url``
(Apicurio Registry's server from Maven Central on loopback, or ``THROUGHLINE_TEST_SCHEMA_REGISTRY``).
The outage test runs a second Apicurio Registry of its own, kept on disk, which it stops and starts.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from projector_env import assert_projection_equals_log, cli_process, connection, fold_topic, start_projector
from support.topic import read_topic
from support.world import make_turn

from throughline.core.repair import build_repair
from throughline.core.turn import TurnRecord
from throughline.log.config import KafkaClientConfig
from throughline.producers.producer import TurnProducer
from throughline.projector.store import DuckProjection
from throughline.schemas import codec, registry
from throughline.schemas.codec import SCHEMAS
from throughline.schemas.exceptions import SchemaIncompatibleError
from throughline.testing.kafka.apicurio import ApicurioRegistry

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the bench package lives beside the tests, not in the installed package
    sys.path.insert(0, str(REPO))

from bench.peers import PeerEnv  # noqa: E402

#: confluent-kafka's schema registry client and Avro deserializer, and what they import, pinned (the
#: versions the benchmark's Quix Streams environment resolved here); fastavro is throughline's own.
READER_PINS = (
    "confluent-kafka==2.12.2",
    "fastavro==1.13.1",
    "httpx==0.29.0",
    "attrs==26.1.0",
    "cachetools==8.0.2",
    "authlib==1.9.10",
    "requests==2.34.2",
)
READER_ENV = PeerEnv("registry-reader", READER_PINS)


@pytest.fixture
def registry_url(schema_registry_url: str) -> Iterator[str]:
    before = codec.schema_ids()
    yield schema_registry_url
    codec.set_schema_ids(before)


def _config(url: str) -> KafkaClientConfig:
    return KafkaClientConfig(schema_registry=registry.RegistrySettings(url))


def _turns(prefix: str, n: int, start: int = 0) -> list[TurnRecord]:
    return [
        make_turn(
            f"/work/{prefix}-{i % 3}",
            "host",
            f"thread-{i % 2}",
            f"{prefix}-{i}",
            at=1_700_000_000_000_000 + i,
            body=f"body {i} ✓",
        )
        for i in range(start, start + n)
    ]


def test_a_mixed_topic_projects_exactly(
    kafka_bootstrap: str, kafka_topic_name: str, registry_url: str, tmp_path: Path
) -> None:
    # Single-object records first (today's framing), then registry-framed ones on the same sources.
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=3) as producer:
        producer.send_many(_turns("p", 12))
    with TurnProducer(kafka_bootstrap, kafka_topic_name, kafka_config=_config(registry_url)) as producer:
        producer.send_many(_turns("p", 12, start=12))
        producer.send_repair(build_repair(project="/work/p-0", host="host", thread="thread-0", reason="checked"))
    stored = read_topic(kafka_bootstrap, kafka_topic_name)
    firsts = [r.value[0] for r in sorted(stored, key=lambda r: r.value[0] != 0xC3)]
    assert firsts.count(0xC3) == 12 and firsts.count(0x00) == 13
    client = registry.RegistryClient(registry.RegistrySettings(registry_url))
    for subject in (registry.value_subject(kafka_topic_name), registry.repair_subject(kafka_topic_name)):
        assert client.compatibility(subject) == "BACKWARD", subject  # new subjects are given BACKWARD

    db = tmp_path / "p.duckdb"
    done = cli_process(
        "project",
        "--until-caught-up",
        "--schema-registry",
        registry_url,
        *connection(kafka_bootstrap, kafka_topic_name, db),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    registry.install(registry.RegistrySettings(registry_url))  # the reference fold reads both framings too
    content = fold_topic(kafka_bootstrap, kafka_topic_name)
    assert content.undecodable == []
    assert_projection_equals_log(db, content)
    with DuckProjection.open(db, read_only=True) as projection:
        assert len(projection.table_rows("turns")) == 24
        assert projection.table_rows("quarantine") == []


def test_without_the_registry_framed_records_are_quarantined_not_lost(
    kafka_bootstrap: str, kafka_topic_name: str, registry_url: str, tmp_path: Path
) -> None:
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=1, kafka_config=_config(registry_url)) as producer:
        producer.send_many(_turns("q", 3))
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=1) as producer:
        producer.send_many(_turns("r", 2))
    db = tmp_path / "q.duckdb"
    done = cli_process("project", "--until-caught-up", *connection(kafka_bootstrap, kafka_topic_name, db), timeout=180)
    assert done.returncode == 0, done.stderr
    with DuckProjection.open(db, read_only=True) as projection:
        quarantined = projection.table_rows("quarantine")
        assert [r["code"] for r in quarantined] == ["unknown_schema"] * 3
        assert "no schema registry is configured" in quarantined[0]["reason"]
        assert len(projection.table_rows("turns")) == 2  # other projects are not blocked


def test_a_registry_that_is_away_is_ridden_out_not_quarantined(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    # A registry of this test's own, kept on disk: the producer registers with it, then it stops. The
    # projector is pointed at its port while nothing listens; it comes back (same data, same ids) only
    # after the projector has tried.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ApicurioRegistry(port=port, on_disk=True)
    turns = _turns("a", 4)
    db = tmp_path / "a.duckdb"
    log = tmp_path / "project.log"
    with contextlib.closing(server):
        server.start()
        with TurnProducer(
            kafka_bootstrap, kafka_topic_name, partitions=1, kafka_config=_config(server.url)
        ) as producer:
            producer.send_many(turns)
        server.stop()
        projector = start_projector(
            "--until-caught-up",
            "--schema-registry",
            server.url,
            *connection(kafka_bootstrap, kafka_topic_name, db),
            log=log,
        )
        try:
            deadline = time.monotonic() + 60
            while "registry_unavailable" not in log.read_text("utf-8") and time.monotonic() < deadline:
                assert projector.poll() is None, log.read_text("utf-8")
                time.sleep(0.2)
            assert "registry_unavailable" in log.read_text("utf-8")
            server.start()
            assert projector.wait(timeout=120) == 0, log.read_text("utf-8")
        finally:
            if projector.poll() is None:
                projector.kill()
                projector.wait(timeout=10)
    with DuckProjection.open(db, read_only=True) as projection:
        assert projection.table_rows("quarantine") == []
        assert sorted(r["turn_id"] for r in projection.table_rows("turns")) == sorted(t.turn_id for t in turns)


def test_v1_to_v2_passes_and_an_incompatible_schema_is_refused_before_any_turn(
    kafka_bootstrap: str, kafka_topic_name: str, registry_url: str
) -> None:
    client = registry.RegistryClient(registry.RegistrySettings(registry_url))
    subject = registry.value_subject(kafka_topic_name)
    client.set_compatibility(subject)
    v1 = client.register(subject, registry.schema_text(SCHEMAS[1]))
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=1, kafka_config=_config(registry_url)) as producer:
        producer.send(_turns("e", 1)[0])
    stored = read_topic(kafka_bootstrap, kafka_topic_name)
    v2 = int.from_bytes(stored[0].value[1:5], "big")
    assert v2 != v1 and registry.known_schema(client.schema_text(v2) or "") is SCHEMAS[2]

    other = f"{kafka_topic_name}-other"
    foreign = {
        "type": "record",
        "name": "CompletedTurn",
        "namespace": "throughline.log",
        "fields": [{"name": "project", "type": "string"}],
    }
    other_subject = registry.value_subject(other)
    client.register(other_subject, json.dumps(foreign))  # by another tool, with no level of the subject's own
    with pytest.raises(SchemaIncompatibleError, match="not compatible") as info:
        TurnProducer(kafka_bootstrap, other, partitions=1, kafka_config=_config(registry_url))
    assert "nothing was sent" in info.value.message
    assert read_topic(kafka_bootstrap, other) == []


_READER = r"""
import json, sys
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

bootstrap, topic, url, partitions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
deserialize = AvroDeserializer(SchemaRegistryClient({"url": url}))
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "registry-reader", "enable.auto.commit": False})
ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
out, seen = [], {p: 0 for p in range(partitions)}
for _ in range(600):
    if all(seen[p] >= ends[p] for p in ends):
        break
    msg = consumer.poll(0.5)
    if msg is None or msg.error():
        continue
    seen[msg.partition()] = msg.offset() + 1
    datum = deserialize(msg.value(), SerializationContext(topic, MessageField.VALUE))
    out.append({k: (v.hex() if isinstance(v, bytes) else v) for k, v in datum.items() if k != "producer"}
               | {"producer": datum["producer"]["name"]})
consumer.close()
print(json.dumps(out, default=str))
"""


def test_confluent_kafkas_avro_deserializer_reads_every_turn(
    kafka_bootstrap: str, kafka_topic_name: str, registry_url: str, tmp_path: Path
) -> None:
    python = READER_ENV.ensure() / "bin" / "python"
    turns = _turns("c", 9)
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=3, kafka_config=_config(registry_url)) as producer:
        producer.send_many(turns)
        partitions = producer.partitions
    script = tmp_path / "reader.py"
    script.write_text(_READER, "utf-8")
    done = subprocess.run(
        [str(python), str(script), kafka_bootstrap, kafka_topic_name, registry_url, str(partitions)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout)
    got = sorted((d["turnId"], d["body"], d["project"], d["projectSha256"], d["contentDigest"]) for d in read)
    want = sorted((t.turn_id, t.body, t.project, t.project_sha256.hex(), t.content_digest.hex()) for t in turns)
    assert got == want
    assert {d["producer"] for d in read} == {turns[0].producer.name}
