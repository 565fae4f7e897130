"""The projector's feeds against the real broker: one contract, run against the fetcher on the calling
thread (``LocalFeed``) and in a worker process (``WorkerFeed``); then what only the worker can do
wrong (die, outlive its parent) and the projector's answer to it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from projector_env import (
    WORKER_FAULT,
    Producer,
    assert_projection_equals_log,
    cli_process,
    connection,
    fold_topic,
    produce_all,
    worker_fault_env,
)
from projector_env import history as make_history
from projector_env import turn as make_turn

from throughline.core.partitioning import partition_for
from throughline.core.turn import TurnRecord
from throughline.log import TopicMissingError
from throughline.projector.feed import (
    FeedSpec,
    FetchWorkerError,
    LocalFeed,
    ProjectorOptions,
    WorkerFeed,
)
from throughline.projector.prepare import Q_INVALID, PreparedBatch, RefusedRecord, SoundRecord
from throughline.projector.runner import Projector
from throughline.projector.store import DuckProjection
from throughline.schemas.codec import encode_turn
from throughline.testing import create_topic

PARTITIONS = 3
OPTIONS = ProjectorOptions(poll_timeout=0.2, check_interval=0.5, timeout=10.0, max_poll_records=37)


def _drain(feed: LocalFeed | WorkerFeed, want: int, *, seconds: float = 60.0) -> list[PreparedBatch]:
    """Batches until ``want`` records came (bounded in time)."""
    got: list[PreparedBatch] = []
    deadline = time.monotonic() + seconds
    while sum(len(b.items) for b in got) < want:
        assert time.monotonic() < deadline, f"only {sum(len(b.items) for b in got)} of {want} records came"
        got.extend(feed.next(0.5))
    return got


def _by_partition(batches: list[PreparedBatch]) -> dict[int, list[SoundRecord | RefusedRecord]]:
    out: dict[int, list[SoundRecord | RefusedRecord]] = {}
    for b in batches:
        out.setdefault(b.partition, []).extend(b.items)
    return out


@pytest.fixture(scope="module")
def filled_topic(kafka_bootstrap: str) -> Iterator[tuple[str, list[TurnRecord]]]:
    topic = f"feed-contract-{os.getpid()}-{random.randrange(1 << 30)}"
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    turns = make_history(random.Random(11), 600, projects=6)
    produce_all(kafka_bootstrap, topic, PARTITIONS, turns)
    yield topic, turns


class FeedContract:
    """What every feed must do (run against both below)."""

    def open(self, spec: FeedSpec) -> LocalFeed | WorkerFeed:
        raise NotImplementedError

    def spec(self, bootstrap: str, topic: str, start: dict[int, int] | None = None) -> FeedSpec:
        return FeedSpec((bootstrap,), topic, PARTITIONS, (), OPTIONS).at(start or {})

    def test_every_record_arrives_once_in_log_order(
        self, kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]]
    ) -> None:
        topic, turns = filled_topic
        with closing(self.open(self.spec(kafka_bootstrap, topic))) as feed:
            batches = _drain(feed, len(turns))
        assert all(len(b.items) <= OPTIONS.max_poll_records for b in batches)
        log = fold_topic(kafka_bootstrap, topic)
        for partition, items in _by_partition(batches).items():
            offsets = [it.offset for it in items]
            assert offsets == list(range(log.ends[partition])), "a record came twice, out of order, or not at all"
            assert all(isinstance(it, SoundRecord) for it in items)
        ids = sorted(it.turn_id for b in batches for it in b.items if isinstance(it, SoundRecord))
        assert ids == sorted(t.turn_id for t in turns)

    def test_a_record_whose_content_digest_is_not_its_contents_is_refused(self, kafka_bootstrap: str) -> None:
        """The worker leaves this check to its parent (``check_content``): every feed still refuses it."""
        topic = f"feed-content-{os.getpid()}-{random.randrange(1 << 30)}"
        create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
        good = make_turn("/p/content", "t", "good-1")
        bad = replace(make_turn("/p/content", "t", "bad-2"), content_digest=bytes(32))
        producer = Producer(kafka_bootstrap, topic, PARTITIONS)
        try:
            home = partition_for(good.project_sha256, PARTITIONS)
            producer.send_raw(home, good.project_sha256, encode_turn(good))
            producer.send_raw(home, bad.project_sha256, encode_turn(bad))
        finally:
            producer.close()
        with closing(self.open(self.spec(kafka_bootstrap, topic))) as feed:
            items = _by_partition(_drain(feed, 2))[home]
        assert isinstance(items[0], SoundRecord) and items[0].turn_id == "good-1"
        assert isinstance(items[1], RefusedRecord)
        assert (items[1].code, items[1].reason) == (Q_INVALID, "contentDigest does not match the turn's content")
        assert items[1].value == encode_turn(bad) and items[1].source == bad.source_sha256

    def test_a_restart_fetches_again_from_the_given_offsets(
        self, kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]]
    ) -> None:
        topic, turns = filled_topic
        with closing(self.open(self.spec(kafka_bootstrap, topic))) as feed:
            _drain(feed, 50)
            start = {0: 5, 1: 0, 2: 17}
            feed.restart(start)
            ends = fold_topic(kafka_bootstrap, topic).ends
            batches = _drain(feed, sum(ends[p] - start[p] for p in ends))
        for partition, items in _by_partition(batches).items():
            offsets = [it.offset for it in items]
            assert offsets == list(range(start[partition], ends[partition]))

    def test_an_idle_feed_returns_nothing_within_its_timeout(
        self, kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]]
    ) -> None:
        topic, _ = filled_topic
        ends = fold_topic(kafka_bootstrap, topic).ends
        with closing(self.open(self.spec(kafka_bootstrap, topic, ends))) as feed:
            started = time.monotonic()
            assert feed.next(0.3) == []
            assert time.monotonic() - started < 10

    def test_a_feed_behind_the_log_fills_its_polls_and_a_caught_up_one_does_not_wait(
        self, kafka_bootstrap: str
    ) -> None:
        topic = f"feed-fill-{os.getpid()}-{random.randrange(1 << 30)}"
        create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
        turns = make_history(random.Random(5), 400, projects=4)
        produce_all(kafka_bootstrap, topic, PARTITIONS, turns[:-1])
        # Fetches of a few records each: only a poll that keeps fetching reaches 120 records.
        options = replace(OPTIONS, max_partition_fetch_bytes=2048, max_poll_records=120, fill_seconds=20.0)
        with closing(self.open(replace(self.spec(kafka_bootstrap, topic), options=options))) as feed:
            first = _drain(feed, 1)
            assert sum(len(b.items) for b in first) == 120
            _drain(feed, len(turns) - 1 - 120)  # now caught up
            produce_all(kafka_bootstrap, topic, PARTITIONS, turns[-1:])
            started = time.monotonic()
            last = _drain(feed, 1)
            assert time.monotonic() - started < options.fill_seconds, "a caught-up poll waited to fill up"
        assert [it.turn_id for b in last for it in b.items if isinstance(it, SoundRecord)] == [turns[-1].turn_id]


class TestLocalFeed(FeedContract):
    def open(self, spec: FeedSpec) -> LocalFeed:
        return LocalFeed(spec)


class TestWorkerFeed(FeedContract):
    def open(self, spec: FeedSpec) -> WorkerFeed:
        return WorkerFeed(spec)

    def test_a_killed_worker_is_reported_and_a_restart_resumes(
        self, kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]]
    ) -> None:
        topic, turns = filled_topic
        with closing(WorkerFeed(self.spec(kafka_bootstrap, topic))) as feed:
            worker = feed.worker
            assert worker is not None
            worker.proc.kill()
            worker.proc.wait(timeout=10)
            with pytest.raises(FetchWorkerError) as caught:
                for _ in range(200):  # frames already in the pipe come first
                    feed.next(0.5)
            assert caught.value.retriable and caught.value.code == "fetch_worker_failed"
            feed.restart({})
            assert sum(len(b.items) for b in _drain(feed, len(turns))) >= len(turns)

    def test_the_worker_leaves_sigterm_and_sigint_to_its_parent(
        self, kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]]
    ) -> None:
        # ``timeout``, a terminal's Ctrl-C and systemd's default KillMode signal the whole process group:
        # the worker must outlive them so that the stopping projector stops it, not restarts it.
        topic, turns = filled_topic
        with closing(WorkerFeed(self.spec(kafka_bootstrap, topic))) as feed:
            worker = feed.worker
            assert worker is not None
            first = _drain(feed, 1)  # a frame came: the worker runs, past installing its handlers
            worker.proc.send_signal(signal.SIGTERM)
            worker.proc.send_signal(signal.SIGINT)
            rest = _drain(feed, len(turns) - sum(len(b.items) for b in first))
            assert sum(len(b.items) for b in first + rest) >= len(turns)
            time.sleep(0.5)
            assert worker.proc.poll() is None, f"the worker exited with {worker.proc.returncode}"

    def test_a_worker_that_raises_is_reported_as_fetch_worker_failed_and_a_restart_resumes(
        self,
        kafka_bootstrap: str,
        filled_topic: tuple[str, list[TurnRecord]],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        # Not killed: the worker's own code raises (a non-Kafka error), and says so over the pipe.
        topic, turns = filled_topic
        env, marker = worker_fault_env(tmp_path)
        for name in ("PYTHONPATH", "THROUGHLINE_TEST_WORKER_FAULT"):
            monkeypatch.setenv(name, env[name])  # the worker inherits this process's environment
        with closing(WorkerFeed(self.spec(kafka_bootstrap, topic))) as feed:
            with pytest.raises(FetchWorkerError) as caught:
                _drain(feed, len(turns))
            assert not marker.exists(), "the worker never raised"
            assert caught.value.retriable and caught.value.code == "fetch_worker_failed"
            assert f"RuntimeError: {WORKER_FAULT}" in caught.value.message
            feed.restart({})
            assert sum(len(b.items) for b in _drain(feed, len(turns))) >= len(turns)

    def test_a_broker_that_does_not_answer_reaches_the_caller_as_a_kafka_error(self) -> None:
        spec = FeedSpec(("127.0.0.1:9",), "nowhere", 1, ((0, 0),), ProjectorOptions(timeout=1.0))
        with closing(WorkerFeed(spec)) as feed:
            with pytest.raises(Exception) as caught:
                for _ in range(40):
                    feed.next(0.5)
            assert caught.type.__name__ in {"BrokerUnavailableError", "NoBrokersAvailable", "KafkaConnectionError"}


def test_the_worker_dies_with_its_parent(
    kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]], tmp_path: Path
) -> None:
    topic, _ = filled_topic
    pid_file = tmp_path / "worker.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time
                from pathlib import Path
                from throughline.projector.feed import FeedSpec, ProjectorOptions, WorkerFeed
                feed = WorkerFeed(FeedSpec(({kafka_bootstrap!r},), {topic!r}, {PARTITIONS}, (), ProjectorOptions()).at({{}}))
                Path({str(pid_file)!r}).write_text(str(feed.worker.proc.pid))
                time.sleep(120)
                """
            ),
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the parent never started its worker"
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        assert _alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(worker):
            assert time.monotonic() < deadline, f"fetch worker {worker} outlived its killed parent"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("fetch_worker", [True, False], ids=["worker", "local"])
