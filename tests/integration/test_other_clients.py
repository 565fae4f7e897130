"""Turns written by other Kafka clients, compressed with every codec, read by every throughline reader.

Two producers that are not kafka-python write to one topic of the session's broker: librdkafka
(confluent-kafka 2.12.2 in the pinned environment the benchmark builds for its peers, bench/peers.py,
cached in ~/.cache/throughline/bench-peers) running docs/examples/librdkafka_turn_producer.py, and the
Java client from the broker's own jars running docs/examples/JavaTurnProducer.java (single-file source
launch). Each writes turns encoded here with ``encode_turn`` and keyed by the project hash, without
naming a partition (its own partitioner picks it), once with each codec, then through a transactional
producer that commits and aborts (its last transaction aborted: the log ends on an abort marker).
``TurnProducer`` adds turns with its default codec.

Then: each client put every turn on throughline's partition; every batch carries the codec its producer
was given (read off the log by the record reader itself); and ``project --until-caught-up`` (the fetch
worker), a replay in this process without the worker (``serve``'s staged path), kafka-python's own
parser, the reader and a group member all hold exactly the committed turns, in the order written, with
the applied offsets at the log's end (past every marker).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from projector_env import assert_projection_equals_log, cli_process, connection, fold_topic, table_columns
from support.world import make_turn

from throughline.core.partitioning import partition_for
from throughline.core.turn import TurnRecord
from throughline.log import KafkaLog, ensure_topic
from throughline.log import fetch as record_fetch
from throughline.log.group import GroupConsumer
from throughline.log.record_batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    BatchHeader,
    control_type,
    split_batches,
)
from throughline.producers.producer import COMPRESSION, TurnProducer
from throughline.projector.feed import ProjectorOptions
from throughline.projector.replay import replay
from throughline.projector.store import DuckProjection
from throughline.reader import read_observer_turn_page
from throughline.schemas.codec import decode_turn, encode_turn
from throughline.testing.kafka import fetch_kafka_jars
from throughline.testing.kafka.jvm import find_java

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the bench package lives beside the tests, not in the installed package
    sys.path.insert(0, str(REPO))
from bench.peers import LOADGEN  # noqa: E402  (confluent-kafka 2.12.2, built once, cached)

EXAMPLES = REPO / "docs" / "examples"
JAVA_EXAMPLE = EXAMPLES / "JavaTurnProducer.java"
LIBRDKAFKA_EXAMPLE = EXAMPLES / "librdkafka_turn_producer.py"
#: What the Java example needs of the broker's jars: the client and its codecs' libraries.
CLIENT_JARS = ("kafka-clients", "lz4-java", "snappy-java", "zstd-jni", "slf4j-api")
PARTITIONS = 3
CODECS = ("gzip", "snappy", "lz4", "zstd")
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
TXN_CODEC = {"librdkafka": "lz4", "java": "snappy"}
CLIENT_TIMEOUT = 240.0
KEY = bytes(range(32))

# Prose, code and tool lines, repeated: what a transcript's body holds, and compressible as one is.
BODY = (
    "The tests pass now. I changed `read_records` so that a batch's records are read once:\n"
    "```python\nfor batch in split_batches(data):\n    read_records(data, batch.records_start, batch.end)\n```\n"
    "$ pytest -q tests/unit/test_record_batch.py\n....................  [100%]\n20 passed in 0.41s\n"
)


@dataclass(frozen=True)
class Sent:
    """One turn handed to a client: which, with what codec, whether its transaction committed, and
    where the client says it landed."""

    client: str
    codec: str
    turn: TurnRecord
    transactional: bool
    committed: bool
    partition: int
    offset: int


def _script(client: str, topic: str) -> tuple[list[str], list[tuple[str, TurnRecord, bool, bool]]]:
    """A client's input lines (docs/examples' protocol) and the turns in them, in order."""
    projects = [f"/srv/{client}/project-{k}" for k in range(4)]
    lines: list[str] = []
    turns: list[tuple[str, TurnRecord, bool, bool]] = []
    n = 0

    def add(codec: str, project: str, committed: bool, transactional: bool = False) -> None:
        nonlocal n
        n += 1
        t = make_turn(
            project,
            "host-a",
            "main",
            f"{client}-{n:03d}",
            at=1_767_225_600_000_000 + n,
            body=f"turn {n} of {client}, {codec}\n" + BODY * 4,
        )
        lines.append(f"{t.project_sha256.hex()} {encode_turn(t).hex()}")
        turns.append((codec, t, transactional, committed))

    for codec in CODECS:
        lines.append(f"producer {codec}")
        for project in projects:
            for _ in range(2):
                add(codec, project, True)
    codec = TXN_CODEC[client]
    lines.append(f"producer {codec} {client}-{topic}")
    for committed, chosen in (
        (True, projects[:2]),
        (False, projects[1:3]),
        (True, projects[2:]),
        (False, projects[:1]),
    ):
        lines.append("begin")
        for project in chosen:
            add(codec, project, committed, transactional=True)
        lines.append("commit" if committed else "abort")
    return lines, turns


def _run(cmd: list[str], lines: list[str]) -> list[tuple[int, int]]:
    """Run a client with ``lines`` on its stdin; the (partition, offset) it reports for each record."""
    proc = subprocess.run(
        cmd,
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, f"{cmd[:2]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return [(int(a), int(b)) for a, b in (line.split() for line in proc.stdout.splitlines() if line.strip())]


def _java_command(bootstrap: str, topic: str) -> list[str]:
    libs = fetch_kafka_jars().libs_dir
    jars = []
    for artifact in CLIENT_JARS:
        found = sorted(libs.glob(f"{artifact}-[0-9]*.jar"))
        assert found, f"{artifact} is not among the broker's jars in {libs}"
        jars.append(str(found[-1]))
    # The C1 compiler only and the serial collector: a short-lived client starts faster on two cores.
    return [
        find_java(),
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-cp",
        ":".join(jars),
        str(JAVA_EXAMPLE),
        bootstrap,
        topic,
    ]


@dataclass(frozen=True)
class Written:
    """The shared topic and everything written to it."""

    bootstrap: str
    topic: str
    sent: list[Sent]
    ours: list[tuple[TurnRecord, int, int]]  # TurnProducer's turns: (turn, partition, offset)

    @property
    def committed(self) -> list[TurnRecord]:
        return [s.turn for s in self.sent if s.committed] + [t for t, _, _ in self.ours]


@pytest.fixture(scope="module")
def written(kafka_bootstrap: str) -> Written:
    """One topic written by librdkafka, the Java client and ``TurnProducer`` (the clients run at once)."""
    topic = f"other-clients-{os.getpid()}-{random.randrange(1 << 30)}"
    ensure_topic(kafka_bootstrap, topic, partitions=PARTITIONS, timeout=30.0)
    LOADGEN.ensure()  # built once per machine (pip, ~15 s), then reused
    scripts = {client: _script(client, topic) for client in ("librdkafka", "java")}
    commands = {
        "librdkafka": [str(LOADGEN.python), str(LIBRDKAFKA_EXAMPLE), kafka_bootstrap, topic],
        "java": _java_command(kafka_bootstrap, topic),
    }
    with ThreadPoolExecutor(2) as pool:
        futures = {c: pool.submit(_run, commands[c], scripts[c][0]) for c in scripts}
        landed = {c: f.result() for c, f in futures.items()}
    sent: list[Sent] = []
    for client, (_, turns) in scripts.items():
        assert len(landed[client]) == len(turns), f"{client} reported {len(landed[client])} of {len(turns)} records"
        for (codec, t, txn, committed), (partition, offset) in zip(turns, landed[client], strict=True):
            sent.append(Sent(client, codec, t, txn, committed, partition, offset))
    ours = [
        make_turn(
            "/srv/turn-producer/p",
            "host-a",
            "main",
            f"ours-{i}",
            at=1_767_225_700_000_000 + i,
            body=f"ours {i}\n" + BODY * 4,
        )
        for i in range(6)
    ]
    with TurnProducer(kafka_bootstrap, topic, partitions=PARTITIONS) as producer:
        positions = producer.send_many(ours)
    return Written(
        kafka_bootstrap,
        topic,
        sent,
        [(t, p.partition, p.offset) for t, p in zip(ours, positions, strict=True)],
    )


def test_each_client_puts_a_turn_on_throughlines_partition(written: Written) -> None:
    for s in written.sent:
        assert s.partition == partition_for(s.turn.project_sha256, PARTITIONS), (s.client, s.turn.project)
    for client in ("librdkafka", "java"):  # the projects spread, so a wrong partitioner would show
        assert len({s.partition for s in written.sent if s.client == client}) >= 2


@dataclass(frozen=True)
class Batch:
    """A batch of the log as the record reader split it."""

    partition: int
    header: BatchHeader
    control: int | None  # the control record's type, for a transaction marker

    def holds(self, partition: int, offset: int) -> bool:
        return self.partition == partition and self.header.base_offset <= offset < self.header.next_offset


def _census(bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Batch], list[Any]]:
    """Every batch of the topic as the record reader splits it (data and markers, aborted ones too), and
    the records a ``read_committed`` consumer with the record reader returns."""
    seen: list[Batch] = []
    unpack = record_fetch.RecordReader._unpack_records

    def spy(self: Any, tp: Any, records: Any, *deserializers: Any) -> Iterator[Any]:
        data = bytes(records._buffer)
        for b in split_batches(data):
            seen.append(Batch(tp.partition, b, control_type(data, b.records_start) if b.is_control else None))
        yield from unpack(self, tp, records, *deserializers)

    monkeypatch.setattr(record_fetch.RecordReader, "_unpack_records", spy)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level="read_committed"
    )
    try:
        assert record_fetch.use_record_reader(consumer)
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        records: list[Any] = []
        for _ in range(200):
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        assert all(consumer.position(tp) >= ends[tp] for tp in tps), "the reader never reached the log's end"
    finally:
        consumer.close()
    return seen, records


def test_every_batch_carries_its_producers_codec(written: Written, monkeypatch: pytest.MonkeyPatch) -> None:
    batches, records = _census(written.bootstrap, written.topic, monkeypatch)

    def codecs(partition: int, offset: int) -> set[int]:
        # A batch fetched twice (a poll that stopped inside it) is in the census twice, the same both times.
        return {b.header.compression for b in batches if b.holds(partition, offset)}

    for s in written.sent:
        assert codecs(s.partition, s.offset) == {CODEC_IDS[s.codec]}, (
            s.client,
            s.codec,
            s.partition,
            s.offset,
        )
    for _, partition, offset in written.ours:
        assert codecs(partition, offset) == {CODEC_IDS[COMPRESSION]}
        flags = {b.header.is_transactional for b in batches if b.holds(s.partition, s.offset)}
        assert flags == {s.transactional}, (s.client, s.codec, s.partition, s.offset)
    assert {CONTROL_COMMIT, CONTROL_ABORT} <= {b.control for b in batches}
    # The record reader itself returned exactly the committed turns (the aborted ones skipped).
    read = sorted((t.turn_id, t.content_digest) for t in (decode_turn(r.value) for r in records))
    assert read == sorted((t.turn_id, t.content_digest) for t in written.committed)


def _projected(db: Path) -> list[tuple[str, bytes]]:
    with DuckProjection.open(db, read_only=True) as projection:
        return sorted(table_columns(projection, "turns", "turn_id", "content_digest"))


def test_the_projector_replay_and_reader_hold_exactly_the_committed_turns(written: Written, tmp_path: Path) -> None:
    committed = written.committed
    expected = sorted((t.turn_id, t.content_digest) for t in committed)
    assert len(expected) < len(written.sent) + len(written.ours)  # some turns were aborted
    db = tmp_path / "projected.duckdb"
    done = cli_process("project", "--until-caught-up", *connection(written.bootstrap, written.topic, db), timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    assert _projected(db) == expected
    # kafka-python's own parser reads the same log; the projection equals its fold (applied offsets at
    # the end offsets, past every marker; every digest).
    assert_projection_equals_log(db, fold_topic(written.bootstrap, written.topic))
    replayed = tmp_path / "replayed.duckdb"
    replay(
        [written.bootstrap],
        written.topic,
        replayed,
        options=ProjectorOptions(fetch_worker=False, stage_reads=True),
    )
    assert _projected(replayed) == expected
    by_project: dict[str, list[TurnRecord]] = {}
    for t in committed:
        by_project.setdefault(t.project, []).append(t)
    with (
        KafkaLog([written.bootstrap], written.topic) as log,
        DuckProjection.open(db, read_only=True) as projection,
    ):
        for project, turns in by_project.items():
            page = read_observer_turn_page(
                project=project, projection=projection, log=log, token_key=KEY, wait_timeout=0.0, limit=100
            )
            assert page.status == "ok", (project, page.reason)  # no wait: the markers are applied too
            assert [t.contentDigest for t in page.turns] == [t.content_digest.hex() for t in turns]


def test_a_group_member_reads_exactly_the_committed_turns(written: Written, kafka_group_id: str) -> None:
    # A member of a projector group (``serve --group``) fetches through the same record reader, its
    # partitions assigned by the group: it too skips the aborted turns and the markers.
    member = GroupConsumer(
        [written.bootstrap],
        written.topic,
        group=kafka_group_id,
        url="http://127.0.0.1:8080",
        client_id="other-clients-member",
        timeout=30.0,
    )
    got: dict[tuple[int, int], TurnRecord] = {}
    try:
        deadline = time.monotonic() + 90.0
        while len(got) < len(written.committed):
            assert time.monotonic() < deadline, f"the member read {len(got)} of {len(written.committed)} turns"
            for records in member.poll(0.5, 1000).values():
                got.update(((r.partition, r.offset), decode_turn(r.value)) for r in records)
    finally:
        member.close()
    read = sorted((t.turn_id, t.content_digest) for t in got.values())
    assert read == sorted((t.turn_id, t.content_digest) for t in written.committed)
