"""The reference Observer over the in-memory projection (docs/spec.md#observer)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from reader_world import KEY, PROJECT, World
from support.cursor import cursor_length

from throughline.errors import ThroughlineError
from throughline.projector.exceptions import ProjectionBusyError, ProjectionStorageError
from throughline.reader import (
    OBSERVER_STATE_SCHEMA,
    Observer,
    ObserverInterrupted,
    ObserverProtocolError,
    ObserverRead,
    ObserverStateError,
    ObserverStateWriteError,
    ProjectionPendingError,
    ResyncRequiredError,
    SeriesOutcome,
    TurnRecordWire,
    load_observer_state,
    read_observer_turn_page,
    save_observer_state,
)


class FakeTime:
    """A clock that only moves when the Observer sleeps; ``on_sleep`` runs at each sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep: Any = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


class Audit:
    """Records audited turns; can fail at the n-th turn."""

    def __init__(self, fail_at: int | None = None, exc: BaseException | None = None) -> None:
        self.turns: list[TurnRecordWire] = []
        self.fail_at = fail_at
        self.exc = exc or RuntimeError("audit refused")
        self.calls = 0

    def __call__(self, turn: TurnRecordWire) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise self.exc
        self.turns.append(turn)

    @property
    def bodies(self) -> list[str]:
        return [t.body for t in self.turns]


def _observer(world: World, state: Path, audit: Any, time: FakeTime | None = None, **kwargs: Any) -> Observer:
    time = time or FakeTime()
    reader = functools.partial(
        read_observer_turn_page, projection=world.projection, log=world.log, token_key=KEY, wait_timeout=0.0
    )
    return Observer(
        reader, project=PROJECT, state_path=state, audit=audit, sleep=time.sleep, clock=time.clock, **kwargs
    )


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "observer.json"


def test_first_series_is_a_snapshot_and_saves_its_through(world: World, state: Path) -> None:
    world.append_many(15)
    audit = Audit()
    summary = _observer(world, state, audit, limit=5).run_series()
    assert summary.kind is SeriesOutcome.SNAPSHOT and summary.history_truncated
    assert summary.turns_audited == 5 and summary.pages == 1 and summary.saved
    assert [t.seq for t in audit.turns] == [11, 12, 13, 14, 15]
    doc = json.loads(state.read_text())
    assert doc == {"schema": OBSERVER_STATE_SCHEMA, "afterCursor": summary.through_cursor}
    assert cursor_length(load_observer_state(state)) == 15
    assert "history truncated" in summary.describe() and "new cursor saved" in summary.describe()


def test_delta_series_audits_every_page_then_saves(world: World, state: Path) -> None:
    world.append_many(3)
    audit = Audit()
    observer = _observer(world, state, audit, limit=4)
    observer.run_series()
    world.append_many(13)
    summary = observer.run_series()
    assert summary.kind is SeriesOutcome.DELTA and summary.pages == 4 and summary.turns_audited == 13
    assert [t.seq for t in audit.turns] == list(range(1, 17))
    assert cursor_length(observer.after_cursor) == 16


def test_switch_series_reads_the_new_thread_from_zero(world: World, state: Path) -> None:
    world.append_many(3)
    audit = Audit()
    observer = _observer(world, state, audit)
    observer.run_series()
    world.append_many(2, thread="thread-other")
    summary = observer.run_series()
    assert summary.kind is SeriesOutcome.SWITCH and [t.seq for t in audit.turns[3:]] == [1, 2]


def test_empty_project_saves_nothing(world: World, state: Path) -> None:
    summary = _observer(world, state, Audit()).run_series()
    assert summary.kind is SeriesOutcome.EMPTY and not summary.saved and not state.exists()


def test_empty_delta_does_not_rewrite_the_state(world: World, state: Path) -> None:
    world.append_many(2)
    observer = _observer(world, state, Audit())
    observer.run_series()
    before = state.stat().st_mtime_ns
    summary = observer.run_series()
    assert summary.kind is SeriesOutcome.DELTA and summary.turns_audited == 0 and not summary.saved
    assert state.stat().st_mtime_ns == before


def test_turns_completed_mid_series_wait_for_the_next_series(world: World, state: Path) -> None:
    world.append()
    audit = Audit()
    observer = _observer(world, state, audit, limit=3)
    observer.run_series()
    world.append_many(9)

    def audit_and_append(turn: TurnRecordWire) -> None:
        audit(turn)
        world.append()

    observer.audit = audit_and_append
    first = observer.run_series()
    assert first.turns_audited == 9 and cursor_length(first.through_cursor) == 10
    observer.audit = audit
    second = observer.run_series()
    assert second.turns_audited == 9
    assert [t.seq for t in audit.turns] == list(range(1, 20))  # no gap, no duplicate


