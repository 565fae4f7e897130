"""The HTTP read API of ``throughline serve``: a FastAPI application over a projection and a log view.

``create_app`` takes the same handles as ``read_observer_turn_page`` (a ``Projection``, a ``LogView``,
the page-token key) plus ``ApiSettings``; the service (``throughline.serve.service``) hands it the live
DuckDB projection that its projector thread writes, and unit tests hand it the in-memory adapters.

Endpoints (docs/http.md is the reference):

- ``GET /v1/projects/read`` (query parameters) and ``POST /v1/projects/read`` (a JSON object): one page
  of a read series, the ``throughline.observer_read.v1`` document, with an optional long-poll ``wait``;
- ``GET /healthz`` (liveness), ``GET /readyz`` (readiness: projector lag per partition);
- ``GET /metrics`` (Prometheus text format), ``GET /openapi.json``.

Hard input errors are 400 with the CLI's stable codes; ``projection_pending`` and ``resync_required``
are 200 answers. No response ever carries a stack trace.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from throughline.core.identity import project_sha256
from throughline.core.ports import LogView, Projection
from throughline.core.seconds import finite_seconds
from throughline.errors import InputError, ThroughlineError
from throughline.reader import page as reader_page
from throughline.reader.exceptions import InvalidWaitError, SourceQuarantinedError
from throughline.reader.wire import STATUS_OK, ObserverRead
from throughline.serve import DEFAULT_MAX_WAIT, READ_PATH, REASON_HEADER
from throughline.serve.auth import BearerAuth
from throughline.serve.exceptions import (
    InvalidRequestError,
    RequestTooLargeError,
    ServerBusyError,
    UnauthorizedError,
)
from throughline.serve.metrics import CONTENT_TYPE, ServeMetrics

if TYPE_CHECKING:
    from throughline.serve.group import GroupRouter

_log = logging.getLogger("throughline.serve")

#: A waiting request re-checks the stop flag at least this often, so shutdown never waits for a poll.
_WAIT_SLICE = 1.0
#: Upper bound on the rounds of one long-poll (each round consumes a projected record or a slice).
_MAX_WAIT_ROUNDS = 100_000
_INTEGER = re.compile(r"^[+-]?[0-9]{1,20}\Z")
_SECONDS = re.compile(r"^[0-9]{1,6}(\.[0-9]{1,9})?\Z")

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


class ErrorBody(BaseModel):
    """An error: a stable machine-readable code and a message for a person."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str = Field(description="stable error code (the CLI prints the same codes)")
    message: str


class ErrorDocument(BaseModel):
    """Every non-2xx answer of the API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    error: ErrorBody


class ReadRequest(BaseModel):
    """The JSON body of ``POST /v1/projects/read`` (documentation of the shape; parsing is stricter)."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="ReadRequest")

    project: str = Field(description="the project (its canonical form is hashed; never echoed back)")
    afterCursor: str | None = Field(default=None, description="what the Observer already audited; null on first contact")
    throughCursor: str | None = Field(default=None, description="the series' pinned upper bound (later pages)")
    pageToken: str | None = Field(default=None, description="the previous page's page.nextToken")
    limit: int | None = Field(default=10, ge=1, le=100, description="turns per page, 1..100")
    wait: float | None = Field(
        default=0, ge=0, description=f"long-poll: seconds to hold an empty answer for new turns (capped at {DEFAULT_MAX_WAIT:g})"
    )


@dataclass(frozen=True, slots=True)
class ReadParams:
    """One read request, its values still as the client sent them (the reader validates them)."""

    project: object
    after_cursor: object = None
    through_cursor: object = None
    page_token: object = None
    limit: object = None
    wait: float = 0.0


ProjectorPhase = Literal["running", "retrying", "stopped", "failed", "off"]


class ProjectorState(Protocol):
    """What the API needs to know about the projector that fills the projection."""

    def phase(self) -> ProjectorPhase:
        """``running``; ``retrying`` (a retriable failure); ``stopped``; ``failed``; ``off`` (none runs)."""
        ...

    def error(self) -> ThroughlineError | None:
        """Why the projector failed (``failed``) or is being retried (``retrying``)."""
        ...


