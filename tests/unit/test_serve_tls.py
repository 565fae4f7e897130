"""HTTPS for the read API (``throughline.serve.security``; docs/security.md): the server's TLS context
under Python's ``ssl`` client and ``curl``; wrong CA, expired and wrong-host certificates refused with
typed errors; mutual TLS; plain HTTP on a non-loopback address refused. Certificates are made in the
test (tests/support/certs.py), loopback only."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from reader_world import KEY, PROJECT, World
from support.certs import Pki, make_pki

from throughline.serve.app import ApiSettings, create_app
from throughline.serve.client import HttpReader
from throughline.serve.exceptions import (
    InvalidTlsOptionError,
    ServerUnavailableError,
    TlsExpiredError,
    TlsHostnameError,
    TlsUntrustedError,
)
from throughline.serve.security import TlsOptions, client_context, require_tls_off_loopback, server_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class TlsServed:
    """The read API over ``world`` behind ``server_context(options)`` on a free loopback port."""

    def __init__(self, world: World, options: TlsOptions) -> None:
        app = create_app(projection=world.projection, log=world.log, token_key=KEY, settings=ApiSettings(read_wait=0.0))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="error", lifespan="on")
        config.load()
        config.ssl = server_context(options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> TlsServed:
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


@pytest.fixture
def world() -> World:
    w = World()
    w.append_many(2)
    return w


@pytest.fixture
def served(world: World, pki: Pki) -> Iterator[TlsServed]:
    with TlsServed(world, TlsOptions(cert=str(pki.cert), key=str(pki.key))) as s:
        yield s


def _handshake(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            return str(tls.version())


def test_python_ssl_client_reads_over_tls13(served: TlsServed, pki: Pki) -> None:
    assert _handshake(served.port, client_context(str(pki.ca))) == "TLSv1.3"
    read = HttpReader(served.url, ca=str(pki.ca)).read_observer_turn_page(project=PROJECT)
    assert read.ok and len(read.turns) == 2


def test_tls12_is_accepted_and_older_refused(served: TlsServed, pki: Pki) -> None:
    context = client_context(str(pki.ca))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    assert _handshake(served.port, context) == "TLSv1.2"
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(cafile=str(pki.ca))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the point: a client that still offers 1.1
        old.minimum_version = ssl.TLSVersion.TLSv1_1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((ssl.SSLError, OSError)):
        _handshake(served.port, old)


def test_a_certificate_from_another_ca_is_refused_typed(served: TlsServed, pki: Pki) -> None:
    with pytest.raises(TlsUntrustedError) as refused:
        HttpReader(served.url, ca=str(pki.other_ca)).read_observer_turn_page(project=PROJECT)
    assert refused.value.code == "tls_untrusted_certificate" and not refused.value.retriable
    with pytest.raises(TlsUntrustedError):  # no --ca: the system's trust store does not know the test CA
        HttpReader(served.url).read_observer_turn_page(project=PROJECT)


def test_an_expired_certificate_is_refused_typed(world: World, pki: Pki) -> None:
    with TlsServed(world, TlsOptions(cert=str(pki.expired_cert), key=str(pki.expired_key))) as served:
        with pytest.raises(TlsExpiredError):
            HttpReader(served.url, ca=str(pki.ca)).read_observer_turn_page(project=PROJECT)


def test_a_certificate_for_another_host_is_refused_typed(world: World, pki: Pki) -> None:
    with TlsServed(world, TlsOptions(cert=str(pki.wrong_host_cert), key=str(pki.wrong_host_key))) as served:
        with pytest.raises(TlsHostnameError):
            HttpReader(served.url, ca=str(pki.ca)).read_observer_turn_page(project=PROJECT)


def test_mutual_tls_refuses_a_client_without_a_certificate(world: World, pki: Pki) -> None:
    options = TlsOptions(cert=str(pki.cert), key=str(pki.key), client_ca=str(pki.ca))
    with TlsServed(world, options) as served:
        with pytest.raises(ServerUnavailableError):
            HttpReader(served.url, ca=str(pki.ca), timeout=5).read_observer_turn_page(project=PROJECT)
        member = client_context(str(pki.ca), cert=str(pki.cert), key=str(pki.key))
        assert _handshake(served.port, member) == "TLSv1.3"
        reader = HttpReader(served.url, ca=str(pki.ca), client_cert=str(pki.cert), client_key=str(pki.key))
        assert reader.read_observer_turn_page(project=PROJECT).ok


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl(served: TlsServed, pki: Pki, world: World) -> None:
    def curl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["curl", "-sS", "--max-time", "10", "--noproxy", "*", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    ok = curl("--cacert", str(pki.ca), "--tlsv1.2", f"{served.url}/v1/projects/read?project={PROJECT}")
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["turns"]) == 2
    assert curl("--cacert", str(pki.other_ca), f"{served.url}/healthz").returncode == 60  # peer not verified
    assert curl(f"{served.url}/healthz").returncode == 60
    assert curl("--cacert", str(pki.ca), "--tls-max", "1.1", f"{served.url}/healthz").returncode != 0
    assert curl(f"http://127.0.0.1:{served.port}/healthz").returncode != 0  # plain HTTP on the TLS port
    with TlsServed(world, TlsOptions(cert=str(pki.cert), key=str(pki.key), client_ca=str(pki.ca))) as mutual:
        refused = curl("--cacert", str(pki.ca), f"{mutual.url}/healthz")
        assert refused.returncode != 0
        accepted = curl(
            "--cacert", str(pki.ca), "--cert", str(pki.cert), "--key", str(pki.key), f"{mutual.url}/healthz"
        )
        assert accepted.returncode == 0 and json.loads(accepted.stdout)["status"] == "alive"


def test_bad_files_are_typed_configuration_errors(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate")
    for options in (
        TlsOptions(cert=str(tmp_path / "missing.pem"), key=str(pki.key)),
        TlsOptions(cert=str(tmp_path / "junk.pem"), key=str(pki.key)),
        TlsOptions(cert=str(pki.cert), key=str(pki.expired_key)),  # a key that is not the certificate's
        TlsOptions(cert=str(pki.cert), key=str(pki.key), client_ca=str(tmp_path / "junk.pem")),
    ):
        with pytest.raises(InvalidTlsOptionError):
            server_context(options)
    with pytest.raises(InvalidTlsOptionError):
        client_context(str(tmp_path / "junk.pem"))


def test_plain_http_off_loopback_needs_insecure_http(tmp_path: Path, pki: Pki) -> None:
    require_tls_off_loopback("127.0.0.1", None, False)
    require_tls_off_loopback("0.0.0.0", TlsOptions(cert="c", key="k"), False)
    require_tls_off_loopback("0.0.0.0", None, True)
    token = tmp_path / "token"
    token.write_text("an-admin-token-of-enough-length-123")
    base = [
        sys.executable,
        "-m",
        "throughline.cli",
        "serve",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--port",
        "0",
    ]
    refused = subprocess.run(
        [*base, "--host", "0.0.0.0", "--auth-token-file", str(token)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and json.loads(refused.stderr)["error"]["code"] == "tls_required"
    half = subprocess.run([*base, "--tls-cert", str(pki.cert)], capture_output=True, text=True, timeout=60)
    assert half.returncode == 2 and json.loads(half.stderr)["error"]["code"] == "invalid_tls_option"


def test_a_member_advertises_the_scheme_it_serves(pki: Pki) -> None:
    base = [
        sys.executable,
        "-m",
        "throughline.cli",
        "serve",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--port",
        "0",
    ]
    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
    for extra in ([*tls, "--advertise", "http://127.0.0.1:9"], ["--advertise", "https://127.0.0.1:9"]):
        done = subprocess.run([*base, "--group", "g", *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and json.loads(done.stderr)["error"]["code"] == "invalid_group_option", extra
