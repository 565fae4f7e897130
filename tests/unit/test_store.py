"""The DuckDB projection's apply path and read handle, without Kafka (``DuckProjection.apply_batch``)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projector_histories import (
    TOPIC,
    Placed,
    apply_whole,
    book_of,
    by_partition,
    histories,
    one_and_many,
    place,
    to_log,
    turn,
)

from throughline.core.chain import chain_digests
from throughline.core.fold import ChainBook
from throughline.core.partitioning import partition_for
from throughline.projector import store as store_module
from throughline.projector.exceptions import (
    InvalidBatchError,
    ProjectionBusyError,
    ProjectionIncompatibleError,
    ProjectionMissingError,
    ProjectionTopicMismatchError,
)
from throughline.projector.store import (
    Q_CHAIN,
    Q_INVALID,
    Q_MISPLACED,
    Q_UNDECODABLE,
    Q_UNKNOWN_SCHEMA,
    BatchSummary,
    DuckProjection,
    LogRecord,
)
from throughline.projector.store import writes as store_writes
from throughline.schemas.codec import MAGIC, encode_turn


def rows(projection: DuckProjection, table: str, *columns: str) -> list[tuple[object, ...]]:
    """The given columns of every row of ``table``, in the table's total order (``table_rows``)."""
    return [tuple(r[c] for c in columns) for r in projection.table_rows(table)]


def assert_matches_book(projection: DuckProjection, book: ChainBook, applied: dict[int, int]) -> None:
    """The projection holds exactly what the reference fold holds."""
    live = {s: ts for s, ts in book.live.items() if ts}
    stored = rows(
        projection,
        "turns",
        "source_sha256",
        "seq",
        "turn_id",
        "content_digest",
        "chain_digest",
        "log_partition",
        "log_offset",
    )
    assert sorted(stored) == sorted(
        (s, t.seq, t.turn_id, t.content_digest, t.chain_digest, t.partition, t.offset)
        for s, ts in live.items()
        for t in ts
    )
    superseded = rows(projection, "superseded_turns", "source_sha256", "seq", "turn_id", "log_offset")
    assert sorted(superseded) == sorted((t.record.source_sha256, t.seq, t.turn_id, t.offset) for t in book.superseded)
    with projection.view() as v:
        for source, turns in book.live.items():
            info = v.source(source)
            assert info is not None
            assert info.length == len(turns)
            assert (info.broken_reason is not None) == (source in book.broken)
            assert v.turns(source, 1, len(turns) + 5) == [_stored(t) for t in turns]
        for project, source in book.heads.items():
            head = v.head(project)
            last = book.live[source][-1]
            assert head is not None
            assert (head.source_sha256, head.length, head.chain_digest, head.partition, head.offset) == (
                source,
                last.seq,
                last.chain_digest,
                last.partition,
                last.offset,
            )
        for p, o in applied.items():
            assert v.applied_offset(p) == o
    assert len(projection.table_rows("project_heads")) == len(book.heads)
    q = rows(projection, "quarantine", "log_partition", "log_offset", "reason")
    assert q == sorted(book.quarantined)


def _stored(t: object) -> object:
    from throughline.core.ports import stored_turn

    return stored_turn(t)  # type: ignore[arg-type]


def _ends(placed: Sequence[Placed]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in placed:
        out[p.partition] = p.offset + 1
    return out


# ----------------------------------------------------------------------------------- equivalence


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(max_size=50), st.integers(1, 3), st.data())
def test_any_batching_folds_like_the_reference_book(records: list, partitions: int, data: st.DataObject) -> None:
    placed = place(records, partitions)
    log = to_log(placed)
    with tempfile.TemporaryDirectory() as tmp:
        projection = DuckProjection.open(
            Path(tmp) / "p.duckdb", topic=TOPIC, source_cache=data.draw(st.sampled_from([1, 1000]))
        )
        try:
            for partition, recs in by_partition(log).items():
                i = 0
                while i < len(recs):
                    size = data.draw(st.integers(1, 12))
                    projection.apply_batch(TOPIC, partition, recs[i : i + size])
                    i += size
            assert_matches_book(projection, book_of(placed), _ends(placed))
        finally:
            projection.close()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(max_size=60), st.data())
