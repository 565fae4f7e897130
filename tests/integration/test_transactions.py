"""A topic written by a transactional producer (commits and aborts), through the real broker.

Every transaction leaves a control marker at an offset no consumer ever returns, and an aborted one
leaves records a ``read_committed`` consumer skips: the projector's applied offset must still reach the
log's end, or every first page would wait for ever. Here: ``project --until-caught-up`` ends; the
reader's first page, a long-poll and the wait scoped to the project all answer ``ok`` with the
committed turns only; and a fetched-but-unapplied transaction of another project does not make a
project's first page pending, while its own does.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from projector_env import cli_process, connection, turn

from throughline.core.identity import project_sha256
from throughline.core.partitioning import partition_for
from throughline.core.turn import TurnRecord
from throughline.log import KafkaLog
from throughline.projector.feed import FeedSpec, ProjectorOptions, open_feed
from throughline.projector.prepare import PreparedBatch, merge_polls
from throughline.projector.runner import Projector
from throughline.projector.store import DuckProjection
from throughline.reader import read_observer_turn_page
from throughline.schemas.codec import encode_turn
from throughline.serve.app import READ_PATH, create_app
from throughline.testing import create_topic

KEY = bytes(range(32))
ALPHA, BETA = "/srv/txn/alpha", "/srv/txn/beta"
PARTITIONS = 2  # both projects hash to partition 1 of 2 (checked below): one partition's markers interleave them
DEADLINE = 60.0


def _topic(bootstrap: str) -> str:
    name = f"txn-{os.getpid()}-{random.randrange(1 << 30)}"
    create_topic(bootstrap, name, partitions=PARTITIONS)
    return name


class Transactions:
    """A transactional producer of turns: each ``commit``/``abort`` is one transaction."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=f"tl-{topic}", acks="all", linger_ms=2
        )
        self.producer.init_transactions()
        self.n = 0
        self._ends = {
            level: KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=level)
            for level in ("read_committed", "read_uncommitted")
        }
        self._tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    def _settled(self) -> None:
        """Wait until the markers are in the log: a transaction's end returns before the coordinator
        writes them, and until then the last stable offset stays below the high watermark."""
        deadline = time.monotonic() + DEADLINE
        while True:
            stable, high = (
                self._ends[level].end_offsets(self._tps) for level in ("read_committed", "read_uncommitted")
            )
            if stable == high:
                return
            assert time.monotonic() < deadline, f"the markers never came: {stable} < {high}"
            time.sleep(0.02)

    def _send(self, project: str, count: int) -> list[TurnRecord]:
        sent = []
        for _ in range(count):
            self.n += 1
            t = turn(project, "main", f"{project}-{self.n}")
            self.producer.send(
                self.topic,
                key=t.project_sha256,
                value=encode_turn(t),
                partition=partition_for(t.project_sha256, PARTITIONS),
            )
            sent.append(t)
        return sent

    def commit(self, project: str, count: int) -> list[TurnRecord]:
        self.producer.begin_transaction()
        sent = self._send(project, count)
        self.producer.commit_transaction()
        self._settled()
        return sent

    def abort(self, project: str, count: int) -> None:
        self.producer.begin_transaction()
        self._send(project, count)
        self.producer.flush()
        self.producer.abort_transaction()
        self._settled()

    def close(self) -> None:
        self.producer.close()
        for consumer in self._ends.values():
            consumer.close()


@pytest.fixture
def txn(kafka_bootstrap: str) -> Iterator[Transactions]:
    """A transactional producer of a new topic (``txn.topic``) of this session's broker (``txn.bootstrap``)."""
    producer = Transactions(kafka_bootstrap, _topic(kafka_bootstrap))
    try:
        yield producer
    finally:
        producer.close()


@pytest.fixture
def projection(txn: Transactions, tmp_path: Path) -> Iterator[DuckProjection]:
    """A new projection of ``txn.topic``, closed after the test."""
    with DuckProjection.open(tmp_path / "p.duckdb", topic=txn.topic) as opened:
        yield opened


def test_the_projects_share_a_partition() -> None:
    assert partition_for(project_sha256(ALPHA), PARTITIONS) == partition_for(project_sha256(BETA), PARTITIONS)


def test_until_caught_up_ends_and_the_first_page_is_ok(txn: Transactions, tmp_path: Path) -> None:
    kept = txn.commit(ALPHA, 3)
    txn.abort(ALPHA, 2)
    kept += txn.commit(ALPHA, 2)
    txn.abort(BETA, 1)  # the log ends with an abort marker
    db = tmp_path / "p.duckdb"
    done = cli_process("project", "--until-caught-up", *connection(txn.bootstrap, txn.topic, db), timeout=120)
    assert done.returncode == 0, done.stderr
    with KafkaLog([txn.bootstrap], txn.topic) as log, DuckProjection.open(db, read_only=True) as projection:
        partition = log.partition_of(project_sha256(ALPHA))
        assert projection.applied_offsets()[partition] == log.end_offset(partition)  # past every marker
        page = read_observer_turn_page(
            project=ALPHA, projection=projection, log=log, token_key=KEY, wait_timeout=0.0, limit=100
        )
    assert page.status == "ok"
    assert [t.seq for t in page.turns] == list(range(1, len(kept) + 1))  # the aborted turns never appear


