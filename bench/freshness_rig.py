"""Item 4's rig: one ``throughline serve``, producer processes, pollers and a lag sampler, and one cell
of the freshness sweep run on them (``bench.freshness`` plans the sweep and reports it).

``throughline serve`` (its defaults: projector and HTTP API in one process) runs over a new topic and
file for the whole sweep. Producer processes append turns at a steady, open-loop rate: turn ``i`` of a
cell is sent at ``start + i / rate`` whatever the acknowledgements do, so the offered rate stays steady
when the system slows down; the rate achieved is reported. One process per ``PER_PRODUCER_RATE`` turns/s,
each sending whole sources (a source's turns keep their order). A turn's acknowledgement instant is
stamped by its delivery callback, and every figure counts from an earlier instant still: the broker's
append of the turn's batch (the topic's ``message.timestamp.type`` is ``LogAppendTime``, milliseconds,
rounded down), which precedes the acknowledgement, so no delay inside a producer process can shorten
ack -> readable. A turn due less than ``PACE_TICK_S`` ahead is sent at once instead of after a wait that
short.

The producers are the load, not the system measured, yet on this machine they share its two cores with
``serve``. With ``TurnProducer`` (kafka-python) at ~60 us of CPU a turn, the four processes of a
10,000 turns/s cell took ~85% of a core, ``serve``'s projector thread waited for a core 58% of its wall
time, and at half the projector's capacity the producers sent only 50-60% of the rate asked (the runs of
2026-12-03). Agent hosts run elsewhere. So the load is generated as cheaply as this machine allows: each
cell's turns are encoded before it starts exactly as ``TurnProducer`` encodes them (``encode_turn``,
keyed by the project's hash, on its partition) and sent by librdkafka (``confluent-kafka``, from its own
pinned environment ``bench.peers.LOADGEN``) with ``TurnProducer``'s delivery settings (acks=all,
idempotent, its linger and batch size): ~13-27 us of CPU a turn, all threads counted. What reaches the
broker are the same records. A producer process's main thread (pacing, delivery callbacks) runs at
``PRODUCER_NICE``: it takes the CPU ``serve`` leaves; librdkafka's threads, started before, keep the normal
priority. The figures count from the broker's append, so a producer that reads its acknowledgements
late cannot flatter them; each cell reports how long after the append the producer stamped them
(``stamp_after_append``, p50 / p99), and 'achieved' says whether the producers still sent the rate
asked.

Pollers (one keep-alive HTTP connection each) take acknowledgements as the producers get them
(``(partition, offset, instant)`` of a sample of the turns, at most ``ACK_SAMPLES_PER_S`` a second) and
re-read that project's first page (``GET /v1/projects/read``, limit 10) until its through cursor covers
the acknowledged offset: the delay from the acknowledgement to that answer is ack -> readable. Every read
they make is a first-page read under that ingest (latency and status are recorded). An acknowledgement
no poller could take within ``STALE_S`` of its stamp is skipped, so queueing inside the benchmark is not counted; one
not readable within ``POLL_BOUND_S`` counts as missed (an infinite latency in the percentiles). A sampler
reads ``/readyz`` every ``LAG_EVERY_S`` for the projector's lag: records (the log's end minus the applied
offset, summed over partitions) and milliseconds (since the acknowledgement of the oldest record not yet
applied, from the producers' acknowledgement times).

A follower (one more keep-alive connection) follows the cell's project 0 as an Observer does, one
long-poll at a time (``afterCursor`` = the last through cursor, ``wait`` = ``FOLLOW_WAIT_S``): ack ->
delivered is the delay from the acknowledgement of each of that project's turns to the first answer
whose through cursor covers it (item 4: a long-poll must see a turn as fast as a first page does).
"""

from __future__ import annotations

import bisect
import http.client
import json
import math
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import peers
from bench.common import (
    PYTHON,
    Config,
    Workload,
    create_topic,
    delete_topics,
    new_topic_name,
    percentile,
)
from bench.profile import recording
from throughline.core.cursor import Cursor, decode_cursor