def test_tables_do_not_depend_on_batch_boundaries(records: list, data: st.DataObject) -> None:
    placed = place(records, 2)
    log = to_log(placed)
    with one_and_many(source_cache=2) as (one, many):
        apply_whole(one, log)
        # Both partitions in one transaction, cut at random places.
        parts = by_partition(log)
        cursors = dict.fromkeys(parts, 0)
        while any(cursors[p] < len(parts[p]) for p in parts):
            batches = []
            for p, recs in parts.items():
                n = data.draw(st.integers(0, 7))
                if n and cursors[p] < len(recs):
                    batches.append(many.prepare(p, recs[cursors[p] : cursors[p] + n]))
                    cursors[p] += n
            many.apply_prepared(TOPIC, batches)
        assert one.table_digests() == many.table_digests()


def test_a_batch_applied_twice_is_applied_once(db: DuckProjection) -> None:
    log = to_log(place([turn(turn_id=f"t{i}") for i in range(5)]))
    first = db.apply_batch(TOPIC, 0, log[:3])
    assert first == BatchSummary(records=3, appended=3)
    before = db.table_digests()
    assert db.apply_batch(TOPIC, 0, log[:3]) == BatchSummary()  # a re-delivered batch: nothing new
    assert db.table_digests() == before
    overlap = db.apply_batch(TOPIC, 0, log[1:5])  # only offsets 3 and 4 are new
    assert overlap == BatchSummary(records=2, appended=2)
    with db.view() as v:
        assert v.applied_offset(0) == 5
        assert [t.turn_id for t in v.turns(turn().source_sha256, 1, 10)] == [f"t{i}" for i in range(5)]


def test_a_crash_before_commit_leaves_nothing(db: DuckProjection, monkeypatch: pytest.MonkeyPatch) -> None:
    log = to_log(place([turn(turn_id=f"t{i}") for i in range(4)]))
    db.apply_batch(TOPIC, 0, log[:2])
    before = db.table_digests()

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(store_writes, "write_offsets", boom)  # the batch's last write before COMMIT
    with pytest.raises(RuntimeError):
        db.apply_batch(TOPIC, 0, log[2:])
    monkeypatch.undo()
    assert db.table_digests() == before
    assert db.applied_offsets() == {0: 2}
    db.apply_batch(TOPIC, 0, log[2:])
    assert len(db.table_rows("turns")) == 4


def test_reopening_continues_where_it_stopped(tmp_path: Path) -> None:
    placed = place([turn(turn_id=f"t{i}", seq=(2 if i == 6 else None)) for i in range(10)])
    log = to_log(placed)
    with DuckProjection.open(tmp_path / "a.duckdb", topic=TOPIC) as a:
        a.apply_batch(TOPIC, 0, log[:5])
    with DuckProjection.open(tmp_path / "a.duckdb", topic=TOPIC) as a:
        assert a.applied_offsets() == {0: 5}
        a.apply_batch(TOPIC, 0, log[5:])
        assert_matches_book(a, book_of(placed), {0: 10})
        resumed = a.table_digests()
    with DuckProjection.open(tmp_path / "b.duckdb", topic=TOPIC) as b:
        b.apply_batch(TOPIC, 0, log)
        assert b.table_digests() == resumed


# ----------------------------------------------------------------------------------- quarantine