@pytest.mark.parametrize("fail_at", [1, 4, 9])
def test_a_failed_audit_keeps_the_old_cursor_and_the_next_run_resumes(world: World, state: Path, fail_at: int) -> None:
    world.append_many(2)
    good = Audit()
    _observer(world, state, good, limit=4).run_series()
    saved = load_observer_state(state)
    world.append_many(10)
    failing = Audit(fail_at=fail_at)
    with pytest.raises(RuntimeError):
        _observer(world, state, failing, limit=4).run_series()
    assert load_observer_state(state) == saved
    retry = Audit()
    summary = _observer(world, state, retry, limit=4).run_series()
    assert [t.seq for t in retry.turns] == list(range(3, 13)) and summary.saved


def test_a_crash_mid_series_keeps_the_old_cursor(world: World, state: Path) -> None:
    world.append_many(2)
    _observer(world, state, Audit()).run_series()
    saved = state.read_bytes()
    world.append_many(30)
    with pytest.raises(KeyboardInterrupt):
        _observer(world, state, Audit(fail_at=15, exc=KeyboardInterrupt()), limit=10).run_series()
    assert state.read_bytes() == saved
    assert [p.name for p in state.parent.iterdir()] == [state.name]  # no temp file left behind


def test_pending_backs_off_and_retries_the_same_page(world: World, state: Path) -> None:
    world.append_many(3)
    world.append_many(2, apply=False)
    time = FakeTime()
    time.on_sleep = lambda: len(time.sleeps) == 3 and world.project()
    audit = Audit()
    summary = _observer(world, state, audit, time, pending_backoff=0.1, pending_backoff_max=0.3).run_series()
    assert [t.seq for t in audit.turns] == [1, 2, 3, 4, 5]
    assert time.sleeps == [0.1, 0.2, 0.3] and summary.pending_retries == 3 and summary.saved


def test_pending_on_a_later_page_retries_that_page(world: World, state: Path) -> None:
    world.append()
    observer = _observer(world, state, Audit(), limit=2)
    observer.run_series()
    world.append_many(6)
    calls: list[dict[str, Any]] = []
    inner = observer.read_page

    def flaky(**kwargs: Any) -> ObserverRead:
        calls.append(kwargs)
        read = inner(**kwargs)
        if kwargs["page_token"] is not None and len(calls) == 2:
            return ObserverRead(
                status="projection_pending",
                thread=None,
                afterCursor=kwargs["after_cursor"],
                throughCursor=kwargs["through_cursor"],
                turns=(),
                historyTruncated=False,
                page={"complete": False, "nextToken": None},
            )
        return read

    observer.read_page = flaky
    audit = Audit()
    observer.audit = audit
    observer.run_series()
    assert calls[1]["page_token"] == calls[2]["page_token"] is not None
    assert [t.seq for t in audit.turns] == [2, 3, 4, 5, 6, 7]


def test_pending_gives_up_after_the_bounded_wait(world: World, state: Path) -> None:
    world.append_many(3)
    _observer(world, state, Audit()).run_series()
    saved = load_observer_state(state)
    world.append_many(2, apply=False)
    time = FakeTime()
    with pytest.raises(ProjectionPendingError) as info:
        _observer(world, state, Audit(), time, max_pending_wait=5.0, pending_backoff=0.5).run_series()
    assert info.value.code == "projection_pending" and info.value.retriable and info.value.exit_code == 1
    assert load_observer_state(state) == saved
    assert 5.0 <= time.now <= 5.0 + 1e-9 and len(time.sleeps) < 20


def test_retriable_read_errors_back_off_like_pending(world: World, state: Path) -> None:
    world.append_many(2)
    observer = _observer(world, state, Audit())
    inner = observer.read_page
    failures = [ProjectionBusyError("busy")] * 2

    def busy(**kwargs: Any) -> ObserverRead:
        if failures:
            raise failures.pop()
        return inner(**kwargs)

    observer.read_page = busy
    assert observer.run_series().pending_retries == 2


def test_hard_read_errors_propagate(world: World, state: Path) -> None:
    world.append_many(2)
    observer = _observer(world, state, Audit())

    def broken(**kwargs: Any) -> ObserverRead:
        raise ProjectionStorageError("disk on fire")

    observer.read_page = broken
    with pytest.raises(ThroughlineError):
        observer.run_series()
    assert not state.exists()


def test_resync_snapshot_policy_discards_the_after_cursor_and_says_so(world: World, state: Path) -> None:
    world.append_many(8)
    _observer(world, state, Audit()).run_series()
    world.append(seq=4)  # rollback under the saved cursor
    world.append_many(2)
    messages: list[str] = []
    audit = Audit()
    summary = _observer(world, state, audit, limit=3, notify=messages.append).run_series()
    assert summary.resynced and summary.kind is SeriesOutcome.SNAPSHOT and summary.saved
    assert [t.seq for t in audit.turns] == [4, 5, 6] and summary.history_truncated
    assert any("discarding the saved after cursor" in m for m in messages)
    assert "resync" in summary.describe()
    assert cursor_length(load_observer_state(state)) == 6