ACK_SAMPLES_PER_S = 100  # acknowledgements offered to the pollers per second (a sample of every rate)
POLL_BOUND_S = 10.0  # an acknowledged turn not readable within this is "missed"
#: An ack no poller picked up within this is skipped: a late start would add its delay to the figure
#: (the poller's first read may already find the turn readable), so it bounds that bias.
STALE_S = 0.01
LAG_EVERY_S = 0.2
#: A turn is sent up to this early rather than sleeping for less: the producer's 5 ms linger batches
#: them anyway, and a wake-up per turn (2,500 a second a process) costs the two cores CPU.
PACE_TICK_S = 0.001
PER_PRODUCER_RATE = 20_000.0  # turns/s one producer process is asked for at most (sources allowing)
#: ``confluent_kafka.TIMESTAMP_LOG_APPEND_TIME``: a delivery report's timestamp is the broker's append.
_LOG_APPEND_TIME = 2
_FULL_QUEUE_TRIES = 1_000  # 10 ms apart: a queue full for 10 s fails the turn
DRAIN_BOUND_S = 90.0  # the wait for the projector to catch up between cells
FIRST_PAGE_LIMIT = 10
FOLLOW_WAIT_S = 5.0  # the follower's long-poll wait (serve caps it at --max-wait)
#: The niceness of a producer process's main thread (see the module's docstring; raising it needs no
#: privilege). Its network thread keeps the process's own.
PRODUCER_NICE = 10

# ------------------------------------------------------------------------------------------ the producers


def _producer_main(
    site: str, bootstrap: str, topic: str, partitions: int, commands: Any, acks: Any, results: Any
) -> None:
    """Producer process: ``("build", cell, rate, projects, seconds, body_bytes, j, n)`` builds and encodes
    the cell's turns and keeps share ``j`` of ``n``; ``("go", cell, start)`` sends them paced at ``rate``
    from the instant ``start`` (open loop), offering a sample of acknowledgements to ``acks`` as they
    arrive, and puts the summary (with every acknowledgement's time) on ``results``; ``None`` ends the
    process. ``site``: the load generator's ``site-packages`` (``bench.peers.LOADGEN``)."""
    sys.path.append(site)  # after throughline's own packages: only confluent_kafka is taken from there
    from confluent_kafka import Producer

    producer = Producer(_load_config(bootstrap))
    try:
        # After librdkafka started its threads (they keep the normal priority): only this one is niced.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PRODUCER_NICE)
        built: tuple[Any, ...] | None = None
        while True:
            cmd = commands.get()
            if cmd is None:
                return
            try:
                if cmd[0] == "build":
                    built = _build_share(partitions, *cmd[1:])
                    results.put({"cell": cmd[1], "ready": True})
                elif built is not None and cmd[0] == "go" and built[0] == cmd[1]:
                    results.put(_send_share(producer, topic, acks, built, start=cmd[2]))
                    built = None
            except Exception as exc:  # reported to the sweep, which fails the cell
                results.put({"cell": cmd[1], "error": f"{type(exc).__name__}: {exc}"})
    finally:
        producer.flush(30)


def _load_config(bootstrap: str) -> dict[str, Any]:
    """librdkafka settings with ``TurnProducer``'s delivery semantics: acks=all, idempotent, its linger
    and batch size, at most 5 requests in flight, no topic auto-created."""
    from throughline.producers.producer import BATCH_BYTES, LINGER_MS

    return {
        "bootstrap.servers": bootstrap,
        "client.id": "bench-freshness-load",
        "acks": "all",
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": LINGER_MS,
        "batch.size": BATCH_BYTES,
        "delivery.timeout.ms": 60_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "log.connection.close": False,  # the broker closes idle connections; not worth a line on stderr
    }


def _build_share(
    partitions: int, cell: int, rate: float, projects: int, seconds: float, body_bytes: int, j: int, n: int
) -> tuple[Any, ...]:
    """The share's turns as ``(number, project, key, value, partition)``, encoded as ``TurnProducer``
    encodes them (``encode_turn``, keyed by the project's hash, on the project's partition), before the
    cell starts: the sends then cost the two cores only librdkafka's work."""
    from throughline.core.partitioning import partition_for
    from throughline.schemas.codec import encode_turn

    count = max(1, int(rate * seconds))
    wl = Workload(count, body_bytes=body_bytes, projects=projects, label=f"fresh{cell}", seed=3 + cell)
    # Whole sources per process, dealt round-robin (source q to process q % n): each source's turns keep
    # their order in the log, since one producer keeps the order it sends in per partition. Each
    # process builds only its own turns.
    numbers = [i for i in range(count) if wl.source_of(i) % n == j]
    mine = [
        (i, t.project, t.project_sha256, encode_turn(t), partition_for(t.project_sha256, partitions))
        for i, t in zip(numbers, wl.records(lambda q: q % n == j), strict=True)
    ]
    return cell, rate, mine, projects


