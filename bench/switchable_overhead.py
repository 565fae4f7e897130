"""What ``SwitchableProjection`` costs a read when no rebuild runs: first pages on an idle projection read
directly from its ``DuckProjection`` and through the facade ``serve`` puts in front of it, side by side.

    .venv/bin/python -m bench.switchable_overhead [--reads 1500] [--rounds 6] [--calls 200000]

Every HTTP read of ``serve`` passes the facade (a lock taken twice and a count kept per read, so that a
rebuild can switch files under the readers). The projection is item 3's small layout written through
``DuckProjection.apply_batch`` (bench/reader.py), opened writable as ``serve`` opens it, with nothing
being applied (idle) and the log's end offsets equal to the applied ones (no freshness wait). Each round
times ``--reads`` first pages (limit 10, a random project each), each read directly and through the facade
in a row (the order alternating), so that the machine's load falls on both alike; it prints each round's p50/p99 and their ratio (facade / direct),
then the bare cost of one facade call (``readable_offsets``) against the handle's own. A ratio within
the rounds' spread of 1.00 means the facade costs nothing measurable on a first page.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import percentile
from bench.reader import TOPIC, Layout, build_through_projector
from throughline.core.memory import FixedLog
from throughline.projector.store import DuckProjection
from throughline.reader import read_observer_turn_page
from throughline.serve.switchable import SwitchableProjection

LIMIT = 10
KEY = b"k" * 32
LAYOUT = Layout(sources=32, length=80, partitions=3, body_bytes=256)


def _first_page_ms(projection: Any, log: FixedLog, project: str) -> float:
    """Milliseconds of one first page of ``project``, checked ``ok`` with ``LIMIT`` turns."""
    t0 = time.perf_counter()
    page = read_observer_turn_page(
        project=project, limit=LIMIT, projection=projection, log=log, token_key=KEY, wait_timeout=0.0
    )
    ms = (time.perf_counter() - t0) * 1000
    if page.status != "ok" or len(page.turns) != LIMIT:
        raise RuntimeError(f"a first page answered {page.status} with {len(page.turns)} turns")
    return ms


class _Counting:
    """Counts the facade calls one first page makes (delegating everything)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        self.calls += 1
        return getattr(self.inner, name)


def _per_call_us(call: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    rows = [
        "| round | direct p50 / p99 ms | facade p50 / p99 ms | ratio p50 | ratio p99 |",
        "|---|---|---|---|---|",
    ]
    p50s: list[float] = []
    p99s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="switchable-bench-") as work:
        path = Path(work) / "p.duckdb"
        build_through_projector(path, LAYOUT)
        log = FixedLog(partitions=LAYOUT.partitions, ends=LAYOUT.ends())
        with DuckProjection.open(path, topic=TOPIC) as direct:
            facade = SwitchableProjection(direct)
            for _ in range(200):  # warm both paths
                project = LAYOUT.project(rng.randrange(LAYOUT.sources))
                _first_page_ms(direct, log, project)
                _first_page_ms(facade, log, project)
            counting = _Counting(facade)
            _first_page_ms(counting, log, LAYOUT.project(0))
            for r in range(1, args.rounds + 1):
                # Side by side: each project's first page both ways in a row, the order alternating, so a
                # change of the machine's load falls on both alike.
                d: list[float] = []
                f: list[float] = []
                for i in range(args.reads):
                    project = LAYOUT.project(rng.randrange(LAYOUT.sources))
                    if (i + r) % 2:
                        d.append(_first_page_ms(direct, log, project))
                        f.append(_first_page_ms(facade, log, project))
                    else:
                        f.append(_first_page_ms(facade, log, project))
                        d.append(_first_page_ms(direct, log, project))
                r50, r99 = percentile(f, 50) / percentile(d, 50), percentile(f, 99) / percentile(d, 99)
                p50s.append(r50)
                p99s.append(r99)
                rows.append(
                    f"| {r} | {percentile(d, 50):.3f} / {percentile(d, 99):.3f} "
                    f"| {percentile(f, 50):.3f} / {percentile(f, 99):.3f} | {r50:.3f} | {r99:.3f} |"
                )
            bare = _per_call_us(direct.readable_offsets, args.calls)
            through = _per_call_us(facade.readable_offsets, args.calls)
    print("\n".join(rows))
    print(
        f"median ratio facade/direct: p50 {statistics.median(p50s):.3f} (rounds {min(p50s):.3f}-{max(p50s):.3f}), "
        f"p99 {statistics.median(p99s):.3f} (rounds {min(p99s):.3f}-{max(p99s):.3f})"
    )
    print(
        f"one readable_offsets call: direct {bare:.2f} us, through the facade {through:.2f} us "
        f"(+{through - bare:.2f} us a call); a first page makes {counting.calls} calls of the facade"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
