"""The projector: consume the topic and apply it to the DuckDB projection, exactly once.

Correctness never depends on consumer-group offsets: the projector joins no group, ``assign``s every
partition of the topic and seeks each one to the offset the projection committed with its rows. Before
it reads, and every ``check_interval`` seconds while it runs (on a thread of its own, so that applying
never waits for the broker's answers: ``PeriodicCheck``), it compares the log with the projection:

- a partition whose end offset is below the applied offset, a topic id other than the recorded one,
  or a topic deleted under the running projector: ``LogRewoundError`` (two histories must not mix);
- a partition whose first offset is above the applied offset: ``LogTruncatedError`` (records the
  projection never applied are gone).

Records are polled in large batches (``max_poll_records``, large fetch sizes) and each poll is applied
as one transaction (``DuckProjection.apply_prepared``): under light load a poll returns as soon as a
record arrives, so batches are small and the lag stays small; under heavy load polls return full, so
the load is absorbed in large transactions.

Fetching, decoding and checking run in a fetch worker process (``throughline.projector.feed``) one
poll ahead of the calling thread, which folds and writes. The worker is stateless: it starts at the
applied offsets, and after a Kafka error or its own death it is started again from them. A writer
thread instead of a process was measured and dropped: on 2 cores it was 5-15% slower, because
DuckDB's Python binding keeps taking the GIL back while a statement runs. The calling thread keeps
its own consumer for the checks above (end and first offsets); it fetches nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from throughline.log import (
    KafkaClientConfig,
    KafkaLog,
    LogError,
    PositionOutOfRangeError,
    TopicInfo,
    bootstrap_list,
    describe_topic,
    resolve_kafka_config,
)
from throughline.log.exceptions import TopicMissingError
from throughline.projector.exceptions import (
    LogRewoundError,
    LogTruncatedError,
    PartitionCountChangedError,
)
from throughline.projector.feed import DEFAULT_MAX_POLL_RECORDS as DEFAULT_MAX_POLL_RECORDS
from throughline.projector.feed import (
    Feed,
    FeedSpec,
    FetchWorkerError,
    WorkerProcess,
    open_feed,
    spawn_worker,
)
from throughline.projector.feed import ProjectorOptions as ProjectorOptions
from throughline.projector.periodic_check import PeriodicCheck
from throughline.projector.pipeline import QUEUED_POLLS, DirectWriter, StagedWriter, StageGate, Writer
from throughline.projector.store import BatchSummary, DuckProjection
from throughline.projector.tally import Progress as Progress
from throughline.projector.tally import ProgressUpdate as ProgressUpdate
from throughline.projector.tally import Tally as Tally
from throughline.runtime import fewer_gc_passes, prompt_gil_handoffs
from throughline.schemas import registry

log = logging.getLogger(__name__)

_WORKER_RESTARTS = 3  # consecutive fetch worker failures without a batch before the run fails


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a run did."""

    summary: BatchSummary
    applied: Mapping[int, int]
    targets: Mapping[int, int] | None
    caught_up: bool
    seconds: float
    topic_id: str | None = None
    partitions: int = 0

    @property
    def rate(self) -> float:
        """Records applied per second."""
        return self.summary.records / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The summary as the CLI prints it."""
        s = self.summary
        return {
            "records": s.records,
            "turns": s.appended,
            "rewinds": s.rewinds,
            "duplicates": s.duplicates,
            "quarantined": s.quarantined,
            "seconds": round(self.seconds, 3),
            "recordsPerSecond": round(self.rate, 1),
            "caughtUp": self.caught_up,
            "applied": {str(p): o for p, o in sorted(self.applied.items())},
        }


class Projector:
    """Consumes the topic into a ``DuckProjection`` (in its own process, or as a thread of ``serve``)."""

    def __init__(
        self,
        projection: DuckProjection,
        bootstrap_servers: Sequence[str] | str,
        topic: str,
        *,
        options: ProjectorOptions | None = None,
        kafka_config: KafkaClientConfig | None = None,
    ) -> None:
        """A projector of ``topic`` into ``projection``; ``kafka_config``: how to connect (``None``:
        ``THROUGHLINE_KAFKA_CONFIG``, else PLAINTEXT), for every client of the run and its fetch worker."""
        self._projection = projection
        self._servers = bootstrap_list(bootstrap_servers)
        self._topic = topic
        self._options = options or ProjectorOptions()
        self._kafka_config = resolve_kafka_config() if kafka_config is None else kafka_config
        # Registry-framed records decode in this process too (the group member's polls, a local feed).
        registry.install(self._kafka_config.schema_registry)
        self._worker_failures = 0

    # -------------------------------------------------------------------------- checks

    def _describe(self) -> TopicInfo:
        return describe_topic(
            self._servers, self._topic, timeout=self._options.timeout, kafka_config=self._kafka_config
        )

    def _check_identity(self, info: TopicInfo) -> None:
        recorded = self._projection.topic_id
        if recorded is not None and info.topic_id is not None and recorded != info.topic_id:
            raise LogRewoundError(
                f"topic {self._topic!r} now has id {info.topic_id} but projection {self._projection.path} was built "
                f"from id {recorded}: the topic was deleted and recreated (or this is another cluster). "
                "Refusing to mix two histories; rebuild with `throughline replay --db NEW_FILE`"
            )
        recorded_n = self._projection.partitions
        if recorded_n is not None and recorded_n != info.partitions:
            raise PartitionCountChangedError(
                f"topic {self._topic!r} has {info.partitions} partitions but projection {self._projection.path} was "
                f"built with {recorded_n}: projects moved between partitions, so their order is lost. "
                "Never change a live topic's partition count",
            )

    def _check_offsets(self, log: KafkaLog) -> dict[int, int]:
        """Compare the log's offsets with the applied ones; return the end offsets.

        Safe beside a running projector (``PeriodicCheck``): the applied offsets compared with the end
        ones are read before them (what was applied then was below the end then, so below any end read
        later), and those compared with the first ones after them (a record deleted before it was
        applied stays unapplied).
        """
        applied_before = self._projection.applied_offsets()
        ends = log.end_offsets()
        begins = log.beginning_offsets()
        applied = self._projection.applied_offsets()
        for p in sorted(ends):
            done = applied.get(p, 0)
            if ends[p] < applied_before.get(p, 0):
                raise LogRewoundError(
                    f"partition {p} of topic {self._topic!r} ends at offset {ends[p]} but projection "
                    f"{self._projection.path} already applied up to offset {applied_before[p]}: the topic was deleted and "
                    "recreated, or this is another cluster. Refusing to mix two histories; rebuild with "
                    "`throughline replay --db NEW_FILE`"
                )
            if begins.get(p, 0) > done:
                raise LogTruncatedError(
                    f"partition {p} of topic {self._topic!r} now starts at offset {begins[p]} but projection "
                    f"{self._projection.path} applied only up to offset {done}: records it never applied were "
                    "deleted (retention?). The topic must keep every record (retention.ms=-1)"
                )
        return ends

    def _check_running(self, log: KafkaLog) -> dict[int, int]:
        try:
            info = self._describe()
        except TopicMissingError:
            raise LogRewoundError(
                f"topic {self._topic!r} was deleted under the running projector (projection "
                f"{self._projection.path}, applied offsets {self._projection.applied_offsets()}); a topic created "
                "under that name later is another log. Rebuild with `throughline replay --db NEW_FILE`"
            ) from None
        self._check_identity(info)
        return self._check_offsets(log)

    # -------------------------------------------------------------------------- the loop

    def _log_view(self) -> KafkaLog:
        """The run's own view of the log: end and first offsets for the checks (the feed fetches)."""
        o = self._options
        return KafkaLog(
            self._servers, self._topic, timeout=o.timeout, client_id=o.client_id, kafka_config=self._kafka_config
        )

    def _open_checked(self, info: TopicInfo | None = None) -> tuple[TopicInfo, KafkaLog, dict[int, int]]:
        """Check that the topic (``info``: as described already) is the projection's log (identity,
        offsets) and bind the projection to it: the topic, the run's log view (open; the caller closes
        it) and the end offsets."""
        info = self._describe() if info is None else info
        self._check_identity(info)
        if info.lossy_reasons:
            log.warning("topic %r may lose records: %s", self._topic, "; ".join(info.lossy_reasons))
        if info.replication_reasons:  # the projector reads whatever the topic holds; the producers refuse
            log.warning("topic %r could lose acknowledged turns: %s", self._topic, "; ".join(info.replication_reasons))
        log_view = self._log_view()
        try:
            ends = self._check_offsets(log_view)
            self._projection.bind_log(self._topic, info.topic_id, info.partitions)
        except BaseException:
            log_view.close()
            raise
        return info, log_view, ends

    def _summary(
        self, tally: Tally, targets: Mapping[int, int] | None, caught_up: bool, started: float, info: TopicInfo
    ) -> RunSummary:
        return RunSummary(
            tally.total,
            self._projection.applied_offsets(),
            targets,
            caught_up,
            time.monotonic() - started,
            info.topic_id,
            info.partitions,
        )

    def run(
        self,
        *,
        until_caught_up: bool = False,
        stop: threading.Event | None = None,
        progress: Progress | None = None,
        commit_queued: threading.Event | None = None,
        released: threading.Event | None = None,
        running: threading.Event | None = None,
        gate: StageGate | None = None,
        worker: WorkerProcess | None = None,
        staging: threading.Event | None = None,
    ) -> RunSummary:
        """Consume and apply until ``stop`` is set (or, with ``until_caught_up``, until every partition's
        applied offset reaches the end offset it had when the run started).

        ``commit_queued`` set when the run ends on ``stop``: what was staged for readers is committed
        before the run returns instead of dropped (``serve`` pausing its projector for a switch of
        files: readers must never see the readable offsets go back); set while it runs, each poll is
        committed as soon as it is staged rather than after ``commit_interval`` (its last polls, as it
        stops). For ``serve``'s switch of files: once ``gate`` (``StageGate``) is closed
        the run makes nothing more readable (it drops what it is handed: it is stopping), whether or not
        its loop noticed its ``stop`` yet; ``running`` is set once it checked the log and opened its
        feed, as its loop begins; ``released`` once it touches the projection no more (its writer
        stopped, DuckDB's thread limit restored), before it closes its feed and log clients.

        Raises ``LogRewoundError``/``LogTruncatedError`` when the log is not the projection's log,
        ``TopicMissingError`` when the topic does not exist at start, ``BrokerUnavailableError`` when no
        broker answers. ``worker``: a fetch worker started ahead for this run (``spawn_worker_ahead``),
        which the run owns from here. With ``stage_reads``, ``staging`` clear: each poll is committed as it
        comes, not staged (nobody reads the projection yet), until it is set.
        """
        started = time.monotonic()
        stop = stop or threading.Event()
        # Started first: its imports overlap the checks below instead of delaying the first batch.
        if worker is None and self._options.fetch_worker:
            worker = spawn_worker()
        log_view: KafkaLog | None = None
        feed: Feed | None = None
        threads: int | None = None
        try:
            info, log_view, ends = self._open_checked()
            applied = self._projection.applied_offsets()
            start_offsets = {p: applied.get(p, 0) for p in range(info.partitions)}
            spec = FeedSpec(
                tuple(self._servers), self._topic, info.partitions, (), self._options, self._kafka_config
            ).at(start_offsets)
            feed, worker = open_feed(spec, worker), None
            self._projection.fetching_from(start_offsets)
            if self._options.fetch_worker:  # one core is the worker's while this run lasts
                threads = self._projection.limit_threads((os.cpu_count() or 2) - 1)
            targets = dict(ends) if until_caught_up else None
            tally = Tally(self._projection, progress, targets, start_offsets, started)
            writer = self._writer(tally, commit_queued, gate, staging)
            log.info(
                "projecting topic %s (id %s, %d partitions) from %s",
                self._topic,
                info.topic_id,
                info.partitions,
                start_offsets,
            )
            if running is not None:
                running.set()
            try:
                with fewer_gc_passes(self._options.gc_threshold), prompt_gil_handoffs(self._options.switch_interval):
                    caught_up = self._loop(log_view, feed, writer, stop, targets)
                if commit_queued is not None and commit_queued.is_set():
                    writer.drain()
            finally:
                writer.close()
                self._release(threads, released)
                threads = None
        finally:
            self._release(threads, released)
            if worker is not None:  # the checks failed before the feed took it
                worker.stop()
            if feed is not None:
                feed.close()
            if log_view is not None:
                log_view.close()
        return self._summary(tally, targets, caught_up, started, info)

    def _release(self, threads: int | None, released: threading.Event | None) -> None:
        """Leave the projection alone from here: DuckDB's thread limit restored (``threads``: as it was),
        then ``released`` set."""
        if threads is not None:
            # Best effort: a projection that just failed must not hide the run's own error.
            with contextlib.suppress(Exception):
                self._projection.limit_threads(threads)
        if released is not None:
            released.set()

    def _caught_up(self, targets: Mapping[int, int] | None) -> bool:
        if targets is None:
            return False
        applied = self._projection.applied_offsets()
        return all(applied.get(p, 0) >= end for p, end in targets.items())

    def _loop(
        self,
        log_view: KafkaLog,
        feed: Feed,
        writer: Writer,
        stop: threading.Event,
        targets: Mapping[int, int] | None,
    ) -> bool:
        o = self._options
        with PeriodicCheck(lambda: self._check_running(log_view), o.check_interval) as check:
            while not stop.is_set():
                if targets is not None and self._caught_up(targets):
                    return True
                self._turn(log_view, feed, writer, stop, check)
        return self._caught_up(targets)

    def _turn(
        self,
        log_view: KafkaLog,
        feed: Feed,
        writer: Writer,
        stop: threading.Event,
        check: PeriodicCheck,
    ) -> None:
        """One turn of the loop: the periodic check's verdict, one fetch, its transaction (or, staged,
        its layer and its place in the writer's queue)."""
        o = self._options
        writer.raise_pending()
        try:
            check.raise_pending()
            batches = feed.next(o.poll_timeout)
        except LogError as exc:
            self._explain(log_view, exc, stop)
            self._restart(feed, writer)
            return
        except FetchWorkerError as exc:
            # The worker died (killed, out of memory): the log decides whether that was the log's
            # fault; otherwise start it again, at most a few times in a row.
            self._check_running(log_view)
            self._worker_failures += 1
            if self._worker_failures > _WORKER_RESTARTS:
                raise
            log.warning("restarting the fetch worker: %s", exc)
            self._restart(feed, writer)
            return
        if batches:
            self._worker_failures = 0
            # Readers may now answer for projects none of these records belong to (``wait_settled``).
            self._projection.fetched(batches)
            writer.apply(batches)

    def _writer(
        self,
        tally: Tally,
        prompt: threading.Event | None = None,
        gate: StageGate | None = None,
        staging: threading.Event | None = None,
    ) -> Writer:
        """Who commits the run's polls: on this thread as they come, or staged for readers first while
        ``staging`` is set (each as soon as it is queued while ``prompt`` is set); none once ``gate``
        closed."""
        o = self._options
        if o.stage_reads:
            return StagedWriter(
                self._projection,
                self._topic,
                tally,
                max_queued_records=QUEUED_POLLS * o.max_poll_records,
                commit_interval=o.commit_interval,
                prompt=prompt,
                gate=gate,
                staging=staging,
            )
        return DirectWriter(self._topic, tally, gate)

    def _restart(self, feed: Feed, writer: Writer) -> None:
        """Fetch again from the applied offsets, once what was fetched before is committed."""
        writer.drain()
        applied = self._projection.applied_offsets()
        partitions = self._projection.partitions or 0
        self._projection.fetching_from({p: applied.get(p, 0) for p in range(partitions)})
        feed.restart(applied)

    #: Who holds the position in the errors ``_explain`` raises.
    _role = "projector"

    def _explain(self, log_view: KafkaLog, exc: LogError, stop: threading.Event) -> None:
        """Turn a Kafka error of the consume loop into the projector's verdict (or wait a moment and
        return, for a retry, when it is transient).

        The log is checked first: a deleted or recreated topic, or one that now ends below the applied
        offsets, is ``LogRewoundError`` whatever the consumer reported (an out-of-range position, a
        truncation, an unknown partition).
        """
        self._check_running(log_view)
        if isinstance(exc, PositionOutOfRangeError):
            raise LogTruncatedError(
                f"the log refused the {self._role}'s position on topic {self._topic!r} ({exc}); applied offsets "
                f"{self._projection.applied_offsets()}"
            ) from exc
        if exc.retriable:
            log.warning("retrying after a Kafka error: %s: %s", exc.code, exc.message)
            stop.wait(min(1.0, self._options.poll_timeout))
            return
        raise exc