def _send_share(producer: Any, topic: str, acks: Any, built: tuple[Any, ...], *, start: float) -> dict[str, Any]:
    cell, rate, mine, projects = built
    sample_every = max(1, round(rate / ACK_SAMPLES_PER_S))
    followed: list[tuple[int, int, float]] = []  # (partition, offset, ack instant) of project 0's turns
    # Each acknowledgement is stamped by its delivery callback, which librdkafka runs in this thread's
    # ``poll``: this loop polls between sends and waits in ``poll``, not in a sleep. Every figure counts
    # from the broker's append (LogAppendTime), so a late callback cannot shorten ack -> readable.
    times: dict[int, tuple[array[int], array[float]]] = {p: (array("q"), array("d")) for p in {m[4] for m in mine}}
    after_append = array("d")  # per acknowledgement: ms from the broker's append to its stamp here
    failures = [0]

    def stamper(project: str, sampled: bool, follow: bool) -> Any:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failures[0] += 1
                return
            now = time.monotonic()
            appended = now
            kind, stamp_ms = msg.timestamp()
            if kind == _LOG_APPEND_TIME:  # the broker's append, on this process's monotonic clock
                behind = max(0.0, time.time() * 1000.0 - stamp_ms)
                after_append.append(behind)
                appended = now - behind / 1000.0
            partition, offset = msg.partition(), msg.offset()
            offsets, stamps = times[partition]
            offsets.append(offset)
            stamps.append(appended)
            if follow:
                followed.append((partition, offset, appended))
            if sampled:
                acks.put((cell, project, partition, offset, appended, now))

        return delivered

    behind = 0.0
    _poll_until(producer, start)
    for i, project, key, value, partition in mine:
        due = start + i / rate
        if due > time.monotonic() + PACE_TICK_S:
            _poll_until(producer, due)
        else:
            behind = max(behind, time.monotonic() - due)
        callback = stamper(project, i % sample_every == 0, i % projects == 0)
        for _ in range(_FULL_QUEUE_TRIES):
            try:
                producer.produce(topic, value, key, partition=partition, on_delivery=callback)
                break
            except BufferError:  # librdkafka's queue is full: let it drain
                producer.poll(0.01)
        else:
            failures[0] += 1
        producer.poll(0)
    last = time.monotonic()
    failures[0] += producer.flush(60)  # what is still queued after 60 s never arrived
    return {
        "cell": cell,
        "sent": len(mine),
        "last": last,
        "behind_s": behind,
        "failed": failures[0],
        "acks": {p: _by_offset(*pair) for p, pair in times.items()},
        "followed": followed,
        "after_append": after_append,
    }


def _poll_until(producer: Any, instant: float) -> None:
    """Serve delivery callbacks until ``instant`` (``poll`` returns early after each one it serves)."""
    for _ in range(100_000):  # bounded; each pass waits or serves at least one callback
        left = instant - time.monotonic()
        if left <= PACE_TICK_S:
            return
        producer.poll(left)


def _by_offset(offsets: array[int], stamps: array[float]) -> tuple[array[int], array[float]]:
    """A partition's acknowledgements in offset order (the lag figures bisect them)."""
    pairs = sorted(zip(offsets, stamps, strict=True))
    return array("q", (o for o, _ in pairs)), array("d", (t for _, t in pairs))


# ------------------------------------------------------------------------------------------ HTTP


