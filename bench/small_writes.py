"""The cost of a small transaction's row writes, side by side, without a broker.

``.venv/bin/python -m bench.small_writes [--rounds N]`` applies the same batches (1 to 100 records,
the sizes a caught-up projector commits under steady ingest) to two fresh projections in alternation:
one chooses between a bound ``VALUES`` list and a registered Arrow table by row count (up to 32 rows a
statement, the store before this change), the other as the store does now (``writes.fits_values``: by
bound-parameter count, ``writes.VALUES_PARAMS``). It prints the median CPU time of a transaction of
each and their ratio, then checks that both projections' ``table_digests`` are equal. Alternating the
two in one run cancels most of a shared machine's drift; CPU time (``time.process_time``) rather than
wall time, since the writer is on-CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import throughline.projector.prepare as prepare
from bench.common import Workload, encode_workload
from throughline.projector.store import DuckProjection, transaction, writes

_ROWS_BEFORE = 32  # the row bound of a VALUES list before writes.VALUES_PARAMS
SIZES = (1, 2, 5, 10, 20, 32, 100)


def _by_rows(width: int, rows: int) -> bool:
    """The rule before ``writes.fits_values``: up to 32 rows whatever their width."""
    return rows <= _ROWS_BEFORE


def _use(rule: Callable[[int, int], bool]) -> None:
    # Both modules bind the rule by name (transaction.py imports it from writes).
    writes.fits_values = rule
    transaction.fits_values = rule


def main(argv: list[str] | None = None) -> int:
    """Print the side-by-side table; exit 1 if the two projections differ."""
    p = argparse.ArgumentParser(prog="python -m bench.small_writes", description=__doc__)
    p.add_argument("--rounds", type=int, default=60, help="transactions of each size per projection (default 60)")
    a = p.parse_args(argv)
    need = sum(SIZES) * a.rounds
    data = encode_workload(Workload(need), 1)
    recs = [prepare.LogRecord(0, i, k, v) for i, (k, v) in enumerate(zip(data.keys, data.values, strict=True))]
    now = writes.fits_values
    print(f"| records a transaction | VALUES up to {_ROWS_BEFORE} rows ms CPU | VALUES up to {writes.VALUES_PARAMS} "
          "parameters ms CPU | ratio |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        old = DuckProjection.open(Path(tmp) / "rows.duckdb", topic="bench")
        new = DuckProjection.open(Path(tmp) / "params.duckdb", topic="bench")
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
                    order = [("old", old, _by_rows), ("new", new, now)]
                    for name, proj, rule in order if r % 2 else order[::-1]:
                        _use(rule)
                        batch = proj.prepare(0, chunk)
                        t = time.process_time()
                        proj.apply_prepared("bench", [batch])
                        spent[name].append(time.process_time() - t)
                o, n = statistics.median(spent["old"]) * 1e3, statistics.median(spent["new"]) * 1e3
                print(f"| {size} | {o:.2f} | {n:.2f} | {n / o:.2f} |", flush=True)
        finally:
            _use(now)
            same = old.table_digests() == new.table_digests()
            old.close()
            new.close()
    print("both projections' table_digests equal" if same else "the two projections DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
