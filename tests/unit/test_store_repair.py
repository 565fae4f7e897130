"""The DuckDB projection applies repair records as the reference fold does (``ChainBook.apply_repair``).

Histories of turns and repairs (``projector_histories.logs``: repairs of known, unknown and foreign
sources, poison ones) are applied in batches cut anywhere, so a repair lands in the same batch as the
break it repairs or in a later one; the tables must match the book and not depend on the cuts. Reads
go through the projection's in-memory read index, which a repair's commit must update.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projector_histories import TOPIC, Entry, apply_whole, by_partition, entries_log, logs, one_and_many, turn
from test_fold_repair import fold
from test_store import rows

from throughline.core.fold import ChainBook
from throughline.core.memory import FixedLog
from throughline.core.partitioning import partition_for
from throughline.core.repair import NOT_BROKEN, REPAIRED, RepairRecord
from throughline.projector.exceptions import ProjectionIncompatibleError
from throughline.projector.prepare import Q_INVALID, Q_MISPLACED, RefusedRecord, RepairItem, prepare_batch
from throughline.projector.store import DuckProjection, LogRecord
from throughline.reader import read_observer_turn_page
from throughline.reader.exceptions import SourceQuarantinedError
from throughline.schemas.codec import encode_repair, encode_turn

KEY = bytes(range(32))


def assert_repairs_match(projection: DuckProjection, book: ChainBook) -> None:
    """Quarantine marks, repairs, broken marks and chains as the book holds them."""
    marks = rows(projection, "quarantine", "log_partition", "log_offset", "repaired_partition", "repaired_offset")
    assert {(p, o): (rp, ro) for p, o, rp, ro in marks if ro is not None} == book.repaired
    assert sorted((p, o) for p, o, _, _ in marks) == sorted((p, o) for p, o, _ in book.quarantined)
    stored = rows(
        projection,
        "repairs",
        "log_partition",
        "log_offset",
        "project_sha256",
        "source_sha256",
        "reason",
        "outcome",
        "cleared",
        "marked",
        "length",
        "chain_digest",
    )
    assert stored == sorted(
        (
            r.partition,
            r.offset,
            r.project_sha256,
            r.source_sha256,
            r.reason,
            r.outcome.status,
            r.outcome.cleared,
            r.outcome.marked,
            r.length,
            r.chain_digest,
        )
        for r in book.repairs
    )
    broken = {r["source_sha256"] for r in projection.table_rows("sources") if r["broken_reason"] is not None}
    assert broken == book.broken
    turns = rows(projection, "turns", "source_sha256", "seq", "chain_digest")
    assert sorted(turns) == sorted((s, t.seq, t.chain_digest) for s, ts in book.live.items() for t in ts)
    with projection.view() as v:  # through the read index
        for source in book.live:
            info = v.source(source)
            assert info is not None and (info.broken_reason is not None) == (source in book.broken)


def apply_cut(projection: DuckProjection, log: list[LogRecord], cuts: list[int]) -> None:
    """Apply ``log`` with both partitions in each transaction, ``cuts`` records of each at a time."""
    parts = by_partition(log)
    at = dict.fromkeys(parts, 0)
    i = 0
    while any(at[p] < len(parts[p]) for p in parts):
        n = cuts[i % len(cuts)]
        i += 1
        batches = []
        for p, recs in parts.items():
            if at[p] < len(recs):
                batches.append(projection.prepare(p, recs[at[p] : at[p] + n]))
                at[p] += n
        projection.apply_prepared(TOPIC, batches)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_repairs_fold_like_the_reference_book_whatever_the_batches(entries: list[Entry], cuts: list[int]) -> None:
    log = entries_log(entries)
    book = fold(entries)
    with one_and_many(source_cache=1) as (one, many):
        apply_whole(one, log)  # every repair in the batch of the records it repairs
        apply_cut(many, log, cuts)  # repairs in later batches, sources evicted from the cache
        assert_repairs_match(one, book)
        assert_repairs_match(many, book)
        assert one.table_digests() == many.table_digests()


def _gap_log() -> tuple[list[LogRecord], bytes, bytes]:
    first = turn(turn_id="a", seq=1)
    p, s = first.project_sha256, first.source_sha256
    log = [
        LogRecord(0, 0, p, encode_turn(first)),
        LogRecord(0, 1, p, encode_turn(turn(turn_id="c", seq=3))),  # a gap: broken
    ]
    return log, p, s


def _read(projection: DuckProjection) -> object:
    return read_observer_turn_page(
        project=turn().project,
        projection=projection,
        log=FixedLog(1, projection.applied_offsets()),
        token_key=KEY,
        wait_timeout=0,
    )


def test_a_repair_serves_the_source_again_through_the_read_index(db: DuckProjection) -> None:
    log, p, s = _gap_log()
    db.apply_batch(TOPIC, 0, log)
    with pytest.raises(SourceQuarantinedError) as refused:
        _read(db)  # the read index now holds the broken chain head
    assert "throughline quarantine" in refused.value.message and "throughline repair" in refused.value.message
    changes = db.project_changes(p)
    db.apply_batch(TOPIC, 0, [LogRecord(0, 2, p, encode_repair(RepairRecord(p, s, "turn b lost")))])
    assert db.project_changes(p) == changes + 1  # a long-poll on the project wakes
    page = _read(db)
    assert [t.seq for t in page.turns] == [1]  # type: ignore[attr-defined]
    # The next seq appends and is served; the quarantined record stays, marked.
    db.apply_batch(TOPIC, 0, [LogRecord(0, 3, p, encode_turn(turn(turn_id="b", seq=2)))])
    assert [t.seq for t in _read(db).turns] == [1, 2]  # type: ignore[attr-defined]
    listing = db.quarantine()
    assert [(q.offset, q.repaired_by) for q in listing.records] == [(1, (0, 2))]
    assert listing.broken == ()
    ((repair),) = listing.repairs
    assert (repair.offset, repair.outcome, repair.marked, repair.length) == (2, REPAIRED, 1, 1)
    stats = db.stats()
    assert (stats.broken_sources, stats.repaired, stats.repairs) == (0, 1, 1)
    assert stats.latest_quarantine[0].repaired_by == (0, 2)


def test_a_repair_in_the_batch_of_its_break_and_a_second_one_that_finds_nothing(db: DuckProjection) -> None:
    log, p, s = _gap_log()
    log.append(LogRecord(0, 2, p, encode_repair(RepairRecord(p, s, "accept"))))
    log.append(LogRecord(0, 3, p, encode_repair(RepairRecord(p, s, "again"))))
    db.apply_batch(TOPIC, 0, log)
    outcomes = [(r.offset, r.outcome, r.marked) for r in db.quarantine().repairs]
    assert outcomes == [(2, REPAIRED, 1), (3, NOT_BROKEN, 0)]
    assert [t.seq for t in _read(db).turns] == [1]  # type: ignore[attr-defined]


def test_poison_and_misplaced_repairs_are_quarantined_and_the_batch_pickles() -> None:
    t = turn()
    p, s = t.project_sha256, t.source_sha256
    records = [
        LogRecord(0, 0, p, encode_turn(t)),
        LogRecord(0, 1, p, encode_repair(RepairRecord(p, s, "fine"))),
        LogRecord(0, 2, p, encode_repair(RepairRecord(p, s, " "))),
        LogRecord(0, 3, bytes(32), encode_repair(RepairRecord(p, s, "wrong key"))),
    ]
    batch = prepare_batch(0, records)
    kinds = [type(it).__name__ for it in batch.items]
    assert kinds == ["SoundRecord", "RepairItem", "RefusedRecord", "RefusedRecord"]
    assert all(it.code == Q_INVALID and it.source == s for it in batch.items if isinstance(it, RefusedRecord))
    assert pickle.loads(pickle.dumps(batch)) == batch  # across the fetch worker's pipe
    assert batch.items[1] == RepairItem(1, p, s, "fine", 0)
    other = 1 - partition_for(p, 2)  # not the project's partition
    (item,) = prepare_batch(other, [LogRecord(other, 0, p, records[1].value)], partitions=2).items
    assert isinstance(item, RefusedRecord) and item.code == Q_MISPLACED and item.source == s


def test_an_older_projection_file_is_refused_with_a_replay_hint(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    DuckProjection.open(path, topic=TOPIC).close()
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(ProjectionIncompatibleError) as err:
        DuckProjection.open(path, topic=TOPIC)
    assert "schema version '1'" in err.value.message and "throughline replay --db NEW_FILE" in err.value.message
