"""Staged layers (``DuckProjection.stage``): what a read sees before the commit is what the commit writes.

The differential property runs the same polls through two projections: ``direct`` commits each poll
as it comes (``project`` and ``replay``), ``staged`` stages each poll for readers and commits the
oldest staged polls, merged, when a generated schedule says so (``serve``'s writer thread). After
every poll both must answer every read alike, and at the end their tables must be equal.
"""

from __future__ import annotations

import gc
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projector_histories import PARTITIONS, TOPIC, Entry, by_partition, entries_log, logs, turn

from throughline.core.key_filter import KeyFilter
from throughline.core.layers import Layer, SourceLayer
from throughline.core.partitioning import partition_for
from throughline.core.ports import ProjectionView
from throughline.core.repair import RepairRecord
from throughline.projector.exceptions import InvalidBatchError
from throughline.projector.prepare import merge_polls
from throughline.projector.store import DuckProjection, LogRecord, PreparedBatch, stageable
from throughline.projector.store.files import cursor
from throughline.projector.store.staging import agrees
from throughline.projector.store.state import SourceState
from throughline.projector.store.transaction import ApplyTransaction
from throughline.schemas.codec import encode_turn


@contextmanager
def two_projections() -> Iterator[tuple[DuckProjection, DuckProjection]]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        DuckProjection.open(Path(tmp) / "direct.duckdb", topic=TOPIC) as direct,
        DuckProjection.open(Path(tmp) / "staged.duckdb", topic=TOPIC, source_cache=2) as staged,
    ):
        yield direct, staged