def test_resync_fail_policy_keeps_the_old_cursor(world: World, state: Path) -> None:
    world.append_many(8)
    _observer(world, state, Audit()).run_series()
    saved = load_observer_state(state)
    world.append(seq=2)
    with pytest.raises(ResyncRequiredError) as info:
        _observer(world, state, Audit(), on_resync="fail").run_series()
    assert info.value.code == "resync_required" and info.value.exit_code == 1
    assert load_observer_state(state) == saved


def test_resync_mid_series_restarts_from_the_same_after_cursor(world: World, state: Path) -> None:
    world.append_many(2)
    _observer(world, state, Audit()).run_series()
    world.append_many(10)
    messages: list[str] = []
    audit = Audit()
    rolled: list[int] = []

    def audit_and_rollback(turn: TurnRecordWire) -> None:
        audit(turn)
        if turn.seq == 5 and not rolled:
            rolled.append(1)
            world.append(seq=9)  # rewinds under the pinned through (length 12) but above after (2)

    observer = _observer(world, state, audit_and_rollback, limit=3, notify=messages.append)
    summary = observer.run_series()
    assert any("restarting the series from the same after cursor" in m for m in messages)
    assert not summary.resynced and summary.kind is SeriesOutcome.DELTA
    assert cursor_length(load_observer_state(state)) == 9
    # The abandoned attempt audited 3..5 (uncommitted); the restart audits the whole new range once.
    assert [t.seq for t in audit.turns] == [3, 4, 5] + list(range(3, 10))


def test_should_stop_mid_series_abandons_it(world: World, state: Path) -> None:
    world.append_many(2)
    _observer(world, state, Audit()).run_series()
    saved = load_observer_state(state)
    world.append_many(10)
    audit = Audit()
    observer = _observer(world, state, audit, limit=3, should_stop=lambda: len(audit.turns) >= 4)
    with pytest.raises(ObserverInterrupted):
        observer.run_series()
    assert load_observer_state(state) == saved


def test_run_forever_runs_series_until_stopped(world: World, state: Path) -> None:
    world.append_many(2)
    time = FakeTime()
    audit = Audit()
    time.on_sleep = lambda: world.append() if len(time.sleeps) % 5 == 0 else None
    observer = _observer(world, state, audit, time)
    summaries = observer.run_forever(interval=0.5, max_series=4)
    assert len(summaries) == 4
    assert [t.seq for t in audit.turns] == list(range(1, len(audit.turns) + 1))
    assert cursor_length(load_observer_state(state)) == len(audit.turns)


def test_run_forever_stops_when_asked(world: World, state: Path) -> None:
    world.append_many(2)
    stop = {"now": False}
    time = FakeTime()
    time.on_sleep = lambda: stop.update(now=True)
    summaries = _observer(world, state, Audit(), time, should_stop=lambda: stop["now"]).run_forever(interval=10)
    assert len(summaries) == 1 and time.now < 10


def test_a_reader_that_changes_the_through_mid_series_is_refused(world: World, state: Path) -> None:
    world.append()
    observer = _observer(world, state, Audit(), limit=2)
    observer.run_series()
    world.append_many(6)
    inner = observer.read_page

    def liar(**kwargs: Any) -> ObserverRead:
        if kwargs["through_cursor"] is not None:
            world.append()
            kwargs = {**kwargs, "through_cursor": None, "page_token": None}
        return inner(**kwargs)

    observer.read_page = liar
    saved = load_observer_state(state)
    with pytest.raises(ObserverProtocolError):
        observer.run_series()
    assert load_observer_state(state) == saved


# ---------------------------------------------------------------------------------------------- state


def test_state_round_trip_and_durable_replace(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    assert load_observer_state(path) is None
    world = World()
    world.append()
    cursor = world.read().throughCursor
    save_observer_state(path, cursor)
    assert load_observer_state(path) == cursor
    save_observer_state(path, None)
    assert load_observer_state(path) is None
    assert sorted(os.listdir(tmp_path)) == ["s.json"]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[]",
        b'{"schema": "throughline.observer_state.v2", "afterCursor": null}',
        b'{"afterCursor": null}',
        b'{"schema": "throughline.observer_state.v1", "afterCursor": null, "x": 1}',
        b'{"schema": "throughline.observer_state.v1", "afterCursor": "garbage"}',
        b'{"schema": "throughline.observer_state.v1", "afterCursor": 5}',
    ],
)
def test_malformed_state_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(ObserverStateError) as info:
        load_observer_state(path)
    assert info.value.code == "invalid_observer_state"


def test_bad_policy_is_refused(world: World, state: Path) -> None:
    with pytest.raises(ThroughlineError):
        _observer(world, state, Audit(), on_resync="ignore")


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_an_interrupted_save_leaves_the_old_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException, step: str
) -> None:
    path = tmp_path / "s.json"
    world = World()
    world.append_many(2)
    old = world.read().throughCursor
    save_observer_state(path, old)
    before = path.read_bytes()
    world.append()
    new = world.read().throughCursor

    def boom(*args: Any) -> None:
        raise failure

    monkeypatch.setattr(os, step, boom)
    with pytest.raises((ObserverStateWriteError, KeyboardInterrupt)):
        save_observer_state(path, new)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["s.json"]
