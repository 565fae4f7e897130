"""``ProjectionFile``: the store. It owns one projection file (open, lock, close, what it was built from) and
its exactly-once write (``write``, through an ``ApplyTransaction``), with the committed state a writer
keeps between batches (the chains' heads, the projects' heads, the partition counters). It holds no
reader machinery: ``DuckProjection`` (``projection``) is the facade that adds the read state, the
staging for readers and the waits, and hears of each commit through a ``CommitListener``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import duckdb

from throughline.projector.exceptions import (
    InvalidBatchError,
    ProjectionMissingError,
    ProjectionReadOnlyError,
    ProjectionStorageError,
    ProjectionTopicMismatchError,
)
from throughline.projector.prepare import PreparedBatch, RecordLike, prepare_batch
from throughline.projector.read_index import ChainHead
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
from throughline.projector.store.placements import Placed
from throughline.projector.store.report import read_quarantine, read_stats, table_digests, table_rows
from throughline.projector.store.schema import ensure_schema, read_meta
from throughline.projector.store.state import PartitionCounters, SourceState, read_counters
from throughline.projector.store.transaction import ApplyTransaction
from throughline.projector.store.values import BatchSummary, ProjectionStats, QuarantineListing
from throughline.projector.store.view import snapshot_version

if TYPE_CHECKING:
    from throughline.projector.cut_manifest import CutManifest

DEFAULT_SOURCE_CACHE = 100_000
_MEMORY_CHECK_EVERY = 16  # commits between two looks at the ART indexes' size
_OOM_RETRIES = 4
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    """What one ``write`` committed, as its listener hears it (never mutated after the COMMIT).

    ``applied_now``: the turn keys it placed (and where); ``next_offsets``: each written partition's next
    offset; ``heads``: the projects whose head source moved, and to which; ``states``: the sources it
    changed, as committed; ``projects``: every project it changed.
    """

    applied_now: Mapping[bytes, Placed]
    next_offsets: Mapping[int, int]
    heads: Mapping[bytes, bytes]
    states: Mapping[bytes, SourceState]
    projects: frozenset[bytes]
    #: A snapshot's partitions were loaded: every cached head may be stale (none is carried here).
    forget_heads: bool = False

    def chains(self) -> dict[bytes, ChainHead]:
        """What a read needs of each source the batch changed."""
        return {s: st.chain_head() for s, st in self.states.items()}


class CommitListener(Protocol):
    """Who hears of a ``ProjectionFile.write``: the facade's read state (``DuckProjection``).

    Every method is called on the writing thread while the file's write lock is held, in this order for
    one write: ``writing`` just before its COMMIT, then ``committed`` once it committed (after the
    file's own caches took the new state, before the checkpoint that may follow), or ``failed`` when it
    did not. A listener must not write to the file from these calls.
    """

    def writing(self) -> None:
        """A COMMIT is about to run: nothing of it is visible before it returns."""
        ...

    def committed(self, batch: CommittedBatch) -> None:
        """The write committed ``batch``."""
        ...

    def failed(self, file_version: int) -> None:
        """The write failed (nothing of it was applied); ``file_version`` is the file's version read after
        the failure (-1 when it could not be read)."""
        ...


class ProjectionFile:
    """One projection file and its exactly-once write path (the store under ``DuckProjection``).

    One instance per file per process. ``write`` runs on the projector's thread (one writer at a time:
    the write lock); reports (``stats``, ``quarantine``, digests) and read cursors (``cursors``) are safe
    on any thread.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        path: Path,
        *,
        read_only: bool,
        source_cache: int = DEFAULT_SOURCE_CACHE,
        memory_headroom: int | None = None,
        durability: CommitDurability | None = None,
    ) -> None:
        self._con = con
        #: Cursors for reads of this file, borrowed per read (closed with the file).
        self.cursors = CursorPool(con)
        self._durability = durability
        self._memory_headroom = memory_headroom
        self._memory_limit = 0
        self._commits = 0
        self._path = path
        self._read_only = read_only
        self._write_lock = threading.Lock()
        self.closed = False
        self._cache: OrderedDict[bytes, SourceState] = OrderedDict()
        self._cache_size = max(1, source_cache)
        self._head_cache: OrderedDict[bytes, bytes] = OrderedDict()  # project -> head source, as committed
        self._writer: duckdb.DuckDBPyConnection | None = None
        meta = read_meta(con, path)
        self._topic: str | None = meta.get("topic")
        self._topic_id: str | None = meta.get("topic_id")
        self._partitions: int | None = int(meta["partitions"]) if "partitions" in meta else None
        self._counters: dict[int, PartitionCounters] = read_counters(con, self._topic)

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
        sync_commits: bool = False,
    ) -> ProjectionFile:
        """Open (and, when writable and new, create) a projection file (``DuckProjection.open`` says how)."""
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
            store = cls(
                con,
                p,
                read_only=read_only,
                source_cache=source_cache,
                memory_headroom=None if read_only else memory_headroom,
                durability=durability,
            )
            store._adapt_memory()
            if topic is not None:
                store._claim_topic(topic)
            if not read_only:
                claim_writer(p)
            return store
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

    def close(self, *, checkpoint: bool = True) -> None:
        """Close the file (idempotent): the read cursors first, then the writer's, after a write under way.
        ``checkpoint=False``: without DuckDB's checkpoint at shutdown (a file removed next: writing its WAL
        into it would only take a core, and for a large WAL seconds); what it committed stays in its WAL."""
        if self.closed:
            return
        self.closed = True
        self.cursors.close()
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if not checkpoint and not self._read_only:
                with contextlib.suppress(duckdb.Error):
                    self._con.execute("PRAGMA disable_checkpoint_on_shutdown")
            elif self._durability is not None:
                self._durability.before_close(self._con)
            self._con.close()
        if not self._read_only:
            release_writer(self._path)

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

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The file's connection, for cursors of this process (the staged fold's, reports')."""
        return self._con

    @property
    def source_cache(self) -> Mapping[bytes, SourceState]:
        """The chains' heads as committed, kept between writes (read by the staged fold on the writer's
        thread only)."""
        return self._cache

    def applied_offsets(self) -> dict[int, int]:
        """The next offset to apply per partition, as committed when the file was opened or last written."""
        return {p: c.next_offset for p, c in self._counters.items()}

    def bind_log(self, topic: str, topic_id: str | None, partitions: int) -> None:
        """Record the topic's id and partition count (``DuckProjection.bind_log``)."""
        self.require_writable()
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
        """Let DuckDB use at most ``threads`` threads (``DuckProjection.limit_threads``); return the previous."""
        cur = cursor(self._con)
        try:
            row = cur.execute("SELECT current_setting('threads')").fetchone()
            cur.execute(f"SET threads = {max(1, int(threads))}")
        finally:
            cur.close()
        return int(row[0]) if row else 1

    def checkpoint(self) -> None:
        """Write DuckDB's WAL into the file now, synced to the disk."""
        self.require_writable()
        assert self._durability is not None  # every writable handle has one
        with self._write_lock:
            cur = cursor(self._con)
            try:
                self._durability.checkpoint(cur)
            finally:
                cur.close()

    # ------------------------------------------------------------------ reports (one snapshot each)

    def stats(self, *, latest_quarantine: int = 10) -> ProjectionStats:
        """Counts and per-partition counters, read in one snapshot (no raw record bytes)."""
        return read_stats(self._con, self._topic, self._topic_id, latest_quarantine=latest_quarantine)

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineListing:
        """The quarantine listing of one project or of all (``DuckProjection.quarantine``)."""
        return read_quarantine(self._con, project_sha256, times=times)

    def table_digests(self) -> dict[str, str]:
        """SHA-256 of every table's rows in a total order (identical projections have identical digests)."""
        return table_digests(self._con)

    def table_rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of one table in its total order (``DuckProjection.table_rows``)."""
        return table_rows(self._con, table)

    def export_cut(self, out_dir: Path, partitions: Sequence[int] | None = None) -> CutManifest:
        """Write a projection snapshot of ``partitions`` (``None``: all) into the empty directory ``out_dir``
        and return its manifest: one read transaction on a pooled cursor, so the rows and applied offsets
        are those of one commit and the writer is never held up (``cut_files``)."""
        from throughline.projector.store.cut_files import write_cut

        with self.cursors.borrowed() as cur:
            return write_cut(cur, out_dir, partitions)

    def load_cut_partitions(
        self, cut_dir: Path, manifest: CutManifest, listener: CommitListener, *, replace: bool = False
    ) -> dict[int, int]:
        """Insert a verified snapshot's partitions into this file, which holds nothing of them (``replace``:
        or is behind the snapshot on them, their rows replaced), in one transaction
        (``cut_files.load_cut_partitions``); ``listener`` hears of it as of a write (its
        ``committed`` carries the loaded partitions' next offsets and ``forget_heads``, no heads). Returns those next offsets."""
        from throughline.projector.store.cut_files import load_cut_partitions

        self.require_writable()
        with self._write_lock:
            if self._writer is None:
                self._writer = cursor(self._con)
            cur = self._writer
            listener.writing()
            try:
                loaded = load_cut_partitions(cur, cut_dir, manifest, replace=replace)
            except BaseException:
                listener.failed(self._file_version(cur))
                raise
            # The caches hold committed heads; the loaded projects' heads are read from the file again.
            self._cache.clear()
            self._head_cache.clear()
            for partition, row in loaded.items():
                self._counters[partition] = PartitionCounters(row[0], BatchSummary(*row[1:]))
            self._topic = manifest.topic
            self._topic_id = self._topic_id or manifest.topic_id
            self._partitions = manifest.partition_count
            next_offsets = {p: row[0] for p, row in loaded.items()}
            listener.committed(CommittedBatch({}, next_offsets, {}, {}, frozenset(), forget_heads=True))
            if self._durability is not None:
                self._durability.after_commit(cur)
            return next_offsets

    # ------------------------------------------------------------------ the write

    def require_writable(self) -> None:
        """Raise unless this handle may write (open, not read-only)."""
        if self._read_only:
            raise ProjectionReadOnlyError(f"projection {self._path} is open read-only")
        if self.closed:
            raise ProjectionMissingError(f"projection {self._path} is closed")

    def prepare(
        self, partition: int, records: Sequence[RecordLike], *, next_offset: int | None = None
    ) -> PreparedBatch:
        """``prepare_batch`` with this file's recorded partition count (safe on any thread)."""
        return prepare_batch(partition, records, partitions=self._partitions, next_offset=next_offset)

    def write(self, topic: str, batches: Sequence[PreparedBatch], listener: CommitListener) -> BatchSummary:
        """Fold and write prepared batches (of distinct partitions) in ONE transaction; ``listener`` hears
        of it. The commit order is ``DuckProjection.apply_prepared``'s; steps 1-11's COMMIT are marked in
        ``transaction.ApplyTransaction``, what follows the COMMIT here."""
        self.require_writable()
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
                    summary = self._execute(work, listener)
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
            # step 11 (after the COMMIT): the caches, then the listener (the read state and its waiters).
            self._commits += 1
            if self._commits % _MEMORY_CHECK_EVERY == 0:
                self._adapt_memory()
            # Before the listener drops the layers holding them: a staged fold that no longer sees a
            # layer finds the source in this cache.
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
            listener.committed(
                CommittedBatch(
                    work.applied_now,
                    {p: c.next_offset for p, c in work.counters.items()},
                    work.heads,
                    work.states,
                    frozenset({*work.heads, *(st.project_sha256 for st in work.states.values())}),
                )
            )
            if self._durability is not None:
                # After the readers heard of the commit: a checkpoint blocks the next write, not them.
                self._durability.after_commit(cur)
            return summary

    def _transaction(
        self, cur: duckdb.DuckDBPyConnection, topic: str, batches: Sequence[PreparedBatch]
    ) -> ApplyTransaction:
        """The transaction of one ``write``, over this file's committed state."""
        return ApplyTransaction(
            cur, topic, batches, source_cache=self._cache, known_heads=self._head_cache, counters=self._counters
        )

    def _execute(self, work: ApplyTransaction, listener: CommitListener) -> BatchSummary:
        """Run one batch's transaction; on any error forget the cached heads (they may be ahead of the file)."""
        try:
            # Nothing of a write is visible before its COMMIT: the listener hears of it just before.
            return work.execute(before_commit=listener.writing)
        except BaseException:
            self._cache.clear()
            self._head_cache.clear()
            listener.failed(self._file_version(work.cur))
            raise

    def _file_version(self, cur: duckdb.DuckDBPyConnection) -> int:
        """The file's version after a failed write (-1 when it cannot be read)."""
        try:
            return snapshot_version(cur, self._topic)
        except duckdb.Error:
            return -1
