"""The read index: what a view answers from memory is the state of its own snapshot's version.

``ReadIndex`` on its own (versions, learning only at the current version, eviction), then the DuckDB
projection with a writer thread committing while views are read: every answer a view takes from the
index must equal the answer its own DuckDB snapshot gives (``DuckView`` without the index, on the same
transaction), including while entries are evicted and learnt again.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from projector_histories import place, to_log, turn

from throughline.core.layers import Layer, LayeredView
from throughline.core.memory import FixedLog
from throughline.projector.read_index import MISSING, ChainHead, ReadIndex
from throughline.projector.read_state import ReadState
from throughline.projector.store import DuckProjection, DuckView, LogRecord
from throughline.projector.store.view import Overtaken
from throughline.reader import read_observer_turn_page

TOPIC = "read-index"


def _chain(length: int) -> ChainHead:
    return ChainHead(b"p" * 32, length, bytes(32), 0, length - 1, None)


def test_the_read_state_publishes_an_immutable_snapshot_at_each_stage_and_commit() -> None:
    """A read takes ``ReadState.snapshot`` once and answers from it: a later stage or commit publishes a new
    value and leaves the one taken as it was (read-only mappings, tuples, a frozen dataclass)."""
    state = ReadState({0: 3})
    taken = state.snapshot
    assert (taken.version, dict(taken.applied), taken.layers, dict(taken.readable), taken.quiet) == (
        3,
        {0: 3},
        (),
        {0: 3},
        True,
    )
    layer = Layer(1, {}, {b"p": b"s"}, {0: 5})  # moves project p's head
    assert state.stage(layer, state.epoch)
    staged = state.snapshot
    assert staged is not taken and staged.layers == (layer,) and dict(staged.readable) == {0: 5}
    assert staged.version == 3 and state.project_changes(b"p") == 1
    state.writing()
    assert not state.snapshot.quiet and staged.quiet  # a COMMIT under way: no quiet read from now
    assert state.commit({0: 5}, {b"p": b"s"}, {b"s": _chain(2)}, [b"p"]) == (layer,)
    committed = state.snapshot
    assert (committed.version, dict(committed.applied), committed.layers, committed.quiet) == (5, {0: 5}, (), True)
    assert state.project_changes(b"p") == 1  # the stage already counted (and woke) the project
    assert (taken.version, dict(taken.applied), taken.layers) == (3, {0: 3}, ())  # what a read took is unchanged
    with pytest.raises(TypeError):
        committed.applied[0] = 9  # type: ignore[index]
    with pytest.raises(AttributeError):
        committed.version = 9  # type: ignore[misc]


def test_an_entry_serves_views_of_its_version_and_later_ones_only() -> None:
    index = ReadIndex({0: 3})
    assert index.state()[1:4] == (3, {0: 3}, ())
    index.publish({0: 5}, {b"a": b"s1"}, {b"s1": _chain(2)})
    _, version, applied, _, _ = index.state()
    assert (version, applied) == (5, {0: 5})
    assert index.head(b"a", 5) == b"s1" and index.chain(b"s1", 7) == _chain(2)
    assert index.head(b"a", 4) is MISSING  # a view of an older snapshot reads that snapshot
    assert index.chain(b"s1", 3) is MISSING
    assert index.head(b"b", 5) is MISSING


def test_a_snapshot_read_is_learnt_only_at_the_current_version() -> None:
    index = ReadIndex({0: 1, 1: 1})
    index.learn_head(b"a", None, 2)  # the project has no turns yet, as of version 2
    assert index.head(b"a", 2) is None
    index.publish({1: 4}, {}, {})  # version 5
    index.learn_chain(b"s", _chain(1), 2)  # read from a snapshot older than the index: not kept
    assert index.chain(b"s", 5) is MISSING
    index.learn_chain(b"s", _chain(1), 5)
    assert index.chain(b"s", 5) == _chain(1)
    index.publish({0: 2}, {b"a": b"s"}, {b"s": _chain(2)})  # a commit overwrites what was learnt
    assert index.head(b"a", 6) == b"s" and index.chain(b"s", 6) == _chain(2)


def test_the_least_recently_used_entries_are_dropped() -> None:
    index = ReadIndex({}, capacity=2)
    index.publish({0: 1}, {b"a": b"1", b"b": b"2"}, {})
    assert index.head(b"a", 1) == b"1"  # used: b is now the oldest
    index.publish({0: 2}, {b"c": b"3"}, {})
    assert index.head(b"b", 2) is MISSING
    assert index.head(b"a", 2) == b"1" and index.head(b"c", 2) == b"3"


@contextmanager
def committing(projection: DuckProjection, log: list[LogRecord]) -> Iterator[threading.Event]:
    """A writer thread applying ``log`` one record a commit; the event is set when it is done. Closes the
    projection at the end."""
    done = threading.Event()

    def write() -> None:
        try:
            for rec in log:
                projection.apply_batch(TOPIC, rec.partition, [rec])
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield done
    finally:
        writer.join(timeout=120)
        projection.close()


def test_every_answer_of_a_view_is_its_snapshots_while_commits_go_on(tmp_path: Path) -> None:
    rng = random.Random(5)
    records = []
    for i in range(240):
        project = ("/p/one", "/p/two", "/p/three")[rng.randrange(3)]
        thread = ("main", "side")[rng.randrange(2)]
        seq = rng.randint(1, 3) if rng.random() < 0.1 else None  # a rewind now and then
        records.append(turn(project, thread=thread, turn_id=f"t{i}", seq=seq, body=f"b{i}"))
    log = to_log(place(records, 2))
    projects = sorted({r.project_sha256 for r in records})
    sources = sorted({r.source_sha256 for r in records})
    # Two entries per map: most answers miss, are read from the snapshot and learnt, then evicted.
    projection = DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC, read_entries=2)
    checked = 0
    with committing(projection, log) as done:
        while not done.is_set() or checked < 50:
            with projection.view() as view:
                strict = DuckView(view._cur, TOPIC)  # the same transaction, read without the index
                for project in rng.sample(projects, len(projects)):
                    assert view.head(project) == strict.head(project)
                for source in rng.sample(sources, 3):
                    assert view.source(source) == strict.source(source)
                for partition in (0, 1):
                    assert view.applied_offset(partition) == strict.applied_offset(partition)
            checked += 1
    assert checked >= 50


def test_a_quiet_read_holds_only_while_no_write_begins_or_ends() -> None:
    state = ReadState({0: 3})
    quiet = state.snapshot
    assert quiet.quiet and (quiet.version, dict(quiet.applied), quiet.layers) == (3, {0: 3}, ())
    state.writing()
    moved = state.snapshot
    assert not moved.quiet and moved.generation != quiet.generation  # a write under way: no quiet read
    state.commit({0: 4}, {}, {}, [])
    again = state.snapshot
    assert again.quiet and again.version == 4 and again.generation != quiet.generation
    state.writing()
    state.settle(4)  # a failed write that left the file at the index's version
    after = state.snapshot
    assert after.quiet and after.generation != again.generation and after.version == 4
    state.writing()
    state.settle(5)  # a failed write that may have committed: the index is no longer to be trusted quietly
    assert not state.snapshot.quiet
    state.writing()
    state.commit({0: 6}, {}, {}, [])
    assert not state.snapshot.quiet


def _projected(tmp_path: Path) -> tuple[DuckProjection, list, bytes, bytes]:
    records = [turn("/p/one", turn_id=f"t{i}", body=f"b{i}") for i in range(5)]
    log = to_log(place(records, 1))
    projection = DuckProjection.open(tmp_path / "q.duckdb", topic=TOPIC)
    projection.apply_batch(TOPIC, 0, log[:4])
    return projection, log, records[0].project_sha256, records[0].source_sha256


def test_a_quiet_view_answers_as_a_snapshot_does(tmp_path: Path) -> None:
    projection, _log, project, source = _projected(tmp_path)
    try:
        with projection._quiet_view() as quiet, projection.view() as strict:
            assert quiet.head(project) == strict.head(project)
            assert quiet.source(source) == strict.source(source)
            assert quiet.applied_offset(0) == strict.applied_offset(0) == 4
            assert quiet.turns(source, 1, 4) == strict.turns(source, 1, 4)
            assert len(quiet.turns(source, 1, 4)) == 4
    finally:
        projection.close()


def test_a_quiet_view_that_a_commit_overtakes_says_so(tmp_path: Path) -> None:
    projection, log, project, source = _projected(tmp_path)
    try:
        with projection._quiet_view() as quiet:
            head = quiet.head(project)
            assert head is not None and head.length == 4
            projection.apply_batch(TOPIC, 0, log[4:])  # lands between the view's answers
            with pytest.raises(Overtaken):
                quiet.turns(source, 1, 4)
        with projection._quiet_view() as quiet:  # the next quiet view is of the new version
            assert quiet.turns(source, 1, 5)[-1].seq == 5
    finally:
        projection.close()


def test_a_quiet_view_holds_beside_an_open_write_and_not_across_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer announces its write just before COMMIT: until then its rows are invisible to other
    cursors, so a quiet view beside the open transaction reads the published version exactly; one
    whose statement comes after the COMMIT is overtaken and says so."""
    from throughline.projector.store import transaction

    projection, log, project, source = _projected(tmp_path)
    folded, resume = threading.Event(), threading.Event()
    fold = transaction.ApplyTransaction.fold_and_write

    def paused(self: transaction.ApplyTransaction) -> object:
        summary = fold(self)  # every row of the batch written, not committed
        folded.set()
        assert resume.wait(10)
        return summary

    monkeypatch.setattr(transaction.ApplyTransaction, "fold_and_write", paused)
    writer = threading.Thread(target=projection.apply_batch, args=(TOPIC, 0, log[4:]))
    try:
        writer.start()
        assert folded.wait(10)
        with projection._quiet_view() as quiet:
            assert quiet._check is not None  # the quiet path, not a snapshot
            head = quiet.head(project)
            assert head is not None and head.length == 4 and quiet.applied_offset(0) == 4
            assert [t.seq for t in quiet.turns(source, 1, 5)] == [1, 2, 3, 4]  # not the uncommitted 5
        with projection._quiet_view() as overtaken:
            assert overtaken.head(project) is not None
            resume.set()
            writer.join(10)
            with pytest.raises(Overtaken):
                overtaken.turns(source, 1, 5)
        with projection._quiet_view() as after:
            assert [t.seq for t in after.turns(source, 1, 5)] == [1, 2, 3, 4, 5]
    finally:
        resume.set()
        writer.join(10)
        projection.close()


