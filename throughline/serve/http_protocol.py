"""The HTTP/1.1 parser ``serve`` runs uvicorn with: httptools (C, llhttp) when installed, else h11.

httptools parses a request in C where h11 parses it in Python, a measurable part of an idle read's CPU
(docs/benchmarks.md). uvicorn bounds a request head only under h11 (``h11_max_incomplete_event_size``);
its httptools protocol buffers any URL and header list it is sent. ``BoundedHttpToolsProtocol`` keeps
the same bound for httptools: past that many bytes of URL and headers the request is refused the way
h11 refuses it (400, connection closed) before anything is routed.

The seam is uvicorn's ``HttpToolsProtocol`` parser callbacks (``on_message_begin``, ``on_url``,
``on_header``), tested against the pinned uvicorn range (``tests/unit/test_serve_http_protocol.py``).
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

#: h11's own default bound, for a config that leaves it unset.
_H11_DEFAULT_BOUND = 16 * 1024


class HeadTooLargeError(Exception):
    """Raised from a parser callback: the request head is over the bound (httptools reports it as a
    parser error, which uvicorn answers 400 and closes the connection on)."""


def _bounded_httptools() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with h11's bound on a request head."""

        _head_bytes = 0

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            super().on_message_begin()

        def _count(self, size: int) -> None:
            self._head_bytes += size
            bound = self.config.h11_max_incomplete_event_size or _H11_DEFAULT_BOUND
            if self._head_bytes > bound:
                raise HeadTooLargeError(f"request head over {bound} bytes")

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)  # ": " and CRLF, as h11 counts the raw head
            super().on_header(name, value)

    return BoundedHttpToolsProtocol


def http_protocol() -> Any:
    """What ``uvicorn.Config(http=...)`` gets: the bounded httptools protocol class, or ``"h11"``."""
    if importlib.util.find_spec("httptools") is None:
        return "h11"
    return _bounded_httptools()
