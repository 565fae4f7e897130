"""Load (docs/reliability.md#5-load): many concurrent HTTP readers plus steady ingest, for a bounded time.

A real ``throughline serve`` (projector + HTTP API) on a real broker. For ``THROUGHLINE_LOAD_SECONDS``
(20 s by default) ``THROUGHLINE_LOAD_READERS`` threads (16) read series through the HTTP API as
Observers do (a snapshot first, then deltas, paginated, across many projects), while turns are
produced steadily. Recorded: every read's latency (percentiles), the statuses, and serve's resident
memory every half second.

Asserted: no errors at all (every answer is a 200 with a valid document; ``projection_pending`` is an
answer, and is counted), every series read is consecutive, and memory is flat: the median RSS of the
last fifth of the run is within ``MAX_RSS_GROWTH`` of the median of the second fifth (after warm-up),
with a small absolute allowance for allocator noise. No timing is asserted: latency is recorded.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import rel_support
from rel_support import Child, Workload, wait_until

from throughline.log import ensure_topic
from throughline.producers.producer import TurnProducer
from throughline.serve.client import HttpReader
from throughline.testing.kafka import free_port

pytestmark = pytest.mark.integration

SECONDS = rel_support.env_float("THROUGHLINE_LOAD_SECONDS", 20.0)
READERS = rel_support.env_int("THROUGHLINE_LOAD_READERS", 16)
INGEST_PER_SECOND = rel_support.env_int("THROUGHLINE_LOAD_INGEST_RATE", 200)
PARTITIONS = 3
PROJECTS = tuple(f"/srv/load/project-{i:02d}" for i in range(24))
MAX_RSS_GROWTH = 0.25
RSS_SLACK_BYTES = 24 * 1024 * 1024


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    turns: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seconds: float, status: str, turns: int) -> None:
        with self.lock:
            self.latencies.append(seconds)
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.turns += turns


def _reader(url: str, seed: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(seed)
    reader = HttpReader(url, timeout=60.0)
    after: dict[str, str | None] = dict.fromkeys(PROJECTS)
    while not stop.is_set():
        project = rng.choice(PROJECTS)
        try:
            through = token = None
            seqs: list[int] = []
            for _ in range(1000):
                started = time.perf_counter()
                page = reader.read_observer_turn_page(
                    project=project,
                    after_cursor=after[project],
                    through_cursor=through,
                    page_token=token,
                    limit=rng.choice((5, 10, 25)),
                )
                tally.add(time.perf_counter() - started, page.status, len(page.turns))
                seqs += [t.seq for t in page.turns]
                if not page.ok:
                    if page.status == "resync_required":
                        after[project] = None  # a rollback under the cursor: start over with a snapshot
                    break
                if page.page.complete:
                    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True, seqs
                    after[project] = page.throughCursor
                    break
                through, token = page.throughCursor, page.page.nextToken
        except Exception as exc:  # every failure counts: the load must run without one
            with tally.lock:
                tally.errors.append(f"{type(exc).__name__}: {exc}"[:300])


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_many_readers_and_steady_ingest(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path) -> None:
    topic = kafka_topic_name
    ensure_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = rel_support.child_env(
        THROUGHLINE_BOOTSTRAP_SERVERS=kafka_bootstrap, THROUGHLINE_TOPIC=topic, THROUGHLINE_TOKEN_KEY="5a" * 32
    )
    serve = Child("serve", ["serve", "--port", str(port), "--db", str(tmp_path / "serve.duckdb")], tmp_path, env)
    workload = Workload(21, PROJECTS, switch_every=9, rollback_every=25)
    stop = threading.Event()
    tally = Tally()
    rss: list[tuple[float, int]] = []
    produced = [0]
    ingest_error: list[BaseException] = []

    def ingest() -> None:
        try:
            with TurnProducer(kafka_bootstrap, topic, partitions=PARTITIONS) as producer:
                batch = max(1, INGEST_PER_SECOND // 10)
                while not stop.is_set():
                    began = time.monotonic()
                    producer.send_many(
                        [
                            workload.next_turn(rng.choice(PROJECTS), body_bytes=rng.randrange(0, 600))
                            for _ in range(batch)
                        ]
                    )
                    produced[0] += batch
                    stop.wait(max(0.0, 0.1 - (time.monotonic() - began)))
        except BaseException as exc:
            ingest_error.append(exc)

    def sample(pid: int) -> None:
        while not stop.is_set():
            value = _rss(pid)
            if value is not None:
                rss.append((time.monotonic(), value))
            stop.wait(0.5)

    rng = random.Random(5)
    try:
        serve.start()
        wait_until(
            lambda: rel_support.http_json(url + "/readyz")[0] == 200 if _up(url) else False,
            timeout=120,
            what="serve to be ready",
        )
        with TurnProducer(kafka_bootstrap, topic, partitions=PARTITIONS) as producer:  # some history first
            producer.send_many([workload.next_turn(p) for p in PROJECTS for _ in range(20)])
        assert serve.proc is not None
        threads = [
            threading.Thread(target=ingest, daemon=True),
            threading.Thread(target=sample, args=(serve.proc.pid,), daemon=True),
        ]
        threads += [threading.Thread(target=_reader, args=(url, i, stop, tally), daemon=True) for i in range(READERS)]
        began = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(SECONDS)
        stop.set()
        for t in threads:
            t.join(timeout=90)
        elapsed = time.monotonic() - began
        assert serve.alive(), serve.stderr()
        assert serve.terminate() == 0, serve.stderr()
    finally:
        stop.set()
        serve.stop_quietly()

    assert not ingest_error, ingest_error
    assert not tally.errors, f"{len(tally.errors)} errors, e.g. {tally.errors[:3]}"
    reads = len(tally.latencies)
    assert reads > READERS
    times = [t - began for t, _ in rss]
    values = [v for _, v in rss]
    fifth = max(1, len(values) // 5)
    warm = statistics.median(values[fifth : 2 * fifth]) if len(values) >= 5 else values[0]
    last = statistics.median(values[-fifth:])
    growth = (last - warm) / warm
    p = {q: _percentile(tally.latencies, q) * 1000 for q in (0.5, 0.9, 0.99)}
    print(
        f"\nload: {READERS} readers, {elapsed:.0f}s, {reads} reads ({reads / elapsed:.0f}/s), statuses {tally.statuses}, "
        f"{tally.turns} turns served, {produced[0]} turns produced; latency p50 {p[0.5]:.1f} ms, p90 {p[0.9]:.1f} ms, "
        f"p99 {p[0.99]:.1f} ms, max {max(tally.latencies) * 1000:.0f} ms; RSS {warm / 2**20:.0f} MB -> "
        f"{last / 2**20:.0f} MB ({growth * 100:+.1f}%, {len(values)} samples over {times[-1] if times else 0:.0f}s)"
    )
    rel_support.record(
        "load",
        "http_readers_and_ingest",
        readers=READERS,
        seconds=round(elapsed, 1),
        reads=reads,
        reads_per_second=round(reads / elapsed, 1),
        errors=0,
        statuses=dict(sorted(tally.statuses.items())),
        turns_served=tally.turns,
        turns_produced=produced[0],
        latency_ms_p50=round(p[0.5], 2),
        latency_ms_p90=round(p[0.9], 2),
        latency_ms_p99=round(p[0.99], 2),
        latency_ms_max=round(max(tally.latencies) * 1000, 1),
        rss_mb_warm=round(warm / 2**20, 1),
        rss_mb_end=round(last / 2**20, 1),
        rss_growth_percent=round(growth * 100, 1),
        rss_samples=len(values),
    )
    assert last <= warm * (1 + MAX_RSS_GROWTH) + RSS_SLACK_BYTES, f"RSS grew from {warm} to {last} bytes"


def _up(url: str) -> bool:
    try:
        rel_support.http_json(url + "/healthz", timeout=5)
    except OSError:
        return False
    return True
