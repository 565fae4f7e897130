"""Item 2: what a user would otherwise write to get the topic into DuckDB.

- ``naive``: a kafka-python consume loop that decodes each record with fastavro and, per record, inserts
  one row and commits (the row and the partition's next offset in one DuckDB transaction, so it is as
  crash-safe as the projector's batches). Timed over a bounded prefix of the topic.
- ``quix``: a Quix Streams application (``quixstreams`` on PyPI, librdkafka underneath) whose
  dataframe decodes the same Avro records with fastavro and sinks them into DuckDB through a
  ``BatchingSink`` subclass (Quix ships no DuckDB sink; this is the documented way to write one). Each
  Quix checkpoint (``commit_interval``, default 5 s) writes its batch as one Arrow insert.

Neither folds chains, checks digests or deduplicates: they only land rows. The projector does all of that.
"""

from __future__ import annotations

import io
import logging
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import fastavro
import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition

from bench.ceiling import CONSUMER_SETTINGS
from bench.common import end_offsets
from throughline.schemas.codec import CURRENT_VERSION, HEADER_BYTES, SCHEMAS

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
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **CONSUMER_SETTINGS
    )
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
    """A Quix Streams application sinking every record of ``topic`` into DuckDB; timed from ``run()``."""
    from quixstreams import Application
    from quixstreams.models.serializers import Deserializer
    from quixstreams.sinks import BatchingSink, SinkBatch

    class AvroSingleObject(Deserializer):  # type: ignore[misc]
        """Avro single-object records -> dicts, with fastavro (Quix's Avro class expects no header)."""

        def __call__(self, value: bytes, ctx: Any) -> Any:
            return _decode(value)

    class DuckDBSink(BatchingSink):  # type: ignore[misc]
        """Writes each checkpoint's batch into DuckDB as one Arrow insert (one transaction)."""

        def __init__(self, path: Path) -> None:
            super().__init__()
            self._path = path
            self._con: duckdb.DuckDBPyConnection | None = None
            self.rows = 0

        def setup(self) -> None:
            self._con = duckdb.connect(str(self._path))
            self._con.execute(_TABLE)

        def write(self, batch: SinkBatch) -> None:
            assert self._con is not None
            cols: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
            for item in batch:
                d = item.value
                cols["project_sha256"].append(d["projectSha256"])
                cols["host"].append(d["host"])
                cols["thread"].append(d["thread"])
                cols["turn_id"].append(d["turnId"])
                cols["seq"].append(d["seq"])
                cols["completed_at_us"].append(d["completedAt"])
                cols["body"].append(d["body"])
                cols["content_digest"].append(d["contentDigest"])
                cols["log_partition"].append(batch.partition)
                cols["log_offset"].append(item.offset)
            self._con.register("quix_batch", pa.table(cols))
            try:
                self._con.execute(f"INSERT INTO turns SELECT {', '.join(_COLUMNS)} FROM quix_batch")  # noqa: S608
            finally:
                self._con.unregister("quix_batch")
            self.rows += batch.size

        def close(self) -> None:
            if self._con is not None:
                self._con.close()
                self._con = None

    total = sum(end_offsets(bootstrap, topic).values())
    for name in ("quixstreams", "confluent_kafka"):
        logging.getLogger(name).setLevel(logging.WARNING)
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        state_dir=str(state_dir),
        loglevel="WARNING",
        use_changelog_topics=False,
    )
    sink = DuckDBSink(db)
    sdf = app.dataframe(app.topic(topic, value_deserializer=AvroSingleObject()))
    sdf.sink(sink)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    start = time.perf_counter()
    try:
        app.run(count=total, timeout=timeout_s, collect=False)
    finally:
        # Quix installs its own SIGINT/SIGTERM handlers; give the benchmark its own back.
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    seconds = time.perf_counter() - start
    sink.close()
    con = duckdb.connect(str(db), read_only=True)
    row = con.execute("SELECT count(*) FROM turns").fetchone()
    con.close()
    landed = int(row[0]) if row else 0
    if landed < total:
        raise RuntimeError(f"Quix landed {landed} rows of {total}")
    return LoopResult(landed, seconds)
