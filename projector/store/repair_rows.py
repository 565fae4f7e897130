"""The projection's side of repairs (DuckDB): rows of the ``repairs`` table (``schema.SCHEMA``) and the
quarantine's repaired marks.

What a repair decides is ``throughline.core.repair.decide_repair``; the store's batch fold
(``throughline.projector.store.transaction``) calls it in log order and uses these statements, inside the batch's one
transaction, to count and mark the source's quarantined records and to keep the repair. A repair is
rare (an operator's act), so these are plain point statements; the quarantine has no index on the
source, and its scan is bounded by the quarantine's size.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from throughline.projector.store.values import RepairEntry

#: One ``repairs`` row, in the table's column order.
RepairRow = tuple[int, int, bytes, bytes, str, int, str, bool, int, int, bytes]

_UNMARKED = (
    " WHERE log_partition = $1 AND project_sha256 = $2 AND source_sha256 = $3 "
    "AND log_offset < $4 AND repaired_offset IS NULL"
)


def count_unmarked(
    cur: duckdb.DuckDBPyConnection, partition: int, project_sha256: bytes, source: bytes, below: int
) -> int:
    """The source's stored quarantined records on ``partition`` below ``below`` that no repair marked."""
    sql = "SELECT count(*) FROM quarantine" + _UNMARKED  # noqa: S608 (constants)
    rows = cur.execute(sql, [partition, project_sha256, source, below]).fetchall()
    return int(rows[0][0]) if rows else 0


def mark_quarantined(
    cur: duckdb.DuckDBPyConnection, partition: int, project_sha256: bytes, source: bytes, below: int
) -> int:
    """Mark those records repaired by the repair at (``partition``, ``below``); returns how many."""
    row = cur.execute(
        "UPDATE quarantine SET repaired_partition = $1, repaired_offset = $4" + _UNMARKED,  # noqa: S608 (constants)
        [partition, project_sha256, source, below],
    ).fetchone()
    return int(row[0]) if row else 0


def insert_repairs(cur: duckdb.DuckDBPyConnection, rows: Sequence[RepairRow]) -> None:
    """Keep the batch's applied repairs."""
    for row in rows:
        cur.execute("INSERT INTO repairs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", list(row)).fetchall()


def load_repairs(cur: duckdb.DuckDBPyConnection, project_sha256: bytes | None) -> tuple[RepairEntry, ...]:
    """The applied repairs of one project (or all), in log order, from the transaction open on ``cur``."""
    rows = cur.execute(
        "SELECT log_partition, log_offset, project_sha256, source_sha256, reason, outcome, marked, length, "
        "produced_at_us FROM repairs WHERE $1::BLOB IS NULL OR project_sha256 = $1::BLOB "
        "ORDER BY log_partition, log_offset",
        [project_sha256],
    ).fetchall()
    return tuple(
        RepairEntry(int(r[0]), int(r[1]), bytes(r[2]), bytes(r[3]), r[4], r[5], int(r[6]), int(r[7]), int(r[8]))
        for r in rows
    )
