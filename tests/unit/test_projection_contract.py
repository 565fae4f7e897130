"""The ``Projection`` contract the reader relies on, run against every implementation.

``ProjectionContract`` feeds the same placed records through each implementation's apply path and checks
its views against the reference fold (``ChainBook``): heads, sources, live turns, applied offsets,
broken marks, superseded turns never served, one snapshot per view, ``wait_applied``, and the
per-project change count a long-poll waits on (``project_changes``, ``wait_project_changed``).
Implementations: ``BookProjection`` (in memory, ``throughline.core.memory``) and ``DuckProjection`` (a real
DuckDB file).
"""

from __future__ import annotations

import abc
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projector_histories import PROJECTS, Placed, book_of, by_partition, histories, place, to_log, turn

from throughline.core.memory import BookProjection
from throughline.core.ports import Projection, cursor_of
from throughline.core.turn import TurnRecord
from throughline.projector.store import DuckProjection, PreparedBatch

TOPIC = "contract"


class Fed(abc.ABC):
    """A projection plus the way to feed it records (as its projector would)."""

    projection: Projection

    @abc.abstractmethod
    def feed(self, placed: Sequence[Placed]) -> None:
        """Apply records (in log order per partition) and advance the applied offsets."""


class BookFed(Fed):
    def __init__(self) -> None:
        self.book = BookProjection()
        self.projection = self.book

    def feed(self, placed: Sequence[Placed]) -> None:
        for p in placed:
            self.book.apply(p.record, p.partition, p.offset)


class DuckFed(Fed):
    def __init__(self, path: Path) -> None:
        self.duck = DuckProjection.open(path, topic=TOPIC)
        self.projection = self.duck

    def feed(self, placed: Sequence[Placed]) -> None:
        for partition, records in by_partition(to_log(placed)).items():
            self.duck.apply_batch(TOPIC, partition, records)


class StagedDuckFed(DuckFed):
    """Each feed is one poll staged for readers (``DuckProjection.stage``); ``lag`` polls stay uncommitted
    (None: none is ever committed), the older ones are committed in order, as ``serve``'s writer does."""

    def __init__(self, path: Path, lag: int | None) -> None:
        super().__init__(path)
        self.lag = lag
        self.polls: list[list[PreparedBatch]] = []

    def feed(self, placed: Sequence[Placed]) -> None:
        poll = [self.duck.prepare(p, records) for p, records in by_partition(to_log(placed)).items()]
        if not poll:
            return
        self.duck.stage(TOPIC, poll)
        self.polls.append(poll)
        while self.lag is not None and len(self.polls) > self.lag:
            self.duck.apply_prepared(TOPIC, self.polls.pop(0))
            # each commit wrote what its staged layer showed (else staging turns itself off)
            assert not self.duck._staging.off


