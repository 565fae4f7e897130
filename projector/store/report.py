"""Whole-projection reads for operators and tests: counts (``read_stats``), the quarantine listing
(``read_quarantine``), ``table_digests`` and ``table_rows``; each reads one snapshot on its own cursor
of ``con``."""

from __future__ import annotations

import hashlib
from typing import Any

import duckdb

from throughline.projector.store.files import cursor
from throughline.projector.store.repair_rows import load_repairs
from throughline.projector.store.schema import TABLE_ORDER
from throughline.projector.store.values import (
    BrokenSource,
    PartitionStats,
    ProjectionStats,
    QuarantineEntry,
    QuarantineListing,
)
from throughline.projector.store.view import heads_past_milestones


def read_stats(
    con: duckdb.DuckDBPyConnection, topic: str | None, topic_id: str | None, *, latest_quarantine: int = 10
) -> ProjectionStats:
    """Counts and per-partition counters, read in one snapshot (no raw record bytes)."""
    cur = cursor(con)
    try:
        cur.execute("BEGIN TRANSACTION")
        parts = cur.execute(
            "SELECT log_partition, next_offset, records, appended, rewinds, duplicates, quarantined "
            "FROM applied_offsets WHERE topic = ? ORDER BY log_partition",
            [topic or ""],
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
        topic=topic,
        topic_id=topic_id,
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


def read_quarantine(
    con: duckdb.DuckDBPyConnection, project_sha256: bytes | None = None, *, times: bool = True
) -> QuarantineListing:
    """Every quarantined record (in log order), broken source and applied repair, of one project or
    of all, read in one snapshot; never a raw record byte. ``times=False`` skips reading the
    records' values to decode when they were produced (``/metrics`` needs only the counts).

    """
    from throughline.schemas.codec import produced_at

    cur = cursor(con)
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
        # A broken source may keep growing past its row (the fold goes on): its length is its head's.
        past = heads_past_milestones(cur, {bytes(r[0]): int(r[2]) for r in broken})
        broken = [(r[0], r[1], past[bytes(r[0])][0] if bytes(r[0]) in past else r[2], *r[3:]) for r in broken]
        repairs = load_repairs(cur, project_sha256)
        cur.execute("ROLLBACK")
    finally:
        cur.close()
    return QuarantineListing(
        tuple(entries),
        tuple(BrokenSource(bytes(r[0]), bytes(r[1]), int(r[2]), r[3], r[4], r[5], r[6]) for r in broken),
        repairs,
    )


def table_digests(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """SHA-256 of every table's rows in a total order (identical projections have identical digests)."""
    cur = cursor(con)
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


def table_rows(con: duckdb.DuckDBPyConnection, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` (one of ``TABLE_ORDER``) in that total order, each as column -> value."""
    # Only the fixed names of TABLE_ORDER enter the SQL text: the caller's string only picks one.
    chosen = [(name, order) for name, order in TABLE_ORDER.items() if name == table]
    if not chosen:
        raise ValueError(f"no table {table!r} in a projection (tables: {', '.join(TABLE_ORDER)})")
    name, order = chosen[0]
    cur = cursor(con)
    try:
        cur.execute("BEGIN TRANSACTION")
        # Sorted here rather than by DuckDB: a sort of whole rows (bodies included) would need DuckDB
        # memory a projector's handle may not have under its memory limit. The order columns are NOT NULL.
        cur.execute(f"SELECT * FROM {name}")  # noqa: S608 (fixed names)
        columns = [d[0] for d in cur.description or ()]
        rows = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
        cur.execute("ROLLBACK")
    finally:
        cur.close()
    keys = [c.strip() for c in order.split(",")]
    rows.sort(key=lambda r: tuple(r[k] for k in keys))
    return rows