class _Http:
    """One keep-alive connection to serve (reconnects once when the server closed it)."""

    def __init__(self, base: str) -> None:
        u = urllib.parse.urlsplit(base)
        self._host, self._port = u.hostname or "127.0.0.1", u.port or 80
        self._conn: http.client.HTTPConnection | None = None

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, dict[str, Any] | None]:
        """``(status code, JSON document or None)``; code 0 when the server did not answer."""
        code, body = self.get_bytes(path, timeout)
        try:
            return code, json.loads(body) if body is not None else None
        except ValueError:
            return code, None

    def get_bytes(self, path: str, timeout: float = 30.0) -> tuple[int, bytes | None]:
        """``(status code, body)``; code 0 (and no body) when the server did not answer."""
        for attempt in range(2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            try:
                self._conn.request("GET", path)
                resp = self._conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    return 0, None
        return 0, None  # pragma: no cover - the loop returns

    def close(self) -> None:
        """Drop the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


#: The projector's transaction histograms in ``/metrics`` (``throughline.serve.metrics``): count, wall
#: seconds and records summed over the transactions so far.
_TRANSACTION_SERIES = (
    "throughline_projector_transaction_duration_seconds_count",
    "throughline_projector_transaction_duration_seconds_sum",
    "throughline_projector_transaction_records_sum",
)


def transactions_so_far(http_: _Http) -> tuple[float, tuple[float, float, float] | None]:
    """``(instant, (transactions, seconds in them, records))`` from serve's ``/metrics`` (``None`` when it
    did not answer or lacks the series)."""
    code, body = http_.get_bytes("/metrics", timeout=10)
    now = time.monotonic()
    if code != 200 or body is None:
        return now, None
    values: dict[str, float] = {}
    for line in body.decode("utf-8", "replace").splitlines():
        name, _, value = line.partition(" ")
        if name in _TRANSACTION_SERIES:
            values[name] = float(value)
    if len(values) < len(_TRANSACTION_SERIES):
        return now, None
    count, seconds, records = (values[n] for n in _TRANSACTION_SERIES)
    return now, (count, seconds, records)


def transaction_figures(
    before: tuple[float, tuple[float, float, float] | None], after: tuple[float, tuple[float, float, float] | None]
) -> dict[str, float]:
    """The projector's transactions between two ``transactions_so_far`` scrapes: a second, records and
    milliseconds each (means), and the share of the window it spent in one (``busy_pct``; near 100 a
    turn arriving waits for the transaction in flight, then for its own)."""
    (t0, m0), (t1, m1) = before, after
    if m0 is None or m1 is None or t1 <= t0 or m1[0] <= m0[0]:
        return {"txn_per_s": math.nan, "txn_records": math.nan, "txn_ms": math.nan, "busy_pct": math.nan}
    count, seconds, records = (b - a for a, b in zip(m0, m1, strict=True))
    return {
        "txn_per_s": count / (t1 - t0),
        "txn_records": records / count,
        "txn_ms": 1000.0 * seconds / count,
        "busy_pct": min(100.0, 100.0 * seconds / (t1 - t0)),
    }


def _read_path(project: str, limit: int = FIRST_PAGE_LIMIT, *, after: str | None = None, wait: float = 0.0) -> str:
    path = f"/v1/projects/read?project={urllib.parse.quote(project, safe='')}&limit={limit}"
    if after is not None:
        path += f"&afterCursor={after}"
    if wait > 0:
        path += f"&wait={wait:g}"
    return path


# ------------------------------------------------------------------------------------------ one cell


@dataclass
class _CellStats:
    """What the pollers and the lag sampler saw in one cell (filled from several threads)."""

    cell: int
    measure_from: float = math.inf  # monotonic instant the measurement starts (after the warm-up)
    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: dict[str, int] = field(default_factory=dict)
    read_ms: list[float] = field(default_factory=list)
    readable_ms: list[float] = field(default_factory=list)
    pickup_ms: list[float] = field(default_factory=list)  # ack -> the poller's first read of it
    # Each turn found readable: (partition, offset, acked, readable), monotonic seconds (the traces join it).
    turns: list[tuple[int, int, float, float]] = field(default_factory=list)
    missed: int = 0
    stale: int = 0
    lag: list[tuple[float, int, dict[int, int], dict[int, int]]] = field(default_factory=list)
    # The follower's answers that carried a through cursor: (instant, partition, offset), in order.
    follow: list[tuple[float, int, int]] = field(default_factory=list)
    follow_statuses: dict[str, int] = field(default_factory=dict)

    def read(self, status: str, ms: float) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.read_ms.append(ms)


class Rig:
    """The serve process, the producer processes, the pollers and the lag sampler of one sweep."""

    topic_prefix = "fresh"  # each sweep's new topic is named from it

    def __init__(self, cfg: Config, bootstrap: str, workdir: Path, *, trace: Path | None = None) -> None:
        self.cfg = cfg
        self.trace = trace  # serve traced into this folder (``bench.serve_trace``), or not traced
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.commands: list[Any] = []
        self.producers: list[Any] = []
        self.pollers: list[threading.Thread] = []
        self.current: _CellStats | None = None
        self.accepting = threading.Event()  # pollers take new acks only while a cell is measured
        self.stop = threading.Event()
        self.busy = threading.Semaphore(cfg.freshness_pollers)
        peers.LOADGEN.ensure()  # the load generator's environment, built on first use
        self.load_site = str(peers.LOADGEN.site_packages)
        self.topic = new_topic_name(self.topic_prefix)
        create_topic(bootstrap, self.topic, cfg.partitions, log_append_time=True)
        try:
            self.proc, self.url = self._start_server()
        except BaseException:
            delete_topics(bootstrap, [self.topic])
            raise
        try:
            self._start_clients()
        except BaseException:
            self.close()
            raise

    def _start_server(self) -> tuple[Any, str]:
        """Start the server the cell reads from, over ``self.topic``: ``throughline serve`` here."""
        env = None
        if self.trace is not None:
            from bench import serve_trace

            env = serve_trace.serve_env(self.trace)
        return start_serve(self.bootstrap, self.topic, self.workdir / "fresh.duckdb", self.cfg.partitions, env=env)

    def _recording(self, label: str) -> Any:
        """The profiler of a profile cell: py-spy on ``serve`` and its children (``bench.profile``)."""
        return recording(label, self.workdir / "serve.pyspy", pid=self.proc.pid)

    def _start_clients(self) -> None:
        cfg = self.cfg
        self._ctx = mp.get_context("spawn")
        self.acks, self.results = self._ctx.Queue(), self._ctx.Queue()
        self.pollers = [threading.Thread(target=self._poller, daemon=True) for _ in range(cfg.freshness_pollers)]
        for t in self.pollers:
            t.start()

    def _producers(self, n: int) -> None:
        """Start producer processes until there are ``n`` (each stays for the rest of the sweep)."""
        while len(self.producers) < n:
            q = self._ctx.Queue()
            proc = self._ctx.Process(
                target=_producer_main,
                args=(self.load_site, self.bootstrap, self.topic, self.cfg.partitions, q, self.acks, self.results),
                daemon=True,
            )
            self.commands.append(q)
            self.producers.append(proc)
            proc.start()

    def close(self) -> None:
        """Stop every thread and process this sweep started (bounded waits)."""
        self.stop.set()
        self.accepting.clear()
        for q in self.commands:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for proc in self.producers:
            if proc.pid is not None:
                proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
        for t in self.pollers:
            t.join(timeout=POLL_BOUND_S + 5)
        stop_serve(self.proc)
        delete_topics(self.bootstrap, [self.topic])

    # -- threads

    def _poller(self) -> None:
        http_ = _Http(self.url)
        try:
            while not self.stop.is_set():
                try:
                    cell, project, partition, offset, acked, stamped = self.acks.get(timeout=0.2)
                except queue.Empty:
                    continue
                with self.busy:
                    stats = self.current
                    if stats is None or cell != stats.cell or acked < stats.measure_from:
                        continue  # another cell's or the warm-up's
                    # Stale by the rig's own delay (stamp -> poller), whatever the producer's.
                    if not self.accepting.is_set() or time.monotonic() - stamped > STALE_S:
                        with stats.lock:  # every poller was busy when this ack came
                            stats.stale += 1
                        continue
                    self._follow(http_, stats, project, partition, offset, acked, stamped)
        finally:
            http_.close()

    def _follow(
        self, http_: _Http, stats: _CellStats, project: str, partition: int, offset: int, acked: float, stamped: float
    ) -> None:
        """Re-read the project's first page until its through cursor covers ``(partition, offset)``: ack ->
        readable counts from ``acked`` (the broker's append), the pickup from ``stamped`` (the producer's)."""
        deadline = acked + POLL_BOUND_S
        path = _read_path(project)
        with stats.lock:
            stats.pickup_ms.append((time.monotonic() - stamped) * 1000)
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            code, doc = http_.get(path, timeout=POLL_BOUND_S)
            now = time.monotonic()
            stats.read(
                str(doc.get("status")) if code == 200 and doc else f"http_{code}", (time.perf_counter() - t0) * 1000
            )
            if code == 200 and doc and doc.get("status") == "ok" and doc.get("throughCursor"):
                cur = decode_cursor(doc["throughCursor"])
                if isinstance(cur, Cursor) and cur.partition == partition and cur.offset >= offset:
                    with stats.lock:
                        stats.readable_ms.append((now - acked) * 1000)
                        stats.turns.append((partition, offset, acked, now))
                    return
            time.sleep(0.002)
        with stats.lock:
            stats.missed += 1

    def _lag_sampler(self, stats: _CellStats, until: threading.Event) -> None:
        http_ = _Http(self.url)
        try:
            while not until.wait(LAG_EVERY_S):
                code, doc = http_.get("/readyz", timeout=10)
                now = time.monotonic()
                if doc and doc.get("lag") is not None and isinstance(doc.get("partitions"), list):
                    applied = {int(p["partition"]): int(p["appliedOffset"]) for p in doc["partitions"]}
                    ends = {
                        int(p["partition"]): int(p["endOffset"])
                        for p in doc["partitions"]
                        if p.get("endOffset") is not None
                    }
                    stats.lag.append((now, int(doc["lag"]), applied, ends))
        finally:
            http_.close()

    def _follower(self, stats: _CellStats, project: str, until: threading.Event) -> None:
        """Follow ``project`` as an Observer does: one long-poll at a time, each after the last through cursor."""
        http_ = _Http(self.url)
        after: str | None = None
        try:
            while not until.is_set():
                code, doc = http_.get(_read_path(project, after=after, wait=FOLLOW_WAIT_S), timeout=FOLLOW_WAIT_S + 30)
                now = time.monotonic()
                status = str(doc.get("status")) if code == 200 and doc else f"http_{code}"
                stats.follow_statuses[status] = stats.follow_statuses.get(status, 0) + 1
                through = doc.get("throughCursor") if doc and status == "ok" else None
                if through:
                    cur = decode_cursor(through)
                    if isinstance(cur, Cursor):
                        stats.follow.append((now, cur.partition, cur.offset))
                        after = through
                elif status != "ok":
                    until.wait(0.01)  # pending or an error: do not spin
        finally:
            http_.close()

    def caught_up(self, bound_s: float = DRAIN_BOUND_S) -> float:
        """Wait until the projector applied everything in the log; return the seconds it took (bounded)."""
        http_ = _Http(self.url)
        start = time.monotonic()
        try:
            while time.monotonic() - start < bound_s:
                code, doc = http_.get("/readyz", timeout=10)
                if doc and doc.get("lag") == 0:
                    return time.monotonic() - start
                if self.proc.poll() is not None:
                    raise RuntimeError(f"throughline serve exited with {self.proc.returncode}")
                time.sleep(0.1)
        finally:
            http_.close()
        return math.inf

    def _results(self, cell: int, n: int, bound_s: float) -> list[dict[str, Any]]:
        """The next answer of each of ``n`` producers for ``cell`` (bounded)."""
        deadline = time.monotonic() + bound_s
        got: list[dict[str, Any]] = []
        while len(got) < n and time.monotonic() < deadline:
            try:
                answer: dict[str, Any] = self.results.get(timeout=1.0)
            except queue.Empty:
                if not all(p.is_alive() for p in self.producers):
                    raise RuntimeError("a producer process died") from None
                continue
            if answer.get("cell") != cell:
                continue
            if "error" in answer:
                raise RuntimeError(f"a producer failed: {answer['error']}")
            got.append(answer)
        if len(got) < n:
            raise RuntimeError(f"{n - len(got)} of {n} producers did not answer within {bound_s:.0f} s")
        return got

    # -- idle reads

    def idle_reads(self, projects: list[str], reads: int) -> tuple[list[float], dict[str, int]]:
        """``reads`` first pages (limit ``FIRST_PAGE_LIMIT``) of ``projects`` in turn over one keep-alive
        connection, once the projector applied everything and nothing is being produced: what a read
        costs over HTTP on an idle serve. Returns the latencies (ms, after a warm-up) and the statuses."""
        if self.caught_up() == math.inf:
            raise RuntimeError(f"the projector did not catch up within {DRAIN_BOUND_S:.0f} s before the idle reads")
        http_ = _Http(self.url)
        warm = max(5, reads // 20)
        ms: list[float] = []
        statuses: dict[str, int] = {}
        try:
            for i in range(reads + warm):
                path = _read_path(projects[i % len(projects)])
                t0 = time.perf_counter()
                code, doc = http_.get(path)
                dt = (time.perf_counter() - t0) * 1000
                status = str(doc.get("status")) if code == 200 and doc else f"http {code}"
                if i >= warm:
                    ms.append(dt)
                    statuses[status] = statuses.get(status, 0) + 1
        finally:
            http_.close()
        return ms, statuses

    # -- a cell

    def run_cell(
        self, cell: int, rate: float, projects: int, *, label: str, profile_label: str | None = None
    ) -> dict[str, Any]:
        """One cell: ``rate`` turns/s over ``projects`` projects for warm-up + measured seconds."""
        cfg = self.cfg
        drained = self.caught_up()
        stats = _CellStats(cell)
        seconds = cfg.freshness_warmup + cfg.freshness_seconds
        n = producers_for(rate, projects, cfg.freshness_producers)
        self._producers(n)
        self.current = stats
        for j in range(n):
            self.commands[j].put(("build", cell, rate, projects, seconds, cfg.freshness_body_bytes, j, n))
        self._results(cell, n, 300)  # every producer built its share of the cell's turns
        recorder = self._recording(profile_label) if profile_label else None
        profile = None
        if recorder is not None:
            profile = recorder.__enter__()
        start = time.monotonic() + 0.05
        for j in range(n):
            self.commands[j].put(("go", cell, start))
        stats.measure_from = start + cfg.freshness_warmup
        until = threading.Event()
        sampler = threading.Thread(target=self._lag_sampler, args=(stats, until), daemon=True)
        followed = Workload(1, projects=projects, label=f"fresh{cell}").project(0)  # the producers' project 0
        follow_stop = threading.Event()
        follower = threading.Thread(target=self._follower, args=(stats, followed, follow_stop), daemon=True)
        self.accepting.set()
        time.sleep(max(0.0, stats.measure_from - time.monotonic()))
        sampler.start()
        follower.start()
        scraper = _Http(self.url)
        try:
            before = transactions_so_far(scraper)
            summary = _merge(self._results(cell, n, seconds * 4 + 120), start)
            transactions = transaction_figures(before, transactions_so_far(scraper))  # while the producers sent
            _wait_covered(stats, summary["followed"], POLL_BOUND_S)
        finally:
            scraper.close()
            follow_stop.set()
            until.set()
            self.accepting.clear()
            sampler.join(timeout=15)
            follower.join(timeout=FOLLOW_WAIT_S + 35)
            # Let every poller finish the acknowledgement it follows (each is bounded by POLL_BOUND_S).
            held = sum(1 for _ in range(cfg.freshness_pollers) if self.busy.acquire(timeout=POLL_BOUND_S + 5))
            for _ in range(held):
                self.busy.release()
            if recorder is not None:
                recorder.__exit__(None, None, None)
            self.current = None
        ended = time.monotonic()
        return (
            _figures(
                stats,
                summary,
                rate=rate,
                projects=projects,
                label=label,
                drained_s=drained,
                producers=n,
                profile=profile[0] if profile else None,
            )
            | transactions
            | {"turns": list(stats.turns), "window": (stats.measure_from, ended)}
        )


def producers_for(rate: float, projects: int, pool: int) -> int:
    """Producer processes for a cell: one per ``PER_PRODUCER_RATE`` turns/s, at most ``pool`` and at most
    one per source (4 per project)."""
    return max(1, min(pool, projects * Workload.threads, math.ceil(rate / PER_PRODUCER_RATE)))


def _wait_covered(stats: _CellStats, followed: list[tuple[int, int, float]], bound_s: float) -> None:
    """Until the follower's answers cover the last followed turn of every partition (at most ``bound_s``):
    a turn sent at the end of a cell is followed like any other; one not covered by then is missed."""
    last: dict[int, int] = {}
    for p, offset, _ in followed:
        last[p] = max(last.get(p, -1), offset)
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        seen: dict[int, int] = {}
        for _, p, offset in list(stats.follow):
            seen[p] = max(seen.get(p, -1), offset)
        if all(seen.get(p, -1) >= o for p, o in last.items()):
            return
        time.sleep(0.01)


def _merge(summaries: list[dict[str, Any]], start: float) -> dict[str, Any]:
    """One summary of the producers of a cell: turns sent, sending seconds, acknowledgement times."""
    by_partition: dict[int, list[tuple[int, float]]] = {}
    for s in summaries:
        for p, (offsets, stamps) in s["acks"].items():
            by_partition.setdefault(int(p), []).extend(zip(offsets, stamps, strict=True))
    acks = {}
    for p, pairs in by_partition.items():
        pairs.sort()
        acks[p] = ([o for o, _ in pairs], [t for _, t in pairs])
    return {
        "sent": sum(s["sent"] for s in summaries),
        "send_seconds": max(s["last"] for s in summaries) - start,
        "behind_s": max(s["behind_s"] for s in summaries),
        "failed": sum(s["failed"] for s in summaries),
        "acks": acks,
        "followed": [f for s in summaries for f in s.get("followed", [])],
        "after_append": [x for s in summaries for x in s.get("after_append", ())],
    }


def _lag_ms(stats: _CellStats, summary: dict[str, Any]) -> list[float]:
    """Per lag sample: milliseconds since the acknowledgement of the oldest record not yet applied."""
    acks = summary["acks"]
    out: list[float] = []
    for t, _, applied, ends in stats.lag:
        worst = 0.0
        for p, a in applied.items():
            if a >= ends.get(p, a) or p not in acks:
                continue
            offsets, stamps = acks[p]
            i = bisect.bisect_left(offsets, a)
            if i < len(offsets) and offsets[i] == a:
                worst = max(worst, (t - stamps[i]) * 1000)
        out.append(max(0.0, worst))
    return out


def _delivered_ms(stats: _CellStats, summary: dict[str, Any]) -> tuple[list[float], int]:
    """Per acknowledged turn of the followed project (after the warm-up): ms from its acknowledgement to
    the follower's first answer whose through cursor covers it; and how many no answer covered."""
    answers: dict[int, tuple[list[int], list[float]]] = {}
    for t, p, offset in stats.follow:  # in time order; a partition's through offsets never go back
        offsets, times = answers.setdefault(p, ([], []))
        offsets.append(offset)
        times.append(t)
    out: list[float] = []
    missed = 0
    for p, offset, acked in summary["followed"]:
        if acked < stats.measure_from:
            continue
        offsets, times = answers.get(p, ([], []))
        i = bisect.bisect_left(offsets, offset)
        if i == len(offsets):
            missed += 1
            continue
        out.append(max(0.0, (times[i] - acked) * 1000))
    return out, missed


