"""The DuckDB projection: schema, the exactly-once batch apply path, and the read-side handle.

Tables (one projection file holds one topic; see ``SCHEMA``):

- ``meta``: schema version, topic name, topic id and partition count of the log it was built from.
- ``applied_offsets``: per topic partition, the next offset to apply, plus deterministic counters of
  what the applied records did (records, appended, rewinds, duplicates, quarantined).
- ``turns``: the live turns of every chain. ``page_key`` buckets 64 consecutive seqs of one source
  under one indexed ``BIGINT``, so a page of at most 100 seqs is at most three ART index lookups
  whatever the size of the history (DuckDB only uses an ART index for equality, not ranges).
- ``superseded_turns``: turns a rewind replaced, kept for audit and never served, with the log
  position of the record that superseded them.
- ``turn_ids``: one row per (source, turn id) ever applied, live or superseded (``turn_key`` is a
  128-bit hash of the pair), with its content digest: the fold's duplicate check, as index probes.
- ``sources``: each chain's head (length, ``d(length)``, log position of the record that made
  ``seq == length``) and its broken mark (the first record of it the fold rejected).
- ``project_heads``: each project's head source (the source of its latest appended turn).
- ``quarantine``: records that did not decode or that the fold refused, with the raw key and value,
  and the log position of the repair record that marked them repaired (if one did).
- ``repairs``: every sound repair record applied (``throughline.core.repair``), with its outcome and
  the chain it accepted.

No column holds a wall-clock time, so replaying a log into a new file and projecting it as a stream
yield identical tables whatever the batch boundaries (``table_digests`` compares them).

Exactly once: ``apply_prepared`` (and ``apply_batch`` on top of it) writes the rows of a batch and the
partition's next offset in one DuckDB transaction. A crash before the commit loses the whole batch
(the projector seeks back to the stored offset and applies it again); after the commit nothing of it
is applied twice, because records below the stored offset are skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pyarrow as pa

from throughline.core.chain import CHAIN_ORIGIN
from throughline.core.fold import Append, Duplicate, fold_turn
from throughline.core.inflight import InFlight
from throughline.core.repair import decide_repair
from throughline.projector.exceptions import (
    InvalidBatchError,
    ProjectionBusyError,
    ProjectionIncompatibleError,
    ProjectionMissingError,
    ProjectionStorageError,
    ProjectionTopicMismatchError,
)
from throughline.projector.prepare import Q_CHAIN as Q_CHAIN
from throughline.projector.prepare import Q_INVALID as Q_INVALID
from throughline.projector.prepare import Q_MISPLACED as Q_MISPLACED
from throughline.projector.prepare import Q_UNDECODABLE as Q_UNDECODABLE
from throughline.projector.prepare import Q_UNKNOWN_SCHEMA as Q_UNKNOWN_SCHEMA
from throughline.projector.prepare import (
    Item,
    RecordLike,
    RefusedRecord,
    RepairItem,
    SoundRecord,
    record_projects,
)
from throughline.projector.prepare import LogRecord as LogRecord
from throughline.projector.prepare import PreparedBatch as PreparedBatch
from throughline.projector.prepare import prepare_batch as prepare_batch
from throughline.projector.prepare import turn_key as turn_key
from throughline.projector.read_index import DEFAULT_READ_ENTRIES, ChainHead, ReadIndex
from throughline.projector.repair_rows import (
    RepairEntry,
    RepairRow,
    count_unmarked,
    insert_repairs,
    load_repairs,
    mark_quarantined,
)
from throughline.projector.snapshot import PAGE_BUCKET_BITS as PAGE_BUCKET_BITS
from throughline.projector.snapshot import DuckView, _turn_rows, snapshot_version
from throughline.projector.snapshot import page_key as page_key

#: Version 2 added ``repairs`` and the quarantine's ``repaired_partition``/``repaired_offset`` (issue 20).
#: A file of another version is refused (``ProjectionIncompatibleError``): the projection is a function of
#: the log, so it is rebuilt with ``throughline replay --db NEW_FILE`` rather than migrated.
SCHEMA_VERSION = "2"

_POINT_LOOKUPS = 32  # up to this many uncached keys are fetched by index probes, more by one hash join

#: DuckDB checkpoints its WAL into the file when the WAL reaches this size. DuckDB's default (16 MiB)
#: checkpoints every ~12k turns of 1 KB under sustained ingest: measured on 200k turns, commits took
#: 4.5 s at 16 MiB and 1.8 s at 256 MiB. With the memory limit below, 128 MiB cost ~10% more CPU than
#: 256 MiB with no limit, for half the peak memory (~390 MiB instead of ~760 MiB at 300k turns).
DEFAULT_WAL_AUTOCHECKPOINT = 128 * 1024 * 1024
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
_SNAPSHOT_TRIES = 3  # snapshots taken to find one of the read index's version, before reading without it

SCHEMA: tuple[str, ...] = (
    """CREATE TABLE meta (
        key VARCHAR PRIMARY KEY,
        value VARCHAR NOT NULL)""",
    """CREATE TABLE applied_offsets (
        topic VARCHAR NOT NULL,
        log_partition INTEGER NOT NULL,
        next_offset BIGINT NOT NULL,
        records BIGINT NOT NULL,
        appended BIGINT NOT NULL,
        rewinds BIGINT NOT NULL,
        duplicates BIGINT NOT NULL,
        quarantined BIGINT NOT NULL,
        PRIMARY KEY (topic, log_partition))""",
    """CREATE TABLE sources (
        source_sha256 BLOB PRIMARY KEY,
        project_sha256 BLOB NOT NULL,
        length BIGINT NOT NULL,
        chain_digest BLOB NOT NULL,
        head_partition INTEGER,
        head_offset BIGINT,
        broken_reason VARCHAR,
        broken_partition INTEGER,
        broken_offset BIGINT)""",
    """CREATE TABLE project_heads (
        project_sha256 BLOB PRIMARY KEY,
        source_sha256 BLOB NOT NULL)""",
    # Page reads fetch rows by index row id; DuckDB's string compression (FSST) makes each such fetch
    # decompress a block, so the columns a page reads are stored uncompressed (measured: a 64-row bucket
    # fetch 2.7 ms -> 1.2 ms at 1M turns; the file grows ~35%).
    """CREATE TABLE turns (
        page_key BIGINT NOT NULL,
        source_sha256 BLOB USING COMPRESSION uncompressed NOT NULL,
        seq BIGINT NOT NULL,
        project_sha256 BLOB NOT NULL,
        turn_id VARCHAR USING COMPRESSION uncompressed NOT NULL,
        completed_at_us BIGINT NOT NULL,
        body VARCHAR USING COMPRESSION uncompressed NOT NULL,
        body_bytes BIGINT NOT NULL,
        content_digest BLOB USING COMPRESSION uncompressed NOT NULL,
        chain_digest BLOB USING COMPRESSION uncompressed NOT NULL,
        log_partition INTEGER NOT NULL,
        log_offset BIGINT NOT NULL)""",
    "CREATE INDEX turns_page_key ON turns (page_key)",
    """CREATE TABLE superseded_turns (
        source_sha256 BLOB NOT NULL,
        seq BIGINT NOT NULL,
        project_sha256 BLOB NOT NULL,
        turn_id VARCHAR NOT NULL,
        completed_at_us BIGINT NOT NULL,
        body VARCHAR NOT NULL,
        body_bytes BIGINT NOT NULL,
        content_digest BLOB NOT NULL,
        chain_digest BLOB NOT NULL,
        log_partition INTEGER NOT NULL,
        log_offset BIGINT NOT NULL,
        superseded_partition INTEGER NOT NULL,
        superseded_offset BIGINT NOT NULL)""",
    """CREATE TABLE turn_ids (
        turn_key BLOB PRIMARY KEY,
        content_digest BLOB NOT NULL)""",
    """CREATE TABLE quarantine (
        log_partition INTEGER NOT NULL,
        log_offset BIGINT NOT NULL,
        code VARCHAR NOT NULL,
        reason VARCHAR NOT NULL,
        project_sha256 BLOB,
        source_sha256 BLOB,
        record_key BLOB,
        record_value BLOB,
        repaired_partition INTEGER,
        repaired_offset BIGINT)""",
    """CREATE TABLE repairs (
        log_partition INTEGER NOT NULL,
        log_offset BIGINT NOT NULL,
        project_sha256 BLOB NOT NULL,
        source_sha256 BLOB NOT NULL,
        reason VARCHAR NOT NULL,
        produced_at_us BIGINT NOT NULL,
        outcome VARCHAR NOT NULL,
        cleared BOOLEAN NOT NULL,
        marked BIGINT NOT NULL,
        length BIGINT NOT NULL,
        chain_digest BLOB NOT NULL,
        PRIMARY KEY (log_partition, log_offset))""",
)

#: Every table, each with the columns that order its rows totally (for ``table_digests``).
TABLE_ORDER: dict[str, str] = {
    "meta": "key",
    "applied_offsets": "topic, log_partition",
    "sources": "source_sha256",
    "project_heads": "project_sha256",
    "turns": "source_sha256, seq",
    "superseded_turns": "source_sha256, superseded_partition, superseded_offset, seq",
    "turn_ids": "turn_key",
    "quarantine": "log_partition, log_offset",
    "repairs": "log_partition, log_offset",
}

# A literal tuple: SQL is built from these names, and tests/reliability/test_sql_parameterised.py
# accepts only constants there.
_TURN_COLUMNS = (
    "source_sha256",
    "seq",
    "project_sha256",
    "turn_id",
    "completed_at_us",
    "body",
    "body_bytes",
    "content_digest",
    "chain_digest",
    "log_partition",
    "log_offset",
)
#: The Arrow column types of the rows a batch writes, per table (names as in ``SCHEMA``).
_ARROW_TURN = tuple(
    zip(
        _TURN_COLUMNS,
        (
            pa.binary(),
            pa.int64(),
            pa.binary(),
            pa.string(),
            pa.int64(),
            pa.string(),
            pa.int64(),
            pa.binary(),
            pa.binary(),
            pa.int32(),
            pa.int64(),
        ),
        strict=True,
    )
)
_ARROW_TURNS = (("page_key", pa.int64()), *_ARROW_TURN)
_ARROW_SUPERSEDED = (*_ARROW_TURN, ("superseded_partition", pa.int32()), ("superseded_offset", pa.int64()))
_ARROW_SOURCES = (
    ("source_sha256", pa.binary()),
    ("project_sha256", pa.binary()),
    ("length", pa.int64()),
    ("chain_digest", pa.binary()),
    ("head_partition", pa.int32()),
    ("head_offset", pa.int64()),
    ("broken_reason", pa.string()),
    ("broken_partition", pa.int32()),
    ("broken_offset", pa.int64()),
)
_ARROW_HEADS = (("project_sha256", pa.binary()), ("source_sha256", pa.binary()))
_ARROW_QUARANTINE = (
    ("log_partition", pa.int32()),
    ("log_offset", pa.int64()),
    ("code", pa.string()),
    ("reason", pa.string()),
    ("project_sha256", pa.binary()),
    ("source_sha256", pa.binary()),
    ("record_key", pa.binary()),
    ("record_value", pa.binary()),
    ("repaired_partition", pa.int32()),
    ("repaired_offset", pa.int64()),
)


#: Up to this many rows are written by one ``INSERT ... VALUES`` with bound parameters, more through a
#: registered Arrow table. A batch under steady ingest holds a few records, and registering a table
#: cost more than writing it (measured, one row: ~1.1 ms VALUES, ~10 ms register + insert + unregister).
_VALUES_ROWS = 32
_TURNS_INSERT = (
    "INSERT INTO turns (page_key, source_sha256, seq, project_sha256, turn_id, completed_at_us, body, body_bytes, "
    "content_digest, chain_digest, log_partition, log_offset)"
)
_SOURCES_UPSERT = (
    "INSERT OR REPLACE INTO sources (source_sha256, project_sha256, length, chain_digest, head_partition, "
    "head_offset, broken_reason, broken_partition, broken_offset)"
)
_HEADS_UPSERT = "INSERT OR REPLACE INTO project_heads (project_sha256, source_sha256)"


def _values_sql(head: str, width: int, rows: int) -> str:
    """``head`` followed by ``rows`` tuples of ``width`` bound parameters."""
    one = "(" + ", ".join("?" for _ in range(width)) + ")"
    return head + " VALUES " + ", ".join(one for _ in range(rows))


def _arrow_table(columns: Sequence[tuple[str, pa.DataType]], values: Sequence[Sequence[Any]]) -> pa.Table:
    """An Arrow table of ``values``: one sequence per column, in the order of ``columns``."""
    return pa.table({name: pa.array(col, kind) for (name, kind), col in zip(columns, values, strict=True)})


def _rows_table(columns: Sequence[tuple[str, pa.DataType]], rows: Sequence[Sequence[Any]]) -> pa.Table:
    """An Arrow table of ``rows`` (at least one), each in the order of ``columns``."""
    return _arrow_table(columns, list(zip(*rows, strict=True)))
_SOURCE_COLUMNS = (
    "source_sha256, project_sha256, length, chain_digest, head_partition, head_offset, "
    "broken_reason, broken_partition, broken_offset"
)


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """What applying some records did (also the counters kept per partition)."""

    records: int = 0
    appended: int = 0
    rewinds: int = 0
    duplicates: int = 0
    quarantined: int = 0

    def __add__(self, other: BatchSummary) -> BatchSummary:
        return BatchSummary(
            self.records + other.records,
            self.appended + other.appended,
            self.rewinds + other.rewinds,
            self.duplicates + other.duplicates,
            self.quarantined + other.quarantined,
        )


# ---------------------------------------------------------------------------------------- fold state


class _SourceState:
    """A source's committed head and health (cached between batches)."""

    __slots__ = (
        "broken_offset",
        "broken_partition",
        "broken_reason",
        "chain_digest",
        "head_offset",
        "head_partition",
        "length",
        "project",
    )

    def __init__(
        self,
        project: bytes,
        length: int = 0,
        chain_digest: bytes = CHAIN_ORIGIN,
        head_partition: int | None = None,
        head_offset: int | None = None,
        broken_reason: str | None = None,
        broken_partition: int | None = None,
        broken_offset: int | None = None,
    ) -> None:
        self.project = project
        self.length = length
        self.chain_digest = chain_digest
        self.head_partition = head_partition
        self.head_offset = head_offset
        self.broken_reason = broken_reason
        self.broken_partition = broken_partition
        self.broken_offset = broken_offset

    def copy(self) -> _SourceState:
        return _SourceState(
            self.project,
            self.length,
            self.chain_digest,
            self.head_partition,
            self.head_offset,
            self.broken_reason,
            self.broken_partition,
            self.broken_offset,
        )

    def chain_head(self) -> ChainHead:
        """What a read needs of this state."""
        return ChainHead(
            self.project, self.length, self.chain_digest, self.head_partition, self.head_offset, self.broken_reason
        )

    def row(self, source: bytes) -> tuple[Any, ...]:
        return (
            source,
            self.project,
            self.length,
            self.chain_digest,
            self.head_partition,
            self.head_offset,
            self.broken_reason,
            self.broken_partition,
            self.broken_offset,
        )