def test_poison_records_are_quarantined_and_the_rest_applied(db: DuckProjection) -> None:
    good = [turn(project="/p/ok", turn_id=f"ok{i}") for i in range(3)]
    gap = turn(project="/p/broken", turn_id="g", seq=5)
    unknown = MAGIC + b"\x00" * 8 + b"whatever"
    key = good[0].project_sha256
    records = [
        LogRecord(0, 0, key, encode_turn(good[0])),
        LogRecord(0, 1, b"junk", b"\x01\x02random bytes"),
        LogRecord(0, 2, key, unknown),
        LogRecord(0, 3, gap.project_sha256, encode_turn(gap)),
        LogRecord(0, 4, key, None),
        LogRecord(0, 5, turn(project="/p/other").project_sha256, encode_turn(good[1])),  # another project's key
        LogRecord(0, 6, key, encode_turn(good[1])),
        LogRecord(0, 7, key, encode_turn(good[2])),
    ]
    summary = db.apply_batch(TOPIC, 0, records)
    assert summary == BatchSummary(records=8, appended=3, quarantined=5)
    q = sorted(
        rows(db, "quarantine", "log_offset", "code", "reason", "record_key", "record_value", "source_sha256"),
        key=lambda r: r[0],  # type: ignore[arg-type,return-value]
    )
    assert [(r[0], r[1]) for r in q] == [
        (1, Q_UNDECODABLE),
        (2, Q_UNKNOWN_SCHEMA),
        (3, Q_CHAIN),
        (4, Q_UNDECODABLE),
        (5, Q_INVALID),
    ]
    assert q[0][3:5] == (b"junk", b"\x01\x02random bytes")  # the raw bytes are kept
    assert q[1][4] == unknown and "fingerprint" in str(q[1][2])
    assert "gap" in str(q[2][2]) and q[2][5] == gap.source_sha256
    assert "partition key" in str(q[4][2])
    with db.view() as v:
        broken = v.source(gap.source_sha256)
        assert broken is not None and broken.length == 0 and broken.broken_reason and "gap" in broken.broken_reason
        ok = v.source(good[0].source_sha256)
        assert ok is not None and ok.length == 3 and ok.broken_reason is None
        assert v.head(gap.project_sha256) is None
        assert v.applied_offset(0) == 8


def test_records_on_the_wrong_partition_are_quarantined_once_the_partition_count_is_known(db: DuckProjection) -> None:
    db.bind_log(TOPIC, "id-1", 4)
    t = turn()
    home = partition_for(t.project_sha256, 4)
    wrong = (home + 1) % 4
    assert db.apply_batch(TOPIC, wrong, [LogRecord(wrong, 0, t.project_sha256, encode_turn(t))]).quarantined == 1
    assert rows(db, "quarantine", "code") == [(Q_MISPLACED,)]
    assert db.apply_batch(TOPIC, home, [LogRecord(home, 0, t.project_sha256, encode_turn(t))]).appended == 1


def test_a_first_rejected_id_then_appended_in_the_same_batch(db: DuckProjection) -> None:
    a = turn(turn_id="a")
    early = turn(turn_id="x", seq=3, body="early")  # a gap: rejected
    later = turn(turn_id="x", body="later")  # same id, other content: appended
    db.apply_batch(TOPIC, 0, to_log(place([a, early, later])))
    assert sorted(rows(db, "turn_ids", "content_digest")) == sorted(  # type: ignore[type-var]
        [(a.content_digest,), (later.content_digest,)]
    )
    # The id is now placed at 2 with the appended content: a retry of it is a duplicate; the early one,
    # other content at a later seq, amends it in place (a re-sent turn is never quarantined).
    log = [
        LogRecord(0, 3, later.project_sha256, encode_turn(later)),
        LogRecord(0, 4, early.project_sha256, encode_turn(early)),
    ]
    summary = db.apply_batch(TOPIC, 0, log)
    assert summary.duplicates == 1 and summary.rewinds == 1 and summary.quarantined == 0
    assert sorted(rows(db, "turn_ids", "content_digest")) == sorted(  # type: ignore[type-var]
        [(a.content_digest,), (early.content_digest,)]
    )
    assert rows(db, "turns", "seq", "turn_id", "body") == [(1, "a", a.body), (2, "x", "early")]


