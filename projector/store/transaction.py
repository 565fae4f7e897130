"""The apply transaction: the fold and writes of one ``DuckProjection.apply_prepared`` call.

``ApplyTransaction`` owns one DuckDB transaction (``execute``: BEGIN, fold and write, COMMIT, or
ROLLBACK on any error). It reads the projection's source cache, committed project heads and partition
counters (passed in, never changed) and leaves what the batch changed in ``states``, ``heads`` and
``counters`` for the projection to take over once the transaction committed. The commit order is
described on ``DuckProjection.apply_prepared``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import duckdb
import pyarrow as pa

from throughline.core.chain import CHAIN_ORIGIN
from throughline.core.chain_delta import ChainDelta
from throughline.core.fold import Amend, Append, Duplicate, Placement, fold_turn, rechain
from throughline.core.repair import decide_repair
from throughline.projector.exceptions import InvalidBatchError
from throughline.projector.prepare import Q_CHAIN, Item, PreparedBatch, RefusedRecord, RepairItem, SoundRecord
from throughline.projector.store import writes
from throughline.projector.store.placements import Placed, Wanted, stored_placements
from throughline.projector.store.repair_rows import (
    RepairRow,
    count_unmarked,
    insert_repairs,
    mark_quarantined,
)
from throughline.projector.store.state import PartitionCounters, SourceState
from throughline.projector.store.statements import parsed
from throughline.projector.store.values import BatchSummary
from throughline.projector.store.view import heads_past_milestones, is_milestone, turn_rows
from throughline.projector.store.writes import SOURCE_COLUMNS, Row, execute_over, fits_values, values_sql

_POINT_LOOKUPS = 32  # up to this many uncached keys are fetched by index probes, more by one hash join


_ROW_DIGEST = operator.itemgetter(6)  # a Row's chain_digest
_ROW_CONTENT = operator.itemgetter(5)  # a Row's content_digest
#: A Row's columns as ``turns`` names them (``turn_rows``).
_ROW_COLUMNS = (
    "seq",
    "turn_id",
    "completed_at_us",
    "body",
    "body_bytes",
    "content_digest",
    "chain_digest",
    "log_partition",
    "log_offset",
)


def _row_chained(row: Row, digest: bytes) -> Row:
    return (row[0], row[1], row[2], row[3], row[4], row[5], digest, row[7], row[8])


def _turn_row(it: SoundRecord, seq: int, chain_digest: bytes, partition: int) -> Row:
    """The ``turns`` row (in ``_ROW_COLUMNS`` order) that places record ``it`` at ``seq``."""
    return (
        seq,
        it.turn_id,
        it.completed_at_micros,
        it.body,
        it.body_bytes,
        it.content_digest,
        chain_digest,
        partition,
        it.offset,
    )


def stored_turn_ids(
    cur: duckdb.DuckDBPyConnection, keys: Sequence[bytes], table: pa.Table | None = None
) -> dict[bytes, bytes]:
    """The content digest of each of ``keys`` that ``turn_ids`` holds (index probes for a few keys, a
    join with ``table``, an Arrow table whose ``turn_key`` column holds at least ``keys``, for many)."""
    if not keys:
        return {}
    if len(keys) > _POINT_LOOKUPS and table is None:
        table = pa.table({"turn_key": pa.array(list(keys), pa.binary())})
    if len(keys) <= _POINT_LOOKUPS or table is None:
        sql = " UNION ALL ".join(
            f"SELECT turn_key, content_digest FROM turn_ids WHERE turn_key = ${i + 1}"  # noqa: S608
            for i in range(len(keys))
        )
        rows = cur.execute(parsed(sql), list(keys)).fetchall()
    else:
        rows = execute_over(
            cur, "SELECT t.turn_key, t.content_digest FROM turn_ids t JOIN tl_rows p ON t.turn_key = p.turn_key", table
        ).fetchall()
    wanted = set(keys)
    return {bytes(r[0]): bytes(r[1]) for r in rows if bytes(r[0]) in wanted}


def wanted_of(sound: Sequence[SoundRecord], keys: Sequence[bytes]) -> dict[bytes, Wanted]:
    """(source, turn id, seq) of the first record of each of ``keys`` (for ``stored_placements``)."""
    want = set(keys)
    out: dict[bytes, Wanted] = {}
    for it in sound:
        if it.turn_key in want and it.turn_key not in out:
            out[it.turn_key] = (it.source, it.turn_id, it.seq)
    return out


class _SourceDelta(ChainDelta[Row]):
    """One source while a batch is folded: the ``ChainDelta`` of its chain over the stored turns, its
    working state (the head as folded so far, and its broken mark) and the ``sources`` row this batch
    writes for it (``milestone``: the state at its last milestone in the batch, ``None`` when it passed
    none)."""

    __slots__ = ("milestone", "source", "state")

    def __init__(self, source: bytes, state: SourceState, stored_digest: Callable[[int], bytes]) -> None:
        super().__init__(state.length, _ROW_DIGEST, stored_digest)
        self.source = source
        self.state = state
        self.milestone: tuple[Any, ...] | None = None


class ApplyTransaction:
    """The fold and writes of one ``apply_prepared`` call, in one DuckDB transaction it owns.

    ``source_cache`` (source -> committed ``SourceState``), ``known_heads`` (project -> committed head
    source) and ``counters`` (partition -> committed ``PartitionCounters``) are the projection's, read
    only. After ``execute``: ``states`` holds the new state of every source the batch touched,
    ``heads`` the head source of every project it appended to, ``counters`` the new counters of every
    partition it applied.
    """

    def __init__(
        self,
        cur: duckdb.DuckDBPyConnection,
        topic: str,
        batches: Sequence[PreparedBatch],
        *,
        source_cache: Mapping[bytes, SourceState],
        known_heads: Mapping[bytes, bytes],
        counters: Mapping[int, PartitionCounters],
    ) -> None:
        self.cur = cur
        self.topic = topic
        self._source_cache = source_cache
        self._known_heads = known_heads
        self._counters = counters
        self.batches: list[tuple[PreparedBatch, list[Item]]] = []
        self.counters: dict[int, PartitionCounters] = {}
        self.states: dict[bytes, SourceState] = {}
        self.heads: dict[bytes, bytes] = {}  # project -> head source, for the projects this batch moved
        #: After ``fold``: each touched source's delta (its cut, pending rows and state), and the turn
        #: keys the batch placed (appended or amended) (key -> (seq, content digest, live) of the last placement).
        self.works: dict[bytes, _SourceDelta] = {}
        self.applied_now: dict[bytes, Placed] = {}
        self._folded: tuple[Any, ...] = ()
        changes = False
        for b in batches:
            current = counters.get(b.partition, PartitionCounters())
            fresh = [it for it in b.items if it.offset >= current.next_offset]  # step 1: drop applied records
            if fresh or b.next_offset > current.next_offset:
                changes = True
                self.batches.append((b, fresh))
        self.changes_anything = changes

    def execute(self, before_commit: Callable[[], None] | None = None) -> BatchSummary:
        """BEGIN, fold and write, ``before_commit()``, COMMIT; on any error ROLLBACK and re-raise (nothing of
        the batch applied)."""
        cur = self.cur
        cur.execute(parsed("BEGIN TRANSACTION"))  # step 2: BEGIN
        try:
            summary = self.fold_and_write()  # steps 3 to 10, each marked below
            # step 11: COMMIT (announced to quiet readers just before it; the rest follows in the projection)
            if before_commit is not None:
                before_commit()
            cur.execute(parsed("COMMIT"))
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass  # the transaction may already be gone (the commit itself failed)
            raise
        return summary

    # -------------------------------------------------------------- lookups inside the transaction

    def _probe_turn_ids(self, sound: list[SoundRecord]) -> tuple[set[bytes], dict[bytes, Placed], dict[bytes, bytes]]:
        """Insert the batch's turn keys into ``turn_ids`` (the keys it inserted: never applied before) and
        find where the others were last placed (``existing``); ``first``: each key's first content."""
        first: dict[bytes, bytes] = {}
        for it in sound:
            first.setdefault(it.turn_key, it.content_digest)
        if not first:
            return set(), {}, first
        keys = list(first)
        table: pa.Table | None = None
        if fits_values(2, len(keys)):
            insert = values_sql("INSERT INTO turn_ids (turn_key, content_digest)", 2, len(keys))
            params: list[Any] = [v for pair in first.items() for v in pair]
        else:
            table = pa.table(
                {"turn_key": pa.array(keys, pa.binary()), "content_digest": pa.array(list(first.values()), pa.binary())}
            )
            insert = "INSERT INTO turn_ids SELECT turn_key, content_digest FROM tl_rows"
            params = []
        cur = self.cur
        # step 3: probe turn_ids. The usual case: every id is new. A plain INSERT says so by succeeding,
        # at a third of the cost of ON CONFLICT DO NOTHING (measured: 13 ms against 40 ms for 10k keys).
        try:
            execute_over(cur, insert, table, params)
            all_new = True
        except duckdb.ConstraintException:
            all_new = False
        if all_new:
            inserted = set(keys)
            missing: list[bytes] = []
        else:
            # Some ids were applied before. The probe is the transaction's first write, so undo it
            # and probe again, this time returning which keys it inserted.
            cur.execute("ROLLBACK")
            cur.execute("BEGIN TRANSACTION")
            returning = execute_over(cur, insert + " ON CONFLICT DO NOTHING RETURNING turn_key", table, params)
            inserted = {bytes(r[0]) for r in returning.fetchall()}
            missing = [k for k in keys if k not in inserted]
        existing = stored_placements(cur, wanted_of(sound, missing)) if missing else {}
        if len(existing) != len(missing):
            raise InvalidBatchError(
                "turn_ids holds a turn key whose turn the projection has nowhere (corrupt projection?)"
            )
        return inserted, existing, first

    def _load_sources(self, sources: list[bytes]) -> dict[bytes, SourceState]:
        if not sources:
            return {}
        if len(sources) <= _POINT_LOOKUPS:
            sql = " UNION ALL ".join(
                f"SELECT {SOURCE_COLUMNS} FROM sources WHERE source_sha256 = ${i + 1}"  # noqa: S608
                for i in range(len(sources))
            )
            rows = self.cur.execute(sql, sources).fetchall()
        else:
            rows = execute_over(
                self.cur,
                f"SELECT {', '.join('s.' + c.strip() for c in SOURCE_COLUMNS.split(','))} "  # noqa: S608
                "FROM sources s JOIN tl_rows w ON s.source_sha256 = w.source_sha256",
                pa.table({"source_sha256": pa.array(sources, pa.binary())}),
            ).fetchall()
        out: dict[bytes, SourceState] = {}
        for r in rows:
            out[bytes(r[0])] = SourceState(bytes(r[1]), int(r[2]), bytes(r[3]), r[4], r[5], r[6], r[7], r[8])
        # A row is the chain as of its last milestone: the head is the last live turn past it, if any.
        past = heads_past_milestones(self.cur, {s: st.length for s, st in out.items()})
        for source, (length, digest, partition, offset) in past.items():
            st = out[source]
            st.length, st.chain_digest, st.head_partition, st.head_offset = length, digest, partition, offset
        return out

    def _stored_head(self, source: bytes, seq: int) -> tuple[Any, ...]:
        """The stored live turn ``seq`` of ``source``: its chain digest and completedAt."""
        rows = turn_rows(self.cur, ("chain_digest", "completed_at_us"), source, seq, seq)
        if not rows:
            raise InvalidBatchError(f"projection is missing live turn {seq} of a source (corrupt projection?)")
        return tuple(rows[0])

    def _stored_digest(self, source: bytes, seq: int) -> bytes:
        return bytes(self._stored_head(source, seq)[0])

    def _stored_rows(self, source: bytes, first: int, last: int) -> list[Row]:
        """Stored live turns ``first..last`` of ``source`` as rows (the turns an amend keeps)."""
        rows = turn_rows(self.cur, _ROW_COLUMNS, source, first, last)
        if len(rows) != last - first + 1:
            raise InvalidBatchError(
                f"projection is missing live turns {first}..{last} of a source (corrupt projection?)"
            )
        return [
            (int(r[0]), r[1], int(r[2]), r[3], int(r[4]), bytes(r[5]), bytes(r[6]), int(r[7]), int(r[8])) for r in rows
        ]

    def _stored_completed_at(self, source: bytes, seq: int) -> int:
        return int(self._stored_head(source, seq)[1])

    def _completed_at(self, w: _SourceDelta, seq: int) -> int:
        """``completedAt`` of live turn ``seq`` of the chain as folded so far (``fold_turn``'s ``completed_at``)."""
        if seq >= w.cut:
            return int(w.pending[seq - w.cut][2])
        return self._stored_completed_at(w.source, seq)

    def _live_below(self, source: bytes, placed: Placed, turn_id: str) -> bool:
        """Whether a turn id placed at ``placed`` before the batch is live there, for a seq below what the
        batch changed (the file's rows there are as the placement look-up found them)."""
        return placed[2]

    def _placement(self, w: _SourceDelta, placed: Placed, turn_id: str) -> Placement:
        """``fold_turn``'s ``applied`` for a turn id last placed at ``placed``: live when the chain as
        folded so far holds it at that seq. A placement of this batch is at or above the delta's cut
        (a rewind below it moved the cut below it too)."""
        seq = placed[0]
        if seq > w.state.length:
            live = False
        elif seq >= w.cut:
            live = w.pending[seq - w.cut][1] == turn_id
        else:
            live = self._live_below(w.source, placed, turn_id)
        return Placement(seq, placed[1], live)

    # -------------------------------------------------------------- the fold

    def fold_and_write(self) -> BatchSummary:
        """Fold every record in log order and write the result (inside the open transaction)."""
        summary = self.fold()
        try:
            self._write_folded()
        finally:
            self.release()
        return summary

    def release(self) -> None:
        """Drop what ``fold`` decided once it is written (or staged). Each delta's stored-digest lookup
        refers back to this transaction: kept, they made a cycle that only a full garbage-collector pass
        frees, which the projector's loop delays (``fewer_gc_passes``), so every batch's rows, bodies
        included, stayed in memory until then (peak RSS at 300k turns 1.5x the old one)."""
        self.works, self._folded = {}, ()

    def fold(self) -> BatchSummary:
        """Fold every record in log order into ``works`` and the rows to write (no write but the probe's)."""
        sound = [it for _, items in self.batches for it in items if isinstance(it, SoundRecord)]
        inserted_keys, existing, first_content = self._probe_turn_ids(sound)

        cache = self._source_cache
        wanted: list[bytes] = []
        seen: set[bytes] = set()
        repairs = [it for _, items in self.batches for it in items if type(it) is RepairItem]
        for snd in (*sound, *repairs) if repairs else sound:
            s = snd.source
            if s not in seen:
                seen.add(s)
                if s not in cache:
                    wanted.append(s)
        loaded = self._load_sources(wanted)  # step 4: heads of the sources the cache misses

        works: dict[bytes, _SourceDelta] = {}
        applied_now: dict[bytes, Placed] = {}
        heads: dict[bytes, bytes] = {}
        superseded: list[tuple[bytes, bytes, Row, int, int]] = []
        quarantine: list[tuple[Any, ...]] = []
        marks: dict[tuple[int, int], tuple[int, int]] = {}  # this batch's quarantine rows a repair marked
        repair_rows: list[RepairRow] = []
        total = BatchSummary()
        lookup = self._stored_digest

        # step 5: fold every record in log order (a repair applied at its place)
        for batch, items in self.batches:
            part = batch.partition
            records = appended = rewinds = duplicates = quarantined = 0
            for it in items:
                records += 1
                if isinstance(it, RefusedRecord):
                    quarantined += 1
                    quarantine.append(
                        (part, it.offset, it.code, it.reason, it.project_sha256, it.source, it.key, it.value)
                    )
                    continue
                if isinstance(it, RepairItem):
                    repair_rows.append(self._repair(part, it, works, loaded, quarantine, marks))
                    continue
                w = works.get(it.source)
                # A source's first record is a milestone: it creates the source's row.
                milestone = False
                if w is None:
                    state = cache.get(it.source) or loaded.get(it.source)
                    milestone = state is None
                    state = state.copy() if state is not None else SourceState(it.project_sha256)
                    w = works[it.source] = _SourceDelta(it.source, state, partial(lookup, it.source))
                st = w.state
                tk = it.turn_key
                placed = applied_now.get(tk)
                if placed is None:
                    placed = existing.get(tk)
                # The source state is the chain's head (read before the fold changes it below).
                outcome = fold_turn(
                    st,
                    it,
                    applied=None if placed is None else self._placement(w, placed, it.turn_id),
                    digest_at=w.digest_at,
                    completed_at=partial(self._completed_at, w),
                )
                if isinstance(outcome, Append):
                    seq = outcome.seq
                    if outcome.rewound_from is not None:
                        rewinds += 1
                        milestone = True
                        for row in w.rewind(seq, part, it.offset):
                            superseded.append((it.source, st.project_sha256, row, part, it.offset))
                    w.pending.append(_turn_row(it, seq, outcome.chain_digest, part))
                    st.length = seq
                    st.chain_digest = outcome.chain_digest
                    st.head_partition = part
                    st.head_offset = it.offset
                    applied_now[tk] = (seq, it.content_digest, True)
                    heads[it.project_sha256] = it.source
                    appended += 1
                    milestone = milestone or is_milestone(seq)
                elif isinstance(outcome, Duplicate):
                    duplicates += 1
                elif isinstance(outcome, Amend):
                    # Turn seq takes the record's content; the turns after it stay, chained anew (for a
                    # reader, a rewind to seq).
                    seq = outcome.seq
                    rewinds += 1
                    appended += 1
                    milestone = True
                    gone, kept = w.amend(seq, part, it.offset, partial(self._stored_rows, it.source))
                    for row in gone:
                        superseded.append((it.source, st.project_sha256, row, part, it.offset))
                    w.pending.append(_turn_row(it, seq, outcome.chain_digest, part))
                    w.pending.extend(rechain(outcome.chain_digest, kept, _ROW_CONTENT, _row_chained))
                    head = w.pending[-1]
                    st.length, st.chain_digest, st.head_partition, st.head_offset = head[0], head[6], head[7], head[8]
                    applied_now[tk] = (seq, it.content_digest, True)
                    heads[it.project_sha256] = it.source
                else:
                    quarantined += 1
                    quarantine.append(
                        (part, it.offset, Q_CHAIN, outcome.reason, it.project_sha256, it.source, it.key, it.value)
                    )
                    if st.broken_reason is None:
                        st.broken_reason = outcome.reason
                        st.broken_partition = part
                        st.broken_offset = it.offset
                        milestone = True
                if milestone:
                    w.milestone = st.row(it.source)
            summary = BatchSummary(records, appended, rewinds, duplicates, quarantined)
            total = total + summary
            before = self._counters.get(part, PartitionCounters())
            after = before.add(summary)
            after.next_offset = max(before.next_offset, batch.next_offset)
            self.counters[part] = after

        self.works, self.applied_now = works, applied_now
        self.states = {s: w.state for s, w in works.items()}
        self.heads = heads
        self._folded = (inserted_keys, first_content, existing, superseded, quarantine, marks, repair_rows, loaded)
        return total

    def _write_folded(self) -> None:
        """Write what ``fold`` decided (inside the open transaction)."""
        inserted_keys, first_content, existing, superseded, quarantine, marks, repair_rows, loaded = self._folded
        # step 6: unprobe the rejected keys, fix the content of keys placed again with other content
        writes.fix_turn_ids(self.cur, inserted_keys, self.applied_now, first_content, existing)
        if marks:
            quarantine = [(*q, *marks.get((q[0], q[1]), (None, None))) for q in quarantine]
        else:
            quarantine = [(*q, None, None) for q in quarantine]
        self._write(self.works, superseded, self.heads, quarantine, repair_rows, loaded)

    def _repair(
        self,
        part: int,
        it: RepairItem,
        works: dict[bytes, _SourceDelta],
        loaded: dict[bytes, SourceState],
        quarantine: list[tuple[Any, ...]],
        marks: dict[tuple[int, int], tuple[int, int]],
    ) -> RepairRow:
        """Apply one sound repair record at its place in the fold (``ChainBook.apply_repair``): mark the
        source's unmarked quarantined records on ``part`` below it (stored ones by an UPDATE in this
        transaction, this batch's own in ``marks``), lift the broken mark, and return its ``repairs`` row."""
        source, project_sha256 = it.source, it.project_sha256
        w = works.get(source)
        state = w.state if w is not None else (self._source_cache.get(source) or loaded.get(source))
        # A source hash is of one project: under another project's repair it is not that project's source.
        known = state is not None and state.project_sha256 == project_sha256
        batch_rows = [
            (q[0], q[1])
            for q in quarantine
            if q[0] == part
            and q[4] == project_sha256
            and q[5] == source
            and q[1] < it.offset
            and (q[0], q[1]) not in marks
        ]
        stored = count_unmarked(self.cur, part, project_sha256, source, it.offset)
        outcome = decide_repair(
            known=known,
            broken=known and state is not None and state.broken_reason is not None,
            unrepaired=stored + len(batch_rows),
        )
        if stored:
            mark_quarantined(self.cur, part, project_sha256, source, it.offset)
        for position in batch_rows:
            marks[position] = (part, it.offset)
        if outcome.cleared:
            assert state is not None  # cleared implies broken implies known
            if w is None:
                w = works[source] = _SourceDelta(source, state.copy(), partial(self._stored_digest, source))
            w.state.broken_reason = w.state.broken_partition = w.state.broken_offset = None
            w.milestone = w.state.row(source)
        length, digest = (state.length, state.chain_digest) if known and state is not None else (0, CHAIN_ORIGIN)
        return (
            part,
            it.offset,
            project_sha256,
            source,
            it.reason,
            it.produced_at_micros,
            outcome.status,
            outcome.cleared,
            outcome.marked,
            length,
            digest,
        )

    # -------------------------------------------------------------- the writes

    def _write(
        self,
        works: dict[bytes, _SourceDelta],
        superseded: list[tuple[bytes, bytes, Row, int, int]],
        heads: dict[bytes, bytes],
        quarantine: list[tuple[Any, ...]],
        repair_rows: list[RepairRow],
        loaded: Mapping[bytes, SourceState],
    ) -> None:
        cur = self.cur
        # step 7: move the stored turns a rewind or an amend superseded, and delete them
        for source, w in works.items():
            for first, last, by_p, by_o in w.cuts:
                writes.supersede_stored(cur, source, first, last, by_p, by_o)
        # step 8: this batch's superseded rows, then the new live turns
        writes.insert_superseded(cur, superseded)
        writes.insert_turns(
            cur, [(source, w.state.project_sha256, w.pending) for source, w in works.items() if w.pending]
        )
        # step 9: sources at a milestone, moved project heads, quarantine and repairs rows.
        # A source's row is written at its milestones only (``view.is_milestone``): most appends leave
        # it as it is, and readers take the head past it from the turns. A source has a row when the
        # cache holds it (every cached state was committed) or it was loaded; a new one has its first
        # record's milestone at least.
        cache = self._source_cache
        stored: list[tuple[Any, ...]] = []
        new: list[tuple[Any, ...]] = []
        for s, w in works.items():
            if w.milestone is not None:
                (stored if s in cache or s in loaded else new).append(w.milestone)
        writes.write_sources(cur, stored, new)
        # A project's head is written when it moves to another source (most appends keep it).
        known = self._known_heads
        writes.write_heads(
            cur, {project: source for project, source in heads.items() if known.get(project) != source}, known.keys()
        )
        writes.insert_quarantine(cur, quarantine)
        insert_repairs(cur, repair_rows)
        writes.write_offsets(cur, self.topic, self.counters, self._counters.keys())  # step 10: applied offsets