class _AlwaysRunning:
    def phase(self) -> ProjectorPhase:
        return "running"

    def error(self) -> ThroughlineError | None:
        return None


# ------------------------------------------------------------------------------------------ parsing

_FIELD_OF = {
    "project": "project",
    "afterCursor": "after_cursor",
    "after": "after_cursor",
    "throughCursor": "through_cursor",
    "through": "through_cursor",
    "pageToken": "page_token",
    "limit": "limit",
    "wait": "wait",
}


def _quoted(name: str) -> str:
    return repr(name if len(name) <= 64 else name[:64] + "...")


def _collect(pairs: Iterable[tuple[str, object]]) -> dict[str, object]:
    # Unknown names are refused, not ignored: a misspelt ``afterCursor`` silently read as first contact
    # would hand the Observer a snapshot instead of the delta it asked for.
    out: dict[str, object] = {}
    for name, value in pairs:
        field = _FIELD_OF.get(name)
        if field is None:
            raise InvalidRequestError(
                f"unknown parameter {_quoted(name)}; expected project, afterCursor, throughCursor, pageToken, "
                "limit, wait"
            )
        if field in out:
            raise InvalidRequestError(f"parameter {_quoted(name)} is given more than once")
        out[field] = value
    return out


def _params(values: Mapping[str, object], wait: float) -> ReadParams:
    if values.get("project") is None:
        raise InvalidRequestError("project is required")
    return ReadParams(
        project=values["project"],
        after_cursor=values.get("after_cursor"),
        through_cursor=values.get("through_cursor"),
        page_token=values.get("page_token"),
        limit=values.get("limit"),
        wait=wait,
    )


def params_from_query(pairs: Iterable[tuple[str, str]], *, max_wait: float = DEFAULT_MAX_WAIT) -> ReadParams:
    """A read request from query parameters (strings): ``limit`` and ``wait`` are parsed as numbers."""
    values = _collect(pairs)
    limit = values.get("limit")
    if isinstance(limit, str) and _INTEGER.match(limit):
        values["limit"] = int(limit)  # anything else stays a string, which validate_limit refuses
    wait = 0.0
    raw_wait = values.get("wait")
    if raw_wait is not None:
        if not isinstance(raw_wait, str) or not _SECONDS.match(raw_wait):
            raise InvalidWaitError(f"wait must be a number of seconds >= 0, got {_quoted(str(raw_wait))}")
        wait = min(float(raw_wait), max_wait)  # a longer wait is clamped, not refused
    return _params(values, wait)


