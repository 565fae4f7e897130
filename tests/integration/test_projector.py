"""The projector against the real broker: poison records, a recreated topic, replay and the CLI."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from projector_env import (
    Producer,
    assert_projection_equals_log,
    cli,
    connection,
    fold_topic,
    history,
    produce_all,
    turn,
)

from throughline.projector.exceptions import LogRewoundError, LogTruncatedError
from throughline.projector.runner import Projector, ProjectorOptions, RunSummary
from throughline.projector.store import DuckProjection, LogRecord
from throughline.schemas.codec import MAGIC, encode_turn
from throughline.testing import create_topic

FAST = ProjectorOptions(poll_timeout=0.2, check_interval=0.5, timeout=10.0)


def test_poison_records_are_quarantined_and_the_projects_behind_them_applied(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=1)
    a1, a2 = turn("/p/a", "main", "a1"), turn("/p/a", "main", "a2")
    c1, c2 = turn("/p/c", "main", "c1"), turn("/p/c", "main", "c2", body="secret body text")
    gap = turn("/p/b", "main", "b-gap", seq=3)
    b1 = turn("/p/b", "main", "b1")
    unknown_schema = MAGIC + bytes.fromhex("0102030405060708") + b"\x02a"
    producer = Producer(kafka_bootstrap, topic, 1)
    try:
        producer.send(a1)
        producer.flush()
        producer.send_raw(0, a1.project_sha256, bytes(random.Random(7).randrange(256) for _ in range(64)))
        producer.send_raw(0, a1.project_sha256, unknown_schema)
        for r in (gap, c1, a2, c2, b1):
            producer.send(r)
        producer.flush()
    finally:
        producer.close()

    db = tmp_path / "p.duckdb"
    with DuckProjection.open(db, topic=topic) as projection:
        summary = Projector(projection, kafka_bootstrap, topic, options=FAST).run(until_caught_up=True)
        assert summary.caught_up
        assert (summary.summary.records, summary.summary.appended, summary.summary.quarantined) == (8, 5, 3)
        with projection.view() as v:
            assert v.applied_offset(0) == 8
            for first, second in ((a1, a2), (c1, c2)):
                assert [t.turn_id for t in v.turns(first.source_sha256, 1, 10)] == [first.turn_id, second.turn_id]
                info = v.source(first.source_sha256)
                assert info is not None and info.broken_reason is None
            broken = v.source(b1.source_sha256)
            assert broken is not None and broken.length == 1 and broken.broken_reason and "gap" in broken.broken_reason
        quarantined = [
            (q["log_offset"], q["code"], q["reason"], q["record_value"] is not None)
            for q in projection.table_rows("quarantine")  # one partition: in offset order
        ]
    assert [(q[0], q[1]) for q in quarantined] == [
        (1, "record_undecodable"),
        (2, "unknown_schema"),
        (3, "chain_rejected"),
    ]
    assert "0102030405060708" in quarantined[1][2]
    assert "gap" in quarantined[2][2]
    assert all(q[3] for q in quarantined)
    assert_projection_equals_log(db, fold_topic(kafka_bootstrap, topic))

    flags = connection(kafka_bootstrap, topic, db)
    code, out, err = cli("status", *flags, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["partitions"] == [
        {
            "partition": 0,
            "applied": 8,
            "end": 8,
            "lag": 0,
            "records": 8,
            "turns": 5,
            "rewinds": 0,
            "duplicates": 0,
            "quarantined": 3,
            # the partition's replication (one broker: its only replica, in sync)
            "leader": 1,
            "replicas": [1],
            "isr": [1],
            "underReplicated": False,
        }
    ]
    assert doc["counts"]["quarantined"] == 3 and doc["counts"]["brokenSources"] == 1 and doc["counts"]["projects"] == 3
    assert [q["code"] for q in doc["quarantine"]] == ["chain_rejected", "unknown_schema", "record_undecodable"]
    code, table, _ = cli("status", *flags)
    assert code == 0 and "chain_rejected" in table and "total lag: 0" in table
    for text in (out, table):
        assert "secret body text" not in text and "/p/c" not in text  # no body, no raw project name


def _delete_and_recreate(bootstrap: str, topic: str, partitions: int, *, recreate: bool = True) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic], timeout_ms=30_000)
        deadline = time.monotonic() + 60
        for _ in range(600):
            if topic not in admin.list_topics():
                break
            assert time.monotonic() < deadline, "the topic was not deleted in time"
            time.sleep(0.1)
    finally:
        admin.close()
    if not recreate:
        return
    deadline = time.monotonic() + 60
    for _ in range(600):
        try:
            create_topic(bootstrap, topic, partitions=partitions)
            return
        except Exception:  # still being deleted on the broker
            assert time.monotonic() < deadline, "the topic could not be recreated in time"
            time.sleep(0.2)


@pytest.mark.parametrize("recreate", [True, False], ids=["recreated", "deleted"])
def test_recreating_the_topic_under_a_running_projector_stops_it(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path, recreate: bool
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=2)
    produce_all(kafka_bootstrap, topic, 2, [turn(f"/p/{i % 4}", "main", f"t{i}") for i in range(40)])
    db = tmp_path / "p.duckdb"
    with DuckProjection.open(db, topic=topic) as projection:
        stop = threading.Event()
        outcome: list[RunSummary | BaseException] = []

        def run() -> None:
            try:
                outcome.append(Projector(projection, kafka_bootstrap, topic, options=FAST).run(stop=stop))
            except BaseException as exc:
                outcome.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        try:
            deadline = time.monotonic() + 60
            while sum(projection.applied_offsets().values()) < 40:
                assert time.monotonic() < deadline and runner.is_alive(), outcome
                projection.wait_applied(0, 10**9, 0.2)
            recorded_id = projection.topic_id
            assert recorded_id is not None

            _delete_and_recreate(kafka_bootstrap, topic, 2, recreate=recreate)
            if recreate:
                produce_all(kafka_bootstrap, topic, 2, [turn("/p/0", "main", "after")])
            runner.join(timeout=60)
            assert not runner.is_alive(), "the projector kept running on a recreated topic"
        finally:
            stop.set()
            runner.join(timeout=30)
        assert len(outcome) == 1 and isinstance(outcome[0], LogRewoundError), outcome
        error = outcome[0]
        assert error.code == "log_rewound" and topic in error.message
        assert sum(projection.applied_offsets().values()) == 40  # nothing of the new topic was mixed in
        if not recreate:
            assert "deleted" in error.message
            return

        # Starting again on the recreated topic is refused too (the topic id differs).
        with pytest.raises(LogRewoundError) as again:
            Projector(projection, kafka_bootstrap, topic, options=FAST).run(until_caught_up=True)
        assert recorded_id in again.value.message

    code, _, err = cli("project", "--until-caught-up", *connection(kafka_bootstrap, topic, db))
    assert code == 1 and json.loads(err.strip().splitlines()[-1])["error"]["code"] == "log_rewound"


def test_a_log_shorter_than_the_applied_offsets_is_refused(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=1)
    produce_all(kafka_bootstrap, topic, 1, [turn("/p/x", "main", "one"), turn("/p/x", "main", "two")])
    with DuckProjection.open(tmp_path / "p.duckdb", topic=topic) as projection:
        projection.apply_batch(topic, 0, [LogRecord(0, 9, None, None)])  # applied up to 10 elsewhere
        with pytest.raises(LogRewoundError) as refused:
            Projector(projection, kafka_bootstrap, topic, options=FAST).run(until_caught_up=True)
        message = refused.value.message
        assert "partition 0" in message and "offset 2" in message and "offset 10" in message
        assert projection.applied_offsets() == {0: 10}


def test_project_then_replay_through_the_cli(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=2, configs={"retention.ms": "-1", "retention.bytes": "-1"})
    records = history(random.Random(11), 600, projects=5)
    produce_all(kafka_bootstrap, topic, 2, records[:400])
    streamed = tmp_path / "streamed.duckdb"
    code, out, err = cli(
        "project", "--until-caught-up", "--max-poll-records", "7", *connection(kafka_bootstrap, topic, streamed)
    )
    assert code == 0, err
    first = json.loads(out)
    assert first["caughtUp"] and first["records"] == 400
    # Repair every source the gaps broke (docs/spec.md#quarantine): the repairs land among the turns that follow, so
    # the stream and the replay must agree on them too (marks, outcomes, sources served again).
    code, out, err = cli("quarantine", "--json", "--db", str(streamed), "--topic", topic)
    assert code == 0, err
    broken = json.loads(out)["brokenSources"]
    assert broken, "the history's gaps break sources"
    names = {turn_of.source_sha256.hex(): turn_of.project for turn_of in records}
    for b in broken:
        code, _, err = cli(
            "repair",
            "--project",
            names[b["sourceSha256"]],
            "--source",
            b["sourceSha256"],
            "--reason",
            "accept the chain",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--topic",
            topic,
        )
        assert code == 0, err
    produce_all(kafka_bootstrap, topic, 2, records[400:])
    code, out, err = cli(
        "project", "--until-caught-up", "--max-poll-records", "13", *connection(kafka_bootstrap, topic, streamed)
    )
    assert code == 0, err
    second: dict[str, Any] = json.loads(out)
    assert second["records"] == 200 + len(broken) and sum(int(v) for v in second["applied"].values()) == 600 + len(
        broken
    )
    with DuckProjection.open(streamed, read_only=True) as projection:
        assert [r.outcome for r in projection.quarantine().repairs] == ["repaired"] * len(broken)

    replayed = tmp_path / "replayed.duckdb"
    code, out, err = cli("replay", *connection(kafka_bootstrap, topic, replayed))
    assert code == 0, err
    summary = json.loads(out)
    assert summary["records"] == 600 + len(broken)
    assert summary["turns"] + summary["duplicates"] + summary["quarantined"] == 600
    assert {"rewinds", "recordsPerSecond", "seconds"} <= set(summary)
    assert "100.0%" in err  # the progress bar's final state
    assert not (tmp_path / "replayed.duckdb.replay-partial").exists()
    with DuckProjection.open(streamed, read_only=True) as a, DuckProjection.open(replayed, read_only=True) as b:
        assert a.table_digests() == b.table_digests()
    assert_projection_equals_log(replayed, fold_topic(kafka_bootstrap, topic))

    code, _, err = cli("replay", *connection(kafka_bootstrap, topic, replayed))
    assert code == 2
    assert json.loads(err.strip().splitlines()[-1])["error"]["code"] == "replay_target_exists"

    empty_topic = topic + "-empty"
    create_topic(kafka_bootstrap, empty_topic, partitions=1)
    code, out, err = cli("replay", *connection(kafka_bootstrap, empty_topic, tmp_path / "empty.duckdb"))
    assert code == 0, err
    assert json.loads(out)["records"] == 0
    with DuckProjection.open(tmp_path / "empty.duckdb", read_only=True) as empty:
        assert empty.stats().turns == 0

    code, _, err = cli(
        "project", "--until-caught-up", *connection(kafka_bootstrap, topic + "-missing", tmp_path / "m.duckdb")
    )
    assert code == 1 and json.loads(err.strip().splitlines()[-1])["error"]["code"] == "topic_missing"


@pytest.mark.parametrize("leftover", ["another-topic", "an-earlier-log-of-the-topic", "a-prefix-of-this-log"])
def test_replay_over_a_leftover_partial_gives_exactly_the_fold_of_the_log(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path, leftover: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A replay killed before its cleanup leaves NEW_FILE.replay-partial. A later replay into the same
    # name must remove it and fold the log from offset 0, whatever the leftover holds.
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=2)
    records = history(random.Random(23), 34, projects=3)
    target = tmp_path / "replayed.duckdb"
    partial = tmp_path / "replayed.duckdb.replay-partial"
    earlier = [turn("/p/earlier", "main", f"earlier-{i}") for i in range(5)]  # five turns of another log
    if leftover == "another-topic":
        other = topic + "-other"
        create_topic(kafka_bootstrap, other, partitions=1)
        produce_all(kafka_bootstrap, other, 1, earlier)
        with DuckProjection.open(partial, topic=other) as projection:
            assert Projector(projection, kafka_bootstrap, other, options=FAST).run(until_caught_up=True).caught_up
    elif leftover == "an-earlier-log-of-the-topic":
        # The same topic name, another history (as a topic deleted and recreated leaves it): offsets
        # 0..4 of partition 0 hold turns this log never had.
        with DuckProjection.open(partial, topic=topic) as projection:
            projection.apply_batch(
                topic, 0, [LogRecord(0, i, r.project_sha256, encode_turn(r)) for i, r in enumerate(earlier)]
            )
    else:
        produce_all(kafka_bootstrap, topic, 2, records[:20])
        with DuckProjection.open(partial, topic=topic) as projection:
            assert Projector(projection, kafka_bootstrap, topic, options=FAST).run(until_caught_up=True).caught_up
    produce_all(kafka_bootstrap, topic, 2, records if leftover != "a-prefix-of-this-log" else records[20:])
    with DuckProjection.open(partial, read_only=True) as projection:
        assert projection.stats().turns > 0  # the leftover holds turns

    code, out, err = cli("replay", "--no-progress", *connection(kafka_bootstrap, topic, target))
    assert code == 0, err
    assert json.loads(out)["records"] == len(records)
    assert_projection_equals_log(target, fold_topic(kafka_bootstrap, topic))
    assert not partial.exists() and not partial.with_name(partial.name + ".wal").exists()
    assert "left by an earlier replay that did not finish" in caplog.text


def test_sigterm_stops_the_projector_after_its_batch(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=1)
    produce_all(kafka_bootstrap, topic, 1, [turn("/p/t", "main", f"t{i}") for i in range(30)])
    db = tmp_path / "p.duckdb"
    wal = tmp_path / "p.duckdb.wal"
    proc = subprocess.Popen(
        [sys.executable, "-m", "throughline.cli", "project", *connection(kafka_bootstrap, topic, db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The projector holds the file, so watch for its WAL (it exists once the projection is open),
        # then give it a moment to apply before asking it to stop.
        deadline = time.monotonic() + 60
        while not wal.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)
        assert proc.poll() is None, "the projector stopped on its own"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["caughtUp"] is False
    with DuckProjection.open(db, read_only=True) as projection:
        assert projection.applied_offsets() == {int(p): o for p, o in summary["applied"].items()}
    code, out, err = cli("project", "--until-caught-up", *connection(kafka_bootstrap, topic, db))
    assert code == 0, err
    assert json.loads(out)["applied"] == {"0": 30}


def test_records_deleted_before_they_were_applied_are_refused(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=1)
    produce_all(kafka_bootstrap, topic, 1, [turn("/p/d", "main", f"t{i}") for i in range(5)])
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): 3}, timeout_ms=30_000)
    finally:
        admin.close()
    with DuckProjection.open(tmp_path / "p.duckdb", topic=topic) as projection:
        with pytest.raises(LogTruncatedError) as refused:
            Projector(projection, kafka_bootstrap, topic, options=FAST).run(until_caught_up=True)
        assert "starts at offset 3" in refused.value.message and refused.value.code == "log_truncated"
        assert projection.applied_offsets() == {}
