"""What every measurement shares: sizes, the workload, the broker, topics, timing and results."""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from throughline.core.partitioning import partition_for
from throughline.core.turn import TurnRecord, build_turn
from throughline.log import ensure_topic
from throughline.schemas.codec import encode_turn

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python")
TOPIC_PREFIX = "bench."
BASE_MICROS = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


# ------------------------------------------------------------------------------------------ sizes


@dataclass
class Config:
    """Sizes and knobs of one run (``python -m bench --help`` documents each flag)."""

    quick: bool = False
    repeat: int = 3
    turns: int = 200_000  # records of the throughput topic (items 1, 2, 5)
    body_bytes: int = 1024
    projects: int = 64
    threads: int = 4  # sources per project (2 hosts x 2 threads)
    partitions: int = 3
    naive_max_records: int = 2_000  # the per-record insert+commit loop is timed over a prefix
    naive_max_seconds: float = 10.0
    reader_sizes: tuple[int, ...] = (10_000, 1_000_000, 10_000_000)
    reader_body_bytes: int = 64
    reader_sources: int = 50
    reader_reads: int = 200  # timed reads per (size, kind, limit)
    ratio_repeat: int = 7  # repetitions of the target ratios of item 1 (ceiling, projector, replay) and item 5
    freshness_rates: tuple[float | None, ...] = (10.0, 100.0, 1_000.0, 5_000.0, None)  # None: half capacity
    freshness_projects: tuple[int, ...] = (1, 64)
    freshness_seconds: float = 10.0  # measured seconds per cell of the sweep
    freshness_warmup: float = 1.0  # seconds of ingest before each cell's measurement
    freshness_body_bytes: int = 512
    freshness_pollers: int = 4
    freshness_producers: int = 4  # producer processes at most (one per 20,000 turns/s of a cell)
    freshness_idle_reads: int = 500  # first pages timed over HTTP on the idle serve after the sweep
    memory_sizes: tuple[int, ...] = (50_000, 150_000, 300_000)
    memory_body_bytes: int = 1024
    only: tuple[str, ...] = ()
    profile: str = "auto"  # py-spy profiles: "auto" (missed targets), "all", "none"
    workdir: Path = field(default_factory=lambda: REPO / ".cache" / "bench")
    report: Path = field(default_factory=lambda: REPO / "docs" / "benchmarks.md")
    argv: tuple[str, ...] = ()

    @classmethod
    def quick_config(cls) -> Config:
        """Small sizes, one repetition: a smoke run of every measurement (under two minutes)."""
        return cls(
            quick=True,
            repeat=1,
            turns=10_000,
            naive_max_records=1_000,
            naive_max_seconds=5.0,
            reader_sizes=(6_000, 60_000),
            reader_reads=50,
            ratio_repeat=1,
            freshness_rates=(100.0, 1_000.0),
            freshness_seconds=3.0,
            freshness_warmup=0.5,
            freshness_idle_reads=50,
            memory_sizes=(5_000, 20_000),
        )


# ------------------------------------------------------------------------------------------ results


@dataclass
class Figure:
    """One measured quantity: its samples (one per repetition) and how to print it."""

    name: str
    samples: list[float]
    unit: str
    fmt: str = "{:,.0f}"

    @property
    def median(self) -> float:
        """The median of the samples (what the report shows)."""
        return float(statistics.median(self.samples)) if self.samples else float("nan")

    def text(self) -> str:
        """The median, formatted, with the spread when there is more than one sample."""
        if not self.samples:
            return "n/a"
        value = self.fmt.format(self.median)
        if len(self.samples) > 1:
            lo, hi = min(self.samples), max(self.samples)
            value += f" ({self.fmt.format(lo)}..{self.fmt.format(hi)})"
        return value


@dataclass
class Target:
    """A goal from the issue: ``value`` compared with ``threshold``."""

    name: str
    value: float | None
    threshold: float
    higher_is_better: bool = True
    text: str = ""
    bottleneck: str = ""  # filled for a miss, from a profile

    @property
    def passed(self) -> bool | None:
        """True/False, or None when the figure was not measured."""
        if self.value is None or self.value != self.value:
            return None
        return self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold


@dataclass
class Section:
    """What one measurement module hands the report."""

    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # ready-made markdown tables
    profiles: list[str] = field(default_factory=list)  # markdown blocks from bench.profile
    seconds: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before / after


def wants_profile(cfg: Config, targets: Sequence[Target]) -> bool:
    """Profile when asked for all, or (auto) when one of ``targets`` missed."""
    if cfg.profile == "all":
        return True
    return cfg.profile == "auto" and any(t.passed is False for t in targets)


