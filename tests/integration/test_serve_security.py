"""Scoped tokens, HTTPS and key rotation through real ``throughline serve`` processes (docs/security.md).

Two tests, each starting real processes on loopback against the test broker:

- one ``serve --token-keys DIR --tls-cert F --tls-key F --access-log``: every endpoint under every
  kind of token over HTTPS; the CLI clients (``read``, ``observe``, ``status --url``) sending a scoped
  token from a file and from the environment with ``--ca``; nothing of project B and no token in the
  access log; a key added and one retired with SIGHUP;
- a group of three members over mutual TLS, forwarding to each other's ``https://`` URLs (each
  verifies the other's certificate and presents its own), each verifying the caller's token itself; the documented rotation done while an Observer follows a project through
  the three members: nothing refused that should pass, every turn seen once and in order, and the
  retired key's tokens refused by every member afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.certs import Pki, make_pki
from test_serve import OTHER, PROJECT, Serve, produce, turn
from test_serve_group import PARTITIONS, PROJECTS, _free_port, _settled

from throughline.core.identity import project_sha256
from throughline.errors import ThroughlineError
from throughline.producers.producer import TurnProducer
from throughline.serve.client import HttpReader
from throughline.serve.exceptions import ServerUnavailableError
from throughline.serve.tokens import generate_key_file, issue_token, load_signing_key

ADMIN = "admin-token-for-the-security-tests-01"
READ_PATH = "/v1/projects/read"
DEADLINE = 120.0


def _wait(what: str, condition: Callable[[], bool], timeout: float = DEADLINE) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.2)


class HttpsServe(Serve):
    """A ``serve`` over HTTPS with scoped tokens; requests verify it with the test CA."""

    scheme = "https://"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        db: Path,
        pki: Pki,
        keys: Path,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            bootstrap,
            topic,
            db,
            "--token-keys", str(keys), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
            "--log-level", "info", "--access-log", *extra,
            env={"THROUGHLINE_AUTH_TOKEN": ADMIN, **(env or {})},
        )  # fmt: skip
        self.context = ssl.create_default_context(cafile=str(pki.ca))
        self.context.load_cert_chain(str(pki.cert), str(pki.key))  # for members that require mutual TLS

    def hup(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def code(self, method: str, path: str, token: str | None, **body: Any) -> tuple[int, str | None]:
        if method == "GET":
            query = ("?" + urllib.parse.urlencode(body)) if body else ""
            status, _, payload = self.request("GET", path + query, token=token)
        else:
            status, _, payload = self.request("POST", path, body=body, token=token)
        if status == 200:
            return 200, None
        return status, json.loads(payload)["error"]["code"]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def running() -> Iterator[list[Serve]]:
    servers: list[Serve] = []
    yield servers
    for s in servers:
        s.kill()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "throughline.cli", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_one_serve_over_https_with_scoped_tokens(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path, pki: Pki, running: list[Serve]
) -> None:
    topic = kafka_topic_name
    produce(kafka_bootstrap, topic, [turn(n, seq=n) for n in range(1, 4)] + [turn(1, project=OTHER)])
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_key_file(tmp_path / "k1.json", public_out=keys / "k1.pub")
    k1 = load_signing_key(tmp_path / "k1.json")
    tokens = {
        "read_a": issue_token(k1, projects=[PROJECT], expires_in=600),
        "read_b": issue_token(k1, projects=[OTHER], expires_in=600),
        "metrics": issue_token(k1, scope="metrics", expires_in=600),
        "admin": issue_token(k1, scope="admin", expires_in=600),
        "expired": issue_token(k1, projects=[PROJECT], expires_in=60, now=time.time() - 120),
    }
    serve = HttpsServe(kafka_bootstrap, topic, tmp_path / "p.duckdb", pki, keys)
    running.append(serve)
    serve.start()
    _wait("the turns projected", lambda: serve.post({"project": PROJECT}, token=ADMIN)[1].get("turns", []) != [])

    expected = {
        None: ((401, "unauthorized"), (401, "unauthorized")),
        ADMIN: ((200, None), (200, None)),
        tokens["admin"]: ((200, None), (200, None)),
        tokens["read_a"]: ((200, None), (403, "forbidden_scope")),
        tokens["read_b"]: ((403, "forbidden_project"), (403, "forbidden_scope")),
        tokens["metrics"]: ((403, "forbidden_scope"), (200, None)),
        tokens["expired"]: ((401, "token_expired"), (401, "token_expired")),
        "tl1.0123456789abcdef.e30.AAAA": ((401, "token_malformed"), (401, "token_malformed")),
    }
    for token, (read, metrics) in expected.items():
        assert serve.code("GET", READ_PATH, token, project=PROJECT) == read
        assert serve.code("POST", READ_PATH, token, project=PROJECT) == read
        assert serve.code("GET", READ_PATH, token, project=PROJECT, wait="1") == read
        assert serve.code("GET", "/metrics", token) == metrics
        for path in ("/healthz", "/readyz", "/openapi.json"):
            assert serve.code("GET", path, token)[0] == 200
    assert serve.code("GET", READ_PATH, tokens["read_a"], project=OTHER) == (403, "forbidden_project")
    assert serve.code("GET", READ_PATH, tokens["read_a"], project="/never/written") == (
        403,
        "forbidden_project",
    )

    # The leak scan over the wire: project A's token, every way to ask about B; nothing of B comes back.
    _, _, b_doc = serve.request("POST", READ_PATH, body={"project": OTHER}, token=ADMIN)
    b_cursor = json.loads(b_doc)["throughCursor"]
    answers: list[str] = []
    for method, body in (
        ("GET", {"project": OTHER}),
        ("GET", {"project": OTHER, "wait": "1"}),
        ("GET", {"project": PROJECT, "afterCursor": b_cursor}),
        ("POST", {"project": OTHER, "afterCursor": b_cursor}),
        ("POST", {"project": PROJECT, "throughCursor": b_cursor}),
        ("POST", {"project": PROJECT + "/../other-project"}),
        ("POST", {"project": [OTHER]}),
    ):
        if method == "GET":
            query = READ_PATH + "?" + urllib.parse.urlencode(body)
            status, headers, payload = serve.request("GET", query, token=tokens["read_a"])
        else:
            status, headers, payload = serve.request("POST", READ_PATH, body=body, token=tokens["read_a"])
        assert status in (200, 400, 403), (body, status)  # A with B's cursor: resync_required
        answers.append(payload.decode() + json.dumps(headers))
    answers.append(serve.metrics(ADMIN))
    scanned = "\n".join(answers)
    for secret in (OTHER, project_sha256(OTHER).hex(), "turn 1 of main", tokens["read_a"], ADMIN):
        assert secret not in scanned, secret

    # The CLI clients: the token from a file and from the environment, the server verified with --ca.
    token_file = tmp_path / "read_a.token"
    token_file.write_text(tokens["read_a"] + "\n")
    remote = ["--url", serve.url, "--ca", str(pki.ca)]
    done = _cli("read", *remote, "--auth-token-file", str(token_file), "--project", PROJECT)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["turns"]) == 3
    refused = _cli("read", *remote, "--auth-token-file", str(token_file), "--project", OTHER)
    assert refused.returncode == 1 and json.loads(refused.stderr)["error"]["code"] == "forbidden_project"
    env = {"THROUGHLINE_AUTH_TOKEN": tokens["read_a"], "THROUGHLINE_CA": str(pki.ca)}
    observed = _cli("observe", "--url", serve.url, "--project", PROJECT, "--state", str(tmp_path / "obs.json"), env=env)
    assert observed.returncode == 0, observed.stderr
    untrusted = _cli("read", "--url", serve.url, "--project", PROJECT, env={"THROUGHLINE_AUTH_TOKEN": tokens["read_a"]})
    assert untrusted.returncode == 1
    assert json.loads(untrusted.stderr)["error"]["code"] == "tls_untrusted_certificate"
    status = _cli("status", "--url", serve.url, "--json", env=env)
    assert status.returncode == 0 and json.loads(status.stdout)["ready"] is True, status.stderr

    # Rotation on one member: a second key verifies after SIGHUP; the first, retired, no longer does.
    generate_key_file(tmp_path / "k2.json", public_out=tmp_path / "k2.pub")
    k2_token = issue_token(load_signing_key(tmp_path / "k2.json"), projects=[PROJECT], expires_in=600)
    assert serve.code("GET", READ_PATH, k2_token, project=PROJECT) == (401, "token_unknown_key")
    shutil.copy(tmp_path / "k2.pub", keys / "k2.pub")
    serve.hup()
    _wait("k2 accepted", lambda: serve.code("GET", READ_PATH, k2_token, project=PROJECT) == (200, None), 30)
    assert serve.code("GET", READ_PATH, tokens["read_a"], project=PROJECT) == (200, None)
    (keys / "k1.pub").unlink()
    serve.hup()
    _wait("k1 retired", lambda: serve.code("GET", READ_PATH, tokens["read_a"], project=PROJECT)[0] == 401, 30)
    assert serve.code("GET", READ_PATH, tokens["read_a"], project=PROJECT) == (401, "token_unknown_key")
    assert serve.code("GET", READ_PATH, k2_token, project=PROJECT) == (200, None)

    assert serve.terminate() == 0
    log = serve.stderr_path.read_text(encoding="utf-8", errors="replace")
    assert "GET /v1/projects/read?..." in log, log[-2000:]  # the access log ran, without its query
    for secret in (PROJECT, OTHER, urllib.parse.quote(PROJECT, safe=""), ADMIN, *tokens.values(), k2_token):
        assert secret not in log, secret


# ------------------------------------------------------------------------------------------ a group


class HttpsMember(HttpsServe):
    """One ``serve --group`` member over mutual TLS (its clients, other members included, present a
    certificate the test CA signed), with its own key folder, advertising an https URL."""

    def __init__(self, bootstrap: str, topic: str, db: Path, pki: Pki, keys: Path, group: str) -> None:
        super().__init__(
            bootstrap, topic, db, pki, keys, "--ca", str(pki.ca), "--tls-client-ca", str(pki.ca),
            env={"THROUGHLINE_GROUP": group, "THROUGHLINE_GROUP_SESSION_TIMEOUT_MS": "6000"},
        )  # fmt: skip
        port = _free_port()
        self.advertised = f"https://127.0.0.1:{port}"
        self.args = [*self.args, "--port", str(port), "--advertise", self.advertised]

    def readyz(self) -> dict[str, Any]:
        return dict(self.get("/readyz")[1])


def test_rotation_while_an_observer_follows_three_members_over_https(
    kafka_bootstrap: str,
    kafka_topic_name: str,
    kafka_group_id: str,
    tmp_path: Path,
    pki: Pki,
    running: list[Serve],
) -> None:
    topic = kafka_topic_name
    followed = PROJECTS[0]
    producer = TurnProducer(kafka_bootstrap, topic, partitions=PARTITIONS)
    counter = [0]

    def produce_round() -> None:
        counter[0] += 1
        n = counter[0]
        for project in PROJECTS:
            producer.append(**turn(n, project=project, seq=n))
        producer.flush()

    produce_round()
    generate_key_file(tmp_path / "k1.json", public_out=tmp_path / "k1.pub")
    folders = []
    members = []
    for i in range(3):
        folder = tmp_path / f"keys-{i}"
        folder.mkdir()
        shutil.copy(tmp_path / "k1.pub", folder / "k1.pub")
        folders.append(folder)
        member = HttpsMember(kafka_bootstrap, topic, tmp_path / f"m{i}.duckdb", pki, folder, kafka_group_id)
        running.append(member)
        members.append(member)
    for member in members:
        member.start()
    _wait("the group settled", lambda: _settled(members))  # type: ignore[arg-type]
    with pytest.raises(ServerUnavailableError):  # mutual TLS: no client certificate, no handshake
        HttpReader(members[0].url, token=ADMIN, ca=str(pki.ca), timeout=5).read_observer_turn_page(project=followed)

    k1 = load_signing_key(tmp_path / "k1.json")
    current = [issue_token(k1, projects=[followed], expires_in=600)]
    refused: list[str] = []
    seen: list[str] = []
    stop = threading.Event()
    urls = [m.url for m in members]

    def follow() -> None:
        after: str | None = None
        for _ in range(100_000):
            if stop.is_set():
                return
            reader = HttpReader(
                urls, token=current[0], ca=str(pki.ca), client_cert=str(pki.cert), client_key=str(pki.key),
                wait=0.5, timeout=30,
            )  # fmt: skip
            try:
                page = reader.read_observer_turn_page(project=followed, after_cursor=after, limit=100)
                pages = [page]
                while page.ok and not page.page.complete:
                    page = reader.read_observer_turn_page(
                        project=followed, after_cursor=after, through_cursor=page.throughCursor,
                        page_token=page.page.nextToken, limit=100,
                    )  # fmt: skip
                    pages.append(page)
            except ThroughlineError as exc:
                if not exc.retriable:
                    refused.append(exc.code)
                time.sleep(0.2)
                continue
            if not all(p.ok for p in pages):
                time.sleep(0.1)
                continue
            seen.extend(t.body for p in pages for t in p.turns)
            after = pages[-1].throughCursor

    observer = threading.Thread(target=follow, daemon=True)
    observer.start()
    try:
        produce_round()
        # A second key only member 0 knows yet: member 0 accepts it, and a read it forwards is
        # refused by the member that answers, which checks the caller's token itself.
        generate_key_file(tmp_path / "k2.json", public_out=tmp_path / "k2.pub")
        k2 = load_signing_key(tmp_path / "k2.json")
        k2_admin = issue_token(k2, scope="admin", expires_in=600)
        shutil.copy(tmp_path / "k2.pub", folders[0] / "k2.pub")
        members[0].hup()
        _wait("member 0 accepts k2", lambda: members[0].code("GET", "/metrics", k2_admin) == (200, None), 30)
        answers = {members[0].code("GET", READ_PATH, k2_admin, project=p) for p in PROJECTS}
        assert (200, None) in answers and (401, "token_unknown_key") in answers, answers
        # Every member, every project (held or forwarded): a read token of another project is refused
        # by the member asked, before anything is forwarded; the metrics token reads no project.
        other = issue_token(k1, projects=[PROJECTS[1]], expires_in=600)
        metrics = issue_token(k1, scope="metrics", expires_in=600)
        for member in members:
            for p in PROJECTS[2:]:
                assert member.code("GET", READ_PATH, other, project=p) == (403, "forbidden_project")
                assert member.code("POST", READ_PATH, metrics, project=p) == (403, "forbidden_scope")
            assert member.code("POST", READ_PATH, other, project=PROJECTS[1]) == (200, None)
            assert member.code("GET", "/metrics", metrics) == (200, None)
            assert member.code("GET", "/metrics", other) == (403, "forbidden_scope")
        produce_round()
        # The documented rotation: the new public key to every member, then tokens of the new key,
        # then the old key retired everywhere.
        for folder in folders[1:]:
            shutil.copy(tmp_path / "k2.pub", folder / "k2.pub")
        for member in members[1:]:
            member.hup()
        for member in members:
            _wait("k2 everywhere", lambda m=member: m.code("GET", "/metrics", k2_admin) == (200, None), 30)  # type: ignore[misc]
        assert {members[0].code("GET", READ_PATH, k2_admin, project=p) for p in PROJECTS} == {(200, None)}
        produce_round()
        old = current[0]
        current[0] = issue_token(k2, projects=[followed], expires_in=600)
        produce_round()
        for folder in folders:
            (folder / "k1.pub").unlink()
        for member in members:
            member.hup()
        for member in members:
            _wait("k1 retired", lambda m=member: m.code("GET", READ_PATH, old, project=followed)[0] == 401, 30)  # type: ignore[misc]
            assert member.code("POST", READ_PATH, old, project=followed) == (401, "token_unknown_key")
        produce_round()
        expected = [turn(n)["body"] for n in range(1, counter[0] + 1)]
        _wait("the Observer saw every turn", lambda: len(seen) >= len(expected), 60)
    finally:
        stop.set()
        observer.join(timeout=60)
        producer.close()
    assert refused == []
    assert seen == expected
    for member in members:
        assert member.terminate() == 0
        log = member.stderr_path.read_text(encoding="utf-8", errors="replace")
        for secret in (followed, ADMIN, old, current[0], k2_admin):
            assert secret not in log, secret
