"""When a writable projection reaches the disk (``store.durability``): commits are not fsynced, DuckDB's
own automatic checkpoint is off, and the handle's checkpoints run with ``fsync_mode = STANDARD``.

What an fsync buys (surviving an operating-system crash) cannot be observed from a test; what can is
the configuration each handle runs with, that the WAL stays bounded by the handle's own checkpoints,
and that what a handle committed is in the file after it closed."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from projector_histories import TOPIC, place, to_log, turn

from throughline.projector.exceptions import ProjectionStorageError
from throughline.projector.store import DuckProjection, wal_path
from throughline.projector.store.durability import CommitDurability


def _setting(con: duckdb.DuckDBPyConnection, name: str) -> str:
    row = con.execute("SELECT current_setting(?)", [name]).fetchone()
    assert row is not None
    return str(row[0])


def _log(count: int) -> list:  # type: ignore[type-arg]
    return to_log(place([turn(turn_id=f"t{i}", body="b" * 400) for i in range(count)]))


def test_a_writable_handle_commits_without_fsync_and_checkpoints_itself(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "raw.duckdb"))
    try:
        CommitDurability(tmp_path / "raw.duckdb", wal_bytes=1 << 20).configure(con)
        assert _setting(con, "fsync_mode") == "NONE"
        assert _setting(con, "wal_autocheckpoint").endswith("TiB")  # DuckDB's own checkpoint never comes
        CommitDurability(tmp_path / "raw.duckdb", wal_bytes=1 << 20, sync_commits=True).configure(con)
        assert _setting(con, "fsync_mode") == "STANDARD"
        assert _setting(con, "wal_autocheckpoint") == "1.0 MiB"
    finally:
        con.close()


def test_the_wal_is_checkpointed_at_the_handles_threshold_and_commits_stay_unsynced(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    threshold = 64 * 1024
    seen: list[int] = []
    with DuckProjection.open(path, topic=TOPIC, wal_autocheckpoint=threshold) as projection:
        for record in _log(400):
            projection.apply_batch(TOPIC, record.partition, [record])
            seen.append(wal_path(path).stat().st_size if wal_path(path).exists() else 0)
        digests = projection.table_digests()
        fsync_mode = _setting(projection._file.connection, "fsync_mode")
    assert fsync_mode == "NONE"  # back to unsynced commits after every checkpoint
    assert max(seen) < threshold + 16 * 1024  # never far past the threshold: the handle checkpointed
    assert any(later < earlier for earlier, later in zip(seen, seen[1:], strict=False))  # and the WAL shrank
    assert not wal_path(path).exists() or wal_path(path).stat().st_size == 0  # the close checkpointed
    with DuckProjection.open(path, read_only=True, topic=TOPIC) as reopened:
        assert reopened.table_digests() == digests


def test_sync_commits_keeps_duckdbs_own_fsync_and_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with DuckProjection.open(path, topic=TOPIC, sync_commits=True) as projection:
        for record in _log(20):
            projection.apply_batch(TOPIC, record.partition, [record])
        assert _setting(projection._file.connection, "fsync_mode") == "STANDARD"
        projection.checkpoint()
        assert _setting(projection._file.connection, "fsync_mode") == "STANDARD"
        digests = projection.table_digests()
    with DuckProjection.open(path, read_only=True, topic=TOPIC) as reopened:
        assert reopened.table_digests() == digests


def test_an_explicit_checkpoint_is_synced_and_leaves_commits_unsynced(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with DuckProjection.open(path, topic=TOPIC) as projection:
        for record in _log(20):
            projection.apply_batch(TOPIC, record.partition, [record])
        assert wal_path(path).stat().st_size > 0
        projection.checkpoint()
        assert not wal_path(path).exists() or wal_path(path).stat().st_size == 0
        assert _setting(projection._file.connection, "fsync_mode") == "NONE"


def test_a_checkpoint_the_disk_refuses_is_a_typed_storage_error(tmp_path: Path) -> None:
    class Refusing:
        def __init__(self) -> None:
            self.statements: list[str] = []

        def execute(self, sql: str) -> None:
            self.statements.append(sql)
            if sql == "CHECKPOINT":
                raise duckdb.IOException("No space left on device")

    wal_path(tmp_path / "p.duckdb").write_bytes(b"x" * 100)
    cur = Refusing()
    with pytest.raises(ProjectionStorageError, match="cannot checkpoint"):
        CommitDurability(tmp_path / "p.duckdb", wal_bytes=10).after_commit(cur)  # type: ignore[arg-type]
    assert cur.statements[-1] == "SET fsync_mode = 'NONE'"  # commits stay unsynced after the failure


def test_readers_in_their_snapshots_never_fail_the_writers_checkpoint(tmp_path: Path) -> None:
    """``serve``'s readers read while its writer checkpoints: DuckDB refuses a plain ``CHECKPOINT`` while
    another transaction is active ("Cannot CHECKPOINT: there are other write transactions active"), which
    ended a busy ``serve`` with ``projection_storage`` once its WAL reached the threshold. Such a
    checkpoint is tried again after a later commit, and the readers are never failed."""
    import threading

    records = [turn(thread=f"t{i % 7}", turn_id=f"u{i}") for i in range(1500)]
    log = to_log(place(records))
    source = records[0].source_sha256
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = [0]
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC, wal_autocheckpoint=1 << 15) as projection:

        def read() -> None:
            while not stop.is_set():
                try:
                    with projection.view() as v:
                        v.head(records[0].project_sha256)
                        v.turns(source, 1, 20)
                    reads[0] += 1
                except BaseException as exc:
                    failures.append(exc)
                    return

        readers = [threading.Thread(target=read) for _ in range(3)]
        for t in readers:
            t.start()
        try:
            for i in range(0, len(log), 10):  # ~150 commits, a checkpoint every few
                projection.apply_batch(TOPIC, 0, log[i : i + 10])
        finally:
            stop.set()
            for t in readers:
                t.join(timeout=30)
        assert failures == [] and reads[0] > 0
        assert projection.applied_offsets() == {0: len(log)}
        more = to_log(place([turn(turn_id=f"u{i}") for i in range(len(log) + 1)]))[len(log) :]
        projection.apply_batch(TOPIC, 0, more)  # no reader now: this commit's checkpoint goes through
        wal = wal_path(tmp_path / "p.duckdb")
        assert not wal.exists() or wal.stat().st_size < 1 << 15  # checkpointed (DuckDB may remove the WAL)


_PROSE = (
    "The observer reads each completed turn of a thread and keeps its cursor only after a whole page. "
    "A projector folds the log into chains; a reader serves pages pinned to a through cursor. "
)


def test_a_writable_handle_stores_prose_bodies_without_fsst(tmp_path: Path) -> None:
    # FSST analysis of prose bodies made each checkpoint several times longer (and the reads of the
    # turns wait for a checkpoint): a writable handle leaves those methods out, whatever DuckDB prefers.
    path = tmp_path / "p.duckdb"
    records = to_log(place([turn(turn_id=f"t{i}", body=f"{i} {_PROSE * 6}") for i in range(600)]))
    with DuckProjection.open(path, topic=TOPIC) as projection:
        disabled = _setting(projection._file.connection, "disabled_compression_methods")
        projection.apply_batch(TOPIC, records[0].partition, records)
        projection.checkpoint()
        methods = {
            str(row[0]).upper()
            for row in projection._file.connection.execute(
                "SELECT DISTINCT compression FROM pragma_storage_info('turns') WHERE column_name = 'body'"
            ).fetchall()
        }
    assert "fsst" in disabled.lower()
    assert methods and not methods & {"FSST", "DICT_FSST"}, methods


def test_without_the_setting_duckdb_would_compress_those_bodies(tmp_path: Path) -> None:
    # The control: the same bodies in a plain table do get FSST (else the test above proves nothing).
    con = duckdb.connect(str(tmp_path / "plain.duckdb"))
    try:
        con.execute("CREATE TABLE t (body VARCHAR)")
        con.executemany("INSERT INTO t VALUES (?)", [[f"{i} {_PROSE * 6}"] for i in range(600)])
        con.execute("CHECKPOINT")
        methods = {
            str(r[0]).upper()
            for r in con.execute("SELECT DISTINCT compression FROM pragma_storage_info('t')").fetchall()
        }
    finally:
        con.close()
    assert methods & {"FSST", "DICT_FSST"}, methods