def polls_of(projection: DuckProjection, log: Sequence[LogRecord], cuts: Sequence[int]) -> list[list[PreparedBatch]]:
    """``log`` cut at ``cuts`` into polls, each prepared per partition as the feed delivers them."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(log))), len(log)]
    return [
        [projection.prepare(p, records) for p, records in by_partition(log[a:b]).items()]
        for a, b in zip(bounds, bounds[1:], strict=False)
        if b > a
    ]


def answers(view: ProjectionView, projects: set[bytes], sources: set[bytes], partitions: int) -> object:
    """Everything a read can ask of a view, as plain values."""
    out: list[object] = [view.applied_offset(p) for p in range(partitions)]
    out += [view.head(project) for project in sorted(projects)]
    for source in sorted(sources):
        info = view.source(source)
        out.append(info)
        length = info.length if info is not None else 0
        out.append(view.turns(source, 1, length + 2))
        out.append(view.turns(source, max(1, length - 1), length))
    return out


def identities(entries: Sequence[Entry]) -> tuple[set[bytes], set[bytes]]:
    projects = {e.record.project_sha256 for e in entries}
    sources = {e.record.source_sha256 for e in entries if e.record.source_sha256 is not None}
    return projects, sources


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(logs(poison=True), st.lists(st.integers(0, 40), max_size=12), st.data())
def test_staged_reads_answer_as_a_projection_that_committed_every_poll(
    entries: list[Entry], cuts: list[int], data: st.DataObject
) -> None:
    log = entries_log(entries)
    projects, sources = identities(entries)
    with two_projections() as (direct, staged):
        pending: list[list[PreparedBatch]] = []

        def commit(count: int) -> None:
            polls, pending[:] = pending[:count], pending[count:]
            if polls:
                staged.apply_prepared(TOPIC, merge_polls(polls))

        for poll in polls_of(direct, log, cuts):
            direct.apply_prepared(TOPIC, poll)
            if stageable(poll):
                layer = staged.stage(TOPIC, poll)
                assert layer is not None  # every poll holds records not staged before
                pending.append(poll)
            else:  # a repair writes while it is folded: what is staged is committed first, then it alone
                commit(len(pending))
                staged.apply_prepared(TOPIC, poll)
            commit(data.draw(st.integers(0, len(pending)), label="polls committed"))
            with direct.view() as d, staged.view() as s:
                assert answers(s, projects, sources, PARTITIONS) == answers(d, projects, sources, PARTITIONS)
            with staged._quiet_view() as q, direct.view() as d:
                assert answers(q, projects, sources, PARTITIONS) == answers(d, projects, sources, PARTITIONS)
        commit(len(pending))
        assert staged.table_digests() == direct.table_digests()
        # Every commit agreed with its layers (a disagreement turns staging off: this poll is not staged).
        extra = turn(turn_id="after-the-log")
        partition = partition_for(extra.project_sha256, PARTITIONS)
        tail = LogRecord(
            partition, staged.applied_offsets().get(partition, 0), extra.project_sha256, encode_turn(extra)
        )
        assert staged.stage(TOPIC, [staged.prepare(partition, [tail])]) is not None


def _record_at(partition: int, offset: int, turn_id: str) -> LogRecord:
    r = turn(turn_id=turn_id)
    return LogRecord(partition, offset, r.project_sha256, encode_turn(r))


def test_a_snapshot_taken_between_a_commit_and_its_publication_keeps_the_layers(tmp_path: Path) -> None:
    """The file holds a commit the index has not published yet: the view must still show every layer (the
    layers above the commit were dropped from a view that read the file alone, and a read then saw the
    chain behind a cursor it had served: ``resync_required``)."""
    project = turn().project_sha256
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        first = [projection.prepare(0, [_record_at(0, 0, "a"), _record_at(0, 1, "b")])]
        second = [projection.prepare(0, [_record_at(0, 2, "c")])]
        projection.stage(TOPIC, first)
        projection.stage(TOPIC, second)
        with projection.view() as v:
            staged_head = v.head(project)
        assert staged_head is not None and staged_head.length == 3
        # Pause the commit of ``first`` after its COMMIT, before the read state publishes it (the first
        # thing it does after the COMMIT is to add its keys to the stored-key filter).
        reached, resume = threading.Event(), threading.Event()
        keys = projection._staging.stored_keys
        add_keys = keys.committed

        def paused(applied: object) -> None:
            reached.set()
            resume.wait(30)
            add_keys(applied)  # type: ignore[arg-type]

        keys.committed = paused  # type: ignore[method-assign]
        writer = threading.Thread(target=projection.apply_prepared, args=(TOPIC, first))
        writer.start()
        try:
            assert reached.wait(30), "the commit never reached the file"
            probe = cursor(projection._file.connection)
            try:
                assert probe.execute("SELECT sum(next_offset) FROM applied_offsets").fetchone() == (2,)
            finally:
                probe.close()
            with projection.view() as v:
                assert v.head(project) == staged_head
                assert [t.seq for t in v.turns(staged_head.source_sha256, 1, 5)] == [1, 2, 3]
        finally:
            resume.set()
            writer.join(timeout=30)
        with projection.view() as v:
            assert v.head(project) == staged_head


def test_nothing_is_staged_after_layers_were_dropped_until_the_feed_starts_again(tmp_path: Path) -> None:
    """Dropped layers (their commit failed) leave their records unapplied and held nowhere: a poll staged
    over the committed state would skip them, and ``wait_settled`` would prove what nothing holds."""
    project = turn().project_sha256
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        projection.fetching_from({0: 0})
        first = [projection.prepare(0, [_record_at(0, 0, "a"), _record_at(0, 1, "b")])]
        projection.fetched(first)
        assert projection.stage(TOPIC, first) is not None
        assert projection.wait_settled(0, project, 2, 0.0)  # staged: readable before any commit
        projection.unstage()
        assert not projection.wait_settled(0, project, 2, 0.0)
        with projection.view() as v:
            assert v.head(project) is None and v.applied_offset(0) == 0
        later = [projection.prepare(0, [_record_at(0, 2, "c")])]
        projection.fetched(later)
        assert projection.stage(TOPIC, later) is None
        assert not projection.wait_settled(0, project, 3, 0.0)
        projection.fetching_from({0: 0})  # the feed starts again from the committed offsets
        again = [projection.prepare(0, [_record_at(0, 0, "a"), _record_at(0, 1, "b"), _record_at(0, 2, "c")])]
        projection.fetched(again)
        assert projection.stage(TOPIC, again) is not None
        with projection.view() as v:
            head = v.head(project)
            assert head is not None and head.length == 3


def test_a_batch_s_fold_is_freed_with_its_transaction_without_a_garbage_collector_pass(tmp_path: Path) -> None:
    """Each delta of a fold looks stored digests up through its transaction: a transaction that kept its
    deltas after the commit (or after staging) was a reference cycle, which the projector's loop frees
    only at its rare full collector passes (``fewer_gc_passes``): every batch's rows stayed in memory
    until then, and the projector's peak RSS grew with the topic."""
    gc.collect()
    gc.disable()
    try:
        with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
            projection.apply_prepared(TOPIC, [projection.prepare(0, [_record_at(0, 0, "a"), _record_at(0, 1, "b")])])
            assert projection.stage(TOPIC, [projection.prepare(0, [_record_at(0, 2, "c")])]) is not None
            alive = [o for o in gc.get_objects() if isinstance(o, ApplyTransaction)]
            assert alive == []
    finally:
        gc.enable()


