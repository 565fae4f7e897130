"""The projection file's schema: the tables (``SCHEMA``), their version, and how a file is created or
refused.

There are no migrations: the projection is a function of the log, so a file of another
``SCHEMA_VERSION`` is refused (``ProjectionIncompatibleError``) and rebuilt with ``throughline replay``.
The tables are described in ``throughline.projector.store``.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from throughline.projector.exceptions import ProjectionIncompatibleError, ProjectionMissingError

#: Version 2 added ``repairs`` and the quarantine's ``repaired_partition``/``repaired_offset`` (docs/spec.md#quarantine);
#: version 3 writes a ``sources`` row at its milestones only (``view.is_milestone``: fewer writes a commit).
#: A file of another version is refused (``ProjectionIncompatibleError``): the projection is a function of
#: the log, so it is rebuilt with ``throughline replay --db NEW_FILE`` rather than migrated.
SCHEMA_VERSION = "3"

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

#: The columns of a turn row, shared by ``turns`` and ``superseded_turns``. A literal tuple: SQL is built
#: from these names, and tests/reliability/test_sql_parameterised.py accepts only constants there.
TURN_COLUMNS = (
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


def ensure_schema(con: duckdb.DuckDBPyConnection, path: Path, *, read_only: bool) -> None:
    """Create the tables in a new (empty) file opened writable; refuse a file that is not a projection.

    Raises ``ProjectionMissingError`` for a read-only file with no projection yet and
    ``ProjectionIncompatibleError`` for a DuckDB file holding other tables.
    """
    has_meta = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND table_name = 'meta'"
    ).fetchone()
    if has_meta and has_meta[0]:
        return
    if read_only:
        raise ProjectionMissingError(f"{path} holds no throughline projection yet")
    if con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()").fetchone() != (0,):
        raise ProjectionIncompatibleError(f"{path} is a DuckDB file but not a throughline projection")
    con.execute("BEGIN TRANSACTION")
    try:
        for ddl in SCHEMA:
            con.execute(ddl)
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def read_meta(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, str]:
    """The ``meta`` table of a projection of this ``SCHEMA_VERSION`` (``ProjectionIncompatibleError``
    for another version)."""
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ProjectionIncompatibleError(
            f"{path} is a projection of schema version {meta.get('schema_version')!r}; this throughline "
            f"writes version {SCHEMA_VERSION}: rebuild it with `throughline replay --db NEW_FILE`"
        )
    return meta
