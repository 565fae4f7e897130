"""Log backups through the real broker (docs/operations.md, "Backup and restore"): ``throughline export``
writes a topic's records into Avro files, ``throughline import`` writes them into a new topic, and a
replay of each topic gives the same projection (the projector's table digests). Also: an export
resumes where the backup ends, a damaged backup writes nothing, an existing topic is refused, and a
transactional topic's aborted records and markers stay out of the backup while the offsets keep their
gaps."""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from projector_env import Producer, cli, connection, history, produce_all

from throughline.backup import import_backup, load_manifest
from throughline.backup.files import read_file
from throughline.core.repair import build_repair
from throughline.producers.producer import TurnProducer
from throughline.projector.store import DuckProjection
from throughline.testing import create_topic

LOSSLESS = {"retention.ms": "-1", "retention.bytes": "-1"}
PARTITIONS = 3
READ_TIMEOUT = 60.0


def _raw_records(bootstrap: str, topic: str) -> dict[int, list[tuple[Any, ...]]]:
    """Every committed record of ``topic`` with all it carries, by partition (a plain kafka-python consumer,
    not throughline's)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[tuple[Any, ...]]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + READ_TIMEOUT
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read the topic to its end in time"
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition].extend(
                    (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, tuple(r.headers or ()))
                    for r in records
                    if r.offset < ends[tp]
                )
        return out
    finally:
        consumer.close()


def _without_offsets(records: dict[int, list[tuple[Any, ...]]]) -> dict[int, list[tuple[Any, ...]]]:
    return {p: [r[1:] for r in rs] for p, rs in records.items()}


def _ok(result: tuple[int, str, str]) -> tuple[dict[str, Any], str]:
    code, out, err = result
    assert code == 0, err
    return json.loads(out), err


def _error(result: tuple[int, str, str]) -> tuple[int, str]:
    code, _, err = result
    return code, json.loads(err.strip().splitlines()[-1])["error"]["code"]


def _same_projection(a: Path, b: Path, topic_a: str, topic_b: str) -> None:
    """Every table digest equal, but for the two tables that name the topic (compared without it)."""
    with DuckProjection.open(a, read_only=True) as pa, DuckProjection.open(b, read_only=True) as pb:
        da, db = pa.table_digests(), pb.table_digests()
        named = {"meta", "applied_offsets"}
        assert {t: d for t, d in da.items() if t not in named} == {t: d for t, d in db.items() if t not in named}
        assert len(da) > len(named)
        for table in named:
            rows_a = [{k: v for k, v in r.items() if k not in ("topic",)} for r in pa.table_rows(table)]
            rows_b = [{k: v for k, v in r.items() if k not in ("topic",)} for r in pb.table_rows(table)]
            if table == "meta":  # the topic's name and id are the two rows that differ
                assert {r["key"]: r["value"] for r in rows_a}.get("topic_id") != {
                    r["key"]: r["value"] for r in rows_b
                }.get("topic_id")
                rows_a = [r for r in rows_a if r["key"] not in ("topic", "topic_id")]
                rows_b = [r for r in rows_b if r["key"] not in ("topic", "topic_id")]
            assert rows_a == rows_b, table
        assert pa.table_rows("turns") and pa.table_rows("quarantine") and pa.table_rows("repairs")


def _log(bootstrap: str, topic: str) -> list[str]:
    return ["--bootstrap-servers", bootstrap, "--topic", topic]


def test_export_import_and_replay_give_the_same_projection(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic, copy = kafka_topic_name, f"{kafka_topic_name}-restored"
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS, configs=LOSSLESS)
    turns = history(random.Random(45), 900, projects=7)
    produce_all(kafka_bootstrap, topic, PARTITIONS, turns[:600])
    poison = Producer(kafka_bootstrap, topic, PARTITIONS)
    poison.send_raw(1, turns[0].project_sha256, b"\x00not a turn" * 9)  # quarantined by the projector
    poison.close()
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    # A record with headers and an old CreateTime: both must come back as they were.
    raw.send(topic, key=b"k", value=b"v", headers=[("h", b"\x01"), ("e", b"")], partition=2, timestamp_ms=12345)
    raw.flush(timeout=30)
    raw.close()
    with TurnProducer(kafka_bootstrap, topic, ensure=False, allow_lossy=True) as producer:
        repair = build_repair(project=turns[1].project, source=turns[1].source_sha256, reason="accepted as it is")
        producer.send_repair(repair)

    backup = tmp_path / "backup"
    first, err = _ok(cli("export", "--out", str(backup), *_log(kafka_bootstrap, topic)))
    assert "stopped at the end offsets taken at its start" in err
    assert first["complete"] and first["records"] == 603 and first["filesWritten"] == PARTITIONS
    assert "100.0%" in err and "/s)" in err  # the progress lines: each partition with its records/s

    # A second run resumes: only what was appended since, nothing twice.
    produce_all(kafka_bootstrap, topic, PARTITIONS, turns[600:])
    second, _ = _ok(cli("export", "--out", str(backup), "--no-progress", *_log(kafka_bootstrap, topic)))
    assert second["complete"] and second["records"] == 300
    manifest = load_manifest(backup)
    assert manifest is not None and manifest.topic == topic and manifest.partition_count == PARTITIONS
    source = _raw_records(kafka_bootstrap, topic)
    for p, entry in manifest.partitions.items():
        in_files = [r for f in entry.files for r in read_file(backup / f.name)]
        assert [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers) for r in in_files] == source[p]
        assert entry.next_offset == entry.end_offset == len(source[p])

    # A damaged copy of the backup is refused whole: exit 2, no topic created.
    damaged = tmp_path / "damaged"
    shutil.copytree(backup, damaged)
    victim = damaged / manifest.partitions[2].files[0].name
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    assert _error(cli("import", str(damaged), *_log(kafka_bootstrap, f"{copy}-never"))) == (2, "backup_damaged")
    admin = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    assert f"{copy}-never" not in admin.topics()
    admin.close()

    restored, _ = _ok(cli("import", str(backup), *_log(kafka_bootstrap, copy)))
    assert restored["created"] and restored["complete"] and restored["records"] == 903
    assert _without_offsets(_raw_records(kafka_bootstrap, copy)) == _without_offsets(source)
    assert _error(cli("import", str(backup), *_log(kafka_bootstrap, copy))) == (2, "import_target_not_empty")
    # --resume on a whole copy writes nothing more.
    resumed, _ = _ok(cli("import", str(backup), "--resume", "--no-progress", *_log(kafka_bootstrap, copy)))
    assert resumed["records"] == 0 and resumed["complete"]

    db_a, db_b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _ok(cli("replay", "--no-progress", *connection(kafka_bootstrap, topic, db_a)))
    _ok(cli("replay", "--no-progress", *connection(kafka_bootstrap, copy, db_b)))
    _same_projection(db_a, db_b, topic, copy)


def test_a_stopped_import_resumes_and_a_foreign_topic_is_refused(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic, copy = kafka_topic_name, f"{kafka_topic_name}-restored"
    create_topic(kafka_bootstrap, topic, partitions=2, configs=LOSSLESS)
    produce_all(kafka_bootstrap, topic, 2, history(random.Random(3), 300, projects=4))
    backup = tmp_path / "backup"
    _ok(cli("export", "--out", str(backup), "--no-progress", *_log(kafka_bootstrap, topic)))

    stop = threading.Event()
    seen: list[Any] = []

    def stop_early(update: Any) -> None:
        seen.append(update)
        stop.set()

    first = import_backup(kafka_bootstrap, backup, copy, partitions=[0], progress=stop_early, stop=stop)
    assert not first.complete and seen
    resumed, _ = _ok(cli("import", str(backup), "--resume", "--no-progress", *_log(kafka_bootstrap, copy)))
    assert resumed["complete"]
    assert _without_offsets(_raw_records(kafka_bootstrap, copy)) == _without_offsets(
        _raw_records(kafka_bootstrap, topic)
    )

    # A topic that is not this backup's copy: another record where the resume would continue.
    other = f"{kafka_topic_name}-other"
    create_topic(kafka_bootstrap, other, partitions=2, configs=LOSSLESS)
    stranger = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    stranger.send(other, key=b"x", value=b"y", partition=0).get(timeout=30)
    stranger.close()
    assert _error(cli("import", str(backup), "--resume", *_log(kafka_bootstrap, other))) == (
        2,
        "import_target_mismatch",
    )
    # Exporting another topic into the same folder is refused.
    assert _error(cli("export", "--out", str(backup), *_log(kafka_bootstrap, other))) == (2, "backup_topic_mismatch")


def test_aborted_transactions_stay_out_and_offsets_keep_their_gaps(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=1, configs=LOSSLESS)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tl-{topic}", acks="all")
    producer.init_transactions()
    for n, commit in enumerate((True, False, True, False)):
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, key=b"k", value=f"{n}-{i}".encode(), partition=0)
        producer.flush()  # on the log before the abort (else an abort drops them in the client)
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()
    # The markers are written after the transaction's end returns: wait until the last stable offset
    # (read_committed's end) is the high watermark, i.e. no transaction is open any more.
    tp = TopicPartition(topic, 0)
    committed = KafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level="read_committed")
    uncommitted = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    deadline = time.monotonic() + READ_TIMEOUT
    while committed.end_offsets([tp])[tp] != uncommitted.end_offsets([tp])[tp]:
        assert time.monotonic() < deadline, "the transactions' markers never came"
        time.sleep(0.1)
    end = committed.end_offsets([tp])[tp]
    committed.close()
    uncommitted.close()
    backup = tmp_path / "backup"
    summary, err = _ok(cli("export", "--out", str(backup), "--partitions", "0", *_log(kafka_bootstrap, topic)))
    assert summary["complete"] and summary["records"] == 6
    assert summary["endOffsets"] == {"0": end} and end == 16  # 12 records and 4 markers
    manifest = load_manifest(backup)
    assert manifest is not None
    entry = manifest.partitions[0]
    records = [r for f in entry.files for r in read_file(backup / f.name)]
    assert [r.value for r in records] == [b"0-0", b"0-1", b"0-2", b"2-0", b"2-1", b"2-2"]
    assert [r.offset for r in records] == [0, 1, 2, 8, 9, 10]  # the original offsets, with their gaps
    assert entry.next_offset == entry.end_offset == 16
    # A second run finds nothing new and writes nothing.
    again, _ = _ok(cli("export", "--out", str(backup), "--no-progress", *_log(kafka_bootstrap, topic)))
    assert again["records"] == 0 and again["filesWritten"] == 0 and again["complete"]
    restored, _ = _ok(cli("import", str(backup), "--no-progress", *_log(kafka_bootstrap, f"{topic}-copy")))
    assert restored["records"] == 6
    copied = _raw_records(kafka_bootstrap, f"{topic}-copy")[0]
    assert [r[0] for r in copied] == list(range(6)) and [r[4] for r in copied] == [r.value for r in records]


def test_an_export_stops_at_the_end_offsets_taken_at_its_start(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=2, configs=LOSSLESS)
    produce_all(kafka_bootstrap, topic, 2, history(random.Random(8), 200, projects=3))
    before = _raw_records(kafka_bootstrap, topic)
    later = Producer(kafka_bootstrap, topic, 2)

    def append_meanwhile(update: Any) -> None:
        if not getattr(append_meanwhile, "done", False):
            append_meanwhile.done = True  # type: ignore[attr-defined]
            for p in range(2):
                for i in range(50):
                    later.send_raw(p, b"late", b"appended after the export took its end offsets %d" % i)

    from throughline.backup import export_log

    backup = tmp_path / "backup"
    first = export_log(kafka_bootstrap, topic, backup, progress=append_meanwhile)
    later.close()
    assert first.complete and first.end_offsets == {p: len(before[p]) for p in range(2)}
    manifest = load_manifest(backup)
    assert manifest is not None
    for p in range(2):
        values = [r.value for f in manifest.partitions[p].files for r in read_file(backup / f.name)]
        assert values == [r[4] for r in before[p]]  # none of the late records
    second = export_log(kafka_bootstrap, topic, backup)
    assert second.records == {0: 50, 1: 50}