def test_a_poll_with_a_repair_is_not_staged(tmp_path: Path) -> None:
    records = [turn(turn_id="a")]
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        repair = RepairRecord(records[0].project_sha256, records[0].source_sha256, "accepted")
        log = entries_log([Entry(repair, 0, 0, repair.project_sha256)])
        poll = [projection.prepare(0, log)]
        assert not stageable(poll)
        with pytest.raises(InvalidBatchError):
            projection.stage(TOPIC, poll)


def _layer(source: bytes, length: int, digest: bytes) -> Layer:
    held = SourceLayer(b"p" * 32, 1, (), length, digest, 0, length - 1, None, None, None)
    return Layer(1, {source: held}, {}, {0: length})


def test_a_commit_agrees_with_its_layers_only_source_by_source() -> None:
    state = SourceState(b"p" * 32, 3, b"d" * 32, 0, 2)
    assert agrees([_layer(b"s", 3, b"d" * 32)], {b"s": state})
    assert not agrees([_layer(b"s", 2, b"d" * 32)], {b"s": state})  # another length
    assert not agrees([_layer(b"s", 3, b"e" * 32)], {b"s": state})  # another digest
    assert not agrees([_layer(b"t", 3, b"d" * 32)], {b"s": state})  # another source
    newer = Layer(2, {b"s": _layer(b"s", 3, b"d" * 32).sources[b"s"]}, {}, {0: 3})
    assert agrees([_layer(b"s", 2, b"x" * 32), newer], {b"s": state})  # the newest layer counts


def _wait_ready(projection: DuckProjection) -> None:
    keys = projection._staging.stored_keys  # the filter under test
    for _ in range(500):  # bounded: up to ~5 s for the scan of turn_ids
        if keys.ready:
            return
        time.sleep(0.01)
    pytest.fail("the stored turn keys never became ready")