# A turn row while a batch is folded: (seq, turn_id, completed_at_us, body, body_bytes,
# content_digest, chain_digest, log_partition, log_offset).
_Row = tuple[int, str, int, str, int, bytes, bytes, int, int]


class _Work:
    """One source while a batch is folded: its state plus what the batch changes in its chain.

    Live turns ``1..cut-1`` are in DuckDB and untouched; turns ``cut..length`` are ``pending`` rows of
    this batch. A rewind below ``cut`` supersedes stored rows (``db_cuts``) and all pending ones.
    """

    __slots__ = ("cut", "db_cuts", "lookup", "pending", "source", "state")

    def __init__(self, source: bytes, state: _SourceState, lookup: Any) -> None:
        self.source = source
        self.state = state
        self.cut = state.length + 1
        self.pending: list[_Row] = []
        self.db_cuts: list[tuple[int, int, int, int]] = []  # (first seq, last seq, by partition, by offset)
        self.lookup = lookup

    def digest_at(self, k: int) -> bytes:
        if k >= self.cut:
            return self.pending[k - self.cut][6]
        digest: bytes = self.lookup(self.source, k)
        return digest


@dataclass
class _PartitionCounters:
    next_offset: int = 0
    records: int = 0
    appended: int = 0
    rewinds: int = 0
    duplicates: int = 0
    quarantined: int = 0

    def add(self, s: BatchSummary) -> _PartitionCounters:
        return _PartitionCounters(
            self.next_offset,
            self.records + s.records,
            self.appended + s.appended,
            self.rewinds + s.rewinds,
            self.duplicates + s.duplicates,
            self.quarantined + s.quarantined,
        )


