"""Scoped tokens through the HTTP read API (docs/security.md): every endpoint under every kind of
token, allowed and refused; page tokens and long-polls under a scope; and a scan that reads with a
token for project A in every way the API allows and finds nothing of project B anywhere.

The same checks against a real ``serve`` and a real group are in tests/integration/test_serve_security.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from reader_world import KEY, OTHER_PROJECT, PROJECT, World
from served_app import ServedApp

from throughline.core.identity import project_sha256
from throughline.serve import READ_PATH
from throughline.serve.app import ApiSettings, create_app
from throughline.serve.client import HttpReader
from throughline.serve.exceptions import ForbiddenProjectError, TokenExpiredError, TokenUnknownKeyError
from throughline.serve.tokens import KeyRing, VerifiedTokens, generate_key_file, issue_token, load_signing_key

ADMIN_TOKEN = "admin-token-for-the-scope-tests-0123"
PROJECT_PREFIX = PROJECT.rsplit("/", 1)[0] + "/"


class Tokens:
    """One token of every kind the tests send, signed by a key the server holds (or not)."""

    def __init__(self, tmp_path: Path) -> None:
        generate_key_file(tmp_path / "k1.json", public_out=tmp_path / "k1.pub")
        generate_key_file(tmp_path / "stranger.json")
        self.ring = KeyRing(tmp_path / "k1.pub")
        key = load_signing_key(tmp_path / "k1.json")
        stranger = load_signing_key(tmp_path / "stranger.json")
        self.by_kind: dict[str, str | None] = {
            "none": None,
            "admin_token": ADMIN_TOKEN,
            "admin": issue_token(key, scope="admin", expires_in=600),
            "read_a": issue_token(key, projects=[PROJECT], expires_in=600),
            "read_prefix_a": issue_token(key, prefixes=[PROJECT_PREFIX], expires_in=600),
            "read_b": issue_token(key, projects=[OTHER_PROJECT], expires_in=600),
            "metrics": issue_token(key, scope="metrics", expires_in=600),
            "expired": issue_token(key, projects=[PROJECT], expires_in=60, now=time.time() - 120),
            "wrong_audience": issue_token(key, projects=[PROJECT], expires_in=600, audience="elsewhere"),
            "stranger": issue_token(stranger, projects=[PROJECT], expires_in=600),
            "garbage": "tl1.0123456789abcdef.e30.AAAA",
        }

    def header(self, kind: str) -> dict[str, str]:
        token = self.by_kind[kind]
        return {} if token is None else {"Authorization": f"Bearer {token}"}


#: What each kind of token gets from the read of project A, from /metrics, from the open endpoints.
EXPECTED: dict[str, tuple[tuple[int, str | None], tuple[int, str | None]]] = {
    "none": ((401, "unauthorized"), (401, "unauthorized")),
    "admin_token": ((200, None), (200, None)),
    "admin": ((200, None), (200, None)),
    "read_a": ((200, None), (403, "forbidden_scope")),
    "read_prefix_a": ((200, None), (403, "forbidden_scope")),
    "read_b": ((403, "forbidden_project"), (403, "forbidden_scope")),
    "metrics": ((403, "forbidden_scope"), (200, None)),
    "expired": ((401, "token_expired"), (401, "token_expired")),
    "wrong_audience": ((401, "token_wrong_audience"), (401, "token_wrong_audience")),
    "stranger": ((401, "token_unknown_key"), (401, "token_unknown_key")),
    "garbage": ((401, "token_malformed"), (401, "token_malformed")),
}


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    return Tokens(tmp_path)


@pytest.fixture
def world() -> World:
    w = World()
    w.append_many(3)
    w.append_many(2, project=OTHER_PROJECT, body="BODY-OF-PROJECT-B must never show")
    return w


def _app(world: World, tokens: Tokens, **overrides: Any) -> Any:
    settings = ApiSettings(auth_token=ADMIN_TOKEN, **{"read_wait": 0.0, **overrides})
    return create_app(
        projection=world.projection,
        log=world.log,
        token_key=KEY,
        settings=settings,
        tokens=VerifiedTokens(tokens.ring, "throughline"),
    )


@pytest.fixture
def client(world: World, tokens: Tokens) -> Iterator[TestClient]:
    with TestClient(_app(world, tokens), raise_server_exceptions=False) as c:
        yield c


def _code(response: Any) -> str | None:
    return response.json()["error"]["code"] if response.status_code != 200 else None


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_endpoint_under_every_token(client: TestClient, tokens: Tokens, kind: str) -> None:
    (read_status, read_code), (metrics_status, metrics_code) = EXPECTED[kind]
    headers = tokens.header(kind)
    answers = [
        client.get(READ_PATH, params={"project": PROJECT}, headers=headers),
        client.post(READ_PATH, json={"project": PROJECT}, headers=headers),
    ]
    for answer in answers:
        assert (answer.status_code, _code(answer)) == (read_status, read_code), answer.text
        if read_status == 401:
            assert answer.headers["www-authenticate"].startswith("Bearer")
        if read_status == 200:
            assert answer.json()["turns"]
    metrics = client.get("/metrics", headers=headers)
    assert (metrics.status_code, _code(metrics)) == (metrics_status, metrics_code)
    for path in ("/healthz", "/readyz", "/openapi.json"):  # open by design: nothing of a project in them
        assert client.get(path, headers=headers).status_code == 200


def test_a_prefix_covers_only_what_starts_with_it(client: TestClient, tokens: Tokens) -> None:
    headers = tokens.header("read_prefix_a")
    assert client.get(READ_PATH, params={"project": PROJECT + "-sibling"}, headers=headers).status_code == 200
    refused = client.get(READ_PATH, params={"project": PROJECT_PREFIX[:-1]}, headers=headers)
    assert (refused.status_code, _code(refused)) == (403, "forbidden_project")


def test_refusal_says_nothing_of_whether_the_project_exists(client: TestClient, tokens: Tokens) -> None:
    headers = tokens.header("read_a")
    existing = client.get(READ_PATH, params={"project": OTHER_PROJECT}, headers=headers)
    missing = client.get(READ_PATH, params={"project": "/home/nobody/never-written"}, headers=headers)
    empty = client.get(READ_PATH, params={"project": ""}, headers=headers)
    assert existing.status_code == missing.status_code == empty.status_code == 403
    assert existing.content == missing.content == empty.content
    assert {k: v for k, v in existing.headers.items() if k != "content-length"} == {
        k: v for k, v in missing.headers.items() if k != "content-length"
    }


def _paged(client: TestClient, world: World, headers: dict[str, str]) -> dict[str, Any]:
    first = client.post(READ_PATH, json={"project": PROJECT}, headers=headers).json()
    world.append_many(5)
    page = client.post(
        READ_PATH,
        json={"project": PROJECT, "afterCursor": first["throughCursor"], "limit": 2},
        headers=headers,
    ).json()
    assert page["page"]["complete"] is False and page["page"]["nextToken"]
    return {"project": PROJECT, "afterCursor": first["throughCursor"], "throughCursor": page["throughCursor"],
            "pageToken": page["page"]["nextToken"], "limit": 2}  # fmt: skip


def test_a_page_token_is_refused_under_a_scope_that_does_not_cover_its_project(
    client: TestClient, world: World, tokens: Tokens
) -> None:
    body = _paged(client, world, tokens.header("admin"))
    for kind in ("read_b", "metrics"):
        refused = client.post(READ_PATH, json=body, headers=tokens.header(kind))
        assert refused.status_code == 403, kind
    # Moved onto project B's name, the page token is refused as not B's (and B is outside the scope).
    moved = client.post(READ_PATH, json=dict(body, project=OTHER_PROJECT), headers=tokens.header("read_a"))
    assert moved.status_code == 403
    allowed = client.post(READ_PATH, json=body, headers=tokens.header("read_a"))
    assert allowed.status_code == 200 and allowed.json()["turns"]


def test_a_long_poll_outside_the_scope_is_refused_at_once(client: TestClient, tokens: Tokens) -> None:
    started = time.monotonic()
    refused = client.post(READ_PATH, json={"project": OTHER_PROJECT, "wait": 5}, headers=tokens.header("read_a"))
    assert refused.status_code == 403 and time.monotonic() - started < 2.0
    refused = client.get(READ_PATH, params={"project": OTHER_PROJECT, "wait": "5"}, headers=tokens.header("read_a"))
    assert refused.status_code == 403 and time.monotonic() - started < 4.0


def test_refused_reads_are_counted_without_a_project_label(client: TestClient, tokens: Tokens) -> None:
    client.get(READ_PATH, params={"project": OTHER_PROJECT}, headers=tokens.header("read_a"))
    text = client.get("/metrics", headers=tokens.header("metrics")).text
    assert 'throughline_read_errors_total{code="forbidden_project"} 1' in text
    assert OTHER_PROJECT not in text and PROJECT not in text


def _hex(project: str) -> str:
    return project_sha256(project).hex()


def test_a_token_for_a_finds_nothing_of_b(world: World, tokens: Tokens, caplog: pytest.LogCaptureFixture) -> None:
    """Every way the API reads, with project A's token: no answer, header, metric or log line holds
    project B's name, its hash, its turns' bodies, or the token itself."""
    caplog.set_level(logging.DEBUG)
    token = tokens.by_kind["read_a"]
    assert token is not None
    seen: list[str] = []
    with TestClient(_app(world, tokens), raise_server_exceptions=False) as client:
        headers = tokens.header("read_a")
        admin = tokens.header("admin")
        b_page = client.post(READ_PATH, json={"project": OTHER_PROJECT}, headers=admin).json()
        world.append_many(3, project=OTHER_PROJECT, body="BODY-OF-PROJECT-B must never show")
        b_delta = client.post(
            READ_PATH,
            json={"project": OTHER_PROJECT, "afterCursor": b_page["throughCursor"], "limit": 1},
            headers=admin,
        ).json()
        a_body = _paged(client, world, headers)
        requests: list[tuple[str, dict[str, Any]]] = [
            ("GET", {"project": OTHER_PROJECT}),
            ("GET", {"project": OTHER_PROJECT, "limit": "1000"}),
            ("GET", {"project": OTHER_PROJECT, "wait": "1"}),
            ("POST", {"project": OTHER_PROJECT, "afterCursor": b_page["throughCursor"]}),
            ("POST", {"project": PROJECT, "afterCursor": b_page["throughCursor"]}),
            ("POST", {"project": PROJECT, "throughCursor": b_delta["throughCursor"]}),
            ("POST", dict(a_body, pageToken=b_delta["page"]["nextToken"])),
            ("POST", dict(a_body, throughCursor=b_delta["throughCursor"])),
            ("POST", {"project": PROJECT, "limit": 0}),
            ("POST", {"project": PROJECT, "bogus": OTHER_PROJECT}),
            ("POST", {"project": [OTHER_PROJECT]}),
            ("GET", {"project": [PROJECT, OTHER_PROJECT]}),
            ("POST", a_body),
            ("GET", {"project": PROJECT}),
            ("GET", {"project": PROJECT, "wait": "0.2"}),
        ]
        for method, params in requests:
            if method == "GET":
                answer = client.get(READ_PATH, params=params, headers=headers)
            else:
                answer = client.post(READ_PATH, json=params, headers=headers)
            assert answer.status_code in (200, 400, 403), (params, answer.text)
            seen.append(answer.text)
            seen.extend(f"{k}: {v}" for k, v in answer.headers.items())
        for path in ("/metrics", "/healthz", "/readyz", "/openapi.json"):
            answer = client.get(path, headers=headers)
            seen.append(answer.text)
            seen.extend(f"{k}: {v}" for k, v in answer.headers.items())
        seen.append(client.get("/metrics", headers=tokens.header("metrics")).text)
    seen.extend(record.getMessage() for record in caplog.records)
    everything = "\n".join(seen)
    for secret in (OTHER_PROJECT, _hex(OTHER_PROJECT), "BODY-OF-PROJECT-B", token, ADMIN_TOKEN):
        assert secret not in everything, secret


def test_the_client_sends_the_token_and_raises_the_typed_refusals(world: World, tokens: Tokens) -> None:
    settings = ApiSettings(auth_token=ADMIN_TOKEN, read_wait=0.0)
    verifier = VerifiedTokens(tokens.ring, "throughline")
    with ServedApp(world, settings, tokens=verifier) as served:
        read = HttpReader(served.url, token=tokens.by_kind["read_a"]).read_observer_turn_page(project=PROJECT)
        assert read.ok and read.turns
        with pytest.raises(ForbiddenProjectError):
            HttpReader(served.url, token=tokens.by_kind["read_a"]).read_observer_turn_page(project=OTHER_PROJECT)
        with pytest.raises(TokenExpiredError):
            HttpReader(served.url, token=tokens.by_kind["expired"]).read_observer_turn_page(project=PROJECT)
        with pytest.raises(TokenUnknownKeyError):
            HttpReader(served.url, token=tokens.by_kind["stranger"]).read_observer_turn_page(project=PROJECT)


def test_a_405_names_every_method_of_the_path(client: TestClient) -> None:
    for method in ("PUT", "DELETE", "PATCH"):
        answer = client.request(method, READ_PATH, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert answer.status_code == 405 and answer.headers["allow"] == "GET, POST"
    assert client.request("POST", "/metrics").headers["allow"] == "GET"