def test_a_quiet_view_is_a_snapshot_while_a_write_is_under_way(tmp_path: Path) -> None:
    projection, _log, project, _source = _projected(tmp_path)
    try:
        projection._reads.writing()  # as the writer does just before its COMMIT
        with projection._quiet_view() as view:
            assert view._check is None  # the snapshot view (BEGIN ... ROLLBACK), never raises
            assert view.head(project) is not None
    finally:
        projection.close()


@pytest.mark.parametrize(
    ("overtaking", "calls_made", "seqs"),
    [
        (1, ["quiet", "quiet"], [1, 2, 3, 4, 5]),  # the second quiet view reads the published commit
        (2, ["quiet", "quiet", "snapshot"], [1, 2, 3, 4, 5, 6]),  # commits keep landing: a snapshot
    ],
)
def test_a_read_that_commits_overtake_is_read_again_quiet_then_in_a_snapshot(
    tmp_path: Path, overtaking: int, calls_made: list[str], seqs: list[int]
) -> None:
    projection, _log, _project, _source = _projected(tmp_path)
    log = to_log(
        place([turn("/p/one", turn_id=f"t{i}", body=f"b{i}") for i in range(6)], 1)
    )  # _projected's, and one more
    commits = iter(log[4 : 4 + overtaking])
    calls: list[str] = []

    quiet, snapshot = projection._quiet_view, projection.view

    @contextmanager
    def overtaken_quiet_view() -> Iterator[DuckView | LayeredView]:
        """A commit lands inside the reader's first ``overtaking`` quiet views."""
        calls.append("quiet")
        with quiet() as view:
            record = next(commits, None)
            if record is not None:
                projection.apply_batch(TOPIC, 0, [record])
            yield view

    def counted_view() -> AbstractContextManager[DuckView | LayeredView]:
        calls.append("snapshot")
        return snapshot()

    projection._quiet_view = overtaken_quiet_view  # type: ignore[method-assign]
    projection.view = counted_view  # type: ignore[method-assign]
    try:
        page = read_observer_turn_page(
            project="/p/one",
            limit=10,
            projection=projection,
            log=FixedLog(partitions=1, ends={0: 4}),
            token_key=b"k" * 32,
            wait_timeout=0.0,
        )
        assert calls == calls_made
        assert page.status == "ok" and [t.seq for t in page.turns] == seqs
    finally:
        projection.close()