def test_staging_looks_up_only_the_keys_the_filter_cannot_rule_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new key is known new from memory (no read of ``turn_ids``, which waits out every checkpoint);
    keys applied before, whether stored before the filter filled or committed after, are looked up and
    folded as duplicates."""
    import throughline.projector.store.staging as staging

    stored = [_record_at(0, i, f"old{i}") for i in range(300)]
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        projection.apply_prepared(TOPIC, [projection.prepare(0, stored)])  # in turn_ids before the scan
        first = [projection.prepare(0, [_record_at(0, 300, "mid")])]
        assert projection.stage(TOPIC, first) is not None  # starts the filter
        _wait_ready(projection)
        projection.apply_prepared(TOPIC, first)  # committed after the scan: the commit adds its key
        asked: list[bytes] = []
        real = staging.stored_turn_ids

        def counting(cur: object, keys: Sequence[bytes], table: object = None) -> dict[bytes, bytes]:
            asked.extend(keys)
            return real(cur, keys, table)  # type: ignore[arg-type]

        monkeypatch.setattr(staging, "stored_turn_ids", counting)
        fresh = [_record_at(0, 301 + i, f"new{i}") for i in range(200)]
        again = [_record_at(0, 501, "old7"), _record_at(0, 502, "mid")]  # the same turns, sent again
        poll = [projection.prepare(0, [*fresh, *again])]
        layer = projection.stage(TOPIC, poll)
        assert layer is not None
        again_keys = {it.turn_key for b in poll for it in b.items if it.offset >= 501}
        assert again_keys <= set(asked)  # both looked up: the scan's key and the commit's key
        assert len(set(asked) - again_keys) <= 2  # and almost none of the 200 new ones (false positives)
        assert not again_keys & set(layer.turn_keys)  # duplicates: not appended again
        assert len(layer.turn_keys) == 200
        projection.apply_prepared(TOPIC, poll)  # and the commit agrees with the layer
        projection.stage(TOPIC, [projection.prepare(0, [_record_at(0, 503, "after")])])
        assert not projection._staging.off


@pytest.mark.parametrize("filtered", [True, False], ids=["filter", "control-without-filter"])
def test_staging_new_turns_does_not_wait_for_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filtered: bool
) -> None:
    """DuckDB makes reads of the tables a checkpoint writes wait for it; staging new turns reads none of
    them once the stored keys are in memory. The control (keys looked up in ``turn_ids``) shows the wait
    is real: there the stage returns only when the checkpoint releases the tables."""
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        projection.apply_prepared(TOPIC, [projection.prepare(0, [_record_at(0, i, f"old{i}") for i in range(100)])])
        first = [projection.prepare(0, [_record_at(0, 100, "mid")])]
        assert projection.stage(TOPIC, first) is not None
        _wait_ready(projection)
        projection.apply_prepared(TOPIC, first)  # the WAL holds work for the checkpoint
        if not filtered:
            monkeypatch.setattr(projection._staging.stored_keys, "maybe_stored", lambda keys: None)
        # DuckDB's own debug setting: the checkpoint holds each table it writes this long before it is done.
        known = projection._file.connection.execute(
            "SELECT count(*) FROM duckdb_settings() WHERE name = 'debug_checkpoint_scan_sleep_ms'"
        ).fetchall()
        if known != [(1,)]:
            pytest.skip("this DuckDB has no debug_checkpoint_scan_sleep_ms (DuckDB 2.0 has it)")
        projection._file.connection.execute("SET GLOBAL debug_checkpoint_scan_sleep_ms = 300")
        checkpoint = threading.Thread(target=projection.checkpoint)
        checkpoint.start()
        time.sleep(0.2)  # into the checkpoint (it holds each of the projection's tables for 0.3 s)
        assert checkpoint.is_alive()
        poll = [projection.prepare(0, [_record_at(0, 101 + i, f"new{i}") for i in range(50)])]
        started = time.monotonic()
        layer = projection.stage(TOPIC, poll)
        waited = time.monotonic() - started
        still_checkpointing = checkpoint.is_alive()
        checkpoint.join(timeout=60)
        projection._file.connection.execute("SET GLOBAL debug_checkpoint_scan_sleep_ms = 0")
        assert layer is not None and len(layer.turn_keys) == 50
        # Not a speed goal but whether the stage waited for the checkpoint: measured 0.0004 s against
        # 2.5 s (the rest of the checkpoint's holds), so the 1 s line is far from both.
        if filtered:
            assert waited < 1.0 and still_checkpointing, waited
        else:
            assert waited > 1.0, waited


def test_a_turn_re_sent_while_the_stored_keys_are_scanned_is_staged_as_its_commit_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored-key filter answers only once its scan of ``turn_ids`` has finished (``StoredTurnKeys.ready``).
    One that answered earlier would call every key the scan has not reached new: at the start of a large
    projection a re-sent turn would be staged as appended, served, and then contradicted by its commit
    (a duplicate). Here the scan is held after its first slice, so the poll is staged mid-scan."""
    import throughline.projector.store.stored_keys as stored_keys

    monkeypatch.setattr(stored_keys, "_SCAN_BATCH", 10)
    monkeypatch.setattr(stored_keys, "_ADD_SLICE", 10)
    first_slice, release = threading.Event(), threading.Event()
    add_many = KeyFilter.add_many

    def held_after_one_slice(self: KeyFilter, keys: Sequence[bytes]) -> None:
        if threading.current_thread().name == "throughline-turn-keys":  # the scan's thread, not a commit
            if first_slice.is_set():
                release.wait(30)
            first_slice.set()
        add_many(self, keys)

    monkeypatch.setattr(KeyFilter, "add_many", held_after_one_slice)
    project, source = turn().project_sha256, turn().source_sha256
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        projection.apply_prepared(TOPIC, [projection.prepare(0, [_record_at(0, i, f"old{i}") for i in range(300)])])
        again = [projection.prepare(0, [_record_at(0, 300 + i, f"old{i}") for i in range(300)])]  # every turn, re-sent
        try:
            assert projection.stage(TOPIC, again) is not None  # starts the scan: staged while it is held
            with projection.view() as v:
                served = answers(v, {project}, {source}, 1)
                assert len(v.turns(source, 1, 1000)) == 300  # duplicates, not appended again
        finally:
            release.set()
        projection.apply_prepared(TOPIC, again)
        with projection.view() as v:
            assert answers(v, {project}, {source}, 1) == served
        assert not projection._staging.off


def test_a_commit_that_disagrees_with_its_staged_fold_turns_staging_off(tmp_path: Path) -> None:
    """Each commit is checked against the layers it covers (``agrees``). One that wrote other records than
    the poll staged at those offsets (a writer that broke the staging order, or a staged fold that
    diverged) drops the layers and stages nothing more: reads answer from the file alone from then on."""
    project = turn().project_sha256
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        assert projection.stage(TOPIC, [projection.prepare(0, [_record_at(0, 0, "a"), _record_at(0, 1, "b")])])
        projection.apply_prepared(TOPIC, [projection.prepare(0, [_record_at(0, 0, "x"), _record_at(0, 1, "y")])])
        assert projection._staging.off
        assert projection.stage(TOPIC, [projection.prepare(0, [_record_at(0, 2, "c")])]) is None
        with projection.view() as v:
            head = v.head(project)
            assert head is not None and head.length == 2
            assert [t.turn_id for t in v.turns(head.source_sha256, 1, 5)] == ["x", "y"]
