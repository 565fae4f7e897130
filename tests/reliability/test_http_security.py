"""Security review, with tests (docs/reliability.md#6-security-review): tokens, the HTTP edge, authentication, binding.

- Page tokens are MAC'd and bound: a token verifies only under its key, and only for the exact
  project, after cursor and through cursor it was issued for (each one changed is refused); the key
  file ``serve`` creates beside the projection is private (mode 0600).
- The HTTP API refuses oversized requests (413 for a body, by ``Content-Length`` or by streaming; 414
  for a query string) before reading them into a page.
- With authentication on, reads and ``/metrics`` refuse a missing, malformed or wrong bearer token
  (401, ``WWW-Authenticate``), and the token never appears in an answer or in serve's log.
- ``serve`` binds to loopback unless told otherwise: with no ``--host`` its listening socket is on
  127.0.0.1 only, and binding anything else without an auth token is refused (exit 2).

In-process checks use FastAPI's TestClient; the rest runs against a real ``throughline serve``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rel_support
from fastapi.testclient import TestClient
from rel_support import Child, wait_until
from rel_world import KEY, PROJECT, build_world

from throughline.core.exceptions import PageTokenError
from throughline.core.identity import project_sha256
from throughline.core.page_token import SeriesBinding, issue_page_token, open_page_token
from throughline.log import ensure_topic
from throughline.reader.token_key import default_key_path, resolve_token_key
from throughline.serve.app import ApiSettings, create_app
from throughline.testing.kafka import free_port

WORLD = build_world()
AUTH = "security-test-token-5b0f3c2a9e7d"
READ = "/v1/projects/read"
CHECKS: dict[str, int] = {}


def checked(kind: str) -> None:
    CHECKS[kind] = CHECKS.get(kind, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    rel_support.record("security", "http_and_tokens", **{k: v for k, v in sorted(CHECKS.items())}, failures=0)


# ------------------------------------------------------------------------------------------ tokens


def test_a_token_verifies_only_under_its_key_and_for_its_exact_series() -> None:
    cursors = WORLD.all_cursors()
    project = project_sha256(PROJECT)
    after, through, other = cursors[1], cursors[5], cursors[6]
    token = issue_page_token(KEY, SeriesBinding.of(project, after, through), 3)
    assert open_page_token(KEY, token, SeriesBinding.of(project, after, through)) == 3
    refusals = {
        "another key": (bytes(32), SeriesBinding.of(project, after, through), "page_token_tampered"),
        "another project": (KEY, SeriesBinding.of(project_sha256("/elsewhere"), after, through), "page_token_mismatch"),
        "another after": (KEY, SeriesBinding.of(project, other, through), "page_token_mismatch"),
        "no after": (KEY, SeriesBinding.of(project, None, through), "page_token_mismatch"),
        "another through": (KEY, SeriesBinding.of(project, after, other), "page_token_mismatch"),
        "same cursor, other spelling": (KEY, SeriesBinding.of(project, after, through + " "), "page_token_mismatch"),
    }
    for why, (key, binding, code) in refusals.items():
        with pytest.raises(PageTokenError) as refused:
            open_page_token(key, token, binding)
        assert refused.value.code == code, why
        checked("token_binding_refusals")


def test_the_generated_token_key_file_is_private(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    key = resolve_token_key(db_path=db, environ={})
    path = default_key_path(db)
    assert path.exists() and len(key) >= 32
    assert path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)
    assert resolve_token_key(db_path=db, environ={}) == key  # it survives a restart
    checked("token_key_file_private")


# ------------------------------------------------------------------------------------------ the HTTP edge


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(
        projection=WORLD.projection, log=WORLD.log, token_key=KEY, settings=ApiSettings(read_wait=0.0, auth_token=AUTH)
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _code(response: Any) -> str:
    return str(response.json()["error"]["code"])


def test_oversized_requests_are_refused(client: TestClient) -> None:
    auth = {"Authorization": f"Bearer {AUTH}"}
    big = json.dumps({"project": PROJECT, "afterCursor": "x" * 70_000}).encode()
    response = client.post(READ, content=big, headers={**auth, "Content-Type": "application/json"})
    assert (response.status_code, _code(response)) == (413, "request_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while streaming
        for _ in range(80):
            yield b" " * 1024

    response = client.post(READ, content=chunks(), headers={**auth, "Content-Type": "application/json"})
    assert (response.status_code, _code(response)) == (413, "request_too_large")
    response = client.get(READ + "?project=" + "p" * 17_000, headers=auth)
    assert (response.status_code, _code(response)) == (414, "request_too_large")
    # Refused before authentication: an unauthenticated client cannot make the server read a big body.
    response = client.post(READ, content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    checked("oversized_refused")


@pytest.mark.parametrize(
    "body", [b"[" * 5_000, b"{" * 5_000, b'{"project":' * 3_000 + b'"/p"', b'{"project": [' * 2_000]
)
def test_a_deeply_nested_json_body_is_a_400_not_a_500(client: TestClient, body: bytes) -> None:
    # Found by test_fuzz_inputs: json.loads raises RecursionError (not ValueError) on deep nesting,
    # which request_from_json does not catch, so the server answers 500 internal_error.
    response = client.post(
        READ, content=body, headers={"Authorization": f"Bearer {AUTH}", "Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert _code(response) == "invalid_arguments"
    checked("nested_json_refused")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        f"Bearer {AUTH}x",
        f"bearer {AUTH[:-1]}",
        f"Basic {AUTH}",
        f"Bearer  {AUTH} extra",
        "Bearer " + "a" * 5000,
    ],
)
def test_missing_or_wrong_credentials_are_refused(client: TestClient, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    for method, path in (("GET", READ + f"?project={PROJECT}"), ("POST", READ), ("GET", "/metrics")):
        kwargs: dict[str, Any] = {"headers": headers}
        if method == "POST":
            kwargs["json"] = {"project": PROJECT}
        response = client.request(method, path, **kwargs)
        assert response.status_code == 401, (method, path, header, response.text)
        assert _code(response) == "unauthorized"
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert AUTH not in response.text
        checked("credentials_refused")
    assert client.get(READ, params={"project": PROJECT}, headers={"Authorization": f"Bearer {AUTH}"}).status_code == 200


# ------------------------------------------------------------------------------------------ a real serve


def test_serve_refuses_a_non_loopback_address_without_a_token(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "192.0.2.1", "example.org"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "throughline.cli",
                "serve",
                "--host",
                host,
                "--port",
                "0",
                "--db",
                str(tmp_path / "x.duckdb"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=rel_support.child_env(),
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert rel_support.last_error(done.stderr) is not None
        assert rel_support.last_error(done.stderr)["code"] == "auth_token_required"  # type: ignore[index]
        checked("non_loopback_refused")


def _listening(port: int) -> list[str]:
    """Local addresses of the LISTEN sockets on ``port`` (from /proc/net/tcp and tcp6)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, state = fields[1], fields[3]
            host, hexport = address.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                out.append(host)
    return out


