"""The cost of a small transaction's row writes, side by side, without a broker.

``.venv/bin/python -m bench.small_writes [--rounds N]`` applies the same batches (1 to 400 records,
the sizes a projector that keeps up commits under steady ingest) to two fresh projections in
alternation: one writes as the store did before this change (every Arrow table ``register``-ed and
``unregister``-ed around its statement), the other as the store does now (``writes.execute_over``: the
table found by DuckDB's replacement scan). Both choose between a bound ``VALUES`` list and an Arrow
table by ``writes.fits_values``. It prints the median CPU time of a transaction of
each and their ratio, then checks that both projections' ``table_digests`` are equal. Alternating the
two in one run cancels most of a shared machine's drift; CPU time (``time.process_time``) rather than
wall time, since the writer is on-CPU.

``--contended N`` runs N busy Python threads beside the writer, with the GIL switch interval a projector
run sets, and prints wall time instead: what the writer pays in ``serve``, where HTTP threads hold the
GIL whenever DuckDB's binding gives it up (a statement that takes it back mid-way then waits).

``--compare milestones`` compares another change the same way: a source's ``sources`` row written at
every append it takes (as the store did before) against at its milestones only (``view.is_milestone``,
as it does now); ``--projects 1`` makes every batch extend the same few sources (one busy project, the
freshness sweep's first column). Their ``sources`` tables differ by design, so it checks that every
other table is equal and that both projections read the same head for every source.

``--compare parsed``: the writer's statements parsed by each execution (as before) against parsed once
per text (``statements.parsed``, as now); the tables must be equal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

import throughline.projector.prepare as prepare
from bench.common import Workload, encode_workload
from throughline.projector.store import DuckProjection, is_milestone, statements, transaction, writes
from throughline.runtime import prompt_gil_handoffs

SIZES = (1, 2, 5, 10, 20, 40, 100, 400)


def _registered(
    cur: duckdb.DuckDBPyConnection, sql: str, rows: pa.Table | None, params: Sequence[Any] | None = None
) -> duckdb.DuckDBPyConnection:
    """``writes.execute_over`` as the store did it before: a temporary view around the statement."""
    if rows is None:
        return cur.execute(sql, params)
    cur.register("tl_rows", rows)
    try:
        return cur.execute(sql, params)
    finally:
        try:
            cur.unregister("tl_rows")
        except duckdb.Error:
            pass  # gone with a failed transaction


_Execute = Callable[..., duckdb.DuckDBPyConnection]


def _use(execute: _Execute) -> None:
    # Both modules bind it by name (transaction.py imports it from writes).
    writes.execute_over = transaction.execute_over = execute


def _rows_at(milestone: Callable[[int], bool]) -> None:
    # The transaction binds it by name from the view module.
    transaction.is_milestone = milestone


def _every_append(seq: int) -> bool:
    """Every append rewrites its source's row (the store before milestones)."""
    return True


def _parse_once(once: bool) -> None:
    # Both modules bind it by name from the statements module.
    writes.parsed = transaction.parsed = statements.parsed if once else _text


def _text(sql: str) -> str:
    """The statement's text, parsed by each execution (the store before ``statements.parsed``)."""
    return sql


#: What each comparison sets up before applying a batch to the projection of "before" and of "now".
_COMPARISONS: dict[str, tuple[tuple[str, Callable[[], None]], tuple[str, Callable[[], None]]]] = {
    "scans": (
        ("registered tables", lambda: _use(_registered)),
        ("replacement scans", lambda: _use(writes.execute_over)),
    ),
    "milestones": (
        ("a source row every append", lambda: _rows_at(_every_append)),
        ("source rows at milestones", lambda: _rows_at(is_milestone)),
    ),
    "parsed": (
        ("statements parsed by each execution", lambda: _parse_once(False)),
        ("statements parsed once", lambda: _parse_once(True)),
    ),
}


def _busy(stop: threading.Event) -> None:
    """Hold the GIL as an HTTP thread does: Python work, until ``stop``."""
    x = 0
    while not stop.is_set():
        for i in range(2000):
            x += i


