"""First pages read beside a busy writer, side by side, without a broker.

``.venv/bin/python -m bench.busy_reads [--rounds N] [--seconds S]`` fills a projection (64 projects),
then, in each round, a writer thread applies small transactions (2 records, a few milliseconds apart:
a projector that keeps up with steady ingest is in a transaction most of the time) while the main
thread reads first pages (``read_observer_turn_page``, limit 10) of the projects in turn. Two ways of
announcing the write to quiet views alternate round by round on the same file:

- ``at BEGIN`` (as the store did before): quiet views stop at the transaction's BEGIN, so a read beside
  any part of it takes the snapshot view (BEGIN, the version, the page, ROLLBACK);
- ``at COMMIT`` (as it does now): they stop only from the COMMIT to its publication, since nothing of
  the transaction is visible to another cursor before it.

It prints, per way, the reads a second, the wall time of a read (p50, p90), its CPU (mean) and the
share of quiet views a commit overtook, then the ratios (now / before). Every read must answer ``ok``
(exit 1 otherwise). The reader retries a quiet view once before the snapshot view in both ways.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import Workload, encode_workload
from throughline.core.layers import LayeredView
from throughline.core.memory import FixedLog
from throughline.projector.store import DuckProjection, DuckView, LogRecord, transaction
from throughline.projector.store.view import Overtaken
from throughline.reader import read_observer_turn_page

TOPIC = "bench.busy-reads"
PROJECTS = 64
WAYS = ("at BEGIN", "at COMMIT")
WRITE_RECORDS = 2  # records a transaction
WRITE_GAP_S = 0.002  # between two transactions
TOKEN_KEY = b"k" * 32


def _log(projects: int, turns: int) -> list[LogRecord]:
    """``turns`` turns over ``projects`` projects, all on one partition."""
    encoded = encode_workload(Workload(turns, body_bytes=512, projects=projects, label="busy"), 1)
    return [LogRecord(0, i, k, v) for i, (k, v) in enumerate(zip(encoded.keys, encoded.values, strict=True))]


@contextmanager
def _announced_at_begin(enabled: bool) -> Iterator[None]:
    """While the block runs, announce each write before its BEGIN (the way before this change)."""
    if not enabled:
        yield
        return
    execute = transaction.ApplyTransaction.execute

    def at_begin(self: transaction.ApplyTransaction, before_commit: Callable[[], None] | None = None) -> Any:
        if before_commit is not None:
            before_commit()  # the announcement, now; its second call before COMMIT changes nothing
        return execute(self, before_commit)

    transaction.ApplyTransaction.execute = at_begin
    try:
        yield
    finally:
        transaction.ApplyTransaction.execute = execute


class _Counted(DuckProjection):
    """The projection, counting its quiet views and those a commit overtook (``read`` tries them first)."""

    overtaken = 0
    quiet = 0

    @contextmanager
    def _quiet_view(self) -> Iterator[DuckView | LayeredView]:
        self.quiet += 1
        try:
            with super()._quiet_view() as view:
                yield view
        except Overtaken:
            self.overtaken += 1
            raise


def _round(projection: _Counted, writes: list[LogRecord], seconds: float) -> dict[str, float]:
    """Reads of first pages while a thread applies ``writes`` (at most ``seconds``)."""
    done = threading.Event()
    failure: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(0, len(writes), WRITE_RECORDS):
                if done.is_set():
                    return
                projection.apply_batch(TOPIC, 0, writes[i : i + WRITE_RECORDS])
                time.sleep(WRITE_GAP_S)
        except BaseException as exc:  # reported by the round
            failure.append(exc)
        finally:
            done.set()

    counted = projection
    counted.quiet = counted.overtaken = 0  # this round's
    log = FixedLog(partitions=1, ends={0: 1})  # every read's records are applied: no wait
    walls: list[float] = []
    cpus: list[float] = []
    projects = [Workload(1, projects=PROJECTS, label="busy").project(k) for k in range(PROJECTS)]
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    started = time.perf_counter()
    deadline = started + seconds
    i = 0
    while not done.is_set() and time.perf_counter() < deadline:
        t0, c0 = time.perf_counter(), time.thread_time()
        page = read_observer_turn_page(
            project=projects[i % PROJECTS],
            limit=10,
            projection=counted,
            log=log,
            token_key=TOKEN_KEY,
            wait_timeout=0.0,
        )
        walls.append((time.perf_counter() - t0) * 1000)
        cpus.append((time.thread_time() - c0) * 1000)
        if page.status != "ok":
            raise SystemExit(f"a read answered {page.status}: {page}")
        i += 1
    elapsed = time.perf_counter() - started
    done.set()
    thread.join(30)
    if failure:
        raise failure[0]
    walls.sort()
    return {
        "reads_per_s": len(walls) / elapsed,
        "wall_p50": walls[len(walls) // 2],
        "wall_p90": walls[int(len(walls) * 0.9)],
        "cpu_mean": statistics.fmean(cpus),
        "overtaken": 100.0 * counted.overtaken / max(1, counted.quiet),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print its table."""
    ap = argparse.ArgumentParser(prog="python -m bench.busy_reads", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each way, alternated (default 6)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of reading a round (default 3)")
    args = ap.parse_args(argv)
    rounds = max(1, args.rounds)
    base = PROJECTS * 10
    # Each round writes its own turns: the writer never runs out before the round ends.
    per_round = max(WRITE_RECORDS, int(args.seconds / WRITE_GAP_S) * WRITE_RECORDS)
    log = _log(PROJECTS, base + 2 * rounds * per_round)
    results: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="busy-reads-") as tmp:
        projection = _Counted.open(Path(tmp) / "p.duckdb", topic=TOPIC)
        try:
            projection.apply_batch(TOPIC, 0, log[:base])
            at = base
            for r in range(2 * rounds):
                way = WAYS[(r + r // 2) % 2]  # ABBA: neither way always goes first
                with _announced_at_begin(way == "at BEGIN"):
                    results[way].append(_round(projection, log[at : at + per_round], args.seconds))
                at += per_round
                print(f"[busy_reads] round {r + 1}/{2 * rounds} ({way}) done", file=sys.stderr, flush=True)
        finally:
            projection.close()
    keys = ("reads_per_s", "wall_p50", "wall_p90", "cpu_mean", "overtaken")
    median = {w: {k: statistics.median(x[k] for x in results[w]) for k in keys} for w in WAYS}
    print(
        f"First pages beside a writer of {WRITE_RECORDS}-record transactions every ~{WRITE_GAP_S * 1000:g} ms "
        f"(medians of {rounds} alternated rounds of {args.seconds:g} s each)"
    )
    print()
    print(
        "| quiet views stop | reads /s | read wall p50 ms | read wall p90 ms | read CPU mean ms | quiet views overtaken |"
    )
    print("|---|---|---|---|---|---|")
    for w in WAYS:
        m = median[w]
        print(
            f"| {w} | {m['reads_per_s']:,.0f} | {m['wall_p50']:.2f} | {m['wall_p90']:.2f} | {m['cpu_mean']:.2f} "
            f"| {m['overtaken']:.0f}% |"
        )
    before, now = median["at BEGIN"], median["at COMMIT"]
    print()
    print(
        f"ratio (at COMMIT / at BEGIN): reads /s {now['reads_per_s'] / before['reads_per_s']:.2f}, "
        f"wall p50 {now['wall_p50'] / before['wall_p50']:.2f}, wall p90 {now['wall_p90'] / before['wall_p90']:.2f}, "
        f"CPU {now['cpu_mean'] / before['cpu_mean']:.2f}; every read ok"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
