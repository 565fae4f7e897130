"""Concurrent end-offset reads: one ListOffsets per call against calls sharing one (``NextAnswer``).

``.venv/bin/python -m bench.end_offsets [--callers 1,4,16] [--calls N] [--repeat R]`` reads the end
offset of a 3-partition topic from ``callers`` threads at once, through one ``KafkaLog`` (as ``serve``'s
readers do), both ways in turn, and prints p50 / p99 per call, the wall time of all calls, and the
ratios of the two ways side by side. "One request per call" is the view's own request under its lock,
what every read paid before calls were shared. The broker is ``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``
when set, else one started here.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

from bench.common import broker, create_topic, delete_topics, log, new_topic_name, percentile
from throughline.log.view import KafkaLog

PARTITIONS = 3
JOIN_S = 120.0


def _run(call: Callable[[], object], callers: int, calls: int) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, wall s) of ``calls`` calls from each of ``callers`` threads."""
    latencies: list[float] = []
    lock = threading.Lock()

    def caller() -> None:
        mine = []
        for _ in range(calls):
            t0 = time.perf_counter()
            call()
            mine.append((time.perf_counter() - t0) * 1000)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    if any(t.is_alive() for t in threads):
        raise RuntimeError(f"a caller did not finish within {JOIN_S:.0f} s")
    return percentile(latencies, 50), percentile(latencies, 99), time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    """Print the side-by-side table; exit 0."""
    p = argparse.ArgumentParser(prog="python -m bench.end_offsets", description=__doc__)
    p.add_argument("--callers", default="1,4,16", help="concurrent callers per cell (default 1,4,16)")
    p.add_argument("--calls", type=int, default=100, help="calls per caller (default 100)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved repetitions (median reported; default 3)")
    a = p.parse_args(argv)
    cells = [int(c) for c in a.callers.split(",") if c.strip()]
    with broker() as bootstrap:
        topic = new_topic_name("end-offsets")
        create_topic(bootstrap, topic, PARTITIONS)
        view = KafkaLog(bootstrap, topic, timeout=10.0)
        try:
            every = list(range(PARTITIONS))
            ways: dict[str, Callable[[], object]] = {
                "one request per call": lambda: view._ask(every, first=False),  # the unshared request
                "shared (NextAnswer)": lambda: view.end_offset(1),
            }
            print("| callers | way | p50 ms | p99 ms | wall s | p50 / shared | p99 / shared | wall / shared |")
            print("|---|---|---|---|---|---|---|---|")
            for callers in cells:
                got: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
                for rep in range(a.repeat):
                    for way, call in ways.items():
                        got[way].append(_run(call, callers, a.calls))
                    log(f"{callers} callers, repetition {rep + 1}/{a.repeat}")
                med = {
                    w: tuple(sorted(r[i] for r in runs)[len(runs) // 2] for i in range(3)) for w, runs in got.items()
                }
                shared = med["shared (NextAnswer)"]
                for way, (p50, p99, wall) in med.items():
                    print(
                        f"| {callers} | {way} | {p50:.2f} | {p99:.2f} | {wall:.2f} | {p50 / shared[0]:.2f}x | "
                        f"{p99 / shared[1]:.2f}x | {wall / shared[2]:.2f}x |"
                    )
        finally:
            view.close()
            delete_topics(bootstrap, [topic])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
