"""The read side of the DuckDB projection: ``DuckView`` (one snapshot) and the SQL of turn ranges.

A page read asks a view for the partition's applied offset, the project's head, the chain heads of
its cursors' sources and then the turns it serves. The first three come from the projection's
``ReadIndex`` (in memory, checked against the snapshot's version: see ``throughline.projector.read_index``)
and, for what the index does not hold, from the snapshot itself; the turns of every range the page
needs come in ONE statement (``turns_many``): a handful of ART index lookups, whatever the size of
the history.

A view of a quiet projection (``DuckProjection.read``) has no transaction: each of its statements
is its own snapshot, and ``check`` says after each one whether it read the index's version (see "Quiet
reads" in ``throughline.projector.read_index``); when it did not, the view raises
``Overtaken`` and its caller reads again in a snapshot. The turns statement's text is parsed
once per shape (``statements.parsed``): DuckDB then only binds and plans it.

``turns`` buckets 64 consecutive seqs of one source under one indexed ``page_key``, because DuckDB
only takes an ART index for an equality filter, not for a range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import duckdb

from throughline.core.cursor import Cursor
from throughline.core.ports import SourceInfo, StoredTurn
from throughline.projector.read_index import ChainHead, Missing, ReadIndex
from throughline.projector.store.schema import TURN_COLUMNS
from throughline.projector.store.statements import parsed

#: Seqs per ``page_key`` bucket (a power of two): a page of up to 100 seqs spans at most 3 buckets.
PAGE_BUCKET_BITS = 6
_MAX_BUCKET_LOOKUPS = 32  # wider ranges (never asked by the reader) fall back to a scan
_MASK63 = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15

#: The columns a view reads of a turn (``StoredTurn`` in this order, after the source): a turn row's own
#: columns without its project (a view is asked by project already).
VIEW_COLUMNS = tuple(c for c in TURN_COLUMNS if c != "project_sha256")
#: The projection's version in a snapshot: the sum of its applied offsets (one more per commit at least).
_VERSION_SQL = "SELECT coalesce(sum(next_offset), 0) FROM applied_offsets WHERE topic = ?"


def snapshot_version(cur: duckdb.DuckDBPyConnection, topic: str | None) -> int:
    """The version (``ReadIndex.version``) of the snapshot ``cur`` reads."""
    row = cur.execute(parsed(_VERSION_SQL), [topic or ""]).fetchone()
    return int(row[0]) if row else 0


def page_key(source_sha256: bytes, seq: int) -> int:
    """The indexed bucket key of (source, seq): one value per 64 consecutive seqs of a source.

    A hash, not an identity: two sources may share a key, so every query also filters on the exact
    source and seq; a shared key only costs a few extra rows read.
    """
    return (int.from_bytes(source_sha256[:8], "big") + (seq >> PAGE_BUCKET_BITS) * _GOLDEN) & _MASK63


def _inner(column: str) -> str:
    return "rowid AS row_id" if column == "row_id" else column


def _bucket_sql(columns: Sequence[str], buckets: int, ranges: int = 1) -> str:
    # DuckDB takes an ART index scan for an equality or IN filter on the indexed column alone (with
    # any other conjunct it scans the table), so the buckets are one IN lookup inside a materialized
    # CTE and the exact source/seq filters are applied after it (measured: a third cheaper than a
    # UNION ALL of one lookup a bucket). Parameters: the bucket keys, then (source, first seq, last
    # seq) of each range.
    inner = ", ".join(_inner(c) for c in dict.fromkeys((*columns, "source_sha256", "seq")))
    keys = ", ".join(f"${i + 1}" for i in range(buckets))
    n = buckets
    where = " OR ".join(
        f"(source_sha256 = ${n + 3 * j + 1} AND seq BETWEEN ${n + 3 * j + 2} AND ${n + 3 * j + 3})"
        for j in range(ranges)
    )
    return (
        f"WITH b AS MATERIALIZED (SELECT {inner} FROM turns WHERE page_key IN ({keys})) "  # noqa: S608
        f"SELECT {', '.join(columns)} FROM b WHERE {where} ORDER BY source_sha256, seq"
    )


def _ranges_sql(buckets: int, ranges: int) -> str:
    # The bucket lookup alone as the filter, so DuckDB takes the ART index, and no CTE: a materialized
    # one cost twice the lookup (measured at 1M turns: ~4.5 ms against ~2 ms). The rows of the buckets
    # outside the ranges come back too, without their bodies (the CASE), and are dropped in Python.
    # Parameters: the bucket keys, then (source, first seq, last seq) of each range.
    keys = ", ".join(f"${i + 1}" for i in range(buckets))
    n = buckets
    match = " OR ".join(
        f"(source_sha256 = ${n + 3 * j + 1} AND seq BETWEEN ${n + 3 * j + 2} AND ${n + 3 * j + 3})"
        for j in range(ranges)
    )
    columns = ", ".join(f"CASE WHEN {match} THEN body END" if c == "body" else c for c in VIEW_COLUMNS)
    return f"SELECT {columns} FROM turns WHERE page_key IN ({keys})"  # noqa: S608 (fixed column names)


def turn_rows(
    cur: duckdb.DuckDBPyConnection, columns: Sequence[str], source: bytes, first: int, last: int
) -> list[tuple[Any, ...]]:
    """Live rows of ``source`` with ``first <= seq <= last`` (index lookups when the range is narrow)."""
    first = max(1, first)
    if last < first:
        return []
    lo, hi = first >> PAGE_BUCKET_BITS, last >> PAGE_BUCKET_BITS
    if hi - lo + 1 > _MAX_BUCKET_LOOKUPS:
        sql = (
            f"SELECT {', '.join(_inner(c) for c in columns)} FROM turns "  # noqa: S608 (fixed column names)
            "WHERE source_sha256 = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq"
        )
        return cur.execute(sql, [source, first, last]).fetchall()
    keys = [page_key(source, b << PAGE_BUCKET_BITS) for b in range(lo, hi + 1)]
    return cur.execute(_bucket_sql(columns, len(keys)), [*keys, source, first, last]).fetchall()


#: Bucket keys looked up by one ``heads_past_milestones`` statement.
_MILESTONE_KEYS = 256


def is_milestone(seq: int) -> bool:
    """Whether an append at ``seq`` rewrites its source's ``sources`` row: the first seq of a page bucket
    (``page_key``). With the other milestones (a source's first record, a rewind, a broken mark set or
    lifted) this keeps every live head in the bucket of its row's length (``heads_past_milestones``)."""
    return not seq & ((1 << PAGE_BUCKET_BITS) - 1)


