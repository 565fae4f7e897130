"""``ReadRoute``: ``GET /v1/projects/read`` answered by a plain ASGI handler, ahead of FastAPI's router.

A read is the API's hot path, and FastAPI's machinery around one (routing, dependency resolution, the
request object, its exception wrappers and anyio's thread hop) cost more CPU than the read itself: a
profile of an idle ``serve`` answering first pages put the framework at about 40% of the process's
busy time and ``read_page`` at under 10% (docs/benchmarks.md, bench/ANALYSIS.md). That CPU is taken
from the projector thread too (one interpreter lock), so it slows freshness as well as reads.

This handler does exactly what the FastAPI route does, in the same order, and nothing else:

1. the bearer token (``BearerAuth.check``), and after step 2 the token's scope (``ReadApi.permit``);
2. the query string, parsed the way Starlette parses it (``parse_qsl``, blank values kept, Latin-1),
   into a ``ReadRequest`` (``request_from_query``), a limit out of range counted as a refused read;
3. ``ReadApi.answer`` on one of the route's own threads (a read waits for the projector, and a
   long-poll for the project's chain, neither of which may block the event loop; a plain executor
   costs the event loop less than anyio's hop), as many as anyio's limit that ``serve`` raises for
   the framework's routes (``max_waiters`` + 32);
4. the answer as ``read_response`` / ``error_response`` make it, the same bytes and headers.

Anything else (POST, another path, a ``serve --group`` member, which may forward a read) goes on to the
FastAPI application unchanged; so does an unexpected exception, to be answered by its error handler.
The route's OpenAPI description stays on the FastAPI route, which this handler shadows.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from throughline.errors import ThroughlineError
from throughline.reader.request import ReadRequest
from throughline.reader.wire import ObserverRead
from throughline.serve import READ_PATH
from throughline.serve.auth import BearerAuth
from throughline.serve.params import request_from_query
from throughline.serve.read_api import ReadApi
from throughline.serve.responses import error_response, http_status, read_response

_log = logging.getLogger("throughline.serve")


class ReadThreads:
    """The worker threads of ``ReadRoute``: as many reads and long-polls may wait at once as the FastAPI
    route allowed (anyio's limit, which ``serve`` raises to ``max_waiters`` + 32: the long-polls, at
    most ``max_waiters``, leave 32 threads to the other reads). A thread starts only when a read finds
    none idle; ``close`` (the app's lifespan ends) lets them go, and a
    later read (an app served again, as tests do) starts a new pool."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, call: Callable[[ReadRequest], ObserverRead], read: ReadRequest) -> ObserverRead:
        """``call(read)`` on one of the threads, awaited."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._size, thread_name_prefix="read")
            pool = self._pool
        return await asyncio.get_running_loop().run_in_executor(pool, call, read)

    def close(self) -> None:
        """Let the threads go once the reads they run are answered (idempotent)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


class ReadRoute:
    """ASGI middleware: answers ``GET`` reads itself, passes every other request to ``app``.

    ``route``: the FastAPI route object of ``GET`` reads, put into the scope so that the request counter
    (``RequestGuard``) labels these answers as it labels the framework's.
    """

    def __init__(self, app: ASGIApp, *, api: ReadApi, auth: BearerAuth, route: object, threads: ReadThreads) -> None:
        self.app = app
        self.api = api
        self.auth = auth
        self.route = route
        self._threads = threads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or scope["path"] != READ_PATH
            or self.api.router is not None
        ):
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        try:
            response = read_response(await self._answer(scope))
        except ThroughlineError as exc:
            if http_status(exc) >= 500:
                _log.warning("read failed: %s (%s)", exc.code, exc.message)
            response = error_response(exc)
        await response(scope, receive, send)

    async def _answer(self, scope: Scope) -> ObserverRead:
        api = self.api
        grant = self.auth.check(_header(scope, b"authorization"))
        pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        read = api.parse(lambda: request_from_query(pairs, max_wait=api.settings.max_wait))
        api.permit(grant, read)
        return await self._threads.run(api.answer, read)


def _header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), decoded as Starlette decodes it."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None
