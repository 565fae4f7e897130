"""Real HTTP servers on 127.0.0.1 for the client tests: the read API over a ``World`` (uvicorn on a
thread), and a small scripted server that records what it was sent (the standard library's)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from reader_world import KEY, World

from throughline.reader.wire import ObserverRead
from throughline.serve.app import ApiSettings, create_app
from throughline.serve.client import HttpReader


class ServedApp:
    """``create_app`` over ``world`` on a free loopback port, for a ``with`` block."""

    def __init__(self, world: World, settings: ApiSettings, router: Any = None, tokens: Any = None) -> None:
        app = create_app(
            projection=world.projection, log=world.log, token_key=KEY, settings=settings, router=router, tokens=tokens
        )
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServedApp:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()


@dataclass
class Received:
    """One request a ``ScriptedServer`` took."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    """What a ``ScriptedServer`` answers: status, headers, body (``delay`` seconds first)."""

    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    delay: float = 0.0


def error_answer(status: int, code: str, message: str = "scripted", **headers: str) -> Answer:
    """A throughline error document."""
    return Answer(
        status,
        json.dumps({"error": {"code": code, "message": message}}).encode(),
        {"Content-Type": "application/json", **headers},
    )


class ScriptedServer:
    """A threaded HTTP server on 127.0.0.1 answering every request with ``answer(request)``."""

    def __init__(self, answer: Callable[[Received], Answer] | Answer) -> None:
        self.received: list[Received] = []
        self._answer = answer if callable(answer) else (lambda _r, a=answer: a)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Received(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                outer.received.append(request)
                answer = outer._answer(request)
                if answer.delay:
                    time.sleep(answer.delay)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up first (a timeout test)
                    self.close_connection = True

            do_GET = do_POST = _serve

            def log_message(self, *_: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=20)


def closed_url() -> str:
    """A loopback URL where nothing listens (the port was free a moment ago)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def rest_of_series(reader: HttpReader, project: str, after: str | None, page: ObserverRead, limit: int) -> list[int]:
    """The seqs of ``page`` and of every later page of its series, read as an Observer reads them."""
    seqs = [t.seq for t in page.turns]
    for _ in range(1000):
        if page.page.complete:
            return seqs
        page = reader.read_observer_turn_page(
            project=project,
            after_cursor=after,
            through_cursor=page.throughCursor,
            page_token=page.page.nextToken,
            limit=limit,
        )
        seqs += [t.seq for t in page.turns]
    raise AssertionError("the series did not complete")