def main(argv: list[str] | None = None) -> int:
    """Print the side-by-side table; exit 1 if the two projections differ."""
    p = argparse.ArgumentParser(prog="python -m bench.small_writes", description=__doc__)
    p.add_argument("--rounds", type=int, default=60, help="transactions of each size per projection (default 60)")
    p.add_argument(
        "--contended",
        type=int,
        default=0,
        metavar="N",
        help="busy Python threads beside the writer; wall time instead of CPU (default 0)",
    )
    p.add_argument(
        "--compare",
        choices=sorted(_COMPARISONS),
        default="scans",
        help="which change to compare (default scans: registered tables against replacement scans)",
    )
    p.add_argument("--projects", type=int, default=64, help="projects the batches' turns go to (default 64)")
    a = p.parse_args(argv)
    stop = threading.Event()
    busy = [threading.Thread(target=_busy, args=(stop,), daemon=True) for _ in range(max(0, a.contended))]
    try:
        with prompt_gil_handoffs():
            for t in busy:
                t.start()
            clock, unit = (time.perf_counter, "ms wall") if busy else (time.process_time, "ms CPU")
            return _compare(a.rounds, clock, unit, a.compare, max(1, a.projects))
    finally:
        stop.set()
        for t in busy:
            t.join(timeout=5)


def _compare(rounds: int, clock: Callable[[], float], unit: str, comparison: str, projects: int) -> int:
    need = sum(SIZES) * rounds
    data = encode_workload(Workload(need, projects=projects), 1)
    recs = [prepare.LogRecord(0, i, k, v) for i, (k, v) in enumerate(zip(data.keys, data.values, strict=True))]
    (before_name, before), (now_name, now) = _COMPARISONS[comparison]
    print(
        f"| records a transaction (VALUES up to {writes.VALUES_PARAMS} parameters) | {before_name} {unit} | "
        f"{now_name} {unit} | ratio |"
    )
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        old = DuckProjection.open(Path(tmp) / "before.duckdb", topic="bench")
        new = DuckProjection.open(Path(tmp) / "now.duckdb", topic="bench")
        try:
            for proj in (old, new):
                proj.bind_log("bench", None, 1)
                proj.limit_threads(1)  # as the projector runs beside its fetch worker on two cores
            i = 0
            for size in SIZES:
                spent: dict[str, list[float]] = {"old": [], "new": []}
                for r in range(rounds):
                    chunk = recs[i : i + size]
                    i += size
                    order = [("old", old, before), ("new", new, now)]
                    for name, proj, set_up in order if r % 2 else order[::-1]:
                        set_up()
                        batch = proj.prepare(0, chunk)
                        t = clock()
                        proj.apply_prepared("bench", [batch])
                        spent[name].append(clock() - t)
                o, n = statistics.median(spent["old"]) * 1e3, statistics.median(spent["new"]) * 1e3
                print(f"| {size} | {o:.2f} | {n:.2f} | {n / o:.2f} |", flush=True)
        finally:
            _use(writes.execute_over)
            _rows_at(is_milestone)
            _parse_once(True)
            old.close()
            new.close()
            same = _same(Path(tmp) / "before.duckdb", Path(tmp) / "now.duckdb", comparison)
    if comparison == "milestones":
        print(
            "both projections' other tables equal and every source's head read equal"
            if same
            else "the two projections DIFFER"
        )
    else:
        print("both projections' table_digests equal" if same else "the two projections DIFFER")
    return 0 if same else 1


def _same(old_path: Path, new_path: Path, comparison: str) -> bool:
    """Whether the two projection files hold the same: every table, or, when comparing where source
    rows are written, every other table and every source's head as a view of the file reads it (opened
    read-only, so from its rows, not from a writer's read index)."""
    with DuckProjection.open(old_path, read_only=True) as old, DuckProjection.open(new_path, read_only=True) as new:
        a, b = old.table_digests(), new.table_digests()
        if comparison != "milestones":
            return a == b
        a.pop("sources")
        b.pop("sources")
        sources = [r["source_sha256"] for r in old.table_rows("sources")]
        if a != b or sources != [r["source_sha256"] for r in new.table_rows("sources")]:
            return False
        with old.view() as va, new.view() as vb:
            return all(va.source(s) == vb.source(s) for s in sources)


if __name__ == "__main__":
    sys.exit(main())