def test_serve_reads_and_long_polls_across_markers(txn: Transactions, projection: DuckProjection) -> None:
    """The projector loop of ``serve`` (fetch worker on) under the HTTP API, in process."""
    txn.commit(ALPHA, 2)
    txn.abort(ALPHA, 3)
    txn.commit(BETA, 1)
    stop = threading.Event()
    projector = threading.Thread(
        target=lambda: Projector(projection, [txn.bootstrap], txn.topic).run(stop=stop), daemon=True
    )
    projector.start()
    try:
        with (
            KafkaLog([txn.bootstrap], txn.topic) as log,
            TestClient(create_app(projection=projection, log=log, token_key=KEY)) as client,
        ):
            deadline = time.monotonic() + DEADLINE
            while True:  # the wait (2 s by default) answers pending only while the projector starts
                first = client.get(READ_PATH, params={"project": ALPHA}).json()
                if first["status"] == "ok":
                    break
                assert time.monotonic() < deadline, first
            assert [t["seq"] for t in first["turns"]] == [1, 2]
            answers: list[dict[str, object]] = []
            poll = threading.Thread(
                target=lambda: answers.append(
                    client.get(
                        READ_PATH, params={"project": ALPHA, "afterCursor": first["throughCursor"], "wait": "30"}
                    ).json()
                )
            )
            poll.start()
            time.sleep(0.5)  # the long-poll is waiting; meanwhile an abort, then a commit, of alpha
            txn.abort(ALPHA, 2)
            txn.commit(ALPHA, 1)
            poll.join(timeout=45)
            assert not poll.is_alive()
            assert answers[0]["status"] == "ok"
            assert [t["seq"] for t in answers[0]["turns"]] == [3]  # type: ignore[index]
            # Every record and marker applied: a first page needs no wait at all.
            deadline = time.monotonic() + DEADLINE
            partition = log.partition_of(project_sha256(ALPHA))
            while projection.applied_offsets().get(partition, 0) < log.end_offset(partition):
                assert time.monotonic() < deadline, "the applied offset never reached the end offset"
                time.sleep(0.05)
            for project in (ALPHA, BETA):
                page = read_observer_turn_page(
                    project=project, projection=projection, log=log, token_key=KEY, wait_timeout=0.0
                )
                assert page.status == "ok", page.reason
    finally:
        stop.set()
        projector.join(timeout=60)


def test_another_projects_transaction_in_flight_does_not_hold_a_first_page(
    txn: Transactions, projection: DuckProjection
) -> None:
    """The scoped wait over a real feed: markers and aborted records are covered by the fetch positions."""
    txn.commit(ALPHA, 2)
    txn.abort(ALPHA, 1)
    partition = partition_for(project_sha256(ALPHA), PARTITIONS)
    spec = FeedSpec((txn.bootstrap,), txn.topic, PARTITIONS, (), ProjectorOptions()).at({})
    feed = open_feed(spec)
    try:
        with KafkaLog([txn.bootstrap], txn.topic) as log:
            projection.fetching_from({p: 0 for p in range(PARTITIONS)})

            held: list[list[PreparedBatch]] = []  # fetched, not applied yet

            def fetch_to_end() -> None:
                end = log.end_offset(partition)
                reached = max(
                    [
                        projection.applied_offsets().get(partition, 0),
                        *(b.next_offset for poll in held for b in poll if b.partition == partition),
                    ]
                )
                deadline = time.monotonic() + DEADLINE
                while reached < end:
                    assert time.monotonic() < deadline, f"the feed reached {reached} of {end}"
                    batches = feed.next(0.5)
                    if batches:
                        projection.fetched(batches)
                        held.append(batches)
                    reached = max([reached, *(b.next_offset for b in batches if b.partition == partition)])

            def apply_held() -> None:
                if held:
                    projection.apply_prepared(txn.topic, merge_polls(held))
                    held.clear()

            fetch_to_end()
            apply_held()  # alpha's turns, its aborted record and both markers applied
            txn.commit(BETA, 2)
            txn.abort(BETA, 1)
            fetch_to_end()  # beta's two transactions fetched, not applied
            end = log.end_offset(partition)
            assert projection.applied_offsets()[partition] < end
            assert projection.wait_settled(partition, project_sha256(ALPHA), end, 0.0)
            assert not projection.wait_settled(partition, project_sha256(BETA), end, 0.0)

            def read(project: str) -> str:
                return read_observer_turn_page(
                    project=project, projection=projection, log=log, token_key=KEY, wait_timeout=0.0
                ).status

            assert read(ALPHA) == "ok"
            assert read(BETA) == "projection_pending"
            apply_held()
            assert projection.applied_offsets()[partition] == end
            assert read(BETA) == "ok"
    finally:
        feed.close()