def _pct(values: list[float], missed: int, q: float) -> float:
    """``percentile`` with ``missed`` samples counted as infinitely late (interpolating toward one of them
    gives infinity, where plain interpolation would compute inf - inf)."""
    ordered = sorted(values) + [math.inf] * missed
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    if math.isinf(ordered[lo]) or (pos > lo and math.isinf(ordered[hi])):
        return math.inf
    if pos == lo:
        return float(ordered[lo])
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def _figures(
    stats: _CellStats,
    summary: dict[str, Any],
    *,
    rate: float,
    projects: int,
    label: str,
    drained_s: float,
    producers: int,
    profile: Any,
) -> dict[str, Any]:
    reads = sum(stats.statuses.values())
    lag_records = [float(x[1]) for x in stats.lag]
    lag_ms = _lag_ms(stats, summary)
    delivered, undelivered = _delivered_ms(stats, summary)
    achieved = summary["sent"] / summary["send_seconds"] if summary["send_seconds"] > 0 else math.nan
    return {
        "label": label,
        "rate": rate,
        "projects": projects,
        "producers": producers,
        "achieved": achieved,
        "achieved_share": 100.0 * achieved / rate if rate > 0 else math.nan,  # of the rate asked
        "behind_s": summary["behind_s"],
        "send_failed": summary["failed"],
        "drained_s": drained_s,
        "samples": len(stats.readable_ms),
        "missed": stats.missed,
        "stale": stats.stale,
        "pickup_p50": percentile(stats.pickup_ms, 50),
        "pickup_max": max(stats.pickup_ms) if stats.pickup_ms else math.nan,
        "stamp_after_append_p50": percentile(summary["after_append"], 50),
        "stamp_after_append_p99": percentile(summary["after_append"], 99),
        "fresh_p50": _pct(stats.readable_ms, stats.missed, 50),
        "fresh_p99": _pct(stats.readable_ms, stats.missed, 99),
        "reads": reads,
        "statuses": dict(stats.statuses),
        "ok": stats.statuses.get("ok", 0),
        "ok_share": 100.0 * stats.statuses.get("ok", 0) / reads if reads else math.nan,
        "read_p50": percentile(stats.read_ms, 50),
        "read_p99": percentile(stats.read_ms, 99),
        "lag_records_p50": percentile(lag_records, 50),
        "lag_records_max": max(lag_records) if lag_records else math.nan,
        "lag_ms_p50": percentile(lag_ms, 50),
        "lag_ms_max": max(lag_ms) if lag_ms else math.nan,
        "lag_samples": len(lag_records),
        "follow_samples": len(delivered),
        "follow_missed": undelivered,
        "follow_p50": _pct(delivered, undelivered, 50),
        "follow_p99": _pct(delivered, undelivered, 99),
        "follow_statuses": dict(stats.follow_statuses),
        "profile": profile,
    }


# ------------------------------------------------------------------------------------------ serve


def start_serve(
    bootstrap: str, topic: str, db: Path, partitions: int, *, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start ``throughline serve --port 0`` with its defaults (in ``env``: this environment by default);
    return the process and its URL (bounded wait)."""
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    cmd = [
        PYTHON,
        "-m",
        "throughline.cli",
        "serve",
        "--port",
        "0",
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--db",
        str(db),
        "--partitions",
        str(partitions),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True).start()
    try:
        url = lines.get(timeout=90).strip()
    except queue.Empty:
        stop_serve(proc)
        raise RuntimeError("throughline serve printed no URL within 90 s") from None
    if not url.startswith("http"):
        code = proc.poll()
        stop_serve(proc)
        raise RuntimeError(f"throughline serve did not start (exit {code}): {url!r}")
    return proc, url


def stop_serve(proc: subprocess.Popen[Any], grace: float = 45.0) -> None:
    """SIGTERM (a group member leaves its group at once), then kill after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
