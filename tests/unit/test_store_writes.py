"""The batch's writes (``projector/store/writes.py``) that the store's property tests cannot tell apart.

``execute_over`` runs a statement over an Arrow table found by DuckDB's replacement scan; the store's
set-based writes depend on it (DuckDB pinned in pyproject), so these tests pin the seam: the table is
seen under ``tl_rows``, each call sees its own table, and nothing stays in the catalog.
``write_offsets`` and ``write_heads`` trust the projection's committed state to know which rows
exist; a row missing under them must fail the batch, never lose an offset or a head.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from throughline.projector.exceptions import InvalidBatchError
from throughline.projector.store.schema import SCHEMA
from throughline.projector.store.state import PartitionCounters
from throughline.projector.store.values import BatchSummary
from throughline.projector.store.writes import execute_over, write_heads, write_offsets


def _table(keys: list[int]) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([f"v{k}" for k in keys], pa.string())})


def test_a_statement_sees_its_own_table_as_tl_rows(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    try:
        con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v VARCHAR)")
        con.execute("BEGIN TRANSACTION")
        execute_over(con, "INSERT INTO t SELECT * FROM tl_rows", _table([1, 2]))
        got = execute_over(con, "INSERT INTO t SELECT k + ?, v FROM tl_rows RETURNING k", _table([3]), [10]).fetchall()
        con.execute("COMMIT")
        assert got == [(13,)]
        assert con.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [(1, "v1"), (2, "v2"), (13, "v3")]
        # Without a table it is a plain statement with its parameters.
        assert execute_over(con, "SELECT count(*) FROM t WHERE k > ?", None, [1]).fetchall() == [(2,)]
    finally:
        con.close()


def test_nothing_of_the_table_stays_behind(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    try:
        con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v VARCHAR)")
        con.execute("BEGIN TRANSACTION")
        execute_over(con, "INSERT INTO t SELECT * FROM tl_rows", _table([1]))
        with pytest.raises(duckdb.ConstraintException):
            execute_over(con, "INSERT INTO t SELECT * FROM tl_rows", _table([1]))  # a duplicate key
        con.execute("ROLLBACK")
        names = con.execute(
            "SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
        assert ("tl_rows",) not in names
        # Outside a call the name means nothing.
        with pytest.raises(duckdb.CatalogException):
            con.execute("SELECT * FROM tl_rows")
    finally:
        con.close()


def _offsets_db(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(tmp_path / "o.duckdb"))
    for statement in SCHEMA:
        con.execute(statement)
    return con


def _counters(next_offset: int, records: int) -> PartitionCounters:
    return PartitionCounters(next_offset, BatchSummary(records, records - 1, 0, 1, 0))


def test_offsets_of_stored_and_new_partitions_are_written_in_one_statement_each(tmp_path: Path) -> None:
    con = _offsets_db(tmp_path)
    try:
        write_offsets(con, "t", {0: _counters(5, 5), 2: _counters(7, 7)}, stored=())
        write_offsets(con, "t", {0: _counters(9, 9), 1: _counters(3, 3), 2: _counters(8, 8)}, stored=(0, 2))
        write_offsets(con, "u", {0: _counters(1, 1)}, stored=())  # another topic's row is left alone
        write_offsets(con, "t", {2: _counters(10, 10)}, stored=(0, 1, 2))
        rows = con.execute("SELECT * FROM applied_offsets ORDER BY topic, log_partition").fetchall()
        assert rows == [
            ("t", 0, 9, 9, 8, 0, 1, 0),
            ("t", 1, 3, 3, 2, 0, 1, 0),
            ("t", 2, 10, 10, 9, 0, 1, 0),
            ("u", 0, 1, 1, 0, 0, 1, 0),
        ]
    finally:
        con.close()


def test_a_stored_partition_without_its_row_is_an_error_not_a_lost_offset(tmp_path: Path) -> None:
    con = _offsets_db(tmp_path)
    try:
        write_offsets(con, "t", {0: _counters(5, 5)}, stored=())
        with pytest.raises(InvalidBatchError, match="1 of the 2 partition rows"):
            write_offsets(con, "t", {0: _counters(6, 6), 1: _counters(2, 2)}, stored=(0, 1))
    finally:
        con.close()


def test_one_stored_partition_without_its_row_is_an_error_too(tmp_path: Path) -> None:
    con = _offsets_db(tmp_path)
    try:
        with pytest.raises(InvalidBatchError, match="0 of the 1 partition rows"):
            write_offsets(con, "t", {1: _counters(6, 6)}, stored=(1,))
    finally:
        con.close()


def _heads(con: duckdb.DuckDBPyConnection) -> dict[bytes, bytes]:
    return {
        bytes(p): bytes(s) for p, s in con.execute("SELECT project_sha256, source_sha256 FROM project_heads").fetchall()
    }


@pytest.mark.parametrize("projects", [1, 3, 80])  # one by key, a VALUES list, an Arrow table
def test_heads_known_to_exist_are_moved_by_key_and_the_others_upserted(tmp_path: Path, projects: int) -> None:
    con = _offsets_db(tmp_path)
    try:
        known = {bytes([1, i]): b"s-old" for i in range(projects)}
        write_heads(con, known)  # none stored yet: every row is inserted
        assert _heads(con) == known
        moved = {p: b"s-new" for p in known}
        stray = {bytes([2, i]): b"s-other" for i in range(projects)}  # not known: may or may not have a row
        write_heads(con, {**moved, **stray}, stored=known.keys())
        assert _heads(con) == {**moved, **stray}
        write_heads(con, {next(iter(stray)): b"s-again"}, stored=())  # an unknown project with a row: updated
        assert _heads(con)[next(iter(stray))] == b"s-again"
    finally:
        con.close()


def test_a_head_known_to_exist_without_its_row_is_an_error_not_a_lost_head(tmp_path: Path) -> None:
    con = _offsets_db(tmp_path)
    try:
        write_heads(con, {b"p1": b"s1"})
        with pytest.raises(InvalidBatchError, match="1 of the 2 head rows"):
            write_heads(con, {b"p1": b"s2", b"p2": b"s2"}, stored=(b"p1", b"p2"))
        with pytest.raises(InvalidBatchError, match="0 of the 1 head rows"):
            write_heads(con, {b"p3": b"s3"}, stored=(b"p3",))
    finally:
        con.close()


def test_every_commit_step_is_marked_at_the_code_that_performs_it() -> None:
    """``DuckProjection.apply_prepared`` lists the commit order once; each step it lists is marked
    ``# step N`` in the store's code, and no marker names a step the list lacks."""
    import re

    from throughline.projector.store import projection, transaction
    from throughline.projector.store.projection import DuckProjection

    listed = [int(n) for n in re.findall(r"^\s{8}(\d+)\. ", DuckProjection.apply_prepared.__doc__ or "", re.M)]
    assert listed == list(range(1, len(listed) + 1)) and len(listed) >= 10
    code = "".join(Path(m.__file__).read_text("utf-8") for m in (projection, transaction))  # type: ignore[arg-type]
    assert {int(n) for n in re.findall(r"# step (\d+)\b", code)} == set(listed)
