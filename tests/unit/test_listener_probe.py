"""The listener probe tells a TLS port from a broker that is not serving yet (both close plain text).

A broker that restarts accepts TCP connections before it serves them and closes the first request. The
probe once read that as "this port speaks TLS", a setting error that is not retriable, and stopped a
projector in the middle of a broker restart. The servers here are tiny loopback stand-ins for the two.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from throughline.log.config import KafkaClientConfig
from throughline.log.exceptions import ProtocolMismatchError
from throughline.log.probe import check_listener
from throughline.testing.kafka.secured import TlsFiles, make_tls_files

PLAINTEXT = KafkaClientConfig()
SERVE_S = 10.0


@contextmanager
def _listener(handle: Callable[[socket.socket], None]) -> Iterator[tuple[str, list[int]]]:
    """A loopback port whose every connection goes to ``handle``; yields (server, first bytes seen)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    first: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        deadline = time.monotonic() + SERVE_S
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    head = conn.recv(1, socket.MSG_PEEK)
                    first.append(head[0] if head else -1)
                    handle(conn)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", first
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def _close_at_once(conn: socket.socket) -> None:
    """A broker that is starting or stopping: the port accepts, the first request is dropped."""
    conn.recv(4096)


def test_a_port_that_closes_every_request_is_not_called_tls() -> None:
    with _listener(_close_at_once) as (server, first):
        check_listener([server], PLAINTEXT, None, time.monotonic() + 5)  # undecided: no error
    # The probe sent its Kafka request, then asked again with a TLS ClientHello (0x16), which closed too.
    assert first[:2] == [0x00, 0x16]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(Path(tmp_path_factory.mktemp("tls")))


def _tls_or_close(context: ssl.SSLContext) -> Callable[[socket.socket], None]:
    """A TLS listener that closes plain text without a word, as a Kafka TLS listener may."""

    def handle(conn: socket.socket) -> None:
        if conn.recv(1, socket.MSG_PEEK) != b"\x16":
            conn.recv(4096)
            return
        with context.wrap_socket(conn, server_side=True) as channel:
            channel.recv(1)

    return handle


def _server_context(files: TlsFiles, *, client_certificate: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.broker_keystore)
    if client_certificate:
        # TLS 1.2, so that the refusal of a client without a certificate comes inside the handshake.
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(files.ca)
    return context


@pytest.mark.parametrize("client_certificate", [False, True], ids=["tls", "mutual-tls"])
def test_a_tls_port_that_closes_plain_text_is_called_tls(tls_files: TlsFiles, client_certificate: bool) -> None:
    handle = _tls_or_close(_server_context(tls_files, client_certificate=client_certificate))
    with _listener(handle) as (server, first):
        with pytest.raises(ProtocolMismatchError, match="speaks TLS") as mismatch:
            check_listener([server], PLAINTEXT, None, time.monotonic() + 5)
    assert not mismatch.value.retriable
    assert first[:2] == [0x00, 0x16]
