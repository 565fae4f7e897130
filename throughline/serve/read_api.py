"""``ReadApi``: what the routes of ``throughline serve`` do, without HTTP (so it is tested directly too).

A read (``answer``) is one ``read_page`` over the projection and the log view, or, for the first page of
a series with ``wait`` > 0, a bounded long-poll that holds an empty answer until the project's chain
moves. ``readiness`` is the ``/readyz`` report (the projector's lag per partition), ``refresh_metrics``
the scrape hook of ``/metrics``. ``ApiSettings`` says how the API behaves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from throughline.core.exceptions import InvalidLimitError
from throughline.core.identity import project_sha256
from throughline.core.ports import LogView, Projection
from throughline.errors import ThroughlineError
from throughline.reader import page as reader_page
from throughline.reader.request import ReadRequest
from throughline.reader.wire import STATUS_OK, ObserverRead
from throughline.serve import DEFAULT_MAX_WAIT
from throughline.serve.exceptions import ForbiddenError, ServerBusyError
from throughline.serve.metrics import ServeMetrics

if TYPE_CHECKING:
    from throughline.log import TopicInfo
    from throughline.serve.group import GroupRouter
    from throughline.serve.tokens import Grant

#: A waiting request re-checks the stop flag at least this often, so shutdown never waits for a poll.
_WAIT_SLICE = 1.0
#: Upper bound on the rounds of one long-poll (each round consumes a projected record or a slice).
_MAX_WAIT_ROUNDS = 100_000

#: Describes the topic (its replication) for ``/readyz``; raises a ``ThroughlineError`` when it cannot.
Replication = Callable[[], "TopicInfo"]

#: ``read_page``'s shape: ``(request, *, projection, log, token_key, wait_timeout, body_limit)``.
ReadPage = Callable[..., ObserverRead]


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """How the API behaves; the defaults are what ``throughline serve`` uses."""

    auth_token: str | None = None
    read_wait: float = reader_page.DEFAULT_WAIT_TIMEOUT  # the reader's bounded wait for the projector
    body_limit: int = reader_page.DEFAULT_BODY_LIMIT  # bytes of a turn's body served before it is cut
    max_wait: float = DEFAULT_MAX_WAIT  # cap on a long-poll's ``wait``
    max_waiters: int = 64  # long-polls waiting at once; one more is answered 503 server_busy
    max_body_bytes: int = 64 * 1024  # a read's JSON body is a few KiB at most (4 KiB token, 1 KiB cursors)
    max_query_bytes: int = 16 * 1024
    ready_max_lag: int = 100  # records behind the log end, per partition, that still count as ready


ProjectorPhase = Literal["running", "retrying", "stopped", "failed", "off"]


class ProjectorState(Protocol):
    """What the API needs to know about the projector that fills the projection."""

    def phase(self) -> ProjectorPhase:
        """``running``; ``retrying`` (a retriable failure); ``stopped``; ``failed``; ``off`` (none runs)."""
        ...

    def error(self) -> ThroughlineError | None:
        """Why the projector failed (``failed``) or is being retried (``retrying``)."""
        ...


class AlwaysRunning:
    """The ``ProjectorState`` of an API without a projector of its own to report on (tests, tools)."""

    def phase(self) -> ProjectorPhase:
        return "running"

    def error(self) -> ThroughlineError | None:
        return None


@dataclass(eq=False, kw_only=True)
class ReadApi:
    """The request handling behind the routes (no HTTP in here, so it is tested directly too).

    Built once by the app from its collaborators: the projection and log view a read answers from,
    the token key, the settings and metrics, the projector's state, the stop flag, the page reader and,
    in ``--group``, the router that forwards what another member holds.
    """

    projection: Projection
    log: LogView
    token_key: bytes
    settings: ApiSettings
    metrics: ServeMetrics
    projector: ProjectorState
    stopping: threading.Event
    read_page: ReadPage
    router: GroupRouter | None = None
    replication: Replication | None = None
    _waiters: threading.BoundedSemaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._waiters = threading.BoundedSemaphore(max(1, self.settings.max_waiters))

    # -- reads

    def answer(self, request: ReadRequest) -> ObserverRead:
        """Answer one read (with its long-poll), counting it in the metrics."""
        spent = [0.0]
        try:
            result = self._answer(request, spent)
        except ThroughlineError as exc:
            self.metrics.reads.inc(status="error")
            self.metrics.read_errors.inc(code=exc.code)
            raise
        except Exception:
            self.metrics.reads.inc(status="error")
            self.metrics.read_errors.inc(code="internal_error")
            raise
        finally:
            self.metrics.read_latency.observe(spent[0])
        self.metrics.reads.inc(status=result.status)
        return result

    def parse(self, parse: Callable[[], ReadRequest]) -> ReadRequest:
        """``parse()`` (the wire into a ``ReadRequest``), counting a limit out of range as a refused read:
        it is the request's value refused, not its wire, as it was when the reader refused it."""
        try:
            return parse()
        except InvalidLimitError as exc:
            self.refused(exc)
            raise

    def permit(self, grant: Grant, request: ReadRequest) -> None:
        """Refuse (403, counted as a refused read) a read outside the token's scope, before any lookup,
        so that the answer says nothing of whether the project exists."""
        try:
            grant.require_project(request.project)
        except ForbiddenError as exc:
            self.refused(exc)
            raise

    def refused(self, error: ThroughlineError) -> None:
        """Count a read whose values were refused before it reached ``answer`` (a ``limit`` out of range)."""
        self.metrics.reads.inc(status="error")
        self.metrics.read_errors.inc(code=error.code)
        self.metrics.read_latency.observe(0.0)

    def _read_once(self, request: ReadRequest, spent: list[float]) -> ObserverRead:
        started = time.perf_counter()
        try:
            return self.read_page(
                request,
                projection=self.projection,
                log=self.log,
                token_key=self.token_key,
                wait_timeout=self.settings.read_wait,
                body_limit=self.settings.body_limit,
            )
        finally:
            spent[0] += time.perf_counter() - started

    def _answer(self, request: ReadRequest, spent: list[float]) -> ObserverRead:
        if request.wait <= 0 or not request.first_page:
            return self._read_once(request, spent)  # only the first page of a series can wait
        if not self._waiters.acquire(blocking=False):
            raise ServerBusyError(
                f"{self.settings.max_waiters} long-polls are already waiting; retry, or read without wait"
            )
        self.metrics.long_polls.inc(1)
        try:
            return self._long_poll(request, spent)
        finally:
            self.metrics.long_polls.inc(-1)
            self._waiters.release()

    def _long_poll(self, request: ReadRequest, spent: list[float]) -> ObserverRead:
        """Hold an empty answer until the project's chain moves past the after cursor (bounded).

        The project's change count is taken *before* each read, so a turn projected between the read
        and the wait wakes the wait at once instead of being missed; waking costs at most one extra
        read. Only the project's own commits wake it (``wait_project_changed``): other projects' turns
        on its partition cost the waiting request nothing.
        """
        deadline = time.monotonic() + request.wait
        project_hash = self._project_hash(request.project)
        seen = self.projection.project_changes(project_hash) if project_hash is not None else 0
        result = self._read_once(request, spent)
        for _ in range(_MAX_WAIT_ROUNDS):
            if project_hash is None or not self._idle(result, request) or self.stopping.is_set():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self.projection.wait_project_changed(project_hash, seen, min(remaining, _WAIT_SLICE)):
                seen = self.projection.project_changes(project_hash)
                result = self._read_once(request, spent)
        return result

    @staticmethod
    def _idle(result: ObserverRead, request: ReadRequest) -> bool:
        # Only the first page of a series can be an empty delta; a page of a pinned series never waits.
        return result.status == STATUS_OK and not result.turns and request.first_page

    def _project_hash(self, project: object) -> bytes | None:
        """The project's hash when the log can place it, else ``None``."""
        try:
            hashed = project_sha256(project)  # type: ignore[arg-type]
            self.log.partition_of(hashed)
        except ThroughlineError:
            return None  # the read itself reports the project's fault, in the reader's order of checks
        return hashed

    def _committed(self) -> dict[int, int] | None:
        """The offsets the projection file holds per partition (``None``: this projection cannot say apart)."""
        committed = self.projection.committed_offsets()
        return None if committed is None else dict(committed)

    # -- health

    def partition_count(self) -> int:
        """The topic's partition count, as the log view knows it."""
        return int(self.log.partitions)

    def offsets(self) -> tuple[dict[int, int], dict[int, int] | None, ThroughlineError | None]:
        """Applied offsets (how far reads answer: committed, or staged for readers before the commit), end
        offsets (``None`` when the log did not answer) and the log's error."""
        n = self.partition_count()
        readable = self.projection.readable_offsets()  # in memory: no snapshot needed
        applied = {p: int(readable.get(p, 0)) for p in range(n)}
        try:
            end = dict(self.log.end_offsets())
        except ThroughlineError as exc:
            return applied, None, exc
        return applied, end, None

    def _topic(self) -> tuple[TopicInfo | None, ThroughlineError | None]:
        """The topic's replication as described (``TopicWatch``: at most a few seconds old), or why not."""
        if self.replication is None:
            return None, None
        try:
            return self.replication(), None
        except ThroughlineError as exc:
            return None, exc

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether the service is ready to answer reads ``ok``, and the report ``/readyz`` prints.

        The topic's replication (leader, replicas, ISR per partition) is reported, never a reason to be
        not ready: an under-replicated partition still serves every read; it is the operator's alarm."""
        committed = self._committed()
        topic, topic_error = self._topic()
        applied, end, log_error = self.offsets()
        self.metrics.set_offsets(applied, end)
        phase = self.projector.phase()
        partitions = []
        total = 0
        worst = 0
        # A group member is behind only on what it holds: the rest is another member's to project.
        held = None if self.router is None else self.router.membership.held()
        for p in sorted(applied):
            lag = None if end is None else max(0, end.get(p, 0) - applied[p])
            if held is None or p in held:
                total += lag or 0
                worst = max(worst, lag or 0)
            entry: dict[str, Any] = {
                "partition": p,
                "appliedOffset": applied[p],
                "endOffset": None if end is None else end.get(p),
                "lag": lag,
            }
            if committed is not None:
                entry["committedOffset"] = committed.get(p, 0)
            if held is not None:
                entry["held"] = p in held
            if topic is not None:
                entry.update(topic.partition_json(p))
            partitions.append(entry)
        ready = (
            phase in ("running", "off")
            and end is not None
            and worst <= self.settings.ready_max_lag
            and not self.stopping.is_set()
            and (self.router is None or self.router.membership.view is not None)
        )
        report: dict[str, Any] = {
            "status": "ready" if ready else "not_ready",
            "projector": phase,
            "lag": None if end is None else total,
            "maxLag": self.settings.ready_max_lag,
            "partitions": partitions,
        }
        if self.router is not None:
            report["group"] = self.router.membership.report(applied, end)
        failure = self.projector.error()
        if failure is not None:
            report["projectorError"] = failure.to_json()["error"]
        if log_error is not None:
            report["logError"] = log_error.to_json()["error"]
        if topic is not None:
            report["replication"] = topic.replication_json()
        if topic_error is not None:
            report["replicationError"] = topic_error.to_json()["error"]
        if self.stopping.is_set():
            report["stopping"] = True
        return ready, report

    def refresh_metrics(self) -> None:
        """Scrape hook: per-partition offsets and lag, and whether the projector runs."""
        self.metrics.projector_up.set(1 if self.projector.phase() == "running" else 0)
        try:
            applied, end, log_error = self.offsets()
        except ThroughlineError:
            self.metrics.scrape_errors.inc()
            return
        if log_error is not None:
            self.metrics.scrape_errors.inc()
        self.metrics.set_offsets(applied, end)
        try:
            listing = self.projection.quarantine(times=False)
            if listing is not None:  # a projection that keeps no listing leaves the gauges as they are
                self.metrics.set_quarantine(listing)
        except Exception:  # a closing or failing projection must not fail the scrape
            self.metrics.scrape_errors.inc()
