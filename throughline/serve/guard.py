"""``RequestGuard``: the ASGI layer in front of the routes (size limits, and a count of every answer).

A query string over ``max_query_bytes`` is refused 414 and a declared body over ``max_body_bytes`` 413
before anything is routed or read; a chunked body without ``Content-Length`` is bounded by the POST
route as it streams. Every answer, refused here or not, is counted by route and status code.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from throughline.errors import ThroughlineError
from throughline.serve.exceptions import InvalidRequestError
from throughline.serve.metrics import ServeMetrics
from throughline.serve.read_api import ApiSettings
from throughline.serve.responses import error_response, too_large


class RequestGuard:
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
            return too_large(f"the query string is larger than {self.settings.max_query_bytes} bytes", 414)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                if not value.isdigit():
                    return InvalidRequestError("Content-Length is not a number")
                if int(value) > self.settings.max_body_bytes:
                    return too_large(f"the request body is larger than {self.settings.max_body_bytes} bytes", 413)
        return None
