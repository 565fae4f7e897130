"""``DuckProjection``: the handle on one projection file (open, lock, close), its write path
(``apply_prepared`` through an ``ApplyTransaction``), the layers it stages for readers before a commit
(``stage``, ``staging.Stager``), its read snapshots (``view``, ``snapshots``) and the waits readers use
for the projector in this process. What reads need in memory has one owner, ``ReadState``
(``throughline.projector.read_state``): the projection hands it each stage and commit, and reads take
its published ``ReadSnapshot``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb

from throughline.core.layers import Layer, LayeredView
from throughline.projector.exceptions import (
    InvalidBatchError,
    ProjectionMissingError,
    ProjectionReadOnlyError,
    ProjectionStorageError,
    ProjectionTopicMismatchError,
)
from throughline.projector.prepare import LogRecord, PreparedBatch, RecordLike, prepare_batch, record_projects
from throughline.projector.read_index import DEFAULT_READ_ENTRIES
from throughline.projector.read_state import ReadState
from throughline.projector.store.durability import DEFAULT_WAL_AUTOCHECKPOINT, CommitDurability
from throughline.projector.store.files import (
    STORAGE_FAULTS,
    CursorPool,
    claim_writer,
    connect,
    cursor,
    refuse_second_writer,
    release_writer,
)
from throughline.projector.store.report import read_quarantine, read_stats, table_digests, table_rows
from throughline.projector.store.schema import ensure_schema, read_meta
from throughline.projector.store.snapshots import quiet_view, snapshot_view
from throughline.projector.store.staging import Stager, agrees
from throughline.projector.store.state import PartitionCounters, SourceState, read_counters
from throughline.projector.store.transaction import ApplyTransaction
from throughline.projector.store.values import BatchSummary, ProjectionStats, QuarantineListing
from throughline.projector.store.view import DuckView, snapshot_version

#: The memory bound the projector's own process uses (``throughline project`` and ``replay``): DuckDB's
#: buffer cache (blocks it wrote or read) stays within this many bytes beyond what its ART indexes hold.
#: The ART indexes (about 60-100 bytes per turn) cannot be evicted by DuckDB, so the limit is raised as
#: they grow (``_adapt_memory``). Handles that serve reads (``serve``, the reader) keep DuckDB's default
#: (80% of RAM) instead: with a 128 MiB cache a page of 100 turns over 1M turns took ~50 ms instead
#: of ~4 ms, because each row of an interleaved history sits in another block.
DEFAULT_MEMORY_HEADROOM = 128 * 1024 * 1024
DEFAULT_SOURCE_CACHE = 100_000
_MEMORY_CHECK_EVERY = 16  # commits between two looks at the ART indexes' size
_OOM_RETRIES = 4
log = logging.getLogger(__name__)


class DuckProjection:
    """The DuckDB projection of the topic (implements the ``Projection`` port).

    One instance per file per process. The projector writes through ``apply_prepared`` on its own
    thread; readers on any thread take snapshots with ``view()`` and wait for the projector with
    ``wait_applied``. A read-only handle cannot be opened while another process (a running projector)
    holds the file: use the ``serve`` HTTP API, which shares one handle between projector and reader.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        path: Path,
        *,
        read_only: bool,
        source_cache: int = DEFAULT_SOURCE_CACHE,
        memory_headroom: int | None = None,
        read_entries: int = DEFAULT_READ_ENTRIES,
        durability: CommitDurability | None = None,
    ) -> None:
        self._con = con
        self._cursors = CursorPool(con)
        self._durability = durability
        self._memory_headroom = memory_headroom
        self._memory_limit = 0
        self._commits = 0
        self._path = path
        self._read_only = read_only
        self._write_lock = threading.Lock()
        self._closed = False
        self._cache: OrderedDict[bytes, SourceState] = OrderedDict()
        self._cache_size = max(1, source_cache)
        self._head_cache: OrderedDict[bytes, bytes] = OrderedDict()  # project -> head source, as committed
        self._writer: duckdb.DuckDBPyConnection | None = None
        meta = read_meta(con, path)
        self._topic: str | None = meta.get("topic")
        self._topic_id: str | None = meta.get("topic_id")
        self._partitions: int | None = int(meta["partitions"]) if "partitions" in meta else None
        self._counters: dict[int, PartitionCounters] = read_counters(con, self._topic)
        # Everything reads need besides the turns they serve, with one owner (``throughline.projector.read_state``).
        self._reads = ReadState({p: c.next_offset for p, c in self._counters.items()}, capacity=read_entries)
        self._changed = self._reads.cond  # the one condition: every change of the read state notifies it
        self._staging = Stager(self._reads)

    # ------------------------------------------------------------------ opening and closing

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        read_only: bool = False,
        topic: str | None = None,
        wal_autocheckpoint: int = DEFAULT_WAL_AUTOCHECKPOINT,
        memory_headroom: int | None = None,
        source_cache: int = DEFAULT_SOURCE_CACHE,
        read_entries: int = DEFAULT_READ_ENTRIES,
        sync_commits: bool = False,
    ) -> DuckProjection:
        """Open (and, when writable and new, create) a projection file.

        ``topic`` is the topic the caller means: recorded in a new projection, and an existing one built
        from another topic raises ``ProjectionTopicMismatchError``. A read-only open raises
        ``ProjectionMissingError`` when the file does not exist and ``ProjectionBusyError`` when a
        running projector holds it.

        Writable handles tune DuckDB: ``wal_autocheckpoint`` (bytes of WAL between checkpoints, which
        are synced to the disk while commits are not unless ``sync_commits``: ``store.durability``) and,
        with ``memory_headroom``, a memory limit of that many bytes beyond the ART indexes (``None``:
        DuckDB's default, 80% of RAM; the projector's CLI passes ``DEFAULT_MEMORY_HEADROOM``).
        ``source_cache`` bounds the chain heads kept in memory between batches, ``read_entries`` the
        project heads and chain heads kept for reads (``ReadIndex``).
        """
        p = Path(path)
        if not read_only:
            refuse_second_writer(p)
        con = connect(p, read_only=read_only)
        try:
            ensure_schema(con, p, read_only=read_only)
            durability = None
            if not read_only:
                durability = CommitDurability(p, wal_bytes=wal_autocheckpoint, sync_commits=sync_commits)
                durability.configure(con)
            projection = cls(
                con,
                p,
                read_only=read_only,
                source_cache=source_cache,
                memory_headroom=None if read_only else memory_headroom,
                read_entries=read_entries,
                durability=durability,
            )
            projection._adapt_memory()
            if topic is not None:
                projection._claim_topic(topic)
            if not read_only:
                claim_writer(p)
            return projection
        except BaseException:
            con.close()
            raise

    def _claim_topic(self, topic: str) -> None:
        if self._topic is not None:
            if self._topic != topic:
                raise ProjectionTopicMismatchError(
                    f"projection {self._path} was built from topic {self._topic!r}, not {topic!r}: "
                    "pass the right --topic/--db, or replay the topic into a new file"
                )
            return
        if self._read_only:
            return
        self._set_meta({"topic": topic})
        self._topic = topic

    def _set_meta(self, values: dict[str, str]) -> None:
        cur = cursor(self._con)
        try:
            cur.execute("BEGIN TRANSACTION")
            for k, v in values.items():
                cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [k, v])
            cur.execute("COMMIT")
        finally:
            cur.close()

    def close(self) -> None:
        """Close the projection (idempotent). Wakes every waiter."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            self._reads.close()
        self._staging.close()
        self._cursors.close()
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if self._durability is not None:
                self._durability.before_close(self._con)
            self._con.close()
        if not self._read_only:
            release_writer(self._path)

    def __enter__(self) -> DuckProjection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ what it was built from

    @property
    def path(self) -> Path:
        """The projection file."""
        return self._path

    @property
    def read_only(self) -> bool:
        """True for a read-only handle."""
        return self._read_only

    @property
    def topic(self) -> str | None:
        """The topic the projection was built from (``None`` until one is recorded)."""
        return self._topic

    @property
    def topic_id(self) -> str | None:
        """The recorded id of that topic (``None`` until a projector recorded it)."""
        return self._topic_id

    @property
    def partitions(self) -> int | None:
        """The recorded partition count of that topic (``None`` until a projector recorded it)."""
        return self._partitions

    @property
    def memory_limit(self) -> int:
        """The memory limit (bytes) this handle set on DuckDB; 0 while it set none (DuckDB's default)."""
        return self._memory_limit

    def bind_log(self, topic: str, topic_id: str | None, partitions: int) -> None:
        """Record the topic's id and partition count (the projector calls this once it has checked them).

        The caller compares a recorded id with the broker's before calling (``LogRewoundError``); this
        only writes what is missing or, for the partition count, what changed.
        """
        self._require_writable()
        self._claim_topic(topic)
        values: dict[str, str] = {}
        if topic_id is not None and self._topic_id is None:
            values["topic_id"] = topic_id
        if self._partitions != partitions:
            values["partitions"] = str(partitions)
        if values:
            self._set_meta(values)
            self._topic_id = values.get("topic_id", self._topic_id)
            self._partitions = partitions

    def _adapt_memory(self, *, at_least: int = 0) -> None:
        """Keep DuckDB's memory limit at the ART indexes' size plus the headroom (never lowering it)."""
        if self._memory_headroom is None:
            return
        cur = cursor(self._con)
        try:
            row = cur.execute(
                "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'ART_INDEX'"
            ).fetchone()
            indexes = int(row[0]) if row else 0
            wanted = max(at_least, indexes + self._memory_headroom)
            if wanted > self._memory_limit:
                # Raise in steps of a quarter, so a growing index does not reset the limit every batch.
                self._memory_limit = max(wanted, self._memory_limit + self._memory_limit // 4)
                cur.execute(f"SET memory_limit = '{self._memory_limit}B'")
        finally:
            cur.close()

    def limit_threads(self, threads: int) -> int:
        """Let DuckDB use at most ``threads`` threads for this database (never fewer than one); return
        the previous setting (to restore it with another call).

        The projector leaves a core to its fetch worker while it runs: on two cores DuckDB's second
        thread only contended with the worker (measured: 4-9% faster end to end with one thread).
        """
        cur = cursor(self._con)
        try:
            row = cur.execute("SELECT current_setting('threads')").fetchone()
            cur.execute(f"SET threads = {max(1, int(threads))}")
        finally:
            cur.close()
        return int(row[0]) if row else 1

    def checkpoint(self) -> None:
        """Write DuckDB's WAL into the file now, synced to the disk (replay does this before it renames
        its result)."""
        self._require_writable()
        assert self._durability is not None  # every writable handle has one
        with self._write_lock:
            cur = cursor(self._con)
            try:
                self._durability.checkpoint(cur)
            finally:
                cur.close()

    def applied_offsets(self) -> dict[int, int]:
        """The next offset to apply per partition, as committed (partitions never applied are absent)."""
        return dict(self._reads.snapshot.applied)

    committed_offsets = applied_offsets  # the port's name: what the file holds (staged reads may be ahead)

    def readable_offsets(self) -> dict[int, int]:
        """How far reads may answer per partition: the applied offsets, or past them where the projector in
        this process has staged records for readers (``stage``; partitions never reached are absent)."""
        return dict(self._reads.snapshot.readable)

    # ------------------------------------------------------------------ read side

    @contextmanager
    def view(self) -> Iterator[DuckView | LayeredView]:
        """One consistent snapshot: every answer of the yielded view is of one version, with what is staged
        above it (``snapshots.snapshot_view``)."""
        if self._closed:
            raise ProjectionMissingError(f"projection {self._path} is closed")
        with snapshot_view(self._cursors, self._topic, self._reads, read_only=self._read_only) as view:
            yield view

    @contextmanager
    def quiet_view(self) -> Iterator[DuckView | LayeredView]:
        """``view``, without a transaction while no commit is under way (``snapshots.quiet_view``); raises
        ``SnapshotMovedError`` when a commit lands meanwhile (the caller then reads again in ``view``)."""
        if self._closed:
            raise ProjectionMissingError(f"projection {self._path} is closed")
        with quiet_view(self._cursors, self._topic, self._reads, read_only=self._read_only) as view:
            yield view

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until the applied offset of ``partition`` reaches ``offset``.

        The in-process projector notifies after each commit, so a waiter wakes without polling. With no
        projector in this process (a read-only handle) the answer comes at once from a snapshot.
        """
        if self._read_only:
            with self.view() as v:
                return v.applied_offset(partition) >= offset

        def reached() -> bool:
            return offset <= 0 or self._reads.snapshot.readable.get(partition, 0) >= offset

        return self._reads.wait_until(reached, timeout)

    def fetching_from(self, offsets: Mapping[int, int]) -> None:
        """The projector's feed (re)starts at ``offsets`` (the applied offsets); see ``fetched``."""
        self._reads.fetching_from(offsets)

    def fetched(self, batches: Sequence[PreparedBatch]) -> None:
        """The projector's feed delivered ``batches`` (each partition contiguous since ``fetching_from``),
        about to be applied: until they are, ``wait_settled`` knows which projects they belong to."""
        self._reads.fetched([(b.partition, record_projects(b), b.next_offset) for b in batches])

    def wait_settled(self, partition: int, project_sha256: bytes, offset: int, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until no record of the project on ``partition`` below ``offset``
        is unapplied, as far as this projection can prove (``throughline.core.inflight``): the applied
        offset reached ``offset``, or the projector in this process has fetched up to it and none of
        the records it has not applied yet belong to the project."""
        if self._read_only:
            return self.wait_applied(partition, offset, timeout)
        return self._reads.wait_until(lambda: self._reads.settled(partition, project_sha256, offset), timeout)

    def project_changes(self, project_sha256: bytes) -> int:
        """How many commits of this process changed the project's chains (appends, rewinds, broken marks)."""
        return self._reads.project_changes(project_sha256)

    def wait_project_changed(self, project_sha256: bytes, seen: int, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until ``project_changes`` exceeds ``seen``."""
        return self._reads.wait_until(lambda: self._reads.project_changes(project_sha256) > seen, timeout)

    def stats(self, *, latest_quarantine: int = 10) -> ProjectionStats:
        """Counts and per-partition counters, read in one snapshot (no raw record bytes)."""
        return read_stats(self._con, self._topic, self._topic_id, latest_quarantine=latest_quarantine)

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineListing:
        """Every quarantined record (in log order), broken source and applied repair, of one project or
        of all, read in one snapshot; never a raw record byte. ``times=False`` skips reading the
        records' values to decode when they were produced (``/metrics`` needs only the counts)."""
        return read_quarantine(self._con, project_sha256, times=times)

    def table_digests(self) -> dict[str, str]:
        """SHA-256 of every table's rows in a total order (identical projections have identical digests)."""
        return table_digests(self._con)

    def table_rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of one table (a key of ``TABLE_ORDER``) in its total order, as column -> value, read
        in one snapshot: what tests and audits compare a projection with (raw bytes included)."""
        return table_rows(self._con, table)

    # ------------------------------------------------------------------ write side

    def _require_writable(self) -> None:
        if self._read_only:
            raise ProjectionReadOnlyError(f"projection {self._path} is open read-only")
        if self._closed:
            raise ProjectionMissingError(f"projection {self._path} is closed")

    def prepare(
        self, partition: int, records: Sequence[RecordLike], *, next_offset: int | None = None
    ) -> PreparedBatch:
        """``prepare_batch`` with this projection's recorded partition count (safe on any thread)."""
        return prepare_batch(partition, records, partitions=self._partitions, next_offset=next_offset)

    def apply_batch(
        self, topic: str, partition: int, records: Sequence[LogRecord], *, next_offset: int | None = None
    ) -> BatchSummary:
        """Apply the records of one partition in one transaction (usable without Kafka).

        Decodes, validates (``record_problem``), folds and writes everything, including the partition's
        applied offset (one past the last record, or ``next_offset``), in one DuckDB transaction.
        Records below the applied offset were applied before and are skipped.
        """
        return self.apply_prepared(topic, [self.prepare(partition, records, next_offset=next_offset)])

    def apply_prepared(self, topic: str, batches: Sequence[PreparedBatch]) -> BatchSummary:
        """Fold and write prepared batches (of distinct partitions) in ONE transaction.

        Commit order, step by step (all inside one DuckDB transaction, so a crash at any instant leaves
        either everything of the batch or nothing of it). This is the one list of the steps; each is
        marked ``# step N`` at the code that performs it (``transaction.ApplyTransaction`` for 1-11's
        ``COMMIT``, this method for what follows it):

        1. Drop records below each partition's applied offset (a re-delivered batch is a no-op).
        2. ``BEGIN TRANSACTION``.
        3. Probe ``turn_ids`` with the batch's (source, turn id) keys: one set-based plain ``INSERT``
           (ART index probes). When it succeeds (the usual case) no id was applied before. When it fails
           on a key that exists, the transaction is rolled back (nothing else was written yet), begun
           again and probed with ``INSERT ... ON CONFLICT DO NOTHING RETURNING``: keys it did not insert
           were applied before, and where each was last placed is looked up (``placements``: seq,
           content, live), for the fold's rule on a re-sent turn id.
        4. Load the heads of sources missing from the in-memory cache (index probes, or one hash join
           when many miss): each one's row, then the last live turn past it (``heads_past_milestones``).
        5. Fold every record in log order in Python (``fold_turn``), collecting new turn rows,
           superseded rows, source heads, project heads and quarantine rows. A repair record is
           applied at its place (``_repair``): it marks the source's stored quarantine rows at once
           (an ``UPDATE``) and the batch's own before they are inserted, and clears the broken mark.
        6. Remove from ``turn_ids`` the probed keys whose records were not appended (rejected), and fix
           the content digest where a later record of the batch placed that key with other content.
        7. Move stored turns that a rewind or an amend superseded into ``superseded_turns`` and delete
           them (an amend's kept turns come back among the new live turns, chained anew).
        8. Insert superseded rows of this batch, then the new live turns (Arrow tables, bulk).
        9. Write the ``sources`` rows at a milestone (``view.is_milestone``) and the moved ``project_heads``
           (UPDATE the rows that exist, INSERT the new); insert ``quarantine`` and ``repairs`` rows.
        10. Upsert ``applied_offsets`` (next offset and counters per partition).
        11. ``COMMIT``. Only now the source cache and the in-memory applied offsets take the new state,
            the layers staged for readers that this commit covers are dropped in the same step as the
            read state publishes it (``ReadState.commit``: one critical section, with the check that the
            commit wrote what its layers showed), and waiters are notified. On any error: ``ROLLBACK``, the cache is
            cleared, and the error propagates (nothing of the batch was applied), except DuckDB running
            out of memory, which raises the memory limit and redoes the batch (at most 4 times).

        A crash of the process (SIGKILL) before step 11 completes leaves DuckDB's WAL without the
        transaction; on restart the projector seeks to the old applied offset and reads the batch again.
        Commits are not ``fsync``ed (``store.durability``): a power loss may also take back transactions
        committed since the last checkpoint, with their applied offsets, and the batches are read again.
        """
        self._require_writable()
        self._claim_topic(topic)
        if self._topic != topic:  # a read-only-like state cannot happen here; keep mypy and readers honest
            raise ProjectionTopicMismatchError(f"projection is of topic {self._topic!r}, not {topic!r}")
        seen: set[int] = set()
        for b in batches:
            if b.partition in seen:
                raise InvalidBatchError(f"two batches of partition {b.partition} in one apply")
            seen.add(b.partition)
        with self._write_lock:
            if self._writer is None:
                self._writer = cursor(self._con)
            cur = self._writer
            work = self._transaction(cur, topic, batches)
            if not work.changes_anything:
                return BatchSummary()
            for attempt in range(_OOM_RETRIES + 1):
                try:
                    summary = self._execute(work)
                    break
                except duckdb.OutOfMemoryException:
                    if self._memory_headroom is None or attempt == _OOM_RETRIES:
                        raise
                    # The indexes outgrew the limit between two checks: double it and redo the batch.
                    self._adapt_memory(at_least=2 * self._memory_limit)
                    work = self._transaction(cur, topic, batches)
                except STORAGE_FAULTS as exc:
                    raise ProjectionStorageError(
                        f"cannot write the projection {self._path}: {type(exc).__name__}: {exc}; nothing of the "
                        "batch was applied: free space or fix permissions, then start the projector again"
                    ) from exc
            # step 11 (after the COMMIT): the stored keys, the caches, the read state and its waiters.
            self._commits += 1
            # Before the layers holding them are dropped (``publish``): a staged fold that no longer
            # sees a layer finds its keys in memory.
            self._staging.stored_keys.committed(work.applied_now)
            if self._commits % _MEMORY_CHECK_EVERY == 0:
                self._adapt_memory()
            for source, state in work.states.items():
                self._cache[source] = state
                self._cache.move_to_end(source)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            for project, source in work.heads.items():
                self._head_cache[project] = source
                self._head_cache.move_to_end(project)
            while len(self._head_cache) > self._cache_size:
                self._head_cache.popitem(last=False)
            self._counters.update(work.counters)
            with self._changed:  # one critical section: no read sees the commit without its verdict
                committed = self._reads.commit(
                    {p: c.next_offset for p, c in work.counters.items()},
                    work.heads,
                    {s: st.chain_head() for s, st in work.states.items()},
                    {*work.heads, *(st.project_sha256 for st in work.states.values())},
                )
                if committed and not agrees(committed, work.states):
                    log.error("a commit disagrees with the fold staged for its readers: staging is off from now on")
                    self._staging.off = True
                    self._reads.drop()
            if self._durability is not None:
                # After the readers heard of the commit: a checkpoint blocks the next write, not them.
                self._durability.after_commit(cur)
            return summary

    def stage(self, topic: str, batches: Sequence[PreparedBatch]) -> Layer | None:
        """Fold a poll for this process's readers before it is committed (``staging.Stager.stage``)."""
        self._require_writable()
        return self._staging.stage(self._con, topic, batches, self._cache)

    def unstage(self) -> None:
        """Drop every staged layer (their commit failed): reads see the committed projection only."""
        self._reads.drop()

    def _transaction(
        self, cur: duckdb.DuckDBPyConnection, topic: str, batches: Sequence[PreparedBatch]
    ) -> ApplyTransaction:
        """The transaction of one ``apply_prepared`` call, over this projection's committed state."""
        return ApplyTransaction(
            cur, topic, batches, source_cache=self._cache, known_heads=self._head_cache, counters=self._counters
        )

    def _execute(self, work: ApplyTransaction) -> BatchSummary:
        """Run one batch's transaction; on any error forget the cached heads (they may be ahead of the file)."""
        try:
            # Nothing of a write is visible before its COMMIT: quiet views pause from there to publication.
            return work.execute(before_commit=self._reads.writing)
        except BaseException:
            self._cache.clear()
            self._head_cache.clear()
            self._reads.settle(self._file_version(work.cur))
            raise

    def _file_version(self, cur: duckdb.DuckDBPyConnection) -> int:
        """The file's version after a failed write (-1 when it cannot be read: quiet views stay off)."""
        try:
            return snapshot_version(cur, self._topic)
        except duckdb.Error:
            return -1

    # ------------------------------------------------------------------ projection snapshots

    def export_cut(self, out_dir: Path, partitions: Sequence[int] | None = None) -> Any:
        """Write a projection snapshot of ``partitions`` (``None``: all) into the empty directory ``out_dir``
        and return its ``CutManifest``: one read transaction on a pooled cursor, so the rows and applied
        offsets are those of one commit and the projector is never held up
        (``throughline.projector.store.cut_files``)."""
        from throughline.projector.store.cut_files import write_cut

        with self._cursors.borrowed() as cur:
            return write_cut(cur, out_dir, partitions)
