"""``DuckProjection``: the projection the reader and the projector use (implements the ``Projection`` port),
a thin facade over three owners: the store (``projection_file.ProjectionFile``: the file and its
exactly-once write), the read state (``throughline.projector.read_state.ReadState``: everything reads
need in memory, published as a frozen ``ReadSnapshot``) and the staging for readers
(``staging.Stager``). It hears of each commit as the store's ``CommitListener``, reads through
``snapshots`` and waits on the read state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from throughline.core.layers import Layer, LayeredView
from throughline.core.ports import ProjectionView
from throughline.projector.exceptions import ProjectionMissingError
from throughline.projector.prepare import LogRecord, PreparedBatch, RecordLike, record_projects
from throughline.projector.read_index import DEFAULT_READ_ENTRIES
from throughline.projector.read_state import ReadState
from throughline.projector.store.durability import DEFAULT_WAL_AUTOCHECKPOINT
from throughline.projector.store.projection_file import DEFAULT_SOURCE_CACHE, CommittedBatch, ProjectionFile
from throughline.projector.store.snapshots import quiet_view, snapshot_view
from throughline.projector.store.staging import Stager, agrees
from throughline.projector.store.values import BatchSummary, ProjectionStats, QuarantineListing
from throughline.projector.store.view import DuckView, Overtaken

if TYPE_CHECKING:
    from throughline.projector.cut_manifest import CutManifest

#: The memory bound the projector's own process uses (``throughline project`` and ``replay``): DuckDB's
#: buffer cache (blocks it wrote or read) stays within this many bytes beyond what its ART indexes hold.
#: The ART indexes (about 60-100 bytes per turn) cannot be evicted by DuckDB, so the limit is raised as
#: they grow (``ProjectionFile._adapt_memory``). Handles that serve reads (``serve``, the reader) keep
#: DuckDB's default (80% of RAM) instead: with a 128 MiB cache a page of 100 turns over 1M turns took
#: ~50 ms instead of ~4 ms, because each row of an interleaved history sits in another block.
DEFAULT_MEMORY_HEADROOM = 128 * 1024 * 1024
#: Quiet reads tried before a read takes a snapshot view (``read``): a commit published by then costs one
#: statement again; one still under way makes the second try a snapshot view anyway.
QUIET_TRIES = 2
log = logging.getLogger(__name__)
T = TypeVar("T")


class DuckProjection:
    """The DuckDB projection of the topic (implements the ``Projection`` port).

    One instance per file per process. The projector writes through ``apply_prepared`` on its own
    thread; readers on any thread answer with ``read`` (or take snapshots with ``view()``) and wait for
    the projector with ``wait_applied``/``wait_settled``. A read-only handle cannot be opened while
    another process (a running projector) holds the file: use the ``serve`` HTTP API, which shares one
    handle between projector and reader.
    """

    def __init__(self, store: ProjectionFile, *, read_entries: int = DEFAULT_READ_ENTRIES) -> None:
        self._file = store
        # Everything reads need besides the turns they serve, with one owner (``throughline.projector.read_state``).
        self._reads = ReadState(store.applied_offsets(), capacity=read_entries)
        self._staging = Stager(self._reads)
        self._closed = False

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
        store = ProjectionFile.open(
            path,
            read_only=read_only,
            topic=topic,
            wal_autocheckpoint=wal_autocheckpoint,
            memory_headroom=memory_headroom,
            source_cache=source_cache,
            sync_commits=sync_commits,
        )
        try:
            return cls(store, read_entries=read_entries)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        """Close the projection (idempotent). Wakes every waiter."""
        self._close(checkpoint=True)

    def discard(self) -> None:
        """``close``, without DuckDB's checkpoint at shutdown: for a file removed next (a rebuild's old file)."""
        self._close(checkpoint=False)

    def _close(self, *, checkpoint: bool) -> None:
        with self._reads.cond:
            if self._closed:
                return
            self._closed = True
            self._reads.close()
        self._staging.close()
        self._file.close(checkpoint=checkpoint)

    def retire(self) -> None:
        """Wake every waiter and refuse new reads, as ``close`` does, while the projector in this process
        may still commit what it queued (``serve``'s switch of files: the waits go on on the new file at
        once, not after the old one's last commit); ``close`` closes the rest later."""
        with self._reads.cond:
            self._reads.close()

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
        return self._file.path

    @property
    def read_only(self) -> bool:
        """True for a read-only handle."""
        return self._file.read_only

    @property
    def topic(self) -> str | None:
        """The topic the projection was built from (``None`` until one is recorded)."""
        return self._file.topic

    @property
    def topic_id(self) -> str | None:
        """The recorded id of that topic (``None`` until a projector recorded it)."""
        return self._file.topic_id

    @property
    def partitions(self) -> int | None:
        """The recorded partition count of that topic (``None`` until a projector recorded it)."""
        return self._file.partitions

    @property
    def memory_limit(self) -> int:
        """The memory limit (bytes) this handle set on DuckDB; 0 while it set none (DuckDB's default)."""
        return self._file.memory_limit

    def bind_log(self, topic: str, topic_id: str | None, partitions: int) -> None:
        """Record the topic's id and partition count (the projector calls this once it has checked them).

        The caller compares a recorded id with the broker's before calling (``LogRewoundError``); this
        only writes what is missing or, for the partition count, what changed.
        """
        self._file.bind_log(topic, topic_id, partitions)

    def limit_threads(self, threads: int) -> int:
        """Let DuckDB use at most ``threads`` threads for this database (never fewer than one); return
        the previous setting (to restore it with another call).

        The projector leaves a core to its fetch worker while it runs: on two cores DuckDB's second
        thread only contended with the worker (measured: 4-9% faster end to end with one thread).
        """
        return self._file.limit_threads(threads)

    def checkpoint(self) -> None:
        """Write DuckDB's WAL into the file now, synced to the disk (replay does this before it renames
        its result)."""
        self._file.checkpoint()

    def applied_offsets(self) -> dict[int, int]:
        """The next offset to apply per partition, as committed (partitions never applied are absent)."""
        return dict(self._reads.snapshot.applied)

    committed_offsets = applied_offsets  # the port's name: what the file holds (staged reads may be ahead)

    def readable_offsets(self) -> dict[int, int]:
        """How far reads may answer per partition: the applied offsets, or past them where the projector in
        this process has staged records for readers (``stage``; partitions never reached are absent)."""
        return dict(self._reads.snapshot.readable)

    # ------------------------------------------------------------------ read side

    def _require_open(self) -> None:
        if self._reads.closed:
            raise ProjectionMissingError(f"projection {self._file.path} is closed")

    @contextmanager
    def view(self) -> Iterator[DuckView | LayeredView]:
        """One consistent snapshot: every answer of the yielded view is of one version, with what is staged
        above it (``snapshots.snapshot_view``)."""
        self._require_open()
        store = self._file
        with snapshot_view(store.cursors, store.topic, self._reads, read_only=store.read_only) as view:
            yield view

    @contextmanager
    def _quiet_view(self) -> Iterator[DuckView | LayeredView]:
        """``view``, without a transaction while no commit is under way (``snapshots.quiet_view``); raises
        ``Overtaken`` when a commit lands meanwhile (``read`` then reads again)."""
        self._require_open()
        store = self._file
        with quiet_view(store.cursors, store.topic, self._reads, read_only=store.read_only) as view:
            yield view

    def read(self, answer: Callable[[ProjectionView], T]) -> T:
        """``answer`` of one consistent snapshot. Tried first in a quiet view (no transaction while no
        commit is under way: on an idle projection a page is one statement); a quiet view a commit
        overtook is thrown away and ``answer`` asked again, at most ``QUIET_TRIES`` times, then in
        ``view``, which is never overtaken. So ``answer`` may run more than once and must have no
        effect beyond its result."""
        for _ in range(QUIET_TRIES):
            try:
                with self._quiet_view() as view:
                    return answer(view)
            except Overtaken:
                continue
        with self.view() as view:
            return answer(view)

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until the applied offset of ``partition`` reaches ``offset``.

        The in-process projector notifies after each commit, so a waiter wakes without polling. With no
        projector in this process (a read-only handle) the answer comes at once from a snapshot.
        """
        if self._file.read_only:
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
        if self._file.read_only:
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
        return self._file.stats(latest_quarantine=latest_quarantine)

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineListing:
        """Every quarantined record (in log order), broken source and applied repair, of one project or
        of all, read in one snapshot; never a raw record byte. ``times=False`` skips reading the
        records' values to decode when they were produced (``/metrics`` needs only the counts)."""
        return self._file.quarantine(project_sha256, times=times)

    def table_digests(self) -> dict[str, str]:
        """SHA-256 of every table's rows in a total order (identical projections have identical digests)."""
        return self._file.table_digests()

    def table_rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of one table (a key of ``TABLE_ORDER``) in its total order, as column -> value, read
        in one snapshot: what tests and audits compare a projection with (raw bytes included)."""
        return self._file.table_rows(table)

    # ------------------------------------------------------------------ write side

    def prepare(
        self, partition: int, records: Sequence[RecordLike], *, next_offset: int | None = None
    ) -> PreparedBatch:
        """``prepare_batch`` with this projection's recorded partition count (safe on any thread)."""
        return self._file.prepare(partition, records, next_offset=next_offset)

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
        ``COMMIT``, ``projection_file.ProjectionFile.write`` and this class's ``committed`` for what follows):

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
        return self._file.write(topic, batches, self)

    # ------------------------------------------------------------------ the store's CommitListener

    def writing(self) -> None:
        """The store is about to COMMIT: quiet views pause from here to the publication."""
        self._reads.writing()

    def committed(self, batch: CommittedBatch) -> None:
        """The store committed ``batch``: publish it to the read state (step 11's last part)."""
        # Before the layers holding them are dropped (``ReadState.commit``): a staged fold that no longer
        # sees a layer finds its keys in memory.
        self._staging.stored_keys.committed(batch.applied_now)
        with self._reads.cond:  # one critical section: no read sees the commit without its verdict
            if batch.forget_heads:
                self._reads.index.forget()
            layers = self._reads.commit(batch.next_offsets, batch.heads, batch.chains(), batch.projects)
            if layers and not agrees(layers, batch.states):
                log.error("a commit disagrees with the fold staged for its readers: staging is off from now on")
                self._staging.off = True
                self._reads.drop()

    def failed(self, file_version: int) -> None:
        """The store's write failed: the file's version says whether quiet views still hold."""
        self._reads.settle(file_version)

    # ------------------------------------------------------------------ staging for readers

    def stage(self, topic: str, batches: Sequence[PreparedBatch]) -> Layer | None:
        """Fold a poll for this process's readers before it is committed (``staging.Stager.stage``)."""
        self._file.require_writable()
        return self._staging.stage(self._file.connection, topic, batches, self._file.source_cache)

    def prepare_staging(self) -> None:
        """Ready ``stage`` before the first poll (``staging.Stager.prepare``), from the thread that stages."""
        self._file.require_writable()
        self._staging.prepare(self._file.connection)

    def keep_turn_keys(self) -> bool:
        """Keep the stored turn keys in memory from here on when the file holds no turn yet (a new file: no
        scan, ``StoredTurnKeys.start_empty``), to hand them to the next process (``save_turn_keys``);
        ``False``: the file has turns (nothing kept). Before the first commit."""
        self._file.require_writable()
        return self._staging.stored_keys.start_empty(self._file.connection)

    def save_turn_keys(self, path: Path) -> bool:
        """Write the kept turn keys to ``path`` for the next process to open this file (``adopt_turn_keys``),
        after the last commit; ``False`` when none are kept."""
        return self._staging.stored_keys.save(self._file.connection, path, self.applied_offsets())

    def adopt_turn_keys(self, path: Path) -> bool:
        """Take the turn keys the last process saved to ``path`` instead of scanning ``turn_ids`` for them, if
        they are exact for the file as it is (``StoredTurnKeys.adopt``); before ``prepare_staging``."""
        self._file.require_writable()
        return self._staging.stored_keys.adopt(self._file.connection, path, self.applied_offsets())

    def unstage(self) -> None:
        """Drop every staged layer (their commit failed): reads see the committed projection only."""
        self._reads.drop()

    # ------------------------------------------------------------------ projection snapshots

    def export_cut(self, out_dir: Path, partitions: Sequence[int] | None = None) -> CutManifest:
        """Write a projection snapshot of ``partitions`` (``None``: all) into the empty directory ``out_dir``
        (``projection_file.ProjectionFile.export_cut``)."""
        return self._file.export_cut(out_dir, partitions)

    def load_cut_partitions(self, cut_dir: Path, manifest: CutManifest, *, replace: bool = False) -> dict[int, int]:
        """Load a verified projection snapshot of partitions this file holds nothing of (``replace``: or is
        behind the snapshot on, their rows replaced) into it (one
        transaction, ``ProjectionFile.load_cut_partitions``) and publish the loaded applied offsets to the
        read state, so waiters wake; returns them. Call it on the writer's thread, between two writes.

        The read index's cached heads are forgotten in the publication's critical section (``committed``):
        a project of a loaded partition may be cached as having no turns at an older version. Staging for
        readers is turned off for good: its in-memory turn keys do not know the loaded ones (a group
        member, the one caller, does not stage)."""
        with self._reads.cond:
            self._staging.off = True
        return self._file.load_cut_partitions(cut_dir, manifest, self, replace=replace)
