"""A loopback TCP proxy in front of one ``serve`` that holds back its projection snapshot answers: a
holder whose snapshot endpoint is slow, for the group member boot tests (the member downloading from it
must go on polling). Every other request passes at once (forwarded reads stay prompt).

The serve advertises the proxy's URL (``--advertise``) and listens on its own port; urllib opens one
connection per request, so the proxy reads each connection's request line and, for
``/v1/admin/snapshot``, waits ``delay`` seconds (or until ``release``) before it passes the answer on.
Every loop is bounded in time; ``close`` stops it.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

SNAPSHOT_PATH = "/v1/admin/snapshot"
_LIFETIME = 600.0  # the longest one proxied connection lives
_HEAD_LIMIT = 1 << 16


class SlowSnapshotProxy:
    """Proxies ``127.0.0.1:port`` to ``127.0.0.1:target``; the first ``slow`` snapshot answers (``None``:
    every one) are held back ``delay`` seconds."""

    def __init__(self, target: int, *, delay: float, slow: int | None = 1) -> None:
        self.target = target
        self.delay = delay
        self._slow = slow
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.release = threading.Event()  # set: every held answer goes on at once
        self.held: list[str] = []  # snapshot requests being held back now (their paths)
        self.slowed: list[str] = []  # every snapshot request held back so far
        self.passed: list[str] = []  # every other request
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, name="slow-proxy", daemon=True)
        self._thread.start()

    def __enter__(self) -> SlowSnapshotProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and let held answers go (each connection ends within its bound)."""
        self._stop.set()
        self.release.set()
        self._thread.join(5.0)
        self._sock.close()

    def slow_next(self, count: int) -> None:
        """Hold back the next ``count`` snapshot answers (``delay`` seconds each, or until ``release``)."""
        with self._lock:
            self._slow = count
        self.release.clear()

    def holding(self) -> list[str]:
        """The snapshot requests held back right now."""
        with self._lock:
            return list(self.held)

    def _accept(self) -> None:
        deadline = time.monotonic() + 3600.0
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="slow-proxy-conn", daemon=True).start()

    def _take_slow(self) -> bool:
        with self._lock:
            if self._slow is None:
                return True
            if self._slow > 0:
                self._slow -= 1
                return True
            return False

    def _serve(self, client: socket.socket) -> None:
        until = time.monotonic() + _LIFETIME
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10.0)
        except OSError:
            client.close()
            return
        with client, upstream:
            client.settimeout(1.0)
            upstream.settimeout(1.0)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT and time.monotonic() < until:
                try:
                    chunk = client.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    break
                head += chunk
            parts = head.split(b" ", 2)
            path = parts[1].decode("latin-1") if len(parts) > 2 else ""
            try:
                upstream.sendall(head)
            except OSError:
                return
            slow = path.startswith(SNAPSHOT_PATH) and self._take_slow()
            with self._lock:
                (self.slowed if slow else self.passed).append(path)
            threading.Thread(target=_pump, args=(client, upstream, until), daemon=True).start()
            if slow:
                with self._lock:
                    self.held.append(path)
                try:
                    self.release.wait(self.delay)
                finally:
                    with self._lock:
                        self.held.remove(path)
            _pump(upstream, client, until)


def _pump(source: socket.socket, sink: socket.socket, until: float) -> None:
    """Copy ``source`` to ``sink`` until either closes or ``until`` passes."""
    while time.monotonic() < until:
        try:
            chunk = source.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError:
            return
        if not chunk:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        try:
            sink.sendall(chunk)
        except OSError:
            return
