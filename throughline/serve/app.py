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

The concerns live in their own modules: ``params`` (wire -> ``ReadRequest``), ``responses`` (status
mapping, error documents), ``guard`` (size limits before routing), ``read_api`` (``ReadApi``: reads,
long-polls, readiness, metrics), ``openapi`` (the document); this module only wires them together.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from throughline.core.ports import LogView, Projection
from throughline.errors import ThroughlineError
from throughline.reader import page as reader_page
from throughline.reader.request import ReadRequest
from throughline.serve import READ_PATH
from throughline.serve.auth import BearerAuth
from throughline.serve.guard import RequestGuard
from throughline.serve.metrics import CONTENT_TYPE, ServeMetrics
from throughline.serve.openapi import (
    QUERY_PARAMETERS,
    READ_BODY,
    READ_DESCRIPTION,
    READ_RESPONSES,
    SECURED,
    SECURITY_SCHEMES,
    openapi_document,
    openapi_text,
)
from throughline.serve.params import request_from_json, request_from_query
from throughline.serve.read_api import (
    AlwaysRunning,
    ApiSettings,
    ProjectorPhase,
    ProjectorState,
    ReadApi,
    ReadPage,
    Replication,
)
from throughline.serve.read_route import ReadRoute, ReadThreads
from throughline.serve.responses import ErrorDocument, install_error_handlers, read_response, too_large
from throughline.serve.tokens import VerifiedTokens

if TYPE_CHECKING:
    from throughline.serve.group import GroupRouter

__all__ = [
    "READ_PATH",
    "ApiSettings",
    "ProjectorPhase",
    "ProjectorState",
    "ReadApi",
    "create_app",
    "openapi_document",
    "openapi_text",
]


def _package_version() -> str:
    try:
        return version("throughline")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout without an install
        return "0"


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
    replication: Replication | None = None,
    tokens: VerifiedTokens | None = None,
) -> FastAPI:
    """The FastAPI application of ``throughline serve``.

    ``projector`` reports whether the projector that fills ``projection`` runs (readiness);
    ``stopping`` is set on shutdown so that long-polls return at once. ``read_page`` defaults to
    ``throughline.reader.read_page``. ``router``: a ``serve --group`` member's
    (``throughline.serve.group``): reads of partitions it does not answer itself are forwarded.
    ``replication``: describes the topic for ``/readyz`` (leader, replicas, ISR per partition), e.g.
    ``TopicWatch.describe``; without it ``/readyz`` leaves replication out.
    ``tokens``: the scoped tokens ``serve --token-keys`` accepts (docs/security.md).
    """
    settings = settings or ApiSettings()
    metrics = metrics or ServeMetrics()
    api = ReadApi(
        projection=projection,
        log=log,
        token_key=token_key,
        settings=settings,
        metrics=metrics,
        projector=projector or AlwaysRunning(),
        stopping=stopping or threading.Event(),
        read_page=read_page or reader_page.read_page,
        router=router,
        replication=replication,
    )
    metrics.registry.on_scrape(api.refresh_metrics)
    auth = BearerAuth(settings.auth_token, tokens)
    threads = ReadThreads(settings.max_waiters + 32)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Each waiting long-poll holds a worker thread; leave room for everything else beside them.
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, settings.max_waiters + 32)
        try:
            yield
        finally:
            threads.close()

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
    framework_openapi = app.openapi

    def openapi_with_security() -> dict[str, Any]:
        if app.openapi_schema is None:  # built once, then served from the framework's cache
            framework_openapi().setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi_with_security  # type: ignore[method-assign]

    async def require_token(request: Request) -> None:
        # async: a sync dependency would cost every request a hop to the worker threads and back.
        request.state.grant = auth.check(request.headers.get("authorization"))

    async def require_metrics(request: Request) -> None:
        auth.check(request.headers.get("authorization")).require_metrics()

    install_error_handlers(app)

    async def _read_or_forward(request: Request, read: ReadRequest, body: bytes | None) -> Response:
        api.permit(request.state.grant, read)  # before anything else: the same answer whether it exists or not
        if api.router is not None:
            target = READ_PATH + (f"?{request.url.query}" if request.url.query else "")
            try:
                forwarded = await run_in_threadpool(
                    lambda: api.router.route(  # type: ignore[union-attr]
                        read.project,
                        wait=read.wait,
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
        return read_response(await run_in_threadpool(api.answer, read))

    @app.get(
        READ_PATH,
        summary="Read one page of an Observer read series",
        description=READ_DESCRIPTION,
        response_model=None,
        responses=READ_RESPONSES,
        dependencies=[Depends(require_token)],
        openapi_extra={"parameters": QUERY_PARAMETERS, "security": SECURED},
        operation_id="readObserverTurnPage",
        tags=["read"],
    )
    async def read_get(request: Request) -> Response:
        pairs = request.query_params.multi_items()
        read = api.parse(lambda: request_from_query(pairs, max_wait=settings.max_wait))
        return await _read_or_forward(request, read, None)

    @app.post(
        READ_PATH,
        summary="Read one page of an Observer read series (JSON body)",
        description=READ_DESCRIPTION + " The body is a JSON object; unknown keys are refused.",
        response_model=None,
        responses=READ_RESPONSES,
        dependencies=[Depends(require_token)],
        openapi_extra={**READ_BODY, "security": SECURED},
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
                raise too_large(f"the request body is larger than {limit} bytes", 413)
            chunks.append(chunk)
        body = b"".join(chunks)
        read = api.parse(lambda: request_from_json(body, max_wait=settings.max_wait))
        return await _read_or_forward(request, read, body)

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
        summary="Readiness: the projector's lag per partition, and the topic's replication",
        description="The body is described in docs/http.md (Health and readiness): status, projector, lag, "
        "maxLag, partitions (offsets, lag, leader, replicas, isr, underReplicated) and replication "
        "(brokers, replicationFactor, minInsyncReplicas, uncleanLeaderElection, underReplicated, problems). "
        "Replication is reported, never a reason to be not ready.",
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
        dependencies=[Depends(require_metrics)],
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {}}},
            401: {"model": ErrorDocument, "description": "missing or refused bearer token"},
            403: {"model": ErrorDocument, "description": "forbidden_scope: a read token (metrics or admin reads them)"},
        },
        openapi_extra={"security": SECURED},
    )
    def metrics_endpoint() -> Response:
        return Response(content=metrics.render(), media_type=CONTENT_TYPE)

    # Inner first: GET reads skip the framework (``read_route``); the guard stays in front of both.
    read_route = next(
        r for r in app.routes if getattr(r, "path", None) == READ_PATH and "GET" in getattr(r, "methods", ())
    )
    app.add_middleware(ReadRoute, api=api, auth=auth, route=read_route, threads=threads)
    app.add_middleware(RequestGuard, settings=settings, metrics=metrics)
    return app


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(openapi_text())