def heads_past_milestones(
    cur: duckdb.DuckDBPyConnection, milestones: Mapping[bytes, int]
) -> dict[bytes, tuple[int, bytes, int, int]]:
    """The live head of each source whose chain grew past the length its ``sources`` row holds
    (``milestones``: source -> that length), as (length, chain digest, log partition, log offset); a
    source whose row is its head is absent.

    A ``sources`` row is rewritten only at a milestone (``is_milestone``), so the turns appended after
    it are all in the bucket of the row's length: one ART lookup a source, a few sources a statement.
    """
    out: dict[bytes, tuple[int, bytes, int, int]] = {}
    items = list(milestones.items())
    for start in range(0, len(items), _MILESTONE_KEYS):
        chunk = dict(items[start : start + _MILESTONE_KEYS])
        keys = list(dict.fromkeys(page_key(s, n) for s, n in chunk.items()))
        sql = (
            "SELECT source_sha256, seq, chain_digest, log_partition, log_offset FROM turns "  # noqa: S608
            f"WHERE page_key IN ({', '.join('?' for _ in range(len(keys)))})"
        )
        for source_b, seq, digest, part, offset in cur.execute(sql, keys).fetchall():
            source = bytes(source_b)
            length = chunk.get(source)
            # Rows of another source sharing the key, and this source's turns at or below its row's
            # length (the same bucket), are not past it.
            if length is None or seq <= length or seq >> PAGE_BUCKET_BITS != length >> PAGE_BUCKET_BITS:
                continue
            best = out.get(source)
            if best is None or seq > best[0]:
                out[source] = (int(seq), bytes(digest), int(part), int(offset))
    return out


def _stored(r: tuple[Any, ...]) -> StoredTurn:
    return StoredTurn(int(r[1]), r[2], int(r[3]), r[4], int(r[5]), bytes(r[6]), bytes(r[7]), int(r[8]), int(r[9]))


class Overtaken(Exception):
    """A quiet view (one without a transaction) saw a commit land while it read: its answers may be of two
    versions. Never leaves the store: ``DuckProjection.read`` throws the view away and reads again."""


