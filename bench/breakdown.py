"""Where the projector's and the producer's time goes, per record, without a broker.

``.venv/bin/python -m bench.breakdown [--records N] [--db-dir DIR]`` prints microseconds per record of
each step (the minimum over several passes, which is the least disturbed by other load), and of two
prototypes of fixes the profiles point at, applied by monkeypatching in this process only (nothing in
the package changes):

- ``verify_turn`` with per-project and per-name caches and one UTF-8 encode of the body, instead of
  rebuilding the whole turn through ``build_turn``;
- ``partition_for`` (pure-Python murmur2) cached per project hash.

The ``apply_prepared`` part times every SQL statement of the batch transaction.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import sys
import tempfile
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import fastavro

import throughline.core.fold as fold_mod
import throughline.core.turn as turn_mod
import throughline.projector.store as store
from bench.common import Workload, encode_workload
from throughline.core.identity import canonical_project, project_sha256, source_sha256, validate_name
from throughline.core.partitioning import partition_for
from throughline.core.turn import (
    MAX_BODY_BYTES,
    MAX_COMPLETED_AT_MICROS,
    MAX_SEQ,
    MIN_COMPLETED_AT_MICROS,
    TurnRecord,
)
from throughline.schemas.codec import CURRENT_VERSION, HEADER_BYTES, SCHEMAS, decode_turn, encode_turn

_TURN_DOMAIN = b"throughline.turn.v1\x00"


def best(fn: Callable[[], Any], n: int, runs: int = 5) -> float:
    """Microseconds per record: the fastest of ``runs`` passes over ``n`` records."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) / n * 1e6


@lru_cache(maxsize=65536)
def _project_hash_if_canonical(project: str) -> bytes | None:
    try:
        canonical = canonical_project(project)
    except Exception:  # the slow path reports the exact error
        return None
    return project_sha256(canonical) if canonical == project else None


@lru_cache(maxsize=65536)
def _name_ok(value: str) -> bool:
    try:
        validate_name(value, "name")
    except Exception:
        return False
    return True


def cached_verify_turn(record: TurnRecord, _slow: Callable[[TurnRecord], str | None] = turn_mod.verify_turn) -> str | None:
    """Prototype: ``verify_turn``'s verdicts, with the per-project/per-name checks cached and the body
    encoded once; anything unusual falls back to the original for its exact message."""
    r = record
    if (
        _project_hash_if_canonical(r.project) != r.project_sha256
        or not (_name_ok(r.host) and _name_ok(r.thread) and _name_ok(r.turn_id))
        or (r.seq is not None and not (type(r.seq) is int and 1 <= r.seq <= MAX_SEQ))
        or type(r.completed_at_micros) is not int
        or not MIN_COMPLETED_AT_MICROS <= r.completed_at_micros <= MAX_COMPLETED_AT_MICROS
        or type(r.body) is not str
    ):
        return _slow(r)
    try:
        body = r.body.encode("utf-8")
    except UnicodeEncodeError:
        return _slow(r)
    if len(body) > MAX_BODY_BYTES:
        return _slow(r)
    tid = r.turn_id.encode("utf-8")
    h = hashlib.sha256(_TURN_DOMAIN)
    h.update(len(tid).to_bytes(8, "big"))
    h.update(tid)
    h.update(r.completed_at_micros.to_bytes(8, "big", signed=True))
    h.update(len(body).to_bytes(8, "big"))
    h.update(body)
    return None if h.digest() == r.content_digest else "contentDigest does not match the turn's content"


