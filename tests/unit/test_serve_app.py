"""The HTTP read API over the in-memory adapters (FastAPI's TestClient; no broker, no socket).

The same requests go through real HTTP against a live ``throughline serve`` in
``tests/integration/test_serve.py``; here every branch of the API is pinned down cheaply.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from reader_world import KEY, OTHER_PROJECT, PROJECT, World
from support.projection import PassThroughWaits

from throughline.core.cursor import Cursor
from throughline.errors import InputError
from throughline.reader import ReadRequest, read_page
from throughline.reader.wire import ObserverRead
from throughline.serve import READ_PATH, REASON_HEADER
from throughline.serve.app import ApiSettings, create_app, openapi_text
from throughline.serve.params import request_from_json, request_from_query

TOKEN = "s3cret-token-for-tests-0123456789"

# A minimal parser of the Prometheus text format (independent of throughline.serve.metrics).
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, by (name, labels); fails on a malformed line."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}, line
            types[name] = kind
            continue
        if line.startswith("# HELP "):
            continue
        m = _SAMPLE.match(line)
        assert m, f"malformed sample line: {line!r}"
        labels = frozenset(_LABEL.findall(m.group(3) or ""))
        value = float(m.group(4).replace("+Inf", "inf").replace("-Inf", "-inf"))
        samples[(m.group(1), labels)] = value
    for name, _labels in samples:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or base in types, f"sample {name} has no # TYPE line"
    return samples


def make_client(http_world: World, **overrides: Any) -> TestClient:
    options: dict[str, Any] = {"read_wait": 0.0, **overrides}
    app = create_app(
        projection=http_world.projection, log=http_world.log, token_key=KEY, settings=ApiSettings(**options)
    )
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def client(http_world: World) -> Iterator[TestClient]:
    with make_client(http_world) as c:
        yield c


def read(client: TestClient, method: str = "GET", **params: Any) -> Any:
    if method == "GET":
        return client.get(READ_PATH, params=params)
    return client.post(READ_PATH, json=params)


def error_code(response: Any) -> str:
    document = response.json()
    assert set(document) == {"error"} and set(document["error"]) == {"code", "message"}, document
    assert "Traceback" not in response.text
    return str(document["error"]["code"])


# ------------------------------------------------------------------------------------------ the wire


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_read_is_the_library_document(http_world: World, client: TestClient, method: str) -> None:
    response = read(client, method, project=PROJECT)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    assert response.json() == json.loads(http_world.read(PROJECT).to_json())
    assert response.content == http_world.read(PROJECT).to_json().encode()  # byte for byte, not just equal JSON
    assert ObserverRead.from_json(response.content).status == "ok"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_delta_series_paginates_with_bound_tokens(http_world: World, client: TestClient, method: str) -> None:
    first = read(client, method, project=PROJECT).json()
    http_world.append_many(5)
    page = read(client, method, project=PROJECT, afterCursor=first["throughCursor"], limit=2).json()
    through = page["throughCursor"]
    served = [t["seq"] for t in page["turns"]]
    for _ in range(10):
        if page["page"]["complete"]:
            break
        page = read(
            client,
            method,
            project=PROJECT,
            afterCursor=first["throughCursor"],
            throughCursor=through,
            pageToken=page["page"]["nextToken"],
            limit=2,
        ).json()
        assert page["throughCursor"] == through
        served += [t["seq"] for t in page["turns"]]
    assert served == [4, 5, 6, 7, 8]


def test_short_aliases_after_and_through(http_world: World, client: TestClient) -> None:
    first = read(client, project=PROJECT).json()
    http_world.append_many(2)
    by_alias = client.get(READ_PATH, params={"project": PROJECT, "after": first["throughCursor"]}).json()
    assert [t["seq"] for t in by_alias["turns"]] == [4, 5]
    both = client.get(
        READ_PATH, params={"project": PROJECT, "after": first["throughCursor"], "afterCursor": first["throughCursor"]}
    )
    assert both.status_code == 400 and error_code(both) == "invalid_arguments"


def test_projection_pending_is_a_200_answer(http_world: World, client: TestClient) -> None:
    http_world.append(apply=False)  # on the log, not yet projected
    response = read(client, project=PROJECT)
    assert response.status_code == 200
    document = response.json()
    assert document["status"] == "projection_pending" and document["turns"] == []
    assert document["page"] == {"complete": False, "nextToken": None}
    assert "reason" not in document  # the wire holds only docs/spec.md#read-wire's fields...
    assert response.headers[REASON_HEADER]  # ...the reason for a person rides in a header


def test_resync_required_is_a_200_answer(http_world: World, client: TestClient) -> None:
    other = World()
    other.append(project=OTHER_PROJECT)
    foreign = other.read(OTHER_PROJECT).throughCursor
    response = read(client, project=PROJECT, afterCursor=foreign)
    assert response.status_code == 200
    assert response.json()["status"] == "resync_required"
    newer_version = read(client, project=PROJECT, afterCursor="tlc2.AAAA")
    assert newer_version.status_code == 200 and newer_version.json()["status"] == "resync_required"


def test_an_empty_project_is_ok_with_no_through(client: TestClient) -> None:
    document = read(client, project="/nobody/home").json()
    assert document["status"] == "ok" and document["throughCursor"] is None and document["page"]["complete"]


# ------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"project": PROJECT, "limit": "0"}, "invalid_limit"),
        ({"project": PROJECT, "limit": "101"}, "invalid_limit"),
        ({"project": PROJECT, "limit": "ten"}, "invalid_limit"),
        ({"project": PROJECT, "limit": "2.0"}, "invalid_limit"),
        ({"project": ""}, "invalid_project"),
        ({"project": PROJECT, "afterCursor": "not-a-cursor"}, "invalid_cursor"),
        ({"project": PROJECT, "afterCursor": ""}, "invalid_cursor"),
        ({"project": PROJECT, "pageToken": "tlp1.x.y"}, "page_token_unbound"),
        ({"project": PROJECT, "wait": "-1"}, "invalid_wait"),
        ({"project": PROJECT, "wait": "soon"}, "invalid_wait"),
        ({"project": PROJECT, "cursor": "x"}, "invalid_arguments"),
        ({}, "invalid_arguments"),
    ],
)
def test_query_input_errors_are_400_with_stable_codes(client: TestClient, params: dict[str, str], code: str) -> None:
    response = client.get(READ_PATH, params=params)
    assert response.status_code == 400
    assert error_code(response) == code


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"project": PROJECT, "limit": "5"}, "invalid_limit"),
        ({"project": PROJECT, "limit": True}, "invalid_limit"),
        ({"project": PROJECT, "limit": 5.0}, "invalid_limit"),
        ({"project": 7}, "invalid_project"),
        ({"project": PROJECT, "afterCursor": 12}, "invalid_cursor"),
        ({"project": PROJECT, "wait": "1"}, "invalid_wait"),
        ({"project": PROJECT, "wait": -0.5}, "invalid_wait"),
        ({"project": PROJECT, "after_cursor": None}, "invalid_arguments"),
        ({"project": None}, "invalid_arguments"),
        ([PROJECT], "invalid_arguments"),
    ],
)
def test_json_input_errors_are_400_with_stable_codes(client: TestClient, body: Any, code: str) -> None:
    response = client.post(READ_PATH, json=body)
    assert response.status_code == 400
    assert error_code(response) == code


def test_a_body_that_is_not_json_is_400(client: TestClient) -> None:
    response = client.post(READ_PATH, content=b"{project", headers={"content-type": "application/json"})
    assert response.status_code == 400 and error_code(response) == "invalid_arguments"


def test_a_repeated_parameter_is_refused(client: TestClient) -> None:
    response = client.get(READ_PATH + "?project=a&project=b")
    assert response.status_code == 400 and error_code(response) == "invalid_arguments"


def test_every_page_token_fault_is_400_never_resync(http_world: World, client: TestClient) -> None:
    first = read(client, project=PROJECT).json()
    after = first["throughCursor"]
    http_world.append_many(4)
    page = read(client, project=PROJECT, afterCursor=after, limit=2).json()
    through, token = page["throughCursor"], page["page"]["nextToken"]
    base = {"project": PROJECT, "afterCursor": after, "throughCursor": through}
    cases = {
        "page_token_tampered": token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1],
        "page_token_version": "tlp2." + token[5:],
        "page_token_malformed": "garbage",
        "page_token_oversize": "tlp1." + "A" * 5000 + ".AAAA",
    }
    for code, bad in cases.items():
        response = client.post(READ_PATH, json={**base, "pageToken": bad, "limit": 2})
        assert response.status_code == 400, code
        assert error_code(response) == code
    mismatch = client.post(READ_PATH, json={**base, "afterCursor": through, "pageToken": token, "limit": 2})
    assert mismatch.status_code == 400 and error_code(mismatch) == "page_token_mismatch"


def test_a_quarantined_source_is_409_not_an_input_error(http_world: World, client: TestClient) -> None:
    http_world.append(seq=9)  # a gap: the record is quarantined and its source marked broken
    response = read(client, project=PROJECT)
    assert response.status_code == 409
    assert error_code(response) == "source_quarantined"


def test_an_unexpected_failure_is_500_without_a_trace(http_world: World) -> None:
    def broken(_: ReadRequest, **__: Any) -> ObserverRead:
        raise RuntimeError("secret internals /home/alice")

    app = create_app(projection=http_world.projection, log=http_world.log, token_key=KEY, read_page=broken)
    with TestClient(app, raise_server_exceptions=False) as c:
        response = c.get(READ_PATH, params={"project": PROJECT})
    assert response.status_code == 500
    assert error_code(response) == "internal_error"
    assert "alice" not in response.text and "RuntimeError" not in response.text


def test_a_get_read_skips_the_framework_and_answers_as_it_would(http_world: World) -> None:
    """GET reads take ``ReadRoute`` (the hot path), POST reads FastAPI's route: same bytes, same headers."""
    threads: list[str] = []

    def recording(request: ReadRequest, **options: Any) -> ObserverRead:
        threads.append(threading.current_thread().name)
        return read_page(request, **options)

    http_world.append(seq=9)  # a quarantined source: an error answer too
    app = create_app(
        projection=http_world.projection,
        log=http_world.log,
        token_key=KEY,
        read_page=recording,
        settings=ApiSettings(read_wait=0.0),
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        for params in ({"project": PROJECT}, {"project": OTHER_PROJECT, "limit": 1}, {"project": ""}):
            got = c.get(READ_PATH, params=params)
            framework = c.post(READ_PATH, json=params)
            assert (got.status_code, got.content) == (framework.status_code, framework.content)
            same = {"content-type", "cache-control", REASON_HEADER.lower(), "retry-after", "www-authenticate"}
            assert {k: v for k, v in got.headers.items() if k in same} == {
                k: v for k, v in framework.headers.items() if k in same
            }
        samples = parse_metrics(c.get("/metrics").text)
    assert threads and threads[0].startswith("read") and not threads[1].startswith("read"), threads
    counted = {dict(labels).get("route") for name, labels in samples if name == "throughline_http_requests_total"}
    assert READ_PATH in counted and "unmatched" not in counted


def test_the_read_threads_go_with_the_lifespan_and_come_back_with_the_next(http_world: World) -> None:
    app = create_app(
        projection=http_world.projection, log=http_world.log, token_key=KEY, settings=ApiSettings(read_wait=0.0)
    )

    def read_threads() -> set[str]:
        return {t.name for t in threading.enumerate() if t.name.startswith("read_")}

    before = read_threads()
    for _ in range(2):  # served twice, as a test suite may
        with TestClient(app, raise_server_exceptions=False) as c:
            assert c.get(READ_PATH, params={"project": PROJECT}).status_code == 200
            assert read_threads() - before
        deadline = time.monotonic() + 10
        while read_threads() - before:
            assert time.monotonic() < deadline, f"read threads outlived the app: {read_threads() - before}"
            time.sleep(0.01)


def test_unknown_paths_and_methods_answer_json(client: TestClient) -> None:
    assert error_code(client.get("/v2/whatever")) == "not_found"
    response = client.delete(READ_PATH)
    assert response.status_code == 405 and error_code(response) == "method_not_allowed"


# ------------------------------------------------------------------------------------------ limits and auth


def test_oversized_bodies_and_query_strings_are_refused(http_world: World) -> None:
    with make_client(http_world, max_body_bytes=1024, max_query_bytes=512) as c:
        big = c.post(READ_PATH, json={"project": "p" * 2000})
        assert big.status_code == 413 and error_code(big) == "request_too_large"

        def chunks() -> Iterator[bytes]:
            yield b'{"project": "'
            yield b"p" * 2000
            yield b'"}'

        streamed = c.post(READ_PATH, content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and error_code(streamed) == "request_too_large"
        long_query = c.get(READ_PATH, params={"project": "p" * 1000})
        assert long_query.status_code == 414 and error_code(long_query) == "request_too_large"


def test_bearer_token_is_required_when_configured(http_world: World) -> None:
    with make_client(http_world, auth_token=TOKEN) as c:
        missing = c.get(READ_PATH, params={"project": PROJECT})
        assert missing.status_code == 401 and error_code(missing) == "unauthorized"
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = c.get(READ_PATH, params={"project": PROJECT}, headers={"Authorization": "Bearer nope-nope-nope-nope"})
        assert wrong.status_code == 401 and error_code(wrong) == "unauthorized"
        basic = c.get(READ_PATH, params={"project": PROJECT}, headers={"Authorization": f"Basic {TOKEN}"})
        assert basic.status_code == 401
        right = c.get(READ_PATH, params={"project": PROJECT}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200 and right.json()["status"] == "ok"
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        # Probes stay open for orchestrators; they reveal offsets, never turns.
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        # An unauthenticated request is refused before its input is looked at.
        assert c.get(READ_PATH, params={"limit": "0"}).status_code == 401


# ------------------------------------------------------------------------------------------ long-poll


def test_a_long_poll_returns_the_new_turn_when_it_is_projected(http_world: World, client: TestClient) -> None:
    after = read(client, project=PROJECT).json()["throughCursor"]
    http_world.append(apply=False)
    http_world.log.ends.clear()  # the turn is "produced" below, while the request waits
    http_world.log.ends[0] = 3
    results: list[Any] = []

    def poll() -> None:
        results.append(read(client, project=PROJECT, afterCursor=after, wait="20").json())

    thread = threading.Thread(target=poll)
    thread.start()
    _wait_for(lambda: client.app.state.api.metrics.long_polls.value() == 1)  # type: ignore[attr-defined]
    http_world.log.ends[0] = 4
    http_world.project()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert results[0]["status"] == "ok" and [t["seq"] for t in results[0]["turns"]] == [4]


def test_a_long_poll_without_news_answers_the_empty_delta(http_world: World, client: TestClient) -> None:
    after = read(client, project=PROJECT).json()["throughCursor"]
    document = read(client, "POST", project=PROJECT, afterCursor=after, wait=0.05)
    assert document.status_code == 200
    assert document.json()["turns"] == [] and document.json()["page"]["complete"] is True


def test_a_long_poll_ignores_other_projects_on_the_same_partition(http_world: World, client: TestClient) -> None:
    after = read(client, project=PROJECT).json()["throughCursor"]
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(read(client, project=PROJECT, afterCursor=after, wait="20").json())
    )
    thread.start()
    _wait_for(lambda: client.app.state.api.metrics.long_polls.value() == 1)  # type: ignore[attr-defined]
    http_world.append(project=OTHER_PROJECT)  # wakes the wait, but the project's chain did not move
    http_world.append()
    thread.join(timeout=20)
    assert [t["seq"] for t in results[0]["turns"]] == [4]


def test_a_long_poll_is_not_woken_by_other_projects_commits(http_world: World) -> None:
    """Other projects' turns on the partition do not wake it (no read again per commit of the partition)."""
    reads: list[object] = []

    def counting_read(request: ReadRequest, **handles: Any) -> ObserverRead:
        reads.append(request.project)
        return read_page(request, **handles)

    app = create_app(
        projection=http_world.projection,
        log=http_world.log,
        token_key=KEY,
        settings=ApiSettings(read_wait=0.0),
        read_page=counting_read,
    )
    with TestClient(app) as c:
        after = read(c, project=PROJECT).json()["throughCursor"]
        reads.clear()
        results: list[Any] = []
        thread = threading.Thread(
            target=lambda: results.append(read(c, project=PROJECT, afterCursor=after, wait="20").json())
        )
        thread.start()
        _wait_for(lambda: c.app.state.api.metrics.long_polls.value() == 1)  # type: ignore[attr-defined]
        for _ in range(5):
            http_world.append(project=OTHER_PROJECT)
        time.sleep(0.2)
        assert len(reads) == 1  # the first read only: five commits of another project woke nothing
        http_world.append()
        thread.join(timeout=20)
    assert [t["seq"] for t in results[0]["turns"]] == [4] and len(reads) == 2


def test_pages_of_a_pinned_series_never_wait(http_world: World) -> None:
    waits: list[tuple[int, int]] = []

    class Counting(PassThroughWaits):
        def view(self) -> Any:
            return http_world.projection.view()

        def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
            waits.append((partition, offset))
            return http_world.projection.wait_applied(partition, offset, timeout)

        def wait_settled(self, partition: int, project: bytes, offset: int, timeout: float) -> bool:
            waits.append((partition, offset))
            return http_world.projection.wait_settled(partition, project, offset, timeout)

        def project_changes(self, project: bytes) -> int:
            return http_world.projection.project_changes(project)

        def wait_project_changed(self, project: bytes, seen: int, timeout: float) -> bool:
            waits.append((-1, seen))
            return http_world.projection.wait_project_changed(project, seen, timeout)

    app = create_app(
        projection=Counting(http_world.projection),
        log=http_world.log,
        token_key=KEY,
        settings=ApiSettings(read_wait=0.0),
    )
    with TestClient(app) as c:
        first = read(c, project=PROJECT).json()
        waits.clear()
        through = first["throughCursor"]
        document = read(c, project=PROJECT, afterCursor=through, throughCursor=through, wait="30").json()
    assert document["status"] == "ok" and document["turns"] == []
    assert len(waits) == 1  # the reader's own freshness check, and no long-poll wait after it


def test_too_many_waiters_get_503_server_busy(http_world: World) -> None:
    with make_client(http_world, max_waiters=1) as c:
        after = read(c, project=PROJECT).json()["throughCursor"]
        thread = threading.Thread(target=lambda: read(c, project=PROJECT, afterCursor=after, wait="20"))
        thread.start()
        _wait_for(lambda: c.app.state.api.metrics.long_polls.value() == 1)  # type: ignore[attr-defined]
        busy = read(c, project=PROJECT, afterCursor=after, wait="20")
        assert busy.status_code == 503 and error_code(busy) == "server_busy"
        assert busy.headers["retry-after"] == "1"
        http_world.append()
        thread.join(timeout=20)
        assert not thread.is_alive()


def test_stopping_releases_waiting_long_polls(http_world: World) -> None:
    stopping = threading.Event()
    app = create_app(
        projection=http_world.projection,
        log=http_world.log,
        token_key=KEY,
        settings=ApiSettings(read_wait=0.0),
        stopping=stopping,
    )
    with TestClient(app) as c:
        after = read(c, project=PROJECT).json()["throughCursor"]
        results: list[Any] = []
        thread = threading.Thread(target=lambda: results.append(read(c, project=PROJECT, afterCursor=after, wait="30")))
        thread.start()
        _wait_for(lambda: app.state.api.metrics.long_polls.value() == 1)
        stopping.set()
        thread.join(timeout=10)  # well inside the 30 s the request asked for
        assert not thread.is_alive()
        assert results[0].status_code == 200 and results[0].json()["turns"] == []


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


# ------------------------------------------------------------------------------------------ operations


def test_readiness_reports_lag_per_partition(http_world: World) -> None:
    with make_client(http_world, ready_max_lag=1) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["partitions"] == [{"partition": 0, "appliedOffset": 3, "endOffset": 3, "lag": 0}]
        http_world.append(apply=False)
        http_world.append(apply=False)
        lagging = c.get("/readyz")
        assert lagging.status_code == 503
        assert lagging.json()["status"] == "not_ready" and lagging.json()["lag"] == 2
        http_world.project()
        assert c.get("/readyz").status_code == 200
        assert c.get("/healthz").json()["status"] == "alive"


def test_metrics_parse_and_name_the_operator_series(http_world: World, client: TestClient) -> None:
    read(client, project=PROJECT)
    read(client, project=PROJECT, limit="0")
    http_world.append(apply=False)
    read(client, project=PROJECT)
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = parse_metrics(response.text)
    p0 = frozenset({("partition", "0")})
    assert samples[("throughline_projector_applied_offset", p0)] == 3
    assert samples[("throughline_log_end_offset", p0)] == 4
    assert samples[("throughline_projector_lag_records", p0)] == 1
    assert samples[("throughline_reads_total", frozenset({("status", "ok")}))] == 1
    assert samples[("throughline_reads_total", frozenset({("status", "projection_pending")}))] == 1
    assert samples[("throughline_reads_total", frozenset({("status", "error")}))] == 1
    assert samples[("throughline_read_errors_total", frozenset({("code", "invalid_limit")}))] == 1
    assert samples[("throughline_read_duration_seconds_count", frozenset())] == 3
    assert samples[("throughline_read_duration_seconds_bucket", frozenset({("le", "+Inf")}))] == 3
    assert samples[("throughline_long_polls_waiting", frozenset())] == 0  # exported before the first long-poll
    for name in ("throughline_projector_turns_applied_total", "throughline_projector_quarantined_records_total"):
        assert (name, frozenset()) in samples
    routes = {dict(labels).get("route") for name, labels in samples if name == "throughline_http_requests_total"}
    assert READ_PATH in routes


def test_openapi_documents_the_read_api(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    read_ops = document["paths"][READ_PATH]
    assert {"get", "post"} <= set(read_ops)
    names = {p["name"] for p in read_ops["get"]["parameters"]}
    assert {"project", "afterCursor", "throughCursor", "pageToken", "limit", "wait"} <= names
    schemas = document["components"]["schemas"]
    assert any(name.startswith("throughline.observer_read.v1") or name.startswith("ObserverRead") for name in schemas)
    assert {"/healthz", "/readyz", "/metrics"} <= set(document["paths"])
    wire = schemas["ObserverRead"]
    assert "reason" not in wire["properties"]  # the person's reason never reaches the wire
    assert set(wire["required"]) == {
        "schema",
        "status",
        "thread",
        "afterCursor",
        "throughCursor",
        "turns",
        "historyTruncated",
        "page",
    }


def test_the_committed_openapi_document_is_current() -> None:
    committed = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
    assert committed.read_text(encoding="utf-8") == openapi_text(), (
        "docs/openapi.json is stale: python -m throughline.serve.app > docs/openapi.json"
    )


# ------------------------------------------------------------------------------------------ parsing properties

_NAMES = st.sampled_from(
    ["project", "afterCursor", "after", "throughCursor", "through", "pageToken", "limit", "wait", "x", ""]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_NAMES, st.text(max_size=30)), max_size=8))
def test_query_parsing_accepts_or_refuses_with_an_input_error(pairs: list[tuple[str, str]]) -> None:
    try:
        params = request_from_query(pairs)
    except InputError as exc:
        assert exc.exit_code == 2 and exc.code
    else:
        assert 0 <= params.wait <= 30
        assert params.project is not None


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        _NAMES,
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20)),
        max_size=6,
    )
)
def test_json_parsing_accepts_or_refuses_with_an_input_error(document: dict[str, Any]) -> None:
    try:
        params = request_from_json(json.dumps(document).encode())
    except InputError as exc:
        assert exc.exit_code == 2 and exc.code
    else:
        assert 0 <= params.wait <= 30


def test_cursor_types_are_untouched_by_parsing() -> None:
    cursor = Cursor(b"\x01" * 32, b"\x02" * 32, 3, b"\x03" * 32, 0, 9).encode()
    params = request_from_query([("project", PROJECT), ("after", cursor), ("limit", "7"), ("wait", "45")])
    assert params.after_cursor == cursor and params.limit == 7 and params.wait == 30  # clamped to the cap