class DuckView:
    """One snapshot of the projection (a ``ProjectionView``): every answer is of one version.

    ``cur`` reads that snapshot (a transaction, or any statement of a read-only file, which cannot
    change); ``index`` and ``version``, when given, answer what the index holds at that version, and
    ``applied`` are the applied offsets at it. Without them every answer comes from ``cur``. ``check``,
    when given, is asked after every statement whether it still read ``version`` (a quiet view's
    statements are each their own snapshot); when not, the view raises ``Overtaken``.
    """

    def __init__(
        self,
        cur: duckdb.DuckDBPyConnection,
        topic: str | None,
        index: ReadIndex | None = None,
        version: int = 0,
        applied: Mapping[int, int] | None = None,
        check: Callable[[], bool] | None = None,
    ) -> None:
        self._cur = cur
        self._check = check
        self._topic = topic
        self._index = index
        self._version = version
        self._applied = applied

    def applied_offset(self, partition: int) -> int:
        """The next offset the projector will apply on ``partition`` (0 when nothing was applied)."""
        if self._applied is not None:
            return self._applied.get(partition, 0)
        if self._topic is None:
            return 0
        row = self._one(
            self._cur.execute(
                "SELECT next_offset FROM applied_offsets WHERE topic = ? AND log_partition = ?",
                [self._topic, partition],
            )
        )
        return int(row[0]) if row else 0

    def _held(self) -> None:
        """After a statement: raise when it may have read another version than the view's."""
        if self._check is not None and not self._check():
            raise Overtaken("a commit landed while the view read without a transaction")

    def _one(self, result: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
        """The first row of a statement just executed on the view's cursor, once ``_held`` says it read
        the view's version."""
        row = result.fetchone()
        self._held()
        return row

    def _head_source(self, project_sha256: bytes) -> bytes | None:
        if self._index is not None:
            known = self._index.head(project_sha256, self._version)
            if not isinstance(known, Missing):
                return known
        row = self._one(
            self._cur.execute(
                parsed("SELECT source_sha256 FROM project_heads WHERE project_sha256 = ?"), [project_sha256]
            )
        )
        source = bytes(row[0]) if row else None
        if self._index is not None:
            self._index.learn_head(project_sha256, source, self._version)
        return source

    def _chain(self, source_sha256: bytes) -> ChainHead | None:
        if self._index is not None:
            known = self._index.chain(source_sha256, self._version)
            if not isinstance(known, Missing):
                return known
        row = self._one(
            self._cur.execute(
                "SELECT project_sha256, length, chain_digest, head_partition, head_offset, broken_reason "
                "FROM sources WHERE source_sha256 = ?",
                [source_sha256],
            )
        )
        chain = None
        if row is not None:
            # The row holds the chain as of its last milestone; the turns after it are in one bucket.
            length, digest, partition, offset = int(row[1]), bytes(row[2]), row[3], row[4]
            past = heads_past_milestones(self._cur, {source_sha256: length}).get(source_sha256)
            self._held()
            if past is not None:
                length, digest, partition, offset = past
            chain = ChainHead(bytes(row[0]), length, digest, partition, offset, row[5])
        if self._index is not None:
            self._index.learn_chain(source_sha256, chain, self._version)
        return chain

    def head(self, project_sha256: bytes) -> Cursor | None:
        """The project's head source's full live chain as a cursor, or ``None`` when it has no turns."""
        source = self._head_source(project_sha256)
        if source is None:
            return None
        chain = self._chain(source)
        if chain is None or not chain.length or chain.head_partition is None or chain.head_offset is None:
            return None
        return Cursor(
            project_sha256, source, chain.length, chain.chain_digest, int(chain.head_partition), int(chain.head_offset)
        )

    def source(self, source_sha256: bytes) -> SourceInfo | None:
        """A source's chain head and broken mark, or ``None`` when the projection never saw it."""
        chain = self._chain(source_sha256)
        if chain is None:
            return None
        return SourceInfo(chain.project_sha256, source_sha256, chain.length, chain.chain_digest, chain.broken_reason)

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> list[StoredTurn]:
        """Live turns with ``first_seq <= seq <= last_seq`` in ascending seq (missing rows are absent)."""
        return self.turns_many([(source_sha256, first_seq, last_seq)])[0]

    def turns_many(self, ranges: Sequence[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
        """``turns`` of each (source, first seq, last seq), all read by one statement."""
        wanted = [(s, max(1, a), b) for s, a, b in ranges]
        live = [(s, a, b) for s, a, b in wanted if b >= a]
        keys: dict[int, None] = {}
        for source, first, last in live:
            lo, hi = first >> PAGE_BUCKET_BITS, last >> PAGE_BUCKET_BITS
            if hi - lo + 1 > _MAX_BUCKET_LOOKUPS:  # a wide range (never a page's): each is its own scan
                wide = [[_stored(r) for r in turn_rows(self._cur, VIEW_COLUMNS, *r)] for r in wanted]
                self._held()
                return wide
            keys.update((page_key(source, b << PAGE_BUCKET_BITS), None) for b in range(lo, hi + 1))
        if not live:
            return [[] for _ in ranges]
        params: list[Any] = list(keys)
        for source, first, last in live:
            params += [source, first, last]
        by_source: dict[bytes, list[StoredTurn]] = {}
        found = self._cur.execute(parsed(_ranges_sql(len(keys), len(live))), params).fetchall()
        self._held()
        for r in found:
            if r[4] is not None:  # a row of a range (the others come without their body)
                by_source.setdefault(bytes(r[0]), []).append(_stored(r))
        for rows in by_source.values():
            rows.sort(key=lambda t: t.seq)
        return [[t for t in by_source.get(s, []) if a <= t.seq <= b] for s, a, b in wanted]
