"""A projection snapshot's DuckDB side: writing a consistent cut of a projection to Parquet files
(``write_cut``) and building a new projection file from them (``load_cut``).

Named "cut", not "snapshot": ``snapshots.py`` is a read's snapshot inside the store. The format and its
checks are ``throughline.projector.cut_manifest``; docs/operations.md "Projection snapshots" describes it.

Why a cut is consistent and never blocks the projector: every table is read in ONE DuckDB transaction on
a cursor of its own. DuckDB's MVCC gives that transaction the state of one commit, and a commit writes a
batch's rows and its partition's ``applied_offsets`` row together, so the files hold exactly the rows of
the offsets they carry. The transaction reads only: it takes no lock the projector's writer waits for
(the writer's automatic checkpoint is skipped while it is open, and tried again after a later commit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from throughline.core.partitioning import partition_for
from throughline.projector.cut_manifest import (
    COUNTERS,
    CUT_TABLES,
    CutManifest,
    describe_file,
    table_file,
    write_manifest,
)
from throughline.projector.exceptions import (
    ProjectionIncompatibleError,
    SnapshotDamagedError,
    SnapshotPartitionsError,
)
from throughline.projector.prepare import TURN_KEY_DOMAIN  # the key of turn_ids, in SQL
from throughline.projector.store.durability import skip_costly_compression
from throughline.projector.store.files import connect, cursor
from throughline.projector.store.schema import SCHEMA_VERSION, ensure_schema

#: Each table of a whole cut (every partition), in the file's own scan order. Not sorted: sorting by each
#: table's total order (``schema.TABLE_ORDER``, which would make two peers' files of one state identical)
#: cost a quarter more time and twice the peak memory on 1M turns (8.3 s / 3.9 GB against 6.4 s / 2.1 GB,
#: docs/operations.md "Projection snapshots"); the digests are for the transfer, not for comparing peers.
#: ``turn_ids`` alone is written in key order: its keys are hashes, and a joiner inserts them into the
#: table's primary-key index far faster in order (3M turns in six partitions: the loads took 3.6-5.5 s
#: against 5.0-7.0 s from files in scan order, docs/scale-out.md "Guesses and limits"), for a sort of
#: 16-byte keys at the holder.
WHOLE: dict[str, str] = {
    "applied_offsets": "SELECT * FROM applied_offsets",
    "sources": "SELECT * FROM sources",
    "project_heads": "SELECT * FROM project_heads",
    "turns": "SELECT * FROM turns",
    "superseded_turns": "SELECT * FROM superseded_turns",
    "turn_ids": "SELECT * FROM turn_ids ORDER BY turn_key",
    "quarantine": "SELECT * FROM quarantine",
    "repairs": "SELECT * FROM repairs",
}
#: The ``turn_ids`` keys of the chosen partitions' live and superseded turns (``$1``: the partitions,
#: ``$2``: ``TURN_KEY_DOMAIN``).
_CHOSEN_TURN_KEYS = (
    "SELECT unhex(left(sha256($2 || source_sha256 || encode(turn_id)), 32)) FROM turns "
    "WHERE list_contains($1, log_partition) UNION ALL "
    "SELECT unhex(left(sha256($2 || source_sha256 || encode(turn_id)), 32)) FROM superseded_turns "
    "WHERE list_contains($1, log_partition)"
)
#: The same for chosen partitions (``$1``: their list). A row's partition is its ``log_partition`` where
#: it has one (every record of a project sits on its project's partition: a misplaced one is only a
#: quarantine row, on the partition it sat on); ``sources`` and ``project_heads`` have the project hash
#: instead (``cut_projects``: the projects of the chosen partitions, ``partition_for``); ``turn_ids`` has
#: only a hash of (source, turn id), so it is matched against the keys of the chosen partitions' live
#: and superseded turns (every key in ``turn_ids`` is placed in one of the two: ``placements``).
PARTIAL: dict[str, str] = {
    "applied_offsets": "SELECT * FROM applied_offsets WHERE list_contains($1, log_partition)",
    "sources": "SELECT * FROM sources WHERE project_sha256 IN (SELECT project_sha256 FROM cut_projects)",
    "project_heads": "SELECT * FROM project_heads WHERE project_sha256 IN (SELECT project_sha256 FROM cut_projects)",
    "turns": "SELECT * FROM turns WHERE list_contains($1, log_partition)",
    "superseded_turns": "SELECT * FROM superseded_turns WHERE list_contains($1, log_partition)",
    "turn_ids": f"SELECT * FROM turn_ids WHERE turn_key IN ({_CHOSEN_TURN_KEYS}) ORDER BY turn_key",  # noqa: S608
    "quarantine": "SELECT * FROM quarantine WHERE list_contains($1, log_partition)",
    "repairs": "SELECT * FROM repairs WHERE list_contains($1, log_partition)",
}
_PARQUET_COMPRESSION = "zstd"


def write_cut(cur: duckdb.DuckDBPyConnection, out_dir: Path, partitions: Sequence[int] | None) -> CutManifest:
    """Write the rows of ``partitions`` (``None``: every partition) and their applied offsets as committed
    together, read in one transaction on ``cur`` (a cursor of its own), into ``out_dir`` (which exists
    and is empty); the manifest is written last. Returns it.

    ``SnapshotPartitionsError`` for a partition the topic does not have, or a projection that has not
    recorded its topic's partition count yet."""
    cur.execute("BEGIN TRANSACTION")
    try:
        meta = dict(cur.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise ProjectionIncompatibleError(
                f"a projection of schema version {meta.get('schema_version')!r}, not {SCHEMA_VERSION}"
            )
        topic, count = meta.get("topic"), meta.get("partitions")
        if topic is None or count is None:
            raise SnapshotPartitionsError(
                "this projection has not recorded its topic and partition count yet (no projector ran on it): "
                "nothing to snapshot"
            )
        n = int(count)
        chosen = tuple(range(n)) if partitions is None else tuple(sorted(set(partitions)))
        outside = [p for p in chosen if not 0 <= p < n]
        if outside:
            raise SnapshotPartitionsError(f"topic {topic!r} has partitions 0..{n - 1}, not {outside}")
        whole = chosen == tuple(range(n))
        if not whole:
            _register_projects(cur, chosen, n)
        rows: dict[str, int] = {}
        for table in CUT_TABLES:
            if whole:
                relation = cur.sql(WHOLE[table])
            else:
                sql = PARTIAL[table]
                params = [list(chosen), TURN_KEY_DOMAIN][: 2 if "$2" in sql else 1 if "$1" in sql else 0]
                relation = cur.sql(sql, params=params or None)
            target = out_dir / table_file(table)
            relation.write_parquet(str(target), compression=_PARQUET_COMPRESSION)
            counted = cur.execute("SELECT count(*) FROM read_parquet(?)", [str(target)]).fetchall()
            rows[table] = int(counted[0][0])
        offsets = {
            int(r[0]): dict(zip(COUNTERS, (int(v) for v in r[1:]), strict=True))
            for r in cur.execute(
                "SELECT log_partition, next_offset, records, appended, rewinds, duplicates, quarantined "
                "FROM applied_offsets WHERE topic = ? AND list_contains(?, log_partition) ORDER BY log_partition",
                [topic, list(chosen)],
            ).fetchall()
        }
    finally:
        with contextlib.suppress(duckdb.Error):
            cur.execute("ROLLBACK")  # it only read
        with contextlib.suppress(duckdb.Error):
            cur.unregister("cut_projects")
    manifest = CutManifest(
        schema_version=SCHEMA_VERSION,
        topic=topic,
        topic_id=meta.get("topic_id"),
        partition_count=n,
        partitions=chosen,
        offsets=offsets,
        tables={t: describe_file(t, out_dir, rows[t]) for t in CUT_TABLES},
    )
    write_manifest(out_dir, manifest)
    return manifest


def _register_projects(cur: duckdb.DuckDBPyConnection, chosen: Sequence[int], n: int) -> None:
    """Register ``cut_projects``: the project hashes of ``sources`` whose partition is chosen (murmur2 is
    computed here, once per project, rather than in SQL)."""
    wanted = set(chosen)
    projects = [
        bytes(r[0])
        for r in cur.execute("SELECT DISTINCT project_sha256 FROM sources").fetchall()
        if partition_for(bytes(r[0]), n) in wanted
    ]
    cur.register("cut_projects", pa.table({"project_sha256": pa.array(projects, type=pa.binary())}))


def load_cut(path: Path, cut_dir: Path, manifest: CutManifest) -> None:
    """Build the projection file ``path`` (new: the caller checked) from the verified files of
    ``cut_dir``: every table in one transaction, the manifest's topic, topic id and partition count in
    ``meta``, then a synced checkpoint. ``SnapshotDamagedError`` when a file does not read as its table
    or holds another number of rows than the manifest says (the caller removes ``path``)."""
    con = connect(path, read_only=False)
    try:
        ensure_schema(con, path, read_only=False)
        skip_costly_compression(con)
        cur = cursor(con)
        cur.execute("BEGIN TRANSACTION")
        try:
            _insert_tables(cur, cut_dir, manifest, "does not load")
            values = {"topic": manifest.topic, "partitions": str(manifest.partition_count)}
            if manifest.topic_id is not None:
                values["topic_id"] = manifest.topic_id
            for key, value in values.items():
                cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])
            cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            raise
        cur.execute("CHECKPOINT")  # fsync_mode is DuckDB's default here: the file is on disk when we return
        cur.close()
    finally:
        con.close()


