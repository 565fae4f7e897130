"""``StagedWriter``: polls staged for readers at once, committed on a writer thread (``serve``'s projector)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from projector_histories import TOPIC, Entry, entries_log, turn

from throughline.core.repair import RepairRecord
from throughline.projector.exceptions import ProjectionStorageError
from throughline.projector.pipeline import UNREAD_SLICE, StagedWriter, StageGate
from throughline.projector.store import DuckProjection, LogRecord, PreparedBatch
from throughline.projector.tally import ProgressUpdate, Tally
from throughline.schemas.codec import encode_turn

PROJECT = turn().project_sha256


def records(first: int, count: int) -> list[LogRecord]:
    """``count`` appends of one thread at offsets ``first``.. of partition 0."""
    out = []
    for offset in range(first, first + count):
        r = turn(turn_id=f"t{offset}")
        out.append(LogRecord(0, offset, r.project_sha256, encode_turn(r)))
    return out


@pytest.fixture
def projection(tmp_path: Path) -> Iterator[DuckProjection]:
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as p:
        p.fetching_from({0: 0})
        yield p


def writer_for(
    projection: DuckProjection, *, interval: float = 0.0, bound: int = 1000
) -> tuple[StagedWriter, list[ProgressUpdate]]:
    updates: list[ProgressUpdate] = []
    tally = Tally(projection, updates.append, None, {0: 0}, time.monotonic())
    return StagedWriter(projection, TOPIC, tally, max_queued_records=bound, commit_interval=interval), updates


def poll(projection: DuckProjection, batch: Sequence[LogRecord]) -> list[PreparedBatch]:
    prepared = [projection.prepare(0, batch)]
    projection.fetched(prepared)
    return prepared


def head_length(projection: DuckProjection) -> int:
    with projection.view() as v:
        head = v.head(PROJECT)
        return head.length if head is not None else 0


def test_every_poll_is_readable_at_once_and_committed_in_fewer_transactions(projection: DuckProjection) -> None:
    writer, updates = writer_for(projection, interval=0.2)
    try:
        for i in range(10):
            writer.apply(poll(projection, records(3 * i, 3)))
            assert head_length(projection) == 3 * (i + 1)  # readable before its commit
        writer.drain()
        assert projection.applied_offsets() == {0: 30}
        assert sum(u.batch.records for u in updates) == 30
        assert len(updates) < 10  # polls share transactions: the interval holds commits back
    finally:
        writer.close()
    assert head_length(projection) == 30


def test_a_failed_commit_drops_the_layers_and_ends_the_run(
    projection: DuckProjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, _ = writer_for(projection)
    try:
        writer.apply(poll(projection, records(0, 2)))
        writer.drain()
        real = projection.apply_prepared

        def failing(topic: str, batches: Sequence[PreparedBatch]) -> Any:
            raise ProjectionStorageError("disk full (injected)")

        monkeypatch.setattr(projection, "apply_prepared", failing)
        writer.apply(poll(projection, records(2, 3)))
        with pytest.raises(ProjectionStorageError):
            writer.drain()
        assert head_length(projection) == 2  # what the failed commit held is no longer served
        assert not projection.wait_settled(0, PROJECT, 5, 0.0)
        with pytest.raises(ProjectionStorageError):
            writer.apply(poll(projection, records(5, 1)))
        monkeypatch.setattr(projection, "apply_prepared", real)
    finally:
        writer.close()
    assert projection.applied_offsets() == {0: 2}


def test_a_poll_with_a_repair_is_committed_alone_after_the_queue(projection: DuckProjection) -> None:
    writer, updates = writer_for(projection, interval=5.0)  # nothing would commit for 5 s on its own
    try:
        writer.apply(poll(projection, records(0, 3)))
        first = turn(turn_id="t0")
        repair = RepairRecord(first.project_sha256, first.source_sha256, "accepted")
        writer.apply(poll(projection, entries_log([Entry(repair, 0, 3, repair.project_sha256)])))
        assert projection.applied_offsets() == {0: 4}  # the queue, then the repair, both committed
        assert [u.batch.records for u in updates] == [3, 1]
    finally:
        writer.close()


def test_the_queue_is_bounded(projection: DuckProjection, monkeypatch: pytest.MonkeyPatch) -> None:
    real = projection.apply_prepared
    gate = threading.Event()

    def slow(topic: str, batches: Sequence[PreparedBatch]) -> Any:
        gate.wait(10)
        return real(topic, batches)

    monkeypatch.setattr(projection, "apply_prepared", slow)
    writer, _ = writer_for(projection, bound=6)
    done = threading.Event()

    def feed() -> None:
        for i in range(6):
            writer.apply(poll(projection, records(4 * i, 4)))
        done.set()

    feeder = threading.Thread(target=feed)
    try:
        feeder.start()
        assert not done.wait(0.5)  # the writer is held: the feed waits once the bound is passed
        assert head_length(projection) <= 12
        gate.set()
        assert done.wait(30)
        writer.drain()
        assert projection.applied_offsets() == {0: 24}
    finally:
        gate.set()
        feeder.join(timeout=30)
        writer.close()


def test_close_drops_what_is_not_committed(projection: DuckProjection) -> None:
    writer, _ = writer_for(projection, interval=5.0)
    writer.apply(poll(projection, records(0, 2)))
    writer.drain()  # the first commit after a quiet spell goes at once; the next waits the interval
    writer.apply(poll(projection, records(2, 3)))
    assert head_length(projection) == 5
    writer.close()
    assert head_length(projection) == 2 and projection.applied_offsets() == {0: 2}


def test_a_prompt_has_each_poll_committed_without_waiting_for_the_interval(projection: DuckProjection) -> None:
    prompt = threading.Event()
    updates: list[ProgressUpdate] = []
    tally = Tally(projection, updates.append, None, {0: 0}, time.monotonic())
    writer = StagedWriter(projection, TOPIC, tally, max_queued_records=1000, commit_interval=30.0, prompt=prompt)
    try:
        writer.apply(poll(projection, records(0, 2)))
        writer.drain()  # the first commit after a quiet spell goes at once; the next would wait 30 s
        writer.apply(poll(projection, records(2, 3)))
        time.sleep(0.3)
        assert projection.applied_offsets() == {0: 2}  # held back by the interval
        prompt.set()  # a switch of files waits for the commits: the next poll wakes the writer
        writer.apply(poll(projection, records(5, 1)))
        deadline = time.monotonic() + 10
        while projection.applied_offsets() != {0: 6} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert projection.applied_offsets() == {0: 6}
    finally:
        writer.close()


def test_once_its_gate_closed_a_writer_makes_nothing_more_readable(projection: DuckProjection) -> None:
    gate = StageGate()
    updates: list[ProgressUpdate] = []
    tally = Tally(projection, updates.append, None, {0: 0}, time.monotonic())
    writer = StagedWriter(projection, TOPIC, tally, max_queued_records=1000, commit_interval=30.0, gate=gate)
    try:
        writer.apply(poll(projection, records(0, 2)))
        assert gate.close(1.0)
        assert projection.readable_offsets() == {0: 2}  # what readers saw is final
        writer.apply(poll(projection, records(2, 3)))  # a poll the stopping run returned with: dropped
        first = turn(turn_id="t0")
        repair = RepairRecord(first.project_sha256, first.source_sha256, "accepted")
        writer.apply(poll(projection, entries_log([Entry(repair, 0, 5, repair.project_sha256)])))  # unstaged: too
        assert projection.readable_offsets() == {0: 2} and head_length(projection) == 2
        writer.drain()  # what was staged is still committed
        assert projection.applied_offsets() == {0: 2} and sum(u.batch.records for u in updates) == 2
    finally:
        writer.close()


def test_a_gate_closes_once_the_poll_it_admitted_is_readable() -> None:
    gate = StageGate()
    admitted, staged = threading.Event(), threading.Event()
    seen: list[bool] = []

    def stage() -> None:
        with gate.admitting() as open_:
            seen.append(open_)
            admitted.set()
            time.sleep(0.2)  # staging the poll in hand
            staged.set()

    thread = threading.Thread(target=stage)
    thread.start()
    assert admitted.wait(5)
    assert not gate.close(0.01)  # not within a bound shorter than the staging
    assert gate.close(5) and staged.is_set()
    with gate.admitting() as open_:
        assert not open_
    thread.join(5)
    assert seen == [True]


def test_while_staging_is_clear_each_poll_is_committed_as_it_comes(projection: DuckProjection) -> None:
    staging = threading.Event()  # nobody reads the projection yet (a rebuild's new file before its switch)
    updates: list[ProgressUpdate] = []
    tally = Tally(projection, updates.append, None, {0: 0}, time.monotonic())
    writer = StagedWriter(projection, TOPIC, tally, max_queued_records=1000, commit_interval=30.0, staging=staging)
    try:
        writer.apply(poll(projection, records(0, 2)))
        assert projection.applied_offsets() == {0: 2} and len(updates) == 1  # committed before apply returned
        writer.apply(poll(projection, records(2, 3)))
        assert projection.applied_offsets() == {0: 5} and len(updates) == 2
        writer.apply(poll(projection, records(5, 2 * UNREAD_SLICE + 1)))  # a catch-up: in bounded transactions
        assert projection.applied_offsets() == {0: 6 + 2 * UNREAD_SLICE} and len(updates) == 5
        assert max(u.batch.records for u in updates) == UNREAD_SLICE
        staging.set()  # readers from here: staged at once, committed on the writer's interval
        n = 6 + 2 * UNREAD_SLICE
        writer.apply(poll(projection, records(n, 1)))
        writer.drain()  # the first commit after a quiet spell goes at once; the next waits the interval
        writer.apply(poll(projection, records(n + 1, 2)))
        assert projection.readable_offsets() == {0: n + 3} and projection.applied_offsets() == {0: n + 1}
        writer.drain()
        assert projection.applied_offsets() == {0: n + 3} and head_length(projection) == n + 3
    finally:
        writer.close()


def test_a_staged_writer_fills_the_stored_turn_keys_before_its_first_poll(projection: DuckProjection) -> None:
    writer, _ = writer_for(projection)
    try:
        keys = projection._staging.stored_keys  # filled by a scan of turn_ids, from the writer's start
        deadline = time.monotonic() + 10
        while not keys.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        assert keys.ready  # nothing was staged: the scan did not wait for a poll
    finally:
        writer.close()
