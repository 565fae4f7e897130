"""The HTTP parser serve runs: httptools, bounded on a request head exactly where h11 is.

A real uvicorn on loopback (no broker: the in-memory world), raw sockets so the request head can be as
large as the test wants.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from reader_world import KEY, World

from throughline.serve.app import ApiSettings, create_app
from throughline.serve.http_protocol import http_protocol
from throughline.serve.service import bind_socket

BOUND = 64 * 1024


@pytest.fixture(params=["bounded-httptools", "h11"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    world = World()
    world.append_many(3)
    world.project()
    app = create_app(projection=world.projection, log=world.log, token_key=KEY, settings=ApiSettings(read_wait=0.0))
    protocol: Any = http_protocol() if request.param == "bounded-httptools" else "h11"
    assert request.param == "h11" or not isinstance(protocol, str), "httptools is a dependency of serve"
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(
        app, http=protocol, log_level="critical", lifespan="off", h11_max_incomplete_event_size=BOUND
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def exchange(port: int, head: bytes) -> bytes:
    """Send ``head`` and read until the server closes or answers (bounded by a timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(head)
        except OSError:  # the server may close before it has read everything
            pass
        got = b""
        while b"\r\n\r\n" not in got:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got


def test_a_small_request_is_answered(port: int) -> None:
    answer = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")


def test_a_header_over_the_bound_is_refused_before_routing(port: int) -> None:
    huge = b"X-Filler: " + b"a" * (2 * BOUND) + b"\r\n"
    answer = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]


def test_many_headers_over_the_bound_are_refused(port: int) -> None:
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(2 * BOUND // 100))
    answer = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]


def test_a_url_over_the_bound_is_refused(port: int) -> None:
    answer = exchange(port, b"GET /healthz?" + b"q" * (2 * BOUND) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