def load_cut_partitions(
    cur: duckdb.DuckDBPyConnection, cut_dir: Path, manifest: CutManifest, *, replace: bool = False
) -> dict[int, tuple[int, ...]]:
    """Insert the verified snapshot of ``cut_dir`` into an existing projection file that holds none of its
    partitions: every table's rows and the partitions' ``applied_offsets`` rows in ONE transaction on
    ``cur`` (the writer's cursor), so a crash leaves the file with all of it or none of it. Returns the
    loaded ``applied_offsets`` counters per partition (``COUNTERS`` order).

    ``SnapshotLogMismatchError`` when the file is of another topic, topic id or partition count;
    ``SnapshotTargetError`` when the file already holds rows or an applied offset of one of the
    partitions (nothing is merged); ``SnapshotDamagedError`` when a file does not read as its table, holds
    another number of rows than the manifest says, or collides with a row the file holds.

    ``replace``: the file may hold rows of the partitions when its applied offset on each is below the
    snapshot's (else ``SnapshotTargetError``); those rows are deleted in the same transaction first (the
    rows a cut of those partitions would hold: ``PARTIAL``'s predicates), so the file holds exactly the
    snapshot's state of them."""
    from throughline.projector.exceptions import SnapshotLogMismatchError, SnapshotTargetError

    chosen = list(manifest.partitions)
    cur.execute("BEGIN TRANSACTION")
    try:
        meta = dict(cur.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("topic") not in (None, manifest.topic):
            raise SnapshotLogMismatchError(f"a snapshot of topic {manifest.topic!r}, the file is of {meta['topic']!r}")
        known_id = meta.get("topic_id")
        if known_id is not None and manifest.topic_id is not None and known_id != manifest.topic_id:
            raise SnapshotLogMismatchError(
                f"a snapshot of topic id {manifest.topic_id}, the file was built from topic id {known_id}"
            )
        count = meta.get("partitions")
        if count is not None and int(count) != manifest.partition_count:
            raise SnapshotLogMismatchError(
                f"a snapshot of {manifest.partition_count} partitions, the file's topic has {count}"
            )
        if replace:
            _delete_partitions(cur, manifest)
        for table in ("applied_offsets", "turns", "superseded_turns", "quarantine", "repairs"):
            held = cur.execute(
                f"SELECT DISTINCT log_partition FROM {table} WHERE list_contains(?, log_partition)",  # noqa: S608
                [chosen],
            ).fetchall()
            if held:
                raise SnapshotTargetError(
                    f"the file already holds {table} rows of partitions {sorted(int(r[0]) for r in held)}: "
                    "a snapshot is loaded only into partitions a file holds nothing of"
                )
        _insert_tables(cur, cut_dir, manifest, "does not load here")
        loaded = {
            int(r[0]): tuple(int(v) for v in r[1:])
            for r in cur.execute(
                "SELECT log_partition, next_offset, records, appended, rewinds, duplicates, quarantined "
                "FROM applied_offsets WHERE topic = ? AND list_contains(?, log_partition)",
                [manifest.topic, chosen],
            ).fetchall()
        }
        expected = {p: tuple(int(row[n]) for n in COUNTERS) for p, row in manifest.offsets.items()}
        if loaded != expected or manifest.tables["applied_offsets"].rows != len(expected):
            raise SnapshotDamagedError("the snapshot's applied_offsets rows are not the manifest's offsets")
        values = {"topic": manifest.topic, "partitions": str(manifest.partition_count)}
        if manifest.topic_id is not None and known_id is None:
            values["topic_id"] = manifest.topic_id
        for key, value in values.items():
            cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])
        cur.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            cur.execute("ROLLBACK")
        raise
    return loaded


