"""The switch of a rebuild without downtime, without Kafka: ``SwitchableProjection`` (reads in flight end on
the old handle, new ones go to the new, waits and change counts carry over), ``PausableProjector`` (a pause
commits the staged polls and holds the next run; a run started beside it is handed over instead of a new
one started), ``Rebuild`` (catch up, hand over to a live run on the new file, pause, switch, resume with
that run; a failure leaves the live file serving) and ``RebuildFiles`` (which file a start keeps after a
crash)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from throughline.projector.exceptions import ProjectionBusyError
from throughline.projector.rebuild_files import RebuildFiles
from throughline.serve.pausable import RunEvents, RunThread
from throughline.serve.rebuild import PausableProjector, Rebuild, RebuildSettings
from throughline.serve.switchable import EPOCH_UNIT, SwitchableProjection

BOUND = 10.0


class Handle:
    """A projection handle in memory: applied offsets, change counts, waits that a close wakes."""

    def __init__(self, name: str, applied: dict[int, int] | None = None) -> None:
        self.name = name
        self.cond = threading.Condition()
        self.applied: dict[int, int] = dict(applied or {})
        self.changes = 0
        self.closed = False
        self.checkpoints = 0

    def advance(self, partition: int, offset: int) -> None:
        with self.cond:
            self.applied[partition] = max(offset, self.applied.get(partition, 0))
            self.changes += 1
            self.cond.notify_all()

    @contextmanager
    def view(self) -> Iterator[Any]:
        assert not self.closed, f"{self.name} read after close"
        yield self

    def read(self, answer: Callable[[Any], Any]) -> Any:
        assert not self.closed, f"{self.name} read after close"
        return answer(self)

    def readable_offsets(self) -> dict[int, int]:
        with self.cond:
            return dict(self.applied)

    def committed_offsets(self) -> dict[int, int]:
        return self.readable_offsets()

    applied_offsets = readable_offsets

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> None:
        return None

    def _wait(self, reached: Callable[[], bool], timeout: float) -> bool:
        with self.cond:
            self.cond.wait_for(lambda: reached() or self.closed, timeout)
            return reached()

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        return self._wait(lambda: self.applied.get(partition, 0) >= offset, timeout)

    def wait_settled(self, partition: int, project_sha256: bytes, offset: int, timeout: float) -> bool:
        return self.wait_applied(partition, offset, timeout)

    def project_changes(self, project_sha256: bytes) -> int:
        with self.cond:
            return self.changes

    def wait_project_changed(self, project_sha256: bytes, seen: int, timeout: float) -> bool:
        return self._wait(lambda: self.changes > seen, timeout)

    def checkpoint(self) -> None:
        self.checkpoints += 1

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    retire = close  # in memory, nothing is left to close after it
    discard = close


def _thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(target()), daemon=True)
    thread.start()
    return thread, box


# ------------------------------------------------------------------ SwitchableProjection


def test_a_read_in_flight_ends_on_the_old_handle_and_new_reads_go_to_the_new() -> None:
    old, new = Handle("old", {0: 5}), Handle("new", {0: 5})
    reads = SwitchableProjection(old)
    inside, release = threading.Event(), threading.Event()

    def slow(view: Any) -> str:
        inside.set()
        assert release.wait(BOUND)
        return str(view.name)

    reader, answer = _thread(lambda: reads.read(slow))
    assert inside.wait(BOUND)
    switcher, switched = _thread(lambda: reads.switch(new, BOUND))
    time.sleep(0.2)
    assert switcher.is_alive()  # the switch waits for the read on the old handle
    assert reads.read(lambda v: v.name) == "new"  # while new reads already go to the new one
    release.set()
    reader.join(BOUND)
    switcher.join(BOUND)
    assert answer == ["old"] and switched == [(old, True)]
    assert reads.reads_in_flight(old) == 0 and reads.epoch == 1


def test_the_switch_is_bounded_by_its_drain_timeout() -> None:
    old, new = Handle("old"), Handle("new")
    reads = SwitchableProjection(old)
    with reads.view():
        assert reads.switch(new, 0.1) == (old, False)
    assert reads.reads_in_flight(old) == 0


def test_a_wait_on_the_old_handle_carries_over_to_the_new_one() -> None:
    old, new = Handle("old", {0: 3}), Handle("new", {0: 3})
    reads = SwitchableProjection(old)
    waiter, answer = _thread(lambda: reads.wait_applied(0, 10, BOUND))
    time.sleep(0.1)
    previous, _ = reads.switch(new, BOUND)
    previous.close()  # wakes the wait on the old handle, which goes on waiting on the new one
    time.sleep(0.1)
    assert waiter.is_alive()
    new.advance(0, 10)
    waiter.join(BOUND)
    assert answer == [True]


def test_a_wait_times_out_as_before_without_a_switch() -> None:
    reads = SwitchableProjection(Handle("old", {0: 3}))
    started = time.monotonic()
    assert reads.wait_applied(0, 10, 0.2) is False
    assert time.monotonic() - started >= 0.2


def test_change_counts_grow_across_a_switch_and_wake_long_polls() -> None:
    old, new = Handle("old"), Handle("new")
    for _ in range(3):
        old.advance(0, 1)
    reads = SwitchableProjection(old)
    seen = reads.project_changes(b"p")
    assert seen == 3
    waiter, answer = _thread(lambda: reads.wait_project_changed(b"p", seen, BOUND))
    time.sleep(0.1)
    previous, _ = reads.switch(new, BOUND)
    previous.close()
    waiter.join(BOUND)
    assert answer == [True]  # the long-poll reads again, on the new handle
    assert reads.project_changes(b"p") == EPOCH_UNIT > seen
    assert reads.wait_project_changed(b"p", EPOCH_UNIT, 0.05) is False
    new.advance(0, 1)
    assert reads.wait_project_changed(b"p", EPOCH_UNIT, 0.05) is True


# ------------------------------------------------------------------ PausableProjector


def test_a_pause_commits_what_was_staged_and_holds_the_next_run_until_resume() -> None:
    first, second = Handle("first"), Handle("second")
    runs: list[tuple[str, bool]] = []

    def run(projection: Handle, events: RunEvents) -> None:
        assert events.stop.wait(BOUND)
        runs.append((projection.name, events.commit.is_set()))

    live = PausableProjector(run, first)
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    time.sleep(0.1)
    assert live.pause(BOUND)
    assert live.wait_left(BOUND)  # the run returned: it committed what it staged
    assert runs == [("first", True)]
    time.sleep(0.3)
    assert runs == [("first", True)]  # held while paused
    live.resume(second)
    time.sleep(0.1)
    assert live.projection is second
    stop.set()  # the service's stop reaches the run in progress
    loop.join(BOUND)
    assert not loop.is_alive()
    assert runs == [("first", True), ("second", False)]


def test_a_run_handed_over_is_the_live_projector_and_nothing_new_starts() -> None:
    first, second = Handle("first"), Handle("second")
    started: list[tuple[str, bool]] = []
    ended: list[tuple[str, bool]] = []

    def run(projection: Handle, events: RunEvents) -> None:
        started.append((projection.name, events.counted.is_set()))
        assert events.stop.wait(BOUND)
        ended.append((projection.name, events.commit.is_set()))

    live = PausableProjector(run, first)
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    time.sleep(0.1)
    standby = live.standby(second, threading.Event())
    time.sleep(0.1)
    assert started == [("first", True), ("second", False)]  # beside the live run, counting nothing yet
    assert live.pause(BOUND)
    assert live.wait_left(BOUND)
    assert ended == [("first", True)] and not standby.ended
    live.resume(second, standby)
    time.sleep(0.3)
    assert started == [("first", True), ("second", False)]  # nothing started: the standby is the live run
    assert live.projection is second and loop.is_alive()
    stop.set()  # the service's stop reaches the run handed over
    loop.join(BOUND)
    assert not loop.is_alive() and standby.ended
    assert ended == [("first", True), ("second", False)]


def test_a_pause_is_over_once_the_runs_gate_closed_and_the_old_file_is_left_once_it_released() -> None:
    polling, committing, closing = threading.Event(), threading.Event(), threading.Event()
    started: list[str] = []
    admitted: list[bool] = []

    def run(projection: Handle, events: RunEvents) -> None:
        started.append(projection.name)
        polling.wait(BOUND)  # a fetch in flight: the loop notices its stop only when it returns
        with events.gate.admitting() as open_:
            admitted.append(open_)  # the poll it returned with: dropped, what readers saw is final
        assert events.stop.wait(BOUND)
        committing.wait(BOUND)  # committing what it staged, slowly
        events.released.set()  # the projection is left alone from here
        closing.wait(BOUND)  # closing its own fetch worker and log clients, slowly

    live = PausableProjector(run, Handle("first"))
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    time.sleep(0.1)
    paused_at = time.monotonic()
    assert live.pause(BOUND)
    assert time.monotonic() - paused_at < BOUND / 2 and loop.is_alive()  # nor for its fetch, nor its commit
    polling.set()
    assert not live.wait_left(0.1)  # still committing: the old file must stay open
    assert admitted == [False]
    committing.set()
    assert live.wait_left(BOUND) and loop.is_alive()  # left, though still closing its clients
    live.resume()  # a switch attempt that failed: the live run starts again, once the last one returned
    time.sleep(0.2)
    assert started == ["first"]
    closing.set()
    deadline = time.monotonic() + BOUND
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == ["first", "first"] and loop.is_alive()
    stop.set()
    loop.join(BOUND)
    assert not loop.is_alive()


def test_the_old_run_failing_after_the_switch_is_not_the_live_projectors_failure() -> None:
    def run(projection: Handle, events: RunEvents) -> None:
        assert events.stop.wait(BOUND)
        if projection.name == "first":
            time.sleep(0.2)  # its last commit to the old file, which fails after the switch
            raise RuntimeError("the old file's disk is full")

    second = Handle("second")
    live = PausableProjector(run, Handle("first"))
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    time.sleep(0.1)
    standby = live.standby(second, threading.Event())
    assert live.pause(BOUND)
    live.resume(second, standby)
    assert live.wait_left(BOUND)
    time.sleep(0.2)
    assert loop.is_alive() and not standby.ended  # the loop follows the run handed over
    stop.set()
    loop.join(BOUND)
    assert not loop.is_alive() and standby.ended


def test_a_retired_projection_wakes_its_waits_and_refuses_reads_until_it_closes(tmp_path: Path) -> None:
    from throughline.projector.exceptions import ProjectionMissingError
    from throughline.projector.store import DuckProjection

    path = tmp_path / "p.duckdb"
    projection = DuckProjection.open(path, topic="t")
    waiter, answer = _thread(lambda: projection.wait_applied(0, 10, BOUND))
    time.sleep(0.1)
    waited = time.monotonic()
    projection.retire()
    waiter.join(BOUND)
    assert answer == [False] and time.monotonic() - waited < BOUND / 2
    with pytest.raises(ProjectionMissingError):
        with projection.view():
            pass
    projection.close()  # still closes the file after a retire
    DuckProjection.open(path, topic="t").close()  # DuckDB's lock on the file is gone


def test_a_discarded_projection_closes_without_writing_its_wal_into_the_file(tmp_path: Path) -> None:
    from throughline.projector.store import DuckProjection, wal_path

    closed, discarded = tmp_path / "closed.duckdb", tmp_path / "discarded.duckdb"
    DuckProjection.open(closed, topic="t").close()
    projection = DuckProjection.open(discarded, topic="t")  # its schema, committed: in its WAL
    wal = wal_path(discarded).stat().st_size
    projection.discard()
    assert not wal_path(closed).exists()  # checkpointed as it closed
    assert wal_path(discarded).stat().st_size == wal > 0  # the old file of a switch: removed next, as it is
    with DuckProjection.open(discarded, topic="t") as reopened:  # still a consistent file (its WAL replayed)
        assert reopened.topic == "t"


def test_the_failure_of_a_run_handed_over_is_the_live_projectors() -> None:
    fail = threading.Event()

    def run(projection: Handle, events: RunEvents) -> None:
        for _ in range(1000):
            if events.stop.wait(0.01):
                return
            if not events.counted.is_set() and fail.is_set():
                raise RuntimeError("the broker went away")

    second = Handle("second")
    live = PausableProjector(run, Handle("first"))
    loop, answer = _thread(lambda: _raised(lambda: live(threading.Event())))
    standby = live.standby(second, threading.Event())
    assert live.pause(BOUND)
    live.resume(second, standby)
    fail.set()
    loop.join(BOUND)
    assert not loop.is_alive() and answer == ["the broker went away"]


def _raised(call: Callable[[], object]) -> str | None:
    try:
        call()
    except RuntimeError as exc:
        return str(exc)
    return None


def test_a_run_handed_over_after_the_service_stopped_is_stopped() -> None:
    def run(projection: Handle, events: RunEvents) -> None:
        events.stop.wait(BOUND)

    live = PausableProjector(run, Handle("first"))
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    service_stopping = threading.Event()
    standby = live.standby(Handle("second"), service_stopping)
    assert live.pause(BOUND)
    stop.set()
    loop.join(BOUND)
    assert not loop.is_alive() and not standby.ended
    live.resume(Handle("second"), standby)  # nobody would follow it: stopped at once
    assert standby.ended
    other = live.standby(Handle("third"), service_stopping)
    service_stopping.set()  # a run nobody took over ends with the service
    deadline = time.monotonic() + BOUND
    while not other.ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert other.ended


def test_a_run_thread_says_why_it_ended() -> None:
    asked = RunThread(lambda events: events.stop.wait(BOUND), name="t")
    asked.start()
    asked.stop(BOUND)
    asked.raise_failure()  # asked to stop: nothing to say
    unasked = RunThread(lambda events: None, name="t")
    unasked.start()
    unasked.wait()
    with pytest.raises(Exception, match="stopped without being asked"):
        unasked.raise_failure()


# ------------------------------------------------------------------ Rebuild


class CappedHandle(Handle):
    """A new file that never gets past offset ``cap`` (its projector is stuck behind the live one)."""

    cap = 1

    def advance(self, partition: int, offset: int) -> None:
        super().advance(partition, min(offset, self.cap))


class ThreadReplay:
    """The rebuild's replay in memory: ``project`` over ``handle`` on a thread (``ReplayProcess``'s part)."""

    def __init__(self, handle: Handle, project: Callable[[Handle, threading.Event], object]) -> None:
        self.handle = handle
        self._runner = RunThread(lambda events: project(handle, events.stop), name="replay")

    def start(self) -> None:
        self._runner.start()

    def offsets(self) -> dict[int, int]:
        return self.handle.applied_offsets()

    def raise_failure(self) -> None:
        self._runner.raise_failure()

    def stop(self, timeout: float) -> None:
        self._runner.stop(timeout)


def _rebuild(
    tmp_path: Path,
    live_handle: Handle,
    project: Callable[[Handle, threading.Event], object],
    *,
    new_handle: Callable[[], Handle] = lambda: Handle("new"),
    standby_fails: bool = False,
) -> tuple[
    Rebuild[Any],
    SwitchableProjection[Any],
    PausableProjector[Any],
    list[Handle],
    RebuildFiles,
    list[tuple[str, threading.Event]],
]:
    db = tmp_path / "p.duckdb"
    db.write_bytes(b"old")
    (tmp_path / "p.duckdb.wal").write_bytes(b"old wal")
    files = RebuildFiles(db)
    reads = SwitchableProjection(live_handle)

    def run_live(projection: Handle, events: RunEvents) -> None:
        runs.append((projection.name, events.counted))
        if standby_fails and not events.counted.is_set():
            raise RuntimeError("the new file's live run lost the log")
        events.started.set()
        for _ in range(10_000):
            if events.stop.wait(0.01):
                return
            with events.gate.admitting() as admitted:
                if admitted:
                    projection.advance(0, projection.applied.get(0, 0) + 1)

    runs: list[tuple[str, threading.Event]] = []  # every live run (its file, its ``counted``), in order
    live = PausableProjector(run_live, live_handle)
    opened: list[Handle] = []

    def replay(path: Path) -> ThreadReplay:
        Path(path).write_bytes(b"new")
        opened.append(new_handle())
        return ThreadReplay(opened[-1], project)

    def open_new(path: Path) -> Handle:
        assert Path(path).read_bytes() == b"new"
        return opened[-1]  # the file the replay wrote

    settings = RebuildSettings(close_enough=5, switch_timeout=5.0, drain_timeout=5.0, attempts=2, poll=0.01)
    rebuild = Rebuild(
        files=files,
        reads=reads,
        live=live,
        open_new=open_new,
        replay=replay,
        stopping=threading.Event(),
        settings=settings,
    )
    return rebuild, reads, live, opened, files, runs


def test_a_rebuild_catches_up_pauses_switches_and_resumes_on_the_new_file(tmp_path: Path) -> None:
    old = Handle("old", {0: 50})

    def replay(projection: Handle, stop: threading.Event) -> None:
        for _ in range(100_000):  # faster than the live projector: it catches up
            if stop.wait(0.001):
                return
            projection.advance(0, projection.applied.get(0, 0) + 5)

    rebuild, reads, live, opened, files, runs = _rebuild(tmp_path, old, replay)
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    try:
        rebuild.start()
        assert rebuild.join(BOUND)
        status = rebuild.status()
        assert status.phase == "switched", status
        new = opened[0]
        assert reads.current is new and live.projection is new and old.closed and not new.closed
        assert new.checkpoints == 1  # as its replay handed over; not after the switch (reads wait for one)
        # One run on the new file: the one started before the pause, counting from the switch on.
        assert [name for name, _ in runs] == ["old", "new"]
        assert runs[1][1].is_set()
        assert all(new.applied[p] >= o for p, o in status.live.items())
        assert files.switched() and files.rebuilt.read_bytes() == b"new"
        assert not files.db.exists() and not (tmp_path / "p.duckdb.wal").exists()  # the old file went
        before = new.applied[0]
        time.sleep(0.2)
        assert new.applied[0] > before  # the live projector goes on, on the new file
        with pytest.raises(Exception, match="switched to a rebuilt file already"):
            rebuild.start()
    finally:
        stop.set()
        loop.join(BOUND)
    files.finish(lambda path: None)
    assert files.db.read_bytes() == b"new" and not files.rebuilt.exists() and not files.switched()


def test_a_failed_rebuild_leaves_the_live_file_serving_and_removes_the_new_one(tmp_path: Path) -> None:
    old = Handle("old", {0: 50})

    def broken(projection: Handle, stop: threading.Event) -> None:
        raise RuntimeError("the log went away")

    rebuild, reads, live, opened, files, _ = _rebuild(tmp_path, old, broken)
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    try:
        rebuild.start()
        assert rebuild.join(BOUND)
        status = rebuild.status()
        assert status.phase == "failed" and "the log went away" in (status.error or "")
        assert reads.current is old and not old.closed
        assert not files.rebuilt.exists() and not files.switched() and files.db.read_bytes() == b"old"
        before = old.applied[0]
        time.sleep(0.2)
        assert old.applied[0] > before  # never paused for good
    finally:
        stop.set()
        loop.join(BOUND)


def test_a_rebuild_that_cannot_reach_the_live_file_during_the_pause_gives_up(tmp_path: Path) -> None:
    old = Handle("old", {0: 3})

    def stuck(projection: Handle, stop: threading.Event) -> None:
        projection.advance(0, 1)  # within close_enough, never at the live offsets
        stop.wait(BOUND)

    rebuild, reads, live, _, files, runs = _rebuild(tmp_path, old, stuck, new_handle=lambda: CappedHandle("new"))
    rebuild._settings = RebuildSettings(close_enough=10**9, switch_timeout=0.2, attempts=2, poll=0.01)
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    try:
        rebuild.start()
        assert rebuild.join(BOUND)
        status = rebuild.status()
        assert status.phase == "failed" and status.attempts == 2 and "did not reach" in (status.error or "")
        assert reads.current is old and not files.rebuilt.exists()
        # One run on the new file, kept across the attempts and stopped at the end; the live one resumed.
        assert [name for name, _ in runs].count("new") == 1 and live.projection is old
        before = old.applied[0]
        time.sleep(0.2)
        assert old.applied[0] > before
    finally:
        stop.set()
        loop.join(BOUND)


def test_a_rebuild_whose_new_live_run_fails_leaves_the_live_file_serving(tmp_path: Path) -> None:
    old = Handle("old", {0: 50})

    def replay(projection: Handle, stop: threading.Event) -> None:
        for _ in range(100_000):
            if stop.wait(0.001):
                return
            projection.advance(0, projection.applied.get(0, 0) + 5)

    rebuild, reads, live, opened, files, runs = _rebuild(tmp_path, old, replay, standby_fails=True)
    stop = threading.Event()
    loop, _ = _thread(lambda: live(stop))
    try:
        rebuild.start()
        assert rebuild.join(BOUND)
        status = rebuild.status()
        assert status.phase == "failed" and "lost the log" in (status.error or ""), status
        assert reads.current is old and live.projection is old and not old.closed and opened[0].closed
        assert not files.rebuilt.exists() and not files.switched() and files.db.read_bytes() == b"old"
        assert [name for name, _ in runs] == ["old", "new"]  # never paused: the live run is the first one
        before = old.applied[0]
        time.sleep(0.2)
        assert old.applied[0] > before
    finally:
        stop.set()
        loop.join(BOUND)


# ------------------------------------------------------------------ RebuildFiles after a crash


def test_a_start_removes_a_rebuild_that_never_switched(tmp_path: Path) -> None:
    files = RebuildFiles(tmp_path / "p.duckdb")
    files.db.write_bytes(b"old")
    files.rebuilt.write_bytes(b"half")
    Path(str(files.rebuilt) + ".wal").write_bytes(b"half wal")
    settled: list[Path] = []
    files.recover(settled.append)
    assert files.db.read_bytes() == b"old" and not files.rebuilt.exists() and settled == [files.rebuilt]
    assert not Path(str(files.rebuilt) + ".wal").exists()


def test_a_start_removes_nothing_another_process_holds(tmp_path: Path) -> None:
    files = RebuildFiles(tmp_path / "p.duckdb")
    files.db.write_bytes(b"old")
    files.rebuilt.write_bytes(b"being rebuilt by another serve")

    def busy(path: Path) -> None:
        raise ProjectionBusyError(f"{path} is held")

    with pytest.raises(ProjectionBusyError):
        files.recover(busy)
    assert files.rebuilt.exists() and files.db.exists()
    files.mark_switched()
    with pytest.raises(ProjectionBusyError):
        files.recover(busy)
    assert files.rebuilt.exists() and files.db.exists() and files.switched()


@pytest.mark.parametrize("step", ["switched", "old removed", "renamed"])
def test_a_start_finishes_a_switched_rebuild_whatever_step_the_crash_stopped_at(tmp_path: Path, step: str) -> None:
    files = RebuildFiles(tmp_path / "p.duckdb")
    files.db.write_bytes(b"old")
    Path(str(files.db) + ".wal").write_bytes(b"old wal")
    files.rebuilt.write_bytes(b"new")
    files.mark_switched()
    if step in ("old removed", "renamed"):
        files.remove_old()
    if step == "renamed":
        files.rebuilt.replace(files.db)
    settled: list[Path] = []
    files.recover(settled.append)
    assert files.db.read_bytes() == b"new"
    assert not Path(str(files.db) + ".wal").exists() and not files.rebuilt.exists() and not files.switched()
    assert settled == ([] if step == "renamed" else [files.rebuilt])
