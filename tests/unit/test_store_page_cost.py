"""A page read is a few ART index lookups, whatever the size of the history.

The test checks the query plans (structure, not time): every read the reader makes of the projection
(``turns`` of up to 100 consecutive seqs, a single seq, a source, a project's head) is an index scan and
never a sequential scan of ``turns``. Run this file as a script to measure page reads over 10k, 100k
and 1M turns of 1 KB inserted in log order (threads interleaved)::

    .venv/bin/python tests/unit/test_store_page_cost.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from throughline.core.chain import CHAIN_ORIGIN
from throughline.projector.store import DuckProjection
from throughline.projector.store.files import cursor
from throughline.projector.store.view import (
    PAGE_BUCKET_BITS,
    VIEW_COLUMNS,
    _bucket_sql,
    _ranges_sql,
    page_key,
)

TOPIC = "page-cost"


def _source(i: int) -> bytes:
    return hashlib.sha256(b"source-%d" % i).digest()


def _connect(projection: DuckProjection) -> duckdb.DuckDBPyConnection:
    """The test's own cursor on the projection's database, for what no projection method does: bulk rows
    straight into the tables, and query plans."""
    return cursor(projection._file.connection)


def fill(projection: DuckProjection, sources: int, per_source: int, body_bytes: int, *, chunk: int = 50_000) -> None:
    """Insert ``sources * per_source`` live turns in log order (sources interleaved), in bulk.

    Rows go straight into the projection's tables (the apply path is measured elsewhere): the point is
    the read cost over a large, interleaved ``turns`` table.
    """
    con = _connect(projection)
    rng = random.Random(3)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     ") for _ in range(100_000))
    digest = hashlib.sha256(b"d").digest()
    project = hashlib.sha256(b"project").digest()
    total = sources * per_source
    for start in range(0, total, chunk):
        idx = range(start, min(total, start + chunk))
        srcs = [_source(i % sources) for i in idx]
        seqs = [i // sources + 1 for i in idx]
        n = len(srcs)
        table = pa.table(
            {
                "page_key": pa.array([page_key(s, q) for s, q in zip(srcs, seqs, strict=True)], pa.int64()),
                "source_sha256": pa.array(srcs, pa.binary()),
                "seq": pa.array(seqs, pa.int64()),
                "project_sha256": pa.array([project] * n, pa.binary()),
                "turn_id": pa.array([f"t{i}" for i in idx], pa.string()),
                "completed_at_us": pa.array(list(idx), pa.int64()),
                "body": pa.array(
                    [f"{i:09d}" + text[i % 90_000 : i % 90_000 + body_bytes - 9] for i in idx], pa.string()
                ),
                "body_bytes": pa.array([body_bytes] * n, pa.int64()),
                "content_digest": pa.array([digest] * n, pa.binary()),
                "chain_digest": pa.array([digest] * n, pa.binary()),
                "log_partition": pa.array([0] * n, pa.int32()),
                "log_offset": pa.array(list(idx), pa.int64()),
            }
        )
        con.register("fill_rows", table)
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO turns BY NAME SELECT * FROM fill_rows")
        con.execute("COMMIT")
        con.unregister("fill_rows")
    heads = pa.table(
        {
            "source_sha256": pa.array([_source(i) for i in range(sources)], pa.binary()),
            "project_sha256": pa.array([project] * sources, pa.binary()),
            "length": pa.array([per_source] * sources, pa.int64()),
            "chain_digest": pa.array([CHAIN_ORIGIN] * sources, pa.binary()),
            "head_partition": pa.array([0] * sources, pa.int32()),
            "head_offset": pa.array([0] * sources, pa.int64()),
        }
    )
    con.register("fill_heads", heads)
    con.execute("INSERT INTO sources BY NAME SELECT * FROM fill_heads")
    con.execute("INSERT INTO project_heads VALUES (?, ?)", [project, _source(0)])
    con.unregister("fill_heads")
    con.execute("CHECKPOINT")
    con.close()


def _scan_types(plan: str) -> list[str]:
    return re.findall(r"Type: (\w+ Scan)", plan)


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> DuckProjection:
    projection = DuckProjection.open(tmp_path_factory.mktemp("cost") / "p.duckdb", topic=TOPIC)
    fill(projection, sources=100, per_source=150, body_bytes=64)
    yield projection
    projection.close()


@pytest.mark.parametrize(("first", "last"), [(1, 100), (40, 139), (150, 150), (64, 64), (1, 1)])
def test_a_page_of_turns_is_index_lookups_only(filled: DuckProjection, first: int, last: int) -> None:
    source = _source(7)
    buckets = range(first >> PAGE_BUCKET_BITS, (last >> PAGE_BUCKET_BITS) + 1)
    keys = [page_key(source, b << PAGE_BUCKET_BITS) for b in buckets]
    cur = _connect(filled)
    plan = cur.execute(
        "EXPLAIN ANALYZE " + _bucket_sql(VIEW_COLUMNS, len(keys)), [*keys, source, first, last]
    ).fetchall()[0][1]
    cur.close()
    assert _scan_types(plan) == ["Index Scan"], plan
    with filled.view() as v:
        assert [t.seq for t in v.turns(source, first, last)] == list(range(first, last + 1))


@pytest.mark.parametrize(("first", "last"), [(1, 100), (40, 139), (150, 150), (1, 1)])
def test_the_ranges_of_a_page_are_one_index_lookup(filled: DuckProjection, first: int, last: int) -> None:
    """The reader's statement (the page's rows and the rows its cursors end with) is one index scan."""
    source, other = _source(7), _source(8)
    buckets = range(first >> PAGE_BUCKET_BITS, (last >> PAGE_BUCKET_BITS) + 1)
    keys = [page_key(source, b << PAGE_BUCKET_BITS) for b in buckets] + [page_key(other, 150)]
    cur = _connect(filled)
    sql = "EXPLAIN ANALYZE " + _ranges_sql(len(keys), 2)
    plan = cur.execute(sql, [*keys, source, first, last, other, 150, 150]).fetchall()[0][1]
    cur.close()
    assert _scan_types(plan) == ["Index Scan"], plan
    with filled.view() as v:
        page, cursor_row = v.turns_many([(source, first, last), (other, 150, 150)])
    assert [t.seq for t in page] == list(range(first, last + 1)) and [t.seq for t in cursor_row] == [150]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT project_sha256, length FROM sources WHERE source_sha256 = ?",
        "SELECT source_sha256 FROM project_heads WHERE project_sha256 = ?",
    ],
)
def test_sources_and_heads_are_point_lookups(filled: DuckProjection, sql: str) -> None:
    cur = _connect(filled)
    key = _source(3) if "sources" in sql else hashlib.sha256(b"project").digest()
    plan = cur.execute("EXPLAIN ANALYZE " + sql, [key]).fetchall()[0][1]
    cur.close()
    assert _scan_types(plan) == ["Index Scan"], plan


def measure(rows: int, *, sources: int = 10_000, body_bytes: int = 1024, reads: int = 200) -> dict[str, float]:
    """Fill a projection with ``rows`` interleaved turns and time page reads (milliseconds)."""
    per_source = max(1, rows // sources)
    with tempfile.TemporaryDirectory() as tmp:
        projection = DuckProjection.open(Path(tmp) / "p.duckdb", topic=TOPIC)
        started = time.perf_counter()
        fill(projection, sources, per_source, body_bytes)
        filled_in = time.perf_counter() - started
        rng = random.Random(5)
        pages: list[float] = []
        points: list[float] = []
        for _ in range(reads):
            source = _source(rng.randrange(sources))
            first = rng.randint(1, max(1, per_source - 99))
            t0 = time.perf_counter()
            with projection.view() as v:
                got = v.turns(source, first, first + 99)
            pages.append(time.perf_counter() - t0)
            assert len(got) == min(100, per_source - first + 1)
            t0 = time.perf_counter()
            with projection.view() as v:
                v.turns(source, first, first)
                v.source(source)
            points.append(time.perf_counter() - t0)
        projection.close()
    return {
        "rows": float(sources * per_source),
        "fill_s": filled_in,
        "page100_p50_ms": statistics.median(pages) * 1000,
        "page100_p95_ms": statistics.quantiles(pages, n=20)[-1] * 1000,
        "point_p50_ms": statistics.median(points) * 1000,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args(argv)
    for rows in args.rows:
        m = measure(rows, sources=max(100, rows // 100))
        print(
            f"{int(m['rows']):>9} turns: page of 100 p50 {m['page100_p50_ms']:.2f} ms, p95 {m['page100_p95_ms']:.2f} ms; "
            f"single seq + source p50 {m['point_p50_ms']:.2f} ms (filled in {m['fill_s']:.1f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
