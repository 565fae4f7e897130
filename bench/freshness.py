"""Item 4: freshness under load.

``throughline serve`` runs as a subprocess (projector + HTTP API) over a new topic and file. A producer
process appends turns with ``TurnProducer`` at half the projector's measured capacity, paced; 16 client
threads read first pages (``GET /v1/projects/read``, limit 10) of random projects as fast as they are
answered. A sample of the producer's acknowledgements (partition, offset, the instant of the ack) goes
to poller threads, each of which re-reads that project's first page until its through cursor reaches
the acknowledged record: that delay is the producer-ack -> readable latency.

The machine has two cores: the broker, the serve process, the producer and the clients share them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import random
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    Config,
    Figure,
    Section,
    Target,
    Workload,
    create_topic,
    delete_topics,
    log,
    new_topic_name,
    percentile,
    wants_profile,
)
from bench.profile import recording
from throughline.core.cursor import Cursor, decode_cursor

SAMPLES_PER_SECOND = 20
POLL_BOUND_S = 15.0
STALE_S = 0.05  # an ack no poller picked up within this is skipped, not measured late
POLLERS = 8


def _producer_main(
    bootstrap: str, topic: str, partitions: int, rate: float, seconds: float, body_bytes: int, projects: int,
    acks: Any, done: Any, ready: Any, go: Any,
) -> None:
    """Producer process: pre-build the turns, then send them paced at ``rate``; sample acks to ``acks``."""
    from throughline.producers.producer import TurnProducer

    count = max(1, int(rate * seconds))
    wl = Workload(count, body_bytes=body_bytes, projects=projects, label="fresh", seed=3)
    turns = list(wl.records())
    sample_every = max(1, int(rate / SAMPLES_PER_SECOND))
    waiters: queue.Queue[Any] = queue.Queue()

    def wait_acks() -> None:
        while True:
            item = waiters.get()
            if item is None:
                return
            project, pending = item
            try:
                pos = pending.result()
            except Exception:
                continue
            acks.put((project, pos.partition, pos.offset, time.monotonic()))

    with TurnProducer(bootstrap, topic, partitions=partitions) as producer:
        waiter = threading.Thread(target=wait_acks, daemon=True)
        waiter.start()
        ready.set()
        go.wait(60)
        start = time.monotonic()
        sent = 0
        late = 0.0
        for i, turn in enumerate(turns):
            due = start + i / rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            else:
                late = max(late, now - due)
            pending = producer.send_async(turn)
            sent += 1
            if i % sample_every == 0:
                waiters.put((turn.project, pending))
        producer.flush()
        elapsed = time.monotonic() - start
        waiters.put(None)
        waiter.join(timeout=30)
    done.put({"sent": sent, "seconds": elapsed, "max_behind_s": late})


@dataclass
class _Reads:
    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: dict[str, int] = field(default_factory=dict)
    ms: list[float] = field(default_factory=list)

    def add(self, status: str, ms: float) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.ms.append(ms)


def _get(url: str, timeout: float = 30.0) -> tuple[int, dict[str, Any] | None]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, TimeoutError, OSError):
        return 0, None


def _read_url(base: str, project: str, limit: int = 10) -> str:
    return f"{base}/v1/projects/read?project={urllib.parse.quote(project, safe='')}&limit={limit}"


def _client(base: str, projects: list[str], stop: threading.Event, reads: _Reads, seed: int, max_reads: int) -> None:
    rng = random.Random(seed)
    for _ in range(max_reads):
        if stop.is_set():
            return
        t0 = time.perf_counter()
        code, doc = _get(_read_url(base, rng.choice(projects)))
        ms = (time.perf_counter() - t0) * 1000
        status = str(doc.get("status")) if code == 200 and doc else f"http_{code}"
        reads.add(status, ms)


def _poller(
    base: str, samples: Any, stop: threading.Event, out: list[float], missed: list[int], stale: list[int]
) -> None:
    while True:
        try:
            item = samples.get(timeout=0.2)
        except queue.Empty:
            if stop.is_set():
                return
            continue
        project, partition, offset, acked = item
        if time.monotonic() - acked > STALE_S:
            # Every poller was busy when this ack came: measuring it now would add queueing time.
            stale.append(1)
            continue
        deadline = acked + POLL_BOUND_S
        found = False
        while time.monotonic() < deadline:
            code, doc = _get(_read_url(base, project, 1), timeout=POLL_BOUND_S)
            if code == 200 and doc and doc.get("status") == "ok" and doc.get("throughCursor"):
                cur = decode_cursor(doc["throughCursor"])
                if isinstance(cur, Cursor) and cur.partition == partition and cur.offset >= offset:
                    out.append((time.monotonic() - acked) * 1000)
                    found = True
                    break
            time.sleep(0.002)
        if not found:
            missed.append(1)


def start_serve(bootstrap: str, topic: str, db: Path, partitions: int) -> tuple[subprocess.Popen[str], str]:
    """Start ``throughline serve --port 0``; return the process and its URL (bounded wait)."""
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    cmd = [
        PYTHON, "-m", "throughline.cli", "serve", "--port", "0", "--bootstrap-servers", bootstrap,
        "--topic", topic, "--db", str(db), "--partitions", str(partitions),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True).start()
    try:
        url = lines.get(timeout=90).strip()
    except queue.Empty:
        stop_serve(proc)
        raise RuntimeError("throughline serve printed no URL within 90 s") from None
    if not url.startswith("http"):
        err = proc.stderr.read()[-2000:] if proc.stderr and proc.poll() is not None else ""
        stop_serve(proc)
        raise RuntimeError(f"throughline serve did not start: {url!r} {err}")
    return proc, url


def stop_serve(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then kill after a bounded wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_once(
    cfg: Config, bootstrap: str, capacity: float, workdir: Path, profile_label: str | None = None
) -> dict[str, Any]:
    """One freshness run; returns the raw figures (and, with ``profile_label``, a py-spy profile of serve)."""
    topic = new_topic_name("fresh")
    create_topic(bootstrap, topic, cfg.partitions)
    rate = max(1.0, capacity / 2)
    proc, url = start_serve(bootstrap, topic, workdir / "fresh.duckdb", cfg.partitions)
    ctx = mp.get_context("spawn")
    acks, done, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    producer = ctx.Process(
        target=_producer_main,
        args=(bootstrap, topic, cfg.partitions, rate, cfg.freshness_seconds, cfg.body_bytes, cfg.projects,
              acks, done, ready, go),
        daemon=True,
    )
    reads = _Reads()
    recorder = recording(profile_label, workdir / "serve.pyspy", pid=proc.pid) if profile_label else None
    got: list[Any] = []
    latencies: list[float] = []
    missed: list[int] = []
    stale: list[int] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        producer.start()
        deadline = time.monotonic() + 120
        while not ready.wait(0.5):
            if not producer.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the producer process died or did not get ready in 120 s")
        projects = [Workload(1, projects=cfg.projects, label="fresh").project(k) for k in range(cfg.projects)]
        max_reads = int(cfg.freshness_seconds * 5000) + 1000
        for i in range(cfg.freshness_clients):
            threads.append(threading.Thread(target=_client, args=(url, projects, stop, reads, i, max_reads), daemon=True))
        pollers = [
            threading.Thread(target=_poller, args=(url, acks, stop, latencies, missed, stale), daemon=True)
            for _ in range(POLLERS)
        ]
        if recorder is not None:
            got = recorder.__enter__()
        for t in threads + pollers:
            t.start()
        go.set()
        summary = done.get(timeout=cfg.freshness_seconds * 4 + 120)
        stop.set()
        for t in threads + pollers:
            t.join(timeout=POLL_BOUND_S + 35)
        producer.join(timeout=30)
        if recorder is not None:
            recorder.__exit__(None, None, None)
            recorder = None
    finally:
        stop.set()
        if producer.is_alive():
            producer.terminate()
        stop_serve(proc)
        delete_topics(bootstrap, [topic])
    total = sum(reads.statuses.values())
    return {
        "rate_target": rate,
        "rate_achieved": summary["sent"] / summary["seconds"],
        "producer_behind_s": summary["max_behind_s"],
        "reads": total,
        "statuses": dict(reads.statuses),
        "ok_share": reads.statuses.get("ok", 0) / total if total else float("nan"),
        "read_p50": percentile(reads.ms, 50),
        "read_p99": percentile(reads.ms, 99),
        "fresh_p50": percentile(latencies, 50),
        "fresh_p99": percentile(latencies, 99),
        "fresh_samples": len(latencies),
        "fresh_missed": len(missed),
        "fresh_stale": len(stale),
        "topic": topic,
        "profile": got[0] if got else None,
    }


def measure(cfg: Config, bootstrap: str, capacity: float, workdir: Path) -> Section:
    """``cfg.repeat`` freshness runs; medians of each figure."""
    runs = []
    for rep in range(cfg.repeat):
        r = run_once(cfg, bootstrap, capacity, workdir)
        runs.append(r)
        log(
            f"freshness rep {rep + 1}: {r['rate_achieved']:,.0f}/s of {r['rate_target']:,.0f}/s, reads {r['reads']:,} "
            f"ok {r['ok_share']:.2%} p99 {r['read_p99']:.0f} ms, ack->readable p50 {r['fresh_p50']:.0f} ms "
            f"p99 {r['fresh_p99']:.0f} ms ({r['fresh_samples']} samples, {r['fresh_missed']} missed, {r['fresh_stale']} skipped) {r['statuses']}"
        )
    sec = Section("freshness", "4. Freshness under load")
    ok = Figure("reads answered `ok`", [r["ok_share"] * 100 for r in runs], "%", "{:.2f}")
    sec.figures = [
        Figure("ingest rate asked (half the projector's capacity)", [r["rate_target"] for r in runs], "records/s"),
        Figure("ingest rate achieved by `TurnProducer`", [r["rate_achieved"] for r in runs], "records/s"),
        Figure(f"reads by {cfg.freshness_clients} clients", [float(r["reads"]) for r in runs], "reads"),
        ok,
        Figure("read latency p50", [r["read_p50"] for r in runs], "ms", "{:.1f}"),
        Figure("read latency p99", [r["read_p99"] for r in runs], "ms", "{:.1f}"),
        Figure("producer ack -> readable p50", [r["fresh_p50"] for r in runs], "ms", "{:.1f}"),
        Figure("producer ack -> readable p99", [r["fresh_p99"] for r in runs], "ms", "{:.1f}"),
        Figure("ack samples (missed within 15 s)", [float(r["fresh_samples"]) for r in runs], "samples"),
    ]
    sec.targets = [Target("reads answered ok >= 99%", ok.median, 99.0, text="share of reads")]
    if wants_profile(cfg, sec.targets):
        r = run_once(cfg, bootstrap, capacity, workdir, profile_label="`throughline serve` under the freshness load (profile run)")
        prof = r["profile"]
        if prof is not None:
            sec.profiles.append(
                prof.markdown()
                + f"\n\nThat run: reads ok {r['ok_share']:.2%}, read p99 {r['read_p99']:.0f} ms, "
                f"ack -> readable p99 {r['fresh_p99']:.0f} ms."
            )
            sec.targets[0].bottleneck = prof.bottleneck()
    statuses: dict[str, int] = {}
    for r in runs:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    sec.notes = [
        f"`throughline serve` (defaults: read wait 2 s) in its own process; {cfg.freshness_seconds:.0f} s of paced "
        f"ingest per run from a separate producer process; {cfg.freshness_clients} client threads reading first "
        f"pages (limit 10) of {cfg.projects} projects; {SAMPLES_PER_SECOND} acks a second offered to {POLLERS} "
        "poller threads for the ack -> readable latency (re-read the project's first page until its through "
        f"cursor reaches the acked offset; an ack no poller took within {STALE_S * 1000:.0f} ms is skipped, "
        "so queueing in the benchmark is not counted).",
        "Read answers over all runs: " + ", ".join(f"{k} {v:,}" for k, v in sorted(statuses.items()))
        + f"; missed samples: {sum(r['fresh_missed'] for r in runs)}.",
    ]
    return sec