# ------------------------------------------------------------------------------------------ read side


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """One quarantined record, without its raw bytes.

    ``produced_at_micros``: when its producer wrote it (``None`` when it does not decode);
    ``repaired_by``: the (partition, offset) of the repair record that marked it, if one did.
    """

    partition: int
    offset: int
    code: str
    reason: str
    project_sha256: bytes | None
    source_sha256: bytes | None
    value_bytes: int
    produced_at_micros: int | None = None
    repaired_by: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class BrokenSource:
    """A source with a broken mark: its chain as applied, and the record that broke it (and its code)."""

    source_sha256: bytes
    project_sha256: bytes
    length: int
    reason: str
    partition: int | None
    offset: int | None
    code: str | None


@dataclass(frozen=True, slots=True)
class QuarantineListing:
    """What ``throughline quarantine`` lists: quarantined records in log order, broken sources, repairs."""

    records: tuple[QuarantineEntry, ...]
    broken: tuple[BrokenSource, ...]
    repairs: tuple[RepairEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """What the projection applied on one partition."""

    partition: int
    next_offset: int
    records: int
    appended: int
    rewinds: int
    duplicates: int
    quarantined: int


@dataclass(frozen=True, slots=True)
class ProjectionStats:
    """Counts of a projection, read in one snapshot."""

    topic: str | None
    topic_id: str | None
    partitions: tuple[PartitionStats, ...]
    turns: int
    sources: int
    projects: int
    superseded: int
    quarantined: int
    broken_sources: int
    repaired: int = 0  # quarantined records a repair marked
    repairs: int = 0  # repair records applied (any outcome)
    latest_quarantine: tuple[QuarantineEntry, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------- projection


# Writable projections open in this process: a second writable handle on the same file would fold
# with its own cache against the same tables, so it is refused.
_OPEN_LOCK = threading.Lock()
_OPEN_WRITABLE: set[Path] = set()


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "lock" in text or "different configuration" in text or "already open" in text


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
    ) -> None:
        self._con = con
        self._memory_headroom = memory_headroom
        self._memory_limit = 0
        self._commits = 0
        self._path = path
        self._read_only = read_only
        self._write_lock = threading.Lock()
        self._changed = threading.Condition()
        self._closed = False
        self._cache: OrderedDict[bytes, _SourceState] = OrderedDict()
        self._cache_size = max(1, source_cache)
        self._head_cache: OrderedDict[bytes, bytes] = OrderedDict()  # project -> head source, as committed
        self._writer: duckdb.DuckDBPyConnection | None = None
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise ProjectionIncompatibleError(
                f"{path} is a projection of schema version {meta.get('schema_version')!r}; this throughline "
                f"writes version {SCHEMA_VERSION}: rebuild it with `throughline replay --db NEW_FILE`"
            )
        self._topic: str | None = meta.get("topic")
        self._topic_id: str | None = meta.get("topic_id")
        self._partitions: int | None = int(meta["partitions"]) if "partitions" in meta else None
        self._counters: dict[int, _PartitionCounters] = {}
        self._load_counters()
        # What every read needs besides the turns it serves (see ``throughline.projector.read_index``).
        self._index = ReadIndex({p: c.next_offset for p, c in self._counters.items()}, capacity=read_entries)
        self._inflight = InFlight()  # what the projector in this process fetched but has not applied
        self._changes: dict[bytes, int] = {}  # project -> commits that changed it (for long-polls)

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
    ) -> DuckProjection:
        """Open (and, when writable and new, create) a projection file.

        ``topic`` is the topic the caller means: recorded in a new projection, and an existing one built
        from another topic raises ``ProjectionTopicMismatchError``. A read-only open raises
        ``ProjectionMissingError`` when the file does not exist and ``ProjectionBusyError`` when a
        running projector holds it.

        Writable handles tune DuckDB: ``wal_autocheckpoint`` (bytes of WAL between checkpoints) and,
        with ``memory_headroom``, a memory limit of that many bytes beyond the ART indexes (``None``:
        DuckDB's default, 80% of RAM; the projector's CLI passes ``DEFAULT_MEMORY_HEADROOM``).
        ``source_cache`` bounds the chain heads kept in memory between batches, ``read_entries`` the
        project heads and chain heads kept for reads (``ReadIndex``).
        """
        p = Path(path)
        if not read_only:
            with _OPEN_LOCK:
                if p.resolve() in _OPEN_WRITABLE:
                    raise ProjectionBusyError(
                        f"projection {p} is already open for writing in this process: share that handle"
                    )
        if read_only and not p.exists():
            raise ProjectionMissingError(f"no projection at {p}: run `throughline project` or `throughline replay` first")
        try:
            con = duckdb.connect(str(p), read_only=read_only)
        except (duckdb.IOException, duckdb.ConnectionException) as exc:
            if _is_lock_error(exc):
                if read_only:
                    message = (
                        f"projection {p} is held by a running projector: read it through the "
                        f"`throughline serve` HTTP API, or stop the projector first ({exc})"
                    )
                else:
                    message = f"projection {p} is held by another process (is a projector already running?) ({exc})"
                raise ProjectionBusyError(message) from None
            raise ProjectionIncompatibleError(f"cannot open {p} as a DuckDB projection: {exc}") from None
        except duckdb.Error as exc:
            raise ProjectionIncompatibleError(f"cannot open {p} as a DuckDB projection: {exc}") from None
        try:
            has_meta = con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND table_name = 'meta'"
            ).fetchone()
            if not has_meta or not has_meta[0]:
                if read_only:
                    raise ProjectionMissingError(f"{p} holds no throughline projection yet")
                if con.execute(
                    "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
                ).fetchone() != (0,):
                    raise ProjectionIncompatibleError(f"{p} is a DuckDB file but not a throughline projection")
                cls._create_schema(con)
            if not read_only:
                con.execute(f"SET wal_autocheckpoint = '{int(wal_autocheckpoint)}B'")
            projection = cls(
                con,
                p,
                read_only=read_only,
                source_cache=source_cache,
                memory_headroom=None if read_only else memory_headroom,
                read_entries=read_entries,
            )
            projection._adapt_memory()
            if topic is not None:
                projection._claim_topic(topic)
            if not read_only:
                with _OPEN_LOCK:
                    _OPEN_WRITABLE.add(p.resolve())
            return projection
        except BaseException:
            con.close()
            raise

    @staticmethod
    def _create_schema(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("BEGIN TRANSACTION")
        try:
            for ddl in SCHEMA:
                con.execute(ddl)
            con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
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
        cur = self._con.cursor()
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
            self._changed.notify_all()
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._con.close()
        if not self._read_only:
            with _OPEN_LOCK:
                _OPEN_WRITABLE.discard(self._path.resolve())

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
        cur = self._con.cursor()
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
        cur = self._con.cursor()
        try:
            row = cur.execute("SELECT current_setting('threads')").fetchone()
            cur.execute(f"SET threads = {max(1, int(threads))}")
        finally:
            cur.close()
        return int(row[0]) if row else 1

    def checkpoint(self) -> None:
        """Write DuckDB's WAL into the file now (replay does this before it renames its result)."""
        self._require_writable()
        with self._write_lock:
            cur = self._con.cursor()
            try:
                cur.execute("CHECKPOINT")
            finally:
                cur.close()

    def applied_offsets(self) -> dict[int, int]:
        """The next offset to apply per partition, as committed (partitions never applied are absent)."""
        with self._changed:
            return {p: c.next_offset for p, c in self._counters.items()}

    def _load_counters(self) -> None:
        rows = self._con.execute(
            "SELECT log_partition, next_offset, records, appended, rewinds, duplicates, quarantined "
            "FROM applied_offsets WHERE topic = ?",
            [self._topic or ""],
        ).fetchall()
        self._counters = {int(r[0]): _PartitionCounters(*(int(x) for x in r[1:])) for r in rows}

    # ------------------------------------------------------------------ read side

    @contextmanager
    def view(self) -> Iterator[DuckView]:
        """One consistent snapshot: every answer of the yielded view is of one committed version.

        Applied offsets, project heads and chain heads come from memory (``ReadIndex``) when the
        snapshot's version is the index's; turns always from DuckDB. A read-only file cannot change
        (DuckDB lets no process write it meanwhile), so its statements need no transaction.
        """
        if self._closed:
            raise ProjectionMissingError(f"projection {self._path} is closed")
        cur = self._con.cursor()
        try:
            if self._read_only:
                version, applied = self._index.capture()
                yield DuckView(cur, self._topic, self._index, version, applied)
                return
            cur.execute("BEGIN TRANSACTION")
            try:
                yield self._snapshot(cur)
            finally:
                cur.execute("ROLLBACK")  # read-only transaction: nothing to keep
        finally:
            cur.close()

    def _snapshot(self, cur: duckdb.DuckDBPyConnection) -> DuckView:
        """A view of the transaction open on ``cur``, with the index when their versions agree."""
        for _ in range(_SNAPSHOT_TRIES):
            version, applied = self._index.capture()
            # DuckDB takes the snapshot when the transaction first reads, not at BEGIN: this read takes it.
            if snapshot_version(cur, self._topic) == version:
                return DuckView(cur, self._topic, self._index, version, applied)
            # A commit between the two (its entries are about to be published): a new snapshot.
            cur.execute("ROLLBACK")
            cur.execute("BEGIN TRANSACTION")
        snapshot_version(cur, self._topic)
        return DuckView(cur, self._topic)  # everything from the snapshot itself

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until the applied offset of ``partition`` reaches ``offset``.

        The in-process projector notifies after each commit, so a waiter wakes without polling. With no
        projector in this process (a read-only handle) the answer comes at once from a snapshot.
        """
        if self._read_only:
            with self.view() as v:
                return v.applied_offset(partition) >= offset
        def reached() -> bool:
            counters = self._counters.get(partition)
            return offset <= 0 or (counters is not None and counters.next_offset >= offset)

        return self._wait_until(reached, timeout)

    def fetching_from(self, offsets: Mapping[int, int]) -> None:
        """The projector's feed (re)starts at ``offsets`` (the applied offsets); see ``fetched``."""
        with self._changed:
            self._inflight.start(offsets)

    def fetched(self, batches: Sequence[PreparedBatch]) -> None:
        """The projector's feed delivered ``batches`` (each partition contiguous since ``fetching_from``),
        about to be applied: until they are, ``wait_settled`` knows which projects they belong to."""
        with self._changed:
            for b in batches:
                self._inflight.add(b.partition, record_projects(b), b.next_offset)
            self._changed.notify_all()

    def wait_settled(self, partition: int, project_sha256: bytes, offset: int, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until no record of the project on ``partition`` below ``offset``
        is unapplied, as far as this projection can prove (``throughline.core.inflight``): the applied
        offset reached ``offset``, or the projector in this process has fetched up to it and none of
        the records it has not applied yet belong to the project."""
        if self._read_only:
            return self.wait_applied(partition, offset, timeout)
        def settled() -> bool:
            counters = self._counters.get(partition)
            applied = counters.next_offset if counters is not None else 0
            return self._inflight.settled(partition, project_sha256, offset, applied)

        return self._wait_until(settled, timeout)

    def project_changes(self, project_sha256: bytes) -> int:
        """How many commits of this process changed the project's chains (appends, rewinds, broken marks)."""
        with self._changed:
            return self._changes.get(project_sha256, 0)

    def wait_project_changed(self, project_sha256: bytes, seen: int, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until ``project_changes`` exceeds ``seen``."""
        return self._wait_until(lambda: self._changes.get(project_sha256, 0) > seen, timeout)

    def _wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` seconds, woken by each commit, until ``done()`` (checked under the lock);
        a closed projection ends the wait at once."""
        with self._changed:
            self._changed.wait_for(lambda: done() or self._closed, max(0.0, timeout))
            return done()

    def stats(self, *, latest_quarantine: int = 10) -> ProjectionStats:
        """Counts and per-partition counters, read in one snapshot (no raw record bytes)."""
        cur = self._con.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            parts = cur.execute(
                "SELECT log_partition, next_offset, records, appended, rewinds, duplicates, quarantined "
                "FROM applied_offsets WHERE topic = ? ORDER BY log_partition",
                [self._topic or ""],
            ).fetchall()
            counts = cur.execute(
                "SELECT (SELECT count(*) FROM turns), (SELECT count(*) FROM sources), "
                "(SELECT count(*) FROM project_heads), (SELECT count(*) FROM superseded_turns), "
                "(SELECT count(*) FROM quarantine), "
                "(SELECT count(*) FROM sources WHERE broken_reason IS NOT NULL), "
                "(SELECT count(*) FROM quarantine WHERE repaired_offset IS NOT NULL), (SELECT count(*) FROM repairs)"
            ).fetchone()
            latest = cur.execute(
                "SELECT log_partition, log_offset, code, reason, project_sha256, source_sha256, "
                "coalesce(octet_length(record_value), 0), repaired_partition, repaired_offset FROM quarantine "
                "ORDER BY log_offset DESC, log_partition LIMIT ?",
                [max(0, latest_quarantine)],
            ).fetchall()
            cur.execute("ROLLBACK")
        finally:
            cur.close()
        assert counts is not None
        return ProjectionStats(
            topic=self._topic,
            topic_id=self._topic_id,
            partitions=tuple(PartitionStats(*(int(x) for x in r)) for r in parts),
            turns=int(counts[0]),
            sources=int(counts[1]),
            projects=int(counts[2]),
            superseded=int(counts[3]),
            quarantined=int(counts[4]),
            broken_sources=int(counts[5]),
            repaired=int(counts[6]),
            repairs=int(counts[7]),
            latest_quarantine=tuple(
                QuarantineEntry(
                    int(r[0]),
                    int(r[1]),
                    r[2],
                    r[3],
                    bytes(r[4]) if r[4] is not None else None,
                    bytes(r[5]) if r[5] is not None else None,
                    int(r[6]),
                    repaired_by=None if r[8] is None else (int(r[7]), int(r[8])),
                )
                for r in latest
            ),
        )

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineListing:
        """Every quarantined record (in log order), broken source and applied repair, of one project or
        of all, read in one snapshot; never a raw record byte. ``times=False`` skips reading the
        records' values to decode when they were produced (``/metrics`` needs only the counts).

        """
        from throughline.schemas.codec import produced_at

        cur = self._con.cursor()
        entries: list[QuarantineEntry] = []
        try:
            cur.execute("BEGIN TRANSACTION")
            cur.execute(
                "SELECT log_partition, log_offset, code, reason, project_sha256, source_sha256, "
                "coalesce(octet_length(record_value), 0), CASE WHEN $2 THEN record_value END, repaired_partition, "
                "repaired_offset FROM quarantine "
                "WHERE $1::BLOB IS NULL OR project_sha256 = $1::BLOB ORDER BY log_partition, log_offset",
                [project_sha256, times],
            )
            while rows := cur.fetchmany(1024):
                entries.extend(
                    QuarantineEntry(
                        int(r[0]),
                        int(r[1]),
                        r[2],
                        r[3],
                        None if r[4] is None else bytes(r[4]),
                        None if r[5] is None else bytes(r[5]),
                        int(r[6]),
                        produced_at(None if r[7] is None else bytes(r[7])),
                        None if r[9] is None else (int(r[8]), int(r[9])),
                    )
                    for r in rows
                )
            broken = cur.execute(
                "SELECT s.source_sha256, s.project_sha256, s.length, s.broken_reason, s.broken_partition, "
                "s.broken_offset, q.code FROM sources s LEFT JOIN quarantine q "
                "ON q.log_partition = s.broken_partition AND q.log_offset = s.broken_offset "
                "WHERE s.broken_reason IS NOT NULL AND ($1::BLOB IS NULL OR s.project_sha256 = $1::BLOB) "
                "ORDER BY s.source_sha256",
                [project_sha256],
            ).fetchall()
            repairs = load_repairs(cur, project_sha256)
            cur.execute("ROLLBACK")
        finally:
            cur.close()
        return QuarantineListing(
            tuple(entries),
            tuple(BrokenSource(bytes(r[0]), bytes(r[1]), int(r[2]), r[3], r[4], r[5], r[6]) for r in broken),
            repairs,
        )

    def table_digests(self) -> dict[str, str]:
        """SHA-256 of every table's rows in a total order (identical projections have identical digests)."""
        cur = self._con.cursor()
        out: dict[str, str] = {}
        try:
            cur.execute("BEGIN TRANSACTION")
            for table, order in TABLE_ORDER.items():
                h = hashlib.sha256()
                cur.execute(f"SELECT * FROM {table} ORDER BY {order}")  # noqa: S608 (fixed names)
                while True:
                    rows = cur.fetchmany(4096)
                    if not rows:
                        break
                    for row in rows:
                        h.update(repr(row).encode("utf-8"))
                        h.update(b"\n")
                out[table] = h.hexdigest()
            cur.execute("ROLLBACK")
        finally:
            cur.close()
        return out

    # ------------------------------------------------------------------ write side

    def _require_writable(self) -> None:
        if self._read_only:
            raise ProjectionIncompatibleError(f"projection {self._path} is open read-only", code="projection_read_only")
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
        either everything of the batch or nothing of it):

        1. Drop records below each partition's applied offset (a re-delivered batch is a no-op).
        2. ``BEGIN TRANSACTION``.
        3. Probe ``turn_ids`` with the batch's (source, turn id) keys: one set-based
           ``INSERT ... ON CONFLICT DO NOTHING`` (ART index probes). When it inserted every key (the
           usual case) no id was applied before. Otherwise the transaction is rolled back (nothing else
           was written yet), begun again and probed with ``RETURNING``: keys it did not insert were
           applied before, and their content digests are fetched (the fold's duplicate check).
        4. Load the heads of sources missing from the in-memory cache (index probes, or one hash join
           when many miss).
        5. Fold every record in log order in Python (``fold_turn``), collecting new turn rows,
           superseded rows, source heads, project heads and quarantine rows. A repair record is
           applied at its place (``_repair``): it marks the source's stored quarantine rows at once
           (an ``UPDATE``) and the batch's own before they are inserted, and clears the broken mark.
        6. Remove from ``turn_ids`` the probed keys whose records were not appended (rejected), and fix
           the content digest where a later record of the batch appended under that key.
        7. Move stored turns that a rewind superseded into ``superseded_turns`` and delete them.
        8. Insert superseded rows of this batch, then the new live turns (Arrow tables, bulk).
        9. Upsert ``sources`` and ``project_heads``; insert ``quarantine`` and ``repairs`` rows.
        10. Upsert ``applied_offsets`` (next offset and counters per partition).
        11. ``COMMIT``. Only now the source cache and the in-memory applied offsets take the new state
            and waiters (``wait_applied``) are notified. On any error: ``ROLLBACK``, the cache is
            cleared, and the error propagates (nothing of the batch was applied), except DuckDB running
            out of memory, which raises the memory limit and redoes the batch (at most 4 times).

        A crash (SIGKILL, power loss) before step 11 completes leaves DuckDB's WAL without the
        transaction; on restart the projector seeks to the old applied offset and reads the batch again.
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
                self._writer = self._con.cursor()
            cur = self._writer
            work = _BatchWork(self, cur, topic, batches)
            if not work.changes_anything:
                return BatchSummary()
            for attempt in range(_OOM_RETRIES + 1):
                try:
                    summary = self._transact(cur, work)
                    break
                except duckdb.OutOfMemoryException:
                    if self._memory_headroom is None or attempt == _OOM_RETRIES:
                        raise
                    # The indexes outgrew the limit between two checks: double it and redo the batch.
                    self._adapt_memory(at_least=2 * self._memory_limit)
                    work = _BatchWork(self, cur, topic, batches)
                except _STORAGE_FAULTS as exc:
                    raise ProjectionStorageError(
                        f"cannot write the projection {self._path}: {type(exc).__name__}: {exc}; nothing of the "
                        "batch was applied: free space or fix permissions, then start the projector again"
                    ) from exc
            self._commits += 1
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
            with self._changed:
                self._counters.update(work.counters)
                for part, c in work.counters.items():
                    self._inflight.applied(part, c.next_offset)
                self._index.publish(
                    {p: c.next_offset for p, c in work.counters.items()},
                    work.heads,
                    {s: st.chain_head() for s, st in work.states.items()},
                )
                for project in {*work.heads, *(st.project for st in work.states.values())}:
                    self._changes[project] = self._changes.get(project, 0) + 1
                self._changed.notify_all()
            return summary

    def _transact(self, cur: duckdb.DuckDBPyConnection, work: _BatchWork) -> BatchSummary:
        """Run one batch's fold and writes in one transaction; on any error roll back and forget the cache."""
        cur.execute("BEGIN TRANSACTION")
        try:
            summary = work.run()
            cur.execute("COMMIT")
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass  # the transaction may already be gone (the commit itself failed)
            self._cache.clear()
            self._head_cache.clear()
            raise
        return summary


#: DuckDB errors that mean the file cannot be written (disk full, read-only, permissions), as opposed to
#: a bug in a statement: they become ``ProjectionStorageError``.
_STORAGE_FAULTS = (duckdb.IOException, duckdb.TransactionException, duckdb.PermissionException, duckdb.FatalException)


class _BatchWork:
    """The fold and writes of one ``apply_prepared`` call (lives for one transaction)."""

    def __init__(
        self, projection: DuckProjection, cur: duckdb.DuckDBPyConnection, topic: str, batches: Sequence[PreparedBatch]
    ) -> None:
        self.p = projection
        self.cur = cur
        self.topic = topic
        self.batches: list[tuple[PreparedBatch, list[Item]]] = []
        self.counters: dict[int, _PartitionCounters] = {}
        self.states: dict[bytes, _SourceState] = {}
        self.heads: dict[bytes, bytes] = {}  # project -> head source, for the projects this batch moved
        changes = False
        for b in batches:
            current = projection._counters.get(b.partition, _PartitionCounters())
            fresh = [it for it in b.items if it.offset >= current.next_offset]
            if fresh or b.next_offset > current.next_offset:
                changes = True
                self.batches.append((b, fresh))
        self.changes_anything = changes

    # -------------------------------------------------------------- lookups inside the transaction

    @contextmanager
    def _registered(self, name: str, table: pa.Table) -> Iterator[None]:
        """``table`` visible to this batch's SQL as ``name`` while the block runs."""
        self.cur.register(name, table)
        try:
            yield
        finally:
            try:
                self.cur.unregister(name)
            except duckdb.Error:
                pass  # the transaction failed: the registration goes with its rollback, keep the first error

    def _probe_turn_ids(self, sound: list[SoundRecord]) -> tuple[set[bytes], dict[bytes, bytes], dict[bytes, bytes]]:
        first: dict[bytes, bytes] = {}
        for it in sound:
            first.setdefault(it.turn_key, it.content_digest)
        if not first:
            return set(), {}, first
        keys = list(first)
        table: pa.Table | None = None
        if len(keys) <= _VALUES_ROWS:
            insert = _values_sql("INSERT INTO turn_ids (turn_key, content_digest)", 2, len(keys))
            params: list[Any] = [v for pair in first.items() for v in pair]
        else:
            table = pa.table(
                {"turn_key": pa.array(keys, pa.binary()), "content_digest": pa.array(list(first.values()), pa.binary())}
            )
            self.cur.register("tl_probe", table)
            insert = "INSERT INTO turn_ids SELECT turn_key, content_digest FROM tl_probe"
            params = []
        try:
            # The usual case: every id is new. A plain INSERT says so by succeeding, at a third of the
            # cost of ON CONFLICT DO NOTHING (measured: 13 ms against 40 ms for 10k keys).
            try:
                self.cur.execute(insert, params)
                all_new = True
            except duckdb.ConstraintException:
                all_new = False
            if all_new:
                inserted = set(keys)
                missing: list[bytes] = []
            else:
                # Some ids were applied before. The probe is the transaction's first write, so undo it
                # and probe again, this time returning which keys it inserted.
                self.cur.execute("ROLLBACK")
                self.cur.execute("BEGIN TRANSACTION")
                if table is not None:
                    self.cur.register("tl_probe", table)  # the registration was part of the undone transaction
                inserted = {
                    bytes(r[0])
                    for r in self.cur.execute(insert + " ON CONFLICT DO NOTHING RETURNING turn_key", params).fetchall()
                }
                missing = [k for k in keys if k not in inserted]
            existing: dict[bytes, bytes] = {}
            if missing:
                if len(missing) <= _POINT_LOOKUPS or table is None:
                    sql = " UNION ALL ".join(
                        f"SELECT turn_key, content_digest FROM turn_ids WHERE turn_key = ${i + 1}"  # noqa: S608
                        for i in range(len(missing))
                    )
                    rows = self.cur.execute(sql, missing).fetchall()
                else:
                    rows = self.cur.execute(
                        "SELECT t.turn_key, t.content_digest FROM turn_ids t JOIN tl_probe p ON t.turn_key = p.turn_key"
                    ).fetchall()
                wanted = set(missing)
                existing = {bytes(r[0]): bytes(r[1]) for r in rows if bytes(r[0]) in wanted}
        finally:
            if table is not None:
                with contextlib.suppress(duckdb.Error):  # gone with a failed transaction: keep the first error
                    self.cur.unregister("tl_probe")
        return inserted, existing, first

    def _load_sources(self, sources: list[bytes]) -> dict[bytes, _SourceState]:
        if not sources:
            return {}
        if len(sources) <= _POINT_LOOKUPS:
            sql = " UNION ALL ".join(
                f"SELECT {_SOURCE_COLUMNS} FROM sources WHERE source_sha256 = ${i + 1}"  # noqa: S608
                for i in range(len(sources))
            )
            rows = self.cur.execute(sql, sources).fetchall()
        else:
            with self._registered("tl_sources", pa.table({"source_sha256": pa.array(sources, pa.binary())})):
                rows = self.cur.execute(
                    f"SELECT {', '.join('s.' + c.strip() for c in _SOURCE_COLUMNS.split(','))} "  # noqa: S608
                    "FROM sources s JOIN tl_sources w ON s.source_sha256 = w.source_sha256"
                ).fetchall()
        out: dict[bytes, _SourceState] = {}
        for r in rows:
            out[bytes(r[0])] = _SourceState(
                bytes(r[1]), int(r[2]), bytes(r[3]), r[4], r[5], r[6], r[7], r[8]
            )
        return out

    def _stored_digest(self, source: bytes, seq: int) -> bytes:
        rows = _turn_rows(self.cur, ("chain_digest",), source, seq, seq)
        if not rows:
            raise InvalidBatchError(f"projection is missing live turn {seq} of a source (corrupt projection?)")
        return bytes(rows[0][0])

    # -------------------------------------------------------------- the fold

    def run(self) -> BatchSummary:
        sound = [it for _, items in self.batches for it in items if isinstance(it, SoundRecord)]
        inserted_keys, existing, first_content = self._probe_turn_ids(sound)

        cache = self.p._cache
        wanted: list[bytes] = []
        seen: set[bytes] = set()
        repairs = [it for _, items in self.batches for it in items if type(it) is RepairItem]
        for snd in (*sound, *repairs) if repairs else sound:
            s = snd.source
            if s not in seen:
                seen.add(s)
                if s not in cache:
                    wanted.append(s)
        loaded = self._load_sources(wanted)

        works: dict[bytes, _Work] = {}
        applied_now: dict[bytes, bytes] = {}
        heads: dict[bytes, bytes] = {}
        superseded: list[tuple[bytes, bytes, _Row, int, int]] = []
        quarantine: list[tuple[Any, ...]] = []
        marks: dict[tuple[int, int], tuple[int, int]] = {}  # this batch's quarantine rows a repair marked
        repair_rows: list[RepairRow] = []
        total = BatchSummary()
        lookup = self._stored_digest

        for batch, items in self.batches:
            part = batch.partition
            records = appended = rewinds = duplicates = quarantined = 0
            for it in items:
                records += 1
                if isinstance(it, RefusedRecord):
                    quarantined += 1
                    quarantine.append((part, it.offset, it.code, it.reason, it.project_sha256, it.source, it.key, it.value))
                    continue
                if isinstance(it, RepairItem):
                    repair_rows.append(self._repair(part, it, works, loaded, quarantine, marks))
                    continue
                w = works.get(it.source)
                if w is None:
                    state = cache.get(it.source) or loaded.get(it.source)
                    state = state.copy() if state is not None else _SourceState(it.project_sha256)
                    w = works[it.source] = _Work(it.source, state, lookup)
                st = w.state
                tk = it.turn_key
                applied = applied_now.get(tk)
                if applied is None:
                    applied = existing.get(tk)
                # The source state is the chain's head (read before the fold changes it below).
                outcome = fold_turn(st, it, applied_content=applied, digest_at=w.digest_at)
                if isinstance(outcome, Append):
                    seq = outcome.seq
                    if outcome.rewound_from is not None:
                        rewinds += 1
                        if seq < w.cut:
                            w.db_cuts.append((seq, w.cut - 1, part, it.offset))
                            moved = w.pending
                            w.pending = []
                            w.cut = seq
                        else:
                            moved = w.pending[seq - w.cut :]
                            del w.pending[seq - w.cut :]
                        for row in moved:
                            superseded.append((it.source, st.project, row, part, it.offset))
                    w.pending.append(
                        (
                            seq,
                            it.turn_id,
                            it.completed_at_micros,
                            it.body,
                            it.body_bytes,
                            it.content_digest,
                            outcome.chain_digest,
                            part,
                            it.offset,
                        )
                    )
                    st.length = seq
                    st.chain_digest = outcome.chain_digest
                    st.head_partition = part
                    st.head_offset = it.offset
                    applied_now[tk] = it.content_digest
                    heads[it.project_sha256] = it.source
                    appended += 1
                elif isinstance(outcome, Duplicate):
                    duplicates += 1
                else:
                    quarantined += 1
                    quarantine.append(
                        (part, it.offset, Q_CHAIN, outcome.reason, it.project_sha256, it.source, it.key, it.value)
                    )
                    if st.broken_reason is None:
                        st.broken_reason = outcome.reason
                        st.broken_partition = part
                        st.broken_offset = it.offset
            summary = BatchSummary(records, appended, rewinds, duplicates, quarantined)
            total = total + summary
            before = self.p._counters.get(part, _PartitionCounters())
            after = before.add(summary)
            after.next_offset = max(before.next_offset, batch.next_offset)
            self.counters[part] = after

        self._fix_turn_ids(inserted_keys, applied_now, first_content)
        if marks:
            quarantine = [(*q, *marks.get((q[0], q[1]), (None, None))) for q in quarantine]
        else:
            quarantine = [(*q, None, None) for q in quarantine]
        self._write(works, superseded, heads, quarantine)
        insert_repairs(self.cur, repair_rows)
        self.states = {s: w.state for s, w in works.items()}
        self.heads = heads
        return total

    def _repair(
        self,
        part: int,
        it: RepairItem,
        works: dict[bytes, _Work],
        loaded: dict[bytes, _SourceState],
        quarantine: list[tuple[Any, ...]],
        marks: dict[tuple[int, int], tuple[int, int]],
    ) -> RepairRow:
        """Apply one sound repair record at its place in the fold (``ChainBook.apply_repair``): mark the
        source's unmarked quarantined records on ``part`` below it (stored ones by an UPDATE in this
        transaction, this batch's own in ``marks``), lift the broken mark, and return its ``repairs`` row."""
        source, project = it.source, it.project_sha256
        w = works.get(source)
        state = w.state if w is not None else (self.p._cache.get(source) or loaded.get(source))
        # A source hash is of one project: under another project's repair it is not that project's source.
        known = state is not None and state.project == project
        batch_rows = [
            (q[0], q[1]) for q in quarantine
            if q[0] == part and q[4] == project and q[5] == source and q[1] < it.offset and (q[0], q[1]) not in marks
        ]
        stored = count_unmarked(self.cur, part, project, source, it.offset)
        outcome = decide_repair(
            known=known, broken=known and state is not None and state.broken_reason is not None,
            unrepaired=stored + len(batch_rows),
        )
        if stored:
            mark_quarantined(self.cur, part, project, source, it.offset)
        for position in batch_rows:
            marks[position] = (part, it.offset)
        if outcome.cleared:
            assert state is not None  # cleared implies broken implies known
            if w is None:
                w = works[source] = _Work(source, state.copy(), self._stored_digest)
            w.state.broken_reason = w.state.broken_partition = w.state.broken_offset = None
        length, digest = (state.length, state.chain_digest) if known and state is not None else (0, CHAIN_ORIGIN)
        return (
            part, it.offset, project, source, it.reason, it.produced_at_micros,
            outcome.status, outcome.cleared, outcome.marked, length, digest,
        )

    # -------------------------------------------------------------- the writes

    def _fix_turn_ids(self, inserted: set[bytes], applied_now: dict[bytes, bytes], first: dict[bytes, bytes]) -> None:
        for key in inserted:
            content = applied_now.get(key)
            if content is None:
                self.cur.execute("DELETE FROM turn_ids WHERE turn_key = ?", [key])
            elif content != first[key]:
                self.cur.execute("UPDATE turn_ids SET content_digest = ? WHERE turn_key = ?", [content, key])

    def _supersede_stored(self, source: bytes, first: int, last: int, by_partition: int, by_offset: int) -> None:
        rows = _turn_rows(self.cur, ("row_id", *_TURN_COLUMNS), source, first, last)
        if len(rows) != last - first + 1:
            raise InvalidBatchError(
                f"projection holds {len(rows)} of the {last - first + 1} live turns a rewind supersedes (corrupt?)"
            )
        # Each row is (row_id, *_TURN_COLUMNS): the stored turn, then who superseded it.
        table = _rows_table(_ARROW_SUPERSEDED, [(*r[1:], by_partition, by_offset) for r in rows])
        with self._registered("tl_old", table):
            self.cur.execute("INSERT INTO superseded_turns BY NAME SELECT * FROM tl_old")
        row_ids = [int(r[0]) for r in rows]
        if len(row_ids) <= 16:
            for rid in row_ids:  # a point delete by rowid skips to its row group
                self.cur.execute("DELETE FROM turns WHERE rowid = ?", [rid])
        else:
            self.cur.execute("DELETE FROM turns WHERE rowid IN (SELECT unnest(?::BIGINT[]))", [row_ids])

    def _write(
        self,
        works: dict[bytes, _Work],
        superseded: list[tuple[bytes, bytes, _Row, int, int]],
        heads: dict[bytes, bytes],
        quarantine: list[tuple[Any, ...]],
    ) -> None:
        cur = self.cur
        for source, w in works.items():
            for first, last, by_p, by_o in w.db_cuts:
                self._supersede_stored(source, first, last, by_p, by_o)

        if superseded:
            table = _rows_table(
                _ARROW_SUPERSEDED,
                [(source, row[0], project, *row[1:], by_p, by_o) for source, project, row, by_p, by_o in superseded],
            )
            with self._registered("tl_superseded", table):
                cur.execute("INSERT INTO superseded_turns BY NAME SELECT * FROM tl_superseded")

        pending = [(source, w) for source, w in works.items() if w.pending]
        if sum(len(w.pending) for _, w in pending) <= _VALUES_ROWS:
            rows_in = [(page_key(source, row[0]), source, row[0], w.state.project, *row[1:]) for source, w in pending for row in w.pending]
            if rows_in:
                cur.execute(_values_sql(_TURNS_INSERT, len(_ARROW_TURNS), len(rows_in)), [v for r in rows_in for v in r])
        elif pending:
            keys: list[int] = []
            srcs: list[bytes] = []
            projects: list[bytes] = []
            rows: list[_Row] = []
            for source, w in works.items():
                if not w.pending:
                    continue
                n = len(w.pending)
                keys.extend(page_key(source, row[0]) for row in w.pending)
                srcs.extend([source] * n)
                projects.extend([w.state.project] * n)
                rows.extend(w.pending)
            seq, *rest = zip(*rows, strict=True)
            table = _arrow_table(_ARROW_TURNS, [keys, srcs, seq, projects, *rest])
            with self._registered("tl_turns", table):
                cur.execute("INSERT INTO turns BY NAME SELECT * FROM tl_turns")

        if len(works) <= _VALUES_ROWS:
            if works:
                rows_s = [w.state.row(source) for source, w in works.items()]
                cur.execute(_values_sql(_SOURCES_UPSERT, len(_ARROW_SOURCES), len(rows_s)), [v for r in rows_s for v in r])
        else:
            table = _rows_table(_ARROW_SOURCES, [w.state.row(source) for source, w in works.items()])
            with self._registered("tl_sources_new", table):
                cur.execute(f"INSERT OR REPLACE INTO sources BY NAME SELECT {_SOURCE_COLUMNS} FROM tl_sources_new")  # noqa: S608

        # A project's head is written when it moves to another source (most appends keep it).
        known = self.p._head_cache
        moved = {project: source for project, source in heads.items() if known.get(project) != source}
        if len(moved) <= _VALUES_ROWS:
            if moved:
                cur.execute(_values_sql(_HEADS_UPSERT, 2, len(moved)), [v for pair in moved.items() for v in pair])
        else:
            table = _arrow_table(_ARROW_HEADS, [list(moved), list(moved.values())])
            with self._registered("tl_heads", table):
                cur.execute("INSERT OR REPLACE INTO project_heads BY NAME SELECT * FROM tl_heads")

        if quarantine:
            table = _rows_table(_ARROW_QUARANTINE, quarantine)
            with self._registered("tl_quarantine", table):
                cur.execute("INSERT INTO quarantine BY NAME SELECT * FROM tl_quarantine")

        for part, c in self.counters.items():
            # An UPDATE of the existing row: DuckDB's INSERT OR REPLACE costs ~2 ms a statement (its
            # conflict handling), three times an UPDATE's; a partition's first batch inserts the row.
            updated = cur.execute(
                "UPDATE applied_offsets SET next_offset = ?, records = ?, appended = ?, rewinds = ?, duplicates = ?, "
                "quarantined = ? WHERE topic = ? AND log_partition = ?",
                [c.next_offset, c.records, c.appended, c.rewinds, c.duplicates, c.quarantined, self.topic, part],
            ).fetchone()
            if not updated or not updated[0]:
                cur.execute(
                    "INSERT INTO applied_offsets VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [self.topic, part, c.next_offset, c.records, c.appended, c.rewinds, c.duplicates, c.quarantined],
                )
