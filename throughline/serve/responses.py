"""What the API answers: the read document, the error documents, and which HTTP status an error gets.

Hard input errors are 400 (401 for a missing or refused token, 403 for a read outside the token's
scope, 404/405 for no such endpoint or method, 413/414 for a request too large), a quarantined source 409, a retriable failure 503 (with ``Retry-After``), anything else 500; every error answer is the
``{"error": {"code", "message"}}`` document and none carries a stack trace.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from throughline.errors import InputError, ThroughlineError
from throughline.reader.exceptions import SourceQuarantinedError
from throughline.reader.wire import ObserverRead
from throughline.serve import REASON_HEADER
from throughline.serve.exceptions import (
    EndpointNotFoundError,
    ForbiddenError,
    HttpProtocolError,
    InvalidRequestError,
    MethodNotAllowedError,
    RebuildRefusedError,
    RequestTooLargeError,
    UnauthorizedError,
)

_log = logging.getLogger("throughline.serve")


class ErrorBody(BaseModel):
    """An error: a stable machine-readable code and a message for a person."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str = Field(description="stable error code (the CLI prints the same codes)")
    message: str


class ErrorDocument(BaseModel):
    """Every non-2xx answer of the API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    error: ErrorBody


def too_large(message: str, status: int) -> RequestTooLargeError:
    """A ``RequestTooLargeError`` answered with ``status`` (413 for a body, 414 for a query string)."""
    error = RequestTooLargeError(message)
    error.http_status = status  # type: ignore[attr-defined]
    return error


def http_status(error: ThroughlineError) -> int:
    """The HTTP status an error is answered with."""
    if isinstance(error, RequestTooLargeError):
        return getattr(error, "http_status", 413)
    if isinstance(error, UnauthorizedError):
        return 401
    if isinstance(error, ForbiddenError):
        return 403
    if isinstance(error, EndpointNotFoundError):
        return 404
    if isinstance(error, MethodNotAllowedError):
        return 405
    if isinstance(error, InputError):
        return 400
    if isinstance(error, RebuildRefusedError):
        return 409  # the request is fine; the rebuild's state forbids it now
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


def read_response(result: ObserverRead) -> Response:
    """The 200 answer of a read: the wire document, and its reason (for a person) in a header."""
    headers = {"Cache-Control": "no-store"}
    if result.reason:
        # The wire document carries only docs/spec.md#read-wire's fields; the reason for a person rides in a header.
        headers[REASON_HEADER] = _header_text(result.reason)
    return Response(content=result.to_json_bytes(), media_type="application/json", headers=headers)


def allowed_methods(app: FastAPI, path: str) -> str:
    """Every method some route of ``path`` answers, for a 405's ``Allow`` header."""
    methods: set[str] = set()
    for route in app.routes:
        if getattr(route, "path", None) == path:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure of ``app`` with an error document: typed errors by their status, the
    framework's own (validation, 404, 405) with their codes, anything unexpected as 500."""

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
    async def _http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            error: ThroughlineError = EndpointNotFoundError("no such endpoint")
        elif exc.status_code == 405:
            error = MethodNotAllowedError("method not allowed on this endpoint")
        else:
            error = HttpProtocolError(str(exc.detail))
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route of the path only (GET of the read, not POST).
            headers["Allow"] = allowed_methods(
                app, request.scope.get("path", "")
            )  # request.url fails on a query that is not UTF-8
        return JSONResponse(error.to_json(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        _log.error("unexpected failure answering a request", exc_info=exc)
        return JSONResponse(
            ThroughlineError("internal error; the server log has the details").to_json(), status_code=500
        )