def test_many_retries_and_many_cold_sources_in_one_batch(tmp_path: Path) -> None:
    # More keys than the index-probe limit: the hash-join lookups must give the same answers.
    first = [turn(project=f"/p/{i}", turn_id=f"t{i}") for i in range(80)]
    placed = place(first + first + [turn(project=f"/p/{i}", turn_id=f"n{i}") for i in range(80)])
    log = to_log(placed)
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as a:
        a.apply_batch(TOPIC, 0, log[:80])
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC, source_cache=1) as a:  # a cold cache
        summary = a.apply_batch(TOPIC, 0, log[80:])
        assert summary == BatchSummary(records=160, appended=80, duplicates=80)
        assert_matches_book(a, book_of(placed), {0: 240})


def test_long_rewinds_move_every_superseded_turn(db: DuckProjection) -> None:
    # 2,300 turns span more buckets than the index-lookup limit; the rewind to 2 takes the scan path.
    records = [turn(turn_id=f"t{i}") for i in range(2300)]
    placed = place(records + [turn(turn_id="r", seq=2), turn(turn_id="s"), turn(turn_id="q", seq=70)])
    log = to_log(placed)
    db.apply_batch(TOPIC, 0, log[:2300])
    db.apply_batch(TOPIC, 0, log[2300:2301])
    db.apply_batch(TOPIC, 0, log[2301:])
    assert_matches_book(db, book_of(placed), {0: 2303})
    superseded = Counter(offset for (offset,) in rows(db, "superseded_turns", "superseded_offset"))
    assert superseded == {2300: 2299}


def test_rewinds_inside_and_across_batches(db: DuckProjection) -> None:
    ids = iter(range(1000))
    history = [turn(turn_id=f"a{next(ids)}") for _ in range(70)]  # seqs 1..70 (two buckets)
    history += [turn(turn_id=f"b{next(ids)}", seq=66), turn(turn_id=f"b{next(ids)}")]  # rewind in the stored part
    history += [turn(turn_id=f"c{next(ids)}", seq=60), turn(turn_id=f"c{next(ids)}", seq=61)]
    history += [turn(turn_id=f"d{next(ids)}", seq=61), turn(turn_id=f"d{next(ids)}", seq=10)]
    placed = place(history)
    log = to_log(placed)
    db.apply_batch(TOPIC, 0, log[:70])
    db.apply_batch(TOPIC, 0, log[70:73])
    db.apply_batch(TOPIC, 0, log[73:])
    assert_matches_book(db, book_of(placed), {0: len(log)})
    with db.view() as v:
        live = v.turns(turn().source_sha256, 1, 100)
        assert [t.seq for t in live] == list(range(1, 11))
        assert [t.chain_digest for t in live] == chain_digests([t.content_digest for t in live])


# ----------------------------------------------------------------------------------- batch rules


def test_batches_must_hold_one_partition_in_ascending_offsets(db: DuckProjection) -> None:
    t = encode_turn(turn())
    with pytest.raises(InvalidBatchError):
        db.apply_batch(TOPIC, 0, [LogRecord(1, 0, None, t)])
    with pytest.raises(InvalidBatchError):
        db.apply_batch(TOPIC, 0, [LogRecord(0, 3, None, t), LogRecord(0, 3, None, t)])
    with pytest.raises(InvalidBatchError):
        db.apply_batch(TOPIC, 0, [LogRecord(0, 3, None, t)], next_offset=2)
    with pytest.raises(InvalidBatchError):
        db.apply_prepared(TOPIC, [db.prepare(0, []), db.prepare(0, [])])


def test_offsets_without_records_advance_the_applied_offset(db: DuckProjection) -> None:
    db.apply_batch(TOPIC, 0, to_log(place([turn()])), next_offset=7)
    db.apply_batch(TOPIC, 1, [], next_offset=3)
    assert db.applied_offsets() == {0: 7, 1: 3}
    with db.view() as v:
        assert (v.applied_offset(0), v.applied_offset(1), v.applied_offset(2)) == (7, 3, 0)


