"""Where the projector's and the producer's time goes, per record, without a broker.

``.venv/bin/python -m bench.breakdown [--records N] [--db-dir DIR]`` prints microseconds per record of
each step (the minimum over several passes, which is the least disturbed by other load). The
``prepare`` steps run in the projector's fetch worker process, the pickling crosses between the two
processes, and the ``apply_prepared`` part (timed statement by statement) runs in the main process.
"""

from __future__ import annotations

import argparse
import io
import pickle
import re
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import fastavro
from kafka.consumer.fetcher import Fetcher
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.structs import TopicPartition

import throughline.core.turn as turn_mod
import throughline.projector.feed.frames as frames
import throughline.projector.prepare as prepare
import throughline.projector.store as store
import throughline.projector.store.transaction as transaction
from bench.common import Workload, encode_workload
from throughline.core.identity import source_sha256
from throughline.core.partitioning import partition_for
from throughline.core.turn import (
    ProducerStamp,
    TurnRecord,
)
from throughline.log.fetch import RecordReader
from throughline.runtime import fewer_gc_passes
from throughline.schemas.codec import (
    CURRENT_VERSION,
    HEADER_BYTES,
    SCHEMAS,
    decode_turn,
    decode_turn_datum,
    encode_turn,
)


def best(fn: Callable[[], Any], n: int, runs: int = 5) -> float:
    """Microseconds per record: the fastest of ``runs`` passes over ``n`` records."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) / n * 1e6


class _TimedCursor:
    """A DuckDB cursor that adds each statement's time to ``stats`` (keyed by the statement's start)."""

    def __init__(self, cur: Any, stats: dict[str, list[float]]) -> None:
        self._cur = cur
        self._stats = stats

    def execute(self, sql: Any, *args: Any, **kwargs: Any) -> Any:
        text = sql if isinstance(sql, str) else str(getattr(sql, "query", sql))  # a parsed statement
        key = re.sub(r"\s+", " ", text.strip())[:58]
        # ``writes.execute_over``'s Arrow rows: DuckDB's replacement scan looks in the frame that runs the
        # statement, which is now this one.
        tl_rows = sys._getframe(1).f_locals.get("tl_rows")  # noqa: F841
        t = time.perf_counter()
        result = self._cur.execute(sql, *args, **kwargs)
        entry = self._stats.setdefault(key, [0.0, 0])
        entry[0] += time.perf_counter() - t
        entry[1] += 1
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def apply_breakdown(records: list[prepare.LogRecord], db: Path) -> tuple[float, float, dict[str, list[float]]]:
    """(prepare us/rec, apply us/rec, per-statement seconds) for batches of 5000 into a new file."""
    stats: dict[str, list[float]] = {}
    orig_execute = transaction.ApplyTransaction.execute

    def execute(self: transaction.ApplyTransaction, before_commit: Any = None) -> Any:
        self.cur = _TimedCursor(self.cur, stats)
        return orig_execute(self, before_commit)

    transaction.ApplyTransaction.execute = execute
    try:
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
        prep = apply = 0.0
        with store.DuckProjection.open(db, topic="breakdown") as proj:
            proj.bind_log("breakdown", None, 1)
            for i in range(0, len(records), 5000):
                t = time.perf_counter()
                batch = proj.prepare(0, records[i : i + 5000])
                t2 = time.perf_counter()
                proj.apply_prepared("breakdown", [batch])
                apply += time.perf_counter() - t2
                prep += t2 - t
    finally:
        transaction.ApplyTransaction.execute = orig_execute
    n = len(records)
    return prep / n * 1e6, apply / n * 1e6, stats


def _record_batches(keys: list[bytes], values: list[bytes], per_batch: int = 500) -> bytes:
    """The bytes a fetch returns for these records: v2 batches as kafka-python's producer builds them."""
    out = bytearray()
    for first in range(0, len(values), per_batch):
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 30,
        )
        for i in range(first, min(first + per_batch, len(values))):
            builder.append(i - first, timestamp=0, key=keys[i], value=values[i], headers=[])
        built = builder.build()
        struct.pack_into(">q", built, 0, first)
        out += built
    return bytes(out)