def test_a_quiet_view_that_answers_is_of_one_version_while_commits_go_on(tmp_path: Path) -> None:
    # Rewinds replace rows under their seqs: a head of one version with rows of another would show as a
    # chain that does not end at the head's digest, or as missing seqs.
    rng = random.Random(9)
    records = []
    for i in range(200):
        seq = rng.randint(1, 4) if rng.random() < 0.15 else None
        records.append(turn(("/p/one", "/p/two")[rng.randrange(2)], turn_id=f"t{i}", seq=seq, body=f"b{i}"))
    log = to_log(place(records, 1))
    projects = sorted({r.project_sha256 for r in records})
    projection = DuckProjection.open(tmp_path / "c.duckdb", topic=TOPIC, read_entries=1)
    answered = 0
    with committing(projection, log) as done:
        while not done.is_set() or answered < 30:
            try:
                with projection._quiet_view() as view:
                    head = view.head(rng.choice(projects))
                    if head is None:
                        continue
                    rows = view.turns(head.source_sha256, 1, head.length)
            except Overtaken:
                continue
            assert [r.seq for r in rows] == list(range(1, head.length + 1))
            assert rows[-1].chain_digest == head.chain_digest
            assert (rows[-1].partition, rows[-1].offset) == (head.partition, head.offset)
            answered += 1
    assert answered >= 30