def params_from_json(body: bytes, *, max_wait: float = DEFAULT_MAX_WAIT) -> ReadParams:
    """A read request from a JSON object; values keep their JSON types (the reader checks them)."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # a deeply nested body is bad input, not a crash
        raise InvalidRequestError("the request body is not JSON") from None
    if not isinstance(document, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    values = _collect(document.items())
    wait = 0.0
    raw_wait = values.get("wait")
    if raw_wait is not None:
        seconds = None if isinstance(raw_wait, str) else finite_seconds(raw_wait)  # JSON: a number, not text
        if seconds is None:
            raise InvalidWaitError(f"wait must be a number of seconds >= 0, got {raw_wait!r}")
        wait = min(seconds, max_wait)  # a longer wait is clamped, not refused
    return _params(values, wait)


# ------------------------------------------------------------------------------------------ errors


def http_status(error: ThroughlineError) -> int:
    """The HTTP status an error is answered with."""
    if isinstance(error, RequestTooLargeError):
        return getattr(error, "http_status", 413)
    if isinstance(error, UnauthorizedError):
        return 401
    if isinstance(error, InputError):
        return 400
    if isinstance(error, SourceQuarantinedError):
        return 409  # the request is fine; the source's state forbids serving it until an operator acts
    if error.retriable:
        return 503
    return 500


def error_response(error: ThroughlineError, status: int | None = None) -> JSONResponse:
    """The JSON answer of an error (no stack trace, ever)."""
    code = status or http_status(error)
    headers = {"Cache-Control": "no-store"}
    if code == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="throughline"'
    if code == 503:
        headers["Retry-After"] = "1"
    return JSONResponse(error.to_json(), status_code=code, headers=headers)


def _header_text(text: str, limit: int = 512) -> str:
    cleaned = "".join(ch if " " <= ch <= "~" else "?" for ch in text)
    return cleaned[:limit]


def _too_large(message: str, status: int) -> RequestTooLargeError:
    error = RequestTooLargeError(message)
    error.http_status = status  # type: ignore[attr-defined]
    return error


# ------------------------------------------------------------------------------------------ middleware


class _Edge:
    """Refuses oversized requests before routing and counts every answer by route and status code."""

    def __init__(self, app: ASGIApp, *, settings: ApiSettings, metrics: ServeMetrics) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        refusal = self._refusal(scope)
        try:
            if refusal is not None:
                await error_response(refusal)(scope, receive, tracking_send)
            else:
                await self.app(scope, receive, tracking_send)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", None) or "unmatched"
            self.metrics.http_requests.inc(route=name, code=status["code"])

    def _refusal(self, scope: Scope) -> ThroughlineError | None:
        if len(scope.get("query_string", b"")) > self.settings.max_query_bytes:
            return _too_large(f"the query string is larger than {self.settings.max_query_bytes} bytes", 414)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                if not value.isdigit():
                    return InvalidRequestError("Content-Length is not a number")
                if int(value) > self.settings.max_body_bytes:
                    return _too_large(f"the request body is larger than {self.settings.max_body_bytes} bytes", 413)
        return None


# ------------------------------------------------------------------------------------------ the API


class ReadApi:
    """The request handling behind the routes (no HTTP in here, so it is tested directly too)."""

    def __init__(
        self,
        *,
        projection: Projection,
        log: LogView,
        token_key: bytes,
        settings: ApiSettings,
        metrics: ServeMetrics,
        projector: ProjectorState,
        stopping: threading.Event,
        read_page: ReadPage,
        router: GroupRouter | None = None,
    ) -> None:
        self.projection = projection
        self.router = router
        self.log = log
        self.token_key = token_key
        self.settings = settings
        self.metrics = metrics
        self.projector = projector
        self.stopping = stopping
        self.read_page = read_page
        self._waiters = threading.BoundedSemaphore(max(1, settings.max_waiters))

    # -- reads

    def answer(self, params: ReadParams) -> ObserverRead:
        """Answer one read (with its long-poll), counting it in the metrics."""
        spent = [0.0]
        try:
            result = self._answer(params, spent)
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

    def _read_once(self, params: ReadParams, spent: list[float]) -> ObserverRead:
        started = time.perf_counter()
        try:
            return self.read_page(
                project=params.project,
                after_cursor=params.after_cursor,
                through_cursor=params.through_cursor,
                page_token=params.page_token,
                limit=params.limit,
                projection=self.projection,
                log=self.log,
                token_key=self.token_key,
                wait_timeout=self.settings.read_wait,
                body_limit=self.settings.body_limit,
            )
        finally:
            spent[0] += time.perf_counter() - started

    def _answer(self, params: ReadParams, spent: list[float]) -> ObserverRead:
        if params.wait <= 0 or params.through_cursor is not None or params.page_token is not None:
            return self._read_once(params, spent)  # only the first page of a series can wait
        if not self._waiters.acquire(blocking=False):
            raise ServerBusyError(
                f"{self.settings.max_waiters} long-polls are already waiting; retry, or read without wait"
            )
        self.metrics.long_polls.inc(1)
        try:
            return self._long_poll(params, spent)
        finally:
            self.metrics.long_polls.inc(-1)
            self._waiters.release()

    def _long_poll(self, params: ReadParams, spent: list[float]) -> ObserverRead:
        """Hold an empty answer until the project's chain moves past the after cursor (bounded).

        The project's change count is taken *before* each read, so a turn projected between the read
        and the wait wakes the wait at once instead of being missed; waking costs at most one extra
        read. Only the project's own commits wake it (``wait_project_changed``): other projects' turns
        on its partition cost the waiting request nothing.
        """
        deadline = time.monotonic() + params.wait
        project = self._project_of(params.project)
        seen = self.projection.project_changes(project) if project is not None else 0
        result = self._read_once(params, spent)
        for _ in range(_MAX_WAIT_ROUNDS):
            if project is None or not self._idle(result, params) or self.stopping.is_set():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self.projection.wait_project_changed(project, seen, min(remaining, _WAIT_SLICE)):
                seen = self.projection.project_changes(project)
                result = self._read_once(params, spent)
        return result

    @staticmethod
    def _idle(result: ObserverRead, params: ReadParams) -> bool:
        # Only the first page of a series can be an empty delta; a page of a pinned series never waits.
        return (
            result.status == STATUS_OK
            and not result.turns
            and params.through_cursor is None
            and params.page_token is None
        )

    def _project_of(self, project: object) -> bytes | None:
        """The project's hash when the log can place it, else ``None``."""
        try:
            hashed = project_sha256(project)  # type: ignore[arg-type]
            self.log.partition_of(hashed)
        except ThroughlineError:
            return None  # the read itself reports the project's fault, in the reader's order of checks
        return hashed

    def _applied(self, partition: int) -> int:
        committed = getattr(self.projection, "applied_offsets", None)
        if callable(committed):  # DuckProjection keeps them in memory: no snapshot needed
            return int(committed().get(partition, 0))
        with self.projection.view() as view:
            return view.applied_offset(partition)

    # -- health

    def partition_count(self) -> int:
        """The topic's partition count, as the log view knows it."""
        count = getattr(self.log, "partitions", 1)
        return int(count() if callable(count) else count)

    def offsets(self) -> tuple[dict[int, int], dict[int, int] | None, ThroughlineError | None]:
        """Applied offsets, end offsets (``None`` when the log did not answer) and the log's error."""
        n = self.partition_count()
        applied = {p: self._applied(p) for p in range(n)}
        try:
            bulk = getattr(self.log, "end_offsets", None)
            end = dict(bulk()) if callable(bulk) else {p: self.log.end_offset(p) for p in range(n)}
        except ThroughlineError as exc:
            return applied, None, exc
        return applied, end, None

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether the service is ready to answer reads ``ok``, and the report ``/readyz`` prints."""
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
            if held is not None:
                entry["held"] = p in held
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
        listing_of = getattr(self.projection, "quarantine", None)  # the DuckDB projection has it
        if listing_of is not None:
            try:
                self.metrics.set_quarantine(listing_of(times=False))
            except Exception:  # a closing or failing projection must not fail the scrape
                self.metrics.scrape_errors.inc()


def _package_version() -> str:
    try:
        return version("throughline")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout without an install
        return "0"


_READ_DESCRIPTION = (
    "One page of an Observer read series: the `throughline.observer_read.v1` document, exactly as "
    "`read_observer_turn_page` and `throughline read` return it. `projection_pending` and "
    "`resync_required` are 200 answers; hard input errors are 400 with a stable code. With `wait` > 0, "
    "an empty first page (an empty delta, or a project without turns) is held until the project's "
    "chain moves past the after cursor, at most `wait` seconds."
)

_QUERY_PARAMETERS: list[dict[str, Any]] = [
    {"name": "project", "in": "query", "required": True, "schema": {"type": "string"},
     "description": "the project name (canonicalised and hashed; never echoed back)"},
    {"name": "afterCursor", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "what the Observer already audited; omit on first contact (alias: `after`)"},
    {"name": "throughCursor", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "the pinned through cursor of the series, on its later pages (alias: `through`)"},
    {"name": "pageToken", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "`page.nextToken` of the previous page (needs the same afterCursor and throughCursor)"},
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
     "description": "turns per page"},
    {"name": "wait", "in": "query", "required": False,
     "schema": {"type": "number", "minimum": 0, "default": 0},
     "description": f"long-poll seconds (capped at {DEFAULT_MAX_WAIT:g} by default)"},
    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}, "deprecated": False,
     "description": "short alias of `afterCursor` (give one or the other)"},
    {"name": "through", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "short alias of `throughCursor` (give one or the other)"},
]

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorDocument, "description": "hard input error (invalid_limit, invalid_cursor, page_token_*, ...)"},
    401: {"model": ErrorDocument, "description": "missing or wrong bearer token (when authentication is on)"},
    409: {"model": ErrorDocument, "description": "source_quarantined: the series' source has a quarantined record"},
    413: {"model": ErrorDocument, "description": "request body too large"},
    414: {"model": ErrorDocument, "description": "query string too large"},
    500: {"model": ErrorDocument, "description": "internal failure (no stack trace is returned)"},
    503: {"model": ErrorDocument, "description": "retriable: broker unavailable, projection busy, server_busy"},
}


def create_app(
    *,
    projection: Projection,
    log: LogView,
    token_key: bytes,
    settings: ApiSettings | None = None,
    metrics: ServeMetrics | None = None,
    projector: ProjectorState | None = None,
    stopping: threading.Event | None = None,
    read_page: ReadPage | None = None,
    router: GroupRouter | None = None,
) -> FastAPI:
    """The FastAPI application of ``throughline serve``.

    ``projector`` reports whether the projector that fills ``projection`` runs (readiness);
    ``stopping`` is set on shutdown so that long-polls return at once. ``read_page`` defaults to
    ``throughline.reader.read_observer_turn_page``. ``router``: a ``serve --group`` member's
    (``throughline.serve.group``): reads of partitions it does not answer itself are forwarded.
    """
    settings = settings or ApiSettings()
    metrics = metrics or ServeMetrics()
    api = ReadApi(
        projection=projection,
        log=log,
        token_key=token_key,
        settings=settings,
        metrics=metrics,
        projector=projector or _AlwaysRunning(),
        stopping=stopping or threading.Event(),
        read_page=read_page or reader_page.read_observer_turn_page,
        router=router,
    )
    metrics.registry.on_scrape(api.refresh_metrics)
    auth = BearerAuth(settings.auth_token)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Each waiting long-poll holds a worker thread; leave room for everything else beside them.
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, settings.max_waiters + 32)
        yield

    app = FastAPI(
        title="throughline",
        version=_package_version(),
        summary="Completed agent turns, projected from a Kafka log into DuckDB, read by an auditing Observer.",
        description="The read API of `throughline serve`. Reference: docs/http.md.",
        docs_url=None,  # the interactive pages load third-party scripts; the OpenAPI document is enough
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.api = api
    app.add_middleware(_Edge, settings=settings, metrics=metrics)

    def require_token(request: Request) -> None:
        auth.check(request.headers.get("authorization"))

    @app.exception_handler(ThroughlineError)
    async def _throughline_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ThroughlineError)
        if http_status(exc) >= 500:
            _log.warning("read failed: %s (%s)", exc.code, exc.message)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(InvalidRequestError("the request does not match the API"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        codes = {404: "not_found", 405: "method_not_allowed"}
        code = codes.get(exc.status_code, "http_error")
        message = {404: "no such endpoint", 405: "method not allowed on this endpoint"}.get(
            exc.status_code, str(exc.detail)
        )
        return JSONResponse(
            {"error": {"code": code, "message": message}},
            status_code=exc.status_code,
            headers=dict(exc.headers or {}),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        _log.error("unexpected failure answering a request", exc_info=exc)
        return JSONResponse(
            {"error": {"code": "internal_error", "message": "internal error; the server log has the details"}},
            status_code=500,
        )

    def _read_response(result: ObserverRead) -> Response:
        headers = {"Cache-Control": "no-store"}
        if result.reason:
            # The wire document carries only the ADR's fields; the reason for a person rides in a header.
            headers[REASON_HEADER] = _header_text(result.reason)
        return Response(content=result.to_json(), media_type="application/json", headers=headers)

    async def _read_or_forward(request: Request, params: ReadParams, body: bytes | None) -> Response:
        if api.router is not None:
            target = READ_PATH + (f"?{request.url.query}" if request.url.query else "")
            try:
                forwarded = await run_in_threadpool(
                    lambda: api.router.route(  # type: ignore[union-attr]
                        params.project,
                        wait=params.wait,
                        method=request.method,
                        target=target,
                        body=body,
                        headers=request.headers,
                    )
                )
            except ThroughlineError:
                metrics.reads_forwarded.inc(code="failed")
                raise
            if forwarded is not None:
                metrics.reads_forwarded.inc(code=str(forwarded.status))
                return Response(content=forwarded.body, status_code=forwarded.status, headers=dict(forwarded.headers))
        return _read_response(await run_in_threadpool(api.answer, params))

    read_responses: dict[int | str, dict[str, Any]] = {
        200: {"model": ObserverRead, "description": "the throughline.observer_read.v1 document"},
        **_ERROR_RESPONSES,
    }

    @app.get(
        READ_PATH,
        summary="Read one page of an Observer read series",
        description=_READ_DESCRIPTION,
        response_model=None,
        responses=read_responses,
        dependencies=[Depends(require_token)],
        openapi_extra={"parameters": _QUERY_PARAMETERS},
        operation_id="readObserverTurnPage",
        tags=["read"],
    )
    async def read_get(request: Request) -> Response:
        params = params_from_query(request.query_params.multi_items(), max_wait=settings.max_wait)
        return await _read_or_forward(request, params, None)

    @app.post(
        READ_PATH,
        summary="Read one page of an Observer read series (JSON body)",
        description=_READ_DESCRIPTION + " The body is a JSON object; unknown keys are refused.",
        response_model=None,
        responses=read_responses,
        dependencies=[Depends(require_token)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ReadRequest.model_json_schema()}},
            }
        },
        operation_id="readObserverTurnPagePost",
        tags=["read"],
    )
    async def read_post(request: Request) -> Response:
        limit = settings.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():  # a chunked body has no Content-Length to refuse up front
            size += len(chunk)
            if size > limit:
                raise _too_large(f"the request body is larger than {limit} bytes", 413)
            chunks.append(chunk)
        body = b"".join(chunks)
        params = params_from_json(body, max_wait=settings.max_wait)
        return await _read_or_forward(request, params, body)

    @app.get("/healthz", summary="Liveness", tags=["operations"], responses={503: {"model": ErrorDocument}})
    def healthz() -> JSONResponse:
        phase = api.projector.phase()
        document: dict[str, Any] = {"status": "failed" if phase == "failed" else "alive", "projector": phase}
        failure = api.projector.error()
        if failure is not None:
            document["error"] = failure.to_json()["error"]
        return JSONResponse(document, status_code=503 if phase == "failed" else 200)

    @app.get(
        "/readyz",
        summary="Readiness: the projector's lag per partition",
        tags=["operations"],
        responses={503: {"description": "not ready: lagging, stopping, or the log does not answer"}},
    )
    def readyz() -> JSONResponse:
        ready, report = api.readiness()
        return JSONResponse(report, status_code=200 if ready else 503, headers={"Cache-Control": "no-store"})

    @app.get(
        "/metrics",
        summary="Prometheus metrics (text exposition format 0.0.4)",
        tags=["operations"],
        dependencies=[Depends(require_token)],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, 401: {"model": ErrorDocument}},
    )
    def metrics_endpoint() -> Response:
        return Response(content=metrics.render(), media_type=CONTENT_TYPE)

    return app


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document (what ``GET /openapi.json`` serves and ``docs/openapi.json`` commits)."""
    from throughline.core.memory import BookProjection, FixedLog

    return create_app(projection=BookProjection(), log=FixedLog(), token_key=bytes(32)).openapi()


def openapi_text() -> str:
    """The committed file's exact text: ``python -m throughline.serve.app > docs/openapi.json``."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.stdout.write(openapi_text())