def main(argv: list[str] | None = None) -> int:
    """Print the breakdown (with the cyclic GC tuned as the projector and ``send_many`` tune it)."""
    with fewer_gc_passes():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.breakdown", description=__doc__)
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument(
        "--db-dir", type=Path, default=None, help="where the apply step's DuckDB file goes (default: a temp dir)"
    )
    a = p.parse_args(argv)
    n = a.records
    wl = Workload(n)
    data = encode_workload(wl, 1)
    recs = [prepare.LogRecord(0, i, k, v) for i, (k, v) in enumerate(zip(data.keys, data.values, strict=True))]
    turns = [decode_turn(r.value) for r in recs]
    schema = SCHEMAS[CURRENT_VERSION].parsed

    def fastavro_only() -> None:
        for r in recs:
            buf = io.BytesIO(r.value)
            buf.seek(HEADER_BYTES)
            fastavro.schemaless_reader(buf, schema, None)

    # Each datum of the turn schema is a record, read as a dict (fastavro types any Avro value).
    datums = [
        cast(dict[str, Any], fastavro.schemaless_reader(io.BytesIO(r.value[HEADER_BYTES:]), schema, None)) for r in recs
    ]

    def construct() -> None:
        for d in datums:
            pr = d["producer"]
            TurnRecord(
                d["project"],
                d["projectSha256"],
                d["host"],
                d["thread"],
                d["turnId"],
                d["seq"],
                d["completedAt"],
                d["body"],
                d["contentDigest"],
                ProducerStamp(pr["name"], pr["version"], pr["producedAt"], pr.get("attributes", {})),
            )

    fetched = _record_batches(data.keys, data.values)
    tp = TopicPartition("bench", 0)

    rows: list[tuple[str, float]] = []
    rows.append(
        (
            "kafka-python's record parsing of fetched batches (the ceiling's)",
            best(lambda: Fetcher.PartitionRecords(0, tp, MemoryRecords(fetched)).take(None), n),
        )
    )
    rows.append(
        (
            "throughline's record reader of the same batches (the projector's)",
            best(lambda: RecordReader(0, tp, MemoryRecords(fetched)).take(None), n),
        )
    )
    rows.append(
        ("fastavro decode of one value (the ceiling's per-record work besides fetching)", best(fastavro_only, n))
    )
    rows.append(
        (
            "decode_turn (header check, current-schema reader, TurnRecord)",
            best(lambda: [decode_turn(r.value) for r in recs], n),
        )
    )
    rows.append(
        (
            "  of which TurnRecord(...) construction (frozen dataclasses: 9 fields and the producer stamp)",
            best(construct, n),
        )
    )
    rows.append(("verify_turn", best(lambda: [turn_mod.verify_turn(t) for t in turns], n)))
    rows.append(
        (
            "partition_for (pure-Python murmur2; prepare caches it per project)",
            best(lambda: [partition_for(t.project_sha256, 3) for t in turns], n),
        )
    )
    rows.append(
        (
            "source_sha256 (prepare caches it per source)",
            best(lambda: [source_sha256(t.project_sha256, t.host, t.thread) for t in turns], n),
        )
    )
    rows.append(("turn_key", best(lambda: [prepare.turn_key(t.project_sha256, t.turn_id) for t in turns], n)))
    rows.append(
        (
            "decode_turn_datum (header check, current-schema reader, no TurnRecord)",
            best(lambda: [decode_turn_datum(r.value) for r in recs], n),
        )
    )
    rows.append(
        (
            "prepare_batch (decode, checks, partition check, SoundRecord)",
            best(lambda: prepare.prepare_batch(0, recs, partitions=1), n),
        )
    )
    batch = prepare.prepare_batch(0, recs, partitions=1)
    frame = frames.dumps(batch)
    rows.append(("pickling a prepared batch in the fetch worker", best(lambda: frames.dumps(batch), n)))
    rows.append(("unpickling it in the main process", best(lambda: pickle.loads(frame), n)))
    # The producer's per-turn work besides kafka-python's send.
    from throughline.producers.producer import checked_turn

    rows.append(("TurnProducer: checked_turn (verify_turn)", best(lambda: [checked_turn(t) for t in turns], n)))
    rows.append(("TurnProducer: encode_turn", best(lambda: [encode_turn(t) for t in turns], n)))
    for label, us in rows:
        print(f"{us:8.2f} us/rec  {label}")
    with tempfile.TemporaryDirectory(dir=a.db_dir) as tmp:
        prep, apply, stats = apply_breakdown(recs, Path(tmp) / "breakdown.duckdb")
    print(f"{prep:8.2f} us/rec  DuckProjection.prepare, batches of 5000")
    print(f"{apply:8.2f} us/rec  DuckProjection.apply_prepared, batches of 5000 (fold + SQL + COMMIT), of which:")
    for key, (secs, count) in sorted(stats.items(), key=lambda kv: -kv[1][0])[:8]:
        print(f"{secs / n * 1e6:8.2f} us/rec    x{int(count):<4d} {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
