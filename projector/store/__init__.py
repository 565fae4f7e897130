"""The DuckDB projection: schema, the exactly-once batch apply path, and the read-side handle.

The only package that imports duckdb (and pyarrow). Its modules, one concern each:

- ``projection``: ``DuckProjection``, the facade that implements the port (reads, waits, staging, apply)
  over the store and the read state (``throughline.projector.read_state``);
- ``projection_file``: ``ProjectionFile``, the store: one file (open, lock, close) and its exactly-once
  write, telling a ``CommitListener`` of each commit;
- ``transaction``: ``ApplyTransaction``, the fold and writes of one batch in the DuckDB transaction it owns;
- ``staging``: ``StagedFold``, the same fold over the committed file and the layers above it, for readers
  before the commit (``DuckProjection.stage``);
- ``writes``: the statements that write a folded batch; ``repair_rows``: the repairs' rows and marks;
- ``view``: ``DuckView``, one read snapshot (heads, sources, turns of pages);
- ``report``: stats, the quarantine listing, ``table_digests``, ``table_rows``; ``schema``: the tables, version;
- ``state``: the writer's cached chain heads and partition counters; ``values``: the frozen value types;
- ``files``: opening a file (one writer a process, typed open errors); ``durability``: commits without
  an ``fsync``, checkpoints with one (what survives a process crash and what a power loss);
- ``snapshots``: read snapshots of a file; ``statements``: statements parsed once per text;
- ``cut_files``: a projection snapshot's tables written to Parquet in one read transaction, and loaded
  into a new file (not a read snapshot: a consistent cut of the file, docs/operations.md);
- ``placements``: where the projection last placed a turn id (the fold's look-up);
- ``stored_keys``: ``StoredTurnKeys``, the turn keys a file may hold, in memory for the staged fold.

Tables (one projection file holds one topic; see ``schema.SCHEMA``):

- ``meta``: schema version, topic name, topic id and partition count of the log it was built from.
- ``applied_offsets``: per topic partition, the next offset to apply, plus deterministic counters of
  what the applied records did (records, appended, rewinds, duplicates, quarantined).
- ``turns``: the live turns of every chain. ``page_key`` buckets 64 consecutive seqs of one source
  under one indexed ``BIGINT``, so a page of at most 100 seqs is at most three ART index lookups
  whatever the size of the history (DuckDB only uses an ART index for equality, not ranges).
- ``superseded_turns``: turns a rewind or an amend replaced, kept for audit and never served, with
  the log position of the record that superseded them.
- ``turn_ids``: one row per (source, turn id) ever applied, live or superseded (``turn_key`` is a
  128-bit hash of the pair), with the content digest of its last placement: which ids were applied
  before, as index probes; where one was last placed is then read from ``turns`` and
  ``superseded_turns`` (``placements``).
- ``sources``: each chain's head (length, ``d(length)``, log position of the record that made
  ``seq == length``) and its broken mark (the first record of it the fold rejected), as of the
  source's last *milestone* (``view.is_milestone``: its first record, a seq that opens a page bucket,
  a rewind, a broken mark set or lifted); the turns appended since are in the bucket of the row's
  length, and readers take the head from them (``view.heads_past_milestones``).
- ``project_heads``: each project's head source (the source of its latest appended turn).
- ``quarantine``: records that did not decode or that the fold refused, with the raw key and value,
  and the log position of the repair record that marked them repaired (if one did).
- ``repairs``: every sound repair record applied (``throughline.core.repair``), with its outcome and
  the chain it accepted.

No column holds a wall-clock time, so replaying a log into a new file and projecting it as a stream
yield identical tables whatever the batch boundaries (``table_digests`` compares them).

Exactly once: ``DuckProjection.apply_prepared`` (and ``apply_batch`` on top of it) writes the rows of a batch and the
partition's next offset in one DuckDB transaction. A crash before the commit loses the whole batch
(the projector seeks back to the stored offset and applies it again); after the commit nothing of it
is applied twice, because records below the stored offset are skipped.
"""

from throughline.projector.prepare import (
    Q_CHAIN,
    Q_INVALID,
    Q_MISPLACED,
    Q_UNDECODABLE,
    Q_UNKNOWN_SCHEMA,
    LogRecord,
    PreparedBatch,
    prepare_batch,
    turn_key,
)
from throughline.projector.store.durability import DEFAULT_WAL_AUTOCHECKPOINT
from throughline.projector.store.files import wal_path
from throughline.projector.store.projection import (
    DEFAULT_MEMORY_HEADROOM,
    DEFAULT_SOURCE_CACHE,
    DuckProjection,
)
from throughline.projector.store.schema import SCHEMA, SCHEMA_VERSION, TABLE_ORDER, TURN_COLUMNS
from throughline.projector.store.staging import stageable
from throughline.projector.store.values import (
    BatchSummary,
    BrokenSource,
    PartitionStats,
    ProjectionStats,
    QuarantineEntry,
    QuarantineListing,
    RepairEntry,
)
from throughline.projector.store.view import PAGE_BUCKET_BITS, DuckView, is_milestone, page_key

__all__ = [
    "DEFAULT_MEMORY_HEADROOM",
    "DEFAULT_SOURCE_CACHE",
    "DEFAULT_WAL_AUTOCHECKPOINT",
    "PAGE_BUCKET_BITS",
    "Q_CHAIN",
    "Q_INVALID",
    "Q_MISPLACED",
    "Q_UNDECODABLE",
    "Q_UNKNOWN_SCHEMA",
    "SCHEMA",
    "SCHEMA_VERSION",
    "TABLE_ORDER",
    "TURN_COLUMNS",
    "BatchSummary",
    "BrokenSource",
    "DuckProjection",
    "DuckView",
    "LogRecord",
    "PartitionStats",
    "PreparedBatch",
    "ProjectionStats",
    "QuarantineEntry",
    "QuarantineListing",
    "RepairEntry",
    "is_milestone",
    "page_key",
    "prepare_batch",
    "stageable",
    "turn_key",
    "wal_path",
]
