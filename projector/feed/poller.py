"""The poller: a ``Fetcher`` polls the topic's partitions and prepares each poll.

``Fetcher`` is the one thing that polls the log for the whole-topic projector; ``LocalFeed`` runs it on
the caller's thread, ``throughline.projector.feed.worker.WorkerFeed`` in a child process. Both answer
the ``Feed`` contract. ``FeedSpec`` is everything a fetcher needs; it crosses to the worker pickled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from throughline.log import FetchSettings, KafkaClientConfig, PartitionConsumer
from throughline.projector.prepare import PreparedBatch, prepare_batch
from throughline.runtime import BULK_GC_THRESHOLD, PROJECTOR_SWITCH_INTERVAL
from throughline.schemas import registry

DEFAULT_MAX_POLL_RECORDS = 10_000
#: A fetcher's first poll holds at most this many records, and each next one twice the last, up to
#: ``max_poll_records``: the projector's first commit then waits for one fetch and a small prepare,
#: not for a whole poll's, and the two processes overlap sooner (``Fetcher.fetch``).
FIRST_POLL_RECORDS = 1_000


@dataclass(frozen=True, slots=True)
class ProjectorOptions:
    """Tuning of the consume loop (the defaults suit both light and heavy load)."""

    max_poll_records: int = DEFAULT_MAX_POLL_RECORDS
    # A poll is one DuckDB transaction: under a backlog, 10k turns a commit cost ~10% less a turn
    # than 5k (the commit's fixed part, fewer frames). Live, a poll holds what has arrived, so the
    # size adds no latency. Fetches stay small (kafka-python reads 1-2 MB partition fetches 15-30%
    # faster than 8 MB ones) and a poll that is behind the log keeps fetching to fill up
    # (``fill_seconds``). Fetch sizes also bound what kafka-python buffers (the flat memory).
    fetch_max_bytes: int = 16 * 1024 * 1024
    max_partition_fetch_bytes: int = 2 * 1024 * 1024
    fetch_max_wait_ms: int = 100
    # How long a poll may keep fetching to fill up while the projector is far behind the log.
    fill_seconds: float = 0.2
    poll_timeout: float = 0.5
    check_interval: float = 5.0
    timeout: float = 15.0  # bound on connecting and on each broker request
    # Python's cyclic GC, at its default threshold (700 allocations), spent 25-35% of the apply time
    # walking the thousands of objects each poll creates; runs raise it (process-wide, restored after).
    gc_threshold: int | None = BULK_GC_THRESHOLD
    # The GIL switch interval while the run lasts (``prompt_gil_handoffs``; ``None``: Python's 5 ms).
    switch_interval: float | None = PROJECTOR_SWITCH_INTERVAL
    client_id: str = "throughline-projector"
    # Fetch, decode and check in a child process (``WorkerFeed``) while this one folds and writes.
    fetch_worker: bool = True
    # Stage each poll for readers in this process before its commit, and commit on a writer thread
    # (``throughline.projector.pipeline``): what ``serve`` runs; ``project`` and ``replay`` have no reader.
    stage_reads: bool = False
    # Staged, how often the writer commits at most (seconds): readers have each poll before its commit,
    # so commits need not follow every poll; fewer, larger ones leave the cores to the reads. Kafka
    # Streams commits exactly-once state every 100 ms by default (``commit.interval.ms``).
    commit_interval: float = 0.1

    def fetching(self) -> dict[str, Any]:
        """The settings of a fetching consumer (``PartitionConsumer``, ``GroupConsumer``) these options ask for."""
        return {
            "client_id": self.client_id,
            "timeout": self.timeout,
            "fetch": FetchSettings(
                max_poll_records=self.max_poll_records,
                fetch_max_bytes=self.fetch_max_bytes,
                max_partition_fetch_bytes=self.max_partition_fetch_bytes,
                fetch_max_wait_ms=self.fetch_max_wait_ms,
            ),
        }


def open_consumer(spec: FeedSpec) -> PartitionConsumer:
    """The projector's consumer of ``spec``'s topic: no group, no auto-commit, no offset reset,
    committed records only, its polls returning ``FetchedRecord``s (partition, offset, key, value)."""
    return PartitionConsumer(
        spec.servers, spec.topic, spec.partitions, kafka_config=spec.kafka_config, **spec.options.fetching()
    )


def prepare_poll(
    polled: Mapping[int, list[Any]],
    partitions: Iterable[int],
    *,
    topic_partitions: int,
    position: Callable[[int], int | None],
    next_offset: Callable[[int], int],
    defer_content: bool = False,
) -> list[PreparedBatch]:
    """One poll's records prepared, a batch a partition of ``partitions``, each ending at the consumer's
    ``position`` on its partition when that is past its last record (``next_offset(p)`` when it returned
    none): an offset-only batch when a partition returned no record but its position moved.

    Transaction markers and aborted records take offsets the consumer never returns; without this
    the applied offset would stay below the end offset, every first page of the partition's
    projects would wait for it, and ``--until-caught-up`` would never end. On every partition, not only
    in a poll that returned nothing: while other partitions are busy, a partition whose last offsets
    are markers would otherwise never reach its end.
    """
    batches = []
    for p in partitions:
        records = polled.get(p) or []
        end = records[-1].offset + 1 if records else next_offset(p)
        at = position(p)
        skipped = at if at is not None and at > end else None
        if records or skipped is not None:
            batches.append(
                prepare_batch(p, records, partitions=topic_partitions, next_offset=skipped, defer_content=defer_content)
            )
    return batches


@dataclass(frozen=True, slots=True)
class FeedSpec:
    """Everything a fetcher needs (it crosses to the worker process pickled)."""

    servers: tuple[str, ...]
    topic: str
    partitions: int
    start: tuple[tuple[int, int], ...]  # (partition, first offset to fetch)
    options: ProjectorOptions
    # How to connect; it crosses to the worker on its stdin pipe (never on a command line).
    kafka_config: KafkaClientConfig | None = None

    def at(self, offsets: Mapping[int, int]) -> FeedSpec:
        """This spec starting at ``offsets`` (partitions not named start at 0)."""
        return replace(self, start=tuple((p, int(offsets.get(p, 0))) for p in range(self.partitions)))


class Feed(Protocol):
    """A source of prepared batches, in log order per partition."""

    def next(self, timeout: float) -> list[PreparedBatch]:
        """The next poll's batches (one per partition), or ``[]`` when none came within ``timeout``.

        Raises the consumer's ``LogError``, or ``FetchWorkerError``.
        """
        ...

    def restart(self, offsets: Mapping[int, int]) -> None:
        """Fetch from ``offsets`` on (after an error; batches not yet returned are dropped)."""
        ...

    def close(self) -> None:
        """Release the consumer (and the worker process)."""
        ...


class Fetcher:
    """Polls the topic's partitions and prepares each poll (what both feeds run)."""

    def __init__(self, spec: FeedSpec, *, defer_content: bool = False) -> None:
        """``defer_content``: prepare with ``prepare_batch(defer_content=True)``, for a caller that runs
        ``check_content`` on each batch (the fetch worker's parent)."""
        self._spec = spec
        self._defer_content = defer_content
        # Registry-framed records resolve their schema ids through the registry the config names (in
        # this process: the fetch worker's own, or the projector's for a local feed).
        registry.install(spec.kafka_config.schema_registry if spec.kafka_config is not None else None)
        self._consumer = open_consumer(spec)
        try:
            self._next: dict[int, int] = {}
            self.seek(dict(spec.start))
        except BaseException:
            self._consumer.close()
            raise

    def seek(self, offsets: Mapping[int, int]) -> None:
        """Fetch from ``offsets`` on."""
        self._next = {p: int(offsets.get(p, 0)) for p in range(self._spec.partitions)}
        self._ramp = FIRST_POLL_RECORDS
        for p, offset in self._next.items():
            self._consumer.seek(p, offset)

    def fetch(self, timeout: float) -> list[PreparedBatch]:
        """One poll, prepared (``prepare_poll``: a batch's next offset is the consumer's position, past
        offsets that hold no record)."""
        o = self._spec.options
        limit = min(o.max_poll_records, self._ramp)
        polled: dict[int, list[Any]] = {}
        got = self._poll_into(polled, timeout, limit)
        # Far behind the log, keep polling until the poll is full: kafka-python reads small fetches
        # faster (its network thread competes for the GIL), and DuckDB commits large transactions
        # cheaper a record; this gives both. Only when the broker already holds the rest of the poll:
        # under steady ingest the records go at once (waiting for more would add latency, not speed).
        deadline = time.monotonic() + o.fill_seconds
        while 0 < got < limit and self._backlog() >= limit - got:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            got += self._poll_into(polled, left, limit - got)
        if got:
            self._ramp = min(o.max_poll_records, 2 * self._ramp)
        n = self._spec.partitions
        batches = prepare_poll(
            polled,
            range(n),
            topic_partitions=n,
            position=self._consumer.position,
            next_offset=self._next.__getitem__,
            defer_content=self._defer_content,
        )
        for b in batches:
            self._next[b.partition] = b.next_offset
        return batches

    def _backlog(self) -> int:
        """Records the broker holds past the positions (as its last fetch responses reported)."""
        backlog = 0
        for p in range(self._spec.partitions):
            highwater = self._consumer.highwater(p)
            if highwater is not None:
                backlog += max(0, highwater - (self._consumer.position(p) or 0))
        return backlog

    def _poll_into(self, polled: dict[int, list[Any]], timeout: float, max_records: int) -> int:
        """One consumer poll appended to ``polled`` (records by partition); how many records came."""
        got = 0
        for partition, records in self._consumer.poll(timeout, max_records).items():
            polled.setdefault(partition, []).extend(records)
            got += len(records)
        return got

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


class LocalFeed:
    """The ``Fetcher`` on the caller's thread."""

    def __init__(self, spec: FeedSpec) -> None:
        self._fetcher = Fetcher(spec)

    def next(self, timeout: float) -> list[PreparedBatch]:
        """See ``Feed.next``."""
        return self._fetcher.fetch(timeout)

    def restart(self, offsets: Mapping[int, int]) -> None:
        """See ``Feed.restart``."""
        self._fetcher.seek(offsets)

    def close(self) -> None:
        """See ``Feed.close``."""
        self._fetcher.close()
