"""The Quix Streams application of item 2, run inside its own environment (``bench.peers.quix``).

Run as ``PEER_PYTHON -I bench/quix_peer.py`` with a JSON job on stdin; prints one JSON line
``{"records": N, "seconds": S}`` on stdout. It imports nothing from throughline or the bench (neither is
installed in that environment): the job carries the topic, the DuckDB table, the columns and the writer
schema (without its logical types). The application: a custom ``Deserializer`` (fastavro, after the
single-object header) and a ``BatchingSink`` subclass (Quix ships no DuckDB sink; this is the documented
way to write one) that writes each checkpoint's batch (``commit_interval``, default 5 s) as one Arrow
insert. The clock runs from ``Application.run()`` to its return after the last record's checkpoint.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import time
import uuid
from typing import Any

import duckdb
import fastavro
import pyarrow as pa
from quixstreams import Application
from quixstreams.models.serializers import Deserializer
from quixstreams.sinks import BatchingSink, SinkBatch


def main() -> int:
    """Run the job read from stdin."""
    job = json.loads(sys.stdin.read())
    # The job's schema comes without its logical types (``codec.without_logical_types``): timestamps stay
    # integer microseconds, as the projector and the bench's ceiling read them; datetimes would make the
    # peer do more work.
    schema = fastavro.parse_schema(job["schema"])
    header = int(job["header_bytes"])
    columns: list[str] = list(job["columns"])

    class AvroSingleObject(Deserializer):
        """Avro single-object records -> dicts (Quix's Avro class expects no header)."""

        def __call__(self, value: bytes, ctx: Any) -> Any:
            buf = io.BytesIO(value)
            buf.seek(header)
            return fastavro.schemaless_reader(buf, schema, None)

    class DuckDBSink(BatchingSink):
        """Writes each checkpoint's batch into DuckDB as one Arrow insert (one transaction)."""

        def __init__(self, path: str) -> None:
            super().__init__()
            self._path = path
            self._con: Any = None

        def setup(self) -> None:
            self._con = duckdb.connect(self._path)
            self._con.execute(job["table_sql"])

        def write(self, batch: SinkBatch) -> None:
            cols: dict[str, list[Any]] = {c: [] for c in columns}
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
                self._con.execute(f"INSERT INTO turns SELECT {', '.join(columns)} FROM quix_batch")  # noqa: S608 (names from the job)
            finally:
                self._con.unregister("quix_batch")

        def close(self) -> None:
            if self._con is not None:
                self._con.close()
                self._con = None

    for name in ("quixstreams", "confluent_kafka"):
        logging.getLogger(name).setLevel(logging.WARNING)
    app = Application(
        broker_address=job["bootstrap"],
        consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        state_dir=job["state_dir"],
        loglevel="WARNING",
        use_changelog_topics=False,
    )
    sink = DuckDBSink(job["db"])
    sdf = app.dataframe(app.topic(job["topic"], value_deserializer=AvroSingleObject()))
    sdf.sink(sink)
    start = time.perf_counter()
    app.run(count=int(job["total"]), timeout=float(job["timeout_s"]), collect=False)
    seconds = time.perf_counter() - start
    sink.close()
    con = duckdb.connect(job["db"], read_only=True)
    row = con.execute("SELECT count(*) FROM turns").fetchone()
    con.close()
    print(json.dumps({"records": int(row[0]) if row else 0, "seconds": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
