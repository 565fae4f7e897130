"""``HttpReader``: reads pages from a running ``throughline serve`` as the library reads them locally.

``HttpReader(url)(project=..., after_cursor=..., through_cursor=..., page_token=..., limit=...)`` returns
the same ``ObserverRead`` model as ``read_observer_turn_page`` and raises the same typed errors: an HTTP
error answer carries the stable code, and the client raises the class that owns that code
(``InvalidLimitError`` for ``invalid_limit``, a ``PageTokenError`` for each ``page_token_*``, ...). It
fits the Observer's ``PageReader`` protocol, so ``Observer(HttpReader(url), ...)`` audits over the network.

A server that cannot be reached raises ``ServerUnavailableError`` (retriable), which the Observer backs
off from like a pending projection. Only the standard library is used (``urllib``).

Several URLs (``HttpReader("http://a:8787,http://b:8787")`` or a sequence; ``--url U1,U2,...``) are the
members of a ``serve --group``: a request that cannot reach one member (refused, reset, timed out, cut
short, a proxy's 502/504) or that it answers with HTTP 503 goes to the next, with the same body, so a
series goes on with the same after and through cursors and page token on whichever member answers
(every member answers every read, identically). Each member is tried at most once per call, starting
with the one that answered last; when none answers other than 503, the last 503 answer stands (its
typed, retriable error), and when none answers at all, ``ServerUnavailableError``. Input errors (4xx)
and other failures are the same on every member and are raised at once. One URL behaves as before.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from throughline.core.page_range import DEFAULT_LIMIT
from throughline.errors import ThroughlineError, error_class
from throughline.reader.request import ReadRequest
from throughline.reader.wire import ObserverRead
from throughline.serve import READ_PATH, REASON_HEADER
from throughline.serve.exceptions import (
    BadResponseError,
    InvalidUrlError,
    ServerUnavailableError,
    UnknownCodeError,
)
from throughline.serve.security import client_context
from throughline.serve.transport import exchange, new_opener

ENV_URL = "THROUGHLINE_URL"
ENV_CLIENT_CERT = "THROUGHLINE_CLIENT_CERT"
ENV_CLIENT_KEY = "THROUGHLINE_CLIENT_KEY"
DEFAULT_TIMEOUT = 30.0
#: Long-poll of ``observe --follow --url`` (below the server's default cap of 30 s).
FOLLOW_WAIT = 25.0


def error_from_answer(status: int, code: str, message: str) -> ThroughlineError:
    """Rebuild the typed error a server answered with: the class that declares its code
    (``UnknownCodeError`` for a code no class declares, such as a newer server's)."""
    cls = error_class(code)
    if cls is None:
        return UnknownCodeError(code, message, status=status)
    error = cls.__new__(cls)
    # Some classes take other constructor arguments (servers, topic...): the base initialiser sets the
    # fields every error has, which is all a remote error can carry.
    retriable = True if status == 503 else None
    ThroughlineError.__init__(error, message, retriable=retriable)
    return error


def request_body(request: ReadRequest) -> dict[str, Any]:
    """The JSON body of ``POST /v1/projects/read`` for ``request`` (what ``serve.params`` reads back)."""
    body: dict[str, Any] = {"project": request.project, "limit": request.limit}
    if request.after_cursor is not None:
        body["afterCursor"] = request.after_cursor
    if request.through_cursor is not None:
        body["throughCursor"] = request.through_cursor
    if request.page_token is not None:
        body["pageToken"] = request.page_token
    if request.wait > 0 and request.first_page:
        body["wait"] = request.wait
    return body


def _check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidUrlError(f"--url must be an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment:
        raise InvalidUrlError("--url must not carry a query or fragment")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def parse_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """``urls`` (one URL, a comma-separated list, or a sequence of either) as checked, distinct URLs."""
    pieces = [urls] if isinstance(urls, str) else list(urls)
    found: list[str] = []
    for piece in pieces:
        if not isinstance(piece, str):
            raise InvalidUrlError(f"--url must be text, got {piece!r}")
        for part in piece.split(","):
            if not part.strip():
                raise InvalidUrlError(f"--url has an empty entry: {piece!r}")
            url = _check_url(part)
            if url not in found:
                found.append(url)
    if not found:
        raise InvalidUrlError("--url needs at least one URL")
    return tuple(found)


class HttpReader:
    """A ``PageReader`` over ``throughline serve``'s ``POST /v1/projects/read``.

    ``url``: one URL, or several (comma-separated or a sequence) to fail over between (see the module).
    ``wait`` (seconds, default 0) is the long-poll: an empty first page of a series is held by the
    server until the project's chain moves past the after cursor, at most that long. ``token``: the
    bearer token (the admin token or a scoped one); ``ca``: the CA file ``https://`` servers are
    verified with (default the system's); a refused certificate raises a ``TlsVerifyError``.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        wait: float = 0.0,
        ca: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        #: Every member's URL, in the order given.
        self.urls = parse_urls(url)
        self._current = 0
        self.timeout = float(timeout)
        self.wait = float(wait)
        self._token = token
        # https:// URLs are verified against ``ca`` (a PEM file), else the system's trust store.
        # ``client_cert``/``client_key``: for a server that requires mutual TLS (``serve --tls-client-ca``).
        wants_tls = ca or client_cert
        self._opener = new_opener(client_context(ca, cert=client_cert, key=client_key) if wants_tls else None)

    @property
    def url(self) -> str:
        """The URL the next request goes to first: the member that answered the last one."""
        return self.urls[self._current]

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        shown = self.urls[0] if len(self.urls) == 1 else ",".join(self.urls)
        return f"HttpReader({shown!r}, token={'***' if self._token else None})"

    def __enter__(self) -> HttpReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def read_observer_turn_page(
        self,
        *,
        project: str,
        after_cursor: str | None = None,
        through_cursor: str | None = None,
        page_token: str | None = None,
        limit: int | None = 10,
        wait: float | None = None,
    ) -> ObserverRead:
        """One page of the series, as ``throughline.reader.read_observer_turn_page`` answers it."""
        return self.read(
            ReadRequest(
                project=project,
                after_cursor=after_cursor,
                through_cursor=through_cursor,
                page_token=page_token,
                limit=DEFAULT_LIMIT if limit is None else limit,
                wait=self.wait if wait is None else wait,
            )
        )

    def read(self, request: ReadRequest) -> ObserverRead:
        """The page ``request`` names; its ``wait`` (the long-poll) is sent for a first page only."""
        long_poll = request.wait if request.first_page else 0.0
        data = json.dumps(request_body(request), ensure_ascii=False, allow_nan=False).encode("utf-8")
        url, status, headers, payload = self._exchange("POST", READ_PATH, data, self.timeout + long_poll)
        if status == 200:
            try:
                read = ObserverRead.from_json(payload)
            except ValidationError:
                raise BadResponseError(f"{url} answered a document that is not {ObserverRead.__name__}") from None
            reason = headers.get(REASON_HEADER.lower())
            return read.model_copy(update={"reason": reason}) if reason else read
        raise self._error(url, status, payload)

    def __call__(self, **request: Any) -> ObserverRead:
        """The Observer's ``PageReader`` call (``project``, ``after_cursor``, ... as keywords)."""
        return self.read(ReadRequest(wait=self.wait, **request))

    def get_json(self, path: str) -> tuple[int, Any]:
        """``GET path`` (``/readyz``, ``/healthz``): the status and the decoded JSON body (of the first
        member that answers other than 503; else the last 503 answer)."""
        url, status, _, payload = self._exchange("GET", path, None, self.timeout)
        try:
            return status, json.loads(payload)
        except ValueError:
            raise BadResponseError(f"{url}{path} did not answer JSON") from None

    # ------------------------------------------------------------------------------------------ HTTP

    def _exchange(
        self, method: str, path: str, data: bytes | None, timeout: float
    ) -> tuple[str, int, dict[str, str], bytes]:
        """One request along the members, the last to answer first (``transport.exchange``)."""
        headers = {"Accept": "application/json", "User-Agent": "throughline-http-reader"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        index, answer = exchange(
            self._opener, self.urls, method, path, data, headers, timeout=timeout, start=self._current
        )
        self._current = index
        return answer.url, answer.status, dict(answer.headers), answer.body

    def _error(self, url: str, status: int, payload: bytes) -> ThroughlineError:
        try:
            document = json.loads(payload)
            error = document["error"]
            code, message = str(error["code"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            if status in (502, 503, 504):  # a proxy or a server shutting down: try again later
                return ServerUnavailableError(f"{url} answered HTTP {status}")
            return BadResponseError(f"{url} answered HTTP {status} without a throughline error document")
        if status in (404, 405):  # our own server, but not a read endpoint: the URL is wrong
            return BadResponseError(f"{url} has no read endpoint ({code}: {message}); check --url")
        return error_from_answer(status, code, message)