@pytest.mark.integration
def test_a_real_serve_binds_loopback_and_authenticates(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    ensure_topic(kafka_bootstrap, kafka_topic_name, partitions=1)
    token_file = tmp_path / "auth.token"
    token_file.write_text(AUTH + "\n")
    port = free_port()
    env = rel_support.child_env(THROUGHLINE_BOOTSTRAP_SERVERS=kafka_bootstrap, THROUGHLINE_TOPIC=kafka_topic_name)
    serve = Child(
        "serve",
        [
            "serve",
            "--port",
            str(port),
            "--db",
            str(tmp_path / "s.duckdb"),
            "--access-log",
            "--auth-token-file",
            str(token_file),
            "--log-level",
            "info",
        ],
        tmp_path,
        env,
    ).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: "http://" in serve.stdout() or not serve.alive(), timeout=120, what="serve to start")
        assert serve.alive(), serve.stderr()
        assert serve.stdout().strip() == url
        hosts = _listening(port)
        assert hosts == ["0100007F"], hosts  # 127.0.0.1, and nothing else
        for address in _other_addresses():
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                assert s.connect_ex((address, port)) != 0, f"serve answers on {address}"
            checked("non_loopback_unreachable")
        status, doc = rel_support.http_json(f"{url}{READ}?project=%2Fp")
        assert (status, doc["error"]["code"]) == (401, "unauthorized")
        request = _authorized(f"{url}{READ}?project=%2Fp", AUTH)
        assert request[0] == 200, request
        assert _authorized(f"{url}{READ}?project=%2Fp", AUTH + "x")[0] == 401
        big = json.dumps({"project": "/p", "afterCursor": "x" * 70_000}).encode()
        assert rel_support.http_json(f"{url}{READ}", data=big)[0] == 413
        assert serve.terminate() == 0
        assert AUTH not in serve.stderr(limit=1_000_000) and AUTH not in serve.stdout()
        checked("real_serve_checks")
    finally:
        serve.stop_quietly()


def _authorized(url: str, token: str) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (none on an isolated box)."""
    found: set[str] = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent
            s.connect(("192.0.2.1", 9))
            found.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127.") and a != "0.0.0.0" and os.name == "posix")