class ProjectionContract(abc.ABC):
    """Tests every ``Projection`` implementation must pass."""

    @abc.abstractmethod
    @contextmanager
    def fed(self) -> Iterator[Fed]:
        """A fresh, empty projection."""

    # ------------------------------------------------------------------------------------- checks

    def check_against_reference(self, fed: Fed, placed: Sequence[Placed], partitions: int) -> None:
        book = book_of(placed)
        applied: dict[int, int] = {}
        for p in placed:
            applied[p.partition] = p.offset + 1
        with fed.projection.view() as v:
            for partition in range(partitions):
                assert v.applied_offset(partition) == applied.get(partition, 0)
            projects = {p.record.project_sha256 for p in placed}
            for project in projects:
                source = book.heads.get(project)
                expected = cursor_of(project, source, book.live[source][-1]) if source else None
                assert v.head(project) == expected
            for source, turns in book.live.items():
                info = v.source(source)
                assert info is not None
                assert info.source_sha256 == source
                assert info.length == len(turns)
                assert info.chain_digest == (turns[-1].chain_digest if turns else info.chain_digest)
                assert (info.broken_reason is not None) == (source in book.broken)
                served = v.turns(source, 1, len(turns) + 3)
                assert [(t.seq, t.turn_id, t.chain_digest, t.partition, t.offset) for t in served] == [
                    (t.seq, t.turn_id, t.chain_digest, t.partition, t.offset) for t in turns
                ]
                assert [(t.body, t.body_bytes, t.completed_at_micros, t.content_digest) for t in served] == [
                    (t.record.body, len(t.record.body.encode()), t.record.completed_at_micros, t.content_digest)
                    for t in turns
                ]
            # Several ranges at once (overlapping, repeated, empty, past the end) read as each alone.
            ranges = [(s, a, b) for s, ts in book.live.items() for a, b in ((1, len(ts)), (len(ts), len(ts)), (2, 1))]
            ranges += [(turn(thread="nowhere").source_sha256, 1, 5), *ranges[:2]]
            assert v.turns_many(ranges) == [v.turns(*r) for r in ranges]
            live_ids = {(s, t.turn_id) for s, ts in book.live.items() for t in ts}
            for old in book.superseded:
                if (old.record.source_sha256, old.turn_id) in live_ids:
                    continue
                served = v.turns(old.record.source_sha256, old.seq, old.seq)
                assert all(t.turn_id != old.turn_id for t in served)

    # -------------------------------------------------------------------------------------- tests

    @settings(
        max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors]
    )
    @given(histories(max_size=45), st.integers(1, 3), st.data())
    def test_views_agree_with_the_reference_fold(
        self, records: list[TurnRecord], partitions: int, data: st.DataObject
    ) -> None:
        placed = place(records, partitions)
        cut = data.draw(st.integers(0, len(placed)))
        with self.fed() as fed:
            fed.feed(placed[:cut])
            self.check_against_reference(fed, placed[:cut], partitions)
            fed.feed(placed[cut:])
            self.check_against_reference(fed, placed, partitions)

    def test_a_history_re_sent_by_a_newer_parser_corrects_the_chain(self) -> None:
        """The old parser's turns, then the new parser's, in polls cut anywhere: the new chain, nothing
        refused. First an extra (interrupted) turn and a fuller reply under a turn id sent before, then a
        turn the old parser made up, dropped, then both before the same turn."""

        def records(spec: list[tuple[str, str]]) -> list[TurnRecord]:
            return [turn(turn_id=t, seq=i + 1, body=body) for i, (t, body) in enumerate(spec)]

        cases = [
            (
                records([("t1", "one"), ("t2", "two"), ("t3", "three, cut"), ("t4", "four")]),
                records(
                    [
                        ("t1", "one"),
                        ("x", "interrupted"),
                        ("t2", "two"),
                        ("t3", "three, the whole reply"),
                        ("t4", "four"),
                    ]
                ),
            ),
            (
                records([("t1", "one"), ("bogus", "made up"), ("t2", "two"), ("t3", "three")]),
                records([("t1", "one"), ("t2", "two"), ("t3", "three, the whole reply"), ("t4", "four")]),
            ),
        ]
        finals = [new for _, new in cases]

        def timed(spec: list[tuple[str, int, int]]) -> list[TurnRecord]:  # (turn id, seq, completedAt)
            return [turn(turn_id=t, seq=seq, body=t, at=1_700_000_000_000_000 + at) for t, seq, at in spec]

        # An extra turn x and a dropped made-up one before c, which keeps its seq: c and d, superseded by
        # x, come back at their seqs (completed after the head); then the host's rewind e, re-sent at its
        # seq, rewinds over d again. The turns the chain's head's completedAt is read from are pending,
        # stored, or in a staged layer, as the polls are cut.
        new = timed([("a", 1, 10), ("x", 2, 20), ("c", 3, 30), ("d", 4, 40), ("e", 4, 50)])
        cases.append((timed([("a", 1, 10), ("m", 2, 25), ("c", 3, 30), ("d", 4, 40), ("e", 4, 50)]), new))
        finals.append([new[0], new[1], new[2], new[4]])
        for (old, new), final in zip(cases, finals, strict=True):
            nxt = turn(turn_id="next", seq=len(final) + 1, body="next", at=1_700_000_000_000_100)
            placed = place([*old, *new, *new[2:], nxt])  # the new records twice (a hook and a follower)
            for cut in range(len(old), len(placed)):
                with self.fed() as fed:
                    fed.feed(placed[:cut])
                    fed.feed(placed[cut : cut + 1])
                    fed.feed(placed[cut + 1 :])
                    self.check_against_reference(fed, placed, 1)
                    with fed.projection.view() as v:
                        info = v.source(turn().source_sha256)
                        assert info is not None and info.broken_reason is None
                        served = v.turns(turn().source_sha256, 1, 10)
                        assert [(t.turn_id, t.body) for t in served] == [(t.turn_id, t.body) for t in [*final, nxt]]

    def test_every_capability_of_the_port_answers(self) -> None:
        """What a reader and the serve API use besides ``view``: ``read`` (on an idle projection it
        answers as ``view``), the offsets in memory, and the quarantine listing (``None``, or one that
        lists the quarantined record once it is committed)."""
        records = [turn(turn_id="a"), turn(turn_id="b"), turn(turn_id="gap", seq=9)]
        source = turn().source_sha256
        with self.fed() as fed:
            fed.feed(place(records))
            with fed.projection.view() as v:
                expected = (
                    v.head(turn().project_sha256),
                    v.source(source),
                    v.turns_many([(source, 1, 5), (source, 2, 2)]),
                )
            assert (
                fed.projection.read(
                    lambda q: (
                        q.head(turn().project_sha256),
                        q.source(source),
                        q.turns_many([(source, 1, 5), (source, 2, 2)]),
                    )
                )
                == expected
            )
            assert dict(fed.projection.readable_offsets()) == {0: 3}
            committed = fed.projection.committed_offsets()
            assert committed is None or all(0 <= o <= 3 for o in committed.values())
            listing = fed.projection.quarantine(times=False)
            if listing is not None:  # of what is committed: a staged quarantine is listed once it is
                assert committed is not None
                assert len(listing.broken) == (1 if committed.get(0) == 3 else 0) and listing.repairs == ()

    def test_an_empty_projection(self) -> None:
        with self.fed() as fed, fed.projection.view() as v:
            assert v.applied_offset(0) == 0
            assert v.head(turn().project_sha256) is None
            assert v.source(turn().source_sha256) is None
            assert v.turns(turn().source_sha256, 1, 100) == []
            assert fed.projection.wait_applied(0, 0, 0.0)

    def test_broken_sources_are_marked_and_keep_their_live_turns(self) -> None:
        records = [turn(turn_id="a"), turn(turn_id="b"), turn(turn_id="gap", seq=9), turn(turn_id="c")]
        with self.fed() as fed:
            fed.feed(place(records))
            with fed.projection.view() as v:
                info = v.source(turn().source_sha256)
                assert info is not None and info.broken_reason and info.length == 3
                assert [t.turn_id for t in v.turns(turn().source_sha256, 1, 10)] == ["a", "b", "c"]

    def test_superseded_turns_are_never_served(self) -> None:
        records = [turn(turn_id=t) for t in "abcd"] + [turn(turn_id="x", seq=2)]
        with self.fed() as fed:
            fed.feed(place(records))
            with fed.projection.view() as v:
                served = v.turns(turn().source_sha256, 1, 10)
                assert [t.turn_id for t in served] == ["a", "x"]
                head = v.head(turn().project_sha256)
                assert head is not None and head.length == 2 and head.offset == 4

    def test_the_head_follows_thread_and_host_switches(self) -> None:
        main, side, other = turn(thread="main"), turn(thread="side"), turn(host="host-b")
        records = [turn(thread="main", turn_id="1"), turn(thread="side", turn_id="2"), turn(host="host-b", turn_id="3")]
        with self.fed() as fed:
            fed.feed(place(records[:1]))
            with fed.projection.view() as v:
                head = v.head(main.project_sha256)
                assert head is not None and head.source_sha256 == main.source_sha256
            fed.feed(place(records)[1:2])
            with fed.projection.view() as v:
                head = v.head(main.project_sha256)
                assert head is not None and head.source_sha256 == side.source_sha256
            fed.feed(place(records)[2:])
            with fed.projection.view() as v:
                head = v.head(main.project_sha256)
                assert head is not None and head.source_sha256 == other.source_sha256 and head.offset == 2

    def test_a_view_does_not_move_while_records_are_applied(self) -> None:
        placed = place([turn(turn_id=f"t{i}") for i in range(4)])
        with self.fed() as fed:
            fed.feed(placed[:2])
            with fed.projection.view() as v:
                feeder = threading.Thread(target=fed.feed, args=(placed[2:],))
                feeder.start()
                feeder.join(timeout=30)
                assert v.applied_offset(0) == 2
                assert len(v.turns(turn().source_sha256, 1, 10)) == 2
                head = v.head(turn().project_sha256)
                assert head is not None and head.length == 2
            with fed.projection.view() as v:
                assert v.applied_offset(0) == 4

    def test_wait_applied_is_woken_by_the_apply(self) -> None:
        placed = place([turn(turn_id=f"t{i}") for i in range(3)])
        with self.fed() as fed:
            assert not fed.projection.wait_applied(0, 1, 0.01)
            answers: list[bool] = []
            waiter = threading.Thread(target=lambda: answers.append(fed.projection.wait_applied(0, 3, 30.0)))
            waiter.start()
            fed.feed(placed)
            waiter.join(timeout=30)
            assert answers == [True]
            assert fed.projection.wait_applied(0, 2, 0.0)

    def test_a_project_change_wakes_only_that_projects_waiters(self) -> None:
        """What a long-poll waits on: another project's commits move neither the count nor the waiter."""
        alpha, beta = PROJECTS[0], PROJECTS[1]
        placed = place(
            [turn(alpha, turn_id="a1"), turn(beta, turn_id="b1"), turn(beta, turn_id="b2"), turn(alpha, turn_id="a2")]
        )
        hashed = placed[0].record.project_sha256
        with self.fed() as fed:
            assert fed.projection.project_changes(hashed) == 0
            fed.feed(placed[:1])
            seen = fed.projection.project_changes(hashed)
            assert seen > 0
            answers: list[bool] = []
            waiter = threading.Thread(
                target=lambda: answers.append(fed.projection.wait_project_changed(hashed, seen, 30.0))
            )
            waiter.start()
            fed.feed(placed[1:3])  # beta's turns on the same partition
            waiter.join(timeout=0.3)
            assert waiter.is_alive() and answers == []
            assert fed.projection.project_changes(hashed) == seen
            assert not fed.projection.wait_project_changed(hashed, seen, 0.01)
            fed.feed(placed[3:])
            waiter.join(timeout=30)
            assert answers == [True] and fed.projection.project_changes(hashed) > seen
            assert fed.projection.wait_project_changed(hashed, seen, 0.0)


class TestBookProjection(ProjectionContract):
    @contextmanager
    def fed(self) -> Iterator[Fed]:
        yield BookFed()


class TestDuckProjection(ProjectionContract):
    @contextmanager
    def fed(self) -> Iterator[Fed]:
        with tempfile.TemporaryDirectory() as tmp:
            fed = DuckFed(Path(tmp) / "p.duckdb")
            try:
                yield fed
            finally:
                fed.duck.close()


class TestStagedDuckProjection(ProjectionContract):
    """Every answer from staged layers alone: nothing is committed."""

    @contextmanager
    def fed(self) -> Iterator[Fed]:
        with tempfile.TemporaryDirectory() as tmp:
            fed = StagedDuckFed(Path(tmp) / "p.duckdb", None)
            try:
                yield fed
            finally:
                fed.duck.close()


class TestStagedDuckProjectionCommittedBehind(ProjectionContract):
    """The newest poll staged on top of the committed ones (the layer above the file's version)."""

    @contextmanager
    def fed(self) -> Iterator[Fed]:
        with tempfile.TemporaryDirectory() as tmp:
            fed = StagedDuckFed(Path(tmp) / "p.duckdb", 1)
            try:
                yield fed
            finally:
                fed.duck.close()
