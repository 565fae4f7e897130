"""Properties of repairs in the reference fold (``ChainBook.apply_repair``): histories with breaks and repairs.

A history is a list of turn records (appends, rewinds, gaps, retries, conflicting ids, unsound ones)
with repair records put in between: repairs of sources the history has, of sources it never had, of
another project's source, and poison ones (a wrong partition key, an empty reason). The properties:
a repair never changes a chain; ``broken`` is exactly the sources with a fold-rejected record no repair
marked; each quarantined record is marked by the first sound repair of its source after it on its
partition; after a repair the next seq appends; the same history folds into the same book.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st
from projector_histories import PARTITIONS, PROJECTS, Entry, logs, turn

from throughline.core.fold import Append, ChainBook, Reject, record_problem
from throughline.core.partitioning import partition_for
from throughline.core.repair import (
    NOT_BROKEN,
    REPAIRED,
    UNKNOWN_SOURCE,
    RepairOutcome,
    RepairRecord,
    build_repair,
)
from throughline.core.turn import TurnRecord


def fold(entries: list[Entry], book: ChainBook | None = None) -> ChainBook:
    book = book if book is not None else ChainBook()
    for e in entries:
        book.apply_record(e.record, e.partition, e.offset, e.key)
    return book


def rejected_by_fold(entries: list[Entry]) -> set[tuple[int, int]]:
    """Positions of the turns the fold rejected (gaps, re-used ids), as opposed to unsound records."""
    book = ChainBook()
    out: set[tuple[int, int]] = set()
    for e in entries:
        if isinstance(e.record, TurnRecord):
            outcome = book.apply(e.record, e.partition, e.offset, e.key)
            if isinstance(outcome, Reject) and record_problem(e.record, e.key) is None:
                out.add((e.partition, e.offset))
    return out


def chains(book: ChainBook) -> tuple[object, ...]:
    return (book.live, book.applied, book.superseded, book.heads)


@settings(max_examples=200, deadline=None)
@given(logs())
def test_what_repairs_do_in_any_history(entries: list[Entry]) -> None:
    book = fold(entries)
    # A repair never changes a chain: the book equals the fold of the turns alone, chain for chain.
    assert chains(book) == chains(fold([e for e in entries if isinstance(e.record, TurnRecord)]))
    # Poison repairs are quarantined; sound ones are recorded, never quarantined.
    sound = {(r.partition, r.offset) for r in book.repairs}
    poison = {(e.partition, e.offset) for e in entries if isinstance(e.record, RepairRecord)} - sound
    quarantined = {(p, o) for p, o, _ in book.quarantined}
    assert poison <= quarantined and not sound & quarantined
    # Broken is exactly the sources with a fold-rejected record that no repair marked.
    rejected = rejected_by_fold(entries)
    assert book.broken == {book.quarantine_identity[pos][1] for pos in rejected if pos not in book.repaired}
    # Each quarantined record is marked by the first sound repair of its source after it on its partition.
    for (partition, offset), (project, source) in book.quarantine_identity.items():
        later = [
            r
            for r in book.repairs
            if (r.project_sha256, r.source_sha256, r.partition) == (project, source, partition) and r.offset > offset
        ]
        assert book.repaired.get((partition, offset)) == ((later[0].partition, later[0].offset) if later else None)
    for r in book.repairs:
        marked = sum(1 for by in book.repaired.values() if by == (r.partition, r.offset))
        assert r.outcome.marked == marked
        assert r.outcome.status in (REPAIRED, NOT_BROKEN, UNKNOWN_SOURCE)
        assert (r.outcome.status == REPAIRED) == (marked > 0 or r.outcome.cleared)


@settings(max_examples=100, deadline=None)
@given(logs(), st.data())
def test_after_a_repair_the_next_seq_appends_and_the_source_is_served_again(
    entries: list[Entry], data: st.DataObject
) -> None:
    book = fold(entries)
    broken = sorted(book.broken)
    if not broken:
        return
    source = data.draw(st.sampled_from(broken), label="source")
    project = book.source_projects[source]
    partition = partition_for(project, PARTITIONS)
    offset = 1 + max((e.offset for e in entries if e.partition == partition), default=-1)
    before = copy.deepcopy(book)
    outcome = book.apply_repair(RepairRecord(project, source, "accepted"), partition, offset, project)
    assert isinstance(outcome, RepairOutcome) and outcome.status == REPAIRED and outcome.cleared
    assert source not in book.broken
    assert chains(book) == chains(before)  # the chain as applied is what the repair accepted
    assert (book.repairs[-1].length, book.repairs[-1].chain_digest) == (
        book.head_of(source).length,
        book.head_of(source).chain_digest,
    )
    # A turn of that source with the next seq folds onto the accepted chain.
    some = next(e.record for e in entries if isinstance(e.record, TurnRecord) and e.record.source_sha256 == source)
    length = book.head_of(source).length
    nxt = turn(some.project, some.host, some.thread, "after-the-repair", seq=length + 1)
    appended = book.apply(nxt, partition, offset + 1, project)
    assert isinstance(appended, Append) and appended.seq == length + 1
    assert source not in book.broken
    # A second repair finds nothing to do.
    again = book.apply_repair(RepairRecord(project, source, "again"), partition, offset + 2, project)
    assert again == RepairOutcome(NOT_BROKEN, False, 0)


@settings(max_examples=100, deadline=None)
@given(logs(), st.data())
def test_the_same_history_folds_into_the_same_book(entries: list[Entry], data: st.DataObject) -> None:
    whole = fold(entries)
    assert fold(entries) == whole  # a replay of the log
    cut = data.draw(st.integers(0, len(entries)), label="cut")
    resumed = fold(entries[cut:], copy.deepcopy(fold(entries[:cut])))  # stopped and resumed anywhere
    assert resumed == whole


def test_a_source_broken_again_after_a_repair_needs_another_repair() -> None:
    book = ChainBook()
    p = turn().project_sha256
    source = turn().source_sha256
    book.apply(turn(turn_id="a"), 0, 0, p)
    assert isinstance(book.apply(turn(turn_id="c", seq=3), 0, 1, p), Reject)  # gap: broken
    first = book.apply_repair(RepairRecord(p, source, "seq 2 lost"), 0, 2, p)
    assert first == RepairOutcome(REPAIRED, True, 1) and source not in book.broken
    assert isinstance(book.apply(turn(turn_id="b", seq=2), 0, 3, p), Append)
    assert isinstance(book.apply(turn(turn_id="e", seq=5), 0, 4, p), Reject)  # another gap
    assert source in book.broken
    assert book.repaired == {(0, 1): (0, 2)}  # the new record is not covered by the old repair
    second = book.apply_repair(RepairRecord(p, source, "seq 3, 4 lost"), 0, 5, p)
    assert second == RepairOutcome(REPAIRED, True, 1)
    assert book.repaired == {(0, 1): (0, 2), (0, 4): (0, 5)} and source not in book.broken


def test_repairs_of_unknown_and_foreign_sources_change_nothing() -> None:
    book = ChainBook()
    alpha, beta = turn(project=PROJECTS[0]), turn(project=PROJECTS[1])
    book.apply(alpha, 0, 0, alpha.project_sha256)
    book.apply(turn(project=PROJECTS[0], turn_id="x", seq=9), 0, 1, alpha.project_sha256)
    unknown = build_repair(project=PROJECTS[0], host="nobody", thread="t", reason="typo")
    assert book.apply_repair(unknown, 0, 2, alpha.project_sha256) == RepairOutcome(UNKNOWN_SOURCE, False, 0)
    # alpha's broken source named under beta's project: not beta's source, so nothing happens.
    foreign = RepairRecord(beta.project_sha256, alpha.source_sha256, "wrong project")
    assert book.apply_repair(foreign, 0, 3, beta.project_sha256) == RepairOutcome(UNKNOWN_SOURCE, False, 0)
    assert book.broken == {alpha.source_sha256} and book.repaired == {}


def test_a_poison_repair_is_quarantined_and_repairs_nothing() -> None:
    book = ChainBook()
    t = turn()
    book.apply(turn(turn_id="x", seq=4), 0, 0, t.project_sha256)
    wrong_key = book.apply_repair(RepairRecord(t.project_sha256, t.source_sha256, "ok"), 0, 1, bytes(32))
    no_reason = book.apply_repair(RepairRecord(t.project_sha256, t.source_sha256, " "), 0, 2, t.project_sha256)
    assert isinstance(wrong_key, Reject) and "partition key" in wrong_key.reason
    assert isinstance(no_reason, Reject)
    assert [q[:2] for q in book.quarantined] == [(0, 0), (0, 1), (0, 2)]
    assert book.broken == {t.source_sha256} and book.repairs == [] and book.repaired == {}
    # A later sound repair marks the poison repairs too: every quarantined record of the source before it.
    assert book.apply_repair(RepairRecord(t.project_sha256, t.source_sha256, "ok"), 0, 3, t.project_sha256) == (
        RepairOutcome(REPAIRED, True, 3)
    )
