"""How a projection file is opened (``store.files``): attached with the projection's row groups, so a poll
of a backlog writes its turns into the file at COMMIT instead of through the write-ahead log; cursors
that start in the projection; and the pool that keeps them for the next read."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from projector_histories import TOPIC, place, to_log, turn

from throughline.projector.store import DuckProjection, wal_path
from throughline.projector.store.files import ALIAS, ROW_GROUP_SIZE, CursorPool, connect, cursor

BODY = "b" * 1000


def _poll(count: int) -> list:  # type: ignore[type-arg]
    return to_log(place([turn(turn_id=f"t{i}", body=BODY) for i in range(count)]))


def _wal_bytes(path: Path) -> int:
    wal = wal_path(path)
    return wal.stat().st_size if wal.exists() else 0


def test_a_poll_of_a_row_group_or_more_goes_into_the_file_not_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    count = 2 * ROW_GROUP_SIZE + 100
    with DuckProjection.open(path, topic=TOPIC) as projection:
        projection.apply_batch(TOPIC, 0, _poll(count))
        wal = _wal_bytes(path)
        digests = projection.table_digests()
    # The bodies alone are ~4 MB; the WAL holds where they are, and the index entries.
    assert wal < count * len(BODY) // 4, wal
    with DuckProjection.open(path, read_only=True, topic=TOPIC) as reopened:
        assert reopened.table_digests() == digests
        assert len(reopened.table_rows("turns")) == count


def test_with_duckdbs_default_row_groups_the_same_poll_goes_through_the_wal(tmp_path: Path) -> None:
    """The control: what the projection's row group size changes (DuckDB's default is 122,880 rows)."""
    path = tmp_path / "plain.duckdb"
    with DuckProjection.open(path, topic=TOPIC):
        pass  # the schema
    count = 2 * ROW_GROUP_SIZE + 100
    bodies = pa.table({"k": pa.array(range(count), pa.int64()), "body": pa.array([BODY] * count, pa.string())})
    con = duckdb.connect(str(path))
    try:
        con.execute("SET wal_autocheckpoint = '1TiB'")
        con.execute("CREATE TABLE bodies (k BIGINT, body VARCHAR)")
        con.execute("CHECKPOINT")
        before = _wal_bytes(path)
        con.register("bodies_arrow", bodies)
        con.execute("INSERT INTO bodies SELECT * FROM bodies_arrow")
        assert _wal_bytes(path) - before > count * len(BODY) // 2
    finally:
        con.close()


def test_connections_and_cursors_start_in_the_projection(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    con = connect(path, read_only=False)
    try:
        con.execute("CREATE TABLE t (x INTEGER)")
        assert con.execute("SELECT current_database()").fetchone() == (ALIAS,)
        cur = cursor(con)
        assert cur.execute("SELECT count(*) FROM t").fetchone() == (0,)
        cur.close()
        plain = con.cursor()  # what ``cursor`` is for: DuckDB's own starts in the in-memory database
        with pytest.raises(duckdb.CatalogException):
            plain.execute("SELECT count(*) FROM t")
        plain.close()
        temp = con.execute("SELECT current_setting('temp_directory')").fetchone()
        assert temp == (f"{path}.tmp",)  # spills beside the file, as DuckDB does for a file it opens
    finally:
        con.close()


def test_the_pool_hands_back_a_returned_cursor_and_drops_one_a_read_failed_in(tmp_path: Path) -> None:
    con = connect(tmp_path / "p.duckdb", read_only=False)
    pool = CursorPool(con, keep=1)
    try:
        with pool.borrowed() as first:
            assert first.execute("SELECT current_database()").fetchone() == (ALIAS,)
        with pool.borrowed() as again:
            assert again is first
            with pool.borrowed() as second:  # the pool is empty while ``first`` is out
                assert second is not first
        with pytest.raises(RuntimeError), pool.borrowed() as failed:
            raise RuntimeError("the read failed")
        with pytest.raises(duckdb.ConnectionException):
            failed.execute("SELECT 1")  # closed, not put back
        with pool.borrowed() as after:
            assert after is not failed
        pool.close()
        with pytest.raises(duckdb.ConnectionException):
            after.execute("SELECT 1")  # an idle cursor closes with the pool
    finally:
        pool.close()
        con.close()