def _insert_tables(cur: duckdb.DuckDBPyConnection, cut_dir: Path, manifest: CutManifest, failed: str) -> None:
    """Insert every table's file of the snapshot in ``cut_dir`` in the transaction open on ``cur``, each
    checked to hold the rows the manifest says (``SnapshotDamagedError``, saying the file ``failed`` when
    DuckDB refuses it)."""
    for table in CUT_TABLES:
        source = str(cut_dir / table_file(table))
        try:
            inserted = cur.execute(
                f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet(?)",  # noqa: S608 - a constant name
                [source],
            ).fetchall()
        except duckdb.Error as exc:
            raise SnapshotDamagedError(f"the snapshot's {table_file(table)} {failed}: {exc}") from None
        got = int(inserted[0][0]) if inserted else 0
        if got != manifest.tables[table].rows:
            raise SnapshotDamagedError(
                f"the snapshot's {table_file(table)} holds {got} rows, the manifest says {manifest.tables[table].rows}"
            )


def _delete_partitions(cur: duckdb.DuckDBPyConnection, manifest: CutManifest) -> None:
    """Inside the caller's transaction: delete every row of the snapshot's partitions, once each is
    below the snapshot's offset (``SnapshotTargetError`` for one that is not: nothing goes backwards)."""
    from throughline.projector.exceptions import SnapshotTargetError

    chosen = list(manifest.partitions)
    wanted = manifest.next_offsets()
    for r in cur.execute(
        "SELECT log_partition, next_offset FROM applied_offsets WHERE list_contains(?, log_partition)", [chosen]
    ).fetchall():
        if int(r[1]) >= wanted.get(int(r[0]), 0):
            raise SnapshotTargetError(
                f"the file applied partition {int(r[0])} to offset {int(r[1])}, the snapshot only to "
                f"{wanted.get(int(r[0]), 0)}: it is not behind, nothing is replaced"
            )
    _register_projects(cur, chosen, manifest.partition_count)
    try:
        # turn_ids first: its keys are found through the turns about to be deleted.
        cur.execute(
            f"DELETE FROM turn_ids WHERE turn_key IN ({_CHOSEN_TURN_KEYS})",  # noqa: S608 - constant SQL
            [chosen, TURN_KEY_DOMAIN],
        )
        for table in ("sources", "project_heads"):
            cur.execute(
                f"DELETE FROM {table} WHERE project_sha256 IN (SELECT project_sha256 FROM cut_projects)"  # noqa: S608
            )
        for table in ("turns", "superseded_turns", "quarantine", "repairs", "applied_offsets"):
            cur.execute(f"DELETE FROM {table} WHERE list_contains($1, log_partition)", [chosen])  # noqa: S608
    finally:
        with contextlib.suppress(duckdb.Error):
            cur.unregister("cut_projects")
