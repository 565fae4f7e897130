"""The cost of a small transaction's row writes, side by side, without a broker.

``.venv/bin/python -m bench.small_writes [--rounds N]`` applies the same batches (1 to 100 records,
the sizes a caught-up projector commits under steady ingest) to two fresh projections in alternation:
one writes ``sources`` and ``project_heads`` with ``INSERT OR REPLACE`` (the projector before issue 15's
change), the other as the store does now (an UPDATE of the rows that exist, an INSERT of the new). It
prints the median CPU time of a transaction of each and their ratio, then checks that both
projections' ``table_digests`` are equal. Alternating the two in one run cancels most of a shared
machine's drift; CPU time (``time.process_time``) rather than wall time, since the writer is on-CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb

import throughline.projector.prepare as prepare
from bench.common import Workload, encode_workload
from throughline.projector.store import DuckProjection, writes

_REPLACE_SOURCES = (
    "INSERT OR REPLACE INTO sources (source_sha256, project_sha256, length, chain_digest, head_partition, "
    "head_offset, broken_reason, broken_partition, broken_offset)"
)
_REPLACE_HEADS = "INSERT OR REPLACE INTO project_heads (project_sha256, source_sha256)"
SIZES = (1, 2, 5, 20, 100)


def _replace_sources(cur: duckdb.DuckDBPyConnection, stored: Sequence[tuple[Any, ...]], new: Sequence[tuple[Any, ...]]) -> None:
    rows = [*stored, *new]
    if len(rows) <= writes.VALUES_ROWS:
        cur.execute(writes.values_sql(_REPLACE_SOURCES, 9, len(rows)), [v for r in rows for v in r])
    else:
        with writes.registered(cur, "tl_replace", writes._rows_table(writes._ARROW_SOURCES, rows)):
            cur.execute(f"INSERT OR REPLACE INTO sources BY NAME SELECT {writes.SOURCE_COLUMNS} FROM tl_replace")  # noqa: S608


def _replace_heads(cur: duckdb.DuckDBPyConnection, moved: Mapping[bytes, bytes]) -> None:
    if not moved:
        return
    if len(moved) <= writes.VALUES_ROWS:
        cur.execute(writes.values_sql(_REPLACE_HEADS, 2, len(moved)), [v for pair in moved.items() for v in pair])
    else:
        table = writes._arrow_table(writes._ARROW_HEADS, [list(moved), list(moved.values())])
        with writes.registered(cur, "tl_replace_heads", table):
            cur.execute("INSERT OR REPLACE INTO project_heads BY NAME SELECT * FROM tl_replace_heads")


def main(argv: list[str] | None = None) -> int:
    """Print the side-by-side table; exit 1 if the two projections differ."""
    p = argparse.ArgumentParser(prog="python -m bench.small_writes", description=__doc__)
    p.add_argument("--rounds", type=int, default=60, help="transactions of each size per projection (default 60)")
    a = p.parse_args(argv)
    need = sum(SIZES) * a.rounds
    data = encode_workload(Workload(need), 1)
    recs = [prepare.LogRecord(0, i, k, v) for i, (k, v) in enumerate(zip(data.keys, data.values, strict=True))]
    now = (writes.write_sources, writes.write_heads)
    before = (_replace_sources, _replace_heads)
    print("| records a transaction | INSERT OR REPLACE ms CPU | UPDATE + INSERT ms CPU | ratio |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        old = DuckProjection.open(Path(tmp) / "replace.duckdb", topic="bench")
        new = DuckProjection.open(Path(tmp) / "update.duckdb", topic="bench")
        try:
            for proj in (old, new):
                proj.bind_log("bench", None, 1)
                proj.limit_threads(1)  # as the projector runs beside its fetch worker on two cores
            i = 0
            for size in SIZES:
                spent: dict[str, list[float]] = {"old": [], "new": []}
                for r in range(a.rounds):
                    chunk = recs[i : i + size]
                    i += size
                    order = [("old", old, before), ("new", new, now)]
                    for name, proj, impl in order if r % 2 else order[::-1]:
                        writes.write_sources, writes.write_heads = impl
                        batch = proj.prepare(0, chunk)
                        t = time.process_time()
                        proj.apply_prepared("bench", [batch])
                        spent[name].append(time.process_time() - t)
                o, n = statistics.median(spent["old"]) * 1e3, statistics.median(spent["new"]) * 1e3
                print(f"| {size} | {o:.2f} | {n:.2f} | {n / o:.2f} |", flush=True)
        finally:
            writes.write_sources, writes.write_heads = now
            same = old.table_digests() == new.table_digests()
            old.close()
            new.close()
    print("both projections' table_digests equal" if same else "the two projections DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