def loadavg() -> float:
    """The 1-minute load average (the machine is shared; every section records it)."""
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def median_interval(samples: Sequence[float], confidence: float = 0.9) -> tuple[float, float, float]:
    """A distribution-free confidence interval of the median: ``(lo, hi, coverage)``.

    For n sorted samples, ``(x_k, x_(n+1-k))`` holds the true median with probability
    ``1 - 2 * P(Binomial(n, 1/2) <= k - 1)`` whatever the distribution; this takes the narrowest such
    interval whose coverage is at least ``confidence``, or ``(min, max)`` with its (smaller) coverage when
    there are too few samples to reach it.
    """
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        return float("nan"), float("nan"), 0.0

    def coverage(k: int) -> float:
        tail = sum(math.comb(n, i) for i in range(k)) / 2**n
        return 1.0 - 2.0 * tail

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return float(ordered[k - 1]), float(ordered[n - k]), coverage(k)


def against_noise(samples: Sequence[float], threshold: float, higher_is_better: bool = True) -> str:
    """Whether repeated ratios tell a pass or a miss from the run's noise, in words for the report."""
    lo, hi, cov = median_interval(samples)
    n = len(samples)
    good = sum(1 for x in samples if (x >= threshold if higher_is_better else x <= threshold))
    head = f"median of {n} interleaved repetition{'s' if n != 1 else ''}, {good} of {n} on the target's side"
    if n < 2:
        return head + "; one repetition cannot tell noise from a miss"
    where = f"{cov:.0%} interval of the median {lo:.2f}..{hi:.2f}"
    if cov < 0.9:
        return f"{head}; {where}: too few repetitions to tell noise from a miss at 90%"
    passes = lo >= threshold if higher_is_better else hi <= threshold
    misses = hi < threshold if higher_is_better else lo > threshold
    verdict = "a clear pass" if passes else "a clear miss" if misses else "within the noise of the threshold"
    return f"{head}; {where}: {verdict}"


def log(message: str) -> None:
    """Progress on stderr, with a wall-clock stamp."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def new_topic_name(label: str) -> str:
    """A fresh topic name for one measurement."""
    return f"{TOPIC_PREFIX}{label}.{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------------ workload

_WORDS = (
    "the observer audits each completed turn of a thread and saves its cursor only after a whole series "
    "projection log offset chain digest kafka duckdb fold rewind snapshot delta page token through after "
    "host switched thread agent runtime answered tool call result summary plan step done"
).split()


def _body_pool(body_bytes: int, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool: list[str] = []
    for _ in range(count):
        words: list[str] = []
        size = 0
        while size < body_bytes:
            w = rng.choice(_WORDS)
            words.append(w)
            size += len(w) + 1
        pool.append(" ".join(words)[:body_bytes])
    return pool


@dataclass(frozen=True)
class Workload:
    """A deterministic stream of completed turns: ``projects`` projects with ``threads`` sources each.

    Turn ``i`` belongs to project ``i % projects``; a project's turns move to its next source every 16
    turns, so head switches happen as they do in real use. Bodies are ASCII text of ``body_bytes``.
    """

    turns: int
    body_bytes: int = 1024
    projects: int = 64
    threads: int = 4
    seed: int = 7
    label: str = "w"

    def project(self, k: int) -> str:
        """The name of project ``k``."""
        return f"/bench/{self.label}/project-{k:05d}"

    def source_of(self, i: int) -> int:
        """The source (``0 .. projects * threads - 1``) that completes turn ``i``."""
        k = i % self.projects
        return k * self.threads + (i // self.projects // 16) % self.threads

    def records(self, sources: Callable[[int], bool] | None = None) -> Iterator[TurnRecord]:
        """The turns, in log order, validated by ``build_turn``; only those of the sources ``sources``
        keeps, when given (the others are not built)."""
        pool = _body_pool(max(0, self.body_bytes - 16), 256, self.seed)
        names = [self.project(k) for k in range(self.projects)]
        for i in range(self.turns):
            k = i % self.projects
            source = (i // self.projects // 16) % self.threads
            if sources is not None and not sources(k * self.threads + source):
                continue
            yield build_turn(
                project=names[k],
                host=f"host-{source % 2}",
                thread=f"thread-{source // 2}",
                turn_id=f"turn-{i:010d}",
                completed_at_micros=BASE_MICROS + i * 1000,
                body=f"#{i:014d} " + pool[i % len(pool)],
                producer_name="bench",
                producer_version="1",
                produced_at_micros=BASE_MICROS + i * 1000,
            )


@dataclass
class Encoded:
    """A workload as topic records: key, value and partition of each, in log order."""

    keys: list[bytes]
    values: list[bytes]
    partitions: list[int]

    @property
    def count(self) -> int:
        """How many records."""
        return len(self.values)

    @property
    def value_bytes(self) -> int:
        """Total bytes of the values."""
        return sum(len(v) for v in self.values)


def encode_workload(workload: Workload, partitions: int) -> Encoded:
    """Encode every turn of ``workload`` (Avro single-object) with its key and partition."""
    keys: list[bytes] = []
    values: list[bytes] = []
    parts: list[int] = []
    part_of: dict[bytes, int] = {}
    for rec in workload.records():
        key = rec.project_sha256
        p = part_of.get(key)
        if p is None:
            p = part_of[key] = partition_for(key, partitions)
        keys.append(key)
        values.append(encode_turn(rec))
        parts.append(p)
    return Encoded(keys, values, parts)


# ------------------------------------------------------------------------------------------ the broker


@contextlib.contextmanager
def broker() -> Iterator[str]:
    """A real Kafka broker: ``THROUGHLINE_TEST_BOOTSTRAP_SERVERS`` when set, else one started here."""
    from throughline.testing.kafka import provision_kafka

    handle = provision_kafka(report=lambda m: log(f"kafka: {m}"))
    try:
        yield handle.bootstrap_servers
    finally:
        handle.close()


def kafka_version(bootstrap: str) -> str:
    """The broker's version as far as the client can tell (the harness runs 4.1.0)."""
    from throughline.testing.kafka import KAFKA_VERSION

    external = os.environ.get("THROUGHLINE_TEST_BOOTSTRAP_SERVERS", "").strip()
    if external:
        return f"external broker at {external} (harness version {KAFKA_VERSION})"
    return f"Apache Kafka {KAFKA_VERSION} (single KRaft node, harness `throughline.testing.kafka`)"


