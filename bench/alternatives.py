"""Item 2: what a user would otherwise write to get the topic into DuckDB.

- ``naive``: a kafka-python consume loop that decodes each record with fastavro and, per record, inserts
  one row and commits (the row and the partition's next offset in one DuckDB transaction, so it is as
  crash-safe as the projector's batches). Timed over a bounded prefix of the topic.
- ``quix``: a Quix Streams application (``quixstreams`` on PyPI, librdkafka underneath) whose
  dataframe decodes the same Avro records with fastavro and sinks them into DuckDB through a
  ``BatchingSink`` subclass (Quix ships no DuckDB sink; this is the documented way to write one). Each
  Quix checkpoint (``commit_interval``, default 5 s) writes its batch as one Arrow insert. It runs as a
  subprocess in its own pinned environment (``bench.peers``): Quix Streams cannot share throughline's.

Neither folds chains, checks digests or deduplicates: they only land rows. The projector does all of that.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import fastavro
from kafka import KafkaConsumer, TopicPartition

from bench import peers
from bench.ceiling import CONSUMER_SETTINGS
from bench.common import end_offsets
from throughline.schemas.codec import CURRENT_VERSION, HEADER_BYTES, SCHEMAS, without_logical_types

_TABLE = """CREATE TABLE IF NOT EXISTS turns (
    project_sha256 BLOB, host VARCHAR, thread VARCHAR, turn_id VARCHAR, seq BIGINT,
    completed_at_us BIGINT, body VARCHAR, content_digest BLOB, log_partition INTEGER, log_offset BIGINT)"""
_OFFSETS = "CREATE TABLE IF NOT EXISTS offsets (log_partition INTEGER PRIMARY KEY, next_offset BIGINT)"
_COLUMNS = (
    "project_sha256",
    "host",
    "thread",
    "turn_id",
    "seq",
    "completed_at_us",
    "body",
    "content_digest",
    "log_partition",
    "log_offset",
)


def _decode(value: bytes) -> dict[str, Any]:
    buf = io.BytesIO(value)
    buf.seek(HEADER_BYTES)
    datum: dict[str, Any] = fastavro.schemaless_reader(buf, SCHEMAS[CURRENT_VERSION].parsed, None)  # type: ignore[assignment]
    return datum


@dataclass(frozen=True)
class LoopResult:
    """Records landed and the seconds it took."""

    records: int
    seconds: float

    @property
    def rate(self) -> float:
        """Records per second."""
        return self.records / self.seconds if self.seconds > 0 else float("nan")


def naive_loop(bootstrap: str, topic: str, db: Path, *, max_records: int, max_seconds: float) -> LoopResult:
    """Insert-and-commit per record, from offset 0, until ``max_records`` or ``max_seconds``."""
    con = duckdb.connect(str(db))
    con.execute(_TABLE)
    con.execute(_OFFSETS)
    ends = end_offsets(bootstrap, topic)
    start = time.perf_counter()
    deadline = start + max_seconds
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **CONSUMER_SETTINGS)
    done = 0
    insert = f"INSERT INTO turns VALUES ({', '.join('?' * len(_COLUMNS))})"  # noqa: S608 (fixed names)
    upsert = "INSERT OR REPLACE INTO offsets VALUES (?, ?)"
    try:
        tps = [TopicPartition(topic, p) for p in sorted(ends)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        total = min(max_records, sum(ends.values()))
        while done < total and time.perf_counter() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    if done >= total or time.perf_counter() >= deadline:
                        break
                    d = _decode(m.value)
                    con.execute("BEGIN TRANSACTION")
                    con.execute(
                        insert,
                        [
                            d["projectSha256"],
                            d["host"],
                            d["thread"],
                            d["turnId"],
                            d["seq"],
                            d["completedAt"],
                            d["body"],
                            d["contentDigest"],
                            tp.partition,
                            m.offset,
                        ],
                    )
                    con.execute(upsert, [tp.partition, m.offset + 1])
                    con.execute("COMMIT")
                    done += 1
        seconds = time.perf_counter() - start
    finally:
        consumer.close()
    row = con.execute("SELECT count(*) FROM turns").fetchone()
    con.close()
    if row is None or int(row[0]) != done:
        raise RuntimeError(f"naive loop landed {row} rows, expected {done}")
    return LoopResult(done, seconds)


def quix_app(bootstrap: str, topic: str, db: Path, state_dir: Path, *, timeout_s: float = 600.0) -> LoopResult:
    """A Quix Streams application sinking every record of ``topic`` into DuckDB (``bench/quix_peer.py``,
    run in its own pinned environment, built on first use); timed inside it from ``run()``."""
    env = peers.quix()
    env.ensure()
    total = sum(end_offsets(bootstrap, topic).values())
    job = {
        "bootstrap": bootstrap,
        "topic": topic,
        "db": str(db),
        "state_dir": str(state_dir),
        "total": total,
        "timeout_s": timeout_s,
        "schema": without_logical_types(SCHEMAS[CURRENT_VERSION].source),
        "header_bytes": HEADER_BYTES,
        "table_sql": _TABLE,
        "columns": list(_COLUMNS),
    }
    try:
        proc = subprocess.run(
            [str(env.python), "-I", str(Path(__file__).with_name("quix_peer.py"))],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=timeout_s + 120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the Quix Streams peer did not finish within {timeout_s + 120:.0f} s") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the Quix Streams peer failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    doc = json.loads(lines[-1])
    landed, seconds = int(doc["records"]), float(doc["seconds"])
    if landed < total:
        raise RuntimeError(f"Quix landed {landed} rows of {total}")
    return LoopResult(landed, seconds)
