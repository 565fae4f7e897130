"""No raw identity leaves the system (docs/reliability.md#6-security-review).

The history of ``rel_world`` names its project, hosts, threads and turn ids with secret markers. None
of those strings (nor their UTF-8 bytes) may appear in:

- a cursor (its text, or its decoded payload bytes) or a page token (text, payload; the payload holds
  exactly the five schema fields, all hashes and one integer);
- a read wire document of any status, over the in-memory and the DuckDB projection, or the reason
  a pending or resync answer carries (on the Python object and in the ``Throughline-Reason`` header);
- the message of any error of the read path (every ``invalid_*`` and ``page_token_*`` code,
  ``source_quarantined``, a wrong key), even when the caller's bad cursor, token or project contains
  those strings (a malformed ``limit`` or ``wait`` is quoted back to the caller who sent it: it is
  never a value the system holds);
- any HTTP answer of the serve app (reads, errors of every status, ``/healthz``, ``/readyz``,
  ``/metrics``, ``/openapi.json``) or its headers;
- the quarantine reasons the projection stores (what ``throughline status`` shows) for every kind of
  refused record.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rel_support
from fastapi.testclient import TestClient
from rel_world import (
    HOSTS,
    KEY,
    OTHER_PROJECT,
    PROJECT,
    SECRET_MARKERS,
    THREADS,
    TOPIC,
    FixedWorld,
    build_world,
)

from throughline.core.cursor import decode_cursor
from throughline.core.encoding import b64url_decode
from throughline.core.identity import project_sha256
from throughline.core.memory import FixedLog
from throughline.core.page_token import SeriesBinding, issue_page_token
from throughline.core.turn import build_turn
from throughline.errors import ThroughlineError
from throughline.projector.store import DuckProjection, LogRecord
from throughline.reader import ObserverRead, read_observer_turn_page
from throughline.schemas.codec import encode_datum, encode_turn, turn_to_avro
from throughline.serve.app import ApiSettings, create_app

WORLD: FixedWorld = build_world()
RAW: tuple[str, ...] = (
    PROJECT,
    OTHER_PROJECT,
    *HOSTS,
    *THREADS,
    *(r.turn_id for r, _, _ in WORLD.records),
    *SECRET_MARKERS,
)
CHECKED: dict[str, int] = {}


def clean(text: str | bytes, where: str) -> None:
    """``text`` holds no raw identity (as text, or as UTF-8 bytes)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    for raw in RAW:
        assert raw.encode("utf-8") not in data, f"{where} leaks {raw!r}"
    CHECKED[where.split(":")[0]] = CHECKED.get(where.split(":")[0], 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    rel_support.record("security", "no_raw_identity_leaks", documents_checked=sum(CHECKED.values()), leaks=0)
    rel_support.record("security", "no_raw_identity_leaks", by_kind=dict(sorted(CHECKED.items())))


@pytest.fixture(scope="module")
def duck() -> Iterator[DuckProjection]:
    with WORLD.temporary_duck("leaks") as projection:
        yield projection


def read(projection: Any, log: Any = None, **params: Any) -> ObserverRead | ThroughlineError:
    try:
        return read_observer_turn_page(
            projection=projection,
            log=log or WORLD.log,
            token_key=KEY,
            wait_timeout=params.pop("wait_timeout", 0.0),
            **params,
        )
    except ThroughlineError as exc:
        return exc


def check_outcome(result: ObserverRead | ThroughlineError, where: str) -> None:
    if isinstance(result, ThroughlineError):
        clean(result.message, f"error message:{where}")
        clean(json.dumps(result.to_json(), ensure_ascii=False), f"error document:{where}")
        return
    clean(result.to_json(), f"wire document:{where}")
    clean(result.reason, f"reason:{where}")
    for text in (result.afterCursor, result.throughCursor, result.page.nextToken):
        if text is not None:
            check_opaque(text)


def check_opaque(text: str) -> None:
    """A cursor or token: its text and its decoded payload bytes hold no raw identity."""
    clean(text, "opaque text")
    if text.startswith("tlc"):
        payload = b64url_decode(text.split(".", 1)[1])
        assert payload is not None and len(payload) == 116
        clean(payload, "cursor payload")
    elif text.startswith("tlp"):
        _, body, tag = text.split(".")
        payload = b64url_decode(body)
        assert payload is not None
        clean(payload, "token payload")
        document = json.loads(payload)
        assert set(document) == {"afterSha256", "offset", "projectSha256", "schema", "throughSha256"}
        assert all(
            len(document[k]) == 64 and int(document[k], 16) >= 0
            for k in ("afterSha256", "projectSha256", "throughSha256")
        )
        assert type(document["offset"]) is int


# ------------------------------------------------------------------------------------------ library


def test_cursors_hold_only_hashes_and_numbers() -> None:
    for text in WORLD.all_cursors():
        check_opaque(text)
        cursor = decode_cursor(text)
        assert len(cursor.project_sha256) == 32 and len(cursor.source_sha256) == 32  # type: ignore[union-attr]


def test_every_series_over_both_projections_leaks_nothing(duck: DuckProjection) -> None:
    afters: list[str | None] = [None, *WORLD.all_cursors()]
    for projection, name in ((WORLD.projection, "book"), (duck, "duckdb")):
        for project in (PROJECT, OTHER_PROJECT):
            for after in afters:
                for limit in (1, 3, 10):
                    page = read(projection, project=project, after_cursor=after, limit=limit)
                    check_outcome(page, f"{name}:{project == PROJECT}")
                    for _ in range(40):
                        if not isinstance(page, ObserverRead) or not page.ok or page.page.complete:
                            break
                        page = read(
                            projection,
                            project=project,
                            after_cursor=after,
                            through_cursor=page.throughCursor,
                            page_token=page.page.nextToken,
                            limit=limit,
                        )
                        check_outcome(page, name)


def test_pending_answers_leak_nothing() -> None:
    ahead = FixedLog(WORLD.log.partitions, {p: end + 5 for p, end in WORLD.log.ends.items()})
    for after in [None, *WORLD.all_cursors()[:8]]:
        result = read(WORLD.projection, ahead, project=PROJECT, after_cursor=after)
        assert isinstance(result, ObserverRead) and result.status == "projection_pending"
        check_outcome(result, "pending")


def test_every_error_of_the_read_path_leaks_nothing() -> None:
    head = WORLD.head()
    token_ok = issue_page_token(KEY, SeriesBinding.of(project_sha256(PROJECT), None, head), 0)
    bait = f"{PROJECT}|{HOSTS[0]}|{THREADS[0]}|{WORLD.records[0][0].turn_id}"
    broken_cursor = next(
        c
        for c in WORLD.all_cursors()
        if decode_cursor(c).source_sha256 in WORLD.projection.book.broken  # type: ignore[union-attr]
    )
    cases: list[dict[str, Any]] = [
        {"limit": 0},
        {"limit": 101},
        {"limit": "ten"},
        {"limit": True},
        {"project": ""},
        {"project": "\x00" + PROJECT},
        {"project": PROJECT * 2000},
        {"project": None},
        {"after_cursor": bait},
        {"through_cursor": bait},
        {"after_cursor": "tlc1." + bait},
        {"page_token": bait},
        {"page_token": bait, "through_cursor": head},
        {"page_token": "tlp1." + bait + "." + bait, "through_cursor": head},
        {"page_token": "tlp2.abc.def", "through_cursor": head},
        {"page_token": "x" * 5000, "through_cursor": head},
        {"page_token": token_ok[:-2] + ("AA" if not token_ok.endswith("AA") else "BA"), "through_cursor": head},
        {"page_token": token_ok, "through_cursor": head, "after_cursor": WORLD.all_cursors()[3]},
        {
            "page_token": issue_page_token(KEY, SeriesBinding.of(project_sha256(PROJECT), None, head), 999),
            "through_cursor": head,
        },
        {"through_cursor": broken_cursor},
        {"after_cursor": broken_cursor},
        {"body_limit": -1},
        {"wait_timeout": -1.0},
    ]
    codes = set()
    for case in cases:
        params: dict[str, Any] = {"project": PROJECT, **case}
        result = read(WORLD.projection, **params)
        assert isinstance(result, ThroughlineError), case
        codes.add(result.code)
        check_outcome(result, f"error {result.code}")
    try:
        read_observer_turn_page(project=PROJECT, projection=WORLD.projection, log=WORLD.log, token_key=b"short")
    except ThroughlineError as exc:
        check_outcome(exc, "token key")
        codes.add(exc.code)
    expected = {
        "invalid_limit",
        "invalid_project",
        "invalid_cursor",
        "page_token_unbound",
        "page_token_malformed",
        "page_token_version",
        "page_token_oversize",
        "page_token_tampered",
        "page_token_mismatch",
        "page_token_offset",
        "source_quarantined",
        "invalid_body_limit",
        "invalid_wait",
        "token_key_unavailable",
    }
    assert expected <= codes, expected - codes


# ------------------------------------------------------------------------------------------ HTTP


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(
        projection=WORLD.projection,
        log=WORLD.log,
        token_key=KEY,
        settings=ApiSettings(read_wait=0.0, max_wait=0.01, auth_token="leak-test-token-0123456789"),
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _http(client: TestClient, method: str, url: str, **kwargs: Any) -> Any:
    kwargs.setdefault("headers", {"Authorization": "Bearer leak-test-token-0123456789"})
    response = client.request(method, url, **kwargs)
    clean(response.content, f"http body:{url}")
    for name, value in response.headers.items():
        clean(f"{name}: {value}", f"http header:{url}")
    return response


def test_http_answers_leak_nothing(client: TestClient) -> None:
    head = WORLD.head()
    bait = f"{PROJECT}/{HOSTS[1]}/{THREADS[1]}"
    statuses = set()
    for params in (
        {"project": PROJECT},
        {"project": PROJECT, "limit": 1, "afterCursor": WORLD.all_cursors()[2]},
        {"project": PROJECT, "afterCursor": WORLD.all_cursors()[-1]},
        {"project": OTHER_PROJECT, "afterCursor": head},
        {"project": PROJECT, "throughCursor": bait},
        {"project": PROJECT, "limit": "ten"},
        {"project": PROJECT, "pageToken": bait},
        {"project": PROJECT, "throughCursor": head, "pageToken": bait},
        {"project": ""},
        {
            "project": PROJECT,
            "throughCursor": next(
                c for c in WORLD.all_cursors() if decode_cursor(c).source_sha256 in WORLD.projection.book.broken
            ),
        },  # type: ignore[union-attr]
    ):
        statuses.add(_http(client, "GET", "/v1/projects/read", params=params).status_code)
        statuses.add(_http(client, "POST", "/v1/projects/read", json=params).status_code)
    statuses.add(_http(client, "GET", "/v1/projects/read", params={"project": PROJECT}, headers={}).status_code)
    statuses.add(
        _http(
            client,
            "GET",
            "/v1/projects/read",
            params={"project": PROJECT},
            headers={"Authorization": f"Bearer {bait}".encode()},
        ).status_code
    )
    statuses.add(_http(client, "POST", "/v1/projects/read", content=b"x" * 70_000).status_code)
    statuses.add(_http(client, "GET", "/v1/projects/read?project=" + "a" * 17_000).status_code)
    statuses.add(_http(client, "GET", "/nowhere/" + THREADS[0]).status_code)
    statuses.add(_http(client, "DELETE", "/v1/projects/read").status_code)
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        statuses.add(_http(client, "GET", path).status_code)
    assert {200, 400, 401, 404, 405, 409, 413, 414} <= statuses, statuses


# ------------------------------------------------------------------------------------------ quarantine


def test_quarantine_reasons_leak_nothing(tmp_path: Path) -> None:
    project = PROJECT
    good = build_turn(
        project=project,
        host=HOSTS[0],
        thread=THREADS[0],
        turn_id="SECRETTURN-q1",
        completed_at_micros=1,
        body="x",
        seq=1,
    )
    conflicting = build_turn(
        project=project, host=HOSTS[0], thread=THREADS[0], turn_id="SECRETTURN-q1", completed_at_micros=2, body="y"
    )
    gap = build_turn(
        project=project,
        host=HOSTS[1],
        thread=THREADS[1],
        turn_id="SECRETTURN-q2",
        completed_at_micros=3,
        body="z",
        seq=9,
    )
    datum = turn_to_avro(good)
    datum["host"] = HOSTS[0] + "\x00"  # unsound: NUL in a name
    unsound = encode_datum(datum, 2)
    datum = turn_to_avro(good)
    datum["contentDigest"] = bytes(32)  # a digest that does not match
    forged = encode_datum(datum, 2)
    values = [
        encode_turn(good),
        encode_turn(conflicting),
        encode_turn(gap),
        unsound,
        forged,
        encode_turn(good)[:-3],
        b"\xc3\x01" + bytes(8) + b"junk",
        None,
    ]
    records = [LogRecord(0, i, good.project_sha256, v) for i, v in enumerate(values)]
    records.append(LogRecord(0, len(records), project_sha256(OTHER_PROJECT), encode_turn(good)))  # wrong key
    with DuckProjection.open(tmp_path / "q.duckdb", topic=TOPIC) as projection:
        projection.apply_batch(TOPIC, 0, records)
        stats = projection.stats(latest_quarantine=100)
    # every record but the good one and ``conflicting`` (the same turn id with other content amends it)
    assert stats.quarantined == len(records) - 2
    for entry in stats.latest_quarantine:
        clean(f"{entry.code}: {entry.reason}", "quarantine reason")