def create_topic(bootstrap: str, topic: str, partitions: int, *, log_append_time: bool = False) -> None:
    """Create the topic the way throughline does (``ensure_topic``: infinite retention, big records);
    with ``log_append_time``, records are stamped with the broker's clock as it appends them
    (``message.timestamp.type = LogAppendTime``: an acknowledgement's ``LogPosition.timestamp_ms``)."""
    ensure_topic(bootstrap, topic, partitions=partitions, timeout=30.0)
    if not log_append_time:
        return
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"message.timestamp.type": "LogAppendTime"})
        admin.alter_configs([resource])
    finally:
        admin.close()


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    """Delete benchmark topics (best effort: a failure only leaves disk used on a throwaway broker)."""
    if not topics:
        return
    from kafka.admin import KafkaAdminClient

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    except Exception as exc:
        log(f"could not delete topics: {exc}")
        return
    try:
        admin.delete_topics(list(topics), timeout_ms=30_000)
    except Exception as exc:
        log(f"could not delete topics: {exc}")
    finally:
        admin.close()


def bare_producer(bootstrap: str, **overrides: Any) -> KafkaProducer:
    """A kafka-python producer with ``TurnProducer``'s delivery settings (acks=all, idempotent)."""
    from throughline.producers.producer import LINGER_MS, batch_bytes

    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "enable_idempotence": True,
        "max_in_flight_requests_per_connection": 5,
        "linger_ms": LINGER_MS,
        # TurnProducer's batch size for the codec (a compressed batch holds more records)
        "batch_size": batch_bytes(overrides.get("compression_type")),
        "max_request_size": 1024 * 1024,
        "allow_auto_create_topics": False,
    }
    config.update(overrides)
    return KafkaProducer(**config)


def fill_topic(bootstrap: str, topic: str, data: Encoded, partitions: int) -> None:
    """Create ``topic`` and write ``data`` into it (a fast bare producer; not a measurement)."""
    create_topic(bootstrap, topic, partitions)
    producer = bare_producer(bootstrap)
    try:
        for key, value, part in zip(data.keys, data.values, data.partitions, strict=True):
            producer.send(topic, value=value, key=key, partition=part)
        producer.flush(timeout=300)
    finally:
        producer.close(timeout=30)
    ends = end_offsets(bootstrap, topic)
    if sum(ends.values()) != data.count:
        raise RuntimeError(f"topic {topic} holds {sum(ends.values())} records, expected {data.count}")


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The end offset of every partition of ``topic``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        return {tp.partition: int(o) for tp, o in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


# ------------------------------------------------------------------------------------------ timing


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn`` once; return (seconds, result)."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def human_count(n: int) -> str:
    """10000 -> '10k', 1000000 -> '1M'."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def parse_count(text: str) -> int:
    """'10k' -> 10000, '1M' -> 1000000, '2500' -> 2500."""
    t = text.strip().lower().replace("_", "")
    mult = 1
    if t.endswith("k"):
        mult, t = 1_000, t[:-1]
    elif t.endswith("m"):
        mult, t = 1_000_000, t[:-1]
    value = float(t) * mult
    if value < 1 or value != int(value):
        raise ValueError(f"not a count: {text!r}")
    return int(value)