def test_keyless_records_are_checked_by_their_project(db: DuckProjection) -> None:
    t = turn()
    assert db.apply_batch(TOPIC, 0, [LogRecord(0, 0, None, encode_turn(t))]).appended == 1


# ----------------------------------------------------------------------------------- open and read


def test_opening_rules(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with pytest.raises(ProjectionMissingError) as missing:
        DuckProjection.open(path, read_only=True)
    assert missing.value.code == "projection_missing"
    with DuckProjection.open(path, topic=TOPIC) as w:
        with pytest.raises(ProjectionBusyError):
            DuckProjection.open(path, topic=TOPIC)  # a second writer in this process
        with pytest.raises(ProjectionBusyError) as busy:
            DuckProjection.open(path, read_only=True)
        assert busy.value.retriable and busy.value.code == "projection_busy"
        w.apply_batch(TOPIC, 0, to_log(place([turn()])))
    with pytest.raises(ProjectionTopicMismatchError):
        DuckProjection.open(path, topic="another")
    with DuckProjection.open(path, read_only=True) as r:
        assert r.topic == TOPIC and r.read_only
        assert r.wait_applied(0, 1, timeout=5.0)
        assert not r.wait_applied(0, 2, timeout=5.0)  # no projector here: answered at once
        with r.view() as v:
            assert v.applied_offset(0) == 1
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE something (x INTEGER)")
    con.close()
    with pytest.raises(ProjectionIncompatibleError):
        DuckProjection.open(other)


def test_a_read_only_open_of_a_file_another_process_writes_is_busy(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    DuckProjection.open(path, topic=TOPIC).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from throughline.projector.store import DuckProjection
                p = DuckProjection.open({str(path)!r}, topic={TOPIC!r})
                print("open", flush=True)
                sys.stdin.read()
                p.close()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(ProjectionBusyError) as busy:
            DuckProjection.open(path, read_only=True)
        assert "serve" in busy.value.message
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def test_a_view_is_one_snapshot(db: DuckProjection) -> None:
    log = to_log(place([turn(turn_id=f"t{i}") for i in range(4)]))
    db.apply_batch(TOPIC, 0, log[:2])
    source = turn().source_sha256
    with db.view() as v:
        assert v.applied_offset(0) == 2
        worker = threading.Thread(target=db.apply_batch, args=(TOPIC, 0, log[2:]))
        worker.start()
        worker.join(timeout=30)
        assert db.applied_offsets() == {0: 4}
        # Committed meanwhile, but this view keeps reading its own snapshot.
        assert v.applied_offset(0) == 2
        info = v.source(source)
        assert info is not None and info.length == 2
        assert len(v.turns(source, 1, 10)) == 2
    with db.view() as v:
        assert v.applied_offset(0) == 4 and len(v.turns(source, 1, 10)) == 4


def test_wait_applied_wakes_on_commit(db: DuckProjection) -> None:
    log = to_log(place([turn(turn_id=f"t{i}") for i in range(3)]))
    assert db.wait_applied(0, 0, timeout=0.0)
    assert not db.wait_applied(0, 1, timeout=0.05)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(db.wait_applied(0, 3, timeout=30.0)))
    waiter.start()
    time.sleep(0.05)
    db.apply_batch(TOPIC, 0, log[:1])
    assert waiter.is_alive()  # offset 1 is not enough
    db.apply_batch(TOPIC, 0, log[1:])
    waiter.join(timeout=30)
    assert result == [True]


def test_stats_and_digests(db: DuckProjection) -> None:
    records = [turn(turn_id="a"), turn(turn_id="b"), turn(turn_id="c", seq=1), turn(turn_id="z", seq=9)]
    db.apply_batch(TOPIC, 0, to_log(place(records)))
    db.apply_batch(TOPIC, 1, [LogRecord(1, 0, b"k", b"garbage")])
    stats = db.stats()
    assert (stats.turns, stats.sources, stats.projects, stats.superseded, stats.quarantined, stats.broken_sources) == (
        1,
        1,
        1,
        2,
        2,
        1,
    )
    assert [
        (p.partition, p.next_offset, p.records, p.appended, p.rewinds, p.quarantined) for p in stats.partitions
    ] == [
        (0, 4, 4, 3, 1, 1),
        (1, 1, 1, 0, 0, 1),
    ]
    assert [q.offset for q in stats.latest_quarantine] == [3, 0]
    assert stats.latest_quarantine[1].value_bytes == len(b"garbage")
    assert set(db.table_digests()) == set(store_module.TABLE_ORDER)


def test_turn_ranges_are_clamped(db: DuckProjection) -> None:
    db.apply_batch(TOPIC, 0, to_log(place([turn(turn_id=f"t{i}") for i in range(5)])))
    source = turn().source_sha256
    with db.view() as v:
        assert [t.seq for t in v.turns(source, -3, 2)] == [1, 2]
        assert v.turns(source, 4, 3) == []
        assert [t.seq for t in v.turns(source, 5, 500)] == [5]
        assert v.turns(b"\x00" * 32, 1, 5) == []
        assert v.source(b"\x00" * 32) is None
        assert v.head(b"\x00" * 32) is None


def test_full_bodies_are_stored(db: DuckProjection) -> None:
    big = turn(turn_id="big", body="é" * 250_000)  # 500,000 bytes of UTF-8: the reader truncates, not the store
    db.apply_batch(TOPIC, 0, to_log(place([big])))
    with db.view() as v:
        (stored,) = v.turns(big.source_sha256, 1, 1)
    assert stored.body == big.body and stored.body_bytes == 500_000


def test_closing_leaves_no_write_ahead_log(tmp_path: Path) -> None:
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as p:
        p.apply_batch(TOPIC, 0, to_log(place([turn()])))
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.duckdb"]


def test_a_memory_limit_too_small_for_a_batch_is_raised_and_the_batch_redone(tmp_path: Path) -> None:
    records = [turn(project=f"/p/{i % 50}", turn_id=f"t{i}", body=f"{i}" * 2000) for i in range(4000)]
    placed = place(records)
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC, memory_headroom=8 * 1024 * 1024) as small:
        before = small.memory_limit
        summary = small.apply_batch(TOPIC, 0, to_log(placed))
        assert summary.appended == 4000
        assert small.memory_limit > before
    # Checked under DuckDB's own limit: reading every table sorted needs more than the batch did (its
    # rows went to the file at COMMIT, ``store.files.ROW_GROUP_SIZE``).
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as whole:
        assert_matches_book(whole, book_of(placed), {0: 4000})


def test_limit_threads_caps_duckdb_and_never_goes_below_one(tmp_path: Path) -> None:
    with DuckProjection.open(tmp_path / "threads.duckdb", topic=TOPIC) as db:
        before = db.limit_threads(2)
        # Each call returns the setting the previous one left.
        for asked, expected in ((1, 1), (0, 1), (3, 3)):
            db.limit_threads(asked)
            assert db.limit_threads(asked) == expected
        assert db.limit_threads(before) == 3


def test_table_rows_reads_one_table_of_the_projection_in_its_total_order(db: DuckProjection) -> None:
    db.apply_batch(TOPIC, 0, to_log(place([turn(turn_id=f"t{i}") for i in range(3)])))
    assert [(r["seq"], r["turn_id"]) for r in db.table_rows("turns")] == [(1, "t0"), (2, "t1"), (3, "t2")]
    assert [r["next_offset"] for r in db.table_rows("applied_offsets")] == [3]
    with pytest.raises(ValueError, match="no table"):
        db.table_rows("turns; DROP TABLE turns")
    assert len(db.table_rows("turns")) == 3
