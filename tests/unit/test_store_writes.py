"""``writes.execute_over``: a statement over an Arrow table found by DuckDB's replacement scan.

The store's set-based writes depend on it (DuckDB pinned in pyproject); these tests pin the seam: the
table is seen under ``tl_rows``, each call sees its own table, and nothing stays in the catalog.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from throughline.projector.store.writes import execute_over


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
        try:
            execute_over(con, "INSERT INTO t SELECT * FROM tl_rows", _table([1]))  # a duplicate key
            raise AssertionError("the duplicate key was accepted")
        except duckdb.ConstraintException:
            pass
        con.execute("ROLLBACK")
        names = con.execute(
            "SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
        assert ("tl_rows",) not in names
        # Outside a call the name means nothing.
        try:
            con.execute("SELECT * FROM tl_rows")
            raise AssertionError("tl_rows resolved outside execute_over")
        except duckdb.CatalogException:
            pass
    finally:
        con.close()
