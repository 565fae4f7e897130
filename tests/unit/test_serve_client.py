"""``HttpReader`` against the API served over a real loopback socket (uvicorn on a thread, no broker).

The client must be a drop-in for the library: the same ``ObserverRead`` documents, the same error
classes and codes, and it must drive the reference Observer.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from reader_world import PROJECT, World
from served_app import ServedApp, rest_of_series

from throughline.core.exceptions import (
    InvalidCursorError,
    InvalidLimitError,
    InvalidProjectError,
    PageTokenError,
    PageTokenTamperedError,
)
from throughline.errors import ThroughlineError
from throughline.reader import Observer, SourceQuarantinedError, load_observer_state
from throughline.reader.exceptions import PageTokenUnboundError
from throughline.reader.wire import TurnRecordWire
from throughline.serve.app import ApiSettings
from throughline.serve.client import HttpReader, error_from_answer
from throughline.serve.exceptions import (
    BadResponseError,
    InvalidRequestError,
    ServerUnavailableError,
    UnauthorizedError,
    UnknownCodeError,
)

TOKEN = "client-test-token-abcdefghijklmnop"


def test_the_client_returns_the_library_document(http_world: World, read_api: ServedApp) -> None:
    remote = HttpReader(read_api.url)(project=PROJECT, after_cursor=None, through_cursor=None, page_token=None, limit=2)
    assert remote == http_world.read(PROJECT, limit=2)
    assert remote.to_json() == http_world.read(PROJECT, limit=2).to_json()


def test_the_client_pages_a_series(http_world: World, read_api: ServedApp) -> None:
    reader = HttpReader(read_api.url)
    after = reader.read_observer_turn_page(project=PROJECT).throughCursor
    http_world.append_many(5)
    page = reader.read_observer_turn_page(project=PROJECT, after_cursor=after, limit=2)
    assert rest_of_series(reader, PROJECT, after, page, 2) == [4, 5, 6, 7, 8]


def test_the_client_carries_the_reason_of_a_pending_read(http_world: World, read_api: ServedApp) -> None:
    http_world.append(apply=False)
    read = HttpReader(read_api.url).read_observer_turn_page(project=PROJECT)
    assert read.status == "projection_pending"
    assert read.reason  # from the Throughline-Reason header; never part of the JSON
    assert "reason" not in read.to_dict()


@pytest.mark.parametrize(
    ("kwargs", "cls", "code"),
    [
        ({"limit": 0}, InvalidLimitError, "invalid_limit"),
        ({"limit": "5"}, InvalidLimitError, "invalid_limit"),
        ({"project": ""}, InvalidProjectError, "invalid_project"),
        ({"after_cursor": "nope"}, InvalidCursorError, "invalid_cursor"),
        ({"page_token": "tlp1.a.b"}, PageTokenUnboundError, "page_token_unbound"),
        ({"through_cursor": "tlc1.AAAA", "page_token": "tlp1.a.b"}, InvalidCursorError, "invalid_cursor"),
    ],
)
def test_the_client_raises_the_library_error_classes(
    read_api: ServedApp, kwargs: dict[str, Any], cls: type[Exception], code: str
) -> None:
    args: dict[str, Any] = {"project": PROJECT, **kwargs}
    with pytest.raises(cls) as caught:
        HttpReader(read_api.url).read_observer_turn_page(**args)
    assert caught.value.code == code  # type: ignore[attr-defined]
    assert caught.value.exit_code == 2  # type: ignore[attr-defined]


def test_a_page_token_error_keeps_its_code(http_world: World, read_api: ServedApp) -> None:
    reader = HttpReader(read_api.url)
    after = reader.read_observer_turn_page(project=PROJECT).throughCursor
    http_world.append_many(4)
    page = reader.read_observer_turn_page(project=PROJECT, after_cursor=after, limit=2)
    with pytest.raises(PageTokenError) as caught:
        reader.read_observer_turn_page(
            project=PROJECT, after_cursor=after, through_cursor=page.throughCursor, page_token="tlp1.AAAA.BBBB", limit=2
        )
    assert caught.value.code == "page_token_malformed"


def test_a_quarantined_source_is_the_same_hard_failure(http_world: World, read_api: ServedApp) -> None:
    http_world.append(seq=7)
    with pytest.raises(SourceQuarantinedError) as caught:
        HttpReader(read_api.url).read_observer_turn_page(project=PROJECT)
    assert caught.value.exit_code == 1 and not caught.value.retriable


def test_authentication_errors_are_typed(http_world: World) -> None:
    with ServedApp(http_world, ApiSettings(read_wait=0.0, auth_token=TOKEN)) as s:
        with pytest.raises(UnauthorizedError):
            HttpReader(s.url).read_observer_turn_page(project=PROJECT)
        with pytest.raises(UnauthorizedError):
            HttpReader(s.url, token="wrong-token-wrong-token").read_observer_turn_page(project=PROJECT)
        assert HttpReader(s.url, token=TOKEN).read_observer_turn_page(project=PROJECT).ok


def test_an_unreachable_server_is_retriable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(ServerUnavailableError) as caught:
        HttpReader(f"http://127.0.0.1:{port}", timeout=2).read_observer_turn_page(project=PROJECT)
    assert caught.value.retriable


def test_a_foreign_answer_is_a_bad_response(read_api: ServedApp) -> None:
    with pytest.raises(BadResponseError):
        HttpReader(read_api.url + "/v1/projects/read").read_observer_turn_page(project=PROJECT)  # 404 path


def test_error_classes_are_found_by_code() -> None:
    assert isinstance(error_from_answer(400, "invalid_arguments", "x"), InvalidRequestError)
    tampered = error_from_answer(400, "page_token_tampered", "x")
    assert type(tampered) is PageTokenTamperedError and isinstance(tampered, PageTokenError)
    assert type(error_from_answer(500, "internal_error", "x")) is ThroughlineError
    unknown = error_from_answer(400, "some_future_code", "x")
    assert type(unknown) is UnknownCodeError
    assert unknown.code == "some_future_code" and unknown.exit_code == 2
    assert unknown.to_json() == {"error": {"code": "some_future_code", "message": "x"}}
    busy = error_from_answer(503, "broker_unavailable", "x")
    assert busy.retriable and busy.code == "broker_unavailable"


def test_the_observer_audits_through_the_client(http_world: World, read_api: ServedApp, tmp_path: Path) -> None:
    audited: list[TurnRecordWire] = []
    state = tmp_path / "observer.json"
    observer = Observer(HttpReader(read_api.url), project=PROJECT, state_path=state, audit=audited.append, limit=2)
    first = observer.run_series()
    assert first.saved and [t.seq for t in audited] == [2, 3]
    http_world.append_many(5)
    second = observer.run_series()
    assert second.saved and second.turns_audited == 5
    assert [t.seq for t in audited] == [2, 3, 4, 5, 6, 7, 8]
    assert load_observer_state(state) == second.through_cursor


def test_a_long_poll_through_the_client(http_world: World, read_api: ServedApp) -> None:
    reader = HttpReader(read_api.url, wait=20)
    after = reader.read_observer_turn_page(project=PROJECT).throughCursor
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(reader.read_observer_turn_page(project=PROJECT, after_cursor=after))
    )
    thread.start()
    metrics = read_api.server.config.app.state.api.metrics  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while metrics.long_polls.value() != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    http_world.append()
    thread.join(timeout=20)
    assert [t.seq for t in results[0].turns] == [4]