class _TimedCursor:
    """A DuckDB cursor that adds each statement's time to ``stats`` (keyed by the statement's start)."""

    def __init__(self, cur: Any, stats: dict[str, list[float]]) -> None:
        self._cur = cur
        self._stats = stats

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        key = re.sub(r"\s+", " ", sql.strip())[:58]
        t = time.perf_counter()
        result = self._cur.execute(sql, *args, **kwargs)
        entry = self._stats.setdefault(key, [0.0, 0])
        entry[0] += time.perf_counter() - t
        entry[1] += 1
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def apply_breakdown(records: list[store.LogRecord], db: Path) -> tuple[float, float, dict[str, list[float]]]:
    """(prepare us/rec, apply us/rec, per-statement seconds) for batches of 5000 into a new file."""
    stats: dict[str, list[float]] = {}
    orig_transact = store.DuckProjection._transact

    def transact(self: store.DuckProjection, cur: Any, work: Any) -> Any:
        timed = _TimedCursor(cur, stats)
        work.cur = timed
        return orig_transact(self, timed, work)

    store.DuckProjection._transact = transact  # type: ignore[method-assign]
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
        store.DuckProjection._transact = orig_transact  # type: ignore[method-assign]
    n = len(records)
    return prep / n * 1e6, apply / n * 1e6, stats


def main(argv: list[str] | None = None) -> int:
    """Print the breakdown."""
    p = argparse.ArgumentParser(prog="python -m bench.breakdown", description=__doc__)
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--db-dir", type=Path, default=None, help="where the apply step's DuckDB file goes (default: a temp dir)")
    a = p.parse_args(argv)
    n = a.records
    wl = Workload(n)
    data = encode_workload(wl, 1)
    recs = [store.LogRecord(0, i, k, v) for i, (k, v) in enumerate(zip(data.keys, data.values, strict=True))]
    turns = [decode_turn(r.value) for r in recs]
    schema = SCHEMAS[CURRENT_VERSION].parsed

    def fastavro_only() -> None:
        for r in recs:
            buf = io.BytesIO(r.value)  # type: ignore[arg-type]
            buf.seek(HEADER_BYTES)
            fastavro.schemaless_reader(buf, schema, None)

    datums = [fastavro.schemaless_reader(io.BytesIO(r.value[HEADER_BYTES:]), schema, None) for r in recs]  # type: ignore[index]

    def construct() -> None:
        for d in datums:
            pr = d["producer"]  # type: ignore[index]
            TurnRecord(d["project"], d["projectSha256"], d["host"], d["thread"], d["turnId"], d["seq"], d["completedAt"],  # type: ignore[index]
                       d["body"], d["contentDigest"], pr["name"], pr["version"], pr["producedAt"], pr.get("attributes", {}))  # type: ignore[index]

    rows: list[tuple[str, float]] = []
    rows.append(("fastavro decode of one value (the ceiling's per-record work besides fetching)", best(fastavro_only, n)))
    rows.append(("decode_turn (fastavro + header check + TurnRecord)", best(lambda: [decode_turn(r.value) for r in recs], n)))  # type: ignore[arg-type]
    rows.append(("  of which TurnRecord(...) construction (frozen dataclass, 13 fields)", best(construct, n)))
    rows.append(("verify_turn (rebuilds the turn with build_turn)", best(lambda: [turn_mod.verify_turn(t) for t in turns], n)))
    rows.append(("verify_turn prototype: cached project/name checks, body encoded once", best(lambda: [cached_verify_turn(t) for t in turns], n)))
    rows.append(("partition_for (pure-Python murmur2)", best(lambda: [partition_for(t.project_sha256, 3) for t in turns], n)))
    rows.append(("source_sha256", best(lambda: [source_sha256(t.project_sha256, t.host, t.thread) for t in turns], n)))
    rows.append(("turn_key", best(lambda: [store.turn_key(t.project_sha256, t.turn_id) for t in turns], n)))
    rows.append(("prepare_batch as is (decode, record_problem, partition check)", best(lambda: store.prepare_batch(0, recs, partitions=1), n)))
    original_verify, original_partition = fold_mod.verify_turn, store.partition_for
    try:
        fold_mod.verify_turn = cached_verify_turn  # type: ignore[assignment]
        store.partition_for = lru_cache(maxsize=65536)(partition_for)  # type: ignore[assignment]
        rows.append(("prepare_batch with both prototypes", best(lambda: store.prepare_batch(0, recs, partitions=1), n)))
    finally:
        fold_mod.verify_turn, store.partition_for = original_verify, original_partition
    # The producer's per-turn work besides kafka-python's send.
    from throughline.producers.producer import checked_turn

    rows.append(("TurnProducer: checked_turn (build_turn again)", best(lambda: [checked_turn(t) for t in turns], n)))
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