def test_both_feeds_project_the_same_tables(
    kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]], tmp_path: Path, fetch_worker: bool
) -> None:
    topic, _ = filled_topic
    db = tmp_path / f"feed-{fetch_worker}.duckdb"
    options = ProjectorOptions(
        poll_timeout=0.2, check_interval=0.5, timeout=10.0, max_poll_records=53, fetch_worker=fetch_worker
    )
    with DuckProjection.open(db, topic=topic) as projection:
        summary = Projector(projection, kafka_bootstrap, topic, options=options).run(until_caught_up=True)
    assert summary.caught_up and summary.summary.records == 600
    assert_projection_equals_log(db, fold_topic(kafka_bootstrap, topic))


def test_the_cli_projector_restarts_a_worker_that_raises(
    kafka_bootstrap: str, filled_topic: tuple[str, list[TurnRecord]], tmp_path: Path
) -> None:
    # `throughline project`: the worker's error is the retriable fetch_worker_failed, the run restarts
    # the worker from the applied offsets and projects the whole log; no traceback, exit code 0.
    topic, turns = filled_topic
    env, marker = worker_fault_env(tmp_path)
    db = tmp_path / "p.duckdb"
    done = cli_process("project", "--until-caught-up", *connection(kafka_bootstrap, topic, db), env=env, timeout=180)
    assert not marker.exists(), "the worker never raised"
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "restarting the fetch worker" in done.stderr and f"RuntimeError: {WORKER_FAULT}" in done.stderr, done.stderr
    summary = json.loads(done.stdout)
    assert summary["caughtUp"] and summary["records"] == len(turns)
    assert_projection_equals_log(db, fold_topic(kafka_bootstrap, topic))


def _feed_children() -> list[str]:
    """Command lines of this process's children that are fetch workers."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # it just exited
            if "throughline.projector.feed" in cmdline:
                found.append(cmdline)
    return found


def test_a_run_whose_checks_fail_leaves_no_worker_behind(kafka_bootstrap: str, tmp_path: Path) -> None:
    # The worker is started before the checks (its imports overlap them); a failed check stops it.
    missing = f"feed-missing-{os.getpid()}-{random.randrange(1 << 30)}"
    with DuckProjection.open(tmp_path / "p.duckdb", topic=missing) as proj:
        with pytest.raises(TopicMissingError):
            Projector(proj, kafka_bootstrap, missing, options=OPTIONS).run(until_caught_up=True)
    assert _feed_children() == []
